"""``summary.md`` of the bandwidth-vs-capacity study: what bounds each workload, read off its points.

Every sentence is chosen and filled from the runs' summaries and ``hardware_whatif`` ledgers: a metric
"moves" with a knob when some factor changes it by at least ``MOVES`` of its value at 1.0, and the workload
is bound by the knob whose increase improves its throughput most (or, where neither does, its TTFT): the
resource it would buy more of. What cutting a knob costs is reported beside it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from experiments.bandwidth_capacity import KNOBS, LABELS, Point

MOVES = 0.05
"""Relative change (against the factor-1 run) counted as moving a metric."""
HIT_MOVES = 0.02
"""Absolute change of the prefix-cache hit rate counted as moving it."""
RESOURCE = {"bandwidth": "HBM bandwidth", "capacity": "HBM capacity"}


def series(points: Sequence[Point], workload: str, knob: str, column: str) -> dict[float, float]:
    """``column`` of the workload's points under ``knob``, by factor."""
    return {p.scale: float(p.row()[column]) for p in sorted(points, key=lambda p: p.scale)
            if p.workload == workload and p.knob == knob}


def ratios(values: Mapping[float, float]) -> dict[float, float]:
    base = values[1.0]
    return {s: (v / base if base else float("nan")) for s, v in values.items() if s != 1.0}


def spread(values: Mapping[float, float]) -> float:
    """Largest relative change from the factor-1 value."""
    return max((abs(r - 1) for r in ratios(values).values()), default=0.0)


def fmt(value: float, column: str) -> str:
    if column == "output_tokens_per_s":
        return f"{value:,.0f}"
    if column == "hit_rate":
        return f"{value:.2f}"
    return f"{value:.3g}"


def trend(values: Mapping[float, float], column: str, unit: str) -> str:
    """'1,816 / 2,481 / 3,293 tokens/s (x0.73, x1.33)': the values by factor, then each against factor 1."""
    text = f"{' / '.join(fmt(v, column) for v in values.values())}{unit}"
    if column == "hit_rate":
        return text
    return text + f" ({', '.join(f'x{r:.2f}' for r in ratios(values).values())})"


def report(points: Sequence[Point], workloads: Mapping[str, Mapping[str, Any]]) -> str:
    """The whole ``summary.md``."""
    lines = ["# HBM bandwidth vs capacity", "",
             "Qwen3-32B FP8, 1 prefill + 1 decode H100, vLLM, staged KV pulls; one knob scaled per run, "
             "the other at 1. Numbers from each run's summary (`bandwidth_capacity.csv`) and "
             "`hardware_whatif` ledger.", ""]
    lines += ledger_section(points)
    for name, workload in workloads.items():
        lines += workload_section(points, name, workload)
    return "\n".join(lines) + "\n"


def ledger_section(points: Sequence[Point]) -> list[str]:
    """What each knob moved in the cost model, from the first workload's what-if ledgers (same deployment)."""
    lines = ["## What each knob moves (ledger)", ""]
    first = points[0].workload
    for p in sorted((p for p in points if p.workload == first and p.whatif), key=lambda p: (p.knob, p.scale)):
        assert p.whatif is not None
        for group in p.whatif["workers"]:
            kv = group["kv_blocks"]
            steps = "; ".join(_step_text(label, group[label]) for label in ("decode", "prefill"))
            lines.append(f"* {KNOBS[p.knob]} x{p.scale:g} ({', '.join(group['workers'])}): KV pool "
                         f"{kv['named']:,} -> {kv['whatif']:,} blocks; {steps}.")
    ref = next((p.whatif["reference_steps"] for p in points if p.whatif), None)
    if ref:
        lines += ["", f"Reference steps: decode = {ref['decode']}; prefill = {ref['prefill']}."]
    return lines + [""]


def _step_text(label: str, step: Mapping[str, Any]) -> str:
    if not step["moved"]:
        return f"{label} step unchanged ({step['named_s'] * 1e3:.2f} ms, no term moved)"
    terms = ", ".join(f"{t} x{m['ratio']:.2f}" for t, m in step["moved"].items() if m["ratio"] is not None)
    return (f"{label} step {step['named_s'] * 1e3:.2f} -> {step['whatif_s'] * 1e3:.2f} ms "
            f"(x{step['whatif_s'] / step['named_s']:.2f}: {terms})")


def gain(values: Mapping[float, float], higher_is_better: bool) -> float:
    """Largest relative improvement a factor above 1 brings (0 where none helps)."""
    return max([(r - 1 if higher_is_better else 1 - r) for s, r in ratios(values).items() if s > 1.0] + [0.0])


def loss(values: Mapping[float, float], higher_is_better: bool) -> float:
    """Largest relative worsening a factor below 1 brings (0 where none hurts)."""
    return max([(1 - r if higher_is_better else r - 1) for s, r in ratios(values).items() if s < 1.0] + [0.0])


def workload_section(points: Sequence[Point], name: str, workload: Mapping[str, Any]) -> list[str]:
    """The workload's verdict: the knob whose increase helps most (throughput first, else TTFT), then why."""
    mine = [p for p in points if p.workload == name]
    cols = {c: {k: series(mine, name, k, c) for k in KNOBS}
            for c in ("output_tokens_per_s", "ttft_p50_s", "hit_rate")}
    thr, ttft, hit = cols["output_tokens_per_s"], cols["ttft_p50_s"], cols["hit_rate"]
    lines = [f"## {LABELS.get(name, name)}", ""]
    bound, metric = None, ""
    for column, label, better in (("output_tokens_per_s", "output throughput", True),
                                  ("ttft_p50_s", "TTFT p50", False)):
        gains = {k: gain(v, better) for k, v in cols[column].items()}
        if max(gains.values()) >= MOVES:
            bound, metric = max(gains, key=lambda k: gains[k]), label
            other = next(k for k in KNOBS if k != bound)
            top = max(cols[column][bound])
            also = f"by at most {gains[other]:.0%}" if gains[other] >= 0.005 else "not at all"
            lines.append(f"**{name} is {RESOURCE[bound]}-bound**: more {KNOBS[bound]} improves its {label} "
                         f"(x{ratios(cols[column][bound])[top]:.2f} at x{top:g}), "
                         f"more {KNOBS[other]} {also}.")
            hurt = loss(cols[column][other], better)
            if hurt >= MOVES:
                low = min(cols[column][other])
                lines[-1] += (f" Less {KNOBS[other]} still hurts: x{low:g} takes its {label} to "
                              f"x{ratios(cols[column][other])[low]:.2f}.")
            break
    if bound is None:
        lines.append(f"**{name} is bound by neither knob**: no factor above 1 improves its throughput or "
                     f"TTFT p50 by {MOVES:.0%} or more.")
    lines.append("")
    for knob in KNOBS:
        scales = " / ".join(f"x{s:g}" for s in thr[knob])
        lines.append(f"* {KNOBS[knob]} {scales}: throughput "
                     f"{trend(thr[knob], 'output_tokens_per_s', ' tokens/s')}; TTFT p50 "
                     f"{trend(ttft[knob], 'ttft_p50_s', ' s')}; hit rate {trend(hit[knob], 'hit_rate', '')}.")
    lines += _why(mine, workload, bound, metric, thr, hit)
    return lines + [""]


def _why(points: Sequence[Point], workload: Mapping[str, Any], bound: str | None, metric: str,
         thr: Mapping[str, Mapping[float, float]], hit: Mapping[str, Mapping[float, float]]) -> list[str]:
    """The reasons the numbers give: decode speed, preemptions, prefix-cache fit, a paced client."""
    by = {(p.knob, p.scale): p for p in points}
    demand = _kv_demand(workload)
    out = []
    if (bound, metric) == ("bandwidth", "output throughput"):
        tpot = " / ".join(f"{by['bandwidth', s].summary['tpot_s']['p50'] * 1e3:.1f}"
                          for s in thr["bandwidth"])
        out.append(f"* Decode sets the pace: TPOT p50 {tpot} ms under {KNOBS['bandwidth']}, as each decode "
                   f"step reads the weights and every running request's KV from HBM.")
    out += [_preempted(p, by["capacity", 1.0], demand) for p in points
            if p.knob == "capacity" and p.summary["preemptions"]]
    above = [s for s in thr["capacity"] if s > 1.0]
    if above and all({**by["capacity", s].row(), "scale": 1.0} == by["capacity", 1.0].row() for s in above):
        pool = by["capacity", 1.0].kv_tokens("decode")
        fit = (f"the {demand[0]:,} tokens {demand[1]} already fit the factor-1 pool of {pool:,} tokens"
               if demand else "its requests already fit")
        out.append(f"* Capacity beyond the H100's buys nothing: the x{above[-1]:g} run's metrics equal the "
                   f"1.0 run's exactly: {fit}, and no step price depends on capacity.")
    if max(hit["capacity"].values()) - min(hit["capacity"].values()) >= HIT_MOVES:
        out.append(_prefix_fit(by, workload, hit, (bound, metric) == ("capacity", "TTFT p50")))
    reuse = {s: v for s in thr["capacity"] if (v := _reused_share(by["capacity", s])) is not None}
    if reuse and max(reuse.values()) - min(reuse.values()) >= HIT_MOVES:
        pulls = " / ".join(f"{by['capacity', s].summary['kv_transfer']['transfer_s']['p50'] * 1e3:.3g}"
                           for s in reuse)
        out.append(f"* The decode worker's pool counts too: its delta pulls find "
                   f"{' / '.join(f'{v:.2f}' for v in reuse.values())} of a request's KV blocks already "
                   f"resident at {KNOBS['capacity']} {' / '.join(f'x{s:g}' for s in reuse)}, so the KV "
                   f"transfer p50 goes {pulls} ms.")
    if metric != "output throughput":
        paced = "its client's pacing" + (f" (qps {workload['qps']:g})" if "qps" in workload else "")
        out.append(f"* Throughput is set by {paced}, not by either resource: it moves by at most "
                   f"{max(spread(v) for v in thr.values()) * 100:.2g} % over all runs.")
    if (bound, metric) == ("capacity", "TTFT p50"):
        out.append(_bandwidth_on_ttft(points))
    return out


def _preempted(p: Point, base: Point, demand: tuple[int, str] | None) -> str:
    pool = p.kv_tokens("decode")
    need = f", short of the {demand[0]:,} tokens {demand[1]}" if demand and demand[0] > pool else ""
    change = p.row()["output_tokens_per_s"] / base.row()["output_tokens_per_s"]
    return (f"* At {KNOBS['capacity']} x{p.scale:g} the decode worker's KV pool holds {pool:,} tokens{need}: "
            f"{p.summary['preemptions']:,} preemptions recompute {p.summary['recomputed_tokens']:,} tokens, "
            f"and throughput falls to x{change:.2f}. Capacity binds too, once it is too small for the "
            f"running requests.")


def _prefix_fit(by: Mapping[tuple[str, float], Point], workload: Mapping[str, Any],
                hit: Mapping[str, Mapping[float, float]], decides_ttft: bool) -> str:
    """How the hit rate follows capacity, and whether the users' histories fit each prefill pool."""
    hit_cap, hit_bw = hit["capacity"], hit["bandwidth"]
    pools = " / ".join(f"{by['capacity', s].kv_tokens('prefill'):,}" for s in hit_cap)
    lead = ("The prefix cache decides TTFT: the hit rate" if decides_ttft
            else "The prefix-cache hit rate moves with capacity: it")
    text = (f"* {lead} goes {trend(hit_cap, 'hit_rate', '')} at {KNOBS['capacity']} "
            f"{' / '.join(f'x{s:g}' for s in hit_cap)} (the prefill worker's pool: {pools} tokens)")
    users = workload.get("num_users")
    if users:
        base = by["capacity", 1.0].summary
        mean_prompt = base["prefix_cache"]["prompt_tokens"] / max(base["requests"]["completed"], 1)
        need = users * mean_prompt
        fits = [f"x{s:g}" for s in hit_cap if by["capacity", s].kv_tokens("prefill") >= need]
        where = ("at every factor" if len(fits) == len(hit_cap) else f"at {', '.join(fits)} only" if fits
                 else "at no factor")
        text += (f"; the {users} users' histories, about {users} x {mean_prompt:,.0f} = {need:,.0f} tokens, "
                 f"fit {where}, and a history evicted before its user's next round is computed again")
    same = max(hit_bw.values()) - min(hit_bw.values()) < 1e-9
    return (text + f"; {KNOBS['bandwidth']} leaves it at {fmt(max(hit_bw.values()), 'hit_rate')}"
            + (" at every factor." if same else " or below."))


def _reused_share(p: Point) -> float | None:
    """Share of the pulled requests' KV blocks a delta pull found on the decode worker (None: no pulls)."""
    kv = p.summary.get("kv_transfer")
    if not kv or not kv["blocks"] + kv["reused_blocks"]:
        return None
    return float(kv["reused_blocks"] / (kv["blocks"] + kv["reused_blocks"]))


def _bandwidth_on_ttft(points: Sequence[Point]) -> str:
    """How far bandwidth moves TTFT, beside what it moves in the ledger's reference prefill step."""
    runs = sorted((p for p in points if p.knob == "bandwidth"), key=lambda p: p.scale)
    bw = ratios({p.scale: p.summary["ttft_s"]["p50"] for p in runs})
    text = (f"* {KNOBS['bandwidth']} moves TTFT p50 only to {', '.join(f'x{r:.2f}' for r in bw.values())} "
            f"at {', '.join(f'x{s:g}' for s in bw)}")
    prefill = _prefill_ratios(points)
    if prefill:
        text += (f"; the ledger's reference prefill step moves to "
                 f"{', '.join(f'x{r:.2f}' for r in prefill[0].values())}, only its "
                 f"{', '.join(prefill[1])} terms: the rest of a prompt step is compute-bound")
    return text + "."


def _prefill_ratios(points: Sequence[Point]) -> tuple[dict[float, float], list[str]] | None:
    """The reference prefill step's price against the shipped GPU under each bandwidth factor, and the terms
    that moved (first worker group of each run's ledger)."""
    runs = sorted((p for p in points if p.knob == "bandwidth" and p.whatif), key=lambda p: p.scale)
    if not runs:
        return None
    steps = {p.scale: p.whatif["workers"][0]["prefill"] for p in runs if p.whatif}
    return ({s: st["whatif_s"] / st["named_s"] for s, st in steps.items()},
            sorted({t for st in steps.values() for t in st["moved"]}))


def _kv_demand(workload: Mapping[str, Any]) -> tuple[int, str] | None:
    """KV the running requests reach at full length, for a closed loop of fixed-length requests."""
    arrival = workload.get("arrival") or {}
    ins, outs = workload.get("input_tokens"), workload.get("output_tokens")
    if arrival.get("kind") == "concurrency" and isinstance(ins, int) and isinstance(outs, int):
        n = int(arrival["concurrency"])
        return n * (ins + outs), f"its {n} running requests reach at full length ({n} x {ins + outs:,})"
    return None
