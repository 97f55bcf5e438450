"""Where measured TTFT exceeds the twin's (``ttft-steps`` and ``seat-wait`` of ``python -m validation.report``):
TTFT in units of the lone prompt step, and the excess against one inter-completion interval of the closed
loop, whose slope tells a missing seat from a latency outside the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from validation.host_fit import prompt_steps
from validation.report_tables import journal_ttft_ms, read_results, with_csv_columns


def lone_prompt_step_ms(row: dict[str, str]) -> float:
    """The twin's cost (ms) of a step that carries one request's whole prompt (the row's mean ISL) and
    nothing else, on the row's deployment: the unit P in which queueing behind other prompts is counted."""
    from hardware import BatchShape
    from twin.system import cost_model
    from validation.silicon import protocol, row_spec

    dep, _, cfg = prompt_steps(row)
    isl = max(1, round(row_spec(row).isl * (1.0 + protocol(row).low_frac) / 2.0))
    return cost_model(cfg, dep).step_cost(BatchShape.from_requests([isl], [isl])).total_s * 1e3


def interval_ms(osl: float, tpot_ms: float, c: int) -> float:
    """One inter-completion interval of a closed loop of ``c`` requests of ``osl`` output tokens: a request's
    lifetime (OSL x TPOT) over the requests in flight."""
    return osl * tpot_ms / c


def ttft_step_table(recs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, concurrency, ISL): medians over the rows of the measured and the twin's TTFT in units of
    the lone prompt step P, and of q = (measured - twin TTFT) / (OSL x measured TPOT / c), the share of one
    inter-completion interval of the closed loop that the excess amounts to (1: as if one request always
    waited for a seat). Each record: model, c, isl, osl, meas_ttft_ms, pred_ttft_ms, meas_tpot_ms, p_ms."""
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in recs:
        groups.setdefault((r["model"], r["c"], r["isl"]), []).append(r)
    out = []
    for (model, c, isl), rs in sorted(groups.items()):
        out.append({
            "model": model, "c": c, "isl": isl, "rows": len(rs),
            "meas_per_p": float(np.median([r["meas_ttft_ms"] / r["p_ms"] for r in rs])),
            "twin_per_p": float(np.median([r["pred_ttft_ms"] / r["p_ms"] for r in rs])),
            "q": float(np.median([(r["meas_ttft_ms"] - r["pred_ttft_ms"])
                                  / interval_ms(r["osl"], r["meas_tpot_ms"], r["c"]) for r in rs])),
        })
    return out


def ttft_steps(csv_path: Path, journal: Path, engine: str) -> str:
    """The genai-perf (aiconfigurator gap analysis) aggregated rows of one engine: TTFT in lone prompt steps."""
    from validation.silicon import GENAI_PERF, Skip, protocol, read_rows, row_spec

    pred = journal_ttft_ms(journal)
    recs = []
    for row in read_rows(csv_path):
        if row["backend"] != engine or row["id"] not in pred or protocol(row) is not GENAI_PERF:
            continue
        try:
            spec = row_spec(row)
        except Skip:
            continue
        recs.append({"model": f"{spec.model} {row['backend_version']}", "c": spec.per_rank_concurrency,
                     "isl": spec.isl, "osl": spec.osl, "meas_ttft_ms": float(row["silicon_ttft_ms"]),
                     "pred_ttft_ms": pred[row["id"]], "meas_tpot_ms": float(row["silicon_tpot_ms"]),
                     "p_ms": lone_prompt_step_ms(row)})
    lines = ["model                                           c    ISL  rows  meas/P  twin/P  q (excess / interval)"]
    for t in ttft_step_table(recs):
        lines.append(f"{t['model']:46s} {t['c']:4d} {t['isl']:6d} {t['rows']:5d} {t['meas_per_p']:7.2f} "
                     f"{t['twin_per_p']:7.2f} {t['q']:7.2f}")
    return "\n".join(lines)


def seat_wait_fit(recs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Least-squares ``excess_ms = slope x interval_ms + intercept_ms`` over records with those two keys, and
    the correlation of the two (NaN with fewer than two distinct intervals)."""
    x = np.array([r["interval_ms"] for r in recs], dtype=float)
    y = np.array([r["excess_ms"] for r in recs], dtype=float)
    if len(x) < 2 or np.ptp(x) == 0.0:
        return {"rows": len(x), "slope": float("nan"), "intercept_ms": float("nan"), "corr": float("nan")}
    slope, intercept = np.polyfit(x, y, 1)
    corr = float(np.corrcoef(x, y)[0, 1]) if np.ptp(y) > 0.0 else float("nan")
    return {"rows": len(x), "slope": float(slope), "intercept_ms": float(intercept), "corr": corr}


def _no_minus_zero(x: float, places: int) -> float:
    """``x``, or 0.0 where it would print as a negative zero at ``places`` decimals."""
    return 0.0 if round(x, places) == 0 else x


def seat_waits(out: Path, keys: Sequence[str], max_conc: int, protocol_name: str = "genai-perf",
               detail: bool = False) -> str:
    from validation.silicon import Skip, row_spec

    rows = [r for r in read_results(out) if r["mode"] == "agg" and r["protocol"] == protocol_name]
    if not rows:
        return f"{out}: no represented aggregated {protocol_name} rows"
    # (the measured CSV's whole row: row_spec reads its parallelism for the concurrency per rank)
    rows = with_csv_columns(out, rows, [*keys, "tp_size", "attention_dp_size", "moe_ep_size"])
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        try:
            c = row_spec(r).per_rank_concurrency
        except Skip:
            continue
        if c > max_conc:
            continue
        groups.setdefault(tuple(str(r[k]) for k in keys), []).append(
            {"interval_ms": interval_ms(float(r["osl"]), float(r["meas_tpot_ms"]), c), "excess_ms": float(r["meas_ttft_ms"]) - float(r["pred_ttft_ms"]),
             "tp": str(r["tp_size"]), "c": c})
    lines = [f"{protocol_name} aggregated rows, concurrency per rank <= {max_conc}: excess = measured - predicted "
             f"TTFT, interval = OSL x measured TPOT / c",
             f"{'rows':>5} {'slope':>6} {'intercept ms':>13} {'corr':>5}  {' / '.join(keys)}"]
    for g, recs in sorted(groups.items()):
        f = seat_wait_fit(recs)
        slope, intercept, corr = (_no_minus_zero(f[k], p) for k, p in (("slope", 2), ("intercept_ms", 0), ("corr", 2)))
        lines.append(f"{f['rows']:5d} {slope:6.2f} {intercept:13.0f} {corr:5.2f}  "
                     f"{' / '.join(v or '-' for v in g)}")
        if detail:
            cells: dict[tuple[str, int], list[float]] = {}
            for r in recs:
                cells.setdefault((r["tp"], r["c"]), []).append(r["excess_ms"] / r["interval_ms"])
            for tp in sorted({tp for tp, _ in cells}, key=lambda t: (len(t), t)):
                lines.append(f"{'':27}tp {tp}: " + ", ".join(
                    f"c{c} {float(np.median(v)):.2f}" for (t, c), v in sorted(cells.items()) if t == tp))
    return "\n".join(lines)
