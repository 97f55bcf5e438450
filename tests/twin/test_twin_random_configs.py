"""Randomised configurations across engines, systems, KV memory, scheduler limits and workloads: every run
ends with each request finished or failed with a reason, its outputs are the same with fast-forward on
and off, and the per-request and summary figures agree with each other.

The examples are drawn from a fixed seed (``derandomize``), so the suite sees the same configurations on
every run. Fresh searches of the same space (``derandomize=False``, other seeds) are how it is widened:
each part below passed the searches named with it, outside the suite.

* The base space: 2,500 examples (max_examples=2500, about 50 s).
* ``_more_knobs`` (drawn by half the examples): 2,000 examples with MoE and 8B models and TP 2, 600 with
  prompts to 3,000 and outputs to 2,000 tokens, 900 replaying the shipped agent sessions with their tool
  waits; 1,500 and 2,500 examples of the whole strategy (seeds 3701, 3702).
* Prompt pools (half the synthetic workloads draw their prompts from 1-4 dataset entries: whole-prompt
  prefix hits): 3,000 examples each of the whole strategy (seeds 4001, 4002), 4,000 each with every
  synthetic workload pooled (seeds 4004, 4005: 3,259 pooled examples).
* The connector's cut of a disaggregated hand-off (``transfer.pieces``): every example disaggregated, its
  cut drawn and half of them with a dearer descriptor, 1,500 twice (seeds 4102, 4103) and 5,000 twice
  (seeds 4105, 4106).
* gpt-oss-20b (a quarter of the examples), whose sliding windows are per-request state held in the KV pool
  (KVCacheManager.state_blocks: 128 / 32 / 8 blocks at block sizes 1 / 4 / 16): 1,500 (seed 4301) and
  5,000 twice (seeds 4302, 4303; 996 and 1,012 of them on gpt-oss-20b).
* Attention-DP engines (gpt-oss-20b, 2-4 lockstep ranks, TensorRT-LLM's balance drawn on colocated ones;
  pools of such engines on disaggregated ones): attention-DP examples only, 150, 600 and 300 (seeds
  4401-4403), 300 and 800 with the groups' fast-forward (seeds 4404, 4405); colocated vLLM attention-DP
  groups, which fast-forward too, 300 and 1,500 (seeds 4501, 4502); ranks advancing their decodes as lazy
  cohorts, priced on the decode fast path, 300 and 200 of the whole strategy (seeds 4703, 4704).
* MTP speculative decoding (MiMo-7B, 1-3 drafts), which fast-forwards: in every example, 400 and 600
  (seeds 4601, 4603), and 150 of the dp_attention example with MTP, its engine, balance, loads and lengths
  drawn (seed 4602).
"""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twin.config import load_config
from twin.runner import Simulation


def _lengths(draw: st.DrawFn, high: int) -> dict[str, int]:
    if draw(st.booleans()):
        return {"fixed": draw(st.integers(1, high))}
    low = draw(st.integers(1, high))
    return {"low": low, "high": draw(st.integers(low, high))}


@st.composite
def configs(draw: st.DrawFn) -> dict:
    engine = draw(st.sampled_from(["vllm", "sglang", "trtllm"]))
    kv: dict = {"prefix_caching": draw(st.booleans()),
                "block_size": draw(st.sampled_from([1, 4, 16])),
                "num_blocks": draw(st.sampled_from([40, 120, 400, 4000]))}
    if kv["prefix_caching"] and draw(st.booleans()):
        kv["host_memory_gib"] = draw(st.sampled_from([0.01, 0.05]))
    sched: dict = {"max_num_batched_tokens": draw(st.sampled_from([16, 128, 1024])),
                   "max_num_seqs": draw(st.sampled_from([1, 4, 64]))}
    if draw(st.booleans()):
        sched["preemption"] = draw(st.sampled_from(["vllm", "sglang"]))
    if draw(st.booleans()):
        sched["policy"] = "priority"
    if draw(st.booleans()):
        system: dict = {"kind": "disaggregated", "prefill": {"workers": draw(st.integers(1, 2))},
                        "decode": {"workers": draw(st.integers(1, 2)),
                                   "max_num_seqs": draw(st.sampled_from([None, 1, 8]))},
                        "decode_router": {"kind": draw(st.sampled_from(["least_loaded", "kv_aware"]))}}
        transfer = {"first_token": draw(st.sampled_from(["decode", "prefill"])),
                    "lease_s": draw(st.sampled_from([None, 1e-6, 0.05])),
                    "kind": draw(st.sampled_from(["pull", "pull", "push"]))}
        extra = {"system": system, "transfer": transfer}
    else:
        extra = {"system": {"kind": "colocated", "replicas": draw(st.integers(1, 2))},
                 "router": {"kind": draw(st.sampled_from(["round_robin", "least_loaded", "kv_aware"]))}}
    if draw(st.booleans()):
        workload = {"kind": "synthetic", "num_requests": draw(st.integers(1, 30)),
                    "arrival": draw(st.sampled_from([{"kind": "poisson", "rate_per_s": 40.0},
                                                     {"kind": "concurrency", "concurrency": 6},
                                                     {"kind": "all_at_once"}])),
                    "input_tokens": _lengths(draw, 400), "output_tokens": _lengths(draw, 60)}
        if draw(st.booleans()):  # a dataset of a few entries: repeated prompts, whole-prompt prefix hits
            workload.update(prompt_pool=draw(st.integers(1, 4)),
                            pool_sampling=draw(st.sampled_from(["sequential", "random", "shuffle"])))
    else:
        workload = {"kind": "lmbenchmark_multiround", "num_users": draw(st.integers(1, 4)),
                    "num_rounds": draw(st.integers(2, 3)), "qps": 8.0,
                    "shared_system_prompt": draw(st.sampled_from([0, 64])), "user_history_prompt": 100,
                    "answer_len": draw(st.integers(1, 40))}
    run = {"seed": draw(st.integers(0, 99)), "warmup_s": draw(st.sampled_from([0.0, 0.0, 0.2]))}
    cfg = {"engine": {"name": engine}, "model": {"name": "Qwen/Qwen3-0.6B"}, "kv_cache": kv,
           "scheduler": sched, "workload": workload, "run": run,
           "metrics": {"sample_interval_s": 0.05, "record_token_times": True}, **extra}
    if draw(st.booleans()):
        _more_knobs(draw, cfg)
    return cfg


def _more_knobs(draw: st.DrawFn, cfg: dict) -> None:
    """Scheduler, engine, run and transfer settings the first draws leave at their defaults (each drawn
    half the time); token times recorded or not (the worker keeps them only when asked)."""
    sched, engine, run = cfg["scheduler"], cfg["engine"], cfg["run"]
    cfg["metrics"]["record_token_times"] = draw(st.booleans())
    if draw(st.booleans()):
        sched["long_prefill_token_threshold"] = draw(st.sampled_from([8, 64, 300]))
    if draw(st.booleans()):
        sched.update(chunked_prefill=False, max_num_batched_tokens=max(sched["max_num_batched_tokens"], 1024))
    if draw(st.booleans()):
        sched["mixed_prefill"] = draw(st.booleans())
    if draw(st.booleans()):
        sched.update(batch_wait_iters=draw(st.integers(1, 4)),
                     batch_wait_max_tokens_ratio=draw(st.sampled_from([0.0, 0.5, 1.0])))
    if draw(st.booleans()):
        sched["reserve_full_kv"] = draw(st.booleans())
    if draw(st.booleans()):
        engine["sampling"] = "top_k_top_p"
    if draw(st.booleans()):
        engine["max_model_len"] = draw(st.sampled_from([64, 300]))
    if draw(st.booleans()):
        engine["cuda_graph_mode"] = draw(st.sampled_from(["none", "piecewise", "full_decode_only"]))
    if draw(st.booleans()):
        run["max_sim_s"] = draw(st.sampled_from([0.3, 1.0]))
    if draw(st.booleans()):
        run["fast_forward_max_steps"] = draw(st.sampled_from([1, 2, 7]))
    if cfg["system"]["kind"] == "disaggregated" and draw(st.booleans()):
        transfer = cfg["transfer"]
        transfer.update(layerwise=draw(st.booleans()), decode_headroom_blocks=draw(st.sampled_from([0, 3, 50])))
        if transfer["kind"] == "pull" and draw(st.booleans()):
            transfer["max_handoffs_per_s"] = draw(st.sampled_from([5.0, 100.0]))
        if draw(st.booleans()):  # another connector's cut of a hand-off into descriptors
            transfer["pieces"] = draw(st.sampled_from(["block", "layer", "buffer"]))
    if draw(st.booleans()):  # a model with per-request state (its sliding windows: KVCacheManager.state_blocks)
        cfg["model"] = {"name": "openai/gpt-oss-20b"}
    if cfg["system"]["kind"] == "colocated" and draw(st.booleans()):
        # an attention-DP engine (twin.shell.attention_dp): ranks in lockstep, the MoE over every rank's tokens
        cfg["model"] = {"name": "openai/gpt-oss-20b"}
        dp = draw(st.sampled_from([2, 4]))
        cfg["system"].update(attention_dp=dp, ep=draw(st.sampled_from([1, dp])))
        if draw(st.booleans()):
            sched.update(attention_dp_balance=True, attention_dp_timeout_iters=draw(st.integers(0, 5)),
                         attention_dp_batching_wait_iters=draw(st.integers(0, 2)))
    if cfg["system"]["kind"] == "disaggregated" and draw(st.booleans()):
        # pools of attention-DP engines, their ranks routed to one by one and stepped together
        cfg["model"] = {"name": "openai/gpt-oss-20b"}
        for side in ("prefill", "decode"):
            dp = draw(st.sampled_from([1, 2, 4]))
            cfg["system"][side].update(attention_dp=dp, ep=draw(st.sampled_from([1, dp])))
    if cfg["model"]["name"] == "Qwen/Qwen3-0.6B" and draw(st.booleans()):
        # MTP speculative decoding: every decode step verifies 1 + k tokens and emits a drawn number of them
        k = draw(st.integers(1, 3))
        cfg["model"] = {"name": "XiaomiMiMo/MiMo-7B-Base"}
        engine["speculative"] = {"method": "mtp", "num_speculative_tokens": k,
                                 "acceptance": draw(st.sampled_from([0.0, 0.6, 1.0]))}
        sched["max_num_batched_tokens"] = max(sched["max_num_batched_tokens"], 1 + k)


def _run(cfg: dict, fast_forward: bool) -> tuple[Simulation, object]:
    cfg = json.loads(json.dumps(cfg))
    cfg["run"]["fast_forward"] = fast_forward
    sim = Simulation(load_config(cfg), keep_requests=True)
    return sim, sim.run()  # raises on a stall, a leaked block or an illegal KV transition


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_random_configurations_end_cleanly_and_agree_with_themselves(cfg):
    sim, res = _run(cfg, True)
    _, off = _run(cfg, False)
    t = res.requests
    # Fast-forward changes nothing but speed.
    for name in t.dtype.names:
        assert all(_same(a, b) if isinstance(a, float) else a == b for a, b in zip(t[name], off.requests[name])), name
    assert res.ledger == off.ledger
    assert json.dumps(dict(res.summary, sim=0), sort_keys=True) == json.dumps(dict(off.summary, sim=0), sort_keys=True)
    # Every request ends, a failure with its reason; a finished one sampled what it asked for, in order.
    for req in sim.driver.requests:
        assert req.status.name in ("FINISHED", "FAILED")
        if req.status.name == "FAILED":
            assert req.fail_reason
            continue
        assert req.num_output_tokens == req.max_output_tokens
        assert req.arrival_ns <= req.queued_ns <= req.first_scheduled_ns <= req.first_token_ns <= req.finish_ns
        if not cfg["metrics"]["record_token_times"]:
            assert req.token_times_ns is None
            continue
        assert len(req.token_times_ns) == req.max_output_tokens and req.token_times_ns[0] == req.first_token_ns
        assert req.token_times_ns[-1] == req.finish_ns and list(req.token_times_ns) == sorted(req.token_times_ns)
    assert ((t["host_hit_tokens"] <= t["cached_tokens"]) & (t["cached_tokens"] <= t["prompt_tokens"])).all()
    # The summary counts what the rows hold (requests arriving before the warm-up left out).
    measured = t[t["arrival_s"] >= cfg["run"]["warmup_s"]]
    counts = res.summary["requests"]
    assert counts["completed"] == int((measured["status"] == "finished").sum())
    assert counts["failed"] == int((measured["status"] == "failed").sum()) and counts["pending"] == 0
    ts = res.timeseries
    assert (np.diff(ts["time_s"]) > 0).all() and (ts["kv_usage"] <= 1.0).all() and (ts["running"] >= 0).all()
