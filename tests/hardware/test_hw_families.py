"""One hand-computed ledger case per model family (MoE, MLA, hybrid Mamba), caching and calibration sets."""

import random

import attrs
import pytest

from hardware import (BatchShape, Calibration, Collective, CostModel, Deployment, Roofline, load_calibration,
                      load_engine, load_gpu, load_model)
from hardware.calibration import calibration_for_engine, list_calibrations

HBM_H200, PEAK_BF16 = 4.8e12, 989e12
FLAT = Roofline(compute_eff=0.5, mem_eff=0.8, floor_s=10e-6)
CAL = Calibration(name="flat", gemm={"bf16": FLAT}, attn_prefill=FLAT, attn_decode=FLAT, moe={"bf16": FLAT},
                  ssm=FLAT, elementwise=Roofline(compute_eff=1.0, mem_eff=0.5, floor_s=1e-6),
                  allreduce=Collective(alpha_s=5e-6, bw_eff=0.9), alltoall=Collective(alpha_s=5e-6, bw_eff=0.5))


def roof(flops: float, nbytes: float, floor_s: float = 10e-6) -> float:
    return max(flops / (PEAK_BF16 * 0.5), nbytes / (HBM_H200 * 0.8)) + floor_s


def eager_floor(engine: str, kernels: int) -> float:
    """FLAT's 10 us floor as an eager step pays it for an op of ``kernels`` kernels: at least their graph
    floors (Calibration.eager_mode)."""
    return max(10e-6, kernels * load_engine(engine).graph_kernel_floor_s)


def test_moe_distinct_experts_by_hand() -> None:
    """Qwen3-30B-A3B: 48 MoE layers, 128 experts, top-8, expert width 768, hidden 2048, BF16, one GPU."""
    model = load_model("Qwen/Qwen3-30B-A3B")
    dep = Deployment(gpu=load_gpu("h200_sxm"), model=model, engine=load_engine("vllm"), weight_dtype="bf16",
                     moe_routing="uniform")
    M = 20
    cost = CostModel(dep, calibration=CAL, cuda_graph=False).step_cost(BatchShape.from_requests([1] * M, [500] * M))
    touched = 128 * (1 - (1 - 8 / 128) ** M)          # expected distinct experts under uniform routing
    # (the fused MoE runs 6 kernels: eager, its floor is at least their graph floors)
    experts = roof(2 * M * 8 * 3 * 2048 * 768, touched * 3 * 2048 * 768 * 2 + M * 8 * (2 * 2048 + 3 * 768) * 2,
                   eager_floor("vllm", 6))
    router = roof(2 * M * 128 * 2048, 128 * 2048 * 2 + M * (128 + 2048) * 2)
    assert cost.terms["moe_experts"] == pytest.approx(48 * (experts + router), rel=1e-12)
    assert cost.terms["mlp"] == 0.0 and cost.terms["moe_shared"] == 0.0


def test_moe_padding_touches_more_experts() -> None:
    """CUDA-graph padding of 5 decodes to 8 includes the experts the padded rows touch."""
    dep = Deployment(gpu=load_gpu("h200_sxm"), model=load_model("Qwen/Qwen3-30B-A3B"), engine=load_engine("vllm"),
                     weight_dtype="bf16", moe_routing="uniform")
    c = CostModel(dep, calibration=CAL).step_cost(BatchShape.from_requests([1] * 5, [100] * 5))
    t8 = 128 * (1 - (1 - 8 / 128) ** 8)
    t5 = 128 * (1 - (1 - 8 / 128) ** 5)
    weight_delta = 48 * (t8 - t5) * 3 * 2048 * 768 * 2 / (HBM_H200 * 0.8)
    assert c.terms["cuda_graph_padding"] > weight_delta


def test_mla_decode_attention_by_hand() -> None:
    """DeepSeek-V3 TP8 decode: absorbed latent attention over a 576-wide BF16 latent cache, 16 heads/GPU."""
    model = load_model("deepseek-ai/DeepSeek-V3")
    dep = Deployment(gpu=load_gpu("h200_sxm"), model=model, engine=load_engine("sglang"), tp=8, ep=1,
                     weight_dtype="bf16", kv_dtype="bf16")
    assert dep.kv_bytes_per_token == 61 * 576 * 2             # latent 512 + rope 64, replicated over TP
    reqs, kv = 4, 1000
    cost = CostModel(dep, calibration=CAL, cuda_graph=False).step_cost(BatchShape.from_requests([1] * reqs,
                                                                                               [kv] * reqs))
    heads = 128 // 8
    # W_UK / W_UV absorbed as batched GEMMs: 2 x 512 x 128 MACs per head per query, kv_b weights streamed
    absorb = roof(reqs * heads * 2 * (128 * 512 + 512 * 128),
                  512 * heads * (128 + 128) * 2 + reqs * heads * (128 + 512 + 512 + 128) * 2)
    # MQA over the latent: scores over 576 dims, values over 512, per head per cached token
    # (eager, the kernel's floor is at least its three kernels' graph floors)
    mqa = roof(reqs * kv * heads * 2 * (576 + 512), reqs * kv * 576 * 2 + reqs * heads * (576 + 512) * 2,
               eager_floor("sglang", 3))
    assert cost.terms["attention"] == pytest.approx(61 * (absorb + mqa), rel=1e-12)
    # replayed in a CUDA graph (SGLang captures pure decode): the absorb GEMM pays one kernel floor, the
    # attention three (cache write, split-KV, reduce), each the engine's graph floor instead of 10 us
    g = load_engine("sglang").graph_kernel_floor_s
    graph = CostModel(dep, calibration=CAL).step_cost(BatchShape.from_requests([1] * reqs, [kv] * reqs))
    assert graph.terms["attention"] == pytest.approx(61 * (absorb + mqa + (g - 10e-6) + (3 * g - eager_floor("sglang", 3))),
                                                     rel=1e-12)


def test_dense_first_layers_and_shared_experts() -> None:
    m = load_model("deepseek-ai/DeepSeek-R1")
    kinds = [f.kind for _, f in m.layers if f is not None]
    assert kinds[:3] == ["dense"] * 3 and set(kinds[3:]) == {"moe"} and len(kinds) == 61
    moe = m.layers[3][1]
    assert moe is not None and moe.shared_intermediate_size == 2048 and moe.num_experts == 256
    assert 660e9 < m.param_count < 690e9 and 36e9 < m.active_param_count < 39e9


def test_hybrid_mamba_state_by_hand() -> None:
    """Nemotron-H-56B: Mamba2 layers keep heads x head_dim x state (BF16) + conv state per request."""
    model = load_model("nvidia/Nemotron-H-56B-Base-8K")
    pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    n_mamba, n_attn = pattern.count("M"), pattern.count("*")
    dep = Deployment(gpu=load_gpu("h100_sxm"), model=model, engine=load_engine("vllm"), tp=2)
    heads, hd, state, groups = 256 // 2, 64, 256, 8 // 2
    ssm = heads * hd * state * 2
    conv = (heads * hd + 2 * groups * state) * (4 - 1) * 2
    assert dep.state_bytes_per_request == n_mamba * (ssm + conv)
    assert dep.kv_bytes_per_token == n_attn * 2 * (8 // 2) * 128 * 2
    cost = CostModel(dep).step_cost(BatchShape.from_requests([1] * 4, [300] * 4))
    assert cost.terms["ssm_scan"] > 0 and cost.terms["ssm_proj"] > 0


def test_gpt_oss_keeps_attention_bf16() -> None:
    dep = Deployment(gpu=load_gpu("h100_sxm"), model=load_model("openai/gpt-oss-120b"), engine=load_engine("vllm"))
    assert dep.weight_dtype == "fp4" and dep.model.quant_scope == "experts"
    assert 60e9 < dep.weight_bytes_per_gpu < 70e9       # ~117 B params, experts at 4.5 bits, rest BF16
    assert dep.state_bytes_per_request == 18 * 128 * 2 * 8 * 64 * 2   # 18 sliding layers x 128-token window


def test_cache_is_exact() -> None:
    """Memoised step times equal a fresh model's for random shapes, in any order."""
    dep = Deployment(gpu=load_gpu("h200_sxm"), model=load_model("Qwen/Qwen3-30B-A3B"), engine=load_engine("vllm"))
    warm = CostModel(dep)
    rng = random.Random(3)
    shapes = []
    for _ in range(60):
        n = rng.randint(1, 40)
        q = [1 if rng.random() < 0.8 else rng.randint(2, 600) for _ in range(n)]
        kv = [x + rng.randint(0, 4000) for x in q]
        shapes.append(BatchShape.from_requests(q, kv))
    first = [warm.step_time_ns(s) for s in shapes]
    again = [warm.step_time_ns(s) for s in reversed(shapes)][::-1]
    fresh = [CostModel(dep).step_time_ns(s) for s in shapes]
    assert first == again == fresh


def test_kv_bucketing_rounds_context_up() -> None:
    dep = Deployment(gpu=load_gpu("h100_sxm"), model=load_model("meta-llama/Llama-3.1-8B"), engine=load_engine("vllm"))
    exact, bucketed = CostModel(dep), CostModel(dep, kv_bucket_tokens=256)
    a = BatchShape.from_requests([1] * 8, [1001] * 8)
    b = BatchShape.from_requests([1] * 8, [1024] * 8)     # sums 8008 and 8192: same 256-token bucket
    assert bucketed.step_time_ns(a) == bucketed.step_time_ns(b) == exact.step_time_ns(b)


def test_engine_calibrations_shipped_and_gpu_independent() -> None:
    assert {"default", "vllm", "sglang", "trtllm"} <= set(list_calibrations())
    for name in ("vllm", "sglang", "trtllm"):
        cal = load_calibration(name)
        assert "fitted" in cal.provenance and cal.gemm_for("bf16").compute_eff > 0.3
    m, e = load_model("meta-llama/Llama-3.1-8B"), load_engine("vllm")
    h100 = CostModel(Deployment(gpu=load_gpu("h100_sxm"), model=m, engine=e))
    b200 = CostModel(Deployment(gpu=load_gpu("b200_sxm"), model=m, engine=e))
    assert h100.cal is b200.cal is calibration_for_engine("vllm")     # only the GPU spec differs
    s = BatchShape.from_requests([1] * 16, [2000] * 16)
    assert b200.step_time_ns(s) < h100.step_time_ns(s)


def _qwen35_split(split: bool):  # type: ignore[no-untyped-def]
    """Qwen3.5-397B-A17B with its GDN input projection split (as loaded) or fused into one GEMM."""
    model = load_model("Qwen/Qwen3.5-397B-A17B")
    layers = tuple((attrs.evolve(m, split_in_proj=split) if m is not None and m.kind == "gdn" else m, f)
                   for m, f in model.layers)
    return attrs.evolve(model, layers=layers)


def test_qwen35_gdn_split_in_proj_by_hand() -> None:
    """Qwen3.5-397B TP8, BF16, 4 decodes: each of the 45 GDN layers runs in_proj_qkv (2 x 2 key heads x 128
    + 8 value heads x 128 = 1536 wide), in_proj_z (1024), in_proj_b and in_proj_a (8 each) and out_proj
    (1024 -> 4096) as five GEMMs over hidden 4096 (SGLang 0.5.9 models/qwen3_5.py:129-166)."""
    model = load_model("Qwen/Qwen3.5-397B-A17B")
    gdn = [m for m, _ in model.layers if m is not None and m.kind == "gdn"]
    assert len(gdn) == 45 and all(m.split_in_proj for m in gdn)
    dep = Deployment(gpu=load_gpu("h200_sxm"), model=model, engine=load_engine("sglang"), tp=8, ep=8,
                     weight_dtype="bf16")
    M, h = 4, 4096

    def gemm(n: int, k: int) -> float:
        return roof(2 * M * n * k, n * k * 2 + M * (n + k) * 2)

    per_layer = gemm(1536, h) + gemm(1024, h) + 2 * gemm(8, h) + gemm(h, 1024)
    cost = CostModel(dep, calibration=CAL, cuda_graph=False).step_cost(BatchShape.from_requests([1] * M, [900] * M))
    assert cost.terms["ssm_proj"] == pytest.approx(45 * per_layer, rel=1e-12)


def test_qwen35_fused_in_proj_changes_only_ssm_proj() -> None:
    """Fusing the four input projections back into one 2576-wide GEMM changes ssm_proj by exactly the
    difference of the GEMMs (4 floors against 1 here) and no other term; weights are the same. The engine's
    eager host time is off: its exposed part, max(0, host - GPU), moves with every GPU term."""
    M, h = 4, 4096
    shape = BatchShape.from_requests([1] * M, [900] * M)
    engine = attrs.evolve(load_engine("sglang"), eager_layer_host_s=0.0, eager_moe_host_s=0.0)
    costs, kernels = {}, {}
    for split in (True, False):
        model = _qwen35_split(split)
        dep = Deployment(gpu=load_gpu("h200_sxm"), model=model, engine=engine, tp=8, ep=8,
                         weight_dtype="bf16")
        cm = CostModel(dep, calibration=CAL, cuda_graph=False)
        costs[split], kernels[split] = cm.step_cost(shape), cm.kernels_per_step
    assert kernels[True] - kernels[False] == 3 * 45       # eager: three more launches per GDN layer
    assert _qwen35_split(True).param_count == _qwen35_split(False).param_count

    def gemm(n: int, k: int) -> float:
        return roof(2 * M * n * k, n * k * 2 + M * (n + k) * 2)

    delta = 45 * (gemm(1536, h) + gemm(1024, h) + 2 * gemm(8, h) - gemm(1536 + 1024 + 16, h))
    assert costs[True].terms["ssm_proj"] - costs[False].terms["ssm_proj"] == pytest.approx(delta, rel=1e-9)
    assert delta > 2.9 * 45 * 10e-6    # three more kernel floors per GDN layer
    for term, value in costs[True].terms.items():
        if term not in ("ssm_proj", "kernel_launch"):
            assert value == costs[False].terms[term], term


def test_split_in_proj_only_for_gdn() -> None:
    from hardware.layers import MixerSpec
    with pytest.raises(ValueError, match="split_in_proj"):
        MixerSpec(kind="gqa", num_heads=8, num_kv_heads=8, head_dim=128, split_in_proj=True)


def test_qwen35_gdn_beta_decay_projections_stay_bf16() -> None:
    """Under block FP8 the b / a projections (8 columns per GPU at TP 8, below the 128-wide block) are BF16
    GEMMs; q/k/v, z and out_proj use the checkpoint's FP8 weights."""
    model = load_model("Qwen/Qwen3.5-397B-A17B")
    dep = Deployment(gpu=load_gpu("h200_sxm"), model=model, engine=load_engine("sglang"), tp=8, ep=8,
                     weight_dtype="fp8_block")
    gdn = next(m for m, _ in model.layers if m is not None and m.kind == "gdn")
    lins = dep.mixer_linears(gdn)
    assert [(lin.n, lin.k, lin.quantized) for lin in lins] == [
        (1536, 4096, True), (1024, 4096, True), (8, 4096, False), (8, 4096, False), (4096, 1024, True)]
