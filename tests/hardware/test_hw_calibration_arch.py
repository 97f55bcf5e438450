"""Kernel constants per GPU architecture: which set a deployment is priced with, and the fit's row choices."""

import pytest

from hardware import BatchShape, CostModel, Deployment, Roofline, load_engine, load_gpu, load_model
from hardware.calibrate import MOE_DTYPES, moe_curve_subsets, moe_format_rows, moe_kernel_family
from hardware.calibration import CALIBRATION_DIR, calibration_for, calibration_for_engine, list_calibrations

SGLANG_B300_FP4_GEMM = Roofline(compute_eff=0.4926, m_half=361.0, mem_eff=0.5696, bytes_half=16850.0,
                                floor_s=5.069e-06, m_tile=64, m_cost_s=2.67e-10, k_half=1.995, n_half=2962.0)
"""gemm.fp4 of calibration/blackwell/sglang.yaml, fitted on the B300 nvfp4 GEMM rows."""


def _cost(gpu: str, engine: str = "sglang") -> CostModel:
    return CostModel(Deployment(gpu=load_gpu(gpu), model=load_model("meta-llama/Llama-3.1-8B"),
                                engine=load_engine(engine)))


def test_blackwell_gpus_take_the_blackwell_set() -> None:
    b300, b200 = _cost("b300_sxm"), _cost("b200_sxm")
    assert b300.cal is b200.cal is calibration_for("sglang", "blackwell")
    assert b300.cal.name == "blackwell/sglang"
    assert b300.cal.provenance == "fitted by hardware.calibrate on opdb-blackwell (sglang-0.5.9, b300_sxm)"
    assert b300.cal.gemm_for("fp4") == SGLANG_B300_FP4_GEMM
    # NVFP4 MoE, fitted on the power-law rows (SGLang's B300 table has no balanced ones)
    fp4 = b300.cal.moe_for("fp4")
    assert (fp4.compute_eff, fp4.m_half, fp4.mem_eff, fp4.floor_s) == (0.3003, 73.07, 0.6487, 1.116e-05)


def test_other_architectures_take_the_hopper_set() -> None:
    for gpu in ("h100_sxm", "h200_sxm", "a100_sxm", "l40s", "mi300x"):
        assert _cost(gpu).cal is calibration_for_engine("sglang"), gpu
    hopper = _cost("h100_sxm").cal
    assert hopper.name == "sglang"
    assert hopper.provenance == "fitted by hardware.calibrate on opdb (sglang-0.5.9, h100_sxm+h200_sxm)"
    assert hopper.gemm_for("fp4") == Roofline(compute_eff=0.6, mem_eff=0.75, floor_s=8.0e-06)   # starting value
    assert calibration_for("sglang", "hopper") is hopper


def test_a_users_gpu_yaml_takes_the_set_of_its_arch(tmp_path) -> None:
    text = (CALIBRATION_DIR.parent / "gpus" / "b300_sxm.yaml").read_text().replace("name: b300_sxm", "name: my_next")
    (tmp_path / "mine.yaml").write_text(text)
    (tmp_path / "other.yaml").write_text(text.replace("arch: blackwell", "arch: rubin"))
    assert _cost(str(tmp_path / "mine.yaml")).cal is calibration_for("sglang", "blackwell")
    assert _cost(str(tmp_path / "other.yaml")).cal is calibration_for_engine("sglang")


def test_blocks_without_a_b300_table_are_the_hopper_sets() -> None:
    blackwell, hopper = calibration_for("sglang", "blackwell"), calibration_for_engine("sglang")
    assert blackwell.moe["int4"] == hopper.moe["int4"]          # SGLang's B300 tables time no INT4 MoE
    assert blackwell.alltoall == hopper.alltoall
    assert blackwell.gemm["bf16"] != hopper.gemm["bf16"]
    text = (CALIBRATION_DIR / "blackwell" / "sglang.yaml").read_text()
    assert "  # no blackwell table (opdb-blackwell sglang-0.5.9): the Hopper set's, moved by the spec (fitted on " \
           "opdb h100_sxm+h200_sxm sglang-0.5.9 moe_perf int4_wo balanced" in text
    assert {"blackwell/sglang", "blackwell/vllm", "blackwell/trtllm", "sglang"} <= set(list_calibrations())


def test_an_engine_without_a_blackwell_set_takes_its_hopper_one() -> None:
    assert calibration_for("no_such_engine", "blackwell") is calibration_for_engine("no_such_engine")
    assert calibration_for_engine("no_such_engine").name == "default"


def _moe(dtype: str, distribution: str, source: str = "k") -> dict[str, str]:
    return {"moe_dtype": dtype, "distribution": distribution, "kernel_source": source}


def test_a_moe_format_without_balanced_rows_is_fitted_on_its_power_law_rows() -> None:
    rows = [_moe("nvfp4", "power_law_1.01"), _moe("nvfp4", "power_law_1.2"), _moe("bfloat16", "balanced"),
            _moe("bfloat16", "power_law_1.01")]
    assert moe_format_rows(rows, "nvfp4") == ([rows[0]], "power_law_1.01")
    assert moe_format_rows(rows, "bfloat16") == ([rows[2]], "balanced")
    assert moe_format_rows(rows, "int4_wo") == ([], "balanced")


def test_moe_kernel_families_on_blackwell() -> None:
    # FlashInfer's TensorRT-LLM-gen MoE (vLLM's default on B300) is the default kernel; CUTLASS is `flashinfer`
    assert moe_kernel_family("vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmonolithic") == "default"
    assert moe_kernel_family("vllm_modeloptfp8moe_flashinfer_cutlass_flashinferexperts") == "flashinfer"
    assert moe_kernel_family("sglang_flashinfer_cutedsl_moe") == "default"
    assert moe_kernel_family("vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts") == "marlin"
    rows = [_moe("nvfp4", "balanced", "x_flashinfer_trtllm_y"), _moe("nvfp4", "balanced", "x_flashinfer_cutlass_y")]
    assert moe_curve_subsets(rows, "fp4") == {"fp4": rows[:1], "fp4_flashinfer": rows[1:]}
    # NVFP4 fits `fp4` before the MXFP4 weight-only rows could (the first format of MOE_DTYPES wins a key)
    fp4_formats = [raw for raw, dtype in MOE_DTYPES.items() if dtype == "fp4"]
    assert fp4_formats == ["nvfp4", "w4a16_mxfp4"]


def test_kernel_check_prices_a_b300_table_with_the_blackwell_set_or_the_one_asked_for(tmp_path) -> None:
    from experiments.kernel_report import check_calibration, check_table, predict_generation

    assert check_calibration("sglang", "b300_sxm") is calibration_for("sglang", "blackwell")
    assert check_calibration("sglang", "b300_sxm", "hopper") is calibration_for_engine("sglang")
    row = {"framework": "SGLANG", "version": "x", "op_name": "generation_attention", "batch_size": "8",
           "isl": "1", "num_heads": "32", "num_key_value_heads": "8", "head_dim": "128", "window_size": "0",
           "kv_cache_dtype": "fp8", "step": "1023", "latency": "0.02"}
    (tmp_path / "t.csv").write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n")
    errs = []
    for arch, cal in ((None, calibration_for("sglang", "blackwell")), ("hopper", calibration_for_engine("sglang"))):
        out = {r["table"]: r for r in check_table(tmp_path / "t.csv", "sglang", "b300_sxm", arch)}
        errs.append(round(100 * (predict_generation(cal, "b300_sxm", row) / 0.02e-3 - 1.0), 1))
        assert out["generation_attention"]["median_signed_err_pct"] == errs[-1]
    assert errs[0] != errs[1]


def test_a_borrowed_moe_kernel_is_priced_with_its_owners_blackwell_curve() -> None:
    """SGLang launched with --moe-runner-backend flashinfer_trtllm runs FlashInfer's TRT-LLM-gen MoE, vLLM's
    default on Blackwell: its routed experts take the Blackwell vLLM set's curve (seen with SGLang's graph
    floors), not SGLang's Triton curve; on Hopper, where the kernel does not run, the deployment is refused."""
    from hardware import kernels
    from hardware.calibration import load_calibration
    from hardware.dtypes import COMPUTE_DTYPE

    model, sglang = load_model("Qwen/Qwen3.5-397B-A17B"), load_engine("sglang")
    shape = BatchShape.from_requests([1] * 8, [1500] * 8)
    lent = CostModel(Deployment(gpu=load_gpu("b300_sxm"), model=model, engine=sglang, tp=8,
                                moe_kernel="flashinfer_trtllm"))
    own = CostModel(Deployment(gpu=load_gpu("b300_sxm"), model=model, engine=sglang, tp=8))
    roof = load_calibration("blackwell/vllm").graph_mode(sglang.graph_kernel_floor_s).moe_for("bf16")
    f = next(f for _, f in model.layers if f is not None and f.kind == "moe")
    gpu = load_gpu("b300_sxm")
    want = kernels.moe_s(roof, tokens=8, width=model.hidden_size, inter=-(-f.intermediate_size // 8),
                         topk=f.experts_per_token, num_experts=f.num_experts, ep=1, mats=f.mats,
                         w_bytes_per_elem=2.0, peak_flops=gpu.flops_for(COMPUTE_DTYPE["bf16"]),
                         bw_Bps=gpu.hbm_bw_Bps, routing="power_law")
    assert lent._moe_s(f, 8, lent.gcal, "power_law") == want   # one layer's grouped experts, graph replay
    assert own._moe_s(f, 8, own.gcal, "power_law") != want
    assert lent.step_cost(shape).terms["moe_experts"] < own.step_cost(shape).terms["moe_experts"]
    with pytest.raises(ValueError, match="flashinfer_trtllm is priced with vllm's kernel tables .* hopper has none"):
        CostModel(Deployment(gpu=load_gpu("h200_sxm"), model=model, engine=sglang, tp=8,
                             moe_kernel="flashinfer_trtllm"))


def test_linear_attention_decode_takes_its_own_curve_where_one_is_fitted() -> None:
    """Both architectures' sets fit the gated-DeltaNet decode kernels on the gdn tables' generation rows
    alone (ssm_decode); a step's decode requests are priced on it and its prompt tokens on the pooled ssm
    curve. A set without a decode curve (a user's, or one fitted before it existed) prices one pooled call."""
    import attrs

    from hardware import kernels

    model = load_model("Qwen/Qwen3.5-397B-A17B")
    mx = next(m for m, _ in model.layers if m is not None and m.kind == "gdn")
    for gpu, split in (("b300_sxm", True), ("h200_sxm", True), ("h200_sxm", False)):
        dep = Deployment(gpu=load_gpu(gpu), model=model, engine=load_engine("sglang"), tp=4)
        cm = CostModel(dep)
        if not split:
            cm = CostModel(dep, calibration=attrs.evolve(cm.cal, ssm_decode=None))
        assert (cm.gcal.ssm_decode is not None) is split
        kw = dict(heads=cm.dep.mixer_heads(mx), dk=mx.state_size, dv=mx.head_dim, chunk=mx.chunk_size,
                  state_bytes=mx.state_bytes, peak_flops=load_gpu(gpu).flops_for("bf16"),
                  bw_Bps=load_gpu(gpu).hbm_bw_Bps)
        if split:
            decode = kernels.ssm_s(cm.gcal.ssm_decode, tokens=16, reqs=16, decode_reqs=16, **kw)
            prompt = kernels.ssm_s(cm.gcal.ssm, tokens=512, reqs=1, decode_reqs=0, **kw)
            assert cm._ssm_s(mx, 16, 16, 16, cm.gcal) == decode
            assert cm._ssm_s(mx, 528, 17, 16, cm.gcal) == decode + prompt
            assert decode < kernels.ssm_s(cm.gcal.ssm, tokens=16, reqs=16, decode_reqs=16, **kw)
        else:
            assert cm._ssm_s(mx, 528, 17, 16, cm.gcal) == kernels.ssm_s(cm.gcal.ssm, tokens=528, reqs=17,
                                                                         decode_reqs=16, **kw)


def test_speculative_verify_moves_a_recurrent_state_per_position() -> None:
    """A verify of q = 4 tokens per decode runs them all through the recurrent update (no chunked scan) and
    writes the state after each position: q writes beside the read, 3 more state moves than a plain decode;
    SGLang then copies the accepted snapshot back (2 more), vLLM does not. Prompt tokens are priced apart."""
    from hardware import kernels

    model = load_model("Qwen/Qwen3.5-397B-A17B")
    mx = next(m for m, _ in model.layers if m is not None and m.kind == "gdn")
    gpu = load_gpu("b300_sxm")
    for engine, extra in (("sglang", 5), ("vllm", 3)):
        cm = CostModel(Deployment(gpu=gpu, model=model, engine=load_engine(engine), tp=4))
        cal = cm.gcal
        assert cal.ssm_decode is not None
        kw = dict(heads=cm.dep.mixer_heads(mx), dk=mx.state_size, dv=mx.head_dim, chunk=mx.chunk_size,
                  state_bytes=mx.state_bytes, peak_flops=gpu.flops_for("bf16"), bw_Bps=gpu.hbm_bw_Bps)
        verify = kernels.ssm_s(cal.ssm_decode, tokens=64, reqs=16, decode_reqs=64, extra_states=16 * extra, **kw)
        prompt = kernels.ssm_s(cal.ssm, tokens=512, reqs=1, decode_reqs=0, **kw)
        assert cm._ssm_s(mx, 64, 16, 16, cal, q=4) == verify
        assert cm._ssm_s(mx, 576, 17, 16, cal, q=4) == verify + prompt
        assert cm._ssm_s(mx, 16, 16, 16, cal, q=1) == kernels.ssm_s(cal.ssm_decode, tokens=16, reqs=16,
                                                                    decode_reqs=16, **kw)
        state = kw["heads"] * mx.state_size * mx.head_dim * mx.state_bytes
        moved = kernels.ssm_s(Roofline(compute_eff=1e9, mem_eff=1.0, floor_s=0.0), tokens=64, reqs=16,
                              decode_reqs=64, extra_states=16 * extra, **kw)
        plain = kernels.ssm_s(Roofline(compute_eff=1e9, mem_eff=1.0, floor_s=0.0), tokens=64, reqs=16,
                              decode_reqs=64, **kw)
        assert (moved - plain) * gpu.hbm_bw_Bps == pytest.approx(16 * extra * state, rel=1e-9)


def test_blackwell_graph_floors_never_exceed_the_fitted_ones() -> None:
    """The B300 tables time TRT-LLM-gen's fused MoE (vLLM NVFP4: an 18.3 us floor per call) where the op's
    kernel count times vLLM's graph kernel floor gives 6 x 4.5 us = 27 us; the Blackwell sets keep the smaller,
    the Hopper sets the kernel count's (as checked on the Hopper serving rows)."""
    from hardware.calibration import OP_KERNELS, load_calibration

    bw, hop = load_calibration("blackwell/vllm"), load_calibration("vllm")
    assert bw.graph_floors_at_most_fitted and not hop.graph_floors_at_most_fitted
    floor = 4.5e-6
    assert bw.moe["fp4"].floor_s == 1.832e-05
    assert bw.graph_mode(floor).moe["fp4"].floor_s == 1.832e-05 < OP_KERNELS["moe"] * floor
    assert bw.graph_mode(floor).gemm["bf16"].floor_s == min(floor, bw.gemm["bf16"].floor_s)
    assert hop.graph_mode(floor).moe["fp8"].floor_s == OP_KERNELS["moe_fp8"] * floor
