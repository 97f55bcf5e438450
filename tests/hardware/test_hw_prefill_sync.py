"""EngineProfile.prefill_sync_mixers / prefill_sync_share: an eager prompt step of a model whose layers make
the host wait for the GPU (SGLang's gated-DeltaNet prefill) lasts max(host, GPU) + share x min(host, GPU)
instead of max(host, GPU); decode steps and models without such a layer keep max."""

from __future__ import annotations

import attrs
import pytest

from hardware import BatchShape, CostModel, Deployment, load_engine, load_gpu, load_model

HOST = ("step_host", "request_host", "kv_traversal")
QWEN35 = "Qwen/Qwen3.5-397B-A17B"     # 60 layers: 45 gated DeltaNet, 15 full attention, every one MoE
PROMPT = BatchShape.from_requests([1024], [1024])


def sglang(sync: bool, layer_s: float = 3e-4, moe_s: float = 2e-3, share: float = 1.0, **kw: object) -> object:
    return attrs.evolve(load_engine("sglang"), eager_layer_host_s=layer_s, eager_moe_host_s=moe_s,
                        prefill_sync_mixers=("gdn",) if sync else (), prefill_sync_share=share, **kw)


def ledger(model: str, engine: object, **kw: object) -> CostModel:
    return CostModel(Deployment(gpu=load_gpu("b300_sxm"), model=load_model(model), engine=engine,  # type: ignore[arg-type]
                                tp=4, ep=1), **kw)  # type: ignore[arg-type]


def gpu_s(terms: dict[str, float]) -> float:
    return sum(v for n, v in terms.items() if n not in HOST and n != "eager_host")


def test_shipped_profiles() -> None:
    assert load_engine("sglang").prefill_sync_mixers == ("gdn",)
    assert load_engine("sglang").prefill_sync_share == 0.5
    assert load_engine("vllm").prefill_sync_mixers == () and load_engine("trtllm").prefill_sync_mixers == ()


@pytest.mark.parametrize("share", [1.0, 0.5])
def test_gdn_prompt_step_exposes_the_share_of_the_gpu_time_by_hand(share: float) -> None:
    """Qwen3.5-397B, 60 layers at 0.3 ms + 2 ms per MoE layer: 138 ms of eager host time. A lone 1k prompt
    on B300 TP 4 takes well under that on the GPU, so without the waits the host hides it (eager_host = 138 ms
    - GPU); with them the step lasts 138 ms + share x GPU (share 1: host + GPU). The GPU terms do not move."""
    synced = ledger(QWEN35, sglang(True, share=share, host_overlap=False))
    free = ledger(QWEN35, sglang(False, host_overlap=False))
    assert synced.eager_host_s == pytest.approx(60 * 3e-4 + 60 * 2e-3, rel=1e-12) == free.eager_host_s
    a, b = dict(synced.step_cost(PROMPT).terms), dict(free.step_cost(PROMPT).terms)
    gpu = gpu_s(b)
    assert 0.0 < gpu < 0.138
    assert a["eager_host"] == pytest.approx(0.138 - gpu + share * gpu, rel=1e-12)
    assert b["eager_host"] == pytest.approx(0.138 - gpu, rel=1e-12)
    assert {n: v for n, v in a.items() if n != "eager_host"} == {n: v for n, v in b.items() if n != "eager_host"}
    assert sum(a.values()) - sum(b.values()) == pytest.approx(share * gpu, rel=1e-9)


def test_gpu_bound_prompt_step_by_hand() -> None:
    """An 8k prompt at 25 us per layer and no MoE term (1.5 ms of host) is GPU-bound: without waits the
    host hides entirely (eager_host 0); with them at share 0.5 half of the host time shows."""
    long = BatchShape.from_requests([8192], [8192])
    synced = ledger(QWEN35, sglang(True, 25e-6, 0.0, share=0.5, host_overlap=False))
    free = ledger(QWEN35, sglang(False, 25e-6, 0.0, host_overlap=False))
    a, b = dict(synced.step_cost(long).terms), dict(free.step_cost(long).terms)
    assert gpu_s(b) > 1.5e-3 and b["eager_host"] == 0.0
    assert a["eager_host"] == pytest.approx(0.5 * 60 * 25e-6, rel=1e-12)


@pytest.mark.parametrize("share", [1.0, 0.5])
def test_gdn_waits_expose_the_scheduling_host_too(share: float) -> None:
    """With the overlap scheduler the CPU schedules the next step in the GPU time it neither launches nor
    waits in: max(0, GPU - eager host) x (1 - share), none here (the host-bound 1k prompt), so the step lasts
    GPU + eager host exposed + scheduling host; max(GPU, eager + scheduling) without the waits."""
    synced = ledger(QWEN35, sglang(True, share=share, host_overlap=True))
    serial = ledger(QWEN35, sglang(True, share=share, host_overlap=False))
    free = ledger(QWEN35, sglang(False, host_overlap=True))
    a, s, b = (dict(m.step_cost(PROMPT).terms) for m in (synced, serial, free))
    sched = sum(s[n] for n in HOST)
    gpu = gpu_s(s)
    assert sched > 0.0
    assert sum(a.values()) == pytest.approx(0.138 + share * gpu + sched, rel=1e-12)
    assert sum(b.values()) == pytest.approx(max(gpu, 0.138 + sched), rel=1e-12)


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


def test_bad_profile_fields_are_refused() -> None:
    with pytest.raises(ValueError, match=r"prefill_sync_mixers names unknown mixer kind\(s\) \['deltanet'\]"):
        attrs.evolve(load_engine("sglang"), prefill_sync_mixers=("deltanet",))
    with pytest.raises(ValueError, match=r"prefill_sync_share must be a number in \[0, 1\], got 1.5"):
        attrs.evolve(load_engine("sglang"), prefill_sync_share=1.5)
