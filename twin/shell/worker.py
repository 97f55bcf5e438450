"""The worker process: schedule -> one timeout for the step's cost -> update, sleeping when idle.

A step ends with an event of lower priority than every ordinary event at the same instant (and ordered
by worker id among step ends), so a request that arrives exactly when a step ends is seen by the next
``schedule`` call whatever order the events were created in. Pure-decode stretches are fast-forwarded
(:mod:`twin.core.fastforward`): one event for k steps, woken early by an arrival, with identical results.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Callable, Generator

import simpy

from twin.core.fastforward import PlannedRun, plan_decode_run
from twin.core.prices import Ledger, StepPrices
from twin.core.request import Request
from twin.core.scheduler import Scheduler
from twin.core.errors import ConfigError
from twin.shell.sim import CLOCK_MAX_NS, CLOCK_RANGE, LATE, ProcessGen, StepEnd, disarm, fire, now_ns, slot_passed, to_ns


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
        self.decoding = False
        """True during a pure-decode step run on its own (not fast-forwarded): the monitor treats it as it
        treats a fast-forward run (:attr:`run`), which step-by-step simulation runs as such steps."""
        self._wake: simpy.Event | None = None
        self._cut: simpy.Event | None = None
        """The end of the step in progress, when an outside event cut into a fast-forwarded run."""
        self._armed: simpy.Event | None = None
        """The segment end the fast-forwarded run in progress waits for."""
        self._costed = 0
        """Steps of that run costed so far; the armed segment end is the end of the last of them."""
        self._segment = 0
        """Steps costed in the run's latest segment (doubled for the next one)."""
        self._aborts: list[tuple[Request, str]] = []
        """Requests to drop at the next step boundary (:meth:`abort`), with their reasons."""
        self.process = env.process(self._run())

    # ------------------------------------------------------------------------------- router interface
    def submit(self, req: Request) -> None:
        req.worker = self.wid
        now = now_ns(self.env)
        if self.run is not None and self._step_passed(self.run, now):
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
        wake = self._wake
        if wake is None or wake.triggered or self._cut is not None:
            return
        run = self.run
        if run is None:
            wake.succeed()
            return
        # The worker resumes at the end of the step in progress (the first step ending at or after now; ends
        # increase), in its own end-of-step slot: after every event of that instant. A step ending now is
        # in progress only until that slot has passed (_step_passed); then the run stops at the end of the next.
        t = now_ns(self.env)
        m = self._steps_done(run, t) + 1
        cut = self._cut = StepEnd(self.env, run.ends[m - 1] - t, self.priority)
        cut.callbacks.append(lambda _: fire(wake, m))  # type: ignore[union-attr]

    def _steps_done(self, run: PlannedRun, t: int) -> int:
        """Steps of the fast-forwarded ``run`` that step-by-step simulation has applied when an event at ``t``
        is processed: those ending before ``t``, and one ending at ``t`` once its end-of-step slot has passed."""
        return bisect_left(run.ends, t) + self._step_passed(run, t)

    def _step_passed(self, run: PlannedRun, t: int) -> bool:
        """Whether a step of the fast-forwarded ``run`` ends at ``t`` and this worker's end-of-step slot of the
        instant has passed (the event being processed came after it: another worker's step end, or what one
        triggered): step by step, that step was applied and the next one formed before this event."""
        if not slot_passed(self.env, self.priority):
            return False
        i = bisect_left(run.ends, t)
        return i < len(run.ends) and run.ends[i] == t

    def sync(self) -> None:
        """Bring a fast-forwarded worker's state to what step-by-step simulation shows now (for readers)."""
        if self.run is not None:
            self.run.sync(now_ns(self.env))
        self.sched.sync()

    def stop(self) -> None:
        """The run stops now (``run.max_sim_s``): :meth:`sync`, and a fast-forward run's steps that had begun
        enter the ledger, as step-by-step simulation charges each step when it begins."""
        self.sync()
        run = self.run
        if run is not None:
            self._end_run(run, run.scheduled)

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
                yield from self._sleep()
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
                yield from self._sleep()
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
        """Sleep through the planned steps; an outside event cuts the run after the step in progress
        (:meth:`wake`), unless the batch survives that step boundary (:meth:`_resumable`).

        Steps are costed in segments that double while the run survives (8, 16, 32 ...), so a run cut
        early by an arrival has not paid for the cost of steps it never ran; the end of one segment costs
        the next (:meth:`_on_segment_end`) and only the end of the last one resumes the worker. Returns the
        requests that finished and whether ``before_schedule`` already ran at the boundary where the run
        stopped.
        """
        env = self.env
        self.run = run
        self._segment = 8
        self._cost_segment(run, now_ns(env))
        while True:
            self._wake = env.event()
            # None: the run's last step ended; else an outside event cut the run and its step m just ended.
            m = yield self._wake
            if m is None:
                break
            self._cut = None
            if m == run.k:
                break
            if not self._resumable(run, m):
                # Cut short, the rest of the plan is dropped and the next schedule() starts afresh.
                self._end_run(run, m)
                return run.update_upto(m), True
            if run.k < self._costed:  # fewer steps are safe now: the segment's end event is past the run
                self._costed = run.k
                self._segment_end(run.ends[run.k - 1] - now_ns(env))
        self._wake = None
        self._end_run(run, run.k)
        return run.update_upto(run.k), False

    def _cost_segment(self, run: PlannedRun, now: int) -> None:
        """Cost the run's next ``_segment`` steps (at most to its end) and arm the end of the last one."""
        self._costed = run.extend(len(run.ends) + self._segment)
        self._segment_end(run.ends[self._costed - 1] - now)

    def _segment_end(self, delay_ns: int) -> None:
        """Arm the end of a run's costed segment, handled by a callback (instead of waiting on ``end |
        wake``: a condition event per segment costs more than the segment's steps)."""
        self._disarm()
        now = now_ns(self.env)
        if now + delay_ns > CLOCK_MAX_NS:
            self._past_clock(now, delay_ns, 0.0)
        end = StepEnd(self.env, delay_ns, self.priority)
        end.callbacks.append(self._on_segment_end)  # type: ignore[union-attr]
        self._armed = end

    def _past_clock(self, now: int, step_ns: int, host_load_s: float) -> None:
        """Refuse a step (or fast-forwarded decode steps) ending past the clock's range: the scheduler takes
        nothing queued there, so the run stalled, or (a host tier at 1e-12 GB/s: one load of three blocks
        lasting 5.5e9 s) sampled the time series every interval through the gap, a hang. What makes a step
        that long is a setting or a spec, named where it is the host tier's bandwidth."""
        field = "kv_cache.host_bandwidth_GBps" if host_load_s * 1e9 * 2 > step_ns else "hardware"
        raise ConfigError(field, f"worker {self.wid}: a step of {step_ns / 1e9:.4g} s starting at {now / 1e9:.4g} s "
                                 f"(host KV loads {host_load_s:.4g} s of it) would end past {CLOCK_RANGE}; a "
                                 f"bandwidth or rate that small cannot be simulated")

    def _disarm(self) -> None:
        """Drop the armed segment end (:func:`~twin.shell.sim.disarm`): one still queued (a run shortened or cut
        before it) does nothing when processed, as step-by-step simulation has no event there; and the
        monitor, which sleeps through still stretches to the next event, skips it."""
        disarm(self._armed)
        self._armed = None

    def _on_segment_end(self, end: simpy.Event) -> None:
        """A segment ended: cost the next, twice as long, or after the run's last step resume the worker.

        The worker resumes inside this callback (:func:`~twin.shell.sim.fire`), as it would in a wake event
        triggered here: nothing else runs between the end and that event. Costing the next segment here
        instead of in the worker changes nothing it would see, for the same reason. An end that a shortened
        or cut run left behind does nothing, and so does the last end while a cut is pending (the worker
        resumes at the cut, the same instant)."""
        if end is not self._armed:
            return
        run = self.run
        assert run is not None
        if self._costed < run.k:
            self._segment *= 2
            self._cost_segment(run, now_ns(self.env))
        elif self._cut is None:
            assert self._wake is not None
            fire(self._wake, None)

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

    def _end_run(self, run: PlannedRun, m: int) -> None:
        """The run stops after step ``m``: its steps enter the ledger."""
        self.run = None
        self._disarm()
        self.ledger.add_steps(run.terms[:m], run.ns[:m])

    def _sleep(self) -> ProcessGen:
        self._wake = self.env.event()
        yield self._wake
        self._wake = None
