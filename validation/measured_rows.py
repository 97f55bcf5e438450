"""A measured CSV's rows: reading and checking the file, the cells every harness rule reads (integers, the
client concurrency, the measurement date, the measured latencies), and the records a row is read into
(:class:`RowSpec`, one :class:`Parallel` per worker). A row that cannot be read raises :class:`Skip` with
its reason, so it is reported, never dropped.
"""

from __future__ import annotations

import csv
import gzip
import math
import re
import zlib
from datetime import datetime, time, timedelta
from pathlib import Path
from typing import Iterable, Iterator, TextIO

import attrs

from twin.core.kv_cache import cdiv
from validation.samples import REQUIRED_COLUMNS
from workloads.errors import utf8_lines


REQUIRED = REQUIRED_COLUMNS   # (validation.samples lists every column read, for the help and the docs)


class Skip(Exception):
    """This row cannot be represented; the message says why."""


def _open_csv(path: str | Path) -> TextIO:
    """A measured CSV as text, gzip-compressed where its name ends .gz."""
    # utf-8-sig: a byte-order mark (Excel writes one) is not part of the first column's name
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", newline="", encoding="utf-8-sig")
    return open(path, newline="", encoding="utf-8-sig")


def _gzip_lines(path: str | Path, lines: Iterable[str]) -> Iterator[str]:
    """The lines of an opened CSV; a damaged .gz is an error naming the file (a bare BadGzipFile named none)."""
    try:
        yield from lines
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise ValueError(f"{path}: not a readable gzip file ({exc or 'truncated'})") from None


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The CSV's rows (.csv, or gzip-compressed .csv.gz); a missing column or an unreadable file is an error
    naming the file."""
    with _open_csv(path) as fh:
        reader = csv.DictReader(utf8_lines(path, _gzip_lines(path, fh)))
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; expected the silicon sample columns "
                             "(twin validate silicon --help lists them)")
        rows = []
        width = len(reader.fieldnames or [])
        for row in reader:
            row["_line"] = str(reader.line_num)  # the row's last physical line (blank lines and quoted newlines count)
            extra = row.pop(None, None)  # type: ignore[call-overload]
            short = [k for k, v in row.items() if v is None]
            if extra is not None or short:
                cells = width + len(extra) if extra is not None else width - len(short)
                row["_bad"] = f"line {reader.line_num} has {cells} cells where the header has {width}"
                for k in short:
                    row[k] = ""
            rows.append(row)
    return rows


def int_cell(row: dict[str, str], key: str, default: int | None = None) -> int:
    text = (row.get(key) or "").strip()
    if not text:
        if default is None:
            raise Skip(f"column {key} is empty")
        return default
    try:
        value = float(text)
    except ValueError:
        raise Skip(f"column {key}={text!r} is not a number") from None
    if not value.is_integer() or value < 0:
        raise Skip(f"column {key}={text!r} is not a non-negative integer")
    return int(value)


def silicon_concurrency(row: dict[str, str]) -> int | None:
    """The client concurrency noted in ``silicon_data_source`` (``silicon_concurrency=N``), if any."""
    found = re.search(r"silicon_concurrency=(\d+)", row.get("silicon_data_source", ""))
    return int(found.group(1)) if found else None


def concurrency(row: dict[str, str]) -> int:
    """The client's total concurrency: ``silicon_concurrency`` in the source note, else ``batch_size``."""
    total = silicon_concurrency(row)
    if total is not None:
        return total
    if (row.get("batch_size") or "").strip():
        return int_cell(row, "batch_size")
    raise Skip("no batch_size and no silicon_concurrency in silicon_data_source")


_MEASURED = re.compile(r"measured=(\d{4}-\d\d-\d\d)(T[0-9:.]+Z)?")
"""The measurement stamp in ``silicon_data_source``: a date, and the time of day where the export has it."""


def measured_day(row: dict[str, str]) -> str:
    """The measurement date (YYYY-MM-DD) named in ``silicon_data_source``, or ''."""
    m = _MEASURED.search(row.get("silicon_data_source", ""))
    return m.group(1) if m else ""


def measured_at(row: dict[str, str]) -> datetime:
    """The row's measurement time; a date-only stamp (the 2026_04_06 export's T00:00:00.000Z, which repeats
    runs the 2026_03_25 export stamps with their start time) stands for the end of that day."""
    m = _MEASURED.search(row["silicon_data_source"])
    if m is None or m.group(2) is None:
        raise Skip("silicon_data_source has no measured=<ISO time>")
    at = datetime.fromisoformat(m.group(1) + m.group(2).replace("Z", "+00:00"))
    if at.time() == time(0):
        at += timedelta(days=1, seconds=-1)
    return at


def measured_ms(row: dict[str, str], key: str) -> float:
    """A measured latency of the row: a finite number > 0 (else the row is skipped, before simulating)."""
    text = (row.get(key) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise Skip(f"column {key}={text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise Skip(f"column {key}={text!r}: expected a measured latency > 0")
    return value


@attrs.frozen
class Parallel:
    """One worker's parallelism after normalising the CSV's columns."""

    tp: int
    dp: int
    ep: int
    redundant_experts: int = 0          # EPLB slots of a disaggregated pool's recipe (_eplb_slots)

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


@attrs.frozen
class RowSpec:
    """What one CSV row says was run, after the data corrections listed in ``notes``."""

    mode: str
    gpu: str
    model: str
    backend: str
    weight_dtype: str
    isl: int
    osl: int
    concurrency: int                    # the client's total concurrency
    agg: Parallel | None = None         # aggregated: one engine
    prefill: Parallel | None = None     # disaggregated pools
    decode: Parallel | None = None
    prefill_workers: int = 1
    decode_workers: int = 1
    prefill_batch: int = 0              # per-rank max batch the row reports (0: engine default)
    decode_batch: int = 0
    spec_tokens: int = 0                # MTP draft tokens of a disaggregated row's matched config (0: none)
    max_batch: int = 0                  # aggregated: the engine's batch cap the row gives (0: the harness rule)
    max_tokens: int = 0                 # aggregated: the engine's step token budget the row gives (0: as above)
    notes: tuple[str, ...] = ()

    @property
    def per_rank_concurrency(self) -> int:
        """Requests one attention-DP rank serves (the whole concurrency when dp = 1)."""
        assert self.agg is not None
        return max(1, cdiv(self.concurrency, self.agg.dp))

    @property
    def harness_batch(self) -> int:
        """The batch a config generator sized an aggregated engine for: the row's ``max_batch_size`` where it
        gives one, else the concurrency per rank, which stands for it (:func:`deployment_limits`)."""
        return self.max_batch or self.per_rank_concurrency
