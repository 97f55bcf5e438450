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


def finish(out: Path, summary: str, files: Sequence[Path], start: float, show: str | None = None) -> None:
    """A study's last step: ``summary.md`` in ``out``, ``show`` on stdout (default: the summary), then one
    line naming every file written and the wall time since ``start`` (``time.perf_counter``)."""
    import time

    path = out / "summary.md"
    path.write_text(summary, encoding="utf-8")
    print(summary if show is None else show, end="")
    print(f"wrote {', '.join(map(str, files))} and {path} in {time.perf_counter() - start:.1f} s")
