"""Decode memory pressure backs up into the prefill queue: staged pulls vs a push pipeline cut.

Multi-turn LMBenchmark-style traffic on Qwen3-32B FP8, one prefill and one decode H100 (NIC between them).
Three runs: pull with the decode worker's derived KV budget, pull with the decode KV budget squeezed, and
the push ablation with the same squeeze. Writes ``summary.csv``, each run's results folder and
``backpressure.png`` (prefill queue, staged KV, decode wait, KV usage and TTFT over time, pull vs push).

    python experiments/disagg_backpressure.py --out out/backpressure [--quick]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

import numpy as np

from experiments.plotting import gauge_panels
from twin.config import load_config
from twin.results import Results
from twin.runner import Simulation


def config(transfer: str, decode_blocks: int | None, quick: bool) -> dict[str, Any]:
    decode: dict[str, Any] = {"workers": 1, "tp": 1}
    if decode_blocks is not None:
        decode["num_blocks"] = decode_blocks
    return {
        "name": f"{transfer}-{'squeezed' if decode_blocks else 'roomy'}",
        "hardware": {"gpu": "h100_sxm"},
        "model": {"name": "Qwen/Qwen3-32B-FP8", "weight_dtype": "fp8", "kv_dtype": "bf16"},
        "system": {"kind": "disaggregated", "prefill": {"workers": 1}, "decode": decode,
                   "decode_router": {"kind": "session_affinity"}, "gpus_per_node": 1},
        "transfer": {"kind": transfer, "lease_s": 60.0},
        "workload": {"kind": "lmbenchmark_multiround", "num_users": 12 if quick else 40,
                     "num_rounds": 4 if quick else 6, "qps": 1.0 if quick else 2.0,
                     "shared_system_prompt": 1000, "user_history_prompt": 3000, "answer_len": 200},
        "metrics": {"sample_interval_s": 0.5},
    }


def run_all(out: Path, quick: bool, squeeze_blocks: int) -> dict[str, Results]:
    runs = {"pull-roomy": ("pull", None), "pull-squeezed": ("pull", squeeze_blocks),
            "push-squeezed": ("push", squeeze_blocks)}
    results = {}
    for name, (transfer, blocks) in runs.items():
        res = Simulation(load_config(config(transfer, blocks, quick))).run()
        res.write(out / name)
        results[name] = res
    return results


def write_summary(out: Path, results: dict[str, Results]) -> list[dict[str, Any]]:
    rows = []
    for name, res in results.items():
        s, kv = res.summary, res.summary["kv_transfer"]
        t = res.timeseries
        rows.append({
            "run": name, "submitted": s["requests"]["submitted"], "completed": s["requests"]["completed"],
            "failed": s["requests"]["failed"], "ttft_mean_s": s["ttft_s"]["mean"], "ttft_p99_s": s["ttft_s"]["p99"],
            "queue_mean_s": s["queue_s"]["mean"], "staged_mean_s": kv["staged_s"]["mean"],
            "staged_p99_s": kv["staged_s"]["p99"], "max_staged_blocks": float(np.nanmax(t["staged_blocks"])),
            "max_prefill_waiting": float(np.nanmax(t["prefill0_waiting"])),
            "max_decode_wait": float(np.nanmax(t["decode_wait"])), "pulls": kv["pulls"], "pushes": kv["pushes"],
            "dropped": kv["dropped"], "lease_expiries": kv["lease_expiries"],
        })
    with open(out / "summary.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return rows


def plot(out: Path, results: dict[str, Results]) -> Path:
    panels = [("prefill queue", "prefill0_waiting"), ("staged KV blocks", "staged_blocks"),
              ("decode pull queue", "decode_wait"), ("prefill KV usage", "prefill0_kv_usage"),
              ("decode KV usage", "decode0_kv_usage")]

    def ttft(ax: Any, name: str, res: Results) -> None:
        req = res.requests
        done = req[req["status"] == "finished"]
        ax.plot(done["arrival_s"], done["ttft_s"], ".", ms=3, label=name)
        failed = req[req["status"] == "failed"]
        if len(failed):
            ax.plot(failed["arrival_s"], np.zeros(len(failed)), "x", color="red", ms=4, label=f"{name}: failed")

    return gauge_panels(results, panels, out / "backpressure.png", ttft, "TTFT (s) by arrival")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/disagg_backpressure")
    parser.add_argument("--quick", action="store_true", help="a smaller workload (seconds)")
    parser.add_argument("--squeeze-blocks", type=int, default=1000,
                        help="decode KV blocks in the squeezed runs (derived budget: about 9,350)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = run_all(out, args.quick, args.squeeze_blocks)
    rows = write_summary(out, results)
    keys = ["run", "completed", "failed", "ttft_mean_s", "ttft_p99_s", "staged_mean_s", "max_staged_blocks",
            "max_prefill_waiting", "max_decode_wait", "dropped"]
    print(" ".join(f"{k:>18}" for k in keys))
    for row in rows:
        print(" ".join(f"{row[k]:>18.4g}" if isinstance(row[k], float) else f"{row[k]:>18}" for k in keys))
    print(f"wrote {out / 'summary.csv'} and {plot(out, results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
