"""Flow-level bandwidth sharing for KV transfers: flows over capacity-limited links, max-min fair.

Flows cross one or more links (a sender's egress, a receiver's ingress); the rates are the max-min fair
allocation (progressive filling), recomputed whenever a flow starts or ends, and each flow's remaining
bytes drain at its rate. Time is integer nanoseconds; nothing here runs a clock
(:class:`twin.shell.links.LinkSet` times the network in SimPy).
"""

from __future__ import annotations

import math
from typing import Any, Hashable, Iterable

from twin.core.errors import InvariantError


class Flow:
    __slots__ = ("fid", "links", "remaining", "rate", "done", "nbytes", "start_ns")

    def __init__(self, fid: Hashable, nbytes: float, links: tuple[str, ...], start_ns: int) -> None:
        self.fid = fid
        self.nbytes = nbytes
        self.links = links
        self.remaining = float(nbytes)
        self.rate = 0.0
        self.start_ns = start_ns
        self.done: Any = None
        """The event the shell fires when the flow completes (a simpy.Event), None until it waits."""


class FlowNetwork:
    """Flows over capacity-limited links, sharing max-min fairly; time is integer nanoseconds."""

    def __init__(self, capacities_Bps: dict[str, float]) -> None:
        for name, cap in capacities_Bps.items():
            if not cap > 0:
                raise ValueError(f"link {name!r}: capacity must be > 0 bytes/s, got {cap!r}")
        self.capacities_Bps = dict(capacities_Bps)
        self.flows: dict[Hashable, Flow] = {}
        self._last_ns = 0
        self.bytes_done: dict[str, float] = {name: 0.0 for name in capacities_Bps}

    def add(self, fid: Hashable, nbytes: float, links: Iterable[str], now: int) -> Flow:
        links = tuple(links)
        for name in links:
            if name not in self.capacities_Bps:
                raise ValueError(f"flow {fid!r} crosses unknown link {name!r}")
        if fid in self.flows:
            raise InvariantError(f"flow {fid!r} already active")
        self.advance(now)
        flow = Flow(fid, nbytes, links, now)
        self.flows[fid] = flow
        self._rerate()
        return flow

    def remove(self, fid: Hashable, now: int) -> Flow:
        self.advance(now)
        flow = self.flows.pop(fid)
        self._rerate()
        return flow

    def advance(self, now: int) -> None:
        """Drain every flow at its current rate up to ``now``."""
        dt = (now - self._last_ns) / 1e9
        if dt < 0:
            raise InvariantError(f"time went backwards: {now} < {self._last_ns}")
        if dt > 0:
            for flow in self.flows.values():
                moved = min(flow.remaining, flow.rate * dt)
                flow.remaining -= moved
                for name in flow.links:
                    self.bytes_done[name] += moved
        self._last_ns = now

    def _rerate(self) -> None:
        """Progressive filling: raise all unfrozen rates together; freeze the flows of the tightest link."""
        left = dict(self.capacities_Bps)
        users: dict[str, list[Flow]] = {}
        for flow in self.flows.values():
            flow.rate = 0.0
            for name in flow.links:
                users.setdefault(name, []).append(flow)
        unfrozen = set(self.flows)
        while unfrozen:
            best_link, best_share = None, math.inf
            for name, flows in users.items():
                n = sum(1 for f in flows if f.fid in unfrozen)
                if n and left[name] / n < best_share:
                    best_link, best_share = name, left[name] / n
            if best_link is None:
                raise InvariantError("flows without links")
            for flow in users[best_link]:
                if flow.fid in unfrozen:
                    flow.rate = best_share
                    unfrozen.discard(flow.fid)
                    for name in flow.links:
                        left[name] -= best_share

    def next_finish(self) -> tuple[Flow, int] | None:
        """The flow finishing first and its finishing time (ceiling to the nanosecond); ties by start order."""
        best: tuple[Flow, int] | None = None
        for flow in self.flows.values():
            t = self._last_ns + math.ceil(flow.remaining / flow.rate * 1e9 - 1e-6) if flow.remaining > 0 else \
                self._last_ns
            if best is None or t < best[1]:
                best = (flow, t)
        return best

    def utilisation(self, name: str) -> float:
        # Added in order, one by one: what sum() does on Python 3.11, and what the compiled core does on every
        # version (Python 3.12's sum() compensates float rounding; the compiled loop would not).
        total = 0.0
        for f in self.flows.values():
            if name in f.links:
                total += f.rate
        return total / self.capacities_Bps[name]
