"""Speculative decoding's acceptances: how many of a decode's k drafts the target model accepts, per request."""

from __future__ import annotations

import itertools
import random
from collections import deque

import numpy as np

from twin.core.request import Request


class Drafter:
    """How many of a speculative decode's k drafts the target model accepts, step by step.

    Draft i is accepted with probability ``rates[i]`` given drafts 1 .. i-1 were (a chain: the first
    rejection ends it). Each request draws from its own stream, seeded from the run seed and the request
    id, so a request's draws do not depend on what else ran (same seed, same results), nor on when they are
    drawn: a fast-forwarded run (twin.core.fastforward.SpecRun) draws the acceptances of its later steps ahead
    (:meth:`ahead`), and its steps, or the steps after it, use them up in order.
    """

    def __init__(self, rates: tuple[float, ...], seed: int) -> None:
        if not rates:
            raise ValueError("a drafter needs the acceptance probability of at least one draft position")
        self.rates = rates
        self.k = len(rates)
        self.seed = seed & 0xFFFF_FFFF_FFFF_FFFF
        self._streams: dict[int, random.Random] = {}
        self._ahead: dict[int, deque[int]] = {}
        """Per request: the draws of its next steps, drawn ahead and not used yet."""

    def accepted(self, req: Request) -> int:
        """The number of leading drafts the target accepts in this step of ``req``."""
        ahead = self._ahead.get(req.id)
        if ahead:
            return ahead.popleft()
        return self._draw(req)

    def ahead(self, req: Request, first: int, last: int) -> list[int]:
        """What :meth:`accepted` will return for the steps ``first`` .. ``last`` - 1 of ``req`` after the next
        one (0: the next), drawn now if not yet."""
        ahead = self._ahead.get(req.id)
        if ahead is None:
            ahead = self._ahead[req.id] = deque()
        while len(ahead) < last:
            ahead.append(self._draw(req))
        return list(itertools.islice(ahead, first, last))

    def use(self, req: Request, steps: int) -> None:
        """The next ``steps`` steps of ``req`` were scheduled with the draws :meth:`ahead` gave."""
        ahead = self._ahead[req.id]
        for _ in range(steps):
            ahead.popleft()

    def _draw(self, req: Request) -> int:
        rng = self._streams.get(req.id)
        if rng is None:
            state = np.random.SeedSequence([self.seed, req.id]).generate_state(2, np.uint64)
            rng = self._streams[req.id] = random.Random(int(state[0]) << 64 | int(state[1]))
        a = 0
        for p in self.rates:
            if rng.random() >= p:
                break
            a += 1
        return a

    def forget(self, req: Request) -> None:
        self._streams.pop(req.id, None)
        self._ahead.pop(req.id, None)
