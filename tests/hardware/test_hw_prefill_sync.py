"""EngineProfile.prefill_sync_mixers: an eager prompt step of a model whose layers make the host wait for the
GPU (SGLang's gated-DeltaNet prefill) lasts max(host, GPU) + min(MoE host, MoE GPU): each MoE layer's host
work and its expert kernels follow one another. Decode steps and models without such a layer keep
max(host, GPU)."""

from __future__ import annotations

import attrs
import pytest

from hardware import BatchShape, CostModel, Deployment, load_engine, load_gpu, load_model

HOST = ("step_host", "request_host", "kv_traversal")
MOE = ("moe_experts", "moe_shared", "ep_alltoall", "ep_imbalance")
QWEN35 = "Qwen/Qwen3.5-397B-A17B"     # 60 layers: 45 gated DeltaNet, 15 full attention, every one MoE
PROMPT = BatchShape.from_requests([1024], [1024])
LONG = BatchShape.from_requests([8192], [8192])


def sglang(sync: bool, layer_s: float = 3e-4, moe_s: float = 2e-3, **kw: object) -> object:
    return attrs.evolve(load_engine("sglang"), eager_layer_host_s=layer_s, eager_moe_host_s=moe_s,
                        prefill_sync_mixers=("gdn",) if sync else (), **kw)


def ledger(model: str, engine: object, ep: int = 1) -> CostModel:
    return CostModel(Deployment(gpu=load_gpu("b300_sxm"), model=load_model(model), engine=engine,  # type: ignore[arg-type]
                                tp=4, ep=ep))


def gpu_s(terms: dict[str, float]) -> float:
    return sum(v for n, v in terms.items() if n not in HOST and n != "eager_host")


def moe_gpu_s(terms: dict[str, float]) -> float:
    return sum(terms.get(n, 0.0) for n in MOE)


def test_shipped_profiles() -> None:
    assert load_engine("sglang").prefill_sync_mixers == ("gdn",)
    assert load_engine("vllm").prefill_sync_mixers == () and load_engine("trtllm").prefill_sync_mixers == ()


@pytest.mark.parametrize("ep", [1, 2])
def test_host_bound_prompt_step_adds_the_moe_gpu_time_by_hand(ep: int) -> None:
    """Qwen3.5-397B, 60 layers at 0.3 ms + 2 ms per MoE layer: 138 ms of eager host time, 120 ms of it the
    MoE layers'. A lone 1k prompt on B300 TP 4 takes well under that on the GPU, its MoE block less than 120
    ms: without the waits the host hides the GPU (eager_host = 138 ms - GPU); with them the MoE block's GPU
    time (experts, shared expert, and with EP 2 the busiest rank's extra) is added on top. The GPU terms do
    not move."""
    synced = ledger(QWEN35, sglang(True, host_overlap=False), ep)
    free = ledger(QWEN35, sglang(False, host_overlap=False), ep)
    assert synced.eager_host_s == pytest.approx(60 * 3e-4 + 60 * 2e-3, rel=1e-12) == free.eager_host_s
    assert synced.eager_moe_host_s == pytest.approx(60 * 2e-3, rel=1e-12)
    a, b = dict(synced.step_cost(PROMPT).terms), dict(free.step_cost(PROMPT).terms)
    gpu, moe = gpu_s(b), moe_gpu_s(b)
    assert 0.0 < moe < gpu < 0.120
    assert (b["ep_imbalance"] > 0.0) == (ep == 2)
    assert b["eager_host"] == pytest.approx(0.138 - gpu, rel=1e-12)
    assert a["eager_host"] == pytest.approx(0.138 - gpu + moe, rel=1e-12)
    assert {n: v for n, v in a.items() if n != "eager_host"} == {n: v for n, v in b.items() if n != "eager_host"}


def test_the_moe_host_bounds_what_shows() -> None:
    """An 8k prompt at 25 us per layer and 0.1 ms per MoE layer (7.5 ms of host, 6 ms of it the MoE layers')
    is GPU-bound, its MoE block above 6 ms on the GPU: without the waits the host hides (eager_host 0); with
    them the MoE layers' 6 ms of host work shows, no more."""
    synced = ledger(QWEN35, sglang(True, 25e-6, 1e-4, host_overlap=False))
    free = ledger(QWEN35, sglang(False, 25e-6, 1e-4, host_overlap=False))
    a, b = dict(synced.step_cost(LONG).terms), dict(free.step_cost(LONG).terms)
    assert moe_gpu_s(b) > 6e-3 and gpu_s(b) > 7.5e-3 and b["eager_host"] == 0.0
    assert a["eager_host"] == pytest.approx(60 * 1e-4, rel=1e-12)


def test_waits_leave_the_scheduling_host_its_cover() -> None:
    """With the overlap scheduler the CPU schedules the next step in the GPU time it does not spend launching
    (max(0, GPU - eager host)); the waits block it, so they add to the step and hide nothing: host-bound, the
    step lasts eager host + scheduling host + MoE GPU; without the waits max(GPU, eager + scheduling)."""
    synced = ledger(QWEN35, sglang(True, host_overlap=True))
    serial = ledger(QWEN35, sglang(True, host_overlap=False))
    free = ledger(QWEN35, sglang(False, host_overlap=True))
    a, s, b = (dict(m.step_cost(PROMPT).terms) for m in (synced, serial, free))
    sched = sum(s[n] for n in HOST)
    assert sched > 0.0
    assert sum(a.values()) == pytest.approx(0.138 + sched + moe_gpu_s(s), rel=1e-12)
    assert sum(b.values()) == pytest.approx(max(gpu_s(s), 0.138 + sched), rel=1e-12)


def test_decode_steps_and_other_models_keep_max() -> None:
    """A pure-decode batch beyond the capture sizes runs eager through the recurrent kernel (no chunk indices):
    max(host, GPU), as without the flag. DeepSeek-V3 (MLA, no DeltaNet layer) keeps max in prompt steps."""
    decode = BatchShape.from_requests([1] * 600, [2000] * 600)     # 600 > SGLang's largest capture size here
    synced = ledger(QWEN35, sglang(True, host_overlap=False))
    free = ledger(QWEN35, sglang(False, host_overlap=False))
    d_sync, d_free = synced.step_cost(decode).terms, free.step_cost(decode).terms
    assert d_sync["eager_host"] > 0.0
    assert dict(d_sync) == dict(d_free)
    ds = Deployment(gpu=load_gpu("b300_sxm"), model=load_model("deepseek-ai/DeepSeek-V3"),
                    engine=sglang(True, host_overlap=False), tp=8, ep=8)  # type: ignore[arg-type]
    ds_free = attrs.evolve(ds, engine=sglang(False, host_overlap=False))
    assert dict(CostModel(ds).step_cost(PROMPT).terms) == dict(CostModel(ds_free).step_cost(PROMPT).terms)


def test_unknown_mixer_kind_is_refused() -> None:
    with pytest.raises(ValueError, match=r"prefill_sync_mixers names unknown mixer kind\(s\) \['deltanet'\]"):
        attrs.evolve(load_engine("sglang"), prefill_sync_mixers=("deltanet",))
