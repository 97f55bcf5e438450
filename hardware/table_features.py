"""The calibration's per-row features: what a kernel table's row does as the fitted curves see it (FLOPs,
bytes and rows for the roofline; expert bytes, token passes and routed loads for the grouped experts; the
all-reduce's algorithm time), with the formulas hardware.kernels prices a step with, vectorised with numpy.
MoE rows are also split here into the curves they are fitted under (moe_format_rows, moe_curve_subsets)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from hardware import kernels
from hardware.calibration import CURVE_MOE_KERNELS, moe_curve_key
from hardware.dtypes import COMPUTE_DTYPE, DTYPE_BYTES
from hardware.gpu import load_gpu
from hardware.kernel_tables import ACT, KV_BYTES, MOE_ROUTING


def gpu_rates(rows: list[dict[str, str]], dtype_of: Callable[[dict[str, str]], str]) -> tuple[np.ndarray, np.ndarray]:
    """Per row: its GPU's spec peak FLOP/s in the row's compute format and its HBM bandwidth."""
    peak = np.array([load_gpu(r["_gpu"]).flops_for(COMPUTE_DTYPE[dtype_of(r)]) for r in rows])
    bw = np.array([load_gpu(r["_gpu"]).hbm_bw_Bps for r in rows])
    return peak, bw


def floats(rows: list[dict[str, str]], key: str) -> np.ndarray:
    """One column of the rows as floats."""
    return np.array([float(r[key]) for r in rows])


# --- per-table row -> (flops, bytes, m) ------------------------------------------------------------

def gemm_features(rows: list[dict[str, str]], dtype: str) -> tuple[np.ndarray, ...]:
    m, n, k = floats(rows, "m"), floats(rows, "n"), floats(rows, "k")
    return 2 * m * n * k, n * k * DTYPE_BYTES[dtype] + m * (n + k) * ACT, m


def context_attn_features(rows: list[dict[str, str]]) -> tuple[np.ndarray, ...]:
    b, s = floats(rows, "batch_size"), floats(rows, "isl")
    h, kvh, hd = floats(rows, "num_heads"), floats(rows, "num_key_value_heads"), floats(rows, "head_dim")
    kvb = np.array([KV_BYTES.get(r["kv_cache_dtype"], 2.0) for r in rows])
    prefix = floats(rows, "step")
    pairs = b * (s * (s + 1) / 2 + s * prefix)
    tokens, sum_kv = b * s, b * (s + prefix)
    tok_kv, qo = kvh * 2 * hd * kvb, h * 2 * hd * ACT
    return 2 * h * 2 * hd * pairs, sum_kv * tok_kv + tokens * (qo + tok_kv), tokens


def gen_attn_features(rows: list[dict[str, str]]) -> tuple[np.ndarray, ...]:
    b, step = floats(rows, "batch_size"), floats(rows, "step")
    h, kvh, hd = floats(rows, "num_heads"), floats(rows, "num_key_value_heads"), floats(rows, "head_dim")
    kvb = np.array([KV_BYTES.get(r["kv_cache_dtype"], 2.0) for r in rows])
    sum_kv = b * (step + 1)
    tok_kv, qo = kvh * 2 * hd * kvb, h * 2 * hd * ACT
    work = np.array([kernels.decode_attention_work(float(n), float(q), float(k), 2.0 * float(d), float(x))
                     for n, q, k, d, x in zip(sum_kv, h, kvh, hd, kvb)])
    return work, sum_kv * tok_kv + b * (qo + tok_kv), b


def mla_context_features(rows: list[dict[str, str]]) -> tuple[np.ndarray, ...]:
    """DeepSeek MLA prefill in MHA form: per-GPU heads, q/k 192 (128 nope + 64 rope), v 128, BF16."""
    b, s, h, prefix = floats(rows, "batch_size"), floats(rows, "isl"), floats(rows, "num_heads"), floats(rows, "step")
    pairs = b * (s * (s + 1) / 2 + s * prefix)
    tokens, ctx = b * s, b * (s + prefix)
    width = 128 + 64 + 128
    return pairs * h * 2 * width, (ctx + tokens) * h * width * ACT, tokens


def mla_generation_features(rows: list[dict[str, str]]) -> tuple[np.ndarray, ...]:
    """Absorbed MLA decode: MQA over the 512 + 64 latent, per-GPU heads."""
    b, step, h = floats(rows, "batch_size"), floats(rows, "step"), floats(rows, "num_heads")
    kvb = np.array([KV_BYTES.get(r["kv_cache_dtype"], 2.0) for r in rows])
    kv = b * (step + 1)
    return kv * h * 2 * (576 + 512), kv * 576 * kvb + b * h * (576 + 512) * ACT, b


GDN_CHUNK = 64
"""Tokens per chunk of the gated-DeltaNet chunked kernels the gdn tables time (FLA's and FlashInfer's)."""


def gdn_features(rows: list[dict[str, str]]) -> tuple[np.ndarray, ...]:
    """Same formula as CostModel._ssm_s for a gdn mixer (FP32 state, GDN_CHUNK); the second kernel's floor
    is part of the fitted floor."""
    b, M = floats(rows, "batch_size"), floats(rows, "num_tokens")
    heads, dk, dv = floats(rows, "num_v_heads"), floats(rows, "head_k_dim"), floats(rows, "head_v_dim")
    prefill = np.array([float(r["num_tokens"]) if r["phase"] == "context" else 0.0 for r in rows])
    state = heads * dk * dv
    flops = 6.0 * M * state + 2.0 * prefill * GDN_CHUNK * heads * (dk + dv)
    nbytes = 2.0 * b * state * 4 + M * 3 * heads * (dk + dv) * ACT
    return flops, nbytes, M


def gdn_chunks(rows: list[dict[str, str]]) -> np.ndarray:
    """Per gdn row, the GDN_CHUNK-token chunks of its longest sequence that the chunked scan runs one after
    another (Roofline.chunk_s): the context rows' seq_len in chunks, 0 for the generation rows (recurrent
    update)."""
    return np.array([float(-(-int(r["seq_len"]) // GDN_CHUNK)) if r["phase"] == "context" else 0.0
                     for r in rows])


def moe_format_rows(rows: list[dict[str, str]], moe_dtype: str) -> tuple[list[dict[str, str]], str]:
    """A MoE table's rows of one format that its curve is fitted on, and their ``distribution``: the balanced
    ones, or, where the table has none of the format, its power_law_1.01 ones (MOE_ROUTING)."""
    of_format = [r for r in rows if r["moe_dtype"] == moe_dtype]
    for distribution in MOE_ROUTING:
        kept = [r for r in of_format if r["distribution"] == distribution]
        if kept:
            return kept, distribution
    return [], "balanced"


def moe_kernel_family(kernel_source: str) -> str:
    """The kernel family of an opdb MoE ``kernel_source``: ``marlin`` for the Marlin weight-only MoE kernels
    (w4a16: FP4 / INT4 weights dequantised to BF16 in the GEMM), ``flashinfer`` for FlashInfer's CUTLASS
    fused MoE (vLLM's FlashInferExperts, e.g. ``vllm_fp8moe_flashinfer_cutlass_flashinferexperts``),
    ``default`` for every other kernel: among them FlashInfer's TensorRT-LLM-gen MoE kernels, vLLM's default
    on B300 (``..._flashinfer_trtllm_...``), and SGLang's FlashInfer CuTe-DSL NVFP4 MoE."""
    src = kernel_source.lower()
    for family in CURVE_MOE_KERNELS:
        if MOE_FAMILY_MARKS[family] in src:
            return family
    return "default"


MOE_FAMILY_MARKS = {"marlin": "marlin", "flashinfer": "flashinfer_cutlass"}
"""What an opdb ``kernel_source`` contains when it runs a named MoE kernel family (CURVE_MOE_KERNELS)."""


def moe_curve_subsets(rows: list[dict[str, str]], dtype: str) -> dict[str, list[dict[str, str]]]:
    """The MoE rows of one weight format, by the calibration key their curve is fitted under.

    A format timed with more than one kernel family gets one curve per family: ``dtype`` for the engine's
    default kernel (the rows of no named family) and ``dtype + '_' + family`` (moe_curve_key) for each named
    family; one curve over both fits neither. vLLM's w4a16_mxfp4 table: OpenAI's triton_kernels at gpt-oss's
    shape, Marlin at a 896-expert shape (one curve put Marlin at 0.44x and the Triton kernel at 1.07x its
    measured time at >= 4k tokens). vLLM's fp8_block table: Triton (TritonExperts) at every moe_ep_size 1
    point, FlashInfer CUTLASS (FlashInferExperts) at every moe_ep_size > 1 point; the default curve keeps
    Triton, the kernel vLLM 0.24 picks for block-FP8 on Hopper without EP. A format timed with one kernel
    family keeps the plain key, whichever it is (vLLM's and SGLang's int4_wo rows are all Marlin: Marlin is
    their INT4 MoE kernel; vLLM's per-tensor fp8 rows are all FlashInfer CUTLASS).
    """
    by_family: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by_family.setdefault(moe_kernel_family(r.get("kernel_source", "")), []).append(r)
    if len(by_family) <= 1:
        return {moe_curve_key(dtype): rows} if rows else {}
    if "default" not in by_family:
        raise ValueError(f"moe {dtype}: kernel families {sorted(by_family)} and no default-kernel rows to fit "
                         f"the plain {dtype!r} curve on")
    return {moe_curve_key(dtype, family): subset for family, subset in by_family.items()}


def moe_features(rows: list[dict[str, str]], dtype: str) -> tuple[np.ndarray, ...]:
    T, hid = floats(rows, "num_tokens"), floats(rows, "hidden_size")
    k, E, ep = floats(rows, "topk"), floats(rows, "num_experts"), floats(rows, "moe_ep_size")
    mats, inter_gpu = _moe_widths(rows)
    # balanced rows (and rows that name no distribution): rank 0's experts and pairs as the collector routed
    # them; power-law rows: MOE_ROUTING
    loads = np.array([kernels.routed_load(int(t), int(kk), int(e), int(p),
                                          MOE_ROUTING[r.get("distribution", "balanced")])
                      for t, kk, e, p, r in zip(T, k, E, ep, rows)]).reshape(-1, 2)
    touched, pairs = loads[:, 0], loads[:, 1]
    flops = 2 * pairs * mats * hid * inter_gpu
    nbytes = touched * moe_expert_bytes(rows, dtype) + pairs * (2 * hid + mats * inter_gpu) * ACT
    return flops, nbytes, pairs / np.maximum(touched, 1e-9), inter_gpu, hid


def _moe_widths(rows: list[dict[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """Per MoE row: the expert's weight matrices (2 without a gate) and its width on one GPU (inter /
    moe_tp)."""
    mats = np.array([2.0 if "nongated" in r.get("kernel_source", "") else 3.0 for r in rows])
    return mats, np.ceil(floats(rows, "inter_size") / floats(rows, "moe_tp_size"))


def moe_expert_bytes(rows: list[dict[str, str]], dtype: str) -> np.ndarray:
    """One expert's weight bytes on the GPU per MoE row (kernels.moe_s: mats x hidden x inter / moe_tp)."""
    mats, inter_gpu = _moe_widths(rows)
    return mats * floats(rows, "hidden_size") * inter_gpu * DTYPE_BYTES[dtype]


def moe_pass_s(rows: list[dict[str, str]], bw: np.ndarray) -> np.ndarray:
    """Per MoE row: one pass over its routed token copies at the GPU's spec HBM bandwidth ``bw``
    (kernels.token_pass_s, as kernels.moe_s prices Roofline.token_passes)."""
    return kernels.token_pass_s(floats(rows, "num_tokens"), floats(rows, "topk"), floats(rows, "hidden_size"), bw)


MOE_WIDTHS_MIN = 3
"""Distinct values a MoE table needs of the expert width per GPU (inter_size / moe_tp_size), or of the
hidden width, for the curve's width term on it (n_half, k_half: kernels.moe_s) to be fitted: with fewer, the
rate at one width cannot be told from the width's share of it, and the term would extrapolate at random."""


def allreduce_features(rows: list[dict[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """Per row: algorithm time at the full link bandwidth, 2 (g-1)/g x bytes / link, and the measured time."""
    g = floats(rows, "num_gpus")
    nbytes = floats(rows, "message_size") * ACT
    link = np.array([load_gpu(r["_gpu"]).scaleup_bw_Bps for r in rows])
    return 2 * (g - 1) / g * nbytes / link, floats(rows, "latency") * 1e-3
