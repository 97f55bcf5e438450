"""The simulated clock's units, apart from SimPy: integer nanoseconds and the latest instant they hold.

The state machines (scheduler, fast-forward, config checks) count time in these units without running a
SimPy environment; :mod:`twin.shell.sim` builds its SimPy helpers on them.
"""

from __future__ import annotations

NS = 1_000_000_000

CLOCK_MAX_NS = 1 << 62
"""The latest instant the simulated clock holds (about 146 years): it counts nanoseconds in 64-bit integers,
and the scheduler's "no cutoff" and fast-forward's "never" sit here."""

CLOCK_RANGE = f"the simulated clock's range (at most {CLOCK_MAX_NS / 1e9:.4g} s: it counts nanoseconds in 64 bits)"
"""How errors name that limit."""


def to_ns(seconds: float) -> int:
    return int(round(seconds * NS))
