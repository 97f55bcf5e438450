"""The worker process: schedule -> one timeout for the step's cost -> update, sleeping when idle.

A step ends with an event of lower priority than every ordinary event at the same instant (and ordered
by worker id among step ends), so a request that arrives exactly when a step ends is seen by the next
``schedule`` call whatever order the events were created in. Pure-decode stretches are fast-forwarded
(:mod:`twin.core.fastforward`, driven by :class:`~twin.shell.fast_forward.FastForward`): one event for k
steps, woken early by an arrival, with identical results.
"""

from __future__ import annotations

from typing import Any, Callable, Generator

import simpy

from twin.core.fastforward import PlannedRun, plan_decode_run
from twin.core.prices import Ledger, StepPrices
from twin.core.request import Request
from twin.core.scheduler import Scheduler
from twin.core.errors import ConfigError
from twin.shell.fast_forward import FastForward, Runs, step_passed
from twin.shell.sim import CLOCK_MAX_NS, CLOCK_RANGE, LATE, ProcessGen, StepEnd, now_ns, to_ns

_FIRST_SEGMENT = 8
"""Steps costed when a worker's run is planned (then 16, 32 ... while it goes on)."""


class Worker:
    """One serving instance (a colocated engine: prefill and decode share its batches)."""

    def __init__(self, env: simpy.Environment, wid: int, scheduler: Scheduler, prices: StepPrices,
                 on_done: Callable[[Request], None], before_schedule: Callable[[], None] | None = None,
                 fast_forward_steps: int = 0) -> None:
        self.env = env
        self.wid = wid
        self.sched = scheduler
        self.prices = prices
        """Step prices of the worker's cost model (one table shared by the workers built on that model)."""
        self.on_done = on_done
        self.before_schedule = before_schedule
        """Called at every step boundary before scheduling (a decode worker starts its pulls there)."""
        self.fast_forward_steps = fast_forward_steps
        """Most decode steps planned in one jump (0 or 1: step by step)."""
        self.priority = LATE + wid
        self.ledger = Ledger(tuple(prices.cost_model.term_names))
        self.blocked = False
        """True while the worker has work but could schedule none of it (reported by the stall detector)."""
        self.run: PlannedRun | None = None
        """The fast-forwarded run in progress (set by the driver of the worker, or of its attention-DP group)."""
        self.decoding = False
        """True during a pure-decode step run on its own (not fast-forwarded): the monitor treats it as it
        treats a fast-forward run (:attr:`run`), which step-by-step simulation runs as such steps."""
        self.ff = FastForward(env, self.priority, _FIRST_SEGMENT, self._book_run,
                              lambda now, ns: self._past_clock(now, ns, 0.0))
        """What the worker waits on between steps: an outside event, or its fast-forwarded run."""
        self._aborts: list[tuple[Request, str]] = []
        """Requests to drop at the next step boundary (:meth:`abort`), with their reasons."""
        self.process = env.process(self._run())

    # ------------------------------------------------------------------------------- router interface
    def submit(self, req: Request) -> None:
        req.worker = self.wid
        now = now_ns(self.env)
        if self.run is not None and step_passed(self.env, self.priority, self.run, now):
            # The queue must see a request arriving after that step's successor was formed
            # (Scheduler.add_request's tie rule).
            self.sched.step_formed(now)
        if not self.sched.add_request(req, now):
            self.on_done(req)
            return
        self.wake()

    def abort(self, req: Request, reason: str) -> None:
        """Drop ``req`` (queued or running here) at the next step boundary: a step in progress still
        carries it, as an engine's abort takes effect between steps."""
        self._aborts.append((req, reason))
        self.wake()

    def _apply_aborts(self) -> None:
        now = now_ns(self.env)
        self.sync()
        for req, reason in self._aborts:
            if self.sched.abort(req, now, reason):
                self.on_done(req)
        self._aborts.clear()

    def wake(self) -> None:
        """An outside event: a sleeping worker wakes now, a fast-forwarded one after the step in progress."""
        self.ff.wake()

    def sync(self) -> None:
        """Bring a fast-forwarded worker's state to what step-by-step simulation shows now (for readers)."""
        if self.run is not None:
            self.run.sync(now_ns(self.env))
        self.sched.sync()

    def stop(self) -> None:
        """The run stops now (``run.max_sim_s``): a fast-forward run's steps that had begun enter the ledger, as
        step-by-step simulation charges each step when it begins (FastForward.stop), and :meth:`sync`."""
        self.ff.stop()
        self.sync()

    def quiet(self) -> bool:
        """Whether nothing but an outside event can change the batch (extended by decode workers)."""
        return not self._aborts

    def load(self) -> int:
        return len(self.sched.running) + len(self.sched.waiting) + len(self.sched.inbox)

    def load_fraction(self) -> float:
        return self.load() / self.sched.limits.max_num_seqs

    def prefix_hit_tokens(self, req: Request) -> int:
        self.sync()
        return len(self.sched.kv.get_computed_blocks(req)) * self.sched.kv.block_size

    # ---------------------------------------------------------------------------------------- process
    def _run(self) -> ProcessGen:
        env = self.env
        sched = self.sched
        prepared = False  # before_schedule already ran at this step boundary
        while True:
            if self._aborts:
                self._apply_aborts()
                prepared = False  # (what they freed may start pulls that before_schedule held back)
            if self.before_schedule is not None and not prepared:
                self.before_schedule()
            prepared = False
            if not sched.has_work:
                yield from self.ff.idle()
                continue
            now = now_ns(env)
            out = sched.schedule(now)
            if out.empty:
                # A request preempted itself and the pass ended: the engine steps again at once (each such
                # pass preempts one more, so this ends); or all that was left were finished requests whose
                # output the schedule applied (SchedulerLimits.async_output).
                if out.preempted or not sched.has_work:
                    continue
                self.blocked = True
                yield from self.ff.idle()
                self.blocked = False
                continue
            run = None
            if self.fast_forward_steps > 1 and self.quiet():
                run = plan_decode_run(sched, out, now, self.prices, self.fast_forward_steps)
            if run is None:
                vector, step_ns = self.prices.step_cost(out.stats)
                extra = None
                if out.host_load_s:
                    extra = {"kv_host_load": out.host_load_s}
                    step_ns += to_ns(out.host_load_s)
                if now + step_ns > CLOCK_MAX_NS:
                    self._past_clock(now, step_ns, out.host_load_s)
                self.ledger.add(vector, step_ns, extra)
                self.decoding = out.stats.is_pure_decode
                yield StepEnd(env, step_ns, self.priority)
                self.decoding = False
                finished = sched.update(out, now_ns(env))
            else:
                finished, prepared = yield from self._fast_forward(run)
            for req in finished:
                self.on_done(req)

    def _fast_forward(self, run: PlannedRun) -> Generator[simpy.Event, Any, tuple[list[Request], bool]]:
        """Sleep through the planned steps (:class:`~twin.shell.fast_forward.FastForward`, segments of 8, 16,
        32 ... steps); an outside event cuts the run after the step in progress, unless the batch survives that
        step boundary (:meth:`_resumable`). Returns the requests that finished and whether ``before_schedule``
        already ran at the boundary where the run stopped."""
        ff = self.ff
        runs: Runs = [(self, run)]
        ff.cost_first(runs)
        ff.start(runs)
        while True:
            m = yield from ff.wait()
            if m == run.k or not self._resumable(run, m):
                break
            ff.go_on(m)
        ff.end(m)  # (cut short, the rest of the plan is dropped: the next schedule() starts afresh)
        return run.update_upto(m), m < run.k

    def _past_clock(self, now: int, step_ns: int, host_load_s: float) -> None:
        """Refuse a step (or fast-forwarded decode steps) ending past the clock's range: the scheduler takes
        nothing queued there, so the run stalled, or (a host tier at 1e-12 GB/s: one load of three blocks
        lasting 5.5e9 s) sampled the time series every interval through the gap, a hang. What makes a step
        that long is a setting or a spec, named where it is the host tier's bandwidth."""
        field = "kv_cache.host_bandwidth_GBps" if host_load_s * 1e9 * 2 > step_ns else "hardware"
        raise ConfigError(field, f"worker {self.wid}: a step of {step_ns / 1e9:.4g} s starting at {now / 1e9:.4g} s "
                                 f"(host KV loads {host_load_s:.4g} s of it) would end past {CLOCK_RANGE}; a "
                                 f"bandwidth or rate that small cannot be simulated")

    def _resumable(self, run: PlannedRun, m: int) -> bool:
        """At the boundary after step ``m`` of a run woken by an outside event, do what step-by-step
        simulation does there before scheduling (``before_schedule``: a decode worker starts its pulls)
        and tell whether the next ``schedule`` would give the same pure-decode batch, with at least one
        step safe from preemption; if so, the run goes on (shortened to the steps still safe)."""
        run.update_upto(m)
        if self.before_schedule is not None:
            self.before_schedule()
        sched = self.sched
        # (Requests compare by identity, so list equality is "the same requests in the same order".)
        if not self.quiet() or len(sched.waiting) or sched.running != run.reqs:
            return False
        further = min(run.safe_further(run.k - m), sched.decodes_before_recv())
        if further < 1:
            return False
        run.truncate(m + further)
        return True

    def _book_run(self, runs: Runs, m: int) -> None:
        """The run stops after step ``m``: its steps enter the ledger."""
        ((_, run),) = runs
        self.ledger.add_steps(run.terms[:m], run.ns[:m])
