"""A request inside the twin: token-level progress (vLLM v1 style) plus the record the results need."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from twin.core.lifecycle import KVRecord

NO_TIME = -1
"""Marks a timestamp that has not happened (times are integer nanoseconds of simulated time)."""


class Status(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3
    FAILED = 4


class Request:
    """One LLM call.

    ``num_tokens`` is the prompt plus the tokens generated so far; ``num_computed_tokens`` is how many of
    them have KV in the cache. A step hands a running request ``num_tokens - num_computed_tokens`` tokens
    (capped by the budget); when the computed count reaches ``num_tokens`` the request samples one token.
    """

    __slots__ = (
        "id", "session", "turn", "prompt_tokens", "max_output_tokens", "priority", "block_keys",
        "status", "num_computed_tokens", "num_output_tokens", "on_finish",
        "worker", "arrival_ns", "queued_ns", "enqueued_ns", "first_scheduled_ns", "first_token_ns", "last_token_ns",
        "finish_ns", "max_itl_ns", "cached_tokens", "recomputed_tokens", "preemptions", "fail_reason",
        "token_times_ns", "lost_tokens", "kv", "host_hit_tokens", "prefill_tokens", "measured",
    )

    def __init__(
        self,
        *,
        id: int,
        prompt_tokens: int,
        max_output_tokens: int,
        block_keys: Sequence[int],
        arrival_ns: int,
        session: str = "",
        turn: int = 0,
        priority: int = 0,
        on_finish: Callable[[Request], None] | None = None,
    ) -> None:
        if prompt_tokens < 1:
            raise ValueError(f"request {session}#{turn}: prompt_tokens must be >= 1, got {prompt_tokens}")
        if max_output_tokens < 1:
            raise ValueError(f"request {session}#{turn}: output tokens must be >= 1, got {max_output_tokens}")
        self.id = id
        self.session = session
        self.turn = turn
        self.prompt_tokens = prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.priority = priority
        self.block_keys = block_keys
        """Keys of the full blocks of prompt + all output tokens; only computed blocks are ever cached.
        Equal keys mean equal prefixes; a run numbers them (:class:`~twin.core.tokens.KeyTable`). A session hands
        a tuple: the garbage collector stops scanning a tuple of ints after its first pass, a list it walks
        at every collection (disagg_10k: a quarter of a collection's time)."""
        self.on_finish = on_finish
        self.status = Status.WAITING
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.worker = -1
        self.arrival_ns = arrival_ns
        self.queued_ns = NO_TIME
        """When it first joined a worker's queue (reported as queued_s)."""
        self.enqueued_ns = NO_TIME
        """When it last joined the queue it is in: what a step formed earlier may not admit. Later than
        queued_ns only for a disaggregated request the decode worker recomputes after its lease ran out."""
        self.first_scheduled_ns = NO_TIME
        self.first_token_ns = NO_TIME
        self.last_token_ns = NO_TIME
        self.finish_ns = NO_TIME
        self.max_itl_ns = 0
        self.cached_tokens = -1
        """Prompt tokens found in the prefix cache at first admission (-1 until admitted)."""
        self.recomputed_tokens = 0
        self.host_hit_tokens = 0
        """The part of ``cached_tokens`` loaded from the host KV tier instead of being recomputed."""
        self.preemptions = 0
        self.fail_reason = ""
        self.token_times_ns: list[int] | None = None
        self.lost_tokens = 0
        """Computed tokens whose KV the last preemption dropped (recomputed at resumption unless cached)."""
        self.prefill_tokens = -1
        """Tokens its last admission set out to prefill (prompt plus any earlier outputs; -1: never admitted
        here, e.g. KV pulled by a decode worker)."""
        self.measured = True
        """Whether its inter-token gaps count in the run's ITL (False when it arrived before run.warmup_s,
        as the summary's other figures leave it out)."""
        self.kv: KVRecord | None = None
        """The KV lifecycle record (disaggregated systems only)."""

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.num_output_tokens

    @property
    def total_tokens(self) -> int:
        """Prompt plus every output token: the most KV this request will ever hold."""
        return self.prompt_tokens + self.max_output_tokens

    @property
    def is_done(self) -> bool:
        return self.status >= Status.FINISHED

    def __repr__(self) -> str:
        return (
            f"Request(id={self.id}, session={self.session!r}, turn={self.turn}, status={self.status.name}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens}, output={self.num_output_tokens}/"
            f"{self.max_output_tokens}, worker={self.worker})"
        )
