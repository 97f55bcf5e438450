"""Attention-DP engines: ranks in lockstep, the routed experts over the group's tokens, request placement, and
TensorRT-LLM's attention-DP balance."""

import pytest

from hardware import BatchShape
from twin.config import load_config
from twin.shell.attention_dp import (AdpBalance, Balancer, DPGroup, LeastLoaded, RoundRobin, VllmStats, balance_step,
                                    make_balancer)
from twin.runner import Simulation
from twin.system import cost_model, make_deployment
from workloads.io import write_sessions
from workloads.sessions import Call, Session

MOE = {"name": "Qwen/Qwen3-30B-A3B"}


def prefill(n: int) -> BatchShape:
    return BatchShape(num_reqs=1, num_decode=0, new_tokens=n, sum_kv=n, sum_q_kv=n * n, sum_q_sq=n * n)


def decode(kv: int) -> BatchShape:
    return BatchShape(num_reqs=1, num_decode=1, new_tokens=1, sum_kv=kv, sum_q_kv=kv, sum_q_sq=1)


def dp_config(tmp_path, sessions, engine="vllm", dp=2, **sections):
    path = tmp_path / "w.jsonl"
    write_sessions(path, sessions, source="test")
    return load_config({"engine": {"name": engine}, "model": MOE,
                        "system": {"kind": "colocated", "tp": 1, "ep": dp, "attention_dp": dp},
                        "workload": {"kind": "sessions", "path": str(path)}, **sections})


def test_a_rank_priced_in_its_group_sees_the_groups_tokens_in_the_routed_experts_alone():
    cfg = load_config({"model": MOE, "system": {"kind": "colocated", "tp": 1, "ep": 2, "attention_dp": 2}})
    sim = Simulation(cfg)
    cm = cost_model(sim.config, make_deployment(sim.config, 1, ep=2, attention_dp=2))
    shape = prefill(300)
    alone, _ = cm.price(shape)
    # Two ranks of 300 tokens each: what the symmetric estimate assumes, but for its imbalance term.
    even, _ = cm.price_in_group(shape, 600)
    assert alone["dp_imbalance"] > 0.0 and even["dp_imbalance"] == 0.0
    assert {k: v for k, v in even.items() if k != "dp_imbalance"} == \
           {k: v for k, v in alone.items() if k != "dp_imbalance"}
    # The other rank idle: the experts see 300 tokens; attention and the dense GEMMs are the rank's own.
    lone, _ = cm.price_in_group(shape, 300)
    assert lone["moe_experts"] < even["moe_experts"]
    assert lone["attention"] == even["attention"] and lone["qkv_proj"] == even["qkv_proj"]
    with pytest.raises(ValueError, match="fewer than the rank's 300"):
        cm.price_in_group(shape, 299)


def test_ranks_step_together_for_as_long_as_the_slowest_one(tmp_path):
    """A 100- and a 400-token prompt at 0.25 s go to ranks 0 and 1; every step lasts the longer rank's part,
    each priced with the experts over both ranks' tokens, so both finish together."""
    sessions = [Session(id="a", arrival_s=0.25, calls=(Call(append_tokens=100, output_tokens=3),)),
                Session(id="b", arrival_s=0.25, calls=(Call(append_tokens=400, output_tokens=3),))]
    sim = Simulation(dp_config(tmp_path, sessions))
    cm = cost_model(sim.config, make_deployment(sim.config, 1, ep=2, attention_dp=2))

    def step(a: BatchShape, b: BatchShape) -> int:
        tokens = a.new_tokens + b.new_tokens
        return max(cm.price_in_group(a, tokens)[1], cm.price_in_group(b, tokens)[1])

    s1 = step(prefill(100), prefill(400))
    s2 = step(decode(101), decode(401))
    s3 = step(decode(102), decode(402))
    assert s1 == cm.price_in_group(prefill(400), 500)[1] > cm.price_in_group(prefill(100), 500)[1]
    res = sim.run()
    rows = {r["session"]: r for r in res.requests}
    t0 = 250_000_000
    for sid, wid in (("a", 0), ("b", 1)):
        assert rows[sid]["worker"] == wid
        assert rows[sid]["first_token_s"] == (t0 + s1) / 1e9
        assert rows[sid]["finish_s"] == (t0 + s1 + s2 + s3) / 1e9
    # Each rank's ledger: its own terms plus the wait for the other, the group's three steps in all.
    for wid in (0, 1):
        led = res.ledger[f"worker{wid}"]
        assert led["steps"] == 3 and led["busy_s"] == pytest.approx((s1 + s2 + s3) / 1e9, abs=1e-12)
        assert sum(led["terms_s"].values()) == pytest.approx(led["busy_s"], abs=3e-9)  # (each step: whole ns)
    # Rank 1 (the longer context) is the slower in every step: rank 0 waits, rank 1 never does.
    assert res.ledger["worker0"]["terms_s"]["dp_wait"] > 0.0 == res.ledger["worker1"]["terms_s"]["dp_wait"]


def test_an_idle_rank_waits_through_its_partners_steps(tmp_path):
    sessions = [Session(id="a", arrival_s=0.0, calls=(Call(append_tokens=64, output_tokens=4),))]
    res = Simulation(dp_config(tmp_path, sessions)).run()
    busy = res.ledger["worker0"]["busy_s"]
    idle = res.ledger["worker1"]
    assert idle["steps"] == 4 and idle["busy_s"] == busy and idle["terms_s"]["dp_wait"] == pytest.approx(busy)


def _group(tmp_path, engine: str) -> DPGroup:
    sim = Simulation(dp_config(tmp_path, [Session(id="a", arrival_s=0.0, calls=(Call(append_tokens=8,
                                                                                       output_tokens=1),))],
                               engine=engine))
    group = sim.system.engines[0]
    assert isinstance(group, DPGroup)
    return group


def test_vllm_places_requests_on_the_published_counts_and_those_it_sent_since(tmp_path):
    """DPLBAsyncMPClient: score 4 x waiting + running as last published, + 4 per request sent since; the
    lowest score, the first rank of equals. A seat freed since the publication is not seen."""
    g = _group(tmp_path, "vllm")
    assert isinstance(g.balancer, VllmStats)
    g.balancer.stats, g.balancer.sent = [5, 4], [0, 0]
    assert [g._rank_for().wid for _ in range(4)] == [1, 0, 1, 0]
    assert g.balancer.sent == [2, 2]
    assert g._rank_for(send=False).wid == 1 and g.balancer.sent == [2, 2]   # a prefix probe sends nothing


def test_sglang_places_requests_round_robin_and_tensorrt_llm_on_the_least_loaded_rank(tmp_path):
    g = _group(tmp_path, "sglang")
    assert isinstance(g.balancer, RoundRobin)
    assert [g._rank_for().wid for _ in range(5)] == [0, 1, 0, 1, 0]
    t = _group(tmp_path, "trtllm")
    assert isinstance(t.balancer, LeastLoaded)
    assert t._rank_for().wid == 0


def test_a_groups_balancer_is_chosen_once_by_its_name_and_an_unknown_name_is_refused(tmp_path):
    """Each engine profile's dp_balancer names one Balancer class; a name none declares is an error, not the
    least-loaded rule by default."""
    from hardware.engine import DP_BALANCERS

    assert sorted(Balancer.kinds) == sorted(DP_BALANCERS)
    assert {name: type(make_balancer(name, 2)) for name in DP_BALANCERS} == \
           {"least_loaded": LeastLoaded, "round_robin": RoundRobin, "vllm_stats": VllmStats}
    ranks = _group(tmp_path, "vllm").ranks
    with pytest.raises(ValueError, match=r"unknown attention-DP balancer 'fewest_tokens' \(known: least_loaded, "
                                         r"round_robin, vllm_stats\)"):
        DPGroup(ranks[0].env, ranks, balancer="fewest_tokens")


def test_tensorrt_llm_balance_holds_prompts_until_every_rank_has_one_or_the_timeout():
    b = AdpBalance(timeout_iters=3, batching_wait_iters=2)
    seats = [4, 4]

    def run(steps):
        w = bw = 0
        out = []
        for ready, decodes in steps:
            admit, w, bw = balance_step(b, w, bw, ready=ready, decodes=decodes, seats=seats)
            out.append((admit, w, bw))
        return out

    # Every rank decoding, one rank with a prompt: held two steps, let through at the third (timeout 3).
    assert run([([True, False], [1, 1])] * 4) == [(False, 1, 0), (False, 2, 0), (True, 0, 0), (False, 1, 0)]
    # The counter runs on through steps without any prompt, so a prompt arriving then waits less.
    assert run([([False, False], [1, 1])] * 2 + [([True, False], [1, 1])]) == \
           [(False, 1, 0), (False, 2, 0), (True, 0, 0)]
    # A rank without decodes: no waiting at all.
    assert run([([True, False], [1, 0])]) == [(True, 0, 0)]
    # Every rank ready and decoding: held batching_wait_iters steps, then let through.
    assert run([([True, True], [1, 1])] * 3) == [(False, 0, 1), (False, 0, 2), (True, 0, 0)]
    # Every rank ready but one full: that is not "every rank ready".
    assert run([([True, True], [4, 1])]) == [(False, 1, 0)]


def test_balance_admits_a_lone_prompt_at_the_timeout_counters_turn(tmp_path):
    """Two long decodes, one per rank, admitted together at step 1 (the counter reset); a third request
    reaches rank 0 alone at 0.5 s, during step 71. Without the balance it starts at step 73, the first formed
    after it arrived (TensorRT-LLM's overlap scheduler forms a step as the one before starts). With it, every
    step from step 2 on counts (no step has a prompt on both ranks), so prompts can start only at steps
    1 + 40 k: it waits for step 81."""
    sessions = [Session(id="a", arrival_s=0.0, calls=(Call(append_tokens=32, output_tokens=300),)),
                Session(id="b", arrival_s=0.0, calls=(Call(append_tokens=32, output_tokens=300),)),
                Session(id="c", arrival_s=0.5, calls=(Call(append_tokens=32, output_tokens=4),))]
    for on, start in ((False, 73), (True, 81)):
        sched = {"attention_dp_balance": on, "attention_dp_timeout_iters": 40, "attention_dp_batching_wait_iters": 0}
        res = Simulation(dp_config(tmp_path, sessions, engine="trtllm", scheduler=sched,
                                   metrics={"record_token_times": True})).run()
        rows = {r["session"]: r for r in res.requests}
        assert all(r["status"] == "finished" for r in rows.values()) and rows["c"]["worker"] == 0
        # Step k ends when request a gets its k-th token (it runs in every step until it finishes).
        ends = res.token_times[rows["a"]["id"]]
        assert ends[0] == rows["a"]["first_token_s"] and len(ends) == 300
        assert ends[69] < 0.5 <= ends[70]                          # it arrives during step 71
        assert rows["c"]["first_scheduled_s"] == ends[start - 2]   # and starts as step `start` does


def test_a_disaggregated_pool_of_attention_dp_engines_steps_each_engines_ranks_together():
    """1 prefill engine and 1 decode engine of 2 ranks each: the routers send requests to ranks, and each
    engine's ranks take part in every one of its steps (one node each: the KV crosses the NIC)."""
    cfg = load_config({"model": MOE, "system": {"kind": "disaggregated",
                                                "prefill": {"tp": 1, "ep": 2, "attention_dp": 2},
                                                "decode": {"tp": 1, "ep": 2, "attention_dp": 2},
                                                "gpus_per_node": 2},
                       "workload": {"kind": "synthetic", "num_requests": 24, "arrival": {"kind": "all_at_once"},
                                    "input_tokens": {"low": 50, "high": 400}, "output_tokens": {"low": 5, "high": 40}}})
    sim = Simulation(cfg)
    system = sim.system
    assert [w.wid for w in system.prefill] == [0, 1] and [w.wid for w in system.decode] == [2, 3]
    assert system.node == {0: 0, 1: 0, 2: 1, 3: 1}
    assert [[w.wid for w in g.ranks] for g in system.groups] == [[0, 1], [2, 3]]
    res = sim.run()
    assert res.summary["requests"]["completed"] == 24
    assert set(res.requests["worker"]) == {2, 3}          # (a request's worker: where it decoded)
    for a, b in (("prefill0", "prefill1"), ("decode0", "decode1")):   # (each rank named within its role)
        la, lb = res.ledger[a], res.ledger[b]
        assert la["steps"] == lb["steps"] > 0 and la["busy_s"] == lb["busy_s"]


MTP = ["engine.speculative.method=mtp", "engine.speculative.num_speculative_tokens=3",
       "engine.speculative.acceptance=[0.8,0.6,0.4]"]


@pytest.mark.parametrize("overrides", [[], ["scheduler.attention_dp_balance=false", "engine.name=sglang"],
                                       ["scheduler.attention_dp_balance=false", "engine.name=vllm"],
                                       MTP, ["scheduler.attention_dp_balance=false", "engine.name=vllm", *MTP],
                                       ["scheduler.attention_dp_balance=false", "engine.name=sglang", *MTP,
                                        "workload.arrival.concurrency=16"]])
def test_a_fast_forwarded_group_gives_the_bytes_of_step_by_step_simulation(tmp_path, overrides):
    """Every rank's run over the same steps, cut by arrivals: requests, ledgers and the time series alike
    (with MTP, each rank's run draws its requests' acceptances ahead: twin.core.fastforward.SpecRun)."""
    from twin.cli import example_path

    out = {}
    for ff in (True, False):
        cfg = load_config(example_path("dp_attention"), ["workload.num_requests=200", f"run.fast_forward={ff}",
                                                         *overrides])
        path = Simulation(cfg).run().write(tmp_path / str(ff))
        out[ff] = {name: (path / name).read_bytes() for name in ("requests.csv", "ledger.json", "timeseries.csv")}
    assert out[True] == out[False]


def _open_loop_vllm_group(tmp_path, ff: bool, rate_per_s: float, seed: int, **scheduler) -> dict[str, bytes]:
    """A vLLM engine of 2 attention-DP ranks under 120 Poisson arrivals of varied lengths: its output files."""
    cfg = load_config({"engine": {"name": "vllm"}, "model": MOE,
                       "system": {"kind": "colocated", "tp": 1, "ep": 2, "attention_dp": 2}, "scheduler": scheduler,
                       "workload": {"kind": "synthetic", "num_requests": 120,
                                    "arrival": {"kind": "poisson", "rate_per_s": rate_per_s},
                                    "input_tokens": {"low": 100, "high": 2000},
                                    "output_tokens": {"low": 50, "high": 600}},
                       "run": {"seed": seed, "fast_forward": ff}})
    path = Simulation(cfg).run().write(tmp_path / str(ff))
    return {name: (path / name).read_bytes() for name in ("requests.csv", "ledger.json", "timeseries.csv")}


def test_a_fast_forwarded_vllm_group_places_requests_on_the_counts_of_the_boundaries_it_skipped(tmp_path):
    """vLLM's front end reads counts published at the first step boundary after each 100 ms mark; a
    fast-forward skips those boundaries and publishes their counts when they are next read. Open-loop arrivals
    of varied lengths land inside runs that cross 100 ms marks, so placing them on the counts of the run's start
    instead would send some to other ranks."""
    assert _open_loop_vllm_group(tmp_path, True, 5.0, 1) == _open_loop_vllm_group(tmp_path, False, 5.0, 1)


def test_a_groups_ranks_advance_their_decodes_as_lazy_cohorts_in_mixed_steps(tmp_path, monkeypatch):
    """A rank's running decodes form a lazy cohort (twin.core.decode_cohort), as a worker's do: in the mixed steps of an
    open-loop load of varied lengths most of a rank's decodes are advanced as a group, and the requests, ledgers
    and time series are those of step-by-step simulation (fast-forward, and with it the cohort, off)."""
    import twin.core.scheduler

    lazy = []
    real = twin.core.scheduler.Scheduler.update

    def counting(self, out, now):
        lazy.append(out.lazy)
        return real(self, out, now)

    monkeypatch.setattr(twin.core.scheduler.Scheduler, "update", counting)
    on = _open_loop_vllm_group(tmp_path, True, 8.0, 2, max_num_batched_tokens=512)
    assert sum(n > 0 for n in lazy) > 100 and sum(lazy) > 1000, (sum(n > 0 for n in lazy), sum(lazy))
    lazy.clear()
    assert on == _open_loop_vllm_group(tmp_path, False, 8.0, 2, max_num_batched_tokens=512)
    assert not any(lazy)


@pytest.mark.parametrize("overrides", [[], MTP])
def test_a_group_fast_forwards_through_the_steps_its_balance_holds_a_prompt(tmp_path, monkeypatch, overrides):
    """TensorRT-LLM's balance holds a prompt until every rank has one or its timeout: runs cross the steps it
    holds one for certain, with the waiting requests on their ranks, and stop before the step that admits
    (with lookahead that step may see requests the held step did not: DPGroup._held_steps counts them)."""
    from twin.cli import example_path
    from twin.shell.attention_dp import DPGroup

    held_runs = []
    plan = DPGroup._plan

    def counting(self, now, stepping, held):
        runs = plan(self, now, stepping, held)
        if runs is not None and held:
            held_runs.append(runs[0][1].k)
            assert runs[0][1].k <= 1 + held
        return runs

    monkeypatch.setattr(DPGroup, "_plan", counting)
    out = {}
    for ff in (True, False):
        cfg = load_config(example_path("dp_attention"), ["workload.num_requests=200", f"run.fast_forward={ff}",
                                                         *overrides])
        path = Simulation(cfg).run().write(tmp_path / str(ff))
        out[ff] = {name: (path / name).read_bytes() for name in ("requests.csv", "ledger.json", "timeseries.csv")}
    assert len(held_runs) > 5 and max(held_runs) > 5
    assert out[True] == out[False]
