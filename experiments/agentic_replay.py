"""Replay the shipped SWE-bench and tau-bench agent sessions on Llama-3.1-8B and Qwen3-30B-A3B (one H100).

For each (workload, model) pair: generation throughput, running and waiting requests, sessions in a tool
wait, KV usage and the prefix-hit rate over time, plus a summary row. Writes ``summary.csv``, each run's
results folder and ``agentic_replay.png``.

    python experiments/agentic_replay.py --out out/agentic [--quick]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

from experiments.plotting import gauge_panels
from twin.config import load_config
from twin.results import Results
from twin.runner import Simulation

WORKLOADS = {
    "swe-bench": {"path": "pkg:workloads/data/swe_bench_dev.jsonl", "arrival": {"kind": "poisson", "rate_per_s": 0.2}},
    "tau-bench": {"path": "pkg:workloads/data/tau_bench_airline.jsonl",
                  "arrival": {"kind": "poisson", "rate_per_s": 1.0}},
}
MODELS = {"llama-3.1-8b": "meta-llama/Llama-3.1-8B", "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B"}


def config(workload: str, model: str, limit: int | None) -> dict[str, Any]:
    wl: dict[str, Any] = {"kind": "sessions", **WORKLOADS[workload]}
    if limit is not None:
        wl["limit"] = limit
    return {"name": f"{workload}-{model}", "hardware": {"gpu": "h100_sxm"}, "model": {"name": MODELS[model]},
            "workload": wl, "metrics": {"sample_interval_s": 2.0}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/agentic_replay")
    parser.add_argument("--quick", action="store_true", help="the first 6 sessions of each set only")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Results] = {}
    rows = []
    for workload in WORKLOADS:
        for model in MODELS:
            res = Simulation(load_config(config(workload, model, 6 if args.quick else None))).run()
            name = f"{workload}-{model}"
            res.write(out / name)
            results[name] = res
            s = res.summary
            rows.append({"run": name, "sessions": s["sessions"]["finished"], "calls": s["requests"]["completed"],
                         "failed": s["requests"]["failed"], "hit_rate": s["prefix_cache"]["hit_rate"],
                         "ttft_mean_s": s["ttft_s"]["mean"], "ttft_p99_s": s["ttft_s"]["p99"],
                         "tpot_mean_s": s["tpot_s"]["mean"], "output_tok_per_s": s["throughput"]["output_tokens_per_s"],
                         "preemptions": s["preemptions"], "simulated_s": s["sim"]["simulated_s"],
                         "wall_s": s["sim"]["wall_s"]})
    with open(out / "summary.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for row in rows:
        print(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    print(f"wrote {out / 'summary.csv'} and {plot(out, results)}")
    return 0


def plot(out: Path, results: dict[str, Results]) -> Path:
    panels = [("output tokens / s", "output_tokens_per_s"), ("running", "running"), ("waiting", "waiting"),
              ("sessions in tool wait", "sessions_in_wait"), ("KV usage", "kv_usage"),
              ("prefix-hit rate", "prefix_hit_rate")]
    return gauge_panels(results, panels, out / "agentic_replay.png")


if __name__ == "__main__":
    raise SystemExit(main())
