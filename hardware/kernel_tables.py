"""The measured kernel tables the calibration fits on (aiconfigurator's opdb): which tables each GPU
architecture has and which engine versions timed them (TABLE_SETS), how a table is read, the format names it
uses, and which of its rows a fit may use (possible, gqa_ratio_fitted, sample_rows). Nothing here fits."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path
from typing import Mapping, Sequence

import attrs
import numpy as np

from hardware.calibration import CALIBRATION_DIR
from hardware.dtypes import DTYPE_BYTES
from hardware.gpu import load_gpu

GPUS = ("h100_sxm", "h200_sxm")
ENGINES = {"vllm": "vllm-0.24.0", "sglang": "sglang-0.5.9", "trtllm": "trtllm-1.2.0rc5"}
MAX_ROWS = 12000            # per fitted subset, sampled with a fixed seed (2-core budget)
ACT = 2.0
GEMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "fp4"}
MOE_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "fp4", "w4a16_mxfp4": "fp4",
              "int4_wo": "int4"}
"""The tables' formats -> the twin's weight formats (hardware.dtypes). The twin's ``fp4`` is NVFP4 (W4A4 on
Blackwell's FP4 tensor cores, 4.5 bits per weight). Where a table has both, the first format of this order
with rows fits a curve key and a later one mapping to the same key is left out (fit_engine): on B300, NVFP4
fits ``fp4`` and the MXFP4 weight-only rows (gpt-oss's kernels) only the kernel families NVFP4 was not timed
with (``fp4_marlin``). Hopper's tables have no NVFP4, so there ``fp4`` is MXFP4 weight-only (W4A16).
w4a8_mxfp4_mxfp8 (B300) maps to no format the twin has."""
MOE_ROUTING = {"balanced": "balanced", "power_law_1.01": "power_law_busiest"}
"""The routing (kernels.routed_load) a MoE table's ``distribution`` is priced with. Curves are fitted on
balanced rows; a format a table times under power-law routing only (SGLang 0.5.9 on B300) is fitted on its
power_law_1.01 rows at the busiest expert-parallel rank (on SGLang's H100 fp8_block table the balanced-fitted
curve prices those rows at 10 % median |error| and -7 % bias at EP > 1 that way, 17 % and -15 % at the mean
rank; alike at EP 1)."""
KV_BYTES = {"bfloat16": 2.0, "fp8": 1.0}
# Tables whose small shapes measure eager host overhead, not GPU time: vLLM 0.24's block-FP8 GEMM rows take
# 60-180 us at every shape with all three kernel sources (DeepGEMM, FlashInfer, CUTLASS), 5-20x what SGLang's
# and TRT-LLM's block-FP8 kernels take. Under CUDA graphs that overhead is gone, so these are fitted on
# m >= 512 rows only (GPU-bound, compute side) and take the memory side and floor from the same engine's
# per-tensor FP8 fit.
HOST_BOUND_GEMM = {"vllm": {"fp8_block": 512}}
# GEMM kernels whose row tile changes with the batch size, from the engine's dispatch, as (largest m,
# largest n, tile rows) entries, a bound of 0 holding for any size (calibration.Roofline.row_tiles). vLLM's
# per-tensor FP8 GEMM on Hopper (the opdb table's CutlassFP8ScaledMMLinearKernel; vllm-project/vllm
# csrc/quantization/w8a8/cutlass/c3x/scaled_mm_sm90_fp8_dispatch.cuh, cutlass_gemm_sm90_fp8_dispatch):
# m <= 16 swaps A and B and tiles the batch by 16 rows (TileShape 64 x 16 x 256); 16 < m <= 64 swaps them
# with 16-row tiles where n <= 1280 and 64-row tiles above; 64 < m <= 128 runs 64 x 128 tiles (64 rows);
# larger m 128 x 128 tiles in clusters of 2 x 1 along m (256 rows a cluster). A fixed input of the fit.
GEMM_ROW_TILES: dict[str, dict[str, tuple[tuple[int, int, int], ...]]] = {
    "vllm": {"fp8": ((16, 0, 16), (64, 1280, 16), (64, 0, 64), (128, 0, 64), (0, 0, 256))}}
# Linear-attention tables (gated DeltaNet) per engine: conv + scan kernels summed per configuration.
# SGLang has no gdn table. Its GDN layers call vendored flash-linear-attention Triton kernels
# (sglang/srt/layers/attention/fla: chunk_gated_delta_rule, fused_recurrent_gated_delta_rule_update), the
# default of its GDN backends in the measured builds (--linear-attn-prefill-backend / --gdn-backend triton;
# FlashInfer's GDN prefill came for SM100 as an option in sglang PR #22921, 2026-04-16, and was auto-selected
# from PR #29734, 2026-06-30; no InferenceX launch of a measured row names another backend). TRT-LLM's table
# times the same kernels (tensorrt_llm/_torch/modules/fla/chunk.py, aiconfigurator's collect_gdn.py), so
# SGLang is fitted on it. vLLM 0.24's table times FlashInfer's fused GDN prefill
# (chunk_gated_delta_rule_flashinfer: vllm PR #32846 on SM90, #40717 on SM100), which walks the chunks of a
# sequence in one kernel: 2-5x faster than FLA's pipeline at 16-64 heads and a few sequences.
SSM_TABLES = {"vllm": "vllm-0.24.0", "trtllm": "trtllm-1.3.0rc20", "sglang": "trtllm-1.3.0rc20"}


GQA_RATIOS = (2, 16)
"""Query heads per KV head of the attention rows the GQA curves are fitted on. No grouped-query model in
hardware/data/models has fewer than 2 (MLA models take the MLA tables). The tables' multi-head rows (ratio 1)
run another kernel on TRT-LLM: with an FP8 cache a curve fitted over both put them at -21 % and the GQA rows
at +20-29 %, so one curve fits neither. Above 16 (DeepSeek-V4's MQA, Nemotron-3 Ultra's 32) the curve
extrapolates, as it did before the lower bound was added."""


def gqa_ratio_fitted(r: dict[str, str]) -> bool:
    """Whether an attention row's query heads per KV head lie in GQA_RATIOS."""
    heads, kv = int(r["num_heads"]), int(r["num_key_value_heads"])
    return GQA_RATIOS[0] * kv <= heads <= GQA_RATIOS[1] * kv


@attrs.frozen(kw_only=True)
class TableSet:
    """The kernel tables one GPU architecture's sets are fitted on, and the fit's inputs that depend on the
    architecture's kernels."""

    arch: str
    source: str                                  # what the provenance calls the tables
    gpus: tuple[str, ...]
    engines: Mapping[str, str]                   # engine -> the tables' engine version
    host_bound_gemm: Mapping[str, Mapping[str, int]]
    gemm_row_tiles: Mapping[str, Mapping[str, tuple[tuple[int, int, int], ...]]]
    out: Path                                    # where its sets ship
    graph_floors_at_most_fitted: bool = False    # written into its sets (Calibration.graph_floors_at_most_fitted)


TABLE_SETS = {
    "hopper": TableSet(arch="hopper", source="opdb", gpus=GPUS, engines=ENGINES, host_bound_gemm=HOST_BOUND_GEMM,
                       gemm_row_tiles=GEMM_ROW_TILES, out=CALIBRATION_DIR),
    # vLLM's block-FP8 GEMM rows measure host overhead at small m on B300 too (170-240 us at m <= 16 and
    # n, k <= 1024, where its per-tensor FP8 GEMM takes 5-6 us); GEMM_ROW_TILES is Hopper's SM90 dispatch, so
    # Blackwell's GEMMs fit a fixed row tile
    "blackwell": TableSet(arch="blackwell", source="opdb-blackwell", gpus=("b300_sxm",),
                          engines={"vllm": "vllm-0.24.0", "sglang": "sglang-0.5.9", "trtllm": "trtllm-1.3.0rc20"},
                          host_bound_gemm=HOST_BOUND_GEMM, gemm_row_tiles={}, out=CALIBRATION_DIR / "blackwell",
                          graph_floors_at_most_fitted=True),
}
"""The architectures with sets of their own (hardware.calibration.calibration_for); every other architecture is
priced with the Hopper sets."""
HOPPER = TABLE_SETS["hopper"]


def possible(r: dict[str, str], table: str, gpu: str) -> bool:
    """Whether a row's measured time is no faster than reading the bytes it must read once at its GPU's
    peak HBM bandwidth: a decode-attention row its KV cache, a GEMM row its weights. A faster row re-read
    cache-resident data, which a serving step, whose layers and requests each hold their own weights and KV,
    never does. TRT-LLM 1.2.0rc5's decode-attention table has 1,364 such rows at large batch x context (1,254
    at the GQA ratios fitted; up to 1.73 x the H100's bandwidth), vLLM's and SGLang's none; no GEMM row the
    fits use is one. Why TRT-LLM's: its collector allocated a K-only cache
    (CacheType.SELFKONLY, aiconfigurator collector/trtllm/collect_attn.py until dec5f4cd2), so V's reads hit
    blocks just read as K and a row crosses HBM with less than the K and V bytes counted here; the table's
    other large rows run fast for the same reason, which this check cannot see."""
    if table == "generation_attention_perf":
        kv = KV_BYTES.get(r["kv_cache_dtype"], 2.0)
        nbytes = int(r["batch_size"]) * (int(r["step"]) + 1) * int(r["num_key_value_heads"]) * 2 \
            * int(r["head_dim"]) * kv
    elif table == "gemm_perf":
        nbytes = int(r["n"]) * int(r["k"]) * DTYPE_BYTES[GEMM_DTYPES[r["gemm_dtype"]]]
    else:
        return True
    return nbytes <= float(r["latency"]) * 1e-3 * load_gpu(gpu).hbm_bw_Bps


def read_table(data: Path, gpu: str, table: str, version: str) -> list[dict[str, str]]:
    path = data / f"{gpu}__{table}__{version}.csv.gz"
    return read_table_file(path) if path.is_file() else []


def read_table_file(path: Path) -> list[dict[str, str]]:
    """The rows of one kernel table in the opdb layout: CSV (.csv, .csv.gz) or Parquet (needs pyarrow),
    every value as text, as the shipped tables are read."""
    name = path.name
    if name.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow), "
                             "or convert the table to .csv / .csv.gz") from err
        return [{k: "" if v is None else str(v) for k, v in r.items()} for r in pq.read_table(path).to_pylist()]
    if name.endswith(".csv.gz"):
        with gzip.open(path, "rt", newline="") as fh:
            return list(csv.DictReader(fh))
    if name.endswith(".csv"):
        with path.open(newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    raise ValueError(f"{path}: expected a .csv, .csv.gz or .parquet kernel table")


def sample_rows(rows: list[dict[str, str]], n: int = MAX_ROWS) -> list[dict[str, str]]:
    """At most ``n`` of the rows, in their order, drawn with a fixed seed (MAX_ROWS: the 2-core budget)."""
    if len(rows) <= n:
        return rows
    idx = np.random.default_rng(0).choice(len(rows), size=n, replace=False)
    return [rows[i] for i in sorted(idx)]


def load_rows(data: Path, table: str, version: str, gpus: Sequence[str] = GPUS) -> list[dict[str, str]]:
    """One table's rows on every GPU of ``gpus``, each tagged with its GPU (``_gpu``)."""
    rows = []
    for gpu in gpus:
        for r in read_table(data, gpu, table, version):
            r["_gpu"] = gpu
            rows.append(r)
    return rows


def gdn_rows(data: Path, version: str, gpus: Sequence[str] = GPUS) -> list[dict[str, str]]:
    """Sum the conv and scan kernel rows of one GDN configuration into one op latency."""
    total: dict[tuple[str, ...], dict[str, str]] = {}
    keys = ("phase", "batch_size", "seq_len", "num_tokens", "d_model", "num_k_heads", "head_k_dim",
            "num_v_heads", "head_v_dim")
    for r in load_rows(data, "gdn_perf", version, gpus):
        k = (r["_gpu"],) + tuple(r[x] for x in keys)
        if k in total:
            total[k]["latency"] = str(float(total[k]["latency"]) + float(r["latency"]))
            total[k]["_kernels"] = str(int(total[k]["_kernels"]) + 1)
        else:
            total[k] = dict(r, _kernels="1")
    return [r for r in total.values() if r["_kernels"] == "2"]
