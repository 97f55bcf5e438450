"""Field validators shared by the config sections (:mod:`twin.config`) and the pluggable parts' parameters:
finite positive numbers, fractions, choices, names of ``hardware`` catalogue entries, and the ranges the
simulated clock (integer nanoseconds) and the block pool (32-bit counts) can hold, so a value out of range
fails at load time naming its field.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from twin.config_codec import INT64_MAX
from twin.core.clock import CLOCK_MAX_NS


def positive(inst: Any, attr: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{attr.name} must be a finite number > 0, got {value!r}")


MAX_POOL_BLOCKS = 2_000_000_000
"""The most blocks one worker's pool holds (twin/core/_blockpool.pyx keeps a 32-bit count per block)."""


def pool_blocks(inst: Any, attr: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
    """A block count a pool can hold, refused here with the field's name rather than deep in the pool."""
    positive(inst, attr, value)
    if value is not None and value > MAX_POOL_BLOCKS:
        raise ValueError(f"{attr.name} must be at most {MAX_POOL_BLOCKS:,} (the blocks one worker's pool holds), "
                         f"got {value!r}")


def non_negative(inst: Any, attr: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
    if value is not None and not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{attr.name} must be a finite number >= 0, got {value!r}")


def one_tick(inst: Any, attr: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
    """A period the simulated clock (integer nanoseconds) steps by: one rounding to 0 ns never advances it."""
    if value is not None and round(value * 1e9) < 1:
        raise ValueError(f"{attr.name} must be at least 1 ns (the simulated clock's resolution), "
                         f"got {value!r}")


CLOCK_MAX_S = CLOCK_MAX_NS / 1e9
"""The longest time the simulated clock holds, in seconds (about 146 years): it counts nanoseconds in 64-bit
integers, and a time, a sum of times or a gap past this leaves that range (a traceback naming nothing)."""


def on_clock(inst: Any, attr: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
    """A time in seconds that the simulated clock can hold (<= CLOCK_MAX_S)."""
    if value is not None and value > CLOCK_MAX_S:
        raise ValueError(f"{attr.name} must be at most {CLOCK_MAX_S:.4g} s (the simulated clock counts "
                         f"nanoseconds in 64 bits), got {value!r}")


def rate_on_clock(inst: Any, attr: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
    """A rate per second whose interval the simulated clock can hold (1 / value <= CLOCK_MAX_S)."""
    if value is not None and 0 < value < 1 / CLOCK_MAX_S:
        raise ValueError(f"{attr.name} must be at least {1 / CLOCK_MAX_S:.4g} per s (one interval at most "
                         f"{CLOCK_MAX_S:.4g} s, the simulated clock's range), got {value!r}")


def bytes_gib(inst: Any, attr: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
    """A size in GiB whose bytes fit 64-bit integers."""
    if value is not None and value * 2**30 > INT64_MAX:
        raise ValueError(f"{attr.name} must be at most {INT64_MAX / 2**30:.4g} GiB (its bytes are counted in "
                         f"64 bits), got {value!r}")


def fraction(inst: Any, attr: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
    if value is not None and not 0 < value <= 1:
        raise ValueError(f"{attr.name} must be in (0, 1], got {value!r}")


def one_of(*choices: str) -> Any:
    def check(inst: Any, attr: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
        if value not in choices:
            raise ValueError(f"{attr.name} must be one of {list(choices)}, got {value!r}")

    return check


def known_name(kind: str, lister: str) -> Any:
    """Validator: the value names an entry of a ``hardware`` catalogue (GPU, model, engine)."""

    def check(inst: Any, attr: attrs.Attribute, value: str) -> None:  # type: ignore[type-arg]
        import hardware

        # Loading the one entry (cached) accepts every listed name and alias; listing them all would load
        # every shipped model, so the list is only built for the error.
        try:
            getattr(hardware, f"load_{kind}")(value)
        except hardware.UnknownName:
            names = getattr(hardware, lister)()
            raise ValueError(f"{attr.name} names no known {kind}: {value!r}; expected one of {names}") from None
        except (ValueError, NotImplementedError) as exc:
            # A known name whose spec file is wrong, or a model type the hardware model does not cover: its
            # own message (file, line, field), not "unknown name" for a name the list shows.
            raise ValueError(f"{attr.name} {value!r} cannot be loaded: {exc}") from None

    return check
