"""Lazy decodes (twin.core.decode_cohort): the same outputs as advancing every request step by step."""

import pytest

from twin.config import load_config
from twin.runner import Simulation
from twin.core.decode_cohort import DecodeCohort
from twin.core.scheduler import Scheduler


def _config(**sections):
    base = {
        "workload": {"kind": "synthetic", "num_requests": 60, "arrival": {"kind": "poisson", "rate_per_s": 40.0},
                     "input_tokens": {"low": 50, "high": 900}, "output_tokens": {"low": 5, "high": 120}},
        "scheduler": {"max_num_batched_tokens": 256},
        "metrics": {"sample_interval_s": 0.25, "record_token_times": True},
    }
    base.update(sections)
    return load_config(base)


def _run(cfg, out, cohort: bool, lazy_steps: list[int] | None = None, shapes: list | None = None):
    """Run ``cfg`` with every worker's cohort on or off (``lazy_steps`` collects each step's cohort size,
    ``shapes`` each step's batch shape with its worker). The steps are read where the workers (twin.shell)
    call Scheduler.schedule, so the compiled core is observed as the Python one."""
    sim = Simulation(cfg)
    wids = {}
    for w in sim.workers:
        sched = w.sched
        sched.cohort = DecodeCohort(sched.kv, sched.record_token_times) if cohort else None
        wids[id(sched)] = w.wid
    schedule = Scheduler.schedule

    def counting(self, now, admit_prompts=True):
        result = schedule(self, now, admit_prompts)
        if lazy_steps is not None:
            lazy_steps.append(result.lazy)
        if shapes is not None:
            shapes.append((wids[id(self)], result.stats))
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Scheduler, "schedule", counting)
        res = sim.run()
    res.write(out)
    return res


@pytest.mark.parametrize("sections", [
    {},  # mixed steps: decodes plus a 256-token prefill chunk
    {"run": {"fast_forward": False}},  # every step through the cohort (the systems leave it off here)
    {"kv_cache": {"num_blocks": 120}},  # preemption: the cohort disbands before a step that could preempt
    {"kv_cache": {"num_blocks": 120}, "scheduler": {"max_num_batched_tokens": 256, "policy": "priority"}},
    {"kv_cache": {"block_size": 1, "num_blocks": 6000}},  # every step fills a block
    {"kv_cache": {"prefix_caching": False}},
    {"scheduler": {"max_num_batched_tokens": 256, "long_prefill_token_threshold": 64}},
    # TensorRT-LLM: full-need reservation (KV-bound queueing) and batch waiting
    {"engine": {"name": "trtllm"}, "kv_cache": {"num_blocks": 60},
     "scheduler": {"max_num_batched_tokens": 1024, "chunked_prefill": False}},
    {"engine": {"name": "trtllm"},
     "scheduler": {"max_num_batched_tokens": 1024, "chunked_prefill": False, "batch_wait_iters": 4,
                   "batch_wait_max_tokens_ratio": 0.8}},
    {"system": {"kind": "disaggregated", "prefill": {"workers": 1}, "decode": {"workers": 2, "num_blocks": 200}},
     "workload": {"kind": "lmbenchmark_multiround", "num_users": 10, "num_rounds": 3, "qps": 8.0,
                  "shared_system_prompt": 120, "user_history_prompt": 300, "answer_len": 60}},
])
def test_cohort_gives_byte_identical_results(tmp_path, sections):
    """And every step's batch shape is the same, its decodes' context and longest context included (the
    cohort sums its members' context and keeps their longest, BatchShape.decode_rows)."""
    cfg = _config(**sections)
    lazy: list[int] = []
    shapes_on: list = []
    shapes_off: list = []
    on = _run(cfg, tmp_path / "on", True, lazy, shapes_on)
    if "system" not in sections:  # decode workers run pure-decode steps, which leave the cohort out
        assert max(lazy) > 1  # the cohort carried decodes
    off = _run(cfg, tmp_path / "off", False, shapes=shapes_off)
    assert shapes_on == shapes_off
    assert any(s.decode_max_kv * s.num_decode > s.decode_kv for _, s in shapes_on)  # unequal contexts
    for name in ("requests.csv", "timeseries.csv", "token_times.json"):
        assert (tmp_path / "on" / name).read_bytes() == (tmp_path / "off" / name).read_bytes(), name
    assert on.summary["itl_s"] == off.summary["itl_s"]
    assert on.ledger == off.ledger


def test_systems_turn_the_cohort_on_with_fast_forward_only():
    assert Simulation(_config()).workers[0].sched.cohort is not None
    assert Simulation(_config(run={"fast_forward": False})).workers[0].sched.cohort is None
    prefill_first = Simulation(_config(engine={"name": "sglang"}))
    assert prefill_first.workers[0].sched.cohort is None  # its decodes sit out prefill steps
    # SGLang's admission reads every running request's output count: mixed steps keep it off too
    mixed = Simulation(_config(engine={"name": "sglang"}, scheduler={"mixed_prefill": True}))
    assert mixed.workers[0].sched.cohort is None
    vllm_rule = Simulation(_config(engine={"name": "sglang"},
                                   scheduler={"mixed_prefill": True, "admission_reserve": "none"}))
    assert vllm_rule.workers[0].sched.cohort is not None


@pytest.mark.pure_core
def test_cohort_rebasing_its_update_count_changes_nothing(tmp_path, monkeypatch):
    import twin.core.decode_cohort

    monkeypatch.setattr(twin.core.decode_cohort, "_REBASE_AFTER", 5)  # rebase every few steps instead of every 65,536
    cfg = _config(run={"fast_forward": False})
    shapes_on: list = []
    shapes_off: list = []
    on = _run(cfg, tmp_path / "on", True, shapes=shapes_on)
    off = _run(cfg, tmp_path / "off", False, shapes=shapes_off)
    assert shapes_on == shapes_off  # the longest member's context too, across rebases
    for name in ("requests.csv", "timeseries.csv", "token_times.json"):
        assert (tmp_path / "on" / name).read_bytes() == (tmp_path / "off" / name).read_bytes(), name
    assert on.ledger == off.ledger


def test_a_member_that_finishes_leaves_the_cohort_without_breaking_it_up(tmp_path):
    """vLLM's async scheduling keeps a request that sampled its last token in the running list until the next
    step is formed. a (100 + 4) and b (100 + 12) decode in the cohort while c's 2,000-token prompt runs in
    256-token chunks; a finishes in step 4. Step 5 is formed with a still listed: b stays lazy (the cohort
    used to break up there, b going step by step for one step and every member rejoining after), and the
    steps, outputs and ledger are those of step-by-step simulation."""
    from workloads.io import write_sessions
    from workloads.sessions import Call, Session

    path = tmp_path / "w.jsonl"
    write_sessions(path, [Session(id="a", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=4),)),
                          Session(id="b", arrival_s=0.0, calls=(Call(append_tokens=100, output_tokens=12),)),
                          Session(id="c", arrival_s=0.0, calls=(Call(append_tokens=2000, output_tokens=3),))],
                   source="test")
    cfg = load_config({"workload": {"kind": "sessions", "path": str(path)},
                       "scheduler": {"max_num_batched_tokens": 256}, "metrics": {"record_token_times": True}})
    lazy: list[int] = []
    shapes_on: list = []
    shapes_off: list = []
    on = _run(cfg, tmp_path / "on", True, lazy, shapes_on)
    assert lazy == [0, 2, 2, 2, 1, 1, 1, 1, 1, 0, 0, 0]
    off = _run(cfg, tmp_path / "off", False, shapes=shapes_off)
    assert shapes_on == shapes_off
    for name in ("requests.csv", "timeseries.csv", "token_times.json"):
        assert (tmp_path / "on" / name).read_bytes() == (tmp_path / "off" / name).read_bytes(), name
    assert on.ledger == off.ledger


@pytest.mark.pure_core
def test_finished_members_with_aborts_and_memory_pressure_change_nothing(tmp_path, monkeypatch):
    """The ghost paths (a member finished while the cohort breaks up under memory pressure, or a client's
    abort breaks it up) give what step-by-step simulation gives: tight KV (120 or 300 blocks of 4 tokens),
    25 aborts of random live requests, 80 requests; both paths are taken."""
    import numpy as np
    import twin.core.scheduler

    taken = [0]
    real = twin.core.scheduler.Scheduler._disband

    def counting(self, placeholders):
        taken[0] += bool(self._ghosts)
        return real(self, placeholders)

    monkeypatch.setattr(twin.core.scheduler.Scheduler, "_disband", counting)

    def one(seed, ff, blocks, out):
        cfg = _config(kv_cache={"num_blocks": blocks, "block_size": 4}, run={"seed": seed, "fast_forward": ff},
                      workload={"kind": "synthetic", "num_requests": 80,
                                "arrival": {"kind": "poisson", "rate_per_s": 60.0},
                                "input_tokens": {"low": 30, "high": 400}, "output_tokens": {"low": 2, "high": 60}})
        sim = Simulation(cfg, keep_requests=True)
        rng = np.random.default_rng(seed + 1000)

        def aborter():
            for t in sorted(rng.uniform(0, 2.0, 25)):
                yield sim.env.timeout(max(0, round(t * 1e9) - sim.env.now))
                live = [r for r in sim.driver.requests if not r.is_done]
                if live:
                    sim.system.abort(live[int(rng.integers(len(live)))], "gone")

        sim.env.process(aborter())
        sim.run().write(out)

    for seed in range(4):
        for blocks in (120, 300):
            one(seed, True, blocks, tmp_path / "on")
            one(seed, False, blocks, tmp_path / "off")
            for name in ("requests.csv", "token_times.json", "timeseries.csv"):
                assert (tmp_path / "on" / name).read_bytes() == (tmp_path / "off" / name).read_bytes(), (seed, name)
    assert taken[0] > 0
