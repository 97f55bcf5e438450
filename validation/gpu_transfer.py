"""How predictions carry from one GPU to another (``gpu-pairs`` and ``transfer`` of
``python -m validation.report``): the same benchmark measured on both Hopper GPUs against the ratio the twin
predicts, and a GPU's rows simulated with its own fitted constants against constants fitted elsewhere.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from validation.report_tables import mape, read_results, with_csv_columns


PAIR_GPUS = ("h100_sxm", "h200_sxm")
PAIR_KEY = ("backend", "backend_version", "model_path", "precision", "mode", "isl", "osl", "tp_size", "pp_size",
            "attention_dp_size", "moe_tp_size", "moe_ep_size", "prefill_num_workers", "prefill_tp_size",
            "decode_num_workers", "decode_tp_size", "concurrency", "protocol", "measured")
"""What makes two rows the same benchmark on different GPUs: measured-CSV and rows.csv columns (``measured``:
the measurement date of silicon_data_source, validation.measured_rows.measured_day)."""


def _mean_ms(rows: Sequence[dict[str, Any]], col: str) -> float:
    return float(np.mean([float(r[col]) for r in rows]))


def gpu_pair_table(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Per group of ``keys`` (and one line for all, group ``("all",)``): the pairs of rows that ran the same
    benchmark (PAIR_KEY) on both PAIR_GPUS, with the median measured and predicted ratio of the second GPU to
    the first, for TPOT and TTFT, and the median and mean |transfer error| (predicted / measured ratio - 1).
    ``rows``: results with the measured CSV's columns; repeated rows of a benchmark are averaged per GPU."""
    by_bench: dict[tuple[str, ...], dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        if r["system"] in PAIR_GPUS:
            by_bench.setdefault(tuple(str(r[k]) for k in PAIR_KEY), {}).setdefault(r["system"], []).append(r)
    groups: dict[tuple[str, ...], list[dict[str, float]]] = {}
    ref, other = PAIR_GPUS
    for sides in by_bench.values():
        if len(sides) < 2:
            continue
        pair = {f"{kind}_{metric}": _mean_ms(sides[other], f"{kind}_{metric}_ms")
                / _mean_ms(sides[ref], f"{kind}_{metric}_ms")
                for metric in ("tpot", "ttft") for kind in ("meas", "pred")}
        first = sides[ref][0]
        for g in (("all",), tuple(str(first[k]) for k in keys)):
            groups.setdefault(g, []).append(pair)
    out = []
    for g, pairs in groups.items():
        line: dict[str, Any] = {"group": g, "pairs": len(pairs)}
        for metric in ("tpot", "ttft"):
            meas = np.array([p[f"meas_{metric}"] for p in pairs])
            pred = np.array([p[f"pred_{metric}"] for p in pairs])
            err = pred / meas - 1.0
            line.update({f"{metric}_meas": float(np.median(meas)), f"{metric}_pred": float(np.median(pred)),
                         f"{metric}_err": float(np.median(err)), f"{metric}_abs_err": float(np.mean(np.abs(err)))})
        out.append(line)
    return sorted(out, key=lambda t: (t["group"] != ("all",), t["group"]))


def gpu_pairs(out: Path, keys: Sequence[str]) -> str:
    from validation.measured_rows import measured_day

    rows = read_results(out)
    if not rows:
        return f"{out}: no represented rows"
    rows = with_csv_columns(out, rows, [k for k in PAIR_KEY if k != "measured"] + list(keys))
    rows = [{**r, "measured": measured_day(r)} for r in rows]
    table_ = gpu_pair_table(rows, keys)
    ref, other = PAIR_GPUS
    lines = [f"the same benchmark on {ref} and {other}: {other} / {ref}, median over pairs; transfer error = "
             f"predicted / measured ratio - 1 (median, mean |.|)",
             f"{'pairs':>5}  {'TPOT meas':>9} {'pred':>6} {'err %':>6} {'|err| %':>7}  {'TTFT meas':>9} {'pred':>6} "
             f"{'err %':>6} {'|err| %':>7}  {' / '.join(keys)}"]
    for t in table_:
        lines.append(f"{t['pairs']:5}  {t['tpot_meas']:9.3f} {t['tpot_pred']:6.3f} {100 * t['tpot_err']:+6.1f} "
                     f"{100 * t['tpot_abs_err']:7.1f}  {t['ttft_meas']:9.3f} {t['ttft_pred']:6.3f} "
                     f"{100 * t['ttft_err']:+6.1f} {100 * t['ttft_abs_err']:7.1f}  "
                     f"{' / '.join(v or '-' for v in t['group'])}")
    if not table_:
        lines.append("(no benchmark ran on both GPUs)")
    return "\n".join(lines)


def transfer_table(fitted: Sequence[dict[str, Any]], moved: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode (agg, disagg) on the rows both runs represent: MAPE with the constants fitted on the rows' own
    GPU and with constants moved to it (another GPU's fit, or another architecture's), and the difference."""
    theirs = {r["id"]: r for r in moved}
    out = []
    for mode in ("agg", "disagg"):
        pairs = [(r, theirs[r["id"]]) for r in fitted if r["mode"] == mode and r["id"] in theirs]
        row: dict[str, Any] = {"mode": mode, "rows": len(pairs)}
        for metric in ("tpot", "ttft"):
            a = mape(f[f"{metric}_err_pct"] for f, _ in pairs)
            b = mape(m[f"{metric}_err_pct"] for _, m in pairs)
            row.update({f"{metric}_fitted": a, f"{metric}_transfer": b, f"{metric}_gap": b - a})
        out.append(row)
    return out


def transfer(csv_path: Path, out: Path, systems: Sequence[str], constants: str, jobs: int = 1,
             every: int = 1, mode: str | None = None) -> str:
    """Simulate the rows measured on ``systems`` twice: with the shipped constants (fitted on tables that
    include those GPUs') and with ``hardware.constants`` = ``constants`` (fitted elsewhere), then compare.
    ``every``: only every k-th of those rows in file order (a smaller, unbiased sample); ``mode``: only the
    aggregated (``agg``) or disaggregated (``disagg``) ones. Both runs journal
    (OUT/fitted, OUT/transfer) and resume, so a repeated call only prints."""
    from validation.silicon import read_rows, validate_silicon

    ids = [r["id"] for r in read_rows(csv_path) if r["system"].strip() in systems
           and (mode is None or r["mode"].strip() == mode)][::every]
    if not ids:
        raise ValueError(f"{csv_path} has no row measured on {', '.join(systems)}")
    match = "^(?:" + "|".join(re.escape(i) for i in ids) + ")$"
    runs = {"fitted": (), "transfer": (f"hardware.constants={constants}",)}
    for name, settings in runs.items():
        validate_silicon(csv_path, out / name, jobs=jobs, match=match, progress=False, resume=True,
                         settings=settings)
    table_rows = transfer_table(read_results(out / "fitted"), read_results(out / "transfer"))
    sample = f" (every {every}th row)" if every > 1 else ""
    lines = [f"rows measured on {', '.join(systems)}: {len(ids)}{sample}; transfer constants: {constants}",
             f"  {'mode':7} {'rows':>5} | {'TPOT fitted':>11} {'transfer':>9} {'gap':>6} | "
             f"{'TTFT fitted':>11} {'transfer':>9} {'gap':>6}"]
    for r in table_rows:
        lines.append(f"  {r['mode']:7} {r['rows']:5} | {r['tpot_fitted']:10.1f}% {r['tpot_transfer']:8.1f}% "
                     f"{r['tpot_gap']:+6.1f} | {r['ttft_fitted']:10.1f}% {r['ttft_transfer']:8.1f}% "
                     f"{r['ttft_gap']:+6.1f}")
    return "\n".join(lines)
