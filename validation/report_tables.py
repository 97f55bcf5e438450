"""The accuracy tables of a validation run (``python -m validation.report report`` and ``points``): its
``rows.csv`` read back, MAPE of TPOT and TTFT per group split into the TRAIN GPU and the held-out ones, and
the share of the file's MAPE each group of rows carries.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np


TRAIN_GPU = "h100_sxm"


def mape(values: Iterable[float]) -> float:
    v = [abs(x) for x in values if math.isfinite(x)]
    return float(np.mean(v)) if v else float("nan")


def read_results(out: Path) -> list[dict[str, Any]]:
    rows = []
    with open(out / "rows.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            if r["skipped"]:
                continue
            rows.append({**r, "ttft_err_pct": float(r["ttft_err_pct"]), "tpot_err_pct": float(r["tpot_err_pct"])})
    return rows


def table(rows: Sequence[dict[str, Any]], key: str) -> list[str]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r)
    lines = [f"  {'':42} {'rows':>5} {'TPOT %':>7} {'TTFT %':>7} | {'train':>5} {'TPOT %':>7} {'TTFT %':>7} | "
             f"{'held-out':>8} {'TPOT %':>7} {'TTFT %':>7}"]
    for g, rs in sorted(groups.items()):
        tr = [r for r in rs if r["system"] == TRAIN_GPU]
        ho = [r for r in rs if r["system"] != TRAIN_GPU]
        lines.append(f"  {g[-42:]:42} {len(rs):5} {mape(r['tpot_err_pct'] for r in rs):7.1f} "
                     f"{mape(r['ttft_err_pct'] for r in rs):7.1f} | {len(tr):5} "
                     f"{mape(r['tpot_err_pct'] for r in tr):7.1f} {mape(r['ttft_err_pct'] for r in tr):7.1f} | "
                     f"{len(ho):8} {mape(r['tpot_err_pct'] for r in ho):7.1f} "
                     f"{mape(r['ttft_err_pct'] for r in ho):7.1f}")
    return lines


def journal_ttft_ms(journal: Path) -> dict[str, float]:
    """Row id -> predicted TTFT (ms) of the aggregated rows a ``twin validate`` journal represents."""
    pred = {}
    with open(journal) as fh:
        next(fh, None)  # the header
        for line in fh:
            rec = json.loads(line)
            if not rec.get("skipped") and rec.get("mode") == "agg":
                pred[rec["id"]] = float(rec["pred_ttft_ms"])
    return pred


def _warmup_labels(out: Path) -> dict[str, str]:
    """Row id -> client warm-up label (validation.silicon.client_warmup) for the rows of the CSV a run's journal
    names; empty when that file is not at hand."""
    from validation.silicon import client_warmup, protocol, read_rows

    journal = out / "rows.jsonl"
    if not journal.is_file():
        return {}
    with open(journal) as fh:
        head = json.loads(fh.readline())
    csv_path = Path(str(head.get("csv", "")))
    if not csv_path.is_file():
        return {}
    return {row["id"]: f"{protocol(row).name}, {client_warmup(row)}" for row in read_rows(csv_path)}


def report(out: Path) -> str:
    rows = read_results(out)
    warmup = _warmup_labels(out)
    rows = [dict(r, client=warmup[r["id"]]) if r["id"] in warmup else r for r in rows]
    summary = json.loads((out / "summary.json").read_text())
    lines = [f"rows {summary['rows']}, represented {summary['rows_represented']} "
             f"({100 * summary['rows_represented'] / max(1, summary['rows']):.1f} %), skipped "
             f"{len(summary['rows_skipped'])}"]
    for reason, n in summary.get("skip_reasons", {}).items():
        lines.append(f"  skipped {n:4} x {reason[:150]}")
    for mode in ("agg", "disagg"):
        sub = [r for r in rows if r["mode"] == mode]
        if not sub:
            continue
        lines.append(f"\n{mode}: MAPE over {len(sub)} rows (train = {TRAIN_GPU}, held-out = other GPUs)")
        for key in ("backend", "model", "protocol", "system"):
            lines.append(f" by {key}")
            lines += table(sub, key)
        if all("client" in r for r in sub):  # InferenceMAX runs before 2026-01-21 met a cold server
            lines.append(" by client warm-up")
            lines += table(sub, "client")
        allrows = [dict(r, all="all") for r in sub]
        lines += table(allrows, "all")
    return "\n".join(lines)


def point_table(rows: Sequence[dict[str, Any]], metric: str, keys: Sequence[str]) -> list[dict[str, Any]]:
    """Per group of ``keys``: rows, points (summed |error| / all rows), the group's MAPE and its signed
    median error, largest points first (ties by group). The points of all groups add up to the MAPE. Rows
    whose error is not finite are left out, as the summary's MAPE leaves them out."""
    if metric not in ("ttft", "tpot"):
        raise ValueError(f"metric must be 'ttft' or 'tpot', got {metric!r}")
    col = f"{metric}_err_pct"
    groups: dict[tuple[str, ...], list[float]] = {}
    n = 0
    for r in rows:
        err = float(r[col])
        if math.isfinite(err):
            groups.setdefault(tuple(str(r[k]) for k in keys), []).append(err)
            n += 1
    out = [{"group": g, "rows": len(e), "points": sum(map(abs, e)) / n, "mape": sum(map(abs, e)) / len(e),
            "signed_median": float(np.median(e))} for g, e in groups.items()]
    return sorted(out, key=lambda t: (-t["points"], t["group"]))


def with_csv_columns(out: Path, rows: list[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """``rows`` with the measured CSV's columns added (from the file the run's journal names), when a key
    is not a rows.csv column; a key in neither is an error naming both."""
    missing = [k for k in keys if rows and k not in rows[0]]
    if not missing:
        return rows
    from validation.silicon import read_rows

    journal = out / "rows.jsonl"
    csv_path = None
    if journal.is_file():
        with open(journal) as fh:
            csv_path = Path(str(json.loads(fh.readline()).get("csv", "")))
    if csv_path is None or not csv_path.is_file():
        raise ValueError(f"{out}: column(s) {missing} are not in rows.csv, and the measured CSV its journal "
                         f"names ({csv_path}) is not at hand")
    measured = {r["id"]: r for r in read_rows(csv_path)}
    unknown = [k for k in missing if k not in next(iter(measured.values()), {})]
    if unknown:
        raise ValueError(f"unknown column(s) {unknown}: not in {out / 'rows.csv'} ({', '.join(rows[0])}) "
                         f"nor in {csv_path}")
    absent = [r["id"] for r in rows if r["id"] not in measured]
    if absent:
        raise ValueError(f"{len(absent)} row(s) of {out / 'rows.csv'} are not in {csv_path} (first: "
                         f"{absent[0]!r}): the file changed since the run")
    return [{**measured[r["id"]], **r} for r in rows]


def points(out: Path, metric: str, keys: Sequence[str], mode: str = "agg", top: int | None = None) -> str:
    rows = [r for r in read_results(out) if r["mode"] == mode]
    if not rows:
        return f"{out}: no represented {mode} rows"
    rows = with_csv_columns(out, rows, keys)
    table_ = point_table(rows, metric, keys)
    mape = sum(t["points"] for t in table_)
    n = sum(t["rows"] for t in table_)
    lines = [f"{n} represented {mode} rows, {metric.upper()} MAPE {mape:.2f} %; points = a group's "
             f"summed |error| / {n}",
             f"{'points':>7} {'rows':>5} {'MAPE %':>7} {'signed median %':>16}  {' / '.join(keys)}"]
    for t in table_[:top]:
        lines.append(f"{t['points']:7.2f} {t['rows']:5} {t['mape']:7.1f} {t['signed_median']:+16.1f}  "
                     f"{' / '.join(v or '-' for v in t['group'])}")
    if top is not None and len(table_) > top:
        rest = table_[top:]
        lines.append(f"{sum(t['points'] for t in rest):7.2f} {sum(t['rows'] for t in rest):5} "
                     f"{'':7} {'':16}  ({len(rest)} more groups)")
    return "\n".join(lines)
