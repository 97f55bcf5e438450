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

With speculative decoding (:class:`SpecRun`) a step emits 1 + a tokens per request, a being the drafts its
verification accepts. Those are drawn from each request's own stream (twin.core.scheduler.Drafter), which a run
draws ahead and its steps use up in order, so the steps' tokens, shapes and block events are known when
the run is planned, and the run is as exact as a plain one.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

import attrs
import numpy as np

from hardware import BatchShape
from twin.core.kv_cache import NO_PLACEHOLDERS
from twin.core.request import NO_TIME, Request
from twin.core.scheduler import Scheduler, SchedulerOutput
from twin.core.clock import CLOCK_MAX_NS

_NEVER = CLOCK_MAX_NS
"""A step no run reaches."""


class Pricer(Protocol):
    """What a run asks of its worker: the prices (term vector, ns) of its steps."""

    def decode_costs(self, n: int, sum_kv: int, max_kv: int, steps: range) -> list[tuple[np.ndarray, int]]:
        """Pure-decode steps of ``n`` requests (:class:`DecodeRun`; see StepPrices.decode_costs)."""
        ...

    def run_costs(self, run: PlannedRun, steps: range) -> list[tuple[np.ndarray, int]]:
        """Steps ``steps`` (0-based) of ``run``, each of the shape ``run.shape(i)``."""
        ...


class GroupPrices(Protocol):
    """The step prices of one rank of an attention-DP group (twin.core.prices.StepPrices)."""

    def group_cost(self, shape: BatchShape, group_tokens: int) -> tuple[np.ndarray, int]:
        ...

    def group_decode_cost(self, n: int, sum_kv: int, max_kv: int, group_tokens: int) -> tuple[np.ndarray, int]:
        ...


class PlannedRun:
    """k planned steps of one worker, the first scheduled by the regular ``schedule``: their costs and end
    times (computed on demand, :meth:`extend`), and their schedule and update phases, applied lazily."""

    def __init__(self, sched: Scheduler, reqs: list[Request], start_ns: int, k: int, first: BatchShape,
                 pricer: Pricer) -> None:
        self.sched = sched
        self.reqs = reqs
        self.measured = sum(r.measured for r in reqs)
        """Requests whose gaps count in the ITL (Request.measured)."""
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

    def shape(self, i: int) -> BatchShape:
        """The batch shape of step i + 1 (0-based i), as the scheduler would form it."""
        raise NotImplementedError

    def _prices(self, steps: range) -> list[tuple[np.ndarray, int]]:
        return self.pricer.run_costs(self, steps)

    def group_price(self, prices: GroupPrices, i: int, group_tokens: int) -> tuple[np.ndarray, int]:
        """Step i + 1 (0-based i) priced for a rank of an attention-DP group computing ``group_tokens`` in it."""
        return prices.group_cost(self.shape(i), group_tokens)

    def extend(self, m: int) -> int:
        """Cost steps up to ``m`` (at most k); returns how many are costed."""
        m = min(m, self.k)
        done = len(self.ends)
        if m <= done:
            return done
        t = self.ends[-1] if self.ends else self.start_ns
        ends = self.ends
        terms_list = self.terms
        ns_list = self.ns
        for terms, d in self._prices(range(done, m)):
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
        raise NotImplementedError

    def update_upto(self, m: int) -> list[Request]:
        """Apply the update phases of steps ``updated+1 .. m``; returns requests finished at step m."""
        raise NotImplementedError

    def safe_further(self, steps: int) -> int:
        """After the steps applied so far, how many more (at most ``steps``) the free blocks see through
        without a preemption."""
        raise NotImplementedError

    def _gaps(self, a: int, m: int, tokens: Sequence[int] | None) -> None:
        """The update phases' token counts, times and gaps of steps a .. m for every request, each emitting
        one token a step or (``tokens``) its own count over them."""
        sched = self.sched
        ends = self.ends
        itl = sched.gap_counts
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
        steps = m - a + 1
        shared = 0  # requests whose previous token came at the previous step end: one shared gap
        for idx, req in enumerate(self.reqs):
            n = steps if tokens is None else tokens[idx]
            req.num_computed_tokens += n
            req.num_output_tokens += n
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
        if shared:
            gap = first_end - prev
            itl[gap] = itl.get(gap, 0) + shared

    def _finish_update(self, a: int, m: int, tokens: int) -> list[Request]:
        """The scheduler's side of the update phases of steps a .. m, which emitted ``tokens`` in all."""
        sched = self.sched
        ends = self.ends
        steps = m - a + 1
        sched.output_tokens += tokens
        sched.steps += steps
        sched.mark_applied(ends[m - 2] if m >= 2 else self.start_ns, ends[m - 1])
        self.updated = m
        finished: list[Request] = []
        if m == self.k:
            finished = [r for r in self.reqs if r.num_output_tokens >= r.max_output_tokens]
        sched.sampled(self.reqs, finished, ends[m - 1])
        sched.count_decode_steps(steps)  # after the finish: an idle worker restarts SGLang's ratio
        sched.count_recv_turns(m - max(a, 2) + 1)  # the turns that formed steps 2 .. m of the run
        return finished


class DecodeRun(PlannedRun):
    """k planned pure-decode steps of one worker; step 1 was scheduled by the regular ``schedule``."""

    def __init__(self, sched: Scheduler, reqs: list[Request], start_ns: int, k: int, first: BatchShape,
                 pricer: Pricer) -> None:
        super().__init__(sched, reqs, start_ns, k, first, pricer)
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

    def shape(self, i: int) -> BatchShape:
        """Every request has i more tokens of context than at step 1."""
        first = self.first
        if not i:
            return first
        n = first.num_reqs
        kv = first.sum_kv + i * n
        longest = first.decode_max_kv + i if first.decode_max_kv >= 0 else -1
        return attrs.evolve(first, sum_kv=kv, sum_q_kv=kv, decode_sum_kv=kv, decode_max_kv=longest)

    def group_price(self, prices: GroupPrices, i: int, group_tokens: int) -> tuple[np.ndarray, int]:
        # :meth:`shape` (i), priced on the decode fast path without building it.
        first, n = self.first, len(self.reqs)
        longest = first.decode_max_kv + i if first.decode_max_kv >= 0 else -1
        return prices.group_decode_cost(n, first.sum_kv + i * n, longest, group_tokens)

    def _prices(self, steps: range) -> list[tuple[np.ndarray, int]]:
        # Step i + 1 (i from 0) attends sum_kv + i * n tokens, the longest request max_kv + i. Step 1 too is
        # a pure-decode step (every request scheduled one token: plan_decode_run checks it), whose decode
        # price is bit for bit the price of its full shape (CostModel.decode_step).
        first = self.first
        return self.pricer.decode_costs(len(self.reqs), first.sum_kv, first.decode_max_kv, steps)

    def safe_further(self, steps: int) -> int:
        return safe_steps(self.sched, self.reqs, steps)

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
        self._gaps(a, m, None)
        if self.sched.record_token_times:
            times = self.ends[a - 1:m]
            for req in self.reqs:
                if req.token_times_ns is None:
                    req.token_times_ns = []
                req.token_times_ns.extend(times)
        return self._finish_update(a, m, len(self.reqs) * (m - a + 1))


class SpecRun(PlannedRun):
    """k planned speculative decode steps of one worker; step 1 was scheduled by the regular ``schedule``.

    Every request verifies q = 1 + d tokens a step (its last token and d drafts) and emits 1 + a of them, a
    drawn for it (``first_drafts`` for step 1, the drafter's :meth:`~twin.core.scheduler.Drafter.ahead` for the
    rest), at most the outputs it has left. The run is planned until the first step a request finishes in,
    or the last step before one whose allocations the free blocks would not cover (``k_max`` at most): the
    tokens of each step and the context before it are then known per request, and with them the steps'
    shapes, their block allocations (a step's verification needs room for all q tokens: allocate_slots) and
    prefix-cache registrations (the blocks full up to the step's last known token)."""

    def __init__(self, sched: Scheduler, reqs: list[Request], start_ns: int, k_max: int, first: BatchShape,
                 first_drafts: list[int], pricer: Pricer) -> None:
        drafter = sched.drafter
        assert drafter is not None
        kv = sched.kv
        size = kv.block_size
        self.q = 1 + drafter.k
        n = len(reqs)
        req_blocks = kv.req_blocks
        caching = kv.enable_prefix_caching
        rows = [(r.num_computed_tokens, r.max_output_tokens - r.num_output_tokens, len(req_blocks[r.id]),
                 caching and kv.registers_now(r, r.num_computed_tokens + 1)) for r in reqs]
        c0, left, held, registers = (np.array(col) for col in zip(*rows))
        """Per request: tokens computed and outputs left before step 1, blocks held after its allocation, and
        whether its decoded blocks enter the prefix cache as they fill (KVCacheManager.registers_now)."""
        free = kv.pool.num_free
        emitted = np.empty((k_max, n), dtype=np.int64)   # tokens emitted per step and request, uncapped
        emitted[0] = first_drafts
        emitted[0] += 1
        drawn = 1
        while True:
            # Draw in chunks, up to the first step that finishes a request or cannot get its blocks.
            want = min(k_max, 8 * drawn)
            if want > drawn:
                emitted[drawn:want] = np.array([drafter.ahead(r, drawn - 1, want - 1) for r in reqs]).T
                emitted[drawn:want] += 1
                drawn = want
            outputs = np.cumsum(emitted[:drawn], axis=0)   # after each step, uncapped
            done = (outputs >= left).any(axis=1)
            ends = bool(done.any())
            k = int(done.argmax()) + 1 if ends else drawn
            computed = np.empty((k, n), dtype=np.int64)
            computed[0] = c0
            computed[1:] = outputs[:k - 1] + c0
            beyond = self._blocks_beyond(computed, held, size)
            fits = self._fitting(beyond, free)
            if fits < k:
                k = fits
                ends = True
            if ends or drawn == k_max:
                break
        tokens = self.tokens = emitted[:k].copy()
        """Tokens each request emits at each step (rows: steps; the last step's capped at the outputs left)."""
        np.minimum(tokens[k - 1], left - (outputs[k - 2] if k >= 2 else 0), out=tokens[k - 1])
        self.computed = computed[:k]
        """Tokens each request has computed before each step."""
        super().__init__(sched, reqs, start_ns, k, first, pricer)
        self._sum = self.computed.sum(axis=1).tolist()
        self._max = self.computed.max(axis=1).tolist()
        self._beyond = beyond[:k]
        self._registers = registers.astype(bool) if caching else None
        self._events: list[tuple[int, int, int, bool]] | None = None
        """(step, request index, blocks allocated, whether it registers blocks) in step-by-step order, found
        when a step after the first is first scheduled (:meth:`_block_events`)."""
        self._next = 0
        """The first event not replayed."""

    def _blocks_beyond(self, computed: np.ndarray, held: np.ndarray, size: int) -> np.ndarray:
        """Per step (rows of ``computed``, the tokens before it) and request: the blocks beyond the ``held``
        ones its allocation leaves the request with, room for the step's q tokens (non-decreasing by step)."""
        return np.maximum(-(-(computed + self.q) // size) - held, 0)

    @staticmethod
    def _fitting(beyond: np.ndarray, free: int) -> int:
        """How many of the steps (rows of :meth:`_blocks_beyond`) the ``free`` blocks cover, from the first."""
        short = beyond.sum(axis=1) > free
        return int(short.argmax()) if short.any() else len(beyond)

    def _block_events(self) -> list[tuple[int, int, int, bool]]:
        """The schedule phase of each step after the first, request by request in running order: the blocks
        its allocation takes, then whether it registers blocks (full up to the step's known token)."""
        grow = np.diff(self._beyond, axis=0)
        if self._registers is None:
            fills = np.zeros_like(grow, dtype=bool)
        else:
            fills = np.diff((self.computed + 1) // self.sched.kv.block_size, axis=0) > 0
            fills &= self._registers
        steps, idx = np.nonzero((grow > 0) | fills)
        return list(zip((steps + 2).tolist(), idx.tolist(), grow[steps, idx].tolist(), fills[steps, idx].tolist()))

    def shape(self, i: int) -> BatchShape:
        """twin.core.shapes.verify_shape of the step: every request a decode of q tokens over its context."""
        n = len(self.reqs)
        q = self.q
        kv = self._sum[i] + n * q
        return BatchShape(num_reqs=n, num_decode=n, new_tokens=n * q, sum_kv=kv, sum_q_kv=q * kv,
                          sum_q_sq=n * q * q, decode_sum_kv=kv, decode_q=q, decode_max_kv=self._max[i] + q)

    def schedule_upto(self, m: int) -> None:
        if m <= self.scheduled:
            return
        kv = self.sched.kv
        pool = kv.pool
        reqs = self.reqs
        events = self._events
        if events is None:
            events = self._events = self._block_events()
        i = self._next
        while i < len(events) and events[i][0] <= m:
            step, idx, grow, fills = events[i]
            req = reqs[idx]
            if grow:
                kv.req_blocks[req.id].extend(pool.allocate(grow))
            if fills:
                kv.cache_computed(req, int(self.computed[step - 1, idx]) + 1)
            i += 1
        self._next = i
        drafter = self.sched.drafter
        assert drafter is not None
        for req in reqs:
            drafter.use(req, m - self.scheduled)
        self.scheduled = m

    def update_upto(self, m: int) -> list[Request]:
        a = self.updated + 1
        if m < a:
            return []
        self.schedule_upto(max(m, self.scheduled))
        tokens = self.tokens[a - 1:m]
        per_req = tokens.sum(axis=0)
        self._gaps(a, m, per_req.tolist())
        sched = self.sched
        if sched.record_token_times:
            times = np.asarray(self.ends[a - 1:m], dtype=np.int64)
            for idx, req in enumerate(self.reqs):
                if req.token_times_ns is None:
                    req.token_times_ns = []
                req.token_times_ns.extend(np.repeat(times, tokens[:, idx]).tolist())
        return self._finish_update(a, m, int(per_req.sum()))

    def safe_further(self, steps: int) -> int:
        kv = self.sched.kv
        held = np.array([len(kv.req_blocks[r.id]) for r in self.reqs], dtype=np.int64)
        rows = self.computed[self.updated:self.updated + max(steps, 0)]
        return self._fitting(self._blocks_beyond(rows, held, kv.block_size), kv.pool.num_free)


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
                    max_steps: int, held: bool = False) -> PlannedRun | None:
    """A run of pure-decode steps starting with ``out`` (speculative ones where it verifies drafts), or None
    when nothing longer than one step is safe. ``held``: the caller holds the waiting requests back for the
    run's steps (an attention-DP group's balance: twin.shell.attention_dp), so that they need not be none."""
    stats = out.stats
    limits = sched.limits
    if held and (limits.batch_wait_iters or limits.batch_wait_max_tokens_ratio):
        return None  # (a held step would still count its admissible prompts: Scheduler._hold_prompts)
    max_steps = min(max_steps, 1 + sched.decodes_before_recv())
    if (out.lazy or out.preempted or out.host_load_s or (len(sched.waiting) and not held) or max_steps < 2
            or stats.num_decode != stats.num_reqs):
        return None
    running = sched.running
    if len(out.scheduled) != len(running):
        return None
    if sched.drafter is not None:  # (a decode with no output yet samples its first token: no drafts to verify)
        return _plan_spec_run(sched, out, start_ns, pricer, max_steps) if out.drafts is not None else None
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


def _plan_spec_run(sched: Scheduler, out: SchedulerOutput, start_ns: int, pricer: Pricer,
                   max_steps: int) -> SpecRun | None:
    """:func:`plan_decode_run` for a step whose every request verifies drafts."""
    drafts = out.drafts
    assert drafts is not None and sched.drafter is not None
    q = 1 + sched.drafter.k
    reqs = []
    first = []
    for (req, tokens), run_req in zip(out.scheduled, sched.running):
        a = drafts.get(req)
        if tokens != q or req is not run_req or a is None:
            return None
        reqs.append(req)
        first.append(a)
    run = SpecRun(sched, reqs, start_ns, max_steps, out.stats, first, pricer)
    return run if run.k >= 2 else None
