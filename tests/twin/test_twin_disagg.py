"""Disaggregation: hand-worked timelines of staged KV, pulls, leases, delta pulls, push; link sharing."""

import math

import attrs
import simpy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twin.config import load_config
from twin.core.errors import ConfigError, InvariantError
from twin.core.lifecycle import KVRecord, KVState
from twin.core.flows import FlowNetwork
from twin.shell.links import LinkSet
from twin.runner import Simulation, run
from workloads.io import write_sessions
from workloads.sessions import Call, Session


def one_call(sid, arrival, prompt, output):
    return Session(id=sid, arrival_s=arrival, calls=(Call(append_tokens=prompt, output_tokens=output),))


def disagg(tmp_path, sessions, *, p_blocks=None, d_blocks=None, **extra):
    path = tmp_path / "w.jsonl"
    write_sessions(path, sessions, source="test")
    system = {"kind": "disaggregated", "prefill": {"workers": 1}, "decode": {"workers": 1},
              "decode_router": {"kind": "session_affinity"}}
    if p_blocks:
        system["prefill"]["num_blocks"] = p_blocks
    if d_blocks:
        system["decode"]["num_blocks"] = d_blocks
    cfg = {"system": system, "workload": {"kind": "sessions", "path": str(path)}, **extra}
    return load_config(cfg)


def rows(res):
    return {r["session"]: r for r in res.requests}


def test_pull_waits_for_decode_capacity_and_staged_kv_blocks_prefill(tmp_path):
    # Decode holds 14 blocks: one 200-token request growing by 16 tokens (cdiv(215, 16) = 14). Prefill holds
    # 26 blocks: two staged 200-token prompts (13 blocks each), so the third must wait for a pull.
    sessions = [one_call(n, 0.0, 200, 16) for n in ("a", "b", "c")]
    res = run(disagg(tmp_path, sessions, p_blocks=26, d_blocks=14))
    r = rows(res)
    assert all(x["status"] == "finished" for x in r.values())
    # a and b are prefilled together in the first step; c waits in the prefill queue.
    assert r["a"]["first_scheduled_s"] == r["b"]["first_scheduled_s"] == 0.0
    # b's KV stays staged until a finishes on the decode worker and frees room.
    assert r["b"]["kv_pull_s"] == r["a"]["finish_s"]
    assert r["b"]["staged_wait_s"] == pytest.approx(r["a"]["finish_s"] - r["b"]["kv_staged_s"], abs=1e-9)
    # c is admitted on the prefill worker exactly when a's pull completed and released a's staged blocks.
    assert r["c"]["first_scheduled_s"] == r["a"]["kv_resident_s"]
    # TTFT includes the staged wait and the transfer (first token from the decode worker).
    assert r["b"]["first_token_s"] > r["b"]["kv_resident_s"] > r["b"]["kv_pull_s"]
    assert res.summary["kv_transfer"]["pulls"] == 3 and res.summary["kv_transfer"]["lease_expiries"] == 0


@pytest.mark.parametrize("caching", [True, False])
def test_decode_worker_registers_arrived_kv_only_with_prefix_caching(tmp_path, caching):
    """The KV a pull lands is registered in the decode worker's prefix cache (its 200-token prompt, 204 tokens
    when done: 12 full 16-token blocks) only where prefix caching is on; without it nothing is registered."""
    sim = Simulation(disagg(tmp_path, [one_call("a", 0.0, 200, 4)], kv_cache={"prefix_caching": caching}))
    res = sim.run()
    assert res.requests["status"][0] == "finished"
    decode = sim.system.decode[0]
    assert decode.sched.kv.pool.num_cached == (12 if caching else 0)


def test_each_pool_captures_graphs_for_its_own_batch_limit(tmp_path):
    """A pool's max_num_seqs sizes its workers' CUDA graphs (vLLM: up to 2 x max_num_seqs, at most 512)."""
    path = tmp_path / "w.jsonl"
    write_sessions(path, [one_call("a", 0.0, 100, 4)], source="test")
    cfg = load_config({"system": {"kind": "disaggregated", "prefill": {"workers": 1},
                                  "decode": {"workers": 1, "max_num_seqs": 8}},
                       "workload": {"kind": "sessions", "path": str(path)}})
    sim = Simulation(cfg)
    assert sim.system.prefill[0].prices.cost_model.max_capture == 512
    assert sim.system.decode[0].prices.cost_model.max_capture == 16


def test_delta_pull_moves_only_the_new_blocks_of_a_second_turn(tmp_path):
    s = Session(id="chat", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=20, wait_after_s=1.0),
                                                 Call(append_tokens=30, output_tokens=5)))
    sim = Simulation(disagg(tmp_path, [s]))
    res = sim.run()
    t = res.requests
    per_block = sim.system.p_dep.bytes_per_block(16)
    # Turn 1: 99 known tokens -> 7 blocks pulled. Decode then computes 100 + 19 tokens: 7 full blocks cached.
    assert (t["transfer_bytes"][0], t["reused_blocks"][0]) == (7 * per_block, 0)
    # Turn 2: 149 known tokens -> 10 blocks, of which the decode worker already caches the first 7.
    assert (t["transfer_bytes"][1], t["reused_blocks"][1]) == (3 * per_block, 7)
    assert res.summary["kv_transfer"]["blocks"] == 10 and res.summary["kv_transfer"]["reused_blocks"] == 7


def test_lease_expiry_then_recompute_on_the_decode_worker(tmp_path):
    # a holds 32 of the decode worker's 44 blocks from its pull on (growing to 44); b needs 13 to be pulled.
    sessions = [one_call("a", 0.0, 500, 200), one_call("b", 0.001, 200, 8)]
    res = run(disagg(tmp_path, sessions, d_blocks=44, transfer={"lease_s": 0.05}))
    r = rows(res)
    assert r["b"]["kv_expired_s"] == pytest.approx(r["b"]["kv_staged_s"] + 0.05, abs=1e-9)
    assert math.isnan(r["b"]["kv_pull_s"]) and r["b"]["kv_state"] == "freed"
    assert r["b"]["status"] == "finished" and r["b"]["output_tokens"] == 8
    assert r["b"]["first_token_s"] > r["b"]["kv_expired_s"]
    assert res.summary["kv_transfer"]["lease_expiries"] == 1 and res.summary["kv_transfer"]["pulls"] == 1


def test_a_recompute_after_lease_expiry_respects_seats_held_by_pulls_and_keeps_the_first_queue_time():
    """Decode worker with one seat, leases of 1 us, two requests at once (found by fuzzing). Request 0 is
    pulled; request 1's lease runs out while that pull holds the seat, so the decode worker queues it to
    recompute. It used to be admitted beside the arriving pull (2 running on 1 seat: InvariantError) and
    to report its expiry as its queue time. With first_token: prefill its discarded prefill token also
    stayed in its token times (6 for 5 tokens)."""
    work = {"kind": "synthetic", "num_requests": 2, "arrival": {"kind": "all_at_once"},
            "input_tokens": {"fixed": 100}, "output_tokens": {"fixed": 5}}
    for first in ("decode", "prefill"):
        cfg = load_config({"system": {"kind": "disaggregated", "decode": {"max_num_seqs": 1}},
                           "transfer": {"lease_s": 1e-6, "first_token": first}, "workload": work,
                           "metrics": {"record_token_times": True, "sample_interval_s": 0.001}})
        sim = Simulation(cfg, keep_requests=True)
        res = sim.run()
        t = res.requests
        assert list(t["status"]) == ["finished"] * 2 and math.isnan(t["kv_expired_s"][0])
        assert t["kv_expired_s"][1] > 0 and res.summary["kv_transfer"]["lease_expiries"] == 1
        assert list(t["queued_s"]) == [0.0, 0.0] and list(t["first_scheduled_s"]) == [0.0, 0.0]
        assert max(res.timeseries["decode0_running"]) == 1
        for req in sim.driver.requests:
            assert len(req.token_times_ns) == 5 and req.token_times_ns[0] == req.first_token_ns


def test_push_ablation_fails_what_the_pull_design_completes(tmp_path):
    sessions = [one_call(n, 0.0, 200, 16) for n in ("a", "b", "c")]
    pulled = run(disagg(tmp_path, sessions, p_blocks=26, d_blocks=14))
    pushed = run(disagg(tmp_path, sessions, p_blocks=26, d_blocks=14, transfer={"kind": "push"}))
    assert pulled.summary["requests"]["failed"] == 0
    r = rows(pushed)
    assert r["a"]["status"] == "finished"
    assert r["b"]["status"] == "failed" and "no room" in r["b"]["fail_reason"] and r["b"]["kv_state"] == "dropped"
    assert pushed.summary["kv_transfer"]["dropped"] >= 1
    # Aborted while its KV was pushed, b fails with the abort's reason, not with the drop's that followed.
    cfg = disagg(tmp_path, sessions, p_blocks=26, d_blocks=14, transfer={"kind": "push"})
    r, _ = run_aborting(cfg, "b", r["b"]["kv_staged_s"] + 1e-9)
    assert r["b"]["status"] == "failed" and r["b"]["fail_reason"] == "client went away"
    assert r["b"]["kv_state"] == "dropped"


def test_first_token_from_prefill_worker_option(tmp_path):
    sessions = [one_call("a", 0.0, 300, 4)]
    r = rows(run(disagg(tmp_path, sessions, transfer={"first_token": "prefill"})))["a"]
    assert r["first_token_s"] == r["kv_staged_s"] and r["output_tokens"] == 4


def test_one_token_answer_from_the_prefill_worker_ends_at_staging(tmp_path):
    # The prefill worker samples the only token asked for: the request finishes there, its staged KV is
    # freed at once (STAGED -> FREED), and no transfer or decode step follows. It used to be pulled and
    # decoded once more, ending with 2 output tokens.
    cfg = disagg(tmp_path, [one_call("a", 0.0, 100, 1)], transfer={"first_token": "prefill"},
                 metrics={"record_token_times": True})
    sim = Simulation(cfg, keep_requests=True)
    res = sim.run()
    r = rows(res)["a"]
    assert r["status"] == "finished" and r["output_tokens"] == 1 and r["kv_state"] == "freed"
    assert r["first_token_s"] == r["finish_s"] == r["kv_staged_s"]
    assert math.isnan(r["kv_pull_s"]) and res.summary["kv_transfer"]["pulls"] == 0
    assert math.isnan(res.summary["kv_transfer"]["staged_s"]["mean"])  # it never waited for a decode worker
    req = sim.driver.requests[0]
    assert req.token_times_ns == [req.first_token_ns]
    assert sim.workers[1].ledger.steps == 0  # the decode worker never ran


def test_output_token_counters_count_each_delivered_token_once(tmp_path):
    """With first_token: decode the prefill worker's sampled token is dropped (the decode worker samples the
    first token again): it used to be counted as generated output, one token per request too many in the
    time series' token rate and serve's generation_tokens_total. With first_token: prefill it is the
    request's first output and counts."""
    sessions = [one_call("a", 0.0, 300, 4), one_call("b", 0.01, 200, 6)]
    for first, on_prefill in (("decode", 0), ("prefill", 2)):
        sim = Simulation(disagg(tmp_path, sessions, transfer={"first_token": first}))
        res = sim.run()
        assert int(res.requests["output_tokens"].sum()) == 10
        assert [w.sched.output_tokens for w in sim.workers] == [on_prefill, 10 - on_prefill]


def test_two_transfers_share_a_link_max_min_fairly():
    env = simpy.Environment()
    links = LinkSet(env, FlowNetwork({"l": 10e9}))
    done = {}

    def flow(name, start_ns, nbytes):
        yield env.timeout(start_ns)
        yield links.transfer(name, nbytes, ["l"])
        done[name] = env.now

    env.process(flow("A", 0, 100e6))
    env.process(flow("B", 5_000_000, 30e6))
    env.run()
    # A alone for 5 ms (50 MB), then 5 GB/s each: B's 30 MB take 6 ms (11 ms); A's last 20 MB at 10 GB/s: 13 ms.
    assert done == {"B": 11_000_000, "A": 13_000_000}


def test_max_min_fairness_across_two_links():
    net = FlowNetwork({"x": 10.0, "y": 4.0})
    net.add("f1", 100, ["x"], 0)
    net.add("f2", 100, ["x", "y"], 0)
    net.add("f3", 100, ["y"], 0)
    # y is the bottleneck: f2 and f3 get 2 each; f1 takes what x has left: 8.
    assert {f.fid: f.rate for f in net.flows.values()} == {"f1": 8.0, "f2": 2.0, "f3": 2.0}


def test_illegal_kv_transition_raises():
    rec = KVRecord(1, 0)
    rec.to(KVState.STAGED, 5)
    with pytest.raises(InvariantError, match="STAGED -> RESIDENT"):
        rec.to(KVState.RESIDENT, 6)


calls = st.builds(lambda a, o, w: Call(append_tokens=a, output_tokens=o, wait_after_s=w),
                  st.integers(1, 300), st.integers(1, 40), st.sampled_from([0.0, 0.01, 0.2]))


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 6))
    sessions = [Session(id=f"s{i}", arrival_s=draw(st.sampled_from([0.0, 0.001, 0.05, 0.3])),
                        **(dict(prefix_group="sys", prefix_tokens=32) if draw(st.booleans()) else {}),
                        calls=tuple(draw(st.lists(calls, min_size=1, max_size=3)))) for i in range(n)]
    system = {"kind": "disaggregated",
              "prefill": {"workers": draw(st.integers(1, 2)), "num_blocks": draw(st.integers(8, 60))},
              "decode": {"workers": draw(st.integers(1, 2)), "num_blocks": draw(st.integers(8, 60)),
                         "max_num_seqs": draw(st.sampled_from([None, 1, 3]))},
              "decode_router": {"kind": draw(st.sampled_from(["least_loaded", "session_affinity", "kv_aware"]))}}
    transfer = {"kind": draw(st.sampled_from(["pull", "push"])), "layerwise": draw(st.booleans()),
                "first_token": draw(st.sampled_from(["decode", "prefill"])),
                "lease_s": draw(st.sampled_from([None, 0.02, 1.0])),
                "decode_headroom_blocks": draw(st.integers(0, 2)),
                "max_handoffs_per_s": draw(st.sampled_from([None, 50.0]))}
    if transfer["kind"] == "push":  # (pacing is refused there: it paces pulls)
        transfer["max_handoffs_per_s"] = None
    return sessions, system, transfer


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenarios())
def test_property_every_request_ends_and_every_block_is_released(tmp_path, scenario):
    sessions, system, transfer = scenario
    path = tmp_path / "p.jsonl"
    write_sessions(path, sessions, source="hypothesis")
    cfg = load_config({"system": system, "transfer": transfer, "workload": {"kind": "sessions", "path": str(path)},
                       "router": {"kind": "least_loaded"}, "metrics": {"sample_interval_s": 0.05}})
    sim = Simulation(cfg, keep_requests=True)
    res = sim.run()  # raises on a stall, an illegal transition or a leaked block (run.check_invariants)
    t = res.requests
    for row in t:
        assert row["status"] in ("finished", "failed")
        if row["status"] == "failed":
            assert row["fail_reason"]
        assert row["kv_state"] in ("freed", "dropped", "failed")
    for w in sim.workers:
        assert w.sched.kv.pool.num_used == 0 and not w.sched.kv.req_blocks
    for req in sim.driver.requests:  # a finished request sampled exactly what it asked for
        assert req.status.name != "FINISHED" or req.num_output_tokens == req.max_output_tokens


def test_headroom_is_capped_by_the_request_size_so_an_empty_decode_worker_can_always_pull(tmp_path):
    # 98-token prompt + 1 output: 7 blocks; 2 headroom blocks would ask for 9 of the decode worker's 8.
    res = run(disagg(tmp_path, [one_call("a", 0.0, 98, 1)], p_blocks=8, d_blocks=8,
                     transfer={"decode_headroom_blocks": 2, "lease_s": None}))
    assert res.summary["requests"]["completed"] == 1


def run_aborting(cfg, session, at_s, reason="client went away"):
    """Run ``cfg`` and abort the request of ``session`` at ``at_s`` (as serve does when its client leaves)."""
    sim = Simulation(cfg, keep_requests=True)

    def aborter():
        yield sim.env.timeout(round(at_s * 1e9))
        req = next(r for r in sim.driver.requests if r.session == session)
        sim.system.abort(req, reason)

    sim.env.process(aborter())
    res = sim.run()
    assert all(not w.sched.kv.req_blocks and not w.sched.running and not len(w.sched.waiting)
               for w in sim.workers)  # every block of every request released, nothing left behind
    return rows(res), res


def test_abort_in_each_kv_state_frees_everything_and_lets_the_next_request_in(tmp_path):
    """The staging scenario above (a decodes, b's KV staged, c queued for prefill), with one request aborted
    per run: b while staged (dropped at once, its staged blocks freed on the prefill worker), b while its
    KV crosses the link (dropped as it lands), a while decoding (dropped at the decode worker's next step
    boundary, which lets b be pulled there and then), c during its prefill (the stage fails at the end of
    the prefill step)."""
    sessions = [one_call(n, 0.0, 200, 16) for n in ("a", "b", "c")]
    cfg = disagg(tmp_path, sessions, p_blocks=26, d_blocks=14, metrics={"record_token_times": True})
    ref_res = run(cfg)
    ref = rows(ref_res)
    a, b, c = ref["a"], ref["b"], ref["c"]
    a_tokens = ref_res.token_times[int(a["id"])]

    t = (a["kv_resident_s"] + a["finish_s"]) / 2  # b staged
    r, res = run_aborting(cfg, "b", t)
    assert r["b"]["status"] == "failed" and r["b"]["fail_reason"] == "client went away"
    assert r["b"]["finish_s"] == pytest.approx(t, abs=1e-9) and r["b"]["kv_state"] == "freed"
    assert math.isnan(r["b"]["kv_pull_s"]) and r["b"]["output_tokens"] == 0
    assert r["c"]["status"] == r["a"]["status"] == "finished"
    assert r["c"]["kv_pull_s"] == r["a"]["finish_s"]  # c is pulled where b would have been
    assert res.summary["requests"]["failed"] == 1 and res.summary["kv_transfer"]["pulls"] == 2

    t = (b["kv_pull_s"] + b["kv_resident_s"]) / 2  # b's KV in flight
    r, _ = run_aborting(cfg, "b", t)
    assert r["b"]["status"] == "failed" and r["b"]["kv_state"] == "freed"
    assert r["b"]["kv_resident_s"] == b["kv_resident_s"] and r["b"]["finish_s"] == b["kv_resident_s"]

    t = (a["kv_resident_s"] + a["finish_s"]) / 2  # a decoding
    r, _ = run_aborting(cfg, "a", t)
    steps = [s for s in a_tokens if s >= t]
    assert r["a"]["status"] == "failed" and r["a"]["finish_s"] == steps[0]
    assert r["a"]["output_tokens"] == sum(1 for s in a_tokens if s <= steps[0])
    assert r["a"]["kv_state"] == "freed" and r["b"]["kv_pull_s"] == steps[0]
    assert r["b"]["status"] == r["c"]["status"] == "finished"

    t = c["first_scheduled_s"] + 1e-6  # in the step that prefills c's whole prompt: its KV is staged, and freed
    r, _ = run_aborting(cfg, "c", t)
    assert r["c"]["status"] == "failed" and r["c"]["fail_reason"] == "client went away"
    assert r["c"]["finish_s"] == r["c"]["kv_staged_s"] == c["kv_staged_s"] and r["c"]["kv_state"] == "freed"
    assert r["a"]["status"] == r["b"]["status"] == "finished"

    chunked = disagg(tmp_path, sessions, p_blocks=26, d_blocks=14, scheduler={"max_num_batched_tokens": 64})
    c = rows(run(chunked))["c"]
    t = c["first_scheduled_s"] + 1e-6  # c's prompt in the first of its four 64-token chunks: the stage fails
    r, _ = run_aborting(chunked, "c", t)
    assert r["c"]["status"] == "failed" and r["c"]["fail_reason"] == "prefill: client went away"
    assert r["c"]["kv_state"] == "failed" and math.isnan(r["c"]["kv_staged_s"])
    assert r["c"]["finish_s"] < c["kv_staged_s"]


def test_disaggregated_bookkeeping_found_by_fuzzing(tmp_path):
    """Each of these disagreed with its definition:
    * host hits found by the prefill stage never reached the request (host_hit_tokens stayed 0);
    * a 1-token answer finished on the prefill worker kept worker -1;
    * a push sends every block, yet counted the blocks the decode worker had cached as reused;
    * a request with no block to move (1-token prompt) had a transfer time in the table, not the summary."""
    shared = dict(prefix_group="sys", prefix_tokens=64)
    sessions = [Session(id="a", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=2),), **shared),
                one_call("b", 1.0, 300, 2),
                Session(id="c", arrival_s=2.0, calls=(Call(append_tokens=100, output_tokens=2),), **shared)]
    r = rows(run(disagg(tmp_path, sessions, p_blocks=20, kv_cache={"host_memory_gib": 1.0})))
    # b takes 19 of the prefill worker's 20 blocks: the 13 never used and 6 of a's 7 freed ones, tail first
    # (freed tail first, they are evicted in that order, and demoted to host memory). c's 64-token prefix
    # hits a's first block on the GPU and its next three in host memory.
    assert (r["c"]["cached_tokens"], r["c"]["host_hit_tokens"]) == (64, 48)
    assert r["a"]["host_hit_tokens"] == r["b"]["host_hit_tokens"] == 0

    r = rows(run(disagg(tmp_path, [one_call("a", 0.0, 100, 1)], transfer={"first_token": "prefill"})))
    assert r["a"]["worker"] == r["a"]["prefill_worker"] == 0

    prefixed = [Session(id=n, arrival_s=float(i), calls=(Call(append_tokens=161, output_tokens=4),), **shared)
                for i, n in enumerate("ab")]
    res = run(disagg(tmp_path, prefixed, transfer={"kind": "push"}))
    r = rows(res)
    assert r["b"]["cached_tokens"] == 64 and r["b"]["reused_blocks"] == 0  # (its prefill hit; the push sent all)
    # Prompt 64 + 161 = 225 tokens; all but the last, 224, are sent: 14 blocks each.
    assert res.summary["kv_transfer"]["blocks"] == 2 * 14 and res.summary["kv_transfer"]["reused_blocks"] == 0

    res = run(disagg(tmp_path, [one_call("a", 0.0, 1, 4)]))
    assert res.requests["transfer_s"][0] == res.summary["kv_transfer"]["transfer_s"]["mean"] > 0


def test_first_token_resampled_after_a_lease_runs_out_counts_once(tmp_path):
    """first_token: prefill; b's lease runs out and the decode worker samples its first token again: that
    token used to count twice in the workers' output counters (the time series' token rate)."""
    sessions = [one_call("a", 0.0, 500, 200), one_call("b", 0.001, 200, 8)]
    sim = Simulation(disagg(tmp_path, sessions, d_blocks=44, transfer={"lease_s": 0.05, "first_token": "prefill"}))
    res = sim.run()
    assert res.summary["kv_transfer"]["lease_expiries"] == 1
    assert sum(w.sched.output_tokens for w in sim.workers) == int(res.requests["output_tokens"].sum()) == 208


def test_sglang_decode_worker_refuses_what_its_admission_could_never_take(tmp_path):
    """SGLang's admission wants fewer tokens than are free: a 50 + 100 request on a 150-token decode pool
    was pulled, retracted and never admitted again (a stall). It fails at staging with the reason."""
    res = run(disagg(tmp_path, [one_call("a", 0.0, 50, 100), one_call("b", 0.0, 50, 99)], d_blocks=150,
                     engine={"name": "sglang"}, kv_cache={"prefix_caching": False}))
    r = rows(res)
    assert r["a"]["status"] == "failed" and r["a"]["fail_reason"].startswith(
        "decode: SGLang's admission needs fewer than the 150 KV tokens worker 1 holds free")
    assert r["b"]["status"] == "finished"


def test_an_abort_that_frees_the_decode_worker_lets_a_staged_request_be_pulled_fast_forward_or_not(tmp_path):
    """a decodes alone on a 45-block decode worker (fast-forwarded), b's KV is staged and cannot fit yet;
    a is aborted at the instant b is staged. At that boundary the aborts were applied after the pulls had
    been tried, and with fast-forward on nothing tried them again: b stayed staged forever (StallError).
    Fast-forward on and off now give the same rows, b pulled at a's abort boundary."""
    sessions = [one_call("a", 0.0, 600, 100), one_call("b", 0.05, 200, 20)]
    cfg = disagg(tmp_path, sessions, d_blocks=45)
    b_staged = rows(run(cfg))["b"]["kv_staged_s"]
    for ff in (True, False):
        r, res = run_aborting(attrs.evolve(cfg, run=attrs.evolve(cfg.run, fast_forward=ff)), "a", b_staged)
        assert r["a"]["status"] == "failed" and r["b"]["status"] == "finished"
        assert r["b"]["kv_pull_s"] == r["a"]["finish_s"]
        res.write(tmp_path / f"ff_{ff}")
    on, off = (tmp_path / f"ff_{ff}" / "requests.csv" for ff in (True, False))
    assert on.read_bytes() == off.read_bytes()


def test_output_counters_match_the_table_when_first_token_prefill_requests_are_aborted(tmp_path):
    """first_token: prefill. Aborted in the prefill step that stages it, a request still gets the first
    token that step samples (its row said 0 while the counters had 1); aborted after its lease ran out and
    before the decode worker samples again, its voided first token leaves the counters (they had 1, the
    row 0)."""
    cfg = disagg(tmp_path, [one_call("a", 0.0, 300, 10)], transfer={"first_token": "prefill"})
    a = rows(run(cfg))["a"]
    sim_rows, res = run_aborting(cfg, "a", a["first_scheduled_s"] + 1e-6)
    assert sim_rows["a"]["output_tokens"] == 1 and sim_rows["a"]["first_token_s"] == a["first_token_s"]
    assert sim_rows["a"]["status"] == "failed" and sim_rows["a"]["kv_state"] == "freed"

    sessions = [one_call("a", 0.0, 500, 200), one_call("b", 0.001, 200, 8)]
    cfg = disagg(tmp_path, sessions, d_blocks=44, transfer={"lease_s": 0.05, "first_token": "prefill"})
    b = rows(run(cfg))["b"]
    sim = Simulation(cfg, keep_requests=True)

    def aborter():
        yield sim.env.timeout(round(b["kv_expired_s"] * 1e9) + 1)  # requeued on the decode worker, not run
        sim.system.abort(next(r for r in sim.driver.requests if r.session == "b"), "gone")

    sim.env.process(aborter())
    res = sim.run()
    t = res.requests
    assert list(t["status"]) == ["finished", "failed"] and list(t["output_tokens"]) == [200, 0]
    assert sum(w.sched.output_tokens for w in sim.workers) == 200


def test_a_lease_expiry_clears_the_prefill_host_hit_with_the_prefill_prefix_hit():
    """Found by fuzzing: a request whose staged KV expired had its cached_tokens reset (the decode worker
    records its own hit when it admits the request) but kept the prefill stage's host_hit_tokens; one that
    ended before that admission (here at run.max_sim_s) showed more host-hit tokens than cached tokens, in
    its row and in summary.prefix_cache."""
    cfg = {"model": {"name": "Qwen/Qwen3-0.6B"},
           "kv_cache": {"block_size": 4, "num_blocks": 116, "host_memory_gib": 0.1},
           "scheduler": {"max_num_seqs": 1},
           "workload": {"kind": "lmbenchmark_multiround", "num_users": 3, "num_rounds": 2, "qps": 2000.0,
                        "shared_system_prompt": 47, "user_history_prompt": 77, "answer_len": 21},
           "run": {"max_sim_s": 0.1},
           "system": {"kind": "disaggregated", "prefill": {"workers": 1}, "decode": {"workers": 1}},
           "transfer": {"lease_s": 0.001}}
    sim = Simulation(load_config(cfg))
    res = sim.run()
    t = res.requests
    assert sim.system.lease_expiries and (t["status"] == "failed").any()
    assert (t["host_hit_tokens"] <= t["cached_tokens"]).all()
    hits = res.summary["prefix_cache"]
    assert hits["host_hit_tokens"] <= hits["cached_tokens"]


@pytest.mark.parametrize("kind", ["pull", "push"])
def test_a_request_longer_than_max_model_len_fails_when_it_arrives(kind):
    """Found by fuzzing: a disaggregated system checked engine.max_model_len only against the prefill stage
    (its prompt + 1 token), and the KV reached the decode worker by a pull or a push, which checked nothing:
    a 60 + 60 token request under max_model_len 100 finished, where a colocated system refuses it."""
    for output, status in ((60, "failed"), (40, "finished")):
        cfg = {"model": {"name": "Qwen/Qwen3-0.6B"}, "engine": {"max_model_len": 100},
               "system": {"kind": "disaggregated"}, "transfer": {"kind": kind},
               "workload": {"kind": "synthetic", "num_requests": 2, "arrival": {"kind": "all_at_once"},
                            "input_tokens": {"fixed": 60}, "output_tokens": {"fixed": output}}}
        rows = Simulation(load_config(cfg)).run().requests
        colocated = Simulation(load_config({**cfg, "system": {"kind": "colocated"}, "transfer": {}})).run().requests
        assert list(rows["status"]) == list(colocated["status"]) == [status] * 2
        assert list(rows["fail_reason"]) == list(colocated["fail_reason"])
        if status == "failed":
            assert "more than the engine's max_model_len 100" in rows["fail_reason"][0]
            assert all(math.isnan(t) for t in rows["first_scheduled_s"])  # refused on arrival: no prefill


@pytest.mark.parametrize("engine, per_prompt", [("vllm", lambda blocks, layers: blocks * layers),
                                                ("sglang", lambda blocks, layers: layers),
                                                ("trtllm", lambda blocks, layers: 1)])
def test_transfer_descriptors_are_cut_as_the_engines_connector_cuts_them(tmp_path, engine, per_prompt):
    """vLLM's NIXL connector posts one descriptor per block per layer, SGLang's merges a request's pages
    into one run per layer, TensorRT-LLM's sends one contiguous buffer: with every other transfer cost off,
    a hand-off takes exactly descriptors x per_descriptor_s."""
    def transfer_s(per: float) -> tuple[float, Simulation]:
        sim = Simulation(disagg(tmp_path, [one_call("a", 0.0, 100, 4)], engine={"name": engine},
                                transfer={"per_descriptor_s": per, "setup_latency_s": 0.0}))
        return float(sim.run().requests["transfer_s"][0]), sim

    per = 1e-3
    slow, sim = transfer_s(per)
    bytes_only, _ = transfer_s(0.0)
    system = sim.system
    blocks = -(-99 // system.block_size)          # the 99 tokens prefilled before the first sampled one
    want = per_prompt(blocks, system.p_dep.layers_per_gpu)
    assert system._descriptors(blocks) == want
    assert slow - bytes_only == pytest.approx(want * per, abs=2e-9)


def test_a_tensorrt_llm_hand_off_larger_than_its_send_buffer_takes_one_descriptor_per_buffer_full(tmp_path):
    from hardware.engine import TRANSFER_BUFFER_BYTES

    system = Simulation(disagg(tmp_path, [one_call("a", 0.0, 100, 4)], engine={"name": "trtllm"})).system
    per_block = system.p_dep.bytes_per_block(system.block_size)     # one GPU's share of a block
    fits = TRANSFER_BUFFER_BYTES // per_block
    assert system._descriptors(0) == 0
    assert system._descriptors(fits) == 1
    assert system._descriptors(fits + 1) == 2
    assert system._descriptors(2 * fits + 1) == 3


def test_an_unknown_transfer_cut_is_refused_with_the_valid_ones():
    from hardware import load_engine

    with pytest.raises(ValueError, match="engine 'vllm': unknown kv_transfer_pieces 'pages'; "
                                         "valid: block, layer, buffer"):
        attrs.evolve(load_engine("vllm"), kv_transfer_pieces="pages")


def test_the_transfer_section_can_name_another_connectors_cut(tmp_path):
    """transfer.pieces overrides the engine's: vLLM with a connector that merges a request's pages posts one
    descriptor per layer; a value outside the three is refused naming the field."""
    cfg = disagg(tmp_path, [one_call("a", 0.0, 100, 4)], transfer={"pieces": "layer"})
    system = Simulation(cfg).system
    assert system.p_dep.engine.kv_transfer_pieces == "block"
    assert system._descriptors(7) == system.p_dep.layers_per_gpu
    with pytest.raises(ConfigError, match=r"transfer\.pieces: pieces must be one of \['block', 'layer', "
                                          r"'buffer'\], got 'pages'"):
        disagg(tmp_path, [one_call("a", 0.0, 100, 4)], transfer={"pieces": "pages"})


def test_pull_sends_the_requests_state_with_its_blocks(tmp_path):
    """A hybrid model (Qwen3.5-27B: gated-DeltaNet state per request) pulls its state with its KV blocks: the
    bytes moved are the pulled blocks' plus the state's, on every turn, however many blocks the decode
    worker already holds."""
    s = Session(id="chat", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=20, wait_after_s=1.0),
                                                 Call(append_tokens=30, output_tokens=5)))
    cfg = disagg(tmp_path, [s], model={"name": "Qwen/Qwen3.5-27B"}, hardware={"gpu": "h200_sxm"})
    sim = Simulation(cfg)
    res = sim.run()
    t = res.requests
    dep = sim.system.p_dep
    per_block, state = dep.bytes_per_block(16), dep.state_bytes_per_request
    assert state > 0 and sim.system.decode[0].sched.kv.state_blocks == dep.state_blocks_per_request(16)
    assert t["transfer_bytes"][0] == 7 * per_block + state
    assert (t["transfer_bytes"][1], t["reused_blocks"][1]) == (3 * per_block + state, 7)


def test_a_decode_pool_of_ep_48_runs_with_32_redundant_expert_slots():
    """DeepSeek-R1's 256 experts do not split over 48 GPUs; 32 redundant slots make 288, 6 a GPU (SGLang
    --ep-num-redundant-experts 32 on GB300). The pool builds, holds the extra experts' weights and runs."""
    system = {"kind": "disaggregated", "prefill": {"workers": 1, "tp": 4},
              "decode": {"workers": 1, "tp": 1, "ep": 48, "attention_dp": 48, "redundant_experts": 32},
              "gpus_per_node": 48}
    base = {"model": {"name": "deepseek-ai/DeepSeek-R1", "weight_dtype": "fp4"}, "hardware": {"gpu": "gb300"},
            "engine": {"name": "sglang"}, "workload": {"num_requests": 4}, "run": {"seed": 0}}
    sim = Simulation(load_config({**base, "system": system}))
    f = next(g for _, g in sim.system.d_dep.model.layers if g is not None and g.kind == "moe")
    assert sim.system.d_dep.redundant_experts == 32 and sim.system.d_dep.experts_per_gpu(f) == 6
    assert sim.system.p_dep.redundant_experts == 0
    res = sim.run()
    assert res.summary["requests"]["completed"] == 4
    few = {**system, "decode": {**system["decode"], "redundant_experts": 16}}
    with pytest.raises(ConfigError) as info:
        Simulation(load_config({**base, "system": few}))
    assert info.value.path == "system.decode.redundant_experts"
    assert "redundant_experts=32 would make it divide" in str(info.value)
