"""Build, run and collect one simulation (desmod-style lifecycle), and the public ``run`` function."""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import simpy

from twin.shell.clients import SessionDriver
from twin.shell.sim import CLOCK_MAX_NS, NS, now_ns, to_ns
from twin.config import TwinConfig, blame, load_config
from twin.core.errors import ConfigError, InvariantError, StallError
from twin.core.request import Request, Status
from twin.request_log import RequestLog
from twin.results import Results, SpilledGaps, summarize
from twin.system import resolve
from twin.core.tokens import KeyTable, SourceTable
from twin.whatif import hardware_whatif
from workloads.generators import OpenLoopSessions
from workloads.sessions import Session


def _keys_recur(sessions: Sequence[Session]) -> bool:
    """Whether some session makes more than one call, so its keys come back in the prefix caches.

    Numbering the keys (:class:`~twin.core.tokens.KeyTable`) costs a lookup in a run-wide table per new key
    and pays off in the workers' prefix-cache dictionaries; with one call per session (request traces)
    each key is cached and evicted about once, and the table costs more than it saves.
    """
    if isinstance(sessions, OpenLoopSessions):   # one call each, by construction (and made only when read)
        return False
    return any(len(s.calls) > 1 or any(c.subagents for c in s.calls) for s in sessions)


_RUN_GC_THRESHOLD = (100_000, 50, 100)


@contextmanager
def _roomy_gc() -> Iterator[None]:
    """Collect cycles less often while a run goes (the thresholds are restored after it).

    The event loop allocates many short-lived objects (events, per-step lists) while the requests and
    their block keys live long; with CPython's default thresholds (700, 10, 10) the collector rescans
    those long-lived objects hundreds of times, 5-8 % of a run's time, and a full collection while the
    results are gathered costs as much again on long runs. A larger young generation collects the same
    garbage far less often. Results never depend on when the collector runs.
    """
    saved = gc.get_threshold()
    gc.set_threshold(*_RUN_GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


class Simulation:
    """One run of one config: ``Simulation(config).run()`` returns :class:`~twin.results.Results`."""

    def __init__(self, config: TwinConfig, env: simpy.Environment | None = None, *,
                 keep_requests: bool = False) -> None:
        """``keep_requests``: keep every request object in ``driver.requests`` after it ends, for inspection
        (tests, notebooks); a run otherwise keeps only each ended request's row (:class:`RequestLog`)."""
        import twin.builtin_kinds  # noqa: F401

        self.config = resolve(config)
        cfg = self.config
        self.env = env if env is not None else simpy.Environment()
        self.rng = np.random.default_rng(cfg.run.seed)
        self.sources = SourceTable()
        self.system = cfg.system.build(self.env, cfg, self._on_done)  # type: ignore[attr-defined]
        self.workers = self.system.workers
        plan = cfg.workload.build(self.rng)  # type: ignore[attr-defined]
        assert cfg.kv_cache.block_size is not None
        stop_ns = to_ns(cfg.run.duration_s) if cfg.run.duration_s is not None else None
        self.driver = SessionDriver(
            self.env, plan.sessions, _start_times_ns(plan.start_s), self._submit,
            block_size=cfg.kv_cache.block_size, sources=self.sources,
            keys=KeyTable() if _keys_recur(plan.sessions) else None,
            wait_scale=plan.wait_scale, max_concurrent=plan.max_concurrent, stop_ns=stop_ns,
            warmup_s=cfg.run.warmup_s, max_model_len=self.workers[0].sched.limits.max_model_len,
            keep_requests=keep_requests,
        )
        self.log = RequestLog()
        self.spilled_gaps = SpilledGaps()
        for w in self.workers:   # (a long run's distinct inter-token gaps go to disk as they pile up)
            w.sched.gaps.spill = self.spilled_gaps.add
        self._token_times: dict[int, list[float]] | None = {} if cfg.metrics.record_token_times else None
        from twin.shell.monitor import Monitor

        self.monitor = Monitor(self.env, self.workers, to_ns(cfg.metrics.sample_interval_s), self._on_idle,
                               lambda: {**self.driver.gauges(), **self.system.gauges()},
                               names=worker_names(self.system))
        self.wall_s = 0.0

    # ------------------------------------------------------------------------------------ wiring
    def _submit(self, req: Request) -> None:
        self.system.submit(req)

    def _on_done(self, req: Request) -> None:
        self._ended(req)
        if req.on_finish is not None:
            req.on_finish(req)

    def _ended(self, req: Request) -> None:
        """``req`` completed or failed: its row is written and the driver lets go of it."""
        self.driver.ended(req)
        self.log.add(req)
        if self._token_times is not None:
            self._token_times[req.id] = [t / 1e9 for t in (req.token_times_ns or [])]

    def _on_idle(self) -> None:
        pending = self.driver.pending_requests
        if pending and not self.driver.all_done.triggered:
            raise StallError(self._stall_report(pending))

    def _stall_report(self, pending: list[Request]) -> str:
        lines = [f"simulation stalled at t={self.env.now / 1e9:.6f}s with {len(pending)} request(s) pending:"]
        if self.env.now > CLOCK_MAX_NS:
            lines[0] += (f" the clock is past its range ({CLOCK_MAX_NS / 1e9:.4g} s, nanoseconds in 64 bits), where "
                         f"the scheduler takes nothing queued")
        for w in self.workers:
            s = w.sched
            lines.append(f"  worker {w.wid}: {len(s.waiting)} waiting, {len(s.running)} running, "
                         f"{s.kv.pool.num_free}/{s.kv.num_blocks} blocks free, blocked={w.blocked}")
        lines += [f"  {r!r}" for r in pending[:20]]
        if len(pending) > 20:
            lines.append(f"  ... and {len(pending) - 20} more")
        return "\n".join(lines)

    # --------------------------------------------------------------------------------------- run
    def run(self, *, progress: bool = False) -> Results:
        """Run to the end; ``progress`` shows a bar on stderr (:class:`~twin.progress.RunProgress`), which
        leaves the results as they are without it."""
        with _roomy_gc():
            return self._run(progress)

    def _run(self, progress: bool = False) -> Results:
        cfg = self.config
        start = time.perf_counter()
        until: simpy.Event = self.driver.all_done
        if cfg.run.max_sim_s is not None:
            until = simpy.AnyOf(self.env, [until, self.env.timeout(to_ns(cfg.run.max_sim_s))])
        bar = None
        if progress:
            from twin.progress import RunProgress

            bar = RunProgress(self)
            self.monitor.on_sample = bar.update
        try:
            self.env.run(until=until)
        except RuntimeError as exc:  # SimPy: no events left but the until-event never fired
            if "No scheduled events left" in str(exc):
                raise StallError(self._stall_report(self.driver.pending_requests)) from None
            raise
        finally:
            if bar is not None:
                self.monitor.on_sample = None
                bar.close()
        self.wall_s = time.perf_counter() - start
        for w in self.workers:
            w.stop()
        for req in list(self.driver.live.values()):  # only after max_sim_s
            if not req.is_done:
                req.fail_reason = f"time limit: still {req.status.name.lower()} at run.max_sim_s"
                req.status = Status.FAILED
                req.finish_ns = now_ns(self.env)  # (it ended there, as an abort or a refusal ends when it happens)
            self._ended(req)
        self.monitor.sample()
        if cfg.run.check_invariants:
            self.check_end_state()
        return self.collect()

    def check_end_state(self) -> None:
        """Every request ended; with nothing running, every block is free or cached (checked, not assumed)."""
        if self.driver.live:
            raise InvariantError(f"{next(iter(self.driver.live.values()))!r} neither completed nor failed")
        if self.log.failed_without_reason:
            raise InvariantError(f"{self.log.failed_without_reason[0]} failed without a reason")
        if self.driver.all_done.triggered:
            for w in self.workers:
                if w.sched.running or w.sched.reserved_blocks:
                    raise InvariantError(f"worker {w.wid}: {len(w.sched.running)} requests still running, "
                                         f"{w.sched.reserved_blocks} blocks reserved for them after the run")
                pool = w.sched.kv.pool
                pool.check()
                if pool.num_used:
                    raise InvariantError(f"worker {w.wid}: {pool.num_used} blocks still referenced after the run")

    # ------------------------------------------------------------------------------------ collect
    def collect(self) -> Results:
        cfg = self.config
        table = self.log.close()
        histograms = [w.sched.gap_arrays() for w in self.workers]
        itl = (np.concatenate([gaps for gaps, _ in histograms]), np.concatenate([n for _, n in histograms]))
        summary = summarize(table, itl, warmup_s=cfg.run.warmup_s, slo_ttft_s=cfg.metrics.slo_ttft_s,
                            slo_tpot_s=cfg.metrics.slo_tpot_s, itl_spilled=self.spilled_gaps)
        # A session still running when run.max_sim_s stopped the run (a request failed there, or in a wait)
        # ended neither way: counted apart, so started = finished + failed + unfinished (it was left out).
        def closed(counts: dict[str, int]) -> dict[str, int]:
            return {**counts, "unfinished": counts["started"] - counts["finished"] - counts["failed"]}

        summary["sessions"] = {**closed(self.driver.sessions), "subagents": closed(self.driver.subagents)}
        summary.update(self.system.summary())
        summary["kv_capacity"] = kv_capacity(self.system, cfg.kv_cache.block_size or 1)
        summary["sim"] = {"simulated_s": self.env.now / 1e9, "wall_s": self.wall_s,
                          "steps": sum(w.ledger.steps for w in self.workers)}
        ledger: dict[str, Any] = {}
        names = worker_names(self.system)
        for w in self.workers:
            ledger[names[w.wid]] = {"steps": w.ledger.steps, "busy_s": w.ledger.busy_ns / 1e9,
                                       "terms_s": dict(w.ledger.terms_s)}
        whatif = hardware_whatif(cfg, self.workers, names)
        if whatif is not None:
            ledger["hardware_whatif"] = whatif
        token_times = None
        if self._token_times is not None:
            token_times = {rid: self._token_times[rid] for rid in sorted(self._token_times)}
        return Results(requests=table, summary=summary, timeseries=self.monitor.table(), ledger=ledger,
                       config=cfg.to_dict(), token_times=token_times)


def _start_times_ns(start_s: Sequence[float]) -> np.ndarray | list[int]:
    """Sessions' start times in integer nanoseconds, as :func:`to_ns` rounds each (an array: a long run
    plans millions). Times outside 64 bits, or not finite, go through :func:`to_ns` one by one, which
    refuses them as it always did."""
    ns = np.asarray(start_s, dtype=np.float64) * NS
    if len(ns) and not (np.isfinite(ns).all() and np.abs(ns).max() < 2.0**62):
        return [to_ns(float(t)) for t in start_s]
    return np.rint(ns).astype(np.int64)   # (round half to even, as round(), on the same products)


def worker_names(system: Any) -> dict[int, str]:
    """Each worker's name in the outputs (ledger, KV capacity, time-series columns, plots): ``prefill0``,
    ``decode0`` ... by role in a disaggregated system, numbered within the role as Dynamo's and SGLang's
    launchers name their servers; ``worker0`` ... for colocated engines and attention-DP ranks."""
    names = {w.wid: f"{role}{i}" for role in ("prefill", "decode") for i, w in enumerate(getattr(system, role, []))}
    return {w.wid: names.get(w.wid, f"worker{w.wid}") for w in system.workers}


def kv_capacity(system: Any, block_size: int) -> list[dict[str, Any]]:
    """Each worker's KV pool, as the engines print it at start-up (vLLM's "# GPU blocks"): blocks, the tokens
    they hold and their GiB on each of the worker's GPUs, with the worker's role (prefill, decode or
    colocated)."""
    roles = {w.wid: role for role in ("prefill", "decode") for w in getattr(system, role, [])}
    names = worker_names(system)
    out = []
    for w in system.workers:
        blocks = w.sched.kv.num_blocks
        per_block = w.prices.cost_model.dep.bytes_per_block(block_size)
        out.append({"worker": names[w.wid], "role": roles.get(w.wid, "colocated"), "blocks": blocks,
                    "tokens": blocks * block_size, "gib_per_gpu": blocks * per_block / 2**30})
    return out


def build(config: TwinConfig, source: str | Path | None = None, overrides: Sequence[str] = ()) -> Simulation:
    """``Simulation(config)``, where a value that only the built deployment refuses names the config file
    ``source`` or the override that set it, as :func:`~twin.config.load_config`'s errors do."""
    try:
        return Simulation(config)
    except ConfigError as exc:
        raise blame(exc, None if source is None else str(source), overrides) from None


def run(config: TwinConfig | dict[str, Any] | str | Path | None = None, *, overrides: tuple[str, ...] = (),
        out: str | Path | None = None, progress: bool = False) -> Results:
    """Run one simulation from a config object, a mapping, a YAML path or nothing (the defaults);
    ``progress`` shows a bar on stderr."""
    source = config if isinstance(config, (str, Path)) else None
    if not isinstance(config, TwinConfig):
        config = load_config(config, overrides)
    elif overrides:
        config = load_config(config.to_dict(), overrides)
    results = build(config, source, overrides).run(progress=progress)
    if out is not None:
        results.write(out)
    return results
