"""Engine policies of the scheduler, each a small object chosen once from the engine's rules
(twin.core.limits.SchedulerLimits, set from the engine profile), never by the engine's name:

* admission (``admission_reserve``): what a waiting request needs beside the running ones to be admitted:
  nothing (vLLM, TensorRT-LLM) or SGLang's new-token-ratio reserve, which owns the ratio's state;
* preemption (``preemption``): the waiting queue that orders the victim and where it rejoins, whether a
  request that preempted itself ends the pass over the running ones, and whether decoded tokens enter the
  prefix cache as they are computed or when their request finishes (SGLang's retraction);
* batching (``mixed_prefill``): whether prefill work shares a step with the running decodes (vLLM,
  TensorRT-LLM) or runs first, alone (SGLang); and TensorRT-LLM's batch waiting (``batch_wait_iters``),
  which holds new prompts back while decodes run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hardware.engine import ADMISSION_RESERVES, PREEMPTION_RULES
from twin.core.kv_cache import KVCacheManager
from twin.core.limits import SchedulerLimits
from twin.core.queues import QUEUE_POLICIES, SglangFcfsQueue, WaitingQueue
from twin.core.request import Request

if TYPE_CHECKING:
    from twin.core.scheduler import Scheduler

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


# ------------------------------------------------------------------------------------------ admission
class AdmissionPolicy:
    """``none`` (vLLM, TensorRT-LLM): nothing is set aside at admission; blocks are taken as tokens come."""

    name: ClassVar[str] = "none"
    reserves: ClassVar[bool] = False
    """Whether :meth:`admits` must be asked for each waiting request (False: it admits every one)."""
    allows_cohort: ClassVar[bool] = True
    """Whether running decodes may be advanced as a lazy cohort (twin.core.decode_cohort): not when admission reads every
    running request's output count."""

    def unservable(self, req: Request, kv: KVCacheManager) -> str | None:
        """Why this rule could never admit ``req``, even on an idle worker of ``kv``'s pool; None: it could."""
        return None

    def open(self) -> None:
        """A pass over the waiting queue begins."""

    def admits(self, req: Request, num_computed: int, running: list[Request], scheduled: dict[Request, int],
               kv: KVCacheManager) -> bool:
        """Whether ``req``, ``num_computed`` of its tokens cached, may be admitted in this pass (False: it and
        everyone behind it wait)."""
        return True

    def count_decode_steps(self, steps: int, running: list[Request], waiting: WaitingQueue) -> None:
        """``steps`` pure-decode steps that preempted nothing were applied; ``running`` and ``waiting`` are the
        scheduler's batch and queue after them."""

    def retracted(self, running: list[Request]) -> None:
        """A step preempted requests; ``running`` are those left."""


class SglangReserve(AdmissionPolicy):
    """``sglang``: SGLang's admission (schedule_policy.PrefillAdder.add_one_req): a waiting request is admitted
    only while its uncached tokens plus its remaining output (at most SGLANG_CLIP_NEW_TOKENS) stay below the
    free tokens less the prompt tokens the running requests have yet to compute, less their remaining outputs
    (each clipped the same way) times the new-token ratio, less what this pass admitted before it.

    The ratio is ``ratio_base`` less SGLANG_RATIO_DECAY per pure-decode step since it was set
    (``ratio_steps``), at least SGLANG_MIN_RATIO: counted, not subtracted step by step, so a fast-forwarded
    run of steps gives the same value."""

    name = "sglang"
    reserves = True
    allows_cohort = False

    def __init__(self) -> None:
        self.ratio_base = SGLANG_INIT_RATIO
        self.ratio_steps = 0
        self._room: float | None = None
        """Tokens the pass still sees free (found at its first candidate)."""

    def new_token_ratio(self) -> float:
        """SGLang's new-token ratio now."""
        return max(self.ratio_base - self.ratio_steps * SGLANG_RATIO_DECAY, SGLANG_MIN_RATIO)

    def unservable(self, req: Request, kv: KVCacheManager) -> str | None:
        pool = kv.num_blocks * kv.block_size
        if sglang_need(req, 0, kv.state_tokens) < pool:
            return None
        held = f" + {kv.state_tokens} of per-request state" if kv.state_blocks else ""
        return (f"SGLang's admission needs fewer than the {pool} KV tokens worker {req.worker} holds "
                f"free for {req.num_tokens} prompt + {sglang_outputs(req)} output tokens{held}: it "
                f"would never be admitted")

    def open(self) -> None:
        self._room = None

    def admits(self, req: Request, num_computed: int, running: list[Request], scheduled: dict[Request, int],
               kv: KVCacheManager) -> bool:
        room = self._room
        if room is None:
            room = self._free_room(running, scheduled, kv)
        need = sglang_need(req, num_computed, kv.state_tokens)
        if need >= room:
            self._room = room
            return False  # NO_TOKEN: the head waits, and so does everyone behind it
        self._room = room - need
        return True

    def _free_room(self, running: list[Request], scheduled: dict[Request, int], kv: KVCacheManager) -> float:
        """Tokens SGLang's PrefillAdder sees free for new requests: free and evictable tokens, less the
        prompt tokens the running requests have yet to compute beyond this step, less their remaining
        outputs (each at most SGLANG_CLIP_NEW_TOKENS) times the new-token ratio."""
        ratio = self.new_token_ratio()
        clip = SGLANG_CLIP_NEW_TOKENS
        prompt = out = 0
        for r in running:
            prompt += r.num_tokens - r.num_computed_tokens - scheduled.get(r, 0)
            out += min(r.max_output_tokens - r.num_output_tokens, clip)
        return kv.pool.num_free * kv.block_size - max(prompt, 0) - out * ratio

    def count_decode_steps(self, steps: int, running: list[Request], waiting: WaitingQueue) -> None:
        """Each pure-decode step that retracted nothing takes one decay off (update_running_batch), and an
        idle scheduler (nothing running or waiting) starts again from SGLANG_INIT_RATIO
        (self_check_during_idle)."""
        if not running and not len(waiting):
            self.ratio_base, self.ratio_steps = SGLANG_INIT_RATIO, 0
        else:
            self.ratio_steps += steps

    def retracted(self, running: list[Request]) -> None:
        """After SGLang retracts requests (a preemption here), the ratio restarts from what the requests
        left running have decoded plus SGLANG_RETRACT_STEPS each, over their output lengths
        (ScheduleBatch.retract_decode)."""
        decoded = sum(r.num_output_tokens for r in running) + SGLANG_RETRACT_STEPS * len(running)
        self.ratio_base = min(1.0, decoded / (sum(r.max_output_tokens for r in running) + 1))
        self.ratio_steps = 0


def sglang_need(req: Request, num_computed: int, state_tokens: int) -> int:
    """Tokens SGLang's PrefillAdder wants free to admit ``req`` with ``num_computed`` of its tokens cached:
    the rest of its sequence, its remaining outputs (at most SGLANG_CLIP_NEW_TOKENS of them) and its
    per-request state (``state_tokens``: KVCacheManager.state_tokens)."""
    return req.num_tokens - num_computed + sglang_outputs(req) + state_tokens


def sglang_outputs(req: Request) -> int:
    return min(req.max_output_tokens - req.num_output_tokens, SGLANG_CLIP_NEW_TOKENS)


ADMISSION_POLICIES: dict[str, type[AdmissionPolicy]] = {"none": AdmissionPolicy, "sglang": SglangReserve}


# ----------------------------------------------------------------------------------------- preemption
class PreemptionPolicy:
    """``vllm`` (Scheduler.schedule): the FCFS victim is the newest running request, it goes back to the front
    of the queue, and a request that preempted itself ends the step's pass over the running ones (under FCFS
    the requests behind it were preempted before it). Decoded tokens enter the prefix cache as their blocks
    fill."""

    name: ClassVar[str] = "vllm"
    ends_pass: ClassVar[bool] = True
    """Whether a running request that preempted itself ends the step's pass over the running ones."""

    def make_queue(self, policy: str, speculative: bool) -> WaitingQueue:
        """The waiting queue of queue policy ``policy``: its ``victim`` and ``prepend`` carry this rule's
        choice of victim and where the victim rejoins (the priority queue keeps its own under either rule)."""
        return QUEUE_POLICIES[policy]()

    def decode_cached_at_finish(self, prefix_caching: bool) -> bool:
        """Whether a running request's decoded tokens enter the prefix cache only when it finishes
        (KVCacheManager.decode_cached_at_finish), so a victim's leave it uncached."""
        return False


class SglangRetraction(PreemptionPolicy):
    """``sglang`` (ScheduleBatch.retract_decode, Scheduler._add_request_to_queue): the victim is the request
    with the fewest output tokens, then the longest prompt, then the latest in the batch (with speculative
    decoding, the latest); it joins the back of the queue (twin.core.queues.SglangFcfsQueue); the requests behind a
    request that retracted itself still run (SGLang checks the whole batch before the step); its decoded
    tokens leave the prefix cache (SGLang frees them without inserting them into its radix tree; what its
    prefill inserted stays), and a running request's decoded tokens enter it only when it finishes."""

    name = "sglang"
    ends_pass = False

    def make_queue(self, policy: str, speculative: bool) -> WaitingQueue:
        if policy == "fcfs":
            return SglangFcfsQueue(by_progress=not speculative)
        return QUEUE_POLICIES[policy]()

    def decode_cached_at_finish(self, prefix_caching: bool) -> bool:
        return prefix_caching


PREEMPTION_POLICIES: dict[str, type[PreemptionPolicy]] = {"vllm": PreemptionPolicy, "sglang": SglangRetraction}


# ------------------------------------------------------------------------------------------- batching
class MixedBatches:
    """``mixed_prefill`` true (vLLM, TensorRT-LLM): prompt chunks and decodes share every step."""

    allows_cohort: ClassVar[bool] = True

    def prefill_step(self, sched: Scheduler, now: int, cutoff: int) -> dict[Request, int] | None:
        """The step's (request, tokens) when it carries prefill work alone; None: a mixed step."""
        return None


class PrefillFirst(MixedBatches):
    """``mixed_prefill`` false (SGLang, scheduler.get_next_batch_to_run): a step with prefill work carries only
    that: the running prompts still being prefilled get their next chunks, then waiting requests are admitted;
    the decodes sit it out. The decodes are in no step with prefill, so they form no lazy cohort."""

    allows_cohort = False

    def prefill_step(self, sched: Scheduler, now: int, cutoff: int) -> dict[Request, int] | None:
        """None when there is no prefill work or a chunk cannot get its blocks (the mixed pass then decodes,
        preempting as usual; blocks given to earlier chunks stay theirs, it needs no more for them)."""
        limits = sched.limits
        budget = limits.max_num_batched_tokens
        threshold = limits.long_prefill_token_threshold
        scheduled: dict[Request, int] = {}
        for req in sched.running:
            num_new = req.prompt_tokens + req.num_output_tokens - req.num_computed_tokens
            if num_new <= 1:
                continue
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, budget)
            if num_new <= 0:
                break
            if not sched.kv.allocate_slots(req, num_new):
                return None
            scheduled[req] = num_new
            budget -= num_new
        sched.admit(scheduled, budget, now, cutoff)
        return scheduled or None


class BatchWaiting:
    """TensorRT-LLM's batch waiting (PyExecutor._waiting_requests; limits batch_wait_iters and
    batch_wait_max_tokens_ratio): in a step that has decodes and could admit new prompts, the prompts are
    held back unless they and the step's other tokens reach ``ratio`` of the step's token budget or they
    have already been held ``iters`` steps in a row."""

    def __init__(self, iters: int, ratio: float, max_num_batched_tokens: int) -> None:
        self.iters = iters
        self.ratio = ratio
        self.max_num_batched_tokens = max_num_batched_tokens
        self.count = 0
        """Steps in a row that held new prompts back."""

    @classmethod
    def from_limits(cls, limits: SchedulerLimits) -> BatchWaiting | None:
        """The rule ``limits`` set; None when it is off."""
        if not (limits.batch_wait_iters or limits.batch_wait_max_tokens_ratio):
            return None
        return cls(limits.batch_wait_iters, limits.batch_wait_max_tokens_ratio, limits.max_num_batched_tokens)

    def holds(self, step_tokens: int) -> bool:
        """Whether a step of ``step_tokens`` tokens with the admissible prompts keeps them waiting (and counts
        the hold)."""
        if self.count >= self.iters or step_tokens >= self.ratio * self.max_num_batched_tokens:
            self.count = 0
            return False
        self.count += 1
        return True


def build_policies(limits: SchedulerLimits) -> tuple[AdmissionPolicy, PreemptionPolicy, MixedBatches]:
    """The admission, preemption and batching policies that ``limits`` name."""
    if limits.preemption not in PREEMPTION_POLICIES:
        raise ValueError(f"unknown preemption rule {limits.preemption!r}; expected one of {PREEMPTION_RULES}")
    if limits.admission_reserve not in ADMISSION_POLICIES:
        raise ValueError(f"unknown admission reserve {limits.admission_reserve!r}; "
                         f"expected one of {ADMISSION_RESERVES}")
    batching = MixedBatches() if limits.mixed_prefill else PrefillFirst()
    return ADMISSION_POLICIES[limits.admission_reserve](), PREEMPTION_POLICIES[limits.preemption](), batching
