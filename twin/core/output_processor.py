"""Applying a step's output: tokens sampled, inter-token gaps, finished requests leaving the batch, and under
vLLM's async scheduling the deferred part of it (twin.core.limits.SchedulerLimits.async_output).

This half of the scheduler is a mixin of :class:`twin.core.scheduler.Scheduler`, as SGLang keeps its
Scheduler's result processing in SchedulerOutputProcessorMixin (vLLM: Scheduler.update_from_output). It
works on the scheduler's batch, KV manager and policies (declared here for the type checker) and keeps its
own state (:meth:`OutputProcessorMixin._init_outputs`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import numpy as np

from hardware import BatchShape
from twin.core.gaps import GapHistogram
from twin.core.kv_cache import NO_PLACEHOLDERS
from twin.core.request import NO_TIME, Request, Status

if TYPE_CHECKING:
    from twin.core.decode_cohort import DecodeCohort
    from twin.core.drafter import Drafter
    from twin.core.input_queue import InputQueue
    from twin.core.kv_cache import KVCacheManager
    from twin.core.limits import SchedulerLimits
    from twin.core.policies import AdmissionPolicy
    from twin.core.queues import WaitingQueue


@attrs.define
class SchedulerOutput:
    """One formed step (Scheduler.schedule), which the worker prices, runs and hands back to Scheduler.update."""

    scheduled: list[tuple[Request, int]]
    preempted: list[Request]
    stats: BatchShape
    host_load_s: float = 0.0
    """Time to load host-tier hits into GPU blocks before this step can run."""
    lazy: int = 0
    """Decodes of the scheduler's cohort (``running[:lazy]``, one token each) not listed in ``scheduled``."""
    drafts: dict[Request, int] | None = None
    """Speculative decodes of the step (each scheduled with 1 + k tokens) -> drafts they accept (None: none)."""

    @property
    def empty(self) -> bool:
        return not self.scheduled and not self.lazy


class OutputProcessorMixin:
    """Scheduler.update and what it calls: the output of a step the worker ran, applied at its end."""

    # The scheduler's state this half reads (set by twin.core.scheduler.Scheduler): declared in the class body,
    # not under TYPE_CHECKING, so that the compiled core (mypyc) knows the attributes of the class it builds.
    limits: SchedulerLimits
    kv: KVCacheManager
    running: list[Request]
    waiting: WaitingQueue
    cohort: DecodeCohort | None
    drafter: Drafter | None
    admission: AdmissionPolicy
    input_queue: InputQueue
    record_token_times: bool
    retain_finished_kv: bool

    def _leave_running(self, req: Request) -> None:
        """Take ``req`` out of the running batch (Scheduler._leave_running)."""
        raise NotImplementedError

    def _init_outputs(self) -> None:
        """The state this half keeps: counters, the gap histogram, the last steps' times, vLLM's async output."""
        self.steps = 0
        self.output_tokens = 0
        """Tokens its steps sampled, less those dropped since (Scheduler.drop_sampled)."""
        self.gaps = GapHistogram()
        self.gap_counts = self.gaps.counts
        """Inter-token gaps (ns -> count) counted one by one; :attr:`itl_counts` is the whole histogram."""
        self._last_step_end_ns = NO_TIME
        """End of the last step this scheduler applied (for the shared inter-token gap)."""
        self._last_step_start_ns = NO_TIME
        """Start of that step: with lookahead, when the step now being formed was formed."""
        self._step_start_ns = NO_TIME
        """Start of the step being scheduled (becomes ``_last_step_start_ns`` when it is applied)."""
        self._deferred: list[Request] = []
        """async_output: requests that sampled their last token in the last step applied; they leave the batch
        after the next schedule() (:meth:`_apply_outputs`)."""
        self._fresh: list[Request] = []
        """async_output: the requests that sampled a token in the last step applied, in its order; the blocks
        those tokens fill enter the prefix cache after the next schedule()."""
        self._cohort_fills: list[tuple[Request, int]] = []
        """async_output: the same for the lazy cohort's members: (member, tokens to register)."""
        self._ghosts: list[Request] = []
        """async_output: cohort members that sampled their last token in the last step applied. They stay in
        ``running`` among the members until the next schedule's :meth:`_apply_outputs`, so the cohort is
        ``running[:len(cohort) + len(_ghosts)]`` less them (leaving it whole would cost a rejoin of every
        member at each finish)."""

    def update(self, out: SchedulerOutput, now: int) -> list[Request]:
        """Apply a finished step at time ``now``; returns the requests that finished in it.

        A speculative decode that accepted a drafts (``out.drafts``) emits 1 + a tokens at the step's end (at
        most the tokens it still has to produce): its last token and the a accepted drafts become computed
        KV, the rejected positions do not (their slots are rewritten). A streaming client gets them in one
        chunk, and the ITL histogram counts one gap per chunk, as vLLM's benchmark client appends one
        inter-token latency per streamed chunk (so under speculative decoding the mean ITL exceeds TPOT)."""
        self.steps += 1
        finished: list[Request] = []
        itl = self.gap_counts
        record = self.record_token_times
        prev = self._last_step_end_ns
        drafts = out.drafts
        same = 0  # requests whose previous token came at the previous step end: one shared gap
        sampled = 0
        fresh: list[Request] | None = [] if self.limits.async_output else None
        if out.lazy:
            assert self.cohort is not None and drafts is None
            same = self.cohort.measured  # (before the advance, which lets the finished leave)
            finished = self.cohort.advance(now, prev)  # ahead of the others in running order
            sampled = out.lazy
            if finished and fresh is not None:
                # They stay in `running` through the next schedule(), among the members: ghosts there, their
                # last tokens placeholders like the others'.
                fresh = list(finished)
                self._ghosts = fresh[:]
        for req, q in out.scheduled:
            a = None if drafts is None else drafts.get(req)
            if a is None:
                computed = req.num_computed_tokens + q
                req.num_computed_tokens = computed
                if computed < req.prompt_tokens + req.num_output_tokens:
                    continue  # a prefill chunk short of the prompt's end samples nothing
                n = 1
            else:
                n = min(1 + a, req.max_output_tokens - req.num_output_tokens)
                req.num_computed_tokens += n
            req.num_output_tokens += n
            sampled += n
            if fresh is not None:
                fresh.append(req)
            last = req.last_token_ns
            if last == NO_TIME:
                req.first_token_ns = now
            else:
                gap = now - last
                if req.measured:  # (one that arrived before run.warmup_s stays out of the ITL)
                    if last == prev:
                        same += 1
                    else:
                        itl[gap] = itl.get(gap, 0) + 1
                if gap > req.max_itl_ns:
                    req.max_itl_ns = gap
            req.last_token_ns = now
            if record:
                if req.token_times_ns is None:
                    req.token_times_ns = []
                req.token_times_ns.extend([now] * n)
            if req.num_output_tokens >= req.max_output_tokens:
                finished.append(req)
        if same:
            gap = now - prev
            itl[gap] = itl.get(gap, 0) + same
        self.output_tokens += sampled
        self.mark_applied(self._step_start_ns, now)
        if fresh is None:
            self.finish(finished, now)
        else:
            self.sampled(fresh, finished, now)
        stats = out.stats
        self.admission.count_decode_steps(1 if not out.preempted and stats.num_decode == stats.num_reqs else 0,
                                          self.running, self.waiting)
        self.input_queue.step_applied(stats.num_decode == stats.num_reqs)
        self.gaps.check()
        return finished

    def _apply_outputs(self) -> None:
        """async_output: what update_from_output of the last step applied does once the next step is formed:
        the blocks its sampled tokens filled enter the prefix cache (not those of requests preempted since),
        and the requests that sampled their last token leave the batch."""
        kv = self.kv
        if kv.placeholders:
            kv.placeholders = NO_PLACEHOLDERS
        fills, fresh, ghosts = self._cohort_fills, self._fresh, self._ghosts
        if fills:
            self._cohort_fills = []
        if fresh:
            self._fresh = []
        if ghosts:
            self._ghosts = []
        if kv.enable_prefix_caching:
            # The cohort's members first: they lead the running order of the last step.
            if ghosts and fills:  # ... with its finished members among them (the head of `fresh`), in place
                assert fresh[:len(ghosts)] == ghosts
                order = {r: i for i, r in enumerate(self.running)}
                fills = sorted([*fills, *self._fresh_fills(ghosts)], key=lambda fill: order[fill[0]])
                fresh = fresh[len(ghosts):]
            for req, tokens in fills:
                kv.cache_computed(req, tokens)
            for req, tokens in self._fresh_fills(fresh):
                kv.cache_computed(req, tokens)
        deferred = self._deferred
        if deferred:
            self._deferred = []
            for req in deferred:
                self._leave_running(req)
                if not self.retain_finished_kv:
                    self._release(req)

    def _fresh_fills(self, reqs: list[Request]) -> list[tuple[Request, int]]:
        """async_output: the blocks that the placeholder tokens of ``reqs`` filled, (request, tokens) to
        register. Only such a block waits: a decode's, when its computed tokens reached a multiple of the block
        size (every other block was registered when its step was formed, its tokens known)."""
        size = self.kv.block_size
        req_blocks = self.kv.req_blocks
        return [(req, req.num_computed_tokens) for req in reqs if req.num_computed_tokens % size == 0
                and req.status is not Status.PREEMPTED and req.id in req_blocks]

    def sampled(self, reqs: list[Request], finished: list[Request], now: int) -> None:
        """The step applied at ``now`` sampled a token for each of ``reqs`` (those of a lazy cohort aside),
        and ``finished`` their last: they leave the batch now, or with async_output after the next schedule()
        (:meth:`_apply_outputs`), their tokens' blocks cached then too (the tokens are placeholders when
        that step is formed)."""
        if not self.limits.async_output:
            self.finish(finished, now)
            return
        assert not self._deferred, "the last step's finished requests were not released"
        for req in finished:
            req.status = Status.FINISHED
            req.finish_ns = now
            if self.retain_finished_kv:  # its blocks are staged now: only its seat waits
                self._release(req)
        self._deferred = finished
        self._fresh = reqs
        if self.kv.enable_prefix_caching:
            self.kv.placeholders = {r.id for r in reqs}

    def count_decode_steps(self, steps: int) -> None:
        """Applied steps' share in the admission policy's state (SGLang's new-token ratio; nothing otherwise):
        ``steps`` pure-decode steps that retracted nothing, on a scheduler idle or not."""
        self.admission.count_decode_steps(steps, self.running, self.waiting)

    @property
    def itl_counts(self) -> dict[int, int]:
        """Histogram of inter-token gaps (ns -> count) over every request of this worker."""
        return self.gaps.whole()

    def add_gap_run(self, gaps: list[int], count: int) -> None:
        """Count each of ``gaps`` ``count`` times, in bulk (twin.core.gaps.GapHistogram.add_run)."""
        self.gaps.add_run(gaps, count)

    def gap_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The whole histogram as arrays of gaps and their counts (a gap may appear more than once)."""
        return self.gaps.arrays()

    def mark_applied(self, start_ns: int, end_ns: int) -> None:
        """The last step applied ran [start_ns, end_ns) (inter-token gaps, lookahead cutoff)."""
        self._last_step_start_ns = start_ns
        self._last_step_end_ns = end_ns

    def finish(self, finished: list[Request], now: int) -> None:
        """Requests that sampled their last token leave the batch; their blocks go (or stay staged)."""
        for req in finished:
            self._leave_running(req)
            self._release(req)
            req.status = Status.FINISHED
            req.finish_ns = now

    def _release(self, req: Request) -> None:
        """A finished request is out of ``running``: its blocks go (or stay staged)."""
        if self.drafter is not None:
            self.drafter.forget(req)
        if self.kv.decode_cached_at_finish:
            self.kv.cache_computed(req, req.num_computed_tokens, finished=True)
        if not self.retain_finished_kv:
            self.kv.free(req)
