"""HBM bandwidth vs capacity: which one a decode-heavy and a prefix-reuse workload are bound by (issue 51).

The deployment (``bandwidth_capacity.yaml`` beside this file): Qwen3-32B FP8, one prefill and one decode
H100 (the KV crossing the NIC), vLLM's defaults (prefix caching on), staged KV pulled by the decode worker.
Each run scales one H100 resource, ``hardware.scale.hbm_bw`` (bandwidth) or ``hardware.scale.hbm_bytes``
(capacity: the KV pool, weights and activations unchanged), by 0.7, 1.0 or 1.4, the other held at 1; the
1.0 run is shared by both knobs (10 runs, 12 points).

* W1: independent requests of 1,024 tokens in and 1,024 out, 64 in flight at any time (closed loop),
  1,920 of them (30 turnovers, so the first wave's ramp is a few per cent of the run).
* W2: LMBenchmark multi-round QA, 20 users x 20 rounds, 100-token answers, at its client's qps 0.5 (a user
  asks every 40 s). The generator (``workloads.generators.lmbenchmark_multiround``) makes round k's prompt
  shared_system_prompt + user_history_prompt + k x 20 (question) + (k - 1) x 100 (earlier answers) tokens;
  shared_system_prompt 1,000 and user_history_prompt 9,980 give 11,000 tokens in round 1 rising by 120 a
  round to 13,280 in round 20 (users present at the start join part-way and stop sooner). At qps 0.5 the
  prefill worker keeps up even when every history misses, so TTFT shows the prefill work itself; from qps
  1.5 the missing histories saturate it and queueing dominates.

Writes ``bandwidth_capacity.csv`` (one row per point), ``bandwidth_capacity.png`` (throughput, TTFT p50 and
prefix-hit rate against the factor, one line per knob) and ``summary.md`` (what bounds each workload, from
the numbers and the runs' ``hardware_whatif`` ledgers; ``experiments/bandwidth_capacity_report.py``).

    python experiments/bandwidth_capacity.py --out out/bandwidth_capacity
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import attrs

from experiments.tables import finish, write_rows
from twin.config import load_config
from twin.config_codec import read_yaml
from twin.runner import Simulation

DEPLOYMENT = Path(__file__).with_suffix(".yaml")
KNOBS = {"bandwidth": "hbm_bw", "capacity": "hbm_bytes"}
"""Study name of each knob -> its ``hardware.scale`` field."""
SCALES = (0.7, 1.0, 1.4)
COLUMNS = ("workload", "knob", "scale", "output_tokens_per_s", "ttft_p50_s", "hit_rate", "queue_p50_s")

W1: dict[str, Any] = {"kind": "synthetic", "num_requests": 1920, "input_tokens": 1024, "output_tokens": 1024,
                      "arrival": {"kind": "concurrency", "concurrency": 64}}
W2: dict[str, Any] = {"kind": "lmbenchmark_multiround", "num_users": 20, "num_rounds": 20, "qps": 0.5,
                      "shared_system_prompt": 1000, "user_history_prompt": 9980, "answer_len": 100}
WORKLOADS = {"W1": W1, "W2": W2}
LABELS = {"W1": "W1: 1,024 in / 1,024 out, 64 in flight",
          "W2": "W2: 20 users x 20 rounds, 11.0k-13.3k-token prompts, 100 out"}


@attrs.frozen(kw_only=True)
class Point:
    """A workload's run with one knob at one factor (the factor-1 run serves both knobs)."""

    workload: str
    knob: str
    scale: float
    summary: dict[str, Any]
    whatif: dict[str, Any] | None
    """The run's ``ledger['hardware_whatif']``: None at 1.0 (the GPU as shipped)."""

    def row(self) -> dict[str, Any]:
        s = self.summary
        return {"workload": self.workload, "knob": self.knob, "scale": self.scale,
                "output_tokens_per_s": s["throughput"]["output_tokens_per_s"],
                "ttft_p50_s": s["ttft_s"]["p50"], "hit_rate": s["prefix_cache"]["hit_rate"],
                "queue_p50_s": s["queue_s"]["p50"]}

    def kv_tokens(self, role: str) -> int:
        """KV pool of the run's first worker of ``role`` (prefill / decode), in tokens."""
        return next(int(k["tokens"]) for k in self.summary["kv_capacity"] if k["role"] == role)


def deployment() -> dict[str, Any]:
    """The study's deployment, ``bandwidth_capacity.yaml``, as a mapping (no workload, no factors)."""
    return read_yaml(DEPLOYMENT)


def point(workload_name: str, workload: Mapping[str, Any], knob: str, scale: float,
          base: Mapping[str, Any] | None = None) -> Point:
    """Run the deployment (``base``, default the study's YAML) with ``workload`` and one knob at ``scale``."""
    data = dict(base if base is not None else deployment())
    data["workload"] = dict(workload)
    data["hardware"] = {**data.get("hardware", {}), "scale": {KNOBS[knob]: scale}}
    res = Simulation(load_config(data)).run()
    return Point(workload=workload_name, knob=knob, scale=scale, summary=res.summary,
                 whatif=res.ledger.get("hardware_whatif"))


def run_points(workloads: Mapping[str, Mapping[str, Any]], scales: Iterable[float] = SCALES,
               base: Mapping[str, Any] | None = None) -> list[Point]:
    """Every (workload, knob, scale) point; the factor-1 run is made once and listed under both knobs."""
    base = base if base is not None else deployment()
    points = []
    for name, workload in workloads.items():
        shared: Point | None = None
        for knob in KNOBS:
            for scale in scales:
                if scale == 1.0:
                    shared = shared or point(name, workload, knob, scale, base)
                    points.append(attrs.evolve(shared, knob=knob))
                else:
                    points.append(point(name, workload, knob, scale, base))
    return points


def write_csv(points: Iterable[Point], path: Path) -> Path:
    return write_rows((p.row() for p in points), COLUMNS, path)


def plot(points: list[Point], path: Path, dpi: int = 90) -> Path:
    """Small multiples: one row per workload; throughput, TTFT p50 and hit rate against the factor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    panels = [("output_tokens_per_s", "output throughput (tokens/s)"), ("ttft_p50_s", "TTFT p50 (s)"),
              ("hit_rate", "prefix-cache hit rate")]
    workloads = list(dict.fromkeys(p.workload for p in points))
    fig, axes = plt.subplots(len(workloads), len(panels), figsize=(11, 3.1 * len(workloads)), squeeze=False)
    styles = {"bandwidth": ("tab:blue", "o", "HBM bandwidth (hbm_bw)"),
              "capacity": ("tab:orange", "s", "HBM capacity (hbm_bytes)")}
    for row, name in zip(axes, workloads):
        for ax, (col, label) in zip(row, panels):
            for knob, (color, marker, legend) in styles.items():
                mine = sorted((p for p in points if (p.workload, p.knob) == (name, knob)),
                              key=lambda p: p.scale)
                ax.plot([p.scale for p in mine], [p.row()[col] for p in mine], marker=marker, color=color,
                        label=legend, lw=1.4)
            ax.set_ylabel(label, fontsize=8)
            ax.set_xlabel("factor on the H100's value", fontsize=8)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=8)
            values = [p.row()[col] for p in points if p.workload == name]
            if col == "ttft_p50_s" and min(values) > 0 and max(values) / min(values) > 5:
                ax.set_yscale("log")
                ax.set_ylabel("TTFT p50 (s, log scale)", fontsize=8)
                ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
                ax.yaxis.set_minor_formatter(NullFormatter())
            elif col == "hit_rate":
                ax.set_ylim(-0.02, 1.02)
            else:
                ax.set_ylim(0, max(values) * 1.1)
        row[0].set_title(LABELS.get(name, name), fontsize=9, loc="left")
    axes[0][-1].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    from experiments.bandwidth_capacity_report import report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/bandwidth_capacity")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    points = run_points(WORKLOADS)
    csv_path = write_csv(points, out / "bandwidth_capacity.csv")
    png_path = plot(points, out / "bandwidth_capacity.png")
    finish(out, report(points, WORKLOADS), [csv_path, png_path], start, show=csv_path.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
