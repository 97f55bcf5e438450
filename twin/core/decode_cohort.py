"""Lazy decodes: running requests that decode one token per step, advanced as a group (exact).

In a mixed step (running decodes plus a prefill chunk) each decode computes one token, and step-by-step
simulation touches every one of them twice per step (schedule, then update) although nothing happens to
most of them: only every ``block_size`` tokens does a decode take a new block or fill one, and once it
finishes. A :class:`DecodeCohort` holds such decodes (a prefix of the scheduler's running list) with their
progress relative to a step counter: a step costs the cohort O(1) plus its block events and finishes,
which are known in advance and replayed at their steps in running order, so block ids, evictions and
prefix hits are those of step-by-step simulation. A member's own fields (computed and output tokens,
last token time, largest gap, token times) are brought up to date only when it leaves or someone reads
them (:meth:`DecodeCohort.sync`).

Every member sampled its last token at the previous step's end, so each step adds the same gap (step end
minus previous step end) to every member: the scheduler counts them as one shared gap, and a member's
largest gap is the largest step gap since it joined.
"""

from __future__ import annotations

from typing import Iterable

from twin.core.kv_cache import KVCacheManager
from twin.core.request import Request, Status


_REBASE_AFTER = 1 << 16
"""Updates after which the cohort counts from zero again (:meth:`DecodeCohort._rebase`)."""


class _Member:
    __slots__ = ("req", "seq", "base", "synced")

    def __init__(self, req: Request, seq: int, base: int, synced: int) -> None:
        self.req = req
        self.seq = seq
        """Join order: the members' running order."""
        self.base = base
        """Computed tokens minus the cohort's update count (constant until the count is rebased)."""
        self.synced = synced
        """Update count up to which ``req``'s fields are current."""


class DecodeCohort:
    """Decodes advanced together, ``running[:len(cohort)]`` of one scheduler (see the module docstring).

    A member's block events come every ``block_size`` steps at a phase set by its computed tokens, so
    members are kept in one list per phase (``base % block_size``) and a step looks only at the two lists
    whose phase is due: the members that fill a block (with prefix caching) and those whose blocks are full.
    """

    def __init__(self, kv: KVCacheManager, record_token_times: bool) -> None:
        self.kv = kv
        self.record_token_times = record_token_times
        self.members: dict[Request, _Member] = {}
        self.updates = 0
        """Steps applied since the cohort was last empty (or rebased)."""
        self.ends: list[int] = []
        """End time of each applied step (``ends[u - 1]`` for update u)."""
        self.gaps: list[int] = []
        """Each applied step's gap: its end minus the previous step's end."""
        self._phases: list[list[_Member]] = [[] for _ in range(kv.block_size)]
        """Members by ``base % block_size``, each list in running order."""
        self._finishes: dict[int, list[_Member]] = {}
        """Update count -> members that sample their last token in that update."""
        self._base_sum = 0
        self._base_max: int | None = None
        """The largest member base, None when it must be found again (its member left)."""
        self._seq = 0
        self.measured = 0
        """Members whose gaps count in the ITL (Request.measured)."""

    def __len__(self) -> int:
        return len(self.members)

    def context(self) -> int:
        """Context the members attend in the step being scheduled: the sum of computed tokens + 1."""
        return self._base_sum + len(self.members) * (self.updates + 1)

    def max_context(self) -> int:
        """The longest context a member attends in the step being scheduled (0 without members)."""
        if not self.members:
            return 0
        top = self._base_max
        if top is None:
            top = self._base_max = max(m.base for m in self.members.values())
        return top + self.updates + 1

    # ------------------------------------------------------------------------------------- membership
    def join(self, running: list[Request], prev_end: int, budget: int, ghosts: int = 0) -> None:
        """Extend the cohort over the running requests after it that are plain decodes which sampled at
        ``prev_end`` (the previous step's end), while ``budget`` leaves each a token. ``ghosts``: finished
        members still in ``running`` among the members (their last token in flight, async_output)."""
        members = self.members
        kv = self.kv
        size = kv.block_size
        req_blocks = kv.req_blocks
        phases = self._phases
        finishes = self._finishes
        u = self.updates
        n = len(members)
        limit = min(len(running) - ghosts, budget)
        while n < limit:
            req = running[n + ghosts]
            computed = req.num_computed_tokens
            if (req.prompt_tokens + req.num_output_tokens - computed != 1 or req.last_token_ns != prev_end
                    or req.status is Status.FINISHED):  # (async_output: its last token is in flight)
                break
            blocks = req_blocks.get(req.id)
            if blocks is None or computed > len(blocks) * size:
                break
            base = computed - u
            m = _Member(req, self._seq, base, u)
            self._seq += 1
            members[req] = m
            self.measured += req.measured
            self._base_sum += base
            if n == 0:
                self._base_max = base
            elif self._base_max is not None and base > self._base_max:
                self._base_max = base
            phases[base % size].append(m)
            at = u + req.max_output_tokens - req.num_output_tokens
            entry = finishes.get(at)
            if entry is None:
                finishes[at] = [m]
            else:
                entry.append(m)
            n += 1

    # ------------------------------------------------------------------------------------------ steps
    def block_events(self, placeholders: bool) -> list[tuple[_Member, bool]]:
        """This step's block events in running order: (member, whether it takes a new block). A member
        takes one when its blocks are full (its computed tokens a multiple of the block size) and, with
        prefix caching, registers a block when its next token fills one. ``placeholders``: the members'
        input tokens are not known when the step is formed (vLLM's async scheduling, a step formed before
        the last one's output is applied: twin.core.scheduler.SchedulerLimits.async_output); then a member
        registers instead the block its last token filled, once the output is applied."""
        kv = self.kv
        size = kv.block_size
        u = self.updates
        req_blocks = kv.req_blocks
        full = self._phases[-u % size]  # computed tokens a multiple of size: blocks full unless reserved
        if kv.enable_prefix_caching and placeholders:  # each registers the block its last token filled
            return [(m, m.base + u == len(req_blocks[m.req.id]) * size) for m in full]
        if kv.enable_prefix_caching:
            fill = self._phases[-(u + 1) % size]
            if fill is full:  # block size 1: every step fills a block, some also take one
                return [(m, m.base + u == len(req_blocks[m.req.id]) * size) for m in fill]
            if fill:
                events = [(m, False) for m in fill]
                events += [(m, True) for m in full if m.base + u == len(req_blocks[m.req.id]) * size]
                events.sort(key=_first_seq)
                return events
        return [(m, True) for m in full if m.base + u == len(req_blocks[m.req.id]) * size]

    def apply(self, events: Iterable[tuple[_Member, bool]], placeholders: bool) -> list[tuple[Request, int]]:
        """The schedule phase of this step for the members with events: what ``KVCacheManager.append_one``
        and the scheduler's inline decode path do (a new block, then registration of full blocks). With
        ``placeholders`` (:meth:`block_events`) the registrations wait: returns them, (member, tokens), for
        after the schedule (the blocks the members' last tokens filled, which are the members whose blocks
        are full: the events)."""
        kv = self.kv
        pool = kv.pool
        caching = kv.enable_prefix_caching
        u = self.updates
        if placeholders:
            for m, allocates in events:
                if allocates:
                    kv.req_blocks[m.req.id].append(pool.allocate_one())
            return [(m.req, m.base + u) for m, _ in events] if caching else []
        for m, allocates in events:
            if allocates:
                kv.req_blocks[m.req.id].append(pool.allocate_one())
            if caching:
                kv.cache_computed(m.req, m.base + u + 1)
        return []

    def pending_fills(self) -> list[tuple[Request, int]]:
        """The registrations a step formed with placeholders would leave for after it (:meth:`apply`), for a
        step formed once the last one's output is applied instead: (member, tokens), in running order."""
        if not self.kv.enable_prefix_caching:
            return []
        u = self.updates
        return [(m.req, m.base + u) for m in self._phases[-u % self.kv.block_size]]

    def advance(self, now: int, prev_end: int) -> list[Request]:
        """The update phase of a step ending at ``now``: every member samples a token. Returns the members
        that sampled their last one (brought up to date and out of the cohort), in running order."""
        self.updates += 1
        self.ends.append(now)
        self.gaps.append(now - prev_end)
        done = self._finishes.pop(self.updates, None)
        if not done:
            if self.updates >= _REBASE_AFTER:
                self._rebase()
            return []
        size = self.kv.block_size
        for m in done:  # in running order: members joined in that order
            self._sync(m)
            del self.members[m.req]
            self.measured -= m.req.measured
            self._base_sum -= m.base
            if m.base == self._base_max:
                self._base_max = None
            self._phases[m.base % size].remove(m)
        if not self.members:
            self._reset()
        return [m.req for m in done]

    # ---------------------------------------------------------------------------------------- readers
    def _sync(self, m: _Member) -> None:
        d = self.updates - m.synced
        if d <= 0:
            return
        req = m.req
        req.num_computed_tokens += d
        req.num_output_tokens += d
        req.last_token_ns = self.ends[-1]
        gap = max(self.gaps[m.synced:])
        if gap > req.max_itl_ns:
            req.max_itl_ns = gap
        if self.record_token_times:
            if req.token_times_ns is None:
                req.token_times_ns = []
            req.token_times_ns.extend(self.ends[m.synced:])
        m.synced = self.updates

    def sync(self) -> None:
        """Bring every member's fields up to date (they stay members)."""
        for m in self.members.values():
            self._sync(m)

    def disband(self) -> list[Request]:
        """Bring every member up to date and empty the cohort; returns the members in running order."""
        self.sync()
        out = list(self.members)
        self.members.clear()
        self._reset()
        return out

    def _rebase(self) -> None:
        """Count updates from zero again, with every member brought up to date (bounds the step lists of
        a cohort that never empties)."""
        self.sync()
        u = self.updates
        size = self.kv.block_size
        for m in self.members.values():
            m.base += u
            m.synced = 0
        self._base_sum += u * len(self.members)
        if self._base_max is not None:
            self._base_max += u
        # A member's phase (base % size) moves by u: the list of phase p becomes that of (p + u) % size.
        shift = u % size
        self._phases = self._phases[-shift:] + self._phases[:-shift] if shift else self._phases
        self._finishes = {at - u: entry for at, entry in self._finishes.items()}
        self.updates = 0
        self.ends.clear()
        self.gaps.clear()

    def _reset(self) -> None:
        self.updates = 0
        self.ends.clear()
        self.gaps.clear()
        for phase in self._phases:
            phase.clear()
        self._finishes.clear()
        self._base_sum = 0
        self._base_max = None
        self.measured = 0


def _first_seq(event: tuple[_Member, bool]) -> int:
    return event[0].seq
