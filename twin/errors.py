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
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{path}: {message}" if path else f"{where}{message}")


class StallError(TwinError, RuntimeError):
    """The simulation can make no more progress while requests are still pending."""


class InvariantError(TwinError, AssertionError):
    """An internal invariant (budget, block accounting, lifecycle) was violated: a bug, never user error."""
