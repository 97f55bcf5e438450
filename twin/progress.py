"""Progress bars (tqdm, on stderr) for long runs and sweeps; they only read the simulation, never steer it.

The run's bar is refreshed from the monitor's periodic sample (:attr:`twin.shell.monitor.Monitor.on_sample`), an
event the run has anyway, throttled by wall clock: no SimPy event is added or moved, so results are the same
byte for byte with the bar on or off.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from twin.runner import Simulation

REFRESH_S = 0.25
"""Wall seconds between two refreshes of a run's bar (the monitor may sample thousands of times a second)."""


def on_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (stderr by default) is a terminal: bars are shown there and nowhere else (logs,
    pipes, CI)."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # (a replaced or closed stream)
        return False


def _bar(**kwargs: Any) -> Any:
    from tqdm import tqdm

    return tqdm(file=sys.stderr, dynamic_ncols=True, **kwargs)


class RunProgress:
    """One run's bar: sessions ended of those planned (its ETA), with the simulated time and the requests
    done of those submitted so far."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.max_sim_s = sim.config.run.max_sim_s
        # Refreshed here, not by tqdm's own clock; the ETA from the mean rate (smoothing 0). The summary
        # printed after the run replaces the bar (leave=False).
        self.bar = _bar(total=sim.driver.planned_sessions, desc="twin run", unit="session", smoothing=0,
                        leave=False)
        self._next = 0.0

    def update(self) -> None:
        """Refresh the bar, at most every :data:`REFRESH_S` wall seconds."""
        now = time.monotonic()
        if now >= self._next:
            self._next = now + REFRESH_S
            self.refresh()

    def refresh(self) -> None:
        driver = self.sim.driver
        counts = driver.sessions
        ended = counts["finished"] + counts["failed"] + counts["skipped"]
        submitted = driver.num_requests
        done = self.sim.log.count
        sim_s = self.sim.env.now / 1e9
        limit = f"/{self.max_sim_s:g}" if self.max_sim_s is not None else ""
        self.bar.n = ended
        self.bar.set_postfix_str(f"sim {sim_s:.1f}{limit} s, requests {done}/{submitted}", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


class SweepProgress:
    """A sweep's bar: points done of those to run (its ETA), and how many the journal gave back."""

    def __init__(self, total: int, reused: int) -> None:
        self.bar = _bar(total=total, desc="twin sweep", unit="point", leave=True)
        if reused:
            self.bar.set_postfix_str(f"{reused} reused", refresh=False)

    def done(self) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
