"""Checks of the measurements themselves, independent of the twin's accuracy (``implied-rate`` and ``repeats``
of ``python -m validation.report``): the linear-layer FLOP rate a row implies against the fastest GEMM
measured on its GPU, and configurations measured more than once, with the MAPE floor their spread sets.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from validation.report_tables import read_results


def implied_linear_rate(row: dict[str, str]) -> float | None:
    """FLOP/s per GPU the row's measurement implies for its linear layers alone (None: not aggregated, or
    not representable)."""
    from hardware import load_model
    from validation.silicon import Skip, protocol, row_spec

    try:
        spec = row_spec(row)
    except (Skip, ValueError, KeyError):
        return None
    if spec.mode != "agg" or spec.agg is None:
        return None
    mean = (1.0 + protocol(row).low_frac) / 2.0
    isl, osl = spec.isl * mean, spec.osl * mean
    e2e_s = (float(row["silicon_ttft_ms"]) + (osl - 1.0) * float(row["silicon_tpot_ms"])) / 1e3
    model = load_model(spec.model)
    linear_params = model.active_param_count - model.embedding_params
    return 2.0 * linear_params * (isl + osl) * spec.concurrency / e2e_s / spec.agg.gpus


def fastest_gemm(opdb: Path) -> dict[str, float]:
    """Per GPU, the highest FLOP/s of any row of any engine's GEMM table in an opdb folder."""
    import gzip

    best: dict[str, float] = {}
    for path in sorted(opdb.glob("*__gemm_perf__*.csv*")):
        gpu = path.name.split("__")[0]
        with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as fh:
            for rec in csv.DictReader(fh):
                rate = 2.0 * int(rec["m"]) * int(rec["n"]) * int(rec["k"]) / (float(rec["latency"]) * 1e-3)
                best[gpu] = max(best.get(gpu, 0.0), rate)
    return best


def implied_rates(csv_path: Path, opdb: Path | None, top: int) -> str:
    """The ``top`` rows implying the highest linear-layer FLOP rate, flagged against the fastest GEMM."""
    from validation.silicon import read_rows

    best = fastest_gemm(opdb) if opdb is not None else {}
    rates = [(rate, row) for row in read_rows(csv_path) if (rate := implied_linear_rate(row)) is not None]
    rates.sort(key=lambda item: -item[0])
    lines = ["TFLOP/s per GPU (linear layers alone)   fastest GEMM on the GPU   row"]
    for rate, row in rates[:top]:
        limit = best.get(row["system"])
        flag = "" if limit is None else f"{limit / 1e12:7.0f}{'  ABOVE' if rate > limit else ''}"
        lines.append(f"{rate / 1e12:10.0f}   {flag:>30}   {row['id']}")
    return "\n".join(lines)


METRICS = ("tpot", "ttft")
REPEAT_IGNORED = ("id", "silicon_data_source", "silicon_ttft_ms", "silicon_tpot_ms")
"""Columns of the measured CSV that two measurements of one configuration may differ in."""
_CONCURRENCY = re.compile(r"silicon_concurrency=(\d+)")


def repeat_key(row: dict[str, str]) -> tuple[str, ...]:
    """What makes two rows one configuration: every column but :data:`REPEAT_IGNORED` (and the reader's
    own, such as ``_line``), and the client concurrency the data source records."""
    conc = _CONCURRENCY.search(row.get("silicon_data_source", ""))
    return (conc.group(1) if conc else "",) + tuple(v for k, v in row.items()
                                                     if k not in REPEAT_IGNORED and not k.startswith("_"))


def best_single_errors(values: Sequence[float]) -> list[float]:
    """|p / m - 1| for each measurement m of one configuration, p being the one prediction that makes their
    mean least: the median of the values weighted by 1 / m (the mean is sum |p - m| / m)."""
    v = np.sort(np.asarray(values, dtype=float))
    cum = np.cumsum(1.0 / v)
    p = float(v[int(np.searchsorted(cum, cum[-1] / 2.0))])
    return [abs(p / m - 1.0) for m in values]


def _measurements(row: dict[str, str]) -> dict[str, float]:
    """The row's measured TPOT and TTFT, ms, read as the validation reads them
    (validation.measured_rows.measured_ms); a row without them is an error naming it (it would be no
    configuration's measurement)."""
    from validation.measured_rows import Skip, measured_ms

    out = {}
    for metric in METRICS:
        col = f"silicon_{metric}_ms"
        try:
            out[metric] = measured_ms(row, col)
        except Skip:
            raise ValueError(f"row {row['id']!r} (line {row.get('_line', '?')}): {col} must be a positive number "
                             f"of milliseconds, got {row[col]!r}") from None
    return out


def repeat_table(rows: Sequence[dict[str, str]], represented: set[str] | None = None,
                 spread: float = 0.2) -> list[dict[str, Any]]:
    """Per (mode, backend): the configurations measured more than once, how many of them spread by more than
    ``spread`` (largest / smallest - 1) in TPOT and in TTFT, the largest such ratio; with ``represented``
    (ids a validation simulated), the MAPE no single prediction per configuration can beat on those rows
    (``floor_tpot`` / ``floor_ttft``, percent: the best-single errors of the repeated ones, over every row
    represented)."""
    by_backend: dict[tuple[str, str], list[list[tuple[dict[str, float], bool]]]] = {}
    configs: dict[tuple[str, ...], list[tuple[dict[str, float], bool]]] = {}
    for r in rows:
        key = repeat_key(r)
        if key not in configs:
            configs[key] = []
            by_backend.setdefault((r["mode"], r["backend"]), []).append(configs[key])
        configs[key].append((_measurements(r), represented is None or r["id"] in represented))
    table = []
    for (mode, backend), groups in sorted(by_backend.items()):
        repeated = [g for g in groups if len(g) > 1]
        t: dict[str, Any] = {"mode": mode, "backend": backend, "configs": len(groups), "repeated": len(repeated)}
        for metric in METRICS:
            ratios = [max(m[metric] for m, _ in g) / min(m[metric] for m, _ in g) for g in repeated]
            t[f"spread_{metric}"] = sum(x - 1.0 > spread for x in ratios)
            t[f"max_ratio_{metric}"] = max(ratios, default=1.0)
        if represented is not None:
            kept = [[m for m, ok in g if ok] for g in groups]
            n = sum(map(len, kept))
            for metric in METRICS:
                err = sum(sum(best_single_errors([m[metric] for m in k])) for k in kept if len(k) > 1)
                t[f"floor_{metric}"] = 100.0 * err / n if n else float("nan")
        table.append(t)
    return table


def repeats(csv_path: Path, out: Path | None = None, spread: float = 0.2) -> str:
    """The measured CSV's repeated configurations (:func:`repeat_table`), with the floors of a validation run
    in ``out`` when given."""
    from validation.silicon import read_rows

    represented = None
    if out is not None:
        represented = {r["id"] for r in read_results(out)}
    table = repeat_table(read_rows(csv_path), represented, spread)
    head = (f"{'mode':7} {'backend':8} {'configs':>7} {'repeated':>8} {'TPOT >':>7} {'TTFT >':>7} "
            f"{'max TPOT x':>10} {'max TTFT x':>10}")
    if represented is not None:
        head += f" {'floor TPOT %':>12} {'floor TTFT %':>12}"
    lines = [f"configurations measured more than once (spread: largest / smallest - 1 > {spread:.0%})", head]
    for t in table:
        line = (f"{t['mode']:7} {t['backend']:8} {t['configs']:7} {t['repeated']:8} {t['spread_tpot']:7} "
                f"{t['spread_ttft']:7} {t['max_ratio_tpot']:10.2f} {t['max_ratio_ttft']:10.2f}")
        if represented is not None:
            line += f" {t['floor_tpot']:12.1f} {t['floor_ttft']:12.1f}"
        lines.append(line)
    return "\n".join(lines)
