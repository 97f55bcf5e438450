"""Scheduler outputs for hand-worked steps (token budget, chunking, preemption, admission rules)."""

import pytest
from twin_testkit import make_request, make_scheduler, step

from twin.core.request import Status
from twin.core.shapes import batch_shape
from twin.core.scheduler import Scheduler, SglangFcfsQueue


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


def test_reserving_the_full_need_admits_later_and_never_preempts():
    """TRT-LLM's GUARANTEED_NO_EVICT on the scenario above: a (4 + 8 tokens) sets aside 3 of the 4
    blocks, so b (3 more) waits until a is done, and c (1 block, would fit) waits behind b (FCFS)."""
    sched = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64, reserve_full_kv=True)
    a, b, c = make_request(1, 4, 8), make_request(2, 4, 8), make_request(3, 2, 1)
    for r in (a, b, c):
        sched.add_request(r, 0)
    assert step(sched) == ([(1, 4)], [], [])
    assert [r.id for r in sched.waiting] == [2, 3]
    assert sched.reserved_blocks == 3
    for _ in range(6):
        assert step(sched) == ([(1, 1)], [], [])
    assert sched.kv.blocks_of(a) == [0, 1, 2]  # allocated as tokens arrive, never beyond the reservation
    assert step(sched) == ([(1, 1)], [], [1])
    # a is done: b takes 3 blocks' worth of reservation and c the fourth
    assert step(sched) == ([(2, 4), (3, 2)], [], [3])
    assert sched.reserved_blocks == 3  # b's 3 blocks (c finished in that step)
    while sched.has_work:
        assert step(sched)[1] == []
    assert sched.preemptions == 0 and b.status is Status.FINISHED


def test_sglang_admission_wants_room_for_the_whole_output():
    """SGLang's PrefillAdder, 100 one-token pages: a (10 + 60) leaves 30, so b (30 + 20 = 50) waits. While a
    decodes, the room is the free tokens less a's remaining output x the new-token ratio: before a's n-th
    output step 90 - n - (60 - n) x (0.7 - (n - 1) x 0.602 / 600), 47.7 at n = 1 and falling, so b waits
    until a is done. The vLLM rule admits b at once (30 prompt tokens fit)."""
    sched = make_scheduler(num_blocks=100, block_size=1, admission_reserve="sglang")
    a, b = make_request(1, 10, 60), make_request(2, 30, 20)
    for r in (a, b):
        sched.add_request(r, 0)
    assert step(sched) == ([(1, 10)], [], [])
    for _ in range(58):
        assert step(sched) == ([(1, 1)], [], [])
    assert step(sched) == ([(1, 1)], [], [1])
    assert step(sched) == ([(2, 30)], [], [])
    vllm = make_scheduler(num_blocks=100, block_size=1)
    for r in (make_request(1, 10, 60), make_request(2, 30, 20)):
        vllm.add_request(r, 0)
    assert step(vllm) == ([(1, 10), (2, 30)], [], [])


def test_sglang_admission_fails_at_the_door_a_request_that_needs_the_whole_pool():
    """100 one-token pages. SGLang admits only while need < room, and an idle worker's room is its 100 free
    tokens: a (40 + 60) fits its pages but could never be admitted, so it fails at once with the reason
    instead of stalling the queue; b (40 + 59) runs. Outputs above SGLang's clip count only up to the clip:
    c (10 + 5,000) on 4,200 pages needs 10 + 4,096 < 4,200 and is queued, though it would not be once it
    holds 4,190 tokens (it does not fit its pages: that is the other check). The vLLM rule queues a."""
    sched = make_scheduler(num_blocks=100, block_size=1, admission_reserve="sglang")
    a, b = make_request(1, 40, 60), make_request(2, 40, 59)
    assert not sched.add_request(a, 0) and a.status is Status.FAILED
    assert a.fail_reason.startswith("SGLang's admission needs fewer than the 100 KV tokens worker")
    assert a.fail_reason.endswith("holds free for 40 prompt + 60 output tokens: it would never be admitted")
    assert sched.add_request(b, 0) and step(sched) == ([(2, 40)], [], [])
    big = make_scheduler(num_blocks=4200, block_size=1, admission_reserve="sglang")
    c = make_request(3, 10, 5000)
    assert not big.add_request(c, 0) and "needs 5010 KV blocks" in c.fail_reason
    fits = make_request(4, 10, 4100)
    assert big.add_request(fits, 0) and step(big) == ([(4, 10)], [], [])
    vllm = make_scheduler(num_blocks=100, block_size=1)
    assert vllm.add_request(make_request(1, 40, 60), 0) and step(vllm) == ([(1, 40)], [], [])


def test_sglang_new_token_ratio_decays_per_decode_step_and_admits_when_room_appears():
    """3,000 pages, a (10 + 2,000), b (100 + 1,500 = 1,600). Before step k (k >= 2) a holds 9 + k tokens
    and has 2,001 - k outputs to go after k - 2 decode steps of decay: room = 2,991 - k - (2,001 - k) x
    (0.7 - (k - 2) x 0.602 / 600): 1,599.898 at k = 8 (b waits: 1,600 is not below it), 1,601.59 at k = 9."""
    from twin.core.scheduler import SGLANG_INIT_RATIO, SGLANG_RATIO_DECAY
    sched = make_scheduler(num_blocks=3000, block_size=1, max_num_batched_tokens=256, admission_reserve="sglang")
    a, b = make_request(1, 10, 2000), make_request(2, 100, 1500)
    for r in (a, b):
        sched.add_request(r, 0)
    assert step(sched) == ([(1, 10)], [], [])
    assert sched.new_token_ratio() == SGLANG_INIT_RATIO       # a prefill step does not decay it
    for _ in range(2, 9):
        assert step(sched) == ([(1, 1)], [], [])
    assert sched.new_token_ratio() == SGLANG_INIT_RATIO - 7 * SGLANG_RATIO_DECAY
    assert step(sched) == ([(1, 1), (2, 100)], [], [])        # k = 9
    assert sched.new_token_ratio() == SGLANG_INIT_RATIO - 7 * SGLANG_RATIO_DECAY   # mixed: no decay


def test_sglang_ratio_restarts_after_a_preemption_and_resets_when_idle():
    """320 pages, the ratio decayed to its floor (0.098): a (4 + 300) goes in, then b and c (4 + 120 each)
    beside it (room 315 - 299 x 0.098 = 285.7, then 161.7 and 37.7 left). Together they outgrow the pool:
    after step 104 they hold 319 pages; in step 105 a takes the last one, b finds none and c (the tail)
    is preempted. The ratio restarts from a and b: (104 + 103 decoded + 2 x 20) / (300 + 120 + 1) =
    247 / 421. The next step is a pure decode (c waits: 103 free - (195 + 16) x 0.587 < 124), one decay
    off; once the worker is idle the ratio is 0.7 again."""
    from twin.core.scheduler import SGLANG_INIT_RATIO, SGLANG_MIN_RATIO, SGLANG_RATIO_DECAY
    sched = make_scheduler(num_blocks=320, block_size=1, prefix_caching=False, admission_reserve="sglang")
    sched.admission.ratio_steps = 600   # as after 600 decode steps
    assert sched.new_token_ratio() == SGLANG_MIN_RATIO
    a, b, c = make_request(1, 4, 300), make_request(2, 4, 120), make_request(3, 4, 120)
    sched.add_request(a, 0)
    assert step(sched) == ([(1, 4)], [], [])
    sched.add_request(b, 1)
    sched.add_request(c, 1)
    assert step(sched) == ([(1, 1), (2, 4), (3, 4)], [], [])
    for _ in range(3, 105):
        assert step(sched) == ([(1, 1), (2, 1), (3, 1)], [], [])
    assert sched.kv.pool.num_free == 1
    assert step(sched) == ([(1, 1), (2, 1)], [3], [])
    assert sched.new_token_ratio() == 247 / 421
    assert step(sched) == ([(1, 1), (2, 1)], [], [])
    assert sched.new_token_ratio() == 247 / 421 - SGLANG_RATIO_DECAY
    while sched.has_work:
        step(sched)
    assert sched.new_token_ratio() == SGLANG_INIT_RATIO and c.status is Status.FINISHED


def test_sglang_retracts_the_fewest_outputs_then_the_longest_prompt_to_the_back_of_the_queue():
    """20 one-token pages, no prefix caching: a (8 + 10) and b (2 + 10) go in together and hold 10 + 2 (k - 1)
    pages after step k, all 20 after step 6. In step 7 a needs a page: both have 6 outputs, so SGLang
    retracts a, the longer prompt, though b is the newer; b, behind it, still decodes (13 pages freed).
    c (4 + 2), arriving then, is not admitted in a step that retracted, and a joins the queue behind it:
    step 8 runs b and c's prompt (9 + 4 of 20 pages), then a's 14 tokens (8 + 6 outputs) do not fit
    (7 free) and it waits. vLLM's rule retracts b, the tail, and puts it before c."""
    sched = make_scheduler(num_blocks=20, block_size=1, prefix_caching=False, preemption="sglang")
    a, b = make_request(1, 8, 10), make_request(2, 2, 10)
    sched.add_request(a, 0)
    sched.add_request(b, 0)
    assert step(sched) == ([(1, 8), (2, 2)], [], [])
    for _ in range(2, 7):
        assert step(sched) == ([(1, 1), (2, 1)], [], [])
    assert sched.kv.pool.num_free == 0 and a.num_output_tokens == b.num_output_tokens == 6
    c = make_request(3, 4, 2)
    sched.add_request(c, 7)
    assert step(sched, 7) == ([(2, 1)], [1], [])
    assert a.status is Status.PREEMPTED and a.lost_tokens == 13 and sched.kv.pool.num_free == 12
    assert [r.id for r in sched.waiting] == [3, 1]
    assert step(sched, 8) == ([(2, 1), (3, 4)], [], [])
    assert [r.id for r in sched.waiting] == [1] and sched.kv.pool.num_free == 7
    vllm = make_scheduler(num_blocks=20, block_size=1, prefix_caching=False)
    a, b = make_request(1, 8, 10), make_request(2, 2, 10)
    vllm.add_request(a, 0)
    vllm.add_request(b, 0)
    for _ in range(6):
        step(vllm)
    vllm.add_request(make_request(3, 4, 2), 7)
    assert step(vllm, 7) == ([(1, 1)], [2], [])
    assert [r.id for r in vllm.waiting] == [2, 3]
    # With speculative decoding SGLang does not sort the batch: the latest is retracted.
    x, y = make_request(4, 8, 10), make_request(5, 2, 10)
    assert SglangFcfsQueue(by_progress=False).victim([x, y]) is y and SglangFcfsQueue().victim([x, y]) is x


def test_sglang_retraction_keeps_the_prefill_cached_and_drops_the_decoded_tokens():
    """The scenario above with prefix caching on: when a is retracted at step 7 it holds its 8 prompt pages
    and 5 decoded ones. SGLang's tree holds what prefill inserted, so the prompt pages stay cached (free,
    evictable) and the decoded ones were never cached (they would enter the tree when a finishes); the page
    b takes in that step is a's last (the head of the free queue), which holds no key, so nothing is
    evicted. Under the vLLM rule every full block is cached as it fills and stays so when preempted."""
    sched = make_scheduler(num_blocks=20, block_size=1, preemption="sglang")
    a, b = make_request(1, 8, 10, block_size=1), make_request(2, 2, 10, block_size=1)
    sched.add_request(a, 0)
    sched.add_request(b, 0)
    for _ in range(6):
        step(sched)
    assert a.prefill_tokens == 8 and a.num_computed_tokens == 13
    a_pages = list(sched.kv.blocks_of(a))
    assert [sched.kv.pool.lookup(k) for k in a.block_keys[8:13]] == [None] * 5   # decoded: not cached yet
    assert step(sched, 7) == ([(2, 1)], [1], [])
    pool = sched.kv.pool
    assert [pool.lookup(k) for k in a.block_keys[:8]] == a_pages[:8]
    assert [pool.lookup(k) for k in a.block_keys[8:13]] == [None] * 5 and pool.evictions == 0
    assert sched.kv.blocks_of(b)[-1] == a_pages[12]
    # a waits (need 6 + 4 outputs >= room) until b finishes at step 10; at step 11 it is admitted again: its
    # 8 prompt pages hit and it re-prefills its 6 outputs (14 tokens). That prefill inserts them into the
    # tree (cache_unfinished_req), so all 14 pages are cached now; they used to wait for the first prefill's
    # 8 tokens (the admission registered blocks before it set prefill_tokens), but only without fast-forward.
    for now in (8, 9):
        assert step(sched, now) == ([(2, 1)], [], [])
    assert step(sched, 10) == ([(2, 1)], [], [2])
    assert step(sched, 11) == ([(1, 6)], [], [])
    assert a.prefill_tokens == 14 and sched.kv.blocks_of(a)[:8] == a_pages[:8]
    assert [pool.lookup(k) for k in a.block_keys[:14]] == sched.kv.blocks_of(a)
    vllm = make_scheduler(num_blocks=20, block_size=1)
    x, y = make_request(1, 8, 10, block_size=1), make_request(2, 2, 10, block_size=1)
    vllm.add_request(x, 0)
    vllm.add_request(y, 0)
    for _ in range(6):
        step(vllm)
    y_pages = list(vllm.kv.blocks_of(y))
    assert step(vllm, 7) == ([(1, 1)], [2], [])
    assert [vllm.kv.pool.lookup(k) for k in y.block_keys[:6]] == y_pages[:6]   # x took y's 7th page


def test_sglang_decoded_tokens_enter_the_cache_when_the_request_finishes():
    """Page size 1, a (6 + 4): its prompt pages are cached after its prefill step, its decoded pages only when
    it finishes (SGLang inserts prompt + outputs into the radix tree in cache_finished_req): the 3 tokens
    with KV by then (the 4th output is sampled, never computed). Under the vLLM rule each page is cached as
    it fills."""
    for rule, cached_while_decoding in (("sglang", False), ("vllm", True)):
        sched = make_scheduler(num_blocks=32, block_size=1, preemption=rule)
        a = make_request(1, 6, 4, block_size=1)
        sched.add_request(a, 0)
        step(sched)
        step(sched)
        step(sched)
        pool = sched.kv.pool
        assert all(pool.lookup(k) is not None for k in a.block_keys[:6])
        assert (pool.lookup(a.block_keys[6]) is not None) is cached_while_decoding
        assert step(sched) == ([(1, 1)], [], [1])
        assert all(pool.lookup(k) is not None for k in a.block_keys[:9]) and pool.lookup(a.block_keys[9]) is None


def test_batch_waiting_holds_small_prompts_while_decodes_run():
    """TRT-LLM batch waiting (2 steps, 0.5 x 64 = 32 tokens): a 4-token prompt beside one decode waits two
    steps and goes in the third; a 40-token prompt fills the threshold and goes at once; with no decode
    running nothing is held."""
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=64, batch_wait=(2, 0.5))
    a = make_request(1, 4, 20)
    sched.add_request(a, 0)
    assert step(sched) == ([(1, 4)], [], [])          # idle engine: no decode to wait beside
    sched.add_request(make_request(2, 4, 3), 1)
    assert step(sched) == ([(1, 1)], [], [])
    assert step(sched) == ([(1, 1)], [], [])
    assert step(sched) == ([(1, 1), (2, 4)], [], [])  # held twice: the third step admits it
    sched.add_request(make_request(3, 40, 3), 2)
    assert step(sched) == ([(1, 1), (2, 1), (3, 40)], [], [])  # 42 tokens >= 32: no hold


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


def test_prefill_first_runs_prefill_chunks_alone_and_decodes_in_between():
    # SGLang without mixed chunks: the same arrivals as the first test, other steps.
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=8, mixed_prefill=False)
    d1, d2 = make_request(1, 3, 5), make_request(2, 3, 5)
    sched.add_request(d1, 0)
    sched.add_request(d2, 0)
    assert step(sched) == ([(1, 3), (2, 3)], [], [])
    p = make_request(3, 20, 2)
    sched.add_request(p, 1)
    # p's prompt goes first, in chunks of the whole budget; d1 and d2 get no token until it is done.
    assert step(sched) == ([(3, 8)], [], [])
    assert step(sched) == ([(3, 8)], [], [])
    assert step(sched) == ([(3, 4)], [], [])
    assert p.num_output_tokens == 1 and (d1.num_output_tokens, d2.num_output_tokens) == (1, 1)
    assert step(sched) == ([(1, 1), (2, 1), (3, 1)], [], [3])
    # A waiting request that cannot be admitted (no seat) does not hold the decodes back.
    full = make_scheduler(num_blocks=64, max_num_batched_tokens=8, max_num_seqs=1, mixed_prefill=False)
    a, b = make_request(4, 3, 2), make_request(5, 3, 1)
    full.add_request(a, 0)
    full.add_request(b, 0)
    assert step(full) == ([(4, 3)], [], [])
    assert step(full) == ([(4, 1)], [], [4])
    assert step(full) == ([(5, 3)], [], [5])


def test_lookahead_admits_an_arrival_one_step_later_unless_the_engine_idles():
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=8, lookahead=True)

    def run(start: int, end: int) -> list[tuple[int, int]]:
        out = sched.schedule(start)
        sched.update(out, end)
        return [(r.id, n) for r, n in out.scheduled]

    d = make_request(1, 3, 4)
    sched.add_request(d, 0)
    assert run(0, 10) == [(1, 3)]            # idle engine: admitted at once
    p = make_request(2, 4, 1)
    sched.add_request(p, 5)                  # arrives during the step [0, 10)
    assert run(10, 20) == [(1, 1)]           # the step [10, 20) was formed at 0: p is not in it
    assert run(20, 30) == [(1, 1), (2, 4)]   # formed at 10, after p arrived
    assert p.first_token_ns == 30
    q = make_request(3, 4, 1)
    sched.add_request(q, 25)                 # arrives during [20, 30)
    assert run(30, 40) == [(1, 1)]           # formed at 20; d reaches 4 outputs and finishes at 40
    r = make_request(4, 2, 1)
    sched.add_request(r, 35)
    assert run(40, 50) == [(3, 4)]           # formed at 30: q is in it, r is not
    assert run(50, 60) == [(4, 2)]           # q finished with its first token at 50
    assert not sched.running
    # t arrived during [50, 60), but with nothing else to run the engine takes it on its next loop turn.
    t = make_request(5, 2, 1)
    sched.add_request(t, 55)
    assert run(60, 70) == [(5, 2)]
    u = make_request(6, 2, 1)
    sched.add_request(u, 90)                 # idle since 70: admitted at once
    assert run(90, 100) == [(6, 2)]


def test_lookahead_an_arrival_at_a_step_boundary_misses_the_step_formed_then():
    # A client answering a token of the step that ended at 10 arrives just after the engine formed
    # the step [20, 30) (at 10): it is first seen by the step formed at 20.
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=8, lookahead=True)
    d = make_request(1, 3, 6)
    sched.add_request(d, 0)
    sched.update(sched.schedule(0), 10)
    x = make_request(2, 3, 1)
    sched.add_request(x, 10)
    for start in (10, 20):
        out = sched.schedule(start)
        assert [r.id for r, _ in out.scheduled] == [1]
        sched.update(out, start + 10)
    out = sched.schedule(30)
    assert [(r.id, n) for r, n in out.scheduled] == [(1, 1), (2, 3)]


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
        assert out.stats == batch_shape(out.scheduled)
        preempted += len(out.preempted)
        sched.update(out, t + 1)
    assert not sched.has_work and preempted


def test_every_steps_shape_is_that_of_its_requests_decodes_counted_exactly():
    """The batch shape a step is priced on is BatchShape.from_requests of what it scheduled: the decodes'
    own context and their longest one included. A mixed step used to leave the decodes' context out, and
    the ledger took a pro-rata share of the whole batch's (here a 24-token chunk on a 200-token prompt
    beside decodes of 30-60 tokens: about twice their real context)."""
    from hardware import BatchShape

    sched = make_scheduler(num_blocks=400, max_num_batched_tokens=28, max_num_seqs=8)
    for rid, (prompt, out) in enumerate([(30, 40), (45, 40), (60, 40), (200, 5)]):
        sched.add_request(make_request(rid, prompt, out), 0)
    now = 0
    mixed = 0
    while sched.has_work:
        out = sched.schedule(now)
        q = [n for _, n in out.scheduled]
        kv = [r.num_computed_tokens + n for r, n in out.scheduled]
        assert out.stats == BatchShape.from_requests(q, kv), now
        mixed += 1 < max(q) and 1 in q
        sched.update(out, now + 1)
        now += 1
    assert mixed >= 5


@pytest.mark.parametrize("system", ["colocated", "disaggregated"])
def test_the_reservation_follows_the_batch_through_admissions_preemptions_aborts_and_pulls(system, monkeypatch):
    """The running requests' whole-life blocks (TRT-LLM's reservation) are summed as requests join and leave
    the batch, not recounted at each admission: at every step formed, the sum kept equals the recount, in
    runs with preemptions (vLLM's rule, tight KV), clients' aborts and, disaggregated, KV pulls joining the
    decode workers' batches; each of those paths is taken."""
    import numpy as np

    from twin.config import load_config
    from twin.runner import Simulation

    seen = {"steps": 0, "preempted": 0, "pulled": 0}
    real = Scheduler.schedule

    def checked(self, now, admit_prompts=True):
        recount = sum(self.kv.life_blocks(r.total_tokens) for r in self.running)
        assert self.reserved_blocks == recount, (now, self.reserved_blocks, recount)
        seen["steps"] += 1
        seen["pulled"] += id(self) in decoders and bool(self.running)
        out = real(self, now, admit_prompts)
        seen["preempted"] += len(out.preempted)
        return out

    monkeypatch.setattr(Scheduler, "schedule", checked)
    layout = ({"kind": "colocated"} if system == "colocated" else
              {"kind": "disaggregated", "prefill": {"workers": 1}, "decode": {"workers": 2}})
    cfg = load_config({"system": layout, "kv_cache": {"num_blocks": 150, "block_size": 4},
                       "scheduler": {"max_num_batched_tokens": 256},
                       "workload": {"kind": "synthetic", "num_requests": 80,
                                    "arrival": {"kind": "poisson", "rate_per_s": 60.0},
                                    "input_tokens": {"low": 30, "high": 300},
                                    "output_tokens": {"low": 2, "high": 60}}})
    sim = Simulation(cfg, keep_requests=True)
    decoders = {id(w.sched) for w in getattr(sim.system, "decode", ())}
    rng = np.random.default_rng(7)
    aborted = []

    def aborter():
        for t in sorted(rng.uniform(0, 1.5, 20)):
            yield sim.env.timeout(max(0, round(t * 1e9) - sim.env.now))
            live = [r for r in sim.driver.requests if not r.is_done]
            if live:
                req = live[int(rng.integers(len(live)))]
                aborted.append(req)
                sim.system.abort(req, "gone")

    sim.env.process(aborter())
    res = sim.run()
    assert res.summary["requests"]["failed"] == len({r.id for r in aborted}) > 0
    assert seen["steps"] > 100 and seen["preempted"] > 0
    assert (seen["pulled"] > 0) == (system == "disaggregated")
    for w in sim.workers:
        assert w.sched.reserved_blocks == 0


def test_sglang_recv_interval_takes_arrivals_only_at_the_turn_its_counter_reaches():
    """--scheduler-recv-interval 3: decode steps add 1 to the counter, a step with prompt tokens enough to
    receive at the next turn, an idle scheduler receives at once (SchedulerRecvSkipper)."""
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=64, recv_interval=3)
    a = make_request(1, 4, 20)
    sched.add_request(a, 0)                      # idle: taken at once
    assert not sched.inbox and len(sched.waiting) == 1
    assert step(sched) == ([(1, 4)], [], [])     # a prompt step: the next turn receives
    b = make_request(2, 4, 20)
    sched.add_request(b, 1)
    assert sched.inbox == [b] and len(sched.waiting) == 0
    assert step(sched) == ([(1, 1), (2, 4)], [], [])   # taken at the turn after the prompt step
    assert step(sched) == ([(1, 1), (2, 1)], [], [])   # (the mixed step's weight: this turn receives nothing)
    c = make_request(3, 4, 20)
    sched.add_request(c, 2)
    # decodes only since the last receive: the turns count 1, 2, 3; c is taken at the third
    assert step(sched) == ([(1, 1), (2, 1)], [], [])
    assert step(sched) == ([(1, 1), (2, 1)], [], [])
    assert sched.inbox == [c]
    assert step(sched) == ([(1, 1), (2, 1), (3, 4)], [], [])
    assert not sched.inbox


def test_an_aborted_request_leaves_sglangs_input_queue():
    sched = make_scheduler(num_blocks=64, recv_interval=5)
    sched.add_request(make_request(1, 4, 20), 0)
    step(sched)
    b = make_request(2, 4, 20)
    sched.add_request(b, 1)
    assert sched.abort(b, 2, "client went away") and not sched.inbox and b.status is Status.FAILED
