"""Step-cost ledger checked against FLOPs and bytes worked out by hand from Llama-3.1-8B's dimensions."""

import math
import time

import attrs
import pytest

from hardware import (BatchShape, Calibration, Collective, CostModel, Deployment, DeploymentError, Roofline, StepCost,
                      load_engine, load_gpu, load_model)
from hardware.terms import ROUTED_TERMS, TOKEN_TERMS

# Llama-3.1-8B, by hand: hidden 4096, 32 heads, 8 KV heads, head_dim 128, MLP 14336, vocab 128256, 32 layers.
H, NH, NKV, HD, I, V, L = 4096, 32, 8, 128, 14336, 128256, 32
PEAK_BF16, HBM = 989e12, 3.35e12           # H100 SXM datasheet

# Constant efficiencies (no curves) so every term can be written down by hand.
GEMM = Roofline(compute_eff=0.8, mem_eff=0.75, floor_s=7e-6)
PREFILL = Roofline(compute_eff=0.5, mem_eff=0.7, floor_s=11e-6)
DECODE = Roofline(compute_eff=0.4, mem_eff=0.9, floor_s=13e-6)
CAL = Calibration(
    name="test", gemm={"bf16": GEMM}, attn_prefill=PREFILL, attn_decode=DECODE, moe={"bf16": GEMM},
    ssm=GEMM, elementwise=Roofline(compute_eff=1.0, mem_eff=0.5, floor_s=1e-6), elementwise_kernels_per_block=2,
    allreduce=Collective(alpha_s=6e-6, bw_eff=0.9, eager_extra_s=20e-6),
    alltoall=Collective(alpha_s=10e-6, bw_eff=0.5))


# The hand computations below add the host terms in full: an engine that does not overlap scheduling.
# vLLM without async scheduling and without eager-step host time (the eager_host tests set their own)
SERIAL = attrs.evolve(load_engine("vllm"), host_overlap=False, eager_layer_host_s=0.0, eager_moe_host_s=0.0)
G = SERIAL.graph_kernel_floor_s


def eager(r: Roofline, kernels: int = 1) -> Roofline:
    """``r`` as an eagerly launched step pays it: its floor raised to ``kernels`` graph floors where lower
    (Calibration.eager_mode: no op is cheaper run eagerly than replayed in a graph)."""
    return attrs.evolve(r, floor_s=max(r.floor_s, kernels * G))


def dep(tp: int = 1, engine: object = SERIAL) -> Deployment:
    return Deployment(gpu=load_gpu("h100_sxm"), model=load_model("meta-llama/Llama-3.1-8B"),
                      engine=engine, tp=tp, weight_dtype="bf16", kv_dtype="bf16")  # type: ignore[arg-type]


def cm(tp: int = 1, **kw: object) -> CostModel:
    return CostModel(dep(tp), calibration=CAL, **kw)  # type: ignore[arg-type]


def roofline(flops: float, nbytes: float, r: Roofline) -> float:
    return max(flops / (PEAK_BF16 * r.compute_eff), nbytes / (HBM * r.mem_eff)) + r.floor_s


# One prefill chunk of 512 tokens on a request with 100 tokens already cached, plus two decodes.
Q = [512, 1, 1]
KV = [612, 300, 1000]
SHAPE = BatchShape(num_reqs=3, num_decode=2, new_tokens=514, sum_kv=612 + 300 + 1000,
                   sum_q_kv=512 * 612 + 300 + 1000, sum_q_sq=512 * 512 + 2, decode_sum_kv=1300, decode_max_kv=1000)


def moe_ledger(gpu: str, model: str, cal: Calibration, kernel: str, **dep_kw: object) -> CostModel:
    """An eager-mode ledger of a MoE deployment on the serial engine, pricing its experts with ``kernel``,
    its tokens routed by independent top-k draws (the routing the hand computations write down) unless
    ``moe_routing`` says otherwise."""
    dep_kw.setdefault("moe_routing", "uniform")
    d = Deployment(gpu=load_gpu(gpu), model=load_model(model), engine=SERIAL, moe_kernel=kernel,
                   **dep_kw)  # type: ignore[arg-type]
    return CostModel(d, calibration=cal, cuda_graph=False)


def without_moe_experts(cost: StepCost) -> dict[str, float]:
    """Every term of a ledger but the routed experts (on the mean rank and the busiest's excess)."""
    return {k: v for k, v in cost.terms.items() if k not in ("moe_experts", "ep_imbalance")}


def test_shape_from_requests_and_causal_pairs() -> None:
    assert BatchShape.from_requests(Q, KV) == SHAPE
    # prefill: 512 queries over 612 keys, causal: sum_{j=1..512} (100 + j); decodes: 300 + 1000
    assert SHAPE.attention_pairs == sum(100 + j for j in range(1, 513)) + 300 + 1000


def test_bad_shape_rejected() -> None:
    with pytest.raises(ValueError, match="num_decode"):
        BatchShape(num_reqs=1, num_decode=2, new_tokens=2, sum_kv=2, sum_q_kv=2, sum_q_sq=2)
    with pytest.raises(ValueError, match="kv_i >= q_i"):
        BatchShape.from_requests([4], [3])


def test_step_cost_matches_hand_computation_tp1() -> None:
    cost = cm().step_cost(SHAPE)
    M = 514
    # QKV: (M x 4096) @ (4096 x (32 + 2*8) * 128): 2*M*4096*6144 FLOPs; weights 4096*6144*2 B + activations
    qkv = L * roofline(2 * M * H * 6144, H * 6144 * 2 + M * (H + 6144) * 2, GEMM)
    assert cost.terms["qkv_proj"] == pytest.approx(qkv, rel=1e-12)
    o = L * roofline(2 * M * H * H, H * H * 2 + M * 2 * H * 2, GEMM)
    assert cost.terms["o_proj"] == pytest.approx(o, rel=1e-12)
    gate_up = roofline(2 * M * H * 2 * I, H * 2 * I * 2 + M * (H + 2 * I) * 2, GEMM)
    down = roofline(2 * M * I * H, I * H * 2 + M * (I + H) * 2, GEMM)
    assert cost.terms["mlp"] == pytest.approx(L * (gate_up + down), rel=1e-12)
    # attention, 4 FLOPs per head-dim element per (query, key) pair per head, KV 2*8*128*2 B per token;
    # decode part: 2 queries over 300 + 1000 keys; prefill part: 512 causal queries over 612 keys
    kv_tok = 2 * NKV * HD * 2
    qo_tok = 2 * NH * HD * 2
    # (514 tokens: above the largest capture size, 512, so eager: the decode kernel's 13 us floor is below
    # its three kernels' graph floors and is raised to them)
    dec = roofline(4 * NH * HD * 1300, 1300 * kv_tok + 2 * (qo_tok + kv_tok), eager(DECODE, 3))
    pairs = sum(100 + j for j in range(1, 513))
    pre = roofline(4 * NH * HD * pairs, 612 * kv_tok + 512 * (qo_tok + kv_tok), PREFILL)
    assert cost.terms["attention"] == pytest.approx(L * (dec + pre), rel=1e-12)
    # LM head: the 3 sampling rows against the whole BF16 vocabulary matrix
    lm = roofline(2 * 3 * V * H, V * H * 2 + 3 * (V + H) * 2, GEMM)
    assert cost.terms["lm_head"] == pytest.approx(lm, rel=1e-12)
    # elementwise: 2 blocks x (add+RMSNorm: 4 vectors of H) + RoPE on q and k + SiLU-and-mul (3 x I), BF16
    ew_bytes = M * 2 * (2 * 4 * H + 2 * (NH + NKV) * HD + 3 * I)
    assert cost.terms["elementwise"] == pytest.approx(L * (ew_bytes / (HBM * 0.5) + 4 * max(1e-6, G)), rel=1e-12)
    assert cost.terms["tp_allreduce"] == 0.0 and cost.terms["cuda_graph_padding"] == 0.0
    e = SERIAL
    assert cost.terms["step_host"] == e.step_host_s
    assert cost.terms["request_host"] == pytest.approx(3 * e.per_request_host_s)
    assert cost.terms["kv_traversal"] == pytest.approx(e.per_block_host_s * (1912 // 16 + 1))
    assert cost.terms["kernel_launch"] == pytest.approx(L * e.launch_s)   # attention eager (piecewise graphs)
    assert cost.total_s == pytest.approx(sum(cost.terms.values()))


def test_decode_is_memory_bound_by_hand() -> None:
    """One decode token: MLP time is the weight stream 3*4096*14336*2 B at 75 % of 3.35 TB/s plus floors.

    Eager, each GEMM pays its fitted (eager) floor, 7 us; a pure-decode batch replays a CUDA graph, where
    each GEMM kernel pays the engine's per-kernel graph floor instead."""
    s = BatchShape.from_requests([1], [2048])
    stream = (2 * H * I * 2 + (H + 2 * I) * 2) + (I * H * 2 + (I + H) * 2)
    eager = cm(cuda_graph=False).step_cost(s).terms["mlp"]
    assert eager == pytest.approx(L * (stream / (HBM * 0.75) + 2 * 7e-6), rel=1e-12)
    graph = cm().step_cost(s).terms["mlp"]
    g = SERIAL.graph_kernel_floor_s
    assert graph == pytest.approx(L * (stream / (HBM * 0.75) + 2 * g), rel=1e-12)


def test_fp8_kv_decode_attention_uses_its_own_curve_and_dequant_work_by_hand() -> None:
    """Decode attention over an FP8 cache is priced with the FP8-KV curve, its compute side being two
    operations per cached K / V element (not the query heads' FLOPs); a BF16 cache keeps the BF16 curve and
    the attention FLOPs; a calibration without an FP8-KV curve prices an FP8 cache's work with the BF16 curve.

    Eager, one decode of a request with 2,048 tokens in context; per layer: K + V elements 2,048 x 8 x 256
    read, the new token's K / V written, queries and outputs 32 x 256 x 2 B."""
    fp8_curve = Roofline(compute_eff=0.01, mem_eff=0.6, floor_s=17e-6)
    cal = attrs.evolve(CAL, attn_decode_fp8kv=fp8_curve)
    s = BatchShape.from_requests([1], [2048])
    elems = 2048 * NKV * 2 * HD                        # cached K / V elements the kernel reads
    qo = NH * 2 * HD * 2
    fp8_dep = attrs.evolve(dep(), kv_dtype="fp8")
    fp8 = CostModel(fp8_dep, calibration=cal, cuda_graph=False).step_cost(s).terms["attention"]
    nbytes = elems * 1 + qo + NKV * 2 * HD * 1
    assert fp8 == pytest.approx(L * roofline(2.0 * elems, nbytes, fp8_curve), rel=1e-12)
    bf16 = CostModel(dep(), calibration=cal, cuda_graph=False).step_cost(s).terms["attention"]
    nbytes = elems * 2 + qo + NKV * 2 * HD * 2
    assert bf16 == pytest.approx(L * roofline(2.0 * NH * 2 * HD * 2048, nbytes, eager(DECODE, 3)), rel=1e-12)
    no_curve = CostModel(fp8_dep, calibration=CAL, cuda_graph=False).step_cost(s).terms["attention"]
    nbytes = elems * 1 + qo + NKV * 2 * HD * 1
    assert no_curve == pytest.approx(L * roofline(2.0 * elems, nbytes, eager(DECODE, 3)), rel=1e-12)
    assert CAL.graph_mode(3e-6).attn_decode_fp8kv is None
    graph_fp8 = cal.graph_mode(3e-6).attn_decode_fp8kv
    assert graph_fp8 is not None and graph_fp8.floor_s == pytest.approx(3 * 3e-6)


def test_decode_attention_rate_is_read_at_the_decodes_context_over_the_longest_by_hand() -> None:
    """A curve with m_half = 4 requests: eff(r) = 0.4 x r / (r + 4). Two decodes of 1,000 and 3,000 tokens
    run as 4,000 / 3,000 requests of the longest length would (a split-KV kernel waits for the longest
    request's splits), not as 2. Eager, per layer: attention FLOPs 2 x 32 x 256 x 4,000 over BF16 K / V."""
    curve = Roofline(compute_eff=0.4, m_half=4.0, mem_eff=0.9, floor_s=13e-6)
    model = CostModel(dep(), calibration=attrs.evolve(CAL, attn_decode=curve), cuda_graph=False)
    s = BatchShape.from_requests([1, 1], [1000, 3000])
    assert s.decode_rows == 4000 / 3000
    flops = 2.0 * NH * 2 * HD * 4000
    nbytes = 4000 * NKV * 2 * HD * 2 + 2 * (NH * 2 * HD * 2 + NKV * 2 * HD * 2)
    rows = 4000 / 3000
    want = max(flops / (PEAK_BF16 * 0.4 * rows / (rows + 4.0)), nbytes / (HBM * 0.9)) + max(13e-6, 3 * G)
    assert model.step_cost(s).terms["attention"] == pytest.approx(L * want, rel=1e-12)
    # Equal contexts (or a shape that does not say) read it at the request count, as the curves were fitted.
    equal = BatchShape.from_requests([1, 1], [2000, 2000])
    assert equal.decode_rows == 2.0
    unknown = attrs.evolve(equal, decode_max_kv=-1)
    assert model.step_cost(equal).terms["attention"] == model.step_cost(unknown).terms["attention"]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("model_name, tp", [("meta-llama/Llama-3.1-8B", 1), ("Qwen/Qwen3-32B", 1),
                                            ("Qwen/Qwen3-235B-A22B", 8), ("deepseek-ai/DeepSeek-V3", 8)])
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_more_decode_work_never_makes_decode_attention_cheaper(engine: str, model_name: str, tp: int,
                                                               kv_dtype: str) -> None:
    """With the shipped curves: a request joining a decode batch, or a context growing, never lowers the
    step's attention (read at the request count, a 1,000-token decode beside a 60,000-token one made the
    pair cheaper than the long one alone: SGLang, Qwen3-32B on H200, 190 -> 104 us per layer)."""
    d = Deployment(gpu=load_gpu("h200_sxm"), model=load_model(model_name), engine=load_engine(engine), tp=tp,
                   kv_dtype=kv_dtype)
    model = CostModel(d, cuda_graph=False)

    def attention(contexts: list[int]) -> float:
        return model.step_cost(BatchShape.from_requests([1] * len(contexts), contexts)).terms["attention"]

    for batch in ([60_000], [8_000], [2_000, 30_000], [500] * 7 + [100_000]):
        base = attention(batch)
        for extra in (1, 1_000, max(batch), 2 * max(batch)):
            assert attention(batch + [extra]) >= base, (batch, extra)
        assert attention([c + 1000 for c in batch]) >= base


def test_gemm_width_and_per_row_terms_by_hand() -> None:
    """A compute-bound GEMM slows by k / (k + k_half) x n / (n + n_half) and adds m_cost_s per row; the
    memory side and a curve without these terms are untouched."""
    from hardware.kernels import gemm_s
    plain = Roofline(compute_eff=0.8, mem_eff=0.75, floor_s=7e-6)
    shaped = attrs.evolve(plain, k_half=256.0, n_half=1024.0, m_cost_s=4e-9)
    m, n, k = 8192, 2048, 512
    compute = 2 * m * n * k / (PEAK_BF16 * 0.8)
    assert gemm_s(plain, m, n, k, 2.0, PEAK_BF16, HBM) == pytest.approx(compute + 7e-6, rel=1e-12)
    factor = (512 / (512 + 256)) * (2048 / (2048 + 1024))
    assert gemm_s(shaped, m, n, k, 2.0, PEAK_BF16, HBM) == pytest.approx(compute / factor + 7e-6 + m * 4e-9,
                                                                        rel=1e-12)
    # one decode row: memory bound either way (the width terms scale the compute rate only)
    stream = n * k * 2.0 + (n + k) * 2.0
    assert gemm_s(shaped, 1, n, k, 2.0, PEAK_BF16, HBM) == pytest.approx(stream / (HBM * 0.75) + 7e-6 + 4e-9,
                                                                       rel=1e-12)


def test_graph_floors_count_kernels_by_hand() -> None:
    """Under graph replay an op's floor is (kernels it launches) x the engine's per-kernel floor: decode
    attention writes the cache, runs split-KV attention and reduces (3 kernels); elementwise kernels 1 each.
    Eager, an op pays its fitted floor, raised to that graph floor where lower: CAL's 13 us decode and 1 us
    elementwise floors are below 3 and 1 graph floors, so the two modes price those ops alike; with floors
    above them (20 us, 6 us) eager costs exactly the difference more."""
    s = BatchShape.from_requests([1] * 2, [300, 1000])
    g = SERIAL.graph_kernel_floor_s
    assert 13e-6 < 3 * g and 1e-6 < g < 6e-6 and 20e-6 > 3 * g
    slow = attrs.evolve(CAL, attn_decode=attrs.evolve(DECODE, floor_s=20e-6),
                        elementwise=attrs.evolve(CAL.elementwise, floor_s=6e-6))
    for cal, decode_floor, ew_floor in ((CAL, 3 * g, g), (slow, 20e-6, 6e-6)):
        graph = CostModel(dep(), calibration=cal).step_cost(s).terms
        eager = CostModel(dep(), calibration=cal, cuda_graph=False).step_cost(s).terms
        assert graph["attention"] - eager["attention"] == pytest.approx(L * (3 * g - decode_floor), rel=1e-9, abs=1e-15)
        assert graph["elementwise"] - eager["elementwise"] == pytest.approx(L * 4 * (g - ew_floor), rel=1e-9,
                                                                              abs=1e-15)


def test_a_step_just_past_the_largest_capture_size_costs_no_less_than_one_inside_it() -> None:
    """vLLM replays piecewise graphs up to its largest capture size (512 tokens by default) and launches a
    longer step eagerly; an eager op is never cheaper than replayed, so the cost of a prompt step grows
    with its tokens across the boundary (it fell 14 % from 512 to 513 tokens on Qwen3-0.6B, H100, with the
    shipped constants: 2.82 -> 2.43 ms, elementwise and BF16 GEMM floors below the graph floor)."""
    for name in ("Qwen/Qwen3-0.6B", "meta-llama/Llama-3.1-8B"):
        d = Deployment(gpu=load_gpu("h100_sxm"), model=load_model(name), engine=load_engine("vllm"))
        model = CostModel(d, max_num_seqs=256, max_num_batched_tokens=8192)
        assert model.max_capture == 512
        costs = [model.step_time_ns(BatchShape.from_requests([m], [m])) for m in (511, 512, 513, 514)]
        assert costs == sorted(costs), (name, costs)
        assert costs[2] - costs[1] < 2 * (costs[1] - costs[0]) + 1, (name, costs)  # no jump at the boundary


def test_host_work_hides_under_gpu_work_with_async_scheduling() -> None:
    """Overlapping engines: a step lasts max(GPU, host); the host terms keep max(0, host - GPU) split in
    proportion to their sizes. Worked by hand on a tiny decode (host-bound) and a prefill (GPU-bound)."""
    over = attrs.evolve(SERIAL, host_overlap=True, step_host_s=0.05, per_request_host_s=0.001)
    ser = attrs.evolve(over, host_overlap=False)
    for shape in (BatchShape.from_requests([1] * 2, [100, 200]), SHAPE):
        a = CostModel(dep(engine=over), calibration=CAL).step_cost(shape).terms
        b = CostModel(dep(engine=ser), calibration=CAL).step_cost(shape).terms
        host_names = ("step_host", "request_host", "kv_traversal")
        host = sum(b[n] for n in host_names)
        device = sum(v for n, v in b.items() if n not in host_names)
        keep = max(0.0, host - device) / host
        for n in host_names:
            assert a[n] == pytest.approx(b[n] * keep, rel=1e-12, abs=1e-15)
        assert sum(a.values()) == pytest.approx(max(host, device), rel=1e-12)
        assert {n: v for n, v in a.items() if n not in host_names} == \
            {n: v for n, v in b.items() if n not in host_names}


def test_tp_allreduce_alpha_beta() -> None:
    cost = cm(tp=2).step_cost(SHAPE)
    msg = 514 * H * 2
    per = 6e-6 + 2 * (2 - 1) / 2 * msg / (450e9 * 0.9)
    assert cost.terms["tp_allreduce"] == pytest.approx(2 * L * per, rel=1e-12)
    # TP shards the weights: the QKV GEMM at tp=2 streams half the columns
    qkv2 = L * roofline(2 * 514 * H * 3072, H * 3072 * 2 + 514 * (H + 3072) * 2, GEMM)
    assert cost.terms["qkv_proj"] == pytest.approx(qkv2, rel=1e-12)


def test_cuda_graph_padding_is_the_padded_minus_true_token_cost() -> None:
    """A pure decode batch of 5 replays the graph captured for 8 (vLLM sizes 1, 2, 4, 8, ...)."""
    five = BatchShape.from_requests([1] * 5, [100] * 5)
    eight = BatchShape.from_requests([1] * 8, [100] * 8)
    c5, c8 = cm().step_cost(five), cm().step_cost(eight)
    token_terms = ("qkv_proj", "o_proj", "mlp", "elementwise", "lm_head", "tp_allreduce")
    expected = sum(c8.terms[t] for t in token_terms) - sum(c5.terms[t] for t in token_terms)
    assert c5.terms["cuda_graph_padding"] == pytest.approx(expected, rel=1e-12) and expected > 0
    assert c8.terms["cuda_graph_padding"] == 0.0
    eager = cm(cuda_graph=False).step_cost(five)
    assert eager.terms["cuda_graph_padding"] == 0.0


def test_trtllm_pads_with_one_dummy_request_repeated() -> None:
    """TensorRT-LLM pads a batch of 5 up to its graph of 8 with one dummy request three times: the routed
    experts see the 5 real tokens and the dummy's (6 distinct), every other token term the 8 tokens; vLLM's
    padded slots are priced as distinct tokens."""
    gpu, model = load_gpu("b300_sxm"), load_model("deepseek-ai/DeepSeek-R1")
    five, six, eight = (BatchShape.from_requests([1] * n, [1500] * n) for n in (5, 6, 8))
    for name, distinct in (("trtllm", 6), ("vllm", 8)):
        dep = Deployment(gpu=gpu, model=model, engine=load_engine(name), tp=4, ep=4)
        model_cost = CostModel(dep)
        c5, c6, c8 = (model_cost.step_cost(s).terms for s in (five, six, eight))
        assert model_cost.dep.engine.graph_padding_one_request is (name == "trtllm")
        by_distinct = {6: c6, 8: c8}[distinct]
        expected = sum(c8[t] - c5[t] for t in TOKEN_TERMS if t not in ROUTED_TERMS) \
            + sum(by_distinct[t] - c5[t] for t in ROUTED_TERMS)
        assert c5["cuda_graph_padding"] == pytest.approx(expected, rel=1e-12)
        assert c6["moe_experts"] < c8["moe_experts"] and c8["cuda_graph_padding"] == 0.0


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_speculative_decodes_pad_in_the_unit_the_engine_captures(engine: str) -> None:
    """MiMo-7B with 2 MTP drafts (3 tokens per decode), 64 seats. vLLM captures graphs by token count (up to
    128 tokens here): 41 decodes (123 tokens) replay the 128-token graph, priced as 43 decodes (ceil(128 / 3)),
    and 43 decodes (129 tokens) run eager with no padding; it used to pad the request count against the token
    sizes (41 -> 48 requests, 144 tokens) and to pad the eager step too (found by fuzzing). SGLang captures by
    request count: 41 decodes replay the 48-request graph, 144 tokens."""
    d = Deployment(gpu=load_gpu("h100_sxm"), model=load_model("XiaomiMiMo/MiMo-7B-Base"),
                   engine=load_engine(engine), spec_tokens=2)
    model = CostModel(d, max_num_seqs=64, max_num_batched_tokens=8192)
    q = 3

    def decode(n: int) -> BatchShape:
        return BatchShape(num_reqs=n, num_decode=n, new_tokens=q * n, sum_kv=500 * n, sum_q_kv=q * 500 * n,
                          sum_q_sq=q * q * n, decode_sum_kv=500 * n, decode_q=q, decode_max_kv=500)

    def token_sum(m: int, r: int) -> float:
        return sum(model._token_terms(m, r, r, q).values())

    padding = model.step_cost(decode(41)).terms["cuda_graph_padding"]
    if engine == "vllm":
        assert model.max_capture == 128
        assert padding == pytest.approx(token_sum(128, 43) - token_sum(123, 41), rel=1e-12)
        eager = model.step_cost(decode(43)).terms
        assert eager["cuda_graph_padding"] == 0.0 and eager["kernel_launch"] > 0.0
    else:
        assert 48 in model.capture_sizes and 41 not in model.capture_sizes
        assert padding == pytest.approx(token_sum(144, 48) - token_sum(123, 41), rel=1e-12)


def test_speculative_requests_pay_their_verify_host_time_once_per_step() -> None:
    """request_host: per_request_host_s for every request of the step, and spec_request_host_s more for each
    speculative decode (a verify of 1 + k tokens); a prompt beside them and a model that does not draft pay
    none of it. Without host overlap (SGLang drafts with its overlap scheduler off) it is all exposed."""
    eng = attrs.evolve(load_engine("sglang"), per_request_host_s=50e-6, spec_request_host_s=200e-6,
                       host_overlap=False)
    k, kv = 2, 500

    def ledger(spec_tokens: int) -> CostModel:
        d = Deployment(gpu=load_gpu("h100_sxm"), model=load_model("XiaomiMiMo/MiMo-7B-Base"), engine=eng,
                       spec_tokens=spec_tokens)
        return CostModel(d, max_num_seqs=64, max_num_batched_tokens=8192)

    q = 1 + k
    verify = BatchShape(num_reqs=6, num_decode=5, new_tokens=5 * q + 300, sum_kv=5 * kv + 300,
                        sum_q_kv=5 * q * kv + 300 * 300, sum_q_sq=5 * q * q + 300 * 300, decode_sum_kv=5 * kv,
                        decode_q=q, decode_max_kv=kv)
    assert ledger(k).step_cost(verify).terms["request_host"] == pytest.approx(6 * 50e-6 + 5 * 200e-6, rel=1e-12)
    plain = BatchShape.from_requests([300] + [1] * 5, [300] + [kv] * 5)
    assert ledger(0).step_cost(plain).terms["request_host"] == pytest.approx(6 * 50e-6, rel=1e-12)
    with pytest.raises(ValueError, match="spec_request_host_s must be a finite number"):
        attrs.evolve(eng, spec_request_host_s=-1e-6)


def test_disabling_a_term_removes_exactly_it() -> None:
    decode = BatchShape.from_requests([1] * 5, [100] * 5)
    for engine, graph, shape in ((SERIAL, False, SHAPE), (load_engine("vllm"), True, SHAPE),
                                 (load_engine("vllm"), True, decode)):
        full = CostModel(dep(tp=2, engine=engine), cuda_graph=graph).step_cost(shape)
        for name in full.terms:
            part = CostModel(dep(tp=2, engine=engine), cuda_graph=graph,
                             disabled_terms=frozenset({name})).step_cost(shape)
            assert name not in part.terms
            assert {k: v for k, v in full.terms.items() if k != name} == dict(part.terms)
            assert part.total_s == pytest.approx(full.total_s - full.terms[name])


def test_top_k_top_p_sampling_prices_each_sampled_row_over_the_whole_vocabulary() -> None:
    """``sampler``: sampler_s_per_vocab x vocabulary x sampled rows (one per request); greedy requests
    have no such term, and switching it off leaves the greedy ledger exactly."""
    engine = attrs.evolve(SERIAL, sampler_s_per_vocab=2e-10)
    sampled = attrs.evolve(dep(engine=engine), sampling="top_k_top_p")
    full = CostModel(sampled, calibration=CAL).step_cost(SHAPE)
    assert full.terms["sampler"] == pytest.approx(2e-10 * V * 3)   # 3 requests: 77 us
    greedy = CostModel(dep(engine=engine), calibration=CAL).step_cost(SHAPE)
    assert "sampler" not in greedy.terms
    assert {k: v for k, v in full.terms.items() if k != "sampler"} == dict(greedy.terms)
    assert full.total_s == pytest.approx(greedy.total_s + 2e-10 * V * 3)
    off = CostModel(sampled, calibration=CAL, disabled_terms=frozenset({"sampler"})).step_cost(SHAPE)
    assert dict(off.terms) == dict(greedy.terms)
    assert (CostModel.term_owner("sampler"), CostModel.term_family("sampler")) == ("engine", "throughput")
    with pytest.raises(ValueError, match="sampling must be one of greedy, top_k_top_p, got 'nucleus'"):
        attrs.evolve(dep(), sampling="nucleus")


def test_unknown_term_name_errors() -> None:
    with pytest.raises(ValueError, match=r"unknown cost term.*'mpl'.*valid: qkv_proj"):
        CostModel(dep(), disabled_terms=frozenset({"mpl"}))
    with pytest.raises(ValueError, match="'bogus'"):
        CostModel.term_owner("bogus")


def test_owners_and_families() -> None:
    cm = CostModel(dep())
    assert cm.term_owner("mlp") == "gpu+model" and cm.term_family("mlp") == "throughput"
    assert cm.term_owner("step_host") == "engine" and cm.term_family("step_host") == "scheduler"
    assert cm.term_owner("kernel_launch") == "engine" and cm.term_family("kernel_launch") == "runtime"


def test_step_time_ns_memoised_and_fast() -> None:
    cm = CostModel(dep())
    ns = cm.step_time_ns(SHAPE)
    assert ns == round(cm.step_cost(SHAPE).total_s * 1e9)
    assert cm.step_time_ns(SHAPE) == ns
    empty = BatchShape(num_reqs=0, num_decode=0, new_tokens=0, sum_kv=0, sum_q_kv=0, sum_q_sq=0)
    assert cm.step_time_ns(empty) == 1
    t0 = time.perf_counter()
    for _ in range(10000):
        cm.step_time_ns(SHAPE)
    assert (time.perf_counter() - t0) / 10000 < 20e-6     # < 5 us typical; generous for slow CI


def test_graph_modes_move_exactly_what_they_leave_out_of_graphs() -> None:
    """vLLM cudagraph_mode PIECEWISE runs a pure decode's attention outside the graphs (its launches, its
    eager floors) and changes nothing else; FULL_DECODE_ONLY (SGLang's and TRT-LLM's rule) prices a mixed
    step's kernels eager; NONE is cuda_graph=False."""
    decode = BatchShape.from_requests([1] * 8, [500] * 8)
    mixed = BatchShape.from_requests([300, 1, 1], [300, 500, 500])
    full = cm().step_cost(decode).terms
    piecewise = cm(graph_mode="piecewise").step_cost(decode).terms
    eager = cm(cuda_graph=False).step_cost(decode).terms
    assert full["kernel_launch"] == 0.0
    assert piecewise["kernel_launch"] == pytest.approx(L * SERIAL.launch_s)
    assert piecewise["attention"] == eager["attention"]
    # CAL's eager floor (13 us per layer) is below three kernels at the engine's graph floor and is raised
    # to it, so only the launches differ; with an eager floor above it (20 us) attention differs by as much
    assert piecewise["attention"] == pytest.approx(full["attention"], rel=1e-12)
    assert {k for k in full if full[k] != piecewise[k]} <= {"attention", "kernel_launch"}
    slow = attrs.evolve(CAL, attn_decode=attrs.evolve(DECODE, floor_s=20e-6))
    full_slow = CostModel(dep(), calibration=slow).step_cost(decode).terms
    piecewise_slow = CostModel(dep(), calibration=slow, graph_mode="piecewise").step_cost(decode).terms
    assert piecewise_slow["attention"] - full_slow["attention"] == pytest.approx(
        L * (20e-6 - 3 * SERIAL.graph_kernel_floor_s), rel=1e-9)
    assert {k for k in full_slow if full_slow[k] != piecewise_slow[k]} == {"attention", "kernel_launch"}
    assert cm(graph_mode="piecewise").step_cost(mixed).terms == cm().step_cost(mixed).terms
    decode_only = cm(graph_mode="full_decode_only").step_cost(mixed).terms
    none = cm(cuda_graph=False).step_cost(mixed).terms
    for term in ("qkv_proj", "o_proj", "mlp", "lm_head", "attention"):
        assert decode_only[term] == none[term]
    assert decode_only["mlp"] > cm().step_cost(mixed).terms["mlp"]          # eager floors, not graph floors
    assert cm(graph_mode="full_decode_only").step_cost(decode).terms == full
    assert cm(graph_mode="none").step_cost(decode).terms == eager
    with pytest.raises(ValueError, match="CUDA-graph mode 'full'"):
        cm(graph_mode="full")


def test_capture_limit_decides_which_mixed_steps_replay_graphs() -> None:
    """vLLM replays piecewise graphs for steps up to its largest capture size, which follows max_num_seqs
    (2 x max_num_seqs up to 512) unless set: a 300-token step is eager at max_num_seqs 8 (largest capture
    16), graphed by default (512) and with max_capture_size 2048."""
    mixed = BatchShape.from_requests([300, 1, 1], [300, 500, 500])
    small = cm(max_num_seqs=8)
    assert small.max_capture == 16 and cm().max_capture == 512
    assert cm(max_num_seqs=8, max_capture_size=2048).max_capture == 2048
    assert small.step_cost(mixed).terms["mlp"] == cm(cuda_graph=False).step_cost(mixed).terms["mlp"]
    assert cm(max_num_seqs=8, max_capture_size=2048).step_cost(mixed).terms == cm().step_cost(mixed).terms


def test_eager_mode_adds_launches_only_there() -> None:
    """Eager, every kernel is launched from the CPU and each op pays its eager floor; in a graph neither."""
    decode = BatchShape.from_requests([1] * 8, [500] * 8)
    graph = CostModel(dep()).step_cost(decode)
    eager = CostModel(dep(), cuda_graph=False).step_cost(decode)
    assert graph.terms["kernel_launch"] == 0.0 and eager.terms["kernel_launch"] > 0.0
    cal = CostModel(dep()).cal
    g = SERIAL.graph_kernel_floor_s
    lm_graph, lm_eager = graph.terms["lm_head"], eager.terms["lm_head"]
    # (the shipped BF16 GEMM floor, 3.5 us, is below the graph floor, 4.5 us, and is raised to it)
    assert lm_eager - lm_graph == pytest.approx(max(cal.gemm_for("bf16").floor_s, g) - g, rel=1e-9, abs=1e-15)
    assert graph.terms["step_host"] == eager.terms["step_host"]


@pytest.mark.parametrize("model,gpu,engine,parallel,kw", [
    ("meta-llama/Llama-3.1-8B", "h100_sxm", "vllm", {}, {}),
    ("meta-llama/Llama-3.1-8B", "a100_sxm", "vllm", {}, {"max_num_seqs": 512, "max_num_batched_tokens": 512}),
    ("meta-llama/Llama-3.1-70B", "h100_sxm", "sglang", {"tp": 4}, {}),
    ("meta-llama/Llama-3.1-8B", "h100_sxm", "trtllm", {}, {"cuda_graph": False}),
    ("meta-llama/Llama-3.1-8B", "h100_sxm", "vllm", {}, {"kv_bucket_tokens": 256}),
    ("meta-llama/Llama-3.1-8B", "h100_sxm", "vllm", {}, {"disabled_terms": frozenset({"kv_traversal", "attention"})}),
    ("meta-llama/Llama-3.1-8B", "h100_sxm", "vllm", {"sampling": "top_k_top_p"}, {}),
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", "vllm", {"tp": 8}, {}),
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", "trtllm", {"tp": 8}, {"cuda_graph": False}),   # eager_host > 0
    ("deepseek-ai/DeepSeek-V3.2", "b200_sxm", "sglang", {"tp": 1, "attn_dp": 8, "ep": 8}, {}),
    ("openai/gpt-oss-20b", "h100_sxm", "vllm", {}, {}),
    ("openai/gpt-oss-20b", "h100_sxm", "vllm", {}, {"graph_mode": "piecewise", "max_num_seqs": 4}),
    ("openai/gpt-oss-20b", "h100_sxm", "vllm", {}, {"graph_mode": "full_decode_only", "max_capture_size": 64}),
    ("nvidia/Nemotron-H-56B-Base-8K", "h100_sxm", "vllm", {"tp": 2}, {}),
])
def test_decode_step_is_step_of_the_pure_decode_shape(model: str, gpu: str, engine: str,
                                                       parallel: dict[str, int], kw: dict[str, object]) -> None:
    """The decode fast path gives bit for bit the floats and nanoseconds of ``step`` on the same batch."""
    d = Deployment(gpu=load_gpu(gpu), model=load_model(model), engine=load_engine(engine), **parallel)
    model_ = CostModel(d, **kw)  # type: ignore[arg-type]
    for n in (1, 2, 3, 7, 8, 31, 64, 100, 257, 512, 600):
        for sum_kv in (n, n + 1, 17 * n, 1000 * n + 13, 128_000 * n):
            # contexts equal (or unknown: -1), and the longest of them as long as the sum allows
            for max_kv in {-1, -(-sum_kv // n), sum_kv - (n - 1)}:
                terms, ns = model_.decode_step(n, sum_kv, max_kv)
                ref_terms, ref_ns = model_.step(BatchShape(
                    num_reqs=n, num_decode=n, new_tokens=n, sum_kv=sum_kv, sum_q_kv=sum_kv, sum_q_sq=n,
                    decode_sum_kv=sum_kv if max_kv >= 0 else -1, decode_max_kv=max_kv))
                assert terms == list(ref_terms.values()) and ns == ref_ns, (n, sum_kv, max_kv)
                assert [t.hex() for t in terms] == [t.hex() for t in ref_terms.values()]


@pytest.mark.parametrize("model, gpu, engine, parallel, kw", [
    ("Qwen/Qwen3-30B-A3B", "h100_sxm", "vllm", {"attn_dp": 2, "ep": 2}, {}),
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", "trtllm", {"tp": 1, "attn_dp": 8, "ep": 8}, {}),
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", "trtllm", {"tp": 1, "attn_dp": 8, "ep": 8}, {"cuda_graph": False}),
    ("openai/gpt-oss-20b", "h100_sxm", "sglang", {"attn_dp": 4}, {"kv_bucket_tokens": 256}),
])
def test_decode_step_in_a_group_is_price_in_group_of_the_pure_decode_shape(model: str, gpu: str, engine: str,
                                                                           parallel: dict[str, int],
                                                                           kw: dict[str, object]) -> None:
    """With the attention-DP group's tokens, the decode fast path gives bit for bit what price_in_group gives
    for the rank's batch (its routed experts and collectives over the group's tokens, no dp_imbalance)."""
    d = Deployment(gpu=load_gpu(gpu), model=load_model(model), engine=load_engine(engine), **parallel)
    model_ = CostModel(d, **kw)  # type: ignore[arg-type]
    for n in (1, 3, 8, 64, 257):
        for group in (n, 2 * n + 1, 8 * n):
            for sum_kv in (n, 17 * n, 1000 * n + 13):
                for max_kv in {-1, -(-sum_kv // n), sum_kv - (n - 1)}:
                    terms, ns = model_.decode_step(n, sum_kv, max_kv, group)
                    ref_terms, ref_ns = model_.price_in_group(BatchShape(
                        num_reqs=n, num_decode=n, new_tokens=n, sum_kv=sum_kv, sum_q_kv=sum_kv, sum_q_sq=n,
                        decode_sum_kv=sum_kv if max_kv >= 0 else -1, decode_max_kv=max_kv), group)
                    assert [t.hex() for t in terms] == [t.hex() for t in ref_terms.values()], (n, group, sum_kv)
                    assert ns == ref_ns
    assert model_.decode_step(8, 800, -1, 16) != model_.decode_step(8, 800, -1, 64)  # (the group's tokens count)
    with pytest.raises(ValueError, match="the group's 4 tokens are fewer than the rank's 8"):
        model_.decode_step(8, 800, -1, 4)


DECODE_CASES = [
    ("meta-llama/Llama-3.1-8B", "h100_sxm", "vllm", {}, {}),
    ("meta-llama/Llama-3.1-8B", "h100_sxm", "vllm", {"kv_dtype": "fp8"}, {}),       # rate-sensitive curve
    ("meta-llama/Llama-3.1-8B", "h200_sxm", "trtllm", {"kv_dtype": "fp8"}, {"cuda_graph": False}),
    ("Qwen/Qwen3-32B", "h200_sxm", "sglang", {"tp": 2}, {}),
    ("openai/gpt-oss-20b", "h100_sxm", "vllm", {}, {}),                             # sliding windows
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", "vllm", {"tp": 8}, {}),                 # MLA
    ("meta-llama/Llama-3.1-8B", "h100_sxm", "vllm", {}, {"kv_bucket_tokens": 256}),
]


@pytest.mark.parametrize("model,gpu,engine,parallel,kw", DECODE_CASES)
def test_decode_price_is_the_same_for_every_longest_context_up_to_its_bound(
        model: str, gpu: str, engine: str, parallel: dict[str, object], kw: dict[str, object]) -> None:
    """CostModel.decode_max_kv_bound: every longest context from the mean up to the bound gives the very
    floats of equal contexts; past it (where the bound is finite) the price may differ."""
    import random
    d = Deployment(gpu=load_gpu(gpu), model=load_model(model), engine=load_engine(engine), **parallel)  # type: ignore[arg-type]
    model_ = CostModel(d, **kw)  # type: ignore[arg-type]
    rng = random.Random(7)
    finite = 0
    for n in (1, 2, 5, 8, 33, 128, 300):
        for sum_kv in (n, 3 * n + 1, 500 * n + 7, 4000 * n, 60_000 * n):
            bound = model_.decode_max_kv_bound(n, sum_kv)
            low = -(-sum_kv // n)
            if bound < low:
                continue
            finite += bound < sum_kv
            ref = model_.decode_step(n, sum_kv, low)
            for m in {low, bound, min(bound, sum_kv - (n - 1)), *(rng.randint(low, bound) for _ in range(5))}:
                if m > sum_kv - (n - 1):
                    continue
                assert model_.decode_step(n, sum_kv, m) == ref, (n, sum_kv, m, bound)
    is_gqa = model != "deepseek-ai/DeepSeek-V3" and model != "openai/gpt-oss-20b" and not kw
    assert (model_.decode_max_kv_bound(8, 8000) >= 0) == is_gqa  # only plain GQA layers are bounded
    if parallel.get("kv_dtype") == "fp8" and engine == "vllm":
        assert finite > 0  # vLLM's dequantising curve is compute-bound at low rates: the bound does bind
    if parallel.get("kv_dtype") == "fp8" and engine == "trtllm":
        assert model_.decode_max_kv_bound(8, 8000) == -1  # TRT-LLM's is compute-bound at any rate


def test_decode_price_bound_by_hand() -> None:
    """CAL's decode curve with m_half = 4 requests: eff(r) = 0.4 r / (r + 4). One layer kind, 8 requests
    over 8,000 tokens (BF16 K / V of 8 heads x 256): compute A (r + 4) / r against memory T, bound at
    rate A 4 / (T - A), i.e. a longest context of 8,000 / that rate."""
    curve = Roofline(compute_eff=0.4, m_half=4.0, mem_eff=0.9, floor_s=13e-6)
    model = CostModel(dep(), calibration=attrs.evolve(CAL, attn_decode=curve), cuda_graph=False)
    n, s = 8, 8000
    flops = 2.0 * NH * 2 * HD * s
    nbytes = s * NKV * 2 * HD * 2 + n * (NH * 2 * HD * 2 + NKV * 2 * HD * 2)
    compute, memory = flops / (PEAK_BF16 * 0.4), nbytes / (HBM * 0.9)
    assert compute < memory
    rate = compute * 4.0 / (memory - compute) * (1 + 1e-9)
    assert model.decode_max_kv_bound(n, s) == int(s / rate)
    # a curve whose rate does not depend on the requests bounds nothing: every longest context prices alike
    flat = CostModel(dep(), calibration=CAL, cuda_graph=False)
    assert flat.decode_max_kv_bound(n, s) == s
    # compute-bound at any rate: no range is known
    slow = attrs.evolve(curve, compute_eff=1e-4)
    assert CostModel(dep(), calibration=attrs.evolve(CAL, attn_decode=slow), cuda_graph=False).decode_max_kv_bound(n, s) == -1


def test_mixed_steps_sharing_token_counts_are_priced_as_by_a_fresh_model() -> None:
    """The batch terms memoised per (tokens, requests, decodes) leave every other term to each step."""
    shapes = [BatchShape.from_requests([1] * 7 + [25], [300 + 40 * i] * 7 + [25 + 100 * i]) for i in range(4)]
    shared = CostModel(dep(engine=load_engine("vllm")))
    for shape in shapes:
        fresh = CostModel(dep(engine=load_engine("vllm"))).step(shape)
        assert shared.step(shape) == fresh
        assert list(fresh[0]) == list(shared.term_names)  # in TERMS order, every term present


def test_moe_kernel_family_changes_only_the_routed_expert_term() -> None:
    """A named MoE kernel family is priced with its own curve and touches nothing else in the ledger; a
    family the calibration never fitted is an error, not a silent fallback."""
    marlin = Roofline(compute_eff=0.1, mem_eff=0.9, floor_s=90e-6)
    cal = attrs.evolve(CAL, moe={"bf16": GEMM, "fp4": GEMM, "fp4_marlin": marlin})
    assert cal.moe_for("fp4") is GEMM and cal.moe_for("fp4", "marlin") is marlin
    with pytest.raises(ValueError, match=r"no marlin MoE curve for bf16 weights \(fitted MoE curves: bf16, fp4, fp4_marlin\)"):
        cal.moe_for("bf16", "marlin")
    with pytest.raises(ValueError, match="moe_kernel must be one of default, marlin"):
        Deployment(gpu=load_gpu("h100_sxm"), model=load_model("openai/gpt-oss-20b"), engine=load_engine("vllm"),
                   moe_kernel="cutlass")

    shape = BatchShape.from_requests([512, 1, 1], [512, 300, 1000])
    base, other = (moe_ledger("h100_sxm", "openai/gpt-oss-20b", cal, kernel, weight_dtype="fp4").step_cost(shape)
                   for kernel in ("default", "marlin"))
    assert other.terms["moe_experts"] > base.terms["moe_experts"]
    assert without_moe_experts(base) == without_moe_experts(other)
    with pytest.raises(ValueError, match="no marlin MoE curve for fp4 weights"):
        moe_ledger("h100_sxm", "openai/gpt-oss-20b", CAL, "marlin", weight_dtype="fp4")


def test_flashinfer_moe_family_changes_only_the_routed_expert_term() -> None:
    """moe_kernel flashinfer (vLLM's FlashInferExperts on block-FP8) is priced with the fp8_block_flashinfer
    curve and touches nothing else; a calibration without that curve raises."""
    fi = Roofline(compute_eff=0.1, mem_eff=0.5, floor_s=80e-6)
    cal = attrs.evolve(CAL, moe={"bf16": GEMM, "fp8_block": GEMM, "fp8_block_flashinfer": fi})
    assert cal.moe_for("fp8_block") is GEMM and cal.moe_for("fp8_block", "flashinfer") is fi
    with pytest.raises(ValueError, match="no flashinfer MoE curve for fp8 weights"):
        cal.moe_for("fp8", "flashinfer")
    def ledger(kernel: str, calibration: Calibration = cal) -> CostModel:
        return moe_ledger("h200_sxm", "MiniMaxAI/MiniMax-M2.5", calibration, kernel, tp=4, ep=4,
                          weight_dtype="fp8_block")

    shape = BatchShape.from_requests([512, 1, 1], [512, 300, 1000])
    base, other = ledger("default").step_cost(shape), ledger("flashinfer").step_cost(shape)
    assert other.terms["moe_experts"] > base.terms["moe_experts"]
    assert without_moe_experts(base) == without_moe_experts(other)
    with pytest.raises(ValueError, match="no flashinfer MoE curve for fp8_block weights"):
        ledger("flashinfer", CAL)


def test_moe_curve_subsets_split_by_kernel_family() -> None:
    """A format timed with two kernel families gets a curve per family (the default curve keeps the rows
    of no named family); a format timed with one family keeps the plain key."""
    from hardware.calibrate import moe_curve_subsets, moe_kernel_family
    assert moe_kernel_family("vllm_fp8moe_flashinfer_cutlass_flashinferexperts") == "flashinfer"
    assert moe_kernel_family("vllm_fp8moe_triton_tritonexperts") == "default"
    assert moe_kernel_family("vllm_compressedtensorswna16marlinmoe_marlin_marlinexperts") == "marlin"
    fi = {"kernel_source": "vllm_fp8moe_flashinfer_cutlass_flashinferexperts"}
    tr = {"kernel_source": "vllm_fp8moe_triton_tritonexperts"}
    assert moe_curve_subsets([fi, tr, fi], "fp8_block") == {"fp8_block_flashinfer": [fi, fi], "fp8_block": [tr]}
    assert moe_curve_subsets([fi, fi], "fp8") == {"fp8": [fi, fi]}
    with pytest.raises(ValueError, match="no default-kernel rows"):
        moe_curve_subsets([fi, {"kernel_source": "x_marlin"}], "fp4")


def test_shipped_vllm_calibration_has_a_flashinfer_block_fp8_moe_curve() -> None:
    """vLLM's opdb fp8_block MoE table times Triton at moe_ep 1 and FlashInfer CUTLASS at moe_ep > 1: both
    fitted, each under its own key; SGLang's (Triton only) has no FlashInfer curve."""
    from hardware import load_calibration
    vllm = load_calibration("vllm")
    assert {"fp8_block", "fp8_block_flashinfer"} <= set(vllm.moe)
    assert vllm.moe_for("fp8_block", "flashinfer") != vllm.moe_for("fp8_block")
    assert "fp8_block_flashinfer" not in load_calibration("sglang").moe


def test_deepgemm_moe_prices_the_padded_contiguous_layout() -> None:
    """moe_kernel deepgemm (vLLM's DeepGemmExperts): two grouped GEMMs over the worst-case padded rows
    M_sum = round_up(T x topk + local_experts x 127, 128), priced with the block-FP8 GEMM curve, so a decode
    step of 1 or 16 tokens costs nearly the same; only the routed-expert term changes; block-FP8 only."""
    from hardware import kernels

    fp8 = Roofline(compute_eff=0.5, mem_eff=0.8, floor_s=5e-6)
    cal = attrs.evolve(CAL, gemm={"bf16": GEMM, "fp8_block": fp8}, moe={"bf16": GEMM, "fp8_block": GEMM})
    gpu, model = load_gpu("h200_sxm"), load_model("Qwen/Qwen3-235B-A22B-FP8")   # 128 experts, top-8, 4096 x 1536
    peak, bw = gpu.flops_for("fp8"), gpu.hbm_bw_Bps

    def hand(tokens: int, tp: int, ep: int) -> float:
        local, inter = 128 // ep, 1536 // tp
        m_sum = -(-(tokens * 8 + local * 127) // 128) * 128
        touched = kernels.experts_touched(tokens, 8, 128, local)
        return sum(fp8.time_s(2.0 * m_sum * n * k, touched * n * k + m_sum * (n + k) * 2, m_sum, peak, bw)
                   for n, k in ((2 * inter, 4096), (4096, inter)))

    def moe(tokens: int, tp: int = 2, ep: int = 1) -> float:
        return kernels.deepgemm_moe_s(fp8, tokens=tokens, width=4096, inter=1536 // tp, topk=8, num_experts=128,
                                      ep=ep, mats=3, w_bytes_per_elem=1.0, peak_flops=peak, bw_Bps=bw)

    assert moe(16) == pytest.approx(hand(16, 2, 1)) and moe(16, ep=2) == pytest.approx(hand(16, 2, 2))
    assert moe(1) == pytest.approx(moe(16), rel=0.02)            # M_sum is 16,384 rows for both
    assert moe(4000) > 2 * moe(16) and moe(0) == 0.0

    shape = BatchShape.from_requests([1] * 16, [2000] * 16)
    base, dg = (moe_ledger("h200_sxm", "Qwen/Qwen3-235B-A22B-FP8", cal, kernel, tp=2,
                           weight_dtype="fp8_block").step_cost(shape) for kernel in ("default", "deepgemm"))
    triton = kernels.moe_s(eager(GEMM, 7), tokens=16, width=4096, inter=768, topk=8, num_experts=128, ep=1, mats=3,
                           w_bytes_per_elem=1.0, peak_flops=peak, bw_Bps=bw)
    # the router GEMM stays in the term; the routed experts swap the fitted MoE curve for the padded layout
    assert dg.terms["moe_experts"] - base.terms["moe_experts"] == pytest.approx(94 * (hand(16, 2, 1) - triton))
    assert without_moe_experts(base) == without_moe_experts(dg)
    with pytest.raises(ValueError, match="deepgemm runs block-FP8 weights only"):
        Deployment(gpu=gpu, model=model, engine=SERIAL, tp=2, weight_dtype="bf16", moe_kernel="deepgemm")


def _binomial_max_by_enumeration(trials: int, p: float, ranks: int) -> float:
    """E[max of ``ranks`` iid Binomial(trials, p)] from P(max <= x) = F(x)^ranks, with math.comb."""
    cdf = [sum(math.comb(trials, j) * p ** j * (1 - p) ** (trials - j) for j in range(x + 1))
           for x in range(trials + 1)]
    below = [0.0] + [c ** ranks for c in cdf[:-1]]
    return sum(x * (cdf[x] ** ranks - below[x]) for x in range(trials + 1))


def test_expected_max_binomial_by_hand() -> None:
    from hardware.kernels import _expected_max_std_normal, expected_max_binomial

    assert expected_max_binomial(1, 0.5, 2) == pytest.approx(0.75)          # 1 - P(both 0)
    assert expected_max_binomial(2, 0.5, 2) == pytest.approx(22 / 16)       # P(max=1) 8/16, P(max=2) 7/16
    assert expected_max_binomial(32, 1 / 16, 4) == pytest.approx(_binomial_max_by_enumeration(32, 1 / 16, 4))
    assert expected_max_binomial(10, 0.3, 1) == pytest.approx(3.0)          # one rank: the mean
    assert expected_max_binomial(10, 0.0, 8) == 0.0 and expected_max_binomial(10, 1.0, 8) == 10.0
    assert _expected_max_std_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert _expected_max_std_normal(8) == pytest.approx(1.4236, abs=1e-4)   # tabulated E[max of 8 N(0,1)]
    # above 2,048 trials: mean + sd x E[max of the ranks' standard normals]
    assert expected_max_binomial(10_000, 0.125, 8) == pytest.approx(
        1250 + math.sqrt(10_000 * 0.125 * 0.875) * _expected_max_std_normal(8))
    # where the two meet they agree (the exact sum at 2,048 trials against the normal approximation)
    exact = expected_max_binomial(2048, 0.125, 8)
    assert exact == pytest.approx(256 + math.sqrt(2048 * 0.125 * 0.875) * _expected_max_std_normal(8), rel=0.005)


def test_balanced_tables_touch_every_expert_the_collector_routed_to() -> None:
    """The opdb MoE tables' 'balanced' rows: with stride s = ceil(128 / 8) = 16, token t of T < 16 picks
    experts floor(16 t / T) + 16 j, T x 8 distinct; from T = 16 on every expert. Rank 0 of EP 4 holds experts
    0-31: one token hits 0 and 16, two tokens 0, 8, 16 and 24. The calibration fits the tables with these
    counts (uniform routing would touch 128 (1 - (120/128)^16) = 82.4 experts at T = 16, not 128)."""
    from hardware import kernels
    from hardware.calibrate import moe_features

    load = kernels.balanced_local_load
    assert [load(t, 8, 128, 1) for t in (1, 4, 16, 64)] == [(8, 8), (32, 32), (128, 128), (128, 512)]
    assert load(1, 8, 128, 4) == (2, 2) and load(2, 8, 128, 4) == (4, 4) and load(64, 8, 128, 4) == (32, 128)
    assert kernels.experts_touched(16, 8, 128, 128) == pytest.approx(82.42, abs=0.01)
    row = {"num_tokens": "2", "hidden_size": "4096", "inter_size": "1536", "topk": "8", "num_experts": "128",
           "moe_tp_size": "1", "moe_ep_size": "4", "kernel_source": "x"}
    flops, nbytes, m, inter_gpu, width = moe_features([row, dict(row, moe_tp_size="4")], "fp8_block")
    assert flops[0] == 2 * 4 * 3 * 4096 * 1536                                  # 4 pairs on rank 0
    assert nbytes[0] == 4 * 3 * 4096 * 1536 * 1 + 4 * (2 * 4096 + 3 * 1536) * 2   # 4 experts' FP8 weights
    assert m[0] == 1.0
    assert list(inter_gpu) == [1536, 384] and list(width) == [4096, 4096]       # the width terms' (n, k)
    with pytest.raises(ValueError, match="routing must be one of uniform, busiest, balanced, power_law, power_law_busiest, not 'even'"):
        kernels.moe_s(GEMM, tokens=2, width=4096, inter=1536, topk=8, num_experts=128, ep=4, mats=3,
                      w_bytes_per_elem=1.0, peak_flops=1e15, bw_Bps=3e12, routing="even")


def test_ep_imbalance_prices_the_busiest_expert_parallel_rank_by_hand() -> None:
    """Qwen3-235B (94 MoE layers, 128 experts, top-8, 4096 x 1536) at TP4 / EP4, one decode token: the
    mean rank touches 32 x 8/128 = 2 experts and routes 2 pairs; the layer waits for the busiest rank,
    E[max of 4 Binomial(32, 1/16)] experts and E[max of 4 Binomial(8, 1/4)] pairs. ``ep_imbalance`` is the
    difference, in every MoE layer; without EP it is 0, and switching it off removes only it."""
    gpu = load_gpu("h200_sxm")
    peak, bw = gpu.flops_for("bf16"), gpu.hbm_bw_Bps

    def hand(touched: float, pairs: float) -> float:
        return GEMM.time_s(2.0 * pairs * 3 * 4096 * 1536, touched * 3 * 4096 * 1536 * 2
                           + pairs * (2 * 4096 + 3 * 1536) * 2, pairs / touched, peak, bw)

    busiest = hand(_binomial_max_by_enumeration(32, 1 / 16, 4), _binomial_max_by_enumeration(8, 1 / 4, 4))
    mean = hand(32 * (1 - (1 - 8 / 128) ** 1), 8 / 4)
    shape = BatchShape.from_requests([1], [1000])
    cost = moe_ledger("h200_sxm", "Qwen/Qwen3-235B-A22B-FP8", CAL, "default", tp=4, ep=4,
                      weight_dtype="bf16").step_cost(shape)
    assert cost.terms["ep_imbalance"] == pytest.approx(94 * (busiest - mean), rel=1e-9)
    no_ep = moe_ledger("h200_sxm", "Qwen/Qwen3-235B-A22B-FP8", CAL, "default", tp=4,
                       weight_dtype="bf16").step_cost(shape)
    assert no_ep.terms["ep_imbalance"] == 0.0
    off = CostModel(Deployment(gpu=gpu, model=load_model("Qwen/Qwen3-235B-A22B-FP8"), engine=SERIAL, tp=4, ep=4,
                               weight_dtype="bf16", moe_routing="uniform"), calibration=CAL, cuda_graph=False,
                    disabled_terms=frozenset({"ep_imbalance"})).step_cost(shape)
    assert "ep_imbalance" not in off.terms
    assert dict(off.terms) == {k: v for k, v in cost.terms.items() if k != "ep_imbalance"}
    # a prefill's thousands of pairs spread evenly: the busiest rank is within a few percent of the mean
    big = moe_ledger("h200_sxm", "Qwen/Qwen3-235B-A22B-FP8", CAL, "default", tp=4, ep=4,
                     weight_dtype="bf16").step_cost(BatchShape.from_requests([8192], [8192]))
    assert 0.0 < big.terms["ep_imbalance"] < 0.05 * big.terms["moe_experts"]


# --- eager-step host time (eager_host) -------------------------------------------------------------------
HOST = ("step_host", "request_host", "kv_traversal")


def eager_engine(base: str, layer_s: float, moe_s: float = 0.0, **kw: object) -> object:
    return attrs.evolve(load_engine(base), eager_layer_host_s=layer_s, eager_moe_host_s=moe_s, **kw)


def test_eager_host_per_layer_counts_by_hand() -> None:
    """DeepSeek-V3: 61 decoder layers, the first 3 dense, 58 MoE."""
    d = Deployment(gpu=load_gpu("h200_sxm"), model=load_model("deepseek-ai/DeepSeek-V3"),
                   engine=eager_engine("trtllm", 1e-4, 2e-3), tp=8)  # type: ignore[arg-type]
    assert CostModel(d).eager_host_s == pytest.approx(61 * 1e-4 + 58 * 2e-3, rel=1e-12)


@pytest.mark.parametrize("k", [1, 3])
def test_eager_host_counts_the_mtp_draft_passes_by_hand(k: int) -> None:
    """With k MTP drafts an eager step also launches k passes of the MTP module's layer (DeepSeek-V3: a MoE
    layer): 61 x 0.1 ms + 58 x 2 ms for the model, k x (0.1 + 2) ms for the drafts."""
    d = Deployment(gpu=load_gpu("h200_sxm"), model=load_model("deepseek-ai/DeepSeek-V3"),
                   engine=eager_engine("trtllm", 1e-4, 2e-3), tp=8, spec_tokens=k)  # type: ignore[arg-type]
    assert CostModel(d).eager_host_s == pytest.approx(61 * 1e-4 + 58 * 2e-3 + k * 2.1e-3, rel=1e-12)


@pytest.mark.parametrize("layer_s", [10e-3, 1e-6])
def test_eager_step_lasts_max_of_host_and_gpu_by_hand(layer_s: float) -> None:
    """A TRT-LLM mixed step runs eager: without overlap the step is the host terms + max(GPU, 32 x layer_s);
    host-bound at 10 ms per layer (eager_host = 320 ms - GPU), GPU-bound at 1 us (eager_host 0, nothing else
    moves)."""
    ser = CostModel(dep(engine=eager_engine("trtllm", layer_s, host_overlap=False)), calibration=CAL)
    off = CostModel(dep(engine=eager_engine("trtllm", 0.0, host_overlap=False)), calibration=CAL)
    a, b = ser.step_cost(SHAPE).terms, off.step_cost(SHAPE).terms
    gpu = sum(v for n, v in b.items() if n not in HOST)
    assert a["eager_host"] == pytest.approx(max(0.0, L * layer_s - gpu), rel=1e-12, abs=1e-15)
    assert (a["eager_host"] > 0.0) == (layer_s == 10e-3)
    assert b["eager_host"] == 0.0
    assert {n: v for n, v in a.items() if n != "eager_host"} == {n: v for n, v in b.items() if n != "eager_host"}
    assert sum(a.values()) == pytest.approx(sum(b[n] for n in HOST) + max(gpu, L * layer_s), rel=1e-12)


@pytest.mark.parametrize("layer_s", [10e-3, 20e-6])
def test_eager_host_and_scheduling_share_the_cpu_by_hand(layer_s: float) -> None:
    """With async scheduling the CPU launches the eager step and schedules the next one: the step lasts
    max(GPU, eager host + scheduling host)."""
    over = CostModel(dep(engine=eager_engine("trtllm", layer_s, host_overlap=True, step_host_s=0.002,
                                             per_request_host_s=1e-4)), calibration=CAL)
    ser = CostModel(dep(engine=eager_engine("trtllm", 0.0, host_overlap=False, step_host_s=0.002,
                                            per_request_host_s=1e-4)), calibration=CAL)
    a, b = over.step_cost(SHAPE).terms, ser.step_cost(SHAPE).terms
    gpu = sum(v for n, v in b.items() if n not in HOST)
    sched = sum(b[n] for n in HOST)
    assert sum(a.values()) == pytest.approx(max(gpu, L * layer_s + sched), rel=1e-12)


def test_eager_host_absent_for_graph_replayed_steps() -> None:
    """vLLM's piecewise graphs cover mixed steps up to the largest capture size (512 tokens here); every
    engine replays pure decode batches up to it: no eager_host there, whatever the constants. A TRT-LLM mixed
    step and a decode batch beyond the capture sizes run eager. The shipped vLLM profile's fitted constants
    (no per-layer term, 1 ms per MoE layer) come to 48 x 1 ms for Qwen3-30B-A3B (48 MoE layers), charged only
    beyond 512."""
    decode = BatchShape.from_requests([1] * 4, [100] * 4)
    mixed = BatchShape.from_requests([300, 1, 1], [400, 300, 1000])
    vllm = CostModel(dep(engine=eager_engine("vllm", 10e-3)), calibration=CAL)
    trt = CostModel(dep(engine=eager_engine("trtllm", 10e-3)), calibration=CAL, max_num_seqs=2)
    assert vllm.step_cost(mixed).terms["eager_host"] == 0.0
    assert vllm.step_cost(decode).terms["eager_host"] == 0.0
    assert vllm.step_cost(SHAPE).terms["eager_host"] > 0.0      # 514 tokens > 512: no piecewise graph
    assert trt.step_cost(mixed).terms["eager_host"] > 0.0
    assert trt.step_cost(BatchShape.from_requests([1, 1], [100, 100])).terms["eager_host"] == 0.0
    assert trt.step_cost(decode).terms["eager_host"] > 0.0      # 4 > the largest capture size, 2
    assert trt.step_cost(SHAPE).terms["eager_host"] > 0.0
    shipped = CostModel(Deployment(gpu=load_gpu("h100_sxm"), model=load_model("Qwen/Qwen3-30B-A3B"),
                                   engine=load_engine("vllm"), tp=1))
    assert shipped.eager_host_s == pytest.approx(48 * 1e-3, rel=1e-12)
    assert shipped.step_cost(mixed).terms["eager_host"] == 0.0


def test_disabling_eager_host_removes_exactly_it() -> None:
    for engine in (eager_engine("trtllm", 10e-3), eager_engine("sglang", 10e-3, 1e-3, host_overlap=False)):
        full = CostModel(dep(engine=engine), calibration=CAL).step_cost(SHAPE)
        part = CostModel(dep(engine=engine), calibration=CAL,
                         disabled_terms=frozenset({"eager_host"})).step_cost(SHAPE)
        assert full.terms["eager_host"] > 0.0 and "eager_host" not in part.terms
        assert {k: v for k, v in full.terms.items() if k != "eager_host"} == dict(part.terms)
        assert full.by_owner()["engine"] - part.by_owner()["engine"] == pytest.approx(full.terms["eager_host"])


def test_calibration_fit_formula_is_the_ledgers() -> None:
    """hardware.calibrate fits with roof_np; the ledger prices with Roofline.time_s. The two must agree on
    every parameter layout the fit writes, or the fitted constants would mean something else in the ledger.
    A fit of rows made by a known curve recovers it."""
    import numpy as np

    from hardware.calibrate import fit_roofline, roof_np

    rng = np.random.default_rng(3)
    flops = rng.uniform(1e9, 1e13, 40)
    nbytes = rng.uniform(1e6, 1e10, 40)
    m = rng.uniform(1, 4096, 40)
    n, k = rng.uniform(256, 16384, 40), rng.uniform(256, 16384, 40)
    peak, bw = np.full(40, 989e12), np.full(40, 3.35e12)
    base = dict(compute_eff=0.6, m_half=40.0, mem_eff=0.8, bytes_half=2e5, floor_s=9e-6)
    layouts = [({}, {}), ({"m_cost_s": 3e-9}, {"per_m": True}),
               ({"m_cost_s": 3e-9, "k_half": 150.0, "n_half": 900.0}, {"per_m": True, "nk": (n, k)})]
    for extra, kw in layouts:
        r = Roofline(**base, **extra)  # type: ignore[arg-type]
        p = list(base.values()) + [v for key, v in extra.items()]
        got = roof_np(np.array(p), flops, nbytes, m, peak, bw, **kw)  # type: ignore[arg-type]
        for i in range(40):
            width = r.width_factor(n[i], k[i]) if "nk" in kw else 1.0
            want = r.time_s(flops[i], nbytes[i], m[i], 989e12, 3.35e12, width)
            assert got[i] == pytest.approx(want, rel=1e-12)
    truth = np.array(list(base.values()) + [3e-9])
    meas = roof_np(truth, flops, nbytes, m, peak, bw, per_m=True)
    start = {"compute_eff": 0.5, "mem_eff": 0.7, "floor_s": 1e-5}
    fit, err = fit_roofline(flops, nbytes, m, peak, bw, meas, start, per_m=True)
    assert float(np.max(np.abs(err))) < 1e-3
    assert fit["compute_eff"] == pytest.approx(0.6, rel=0.05)
    assert fit["mem_eff"] == pytest.approx(0.8, rel=0.05)
    # row tiles by batch size (a kernel dispatch): the same agreement, and the fit writes them as given
    tiles = ((16, 0, 16), (64, 1280, 16), (64, 0, 64), (128, 0, 64), (0, 0, 256))
    r = Roofline(**base, m_cost_s=3e-9, row_tiles=tiles)  # type: ignore[arg-type]
    got = roof_np(truth, flops, nbytes, m, peak, bw, per_m=True, row_tiles=tiles)
    for i in range(40):
        assert got[i] == pytest.approx(r.time_s(flops[i], nbytes[i], m[i], 989e12, 3.35e12), rel=1e-12)
    widths = np.array([1024.0, 4096.0] * 20)   # n < / > 1280: the 17-64-row tiles differ
    r_n = attrs.evolve(r, n_half=900.0)
    with_n = roof_np(np.append(truth, 900.0), flops, nbytes, m, peak, bw, per_m=True, nk=(widths, None),
                     row_tiles=tiles)
    for i in range(40):
        want = r_n.time_s(flops[i], nbytes[i], m[i], 989e12, 3.35e12, r_n.width_factor(widths[i], 1.0),
                          n=widths[i])
        assert with_n[i] == pytest.approx(want, rel=1e-12)
    fit, err = fit_roofline(flops, nbytes, m, peak, bw, got, start, per_m=True, row_tiles=tiles)
    assert float(np.max(np.abs(err))) < 1e-3 and fit["row_tiles"] == [list(t) for t in tiles]
    assert "m_tile" not in fit and fit["compute_eff"] == pytest.approx(0.6, rel=0.05)


def test_moe_width_terms_by_hand_and_as_the_fit_writes_them() -> None:
    """Routed experts slow down with narrow experts as GEMMs do with narrow shapes: the compute rate of
    kernels.moe_s is scaled by inter / (inter + n_half) x width / (width + k_half) (expert width per GPU,
    hidden width). By hand for Qwen3-235B's experts (4096 x 1536) sharded over moe_tp 8 (192 columns), 8,192
    tokens on one GPU with every expert touched; the fitter's vectorised formula is the same with both
    terms and with n_half alone (a table whose hidden width never varies), and a fit of rows made by a
    known curve recovers its n_half."""
    import numpy as np

    from hardware import kernels
    from hardware.calibrate import fit_roofline, roof_np

    curve = Roofline(compute_eff=0.5, m_half=30.0, mem_eff=0.8, floor_s=20e-6, k_half=500.0, n_half=400.0)
    T, E, topk, width, inter = 8192, 128, 8, 4096, 1536 // 8
    pairs = T * topk
    flops = 2.0 * pairs * 3 * width * inter
    nbytes = E * 3 * width * inter * 1.0 + pairs * (2 * width + 3 * inter) * 2
    rate = 989e12 * 0.5 * (pairs / E) / (pairs / E + 30.0) * (192 / (192 + 400.0)) * (4096 / (4096 + 500.0))
    want = max(flops / rate, nbytes / (3.35e12 * 0.8)) + 20e-6
    got = kernels.moe_s(curve, tokens=T, width=width, inter=inter, topk=topk, num_experts=E, ep=1, mats=3,
                        w_bytes_per_elem=1.0, peak_flops=989e12, bw_Bps=3.35e12, routing="balanced")
    assert got == pytest.approx(want, rel=1e-12)
    wide = kernels.moe_s(curve, tokens=T, width=width, inter=1536, topk=topk, num_experts=E, ep=1, mats=3,
                         w_bytes_per_elem=1.0, peak_flops=989e12, bw_Bps=3.35e12, routing="balanced")
    assert got > wide / 8  # a shard of an eighth of the work, at a lower rate
    rng = np.random.default_rng(5)
    n, k = rng.choice([48.0, 96.0, 192.0, 384.0, 768.0, 1536.0], 60), rng.choice([2048.0, 4096.0, 7168.0], 60)
    m = rng.uniform(1, 512, 60)
    fl = 2 * m * 128 * 3 * n * k
    nb = 128 * 3 * n * k + m * 128 * (2 * k + 3 * n) * 2
    peak, bw = np.full(60, 989e12), np.full(60, 3.35e12)
    base = [0.5, 30.0, 0.8, 0.0, 20e-6]
    both = roof_np(np.array(base + [500.0, 400.0]), fl, nb, m, peak, bw, nk=(n, k))
    only_n = roof_np(np.array(base + [400.0]), fl, nb, m, peak, bw, nk=(n, None))
    for i in range(60):
        r = Roofline(compute_eff=0.5, m_half=30.0, mem_eff=0.8, floor_s=20e-6, k_half=500.0, n_half=400.0)
        assert both[i] == pytest.approx(r.time_s(fl[i], nb[i], m[i], 989e12, 3.35e12, r.width_factor(n[i], k[i])),
                                        rel=1e-12)
        r = attrs.evolve(r, k_half=0.0)
        assert only_n[i] == pytest.approx(r.time_s(fl[i], nb[i], m[i], 989e12, 3.35e12, r.width_factor(n[i], k[i])),
                                          rel=1e-12)
    fit, err = fit_roofline(fl, nb, m, peak, bw, only_n, {"compute_eff": 0.4, "mem_eff": 0.7, "floor_s": 1e-5},
                            nk=(n, None))
    assert "k_half" not in fit and fit["n_half"] == pytest.approx(400.0, rel=0.05)
    assert float(np.max(np.abs(err))) < 1e-3


def test_calibrate_only_refits_the_named_blocks() -> None:
    """``hardware.calibrate --only moe``: the fitted MoE block and its notes, every other block and its note
    as the shipped YAML has them."""
    from hardware._data import read_yaml
    from hardware.calibrate import keep_shipped
    from hardware.calibration import CALIBRATION_DIR

    shipped = read_yaml(CALIBRATION_DIR / "vllm.yaml")
    fitted = {k: v for k, v in shipped.items() if k != "provenance"}
    fitted["gemm"] = {"bf16": {"compute_eff": 0.1, "mem_eff": 0.1}}
    fitted["moe"] = {"bf16": {"compute_eff": 0.2, "mem_eff": 0.2, "n_half": 7.0}}
    fitted["mla_decode"] = {"mem_eff": 0.3}   # a block the fit gives and the shipped set lacks
    notes = {"gemm.bf16": "refitted", "moe.bf16": "new moe note", "mla_decode": "not asked for"}
    assert "mla_decode" not in shipped
    data, kept_notes = keep_shipped("vllm", fitted, notes, {"moe"})
    assert data["gemm"] == shipped["gemm"] and data["moe"] == fitted["moe"]
    assert "mla_decode" not in data and "mla_decode" not in kept_notes   # not named: not written
    added, added_notes = keep_shipped("vllm", fitted, notes, {"mla_decode"})
    assert added["mla_decode"] == {"mem_eff": 0.3} and added_notes["mla_decode"] == "not asked for"
    assert data["attention_decode"] == shipped["attention_decode"]
    assert kept_notes["moe.bf16"] == "new moe note"
    text = (CALIBRATION_DIR / "vllm.yaml").read_text()
    assert kept_notes["gemm.bf16"] != "refitted" and kept_notes["gemm.bf16"] in text
    with pytest.raises(SystemExit, match="--only: no block moee"):
        keep_shipped("vllm", fitted, notes, {"moee"})


def _collector_power_law_counts(u: "np.ndarray", tokens: int, topk: int, ep: int) -> "np.ndarray":
    """aiconfigurator's collector/helper.py _generate_power_law_distribution step by step (its round-robin
    loop kept as a loop) on given uniforms u: per-expert counts, shape (ep, experts per rank)."""
    import numpy as np

    a, E = 1.01, u.size
    lo, hi = (1.0, tokens * 0.8) if tokens * topk > E else (0.01, 2.0)
    x = ((hi ** (1 - a) - lo ** (1 - a)) * u + lo ** (1 - a)) ** (1 / (1 - a))
    target = tokens * topk
    counts = np.round(x / x.sum() * target).astype(np.int64)
    overflow = int(np.clip(counts - tokens, 0, None).sum())
    counts = np.minimum(counts, tokens).reshape(ep, E // ep)

    def round_robin(remaining: int, fill: bool) -> None:
        while remaining > 0:
            progressed = False
            for r in range(ep):
                ok = np.nonzero(counts[r] < tokens if fill else counts[r] > 0)[0]
                if ok.size == 0:
                    continue
                j = ok[int(np.argmin(counts[r, ok]) if fill else np.argmax(counts[r, ok]))]
                counts[r, j] += 1 if fill else -1
                remaining -= 1
                progressed = True
                if remaining == 0:
                    break
            if not progressed:
                break

    round_robin(overflow, True)
    delta = target - int(counts.sum())
    round_robin(abs(delta), delta > 0)
    return counts


@pytest.mark.parametrize("tokens,topk,experts,ep", [(1, 8, 256, 1), (3, 8, 256, 8), (16, 8, 128, 4),
                                                    (64, 8, 256, 8), (200, 2, 8, 2), (1000, 4, 128, 1)])
def test_power_law_routing_is_the_collectors_without_its_loop(tokens: int, topk: int, experts: int, ep: int) -> None:
    """kernels.power_law_load counts the experts and pairs of aiconfigurator's power-law routing in closed
    form; the collector's own procedure, run step by step on the same draws, gives the same numbers. Every
    draw routes T k pairs (so the mean rank has T k / ep of them), no expert more than T, and the busiest
    rank (most pairs) has at least the mean rank's pairs. The draws are seeded by (top-k, experts, EP), not
    the token count."""
    import numpy as np

    from hardware import kernels

    rng = np.random.default_rng((topk, experts, ep))
    u = rng.random((kernels.POWER_LAW_SAMPLES, experts))
    te = tp = be = bp = 0.0
    for row in u:
        c = _collector_power_law_counts(row, tokens, topk, ep)
        assert int(c.sum()) == tokens * topk and int(c.max()) <= tokens
        touched, pairs = (c > 0).sum(axis=1), c.sum(axis=1)
        top = int(np.argmax(pairs))
        te += touched.mean(); tp += pairs.mean(); be += touched[top]; bp += pairs[top]
    n = kernels.POWER_LAW_SAMPLES
    got = kernels.power_law_load(tokens, topk, experts, ep)
    assert got == pytest.approx((te / n, tp / n, be / n, bp / n), rel=1e-12)
    assert got[1] == pytest.approx(tokens * topk / ep) and got[3] >= got[1]
    if tokens == 1:
        assert got[0] * ep == topk        # one token: exactly k distinct experts in all


def test_power_law_routing_touches_fewer_experts_and_loads_the_busiest_rank_more() -> None:
    """DeepSeek-V3's router (256 experts, top-8): 16 tokens touch fewer distinct experts than independent
    draws (E (1 - (1 - k/E)^T) = 102), and under EP 8 the busiest rank carries more pairs than uniform
    routing's busiest; the ledger uses the deployment's routing (power_law by default) for moe_experts (the
    mean rank: fewer experts to read) and ep_imbalance, and for nothing else."""
    from hardware import kernels

    mean_e, mean_p, top_e, top_p = kernels.power_law_load(16, 8, 256, 1)
    assert mean_e < kernels.experts_touched(16, 8, 256, 256) and mean_p == 128
    _, _, _, top8 = kernels.power_law_load(16, 8, 256, 8)
    assert top8 > kernels.pairs_busiest(16, 8, 8)
    shape = BatchShape.from_requests([1] * 16, [500] * 16)
    skewed = moe_ledger("h200_sxm", "deepseek-ai/DeepSeek-V3", CAL, "default", tp=8, ep=8, weight_dtype="bf16",
                        moe_routing="power_law").step_cost(shape)
    uniform = moe_ledger("h200_sxm", "deepseek-ai/DeepSeek-V3", CAL, "default", tp=8, ep=8,
                         weight_dtype="bf16").step_cost(shape)
    assert skewed.terms["moe_experts"] < uniform.terms["moe_experts"]
    assert skewed.terms["ep_imbalance"] != uniform.terms["ep_imbalance"]
    assert {k: v for k, v in skewed.terms.items() if k not in ("moe_experts", "ep_imbalance")} == \
        {k: v for k, v in uniform.terms.items() if k not in ("moe_experts", "ep_imbalance")}
    default = Deployment(gpu=load_gpu("h200_sxm"), model=load_model("deepseek-ai/DeepSeek-V3"),
                         engine=SERIAL, tp=8, ep=8)
    assert default.moe_routing == "power_law"
    with pytest.raises(ValueError, match="moe_routing must be one of uniform, power_law, got 'zipf'"):
        attrs.evolve(default, moe_routing="zipf")


# An all-reduce with a count of its own: two lines for 8 GPUs (small messages: little latency, a fifth of the
# link; large ones: 20 us and nearly the whole link), none for 2 GPUs (the pooled line).
AR8 = Collective(alpha_s=6e-6, bw_eff=0.9, eager_extra_s=20e-6, by_gpus=((8, ((4e-6, 0.2), (20e-6, 0.95))),))


def test_allreduce_takes_the_faster_line_of_its_gpu_count() -> None:
    from hardware import kernels

    link = 450e9
    for nbytes in (64e3, 1e6, 16e6, 128e6):
        x = 2 * 7 / 8 * nbytes / link
        want = min(4e-6 + x / 0.2, 20e-6 + x / 0.95)
        assert kernels.allreduce_s(AR8, nbytes=nbytes, gpus=8, link_Bps=link) == pytest.approx(want, rel=1e-12)
    # which line wins: the small-message one at 64 kB, the large-message one at 128 MB
    assert kernels.allreduce_s(AR8, nbytes=64e3, gpus=8, link_Bps=link) == \
        pytest.approx(4e-6 + 2 * 7 / 8 * 64e3 / link / 0.2, rel=1e-12)
    assert kernels.allreduce_s(AR8, nbytes=128e6, gpus=8, link_Bps=link) == \
        pytest.approx(20e-6 + 2 * 7 / 8 * 128e6 / link / 0.95, rel=1e-12)
    # a count without lines, and 8 GPUs across nodes, take the pooled line; eager adds the setup
    x2 = 2 * 1 / 2 * 1e6 / link
    assert kernels.allreduce_s(AR8, nbytes=1e6, gpus=2, link_Bps=link) == pytest.approx(6e-6 + x2 / 0.9, rel=1e-12)
    x8 = 2 * 7 / 8 * 1e6 / 50e9
    assert kernels.allreduce_s(AR8, nbytes=1e6, gpus=8, link_Bps=50e9, scale_up=False) == \
        pytest.approx(6e-6 + x8 / 0.9, rel=1e-12)
    # given the node size, a group across nodes takes NCCL's latency (2 nodes of 4: 6.8 + 2 x (3 x 0.6 + 5) us)
    assert kernels.allreduce_s(AR8, nbytes=1e6, gpus=8, link_Bps=50e9, scale_up=False, per_node=4) == \
        pytest.approx(20.4e-6 + x8 / 0.9, rel=1e-12)
    assert kernels.allreduce_s(AR8, nbytes=1e6, gpus=8, link_Bps=link, eager=True) == \
        pytest.approx(kernels.allreduce_s(AR8, nbytes=1e6, gpus=8, link_Bps=link) + 20e-6, rel=1e-12)
    assert kernels.allreduce_s(AR8, nbytes=1e6, gpus=1, link_Bps=link) == 0.0


def test_tp_allreduce_uses_the_gpu_counts_lines_inside_nvlink_and_the_pooled_line_across_nodes() -> None:
    cal = attrs.evolve(CAL, allreduce=AR8)
    msg = 514 * H * 2
    # TP 8 inside the H100's NVLink domain: Llama-3.1-8B's two all-reduces per layer on the 8-GPU lines
    cost = CostModel(dep(8), calibration=cal).step_cost(SHAPE)
    x = 2 * 7 / 8 * msg / 450e9
    assert cost.terms["tp_allreduce"] == pytest.approx(2 * L * min(4e-6 + x / 0.2, 20e-6 + x / 0.95), rel=1e-12)
    # TP 16 spans two nodes: the ring's 8 rails of 50 GB/s (400 GB/s, below NVLink's 450), the pooled
    # efficiency and NCCL's tree latency for 2 x 8 ranks, 6.8 + 2 x (7 x 0.6 + 1 x 5.0) = 25.2 us
    d16 = attrs.evolve(dep(8), tp=16)
    cost16 = CostModel(d16, calibration=cal).step_cost(SHAPE)
    x16 = 2 * 15 / 16 * msg / 400e9
    assert cost16.terms["tp_allreduce"] == pytest.approx(2 * L * (25.2e-6 + x16 / 0.9), rel=1e-12)


def test_the_experts_all_reduce_prices_its_own_group_across_nodes() -> None:
    """TP 8 with attention DP 2 and no EP: the routed experts' all-reduce runs over moe_tp = 16 GPUs, two
    H100 nodes, so it takes the NIC and NCCL's latency while the attention's all-reduce over 8 stays on
    NVLink with the pooled line (it used to be priced as if the 16 GPUs shared one NVLink domain)."""
    from hardware import kernels

    ledger = moe_ledger("h100_sxm", "Qwen/Qwen3-30B-A3B", CAL, "default", tp=8, attn_dp=2, ep=1,
                        weight_dtype="bf16", kv_dtype="bf16")
    assert ledger.dep.moe_tp == 16
    nvl = ledger.dep.gpu.scaleup_bw_Bps
    rails = 8 * ledger.dep.gpu.nic_bw_Bps    # 8 ranks a node, each on its own 50 GB/s NIC: 400 GB/s
    assert ledger._allreduce_s(1e6, 16) == pytest.approx(25.2e-6 + 2 * 15 / 16 * 1e6 / rails / 0.9, rel=1e-12)
    assert ledger._allreduce_s(1e6, 8) == pytest.approx(6e-6 + 2 * 7 / 8 * 1e6 / nvl / 0.9, rel=1e-12)
    assert ledger._allreduce_s(1e6, 16) == kernels.allreduce_s(CAL.allreduce, nbytes=1e6, gpus=16,
                                                               link_Bps=rails, scale_up=False, per_node=8)


def test_internode_ring_runs_on_every_ranks_nic_up_to_nvlink() -> None:
    """Across nodes the ring's bandwidth is ranks-per-node x one GPU's NIC, capped by the NVLink hops."""
    from hardware.kernels import internode_ring_Bps

    assert internode_ring_Bps(16, 8, 450e9, 50e9) == 400e9     # 2 x 8 H100: 8 rails of 400 Gb/s
    assert internode_ring_Bps(32, 8, 450e9, 50e9) == 400e9     # 4 nodes: still 8 ranks a node
    assert internode_ring_Bps(16, 8, 300e9, 50e9) == 300e9     # NVLink slower than the rails: NVLink
    assert internode_ring_Bps(12, 8, 450e9, 50e9) == 300e9     # 12 ranks on 2 nodes: 6 a node
    assert internode_ring_Bps(2, 1, 64e9, 50e9) == 50e9        # one GPU a node: its one NIC
    with pytest.raises(ValueError, match="fit one node"):
        internode_ring_Bps(8, 8, 450e9, 50e9)


def test_internode_allreduce_latency_is_nccls_tree_or_ring_by_hand() -> None:
    """NCCL's LL latencies (tuning.cc): tree 6.8 + 2 x ((ppn - 1) x 0.6 + log2(nodes) x 5.0) us, ring 6.6 +
    (2 (g - 1) - 2 nodes) x max(0.6, 1.0) + 2 nodes x 2.7 us; the faster is taken."""
    from hardware.kernels import internode_allreduce_alpha_s

    assert internode_allreduce_alpha_s(16, 8) == pytest.approx(25.2e-6, rel=1e-12)   # ring: 43.4 us
    assert internode_allreduce_alpha_s(32, 8) == pytest.approx(35.2e-6, rel=1e-12)   # 4 nodes; ring 82.2 us
    assert internode_allreduce_alpha_s(2, 1) == pytest.approx(15.4e-6, rel=1e-12)    # one GPU a node: ring
    assert internode_allreduce_alpha_s(12, 8) == pytest.approx(6.8e-6 + 2 * (5 * 0.6e-6 + 5.0e-6), rel=1e-12)
    with pytest.raises(ValueError, match="8 GPUs fit one node of 8"):
        internode_allreduce_alpha_s(8, 8)


def test_allreduce_lines_load_from_yaml_and_the_fit_recovers_known_lines() -> None:
    import numpy as np

    from hardware.calibrate import fit_allreduce_lines
    from hardware.calibration import _coll

    coll = _coll({"alpha_s": 5e-6, "bw_eff": 0.6, "by_gpus": {8: [[4e-6, 0.2], [2e-5, 0.95]], 2: [[3e-6, 0.5]]}})
    assert coll.lines(8) == ((4e-6, 0.2), (2e-5, 0.95)) and coll.lines(2) == ((3e-6, 0.5),)
    assert coll.lines(4) == ((5e-6, 0.6),) and coll.lines(8, scale_up=False) == ((5e-6, 0.6),)
    # rows timed from two known lines on 8 H200s, message sizes as the opdb tables step them
    sizes = [128 * 2 ** i for i in range(23)]
    link = 450e9  # H200 SXM NVLink
    rows = [{"num_gpus": "8", "message_size": str(n), "_gpu": "h200_sxm",
             "latency": str(1e3 * min(4e-6 + 1.75 * 2 * n / link / 0.2, 2e-5 + 1.75 * 2 * n / link / 0.95))}
            for n in sizes]
    lines, err = fit_allreduce_lines(rows)
    assert float(np.max(np.abs(err))) < 1e-3
    (a1, e1), (a2, e2) = lines
    assert (a1, e1, a2, e2) == pytest.approx((4e-6, 0.2, 2e-5, 0.95), rel=0.02)


def test_gqa_curves_are_fitted_on_the_ratios_the_shipped_models_have() -> None:
    """The GQA attention curves are fitted on rows with 2-16 query heads per KV head. No grouped-query model
    shipped in hardware/data/models has fewer than 2 (MHA rows run other kernels; MLA has its own tables);
    the wider groups some have (DeepSeek-V4 64-128, Nemotron-3 Ultra 32) extrapolate the curve, as before."""
    import json

    from hardware._data import DATA_DIR
    from hardware.calibrate import GQA_RATIOS, gqa_ratio_fitted

    def row(heads: int, kv: int) -> dict[str, str]:
        return {"num_heads": str(heads), "num_key_value_heads": str(kv)}

    assert [gqa_ratio_fitted(row(h, kv)) for h, kv in ((8, 8), (16, 8), (64, 8), (128, 8), (136, 8))] == \
        [False, True, True, True, False]
    for path in sorted((DATA_DIR / "models").glob("*.json")):
        if path.name.endswith(".hf_quant_config.json"):
            continue
        cfg = json.loads(path.read_text())
        cfg = cfg.get("text_config", cfg)
        heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
        if not heads or not kv or cfg.get("kv_lora_rank"):
            continue
        assert heads >= GQA_RATIOS[0] * kv, path.name


def test_power_law_load_moves_smoothly_with_the_token_count() -> None:
    """Common random numbers: neighbouring token counts route the same draws, so one token more changes the
    busiest rank's load by about a token's share, not by a fresh sample (DeepSeek-V3, EP 8: 2,948 -> 2,949
    tokens used to drop the routed-expert cost by 5 %)."""
    from hardware import kernels

    loads = [kernels.power_law_load(t, 8, 256, 8) for t in range(2940, 2960)]
    for a, b in zip(loads, loads[1:]):
        assert b[1] - a[1] == pytest.approx(1.0)  # mean rank: 8 more pairs over 8 ranks
        assert -0.5 < b[3] - a[3] < 3.0 and -0.5 < b[2] - a[2] < 0.5


def test_tiled_gemm_runs_at_the_rate_of_its_padded_rows() -> None:
    """128-row tiles, m_half 16: one row computes a whole tile, at the rate of 128 rows, 128 / (128 + 16) of
    the plateau, so it costs exactly what 128 rows cost; the rate used to be read at the one row asked for
    (1 / 17 of the plateau on top of the padding: 2,100 x the ideal time at vLLM's block-FP8 constants), so a
    GEMM with fewer rows cost more (found by fuzzing: a 1-request decode of Qwen3-32B-FP8 at 106 ms)."""
    from hardware import kernels
    from hardware.calibration import calibration_for_engine

    roof = Roofline(compute_eff=0.5, m_half=16.0, mem_eff=1.0, m_tile=128)
    n = k = 1024
    want = 2 * 128 * n * k / (1e15 * 0.5 * 128 / 144)
    assert roof.time_s(2 * 1 * n * k, 0.0, 1, 1e15, 1e12) == pytest.approx(want, rel=1e-12)
    assert roof.time_s(2 * 128 * n * k, 0.0, 128, 1e15, 1e12) == pytest.approx(want, rel=1e-12)
    fp8_block = calibration_for_engine("vllm").gemm_for("fp8_block")
    times = [kernels.gemm_s(fp8_block, m, 51200, 5120, 1.0, 1979e12, 3.35e12) for m in range(1, 300)]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(times, times[1:]))  # (equal within a tile: rounding)
    nbytes = 51200 * 5120 + (51200 + 5120) * 2.0  # FP8 weights, BF16 activations in and out
    memory = nbytes / (3.35e12 * fp8_block.mem_eff * nbytes / (nbytes + fp8_block.bytes_half))
    assert times[0] == pytest.approx(memory + fp8_block.floor_s + fp8_block.m_cost_s, rel=1e-12)  # memory-bound


def test_row_tiles_follow_the_kernel_dispatch_by_batch_size() -> None:
    """vLLM's Hopper FP8 GEMM dispatch as row tiles: 16 rows up to m = 16; 16 up to 64 where n <= 1280, else
    64; 64 up to 128; then 256 (128-row tiles in 2 x 1 clusters). Padded rows / rows, by hand: m = 1 pads to
    16, 16 is whole, 17 pads to 64 at n = 8192 but to 32 at n = 1280 (and at unknown n, 64: an n bound holds
    only for a known n), 100 to 128, 129 to 256, 300 to 512; the fit's vectorised padding agrees row by row."""
    import numpy as np

    from hardware.calibrate import GEMM_ROW_TILES, tile_pad_np
    from hardware.calibration import row_tiles

    tiles = GEMM_ROW_TILES["vllm"]["fp8"]
    assert tiles == ((16, 0, 16), (64, 1280, 16), (64, 0, 64), (128, 0, 64), (0, 0, 256))
    roof = Roofline(compute_eff=0.5, mem_eff=1.0, m_tile=128, row_tiles=tiles)   # row_tiles win over m_tile
    assert [roof.tile_factor(m, 8192) for m in (1, 16, 17, 64, 100, 128, 129, 256, 300)] == \
        [16.0, 1.0, 64 / 17, 1.0, 128 / 100, 1.0, 256 / 129, 1.0, 512 / 300]
    assert roof.tile_factor(17, 1280) == 32 / 17 and roof.tile_factor(17, 1281) == roof.tile_factor(17) == 64 / 17
    m = np.arange(1, 2049, dtype=float)
    for n in (1024.0, 1280.0, 1281.0, 8192.0):
        assert np.allclose(tile_pad_np(m, 1, tiles, np.full(m.shape, n)), [roof.tile_factor(x, n) for x in m],
                           rtol=0, atol=1e-15)
    assert np.allclose(tile_pad_np(m, 1, tiles), [roof.tile_factor(x) for x in m], rtol=0, atol=1e-15)
    assert row_tiles([[16, 0, 16], [0, 0, 256]]) == ((16, 0, 16), (0, 0, 256)) and row_tiles([]) == ()
    # a curve built in code without the closing entry falls back to m_tile where no entry holds
    assert Roofline(compute_eff=0.5, mem_eff=1.0, m_tile=8, row_tiles=((16, 0, 16),)).tile_factor(20) == 24 / 20
    for bad in ([[16, 0, 16], [64, 0, 64]], [[64, 0, 64], [16, 0, 16], [0, 0, 1]], [[16, 0, 0], [0, 0, 256]],
                [[16, -1, 16], [0, 0, 256]]):
        with pytest.raises(ValueError, match=r"row_tiles .*: expected \[largest m, largest n, tile rows\]"):
            row_tiles(bad)
    from hardware.calibration import calibration_from_dict, read_yaml, CALIBRATION_DIR

    raw = read_yaml(CALIBRATION_DIR / "vllm.yaml")
    raw["gemm"]["fp8"] = {**raw["gemm"]["fp8"], "row_tiles": [[16, 0, 16], [64, 0, 64]]}
    with pytest.raises(ValueError, match=r"^calibration vllm.yaml gemm.fp8: row_tiles \[\[16, 0, 16\]"):
        calibration_from_dict("vllm", raw)


def test_vllm_fp8_gemm_is_memory_bound_at_decode_sizes_and_never_cheaper_for_more_rows() -> None:
    """The shipped vLLM FP8 curve (row tiles of its dispatch): a Llama-3.1-70B MLP up-projection at TP 8
    (7168 x 8192) costs its weight stream at m = 1 (memory side + floor + one row's cost), and a larger
    batch never costs less than a smaller one, also across the tile boundaries 16 / 17, 64 / 65, 128 / 129."""
    from hardware import kernels
    from hardware.calibration import calibration_for_engine

    fp8 = calibration_for_engine("vllm").gemm_for("fp8")
    assert fp8.row_tiles
    times = [kernels.gemm_s(fp8, m, 7168, 8192, 1.0, 1979e12, 3.35e12) for m in range(1, 600)]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(times, times[1:]))
    nbytes = 7168 * 8192 + (7168 + 8192) * 2.0
    memory = nbytes / (3.35e12 * fp8.mem_eff * nbytes / (nbytes + fp8.bytes_half))
    assert times[0] == pytest.approx(memory + fp8.floor_s + fp8.m_cost_s, rel=1e-12)


def test_a_prefill_chunk_on_a_long_context_is_priced_at_the_rows_of_its_work() -> None:
    """Prefill attention's rate is read at max(query tokens, sqrt(2 pairs)): a fresh prompt of L tokens
    (L (L + 1) / 2 pairs) is read at its L tokens, within half a token; a 64-token chunk after 50,000 tokens
    of context scores the pairs of a 2,530-token prompt and is read there. Read at its 64 queries it cost
    53 ms on Llama-3.1-8B / H100, more than with a new 64-token prompt added beside it (found by fuzzing)."""
    from hardware import kernels

    for length in (1, 64, 1024, 8192):
        assert length <= kernels.prefill_rows(length, length * (length + 1) / 2) < length + 0.5
        assert kernels.prefill_rows(4 * length, 4 * length * (length + 1) / 2) == 4 * length  # a batch of 4
    chunk = 64 * 50_000 + 64 * 65 / 2
    assert kernels.prefill_rows(64, chunk) == pytest.approx(math.sqrt(2 * chunk))
    roof = Roofline(compute_eff=0.55, m_half=1027.0, mem_eff=0.35)
    common = dict(heads=32, kv_heads=8, head_dim=128, v_head_dim=128, kv_bytes=2.0, peak_flops=989e12, bw_Bps=3.35e12)
    alone = kernels.gqa_prefill_s(roof, tokens=64, sum_kv=50_064, pairs=chunk, **common)
    both = kernels.gqa_prefill_s(roof, tokens=128, sum_kv=50_128, pairs=chunk + 64 * 65 / 2, **common)
    assert both >= alone


def test_ep_imbalance_is_never_negative(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rank with the most pairs can touch fewer experts than the mean rank (Qwen3-30B-A3B, EP 2, 126
    tokens under the draws seeded by the token count: 60.16 against 60.33), and a memory-bound layer then
    priced it faster than the mean: ep_imbalance -18 us (found by fuzzing). The rank the layer waits for is
    never faster than the mean one: with such a load injected, the term is 0, not negative."""
    from hardware import kernels

    monkeypatch.setattr(kernels, "power_law_load", lambda tokens, topk, experts, ep: (60.33, 504.0, 60.16, 520.0))
    cm = CostModel(Deployment(gpu=load_gpu("h100_sxm"), model=load_model("Qwen/Qwen3-30B-A3B"),
                              engine=load_engine("vllm"), tp=2, ep=2))
    terms = cm.step_cost(BatchShape.from_requests([1] * 126, [1000] * 126)).terms
    assert terms["ep_imbalance"] == 0.0 and terms["moe_experts"] > 0


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("model_name, tp, weights", [("Qwen/Qwen3-0.6B", 1, "bf16"), ("meta-llama/Llama-3.1-8B", 1, "bf16"),
                                                     ("Qwen/Qwen3-32B", 2, "fp8"),
                                                     ("Qwen/Qwen3-235B-A22B-FP8", 4, "fp8_block"),
                                                     ("deepseek-ai/DeepSeek-V3", 8, "fp8_block")])
def test_no_step_costs_less_eager_than_replayed_in_a_graph(engine: str, model_name: str, tp: int,
                                                            weights: str) -> None:
    """With every engine's shipped constants: a step (pure decode, prefill or mixed) never costs less
    launched eagerly than replayed in graphs, whichever graph mode and capture size replay it, term by term
    for the GPU terms the two modes share."""
    d = Deployment(gpu=load_gpu("h200_sxm"), model=load_model(model_name), engine=load_engine(engine), tp=tp,
                   weight_dtype=weights)
    eager = CostModel(d, cuda_graph=False, max_num_seqs=256, max_num_batched_tokens=8192)
    graphed = [CostModel(d, graph_mode=mode, max_num_seqs=256, max_num_batched_tokens=8192, max_capture_size=cap)
               for mode in ("full_and_piecewise", "piecewise", "full_decode_only") for cap in (64, 512, 8192)]
    shapes = [BatchShape.from_requests([1] * n, [700 + 31 * i for i in range(n)]) for n in (1, 7, 64, 200)]
    shapes += [BatchShape.from_requests([m], [m]) for m in (1, 17, 511, 512, 513, 4000)]
    shapes += [BatchShape.from_requests([m] + [1] * n, [m + 100] + [900] * n) for m, n in ((60, 3), (480, 31), (2000, 64))]
    for s in shapes:
        e = eager.step_cost(s).terms
        for g in graphed:
            t = g.step_cost(s).terms
            assert g.step_time_ns(s) <= eager.step_time_ns(s), (g.graph_mode, g.max_capture, s)
            for term in ("qkv_proj", "o_proj", "mlp", "moe_experts", "moe_shared", "elementwise", "lm_head",
                         "attention", "ssm_scan"):
                assert t[term] <= e[term] * (1 + 1e-12), (term, g.graph_mode, g.max_capture, s)


def test_pipeline_stages_hand_their_activations_on_by_hand() -> None:
    """pp 2 on TP 2 (4 GPUs, one NVLink domain): one boundary, where every rank sends its peer the hidden
    states and the residual of the step's 514 tokens (2 x 514 x 4096 x 2 bytes), priced as one NCCL LL ring
    step over NVLink (6.6 + 0.6 us) plus the bytes at the all-reduce's pooled efficiency (0.9). Only
    pp_sendrecv differs from pp 1's ledger: every stage's layers still run one after another in the step.
    Launched eagerly, the send also pays a collective's setup (20 us here)."""
    one = CostModel(dep(tp=2), calibration=CAL).step_cost(SHAPE)
    two = CostModel(attrs.evolve(dep(tp=2), pp=2), calibration=CAL)
    assert two.pp_hops == (False,)
    nbytes = 2 * 514 * H * 2
    nvl = two.dep.gpu.scaleup_bw_Bps
    terms = two.step_cost(SHAPE).terms
    assert terms["pp_sendrecv"] == pytest.approx(7.2e-6 + nbytes / (nvl * 0.9), rel=1e-12)  # 28.0 us on H100
    assert one.terms["pp_sendrecv"] == 0.0
    assert {k: v for k, v in terms.items() if k != "pp_sendrecv"} == \
        {k: v for k, v in one.terms.items() if k != "pp_sendrecv"}
    off = CostModel(attrs.evolve(dep(tp=2), pp=2), calibration=CAL,
                    disabled_terms=frozenset({"pp_sendrecv"})).step_cost(SHAPE)
    assert off.total_s == pytest.approx(one.total_s, rel=1e-12)
    e1 = CostModel(dep(tp=2), calibration=CAL, cuda_graph=False).step_cost(SHAPE).terms
    e2 = CostModel(attrs.evolve(dep(tp=2), pp=2), calibration=CAL, cuda_graph=False).step_cost(SHAPE).terms
    assert e2["collective_setup"] == pytest.approx(e1["collective_setup"] + 20e-6, rel=1e-12)
    assert e2["pp_sendrecv"] == terms["pp_sendrecv"]


def test_pipeline_boundaries_cross_nodes_where_the_stages_do() -> None:
    """Stages placed in order on nodes of 8 GPUs: 4-GPU stages cross a node after every second stage, 8-GPU
    (or wider) stages at every boundary, 3-GPU stages wherever some rank's peer is on the next node; a
    crossing hop pays the network's latency (6.6 + 2.7 us) and the NIC."""
    from hardware.kernels import pipeline_hops, pipeline_sendrecv_s

    assert pipeline_hops(1, 8, 8) == ()
    assert pipeline_hops(4, 4, 8) == (False, True, False)
    assert pipeline_hops(3, 8, 8) == (True, True)
    assert pipeline_hops(4, 2, 8) == (False, False, False)
    assert pipeline_hops(3, 16, 8) == (True, True)
    assert pipeline_hops(3, 3, 8) == (False, True)   # GPUs 0-2 | 3-5 | 6-8: 5 -> 8 leaves the first node
    coll = Collective(alpha_s=1.0, bw_eff=0.5)   # alpha unused: hops take NCCL's latencies
    t = pipeline_sendrecv_s(coll, tokens=10, hidden=1000, hops=(False, True), scaleup_Bps=400e9, nic_Bps=50e9)
    nbytes = 2 * 10 * 1000 * 2
    assert t == pytest.approx(7.2e-6 + nbytes / 200e9 + 9.3e-6 + nbytes / 25e9, rel=1e-12)
    assert pipeline_sendrecv_s(coll, tokens=0, hidden=1000, hops=(True,), scaleup_Bps=1.0, nic_Bps=1.0) == 0.0


def _moe_only_calibration(curve: Roofline) -> Calibration:
    """A calibration whose every curve is GEMM but its fp4 MoE curve, ``curve``."""
    return Calibration(name="t", gemm={"bf16": GEMM}, attn_prefill=GEMM, attn_decode=GEMM, moe={"fp4": curve},
                       ssm=GEMM, elementwise=GEMM, allreduce=Collective(alpha_s=5e-6, bw_eff=0.7),
                       alltoall=Collective(alpha_s=5e-6, bw_eff=0.7))


def test_moe_serial_expert_term_by_hand() -> None:
    """Roofline.expert_s_per_byte adds one expert's weight bytes on the GPU at that rate to a routed-expert
    call, whatever the experts it touches: by hand at gpt-oss-120b's shape (2880 x 2880, 3 matrices, MXFP4),
    one token over 4 of 128 experts, TP 1 and with the experts sharded over moe_tp 4; a curve without it is
    the plain roofline. Not a floor: a replayed graph keeps it."""
    from hardware import kernels
    from hardware.dtypes import DTYPE_BYTES

    plain = Roofline(compute_eff=0.3, m_half=10.0, mem_eff=0.8, floor_s=25e-6, n_half=500.0)
    serial = attrs.evolve(plain, expert_s_per_byte=5e-12)
    fp4 = DTYPE_BYTES["fp4"]
    for inter in (2880, 2880 // 4):
        kw = dict(tokens=1, width=2880, inter=inter, topk=4, num_experts=128, ep=1, mats=3,
                  w_bytes_per_elem=fp4, peak_flops=989e12, bw_Bps=4.8e12, routing="balanced")
        extra = kernels.moe_s(serial, **kw) - kernels.moe_s(plain, **kw)
        assert extra == pytest.approx(5e-12 * 3 * 2880 * inter * fp4, rel=1e-9)
        assert kernels.moe_s(serial, **dict(kw, tokens=64)) - kernels.moe_s(plain, **dict(kw, tokens=64)) \
            == pytest.approx(extra, rel=1e-9)
    assert kernels.moe_s(serial, tokens=0, width=2880, inter=2880, topk=4, num_experts=128, ep=1, mats=3,
                         w_bytes_per_elem=fp4, peak_flops=989e12, bw_Bps=4.8e12) == 0.0
    graphed = _moe_only_calibration(serial).graph_mode(3e-6).moe["fp4"]
    assert graphed.expert_s_per_byte == 5e-12 and graphed.floor_s != serial.floor_s


def test_moe_serial_expert_term_in_the_ledger() -> None:
    """In a step, the serial term is paid once per MoE layer by the mean expert-parallel rank and by the
    busiest alike: moe_experts grows by layers x rate x one expert's bytes, ep_imbalance does not move, and
    no other term changes (gpt-oss-120b MXFP4, TP 2 x EP 2 on H200, 8 decodes)."""
    from hardware import calibration_for_engine, load_gpu, load_model

    cal = calibration_for_engine("trtllm")
    plain = attrs.evolve(cal, moe={**cal.moe, "fp4": attrs.evolve(cal.moe["fp4"], expert_s_per_byte=0.0)})
    rate = 4e-12
    serial = attrs.evolve(cal, moe={**cal.moe, "fp4": attrs.evolve(cal.moe["fp4"], expert_s_per_byte=rate)})
    model = load_model("openai/gpt-oss-120b")
    dep = Deployment(gpu=load_gpu("h200_sxm"), model=model, engine=load_engine("trtllm"), tp=2, ep=2)
    shape = BatchShape.from_requests([1] * 8, [1500] * 8)
    a = CostModel(dep, calibration=plain).step_cost(shape).terms
    b = CostModel(dep, calibration=serial).step_cost(shape).terms
    moe = [ffn for _mixer, ffn in model.layers if ffn is not None and ffn.kind == "moe"]
    ffn, moe_layers = moe[0], len(moe)
    inter = -(-ffn.intermediate_size // dep.moe_tp)
    expert_bytes = ffn.mats * model.hidden_size * inter * dep.weight_bytes_per_elem
    assert b["moe_experts"] - a["moe_experts"] == pytest.approx(moe_layers * rate * expert_bytes, rel=1e-9)
    assert b["ep_imbalance"] == pytest.approx(a["ep_imbalance"], rel=1e-9, abs=1e-15)
    assert {k: v for k, v in a.items() if k not in ("moe_experts", "ep_imbalance")} == \
        {k: v for k, v in b.items() if k not in ("moe_experts", "ep_imbalance")}


def test_fit_moe_curve_keeps_the_serial_term_only_where_it_fits() -> None:
    """hardware.calibrate.fit_moe_curve: rows made by a curve with a serial expert term give that term back
    (within 5 %) and a better fit than the plain roofline; rows made by a plain curve keep the plain fit,
    with no expert_s_per_byte written."""
    import numpy as np

    from hardware.calibrate import fit_moe_curve, fit_roofline, roof_np

    rng = np.random.default_rng(11)
    n = 120
    inter = rng.choice([360.0, 720.0, 1440.0, 2880.0], n)
    width = np.full(n, 2880.0)
    touched = rng.choice([1.0, 4.0, 16.0, 64.0, 128.0], n)
    m = rng.uniform(1, 64, n)
    pairs = touched * m
    fl = 2 * pairs * 3 * width * inter
    nb = touched * 3 * width * inter * 0.53 + pairs * (2 * width + 3 * inter) * 2
    eb = 3 * width * inter * 0.53
    peak, bw = np.full(n, 989e12), np.full(n, 4.8e12)
    p = np.array([0.3, 10.0, 0.7, 0.0, 20e-6, 500.0])
    start = {"compute_eff": 0.4, "mem_eff": 0.6, "floor_s": 1e-5}
    planted = roof_np(p, fl, nb, m, peak, bw, nk=(inter, None)) + 5e-12 * eb
    fit, err = fit_moe_curve(fl, nb, m, peak, bw, planted, start, eb, nk=(inter, None))
    assert fit["expert_s_per_byte"] == pytest.approx(5e-12, rel=0.05)
    _, plain_err = fit_roofline(fl, nb, m, peak, bw, planted, start, nk=(inter, None))
    assert float(np.median(np.abs(err))) < float(np.median(np.abs(plain_err)))
    plain_rows = roof_np(p, fl, nb, m, peak, bw, nk=(inter, None))
    fit, err = fit_moe_curve(fl, nb, m, peak, bw, plain_rows, start, eb, nk=(inter, None))
    assert "expert_s_per_byte" not in fit
    assert fit == fit_roofline(fl, nb, m, peak, bw, plain_rows, start, nk=(inter, None))[0]


def test_moe_token_passes_by_hand() -> None:
    """Roofline.token_passes adds that many passes over the routed copies of the call's tokens (tokens x
    top-k x hidden x 2 B of BF16 activations) at HBM bandwidth, however the experts are sharded: by hand at
    the Marlin table's shape (hidden 3584, inter 3072, top 16 of 896), 8,192 tokens, unsharded, over moe_tp
    8 and over ep 8 (the same extra each time: 3 x 8192 x 16 x 3584 x 2 B / 4.8 TB/s = 587.2 us); a
    replayed graph keeps it; a curve without it is the plain roofline, and a YAML curve reads it."""
    from hardware import kernels
    from hardware.calibration import _roof

    plain = Roofline(compute_eff=0.14, m_half=25.0, mem_eff=0.95, floor_s=79e-6)
    passes = attrs.evolve(plain, token_passes=3.0)
    for inter, ep in ((3072, 1), (3072 // 8, 1), (3072, 8)):
        kw = dict(tokens=8192, width=3584, inter=inter, topk=16, num_experts=896, ep=ep, mats=3,
                  w_bytes_per_elem=0.53125, peak_flops=989e12, bw_Bps=4.8e12, routing="balanced")
        assert kernels.moe_s(passes, **kw) - kernels.moe_s(plain, **kw) == pytest.approx(587.2e-6, rel=1e-4)
    assert kernels.moe_s(passes, tokens=0, width=3584, inter=3072, topk=16, num_experts=896, ep=1, mats=3,
                         w_bytes_per_elem=0.53125, peak_flops=989e12, bw_Bps=4.8e12) == 0.0
    assert _moe_only_calibration(passes).graph_mode(3e-6).moe["fp4"].token_passes == 3.0
    assert _roof({"mem_eff": 0.9, "token_passes": 1.5}).token_passes == 1.5
    assert _roof({"mem_eff": 0.9}).token_passes == 0.0


def test_moe_per_token_term_by_hand() -> None:
    """Roofline.token_s adds that time per token entering a routed-expert call, whatever its top-k, width or
    sharding (8,192 tokens x 270 ns = 2.2118 ms at the Marlin table's shape, unsharded and over ep 8), and
    adds to the token passes; a replayed graph keeps it and a YAML curve reads it."""
    from hardware import kernels
    from hardware.calibration import _roof

    plain = Roofline(compute_eff=0.14, m_half=25.0, mem_eff=0.95, floor_s=79e-6)
    per_token = attrs.evolve(plain, token_s=270e-9)
    both = attrs.evolve(per_token, token_passes=3.0)
    for ep in (1, 8):
        kw = dict(tokens=8192, width=3584, inter=3072, topk=16, num_experts=896, ep=ep, mats=3,
                  w_bytes_per_elem=0.53125, peak_flops=989e12, bw_Bps=4.8e12, routing="balanced")
        assert kernels.moe_s(per_token, **kw) - kernels.moe_s(plain, **kw) == pytest.approx(2.21184e-3, rel=1e-9)
        assert kernels.moe_s(both, **kw) - kernels.moe_s(plain, **kw) == pytest.approx(2.21184e-3 + 587.2e-6,
                                                                                          rel=1e-4)
    assert _moe_only_calibration(per_token).graph_mode(3e-6).moe["fp4"].token_s == 270e-9
    assert _roof({"mem_eff": 0.9, "token_s": 3e-8}).token_s == 3e-8
    assert _roof({"mem_eff": 0.9}).token_s == 0.0


def test_moe_token_passes_in_the_ledger() -> None:
    """In a step, the token traffic is paid once per MoE layer for every token the layer sees, by the mean
    expert-parallel rank and the busiest alike: moe_experts grows by layers x passes x tokens x top-k x
    hidden x 2 B / HBM bandwidth, nothing else moves (gpt-oss-120b MXFP4, TP 2 x EP 2 on H200, 8 decodes
    in a replayed graph)."""
    from hardware import calibration_for_engine, load_gpu, load_model

    cal = calibration_for_engine("trtllm")
    plain = attrs.evolve(cal, moe={**cal.moe, "fp4": attrs.evolve(cal.moe["fp4"], token_passes=0.0)})
    passes = attrs.evolve(cal, moe={**cal.moe, "fp4": attrs.evolve(cal.moe["fp4"], token_passes=2.0)})
    model = load_model("openai/gpt-oss-120b")
    gpu = load_gpu("h200_sxm")
    dep = Deployment(gpu=gpu, model=model, engine=load_engine("trtllm"), tp=2, ep=2)
    shape = BatchShape.from_requests([1] * 8, [1500] * 8)
    a = CostModel(dep, calibration=plain).step_cost(shape).terms
    b = CostModel(dep, calibration=passes).step_cost(shape).terms
    moe = [ffn for _mixer, ffn in model.layers if ffn is not None and ffn.kind == "moe"]
    one_pass = 8 * moe[0].experts_per_token * model.hidden_size * 2 / gpu.hbm_bw_Bps
    assert b["moe_experts"] - a["moe_experts"] == pytest.approx(len(moe) * 2.0 * one_pass, rel=1e-9)
    assert b["ep_imbalance"] == pytest.approx(a["ep_imbalance"], rel=1e-9, abs=1e-15)
    assert {k: v for k, v in a.items() if k not in ("moe_experts", "ep_imbalance")} == \
        {k: v for k, v in b.items() if k not in ("moe_experts", "ep_imbalance")}


def test_fit_moe_curve_adds_the_token_passes_where_they_fit() -> None:
    """fit_moe_curve given each row's pass over its routed token copies: rows made by a curve with 1.5
    passes (the same tokens sharded over 1-16 ranks by moe_tp or by ep, as the opdb tables time them) give
    1.5 passes back within 5 % and no serial expert term; the plain rows keep the plain fit, neither extra
    term written. calibrate.moe_pass_s prices a table row's pass as kernels.moe_s does."""
    import numpy as np

    from hardware.calibrate import fit_moe_curve, fit_roofline, moe_pass_s, roof_np

    rng = np.random.default_rng(12)
    n = 160
    tokens = rng.choice([64.0, 512.0, 2048.0, 8192.0], n)
    shards = rng.choice([1.0, 2.0, 4.0, 8.0, 16.0], n)
    by_ep = rng.random(n) < 0.5
    inter = np.where(by_ep, 3072.0, 3072.0 / shards)
    width = np.full(n, 3584.0)
    touched = np.where(by_ep, 896.0 / shards, 896.0)
    pairs = tokens * 16 / np.where(by_ep, shards, 1.0)
    m = pairs / touched
    fl = 2 * pairs * 3 * width * inter
    nb = touched * 3 * width * inter * 0.53 + pairs * (2 * width + 3 * inter) * 2
    eb = 3 * width * inter * 0.53
    peak, bw = np.full(n, 989e12), np.full(n, 4.8e12)
    rows = [{"num_tokens": str(t), "topk": "16", "hidden_size": "3584"} for t in tokens]
    pass_s = moe_pass_s(rows, bw)
    assert pass_s == pytest.approx(tokens * 16 * 3584 * 2 / 4.8e12, rel=1e-12)
    p = np.array([0.15, 25.0, 0.9, 0.0, 80e-6, 50.0])
    start = {"compute_eff": 0.4, "mem_eff": 0.6, "floor_s": 1e-5}
    plain_rows = roof_np(p, fl, nb, m, peak, bw, nk=(inter, None))
    planted = plain_rows + 1.5 * pass_s
    fit, err = fit_moe_curve(fl, nb, m, peak, bw, planted, start, eb, nk=(inter, None), pass_s=pass_s)
    assert fit["token_passes"] == pytest.approx(1.5, rel=0.05)
    assert "expert_s_per_byte" not in fit
    assert float(np.max(np.abs(err))) < 0.01
    fit, err = fit_moe_curve(fl, nb, m, peak, bw, plain_rows, start, eb, nk=(inter, None), pass_s=pass_s)
    assert "token_passes" not in fit and "expert_s_per_byte" not in fit
    assert fit == fit_roofline(fl, nb, m, peak, bw, plain_rows, start, nk=(inter, None))[0]


def test_fit_moe_curve_tells_a_per_token_cost_from_token_traffic() -> None:
    """Offered both, fit_moe_curve keeps the extra term the table shows: over two shapes (top 16 x hidden
    3584 and top 4 x hidden 2880, 4.98 x apart in routed bytes per token), rows with a flat 250 ns per token
    give token_s back (within 5 %) and no token_passes; rows with 10 passes over the routed copies give
    token_passes back and no token_s (each row with 2 % of measurement noise: on exact rows a fit's cost is
    all but zero, and any second term lowers it by more than a tenth)."""
    import numpy as np

    from hardware.calibrate import fit_moe_curve, roof_np

    rng = np.random.default_rng(13)
    n = 200
    tokens = rng.choice([64.0, 512.0, 2048.0, 8192.0], n)
    wide = rng.random(n) < 0.5
    topk, width = np.where(wide, 16.0, 4.0), np.where(wide, 3584.0, 2880.0)
    experts = np.where(wide, 896.0, 128.0)
    inter = 3072.0 / rng.choice([1.0, 2.0, 4.0, 8.0], n)
    pairs = tokens * topk
    touched = np.minimum(experts, pairs)
    m = pairs / touched
    fl = 2 * pairs * 3 * width * inter
    nb = touched * 3 * width * inter * 0.53 + pairs * (2 * width + 3 * inter) * 2
    eb = 3 * width * inter * 0.53
    peak, bw = np.full(n, 989e12), np.full(n, 4.8e12)
    pass_s = tokens * topk * width * 2 / bw
    p = np.array([0.15, 25.0, 0.9, 0.0, 80e-6, 50.0])
    start = {"compute_eff": 0.4, "mem_eff": 0.6, "floor_s": 1e-5}
    plain_rows = roof_np(p, fl, nb, m, peak, bw, nk=(inter, None)) * np.exp(rng.normal(0.0, 0.02, n))
    fit, _ = fit_moe_curve(fl, nb, m, peak, bw, plain_rows + 250e-9 * tokens, start, eb, nk=(inter, None),
                           tokens=tokens, pass_s=pass_s)
    assert fit["token_s"] == pytest.approx(250e-9, rel=0.05) and "token_passes" not in fit
    fit, _ = fit_moe_curve(fl, nb, m, peak, bw, plain_rows + 10.0 * pass_s, start, eb, nk=(inter, None),
                           tokens=tokens, pass_s=pass_s)
    assert fit["token_passes"] == pytest.approx(10.0, rel=0.05) and "token_s" not in fit


def test_calibrate_only_refits_one_named_curve() -> None:
    """``--only moe.fp4``: that curve and its note refitted, the group's other curves, every other block and
    their notes as shipped; a curve name the fit does not have is refused with the names it has."""
    from hardware._data import read_yaml
    from hardware.calibrate import keep_shipped
    from hardware.calibration import CALIBRATION_DIR

    shipped = read_yaml(CALIBRATION_DIR / "trtllm.yaml")
    fitted = {k: v for k, v in shipped.items() if k != "provenance"}
    fitted["moe"] = {key: {"compute_eff": 0.2, "mem_eff": 0.2} for key in shipped["moe"]}
    fitted["gemm"] = {"bf16": {"compute_eff": 0.1, "mem_eff": 0.1}}
    notes = {"moe.fp4": "new fp4 note", "moe.bf16": "new bf16 note", "gemm.bf16": "refitted"}
    data, kept_notes = keep_shipped("trtllm", fitted, notes, {"moe.fp4"})
    assert data["moe"]["fp4"] == fitted["moe"]["fp4"]
    assert {k: v for k, v in data["moe"].items() if k != "fp4"} == \
        {k: v for k, v in shipped["moe"].items() if k != "fp4"}
    assert data["gemm"] == shipped["gemm"] and data["attention_decode"] == shipped["attention_decode"]
    text = (CALIBRATION_DIR / "trtllm.yaml").read_text()
    assert kept_notes["moe.fp4"] == "new fp4 note"
    assert kept_notes["moe.bf16"] != "new bf16 note" and kept_notes["moe.bf16"] in text
    with pytest.raises(SystemExit, match="--only: no block moe.fp5; blocks: .*moe.fp4"):
        keep_shipped("trtllm", fitted, notes, {"moe.fp5"})


def test_fp8_weights_without_fp8_tensor_cores_run_weight_only() -> None:
    """On a GPU without FP8 tensor cores (A100) FP8 weights are priced as vLLM and SGLang run them, weight-only:
    the GEMMs on the BF16 curve at the BF16 peak, the experts on the engine's weight-only curve, both streaming
    one byte per weight; the FP8 curves are not read. On an H100 they are, at its FP8 peak."""
    fp8 = Roofline(compute_eff=0.3, mem_eff=0.5, floor_s=20e-6)
    wo = Roofline(compute_eff=0.6, mem_eff=0.6, floor_s=9e-6)
    cal = attrs.evolve(CAL, gemm={"bf16": GEMM, "fp8": fp8}, moe={"bf16": GEMM, "fp8": fp8, "int4": wo})
    M = 514

    def qkv(gpu: str) -> tuple[Deployment, float]:
        d = Deployment(gpu=load_gpu(gpu), model=load_model("meta-llama/Llama-3.1-8B"), engine=SERIAL,
                       weight_dtype="fp8", kv_dtype="bf16")
        return d, CostModel(d, calibration=cal).step_cost(SHAPE).terms["qkv_proj"]

    a100, t = qkv("a100_sxm")
    assert a100.weight_only and a100.curve_dtype == "int4"
    peak, bw = 312e12, 2.039e12   # A100 SXM4 80 GB: BF16 dense, HBM2e
    flops, nbytes = 2 * M * H * 6144, H * 6144 * 1 + M * (H + 6144) * 2
    assert t == pytest.approx(L * (max(flops / (peak * 0.8), nbytes / (bw * 0.75)) + 7e-6), rel=1e-12)
    h100, t = qkv("h100_sxm")
    assert not h100.weight_only and h100.curve_dtype == "fp8"
    peak8 = load_gpu("h100_sxm").flops_for("fp8")
    assert t == pytest.approx(L * (max(flops / (peak8 * 0.3), nbytes / (HBM * 0.5)) + 20e-6), rel=1e-12)

    def experts(gpu: str, c: Calibration) -> float:
        ledger = moe_ledger(gpu, "Qwen/Qwen3-30B-A3B", c, "default", weight_dtype="fp8", kv_dtype="bf16")
        return ledger.step_cost(SHAPE).terms["moe_experts"]

    no_fp8 = attrs.evolve(cal, moe={"bf16": GEMM, "int4": wo})
    no_wo = attrs.evolve(cal, moe={"bf16": GEMM, "fp8": fp8})
    assert experts("a100_sxm", cal) == experts("a100_sxm", no_fp8) != experts("a100_sxm", no_wo)
    assert experts("h100_sxm", cal) == experts("h100_sxm", no_wo) != experts("h100_sxm", no_fp8)


def test_weight_only_formats_by_gpu_and_engine() -> None:
    """FP4 on Hopper runs at the FP8 rate (not weight-only); FP8 and FP4 on Ampere run weight-only, which
    TensorRT-LLM has no kernels for: refused, naming the field."""
    def d(gpu: str, wdt: str, engine: str = "vllm") -> Deployment:
        return Deployment(gpu=load_gpu(gpu), model=load_model("meta-llama/Llama-3.1-8B"),
                          engine=load_engine(engine), weight_dtype=wdt)

    assert [d("h100_sxm", w).weight_only for w in ("bf16", "fp8", "fp8_block", "fp4", "int4")] == [False] * 5
    assert [d("a100_sxm", w).weight_only for w in ("bf16", "fp8", "fp8_block", "fp4", "int4")] == \
        [False, True, True, True, False]
    assert d("a100_sxm", "fp8", "sglang").curve_dtype == "int4"
    for wdt in ("fp8", "fp4"):
        with pytest.raises(DeploymentError, match=rf"engine 'trtllm' runs {wdt} weights on FP8 / FP4 tensor "
                                                  r"cores \(Ada, Hopper or newer\), which a100_sxm does not have") as exc:
            d("a100_sxm", wdt, "trtllm")
        assert exc.value.field == "weight_dtype"
    assert d("h100_sxm", "fp4", "trtllm").curve_dtype == "fp4"
    assert d("a100_sxm", "bf16", "trtllm").curve_dtype == "bf16"


def minimax(tp: int, across_heads: bool | None = None) -> CostModel:
    """MiniMax-M2.5 on an H100 under the hand-checkable calibration; ``across_heads`` overrides the model's
    q / k norm span (None: as its config says)."""
    model = load_model("MiniMaxAI/MiniMax-M2.5")
    if across_heads is not None:
        model = attrs.evolve(model, layers=tuple((attrs.evolve(mx, qk_norm_across_heads=across_heads), ffn)
                                                 for mx, ffn in model.layers))
    d = Deployment(gpu=load_gpu("h100_sxm"), model=model, engine=SERIAL, tp=tp, weight_dtype="bf16",
                   kv_dtype="bf16")
    return CostModel(d, calibration=CAL)


def test_a_norm_over_all_heads_adds_one_small_allreduce_and_one_pass_per_layer_under_tp() -> None:
    # MiniMax-M2 (qk_norm_type: per_layer): 62 layers, 48 query and 8 KV heads of 128, on 2 ranks 24 + 4
    assert load_model("MiniMaxAI/MiniMax-M2.5").layers[0][0].qk_norm_across_heads
    assert not load_model("meta-llama/Llama-3.1-8B").layers[0][0].qk_norm_across_heads
    shape = BatchShape.from_requests([1] * 8, [1000] * 8)
    with_norm, without = (minimax(2, flag).step_cost(shape).terms for flag in (True, False))
    allreduce = 6e-6 + 2 * (2 - 1) / 2 * (8 * 2 * 4) / (450e9 * 0.9)    # 8 tokens x 2 FP32 sums of squares
    # (a pure-decode step replays a CUDA graph: the kernel's floor is the engine's graph floor G)
    qk_pass = 8 * (24 + 4) * 128 * 2 / (load_gpu("h100_sxm").hbm_bw_Bps * 0.5) + G
    assert with_norm["tp_allreduce"] - without["tp_allreduce"] == pytest.approx(62 * allreduce, rel=1e-9)
    assert with_norm["elementwise"] - without["elementwise"] == pytest.approx(62 * qk_pass, rel=1e-9)
    assert {k for k in with_norm if with_norm[k] != without[k]} <= {"tp_allreduce", "elementwise",
                                                                     "kernel_launch"}
    # one rank holds every head: nothing to reduce
    assert minimax(1).step_cost(shape).terms == minimax(1, False).step_cost(shape).terms
