"""The worker process: schedule -> one timeout for the step's cost -> update, sleeping when idle.

The step's end is an event of lower priority than every other event at the same instant, so a request that
arrives exactly when a step ends is seen by the next ``schedule`` call whatever the event order would be.
"""

from __future__ import annotations

from typing import Callable, Mapping

import simpy

from hardware import CostModel
from twin.sim import ProcessGen, StepEnd, now_ns
from twin.request import Request
from twin.scheduler import Scheduler

class Ledger:
    """Seconds spent per cost term on one worker, and the number of steps."""

    def __init__(self) -> None:
        self.terms_s: dict[str, float] = {}
        self.steps = 0
        self.busy_ns = 0

    def add(self, terms: Mapping[str, float], step_ns: int, count: int = 1) -> None:
        acc = self.terms_s
        for name, value in terms.items():
            acc[name] = acc.get(name, 0.0) + value * count
        self.steps += count
        self.busy_ns += step_ns * count


class Worker:
    """One serving instance (a colocated engine: prefill and decode share its batches)."""

    def __init__(self, env: simpy.Environment, wid: int, scheduler: Scheduler, cost_model: CostModel,
                 on_done: Callable[[Request], None], before_schedule: Callable[[], None] | None = None) -> None:
        self.env = env
        self.wid = wid
        self.sched = scheduler
        self.cost_model = cost_model
        self.on_done = on_done
        self.before_schedule = before_schedule
        """Called at every step boundary before scheduling (a decode worker starts its pulls there)."""
        self.ledger = Ledger()
        self.blocked = False
        """True while the worker has work but could schedule none of it (reported by the stall detector)."""
        self._wake: simpy.Event | None = None
        self.process = env.process(self._run())

    # ------------------------------------------------------------------------------- router interface
    def submit(self, req: Request) -> None:
        req.worker = self.wid
        if not self.sched.add_request(req, now_ns(self.env)):
            self.on_done(req)
            return
        self.wake()

    def wake(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def load(self) -> int:
        return len(self.sched.running) + len(self.sched.waiting)

    def load_fraction(self) -> float:
        return self.load() / self.sched.limits.max_num_seqs

    def prefix_hit_tokens(self, req: Request) -> int:
        return len(self.sched.kv.get_computed_blocks(req)) * self.sched.kv.block_size

    # ---------------------------------------------------------------------------------------- process
    def _run(self) -> ProcessGen:
        env = self.env
        sched = self.sched
        cost_model = self.cost_model
        ledger = self.ledger
        while True:
            if self.before_schedule is not None:
                self.before_schedule()
            if not sched.has_work:
                yield from self._sleep()
                continue
            out = sched.schedule(now_ns(env))
            if out.empty:
                self.blocked = True
                yield from self._sleep()
                self.blocked = False
                continue
            cost = cost_model.step_cost(out.stats)
            step_ns = cost_model.step_time_ns(out.stats)
            ledger.add(cost.terms, step_ns)
            yield StepEnd(env, step_ns)
            for req in sched.update(out, now_ns(env)):
                self.on_done(req)

    def _sleep(self) -> ProcessGen:
        self._wake = self.env.event()
        yield self._wake
        self._wake = None
