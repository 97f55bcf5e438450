"""The scheduler's engine policies (twin.core.policies) and the parts split out of it, each without a simulation:
chosen from the limits' rule names, never from the engine's name; and the size limits of those modules."""

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from twin_testkit import make_request, make_scheduler, step

from hardware.engine import ADMISSION_RESERVES, PREEMPTION_RULES
from twin.core.gaps import GapHistogram
from twin.core.input_queue import RECV_WEIGHT_DECODE, RECV_WEIGHT_OTHER, InputQueue
from twin.core.kv_cache import KVCacheManager
from twin.core.limits import SchedulerLimits
from twin.core.policies import (ADMISSION_POLICIES, PREEMPTION_POLICIES, SGLANG_INIT_RATIO, SGLANG_MIN_RATIO,
                           SGLANG_RATIO_DECAY, AdmissionPolicy, BatchWaiting, MixedBatches, PreemptionPolicy,
                           PrefillFirst, SglangReserve, SglangRetraction, build_policies)
from twin.core.queues import FcfsQueue, PriorityQueue, SglangFcfsQueue
from twin.core.request import Status
from twin.core.scheduler import Scheduler

TWIN = Path(__file__).resolve().parents[2] / "twin" / "core"
SCHEDULER_MODULES = ("scheduler", "output_processor", "policies", "queues", "limits", "drafter", "gaps", "shapes",
                     "input_queue")


def limits(**rules: object) -> SchedulerLimits:
    return SchedulerLimits(max_num_batched_tokens=64, max_num_seqs=16, **rules)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- choosing
def test_every_rule_an_engine_profile_may_name_has_a_policy():
    assert set(PREEMPTION_POLICIES) == set(PREEMPTION_RULES)
    assert set(ADMISSION_POLICIES) == set(ADMISSION_RESERVES)


def test_the_scheduler_builds_its_policies_once_from_the_limits():
    vllm = make_scheduler(num_blocks=8)
    assert type(vllm.admission) is AdmissionPolicy and type(vllm.preemption) is PreemptionPolicy
    assert type(vllm.batching) is MixedBatches and vllm.batch_waiting is None
    assert type(vllm.waiting) is FcfsQueue and not vllm.kv.decode_cached_at_finish
    sglang = make_scheduler(num_blocks=8, admission_reserve="sglang", preemption="sglang", mixed_prefill=False,
                            batch_wait=(3, 0.5))
    assert isinstance(sglang.admission, SglangReserve) and isinstance(sglang.preemption, SglangRetraction)
    assert isinstance(sglang.batching, PrefillFirst) and isinstance(sglang.batch_waiting, BatchWaiting)
    assert isinstance(sglang.waiting, SglangFcfsQueue) and sglang.kv.decode_cached_at_finish
    assert not make_scheduler(num_blocks=8, preemption="sglang", prefix_caching=False).kv.decode_cached_at_finish


@pytest.mark.parametrize(("rules", "message"), [
    ({"preemption": "trtllm"}, "unknown preemption rule 'trtllm'"),
    ({"admission_reserve": "full"}, "unknown admission reserve 'full'"),
])
def test_an_unknown_rule_name_fails(rules, message):
    with pytest.raises(ValueError, match=message):
        build_policies(limits(**rules))


def test_the_preemption_policy_makes_the_queue_that_orders_its_victims():
    assert type(PreemptionPolicy().make_queue("fcfs", speculative=False)) is FcfsQueue
    assert type(PreemptionPolicy().make_queue("priority", speculative=False)) is PriorityQueue
    sglang = SglangRetraction()
    queue = sglang.make_queue("fcfs", speculative=False)
    assert isinstance(queue, SglangFcfsQueue) and queue.by_progress
    speculative = sglang.make_queue("fcfs", speculative=True)
    assert isinstance(speculative, SglangFcfsQueue) and not speculative.by_progress
    assert type(sglang.make_queue("priority", speculative=False)) is PriorityQueue  # its own victim either way
    assert PreemptionPolicy.ends_pass and not SglangRetraction.ends_pass


def test_the_scheduler_names_no_engine():
    """Engine differences reach the scheduler as policies: no string of an engine's rule is compared there."""
    for module in ("scheduler", "output_processor"):
        tree = ast.parse((TWIN / f"{module}.py").read_text())
        names = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                 and node.value in {*PREEMPTION_RULES, *ADMISSION_RESERVES, "trtllm"}}
        assert not names, (module, names)


# --------------------------------------------------------------------------------------- admission
def test_sglang_reserve_counts_its_ratio_and_resets_it_when_idle():
    policy = SglangReserve()
    assert policy.new_token_ratio() == SGLANG_INIT_RATIO
    policy.count_decode_steps(5, [make_request(9, 4, 4)], FcfsQueue())
    assert policy.new_token_ratio() == SGLANG_INIT_RATIO - 5 * SGLANG_RATIO_DECAY
    waiting = FcfsQueue()
    waiting.add(make_request(9, 4, 4))
    policy.count_decode_steps(10_000, [], waiting)
    assert policy.new_token_ratio() == SGLANG_MIN_RATIO
    policy.count_decode_steps(0, [], FcfsQueue())
    assert (policy.ratio_base, policy.ratio_steps) == (SGLANG_INIT_RATIO, 0)
    a, b = make_request(1, 4, 100), make_request(2, 4, 60)
    a.num_output_tokens, b.num_output_tokens = 30, 10
    policy.retracted([a, b])  # (30 + 10 + 2 x 20) / (100 + 60 + 1)
    assert policy.new_token_ratio() == 80 / 161


def test_sglang_reserve_admits_while_the_room_of_one_pass_lasts():
    """100 one-token pages, nothing running: the room is the 100 free tokens; a needs 10 + 30 = 40 and b 50
    (admitted, 10 left), c 20 (not below the 10 left: it waits). A new pass sees the pool again."""
    kv = KVCacheManager(100, 1, True)
    policy = SglangReserve()
    a, b, c = make_request(1, 10, 30, block_size=1), make_request(2, 20, 30, block_size=1), \
        make_request(3, 10, 10, block_size=1)
    policy.open()
    assert policy.admits(a, 0, [], {}, kv) and policy.admits(b, 0, [], {}, kv)
    assert not policy.admits(c, 0, [], {}, kv)
    policy.open()
    assert policy.admits(c, 0, [], {}, kv)


def test_no_reserve_admits_everyone_and_never_refuses():
    policy = AdmissionPolicy()
    kv = KVCacheManager(4, 1, True)
    req = make_request(1, 100, 100, block_size=1)
    assert policy.admits(req, 0, [], {}, kv) and policy.unservable(req, kv) is None
    assert "would never be admitted" in SglangReserve().unservable(req, kv)


# ---------------------------------------------------------------------------------------- batching
def test_prefill_first_forms_a_step_of_prefill_work_alone_and_none_without_it():
    sched = make_scheduler(num_blocks=64, mixed_prefill=False, max_num_batched_tokens=8)
    d, p = make_request(1, 3, 4), make_request(2, 12, 2)
    sched.add_request(d, 0)
    assert step(sched) == ([(1, 3)], [], [])
    assert sched.batching.prefill_step(sched, 1, sched._cutoff(1)) is None  # a decode alone: a mixed step
    sched.add_request(p, 1)
    assert step(sched, 1) == ([(2, 8)], [], [])   # the decode sits it out
    assert step(sched, 2) == ([(2, 4)], [], [])   # the last chunk, alone again
    assert step(sched, 3) == ([(1, 1), (2, 1)], [], [2])  # p samples its second, last token


def test_batch_waiting_holds_prompts_for_its_iterations_or_until_the_step_is_full_enough():
    wait = BatchWaiting(iters=2, ratio=0.5, max_num_batched_tokens=100)
    assert wait.holds(10) and wait.holds(10)
    assert not wait.holds(10) and wait.count == 0  # held twice in a row: admitted
    assert not wait.holds(50)                      # half the budget: admitted at once
    assert BatchWaiting.from_limits(limits()) is None


# ---------------------------------------------------------------------------------- split-out parts
def test_the_input_queue_receives_when_the_counter_reaches_its_interval():
    queue, waiting = InputQueue(3), FcfsQueue()
    a, b = make_request(1, 4, 4), make_request(2, 4, 4)
    assert not queue.holds(a, busy=False)
    assert queue.holds(b, busy=True) and queue.inbox == [b]
    queue.step_applied(decode=True)
    queue.poll(waiting, idle=False)
    assert queue.counter == RECV_WEIGHT_DECODE and queue.decodes_before_recv() == 1
    queue.count_turns(1)
    assert queue.counter == 2 and queue.weight == RECV_WEIGHT_DECODE
    queue.poll(waiting, idle=False)
    assert not queue.inbox and list(waiting) == [b] and queue.counter == 0
    queue.step_applied(decode=False)
    assert queue.weight == RECV_WEIGHT_OTHER


def test_gaps_handed_in_bulk_join_those_counted_one_by_one():
    gaps = GapHistogram()
    gaps.counts[5] = 2
    gaps.add_run([5, 7], 3)
    values, counts = gaps.arrays()
    assert sorted(zip(values.tolist(), counts.tolist())) == [(5, 2), (5, 3), (7, 3)]
    assert gaps.whole() == {5: 5, 7: 3} and gaps.arrays()[1].sum() == 8


def test_a_scheduler_finishes_what_it_admitted_under_every_rule_pair():
    """Every admission x preemption x batching policy runs two requests on a tight pool to their end."""
    for admission in ADMISSION_RESERVES:
        for preemption in PREEMPTION_RULES:
            for mixed in (True, False):
                sched = make_scheduler(num_blocks=12, block_size=2, admission_reserve=admission,
                                       preemption=preemption, mixed_prefill=mixed)
                reqs = [make_request(i, 6, 8, block_size=2) for i in (1, 2)]
                for r in reqs:
                    sched.add_request(r, 0)
                for now in range(200):
                    if not sched.has_work:
                        break
                    step(sched, now)
                assert all(r.status is Status.FINISHED for r in reqs), (admission, preemption, mixed)
                assert isinstance(sched, Scheduler) and sched.kv.pool.num_used == 0


# ------------------------------------------------------------------------------------------- shape
@pytest.mark.parametrize("module", SCHEDULER_MODULES)
def test_scheduler_modules_import_without_simpy_and_stay_small(module: str) -> None:
    """The scheduler's modules are pure state machines, each at most 700 lines with functions of at most 80."""
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.modules['simpy'] = None; import twin.core.{module}"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = (TWIN / f"{module}.py").read_text()
    assert text.count("\n") <= 700
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef):
            assert node.end_lineno is not None and node.end_lineno - node.lineno < 80, node.name


def test_a_gap_histogram_merged_into_arrays_keeps_every_count(monkeypatch):
    """Past its dictionary limit the histogram merges into sorted arrays (a sixth of the memory) and keeps
    counting into the same dictionary; what it reads back is every gap with its whole count."""
    import twin.core.gaps as gaps_module

    monkeypatch.setattr(gaps_module, "_DICT_ITEMS", 3)
    h = GapHistogram()
    counts = h.counts
    for gap in (5, 9, 5, 12, 7):
        counts[gap] = counts.get(gap, 0) + 1
        h.check()
    assert len(counts) <= 3 and list(h._merged[0]) == [5, 7, 9, 12]
    h.add_run([7, 30], 2)
    counts[5] = counts.get(5, 0) + 1
    values, weights = h.arrays()
    assert sorted(zip(values.tolist(), weights.tolist())) == [(5, 1), (5, 2), (7, 1), (7, 2), (9, 1), (12, 1),
                                                              (30, 2)]
    assert h.whole() == {5: 3, 7: 3, 9: 1, 12: 1, 30: 2} and h.counts is counts


def test_a_gap_histogram_past_its_spill_bound_hands_its_sorted_arrays_over_and_keeps_counting():
    """With somewhere to spill to, the merged arrays leave the histogram once they hold more than its bound
    (distinct gaps, sorted, with their counts); what it reads back after that is only what came since, and
    the two together give the summary's statistics of every gap."""
    from twin.results import SpilledGaps, histogram_stats

    spilled: list[tuple[list[int], list[int]]] = []
    h = GapHistogram()
    h.spill, h.spill_items = (lambda g, c: spilled.append((g.tolist(), c.tolist()))), 2
    h.counts.update({9: 1, 5: 2})
    h.compact()
    assert spilled == [] and list(h._merged[0]) == [5, 9]
    h.counts.update({7: 4})
    h.compact()
    assert spilled == [([5, 7, 9], [2, 4, 1])] and len(h._merged[0]) == 0
    h.counts.update({5: 1, 40: 3})
    assert h.whole() == {5: 1, 40: 3}

    disk = SpilledGaps()
    h2 = GapHistogram()
    h2.spill, h2.spill_items = disk.add, 3
    every: dict[int, int] = {}
    rng = np.random.default_rng(11)
    for gap in rng.integers(1, 50, 400).tolist():
        h2.counts[gap] = h2.counts.get(gap, 0) + 1
        every[gap] = every.get(gap, 0) + 1
        if len(h2.counts) > 4:
            h2.compact()
    assert len(disk.runs) > 3 and sum(count for _, _, count, _ in disk.runs) < 400
    assert histogram_stats(h2.arrays(), disk) == histogram_stats(every)
    empty = np.zeros(0, dtype=np.int64)
    assert histogram_stats((empty, empty), disk) == histogram_stats(_spilled_only(disk))


def _spilled_only(disk) -> dict[int, int]:
    """The counts ``disk`` holds, read back from its runs' cumulative counts."""
    out: dict[int, int] = {}
    for gaps, ends in disk.read():
        previous = 0
        for g, e in zip(gaps.tolist(), ends.tolist()):
            out[g] = out.get(g, 0) + e - previous
            previous = e
    return out
