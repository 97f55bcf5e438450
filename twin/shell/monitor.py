"""The monitor: samples every gauge on a fixed simulated interval, and notices a stalled simulation."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence, Sized

import numpy as np
import simpy

from twin.shell.sim import ProcessGen, next_live_event_ns
from twin.shell.worker import Worker


def _pull_queue(worker: Worker) -> Sized | None:
    """A disaggregated decode worker's queue of staged requests waiting for their KV (None elsewhere)."""
    from twin.shell.disagg import DecodeWorker

    return worker.pull_queue if isinstance(worker, DecodeWorker) else None


class Monitor:
    """Gauges per worker (waiting, running, KV usage, cached blocks; host-tier usage where the worker has a
    host tier, the pull queue of a disaggregated decode worker) and totals (tokens/s, hit rate).

    At each tick, if no other event that can change anything is scheduled, nothing can ever happen again:
    ``on_idle`` is called (the runner raises a stall error there if work is pending) and sampling stops.

    A still stretch (no worker in a decode step or a fast-forwarded run of them, and the row just written
    repeats the one before but for its time) is written as its first and last rows: the monitor sleeps to
    the last tick before the next scheduled event, since nothing changes a gauge before that event. The rows
    left out are copies but for their time; a trace whose times start far from zero (epoch seconds) would
    otherwise tick through the whole gap, and so would one prompt step lasting years (a host tier at
    1e-12 GB/s). Decode steps are left out because a fast-forwarded run changes the gauges at its step
    boundaries without an event: step by step or fast-forwarded, they are sampled at every tick alike.
    """

    def __init__(self, env: simpy.Environment, workers: Sequence[Worker], interval_ns: int,
                 on_idle: Callable[[], None], extra: Callable[[], dict[str, float]] | None = None, *,
                 names: Mapping[int, str]) -> None:
        self.env = env
        self.workers = workers
        self.names = [names[w.wid] for w in workers]
        """Each worker's column prefix (twin.runner.worker_names: prefill0, decode0, worker0 ...)."""
        self.interval_ns = interval_ns
        self.on_idle = on_idle
        self.extra = extra
        """System-specific gauges (staged KV, pull queues, links), sampled with the others."""
        self._extra_names: list[str] = list(extra()) if extra is not None else []
        self._pull_queues = [_pull_queue(w) for w in workers]
        """Per worker: its queue of staged requests waiting for their KV (decode workers), or None."""
        self.rows: list[tuple[float, ...]] = []
        self._marks: list[tuple[int, int, int, int]] = []
        """Per row: its time (ns) and the output, admitted prompt and cached token counts then."""
        self.on_sample: Callable[[], None] | None = None
        """Called after each periodic sample (a progress bar); it must only read the simulation."""
        self.process = env.process(self._run())

    def columns(self) -> list[str]:
        cols = ["time_s", "waiting", "running", "kv_usage", "output_tokens_per_s", "prefix_hit_rate",
                "preemptions"]
        for w, name, queue in zip(self.workers, self.names, self._pull_queues):
            cols += [f"{name}_waiting", f"{name}_running", f"{name}_kv_usage", f"{name}_kv_cached_blocks",
                     f"{name}_host_blocks"]
            if w.sched.kv.host is not None:
                cols.append(f"{name}_host_usage")
            if queue is not None:
                cols.append(f"{name}_pull_queue")
        return cols + self._extra_names

    def sample(self) -> None:
        now_s = self.env.now / 1e9
        waiting = running = tokens = prompt = cached = preempt = 0
        used = total = 0
        per_worker: list[float] = []
        for w, queue in zip(self.workers, self._pull_queues):
            w.sync()
            s = w.sched
            nw, nr = len(s.waiting), len(s.running)
            waiting += nw
            running += nr
            tokens += s.output_tokens
            prompt += s.prompt_tokens_admitted
            cached += s.cached_tokens_admitted
            preempt += s.preemptions
            pool = s.kv.pool
            used += pool.num_used
            total += pool.num_blocks
            host = s.kv.host
            per_worker += [nw, nr, pool.num_used / pool.num_blocks, pool.num_cached,
                           len(host.keys) if host is not None else 0]
            if host is not None:
                per_worker.append(len(host.keys) / host.capacity_blocks)
            if queue is not None:
                per_worker.append(len(queue))
        now = int(self.env.now)
        if self._marks and self._marks[-1][0] == now:  # the run's last sample, on a tick: it replaces that row
            self._marks.pop()
            self.rows.pop()
        # Rates over the time since the previous row (an interval, or less for the run's last sample).
        rate, hit = 0.0, float("nan")
        if self._marks:
            t0, tokens0, prompt0, cached0 = self._marks[-1]
            rate = (tokens - tokens0) / ((now - t0) / 1e9)
            d_prompt = prompt - prompt0
            hit = (cached - cached0) / d_prompt if d_prompt else float("nan")
        else:
            hit = cached / prompt if prompt else float("nan")
        self._marks.append((now, tokens, prompt, cached))
        extra = list(self.extra().values()) if self.extra is not None else []
        self.rows.append((now_s, waiting, running, used / total, rate, hit, preempt, *per_worker, *extra))

    def _still(self) -> bool:
        """Whether the last row repeats the one before but for its time, and only an event can change that."""
        marks = self._marks
        if len(marks) < 2 or marks[-1][1:] != marks[-2][1:]:
            return False
        return all(w.run is None and not w.decoding for w in self.workers)

    def _run(self) -> ProcessGen:
        env = self.env
        step = self.interval_ns
        while True:
            self.sample()
            if self.on_sample is not None:
                self.on_sample()
            nxt = next_live_event_ns(env)
            if nxt is None:  # nothing else scheduled that can change anything: the simulation can never move
                self.on_idle()
                return
            wait = step
            if self._still():  # sleep to the last tick strictly before the next event
                ticks = (nxt - 1 - int(env.now)) // step
                wait = max(ticks, 1) * step
            yield env.timeout(wait)

    def table(self) -> dict[str, np.ndarray]:
        cols = self.columns()
        data = np.array(self.rows, dtype=np.float64).reshape(len(self.rows), len(cols))
        return {c: data[:, i] for i, c in enumerate(cols)}
