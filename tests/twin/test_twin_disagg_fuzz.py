"""Disaggregated and multi-worker runtime: bugs found by fuzzing small simulations, each pinned exactly."""

import pytest

from twin.config import load_config
from twin.core.errors import ConfigError
from twin.runner import Simulation, run
from workloads.io import write_sessions
from workloads.sessions import Call, Session


def one_call(sid, arrival, prompt, output):
    return Session(id=sid, arrival_s=arrival, calls=(Call(append_tokens=prompt, output_tokens=output),))


def config(tmp_path, sessions, system=None, **extra):
    path = tmp_path / "w.jsonl"
    write_sessions(path, sessions, source="test")
    spec = {"kind": "disaggregated", "prefill": {"workers": 1}, "decode": {"workers": 1},
            "decode_router": {"kind": "session_affinity"}}
    for key, value in (system or {}).items():
        spec[key] = {**spec[key], **value} if isinstance(value, dict) else value
    return load_config({"system": spec, "workload": {"kind": "sessions", "path": str(path)}, **extra})


def rows(res):
    return {r["session"]: r for r in res.requests}


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_pull_that_finds_no_room_takes_no_pacing_slot(tmp_path, fast_forward):
    """max_handoffs_per_s 1, decode worker of 20 blocks. a (100 + 200 tokens) is pulled at once; b (100 + 5)
    is held by the pacing until 1 s later, when a holds too many blocks for b's 7. b is pulled when a
    finishes and frees them. The failed reservation used to count as a hand-off, so b waited for the next
    slot, 2 s after a's pull (0.59 s after a finished)."""
    cfg = config(tmp_path, [one_call("a", 0.0, 100, 200), one_call("b", 0.0, 100, 5)],
                 {"decode": {"num_blocks": 20}}, transfer={"max_handoffs_per_s": 1.0},
                 run={"fast_forward": fast_forward})
    r = rows(run(cfg))
    assert r["a"]["kv_pull_s"] == r["a"]["kv_staged_s"] == r["b"]["kv_staged_s"]
    assert r["a"]["finish_s"] > r["a"]["kv_pull_s"] + 1.0  # b's slot came while a still held the blocks
    assert r["b"]["kv_pull_s"] == r["a"]["finish_s"]
    assert r["b"]["status"] == "finished"


def test_pacing_still_spaces_pulls_from_one_prefill_worker(tmp_path):
    """The pacing itself holds: with room for both, b's pull leaves the prefill worker 1 s after a's."""
    cfg = config(tmp_path, [one_call("a", 0.0, 100, 2), one_call("b", 0.0, 100, 2)],
                 transfer={"max_handoffs_per_s": 1.0}, metrics={"sample_interval_s": 0.5})
    r = rows(run(cfg))
    assert r["b"]["kv_pull_s"] >= r["a"]["kv_pull_s"] + 1.0


def test_workers_are_placed_by_all_their_gpus_and_pools_of_two_gpu_kinds_apart(tmp_path):
    """An engine takes tp x attention_dp GPUs on one node, its ranks tp each. Two tp=4 x attention_dp=2
    engines used to share one 8-GPU node (placed by tp alone), their KV crossing NVLink instead of the NIC.
    Prefill H100s and decode H200s used to share a node too, joined by NVLink."""
    sessions = [one_call("a", 0.0, 100, 2)]
    dp = {"tp": 4, "attention_dp": 2}
    sim = Simulation(config(tmp_path, sessions, {"prefill": {"workers": 2, **dp}, "decode": {"workers": 1, **dp},
                                                 "gpus_per_node": 8}))
    # Two prefill engines of ranks 0-1 and 2-3, a decode engine of ranks 4-5: a node each.
    assert sim.system.node == {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2}
    assert sim.system._path(sim.system.prefill[0], sim.system.decode[0]) == ("w0.out.nic", "w4.in.nic")
    sim = Simulation(config(tmp_path, sessions, {"prefill": {"workers": 2, "tp": 2},
                                                 "decode": {"workers": 3, "tp": 2}, "gpus_per_node": 8}))
    assert sim.system.node == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1}  # (one kind: the pools share nodes as before)
    sim = Simulation(config(tmp_path, sessions, {"decode": {"workers": 2, "gpu": "h200_sxm"}}))
    assert sim.system.node == {0: 0, 1: 1, 2: 1}
    assert sim.system._path(sim.system.prefill[0], sim.system.decode[0]) == ("w0.out.nic", "w1.in.nic")
    with pytest.raises(ConfigError, match=r"system\.gpus_per_node: an engine with tp=2 x attention_dp=2 = 4 "
                                          r"GPUs does not fit a node of 2 GPUs"):
        Simulation(config(tmp_path, sessions, {"decode": {"tp": 2, "attention_dp": 2}, "gpus_per_node": 2}))


def test_pacing_with_push_is_refused_naming_the_field(tmp_path):
    """transfer.max_handoffs_per_s paces pulls; a push left at once whatever it said (ignored without a word)."""
    with pytest.raises(ConfigError, match=r"^transfer\.max_handoffs_per_s: paces the pulls of decode workers; "
                                          r"transfer\.kind push sends"):
        Simulation(config(tmp_path, [one_call("a", 0.0, 100, 2)],
                          transfer={"kind": "push", "max_handoffs_per_s": 10.0}))


def test_a_pool_too_small_for_sglang_to_size_its_batch_names_that_pools_field(tmp_path):
    """SGLang derives max_num_seqs from each worker's KV pool. A 1-block decode pool (beside a prefill pool
    that set its own max_num_seqs) used to blame scheduler.max_num_seqs alone."""
    sessions = [one_call("a", 0.0, 10, 2)]
    with pytest.raises(ConfigError, match=r"^system\.decode\.max_num_seqs: sglang derives no running-request cap "
                                          r"from a decode worker's pool of 1 KV block; set it \(or "
                                          r"scheduler\.max_num_seqs, for every pool\)$"):
        Simulation(config(tmp_path, sessions, {"prefill": {"max_num_seqs": 4}, "decode": {"num_blocks": 1}},
                          engine={"name": "sglang"}))
    with pytest.raises(ConfigError, match=r"^system\.prefill\.max_num_seqs: .* a prefill worker's pool of 1 KV"):
        Simulation(config(tmp_path, sessions, {"prefill": {"num_blocks": 1}}, engine={"name": "sglang"}))
    # Setting the pool's field is enough; colocated, the config's field is the one named.
    Simulation(config(tmp_path, sessions, {"decode": {"num_blocks": 1, "max_num_seqs": 1}},
                      engine={"name": "sglang"}))
    with pytest.raises(ConfigError, match=r"^scheduler\.max_num_seqs: sglang derives no running-request cap from "
                                          r"a pool of 1 KV block; set it$"):
        Simulation(load_config({"engine": {"name": "sglang"}, "kv_cache": {"num_blocks": 1}}))


@pytest.mark.parametrize("engine, tokens", [("vllm", 65536), ("sglang", 16384), ("trtllm", 65536)])
def test_a_pools_own_step_limits_size_its_kv_memory(tmp_path, engine, tokens):
    """The memory left for KV depends on the step limits (the activation peak; SGLang's chunk size). A pool
    given its own max_num_batched_tokens and max_num_seqs used to be sized with the config's (vLLM: 27,792
    blocks for a 65,536-token prefill pool, where the same limits set for all give 25,491); now it holds
    what the same limits give set for every worker, and the other pool keeps the default's."""
    sessions = [one_call("a", 0.0, 10, 2)]
    limits = {"max_num_batched_tokens": tokens, "max_num_seqs": 4}
    own = Simulation(config(tmp_path, sessions, {"prefill": limits}, engine={"name": engine}))
    shared = Simulation(config(tmp_path, sessions, scheduler=limits, engine={"name": engine}))
    default = Simulation(load_config({"engine": {"name": engine}}))
    blocks = [w.sched.kv.num_blocks for w in own.workers]
    assert blocks[0] == shared.workers[0].sched.kv.num_blocks < default.workers[0].sched.kv.num_blocks
    assert blocks[1] == default.workers[0].sched.kv.num_blocks
