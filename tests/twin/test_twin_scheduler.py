"""Scheduler outputs for hand-worked steps (token budget, chunking, preemption, admission rules)."""

import pytest
from twin_testkit import make_request, make_scheduler, step

from twin.request import Status
from twin.scheduler import Scheduler


def test_budget_goes_to_running_decodes_first_then_a_chunked_prefill():
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=8)
    d1, d2 = make_request(1, 3, 5), make_request(2, 3, 5)
    sched.add_request(d1, 0)
    sched.add_request(d2, 0)
    assert step(sched) == ([(1, 3), (2, 3)], [], [])
    assert (d1.num_output_tokens, d2.num_output_tokens) == (1, 1)

    p = make_request(3, 20, 2)
    sched.add_request(p, 1)
    assert step(sched) == ([(1, 1), (2, 1), (3, 6)], [], [])
    assert p.num_computed_tokens == 6 and p.num_output_tokens == 0  # a chunk samples nothing
    assert step(sched) == ([(1, 1), (2, 1), (3, 6)], [], [])
    assert step(sched) == ([(1, 1), (2, 1), (3, 6)], [], [])
    # The last chunk completes the prompt: p samples its first token; d1, d2 reach 5 outputs and finish.
    assert step(sched) == ([(1, 1), (2, 1), (3, 2)], [], [1, 2])
    assert p.num_output_tokens == 1 and p.first_token_ns == 1
    assert step(sched) == ([(3, 1)], [], [3])
    assert not sched.has_work and sched.kv.pool.num_used == 0


def test_batch_shape_sums():
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=8)
    sched.add_request(make_request(1, 3, 5), 0)
    step(sched)
    sched.add_request(make_request(2, 20, 2), 0)
    out = sched.schedule(0)
    # request 1 decodes (q=1, kv=4); request 2 prefills a 7-token chunk (q=7, kv=7).
    s = out.stats
    assert (s.num_reqs, s.num_decode, s.new_tokens, s.sum_kv, s.sum_q_kv, s.sum_q_sq) == (2, 1, 8, 11, 53, 50)


def test_long_prefill_threshold_caps_each_chunk():
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=64, threshold=5)
    sched.add_request(make_request(1, 12, 1), 0)
    assert step(sched) == ([(1, 5)], [], [])
    assert step(sched) == ([(1, 5)], [], [])
    assert step(sched) == ([(1, 2)], [], [1])


def test_preemption_from_the_tail_and_no_admission_in_that_step():
    sched = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    a, b = make_request(1, 4, 8), make_request(2, 4, 8)
    sched.add_request(a, 0)
    sched.add_request(b, 0)
    assert step(sched) == ([(1, 4), (2, 4)], [], [])
    assert (sched.kv.blocks_of(a), sched.kv.blocks_of(b)) == ([0], [1])
    assert step(sched) == ([(1, 1), (2, 1)], [], [])  # token 5 needs a second block each
    assert (sched.kv.blocks_of(a), sched.kv.blocks_of(b)) == ([0, 2], [1, 3])
    for _ in range(3):
        assert step(sched) == ([(1, 1), (2, 1)], [], [])
    # a's 9th token needs a third block; none is free, so the newest running request (b) is preempted.
    c = make_request(3, 2, 1)
    sched.add_request(c, 5)
    assert step(sched) == ([(1, 1)], [2], [])
    assert b.status is Status.PREEMPTED and b.num_computed_tokens == 0 and b.preemptions == 1
    assert b.lost_tokens == 8
    assert sched.kv.blocks_of(a) == [0, 2, 3]
    # Block 1 (b's prompt block, cached) is free, c would fit in it, but a step that preempted admits nobody.
    assert sched.kv.pool.free_order() == [1] and c.status is Status.WAITING
    assert [r.id for r in sched.waiting] == [2, 3]
    # Next step: b is at the head; its prompt block is a cache hit but it needs 2 more blocks: it waits,
    # and FCFS keeps c behind it.
    assert step(sched) == ([(1, 1)], [], [])
    assert [r.id for r in sched.waiting] == [2, 3]


def test_resumed_request_recomputes_what_the_cache_lost():
    sched = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    a, b = make_request(1, 4, 6), make_request(2, 4, 8)
    sched.add_request(a, 0)
    sched.add_request(b, 0)
    for _ in range(5):
        step(sched)
    # a's 9th token needs a third block: b is preempted, and a samples its 6th (last) token in that step.
    assert step(sched) == ([(1, 1)], [2], [1])
    assert b.preemptions == 1
    # b resumes: 4 prompt + 5 outputs = 9 tokens; its prompt block (1) is still cached: 4 hit, 5 recomputed.
    assert step(sched) == ([(2, 5)], [], [])
    assert b.cached_tokens == 0  # the first admission's hit count is kept
    assert b.recomputed_tokens == 8 - 4


def test_priority_policy_admits_and_preempts_by_priority():
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=64, max_num_seqs=1, policy="priority")
    low = make_request(1, 4, 1, priority=5, arrival_ns=0)
    high = make_request(2, 4, 1, priority=0, arrival_ns=1)
    sched.add_request(low, 0)
    sched.add_request(high, 1)
    assert step(sched) == ([(2, 4)], [], [2])
    assert step(sched) == ([(1, 4)], [], [1])


def test_request_larger_than_the_cache_fails_with_a_reason():
    sched = make_scheduler(num_blocks=4, block_size=4)
    big = make_request(1, 14, 4)
    assert not sched.add_request(big, 7)
    assert big.status is Status.FAILED and big.finish_ns == 7
    assert "needs 5 KV blocks" in big.fail_reason and "holds only 4" in big.fail_reason


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_step_and_too_long_ones_fail():
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=8, chunked_prefill=False)
    a, b, long = make_request(1, 6, 4), make_request(2, 5, 1), make_request(3, 9, 1)
    assert not sched.add_request(long, 0) and "9 prompt tokens in one step" in long.fail_reason
    sched.add_request(a, 0)
    sched.add_request(b, 0)
    assert step(sched) == ([(1, 6)], [], [])  # b's 5 tokens do not fit the 2 left: it waits whole
    assert step(sched) == ([(1, 1), (2, 5)], [], [2])


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_batch_shape_summed_in_parts_equals_the_whole(policy: str) -> None:
    """schedule() sums plain decodes as it meets them and the rest afterwards; the shape is the one summed
    over every scheduled entry at once (with preemptions on the way: a small pool)."""
    sched = make_scheduler(num_blocks=12, max_num_batched_tokens=20, max_num_seqs=6, policy=policy)
    for i in range(10):
        sched.add_request(make_request(i, prompt=3 + 5 * (i % 4), output=6 + i, shared=("p", 4),
                                       priority=i % 3), 0)
    preempted = 0
    for t in range(200):
        if not sched.has_work:
            break
        out = sched.schedule(t)
        assert out.stats == Scheduler._stats(out.scheduled)
        preempted += len(out.preempted)
        sched.update(out, t + 1)
    assert not sched.has_work and preempted
