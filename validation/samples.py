"""The measured-benchmark CSV format: the columns ``twin validate silicon`` reads, and the measured samples
shipped in the package (validation/data/README.md), named so a command can take a name in place of a path.

Kept free of the simulator's imports: ``twin --help`` builds the column list from here.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"

SAMPLES = {"h100_h200": "silicon_h100_h200.csv.gz", "blackwell_dev": "silicon_blackwell_dev.csv.gz"}
"""Shipped measured samples: name -> file under validation/data (provenance and licence in its README)."""

Columns = tuple[tuple[tuple[str, ...], str], ...]
"""(column names, what they give): one entry of the help's column list per item."""

REQUIRED: Columns = (
    (("id",), "the row's name (rows.csv, --match); an aggregated id's tpN_epM part checks its GPU count"),
    (("backend",), "the engine: vllm, sglang or trtllm"),
    (("model_path",), "the model's Hugging Face name, or an alias of hardware/data/models/aliases.yaml"),
    (("system",), "the GPU spec: h100_sxm, h200_sxm, b300_sxm, gb300, ... (hardware/data/gpus)"),
    (("mode",), "agg (one engine) or disagg (prefill and decode pools)"),
    (("isl", "osl"), "input and output tokens of every request"),
    (("silicon_ttft_ms", "silicon_tpot_ms"), "the measured mean TTFT and TPOT, milliseconds"),
)

OPTIONAL: Columns = (
    (("silicon_data_source",), "where the row was measured: picks the benchmark client and launch rules; may "
                               "carry silicon_concurrency=N (the client's concurrency) and measured=ISO-TIME"),
    (("backend_version",), "the engine version (some launch rules depend on it)"),
    (("precision", "gemm_quant_mode", "moe_quant_mode"),
     "weight formats (bf16, fp8, fp8_block, nvfp4, mxfp4, int4_wo): the row's, its GEMMs' (blank: precision), "
     "its experts'"),
    (("batch_size",), "the client's concurrency, per attention-DP rank where the engine has attention DP "
                      "(silicon_concurrency=N in silicon_data_source takes precedence)"),
    (("tp_size", "pp_size", "attention_dp_size"),
     "an aggregated engine's tensor, pipeline and attention data parallelism (blank: 1, attention DP inferred "
     "where the MoE spans more GPUs than tp_size; pp_size > 1 is skipped)"),
    (("moe_tp_size", "moe_ep_size"), "its MoE tensor and expert parallelism"),
    (("prefill_tp_size", "prefill_pp_size", "prefill_attention_dp_size"),
     "a disaggregated row's prefill workers: as tp_size, pp_size, attention_dp_size"),
    (("prefill_moe_tp_size", "prefill_moe_ep_size"), "as moe_tp_size, moe_ep_size"),
    (("prefill_num_workers", "prefill_batch_size"),
     "prefill workers (blank: the harness config's, else 1) and each rank's batch cap (blank: the engine's)"),
    (("decode_tp_size", "decode_pp_size", "decode_attention_dp_size"), "the same for the decode workers"),
    (("decode_moe_tp_size", "decode_moe_ep_size"), "as moe_tp_size, moe_ep_size"),
    (("decode_num_workers", "decode_batch_size"), "as prefill_num_workers, prefill_batch_size"),
    (("max_batch_size", "max_num_tokens"),
     "an aggregated engine's launch limits, where known: running requests per rank (--max-num-seqs, "
     "--max-running-requests, --max_batch_size) and new tokens per step (blank: the harness rule's)"),
)


def names(columns: Columns) -> tuple[str, ...]:
    """The column names of a list, in order."""
    return tuple(name for group, _ in columns for name in group)


REQUIRED_COLUMNS = names(REQUIRED)
OPTIONAL_COLUMNS = names(OPTIONAL)

NAME_WIDTH = 28
HELP_WIDTH = 100


def _format(columns: Columns) -> list[str]:
    lines = []
    for group, what in columns:
        head = ", ".join(group)
        text = textwrap.wrap(what, HELP_WIDTH - NAME_WIDTH - 4)
        if len(head) <= NAME_WIDTH:
            lines.append(f"  {head:<{NAME_WIDTH}}  {text[0]}")
            text = text[1:]
        else:
            lines.append(f"  {head}")
        lines += [" " * (NAME_WIDTH + 4) + t for t in text]
    return lines


def columns_help() -> str:
    """The column list of ``twin validate silicon --help``: one line of names (two spaces in) per entry, what
    they give after them or on the lines below."""
    return "\n".join([
        "required columns:", *_format(REQUIRED),
        "optional columns (absent or blank: the default named):", *_format(OPTIONAL),
        "", "other columns are ignored. Shipped samples (validation/data/README.md): "
        + ", ".join(SAMPLES) + "."])


def columns_markdown() -> str:
    """The same list as a Markdown table, as README.md's "Measured data" section has it (a test keeps the two
    equal)."""
    lines = ["| column | required | what it gives |", "|---|---|---|"]
    for columns, required in ((REQUIRED, "yes"), (OPTIONAL, "no")):
        lines += [f"| {', '.join(f'`{n}`' for n in group)} | {required} | {what} |" for group, what in columns]
    return "\n".join(lines)


def sample_path(name: str) -> Path:
    """The file of a shipped sample."""
    if name not in SAMPLES:
        raise ValueError(f"unknown sample {name!r}; shipped samples: {', '.join(SAMPLES)}")
    return DATA_DIR / SAMPLES[name]


def resolve_csv(arg: str | Path) -> Path:
    """A measured CSV given on a command line: the file at ``arg`` where there is one (a user's own
    .csv or .csv.gz), else the shipped sample named ``arg``."""
    path = Path(arg)
    if path.exists():
        return path
    if str(arg) in SAMPLES:
        return sample_path(str(arg))
    raise FileNotFoundError(f"{arg}: no such file, and no shipped sample of that name ({', '.join(SAMPLES)})")
