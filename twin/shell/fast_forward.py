"""The fast-forward driver: what a stepping process waits on between its steps, idle or fast-forwarding.

A process that steps (a worker; an attention-DP group, whose ranks step together: twin.shell.attention_dp)
sleeps either until an outside event (an arrival, an abort, a KV pull queued) or through fast-forwarded
pure-decode steps (:mod:`twin.core.fastforward` plans and applies them): a worker's one run, or a group's run
per stepping rank, all over the same steps, so that they end together. :class:`FastForward` owns those runs
while they last:

* their steps are costed in segments that double while the runs go on (a worker's 8, 16, 32 ...; a group's 4,
  8 ...), so runs cut early have not paid for steps they never ran; the end of a segment is armed as a
  :class:`~twin.shell.sim.StepEnd` in the owner's end-of-step slot, whose callback costs the next segment, or
  after the runs' last step resumes the owner (:func:`~twin.shell.sim.fire`: nothing runs between that end
  and a wake event it would trigger, so costing the next segment there changes nothing the owner would see);
* an outside event cuts the runs after the step in progress (:meth:`FastForward.wake`): the owner resumes at
  that step's end, in its end-of-step slot, after every event of the instant;
* steps ending past the clock's range are refused as the owner says (a worker raises: Worker._past_clock) or
  dropped from the runs (a group: its next step, stepped one by one, then raises);
* the steps that elapsed are booked by the owner (``book``), when the runs stop or the simulation does.

A worker whose batch survives the cut goes on with its run (Worker._resumable, then :meth:`FastForward.go_on`);
a group's runs stop at every cut.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Callable, Generator

import simpy

from twin.core.fastforward import PlannedRun
from twin.shell.sim import CLOCK_MAX_NS, ProcessGen, StepEnd, disarm, fire, now_ns, slot_passed

if TYPE_CHECKING:
    from twin.shell.worker import Worker

Runs = list[tuple["Worker", PlannedRun]]
"""Runs over the same steps, each with the worker (or rank) it steps."""


def step_passed(env: simpy.Environment, priority: int, run: PlannedRun, t: int) -> bool:
    """Whether a step of the fast-forwarded ``run`` ends at ``t`` and its stepper's end-of-step slot (``priority``)
    of the instant has passed (the event being processed came after it: another worker's step end, or what one
    triggered): step by step, that step was applied and the next one formed before this event."""
    if not slot_passed(env, priority):
        return False
    i = bisect_left(run.ends, t)
    return i < len(run.ends) and run.ends[i] == t


def steps_done(env: simpy.Environment, priority: int, run: PlannedRun, t: int) -> int:
    """Steps of the fast-forwarded ``run`` that step-by-step simulation has applied when an event at ``t`` is
    processed: those ending before ``t``, and one ending at ``t`` once its end-of-step slot has passed."""
    return bisect_left(run.ends, t) + step_passed(env, priority, run, t)


class FastForward:
    """The waits of one stepping process, whose step ends take the end-of-step slot ``priority``: idle until an
    outside event, or through fast-forwarded runs (module docstring). ``first_segment``: the steps costed when
    runs start; ``book(runs, m)``: the runs stop after step ``m``, whose steps enter the ledgers; ``past_clock(now,
    ns)``: costed steps would end ``ns`` after ``now``, past the clock's range (None: drop those steps)."""

    def __init__(self, env: simpy.Environment, priority: int, first_segment: int,
                 book: Callable[[Runs, int], None], past_clock: Callable[[int, int], None] | None = None) -> None:
        self.env = env
        self.priority = priority
        self.first_segment = first_segment
        self.book = book
        self.past_clock = past_clock
        self.runs: Runs = []
        """The runs in progress (their workers' ``run`` while they last)."""
        self._wait: simpy.Event | None = None
        """What the owner waits for: an outside event (idle), or the step after which it resumes (its value)."""
        self._armed: StepEnd | None = None
        """The armed end of the costed segment."""
        self._costed = 0
        """Steps of the runs costed so far; the armed end is the end of the last of them."""
        self._segment = 0
        """Steps costed in the runs' latest segment (doubled for the next one)."""
        self._cut_at = 0
        """The step after which an outside event cut the runs (0: none pending)."""

    # ------------------------------------------------------------------------------------ the owner's side
    def idle(self) -> ProcessGen:
        """Sleep until an outside event (:meth:`wake`)."""
        self._wait = self.env.event()
        yield self._wait
        self._wait = None

    def cost_first(self, runs: Runs) -> int:
        """Cost the first segment of ``runs`` (planned over the same steps); returns the steps costed."""
        self._segment = self.first_segment
        return self._extend(runs, len(runs[0][1].ends) + self._segment)

    def start(self, runs: Runs) -> None:
        """Take the costed ``runs`` and arm the end of their costed segment."""
        self.runs = runs
        for w, run in runs:
            w.run = run
        self._arm()

    def wait(self) -> Generator[simpy.Event, Any, int]:
        """Sleep through the runs; returns the step after which the owner resumes: their last (the runs' ``k``),
        or the step in progress when an outside event came."""
        self._wait = self.env.event()
        m: int = yield self._wait
        self._cut_at = 0
        return m

    def go_on(self, m: int) -> None:
        """The owner resumed after step ``m``, which an outside event cut the runs after, and goes on with them
        (shortened, perhaps, to the steps still safe): arm the end of their costed segment again where it moved."""
        lead = self.runs[0][1]
        if m == self._costed:
            # The cut came at the segment's end, which resumed the owner instead of costing the next one.
            self._segment *= 2
            self._extend(self.runs, m + self._segment)
            self._arm()
        elif lead.k < self._costed:  # fewer steps are safe now: the segment's end is past the runs
            self._costed = lead.k
            self._arm()

    def end(self, m: int) -> None:
        """The runs stop after step ``m``: their steps enter the ledgers (``book``)."""
        runs, self.runs = self.runs, []
        for w, _ in runs:
            w.run = None
        disarm(self._armed)
        self._armed = None
        self.book(runs, m)

    def stop(self) -> None:
        """The simulation stops now (``run.max_sim_s``): the runs' steps that had begun enter the ledgers, as
        step-by-step simulation charges each step when it begins."""
        if self.runs:
            now = now_ns(self.env)
            for _, run in self.runs:
                run.sync(now)
            self.end(self.runs[0][1].scheduled)

    def boundaries_passed(self) -> int:
        """The inner step boundaries of the runs that step-by-step simulation has passed by now (the last, after
        which the owner resumes, is the owner's own)."""
        lead = self.runs[0][1]
        return min(steps_done(self.env, self.priority, lead, now_ns(self.env)), (self._cut_at or self._costed) - 1)

    # ------------------------------------------------------------------------------------- outside events
    def wake(self) -> None:
        """An outside event: an idle owner resumes now, a fast-forwarding one after the step in progress."""
        wait = self._wait
        if wait is None or wait.triggered or self._cut_at:
            return
        if not self.runs:
            wait.succeed()
            return
        # The owner resumes at the end of the step in progress (the first step ending at or after now; ends
        # increase), in its own end-of-step slot: after every event of that instant. A step ending now is in
        # progress only until that slot has passed (step_passed); then the runs stop at the end of the next.
        lead = self.runs[0][1]
        t = now_ns(self.env)
        m = self._cut_at = steps_done(self.env, self.priority, lead, t) + 1
        cut = StepEnd(self.env, lead.ends[m - 1] - t, self.priority)
        cut.callbacks.append(lambda _: fire(wait, m))  # type: ignore[union-attr]

    # ---------------------------------------------------------------------------------------- segments
    def _extend(self, runs: Runs, m: int) -> int:
        """Cost the runs' steps up to ``m`` (at most their end), every run at once; returns the steps costed.
        Steps ending past the clock's range go to ``past_clock``, or are dropped from the runs: step by step,
        the first of them raises (Worker._past_clock), which the step after the shortened runs then does."""
        for _, run in runs:
            run.extend(m)
        ends = runs[0][1].ends
        if ends[-1] > CLOCK_MAX_NS:
            if self.past_clock is not None:
                now = now_ns(self.env)
                self.past_clock(now, ends[-1] - now)
            inside = bisect_left(ends, CLOCK_MAX_NS + 1)
            for _, run in runs:
                run.truncate(max(inside, run.updated))
        self._costed = len(ends)
        return self._costed

    def _arm(self) -> None:
        """Arm the end of the runs' costed segment (dropping the end armed before), handled by a callback
        (instead of waiting on ``end | wake``: a condition event per segment costs more than its steps)."""
        disarm(self._armed)
        end = StepEnd(self.env, self.runs[0][1].ends[self._costed - 1] - now_ns(self.env), self.priority)
        end.callbacks.append(self._segment_ended)  # type: ignore[union-attr]
        self._armed = end

    def _segment_ended(self, end: simpy.Event) -> None:
        """A segment ended: cost the next, twice as long, or after the runs' last step resume the owner (inside
        this callback: :func:`~twin.shell.sim.fire`). An end that shortened or stopped runs left behind was
        disarmed; with a cut pending (at this very step: a cut before it resumed the owner first), the owner
        resumes at the cut, the same instant, and costs the next segment only if it goes on (:meth:`go_on`)."""
        if end is not self._armed or self._cut_at:
            return
        costed = self._costed
        if costed < self.runs[0][1].k:
            self._segment *= 2
            if self._extend(self.runs, costed + self._segment) > costed:
                self._arm()
                return
        assert self._wait is not None
        fire(self._wait, self._costed)


__all__ = ["FastForward", "Runs", "step_passed", "steps_done"]
