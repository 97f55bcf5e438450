"""The studies' CSV convention: one row per mapping, in a fixed column order, floats to 6 significant digits
(so a study's CSV is the same bytes on every machine)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence


def cell(value: Any) -> Any:
    """A float to 6 significant digits; anything else as it is."""
    return f"{value:.6g}" if isinstance(value, float) else value


def write_rows(rows: Iterable[Mapping[str, Any]], columns: Sequence[str], path: Path) -> Path:
    """Write ``rows`` (mappings with exactly ``columns``) under a header line; returns ``path``."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: cell(v) for k, v in row.items()})
    return path
