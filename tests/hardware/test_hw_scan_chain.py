"""Roofline.chunk_s: a gated-DeltaNet prompt scan walks each sequence's 64-token chunks in turn, so a call
costs its longest sequence's chunks at that rate, added to the parallel work (FLA's Triton pipeline) or
bounding it from below (FlashInfer's fused kernel). Priced on the step's prompts alone; decode steps and
Mamba2 layers keep the roofline."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

from hardware import BatchShape, CostModel, Deployment, load_engine, load_gpu, load_model
from hardware.calibration import Roofline, calibration_for, calibration_from_dict
from hardware.curve_fit import fit_chunk_s, roof_np
from hardware.kernel_tables import SSM_TABLES
from hardware.kernels import ssm_s
from hardware.table_features import gdn_chunks

QWEN35 = "Qwen/Qwen3.5-397B-A17B"     # 45 gated-DeltaNet layers of 60; 64 value heads, 16 per GPU at TP 4
SHAPE = dict(reqs=1, decode_reqs=0, heads=16, dk=128, dv=128, chunk=64, state_bytes=4, peak_flops=1e15)


def test_ssm_s_chain_by_hand() -> None:
    """8,192 prompt tokens at 16 heads: 192 MiB of activations (8192 x 3 x 16 x 256 x 2 B) plus two 1 MiB
    FP32 states, read at 100 GB/s (mem_eff 1), and 17 us of compute at 1 PFLOP/s: 2.0342 ms of memory time,
    5 us of floor per kernel. 128 chunks at 2 us: 256 us, added (2.0342 + 0.256 + 0.010 ms) or below the
    memory time as a bound (2.0342 + 0.010 ms); at 20 us a chunk the bound shows (2.56 + 0.010 ms)."""
    nbytes = 8192 * 3 * 16 * 256 * 2 + 2 * 16 * 128 * 128 * 4
    mem = nbytes / 100e9
    roof = Roofline(compute_eff=1.0, mem_eff=1.0, floor_s=5e-6)
    plain = ssm_s(roof, tokens=8192, bw_Bps=100e9, **SHAPE)  # type: ignore[arg-type]
    assert mem == pytest.approx(2.0342e-3, rel=1e-4) and plain == pytest.approx(mem + 10e-6, rel=1e-9)
    assert ssm_s(roof, tokens=8192, bw_Bps=100e9, longest=8192, **SHAPE) == plain  # type: ignore[arg-type]
    added = attrs.evolve(roof, chunk_s=2e-6, chunk_adds=True)
    bound = attrs.evolve(roof, chunk_s=2e-6)
    assert ssm_s(added, tokens=8192, bw_Bps=100e9, longest=8192, **SHAPE) == pytest.approx(  # type: ignore[arg-type]
        plain + 128 * 2e-6, rel=1e-12)
    assert ssm_s(bound, tokens=8192, bw_Bps=100e9, longest=8192, **SHAPE) == plain  # type: ignore[arg-type]
    slow = attrs.evolve(roof, chunk_s=20e-6)
    assert ssm_s(slow, tokens=8192, bw_Bps=100e9, longest=8192, **SHAPE) == pytest.approx(  # type: ignore[arg-type]
        128 * 20e-6 + 10e-6, rel=1e-12)
    # a partial chunk is a whole one: 8,193 tokens walk 129 chunks
    assert ssm_s(added, tokens=8193, bw_Bps=100e9, longest=8193, **SHAPE) - ssm_s(  # type: ignore[arg-type]
        roof, tokens=8193, bw_Bps=100e9, **SHAPE) == pytest.approx(129 * 2e-6, rel=1e-9)  # type: ignore[arg-type]


def test_calibration_reads_the_chain() -> None:
    base = {"gemm": {"bf16": {"mem_eff": 0.8}}, "attention_prefill": {"mem_eff": 0.8},
            "attention_decode": {"mem_eff": 0.8}, "moe": {"bf16": {"mem_eff": 0.8}}, "elementwise": {"mem_eff": 0.8},
            "allreduce": {"alpha_s": 1e-5, "bw_eff": 0.8}, "alltoall": {"alpha_s": 1e-5, "bw_eff": 0.8}}
    cal = calibration_from_dict("t", {**base, "ssm": {"mem_eff": 0.5, "chunk_s": 1.5e-6, "chunk_adds": True}})
    assert (cal.ssm.chunk_s, cal.ssm.chunk_adds) == (1.5e-6, True)
    assert (cal.graph_mode(4e-6).ssm.chunk_s, cal.eager_mode(4e-6).ssm.chunk_adds) == (1.5e-6, True)
    plain = calibration_from_dict("t", {**base, "ssm": {"mem_eff": 0.5}})
    assert (plain.ssm.chunk_s, plain.ssm.chunk_adds) == (0.0, False)


def _rows() -> tuple[dict[str, float], tuple[np.ndarray, ...], np.ndarray]:
    """A roofline and 24 rows of 1-8 sequences of 256-16,384 tokens at 16 heads (B300 rates)."""
    p = {"compute_eff": 0.5, "m_half": 30.0, "mem_eff": 0.3, "bytes_half": 1e6, "floor_s": 8e-6}
    b = np.repeat([1.0, 2.0, 4.0, 8.0], 6)
    L = np.tile([256.0, 512.0, 1024.0, 4096.0, 8192.0, 16384.0], 4)
    M = b * L
    state = 16 * 128 * 128
    flops = 6.0 * M * state + 2.0 * M * 64 * 16 * 256
    nbytes = 2.0 * b * state * 4 + M * 3 * 16 * 256 * 2
    peak, bw = np.full(24, 2.25e15), np.full(24, 8e12)
    return p, (flops, nbytes, M, peak, bw), np.ceil(L / 64)


@pytest.mark.parametrize("adds, c", [(True, 1.7e-6), (False, 3.2e-6)])
def test_fit_chunk_s_finds_the_form_and_the_rate(adds: bool, c: float) -> None:
    """Rows made from a known roofline plus a chain of either form: the fit names the form and finds the
    rate within its 1 % grid; rows of the roofline alone give 0."""
    p, features, chunks = _rows()
    whole = roof_np([p[k] for k in ("compute_eff", "m_half", "mem_eff", "bytes_half", "floor_s")], *features)
    meas = whole + chunks * c if adds else np.maximum(whole - p["floor_s"], chunks * c) + p["floor_s"]
    assert (meas > whole * 1.2).any()   # the chain shows on some rows
    got, got_adds, err = fit_chunk_s(p, *features, meas, chunks)
    assert got_adds is adds
    assert got == pytest.approx(c, rel=0.01)
    assert np.abs(err).max() < 0.01
    none, none_adds, err0 = fit_chunk_s(p, *features, whole, chunks)
    assert (none, none_adds) == (0.0, False) and np.abs(err0).max() < 1e-12


def test_gdn_chunks_of_table_rows() -> None:
    rows = [{"phase": "context", "seq_len": "8192"}, {"phase": "context", "seq_len": "100"},
            {"phase": "generation", "seq_len": "8192"}]
    assert gdn_chunks(rows).tolist() == [128.0, 2.0, 0.0]


def test_sglang_scans_are_fitted_on_the_fla_table() -> None:
    """SGLang's GDN layers run FLA's Triton kernels, which TRT-LLM's table times; vLLM's times FlashInfer's."""
    assert SSM_TABLES["sglang"] == SSM_TABLES["trtllm"] == "trtllm-1.3.0rc20"
    fla, fused = calibration_for("sglang", "blackwell").ssm, calibration_for("vllm", "blackwell").ssm
    assert fla.chunk_adds and not fused.chunk_adds and fla.chunk_s > 0.0 and fused.chunk_s > 0.0


def _ledgers(model: str = QWEN35, engine: str = "sglang") -> tuple[CostModel, CostModel, Roofline]:
    dep = Deployment(gpu=load_gpu("b300_sxm"), model=load_model(model), engine=load_engine(engine), tp=4)
    cal = calibration_for(engine, "blackwell")
    flat = attrs.evolve(cal, ssm=attrs.evolve(cal.ssm, chunk_s=0.0))
    return CostModel(dep), CostModel(dep, calibration=flat), cal.ssm


@pytest.mark.parametrize("q, kv, chunks", [
    ([8192], [8192], 128),                   # one prompt: its 128 chunks
    ([4096, 1024], [4096, 1024], 55),        # (4096^2 + 1024^2) / 5120 = 3481.6 tokens: 55 chunks
    ([4096, 1, 1], [4096, 5000, 300], 64),   # decodes beside a prompt: the prompt's 64 chunks
])
def test_prompt_steps_pay_the_chain_of_their_longest_prompt(q: list[int], kv: list[int], chunks: int) -> None:
    """SGLang on B300 (FLA, added chain): every DeltaNet layer's scan gains the chunks of the step's
    token-weighted mean prompt length at chunk_s; no other GPU term moves."""
    chained, flat, roof = _ledgers()
    assert roof.chunk_adds
    s = BatchShape.from_requests(q, kv)
    a, b = dict(chained.step_cost(s).terms), dict(flat.step_cost(s).terms)
    assert a["ssm_scan"] - b["ssm_scan"] == pytest.approx(45 * chunks * roof.chunk_s, rel=1e-9)
    moved = {n for n in a if a[n] != b[n]}
    assert moved <= {"ssm_scan", "eager_host", "step_host", "request_host", "kv_traversal"}


def test_decode_steps_and_mamba2_layers_keep_the_roofline() -> None:
    chained, flat, _ = _ledgers()
    decode = BatchShape.from_requests([1] * 8, [9000] * 8)
    assert dict(chained.step_cost(decode).terms) == dict(flat.step_cost(decode).terms)
    assert chained.decode_step(8, 72000, 9000) == flat.decode_step(8, 72000, 9000)
    mamba, mamba_flat, _ = _ledgers("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    prompt = BatchShape.from_requests([8192], [8192])
    assert dict(mamba.step_cost(prompt).terms) == dict(mamba_flat.step_cost(prompt).terms)
    assert math.isclose(sum(mamba.step_cost(prompt).terms.values()), sum(mamba_flat.step_cost(prompt).terms.values()))
