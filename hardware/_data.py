"""Locate and read the data files shipped inside the package (never at import time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import yaml

DATA_DIR = Path(__file__).resolve().parent / "data"

SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # type: ignore[assignment]
"""libyaml's parser when PyYAML was built with it (several times faster), with the same safe constructors
and resolvers as ``yaml.safe_load``, so the values are the same."""


def read_yaml(path: Path) -> dict[str, Any]:
    """Read one YAML mapping; a file that is not a mapping is a packaging error."""
    with path.open() as fh:
        data = yaml.load(fh, Loader=SAFE_LOADER)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping, got {type(data).__name__}")
    return data


def unknown_name(kind: str, name: str, valid: Iterable[str]) -> ValueError:
    """The error every loader raises for a name it does not know."""
    return ValueError(f"unknown {kind} {name!r}; valid names: {', '.join(sorted(valid))}")
