"""Redundant expert slots (Deployment.redundant_experts, EPLB): layout, weights and the routed-expert price."""

import pytest

from hardware import CostModel, Deployment, DeploymentError, kernels, load_engine, load_gpu, load_model
from hardware.dtypes import COMPUTE_DTYPE

R1 = "deepseek-ai/DeepSeek-R1"


def dsr1(ep: int, redundant: int = 0) -> Deployment:
    """DeepSeek-R1 NVFP4 on GB300 under TRT-LLM, one GPU per attention-DP rank, ep of them (moe_tp 1)."""
    return Deployment(gpu=load_gpu("gb300"), model=load_model(R1), engine=load_engine("trtllm"), tp=1,
                      attn_dp=ep, ep=ep, weight_dtype="fp4", redundant_experts=redundant)


def moe_layer(d: Deployment):  # type: ignore[no-untyped-def]
    return next(f for _, f in d.model.layers if f is not None and f.kind == "moe")


def test_each_gpu_holds_its_share_of_the_experts_plus_the_redundant_slots() -> None:
    """256 + 32 slots over 48 GPUs: 6 whole experts each (256 / 32 = 8 without slots); the weights per GPU
    differ from ep 32's by exactly 2 experts in each of the 58 MoE layers."""
    f = moe_layer(dsr1(32))
    ep48, ep32, ep32r = dsr1(48, 32), dsr1(32), dsr1(32, 32)
    assert (ep48.expert_slots(f), ep48.experts_per_gpu(f)) == (288, 6)
    assert (ep32.experts_per_gpu(f), ep32r.experts_per_gpu(f)) == (8, 9)
    moe_layers = sum(1 for _, g in ep32.model.layers if g is not None and g.kind == "moe")
    expert_bytes = ep32.expert_elems(f) * ep32.weight_bytes_per_elem
    assert moe_layers == 58
    assert abs(ep32.weight_bytes_per_gpu - ep48.weight_bytes_per_gpu - 2 * moe_layers * expert_bytes) <= 1
    assert abs(ep32r.weight_bytes_per_gpu - ep32.weight_bytes_per_gpu - moe_layers * expert_bytes) <= 1


def test_slots_that_do_not_split_evenly_name_the_field_and_the_count_that_would() -> None:
    with pytest.raises(DeploymentError) as plain:
        dsr1(48)
    assert plain.value.field == "ep"
    assert str(plain.value) == (f"ep=48 does not divide {R1}'s 256 routed experts (each GPU holds an equal "
                                "share); redundant_experts=32 would make it divide")
    with pytest.raises(DeploymentError) as few:
        dsr1(48, 16)
    assert few.value.field == "redundant_experts"
    assert str(few.value) == (f"ep=48 does not divide {R1}'s 256 routed experts + redundant_experts=16 = 272 "
                              "expert slots (each GPU holds an equal share); redundant_experts=32 would make it "
                              "divide")
    with pytest.raises(DeploymentError, match="it needs ep > 1") as alone:
        Deployment(gpu=load_gpu("gb300"), model=load_model(R1), engine=load_engine("trtllm"),
                   redundant_experts=32)
    assert alone.value.field == "redundant_experts"
    with pytest.raises(DeploymentError, match="must be >= 0"):
        dsr1(32, -32)
    with pytest.raises(DeploymentError, match="is a dense model") as dense:
        Deployment(gpu=load_gpu("h100_sxm"), model=load_model("meta-llama/Llama-3.1-8B"),
                   engine=load_engine("vllm"), redundant_experts=8)
    assert dense.value.field == "redundant_experts"


def test_the_busiest_rank_carries_less_when_its_load_spreads_over_the_redundant_slots() -> None:
    """2,048 tokens, top-8, ep 32 under power-law routing: the mean rank's pairs stay T k / ep = 512; the
    busiest rank's fall from 1,286.7 to 1,193.6 pairs when 256 experts become 288 slots (9 per rank)."""
    mean0, pairs0 = kernels.routed_load(2048, 8, 256, 32, "power_law")
    mean1, pairs1 = kernels.routed_load(2048, 8, 288, 32, "power_law")
    assert pairs0 == pytest.approx(512.0) and pairs1 == pytest.approx(512.0)
    busy0 = kernels.routed_load(2048, 8, 256, 32, "power_law_busiest")[1]
    busy1 = kernels.routed_load(2048, 8, 288, 32, "power_law_busiest")[1]
    assert (round(busy0, 1), round(busy1, 1)) == (1286.7, 1193.6)
    # the ledger prices the deployment's slots: R = 0 is the plain price, R = 32 the 288-slot one
    plain, slotted = CostModel(dsr1(32)), CostModel(dsr1(32, 32))
    f = moe_layer(plain.dep)
    busiest0 = plain._moe_s(f, 2048, plain.cal, "power_law_busiest")
    busiest1 = slotted._moe_s(f, 2048, slotted.cal, "power_law_busiest")
    assert busiest1 < busiest0
    d = plain.dep
    direct = kernels.moe_s(plain.cal.moe_for(d.curve_dtype, d.moe_kernel), tokens=2048, width=d.model.hidden_size,
                           inter=f.intermediate_size, topk=8, num_experts=256, ep=32, mats=f.mats,
                           w_bytes_per_elem=d.weight_bytes_per_elem,
                           peak_flops=d.gpu.flops_for(COMPUTE_DTYPE[d.curve_dtype]), bw_Bps=d.gpu.hbm_bw_Bps,
                           routing="power_law_busiest")
    assert busiest0 == direct
