"""A MoE router's GEMM in float32 (MiniMax-M2) on the CUDA cores or the TF32 tensor cores, by hand."""

import attrs
import pytest

from hardware import BatchShape, CostModel, Deployment, load_engine, load_gpu, load_model
from hardware.deployment import DeploymentError
from hardware.gpu import derive_gpu
from hardware.kernels import gemm_s

MINIMAX = "MiniMaxAI/MiniMax-M2.5"   # 62 layers, hidden 3072, 256 experts, float32 router
QWEN_MOE = "Qwen/Qwen3-235B-A22B"     # a BF16 router


def _router(dep: Deployment):
    cm = CostModel(dep)
    (group,) = [g for g in cm.groups if g.ffn is not None and g.ffn.kind == "moe"]
    (router,) = [gm for gm in group.gemms if (gm.n, gm.k) == (group.ffn.num_experts, dep.model.hidden_size)]
    return cm, group, router


@pytest.mark.parametrize("precision, peak", [("highest", 67e12), ("high", 494.5e12)])
def test_a_float32_router_runs_on_the_units_its_matmul_precision_names(precision, peak):
    dep = Deployment(gpu=load_gpu("h200_sxm"), model=load_model(MINIMAX), engine=load_engine("vllm"), tp=4,
                     fp32_matmul=precision)
    cm, group, router = _router(dep)
    assert (group.count, router.n, router.k, router.w_bytes_per_elem, router.peak_flops) == (62, 256, 3072, 4.0, peak)
    bf16 = cm.cal.gemm_for("bf16")   # the BF16 curve's efficiencies (the eager curve differs in its floor only)
    assert router.term == "moe_experts" and attrs.evolve(router.roof, floor_s=bf16.floor_s) == bf16
    # 8,192 prompt tokens: the router's share of the step is 62 such GEMMs
    assert router.time_s(8192) == gemm_s(router.roof, 8192, 256, 3072, 4.0, peak, 4.8e12)


def test_the_router_precision_moves_the_moe_term_by_the_routers_alone():
    model, gpu, engine = load_model(MINIMAX), load_gpu("h200_sxm"), load_engine("vllm")
    shape = BatchShape.from_requests([8192], [8192])
    terms = {}
    for precision in ("highest", "high"):
        dep = Deployment(gpu=gpu, model=model, engine=engine, tp=4, fp32_matmul=precision)
        terms[precision] = CostModel(dep).step_cost(shape).terms
    _, _, slow = _router(Deployment(gpu=gpu, model=model, engine=engine, tp=4))
    _, _, fast = _router(Deployment(gpu=gpu, model=model, engine=engine, tp=4, fp32_matmul="high"))
    assert terms["highest"]["moe_experts"] - terms["high"]["moe_experts"] == pytest.approx(
        62 * (slow.time_s(8192) - fast.time_s(8192)), rel=1e-12)
    assert {k: v for k, v in terms["highest"].items() if k != "moe_experts"} == \
        {k: v for k, v in terms["high"].items() if k != "moe_experts"}


def test_a_bf16_router_and_the_float32_routers_weights():
    dep = Deployment(gpu=load_gpu("h200_sxm"), model=load_model(QWEN_MOE), engine=load_engine("vllm"), tp=4)
    _, _, router = _router(dep)
    assert (router.w_bytes_per_elem, router.peak_flops) == (2.0, 989e12)
    # MiniMax's float32 gate weighs 4 bytes a weight: 62 x 3072 x 256 x 2 bytes more than a BF16 one would
    model = load_model(MINIMAX)
    bf16_router = attrs.evolve(model, layers=tuple((mx, attrs.evolve(f, router_fp32=False)) for mx, f in model.layers))
    engine, gpu = load_engine("vllm"), load_gpu("h200_sxm")
    fp32 = Deployment(gpu=gpu, model=model, engine=engine, tp=4).weight_bytes_per_gpu
    bf16 = Deployment(gpu=gpu, model=bf16_router, engine=engine, tp=4).weight_bytes_per_gpu
    assert fp32 - bf16 == 62 * 3072 * 256 * 2


def test_a_gpu_without_a_float32_rate_cannot_price_a_float32_router():
    h200 = load_gpu("h200_sxm")
    bare = attrs.evolve(h200, peak_flops={"bf16": 989e12, "fp8": 1979e12})
    with pytest.raises(DeploymentError, match="MiniMax-M2.5's router runs a float32 GEMM, and h200_sxm's spec gives no "
                                              r"peak_flops.fp32"):
        Deployment(gpu=bare, model=load_model(MINIMAX), engine=load_engine("vllm"), tp=4)
    Deployment(gpu=bare, model=load_model(QWEN_MOE), engine=load_engine("vllm"), tp=4)   # a BF16 router needs none
    no_tf32 = derive_gpu(h200, {"peak_flops": {"fp32": 60e12}})
    assert no_tf32.flops_for("fp32") == 60e12 and no_tf32.flops_for("tf32") == 494.5e12
    only_fp32 = attrs.evolve(h200, peak_flops={"bf16": 989e12, "fp32": 67e12})
    assert only_fp32.flops_for("tf32") == 67e12   # no TF32 rate: a TF32 matmul at the CUDA cores' rate
    with pytest.raises(ValueError, match="peak_flops has no fp32 entry"):
        bare.flops_for("tf32")


def test_a_factor_on_the_fp32_rate_moves_the_float32_router_alone():
    """hardware.scale.flops_fp32: the CUDA cores' rate doubles; of an 8k-token MiniMax prompt only the routers
    (moe_experts) get faster, and with the router on TF32 nothing moves."""
    model, engine, h200 = load_model(MINIMAX), load_engine("vllm"), load_gpu("h200_sxm")
    faster = derive_gpu(h200, scale={"flops_fp32": 2.0})
    assert faster.peak_flops == {**h200.peak_flops, "fp32": 134e12}
    shape = BatchShape.from_requests([8192], [8192])
    for precision, moves in (("highest", True), ("high", False)):
        base, fast = (CostModel(Deployment(gpu=g, model=model, engine=engine, tp=4, fp32_matmul=precision))
                      .step_cost(shape).terms for g in (h200, faster))
        assert {k: v for k, v in base.items() if k != "moe_experts"} == \
            {k: v for k, v in fast.items() if k != "moe_experts"}
        assert (fast["moe_experts"] < base["moe_experts"]) is moves
        if not moves:
            assert fast["moe_experts"] == base["moe_experts"]
