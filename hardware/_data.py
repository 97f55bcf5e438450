"""Locate and read the data files shipped inside the package (never at import time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import json
import math
import re

import yaml

DATA_DIR = Path(__file__).resolve().parent / "data"

SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # type: ignore[assignment]
"""libyaml's parser when PyYAML was built with it (several times faster), with the same safe constructors
and resolvers as ``yaml.safe_load``, so the values are the same."""


def read_yaml(path: Path) -> dict[str, Any]:
    """Read one YAML mapping; a file that is not a mapping is a packaging error.

    A syntax error is a ValueError naming the file and the line (a user's own spec under data/ is read by
    the same loaders as the shipped ones, and the twin's config check reports ValueErrors; a bare
    yaml.YAMLError was a traceback)."""
    with path.open() as fh:
        try:
            data = yaml.load(fh, Loader=SAFE_LOADER)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f", line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise ValueError(f"{path}{line}: not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping, got {type(data).__name__}")
    return data


def read_json(path: Path) -> dict[str, Any]:
    """Read one JSON object (a model's config.json), with the same errors as :func:`read_yaml`."""
    with path.open() as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def key_line(path: Path, dotted: str) -> int | None:
    """The line (1-based) of a field of a YAML or JSON spec file, for error messages: the first line that
    names its last part after the lines naming the parts before it (``peak_flops.bf16``); None if not found.

    A text scan rather than a second parse: it only has to point a person at the right line."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    start = 0
    for part in dotted.split("."):
        pattern = re.compile(rf"""^\s*["']?{re.escape(part)}["']?\s*:""")
        hit = next((i for i in range(start, len(lines)) if pattern.match(lines[i])), None)
        if hit is None:
            return None
        start = hit
    return start + 1


def where(path: Path, dotted: str) -> str:
    """``path, line N`` of a field (just ``path`` when the field is not written in the file)."""
    line = key_line(path, dotted)
    return f"{path}, line {line}" if line is not None else str(path)


def is_integer(value: Any) -> bool:
    """Whether ``value`` is an integer (a YAML / JSON true is not one)."""
    return not isinstance(value, bool) and isinstance(value, int)


def is_count(value: Any, low: int = 0) -> bool:
    """Whether ``value`` is an integer >= ``low``."""
    return is_integer(value) and value >= low


def is_number(value: Any) -> bool:
    """Whether ``value`` is a number (a YAML / JSON true is not one)."""
    return not isinstance(value, bool) and isinstance(value, (int, float))


def is_rate(value: Any) -> bool:
    """Whether ``value`` is a finite number > 0 (a bandwidth, a FLOP rate, a scaling factor)."""
    return is_number(value) and 0 < value < math.inf


def located(path: Path, exc: ValueError, fields: Iterable[str]) -> ValueError:
    """``exc``, a spec's own check, prefixed with the file and the line of the field it names (the first of
    ``fields`` whose name it writes before "must"), or the file alone."""
    field = next((f for f in fields if f"{f} must" in str(exc)), None)
    return ValueError(f"{where(path, field) if field else path}: {exc}")


class UnknownName(ValueError):
    """A loader was given a name it does not know (not: a known name whose spec file is wrong)."""


def unknown_name(kind: str, name: str, valid: Iterable[str]) -> UnknownName:
    """The error every loader raises for a name it does not know."""
    return UnknownName(f"unknown {kind} {name!r}; valid names: {', '.join(sorted(valid))}")
