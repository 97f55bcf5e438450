"""End-to-end runs: event times in a tiny scenario, prefix hits across turns, failures, stalls, determinism."""

import json
import re
from pathlib import Path

import attrs
import numpy as np
import pytest

from hardware import BatchShape
from twin.config import RouterSpec, load_config
from twin.core.errors import ConfigError, StallError
from twin.registry import register
from twin.runner import Simulation, run
from twin.system import check_run_blocks, cost_model, make_deployment
from workloads.io import write_sessions
from workloads.sessions import Call, Session


def small_config(**sections):
    base = {
        "workload": {"kind": "synthetic", "num_requests": 40, "arrival": {"kind": "poisson", "rate_per_s": 20.0},
                     "input_tokens": {"low": 50, "high": 400}, "output_tokens": {"low": 5, "high": 40}},
        "metrics": {"sample_interval_s": 0.5},
    }
    base.update(sections)
    return load_config(base)


def sessions_config(tmp_path: Path, sessions, **sections):
    path = tmp_path / "w.jsonl"
    write_sessions(path, sessions, source="test")
    return load_config({"workload": {"kind": "sessions", "path": str(path)}, **sections})


def test_single_request_timeline_matches_the_cost_model(tmp_path):
    """One 100-token prompt, 3 output tokens, alone: TTFT is one prefill step, then two decode steps."""
    cfg = sessions_config(tmp_path, [Session(id="s", arrival_s=0.25, calls=(Call(append_tokens=100,
                                                                              output_tokens=3),))])
    sim = Simulation(cfg)
    cm = cost_model(sim.config, make_deployment(sim.config, 1))
    prefill = cm.step_time_ns(BatchShape(num_reqs=1, num_decode=0, new_tokens=100, sum_kv=100, sum_q_kv=10000,
                                         sum_q_sq=10000))
    decode1 = cm.step_time_ns(BatchShape(num_reqs=1, num_decode=1, new_tokens=1, sum_kv=101, sum_q_kv=101,
                                         sum_q_sq=1))
    decode2 = cm.step_time_ns(BatchShape(num_reqs=1, num_decode=1, new_tokens=1, sum_kv=102, sum_q_kv=102,
                                         sum_q_sq=1))
    row = sim.run().requests[0]
    t0 = 250_000_000
    assert row["first_scheduled_s"] == t0 / 1e9
    assert row["first_token_s"] == (t0 + prefill) / 1e9
    assert row["finish_s"] == (t0 + prefill + decode1 + decode2) / 1e9
    assert row["max_itl_s"] == max(decode1, decode2) / 1e9
    assert row["status"] == "finished" and row["output_tokens"] == 3


def test_second_turn_hits_the_first_turns_blocks(tmp_path):
    s = Session(id="chat", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=20, wait_after_s=2.0),
                                                 Call(append_tokens=30, output_tokens=10)))
    res = run(sessions_config(tmp_path, [s]))
    t = res.requests
    assert list(t["prompt_tokens"]) == [100, 150]
    # Turn 1 computed 100 prompt + 19 output tokens (the last sampled token is never fed back): 7 full blocks.
    assert list(t["cached_tokens"]) == [0, 112]
    # The tool wait separates the turns exactly.
    assert t["arrival_s"][1] == pytest.approx(t["finish_s"][0] + 2.0, abs=1e-9)
    assert res.summary["prefix_cache"]["hit_rate"] == pytest.approx(112 / 250)


def test_shared_system_prompt_is_cached_across_sessions(tmp_path):
    sessions = [Session(id=f"u{i}", arrival_s=float(i), prefix_group="sys", prefix_tokens=64,
                        calls=(Call(append_tokens=40, output_tokens=4),)) for i in range(3)]
    t = run(sessions_config(tmp_path, sessions)).requests
    assert list(t["cached_tokens"]) == [0, 64, 64]


def test_request_that_can_never_fit_fails_and_others_complete(tmp_path):
    sessions = [Session(id="big", arrival_s=0.0, calls=(Call(append_tokens=5000, output_tokens=10),)),
                Session(id="ok", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=10),))]
    res = run(sessions_config(tmp_path, sessions, kv_cache={"num_blocks": 100}))
    t = res.requests
    assert list(t["status"]) == ["failed", "finished"]
    assert "needs 314 KV blocks" in t["fail_reason"][0]
    assert res.summary["requests"] == {"submitted": 2, "completed": 1, "failed": 1, "pending": 0}
    # One-call sessions are sent without a process of their own; their finish (or failure at the door)
    # still closes the session.
    assert res.summary["sessions"] == {"started": 2, "finished": 1, "failed": 1, "skipped": 0, "unfinished": 0,
                                       "subagents": {"started": 0, "finished": 0, "failed": 0, "unfinished": 0}}


def test_request_above_max_model_len_fails_at_the_door(tmp_path):
    """As vLLM refuses prompt + max_tokens above max_model_len: 100 + 51 > 150 fails with its reason,
    100 + 50 runs. The default limit is the model's context length (Llama-3.1-8B: 131,072), and a limit
    above it is a config error naming the field."""
    sessions = [Session(id="long", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=51),)),
                Session(id="ok", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=50),))]
    t = run(sessions_config(tmp_path, sessions, engine={"max_model_len": 150})).requests
    assert list(t["status"]) == ["failed", "finished"]
    assert t["fail_reason"][0] == ("asks for 151 tokens (100 prompt + 51 output), more than the engine's "
                                   "max_model_len 150")
    at_limit = [Session(id="edge", arrival_s=0.0, calls=(Call(append_tokens=131_000, output_tokens=72),)),
                Session(id="over", arrival_s=0.0, calls=(Call(append_tokens=131_000, output_tokens=73),))]
    t = run(sessions_config(tmp_path, at_limit, kv_cache={"num_blocks": 9000})).requests
    assert list(t["status"]) == ["finished", "failed"]
    assert t["fail_reason"][1].endswith("more than the engine's max_model_len 131072")
    with pytest.raises(ConfigError, match="engine.max_model_len.*131073 is more than .*context length, 131072"):
        Simulation(sessions_config(tmp_path, sessions, engine={"max_model_len": 131_073}))


@pytest.mark.parametrize("kind", ["colocated", "disaggregated"])
def test_a_request_above_max_model_len_gets_no_block_keys(tmp_path, kind):
    """Found by fuzzing: the client computed the block keys of a request's whole prompt and output before
    the engine refused it for max_model_len, so a trace row asking for 10**12 tokens ran for hours in all the
    memory there was; so did a prefix group's keys, computed when its first session starts. Refused on
    arrival, the request has none (its keys are never read), nor has a prefix that reaches max_model_len;
    the requests beside them are served as before (10**7 tokens: 625,000 keys of 16 tokens)."""
    sessions = [Session(id="huge", arrival_s=0.0, calls=(Call(append_tokens=10**7, output_tokens=10),)),
                Session(id="ok", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=50),)),
                Session(id="prefixed", arrival_s=0.0, prefix_group="g", prefix_tokens=10**7,
                        calls=(Call(append_tokens=0, output_tokens=1),))]
    sim = Simulation(sessions_config(tmp_path, sessions, system={"kind": kind}, engine={"max_model_len": 150}),
                     keep_requests=True)
    t = sim.run().requests
    assert list(t["status"]) == ["failed", "finished", "failed"]
    assert t["fail_reason"][0] == ("asks for 10000010 tokens (10000000 prompt + 10 output), more than the "
                                   "engine's max_model_len 150")
    huge, ok, prefixed = sim.driver.requests
    assert huge.block_keys == prefixed.block_keys == () and len(ok.block_keys) == 150 // 16
    assert [seq._keys for seq in sim.driver._prefixes.values()] == [{}]


def test_abort_drops_a_running_and_a_queued_request_at_the_next_step_boundary(tmp_path):
    """One seat: a (100 + 50) runs, b waits. a is aborted mid-step at t: the step in progress still gives it
    its token, then it leaves, its KV freed, and b is admitted at that boundary. b, aborted while queued,
    leaves at the next boundary without ever running. Fast-forward on or off, the same."""
    sessions = [Session(id=n, arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=50),)) for n in "ab"]
    for ff in (True, False):
        cfg = sessions_config(tmp_path, sessions, scheduler={"max_num_seqs": 1},
                              metrics={"record_token_times": True}, run={"fast_forward": ff})
        ref = run(cfg)
        a_times = ref.token_times[0]
        t = (a_times[10] + a_times[11]) / 2

        def aborting(name, at_s):
            sim = Simulation(cfg, keep_requests=True)

            def aborter():
                yield sim.env.timeout(round(at_s * 1e9))
                req = next(r for r in sim.driver.requests if r.session == name)
                sim.system.abort(req, "gone")

            sim.env.process(aborter())
            res = sim.run()
            assert not sim.workers[0].sched.kv.req_blocks
            return {r["session"]: r for r in res.requests}

        r = aborting("a", t)
        assert r["a"]["status"] == "failed" and r["a"]["fail_reason"] == "gone"
        assert r["a"]["finish_s"] == a_times[11] and r["a"]["output_tokens"] == 12
        assert r["b"]["first_scheduled_s"] == a_times[11] and r["b"]["status"] == "finished"
        r = aborting("b", t)
        assert r["b"]["status"] == "failed" and r["b"]["finish_s"] == a_times[11]
        assert np.isnan(r["b"]["first_scheduled_s"]) and r["b"]["output_tokens"] == 0
        assert r["a"]["finish_s"] == ref.requests["finish_s"][0]  # a never noticed


def _same_outputs(a, b, tmp_path: Path) -> bool:
    """requests.csv, timeseries.csv and ledger.json of two runs are the same bytes."""
    a.write(tmp_path / "a")
    b.write(tmp_path / "b")
    return all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
               for f in ("requests.csv", "timeseries.csv", "ledger.json"))


def test_a_request_reaching_a_fast_forwarded_worker_as_its_step_ends_waits_for_the_step_formed_then(tmp_path):
    """Two replicas run identical 1-token prompts, so their step ends fall on the same nanosecond. s1's first
    call finishes on worker 1 at T and its second call goes to worker 0 (round robin), whose step also ends
    at T. Step by step, worker 0's step end comes first at T (its priority is lower) and its next step is
    formed before the call arrives; the call is admitted at the step after. Fast-forwarded, worker 0 has no
    event at T: it cut its run at T itself and admitted the call a step early (s0 finished 0.46 ms late, and
    the call's first token came 1.5 ms early; found by fuzzing)."""
    sessions = [Session(id="s0", arrival_s=0.0, calls=(Call(append_tokens=1, output_tokens=5),)),
                Session(id="s1", arrival_s=0.0, calls=(Call(append_tokens=1, output_tokens=3),
                                                      Call(append_tokens=1, output_tokens=1)))]
    res = {}
    for ff in (True, False):
        res[ff] = run(sessions_config(tmp_path, sessions, kv_cache={"num_blocks": 100},
                                      scheduler={"max_num_seqs": 4}, system={"kind": "colocated", "replicas": 2},
                                      router={"kind": "round_robin"}, metrics={"record_token_times": True},
                                      run={"fast_forward": ff}))
    off = res[False]
    s0, call = off.token_times[0], off.token_times[2]
    assert off.requests["worker"][2] == 0 and off.token_times[1][-1] == s0[2]  # the call leaves at s0's 3rd step end
    assert off.requests["first_scheduled_s"][2] == s0[4]  # admitted with the step formed at s0's last token
    assert _same_outputs(res[True], off, tmp_path) and res[True].token_times == off.token_times
    assert call[0] > s0[4]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_an_abort_sent_as_a_fast_forwarded_workers_step_ends_takes_effect_at_the_next_boundary(tmp_path, engine):
    """The same tie with an abort: when s1's request finishes on worker 1 at T, its callback aborts s0's on
    worker 0, whose step ends at T too. Step by step, worker 0 formed its next step before the abort, so s0
    gets that step's token and leaves at its end; fast-forwarded, it left at T (one token fewer)."""
    sessions = [Session(id="s0", arrival_s=0.0, calls=(Call(append_tokens=1, output_tokens=8),)),
                Session(id="s1", arrival_s=0.0, calls=(Call(append_tokens=1, output_tokens=3),))]
    out = {}
    for ff in (True, False):
        sim = Simulation(sessions_config(tmp_path, sessions, engine={"name": engine}, kv_cache={"num_blocks": 100},
                                         scheduler={"max_num_seqs": 4}, router={"kind": "round_robin"},
                                         system={"kind": "colocated", "replicas": 2},
                                         metrics={"record_token_times": True}, run={"fast_forward": ff}),
                         keep_requests=True)
        w1 = sim.workers[1]
        done = w1.on_done

        def on_done(req, sim=sim, done=done):
            done(req)
            sim.system.abort(next(r for r in sim.driver.requests if r.session == "s0"), "gone")

        w1.on_done = on_done
        out[ff] = sim.run()
    t = out[False].requests
    assert t["status"][0] == "failed" and t["output_tokens"][0] == 4
    assert t["finish_s"][0] == out[False].token_times[0][3] > t["finish_s"][1]
    assert _same_outputs(out[True], out[False], tmp_path)


def test_after_a_pass_that_only_preempted_the_cohort_registers_a_decodes_block_when_the_step_is_formed(tmp_path):
    """vLLM's async scheduling, priority policy, 6 blocks of 4: a (low priority) preempts itself, and the
    pass after it is formed at once with the last step's output applied, so b's token is known and the block
    it fills is cached when that step is formed, as step by step. The lazy cohort (fast-forward on) took the
    token for a placeholder and cached the block one step late: the cached-blocks gauge read 4 instead of
    5 for that step (found by fuzzing)."""
    sessions = [Session(id="a", arrival_s=0.0, priority=1, calls=(Call(append_tokens=4, output_tokens=10),)),
                Session(id="b", arrival_s=0.0001, priority=0, calls=(Call(append_tokens=5, output_tokens=8),))]
    res = {ff: run(sessions_config(tmp_path, sessions, scheduler={"policy": "priority"},
                                   kv_cache={"block_size": 4, "num_blocks": 6},
                                   metrics={"sample_interval_s": 0.0001}, run={"fast_forward": ff}))
           for ff in (True, False)}
    assert list(res[False].requests["preemptions"]) == [1, 0]
    assert _same_outputs(res[True], res[False], tmp_path)


def test_a_request_that_preempts_itself_under_the_priority_policy_does_not_stall_the_worker(tmp_path):
    """Priority policy, 6 blocks of 4: a (low priority, admitted first, so first in the running order)
    needs a block on a full pool and the victim, the lowest priority, is a itself: the pass ends with
    nothing scheduled and one request preempted. The worker used to sleep on that empty step with nothing
    to wake it (StallError); as vLLM's loop does, it schedules again at once, and b runs on."""
    sessions = [Session(id="a", arrival_s=0.0, priority=1, calls=(Call(append_tokens=8, output_tokens=10),)),
                Session(id="b", arrival_s=0.0001, priority=0, calls=(Call(append_tokens=8, output_tokens=10),))]
    t = run(sessions_config(tmp_path, sessions, scheduler={"policy": "priority"},
                            kv_cache={"block_size": 4, "num_blocks": 6})).requests
    assert list(t["status"]) == ["finished", "finished"] and list(t["preemptions"]) == [1, 0]
    assert t["finish_s"][1] < t["finish_s"][0]


def test_sub_agents_fork_the_parents_context_and_the_parent_joins_them(tmp_path):
    """p's call 0 (100 + 4) starts three sub-agents with its context forked (104 tokens): a (+30 = 134) and
    b (+20 = 124) hit its 6 full 16-token blocks (96 tokens; the 7th is partial); big can never fit and fails
    at the door. p's call 1 (104 + 10 = 114) is sent when the last of them ends (a) and hits the same 96.
    The session counts are the workload's sessions; sub-agents are counted apart (they used to be counted
    as sessions when they ended but not when they started: found by fuzzing)."""
    subs = (Session(id="a", calls=(Call(append_tokens=30, output_tokens=3),)),
            Session(id="b", calls=(Call(append_tokens=20, output_tokens=2),)),
            Session(id="big", calls=(Call(append_tokens=10**6, output_tokens=2),)))
    p = Session(id="p", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=4, subagents=subs,
                                                   fork_context=True),
                                              Call(append_tokens=10, output_tokens=2)))
    res = run(sessions_config(tmp_path, [p]))
    r = {(row["session"], row["turn"]): row for row in res.requests}
    assert [(k, r[k]["prompt_tokens"], r[k]["cached_tokens"], r[k]["status"]) for k in sorted(r)] == [
        (("p", 0), 100, 0, "finished"), (("p", 1), 114, 96, "finished"), (("p/a", 0), 134, 96, "finished"),
        (("p/b", 0), 124, 96, "finished"), (("p/big", 0), 1000104, 0, "failed")]
    parent_done = r[("p", 0)]["finish_s"]
    assert {r[(s, 0)]["arrival_s"] for s in ("p/a", "p/b", "p/big")} == {parent_done}
    assert r[("p", 1)]["arrival_s"] == max(r[("p/a", 0)]["finish_s"], r[("p/b", 0)]["finish_s"])
    assert res.summary["sessions"] == {"started": 1, "finished": 1, "failed": 0, "skipped": 0, "unfinished": 0,
                                       "subagents": {"started": 3, "finished": 2, "failed": 1, "unfinished": 0}}


def test_the_last_time_series_row_is_a_rate_over_its_own_interval_and_never_repeats_a_time():
    """Found by fuzzing. One request (100 + 10), samples every second: rows at 0 and at the end (about 71
    ms), whose output rate is its 10 tokens over those 71 ms, not over a whole second. A run that ends on
    a tick (here at 0: the request cannot fit and fails at the door) has one row there, not two."""
    work = {"kind": "synthetic", "num_requests": 1, "arrival": {"kind": "all_at_once"},
            "input_tokens": {"fixed": 100}, "output_tokens": {"fixed": 10}}
    ts = run(load_config({"workload": work, "metrics": {"sample_interval_s": 1.0}})).timeseries
    end = ts["time_s"][-1]
    assert len(ts["time_s"]) == 2 and 0 < end < 1 and ts["output_tokens_per_s"][-1] == 10 / (round(end * 1e9) / 1e9)
    at_zero = run(load_config({"workload": work, "kv_cache": {"num_blocks": 2}})).timeseries
    assert list(at_zero["time_s"]) == [0.0]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_still_stretch_of_the_time_series_is_its_first_and_last_rows(tmp_path, fast_forward):
    """a (100 + 10) at 0 s finishes within the first second; b (100 + 10) arrives at 10.5 s. Sampling every
    second, the rows are 0, 1 (a's 10 tokens), 2 (the first still row), 10 (the last tick before b) and b's
    end: rows 3-9 would repeat row 2 but for their time. With b at 1.7e9 + 0.5 s (an epoch-stamped trace) the
    run writes the same five rows instead of ticking through 54 years."""
    def rows(b_s):
        sessions = [Session(id="a", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=10),)),
                    Session(id="b", arrival_s=b_s, calls=(Call(append_tokens=100, output_tokens=10),))]
        cfg = sessions_config(tmp_path, sessions, metrics={"sample_interval_s": 1.0},
                              run={"fast_forward": fast_forward})
        return run(cfg).timeseries

    ts = rows(10.5)
    t = list(ts["time_s"])
    assert t[:4] == [0.0, 1.0, 2.0, 10.0] and len(t) == 5 and 10.5 < t[4] < 11.0
    assert list(ts["output_tokens_per_s"][:4]) == [0.0, 10.0, 0.0, 0.0]
    for col, v in ts.items():  # the row at 10 s repeats the row at 2 s but for its time
        if col != "time_s":
            assert v[3] == v[2] or (np.isnan(v[3]) and np.isnan(v[2])), col
    far = rows(1.7e9 + 0.5)["time_s"]
    assert list(far[:4]) == [0.0, 1.0, 2.0, 1.7e9] and len(far) == 5


@pytest.mark.parametrize("engine", ["vllm", "sglang"])  # vLLM: a decode cohort; SGLang's admission: none
@pytest.mark.parametrize("fast_forward", [True, False])
def test_itl_leaves_out_requests_that_arrived_before_the_warmup(tmp_path, engine, fast_forward):
    """a (0 s, 60 outputs) arrives before run.warmup_s = 0.05 s, b (0.1 s, 20 outputs) after it: the
    summary's ITL is b's 19 gaps alone, like its other figures (it used to take every request's gaps:
    found by fuzzing). Without a warm-up it is both requests' gaps."""
    sessions = [Session(id="a", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=60),)),
                Session(id="b", arrival_s=0.1, calls=(Call(append_tokens=100, output_tokens=20),))]

    def itl(warmup_s):
        sim = Simulation(sessions_config(tmp_path, sessions, engine={"name": engine},
                                         metrics={"record_token_times": True},
                                         run={"warmup_s": warmup_s, "fast_forward": fast_forward}),
                         keep_requests=True)
        res = sim.run()
        gaps = {r.session: np.diff(r.token_times_ns) for r in sim.driver.requests}
        return res.summary, gaps

    summary, gaps = itl(0.05)
    assert summary["requests"]["submitted"] == 1 and summary["itl_s"]["mean"] == pytest.approx(gaps["b"].mean() / 1e9)
    assert summary["itl_s"]["p99"] == pytest.approx(np.percentile(gaps["b"], 99) / 1e9, rel=1e-6)
    everyone, gaps = itl(0.0)
    both = np.concatenate([gaps["a"], gaps["b"]])
    assert everyone["itl_s"]["mean"] == pytest.approx(both.mean() / 1e9)


def test_memory_pressure_preempts_and_still_completes_everything():
    cfg = small_config(kv_cache={"num_blocks": 60}, workload={
        "kind": "synthetic", "num_requests": 30, "arrival": {"kind": "all_at_once"},
        "input_tokens": {"fixed": 200}, "output_tokens": {"fixed": 200}})
    res = run(cfg)
    assert res.summary["requests"]["completed"] == 30
    assert res.summary["preemptions"] > 0 and res.summary["recomputed_tokens"] > 0


def test_same_seed_same_bytes_and_other_seed_differs(tmp_path):
    a = run(small_config(), out=tmp_path / "a")
    run(small_config(), out=tmp_path / "b")
    run(small_config(run={"seed": 1}), out=tmp_path / "c")
    assert (tmp_path / "a/requests.csv").read_bytes() == (tmp_path / "b/requests.csv").read_bytes()
    assert (tmp_path / "a/timeseries.csv").read_bytes() == (tmp_path / "b/timeseries.csv").read_bytes()
    assert (tmp_path / "a/requests.csv").read_bytes() != (tmp_path / "c/requests.csv").read_bytes()
    assert a.summary["requests"]["completed"] == 40
    for name in ("summary.json", "config.yaml", "ledger.json", "timeseries.csv"):
        assert (tmp_path / "a" / name).exists()


def test_fixed_concurrency_keeps_n_in_flight():
    cfg = small_config(workload={"kind": "synthetic", "num_requests": 12, "arrival": {"kind": "concurrency",
                                 "concurrency": 3}, "input_tokens": {"fixed": 64}, "output_tokens": {"fixed": 8}})
    t = run(cfg).requests
    order = np.argsort(t["arrival_s"], kind="stable")
    arrivals, finishes = t["arrival_s"][order], np.sort(t["finish_s"])
    assert list(arrivals[:3]) == [0.0, 0.0, 0.0]
    # Each later request is sent exactly when an earlier one finished.
    assert list(arrivals[3:]) == list(finishes[:9])


def test_replicas_behind_round_robin_and_least_loaded():
    rr = run(small_config(system={"kind": "colocated", "replicas": 2})).requests
    assert list(rr["worker"][:4]) == [0, 1, 0, 1]
    ll = run(small_config(system={"kind": "colocated", "replicas": 3}, router={"kind": "least_loaded"})).requests
    assert set(ll["worker"]) == {0, 1, 2}


class _Nowhere:
    """A worker stand-in that accepts requests and never serves them."""

    wid = 99

    def submit(self, req):
        req.worker = 99


@register("router", "black_hole_for_test")
@attrs.frozen(kw_only=True)
class BlackHole(RouterSpec):
    def build(self):
        class Policy:
            def choose(self, req, workers):
                return _Nowhere()

        return Policy()


def test_user_registered_kind_runs_and_a_stall_names_the_stuck_request(tmp_path):
    cfg = sessions_config(tmp_path, [Session(id="lost", arrival_s=1.0, calls=(Call(append_tokens=10,
                                                                                  output_tokens=2),))],
                          router={"kind": "black_hole_for_test"})
    with pytest.raises(StallError) as info:
        run(cfg)
    text = str(info.value)
    assert "stalled at t=1.000000s" in text and "1 request(s) pending" in text and "session='lost'" in text


def test_max_sim_s_fails_pending_requests_with_a_reason():
    cfg = small_config(run={"max_sim_s": 0.5})
    res = run(cfg)
    t = res.requests
    pending = t[t["status"] == "failed"]
    assert len(pending) > 0 and all(r.startswith("time limit") for r in pending["fail_reason"])
    assert (pending["finish_s"] == 0.5).all()  # (it was NaN: they ended at the limit)


def test_sessions_still_running_at_the_time_limit_are_counted_unfinished(tmp_path):
    """Found by fuzzing: at run.max_sim_s the pending requests fail, but the sessions they belong to (and one
    in a tool wait) were counted neither finished nor failed (started 3, finished 1, failed 0). They are
    now "unfinished": a's second call never left its 10 s wait, b's one long request was cut."""
    sessions = [Session(id="a", arrival_s=0.0, calls=(Call(append_tokens=10, output_tokens=2, wait_after_s=10.0),
                                                      Call(append_tokens=10, output_tokens=2))),
                Session(id="b", arrival_s=0.0, calls=(Call(append_tokens=10, output_tokens=5000),)),
                Session(id="c", arrival_s=0.0, calls=(Call(append_tokens=10, output_tokens=2),))]
    res = run(sessions_config(tmp_path, sessions, run={"max_sim_s": 1.0}))
    t = res.requests
    assert sorted(zip(t["session"], t["status"])) == [("a", "finished"), ("b", "failed"), ("c", "finished")]
    assert res.summary["sessions"] == {"started": 3, "finished": 1, "failed": 0, "skipped": 0, "unfinished": 2,
                                       "subagents": {"started": 0, "finished": 0, "failed": 0, "unfinished": 0}}


@pytest.mark.parametrize("sections", [
    {},  # open-loop chat on one worker
    {"system": {"kind": "colocated", "replicas": 2}, "router": {"kind": "kv_aware"},
     "workload": {"kind": "synthetic", "num_requests": 60, "arrival": {"kind": "gamma", "rate_per_s": 30.0, "cv": 3.0},
                  "input_tokens": {"low": 60, "high": 300}, "output_tokens": {"low": 2, "high": 120},
                  "prefix_group": "sys", "prefix_tokens": 48}},
    {"kv_cache": {"num_blocks": 90}, "workload": {"kind": "synthetic", "num_requests": 40,
                                                 "arrival": {"kind": "concurrency", "concurrency": 12},
                                                 "input_tokens": {"fixed": 100}, "output_tokens": {"low": 50, "high": 200}}},
    {"kv_cache": {"num_blocks": 150, "host_memory_gib": 0.3},
     "workload": {"kind": "lmbenchmark_multiround", "num_users": 8, "num_rounds": 3, "qps": 6.0,
                  "shared_system_prompt": 300, "user_history_prompt": 400, "answer_len": 40}},
    {"system": {"kind": "disaggregated", "prefill": {"workers": 2}, "decode": {"workers": 2, "num_blocks": 120},
                "decode_router": {"kind": "kv_aware"}},
     "transfer": {"lease_s": 0.5},
     "workload": {"kind": "lmbenchmark_multiround", "num_users": 6, "num_rounds": 3, "qps": 4.0,
                  "shared_system_prompt": 200, "user_history_prompt": 300, "answer_len": 60}},
    # SGLang: prefill-first steps (decodes wait) and page size 1, under memory pressure.
    {"engine": {"name": "sglang"}, "kv_cache": {"num_blocks": 2000},
     "workload": {"kind": "synthetic", "num_requests": 40, "arrival": {"kind": "concurrency", "concurrency": 12},
                  "input_tokens": {"low": 80, "high": 160}, "output_tokens": {"low": 20, "high": 120}}},
    # SGLang with long outputs: its new-token ratio decays in fast-forwarded runs and restarts after the
    # preemptions (retractions) it lets happen.
    {"engine": {"name": "sglang"}, "kv_cache": {"num_blocks": 3000},
     "workload": {"kind": "synthetic", "num_requests": 40, "arrival": {"kind": "concurrency", "concurrency": 8},
                  "input_tokens": {"low": 80, "high": 160}, "output_tokens": {"low": 200, "high": 900}}},
    # SGLang with mixed chunks (--enable-mixed-chunk): its admission rule in mixed steps, memory pressure.
    {"engine": {"name": "sglang"}, "scheduler": {"mixed_prefill": True}, "kv_cache": {"num_blocks": 1500},
     "workload": {"kind": "synthetic", "num_requests": 40, "arrival": {"kind": "concurrency", "concurrency": 12},
                  "input_tokens": {"low": 80, "high": 160}, "output_tokens": {"low": 20, "high": 120}}},
    # SGLang's --scheduler-recv-interval: arrivals wait in the input queue through decode steps; the runs
    # stop at the turn that takes them (Scheduler.decodes_before_recv), cut short by an arrival or not.
    {"engine": {"name": "sglang"}, "scheduler": {"recv_interval": 7},
     "workload": {"kind": "synthetic", "num_requests": 60, "arrival": {"kind": "concurrency", "concurrency": 12},
                  "input_tokens": {"low": 80, "high": 160}, "output_tokens": {"low": 20, "high": 300}}},
    {"engine": {"name": "sglang"}, "scheduler": {"recv_interval": 30}, "kv_cache": {"num_blocks": 400},
     "workload": {"kind": "synthetic", "num_requests": 60, "arrival": {"kind": "poisson", "rate_per_s": 40.0},
                  "input_tokens": {"low": 80, "high": 160}, "output_tokens": {"low": 20, "high": 300}}},
    # top-k / top-p sampling priced per sampled row (the sampler term), closed loop.
    {"engine": {"sampling": "top_k_top_p"},
     "workload": {"kind": "synthetic", "num_requests": 40, "arrival": {"kind": "concurrency", "concurrency": 12},
                  "input_tokens": {"low": 80, "high": 160}, "output_tokens": {"low": 20, "high": 120}}},
    # MTP speculative decoding (2 drafts, drawn acceptance) under memory pressure, disaggregated.
    {"model": {"name": "XiaomiMiMo/MiMo-7B-Base"},
     "engine": {"speculative": {"method": "mtp", "num_speculative_tokens": 2, "acceptance": [0.8, 0.5]}},
     "system": {"kind": "disaggregated", "prefill": {"workers": 1}, "decode": {"workers": 2, "num_blocks": 60}},
     "workload": {"kind": "synthetic", "num_requests": 40, "arrival": {"kind": "concurrency", "concurrency": 12},
                  "input_tokens": {"low": 80, "high": 160}, "output_tokens": {"low": 20, "high": 120}}},
])
def test_fast_forward_gives_byte_identical_results(tmp_path, sections):
    on = run(small_config(**sections), out=tmp_path / "on")
    if "host_memory_gib" in str(sections):
        assert on.summary["prefix_cache"]["host_hit_tokens"] > 0
    off = run(small_config(run={"fast_forward": False}, **sections), out=tmp_path / "off")
    for name in ("requests.csv", "timeseries.csv"):
        assert (tmp_path / "on" / name).read_bytes() == (tmp_path / "off" / name).read_bytes(), name
    assert on.summary["itl_s"] == off.summary["itl_s"]
    assert on.ledger == off.ledger


@pytest.mark.parametrize("max_sim_s", [0.5, 0.1234567])
def test_a_time_limit_inside_a_fast_forward_run_charges_the_steps_begun(tmp_path, max_sim_s):
    """run.max_sim_s stops the run inside a fast-forwarded decode run (one request, 2,000 outputs): the
    steps begun by then are in the ledger and the summary, as step by step, where each step is charged when
    it begins. The cut run's steps used to be left out (1 step against 62 at 0.5 s)."""
    work = {"kind": "synthetic", "num_requests": 1, "input_tokens": {"fixed": 100}, "output_tokens": {"fixed": 2000}}
    res = {ff: run(small_config(workload=work, run={"max_sim_s": max_sim_s, "fast_forward": ff}),
                   out=tmp_path / str(ff)) for ff in (True, False)}
    assert res[True].ledger == res[False].ledger and res[True].summary["sim"]["steps"] > 1
    for name in ("requests.csv", "timeseries.csv"):
        assert (tmp_path / "True" / name).read_bytes() == (tmp_path / "False" / name).read_bytes(), name
    on, off = (json.dumps(dict(res[ff].summary, sim=dict(res[ff].summary["sim"], wall_s=0)), sort_keys=True)
               for ff in (True, False))  # (as text: NaN statistics compare equal)
    assert on == off


def test_fast_forward_runs_resume_past_pull_starts(tmp_path, monkeypatch):
    """A decode worker's run woken by a new pull goes on past the step boundary where the pull starts
    (shortened when the pull leaves fewer free blocks): results identical to step-by-step simulation."""
    from twin.shell.worker import Worker

    outcomes: list[str] = []
    resumable = Worker._resumable

    def counting(self, decode_run, m):
        k = decode_run.k
        ok = resumable(self, decode_run, m)
        outcomes.append("cut" if not ok else "shortened" if decode_run.k < k else "resumed")
        return ok

    monkeypatch.setattr(Worker, "_resumable", counting)
    sections = {"system": {"kind": "disaggregated", "prefill": {"workers": 1},
                           "decode": {"workers": 1, "num_blocks": 110}},
                "workload": {"kind": "lmbenchmark_multiround", "num_users": 12, "num_rounds": 2, "qps": 12.0,
                             "shared_system_prompt": 64, "user_history_prompt": 200, "answer_len": 120}}
    on = run(small_config(**sections), out=tmp_path / "on")
    assert {"cut", "resumed", "shortened"} <= set(outcomes)
    off = run(small_config(run={"fast_forward": False}, **sections), out=tmp_path / "off")
    for name in ("requests.csv", "timeseries.csv"):
        assert (tmp_path / "on" / name).read_bytes() == (tmp_path / "off" / name).read_bytes(), name
    assert on.summary["itl_s"] == off.summary["itl_s"] and on.ledger == off.ledger


class _FlatPrices:
    """Every pure-decode step costs 1 us (a fast-forward run's block events do not depend on prices)."""

    def decode_costs(self, n, sum_kv, max_kv, steps):
        return [(np.zeros(1), 1000) for _ in steps]


@pytest.mark.pure_core
@pytest.mark.parametrize("same_content", [False, True])
def test_fast_forward_block_events_in_bulk_match_the_step_by_step_order(monkeypatch, same_content):
    """24 blocks of 2 tokens. r0 (6 + 30 tokens) runs alone and leaves 18 cached free blocks; r1 and r2
    (6 + 30 each) then decode together in a planned run whose allocations use the 6 fresh blocks and then
    evict r0's. Unique content: the run takes its block events in bulk. r1 and r2 with r0's content
    (one stream): their output blocks repeat keys that r0's free blocks hold and that each other writes,
    so the run replays the events one by one. Either way the blocks, cached keys, free order and
    evictions are those of the step-by-step replay."""
    from twin.core.fastforward import DecodeRun, plan_decode_run
    from twin_testkit import make_request, make_scheduler, step

    def planned(bulk: bool):
        taken = []
        in_bulk = DecodeRun._schedule_in_bulk
        monkeypatch.setattr(DecodeRun, "_schedule_in_bulk",
                            lambda self, m: taken.append(bulk and in_bulk(self, m)) or taken[-1])
        sched = make_scheduler(num_blocks=24, block_size=2)
        stream = (lambda rid: "s") if same_content else (lambda rid: None)
        sched.add_request(make_request(0, 6, 30, block_size=2, stream=stream(0)), 0)
        while sched.has_work:
            step(sched)
        for rid in (1, 2):
            sched.add_request(make_request(rid, 6, 30, block_size=2, stream=stream(rid)), 1)
        step(sched, 1)
        out = sched.schedule(2)
        run = plan_decode_run(sched, out, 2, _FlatPrices(), 64)
        assert run is not None and run.k >= 8
        run.extend(run.k)
        run.schedule_upto(run.k)
        kv = sched.kv
        return taken, ({r: list(b) for r, b in kv.req_blocks.items()}, dict(kv.pool.cached),
                       kv.pool.free_order(), kv.pool.evictions)

    taken, bulk = planned(True)
    assert taken and all(taken) is not same_content and any(taken) is not same_content
    assert bulk[3] > 0  # the run evicted r0's cached blocks
    _, one_by_one = planned(False)
    assert bulk == one_by_one


def test_host_tier_demotes_evicted_prefix_and_loads_it_back(tmp_path):
    # 20 GPU blocks of 16 tokens. s1 caches the 160-token system prompt (10 blocks); s2's 300-token prompt
    # reuses 10 freed blocks: block 10 (partial, no key) and 9, 8 ... 1, whose keys are demoted to the host
    # tier. s3 finds system block 0 on the GPU and blocks 1-9 in host memory.
    sessions = [Session(id="s1", arrival_s=0.0, prefix_group="sys", prefix_tokens=160,
                        calls=(Call(append_tokens=10, output_tokens=1),)),
                Session(id="s2", arrival_s=1.0, calls=(Call(append_tokens=300, output_tokens=1),)),
                Session(id="s3", arrival_s=2.0, prefix_group="sys", prefix_tokens=160,
                        calls=(Call(append_tokens=10, output_tokens=1),))]
    cfg = sessions_config(tmp_path, sessions, kv_cache={"num_blocks": 20, "host_memory_gib": 0.05})
    sim = Simulation(cfg)
    res = sim.run()
    t = res.requests
    assert list(t["cached_tokens"]) == [0, 0, 160] and list(t["host_hit_tokens"]) == [0, 0, 144]
    host = sim.workers[0].sched.kv.host
    # 9 system blocks demoted by s2, then 9 of s2's own cached blocks (2-10) reused by s3's allocation.
    assert host is not None and host.demotions == 18 and host.promotions == 9
    # s3's only step: the prefill of its 10 new tokens plus loading 9 blocks of 2 MiB over 64 GB/s.
    cm = cost_model(sim.config, make_deployment(sim.config, 1))
    step = cm.step_time_ns(BatchShape(num_reqs=1, num_decode=0, new_tokens=10, sum_kv=170, sum_q_kv=1700,
                                      sum_q_sq=100))
    load_ns = round(9 * 16 * 131072 / 64e9 * 1e9)
    assert round((t["first_token_s"][2] - t["first_scheduled_s"][2]) * 1e9) == step + load_ns
    assert res.ledger["worker0"]["terms_s"]["kv_host_load"] == pytest.approx(load_ns / 1e9)
    assert res.summary["prefix_cache"]["host_hit_tokens"] == 144


def test_host_loads_after_a_preemption_are_timed_but_are_not_prefix_hits(tmp_path):
    """20 blocks, a 16-token budget, two clients: requests are preempted and, resumed, load their own
    demoted blocks back from host memory. Those loads take time (kv_host_load) but are not the request's
    prefix hit, which is what it found at its first admission: host_hit_tokens is the part of
    cached_tokens that came from host memory. (Found by fuzzing: resumed loads used to be added, giving
    host_hit_tokens 80 against cached_tokens 0.)"""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0.0609,1443,97\n0.6288,117,108\n0.6411,1461,43\n"
                     "0.6694,239,57\n0.9029,104,213\n")
    cfg = load_config({"model": {"name": "Qwen/Qwen3-0.6B"},
                       "kv_cache": {"num_blocks": 20, "host_memory_gib": 0.1, "host_bandwidth_GBps": 64.0},
                       "scheduler": {"max_num_batched_tokens": 16, "reserve_full_kv": False},
                       "workload": {"kind": "trace_csv", "path": str(trace),
                                    "arrival": {"kind": "concurrency", "concurrency": 2}}})
    res = run(cfg)
    t = res.requests
    assert t["preemptions"].sum() > 0 and res.ledger["worker0"]["terms_s"]["kv_host_load"] > 0
    assert (t["host_hit_tokens"] <= t["cached_tokens"]).all()
    assert res.summary["prefix_cache"]["host_hit_tokens"] <= res.summary["prefix_cache"]["cached_tokens"]


def test_closed_loop_waits_that_add_up_past_the_clock_range_are_an_error_naming_the_session(tmp_path):
    """One session at a time: b starts when a ends (after a's 3e9 s wait), so its own 3e9 s wait would send its
    second call at 6e9 s, past 2**62 ns. Each session's waits fit the range, so the plan passes them; the run
    stalled with b's request "waiting" and no word of the clock. Now the driver refuses the send, naming the
    session, the call and the time; a pacing interval likewise. With a 2e9 s wait both sessions fit and run."""
    def sessions(wait_s, interval_s=0.0):
        return [Session(id=n, arrival_s=0.0, calls=(Call(append_tokens=10, output_tokens=5, wait_after_s=wait_s),
                                                    Call(append_tokens=10, output_tokens=5,
                                                         min_interval_s=interval_s)))
                for n in "ab"]

    def closed(sessions_):
        cfg = sessions_config(tmp_path, sessions_).to_dict()
        return load_config({**cfg, "workload": {**cfg["workload"], "max_concurrent_sessions": 1}})

    with pytest.raises(ConfigError, match=r"^workload: session 'b' would send call 1 at 600000000\d\.\d+ s after "
                                          r"its wait \(wait_s x wait_scale\), past the simulated clock's range"):
        Simulation(closed(sessions(3e9))).run()
    with pytest.raises(ConfigError, match=r"^workload: session 'b' would send call 1 at \S+ s after its pacing "
                                          r"interval \(min_interval_s\)"):
        Simulation(closed(sessions(0.0, 3e9))).run()
    assert list(run(closed(sessions(2e9))).requests["status"]) == ["finished"] * 4


def test_a_stall_past_the_clock_range_says_so(tmp_path):
    """The scheduler takes nothing queued past 2**62 ns, so a stall there is the clock's range, not the
    engine: the report's first line says so (and only there)."""
    from twin.shell.sim import CLOCK_MAX_NS

    sim = Simulation(sessions_config(tmp_path, [Session(id="s", arrival_s=0.0,
                                                        calls=(Call(append_tokens=10, output_tokens=2),))]))
    assert "past its range" not in sim._stall_report([])
    sim.env._now = CLOCK_MAX_NS + 1
    assert sim._stall_report([]).splitlines()[0] == (
        "simulation stalled at t=4611686018.427388s with 0 request(s) pending: the clock is past its range "
        "(4.612e+09 s, nanoseconds in 64 bits), where the scheduler takes nothing queued")


def test_a_cut_fast_forward_run_leaves_no_event_the_monitor_stops_at(tmp_path):
    """Found by fuzzing: an abort cuts a's fast-forwarded run at 0.2 s, and the end of its costed segment
    (about 0.41 s) stayed queued. The monitor sleeps through a still stretch to the next event, so with
    fast-forward on it stopped there and wrote rows at 0.40 and 0.41 s that step-by-step simulation does
    not. Now that end loses its callbacks and the monitor skips such events: the same rows either way."""
    sessions = [Session(id="a", arrival_s=0.0, calls=(Call(append_tokens=10, output_tokens=500),)),
                Session(id="b", arrival_s=1.0, calls=(Call(append_tokens=10, output_tokens=3),))]
    times = []
    for ff in (True, False):
        sim = Simulation(sessions_config(tmp_path, sessions, metrics={"sample_interval_s": 0.01},
                                         run={"fast_forward": ff}), keep_requests=True)

        def aborter(sim=sim):
            yield sim.env.timeout(200_000_000)
            sim.system.abort(next(r for r in sim.driver.requests if r.session == "a"), "gone")

        sim.env.process(aborter())
        times.append([round(float(t), 3) for t in sim.run().timeseries["time_s"]])
    assert times[0] == times[1]
    assert times[0][20:25] == [0.2, 0.21, 0.22, 0.99, 1.0]


def test_a_prompt_step_lasting_years_is_sampled_as_a_still_stretch_and_one_past_the_clock_is_refused(tmp_path):
    """Found by fuzzing: a host tier at 1e-12 GB/s makes a's second prompt step load two host blocks for
    about 3.7e9 s. The monitor sampled every second through it (a hang: it only skipped stretches with no
    request on any worker); now a stretch in which no decode step runs is skipped to the last tick before
    the next event, so the run ends at once with a handful of rows. At half that bandwidth the step would
    end past the clock's range (2**62 ns), where the scheduler takes nothing: a config error naming the
    bandwidth. (An alarm turns the old hang into a failure.)"""
    import signal

    sessions = [Session(id="a", arrival_s=0.0, calls=(Call(append_tokens=40, output_tokens=2, wait_after_s=0.5),
                                                      Call(append_tokens=20, output_tokens=2))),
                Session(id="b", arrival_s=0.1, calls=(Call(append_tokens=80, output_tokens=2),))]

    def config(bandwidth):
        return sessions_config(tmp_path, sessions, model={"name": "Qwen/Qwen3-0.6B"},
                               kv_cache={"block_size": 16, "num_blocks": 6, "host_memory_gib": 1,
                                         "host_bandwidth_GBps": bandwidth})

    old = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the run did not end within 30 s"))
    signal.alarm(30)
    try:
        res = run(config(1e-12))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert list(res.requests["status"]) == ["finished"] * 3 and res.summary["prefix_cache"]["host_hit_tokens"] == 32
    assert 3.6e9 < res.summary["sim"]["simulated_s"] < 3.8e9 and len(res.timeseries["time_s"]) < 20
    with pytest.raises(ConfigError, match=r"^kv_cache.host_bandwidth_GBps: worker 0: a step of 7.\d+e\+09 s starting "
                                          r"at 0.5039 s \(host KV loads 7.\d+e\+09 s of it\) would end past the "
                                          r"simulated clock's range"):
        run(config(5e-13))


def test_a_pool_past_the_block_pools_size_is_a_config_error():
    """Found by fuzzing: kv_cache.num_blocks 10**15 was a bare ValueError from the block pool."""
    for section, path in (({"kv_cache": {"num_blocks": 10**15}}, "kv_cache.num_blocks"),
                          ({"system": {"kind": "disaggregated", "decode": {"num_blocks": 10**15}}},
                           "system.decode.num_blocks")):
        with pytest.raises(ConfigError, match=rf"^{re.escape(path)}: num_blocks must be at most 2,000,000,000"):
            load_config(section)
    assert load_config({"kv_cache": {"num_blocks": 2_000_000_000}}).kv_cache.num_blocks == 2_000_000_000


def test_a_run_holding_more_blocks_than_memory_allows_is_refused_before_building():
    """A million colocated replicas (2.8e10 blocks) ran out of memory without a message; the refusal names the
    worker count's field; a run at the limit passes."""
    def sim(system: dict) -> Simulation:
        return Simulation(load_config({"kv_cache": {"num_blocks": 1000}, "system": system}))

    with pytest.raises(ConfigError, match=r"^system.replicas: 500,001,000 KV blocks over the run's workers \(500,001 "
                                          r"workers of 1,000 in the largest pool\), about 9 GiB .* at most "
                                          r"500,000,000"):
        sim({"replicas": 500_001})
    with pytest.raises(ConfigError, match=r"^system.decode.workers: 500,001,000 KV blocks over the run's workers "
                                          r"\(400,000 workers of 1,000 in the largest pool\)"):
        sim({"kind": "disaggregated", "prefill": {"workers": 100_001}, "decode": {"workers": 400_000}})
    check_run_blocks([("system.replicas", 500_000, 1000)])  # at the limit (not built: 10 GiB)


def test_config_errors_survive_simpy_copying_them():
    """SimPy hands a failed process's exception to the process waiting on it as type(exc)(*exc.args): a
    ConfigError built from its formatted text alone was a TypeError there."""
    exc = ConfigError("workload", "bad", source="c.yaml")
    copy = type(exc)(*exc.args)
    assert (str(copy), copy.path, copy.message, copy.source) == ("c.yaml: workload: bad", "workload", "bad", "c.yaml")


def test_vllm_with_prefill_first_steps_runs_without_its_async_scheduling(tmp_path):
    """scheduler.mixed_prefill: false on vLLM (which always mixes) is a what-if the twin can run: its async
    scheduling is modelled for mixed steps only, so the scheduler keeps the plain overlap (it raised a bare
    ValueError from the scheduler naming no config field; found by fuzzing)."""
    sessions = [Session(id=n, arrival_s=0.001 * i, calls=(Call(append_tokens=50, output_tokens=5),))
                for i, n in enumerate("abc")]
    sim = Simulation(sessions_config(tmp_path, sessions, scheduler={"mixed_prefill": False}))
    limits = sim.workers[0].sched.limits
    assert (limits.mixed_prefill, limits.lookahead, limits.async_output) == (False, True, False)
    t = sim.run().requests
    assert list(t["status"]) == ["finished"] * 3


def test_a_session_starting_or_waiting_past_the_clock_range_is_a_config_error(tmp_path):
    """Found by fuzzing: a trace time past 2**62 ns (about 146 years; a trace in epoch milliseconds read as
    seconds) stalled the run, and with later arrivals the monitor ticked through the gap (a hang); an
    infinite one (1e300 s) was a traceback naming nothing; so were a session's waits adding up past it.
    Each is now a config error naming the session before the run; 4e9 s still runs."""
    from twin.config import CLOCK_MAX_S

    trace = tmp_path / "t.csv"
    for time_s in ("1e10", "1e300"):
        trace.write_text(f"arrival_s,input_tokens,output_tokens\n0,10,10\n{time_s},10,10\n")
        stamp = re.escape(repr(float(time_s)))
        with pytest.raises(ConfigError, match=rf"^workload: session 'req-1' starts at {stamp} s, past the "
                                              r"simulated clock's range \(at most 4.612e\+09 s"):
            Simulation(load_config({"workload": {"kind": "trace_csv", "path": str(trace)}}))
    trace.write_text("arrival_s,input_tokens,output_tokens\n4e9,10,10\n")
    assert run(load_config({"workload": {"kind": "trace_csv", "path": str(trace)}})).summary["requests"][
        "completed"] == 1
    # Poisson arrivals at 1e-9 per s: the fourth of five draws lies past the range.
    poisson = {"kind": "synthetic", "num_requests": 5, "arrival": {"kind": "poisson", "rate_per_s": 1e-9}}
    with pytest.raises(ConfigError, match=r"^workload: session 'req-3' starts at"):
        Simulation(load_config({"workload": poisson, "run": {"seed": 0}}))
    waits = [Session(id="a", arrival_s=1e9, calls=(Call(append_tokens=10, output_tokens=5, wait_after_s=2e9),
                                                   Call(append_tokens=10, output_tokens=5, wait_after_s=9e9))),
             Session(id="b", arrival_s=1.0, calls=(
                 Call(append_tokens=10, output_tokens=5, subagents=(
                     Session(id="s", calls=(Call(append_tokens=10, output_tokens=5, wait_after_s=CLOCK_MAX_S),
                                            Call(append_tokens=10, output_tokens=5))),)),))]
    cfg = sessions_config(tmp_path, waits[:1])  # (the last call's wait is never taken)
    assert run(cfg).summary["requests"]["completed"] == 2
    with pytest.raises(ConfigError, match=r"^workload: session 'a' starts at 1000000000.0 s and its waits add "
                                          r"up to 4000000000.0 s \(wait_s x wait_scale"):
        Simulation(load_config({**cfg.to_dict(), "workload": {**cfg.to_dict()["workload"], "wait_scale": 2.0}}))
    with pytest.raises(ConfigError, match=r"^workload: session 'b' starts at 1.0 s and its waits add up to "
                                          rf"{CLOCK_MAX_S!r} s"):
        Simulation(sessions_config(tmp_path, waits[1:]))


@pytest.mark.parametrize("example, sample_s, size", [("chat", 0.05, "workload.num_requests=60"),
                                                     ("agentic", 0.05, "workload.limit=6"),
                                                     ("disagg", 0.01, "workload.num_users=6")])
def test_still_stretch_compression_leaves_out_only_copies(monkeypatch, example, sample_s, size):
    """The time series with still stretches compressed is the uncompressed one less rows that repeat the
    row before them but for their time, on the three examples sampled finely (blocked workers, prompt
    steps spanning ticks, tool waits, pulls). The first and last row of each stretch stay."""
    import math

    import twin.shell.monitor
    from twin.cli import example_path

    def series(compress):
        if not compress:
            monkeypatch.setattr(twin.shell.monitor.Monitor, "_still", lambda self: False)
        cfg = load_config(example_path(example), [f"metrics.sample_interval_s={sample_s}", size])
        ts = run(cfg).timeseries
        monkeypatch.undo()
        cols = list(ts)
        return [tuple(float(ts[c][i]) for c in cols) for i in range(len(ts["time_s"]))]

    def same(a, b):
        return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a[1:], b[1:]))

    kept, full = series(True), series(False)
    assert len(kept) < len(full)
    times = {row[0] for row in kept}
    assert times <= {row[0] for row in full}
    for i, row in enumerate(full):
        if row[0] in times:  # a kept row is the same row
            other = kept[[r[0] for r in kept].index(row[0])]
            assert other[0] == row[0] and same(other, row)
        else:
            assert same(row, full[i - 1]), (example, row[0])  # a row left out repeats the row before it
