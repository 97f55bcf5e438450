"""Small SimPy helpers shared by the processes: integer-nanosecond time and a late-priority timeout.

Simulated time is an integer number of nanoseconds, so adding step costs is exact and associative: k steps
applied one by one or in one jump land on the same instant.
"""

from __future__ import annotations

from typing import Any, Generator

import simpy
from simpy.events import NORMAL, EventPriority

# (the clock's units live apart from SimPy, for the state machines; the processes take them from here too)
from twin.core.clock import CLOCK_MAX_NS as CLOCK_MAX_NS, CLOCK_RANGE as CLOCK_RANGE, NS as NS, to_ns as to_ns

ProcessGen = Generator[simpy.Event, Any, None]
"""The type of a SimPy process function's generator."""

LATE = EventPriority(2)
"""SimPy priority after URGENT (0) and NORMAL (1): processed last among the events of one instant."""


def now_ns(env: simpy.Environment) -> int:
    return env.now  # type: ignore[return-value]  # the twin only ever schedules integer delays


class StepEnd(simpy.Event):
    """A timeout that fires after every ordinary event scheduled for the same time.

    Workers pass ``LATE + worker id``, so step ends of one instant are ordered by worker, never by the
    moment their events were created (which differs between step-by-step and fast-forwarded runs). When
    one is processed it records its slot (:func:`slot_passed`): a fast-forwarded worker has no event for
    the steps inside its run, and needs to know whether its step ending now would already have been.
    """

    def __init__(self, env: simpy.Environment, delay_ns: int, priority: int = LATE) -> None:
        # simpy.Event.__init__ inlined (a worker creates one of these per step or segment)
        self.env = env
        self.callbacks = [_record_slot]
        self._ok = True
        self._value = None
        self._slot = (env.now + delay_ns, priority)
        env.schedule(self, priority, delay_ns)  # type: ignore[arg-type]  # EventPriority is a NewType of int


def _record_slot(event: simpy.Event) -> None:
    """The first callback of every :class:`StepEnd`: the instant and priority of the latest one processed."""
    event.env._twin_slot = event._slot  # type: ignore[attr-defined]


def disarm(event: simpy.Event | None) -> None:
    """Drop a queued step end's callbacks: SimPy cannot remove it from its queue, but processed it does
    nothing and records no step slot, and :func:`next_live_event_ns` skips it."""
    if event is not None and event.callbacks is not None:
        event.callbacks = []


def slot_passed(env: simpy.Environment, priority: int) -> bool:
    """Whether the step ends of this instant up to ``priority`` (a worker's ``LATE + id``) have been
    processed: the event being processed comes after them (a step end of that worker or of a later one,
    or an ordinary event one of them triggered). Step by step, that worker's step ending now would have
    been applied, and its next step formed, before this event."""
    slot = getattr(env, "_twin_slot", None)
    return slot is not None and slot[0] == env.now and slot[1] >= priority


def fire(event: simpy.Event, value: Any = None) -> None:
    """Trigger ``event`` and run its callbacks at once, inside the event being processed.

    Exact where ``event``, triggered instead, would be the very next event processed (the caller
    ensures it: nothing else is due before it at this instant); it saves scheduling and processing an
    event. SimPy marks a processed event by ``callbacks = None``, as :meth:`simpy.Environment.step` does.
    """
    event._ok = True  # type: ignore[attr-defined]
    event._value = value  # type: ignore[attr-defined]
    callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]
    assert callbacks is not None
    for callback in callbacks:
        callback(event)


def next_live_event_ns(env: simpy.Environment) -> int | None:
    """The time of the next queued event that can change anything, or None when none can.

    An event that succeeded with no callbacks left (a worker's disarmed segment end, :func:`disarm`)
    changes nothing when processed; a failed one still raises, so it counts. The heap's
    first entry answers unless it is such a dead event; only then is the queue scanned."""
    queue = env._queue  # type: ignore[attr-defined]  # SimPy's heap of (time, priority, id, event)
    if not queue:
        return None
    first = queue[0][3]
    if first.callbacks or not first._ok:
        return int(queue[0][0])
    live = [t for t, _, _, ev in queue if ev.callbacks or not ev._ok]
    return int(min(live)) if live else None


def due_now(env: simpy.Environment) -> bool:
    """Whether an event is due at this instant ahead of an ordinary event triggered now (one of
    priority URGENT or NORMAL: those are processed first, the one triggered now being the newest)."""
    queue = env._queue  # type: ignore[attr-defined]  # SimPy's heap of (time, priority, id, event)
    return bool(queue) and queue[0][0] == env.now and queue[0][1] <= NORMAL
