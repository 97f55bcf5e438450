"""Agent replays at rising concurrency: where the agents' contexts outgrow the KV pool (issue 51).

The shipped agent sessions, replayed with their tool waits (``workloads/data``: 23 SWE-bench mini-swe-agent
trajectories, 80 calls of 21k tokens on average, up to 85k; 200 tau-bench airline conversations, 12 calls of
6k tokens) on Llama-3.1-8B on one L40S (48 GB: a 24 GiB KV pool of 12,335 blocks, 197k tokens, next to the
weights; vLLM's defaults, prefix caching on). N agents run at once (closed loop: the next session starts
when one ends), N rising until every session runs at once. Each agent's calls hit its own earlier context
while it stays cached, so throughput grows with N until the N contexts no longer fit the pool: then they
evict each other, the hit rate falls, prompts are recomputed and requests preempted, and throughput falls.

Writes ``agent_concurrency.csv`` (one row per workload and N), ``agent_concurrency.png`` (throughput and TTFT
against N; the queue, sessions in tool waits, KV usage and prefix-hit rate over time for three N around the
peak) and ``summary.md`` (what the figure shows, from the numbers).

    python experiments/agent_concurrency.py --out out/agent_concurrency
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import attrs
import numpy as np

from experiments.tables import finish, write_rows
from twin.config import load_config
from twin.plots import default_hit_window, hit_rate, tokens_label
from twin.results import Results
from twin.runner import Simulation

DEPLOYMENT: dict[str, Any] = {
    "hardware": {"gpu": "l40s"}, "model": {"name": "meta-llama/Llama-3.1-8B"}, "engine": {"name": "vllm"},
    "system": {"kind": "colocated", "replicas": 1, "tp": 1}, "metrics": {"sample_interval_s": 1.0},
    "run": {"seed": 0}}
WORKLOADS = {"SWE-bench": "pkg:workloads/data/swe_bench_dev.jsonl",
             "tau-bench": "pkg:workloads/data/tau_bench_airline.jsonl"}
AGENTS = {"SWE-bench": (1, 2, 4, 8, 16, 23), "tau-bench": (1, 4, 16, 32, 64, 128, 200)}
"""Agents in flight per workload (up to every session of the set at once: 23 and 200)."""
FEATURED = {"SWE-bench": (4, 8, 16), "tau-bench": (32, 64, 128)}
"""The N whose gauges the figure draws over time: below, at and above each workload's peak."""
COLUMNS = ("workload", "agents", "sessions", "calls", "failed", "output_tokens_per_s", "calls_per_s",
           "ttft_p50_s", "ttft_p99_s", "hit_rate", "uncached_prompt_tokens", "preemptions", "kv_usage_peak",
           "waiting_mean", "in_tool_wait_mean", "simulated_s")


@attrs.frozen(kw_only=True)
class Point:
    """One workload replayed with ``agents`` sessions in flight."""

    workload: str
    agents: int
    results: Results

    def row(self) -> dict[str, Any]:
        s, ts = self.results.summary, self.results.timeseries
        cache = s["prefix_cache"]
        return {"workload": self.workload, "agents": self.agents, "sessions": s["sessions"]["finished"],
                "calls": s["requests"]["completed"], "failed": s["requests"]["failed"],
                "output_tokens_per_s": s["throughput"]["output_tokens_per_s"],
                "calls_per_s": s["throughput"]["requests_per_s"], "ttft_p50_s": s["ttft_s"]["p50"],
                "ttft_p99_s": s["ttft_s"]["p99"], "hit_rate": s["prefix_cache"]["hit_rate"],
                "uncached_prompt_tokens": cache["prompt_tokens"] - cache["cached_tokens"],
                "preemptions": s["preemptions"],
                "kv_usage_peak": float(np.max(ts["kv_usage"])), "waiting_mean": _time_mean(ts, "waiting"),
                "in_tool_wait_mean": _time_mean(ts, "sessions_in_wait"),
                "simulated_s": s["sim"]["simulated_s"]}


def _time_mean(ts: Mapping[str, np.ndarray], col: str) -> float:
    """A gauge's mean over time (rows are not evenly spaced: a still stretch is its first and last rows)."""
    t, v = ts["time_s"], ts[col]
    if len(t) < 2 or t[-1] <= t[0]:
        return float(v[0]) if len(v) else float("nan")
    return float(np.sum(v[:-1] * np.diff(t)) / (t[-1] - t[0]))


def config(workload: str, agents: int, limit: int | None = None) -> dict[str, Any]:
    """The deployment replaying ``workload``'s sessions, ``agents`` in flight (the first ``limit`` only)."""
    wl: dict[str, Any] = {"kind": "sessions", "path": WORKLOADS[workload],
                          "arrival": {"kind": "concurrency", "concurrency": agents}}
    if limit is not None:
        wl["limit"] = limit
    return {**DEPLOYMENT, "name": f"{workload}-{agents}", "workload": wl}


def point(workload: str, agents: int, limit: int | None = None) -> Point:
    results = Simulation(load_config(config(workload, agents, limit))).run()
    return Point(workload=workload, agents=agents, results=results)


def run_points(agents: Mapping[str, Iterable[int]] = AGENTS, limit: int | None = None) -> list[Point]:
    return [point(w, n, limit) for w, levels in agents.items() for n in levels]


def write_csv(points: Iterable[Point], path: Path) -> Path:
    return write_rows((p.row() for p in points), COLUMNS, path)


def peak(points: Sequence[Point], workload: str) -> Point:
    """The workload's point of highest output throughput."""
    return max((p for p in points if p.workload == workload), key=lambda p: p.row()["output_tokens_per_s"])


# -------------------------------------------------------------------------------------------- figure
def plot(points: Sequence[Point], path: Path, featured: Mapping[str, Sequence[int]] = FEATURED,
         dpi: int = 200) -> Path:
    """Top: throughput and TTFT against the number of agents; below, per workload, gauges over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import StrMethodFormatter

    from twin.plots import PAPER_RC, WIDTH_IN

    workloads = list(dict.fromkeys(p.workload for p in points))
    with plt.rc_context(PAPER_RC):
        fig = plt.figure(figsize=(WIDTH_IN, 8.4), layout="constrained")
        parts: Any = fig.subfigures(2, 1, height_ratios=(1, 3.3))
        top, bottom = parts
        tput, ttft = top.subplots(1, 2)
        for i, w in enumerate(workloads):
            mine = sorted((p for p in points if p.workload == w), key=lambda p: p.agents)
            x = [p.agents for p in mine]
            rows = [p.row() for p in mine]
            tput.plot(x, [r["output_tokens_per_s"] for r in rows], marker="o", ms=3, color=f"C{i}", label=w)
            ttft.plot(x, [r["ttft_p50_s"] for r in rows], marker="o", ms=3, color=f"C{i}", label=f"{w} p50")
            ttft.plot(x, [r["ttft_p99_s"] for r in rows], ":", marker="o", ms=3, mfc="none", color=f"C{i}",
                      label=f"{w} p99")
        for ax in (tput, ttft):
            ax.set_xscale("log")
            ax.set_xlabel("agents in flight (log scale)")
            ax.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
            ax.legend(loc="upper left", framealpha=0.7)
        tput.set_ylabel("output tokens / s")
        tput.set_ylim(bottom=0)
        ttft.set_ylabel("TTFT (s, log scale)")
        ttft.set_yscale("log")
        ttft.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
        top.suptitle("Llama-3.1-8B on one L40S, shipped agent sessions replayed with their tool waits",
                     fontsize=8.5)
        columns = bottom.subfigures(1, len(workloads))
        for sub, w in zip(np.atleast_1d(columns), workloads):
            _over_time(sub, w, [p for p in points if p.workload == w and p.agents in featured[w]])
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
    return path


def admissions(res: Results) -> dict[str, np.ndarray]:
    """The request columns :func:`twin.plots.hit_rate` reads, as floats."""
    cols = ("first_scheduled_s", "prompt_tokens", "cached_tokens")
    return {c: res.requests[c].astype(np.float64) for c in cols}


def _over_time(sub: Any, workload: str, mine: Sequence[Point]) -> None:
    axes = sub.subplots(4, 1, sharex=True)
    window = default_hit_window(admissions(mine[0].results))
    for i, p in enumerate(sorted(mine, key=lambda q: q.agents)):
        ts, colour = p.results.timeseries, f"C{i + 2}"
        t = ts["time_s"]
        label = f"{p.agents} agents"
        axes[0].plot(t, ts["waiting"], color=colour, lw=0.8, label=label)
        axes[1].plot(t, ts["sessions_in_wait"], color=colour, lw=0.8, label=label)
        axes[2].plot(t, ts["kv_usage"], color=colour, lw=0.8, label=label)
        axes[3].plot(t, hit_rate(admissions(p.results), t, window), color=colour, label=label)
    labels = ["requests waiting", "sessions in a\ntool wait", "KV usage\n(share of pool)",
              f"hit rate, last {tokens_label(window)}\nadmitted prompt tokens"]
    for ax, label in zip(axes, labels):
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
    axes[2].set_ylim(0, 1.05)
    axes[3].set_ylim(0, 1.05)
    axes[0].legend(loc="upper right", framealpha=0.7)
    axes[-1].set_xlabel("simulated time (s)")
    sub.suptitle(f"{workload}, over time", fontsize=8, x=0.02, ha="left")


# ------------------------------------------------------------------------------------------- summary
def report(points: Sequence[Point], featured: Mapping[str, Sequence[int]] = FEATURED) -> str:
    """``summary.md``: per workload, throughput and TTFT against N and what happens past the peak."""
    pool = points[0].results.summary["kv_capacity"][0]
    lines = ["# Agent replays at rising concurrency", "",
             f"Llama-3.1-8B on one L40S (vLLM defaults, prefix caching on; a KV pool of {pool['blocks']:,} "
             f"blocks, {pool['tokens']:,} tokens); the shipped agent sessions replayed with their tool "
             f"waits, N in flight at once (closed loop: the next session starts when one ends).", ""]
    for w in dict.fromkeys(p.workload for p in points):
        mine = sorted((p for p in points if p.workload == w), key=lambda p: p.agents)
        rows = {p.agents: p.row() for p in mine}
        lines += [f"## {w}", "", "| " + " | ".join(TABLE) + " |", "|" + "---:|" * len(TABLE)]
        lines += ["| " + " | ".join(fmt.format(rows[n][col]) for col, fmt in TABLE.values()) + " |"
                  for n in rows]
        lines += ["", _peak_text(rows, peak(points, w).row()), ""]
    lines += ["## Over time (lower panels)", ""]
    for w, levels in featured.items():
        mine = sorted((p for p in points if p.workload == w and p.agents in levels), key=lambda p: p.agents)
        if mine:
            window = default_hit_window(admissions(mine[0].results))
            lines += [f"* {w}: " + "; ".join(_over_time_text(p, window) for p in mine) + "."]
    return "\n".join(lines) + "\n"


TABLE = {"agents": ("agents", "{}"), "output tok/s": ("output_tokens_per_s", "{:.0f}"),
         "calls/s": ("calls_per_s", "{:.2f}"), "TTFT p50 (s)": ("ttft_p50_s", "{:.3f}"),
         "TTFT p99 (s)": ("ttft_p99_s", "{:.2f}"), "hit rate": ("hit_rate", "{:.3f}"),
         "prompt tokens computed": ("uncached_prompt_tokens", "{:,}"), "preemptions": ("preemptions", "{}"),
         "peak KV usage": ("kv_usage_peak", "{:.2f}"), "mean waiting": ("waiting_mean", "{:.2f}"),
         "mean in tool wait": ("in_tool_wait_mean", "{:.2f}")}
"""summary.md's table: heading -> (row key, format)."""


def _peak_text(rows: Mapping[int, Mapping[str, Any]], best: Mapping[str, Any]) -> str:
    """Throughput up to the peak, and what happens past it (from the runs' rows, by N)."""
    first, last = rows[min(rows)], rows[max(rows)]
    n1, tput1, top = first["agents"], first["output_tokens_per_s"], best["output_tokens_per_s"]
    text = (f"Throughput rises from {tput1:.0f} output tokens/s with {n1} agent{'s' if n1 > 1 else ''} to a "
            f"peak of {top:.0f} with {best['agents']} (x{top / tput1:.1f}); TTFT p50 goes from "
            f"{first['ttft_p50_s']:.3f} s to {best['ttft_p50_s']:.3f} s.")
    if best["agents"] != last["agents"]:
        computed = (first["uncached_prompt_tokens"] / 1e6, last["uncached_prompt_tokens"] / 1e6)
        text += (f" Past the peak the agents' contexts no longer fit the KV pool together and evict each "
                 f"other: with {last['agents']} agents the prefix-hit rate ({first['hit_rate']:.2f} with "
                 f"{n1}, {best['hit_rate']:.2f} at the peak) falls to {last['hit_rate']:.2f}, the prompt "
                 f"tokens computed grow from {computed[0]:.2f}M to {computed[1]:.2f}M, {last['preemptions']} "
                 f"requests are preempted, throughput drops to {last['output_tokens_per_s']:.0f} tokens/s "
                 f"({last['output_tokens_per_s'] / top:.0%} of the peak) and TTFT p50 reaches "
                 f"{last['ttft_p50_s']:.2f} s (p99 {last['ttft_p99_s']:.1f} s).")
    else:
        text += " It is still rising with every session of the set in flight."
    failed = sum(r["failed"] for r in rows.values())
    return text + (" Every call completes at every N." if failed == 0 else f" {failed} calls fail in all.")


def _over_time_text(p: Point, window: float) -> str:
    """When the pool filled, how low the trailing hit rate went and for how long, how many requests waited."""
    ts, req = p.results.timeseries, admissions(p.results)
    t = ts["time_s"]
    rate = hit_rate(req, t, window)
    # From the time the window first fills on: before it, the sessions' first (cold) prompts dominate it.
    admitted = np.isfinite(req["first_scheduled_s"])
    order = np.argsort(req["first_scheduled_s"][admitted], kind="stable")
    when = req["first_scheduled_s"][admitted][order]
    filled = int(np.searchsorted(np.cumsum(req["prompt_tokens"][admitted][order]), window))
    rate[t < when[min(filled, len(when) - 1)]] = np.nan
    text = f"{p.agents} agent{'s' if p.agents > 1 else ''}: "
    full = np.flatnonzero(ts["kv_usage"] >= 0.99)
    if len(full):
        text += f"KV pool full from t = {t[full[0]]:.0f} s"
    else:
        text += f"KV usage at most {np.max(ts['kv_usage']):.2f}"
    low = int(np.nanargmin(rate))
    text += f", hit rate (last {tokens_label(window)} prompt tokens) at least {rate[low]:.2f}"
    if rate[low] < 0.9:
        below = np.flatnonzero(rate < 0.9)
        text += f" (t = {t[low]:.0f} s; first below 0.9 at {t[below[0]]:.0f} s, last at {t[below[-1]]:.0f} s)"
    return text + f", at most {np.max(ts['waiting']):.0f} requests waiting"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/agent_concurrency")
    parser.add_argument("--dpi", type=int, default=200, help="of the PNG (the gallery's: 110)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    points = run_points()
    csv_path = write_csv(points, out / "agent_concurrency.csv")
    png_path = plot(points, out / "agent_concurrency.png", dpi=args.dpi)
    finish(out, report(points), [csv_path, png_path], start, show=csv_path.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
