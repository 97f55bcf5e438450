"""Bandwidth vs runtime costs: does a latency-bound or a throughput-bound service gain more from 1.4x the HBM
bandwidth or from the engine's host work gone (issue 51)?

The deployment (``bandwidth_vs_runtime.yaml`` beside this file): DeepSeek-R1 FP8 on 8 H200s under TensorRT-LLM
with attention data parallelism (8 ranks of tp 1 in lockstep, experts over ep 8), as the built-in example
``dp_attention``. Two services, 1,024 tokens in and 1,024 out, closed loop: latency-bound, 8 requests in
flight (one per rank); throughput-bound, 512 in flight (64 per rank).

The levers, one per run: ``hardware.scale.hbm_bw: 1.4``, and each cost-ledger term of the scheduler and
runtime families (``hardware.cost.TERMS``: step_host, request_host, cuda_graph_padding; kernel_launch,
eager_host, kv_traversal, collective_setup, dp_imbalance) switched off with ``hardware.disabled_terms``, then
all of them at once. The config can switch a term off but not scale it, so "term off" stands for "x0.5"
here: it is the most halving the term could buy (a halved term saves at most half its exposed time; a term
hidden under GPU work saves nothing either way).

Why, from the ledger: each run's ``ledger`` holds the seconds every term took over the run, per rank
(``dp_wait`` is the time a rank waited for the slowest rank of its lockstep step: the attention-DP imbalance
as simulated, not a cost term). TensorRT-LLM overlaps scheduling with the GPU step (``host_overlap``), so a
host term is exposed only where the host work outlasts the GPU work; the study prices each service's typical
decode step (its requests per rank, at the input plus half the output of context: the mean over a
request's decode; in the lockstep group) with and without the
overlap to say how much host work is hidden.

Writes ``bandwidth_vs_runtime.csv`` (TPOT, TTFT, throughput per service and lever, with the change from the
baseline), ``bandwidth_vs_runtime.png`` (per service: the baseline's ledger shares; the change each lever
makes to TPOT, TTFT and throughput) and ``summary.md``.

    python experiments/bandwidth_vs_runtime.py --out out/bandwidth_vs_runtime
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import attrs

from experiments.tables import finish, write_rows
from hardware.cost import HOST_TERMS, TERMS
from hardware.shape import BatchShape
from twin.config import load_config
from twin.config_codec import read_yaml
from twin.runner import Simulation
from twin.system import cost_model, kv_blocks, make_deployment, resolve, worker_max_num_seqs

DEPLOYMENT = Path(__file__).with_suffix(".yaml")
ISL = OSL = 1024
SERVICES: dict[str, dict[str, int]] = {"latency-bound": {"concurrency": 8, "num_requests": 64},
                                       "throughput-bound": {"concurrency": 512, "num_requests": 2048}}
"""Requests in flight and requests sent (8 and 4 turnovers) per service."""
SCHEDULER_TERMS = tuple(t for t, (family, _) in TERMS.items() if family == "scheduler")
RUNTIME_TERMS = tuple(t for t, (family, _) in TERMS.items() if family == "runtime")
BASELINE = "baseline"
HBM = "HBM bandwidth x1.4"
ALL_OFF = "all scheduler + runtime terms off"
LEVERS: dict[str, dict[str, Any]] = {
    BASELINE: {}, HBM: {"scale": {"hbm_bw": 1.4}},
    **{f"{t} off": {"disabled_terms": [t]} for t in SCHEDULER_TERMS + RUNTIME_TERMS},
    ALL_OFF: {"disabled_terms": list(SCHEDULER_TERMS + RUNTIME_TERMS)}}
"""Lever name -> the ``hardware`` settings it adds to the deployment's."""
COLUMNS = ("service", "lever", "family", "tpot_p50_ms", "ttft_p50_ms", "output_tokens_per_s",
           "output_tokens_per_s_per_gpu", "tpot_change_pct", "ttft_change_pct", "throughput_change_pct")


def family(lever: str) -> str:
    if lever in (BASELINE, HBM):
        return {"baseline": "-", HBM: "bandwidth"}[lever]
    if lever == ALL_OFF:
        return "scheduler+runtime"
    return TERMS[lever.removesuffix(" off")][0]


@attrs.frozen(kw_only=True)
class Point:
    """One service run with one lever."""

    service: str
    concurrency: int
    lever: str
    summary: dict[str, Any]
    terms_s: dict[str, float]
    """Seconds of every ledger term over the run, summed over the ranks (``dp_wait`` included)."""
    gpus: int

    @property
    def tpot_ms(self) -> float:
        return float(self.summary["tpot_s"]["p50"]) * 1e3

    @property
    def ttft_ms(self) -> float:
        return float(self.summary["ttft_s"]["p50"]) * 1e3

    @property
    def throughput(self) -> float:
        return float(self.summary["throughput"]["output_tokens_per_s"])

    def shares(self) -> dict[str, float]:
        total = sum(self.terms_s.values())
        return {t: s / total for t, s in self.terms_s.items()}

    def row(self, base: "Point") -> dict[str, Any]:
        def change(a: float, b: float) -> float:
            return 100.0 * (a / b - 1.0)

        return {"service": self.service, "lever": self.lever, "family": family(self.lever),
                "tpot_p50_ms": self.tpot_ms, "ttft_p50_ms": self.ttft_ms,
                "output_tokens_per_s": self.throughput,
                "output_tokens_per_s_per_gpu": self.throughput / self.gpus,
                "tpot_change_pct": change(self.tpot_ms, base.tpot_ms),
                "ttft_change_pct": change(self.ttft_ms, base.ttft_ms),
                "throughput_change_pct": change(self.throughput, base.throughput)}


@attrs.frozen(kw_only=True)
class HostCheck:
    """A service's typical decode step on one rank, priced with and without the engine's host overlap."""

    service: str
    batch: int
    context: int
    gpu_s: float
    """The step's GPU terms (everything but the host terms)."""
    host_s: dict[str, float]
    """The host terms as computed (no overlap)."""
    exposed_s: dict[str, float]
    """The host terms left exposed by the overlap (what the ledger records)."""


def deployment() -> dict[str, Any]:
    """``bandwidth_vs_runtime.yaml`` as a mapping (no workload, no lever)."""
    return read_yaml(DEPLOYMENT)


def workload(service: Mapping[str, int]) -> dict[str, Any]:
    """The service's closed-loop requests (``input_tokens`` / ``output_tokens`` default to ISL / OSL)."""
    return {"kind": "synthetic", "num_requests": service["num_requests"],
            "input_tokens": service.get("input_tokens", ISL),
            "output_tokens": service.get("output_tokens", OSL),
            "arrival": {"kind": "concurrency", "concurrency": service["concurrency"]}}


def config_data(service: Mapping[str, int], lever: Mapping[str, Any],
                base: Mapping[str, Any]) -> dict[str, Any]:
    return {**base, "workload": workload(service), "hardware": {**base.get("hardware", {}), **lever}}


def gpus(base: Mapping[str, Any]) -> int:
    s = base["system"]
    return int(s.get("replicas", 1)) * int(s.get("tp", 1)) * int(s.get("attention_dp", 1))


def point(name: str, service: Mapping[str, int], lever: str, base: Mapping[str, Any] | None = None) -> Point:
    base = base if base is not None else deployment()
    res = Simulation(load_config(config_data(service, LEVERS[lever], base))).run()
    terms: dict[str, float] = {}
    for key, worker in res.ledger.items():
        if key.startswith("worker"):
            worker_terms: Mapping[str, float] = worker["terms_s"]  # type: ignore[assignment]
            for term, seconds in worker_terms.items():
                terms[term] = terms.get(term, 0.0) + seconds
    return Point(service=name, concurrency=service["concurrency"], lever=lever, summary=res.summary,
                 terms_s=terms, gpus=gpus(base))


def run_points(services: Mapping[str, Mapping[str, int]] = SERVICES, levers: Iterable[str] = LEVERS,
               base: Mapping[str, Any] | None = None) -> list[Point]:
    base = base if base is not None else deployment()
    return [point(name, service, lever, base) for name, service in services.items() for lever in levers]


def host_check(name: str, service: Mapping[str, int], base: Mapping[str, Any] | None = None) -> HostCheck:
    """Price the service's typical pure-decode step on one rank (built as ``twin.system`` builds the worker),
    as the engine runs it (host work overlapped) and with the overlap off, to see the hidden host work."""
    base = base if base is not None else deployment()
    config = resolve(load_config(config_data(service, {}, base)))
    s = config.system
    dp = int(s.attention_dp)  # type: ignore[attr-defined]
    dep = make_deployment(config, s.tp, ep=s.ep, attention_dp=dp,  # type: ignore[attr-defined]
                          redundant_experts=s.redundant_experts)  # type: ignore[attr-defined]
    seqs = worker_max_num_seqs(config, dep, kv_blocks(config, dep))
    batch = max(1, service["concurrency"] // dp)
    context = service.get("input_tokens", ISL) + service.get("output_tokens", OSL) // 2
    shape = BatchShape.from_requests([1] * batch, [context] * batch)
    overlapped, _ = cost_model(config, dep, max_num_seqs=seqs).price_in_group(shape, batch * dp)
    serial = attrs.evolve(dep, engine=attrs.evolve(dep.engine, host_overlap=False))
    raw, _ = cost_model(config, serial, max_num_seqs=seqs).price_in_group(shape, batch * dp)
    return HostCheck(service=name, batch=batch, context=context,
                     gpu_s=sum(v for t, v in raw.items() if t not in HOST_TERMS),
                     host_s={t: raw.get(t, 0.0) for t in HOST_TERMS},
                     exposed_s={t: overlapped.get(t, 0.0) for t in HOST_TERMS})


def baselines(points: Sequence[Point]) -> dict[str, Point]:
    return {p.service: p for p in points if p.lever == BASELINE}


def write_csv(points: Sequence[Point], path: Path) -> Path:
    base = baselines(points)
    return write_rows((p.row(base[p.service]) for p in points), COLUMNS, path)


def ledger_bars(p: Point, top: int = 5) -> list[tuple[str, float, str]]:
    """(label, share, colour) of the baseline's step time: the largest GPU terms, the rest of the GPU work,
    each family of host-side terms and the lockstep wait."""
    shares = p.shares()
    gpu = sorted(((t, v) for t, v in shares.items() if t in TERMS and TERMS[t][0] == "throughput"),
                 key=lambda tv: -tv[1])
    bars = [(t, v, "tab:blue") for t, v in gpu[:top]]
    bars.append((f"{len(gpu) - top} other GPU terms", sum(v for _, v in gpu[top:]), "tab:cyan"))
    bars.append((f"scheduler terms ({len(SCHEDULER_TERMS)})",
                 sum(shares.get(t, 0.0) for t in SCHEDULER_TERMS), "tab:orange"))
    bars.append((f"runtime terms ({len(RUNTIME_TERMS)})", sum(shares.get(t, 0.0) for t in RUNTIME_TERMS),
                 "tab:green"))
    bars.append(("dp_wait (lockstep wait)", shares.get("dp_wait", 0.0), "0.5"))
    return bars


METRICS = (("tpot_change_pct", "TPOT p50", "tab:blue"), ("ttft_change_pct", "TTFT p50", "tab:orange"),
           ("throughput_change_pct", "output throughput", "tab:green"))


def plot(points: Sequence[Point], path: Path, checks: Sequence[HostCheck] = (), dpi: int = 80) -> Path:
    """Per service (row): the baseline's ledger shares (and, hatched, the host work the engine hides under the
    GPU work of a typical step, as a share of that step); each lever's change of TPOT p50, TTFT p50 and output
    throughput against the baseline (%)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = baselines(points)
    fig, axes = plt.subplots(len(base), 2, figsize=(11.5, 3.9 * len(base)), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 1.45]})
    hidden = {c.service: sum(c.host_s.values()) / c.gpu_s for c in checks}
    for (left, right), (name, b) in zip(axes, base.items()):
        bars = ledger_bars(b)
        if name in hidden:
            bars.append(("host work hidden under\nthe GPU (typical step)", hidden[name], "white"))
        y = list(range(len(bars)))[::-1]
        left.barh(y, [100 * v for _, v, _ in bars], color=[c for _, _, c in bars], edgecolor="0.3",
                  hatch=["//" if c == "white" else "" for _, _, c in bars], lw=0.5)
        left.set_yticks(y, [label for label, _, _ in bars], fontsize=8)
        for yi, (_, v, _) in zip(y, bars):
            left.text(100 * v, yi, f" {100 * v:.1f}%", va="center", fontsize=7)
        left.set_xlim(0, 100 * max(v for _, v, _ in bars) * 1.3)
        left.set_xlabel("share of the baseline's rank time (%)", fontsize=8)
        left.set_title(f"{name}, {b.concurrency} in flight: baseline TPOT {b.tpot_ms:.1f} ms, "
                       f"{b.throughput / b.gpus:,.0f} tokens/s "
                       f"per GPU", fontsize=9, loc="left")
        mine = [p for p in points if p.service == name and p.lever != BASELINE]
        rows = [p.row(b) for p in mine]
        height = 0.26
        centre = [float(len(mine) - 1 - i) for i in range(len(mine))]
        for k, (col, label, colour) in enumerate(METRICS):
            yk = [c + (1 - k) * height for c in centre]
            values = [r[col] for r in rows]
            right.barh(yk, values, height=height, color=colour, label=f"{label} change")
            for yv, v in zip(yk, values):
                if abs(v) >= 0.05:
                    right.text(v, yv, f" {v:+.1f}" if v > 0 else f"{v:+.1f} ", va="center", fontsize=6.5,
                               ha="left" if v > 0 else "right")
        right.set_yticks(centre, [p.lever for p in mine], fontsize=8)
        right.axvline(0, color="black", lw=0.6)
        right.axhline(centre[0] - 0.5, color="0.6", lw=0.6, ls="--")
        lim = max(1.0, max(abs(r[c]) for r in rows for c, _, _ in METRICS)) * 1.3
        right.set_xlim(-lim, lim)
        right.set_xlabel("change against the baseline (%): TPOT / TTFT negative is faster", fontsize=8)
        right.grid(axis="x", alpha=0.3)
        right.tick_params(labelsize=8)
        right.legend(fontsize=7, loc="lower left", title="labelled where |change| >= 0.05%", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


MATTERS_PCT = 1.0
"""A lever "helps" a metric when it improves it by at least this many per cent."""


def report(points: Sequence[Point], checks: Sequence[HostCheck]) -> str:
    """``summary.md``: every number from the runs and the priced steps."""
    base = baselines(points)
    lines = ["# Bandwidth vs runtime costs", "",
             "DeepSeek-R1 FP8 on 8 H200s, TensorRT-LLM, attention DP 8 / EP 8, 1,024 in / 1,024 out, "
             "closed loop. Levers: `hardware.scale.hbm_bw: 1.4`, and each scheduler / runtime ledger term "
             "switched off with `hardware.disabled_terms` (the config has no factor for a term: \"off\" is "
             "used, the most halving it could buy). Numbers from `bandwidth_vs_runtime.csv` and the runs' "
             "ledgers.", ""]
    by_check = {c.service: c for c in checks}
    for name, b in base.items():
        mine = [p for p in points if p.service == name and p.lever != BASELINE]
        rows = {p.lever: p.row(b) for p in mine}
        shares = b.shares()
        gpu_share = sum(v for t, v in shares.items() if t in TERMS and TERMS[t][0] == "throughput")
        sched = sum(shares.get(t, 0.0) for t in SCHEDULER_TERMS)
        runtime = sum(shares.get(t, 0.0) for t in RUNTIME_TERMS)
        lines += [f"## {name} ({b.concurrency} in flight)", "",
                  f"Baseline: TPOT p50 {b.tpot_ms:.2f} ms, TTFT p50 {b.ttft_ms:.0f} ms, "
                  f"{b.throughput:,.0f} output tokens/s ({b.throughput / b.gpus:,.0f} per GPU). Ledger: GPU "
                  f"terms {gpu_share:.1%} of the ranks' time (largest {_largest(shares)}), scheduler terms "
                  f"{sched:.2%}, runtime terms {runtime:.2%}, lockstep wait (dp_wait) "
                  f"{shares.get('dp_wait', 0.0):.1%}.", ""]
        hbm = rows[HBM]
        moved = _moved(b, next(p for p in mine if p.lever == HBM))
        lines.append(f"* **{HBM}**: TPOT {hbm['tpot_change_pct']:+.1f}%, TTFT {hbm['ttft_change_pct']:+.1f}%,"
                     f" throughput {hbm['throughput_change_pct']:+.1f}%. The largest savings per step in the "
                     f"ledger: "
                     f"{moved}.")
        runtime_rows = {k: v for k, v in rows.items() if k != HBM}
        best = max(runtime_rows, key=lambda k: abs(runtime_rows[k]["tpot_change_pct"]))
        if abs(runtime_rows[best]["tpot_change_pct"]) < 0.01:
            text = "no term changes TPOT by 0.01% or more"
        else:
            text = (f"the largest TPOT change is {best} ({runtime_rows[best]['tpot_change_pct']:+.2f}%; "
                    f"throughput {runtime_rows[best]['throughput_change_pct']:+.2f}%)")
        off = rows[ALL_OFF]
        lines.append(f"* **Scheduler / runtime terms off**: {text}; with all of them off, TPOT "
                     f"{off['tpot_change_pct']:+.2f}%, TTFT {off['ttft_change_pct']:+.2f}%, "
                     f"throughput {off['throughput_change_pct']:+.2f}%.")
        c = by_check.get(name)
        if c is not None:
            host = sum(c.host_s.values())
            lines.append(f"* **Why**: at this service's typical step ({c.batch} request{'s' * (c.batch > 1)} "
                         f"per rank, {c.context:,} tokens of context) a rank's GPU work is "
                         f"{c.gpu_s * 1e3:.2f} ms "
                         f"and its host work {host * 1e3:.2f} ms ("
                         + ", ".join(f"{t} {v * 1e3:.3f}" for t, v in c.host_s.items())
                         + " ms); TensorRT-LLM's overlap scheduler runs the host work of the next step "
                         f"under the GPU work of this one, so {sum(c.exposed_s.values()) * 1e3:.3f} ms of it "
                         f"is exposed. "
                         f"The host work would have to grow {c.gpu_s / host:.1f}x before it showed.")
        lines.append("")
    lines += ["## Verdict", ""] + [f"* {_verdict(name, points, b)}" for name, b in base.items()]
    return "\n".join(lines) + "\n"


def _largest(shares: Mapping[str, float], n: int = 3) -> str:
    gpu = sorted(((t, v) for t, v in shares.items() if t in TERMS and TERMS[t][0] == "throughput"),
                 key=lambda tv: -tv[1])
    return ", ".join(f"{t} {v:.0%}" for t, v in gpu[:n])


def _moved(base: Point, lever: Point, n: int = 3) -> str:
    """The terms that changed most per step (seconds per step summed over ranks), largest first."""
    steps_b = max(1, int(base.summary["sim"]["steps"]))
    steps_l = max(1, int(lever.summary["sim"]["steps"]))
    change = {t: lever.terms_s.get(t, 0.0) / steps_l - s / steps_b for t, s in base.terms_s.items()}
    total_b = sum(base.terms_s.values()) / steps_b
    total_l = sum(lever.terms_s.values()) / steps_l
    top = sorted(change, key=lambda t: change[t])[:n]
    moved = sum(s / steps_b for t, s in base.terms_s.items() if change[t] < -0.01 * s / steps_b)
    return (", ".join(f"{t} {change[t] / (base.terms_s[t] / steps_b):+.0%}" for t in top if base.terms_s[t])
            + f"; the terms it moves at all are {moved / total_b:.0%} of the baseline step (the others do "
            f"not read HBM at its bound), so the step changes {total_l / total_b - 1:+.0%}")


def _verdict(name: str, points: Sequence[Point], b: Point) -> str:
    rows = {p.lever: p.row(b) for p in points if p.service == name and p.lever != BASELINE}
    helps = [k for k, r in rows.items()
             if r["tpot_change_pct"] <= -MATTERS_PCT or r["throughput_change_pct"] >= MATTERS_PCT]
    if not helps:
        return f"{name}: no lever changes TPOT or throughput by {MATTERS_PCT:g}% or more."
    parts = [f"{k} (TPOT {rows[k]['tpot_change_pct']:+.1f}%, throughput "
             f"{rows[k]['throughput_change_pct']:+.1f}%)" for k in helps]
    others = len(rows) - len(helps)
    return (f"{name}: {', '.join(parts)} helps; the other {others} lever{'s' * (others != 1)} change TPOT "
            f"and throughput by less than {MATTERS_PCT:g}%.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/bandwidth_vs_runtime")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    points = run_points()
    checks = [host_check(name, service) for name, service in SERVICES.items()]
    csv_path = write_csv(points, out / "bandwidth_vs_runtime.csv")
    png = plot(points, out / "bandwidth_vs_runtime.png", checks)
    finish(out, report(points, checks), [csv_path, png], start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
