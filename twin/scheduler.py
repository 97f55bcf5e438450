"""Token-budget continuous batching with vLLM v1 semantics: a pure state machine that takes ``now``.

One step hands at most ``max_num_batched_tokens`` tokens to at most ``max_num_seqs`` requests. Running
requests come first, in admission order; each asks for ``num_tokens - num_computed_tokens`` tokens (one
while decoding, a chunk while prefilling). When one cannot get its blocks, the queue policy picks a victim
among the running requests (the tail for FCFS), which loses its blocks and goes back to the front of the
waiting queue (recompute preemption); a step that preempted admits nobody. Then waiting requests are
admitted in queue order: the prefix cache is matched, cached tokens count as computed, and the rest is
scheduled (chunked when it does not fit the remaining budget).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from typing import Iterable, Iterator, Protocol

import attrs
import numpy as np

from hardware import BatchShape
from hardware.engine import PREEMPTION_RULES
from twin.cohort import DecodeCohort
from twin.errors import InvariantError
from twin.kv_cache import NO_PLACEHOLDERS, KVCacheManager
from twin.request import NO_TIME, Request, Status
from twin.clock import CLOCK_MAX_NS


@attrs.frozen(kw_only=True)
class SchedulerLimits:
    max_num_batched_tokens: int
    max_num_seqs: int
    long_prefill_token_threshold: int = 0
    chunked_prefill: bool = True
    lookahead: bool = False
    """Overlap scheduling (vLLM async scheduling, SGLang's overlap scheduler, TRT-LLM's overlap executor):
    the next step is formed while the current one runs, so a request that arrives during a step is first
    seen by the step after the next. An idle engine admits an arrival at once."""
    mixed_prefill: bool = True
    """False: prefill first (SGLang): a step that has prefill work (a prompt being chunked, or a waiting
    request that can be admitted) carries only that; the running decodes wait for a step without it."""
    batch_wait_iters: int = 0
    batch_wait_max_tokens_ratio: float = 0.0
    """TRT-LLM batch waiting (PyExecutor._waiting_requests): in a step that has decodes and could admit
    new prompts, the prompts are held back unless they and the step's other tokens reach this fraction of
    max_num_batched_tokens or they have already been held batch_wait_iters steps in a row."""
    reserve_full_kv: bool = False
    """Admission sets aside the blocks of prompt + all output tokens of every running request (TRT-LLM's
    GUARANTEED_NO_EVICT): a request waits until its own full need fits beside them."""
    admission_reserve: str = "none"
    """``sglang``: SGLang's admission (schedule_policy.PrefillAdder.add_one_req): a waiting request is
    admitted only while its uncached tokens plus its remaining output (at most SGLANG_CLIP_NEW_TOKENS) stay
    below the free tokens less the running requests' remaining outputs (each clipped the same way) times
    the new-token ratio, less what this step admitted before it; ``none``: blocks as tokens come (vLLM)."""
    max_model_len: int | None = None
    """Most prompt + output tokens a request may ask for (the engine's max_model_len); None: no limit."""
    async_output: bool = False
    """With ``lookahead``: vLLM's async scheduling (AsyncScheduler driven by EngineCore.step_with_batch_queue),
    where step k + 1 is formed before step k's output is applied (update_from_output), which shows in three
    ways. A request that samples its last token in step k keeps its seat and its blocks while step k + 1 is
    formed (schedule() skips it, "avoid scheduling an extra step", but it is in ``running``, and it can be
    the victim of a preemption: then it is freed and reported preempted) and leaves after. A decode's input
    token is a placeholder when its step is formed, so the block that token fills enters the prefix cache
    only when the output after it is applied, after the next step is formed, and never if the request was
    preempted in between (AsyncScheduler._update_request_with_output). And after an idle engine the first
    step and the next are formed at the same instant: a request queued at the instant a step was formed is
    seen by the next step unless it came after that step was formed (a client answering the step that
    ended); without async_output such a tie is never seen."""
    recv_interval: int = 1
    """SGLang's --scheduler-recv-interval (config ``scheduler.recv_interval``): arrivals wait in an input queue
    until the receive counter reaches it (:meth:`Scheduler.poll`); 1: admitted by the next step."""
    preemption: str = "vllm"
    """When a running request cannot get the KV slots of its step, requests are preempted (their KV freed,
    recomputed when resumed) until it can. ``vllm`` (Scheduler.schedule): the FCFS victim is the newest
    running request, it goes back to the front of the queue, and a request that preempted itself ends the
    step's pass over the running ones. ``sglang`` (ScheduleBatch.retract_decode,
    Scheduler._add_request_to_queue): the victim is the request with the fewest output tokens, then the
    longest prompt, then the latest in the batch (with speculative decoding, the latest); it joins the
    back of the queue; the requests behind a request that retracted itself still run (SGLang checks the
    whole batch before the step); the victim's decoded tokens leave the prefix cache (SGLang frees them
    without inserting them into its radix tree; what its prefill inserted stays), and a running request's
    decoded tokens enter it only when it finishes (KVCacheManager.decode_cached_at_finish). The priority
    policy keeps its own victim (lowest priority, latest arrival) under either rule."""


SGLANG_INIT_RATIO = 0.7
"""SGLANG_INIT_NEW_TOKEN_RATIO (sglang 0.5.9 environ.py; schedule_conservativeness 1.0)."""
SGLANG_MIN_RATIO = SGLANG_INIT_RATIO * 0.14
"""init x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR."""
SGLANG_RATIO_DECAY = (SGLANG_INIT_RATIO - SGLANG_MIN_RATIO) / 600
"""Fall of the ratio per decode batch (SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600)."""
SGLANG_CLIP_NEW_TOKENS = 4096
"""SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: the output counted per request is at most this."""
SGLANG_RETRACT_STEPS = 20
"""SGLANG_RETRACT_DECODE_STEPS: after a retraction the ratio covers this many more steps per request."""
RECV_WEIGHT_DECODE = 1
"""SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DECODE (and _TARGET_VERIFY): a decode step's share of the receive
counter."""
RECV_WEIGHT_OTHER = 1000
"""SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DEFAULT: a step with prompt tokens (extend, mixed): receive next turn."""


@attrs.define
class SchedulerOutput:
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


class WaitingQueue(Protocol):
    """Order of admission and choice of preemption victim: the policy hook of the scheduler."""

    def add(self, req: Request) -> None: ...
    def prepend(self, req: Request) -> None: ...
    def peek(self) -> Request: ...
    def pop(self) -> Request: ...
    def remove(self, req: Request) -> None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Request]: ...
    def victim(self, running: list[Request]) -> Request: ...


class FcfsQueue:
    """First come, first served; preempted requests go back to the front; the newest running is preempted."""

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def prepend(self, req: Request) -> None:
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, req: Request) -> None:
        self._q.remove(req)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)

    def victim(self, running: list[Request]) -> Request:
        return running[-1]


class PriorityQueue:
    """Lowest ``priority`` value first, then arrival; the victim is the lowest-priority, latest arrival."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int, Request]] = []

    @staticmethod
    def _key(req: Request) -> tuple[int, int, int]:
        return (req.priority, req.arrival_ns, req.id)

    def add(self, req: Request) -> None:
        heapq.heappush(self._heap, (*self._key(req), req))

    prepend = add

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, req: Request) -> None:
        self._heap = [e for e in self._heap if e[3] is not req]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (e[3] for e in sorted(self._heap, key=lambda e: e[:3]))

    def victim(self, running: list[Request]) -> Request:
        return max(running, key=self._key)


class SglangFcfsQueue(FcfsQueue):
    """SGLang's FCFS queue (schedule_policy fcfs, its default) with its retraction order: the victim has the
    fewest outputs, then the longest prompt, then is the latest in the batch (retract_decode sorts the batch
    by (outputs, -prompt) descending, stably, and pops from the end; with speculative decoding it does not
    sort, so the latest goes first: ``by_progress`` False); it joins the back of the queue."""

    def __init__(self, by_progress: bool = True) -> None:
        super().__init__()
        self.by_progress = by_progress

    def prepend(self, req: Request) -> None:
        self._q.append(req)

    def victim(self, running: list[Request]) -> Request:
        if not self.by_progress:
            return running[-1]
        # min keeps the first of equal keys: scanning from the back, ties go to the later request
        return min(reversed(running), key=lambda r: (r.num_output_tokens, -r.prompt_tokens))


QUEUE_POLICIES: dict[str, type] = {"fcfs": FcfsQueue, "priority": PriorityQueue}


class Drafter:
    """How many of a speculative decode's k drafts the target model accepts, step by step.

    Draft i is accepted with probability ``rates[i]`` given drafts 1 .. i-1 were (a chain: the first
    rejection ends it). Each request draws from its own stream, seeded from the run seed and the request
    id, so a request's draws do not depend on what else ran (same seed, same results), nor on when they are
    drawn: a fast-forwarded run (twin.fastforward.SpecRun) draws the acceptances of its later steps ahead
    (:meth:`ahead`), and its steps, or the steps after it, use them up in order.
    """

    def __init__(self, rates: tuple[float, ...], seed: int) -> None:
        if not rates:
            raise ValueError("a drafter needs the acceptance probability of at least one draft position")
        self.rates = rates
        self.k = len(rates)
        self.seed = seed & 0xFFFF_FFFF_FFFF_FFFF
        self._streams: dict[int, random.Random] = {}
        self._ahead: dict[int, deque[int]] = {}
        """Per request: the draws of its next steps, drawn ahead and not used yet."""

    def accepted(self, req: Request) -> int:
        """The number of leading drafts the target accepts in this step of ``req``."""
        ahead = self._ahead.get(req.id)
        if ahead:
            return ahead.popleft()
        return self._draw(req)

    def ahead(self, req: Request, first: int, last: int) -> list[int]:
        """What :meth:`accepted` will return for the steps ``first`` .. ``last`` - 1 of ``req`` after the next
        one (0: the next), drawn now if not yet."""
        ahead = self._ahead.get(req.id)
        if ahead is None:
            ahead = self._ahead[req.id] = deque()
        while len(ahead) < last:
            ahead.append(self._draw(req))
        return list(itertools.islice(ahead, first, last))

    def use(self, req: Request, steps: int) -> None:
        """The next ``steps`` steps of ``req`` were scheduled with the draws :meth:`ahead` gave."""
        ahead = self._ahead[req.id]
        for _ in range(steps):
            ahead.popleft()

    def _draw(self, req: Request) -> int:
        rng = self._streams.get(req.id)
        if rng is None:
            state = np.random.SeedSequence([self.seed, req.id]).generate_state(2, np.uint64)
            rng = self._streams[req.id] = random.Random(int(state[0]) << 64 | int(state[1]))
        a = 0
        for p in self.rates:
            if rng.random() >= p:
                break
            a += 1
        return a

    def forget(self, req: Request) -> None:
        self._streams.pop(req.id, None)
        self._ahead.pop(req.id, None)
_NO_CUTOFF = CLOCK_MAX_NS
_GAP_RUN_BATCH = 4096
"""Gaps handed in bulk (:meth:`Scheduler.add_gap_run`) that are packed into arrays at once."""
_GAP_BLOCK_ITEMS = 1 << 22
"""Packed gaps that are counted into the histogram's dictionary when there are more."""


def _sglang_need(req: Request, num_computed: int, state_tokens: int) -> int:
    """Tokens SGLang's PrefillAdder wants free to admit ``req`` with ``num_computed`` of its tokens cached:
    the rest of its sequence, its remaining outputs (at most SGLANG_CLIP_NEW_TOKENS of them) and its
    per-request state (``state_tokens``: KVCacheManager.state_tokens)."""
    return req.num_tokens - num_computed + _sglang_outputs(req) + state_tokens


def _sglang_outputs(req: Request) -> int:
    return min(req.max_output_tokens - req.num_output_tokens, SGLANG_CLIP_NEW_TOKENS)


class Scheduler:
    """Continuous-batching scheduler of one worker."""

    def __init__(self, limits: SchedulerLimits, kv: KVCacheManager, policy: str = "fcfs",
                 record_token_times: bool = False, retain_finished_kv: bool = False,
                 lazy_decodes: bool = False, drafter: Drafter | None = None) -> None:
        if policy not in QUEUE_POLICIES:
            raise ValueError(f"unknown queue policy {policy!r}; expected one of {sorted(QUEUE_POLICIES)}")
        self.limits = limits
        self.kv = kv
        if limits.preemption not in PREEMPTION_RULES:
            raise ValueError(f"unknown preemption rule {limits.preemption!r}; "
                             f"expected one of {PREEMPTION_RULES}")
        if (policy, limits.preemption) == ("fcfs", "sglang"):
            self.waiting: WaitingQueue = SglangFcfsQueue(by_progress=drafter is None)
        else:
            self.waiting = QUEUE_POLICIES[policy]()
        # Under SGLang's rule a running request's decoded tokens enter the prefix cache when it finishes,
        # so a retraction frees them uncached (SchedulerLimits.preemption): the scheduler sets its KV
        # manager to that rule, the one place it is decided.
        kv.decode_cached_at_finish = kv.enable_prefix_caching and limits.preemption == "sglang"
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
        self.gap_counts: dict[int, int] = {}
        """Inter-token gaps (ns -> count) counted one by one; :attr:`itl_counts` is the whole histogram."""
        self._gap_runs: list[tuple[list[int], int]] = []
        """Gaps not in ``gap_counts`` yet: step durations, each the gap of ``count`` requests (a fast-forwarded
        run hands them in bulk, :meth:`add_gap_run`; they are counted in numpy when the histogram is read)."""
        self._gap_run_items = 0
        self._gap_blocks: list[tuple[np.ndarray, np.ndarray]] = []
        """Those gaps packed into arrays (gaps, counts), a batch at a time."""
        self._gap_block_items = 0
        self.prompt_tokens_admitted = 0
        self.cached_tokens_admitted = 0
        self.preemptions = 0
        self.steps = 0
        self.output_tokens = 0
        """Tokens its steps sampled, less those dropped since (:meth:`drop_sampled`)."""
        self.host_load_s = 0.0
        """Host-tier loads the step being scheduled must wait for (reset by :meth:`schedule`)."""
        self._last_step_end_ns = NO_TIME
        """End of the last step this scheduler applied (for the shared inter-token gap)."""
        self._last_step_start_ns = NO_TIME
        """Start of that step: with lookahead, when the step now being formed was formed."""
        self._step_start_ns = NO_TIME
        """Start of the step being scheduled (becomes ``_last_step_start_ns`` when it is applied)."""
        if limits.async_output and not (limits.lookahead and limits.mixed_prefill and drafter is None):
            raise ValueError("async_output models vLLM's async scheduling: it needs lookahead, mixed prefill "
                             "and no speculative decoding")
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
        self._late_ns = NO_TIME
        self._late: set[int] = set()
        self._idle_turn_ns = NO_TIME
        """async_output: when a pass that only preempted ended; the pass after it at that instant sees all."""
        """async_output: requests queued at ``_late_ns`` after a step was formed at that instant."""
        self._batch_wait_count = 0
        """Steps in a row that held new prompts back (batch waiting)."""
        self._ratio_base = SGLANG_INIT_RATIO
        self._ratio_steps = 0
        """SGLang's new-token ratio (admission_reserve sglang) is ``_ratio_base`` less SGLANG_RATIO_DECAY per
        pure-decode step since it was set (``_ratio_steps``), at least SGLANG_MIN_RATIO: counted, not
        subtracted step by step, so a fast-forwarded run of steps gives the same value."""
        self.inbox: list[Request] = []
        """Arrivals still in SGLang's input queue (limits.recv_interval > 1): taken by :meth:`poll`."""
        self._recv_counter = 0
        """SGLang's receive counter (SchedulerRecvSkipper._counter) after the last turn that polled."""
        self._recv_weight = 0
        """What the step applied since that turn adds at the next (0: none applied)."""
        self.drafter = drafter
        """Speculative decoding (None: off): every decode verifies 1 + k tokens, its last one and k drafts,
        and needs KV slots for all of them (lookahead); the step emits 1 + the drafts accepted."""
        if drafter is not None and lazy_decodes:
            raise ValueError("speculative decodes emit a drawn number of tokens: they cannot be a lazy cohort")
        lazy = lazy_decodes and limits.mixed_prefill and limits.admission_reserve == "none"
        self.cohort = DecodeCohort(kv, record_token_times) if lazy else None
        """Running decodes advanced as a group (:mod:`twin.cohort`); None: every request step by step.
        Prefill-first steps leave the decodes out, so they keep it off; so does SGLang's admission, which
        reads every running request's output count at every admission."""

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
        if self.limits.admission_reserve == "sglang":
            pool = kv.num_blocks * kv.block_size
            if _sglang_need(req, 0, kv.state_tokens) >= pool:
                held = f" + {kv.state_tokens} of per-request state" if state else ""
                return (f"SGLang's admission needs fewer than the {pool} KV tokens worker {req.worker} holds "
                        f"free for {req.num_tokens} prompt + {_sglang_outputs(req)} output tokens{held}: it "
                        f"would never be admitted")
        return None

    def step_formed(self, now: int) -> None:
        """A step was formed at ``now`` outside :meth:`schedule`: a fast-forwarded run's (twin.worker)."""
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
        if self.limits.recv_interval > 1:
            if self.has_work:
                self.inbox.append(req)
                return True
            # An idle scheduler spins through its turns: it takes the request at once, its counter restarting.
            self._recv_counter = self._recv_weight = 0
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

    # ------------------------------------------------------------------------- input queue (SGLang)
    def poll(self) -> None:
        """A scheduler turn's receive (SGLang Scheduler.recv_requests with --scheduler-recv-interval T): the
        step applied since the last turn adds its weight to the counter (a decode 1, a step with prompt tokens
        RECV_WEIGHT_OTHER); at T the counter restarts and the input queue joins the waiting queue. With nothing
        running or waiting the scheduler spins through idle turns and takes it at once."""
        weight, self._recv_weight = self._recv_weight, 0
        idle = not self.running and not len(self.waiting)
        if not weight and not idle:
            return  # (a second pass at one step boundary)
        self._recv_counter += weight
        if self._recv_counter >= self.limits.recv_interval or idle:
            self._recv_counter = 0
            for req in self.inbox:
                self.waiting.add(req)
            self.inbox.clear()

    def decodes_before_recv(self) -> int:
        """How many more decode steps may follow the last one formed before a turn takes the input queue
        (fast-forward stops there); unbounded while the queue is empty."""
        if not self.inbox:
            return CLOCK_MAX_NS
        return self.limits.recv_interval - self._recv_counter - 1

    def count_recv_turns(self, turns: int) -> None:
        """Fast-forwarded decode steps: ``turns`` scheduler turns between them, each adding a decode's weight.
        A turn that reaches the interval restarts the counter with the input queue empty: a run stops before
        one that would take a queued request (:meth:`decodes_before_recv`), and the turns of steps formed
        before an arrival are counted before the worker looks at it (twin.worker.Worker._resumable)."""
        if self.limits.recv_interval == 1:
            return
        self._recv_counter = (self._recv_counter + turns) % self.limits.recv_interval
        self._recv_weight = RECV_WEIGHT_DECODE

    # --------------------------------------------------------------------------------------- schedule
    def schedule(self, now: int, admit_prompts: bool = True) -> SchedulerOutput:
        """Form the step starting ``now``; with ``admit_prompts`` false it admits no waiting request (an
        attention-DP group's balance holds them back: twin.dpgroup)."""
        self._step_start_ns = now
        self._admitting = admit_prompts
        if self.limits.recv_interval > 1:
            self.poll()
        cutoff = self._cutoff(now)
        lookahead = cutoff != _NO_CUTOFF
        placeholders = lookahead and self.limits.async_output
        """Whether the step is formed before the last one's output is applied (its decodes' input tokens
        unknown: SchedulerLimits.async_output)."""
        if not lookahead and self.limits.async_output:
            # After an idle turn, the last step's output was applied before this one is formed: the
            # cohort's members register the blocks their last tokens filled first, as the others do.
            assert not self._cohort_fills
            if self.cohort is not None and len(self.cohort):
                self._cohort_fills = self.cohort.pending_fills()
            self._apply_outputs()
        if not self.limits.mixed_prefill:
            out = self._schedule_prefill_only(now, cutoff)
            if out is not None:
                return out
        limits = self.limits
        kv = self.kv
        budget = limits.max_num_batched_tokens
        threshold = limits.long_prefill_token_threshold
        scheduled: dict[Request, int] = {}
        preempted: list[Request] = []
        running = self.running
        self.host_load_s = 0.0

        req_blocks = kv.req_blocks
        size = kv.block_size
        caching = kv.enable_prefix_caching
        defer = kv.decode_cached_at_finish  # only then can a full block wait (KVCacheManager.registers_now)
        fast_n = fast_kv = fast_max = 0  # decodes of the fast path, summed here for the batch shape
        others: list[tuple[Request, int]] = []  # every other entry of `scheduled`, in order
        drafter = self.drafter
        drafts: dict[Request, int] = {}  # speculative decodes -> drafts accepted
        fast_one = 1 if drafter is None else -1  # new tokens of a fast-path decode (none when speculative)
        i = 0
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
                # Decode with room in the last block: KVCacheManager.append_one, inlined (the hot path).
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
            verify = drafter is not None and num_new == 1 and req.num_output_tokens > 0
            if verify:
                assert drafter is not None
                num_new += drafter.k  # the last token and k drafts, all or none of them (lookahead slots)
                if num_new > budget:
                    i += 1
                    continue
                if computed + num_new <= len(req_blocks[req.id]) * size:
                    # Room for all of them in its blocks: allocate_slots would take no block, only register
                    # the full blocks among its computed + 1 real tokens (its last step may have filled more
                    # than one: the call, not a boundary test as above).
                    if caching:
                        kv.cache_computed(req, computed + 1)
                    scheduled[req] = num_new
                    others.append((req, num_new))
                    budget -= num_new
                    i += 1
                    drafts[req] = drafter.accepted(req)
                    continue
            elif 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, budget)
            if num_new <= 0:
                i += 1
                continue
            while not (num_new == 1 and kv.append_one(req)) and not kv.allocate_slots(req, num_new):
                victim = self.waiting.victim(running)
                # A priority or SGLang victim may sit ahead of `req` (vLLM steps back if it was scheduled).
                if victim in scheduled if limits.async_output else running.index(victim) < i:
                    i -= 1
                self._leave_running(victim)
                n_running -= 1
                if victim in scheduled:
                    budget += scheduled.pop(victim)
                    drafts.pop(victim, None)
                if victim.status is Status.FINISHED:  # (async_output) done, its last token in flight
                    self._deferred.remove(victim)
                    if not self.retain_finished_kv:
                        self._release(victim)
                else:
                    self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            else:
                scheduled[req] = num_new
                others.append((req, num_new))
                budget -= num_new
                i += 1
                if verify:
                    assert drafter is not None
                    drafts[req] = drafter.accepted(req)
                continue
            # `req` preempted itself. vLLM ends the pass (under FCFS the requests behind it were preempted
            # before it); SGLang's check covered the whole batch, so those left behind it run.
            if limits.preemption != "sglang":
                break

        if preempted:  # victims may have left `scheduled`: sum it afresh
            assert not lazy, "a step with a cohort never preempts (checked by _schedule_cohort)"
            if limits.admission_reserve == "sglang":
                self._retract_ratio()
            stats = self._stats(scheduled.items()) if not drafts else self._verify_stats(scheduled.items(), drafts)
        else:
            n_before = len(scheduled)
            decodes = fast_n + sum(1 for _, n in others if n == 1) + len(drafts)
            if not self._hold_prompts(budget, cutoff, decodes):
                self._admit(scheduled, budget, now, cutoff)
            if not scheduled and not lazy and cutoff != _NO_CUTOFF:
                # Nothing was in the step formed ahead: the engine idles one loop turn and then sees them.
                if limits.async_output:
                    self._apply_outputs()
                self._admit(scheduled, budget, now, _NO_CUTOFF)
            others.extend(itertools.islice(scheduled.items(), n_before, None))
            stats = (self._stats(others, fast_n, fast_kv, fast_max) if not drafts
                     else self._verify_stats(others, drafts))
        if stats.new_tokens > limits.max_num_batched_tokens or len(running) > limits.max_num_seqs:
            raise InvariantError(f"step over limits: {stats.new_tokens} tokens, {len(running)} running")
        if lazy and not scheduled and (not len(self.waiting) or not admit_prompts):
            # Pure decode with nothing waiting, or whatever waits held back by an attention-DP group's balance:
            # listed in full, so that fast-forward can plan from it.
            assert self.cohort is not None
            scheduled = dict.fromkeys(self.cohort.disband(), 1)
            lazy = 0
        if limits.async_output:
            self._apply_outputs()
            if preempted and not scheduled:
                # An empty step is not run: the engine waits for the running one, and forms the next when its
                # output is applied, with the arrivals until then.
                self._idle_turn_ns = now
        return SchedulerOutput(scheduled=list(scheduled.items()), preempted=preempted, stats=stats,
                               host_load_s=self.host_load_s, lazy=lazy, drafts=drafts or None)

    def _cutoff(self, now: int) -> int:
        """The time a step starting ``now`` was formed at, for the waiting queue: back to back with the last
        step (lookahead), the real engine formed it when that one started, and sees only requests queued
        before then; otherwise every request queued so far (_NO_CUTOFF)."""
        lookahead = self.limits.lookahead and now == self._last_step_end_ns and now != self._idle_turn_ns
        return self._last_step_start_ns if lookahead else _NO_CUTOFF

    def prompt_ready(self, now: int, every_queued: bool = False) -> bool:
        """Whether a step formed ``now`` would carry prompt work: a running request still prefilling, or a
        waiting one :meth:`_admit` would take (found without allocating; every running request is taken to
        use a token of the budget). An attention-DP group asks each rank before it lets them admit
        (twin.dpgroup, TensorRT-LLM's attention-DP balance). ``every_queued``: every waiting request seen,
        as by any step formed after now (with lookahead, one formed now sees only those queued before the
        last step began)."""
        if any(r.num_computed_tokens < r.prompt_tokens for r in self.running):
            return True
        if not len(self.waiting):
            return False
        budget = self.limits.max_num_batched_tokens - len(self.running)
        return self._admissible_tokens(budget, _NO_CUTOFF if every_queued else self._cutoff(now)) > 0

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

    def _schedule_prefill_only(self, now: int, cutoff: int) -> SchedulerOutput | None:
        """A prefill-first step: the running prompts still being prefilled get their next chunks, then
        waiting requests are admitted; the decodes sit it out. None when there is no prefill work or a
        chunk cannot get its blocks (the mixed pass then decodes, preempting as usual)."""
        limits = self.limits
        budget = limits.max_num_batched_tokens
        threshold = limits.long_prefill_token_threshold
        self.host_load_s = 0.0
        scheduled: dict[Request, int] = {}
        for req in self.running:
            num_new = req.prompt_tokens + req.num_output_tokens - req.num_computed_tokens
            if num_new <= 1:
                continue
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, budget)
            if num_new <= 0:
                break
            if not self.kv.allocate_slots(req, num_new):
                return None  # blocks given to earlier chunks stay theirs; the mixed pass needs no more for them
            scheduled[req] = num_new
            budget -= num_new
        self._admit(scheduled, budget, now, cutoff)
        if not scheduled:
            return None
        return SchedulerOutput(scheduled=list(scheduled.items()), preempted=[], stats=self._stats(scheduled.items()),
                               host_load_s=self.host_load_s)

    def _admit(self, scheduled: dict[Request, int], budget: int, now: int, cutoff: int) -> None:
        """Admit waiting requests in queue order while budget and seats last; with lookahead only those
        queued before ``cutoff`` (when the step was formed). None where the step may admit none."""
        if not self._admitting:
            return
        limits = self.limits
        kv = self.kv
        waiting = self.waiting
        sglang = limits.admission_reserve == "sglang"
        room: float | None = None  # tokens SGLang's admission still sees free (found at the first candidate)
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
            if sglang:
                if room is None:
                    room = self._sglang_room(scheduled)
                need = _sglang_need(req, num_computed, kv.state_tokens)
                if need >= room:
                    break  # NO_TOKEN: the head waits, and so does everyone behind it
                room -= need
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
            if host:
                assert kv.host is not None
                kv.host.promote(req.block_keys[len(hits):len(hits) + host])
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
            scheduled[req] = num_new
            budget -= num_new

    def new_token_ratio(self) -> float:
        """SGLang's new-token ratio now (admission_reserve sglang)."""
        return max(self._ratio_base - self._ratio_steps * SGLANG_RATIO_DECAY, SGLANG_MIN_RATIO)

    def _sglang_room(self, scheduled: dict[Request, int]) -> float:
        """Tokens SGLang's PrefillAdder sees free for new requests: free and evictable tokens, less the
        prompt tokens the running requests have yet to compute beyond this step, less their remaining
        outputs (each at most SGLANG_CLIP_NEW_TOKENS) times the new-token ratio."""
        ratio = self.new_token_ratio()
        clip = SGLANG_CLIP_NEW_TOKENS
        prompt = out = 0
        for r in self.running:
            prompt += r.num_tokens - r.num_computed_tokens - scheduled.get(r, 0)
            out += min(r.max_output_tokens - r.num_output_tokens, clip)
        return self.kv.pool.num_free * self.kv.block_size - max(prompt, 0) - out * ratio

    def _retract_ratio(self) -> None:
        """After SGLang retracts requests (a preemption here), the ratio restarts from what the requests
        left running have decoded plus SGLANG_RETRACT_STEPS each, over their output lengths
        (ScheduleBatch.retract_decode)."""
        running = self.running
        decoded = sum(r.num_output_tokens for r in running) + SGLANG_RETRACT_STEPS * len(running)
        self._ratio_base = min(1.0, decoded / (sum(r.max_output_tokens for r in running) + 1))
        self._ratio_steps = 0

    def join_running(self, req: Request) -> None:
        """``req`` joins the end of the batch (admitted here, or its KV pulled by a decode worker)."""
        self.running.append(req)
        self.reserved_blocks += self.kv.life_blocks(req.total_tokens)

    def _leave_running(self, req: Request) -> None:
        """``req`` leaves the batch (finished, preempted or aborted)."""
        self.running.remove(req)
        self.reserved_blocks -= self.kv.life_blocks(req.total_tokens)

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

    def _hold_prompts(self, budget: int, cutoff: int, decodes: int) -> bool:
        """Batch waiting: whether this step keeps the admissible prompts waiting (and counts the hold)."""
        limits = self.limits
        if not (limits.batch_wait_iters or limits.batch_wait_max_tokens_ratio) or not decodes:
            return False
        prompt_tokens = self._admissible_tokens(budget, cutoff)
        if not prompt_tokens:
            return False  # nothing to hold: the count is left as it is
        step_tokens = limits.max_num_batched_tokens - budget + prompt_tokens
        if self._batch_wait_count >= limits.batch_wait_iters or \
                step_tokens >= limits.batch_wait_max_tokens_ratio * limits.max_num_batched_tokens:
            self._batch_wait_count = 0
            return False
        self._batch_wait_count += 1
        return True

    def _admissible_tokens(self, budget: int, cutoff: int) -> int:
        """Prompt tokens :meth:`_admit` would schedule now, found without allocating anything (KV room is
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

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.lost_tokens = req.num_computed_tokens
        req.num_computed_tokens = 0
        req.status = Status.PREEMPTED
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.prepend(req)

    @staticmethod
    def _stats(scheduled: Iterable[tuple[Request, int]], num_decode: int = 0, decode_kv: int = 0,
               decode_max: int = 0) -> BatchShape:
        """The batch shape of ``scheduled`` (request, new tokens) plus ``num_decode`` more decodes attending
        ``decode_kv`` tokens (context after the step) in all, at most ``decode_max`` each; integer sums, so
        any split is exact, and the decodes' own context and longest context are given to the shape (without
        them a mixed step's decode context was a pro-rata share of the whole batch's)."""
        num_reqs = num_decode
        d_kv = decode_kv
        d_max = decode_max
        sum_kv = sum_q_kv = sum_q_sq = new_tokens = 0
        for req, q in scheduled:
            num_reqs += 1
            kv_len = req.num_computed_tokens + q
            if q == 1:
                num_decode += 1
                d_kv += kv_len
                if kv_len > d_max:
                    d_max = kv_len
            else:
                sum_kv += kv_len
                sum_q_kv += q * kv_len
                sum_q_sq += q * q
                new_tokens += q
        return BatchShape(num_reqs=num_reqs, num_decode=num_decode, new_tokens=new_tokens + num_decode,
                          sum_kv=sum_kv + d_kv, sum_q_kv=sum_q_kv + d_kv, sum_q_sq=sum_q_sq + num_decode,
                          decode_sum_kv=d_kv, decode_max_kv=d_max)

    def _verify_stats(self, scheduled: Iterable[tuple[Request, int]], drafts: dict[Request, int]) -> BatchShape:
        """The batch shape of a step with speculative decodes: each one a decode of 1 + k query tokens
        (``decode_q``) over its context, the others (prefill chunks) as in :meth:`_stats`."""
        assert self.drafter is not None
        num_reqs = num_decode = new_tokens = sum_kv = sum_q_kv = sum_q_sq = decode_kv = decode_max = 0
        for req, q in scheduled:
            kv_len = req.num_computed_tokens + q
            num_reqs += 1
            new_tokens += q
            sum_kv += kv_len
            sum_q_kv += q * kv_len
            sum_q_sq += q * q
            if req in drafts:
                num_decode += 1
                decode_kv += kv_len
                if kv_len > decode_max:
                    decode_max = kv_len
        return BatchShape(num_reqs=num_reqs, num_decode=num_decode, new_tokens=new_tokens, sum_kv=sum_kv,
                          sum_q_kv=sum_q_kv, sum_q_sq=sum_q_sq, decode_sum_kv=decode_kv,
                          decode_q=1 + self.drafter.k, decode_max_kv=decode_max)

    # ----------------------------------------------------------------------------------------- update
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
        self.count_decode_steps(1 if not out.preempted and stats.num_decode == stats.num_reqs else 0)
        self._recv_weight = RECV_WEIGHT_DECODE if stats.num_decode == stats.num_reqs else RECV_WEIGHT_OTHER
        return finished

    def _after(self, req: Request, cutoff: int) -> bool:
        """Whether ``req``, queued at or after ``cutoff`` (the instant the step now formed was formed, with
        lookahead), came after that: a tie is a client answering the step that ended (SimPy runs it after
        the step end that formed the step), unless with async_output it was queued before that formation
        (SchedulerLimits.async_output: after an idle engine, the second step is formed at the instant of the
        first, after the arrivals of that instant)."""
        if req.enqueued_ns != cutoff or not self.limits.async_output:
            return True
        return cutoff == self._late_ns and req.id in self._late

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
        """Applied steps' share in SGLang's new-token ratio (admission_reserve sglang; nothing otherwise):
        ``steps`` pure-decode steps that retracted nothing (update_running_batch) each take one decay off,
        and an idle scheduler starts again from SGLANG_INIT_RATIO (self_check_during_idle)."""
        if self.limits.admission_reserve != "sglang":
            return
        if not self.running and not len(self.waiting):
            self._ratio_base, self._ratio_steps = SGLANG_INIT_RATIO, 0
        else:
            self._ratio_steps += steps

    @property
    def itl_counts(self) -> dict[int, int]:
        """Histogram of inter-token gaps (ns -> count) over every request of this worker."""
        if self._gap_runs or self._gap_blocks:
            self._count_gap_blocks()
        return self.gap_counts

    def add_gap_run(self, gaps: list[int], count: int) -> None:
        """Count each of ``gaps`` ``count`` times: in bulk, later (a dictionary update per gap and step costs
        more than the step's other bookkeeping)."""
        self._gap_runs.append((gaps, count))
        self._gap_run_items += len(gaps)
        if self._gap_run_items >= _GAP_RUN_BATCH:
            self._pack_gap_runs()

    def _pack_gap_runs(self) -> None:
        """Turn the lists handed to :meth:`add_gap_run` into arrays (which the garbage collector ignores)."""
        runs = self._gap_runs
        if not runs:
            return
        gaps = np.fromiter(itertools.chain.from_iterable(g for g, _ in runs), dtype=np.int64,
                           count=self._gap_run_items)
        weights = np.repeat(np.array([c for _, c in runs], dtype=np.int64), [len(g) for g, _ in runs])
        self._gap_blocks.append((gaps, weights))
        self._gap_block_items += len(gaps)
        runs.clear()
        self._gap_run_items = 0
        if self._gap_block_items > _GAP_BLOCK_ITEMS:  # bound the memory of very long runs
            self._count_gap_blocks()

    def _count_gap_blocks(self) -> None:
        """Add every gap handed in bulk to ``gap_counts`` (integer sums: any order gives them)."""
        self._pack_gap_runs()
        if not self._gap_blocks:
            return
        values, where = np.unique(np.concatenate([g for g, _ in self._gap_blocks]), return_inverse=True)
        totals = np.zeros(len(values), dtype=np.int64)
        np.add.at(totals, where, np.concatenate([w for _, w in self._gap_blocks]))
        counts = self.gap_counts
        for gap, n in zip(values.tolist(), totals.tolist()):
            counts[gap] = counts.get(gap, 0) + n
        self._gap_blocks.clear()
        self._gap_block_items = 0

    def gap_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The whole histogram as arrays of gaps and their counts, without building the dictionary (a gap
        may appear more than once)."""
        self._pack_gap_runs()
        counts = self.gap_counts
        return (np.concatenate([np.fromiter(counts, dtype=np.int64, count=len(counts)),
                                *(g for g, _ in self._gap_blocks)]),
                np.concatenate([np.fromiter(counts.values(), dtype=np.int64, count=len(counts)),
                                *(w for _, w in self._gap_blocks)]))

    def sync(self) -> None:
        """Bring the cohort's requests up to date (for readers of their fields)."""
        if self.cohort is not None:
            self.cohort.sync()

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
