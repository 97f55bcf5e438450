"""The accuracy summary of a validation run: MAPE of TTFT and TPOT per mode (aggregated, disaggregated) and
per GPU, engine and model, the error spread the MAPE hides, the skipped rows by reason, and its text form.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np


def _mape(values: Iterable[float]) -> float:
    v = [abs(x) for x in values if x == x and math.isfinite(x)]
    return float(np.mean(v)) if v else float("nan")


def error_spread(errors: list[float]) -> dict[str, float | None]:
    """Beside the MAPE, what it hides: the median absolute and the median signed error (%), and the share of
    rows within 10 % of the measurement (None without rows)."""
    if not errors:
        return {"median_abs": None, "median_signed": None, "within_10": None}
    e = np.asarray(errors, dtype=float)
    return {"median_abs": float(np.median(np.abs(e))), "median_signed": float(np.median(e)),
            "within_10": float(np.mean(np.abs(e) <= 10.0))}


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in results if "skipped" not in r]
    out: dict[str, Any] = {
        "rows": len(results), "rows_represented": len(done),
        "rows_skipped": [{"id": r["id"], "line": r["line"], "reason": r["skipped"]} for r in results if "skipped" in r],
    }
    reasons: dict[str, int] = {}
    for r in results:
        if "skipped" in r:
            reasons[r["skipped"]] = reasons.get(r["skipped"], 0) + 1
    out["skip_reasons"] = dict(sorted(reasons.items(), key=lambda kv: -kv[1]))
    for mode in ("agg", "disagg"):
        sub = [r for r in done if r["mode"] == mode]
        out[mode] = {"rows": len(sub), "tpot_mape": _mape(r["tpot_err_pct"] for r in sub),
                     "ttft_mape": _mape(r["ttft_err_pct"] for r in sub),
                     **{f"{m}_{k}": v for m in ("tpot", "ttft")
                        for k, v in error_spread([r[f"{m}_err_pct"] for r in sub]).items()}}
        for key in ("system", "backend", "model"):
            groups: dict[str, list[dict[str, Any]]] = {}
            for r in sub:
                groups.setdefault(r[key], []).append(r)
            out[mode][f"by_{key}"] = {g: {"rows": len(rs), "tpot_mape": _mape(r["tpot_err_pct"] for r in rs),
                                          "ttft_mape": _mape(r["ttft_err_pct"] for r in rs)}
                                      for g, rs in sorted(groups.items())}
    agg = out["agg"]
    out["tpot_mape"], out["ttft_mape"] = agg["tpot_mape"], agg["ttft_mape"]
    return out


def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"rows: {summary['rows']}, represented: {summary['rows_represented']}, "
             f"skipped: {len(summary['rows_skipped'])}"]
    for mode in ("agg", "disagg"):
        m = summary[mode]
        lines.append(f"{mode}: {m['rows']} rows, TPOT MAPE {m['tpot_mape']:.1f} %, TTFT MAPE {m['ttft_mape']:.1f} %")
        if m["rows"]:
            for metric in ("tpot", "ttft"):
                lines.append(f"  {metric.upper()}: median |error| {m[f'{metric}_median_abs']:.1f} %, median signed "
                             f"{m[f'{metric}_median_signed']:+.1f} %, within 10 %: "
                             f"{100 * m[f'{metric}_within_10']:.0f} % of rows")
        for key in ("backend", "model", "system"):
            for g, v in m[f"by_{key}"].items():
                lines.append(f"  {key} {g:40} {v['rows']:5} rows  TPOT {v['tpot_mape']:6.1f} %  "
                             f"TTFT {v['ttft_mape']:6.1f} %")
    return "\n".join(lines)
