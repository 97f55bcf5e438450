"""Waiting queues of the scheduler: the order of admission, and the running request a preemption takes.

The queue policy (``scheduler.policy``) names the order; the preemption policy (twin.core.policies) picks the
queue that also carries its engine's victim and where the victim rejoins (SGLang's FCFS queue)."""

from __future__ import annotations

import heapq
from collections import deque
from typing import Iterator, Protocol

from twin.core.request import Request


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

    def prepend(self, req: Request) -> None:
        """A preempted request rejoins by its key, as any other."""
        self.add(req)

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
        return iter([e[3] for e in sorted(self._heap, key=lambda e: e[:3])])

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
"""``scheduler.policy`` -> the queue class (under SGLang's preemption FCFS takes :class:`SglangFcfsQueue`)."""
