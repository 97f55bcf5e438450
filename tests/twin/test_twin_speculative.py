"""MTP speculative decoding: tokens per step, lookahead slots, event times, the draft term, determinism."""

from pathlib import Path

import pytest

from hardware import BatchShape, CostModel, Deployment, kernels, load_engine, load_gpu, load_model
from hardware.deployment import ACT_BYTES
from twin.config import load_config
from twin.core.errors import ConfigError
from twin.runner import Simulation, run
from twin.core.scheduler import Drafter
from twin.system import cost_model, make_deployment
from workloads.io import write_sessions
from workloads.sessions import Call, Session

from twin_testkit import make_request, make_scheduler

MIMO = "XiaomiMiMo/MiMo-7B-Base"  # 36 identical GQA + dense layers, one MTP module (num_nextn_predict_layers 1)


def spec(k: int, acceptance: object) -> dict[str, object]:
    return {"speculative": {"method": "mtp", "num_speculative_tokens": k, "acceptance": acceptance}}


def one_request(tmp_path: Path, k: int, acceptance: object, output: int) -> Simulation:
    path = tmp_path / "w.jsonl"
    write_sessions(path, [Session(id="s", arrival_s=0.25, calls=(Call(append_tokens=100, output_tokens=output),))],
                   source="test")
    return Simulation(load_config({"model": {"name": MIMO}, "engine": spec(k, acceptance),
                                   "workload": {"kind": "sessions", "path": str(path)},
                                   "metrics": {"record_token_times": True}}))


def verify_shape(contexts: list[int], q: int) -> BatchShape:
    """Speculative decodes of q tokens each, attending ``contexts`` tokens after the step."""
    kv = sum(contexts)
    return BatchShape(num_reqs=len(contexts), num_decode=len(contexts), new_tokens=q * len(contexts), sum_kv=kv,
                      sum_q_kv=q * kv, sum_q_sq=q * q * len(contexts), decode_sum_kv=kv, decode_q=q,
                      decode_max_kv=max(contexts))


# ------------------------------------------------------------------------------------------- scheduler
def test_each_decode_takes_one_plus_k_tokens_of_the_budget_all_or_none() -> None:
    # k = 2: a decode needs 3 tokens of the budget (5); the second decode cannot get its 3 and waits.
    sched = make_scheduler(num_blocks=40, max_num_batched_tokens=5, drafter=Drafter((1.0, 1.0), seed=0))
    a, b = make_request(1, 2, 9), make_request(2, 2, 9)
    for r in (a, b):
        sched.add_request(r, 0)
    out = sched.schedule(0)  # both prompts (2 + 2 tokens)
    sched.update(out, 1)
    out = sched.schedule(1)
    assert [(r.id, n) for r, n in out.scheduled] == [(1, 3)] and out.drafts == {a: 2}
    assert out.stats == verify_shape([2 + 3], 3)
    sched.update(out, 2)
    assert (a.num_output_tokens, a.num_computed_tokens) == (1 + 3, 2 + 3)  # 1 + 2 accepted tokens


def test_lookahead_slots_are_allocated_and_rejected_drafts_are_never_cached() -> None:
    # Block size 4, prompt 8, k = 2, nothing accepted: every step allocates room for 3 tokens past the
    # computed ones, but only blocks full of real tokens are registered in the prefix cache.
    sched = make_scheduler(num_blocks=40, max_num_batched_tokens=64, drafter=Drafter((0.0, 0.0), seed=0))
    req = make_request(1, 8, 6)
    sched.add_request(req, 0)
    kv = sched.kv
    steps = []
    for t in range(7):
        out = sched.schedule(t)
        blocks = len(kv.req_blocks[req.id])
        hashed = kv._num_hashed[req.id]
        sched.update(out, t + 1)
        steps.append((out.scheduled[0][1], blocks, hashed, req.num_computed_tokens, req.num_output_tokens))
        if req.num_output_tokens == 6:
            break
    # (tokens scheduled, blocks held, blocks registered, computed, output) after each step
    assert steps == [(8, 2, 2, 8, 1), (3, 3, 2, 9, 2), (3, 3, 2, 10, 3), (3, 4, 2, 11, 4), (3, 4, 3, 12, 5),
                     (3, 4, 3, 13, 6)]


def test_drafter_streams_are_per_request_and_seeded() -> None:
    a, b = Drafter((0.6, 0.6, 0.6), seed=7), Drafter((0.6, 0.6, 0.6), seed=7)
    r1, r2 = make_request(1, 4, 4), make_request(2, 4, 4)
    draws_a = [a.accepted(r1) for _ in range(50)]
    # Interleaving another request's draws changes nothing for r1.
    draws_b = []
    for _ in range(50):
        b.accepted(r2)
        draws_b.append(b.accepted(r1))
    assert draws_a == draws_b and set(draws_a) == {0, 1, 2, 3}
    assert draws_a != [Drafter((0.6, 0.6, 0.6), seed=8).accepted(r1) for _ in range(50)]


# ----------------------------------------------------------------------------------------- timelines
def test_all_drafts_accepted_timeline_by_hand(tmp_path) -> None:
    """k = 3, acceptance 1: the prefill samples token 1, the first verify step tokens 2-5, the second
    tokens 6-7 (capped by the 7 wanted), each step priced by the cost model on its hand-built shape."""
    sim = one_request(tmp_path, 3, 1.0, 7)
    cm = cost_model(sim.config, make_deployment(sim.config, 1))
    prefill = cm.step_time_ns(BatchShape(num_reqs=1, num_decode=0, new_tokens=100, sum_kv=100, sum_q_kv=10000,
                                         sum_q_sq=10000))
    v1 = cm.step_time_ns(verify_shape([104], 4))  # context 100 + 4 verified positions
    v2 = cm.step_time_ns(verify_shape([108], 4))
    res = sim.run()
    row = res.requests[0]
    t0 = 250_000_000
    t1, t2, t3 = t0 + prefill, t0 + prefill + v1, t0 + prefill + v1 + v2
    assert row["first_token_s"] == t1 / 1e9 and row["finish_s"] == t3 / 1e9
    assert row["output_tokens"] == 7 and row["max_itl_s"] == max(v1, v2) / 1e9
    assert res.token_times[int(row["id"])] == [t / 1e9 for t in [t1] + [t2] * 4 + [t3] * 2]
    # Gaps as vLLM's benchmark client counts them: one per streamed chunk, i.e. per step (4 then 2 tokens).
    assert sim.workers[0].sched.itl_counts == {v1: 1, v2: 1}


def test_no_draft_accepted_timeline_by_hand(tmp_path) -> None:
    """Acceptance 0: every verify step emits one token; the context grows by one per step."""
    sim = one_request(tmp_path, 3, 0.0, 7)
    cm = cost_model(sim.config, make_deployment(sim.config, 1))
    prefill = cm.step_time_ns(BatchShape(num_reqs=1, num_decode=0, new_tokens=100, sum_kv=100, sum_q_kv=10000,
                                         sum_q_sq=10000))
    verifies = [cm.step_time_ns(verify_shape([104 + j], 4)) for j in range(6)]
    row = sim.run().requests[0]
    t0 = 250_000_000
    assert row["first_token_s"] == (t0 + prefill) / 1e9
    assert row["finish_s"] == (t0 + prefill + sum(verifies)) / 1e9
    assert row["output_tokens"] == 7 and row["max_itl_s"] == max(verifies) / 1e9


def workload_config(seed: int, acceptance: object = 0.7, **extra: object):
    return load_config({"model": {"name": MIMO}, "engine": spec(2, acceptance), "run": {"seed": seed, **extra},
                        "workload": {"kind": "synthetic", "num_requests": 30,
                                     "arrival": {"kind": "concurrency", "concurrency": 8},
                                     "input_tokens": {"low": 50, "high": 300}, "output_tokens": {"low": 5, "high": 60}},
                        "metrics": {"sample_interval_s": 0.5}})


def test_same_seed_same_results_and_the_seed_matters(tmp_path) -> None:
    a = run(workload_config(3), out=tmp_path / "a")
    b = run(workload_config(3), out=tmp_path / "b")
    assert (tmp_path / "a" / "requests.csv").read_bytes() == (tmp_path / "b" / "requests.csv").read_bytes()
    assert a.ledger == b.ledger
    # Same requests (the workload draws first), other acceptance draws: other times.
    c = Simulation(workload_config(3, acceptance=[0.7, 0.3])).run()
    assert list(c.requests["output_tokens"]) == list(a.requests["output_tokens"])
    assert list(c.requests["finish_s"]) != list(a.requests["finish_s"])


def test_tokens_per_step_follow_the_acceptance(tmp_path) -> None:
    """Output tokens per verify step: 1 + k at acceptance 1, 1 at acceptance 0 (counted by the ledger)."""
    steps = {}
    for acc in (0.0, 1.0):
        res = Simulation(workload_config(0, acceptance=acc)).run()
        steps[acc] = res.ledger["worker0"]["steps"]
    assert steps[1.0] < steps[0.0]


# ------------------------------------------------------------------------------------------------ cost
def spec_deployment(k: int) -> Deployment:
    return Deployment(gpu=load_gpu("h100_sxm"), model=load_model(MIMO), engine=load_engine("vllm"), spec_tokens=k)


def test_draft_term_by_hand() -> None:
    """k = 2, two decodes of contexts 100 and 200 verifying 3 tokens each. The draft's first pass runs the
    MTP layer (one layer of MiMo's single kind, so 1/36 of the target's layer terms) and its 2h -> h BF16
    projection over the 6 verified tokens; the second over 2 tokens; each pass takes 2 LM-head rows."""
    cm = CostModel(spec_deployment(2))
    plain = CostModel(Deployment(gpu=load_gpu("h100_sxm"), model=load_model(MIMO), engine=load_engine("vllm")))
    s = verify_shape([103, 203], 3)
    layers = ("qkv_proj", "o_proj", "mlp", "elementwise", "tp_allreduce")

    def layer_s(m: int) -> float:  # one layer over m tokens: the target's 36 layers / 36 (every term linear in n)
        terms = plain.step_cost(BatchShape(num_reqs=m, num_decode=m, new_tokens=m, sum_kv=m * 50, sum_q_kv=m * 50,
                                           sum_q_sq=m)).terms
        return sum(terms[t] for t in layers) / 36

    h = 4096
    gpu = load_gpu("h100_sxm")

    def proj_s(m: int) -> float:
        return kernels.gemm_s(plain.gcal.gemm_for("bf16"), m, h, 2 * h, ACT_BYTES, gpu.flops_for("bf16"),
                              gpu.hbm_bw_Bps)

    lm = plain.step_cost(BatchShape(num_reqs=2, num_decode=2, new_tokens=2, sum_kv=306, sum_q_kv=306,
                                    sum_q_sq=2)).terms["lm_head"]
    target_attn = cm.step_cost(s).terms["attention"]  # 36 layers of the verify attention
    second_attn = plain.step_cost(BatchShape(num_reqs=2, num_decode=2, new_tokens=2, sum_kv=306, sum_q_kv=306,
                                             sum_q_sq=2)).terms["attention"]
    want = (layer_s(6) + proj_s(6) + layer_s(2) + proj_s(2) + 2 * lm + target_attn / 36 + second_attn / 36)
    assert cm.step_cost(s).terms["spec_draft"] == pytest.approx(want, rel=1e-12)


def test_verify_attention_reads_each_context_once_for_all_queries() -> None:
    """A decode of q = 1 + k queries is a decode kernel with q x the query heads (FlashMLA / FlashInfer
    fold the query length into the heads), not a prefill; its rate is read at 306 / 203 requests (the
    contexts over the longest one, BatchShape.decode_rows)."""
    cm = CostModel(spec_deployment(3))
    dep = spec_deployment(3)
    mx = dep.model.layers[0][0]
    assert mx is not None
    want = 36 * kernels.gqa_decode_s(cm.gcal.attn_decode, reqs=2, sum_kv=306, heads=32 * 4, kv_heads=8,
                                     head_dim=128, v_head_dim=128, kv_bytes=2, peak_flops=load_gpu("h100_sxm").flops_for("bf16"),
                                     bw_Bps=load_gpu("h100_sxm").hbm_bw_Bps, rate_rows=306 / 203)
    assert cm.step_cost(verify_shape([103, 203], 4)).terms["attention"] == pytest.approx(want, rel=1e-12)


def test_lm_head_prices_every_verified_position() -> None:
    cm = CostModel(spec_deployment(3))
    plain_rows = CostModel(spec_deployment(3)).step_cost(
        BatchShape(num_reqs=8, num_decode=8, new_tokens=8, sum_kv=800, sum_q_kv=800, sum_q_sq=8)).terms["lm_head"]
    assert cm.step_cost(verify_shape([100, 100], 4)).terms["lm_head"] == plain_rows  # 2 x 4 logit rows


def test_switching_the_draft_term_off_removes_exactly_it() -> None:
    full = CostModel(spec_deployment(2))
    off = CostModel(spec_deployment(2), disabled_terms=frozenset({"spec_draft"}))
    for s in (verify_shape([103, 203], 3),
              BatchShape(num_reqs=1, num_decode=0, new_tokens=100, sum_kv=100, sum_q_kv=10000, sum_q_sq=10000)):
        terms = dict(full.step_cost(s).terms)
        assert terms.pop("spec_draft") > 0
        assert dict(off.step_cost(s).terms) == terms
    assert "spec_draft" in full.term_names and "spec_draft" not in off.term_names


def test_plain_decode_fast_path_refuses_a_speculative_model_and_shapes_check_decode_q() -> None:
    with pytest.raises(ValueError, match="verifies 1 \\+ spec_tokens tokens"):
        CostModel(spec_deployment(2)).decode_step(4, 400)
    with pytest.raises(ValueError, match="decode_q >= 1"):
        BatchShape(num_reqs=1, num_decode=1, new_tokens=1, sum_kv=10, sum_q_kv=10, sum_q_sq=1, decode_q=0)
    with pytest.raises(ValueError, match="has none"):
        Deployment(gpu=load_gpu("h100_sxm"), model=load_model("meta-llama/Llama-3.1-8B"), engine=load_engine("vllm"),
                   spec_tokens=1)


def test_without_speculation_there_is_no_draft_term_and_no_mtp_memory() -> None:
    plain = Deployment(gpu=load_gpu("h100_sxm"), model=load_model(MIMO), engine=load_engine("vllm"))
    assert "spec_draft" not in CostModel(plain).term_names
    with_mtp = spec_deployment(1)
    # The MTP module: one more layer of weights (+ its 2h x h projection and 4 norms) and one more KV layer.
    h = 4096
    layer = (plain.weight_bytes_per_gpu - 2 * plain.embedding_bytes_per_gpu - (2 * 36 + 1) * h * ACT_BYTES) / 36
    assert with_mtp.weight_bytes_per_gpu - plain.weight_bytes_per_gpu == pytest.approx(
        layer + 2 * h * h * ACT_BYTES + 4 * h * ACT_BYTES, abs=1)
    assert with_mtp.kv_bytes_per_token * 36 == plain.kv_bytes_per_token * 37


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("section, path, words", [
    ({"method": "eagle"}, "engine.speculative.method", "one of"),
    ({"method": "mtp", "num_speculative_tokens": 0, "acceptance": 0.5}, "engine.speculative.num_speculative_tokens",
     ">= 1"),
    ({"method": "mtp", "num_speculative_tokens": 2}, "engine.speculative.acceptance", "must be given"),
    ({"method": "mtp", "num_speculative_tokens": 2, "acceptance": [0.5]}, "engine.speculative.acceptance",
     "expected num_speculative_tokens = 2"),
    ({"method": "mtp", "num_speculative_tokens": 1, "acceptance": 1.2}, "engine.speculative.acceptance", "[0, 1]"),
    ({"num_speculative_tokens": 2}, "engine.speculative.method", "left unset"),
])
def test_config_errors_name_the_field(section, path, words) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"model": {"name": MIMO}, "engine": {"speculative": section}})
    assert err.value.path == path and words in str(err.value)


def test_a_model_without_an_mtp_module_is_an_error() -> None:
    cfg = load_config({"engine": spec(1, 0.8)})  # Llama-3.1-8B: no next-token-prediction module
    with pytest.raises(ConfigError) as err:
        Simulation(cfg)
    assert err.value.path == "engine.speculative.method"
    assert "no num_nextn_predict_layers / mtp_num_hidden_layers" in str(err.value)


def test_a_step_budget_below_one_speculative_decode_is_an_error() -> None:
    # 1 + 3 verified tokens cannot fit a 3-token step: every decode would wait for ever.
    cfg = load_config({"model": {"name": MIMO}, "engine": spec(3, 0.8),
                       "scheduler": {"max_num_batched_tokens": 3, "chunked_prefill": True}})
    with pytest.raises(ConfigError) as err:
        Simulation(cfg)
    assert err.value.path == "scheduler.max_num_batched_tokens" and "= 4 tokens" in str(err.value)


@pytest.mark.parametrize("acceptance", [0.0, 1.0])
def test_a_request_whose_last_verify_step_cannot_fit_fails_at_the_door(tmp_path, acceptance) -> None:
    """10 blocks of 16 = 160 slots, k = 3. The last verify step of a 100 + n request computes its last
    sampled token and 3 drafts over 100 + n - 2 earlier tokens: 100 + n + 2 slots. n = 58 fits exactly and
    finishes; n = 59 used to preempt itself with the pool empty and stall; it fails when it arrives."""
    path = tmp_path / "w.jsonl"
    write_sessions(path, [Session(id=f"n{n}", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=n),))
                          for n in (58, 59)], source="test")
    t = run(load_config({"model": {"name": MIMO}, "engine": spec(3, acceptance), "kv_cache": {"num_blocks": 10},
                         "workload": {"kind": "sessions", "path": str(path)}})).requests
    assert list(t["status"]) == ["finished", "failed"]
    assert t["fail_reason"][1] == ("needs 11 KV blocks (100 prompt + 59 output tokens and 2 more for the drafts "
                                   "of its last verify step) but worker 0 holds only 10")


# ------------------------------------------------------------------------------------------ fast-forward
def _count_spec_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The planned lengths of the speculative runs a simulation fast-forwards (k >= 2)."""
    import twin.core.fastforward as ff

    lengths: list[int] = []
    plan = ff._plan_spec_run

    def counting(*args, **kwargs):
        run = plan(*args, **kwargs)
        if run is not None:
            lengths.append(run.k)
        return run

    monkeypatch.setattr(ff, "_plan_spec_run", counting)
    return lengths


@pytest.mark.parametrize("sections", [
    # vLLM's blocks of 16 and its prefix cache (shared prefixes: registrations of decoded blocks), open loop
    {"workload": {"kind": "synthetic", "num_requests": 40, "arrival": {"kind": "poisson", "rate_per_s": 6.0},
                  "input_tokens": {"low": 60, "high": 300}, "output_tokens": {"low": 20, "high": 400},
                  "prefix_group": "sys", "prefix_tokens": 48}},
    # too few blocks for the batch: runs end before the step that would preempt, preemptions step by step
    {"kv_cache": {"num_blocks": 100, "block_size": 4},
     "workload": {"kind": "synthetic", "num_requests": 30, "arrival": {"kind": "concurrency", "concurrency": 4},
                  "input_tokens": {"low": 30, "high": 120}, "output_tokens": {"low": 40, "high": 300}}},
    # SGLang: page size 1, decoded blocks cached at the finish, its admission reserve
    {"engine": {"name": "sglang"}, "kv_cache": {"num_blocks": 3000},
     "workload": {"kind": "synthetic", "num_requests": 30, "arrival": {"kind": "concurrency", "concurrency": 8},
                  "input_tokens": {"low": 30, "high": 200}, "output_tokens": {"low": 40, "high": 300}}},
    # TensorRT-LLM: blocks of 32, full-need admission
    {"engine": {"name": "trtllm"},
     "workload": {"kind": "synthetic", "num_requests": 30, "arrival": {"kind": "poisson", "rate_per_s": 4.0},
                  "input_tokens": {"low": 30, "high": 200}, "output_tokens": {"low": 40, "high": 300}}},
])
@pytest.mark.pure_core
def test_fast_forwarded_speculative_runs_give_the_bytes_of_step_by_step_simulation(tmp_path, monkeypatch, sections):
    """Speculative decodes emit a drawn number of tokens a step; a run draws its steps' acceptances ahead from
    each request's own stream, so its tokens, block events and end times are those of step-by-step
    simulation: requests (token times recorded), time series, ledger and inter-token gaps all equal."""
    lengths = _count_spec_runs(monkeypatch)
    engine = {**sections.get("engine", {}), **spec(3, [0.8, 0.6, 0.4])}
    res = {}
    for ff in (True, False):
        cfg = {**sections, "model": {"name": MIMO}, "engine": engine,
               "metrics": {"sample_interval_s": 0.05, "record_token_times": True},
               "run": {"seed": 3, "fast_forward": ff}}
        res[ff] = Simulation(load_config(cfg)).run()
        res[ff].write(tmp_path / str(ff))
    assert len(lengths) >= 5 and max(lengths) > 4   # (runs were planned, and some were long)
    for name in ("requests.csv", "timeseries.csv", "ledger.json"):
        assert (tmp_path / "True" / name).read_bytes() == (tmp_path / "False" / name).read_bytes(), name
    assert res[True].summary["itl_s"] == res[False].summary["itl_s"]
    if "block_size" in str(sections):
        assert res[True].summary["preemptions"] > 0


class _FlatPrices:
    """Every step 10 ns, no terms (fastforward.Pricer)."""

    def run_costs(self, run, steps):
        import numpy as np
        return [(np.zeros(1), 10) for _ in steps]


@pytest.mark.parametrize("num_blocks, k", [(12, 3), (8, 2)])
def test_a_speculative_run_is_planned_to_the_first_finish_or_the_blocks_it_would_lack(num_blocks, k) -> None:
    """Acceptance 1, k = 2: every verify step emits 3 tokens. A (prompt 8, 12 outputs) and B (prompt 4, 8
    outputs) after their prefill: B has 7 outputs left, so its third step emits 1 and finishes (k = 3).
    Contexts before the steps: A 8 / 11 / 14, B 4 / 7 / 10; with blocks of 4 a step needs cdiv(context + 3, 4):
    A 3 / 4 / 5, B 2 / 3 / 4. The first step took 5 of the pool's blocks; the next two need 2 more each, so
    with 3 free the run stops before the third step (k = 2)."""
    from twin.core.fastforward import SpecRun, plan_decode_run

    def start(blocks: int):
        sched = make_scheduler(num_blocks=blocks, drafter=Drafter((1.0, 1.0), seed=0))
        reqs = [make_request(1, 8, 12), make_request(2, 4, 8)]
        for r in reqs:
            sched.add_request(r, 0)
        sched.update(sched.schedule(0), 1)
        return sched, reqs, sched.schedule(1)

    sched, (a, b), out = start(num_blocks)
    assert out.stats == verify_shape([11, 7], 3) and sched.kv.pool.num_free == num_blocks - 5
    run = plan_decode_run(sched, out, 1, _FlatPrices(), 128)
    assert isinstance(run, SpecRun) and run.k == k
    assert [run.shape(i) for i in range(k)] == [verify_shape([11, 7], 3), verify_shape([14, 10], 3),
                                                 verify_shape([17, 13], 3)][:k]
    assert run.tokens.tolist() == [[3, 3], [3, 3], [3, 1]][:k]
    run.extend(k)
    assert run.ends == [11, 21, 31][:k]
    finished = run.update_upto(k)
    # Step by step from the same start: the same tokens, blocks (ids), registrations and finish.
    ref, (ra, rb), ref_out = start(num_blocks)
    for t in range(1, k + 1):
        ref_finished = ref.update(ref_out, 1 + 10 * t)
        if t < k:
            ref_out = ref.schedule(1 + 10 * t)
    assert [r.id for r in finished] == [r.id for r in ref_finished] == ([2] if k == 3 else [])
    for x, y in ((a, ra), (b, rb)):
        assert (x.num_computed_tokens, x.num_output_tokens, x.last_token_ns) == \
            (y.num_computed_tokens, y.num_output_tokens, y.last_token_ns)
        assert sched.kv.req_blocks.get(x.id) == ref.kv.req_blocks.get(y.id)
        assert sched.kv._num_hashed.get(x.id) == ref.kv._num_hashed.get(y.id)
    assert (a.num_computed_tokens, a.num_output_tokens) == (8 + 3 * k, 1 + 3 * k)
    assert sched.kv.pool.num_free == ref.kv.pool.num_free
    assert sched.output_tokens == ref.output_tokens and sched.steps == ref.steps


def test_sglang_drafts_without_the_overlap_scheduler_unless_the_launch_keeps_it() -> None:
    """SGLang's EAGLE worker turns its overlap scheduler off unless SGLANG_ENABLE_SPEC_V2 is set: a speculative
    SGLang deployment runs its host work in series with the GPU's, so the step pays SGLang's whole step host
    time; engine.speculative.overlap: true keeps the overlap (and hides it); vLLM keeps its overlap."""
    def deployment(engine: str, **speculative: object) -> tuple[Deployment, float]:
        section = spec(2, 0.8)
        section["speculative"].update(speculative)  # type: ignore[attr-defined]
        cfg = load_config({"model": {"name": MIMO}, "engine": {"name": engine, **section}})
        dep = make_deployment(cfg, 1)
        cost = cost_model(cfg, dep).step_cost(verify_shape([500, 700], 3))
        return dep, cost.terms["step_host"]

    plain = make_deployment(load_config({"model": {"name": MIMO}, "engine": {"name": "sglang"}}), 1)
    assert plain.engine.host_overlap
    drafting, host = deployment("sglang")
    assert not drafting.engine.host_overlap and host == load_engine("sglang").step_host_s
    kept, hidden = deployment("sglang", overlap=True)
    assert kept.engine.host_overlap and hidden < host
    assert deployment("vllm")[0].engine.host_overlap
    assert not deployment("vllm", overlap=False)[0].engine.host_overlap
    # The run's resolved config (config.yaml) writes the engine's rule out.
    from twin.system import resolve
    for engine, overlap in (("sglang", False), ("vllm", True)):
        section = spec(2, 0.8)
        cfg = resolve(load_config({"model": {"name": MIMO}, "engine": {"name": engine, **section}}))
        assert cfg.engine.speculative.overlap is overlap
