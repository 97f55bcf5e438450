"""One hand-computed ledger case per model family (MoE, MLA, hybrid Mamba), caching and calibration sets."""

import math
import random

import attrs
import pytest

from hardware import (BatchShape, Calibration, Collective, CostModel, Deployment, Roofline, load_calibration,
                      load_engine, load_gpu, load_model)
from hardware.calibration import calibration_for, calibration_for_engine, list_calibrations

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


def test_speculative_verify_state_memory_by_engine() -> None:
    """Qwen3.5-397B TP4 with 3 MTP drafts: 45 GDN layers of 64 / 4 value heads x 128 x 128 FP32 state
    (1 MiB) plus a BF16 conv window of (2 x 16 / 4 key heads x 128 + 16 x 128) x 3. vLLM holds 1 + 3 such
    states per request; SGLang one per request and a pool of (256 + 1) x 4 SSM snapshots per layer (45 GiB),
    which comes off its KV memory."""
    model = load_model("Qwen/Qwen3.5-397B-A17B")
    ssm = 16 * 128 * 128 * 4
    state = 45 * (ssm + (2 * 4 * 128 + 16 * 128) * 3 * 2)
    gpu = load_gpu("b300_sxm")
    for engine, held, snaps in (("vllm", 4 * state, 0), ("sglang", state, 257 * 4 * 45 * ssm)):
        plain = Deployment(gpu=gpu, model=model, engine=load_engine(engine), tp=4, weight_dtype="fp8")
        dep = attrs.evolve(plain, spec_tokens=3)
        assert plain.state_bytes_per_request == dep.state_bytes_per_request == state
        assert plain.held_state_bytes_per_request == state and dep.held_state_bytes_per_request == held
        assert plain.verify_snapshot_bytes(256) == 0 and dep.verify_snapshot_bytes(256) == snaps
    # SGLang's KV memory (mem_fraction_static): HBM x fraction - weights - runtime reserve - the snapshots
    # (the drafting deployment also holds the MTP layer's weights and, per token, its KV)
    for d, pool in ((plain, 0), (dep, snaps)):
        free = gpu.hbm_bytes * 0.8 - d.weight_bytes_per_gpu - d.engine.runtime_reserve_bytes - pool
        assert d.kv_capacity_blocks(64, 0.8, max_num_seqs=256) == math.floor(free / d.bytes_per_block(64))


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
    assert h100.cal is calibration_for_engine("vllm")                 # Hopper set
    assert b200.cal is calibration_for("vllm", "blackwell")           # Blackwell's own (hardware.calibration)
    h200 = CostModel(Deployment(gpu=load_gpu("h200_sxm"), model=m, engine=e))
    assert h200.cal is h100.cal                                        # within one architecture only the spec differs
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


def test_kimi_k3_layer_map_and_formats() -> None:
    """Kimi-K3 (kimi_linear text config): the 1-based full_attn_layers put MLA at 0-based 3, 7, ..., 91 and 92,
    KDA everywhere else (69 layers); layer 0's MLP is dense (first_k_dense_replace 1), every other layer a
    latent MoE (896 experts, top-16, expert width 3072 over a 3584-wide latent, shared experts one 6144-wide
    MLP). The compressed-tensors MXFP4 checkpoint ignores self_attn, the shared experts and the dense MLP:
    only the routed experts are FP4."""
    m = load_model("moonshotai/Kimi-K3")
    mla_at = [i for i, (mx, _) in enumerate(m.layers) if mx is not None and mx.kind == "mla"]
    assert mla_at == list(range(3, 92, 4)) + [92] and len(m.layers) == 93
    kda = m.layers[0][0]
    assert kda is not None and kda.kind == "gdn" and (kda.num_heads, kda.head_dim, kda.groups, kda.state_size) == \
        (96, 128, 96, 128)
    assert (kda.gate_rank, kda.out_gate_rank, kda.conv_kernel, kda.state_bytes) == (128, 0, 4, 4)
    mla = m.layers[3][0]
    assert mla is not None and mla.output_gate and (mla.q_lora_rank, mla.kv_lora_rank) == (1536, 512)
    ffns = [f for _, f in m.layers]
    assert ffns[0] is not None and ffns[0].kind == "dense" and ffns[0].intermediate_size == 33792
    moe = ffns[1]
    assert moe is not None and all(f == moe for f in ffns[1:])
    assert (moe.num_experts, moe.experts_per_token, moe.intermediate_size, moe.latent_size,
            moe.shared_intermediate_size) == (896, 16, 3072, 3584, 6144)
    assert (m.default_weight_dtype, m.quant_scope) == ("fp4", "experts")
    assert load_model("moonshotai/Kimi-K2.5").quant_scope == "experts"     # the same rule, INT4


def test_kimi_k3_kda_projections_and_state_by_hand() -> None:
    """KDA at TP8 (12 of 96 heads per GPU, 128 wide): q, k, v and the full-rank output gate in one GEMM
    (4 x 1536 columns), f_a (128, whole on every rank) with beta (12) in a second, f_b (128 -> 1536) a third,
    then o_proj (1536 -> 7168), all BF16. Per request: 12 heads x 128 x 128 FP32 state and a 3 x 1536-channel
    conv state over 3 taps (BF16) in each of the 69 KDA layers; the MLA cache is 24 layers x 576 latent BF16."""
    m = load_model("moonshotai/Kimi-K3")
    dep = Deployment(gpu=load_gpu("b200_sxm"), model=m, engine=load_engine("vllm"), tp=8, ep=8)
    kda = m.layers[0][0]
    assert kda is not None
    assert [(lin.name, lin.n, lin.k, lin.quantized) for lin in dep.mixer_linears(kda)] == [
        ("in_proj", 4 * 1536, 7168, False), ("in_proj", 128 + 12, 7168, False), ("in_proj", 1536, 128, False),
        ("out_proj", 7168, 1536, False)]
    assert dep.state_bytes_per_request == 69 * (12 * 128 * 128 * 4 + 3 * 1536 * 3 * 2)
    assert dep.kv_bytes_per_token == 24 * 576 * 2
    mla = m.layers[3][0]
    assert mla is not None
    assert ("g_proj", 12 * 128, 7168) in [(lin.name, lin.n, lin.k) for lin in dep.mixer_linears(mla)]


def test_kimi_k3_params_by_hand() -> None:
    """Parameter count from the shapes: a KDA layer 4 x 7168 x 12288 (q, k, v, g) + 7168 x 96 (beta) +
    128 x (7168 + 12288) (f_a, f_b) + 12288 x 7168 (o); an MLA layer DeepSeek's with q_lora 1536 plus the
    7168 x 12288 output gate; a MoE layer 896 experts of 3 x 3584 x 3072, the 3 x 7168 x 6144 shared MLP,
    the 896-way router and the 2 x 7168 x 3584 latent projections; one 3 x 7168 x 33792 dense MLP."""
    m = load_model("moonshotai/Kimi-K3")
    h, p = 7168, 96 * 128
    kda = 4 * h * p + h * 96 + 128 * (h + p) + p * h
    mla = (h * 1536 + 1536 * 96 * 192 + h * 576 + 512 * 96 * 256 + 96 * 128 * h) + h * p
    moe = 896 * 3 * 3584 * 3072 + 3 * h * 6144 + h * 896 + 2 * h * 3584
    layers = 69 * (kda + h) + 24 * (mla + h) + 92 * (moe + h) + (3 * h * 33792 + h)
    assert m.param_count == layers + 2 * 163840 * h + h
    assert 2.77e12 < m.param_count < 2.79e12


def test_kimi_k3_kda_ledger_by_hand() -> None:
    """The 69 KDA layers' projections (ssm_proj) of 4 decodes at TP8 under a flat curve, eager: each GEMM
    max(compute, weights + activations at HBM) + its floor; f_a / beta and f_b are GEMMs of their own."""
    m = load_model("moonshotai/Kimi-K3")
    dep = Deployment(gpu=load_gpu("h200_sxm"), model=m, engine=load_engine("sglang"), tp=8, ep=8)
    M, h = 4, 7168

    def gemm(n: int, k: int) -> float:
        return roof(2 * M * n * k, n * k * 2 + M * (n + k) * 2)

    per_layer = gemm(4 * 1536, h) + gemm(140, h) + gemm(1536, 128) + gemm(h, 1536)
    cost = CostModel(dep, calibration=CAL, cuda_graph=False).step_cost(BatchShape.from_requests([1] * M, [900] * M))
    assert cost.terms["ssm_proj"] == pytest.approx(69 * per_layer, rel=1e-12)


def test_kimi_linear_layer_lists_must_cover_every_layer() -> None:
    """A kimi_linear config whose kda_layers / full_attn_layers leave a layer out is refused with the file
    and the layers, not costed with a guess."""
    import json
    from hardware import model as hw_model
    cfg = json.loads((hw_model.MODEL_DIR / "moonshotai--Kimi-K3.json").read_text())
    text = cfg["text_config"]
    text["linear_attn_config"]["kda_layers"] = text["linear_attn_config"]["kda_layers"][1:]
    with pytest.raises(ValueError, match=r"in neither: \[1\]"):
        hw_model._kimi_linear(text)


def test_kimi_k3_attention_residual_reads() -> None:
    """Block attention residuals every 12 layers over 93 layers: layer l mixes cdiv(l, 12) snapshots into its
    attention input, one more into its MLP input where it freezes one (l = 0, 12, ..., 84): (400 + 408) /
    186 extra hidden vectors per sub-layer, priced as elementwise traffic."""
    m = load_model("moonshotai/Kimi-K3")
    assert m.residual_reads == pytest.approx((400 + 408) / 186)
    plain = attrs.evolve(m, residual_reads=0.0)
    dep = Deployment(gpu=load_gpu("b200_sxm"), model=m, engine=load_engine("vllm"), tp=8, ep=8)
    dep0 = attrs.evolve(dep, model=plain)
    shape = BatchShape.from_requests([2048], [2048])
    a = CostModel(dep, calibration=CAL, cuda_graph=False).step_cost(shape)
    b = CostModel(dep0, calibration=CAL, cuda_graph=False).step_cost(shape)
    ew = 93 * 2 * 2048 * m.residual_reads * 7168 * 2 / (load_gpu("b200_sxm").hbm_bw_Bps * 0.5)
    assert a.terms["elementwise"] - b.terms["elementwise"] == pytest.approx(ew, rel=1e-9)


def test_deepseek_v4_layer_map_and_formats() -> None:
    """compress_ratios per layer (Flash: 0, 0, then 4 on even and 128 on odd layers; Pro: 128, 128, then the
    same), the extra last entry the MTP layer's (0: the window alone); routed experts FP4 with block-FP8
    projections and shared expert in DeepSeek's and NVIDIA's checkpoints, all block FP8 in SGLang's -FP8
    conversions; an FP8 KV cache; the 4-wide hyper-connected residual."""
    flash = load_model("deepseek-ai/DeepSeek-V4-Flash")
    ratios = [mx.compress_ratio for mx, _ in flash.layers if mx is not None]
    assert ratios == [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, 43)]
    assert all(mx is not None and mx.kind == "csa" and mx.window == 128 for mx, _ in flash.layers)
    assert [mx.index_topk for mx, _ in flash.layers if mx is not None][2:4] == [512, 0]
    assert flash.mtp_layer is not None and flash.mtp_layer[0] is not None and flash.mtp_layer[0].compress_ratio == 0
    pro = load_model("deepseek-ai/DeepSeek-V4-Pro")
    assert [mx.compress_ratio for mx, _ in pro.layers if mx is not None][:4] == [128, 128, 4, 128]
    for name, experts in (("deepseek-ai/DeepSeek-V4-Flash", "fp4"), ("nvidia/DeepSeek-V4-Pro-NVFP4", "fp4"),
                          ("sgl-project/DeepSeek-V4-Flash-FP8", "fp8_block")):
        m = load_model(name)
        assert (m.default_weight_dtype, m.default_kv_dtype, m.quant_scope) == (experts, "fp8", "all"), name
        dep = Deployment(gpu=load_gpu("h200_sxm"), model=m, engine=load_engine("vllm"), tp=8, ep=8)
        assert dep.dense_weight_dtype == "fp8_block" and dep.linear_curve_dtype(True) == "fp8_block", name
    assert flash.residual_reads == 6.0


def test_deepseek_v4_params_by_hand() -> None:
    """Flash from the shapes (hidden 4096, 64 heads of 512, q_lora 1024, 8 output groups of rank 1024):
    attention 4096 x (1024 + 512) + 1024 x 32768 + 1024 x 32768 + 8 x 1024 x 4096 per layer, the compressor
    4096 x 2 x coff x 512 (coff 2 at ratio 4, 1 at 128), the indexer 1024 x 64 x 128 + 4096 x (64 + 4 x 128);
    each layer 256 experts and one shared expert of 3 x 4096 x 2048 and a 256-way router. 284 B as published."""
    m = load_model("deepseek-ai/DeepSeek-V4-Flash")
    h = 4096
    attn = h * 1536 + 1024 * 32768 + 1024 * 32768 + 8 * 1024 * h
    csa = attn + h * 2 * 2 * 512 + 1024 * 64 * 128 + h * (64 + 4 * 128)
    hca = attn + h * 2 * 512
    moe = 257 * 3 * h * 2048 + h * 256
    layers = 2 * (attn + h) + 21 * (csa + h) + 20 * (hca + h) + 43 * (moe + h)
    assert m.param_count == layers + 2 * 129280 * h + h
    assert 284.0e9 < m.param_count < 284.5e9


def test_deepseek_v4_kv_and_state_by_hand() -> None:
    """Per token (vLLM's fp8_ds_mla entry: 448 FP8 + 64 BF16 + 7 scales + 1 = 584 B): a ratio-4 layer adds a
    584-B entry and a 132-B indexer entry every 4 tokens, a ratio-128 layer an entry every 128, window-only
    layers nothing. Per request: every layer's 128-token window of entries, and the compressors' FP32 rows
    (ratio 4: 8 rows of 2 x 2 x 512 plus the indexer's 8 of 2 x 2 x 128; ratio 128: 128 of 2 x 512)."""
    m = load_model("deepseek-ai/DeepSeek-V4-Flash")
    dep = Deployment(gpu=load_gpu("h200_sxm"), model=m, engine=load_engine("vllm"), tp=8, ep=8)
    mx = m.layers[2][0]
    assert mx is not None and dep.csa_entry_bytes(mx) == 584
    assert dep.kv_bytes_per_token == round(21 * (584 + 132) / 4 + 20 * 584 / 128)
    state = 43 * 128 * 584 + 21 * (8 * 2 * 2 * 512 * 4 + 8 * 2 * 2 * 128 * 4) + 20 * 128 * 2 * 512 * 4
    assert dep.state_bytes_per_request == state
    bf16 = Deployment(gpu=load_gpu("h200_sxm"), model=m, engine=load_engine("vllm"), tp=8, ep=8, kv_dtype="bf16")
    assert bf16.csa_entry_bytes(mx) == 1024


def test_deepseek_v4_decode_attention_by_hand() -> None:
    """One decode step of 4 requests at 1,000 tokens on Flash, TP8, eager, flat curves. A ratio-4 layer reads
    its 4 x 128 window keys and min(1000 / 4, 512) = 250 indexed entries per request (1,512 keys of 584 B),
    64 query heads (the rank's 8 padded to FlashMLA's 64) over 512-wide scores and values, and its indexer
    scores all 1,000 visible entries (64 x 128 each, FP8, 132 B read each); a ratio-128 layer reads the window
    and 1000 / 128 entries per request; a window-only layer the window alone."""
    m = load_model("deepseek-ai/DeepSeek-V4-Flash")
    dep = Deployment(gpu=load_gpu("h200_sxm"), model=m, engine=load_engine("sglang"), tp=8, ep=8)
    R, kv = 4, 1000
    floor = eager_floor("sglang", 3)

    def core(keys: float) -> float:
        return roof(keys * 64 * 2 * 1024, keys * 584 + R * 64 * 1024 * 2, floor)

    fp8_peak = load_gpu("h200_sxm").flops_for("fp8")
    indexer = max(2 * 1000 * 64 * 128 / (fp8_peak * 0.5), 1000 * 132 / (HBM_H200 * 0.8)) + floor
    csa = core(R * 128 + R * 250) + indexer
    hca = core(R * 128 + R * kv / 128)
    swa = core(R * 128)
    cost = CostModel(dep, calibration=CAL, cuda_graph=False).step_cost(BatchShape.from_requests([1] * R, [kv] * R))
    assert cost.terms["attention"] == pytest.approx(21 * csa + 20 * hca + 2 * swa, rel=1e-12)


def test_deepseek_v4_prefill_attention_grows_with_the_indexer() -> None:
    """An 8k prompt on Flash: the indexed layers' attention reads at most 512 entries per query, the
    ratio-128 layers every entry, and the indexer scores every causal pair / 4; doubling the prompt nearly
    doubles the attention core (bounded key sets) but quadruples the indexer's work, so the term grows by
    more than 2x and less than 4x."""
    m = load_model("deepseek-ai/DeepSeek-V4-Flash")
    dep = Deployment(gpu=load_gpu("b200_sxm"), model=m, engine=load_engine("vllm"), tp=4, ep=4)
    cm = CostModel(dep, calibration=CAL, cuda_graph=False)
    a = cm.step_cost(BatchShape.from_requests([8192], [8192])).terms["attention"]
    b = cm.step_cost(BatchShape.from_requests([16384], [16384])).terms["attention"]
    assert 2.0 < b / a < 4.0


def test_deepseek_v4_on_trtllm_needs_blackwell() -> None:
    """TensorRT-LLM's DeepSeek-V4 attention runs on SM100+ only: an H200 deployment is refused naming the
    GPU, a B200 one builds; vLLM builds on either."""
    from hardware.deployment import DeploymentError
    m = load_model("deepseek-ai/DeepSeek-V4-Flash")
    with pytest.raises(DeploymentError, match="blackwell GPUs only, and h200_sxm is hopper") as err:
        Deployment(gpu=load_gpu("h200_sxm"), model=m, engine=load_engine("trtllm"), tp=8, ep=8)
    assert err.value.field == "gpu"
    Deployment(gpu=load_gpu("b200_sxm"), model=m, engine=load_engine("trtllm"), tp=8, ep=8)
    Deployment(gpu=load_gpu("h200_sxm"), model=m, engine=load_engine("vllm"), tp=8, ep=8)


def test_trtllm_keeps_sliding_window_layers_at_full_length() -> None:
    """gpt-oss-120b (18 of 36 layers sliding over 128 tokens, 8 KV heads x 64, BF16): vLLM and SGLang bound the
    sliding layers by the window (per-request state: 18 x 128 tokens), TensorRT-LLM keeps one pool of
    full-length KV for all 36 layers (73,728 B a token, as trtllm-serve logs it) and no window state."""
    m = load_model("openai/gpt-oss-120b")
    per_layer = 2 * 8 * 64 * 2
    for engine, per_token, state in (("vllm", 18 * per_layer, 18 * 128 * per_layer),
                                     ("sglang", 18 * per_layer, 18 * 128 * per_layer),
                                     ("trtllm", 36 * per_layer, 0)):
        dep = Deployment(gpu=load_gpu("h200_sxm"), model=m, engine=load_engine(engine))
        assert (dep.kv_bytes_per_token, dep.state_bytes_per_request) == (per_token, state), engine
    assert 36 * per_layer == 73728


def test_deepseek_v4_bad_compress_ratios_are_refused() -> None:
    """A compress_ratios list shorter than the layers, or with a ratio that is not a count, is refused with
    the field named; a ratio-4 layer without an indexer is refused by the mixer itself."""
    import json
    from hardware import model as hw_model
    from hardware.layers import MixerSpec
    cfg = json.loads((hw_model.MODEL_DIR / "deepseek-ai--DeepSeek-V4-Flash.json").read_text())
    for bad in (cfg["compress_ratios"][:10], [0.5] * 44, "4"):
        with pytest.raises(ValueError, match="compress_ratios must list one ratio"):
            hw_model._deepseek_v4({**cfg, "compress_ratios": bad})
    with pytest.raises(ValueError, match="an indexer"):
        MixerSpec(kind="csa", num_heads=64, num_kv_heads=1, head_dim=512, window=128, o_groups=8, o_lora_rank=1024,
                  compress_ratio=4)


@pytest.mark.parametrize("gpu,padded", [("h200_sxm", 64), ("b300_sxm", 128)])
def test_dsa_sparse_prefill_pads_heads_by_hand(gpu: str, padded: int) -> None:
    """GLM-5 at TP 8 under SGLang (8 query heads a GPU), one 8,192-token prompt, eager, flat curves. Past
    index_topk (2,048) keys SGLang runs FlashMLA's sparse prefill in absorbed form: W_UK / W_UV per query
    token, then every query head, padded to 64 (Hopper) or 128 (Blackwell), over the 576-wide scores and
    512-wide values of its top-2,048 keys at 0.65 of the BF16 peak; the FP8 indexer scores every causal
    pair. A prompt of 2,048 tokens stays on the dense MHA path, priced as under the dense rule."""
    spec = load_gpu(gpu)
    sglang = load_engine("sglang")
    assert sglang.dsa_prefill == "sparse_padded"

    def dep(engine: object) -> Deployment:
        return Deployment(gpu=spec, model=load_model("zhipuai/GLM-5"), engine=engine, tp=8, ep=1,  # type: ignore[arg-type]
                          weight_dtype="bf16", kv_dtype="bf16")

    def attention(d: Deployment, T: int) -> float:
        return CostModel(d, calibration=CAL, cuda_graph=False).step_cost(
            BatchShape.from_requests([T], [T])).terms["attention"]

    T, h = 8192, 64 // 8
    bw, peak, fp8 = spec.hbm_bw_Bps, spec.flops_for("bf16"), spec.flops_for("fp8")

    def flat(flops: float, nbytes: float, floor: float) -> float:
        return max(flops / (peak * 0.5), nbytes / (bw * 0.8)) + floor

    absorb = flat(T * h * 2 * (192 * 512 + 512 * 256), 512 * h * (192 + 256) * 2 + T * h * (192 + 512 + 512 + 256) * 2,
                  eager_floor("sglang", 1))
    kernel = T * 2048 * padded * 2 * (576 + 512) / (0.65 * peak)
    indexer = max(2 * (T * (T + 1) // 2) * 32 * 128 / (fp8 * 0.5), T * (128 + 4) / (bw * 0.8)) + eager_floor("sglang", 3)
    assert attention(dep(sglang), T) == pytest.approx(78 * (absorb + kernel + indexer), rel=1e-12)
    dense = attrs.evolve(sglang, dsa_prefill="dense")
    assert attention(dep(sglang), 2048) == attention(dep(dense), 2048)
    assert attention(dep(sglang), 2049) > 2 * attention(dep(dense), 2049)
