"""Write the measured kernel tables the calibration and the kernel report read, from a local checkout of
ai-dynamo/aiconfigurator (Apache-2.0), once:

    git init ../aiconfigurator
    git -C ../aiconfigurator fetch --depth 1 https://github.com/ai-dynamo/aiconfigurator COMMIT
    git -C ../aiconfigurator checkout FETCH_HEAD
    pip install pyarrow                        # or: pip install -e '.[pandas]'
    python -m hardware.opdb_import ../aiconfigurator

with COMMIT = AICONFIGURATOR_COMMIT (the fetch is about 220 MB). The tables are not shipped in the package:
compressed they take about 34 MB. This writes kernel-tables/opdb (H100 SXM and H200 SXM) and
kernel-tables/opdb-blackwell (B300 SXM), where ``python -m hardware.calibrate`` and
``python -m experiments.kernel_report`` look by default: one ``<gpu>__<table>__<engine>-<version>.csv.gz`` per
aiconfigurator table (``systems/data/<gpu>/<family>/<engine>/<version>/<table>.parquet``), every value as text.
At that commit the row counts equal those of the tables the shipped constants were fitted on (EXPECTED_ROWS).
Nothing here runs at import or simulation time; no command downloads anything by itself.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

AICONFIGURATOR_COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"
DEFAULT_DIR = Path("kernel-tables")
"""Where the tables go, relative to the working directory (the calibration and the kernel report default to
its sub-folders)."""

MISSING_TABLES_HINT = (": the kernel tables are not shipped; fetch them once "
                       "(python -m hardware.opdb_import --help says how)")

DATA_ROOTS = ("aic-core/src/aiconfigurator_core/systems/data", "src/aiconfigurator/systems/data", "systems/data",
              ".")
"""Where a checkout keeps its per-GPU folders (the layout moved between releases), or the data folder itself."""

_ATTENTION = ("context_attention_perf", "generation_attention_perf")
_MLA = ("context_mla_perf", "generation_mla_perf")
_SGLANG = (*_ATTENTION, *_MLA, "custom_allreduce_perf", "gemm_perf", "moe_perf", "wideep_context_mla_perf",
           "wideep_generation_mla_perf")
_VLLM = (*_ATTENTION, "custom_allreduce_perf", "gdn_perf", "gemm_perf", "mla_context_module_perf",
         "mla_generation_module_perf", "moe_perf")
_TRTLLM = (*_ATTENTION, *_MLA, "custom_allreduce_perf", "gemm_perf", "moe_perf")
_LINEAR = ("gdn_perf", "mamba2_perf")

TABLES: Mapping[str, tuple[tuple[str, ...], Mapping[str, tuple[str, ...]]]] = {
    "opdb": (("h100_sxm", "h200_sxm"), {"sglang-0.5.9": _SGLANG, "trtllm-1.2.0rc5": _TRTLLM,
                                        "trtllm-1.3.0rc20": _LINEAR, "vllm-0.24.0": _VLLM,
                                        "nccl-2.29.2": ("nccl_perf",)}),
    "opdb-blackwell": (("b300_sxm",), {"sglang-0.5.9": _SGLANG, "trtllm-1.3.0rc20": (*_TRTLLM, *_LINEAR),
                                       "vllm-0.24.0": _VLLM, "nccl-2.29.2": ("nccl_perf",)}),
}
"""Output folder -> (GPUs, engine-version -> tables): the tables the calibration (hardware.kernel_tables.TABLE_SETS)
and the kernel report read, with the engine versions they were fitted on. A table a GPU was not measured with
(H200 has no wide-EP MLA tables) is left out."""

EXPECTED_ROWS = {"opdb": 1_480_355, "opdb-blackwell": 1_039_283}
"""Rows written per folder at AICONFIGURATOR_COMMIT, as in the tables the shipped constants were fitted on."""


def data_root(checkout: Path) -> Path:
    """The folder of a checkout that holds the per-GPU folders (h100_sxm/, ...)."""
    for rel in DATA_ROOTS:
        root = checkout / rel
        if (root / "h100_sxm").is_dir():
            return root
    raise ValueError(f"{checkout}: no aiconfigurator systems/data folder (looked for "
                     f"{', '.join(str(checkout / r / 'h100_sxm') for r in DATA_ROOTS)})")


def plan(root: Path) -> dict[str, dict[str, Path]]:
    """Output folder -> output file name -> the Parquet table it is written from, for every table of
    :data:`TABLES` the data folder ``root`` has (the family folder of the current layout or none, the older)."""
    out: dict[str, dict[str, Path]] = {}
    for folder, (gpus, versions) in TABLES.items():
        files: dict[str, Path] = {}
        for gpu in gpus:
            for engine_version, tables in versions.items():
                engine, version = engine_version.split("-", 1)
                for table in tables:
                    found = sorted((root / gpu).glob(f"*/{engine}/{version}/{table}.parquet")) or \
                        sorted((root / gpu).glob(f"{engine}/{version}/{table}.parquet"))
                    if found:
                        files[f"{gpu}__{table}__{engine_version}.csv.gz"] = found[0]
        out[folder] = files
    return out


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def csv_text(columns: Mapping[str, list[Any]]) -> str:
    """A table's columns as CSV text: a header line, then one line per row, every value as ``str`` gives it
    (a float's shortest repr) and a missing one empty."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(list(columns))
    writer.writerows(zip(*([_cell(v) for v in col] for col in columns.values())))
    return buf.getvalue()


def write_gz(path: Path, text: str) -> None:
    """Write ``text`` gzip-compressed, with no name or time in the header (the same input, the same bytes)."""
    with path.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        gz.write(text.encode("utf-8"))


def convert(checkout: Path, out: Path, log: Any = print) -> dict[str, int]:
    """Write every planned table under ``out/<folder>/``; returns the rows written per folder."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ValueError("reading aiconfigurator's Parquet tables needs pyarrow: pip install pyarrow "
                         "(or pip install -e '.[pandas]')") from err
    rows: dict[str, int] = {}
    for folder, files in plan(data_root(checkout)).items():
        target = out / folder
        target.mkdir(parents=True, exist_ok=True)
        rows[folder] = 0
        for name, source in sorted(files.items()):
            table = pq.read_table(source)
            write_gz(target / name, csv_text(table.to_pydict()))
            rows[folder] += table.num_rows
        log(f"{target}: {len(files)} tables, {rows[folder]:,} rows")
    return rows


def check(rows: Mapping[str, int]) -> Iterable[str]:
    """Warnings for the folders whose row count differs from :data:`EXPECTED_ROWS`."""
    for folder, n in rows.items():
        if n != EXPECTED_ROWS[folder]:
            yield (f"warning: {folder} has {n:,} rows, not the {EXPECTED_ROWS[folder]:,} the shipped constants "
                   f"were fitted on: check out aiconfigurator {AICONFIGURATOR_COMMIT} for those tables")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkout", type=Path, help="a checkout of ai-dynamo/aiconfigurator (or its systems/data folder)")
    ap.add_argument("--out", type=Path, default=DEFAULT_DIR,
                    help=f"where to write opdb/ and opdb-blackwell/ (default: {DEFAULT_DIR})")
    args = ap.parse_args(argv)
    try:
        rows = convert(args.checkout, args.out)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in check(rows):
        print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
