"""Errors the twin raises on purpose: each names what is wrong and where."""

from __future__ import annotations


class TwinError(Exception):
    """Base class of the twin's own errors."""


class ConfigError(TwinError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or impossible; names the dotted path."""

    def __init__(self, path: str, message: str, source: str | None = None) -> None:
        self.path = path
        self.message = message
        self.source = source
        # The arguments themselves, so type(exc)(*exc.args) rebuilds it: SimPy copies an exception that way
        # when it passes a failed process on to the one waiting for it (a TypeError before).
        super().__init__(path, message, source)

    def __str__(self) -> str:
        where = f"{self.source}: " if self.source else ""
        return f"{where}{self.path}: {self.message}" if self.path else f"{where}{self.message}"


class StallError(TwinError, RuntimeError):
    """The simulation can make no more progress while requests are still pending."""


class InvariantError(TwinError, AssertionError):
    """An internal invariant (budget, block accounting, lifecycle) was violated: a bug, never user error."""
