"""Converters from public trace and trajectory formats to session scripts, by name.

Each converter takes the input paths and keyword options and returns ``list[Session]``; malformed input
raises :class:`workloads.errors.WorkloadFormatError` naming the file, the position and the expectation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workloads.convert.azure import convert_azure
from workloads.convert.mini_swe_agent import convert_mini_swe_agent
from workloads.convert.mooncake import convert_mooncake
from workloads.convert.sharegpt import convert_lmbenchmark_sharegpt
from workloads.convert.tau_bench import convert_tau_bench
from workloads.sessions import Session

Converter = Callable[..., list[Session]]

CONVERTERS: dict[str, Converter] = {
    "mini-swe-agent": convert_mini_swe_agent,
    "tau-bench": convert_tau_bench,
    "mooncake": convert_mooncake,
    "azure": convert_azure,
    "lmbenchmark-sharegpt": convert_lmbenchmark_sharegpt,
}
"""Format name -> converter(inputs, **options)."""


def register_converter(name: str, converter: Converter) -> None:
    """Add a converter from user code; names are unique."""
    if name in CONVERTERS:
        raise ValueError(f"converter {name!r} is already registered")
    CONVERTERS[name] = converter


def convert(name: str, inputs: list[Any], **options: Any) -> list[Session]:
    """Run the converter registered under ``name``."""
    try:
        converter = CONVERTERS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; expected one of {sorted(CONVERTERS)}") from None
    return converter(inputs, **options)


__all__ = [
    "CONVERTERS",
    "Converter",
    "convert",
    "convert_azure",
    "convert_lmbenchmark_sharegpt",
    "convert_mini_swe_agent",
    "convert_mooncake",
    "convert_tau_bench",
    "register_converter",
]
