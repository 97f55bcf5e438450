"""KV-transfer links in SimPy: the timer that times a :class:`~twin.core.flows.FlowNetwork`.

The network (pure, in :mod:`twin.core.flows`) shares the links max-min fairly; :class:`LinkSet` arms one
timer for the next completion, re-armed whenever a flow starts or ends and so changes the shares (the
machine-shop pattern of re-timing remaining work).
"""

from __future__ import annotations

from typing import Hashable, Iterable

import simpy

from twin.core.flows import Flow, FlowNetwork
from twin.shell.sim import ProcessGen, due_now, fire, now_ns


class LinkSet:
    """Times a :class:`FlowNetwork` in SimPy: ``yield links.transfer(...)`` waits for a flow.

    One timer is armed for the flow finishing first; a change of the flows (a start, a completion)
    re-arms it, and a timer armed before the last change does nothing when it fires. A timer's callback
    completes its flow directly, without a process between (a process and a condition event per re-arm
    cost more than the rest of a transfer).
    """

    def __init__(self, env: simpy.Environment, network: FlowNetwork) -> None:
        self.env = env
        self.net = network
        self._armed: simpy.Event | None = None
        """The timer of the flow finishing first (None when no flow is active)."""
        self._first: Flow | None = None
        """That flow."""

    def transfer(self, fid: Hashable, nbytes: float, links: Iterable[str]) -> simpy.Event:
        """Start a flow now; the returned event fires when its last byte arrives."""
        flow = self.net.add(fid, nbytes, links, now_ns(self.env))
        flow.done = self.env.event()
        self._arm()
        return flow.done

    def _arm(self) -> None:
        """Arm the timer of the flow that finishes first under the current rates."""
        nxt = self.net.next_finish()
        if nxt is None:
            self._armed = self._first = None
            return
        self._first, t = nxt
        timer = self._armed = self.env.timeout(t - now_ns(self.env))
        timer.callbacks.append(self._on_timer)  # type: ignore[union-attr]

    def _on_timer(self, timer: simpy.Event) -> None:
        flow = self._first
        if timer is not self._armed or flow is None:
            return
        now = now_ns(self.env)
        self.net.remove(flow.fid, now)
        flow.remaining = 0.0
        done, flow.done = flow.done, None  # (the event's value is the flow: no reference cycle left behind)
        assert done is not None
        if due_now(self.env):
            done.succeed(flow)
            self._arm()
        else:
            # The completion would be the next event processed (after this timer, before anything the
            # re-armed timer and the completion's callbacks schedule): its callbacks run now, no event.
            self._arm()
            fire(done, flow)
