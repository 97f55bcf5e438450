"""The error every reader and converter raises for bad input: it names the file, position and expectation."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from typing import Any


class WorkloadFormatError(ValueError):
    """Malformed workload input: ``path[:line]: field: what was expected``."""

    def __init__(
        self, path: str | os.PathLike[str], message: str, *, line: int | None = None, field: str | None = None
    ) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.detail = message
        where = self.path if line is None else f"{self.path}:{line}"
        text = f"{where}: {field}: {message}" if field else f"{where}: {message}"
        super().__init__(text)


def utf8_lines(path: str | os.PathLike[str], lines: Iterable[str]) -> Iterator[str]:
    """The lines of a file opened as UTF-8 text; bytes that are not UTF-8 are an error naming the file (a
    bare UnicodeDecodeError named none). Text is decoded a buffer ahead of the lines, so no line is named."""
    try:
        yield from lines
    except UnicodeDecodeError as exc:
        raise WorkloadFormatError(path, f"expected UTF-8 text ({exc})") from None


def parse_json(path: str | os.PathLike[str], text: str, line: int | None = None, **options: Any) -> Any:
    """``json.loads(text, **options)`` of the file ``path`` (its line ``line``, for JSON Lines), every way it
    can fail a WorkloadFormatError naming the file and line: a syntax error with its column, an integer of
    over 4,300 digits (Python's int-from-text limit, a ValueError) or a value ``options`` refuse, and
    nesting deeper than the decoder's recursion (a bare RecursionError)."""
    try:
        return json.loads(text, **options)
    except json.JSONDecodeError as exc:
        raise WorkloadFormatError(path, f"invalid JSON at column {exc.colno}: {exc.msg}",
                                  line=exc.lineno if line is None else line) from None
    except ValueError as exc:
        raise WorkloadFormatError(path, f"invalid JSON ({exc})", line=line) from None
    except RecursionError:
        raise WorkloadFormatError(path, "invalid JSON (nested too deeply)", line=line) from None


def is_finite(value: int | float) -> bool:
    """``math.isfinite`` that is False, not OverflowError, for a JSON integer too large for a float (a
    400-digit ``arrival_s`` or ``timestamp``), so such a value is refused like an infinity."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class WorkloadWarning(UserWarning):
    """Input converted with a correction the user should know of (``path: what was corrected``)."""
