"""SGLang's input queue (``scheduler.recv_interval``, --scheduler-recv-interval): arrivals wait there until a
scheduler turn's receive counter reaches the interval (Scheduler.recv_requests with its SchedulerRecvSkipper)."""

from __future__ import annotations

from twin.core.clock import CLOCK_MAX_NS
from twin.core.queues import WaitingQueue
from twin.core.request import Request

RECV_WEIGHT_DECODE = 1
"""SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DECODE (and _TARGET_VERIFY): a decode step's share of the receive
counter."""
RECV_WEIGHT_OTHER = 1000
"""SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DEFAULT: a step with prompt tokens (extend, mixed): receive next turn."""


class InputQueue:
    """Arrivals not yet received, and the receive counter; ``interval`` 1: every turn receives (no queue)."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.inbox: list[Request] = []
        """Arrivals still in the input queue: taken by :meth:`poll`."""
        self.counter = 0
        """The receive counter (SchedulerRecvSkipper._counter) after the last turn that polled."""
        self.weight = 0
        """What the step applied since that turn adds at the next (0: none applied)."""

    def holds(self, req: Request, busy: bool) -> bool:
        """Whether ``req`` waits in the input queue: while the scheduler is ``busy``. An idle scheduler spins
        through its turns: it takes the request at once, its counter restarting."""
        if busy:
            self.inbox.append(req)
            return True
        self.counter = self.weight = 0
        return False

    def poll(self, waiting: WaitingQueue, idle: bool) -> None:
        """A scheduler turn's receive: the step applied since the last turn adds its weight to the counter (a
        decode 1, a step with prompt tokens RECV_WEIGHT_OTHER); at the interval the counter restarts and the
        input queue joins ``waiting``. With nothing running or waiting (``idle``) the scheduler spins through
        idle turns and takes it at once."""
        weight, self.weight = self.weight, 0
        if not weight and not idle:
            return  # (a second pass at one step boundary)
        self.counter += weight
        if self.counter >= self.interval or idle:
            self.counter = 0
            for req in self.inbox:
                waiting.add(req)
            self.inbox.clear()

    def step_applied(self, decode: bool) -> None:
        """A step was applied: a pure-decode one (``decode``) or one with prompt tokens."""
        self.weight = RECV_WEIGHT_DECODE if decode else RECV_WEIGHT_OTHER

    def decodes_before_recv(self) -> int:
        """How many more decode steps may follow the last one formed before a turn takes the input queue
        (fast-forward stops there); unbounded while the queue is empty."""
        if not self.inbox:
            return CLOCK_MAX_NS
        return self.interval - self.counter - 1

    def count_turns(self, turns: int) -> None:
        """Fast-forwarded decode steps: ``turns`` scheduler turns between them, each adding a decode's weight.
        A turn that reaches the interval restarts the counter with the input queue empty: a run stops before
        one that would take a queued request (:meth:`decodes_before_recv`), and the turns of steps formed
        before an arrival are counted before the worker looks at it (twin.shell.worker.Worker._resumable)."""
        if self.interval == 1:
            return
        self.counter = (self.counter + turns) % self.interval
        self.weight = RECV_WEIGHT_DECODE
