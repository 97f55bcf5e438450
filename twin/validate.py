"""End-to-end validation against measured serving benchmarks (``twin validate silicon CSV --out DIR``).

Each row of a CSV with the columns of aiconfigurator's ``silicon`` samples is simulated the way the
benchmark ran it: a closed loop of ``batch_size`` concurrent requests with fixed ISL / OSL (random
prompts, so no prefix reuse), the row's GPU, model, backend, weight format and parallelism; a
disaggregated row gets its prefill / decode pools. Predicted mean TTFT and TPOT are compared with the
measured ones. A row the twin cannot represent is skipped with its reason, never dropped silently.
"""

from __future__ import annotations

import csv
import json
import math
import re
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from typing import Any, Iterable

import numpy as np

WEIGHT_FORMATS = {"": "bf16", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp8_block": "fp8_block",
                  "nvfp4": "fp4", "fp4": "fp4", "mxfp4": "fp4", "int4_wo": "int4", "int4": "int4"}
REQUIRED = ("id", "backend", "model_path", "system", "mode", "isl", "osl", "silicon_ttft_ms", "silicon_tpot_ms")


class Skip(Exception):
    """This row cannot be represented; the message says why."""


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The CSV's rows; a missing column or an unreadable file is an error naming the file."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; expected the silicon sample columns")
        rows = []
        for line, row in enumerate(reader, start=2):
            row["_line"] = str(line)
            rows.append(row)
    return rows


def _int(row: dict[str, str], key: str, default: int | None = None) -> int:
    text = (row.get(key) or "").strip()
    if not text:
        if default is None:
            raise Skip(f"column {key} is empty")
        return default
    try:
        value = float(text)
    except ValueError:
        raise Skip(f"column {key}={text!r} is not a number") from None
    if not value.is_integer() or value < 0:
        raise Skip(f"column {key}={text!r} is not a non-negative integer")
    return int(value)


def concurrency(row: dict[str, str]) -> int:
    """``batch_size``, or for disaggregated rows the ``silicon_concurrency`` in the source note."""
    if (row.get("batch_size") or "").strip():
        return _int(row, "batch_size")
    found = re.search(r"silicon_concurrency=(\d+)", row.get("silicon_data_source", ""))
    if not found:
        raise Skip("no batch_size and no silicon_concurrency in silicon_data_source")
    return int(found.group(1))


def row_config(row: dict[str, str], *, waves: int = 3) -> dict[str, Any]:
    """The twin config for one row (raises :class:`Skip` with the reason when it cannot be represented)."""
    import hardware

    gpu = row["system"].strip()
    if gpu not in hardware.list_gpus():
        raise Skip(f"GPU {gpu!r} has no spec in hardware/ (known: {', '.join(hardware.list_gpus())})")
    try:
        hardware.load_model(row["model_path"])
    except (ValueError, NotImplementedError) as exc:
        raise Skip(f"model: {exc}") from None
    backend = row["backend"].strip()
    if backend not in hardware.list_engines():
        raise Skip(f"backend {backend!r} has no engine profile")
    fmt = (row.get("gemm_quant_mode") or row.get("precision") or "").strip().lower()
    if fmt not in WEIGHT_FORMATS:
        raise Skip(f"weight format {fmt!r} is not modelled")
    isl, osl, conc = _int(row, "isl"), _int(row, "osl"), concurrency(row)
    if isl < 1 or osl < 1 or conc < 1:
        raise Skip(f"isl={isl}, osl={osl}, concurrency={conc}: all must be >= 1")
    cfg: dict[str, Any] = {
        "name": row["id"], "hardware": {"gpu": gpu}, "engine": {"name": backend},
        "model": {"name": row["model_path"], "weight_dtype": WEIGHT_FORMATS[fmt]},
        "workload": {"kind": "synthetic", "num_requests": max(waves * conc, 8),
                     "arrival": {"kind": "concurrency", "concurrency": conc},
                     "input_tokens": {"fixed": isl}, "output_tokens": {"fixed": osl}},
        "metrics": {"sample_interval_s": 5.0}, "run": {"seed": 0},
    }
    mode = row["mode"].strip()
    if mode == "agg":
        if _int(row, "pp_size", 1) > 1:
            raise Skip("pipeline parallelism (pp_size > 1) is not modelled")
        cfg["system"] = {"kind": "colocated", "tp": _int(row, "tp_size", 1), "ep": max(1, _int(row, "moe_ep_size", 1)),
                         "attention_dp": max(1, _int(row, "attention_dp_size", 1))}
        cfg["scheduler"] = {"max_num_seqs": max(conc, 1)}
    elif mode == "disagg":
        pools = {}
        for side in ("prefill", "decode"):
            if _int(row, f"{side}_pp_size", 1) > 1:
                raise Skip(f"pipeline parallelism ({side}_pp_size > 1) is not modelled")
            pools[side] = {"workers": max(1, _int(row, f"{side}_num_workers", 1)), "tp": _int(row, f"{side}_tp_size", 1),
                           "ep": max(1, _int(row, f"{side}_moe_ep_size", 1)),
                           "attention_dp": max(1, _int(row, f"{side}_attention_dp_size", 1))}
            batch = _int(row, f"{side}_batch_size", 0)
            if batch:
                pools[side]["max_num_seqs"] = batch * pools[side]["attention_dp"]
        cfg["system"] = {"kind": "disaggregated", **pools, "decode_router": {"kind": "least_loaded"}}
        cfg["router"] = {"kind": "least_loaded"}
    else:
        raise Skip(f"mode {mode!r} is neither agg nor disagg")
    return cfg


def simulate_row(row: dict[str, str], waves: int = 3) -> dict[str, Any]:
    """Predicted vs measured TTFT / TPOT for one row, or its skip reason."""
    from twin.config import load_config
    from twin.errors import TwinError
    from twin.runner import Simulation

    out: dict[str, Any] = {"id": row["id"], "line": int(row["_line"]), "system": row["system"],
                           "backend": row["backend"], "model": row["model_path"], "mode": row["mode"]}
    try:
        cfg = load_config(row_config(row, waves=waves))
        res = Simulation(cfg).run()
    except Skip as exc:
        return {**out, "skipped": str(exc)}
    except (TwinError, ValueError, NotImplementedError) as exc:
        return {**out, "skipped": f"not representable: {exc}"}
    s = res.summary
    if s["requests"]["failed"]:
        return {**out, "skipped": f"{s['requests']['failed']} requests failed: {s['fail_reasons']}"}
    meas_ttft, meas_tpot = float(row["silicon_ttft_ms"]), float(row["silicon_tpot_ms"])
    pred_ttft, pred_tpot = s["ttft_s"]["mean"] * 1e3, s["tpot_s"]["mean"] * 1e3
    return {**out, "isl": row["isl"], "osl": row["osl"], "concurrency": concurrency(row),
            "pred_ttft_ms": pred_ttft, "meas_ttft_ms": meas_ttft, "ttft_err_pct": 100 * (pred_ttft - meas_ttft) / meas_ttft,
            "pred_tpot_ms": pred_tpot, "meas_tpot_ms": meas_tpot, "tpot_err_pct": 100 * (pred_tpot - meas_tpot) / meas_tpot,
            "wall_s": s["sim"]["wall_s"]}


def _mape(values: Iterable[float]) -> float:
    v = [abs(x) for x in values if x == x and math.isfinite(x)]
    return float(np.mean(v)) if v else float("nan")


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in results if "skipped" not in r]
    out: dict[str, Any] = {
        "rows": len(results), "rows_represented": len(done),
        "rows_skipped": [{"id": r["id"], "line": r["line"], "reason": r["skipped"]} for r in results if "skipped" in r],
    }
    for mode in ("agg", "disagg"):
        sub = [r for r in done if r["mode"] == mode]
        out[mode] = {"rows": len(sub), "tpot_mape": _mape(r["tpot_err_pct"] for r in sub),
                     "ttft_mape": _mape(r["ttft_err_pct"] for r in sub)}
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


def validate_silicon(path: str | Path, out_dir: str | Path, *, jobs: int = 1, limit: int | None = None,
                     match: str | None = None, waves: int = 3, executor: Executor | None = None,
                     progress: bool = True) -> dict[str, Any]:
    """Simulate every row, write ``rows.csv`` and ``summary.json`` into ``out_dir``; returns the summary."""
    rows = read_rows(path)
    if match:
        rows = [r for r in rows if re.search(match, r["id"])]
    if limit is not None:
        rows = rows[:limit]
    own = executor is None and jobs > 1
    pool = ProcessPoolExecutor(max_workers=jobs) if own else executor
    try:
        if pool is None:
            results = []
            for i, row in enumerate(rows, 1):
                results.append(simulate_row(row, waves))
                if progress:
                    print(f"\r{i}/{len(rows)} rows", end="", flush=True)
        else:
            results = list(pool.map(simulate_row, rows, [waves] * len(rows), chunksize=4))
    finally:
        if own and pool is not None:
            pool.shutdown()
    if progress:
        print()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cols = ["id", "line", "system", "backend", "model", "mode", "isl", "osl", "concurrency", "pred_ttft_ms",
            "meas_ttft_ms", "ttft_err_pct", "pred_tpot_ms", "meas_tpot_ms", "tpot_err_pct", "wall_s", "skipped"]
    with open(out / "rows.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=cols)
        writer.writeheader()
        for r in results:
            writer.writerow({c: r.get(c, "") for c in cols})
    summary = summarize(results)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=lambda x: None) + "\n")
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"rows: {summary['rows']}, represented: {summary['rows_represented']}, "
             f"skipped: {len(summary['rows_skipped'])}"]
    for mode in ("agg", "disagg"):
        m = summary[mode]
        lines.append(f"{mode}: {m['rows']} rows, TPOT MAPE {m['tpot_mape']:.1f} %, TTFT MAPE {m['ttft_mape']:.1f} %")
        for key in ("backend", "model", "system"):
            for g, v in m[f"by_{key}"].items():
                lines.append(f"  {key} {g:40} {v['rows']:5} rows  TPOT {v['tpot_mape']:6.1f} %  "
                             f"TTFT {v['ttft_mape']:6.1f} %")
    return "\n".join(lines)
