"""Fit the throughput family's efficiency curves and floors on measured kernel tables (aiconfigurator opdb).

    python -m hardware.calibrate [--data kernel-tables/opdb] --out hardware/data/calibration
    python -m hardware.calibrate --arch blackwell [--data kernel-tables/opdb-blackwell] \
        --out hardware/data/calibration/blackwell

The tables (aiconfigurator's, about 34 MB compressed) are not shipped: ``python -m hardware.opdb_import``
writes them once into kernel-tables/, where --data looks by default.

One constant set per engine and GPU architecture (TABLE_SETS). Hopper: each engine's kernels (vLLM 0.24.0,
SGLang 0.5.9, TRT-LLM 1.2.0rc5) fitted jointly on H100 SXM and H200 SXM; Blackwell: on B300 SXM (vLLM 0.24.0,
SGLang 0.5.9, TRT-LLM 1.3.0rc20). Every row's FLOPs and bytes are divided by that GPU's *spec* peak and
bandwidth, so within an architecture the constants carry over to GPUs that were not measured (only the GPU
spec changes). Least squares on log(predicted / measured). Nothing here looks at end-to-end serving rows.
The script writes <out>/<engine>.yaml with a provenance comment per block; blocks with no table to fit keep
the set's starting values: default.yaml's for Hopper, the engine's Hopper set's for another architecture.

This module is the command line. The fit itself is split by role: hardware.kernel_tables (which tables,
read how, which rows), hardware.table_features (a row's FLOPs, bytes and loads), hardware.curve_fit (the
least-squares fits), hardware.engine_fit (one engine's set, block by block) and hardware.fitted_sets (the
YAML written, its notes, --only's merge). The names other code imports from here are re-exported below.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import attrs

from hardware.curve_fit import (EXPERT_TERM_MIN_GAIN, EXTRA_TERMS, fit_allreduce, fit_allreduce_lines, fit_moe_curve,
                                fit_roofline, roof_np, tile_pad_np)
from hardware.engine_fit import SSM_BLOCKS, fit_engine, fit_ssm
from hardware.fitted_sets import keep_shipped, starting_set, yaml_with_notes
from hardware.kernel_tables import (ACT, ENGINES, GEMM_DTYPES, GEMM_ROW_TILES, GPUS, GQA_RATIOS, HOPPER,
                                    HOST_BOUND_GEMM, KV_BYTES, MAX_ROWS, MOE_DTYPES, MOE_ROUTING, SSM_TABLES,
                                    TABLE_SETS, TableSet, gdn_rows, gqa_ratio_fitted, possible, read_table,
                                    read_table_file)
from hardware.opdb_import import DEFAULT_DIR, MISSING_TABLES_HINT
from hardware.table_features import (MOE_FAMILY_MARKS, MOE_WIDTHS_MIN, moe_curve_subsets, moe_expert_bytes,
                                     moe_features, moe_format_rows, moe_kernel_family, moe_pass_s)

__all__ = [
    "ACT", "ENGINES", "EXPERT_TERM_MIN_GAIN", "EXTRA_TERMS", "GEMM_DTYPES", "GEMM_ROW_TILES", "GPUS", "GQA_RATIOS",
    "HOPPER", "HOST_BOUND_GEMM", "KV_BYTES", "MAX_ROWS", "MOE_DTYPES", "MOE_FAMILY_MARKS", "MOE_ROUTING",
    "MOE_WIDTHS_MIN", "SSM_BLOCKS", "SSM_TABLES", "TABLE_SETS", "TableSet", "fit_allreduce", "fit_allreduce_lines",
    "fit_engine", "fit_moe_curve", "fit_roofline", "fit_ssm", "gdn_rows", "gqa_ratio_fitted", "keep_shipped", "main",
    "moe_curve_subsets", "moe_expert_bytes", "moe_features", "moe_format_rows", "moe_kernel_family", "moe_pass_s",
    "possible", "read_table", "read_table_file", "roof_np", "starting_set", "tile_pad_np",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=None,
                    help=f"folder with the opdb *.csv.gz tables (default: {DEFAULT_DIR}/<the --arch's folder>: "
                         f"{', '.join(str(DEFAULT_DIR / t.source) for t in TABLE_SETS.values())}, written once by "
                         "python -m hardware.opdb_import)")
    ap.add_argument("--arch", default="hopper", choices=list(TABLE_SETS),
                    help="the GPU architecture the tables were measured on (TABLE_SETS: its GPUs, engine versions "
                         "and default --out; hopper: hardware/data/calibration, another: a sub-folder of it)")
    ap.add_argument("--out", type=Path, default=None, help="where to write <engine>.yaml (default: the --arch's)")
    ap.add_argument("--engines", nargs="*", default=list(ENGINES), choices=list(ENGINES))
    ap.add_argument("--gpus", nargs="*", default=None, metavar="GPU",
                    help="fit on these GPUs' tables only (default: every GPU of --arch): a set for a transfer "
                         "test, e.g. --gpus h100_sxm --out validation/constants/h100_only")
    ap.add_argument("--only", nargs="*", default=None, metavar="BLOCK",
                    help="write only these blocks (e.g. moe) or curves (e.g. moe.fp4), keeping every other "
                         "block and curve of the shipped <engine>.yaml of --arch as it is (a refit of one kernel "
                         "family)")
    args = ap.parse_args(argv)
    tables = TABLE_SETS[args.arch]
    if args.data is None:
        args.data = DEFAULT_DIR / tables.source
    if not args.data.is_dir():
        print(f"error: --data {args.data} is not a folder{MISSING_TABLES_HINT}", file=sys.stderr)
        return 2
    if args.gpus:
        unknown = sorted(set(args.gpus) - set(tables.gpus))
        if unknown:
            print(f"error: --gpus {' '.join(unknown)}: {args.arch} tables are of {', '.join(tables.gpus)}",
                  file=sys.stderr)
            return 2
        if args.out is None:
            print("error: --gpus needs --out (the shipped sets are fitted on every GPU)", file=sys.stderr)
            return 2
        tables = attrs.evolve(tables, gpus=tuple(args.gpus))
    out = args.out if args.out is not None else tables.out
    out.mkdir(parents=True, exist_ok=True)
    for engine in args.engines:
        start, start_notes = starting_set(engine, tables)
        log = lambda s: print(s, flush=True)  # noqa: E731
        if args.only is not None and set(args.only) <= SSM_BLOCKS:   # (no other table to read)
            data, notes = fit_ssm(args.data, engine, start, log, tables)
            data = {**{k: v for k, v in start.items() if k != "provenance"}, **data}
        else:
            data, notes = fit_engine(args.data, engine, start, log, tables)
        notes = {**start_notes, **notes}
        if args.only is not None:
            data, notes = keep_shipped(engine, data, notes, set(args.only), tables)
        path = out / f"{engine}.yaml"
        path.write_text(yaml_with_notes(engine, data, notes, str(args.data), tables))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
