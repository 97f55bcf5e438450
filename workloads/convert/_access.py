"""Typed access into parsed JSON, failing with the file and the field path (``messages[4].extra``)."""

from __future__ import annotations

import os
from typing import Any

from workloads.errors import WorkloadFormatError, is_finite, parse_json
from workloads.sessions import INT64_MAX

PathLike = str | os.PathLike[str]


def load_json(path: PathLike) -> Any:
    """Parse a whole JSON file; a truncated or edited file names the line and column that broke."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError as exc:
        raise WorkloadFormatError(path, f"expected UTF-8 text ({exc})") from None
    return parse_json(path, text)


class Doc:
    """A JSON value with its file and path, so every failed expectation says where."""

    def __init__(self, path: PathLike, value: Any, where: str = "", line: int | None = None) -> None:
        self.path = path
        self.value = value
        self.where = where
        self.line = line

    def fail(self, message: str, where: str | None = None) -> WorkloadFormatError:
        return WorkloadFormatError(
            self.path, message, line=self.line, field=(self.where if where is None else where) or None
        )

    def _child_path(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.where}[{key}]"
        return f"{self.where}.{key}" if self.where else key

    def has(self, key: str) -> bool:
        return isinstance(self.value, dict) and key in self.value and self.value[key] is not None

    def get(self, key: str | int) -> Doc:
        where = self._child_path(key)
        if isinstance(key, int):
            if not isinstance(self.value, list) or not -len(self.value) <= key < len(self.value):
                raise self.fail(f"expected an array with an element {key}", where)
            return Doc(self.path, self.value[key], where, self.line)
        if not isinstance(self.value, dict):
            raise self.fail(f"expected an object, got {_kind(self.value)}")
        if key not in self.value:
            raise self.fail("missing", where)
        return Doc(self.path, self.value[key], where, self.line)

    def items(self) -> list[Doc]:
        if not isinstance(self.value, list):
            raise self.fail(f"expected an array, got {_kind(self.value)}")
        return [Doc(self.path, v, self._child_path(i), self.line) for i, v in enumerate(self.value)]

    def obj(self) -> dict[str, Any]:
        if not isinstance(self.value, dict):
            raise self.fail(f"expected an object, got {_kind(self.value)}")
        return self.value

    def str_(self) -> str:
        if not isinstance(self.value, str):
            raise self.fail(f"expected a string, got {_kind(self.value)}")
        return self.value

    def text(self) -> str:
        """Message content: a string, null (empty) or a list of ``{"type": "text", "text": ...}`` parts."""
        if self.value is None:
            return ""
        if isinstance(self.value, str):
            return self.value
        if isinstance(self.value, list):
            return "".join(part.get("text").str_() for part in self.items())
        raise self.fail(f"expected text (a string, null or a list of text parts), got {_kind(self.value)}")

    def count(self, minimum: int = 0) -> int:
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < minimum:
            raise self.fail(f"expected a token count (integer >= {minimum}), got {_kind(self.value)}")
        if self.value > INT64_MAX:
            # the session-script reader refuses it, so the converted file could not be read back
            raise self.fail(f"expected a token count of at most 2**63 - 1 (64 bits), got {self.value}")
        return self.value

    def number(self) -> float:
        if (
            isinstance(self.value, bool)
            or not isinstance(self.value, (int, float))
            or not is_finite(self.value)
        ):
            raise self.fail(f"expected a finite number, got {_kind(self.value)}")
        return float(self.value)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value[:40]!r}"
    return "an object" if isinstance(value, dict) else "an array"
