"""Tiny builders for the twin's unit tests (vLLM-test style: make_request, make_scheduler)."""

from __future__ import annotations

from twin.core.kv_cache import KVCacheManager
from twin.core.request import Request
from twin.core.scheduler import Drafter, Scheduler, SchedulerLimits
from twin.core.tokens import SourceTable, TokenSequence

_sources = SourceTable()


def make_request(rid: int, prompt: int, output: int, *, block_size: int = 4, stream: str | None = None,
                 shared: tuple[str, int] | None = None, arrival_ns: int = 0, priority: int = 0) -> Request:
    """A request whose prompt is ``shared`` (group, tokens) then its own stream (default: unique per id)."""
    seq = TokenSequence()
    own = prompt
    if shared is not None:
        seq.extend(_sources.get(("group", shared[0])), 0, shared[1])
        own -= shared[1]
    seq.extend(_sources.get(("stream", stream or f"r{rid}")), 0, own + output)
    return Request(id=rid, prompt_tokens=prompt, max_output_tokens=output,
                   block_keys=list(seq.block_keys(block_size)), arrival_ns=arrival_ns, session=f"s{rid}",
                   priority=priority)


def make_scheduler(*, num_blocks: int, block_size: int = 4, max_num_batched_tokens: int = 64,
                   max_num_seqs: int = 16, threshold: int = 0, policy: str = "fcfs",
                   chunked_prefill: bool = True, prefix_caching: bool = True,
                   mixed_prefill: bool = True, lookahead: bool = False,
                   reserve_full_kv: bool = False, batch_wait: tuple[int, float] = (0, 0.0),
                   drafter: Drafter | None = None, admission_reserve: str = "none",
                   preemption: str = "vllm", state_blocks: int = 0, recv_interval: int = 1) -> Scheduler:
    limits = SchedulerLimits(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                             long_prefill_token_threshold=threshold, chunked_prefill=chunked_prefill,
                             mixed_prefill=mixed_prefill, lookahead=lookahead, reserve_full_kv=reserve_full_kv,
                             batch_wait_iters=batch_wait[0], batch_wait_max_tokens_ratio=batch_wait[1],
                             admission_reserve=admission_reserve, preemption=preemption,
                             recv_interval=recv_interval)
    return Scheduler(limits, KVCacheManager(num_blocks, block_size, prefix_caching, state_blocks=state_blocks), policy,
                     drafter=drafter)


def step(sched: Scheduler, now: int = 0) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """One schedule + update: ((id, tokens) scheduled, ids preempted, ids finished)."""
    out = sched.schedule(now)
    finished = sched.update(out, now + 1)
    return ([(r.id, n) for r, n in out.scheduled], [r.id for r in out.preempted], [r.id for r in finished])
