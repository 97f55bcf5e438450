"""The scheduler's limits and engine rules, set from the engine profile and the config's scheduler section;
the string rules name the engine policies (twin.core.policies) that the scheduler builds from them."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class SchedulerLimits:
    """One worker's step limits and the engine's scheduling rules (Scheduler reads them; never mutated)."""

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
    request that can be admitted) carries only that; the running decodes wait for a step without it
    (twin.core.policies.PrefillFirst; true: MixedBatches)."""
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
    the new-token ratio, less what this step admitted before it; ``none``: blocks as tokens come (vLLM).
    The policy: twin.core.policies.ADMISSION_POLICIES."""
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
    policy keeps its own victim (lowest priority, latest arrival) under either rule. The policy:
    twin.core.policies.PREEMPTION_POLICIES."""
