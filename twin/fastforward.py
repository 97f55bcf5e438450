"""Exact decode fast-forward: k pure-decode steps planned at once and applied lazily (DESIGN section 7).

When a step is pure decode, nothing waits, and every running request has outputs left, then nothing but an
outside event (an arrival, a KV pull landing) can change the batch until the first request finishes, and
no step can preempt as long as the free blocks cover every block the batch will need. The worker then
plans those steps (their costs and end times), sleeps until the last one ends or an outside event wakes
it, and applies exactly the steps that elapsed.

Applying is split the way a step is: the *schedule* phase of step i (block allocation, registering full
blocks in the prefix cache) happens when the step starts, the *update* phase (tokens, timestamps,
completions) when it ends. Readers from outside (router, monitor) call :meth:`DecodeRun.sync` first, so
they see exactly the state step-by-step simulation would show at that instant. Allocation and caching
events are replayed in the step-by-step order (step, then running order), so block ids, evictions and
prefix hits are identical; only the Python work per token disappears (events are per block, not per
token).
"""

from __future__ import annotations

from typing import Iterable, Protocol

import numpy as np

from hardware import BatchShape
from twin.kv_cache import NO_PLACEHOLDERS
from twin.request import NO_TIME, Request
from twin.scheduler import Scheduler, SchedulerOutput
from twin.sim import CLOCK_MAX_NS

_NEVER = CLOCK_MAX_NS
"""A step no run reaches."""


class Pricer(Protocol):
    """What a run asks of its worker: the prices (term vector, ns) of pure-decode steps."""

    def decode_costs(self, n: int, sum_kv: int, max_kv: int, steps: range) -> list[tuple[np.ndarray, int]]: ...


class DecodeRun:
    """k planned pure-decode steps of one worker; step 1 was scheduled by the regular ``schedule``."""

    def __init__(self, sched: Scheduler, reqs: list[Request], start_ns: int, k: int, first: BatchShape,
                 pricer: Pricer) -> None:
        self.sched = sched
        self.reqs = reqs
        self.measured = sum(r.measured for r in reqs)
        """Requests whose gaps count in the ITL (Request.measured)."""
        self.c0 = [r.num_computed_tokens for r in reqs]
        """Computed tokens of each request before step 1."""
        size = sched.kv.block_size
        self.cap1 = [len(sched.kv.req_blocks[r.id]) * size for r in reqs]
        """Token capacity of each request's blocks after step 1's allocation."""
        # Step i computes token c0 + i - 1 (0-based); it needs a new block when that token starts one beyond
        # the capacity reserved after step 1, and fills a block when c0 + i is a multiple of size: each
        # request's block events come every `size` steps from the first after step 1.
        first_alloc = [max(2, cap1 - c0 + 1) for c0, cap1 in zip(self.c0, self.cap1)]
        self._next_alloc = [i + (-(c0 + i - 1)) % size for c0, i in zip(self.c0, first_alloc)]
        """Per request: the next step (not scheduled yet) that takes a new block."""
        kv = sched.kv
        self._lag = 1 if sched.limits.async_output else 0
        """Steps between a block's filling and its registration: with vLLM's async scheduling the block
        that step i fills is registered once step i + 1 is formed (SchedulerLimits.async_output)."""
        if not kv.enable_prefix_caching:
            self._next_cache = [_NEVER] * len(reqs)
        elif not kv.decode_cached_at_finish:
            lag = self._lag
            self._next_cache = [2 + (-(c0 + 2 - lag)) % size for c0 in self.c0]
        else:  # blocks past the prefill wait for the request's finish (KVCacheManager.registers_now)
            self._next_cache = [2 + (-(c0 + 2)) % size if kv.registers_now(r, c0 + 1) else _NEVER
                                for c0, r in zip(self.c0, reqs)]
        """Per request: the next step (not scheduled yet) whose schedule phase registers a block in the prefix
        cache (the one it fills, or with async scheduling the one the step before filled)."""
        self._next_event = self._earliest_block_event()
        self.k = k
        """Steps planned; their costs are computed on demand (:meth:`extend`), as the run survives."""
        self.first = first
        self.pricer = pricer
        self.ns: list[int] = []
        self.terms: list[np.ndarray] = []
        self.start_ns = start_ns
        self.ends: list[int] = []
        self.scheduled = 1
        """Steps whose schedule phase has been applied."""
        self.updated = 0
        """Steps whose update phase has been applied."""

    def extend(self, m: int) -> int:
        """Cost steps up to ``m`` (at most k); returns how many are costed."""
        m = min(m, self.k)
        done = len(self.ends)
        if m <= done:
            return done
        n = len(self.reqs)
        first = self.first
        t = self.ends[-1] if self.ends else self.start_ns
        # Step i + 1 (i from 0) attends sum_kv + i * n tokens, the longest request max_kv + i. Step 1 too is
        # a pure-decode step (every request scheduled one token: plan_decode_run checks it), whose decode
        # price is bit for bit the price of its full shape (CostModel.decode_step).
        prices = self.pricer.decode_costs(n, first.sum_kv, first.decode_max_kv, range(done, m))
        ends = self.ends
        terms_list = self.terms
        ns_list = self.ns
        for terms, d in prices:
            terms_list.append(terms)
            ns_list.append(d)
            t += d
            ends.append(t)
        return m

    def truncate(self, k: int) -> None:
        """Plan only ``k`` steps (at least the steps applied so far), dropping the costs of later ones."""
        assert self.updated <= k <= self.k
        self.k = k
        del self.ends[k:], self.terms[k:], self.ns[k:]

    def start_of(self, i: int) -> int:
        """Start time of step i (1-based)."""
        return self.start_ns if i == 1 else self.ends[i - 2]

    def sync(self, now: int) -> list[Request]:
        """Apply what step-by-step simulation has applied before events at ``now`` run."""
        upto = self.scheduled
        while upto < len(self.ends) and self.ends[upto - 1] < now:
            upto += 1
        self.schedule_upto(upto)
        done = self.updated
        while done < len(self.ends) and self.ends[done] < now:
            done += 1
        return self.update_upto(done)

    def schedule_upto(self, m: int) -> None:
        """Replay the schedule phases of steps ``scheduled+1 .. m``: allocations and cache registrations."""
        if m < self._next_event:  # no block event in these steps
            self.scheduled = max(m, self.scheduled)
            return
        # The run registers each block at the step that may (self._lag): update_upto's placeholders, there for
        # the regular schedule() after the run, do not apply to it.
        self.sched.kv.placeholders = NO_PLACEHOLDERS
        # A few events (fewer steps than two blocks' worth) cost less one by one than in bulk.
        if m - self.scheduled < 2 * self.sched.kv.block_size or not self._schedule_in_bulk(m):
            self._schedule_event_by_event(m)
        self.scheduled = m
        self._next_event = self._earliest_block_event()

    def _schedule_in_bulk(self, m: int) -> bool:
        """:meth:`schedule_upto` with the allocations taken at once and each request's registrations in one
        call, where that gives the same state as the step-by-step order; False (nothing changed) otherwise.

        The pool hands out blocks in the same order whether asked one at a time or n at once (block ids,
        evictions and their host-tier hooks alike). Registrations touch only blocks the running requests
        hold, which no allocation takes, and an eviction only removes keys; so when none of the keys to be
        registered is cached now and none appears twice, every registration succeeds in either order, and
        taking the allocations first changes nothing. Otherwise (a key held by a free block that an
        allocation of these steps may evict, two requests writing the same content) the order matters, and
        the caller replays the events one by one."""
        kv = self.sched.kv
        size = kv.block_size
        reqs = self.reqs
        n = len(reqs)
        # Registrations: each request's last block-filling step up to m (its earlier ones register a prefix).
        targets: list[tuple[Request, int]] = []
        pending: list[int] = []
        next_cache = self._next_cache
        for idx in range(n):
            i = next_cache[idx]
            if i <= m:
                last = i + (m - i) // size * size - self._lag
                targets.append((reqs[idx], self.c0[idx] + last))
                pending.extend(kv.uncached_keys(reqs[idx], self.c0[idx] + last))
        if pending and (len(set(pending)) != len(pending) or kv.holds_any(pending)):
            return False
        # Allocations, handed out in the step-by-step order: by step, then running order.
        starts = self._next_alloc
        counts = [0 if s > m else (m - s) // size + 1 for s in starts]
        total = sum(counts)
        if total:
            blocks = kv.pool.allocate(total)
            req_blocks = kv.req_blocks
            if size == 1 and min(counts) == total // n == max(counts):
                # Every request takes a block at every one of the steps (page size 1): request r gets the
                # r-th block of each step's n.
                for r, req in enumerate(reqs):
                    req_blocks[req.id] += blocks[r::n]
            else:
                order = sorted((s + size * j, idx) for idx, (s, c) in enumerate(zip(starts, counts))
                               for j in range(c))
                for (_, idx), block in zip(order, blocks):
                    req_blocks[reqs[idx].id].append(block)
            self._next_alloc = [s + c * size for s, c in zip(starts, counts)]
        for req, tokens in targets:
            kv.cache_computed(req, tokens)
        self._next_cache = [i if i > m else i + ((m - i) // size + 1) * size for i in next_cache]
        return True

    def _schedule_event_by_event(self, m: int) -> None:
        """:meth:`schedule_upto`, every allocation and registration in the step-by-step order."""
        kv = self.sched.kv
        size = kv.block_size
        events: list[tuple[int, int, int]] = []
        for kind, steps in enumerate((self._next_alloc, self._next_cache)):
            for idx, i in enumerate(steps):
                while i <= m:
                    events.append((i, idx, kind))
                    i += size
                steps[idx] = i
        events.sort()
        pool = kv.pool
        lag = self._lag
        for i, idx, kind in events:
            req = self.reqs[idx]
            if kind == 0:
                kv.req_blocks[req.id].append(pool.allocate_one())
            else:
                kv.cache_computed(req, self.c0[idx] + i - lag)

    def _earliest_block_event(self) -> int:
        """The first step not scheduled yet that allocates or fills a block for any request."""
        return min(min(self._next_alloc), min(self._next_cache))

    def update_upto(self, m: int) -> list[Request]:
        """Apply the update phases of steps ``updated+1 .. m``; returns requests finished at step m."""
        a = self.updated + 1
        if m < a:
            return []
        self.schedule_upto(max(m, self.scheduled))
        sched = self.sched
        ends = self.ends
        steps = m - a + 1
        itl = sched.gap_counts
        n = len(self.reqs)
        measured = self.measured
        # Gaps after a request's first token in this range are the durations of steps a+1 .. m (each end
        # is the previous one plus the step's duration), the same for all requests (counted for those
        # measured: Request.measured).
        inner = self.ns[a:m]
        if inner and measured:
            sched.add_gap_run(inner, measured)
        inner_max = max(inner) if inner else 0  # not max(inner, default=0): a keyword call costs 3 x more
        first_end = ends[a - 1]
        last_end = ends[m - 1]
        prev = sched._last_step_end_ns
        record = sched.record_token_times
        shared = 0  # requests whose previous token came at the previous step end: one shared gap
        for req in self.reqs:
            req.num_computed_tokens += steps
            req.num_output_tokens += steps
            if req.first_token_ns == NO_TIME:
                req.first_token_ns = first_end  # its gaps start with step a + 1
                gap_max = inner_max
            else:
                last = req.last_token_ns
                gap = first_end - last
                if req.measured:
                    if last == prev:
                        shared += 1
                    else:
                        itl[gap] = itl.get(gap, 0) + 1
                gap_max = gap if gap > inner_max else inner_max
            if gap_max > req.max_itl_ns:
                req.max_itl_ns = gap_max
            req.last_token_ns = last_end
            if record:
                if req.token_times_ns is None:
                    req.token_times_ns = []
                req.token_times_ns.extend(ends[a - 1:m])
        if shared:
            gap = first_end - prev
            itl[gap] = itl.get(gap, 0) + shared
        sched.output_tokens += n * steps
        sched.steps += steps
        sched.mark_applied(ends[m - 2] if m >= 2 else self.start_ns, ends[m - 1])
        self.updated = m
        finished: list[Request] = []
        if m == self.k:
            finished = [r for r in self.reqs if r.num_output_tokens >= r.max_output_tokens]
        sched.sampled(self.reqs, finished, ends[m - 1])
        sched.count_decode_steps(steps)  # after the finish: an idle worker restarts SGLang's ratio
        return finished


def safe_steps(sched: Scheduler, reqs: list[Request], k: int) -> int:
    """The most steps up to ``k`` after which the free blocks still cover every block the decodes of
    ``reqs`` need beyond their own (so none of these steps can preempt); 0 when the next one cannot run."""
    kv = sched.kv
    size = kv.block_size
    req_blocks = kv.req_blocks
    # Per request: token capacity of its blocks and tokens computed (constant while planning).
    capacity = [len(req_blocks[r.id]) * size for r in reqs]
    computed = [r.num_computed_tokens for r in reqs]
    free = kv.pool.num_free

    def blocks_needed(steps: int) -> int:
        # Blocks beyond each request's own for `steps` more tokens: cdiv(c + steps - cap, size) when > 0.
        need = 0
        for c, cap in zip(computed, capacity):
            over = c + steps - cap
            if over > 0:
                need -= -over // size
        return need

    if blocks_needed(k) <= free:
        return k
    lo, hi = 0, k  # largest number of steps with enough free blocks
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if blocks_needed(mid) <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_decode_run(sched: Scheduler, out: SchedulerOutput, start_ns: int, pricer: Pricer,
                    max_steps: int) -> DecodeRun | None:
    """A run of pure-decode steps starting with ``out``, or None when nothing longer than one step is safe."""
    stats = out.stats
    if (out.lazy or out.preempted or out.host_load_s or len(sched.waiting) or max_steps < 2
            or stats.num_decode != stats.num_reqs):
        return None
    running = sched.running
    if len(out.scheduled) != len(running):
        return None
    reqs = []
    k = max_steps
    for (req, q), run_req in zip(out.scheduled, running):
        if q != 1 or req is not run_req or req.num_computed_tokens + 1 != req.prompt_tokens + req.num_output_tokens:
            return None
        reqs.append(req)
        left = req.max_output_tokens - req.num_output_tokens
        if left < k:
            k = left
    if k < 2:
        return None
    k = safe_steps(sched, reqs, k)
    if k < 2:
        return None
    # The pure-decode shape that DecodeRun.extend prices by the decode fast path, step 1 included.
    assert stats.new_tokens == stats.sum_q_sq == len(reqs) and stats.sum_q_kv == stats.sum_kv
    assert stats.decode_q == 1
    return DecodeRun(sched, reqs, start_ns, k, out.stats, pricer)
