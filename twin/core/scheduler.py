"""Token-budget continuous batching with vLLM v1 semantics: a pure state machine that takes ``now``.

One step hands at most ``max_num_batched_tokens`` tokens to at most ``max_num_seqs`` requests.
:meth:`Scheduler.schedule` reads as vLLM's: the running requests first, in admission order, each asking for
``num_tokens - num_computed_tokens`` tokens (one while decoding, a chunk while prefilling); when one cannot
get its blocks, a victim among the running requests loses its blocks and waits again (recompute
preemption), and a step that preempted admits nobody. Then the waiting requests, in queue order: the prefix
cache is matched, cached tokens count as computed, and the rest is scheduled (chunked when it does not fit
the remaining budget). Each part is a named step; what differs between engines (the admission reserve, the
victim and where it rejoins, when decoded tokens are cached, prefill-first steps) is a policy object
(twin.core.policies) built once from the limits (twin.core.limits).
"""

from __future__ import annotations

import itertools

from twin.core.clock import CLOCK_MAX_NS
from twin.core.decode_cohort import DecodeCohort
from twin.core.drafter import Drafter
from twin.core.errors import InvariantError
from twin.core.input_queue import InputQueue
from twin.core.kv_cache import KVCacheManager
from twin.core.limits import SchedulerLimits
from twin.core.output_processor import OutputProcessorMixin, SchedulerOutput
from twin.core.policies import (SGLANG_INIT_RATIO, SGLANG_MIN_RATIO, SGLANG_RATIO_DECAY, BatchWaiting, SglangReserve,
                           build_policies)
from twin.core.queues import QUEUE_POLICIES, SglangFcfsQueue, WaitingQueue
from twin.core.request import NO_TIME, Request, Status
from twin.core.shapes import batch_shape, verify_shape

__all__ = ["Drafter", "SGLANG_INIT_RATIO", "SGLANG_MIN_RATIO", "SGLANG_RATIO_DECAY", "Scheduler", "SchedulerLimits",
           "SchedulerOutput", "SglangFcfsQueue"]

_NO_CUTOFF = CLOCK_MAX_NS


class _Step:
    """The step being formed, handed from one named step of :meth:`Scheduler.schedule` to the next."""

    __slots__ = ("budget", "scheduled", "preempted", "others", "drafts", "lazy", "decodes", "decode_kv",
                 "decode_max", "index", "size")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        """Tokens left to hand out."""
        self.scheduled: dict[Request, int] = {}
        self.preempted: list[Request] = []
        self.others: list[tuple[Request, int]] = []
        """Every entry of ``scheduled`` but the decodes of the fast path, in order."""
        self.drafts: dict[Request, int] = {}
        """Speculative decodes -> drafts accepted."""
        self.lazy = 0
        """Decodes of the lazy cohort, not listed in ``scheduled``."""
        self.decodes = self.decode_kv = self.decode_max = 0
        """Decodes of the fast path and the cohort: count, context after the step, longest context."""
        self.index = 0
        """Position in ``running`` of the request being scheduled."""
        self.size = 0
        """Running requests not preempted so far."""


class Scheduler(OutputProcessorMixin):
    """Continuous-batching scheduler of one worker: :meth:`schedule` forms a step, :meth:`update` applies
    its output (twin.core.output_processor)."""

    def __init__(self, limits: SchedulerLimits, kv: KVCacheManager, policy: str = "fcfs",
                 record_token_times: bool = False, retain_finished_kv: bool = False,
                 lazy_decodes: bool = False, drafter: Drafter | None = None) -> None:
        if policy not in QUEUE_POLICIES:
            raise ValueError(f"unknown queue policy {policy!r}; expected one of {sorted(QUEUE_POLICIES)}")
        if limits.async_output and not (limits.lookahead and limits.mixed_prefill and drafter is None):
            raise ValueError("async_output models vLLM's async scheduling: it needs lookahead, mixed prefill "
                             "and no speculative decoding")
        if drafter is not None and lazy_decodes:
            raise ValueError("speculative decodes emit a drawn number of tokens: they cannot be a lazy cohort")
        self.limits = limits
        self.kv = kv
        self.admission, self.preemption, self.batching = build_policies(limits)
        """The engine's rules (twin.core.policies): admission reserve, preemption victim and decode caching,
        prefill-first or mixed steps."""
        self.waiting: WaitingQueue = self.preemption.make_queue(policy, speculative=drafter is not None)
        # Under SGLang's rule a running request's decoded tokens enter the prefix cache when it finishes,
        # so a retraction frees them uncached: the scheduler sets its KV manager to its preemption policy's
        # rule, the one place it is decided.
        kv.decode_cached_at_finish = self.preemption.decode_cached_at_finish(kv.enable_prefix_caching)
        self.drafter = drafter
        """Speculative decoding (None: off): every decode verifies 1 + k tokens, its last one and k drafts,
        and needs KV slots for all of them (lookahead); the step emits 1 + the drafts accepted."""
        lazy = lazy_decodes and self.batching.allows_cohort and self.admission.allows_cohort
        self.cohort = DecodeCohort(kv, record_token_times) if lazy else None
        """Running decodes advanced as a group (:mod:`twin.core.decode_cohort`); None: every request step by step.
        Prefill-first steps leave the decodes out, so they keep it off; so does SGLang's admission, which
        reads every running request's output count at every admission."""
        self.running: list[Request] = []
        """The batch, in running order; requests join and leave it through :meth:`join_running` and
        :meth:`_leave_running`, which keep :attr:`reserved_blocks` with it."""
        self.reserved_blocks = 0
        """Blocks the running requests' whole lives take (prompt + all output, state included), summed as
        they join and leave: TRT-LLM's capacity scheduler checks it at every admission (reserve_full_kv)."""
        self.held_seats = 0
        """Seats promised outside the queue (a decode worker's pulls in flight): admission leaves them."""
        self._admitting = True
        """Whether the step being formed may admit waiting requests (:meth:`schedule`'s admit_prompts)."""
        self.record_token_times = record_token_times
        self.retain_finished_kv = retain_finished_kv
        """A prefill worker keeps a finished request's blocks (staged KV) until the hand-off releases them."""
        self.prompt_tokens_admitted = 0
        self.cached_tokens_admitted = 0
        self.preemptions = 0
        self.host_load_s = 0.0
        """Host-tier loads the step being scheduled must wait for (reset by :meth:`schedule`)."""
        self.batch_waiting = BatchWaiting.from_limits(limits)
        """TensorRT-LLM's batch waiting (None: off)."""
        self._init_outputs()
        self._late_ns = NO_TIME
        self._late: set[int] = set()
        """async_output: requests queued at ``_late_ns`` after a step was formed at that instant."""
        self._idle_turn_ns = NO_TIME
        """async_output: when a pass that only preempted ended; the pass after it at that instant sees all."""
        self.input_queue = InputQueue(limits.recv_interval)
        """SGLang's input queue (limits.recv_interval > 1)."""
        self.inbox = self.input_queue.inbox
        """Arrivals still in it: taken by :meth:`poll`."""

    # ----------------------------------------------------------------------------------------- intake
    def too_long(self, req: Request) -> str | None:
        """Why the engine refuses ``req`` outright (prompt + output above its max_model_len), or None."""
        limit = self.limits.max_model_len
        if limit is not None and req.total_tokens > limit:
            return (f"asks for {req.total_tokens} tokens ({req.prompt_tokens} prompt + "
                    f"{req.max_output_tokens} output), more than the engine's max_model_len {limit}")
        return None

    def unservable(self, req: Request) -> str | None:
        """Why this worker could never hold ``req`` to its end, or None: the KV blocks of its prompt and
        every output token, with a speculative decode's last verify step k - 1 slots beyond them (vLLM's
        lookahead slots), are more than its pool; or SGLang's admission, which wants fewer tokens than are
        free, could never pass even on an idle worker."""
        kv = self.kv
        extra = self.drafter.k - 1 if self.drafter is not None else 0
        state = kv.state_blocks
        need = kv.life_blocks(req.total_tokens + extra)
        if need > kv.num_blocks:
            spec = f" and {extra} more for the drafts of its last verify step" if extra else ""
            held = f", and {state} for its per-request state" if state else ""
            return (f"needs {need} KV blocks ({req.prompt_tokens} prompt + {req.max_output_tokens} output tokens"
                    f"{spec}{held}) but worker {req.worker} holds only {kv.num_blocks}")
        return self.admission.unservable(req, kv)

    def step_formed(self, now: int) -> None:
        """A step was formed at ``now`` outside :meth:`schedule`: a fast-forwarded run's (twin.shell.worker)."""
        self._step_start_ns = now

    def add_request(self, req: Request, now: int) -> bool:
        """Queue ``req``; a request the engine would refuse, or that this worker could never hold, fails at
        once with its reason."""
        reason = self.too_long(req)
        if reason is not None:
            self.fail(req, now, reason)
            return False
        reason = self.unservable(req)
        if reason is not None:
            self.fail(req, now, reason)
            return False
        if not self.limits.chunked_prefill and req.prompt_tokens > self.limits.max_num_batched_tokens:
            self.fail(req, now, f"needs {req.prompt_tokens} prompt tokens in one step (chunked prefill is off) "
                                f"but max_num_batched_tokens is {self.limits.max_num_batched_tokens}")
            return False
        req.status = Status.WAITING
        req.enqueued_ns = now
        if req.queued_ns == NO_TIME:
            req.queued_ns = now
        if self.limits.recv_interval > 1 and self.input_queue.holds(req, self.has_work):
            return True
        if now == self._step_start_ns and self.limits.async_output:  # a step was formed at this instant
            if self._late_ns != now:
                self._late_ns = now
                self._late = set()
            self._late.add(req.id)
        self.waiting.add(req)
        return True

    def abort(self, req: Request, now: int, reason: str) -> bool:
        """Drop ``req`` between steps, as an engine aborts a request whose client went away: it leaves the
        queue or the batch, its KV blocks are freed (cached ones stay cached, as after a finish) and it
        fails with ``reason``. False when it is not here (it ended already)."""
        if req in self.inbox:
            self.inbox.remove(req)
        elif req.status is Status.WAITING or req.status is Status.PREEMPTED:
            self.waiting.remove(req)
        elif req.status is Status.RUNNING and req in self.running:
            if self.cohort is not None and len(self.cohort):
                # (the next step forms it again from the requests left running)
                self._disband(self.limits.async_output)
            self._leave_running(req)
            if self.drafter is not None:
                self.drafter.forget(req)
        else:
            return False
        self.kv.free(req)
        self.fail(req, now, reason)
        return True

    def drop_sampled(self) -> None:
        """A token one of its steps sampled, and counted, was dropped: a disaggregated prefill worker's
        first token that the decode worker samples again. It is no output."""
        self.output_tokens -= 1

    @staticmethod
    def fail(req: Request, now: int, reason: str) -> None:
        req.status = Status.FAILED
        req.fail_reason = reason
        req.finish_ns = now

    @property
    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0 or bool(self._deferred) or bool(self.inbox)

    def sync(self) -> None:
        """Bring the cohort's requests up to date (for readers of their fields)."""
        if self.cohort is not None:
            self.cohort.sync()

    # ------------------------------------------------------------------------- input queue (SGLang)
    def poll(self) -> None:
        """A scheduler turn's receive (twin.core.input_queue.InputQueue.poll)."""
        self.input_queue.poll(self.waiting, not self.running and not len(self.waiting))

    def decodes_before_recv(self) -> int:
        """Decode steps that may follow the last one formed before a turn takes the input queue."""
        return self.input_queue.decodes_before_recv()

    def count_recv_turns(self, turns: int) -> None:
        """Fast-forwarded decode steps: ``turns`` scheduler turns between them (InputQueue.count_turns)."""
        self.input_queue.count_turns(turns)

    # --------------------------------------------------------------------------------------- schedule
    def schedule(self, now: int, admit_prompts: bool = True) -> SchedulerOutput:
        """Form the step starting ``now``, as vLLM's Scheduler.schedule does: the running requests first, then
        the waiting ones. Under prefill first (SGLang) a step with prefill work carries only that. With
        ``admit_prompts`` false it admits no waiting request (an attention-DP group's balance holds them back:
        twin.shell.attention_dp)."""
        cutoff, placeholders = self._begin_step(now, admit_prompts)
        prefill = self.batching.prefill_step(self, now, cutoff)
        if prefill is not None:
            return SchedulerOutput(scheduled=list(prefill.items()), preempted=[], stats=batch_shape(prefill.items()),
                                   host_load_s=self.host_load_s)
        step = _Step(self.limits.max_num_batched_tokens)
        self._schedule_running(step, placeholders)
        if step.preempted:
            assert not step.lazy, "a step with a cohort never preempts (checked by _schedule_cohort)"
            self.admission.retracted(self.running)
        else:
            self._schedule_waiting(step, now, cutoff)
        return self._end_step(step, now, admit_prompts)

    def _begin_step(self, now: int, admit_prompts: bool) -> tuple[int, bool]:
        """Start forming the step at ``now``: the input queue's turn, the cutoff of the waiting requests the
        step sees (:meth:`_cutoff`), and whether its decodes' input tokens are placeholders (async_output:
        the step is formed before the last one's output is applied, which otherwise is applied now)."""
        self._step_start_ns = now
        self._admitting = admit_prompts
        self.host_load_s = 0.0
        if self.limits.recv_interval > 1:
            self.poll()
        cutoff = self._cutoff(now)
        lookahead = cutoff != _NO_CUTOFF
        if not lookahead and self.limits.async_output:
            # After an idle turn, the last step's output was applied before this one is formed: the
            # cohort's members register the blocks their last tokens filled first, as the others do.
            assert not self._cohort_fills
            if self.cohort is not None and len(self.cohort):
                self._cohort_fills = self.cohort.pending_fills()
            self._apply_outputs()
        return cutoff, lookahead and self.limits.async_output

    def _cutoff(self, now: int) -> int:
        """The time a step starting ``now`` was formed at, for the waiting queue: back to back with the last
        step (lookahead), the real engine formed it when that one started, and sees only requests queued
        before then; otherwise every request queued so far (_NO_CUTOFF)."""
        lookahead = self.limits.lookahead and now == self._last_step_end_ns and now != self._idle_turn_ns
        return self._last_step_start_ns if lookahead else _NO_CUTOFF

    def _after(self, req: Request, cutoff: int) -> bool:
        """Whether ``req``, queued at or after ``cutoff`` (the instant the step now formed was formed, with
        lookahead), came after that: a tie is a client answering the step that ended (SimPy runs it after
        the step end that formed the step), unless with async_output it was queued before that formation
        (SchedulerLimits.async_output: after an idle engine, the second step is formed at the instant of the
        first, after the arrivals of that instant)."""
        if req.enqueued_ns != cutoff or not self.limits.async_output:
            return True
        return cutoff == self._late_ns and req.id in self._late

    def _schedule_running(self, step: _Step, placeholders: bool) -> None:
        """The running requests, in running order, each its next tokens under the budget: the lazy cohort's
        decodes as one (:meth:`_schedule_cohort`), a decode with room in its last block inline (the hot path:
        KVCacheManager.append_one, inlined), any other through :meth:`_schedule_request`."""
        running = self.running
        kv = self.kv
        req_blocks = kv.req_blocks
        size = kv.block_size
        caching = kv.enable_prefix_caching
        defer = kv.decode_cached_at_finish  # only then can a full block wait (KVCacheManager.registers_now)
        fast_one = 1 if self.drafter is None else -1  # new tokens of a fast-path decode (none when speculative)
        scheduled = step.scheduled
        budget = step.budget
        fast_n = fast_kv = fast_max = i = 0  # decodes of the fast path, summed here for the batch shape
        n_running = len(running)
        lazy = self._schedule_cohort(budget, placeholders) if self.cohort is not None else 0
        if lazy:
            assert self.cohort is not None
            fast_n, fast_kv, fast_max = lazy, self.cohort.context(), self.cohort.max_context()
            budget -= lazy
            i = lazy + len(self._ghosts)
        while i < n_running and budget > 0:
            req = running[i]
            if req.status is Status.FINISHED:  # (async_output) its last token is in flight: vLLM skips it
                i += 1
                continue
            computed = req.num_computed_tokens
            num_new = req.prompt_tokens + req.num_output_tokens - computed
            if num_new == fast_one and computed < len(req_blocks[req.id]) * size:
                if caching and (computed + 1) % size == 0 and (not defer or kv.registers_now(req, computed)):
                    kv.cache_computed(req, computed + 1)
                scheduled[req] = 1
                fast_n += 1
                fast_kv += computed + 1
                if computed >= fast_max:
                    fast_max = computed + 1
                budget -= 1
                i += 1
                continue
            step.budget, step.index, step.size = budget, i, n_running
            goes_on = self._schedule_request(step, req, num_new)
            budget, i, n_running = step.budget, step.index, step.size
            if not goes_on:
                break
        step.budget, step.lazy = budget, lazy
        step.decodes, step.decode_kv, step.decode_max = fast_n, fast_kv, fast_max

    def _schedule_request(self, step: _Step, req: Request, num_new: int) -> bool:
        """A running request off the fast path, ``num_new`` tokens short of its sequence: a prompt chunk
        (capped by long_prefill_token_threshold and the budget), a decode that needs a block, or a speculative
        verify (its last token and k drafts, all or none of them). Its KV slots are allocated all or nothing,
        preempting while they do not fit (:meth:`_preempt_until_fits`). False when it preempted itself and the
        preemption policy ends the pass there."""
        kv = self.kv
        drafter = self.drafter
        verify = drafter is not None and num_new == 1 and req.num_output_tokens > 0
        in_blocks = False
        if verify:
            assert drafter is not None
            num_new += drafter.k  # the last token and k drafts, all or none of them (lookahead slots)
            if num_new > step.budget:
                step.index += 1
                return True
            computed = req.num_computed_tokens
            in_blocks = computed + num_new <= len(kv.req_blocks[req.id]) * kv.block_size
            if in_blocks and kv.enable_prefix_caching:
                # Room for all of them in its blocks: allocate_slots would take no block, only register
                # the full blocks among its computed + 1 real tokens (its last step may have filled more
                # than one: the call, not a boundary test as on the fast path).
                kv.cache_computed(req, computed + 1)
        else:
            if 0 < self.limits.long_prefill_token_threshold < num_new:
                num_new = self.limits.long_prefill_token_threshold
            num_new = min(num_new, step.budget)
            if num_new <= 0:
                step.index += 1
                return True
        if not in_blocks and not (num_new == 1 and kv.append_one(req)) and not kv.allocate_slots(req, num_new) \
                and not self._preempt_until_fits(step, req, num_new):
            # vLLM ends the pass (under FCFS the requests behind it were preempted before it); SGLang's check
            # covered the whole batch, so those left behind it run.
            return not self.preemption.ends_pass
        step.scheduled[req] = num_new
        step.others.append((req, num_new))
        step.budget -= num_new
        step.index += 1
        if verify:
            assert drafter is not None
            step.drafts[req] = drafter.accepted(req)
        return True

    def _preempt_until_fits(self, step: _Step, req: Request, num_new: int) -> bool:
        """The KV slots of ``num_new`` tokens of ``req`` did not fit: the waiting queue's victim among the
        running requests is preempted (:meth:`_preempt_victim`) and the allocation retried, until it fits.
        False when ``req`` itself was the victim."""
        kv = self.kv
        while True:
            victim = self.waiting.victim(self.running)
            self._preempt_victim(step, victim)
            if victim is req:
                return False
            if (num_new == 1 and kv.append_one(req)) or kv.allocate_slots(req, num_new):
                return True

    def _preempt_victim(self, step: _Step, victim: Request) -> None:
        """``victim`` leaves the batch and gives its tokens of this step back; it waits again (or, finished
        with its last token in flight under async_output, just goes)."""
        scheduled = step.scheduled
        # A priority or SGLang victim may sit ahead of `req` (vLLM steps back if it was scheduled).
        if victim in scheduled if self.limits.async_output else self.running.index(victim) < step.index:
            step.index -= 1
        self._leave_running(victim)
        step.size -= 1
        if victim in scheduled:
            step.budget += scheduled.pop(victim)
            step.drafts.pop(victim, None)
        if victim.status is Status.FINISHED:  # (async_output) done, its last token in flight
            self._deferred.remove(victim)
            if not self.retain_finished_kv:
                self._release(victim)
        else:
            self._preempt(victim)
        step.preempted.append(victim)

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.lost_tokens = req.num_computed_tokens
        req.num_computed_tokens = 0
        req.status = Status.PREEMPTED
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.prepend(req)

    def _schedule_waiting(self, step: _Step, now: int, cutoff: int) -> None:
        """Then the waiting requests, in queue order (:meth:`admit`), unless batch waiting holds them back.
        With lookahead, a step left empty takes those queued since it was formed: the engine idles one loop
        turn and then sees them."""
        scheduled = step.scheduled
        n_before = len(scheduled)
        if self.batch_waiting is None or not self._hold_prompts(step, cutoff):
            self.admit(scheduled, step.budget, now, cutoff)
        if not scheduled and not step.lazy and cutoff != _NO_CUTOFF:
            if self.limits.async_output:
                self._apply_outputs()
            self.admit(scheduled, step.budget, now, _NO_CUTOFF)
        step.others.extend(itertools.islice(scheduled.items(), n_before, None))

    def _hold_prompts(self, step: _Step, cutoff: int) -> bool:
        """Batch waiting (twin.core.policies.BatchWaiting): whether this step, which has decodes, keeps the
        admissible prompts waiting."""
        wait = self.batch_waiting
        assert wait is not None
        if not step.decodes + sum(1 for _, n in step.others if n == 1) + len(step.drafts):
            return False
        prompt_tokens = self._admissible_tokens(step.budget, cutoff)
        if not prompt_tokens:
            return False  # nothing to hold: the count is left as it is
        return wait.holds(self.limits.max_num_batched_tokens - step.budget + prompt_tokens)

    def _end_step(self, step: _Step, now: int, admit_prompts: bool) -> SchedulerOutput:
        """The formed step: its batch shape (after a preemption ``scheduled`` is summed afresh, since victims
        may have left it), the budget and seat limits checked, the cohort listed in full when that lets
        fast-forward plan from it, and under async_output the last step's output applied."""
        limits = self.limits
        scheduled, drafts, lazy = step.scheduled, step.drafts, step.lazy
        entries = scheduled.items() if step.preempted else step.others
        if drafts:
            assert self.drafter is not None
            stats = verify_shape(entries, drafts, 1 + self.drafter.k)
        elif step.preempted:
            stats = batch_shape(entries)
        else:
            stats = batch_shape(entries, step.decodes, step.decode_kv, step.decode_max)
        if stats.new_tokens > limits.max_num_batched_tokens or len(self.running) > limits.max_num_seqs:
            raise InvariantError(f"step over limits: {stats.new_tokens} tokens, {len(self.running)} running")
        if lazy and not scheduled and (not len(self.waiting) or not admit_prompts):
            # Pure decode with nothing waiting, or whatever waits held back by an attention-DP group's balance:
            # listed in full, so that fast-forward can plan from it.
            assert self.cohort is not None
            scheduled = dict.fromkeys(self.cohort.disband(), 1)
            lazy = 0
        if limits.async_output:
            self._apply_outputs()
            if step.preempted and not scheduled:
                # An empty step is not run: the engine waits for the running one, and forms the next when its
                # output is applied, with the arrivals until then.
                self._idle_turn_ns = now
        return SchedulerOutput(scheduled=list(scheduled.items()), preempted=step.preempted, stats=stats,
                               host_load_s=self.host_load_s, lazy=lazy, drafts=drafts or None)

    # ----------------------------------------------------------------------------------------- cohort
    def _schedule_cohort(self, budget: int, placeholders: bool) -> int:
        """The cohort's part of a step: running decodes join it, and its block events of this step are
        applied. Returns its size, or 0 after disbanding it when the step might preempt (the allocations
        of the cohort and of the requests behind it could exceed the free blocks): preemption then takes
        the regular path with every request's state up to date. ``placeholders``: the step is formed
        before the last one's output is applied (DecodeCohort.block_events)."""
        cohort = self.cohort
        assert cohort is not None
        prev = self._last_step_end_ns
        if prev == NO_TIME:
            return 0
        running = self.running
        if not len(cohort) and not len(self.waiting) and running:
            newest = running[-1]
            if newest.prompt_tokens + newest.num_output_tokens - newest.num_computed_tokens == 1:
                # Most likely a pure-decode step, which fast-forward plans from a full list: joining the
                # cohort only to disband it at once would cost more than the step.
                return 0
        ghosts = len(self._ghosts)
        cohort.join(running, prev, budget, ghosts)
        n = len(cohort)
        if not n:
            return 0
        events = cohort.block_events(placeholders)
        need = sum(1 for _, allocates in events if allocates) + self._tail_blocks(n + ghosts, budget - n)
        if need > self.kv.pool.num_free:
            self._disband(placeholders)
            return 0
        fills = cohort.apply(events, placeholders)
        if fills:
            self._cohort_fills = fills
        return n

    def _disband(self, placeholders: bool) -> None:
        """Empty the cohort between a step's update and the next step's regular pass. With ``placeholders``
        (async_output, the next step formed before the last one's output is applied) its members' last
        tokens, which the last step applied sampled, are placeholders as are the others'."""
        assert self.cohort is not None
        members = self.cohort.disband()
        if members and placeholders:
            fresh = members + self._fresh
            if self._ghosts:  # finished members among them: the fresh go in running order
                order = {r: i for i, r in enumerate(self.running)}
                fresh.sort(key=lambda r: order.get(r, -1))  # (-1: aborted since; it registers nothing)
            self._fresh = fresh
            if self.kv.enable_prefix_caching:
                self.kv.placeholders = {*self.kv.placeholders, *(r.id for r in members)}
        self._ghosts = []

    def _tail_blocks(self, start: int, budget: int) -> int:
        """Blocks that the running requests from ``start`` on would take this step (the budget shared out
        as :meth:`schedule` does when no allocation fails)."""
        kv = self.kv
        threshold = self.limits.long_prefill_token_threshold
        need = 0
        for req in itertools.islice(self.running, start, None):
            if budget <= 0:
                break
            if req.status is Status.FINISHED:  # (async_output) leaves after this schedule
                continue
            num_new = req.prompt_tokens + req.num_output_tokens - req.num_computed_tokens
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, budget)
            if num_new <= 0:
                continue
            need += kv.blocks_needed(req, num_new)
            budget -= num_new
        return need

    # ---------------------------------------------------------------------------------------- admission
    def admit(self, scheduled: dict[Request, int], budget: int, now: int, cutoff: int) -> None:
        """Admit waiting requests in queue order while budget and seats last (the waiting step, and the
        prefill-first policy's); with lookahead only those queued before ``cutoff`` (when the step was
        formed). None where the step may admit none."""
        if not self._admitting:
            return
        limits = self.limits
        kv = self.kv
        waiting = self.waiting
        gate = self.admission if self.admission.reserves else None
        if gate is not None:
            gate.open()
        while len(waiting) and budget > 0 and len(self.running) + self.held_seats < limits.max_num_seqs:
            req = waiting.peek()
            if req.enqueued_ns >= cutoff and self._after(req, cutoff):
                break  # arrived after this step was formed
            if limits.reserve_full_kv and (self.reserved_blocks + kv.life_blocks(req.total_tokens)
                                           > kv.num_blocks):
                break  # FCFS: the head waits, and so does everyone behind it (those admitted joined the sum)
            hits = kv.get_computed_blocks(req)
            host = kv.host_hits(req, len(hits))
            num_computed = (len(hits) + host) * kv.block_size
            if gate is not None and not gate.admits(req, num_computed, self.running, scheduled, kv):
                break  # the head waits, and so does everyone behind it
            num_new = self._prompt_chunk(req.num_tokens - num_computed, budget)
            if num_new is None:
                break
            # This admission prefills the whole sequence (a resumed request its decoded tokens too): set
            # before the allocation, which registers the blocks it will compute by that rule.
            prefilled, req.prefill_tokens = req.prefill_tokens, req.num_tokens
            # Host hits need GPU blocks (loaded, not computed): allocated with the new tokens.
            if not kv.allocate_slots(req, host * kv.block_size + num_new, hits):
                req.prefill_tokens = prefilled
                break
            waiting.pop()
            self._admitted(req, len(hits), host, num_computed, now)
            scheduled[req] = num_new
            budget -= num_new

    def _admitted(self, req: Request, hits: int, host: int, num_computed: int, now: int) -> None:
        """``req`` left the queue with ``hits`` blocks cached on the GPU and ``host`` loaded from host memory,
        ``num_computed`` tokens in all: it joins the batch."""
        kv = self.kv
        if host:
            assert kv.host is not None
            kv.host.promote(req.block_keys[hits:hits + host])
            self.host_load_s += host * kv.host.load_s_per_block
        if req.cached_tokens < 0:  # its prefix hit, found at its first admission (a resumed request recomputes)
            req.cached_tokens = num_computed
            req.host_hit_tokens = host * kv.block_size  # the part of it loaded from host memory
            self.prompt_tokens_admitted += req.prompt_tokens
            self.cached_tokens_admitted += num_computed
        else:  # resumed after preemption
            req.recomputed_tokens += max(0, req.lost_tokens - num_computed)
        if req.first_scheduled_ns == NO_TIME:
            req.first_scheduled_ns = now
        req.num_computed_tokens = num_computed
        req.status = Status.RUNNING
        self.join_running(req)

    def _prompt_chunk(self, num_new: int, budget: int) -> int | None:
        """Tokens an admitted request computes this step out of its ``num_new`` uncached ones, or None when
        it must wait (the whole prompt does not fit and chunked prefill is off)."""
        limits = self.limits
        if 0 < limits.long_prefill_token_threshold < num_new:
            num_new = limits.long_prefill_token_threshold
        if num_new > budget:
            # Without chunked prefill a prompt waits for a step with room for all of it; a preempted request
            # whose prompt plus output outgrew the whole budget is chunked anyway (else it could never resume).
            if not limits.chunked_prefill and num_new <= limits.max_num_batched_tokens:
                return None
            num_new = budget
        return num_new

    def _admissible_tokens(self, budget: int, cutoff: int) -> int:
        """Prompt tokens :meth:`admit` would schedule now, found without allocating anything (KV room is
        checked only through the full-need reservation, as TRT-LLM's capacity scheduler does; batch waiting
        is TRT-LLM's, so SGLang's admission rule is not applied here)."""
        limits = self.limits
        kv = self.kv
        seats = limits.max_num_seqs - len(self.running) - self.held_seats
        reserved = self.reserved_blocks
        total = 0
        for req in self.waiting:
            if seats <= 0 or budget <= 0 or (req.enqueued_ns >= cutoff and self._after(req, cutoff)):
                break
            if limits.reserve_full_kv:
                reserved += kv.life_blocks(req.total_tokens)
                if reserved > kv.num_blocks:
                    break
            num_new = self._prompt_chunk(req.num_tokens - len(kv.get_computed_blocks(req)) * kv.block_size,
                                         budget)
            if num_new is None:
                break
            total += num_new
            budget -= num_new
            seats -= 1
        return total

    def prompt_ready(self, now: int, every_queued: bool = False) -> bool:
        """Whether a step formed ``now`` would carry prompt work: a running request still prefilling, or a
        waiting one :meth:`admit` would take (found without allocating; every running request is taken to
        use a token of the budget). An attention-DP group asks each rank before it lets them admit
        (twin.shell.attention_dp, TensorRT-LLM's attention-DP balance). ``every_queued``: every waiting request seen,
        as by any step formed after now (with lookahead, one formed now sees only those queued before the
        last step began)."""
        if any(r.num_computed_tokens < r.prompt_tokens for r in self.running):
            return True
        if not len(self.waiting):
            return False
        budget = self.limits.max_num_batched_tokens - len(self.running)
        return self._admissible_tokens(budget, _NO_CUTOFF if every_queued else self._cutoff(now)) > 0

    def new_token_ratio(self) -> float:
        """SGLang's new-token ratio now (admission_reserve sglang: twin.core.policies.SglangReserve)."""
        assert isinstance(self.admission, SglangReserve), "the new-token ratio is SGLang's admission's"
        return self.admission.new_token_ratio()

    def join_running(self, req: Request) -> None:
        """``req`` joins the end of the batch (admitted here, or its KV pulled by a decode worker)."""
        self.running.append(req)
        self.reserved_blocks += self.kv.life_blocks(req.total_tokens)

    def _leave_running(self, req: Request) -> None:
        """``req`` leaves the batch (finished, preempted or aborted)."""
        self.running.remove(req)
        self.reserved_blocks -= self.kv.life_blocks(req.total_tokens)
