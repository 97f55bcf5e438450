"""The KV lifecycle of a disaggregated request as a pure state machine (DESIGN section 5).

::

    ALLOCATED (prefill computing) -> STAGED (held on the prefill worker, lease running)
    STAGED   -> PULLING (decode reserved blocks, transfer started)  | EXPIRED (lease ran out: recompute)
    STAGED   -> PUSHING (push ablation: transfer right after prefill, nothing reserved)
    STAGED   -> FREED (the prefill worker sampled the request's only output token: nothing to decode)
    PULLING  -> RESIDENT (all blocks arrived; prefill side released)
    PUSHING  -> RESIDENT | DROPPED (decode had no room on arrival: the request fails)
    EXPIRED  -> FREED (the decode worker recomputed the prompt itself and finished the request)
    RESIDENT -> FREED (finished; blocks stay cached on the decode worker)
    ALLOCATED | STAGED -> FAILED (cannot fit on any decode worker)

Every transition's time lands in the record; an illegal transition raises, it is never a warning.
"""

from __future__ import annotations

import enum

from twin.core.errors import InvariantError


class KVState(enum.IntEnum):
    ALLOCATED = 0
    STAGED = 1
    PULLING = 2
    PUSHING = 3
    RESIDENT = 4
    EXPIRED = 5
    DROPPED = 6
    FREED = 7
    FAILED = 8


LEGAL: dict[KVState, frozenset[KVState]] = {
    KVState.ALLOCATED: frozenset({KVState.STAGED, KVState.FAILED}),
    KVState.STAGED: frozenset({KVState.PULLING, KVState.PUSHING, KVState.EXPIRED, KVState.FREED, KVState.FAILED}),
    KVState.PULLING: frozenset({KVState.RESIDENT}),
    KVState.PUSHING: frozenset({KVState.RESIDENT, KVState.DROPPED}),
    KVState.EXPIRED: frozenset({KVState.FREED, KVState.FAILED}),
    KVState.RESIDENT: frozenset({KVState.FREED}),
    KVState.DROPPED: frozenset(),
    KVState.FREED: frozenset(),
    KVState.FAILED: frozenset(),
}

TERMINAL = frozenset({KVState.FREED, KVState.DROPPED, KVState.FAILED})

_STAGING_ENDS = (KVState.PULLING, KVState.PUSHING, KVState.EXPIRED)
"""States that end the staging of a request's KV (at most one of them is ever entered); a request that
ends at staging (STAGED -> FREED) never waited for a decode worker and has no staged wait."""


class KVRecord:
    """One request's KV history: the current state and the time of every state entered."""

    __slots__ = ("request_id", "state", "times_ns", "prefill_worker", "decode_worker", "transfer_bytes",
                 "transfer_blocks", "reused_blocks", "transfer_ns")

    def __init__(self, request_id: int, now: int) -> None:
        self.request_id = request_id
        self.state = KVState.ALLOCATED
        self.times_ns: dict[KVState, int] = {KVState.ALLOCATED: now}
        self.prefill_worker = -1
        self.decode_worker = -1
        self.transfer_bytes = 0
        self.transfer_blocks = 0
        self.reused_blocks = 0
        """Prompt blocks already cached on the decode worker, so not transferred (delta pull)."""
        self.transfer_ns = 0

    def to(self, new: KVState, now: int) -> None:
        if new not in LEGAL[self.state]:
            raise InvariantError(f"request {self.request_id}: illegal KV transition {self.state.name} -> {new.name}")
        self.state = new
        self.times_ns[new] = now

    def time_s(self, state: KVState) -> float:
        t = self.times_ns.get(state)
        return float("nan") if t is None else t / 1e9

    @property
    def transferred(self) -> bool:
        """Whether a transfer of this KV ran to its end: it landed on a decode worker, or a push arrived
        and was refused there. ``transfer_ns`` is its time, set-up included (even with no block to move)."""
        times = self.times_ns
        return KVState.RESIDENT in times or KVState.DROPPED in times

    @property
    def staged_wait_ns(self) -> int | None:
        """Time the KV waited staged before its pull started (or its lease expired)."""
        times = self.times_ns
        start = times.get(KVState.STAGED)
        if start is None:
            return None
        for state in _STAGING_ENDS:
            end = times.get(state)
            if end is not None:
                return end - start
        return None
