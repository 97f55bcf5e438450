"""Kernel report: the hardware model's predicted vs measured latency on the opdb kernel tables.

    python -m experiments.kernel_report [--data kernel-tables/opdb] [--out DIR]

The tables are not shipped; ``python -m hardware.opdb_import`` writes them once into kernel-tables/.

Predictions use only the shipped, frozen constants (hardware/data/calibration/<engine>.yaml) and the GPU
specs, through the same single-kernel functions the step-cost ledger uses (hardware.kernels). Prints, per
engine and table, the median and p90 of |predicted / measured - 1| and the median signed error; with --out
also writes kernel_report.csv. Decode attention is also reported on the shapes serving steps have
(``serving``: at most 128 requests of 256-8k tokens) and on the rows measured faster than the GPU's HBM
bandwidth allows (``> HBM peak``: cache-resident re-reads of the collector, unlike any serving step).
Each table is also reported per GPU (``@h100_sxm``, ``@h200_sxm``): its curves are fitted on both GPUs at
once, so a bias that differs between them is one the GPU specs do not explain.

``--transfer`` also prints how well the GPU spec alone carries a kernel from one GPU to the other: every
shape a table times on both GPUs is a pair, and the pair's measured latency ratio (H200 / H100) is set
against the ratio the same curves predict from the two specs. A median transfer error of 0 means that
switching the GPU spec moves the kernels as the measurements do; it is split by regime (GEMM and MoE at
<= 256 rows or tokens, which is what decode steps run, against more; decode attention at serving shapes).

``--check TABLE --engines E --gpu G`` prices one kernel table the constants were not fitted on (another
collector or engine version in the opdb layout, .csv / .csv.gz / .parquet; Parquet needs pyarrow) with the
shipped constants of engine E on GPU spec G, and prints the same figures; ``--check FOLDER`` does so for every
table of a folder named as the opdb tables are (``<gpu>__<table>__<engine>-<version>``), each against its own
engine on its own GPU. The constants are the set of G's architecture (hardware.calibration.calibration_for:
B300 tables against the Blackwell sets, in sample); ``--arch hopper`` prices with the Hopper sets instead (how
far the GPU spec alone carries them). A MoE format a table times under power-law routing only is checked on
its power_law_1.01 rows (calibrate.MOE_ROUTING), reported as ``moe[<format>, power_law_1.01]``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from hardware import kernels, load_calibration, load_gpu
from hardware.calibrate import (ENGINES, GEMM_DTYPES, GPUS, KV_BYTES, MOE_DTYPES, MOE_ROUTING, SSM_TABLES,
                                TABLE_SETS, gdn_rows, gqa_ratio_fitted, moe_format_rows, moe_kernel_family,
                                possible, read_table, read_table_file)
from hardware.calibration import CURVE_MOE_KERNELS, Calibration, calibration_for, moe_curve_key
from hardware.dtypes import COMPUTE_DTYPE, DTYPE_BYTES
from hardware.opdb_import import DEFAULT_DIR, MISSING_TABLES_HINT
from hardware.table_features import GDN_CHUNK

MAX_ROWS = 20000
Row = dict[str, str]


def _sample(rows: list[Row]) -> list[Row]:
    if len(rows) <= MAX_ROWS:
        return rows
    idx = np.random.default_rng(1).choice(len(rows), size=MAX_ROWS, replace=False)
    return [rows[i] for i in sorted(idx)]


def predict_gemm(cal: Calibration, gpu: str, r: Row) -> float:
    dtype = GEMM_DTYPES[r["gemm_dtype"]]
    g = load_gpu(gpu)
    return kernels.gemm_s(cal.gemm_for(dtype), float(r["m"]), int(r["n"]), int(r["k"]), DTYPE_BYTES[dtype],
                          g.flops_for(COMPUTE_DTYPE[dtype]), g.hbm_bw_Bps)


def predict_context(cal: Calibration, gpu: str, r: Row) -> float:
    g = load_gpu(gpu)
    b, s, prefix = int(r["batch_size"]), int(r["isl"]), int(r["step"])
    hd = int(r["head_dim"])
    return kernels.gqa_prefill_s(cal.attn_prefill, tokens=b * s, sum_kv=b * (s + prefix),
                                 pairs=b * (s * (s + 1) / 2 + s * prefix), heads=int(r["num_heads"]),
                                 kv_heads=int(r["num_key_value_heads"]), head_dim=hd, v_head_dim=hd,
                                 kv_bytes=KV_BYTES.get(r["kv_cache_dtype"], 2.0),
                                 peak_flops=g.flops_for("bf16"), bw_Bps=g.hbm_bw_Bps)


def predict_generation(cal: Calibration, gpu: str, r: Row) -> float:
    g = load_gpu(gpu)
    b, step, hd = int(r["batch_size"]), int(r["step"]), int(r["head_dim"])
    kv_bytes = KV_BYTES.get(r["kv_cache_dtype"], 2.0)
    return kernels.gqa_decode_s(cal.gqa_decode(kv_bytes), reqs=b, sum_kv=b * (step + 1),
                                heads=int(r["num_heads"]), kv_heads=int(r["num_key_value_heads"]),
                                head_dim=hd, v_head_dim=hd,
                                kv_bytes=kv_bytes, peak_flops=g.flops_for("bf16"), bw_Bps=g.hbm_bw_Bps)


def _serving_decode(r: Row) -> bool:
    """A decode-attention row of the shapes serving steps have: at most 128 requests of 256-8k tokens."""
    return int(r["batch_size"]) <= 128 and 256 <= int(r["step"]) + 1 <= 8192


def predict_mla_context(cal: Calibration, gpu: str, r: Row) -> float:
    g = load_gpu(gpu)
    b, s, prefix = int(r["batch_size"]), int(r["isl"]), int(r["step"])
    return kernels.mla_prefill_s(cal.mla_prefill, tokens=b * s, sum_kv=b * (s + prefix),
                                 pairs=b * (s * (s + 1) / 2 + s * prefix), heads=int(r["num_heads"]),
                                 qk_dim=192, v_dim=128, peak_flops=g.flops_for("bf16"), bw_Bps=g.hbm_bw_Bps)


def predict_mla_generation(cal: Calibration, gpu: str, r: Row) -> float:
    g = load_gpu(gpu)
    b, step = int(r["batch_size"]), int(r["step"])
    return kernels.mla_decode_s(cal.mla_decode, reqs=b, sum_kv=b * (step + 1), heads=int(r["num_heads"]),
                                kv_lora_rank=512, rope_dim=64, kv_bytes=KV_BYTES.get(r["kv_cache_dtype"], 2.0),
                                peak_flops=g.flops_for("bf16"), bw_Bps=g.hbm_bw_Bps)


def predict_gdn(cal: Calibration, gpu: str, r: Row) -> float:
    g = load_gpu(gpu)
    gen = r["phase"] == "generation"
    return kernels.ssm_s(cal.ssm, tokens=int(r["num_tokens"]), reqs=int(r["batch_size"]),
                         decode_reqs=int(r["batch_size"]) if gen else 0, heads=int(r["num_v_heads"]),
                         dk=int(r["head_k_dim"]), dv=int(r["head_v_dim"]), chunk=GDN_CHUNK, state_bytes=4,
                         peak_flops=g.flops_for("bf16"), bw_Bps=g.hbm_bw_Bps,
                         longest=0 if gen else int(r["seq_len"]))


def _gqa_ok(r: Row) -> bool:
    """Full attention at GQA ratios real models use (hardware.calibrate.GQA_RATIOS), as fitted."""
    return r.get("window_size", "0") == "0" and gqa_ratio_fitted(r)


def predict_moe(cal: Calibration, gpu: str, r: Row) -> float:
    g = load_gpu(gpu)
    dtype = MOE_DTYPES[r["moe_dtype"]]
    family = moe_kernel_family(r.get("kernel_source", ""))
    # a format timed with one kernel family has only its plain curve, whichever family that is
    kernel = family if moe_curve_key(dtype, family) in cal.moe else "default"
    return kernels.moe_s(cal.moe_for(dtype, kernel), tokens=float(r["num_tokens"]), width=int(r["hidden_size"]),
                         inter=-(-int(r["inter_size"]) // int(r["moe_tp_size"])), topk=int(r["topk"]),
                         num_experts=int(r["num_experts"]), ep=int(r["moe_ep_size"]),
                         mats=2 if "nongated" in r.get("kernel_source", "") else 3,
                         w_bytes_per_elem=DTYPE_BYTES[dtype], peak_flops=g.flops_for(COMPUTE_DTYPE[dtype]),
                         bw_Bps=g.hbm_bw_Bps, routing=MOE_ROUTING[r["distribution"]])


def _split_moe_format(cal: Calibration, moe_dtype: str) -> bool:
    """True when the format's MoE table is fitted as more than one kernel family (its rows are then also
    reported per family, e.g. ``moe[fp8_block:flashinfer]``)."""
    dtype = MOE_DTYPES[moe_dtype]
    return any(moe_curve_key(dtype, family) in cal.moe for family in CURVE_MOE_KERNELS)


def predict_allreduce(cal: Calibration, gpu: str, r: Row) -> float:
    g = load_gpu(gpu)
    tag = r.get("backend", r.get("implementation", ""))
    return kernels.allreduce_s(cal.allreduce, nbytes=2.0 * float(r["message_size"]), gpus=int(r["num_gpus"]),
                               link_Bps=g.scaleup_bw_Bps, eager="eager" in tag)


TABLES: list[tuple[str, str, Callable[[Row], bool], Callable[[Calibration, str, Row], float]]] = [
    ("gemm", "gemm_perf", lambda r: r["gemm_dtype"] in GEMM_DTYPES, predict_gemm),
    ("context_attention", "context_attention_perf", _gqa_ok, predict_context),
    ("generation_attention", "generation_attention_perf", _gqa_ok, predict_generation),
    ("context_mla", "context_mla_perf", lambda r: True, predict_mla_context),
    ("generation_mla", "generation_mla_perf", lambda r: True, predict_mla_generation),
    ("moe", "moe_perf", lambda r: r["distribution"] == "balanced" and r["moe_dtype"] in MOE_DTYPES, predict_moe),
    ("allreduce", "custom_allreduce_perf", lambda r: True, predict_allreduce),
    ("gdn (conv+scan)", "gdn_perf", lambda r: True, predict_gdn),
]


def row_format(table: str, r: Row) -> str:
    """The weight or KV-cache format a row is also reported under ('' where its table has none split)."""
    if table == "generation_attention_perf":
        return "kv " + r["kv_cache_dtype"]
    if table == "moe_perf" and r["distribution"] != "balanced":
        return f"{r['moe_dtype']}, {r['distribution']}"
    return r.get("gemm_dtype") or r.get("moe_dtype") or ""


def _add_row(errs: dict[str, list[float]], cal: Calibration, gpu: str, name: str, table: str,
             predict: Callable[[Calibration, str, Row], float], r: Row) -> None:
    """File one row's error, predicted / measured - 1, under its table, its GPU and its format labels."""
    meas = float(r["latency"]) * 1e-3
    if meas <= 0:
        return
    e = predict(cal, gpu, r) / meas - 1.0
    errs.setdefault(name, []).append(e)
    errs.setdefault(f"{name} @{gpu}", []).append(e)
    fmt = row_format(table, r)
    if table == "generation_attention_perf":
        if _serving_decode(r):
            errs.setdefault(f"{name}[{fmt}, serving]", []).append(e)
        if not possible(r, table, gpu):  # faster than reading its KV once at peak HBM bandwidth
            errs.setdefault(f"{name}[{fmt}, > HBM peak]", []).append(e)
    if fmt:
        errs.setdefault(f"{name}[{fmt}]", []).append(e)
    if table == "moe_perf" and _split_moe_format(cal, r["moe_dtype"]):
        family = moe_kernel_family(r.get("kernel_source", ""))
        errs.setdefault(f"{name}[{fmt}:{family}]", []).append(e)


def check_calibration(engine: str, gpu: str, arch: str | None = None) -> Calibration:
    """The constants a --check prices ``engine``'s table on ``gpu`` with: the set of the GPU's architecture,
    or of ``arch`` (e.g. "hopper", for the Hopper sets on a Blackwell table)."""
    return calibration_for(engine, arch or load_gpu(gpu).arch)


def _summaries(engine: str, errs: dict[str, list[float]]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for label, vals in errs.items():
        a = np.array(vals)
        out.append({"engine": engine, "table": label, "rows": len(a),
                    "median_abs_err_pct": round(100 * float(np.median(np.abs(a))), 1),
                    "p90_abs_err_pct": round(100 * float(np.percentile(np.abs(a), 90)), 1),
                    "median_signed_err_pct": round(100 * float(np.median(a)), 1)})
    return out


def report(data: Path, engines: Iterable[str]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for engine in engines:
        cal = load_calibration(engine)
        for name, table, keep, predict in TABLES:
            errs: dict[str, list[float]] = {}
            for gpu in GPUS:
                if table == "gdn_perf":
                    if engine not in SSM_TABLES:
                        continue
                    rows = _sample([r for r in gdn_rows(data, SSM_TABLES[engine]) if r["_gpu"] == gpu])
                else:
                    rows = _sample([r for r in read_table(data, gpu, table, ENGINES[engine]) if keep(r)])
                for r in rows:
                    _add_row(errs, cal, gpu, name, table, predict, r)
            out.extend(_summaries(engine, errs))
    return out


OP_TABLES = {"all_reduce": "custom_allreduce_perf", "mla_context": "context_mla_perf",
             "mla_generation": "generation_mla_perf"}
"""opdb op_name -> table, where the table is not ``<op_name>_perf``."""


def check_table(path: Path, engine: str, gpu: str, arch: str | None = None) -> list[dict[str, object]]:
    """The shipped constants of ``engine`` against a kernel table they were not fitted on (one measured on
    ``gpu``, in the opdb layout: another collector version, a GPU of one's own): the report's figures for
    each of its tables. Rows the report would not use are left out, as there (e.g. windowed attention), and a
    table of more than MAX_ROWS rows is sampled as there; a MoE format with no balanced rows is checked on its
    power-law rows (calibrate.moe_format_rows). ``arch``: price with that architecture's sets
    (:func:`check_calibration`)."""
    load_gpu(gpu)
    rows = read_table_file(path)
    if not rows:
        raise ValueError(f"{path}: no rows")
    missing = {"op_name", "latency"} - set(rows[0])
    if missing:
        raise ValueError(f"{path}: missing column(s) {sorted(missing)}; expected the opdb table layout")
    by_table = {table: (name, keep, predict) for name, table, keep, predict in TABLES}
    kept: dict[str, list[Row]] = {}
    power_law: list[Row] = []
    for i, r in enumerate(rows, start=2):
        table = OP_TABLES.get(r["op_name"], f"{r['op_name']}_perf")
        if table not in by_table or table == "gdn_perf":
            ops = {t: t.removesuffix("_perf") for t in by_table if t != "gdn_perf"}
            ops.update({t: op for op, t in OP_TABLES.items()})
            raise ValueError(f"{path} line {i}: op_name {r['op_name']!r} is not one the report prices "
                             f"(expected one of {sorted(ops.values())})")
        r["_line"] = str(i)
        if _named(path, r, lambda: by_table[table][1](r)):
            kept.setdefault(table, []).append(r)
        elif table == "moe_perf" and r.get("moe_dtype") in MOE_DTYPES and r.get("distribution") in MOE_ROUTING:
            power_law.append(r)
    balanced = {r["moe_dtype"] for r in kept.get("moe_perf", [])}
    for fmt in dict.fromkeys(r["moe_dtype"] for r in power_law if r["moe_dtype"] not in balanced):
        kept.setdefault("moe_perf", []).extend(moe_format_rows(power_law, fmt)[0])
    cal = check_calibration(engine, gpu, arch)
    errs: dict[str, list[float]] = {}
    for table, of_table in kept.items():
        name, _, predict = by_table[table]
        for r in _sample(of_table):
            _named(path, r, lambda: _add_row(errs, cal, gpu, name, table, predict, r))
    return _summaries(engine, errs)


def _named(path: Path, r: Row, run: Callable[[], object]) -> object:
    """``run()``, with a missing column or an unreadable number reported with the file and line of ``r``."""
    try:
        return run()
    except KeyError as err:
        raise ValueError(f"{path} line {r['_line']}: no column {err} ({r['op_name']} rows need it)") from err
    except ValueError as err:
        raise ValueError(f"{path} line {r['_line']}: {err}") from err


REFERENCE_GPU, OTHER_GPU = GPUS
SMALL_ROWS = 256
"""GEMM rows / MoE tokens up to which a kernel is in the decode regime (a decode step's batch)."""
SHAPE_IGNORED = ("device", "latency", "_gpu")


def shape_key(r: Row) -> tuple[tuple[str, str], ...]:
    """What identifies a table's shape across GPUs: every column but the device and the latency."""
    return tuple(sorted((k, v) for k, v in r.items() if k not in SHAPE_IGNORED))


def regime(name: str, r: Row) -> str:
    """The regime a row is reported in by --transfer ('' when its table has one regime only)."""
    if name == "gemm":
        return f"m <= {SMALL_ROWS}" if int(r["m"]) <= SMALL_ROWS else f"m > {SMALL_ROWS}"
    if name == "moe":
        return f"tokens <= {SMALL_ROWS}" if int(r["num_tokens"]) <= SMALL_ROWS else f"tokens > {SMALL_ROWS}"
    if name == "generation_attention":
        return "serving" if _serving_decode(r) else "other"
    return ""


def transfer_pairs(ref: list[Row], other: list[Row], predict_ref: Callable[[Row], float],
                   predict_other: Callable[[Row], float]) -> list[tuple[Row, float, float]]:
    """Rows timed on both GPUs (matched by :func:`shape_key`, the first of repeated shapes): per pair the
    reference GPU's row, the measured latency ratio other / reference and the predicted one."""
    by_shape: dict[tuple[tuple[str, str], ...], Row] = {}
    for r in other:
        by_shape.setdefault(shape_key(r), r)
    out: list[tuple[Row, float, float]] = []
    seen: set[tuple[tuple[str, str], ...]] = set()
    for r in ref:
        key = shape_key(r)
        o = by_shape.get(key)
        if o is None or key in seen:
            continue
        seen.add(key)
        m_ref, m_other = float(r["latency"]), float(o["latency"])
        if m_ref <= 0 or m_other <= 0:
            continue
        p_ref, p_other = predict_ref(r), predict_other(o)
        if p_ref <= 0:
            continue
        out.append((r, m_other / m_ref, p_other / p_ref))
    return out


def transfer(data: Path, engines: Iterable[str]) -> list[dict[str, object]]:
    """Per engine, table and regime: the shapes timed on both GPUs, the median measured and predicted
    latency ratio (OTHER_GPU / REFERENCE_GPU) and the transfer error, predicted / measured ratio - 1."""
    out: list[dict[str, object]] = []
    for engine in engines:
        cal = load_calibration(engine)
        for name, table, keep, predict in TABLES:
            if table == "gdn_perf":
                continue
            rows = {gpu: [r for r in read_table(data, gpu, table, ENGINES[engine]) if keep(r)]
                    for gpu in (REFERENCE_GPU, OTHER_GPU)}
            pairs = transfer_pairs(rows[REFERENCE_GPU], rows[OTHER_GPU],
                                   lambda r: predict(cal, REFERENCE_GPU, r),
                                   lambda r: predict(cal, OTHER_GPU, r))
            groups: dict[str, list[tuple[float, float]]] = {}
            for r, meas, pred in pairs:
                fmt = row_format(table, r)
                where = regime(name, r)
                labels = [name] + ([f"{name}[{fmt}]"] if fmt else []) + ([f"{name}[{fmt}, {where}]"]
                                                                          if fmt and where else [])
                for label in labels:
                    groups.setdefault(label, []).append((meas, pred))
            for label, vals in groups.items():
                a = np.array(vals)
                err = a[:, 1] / a[:, 0] - 1.0
                out.append({"engine": engine, "table": label, "pairs": len(a),
                            "measured_ratio": round(float(np.median(a[:, 0])), 3),
                            "predicted_ratio": round(float(np.median(a[:, 1])), 3),
                            "median_transfer_err_pct": round(100 * float(np.median(err)), 1),
                            "p90_abs_transfer_err_pct":
                                round(100 * float(np.percentile(np.abs(err), 90)), 1)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="predicted vs measured kernel latency on the opdb tables")
    ap.add_argument("--data", type=Path, default=DEFAULT_DIR / "opdb",
                    help=f"folder with the opdb tables of H100 / H200 (default: {DEFAULT_DIR / 'opdb'}, written "
                         "once by python -m hardware.opdb_import)")
    ap.add_argument("--engines", nargs="*", default=list(ENGINES), choices=list(ENGINES))
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for kernel_report.csv (kernel_check.csv with --check)")
    ap.add_argument("--transfer", action="store_true",
                    help=f"also compare the measured {OTHER_GPU} / {REFERENCE_GPU} latency ratio of the "
                         "shapes both GPUs time with the predicted one (kernel_transfer.csv with --out)")
    ap.add_argument("--check", type=Path, default=None, metavar="TABLE",
                    help="instead: the shipped constants of --engines against one kernel table in the opdb "
                         "layout (.csv, .csv.gz, .parquet) measured on --gpu, or against every table of a "
                         "folder named <gpu>__<table>__<engine>-<version>.<ext> (engine and GPU from the name)")
    ap.add_argument("--gpu", default=None, help="the GPU spec the --check table was measured on")
    ap.add_argument("--arch", default=None, choices=list(TABLE_SETS),
                    help="with --check: price with this architecture's constant sets (default: those of the "
                         "table's GPU; hopper on a Blackwell table: the Hopper sets moved by the GPU spec alone)")
    args = ap.parse_args(argv)
    if args.check is not None:
        return _check_main(args.check, args.engines, args.gpu, args.out, args.arch)
    if not args.data.is_dir():
        print(f"error: --data {args.data} is not a folder{MISSING_TABLES_HINT}", file=sys.stderr)
        return 2
    rows = report(args.data, args.engines)
    _print_rows(rows)
    if args.out is not None:
        _write_csv(args.out / "kernel_report.csv", rows)
    if args.transfer:
        moved = transfer(args.data, args.engines)
        print(f"\n{OTHER_GPU} / {REFERENCE_GPU} on the shapes both time "
              "(transfer error: predicted / measured ratio - 1)")
        print(f"{'engine':8s} {'table':44s} {'pairs':>7s} {'measured':>9s} {'predicted':>10s} "
              f"{'median%':>8s} {'p90|%|':>7s}")
        for t in moved:
            print(f"{t['engine']!s:8s} {t['table']!s:44s} {t['pairs']!s:>7s} {t['measured_ratio']!s:>9s} "
                  f"{t['predicted_ratio']!s:>10s} {t['median_transfer_err_pct']!s:>8s} "
                  f"{t['p90_abs_transfer_err_pct']!s:>7s}")
        if args.out is not None and moved:
            _write_csv(args.out / "kernel_transfer.csv", moved)
    return 0


def _print_rows(rows: list[dict[str, object]]) -> None:
    print(f"{'engine':8s} {'table':44s} {'rows':>7s} {'median|err|%':>13s} {'p90|err|%':>10s} {'bias%':>7s}")
    for r in rows:
        print(f"{r['engine']!s:8s} {r['table']!s:44s} {r['rows']!s:>7s} {r['median_abs_err_pct']!s:>13s} "
              f"{r['p90_abs_err_pct']!s:>10s} {r['median_signed_err_pct']!s:>7s}")


TABLE_SUFFIXES = (".csv.gz", ".csv", ".parquet")


def table_name_parts(name: str) -> tuple[str, str, str, str] | None:
    """(gpu, table, engine, version) of a file named as the opdb tables are,
    ``<gpu>__<table>__<engine>-<version>.<csv | csv.gz | parquet>``; None for any other name."""
    for suffix in TABLE_SUFFIXES:
        if name.endswith(suffix):
            parts = name[:-len(suffix)].split("__")
            if len(parts) == 3 and "-" in parts[2]:
                engine, version = parts[2].split("-", 1)
                return parts[0], parts[1], engine, version
    return None


def check_folder(folder: Path, engines: Iterable[str],
                 arch: str | None = None) -> tuple[list[dict[str, object]], list[str]]:
    """:func:`check_table` for every table in ``folder`` named as the opdb tables are, each against its own
    engine's constants (those of ``engines`` only) on the GPU its name gives: the figures, each row with its
    file and version, and a line for every file left out and why."""
    rows: list[dict[str, object]] = []
    notes: list[str] = []
    wanted = set(engines)
    for path in sorted(folder.iterdir()):
        parts = table_name_parts(path.name)
        if parts is None:
            notes.append(f"{path.name}: left out, not named <gpu>__<table>__<engine>-<version>.<csv|csv.gz|parquet>")
            continue
        gpu, _, engine, version = parts
        if engine not in ENGINES:
            notes.append(f"{path.name}: left out, no constants for engine {engine!r} (known: {sorted(ENGINES)})")
            continue
        if engine not in wanted:
            continue
        checked = check_table(path, engine, gpu, arch)
        if not checked:
            notes.append(f"{path.name}: left out, no row the report prices (it keeps balanced-routing MoE rows, "
                         "full attention at GQA ratios 2-16 and the formats it has curves for)")
        rows.extend({"file": path.name, "version": version, "gpu": gpu, **r} for r in checked)
    return rows, notes


def _check_main(path: Path, engines: list[str], gpu: str | None, out: Path | None, arch: str | None = None) -> int:
    if path.is_dir() and gpu is not None:
        print("error: --gpu is for one table; a folder's file names give each table's GPU", file=sys.stderr)
        return 2
    try:
        if path.is_dir():
            rows, notes = check_folder(path, engines, arch)
            for note in notes:
                print(note)
            for name in dict.fromkeys(str(r["file"]) for r in rows):
                print(f"\n{name}")
                _print_rows([r for r in rows if r["file"] == name])
        else:
            if gpu is None or len(engines) != 1:
                print("error: --check TABLE needs --gpu and exactly one of --engines (a folder of tables named "
                      "<gpu>__<table>__<engine>-<version> needs neither)", file=sys.stderr)
                return 2
            rows = check_table(path, engines[0], gpu, arch)
            print(f"{path} ({gpu}) against the shipped {check_calibration(engines[0], gpu, arch).name} constants")
            _print_rows(rows)
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if out is not None and rows:
        _write_csv(out / "kernel_check.csv", rows)
    return 0


def _write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    raise SystemExit(main())
