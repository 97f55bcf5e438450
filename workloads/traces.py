"""Request-trace CSV readers: arrival time + prompt length + output length per row, as one-call sessions."""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import attrs

from workloads.errors import WorkloadFormatError, utf8_lines
from workloads.sessions import INT64_MAX, Call, Session

PathLike = str | os.PathLike[str]
_T = TypeVar("_T", int, float)


@attrs.frozen
class _Columns:
    """One recognised column set: time, prompt-length and output-length column names."""

    time: str
    input: str
    output: str
    time_kind: str  # "seconds" | "datetime"
    name: str


_COLUMN_SETS = (
    _Columns("arrived_at", "num_prefill_tokens", "num_decode_tokens", "seconds", "vidur"),
    _Columns("arrival_s", "input_tokens", "output_tokens", "seconds", "servetwin"),
    _Columns("TIMESTAMP", "ContextTokens", "GeneratedTokens", "datetime", "azure"),
)
_ID_COLUMNS = ("request_id", "id")
_DIGITS = re.compile(r"^[0-9]+$")
_DATETIME = re.compile(r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?$")


def read_request_csv(path: PathLike, *, id_prefix: str = "req") -> list[Session]:
    """One one-call session per CSV row (arrival, whole prompt as the append, output tokens).

    Recognised header sets (any column order):

    * ``arrived_at, num_prefill_tokens, num_decode_tokens`` (Vidur request lists, seconds; an optional
      ``request_id`` column names the sessions),
    * ``arrival_s, input_tokens, output_tokens`` (seconds; optional ``id``),
    * ``TIMESTAMP, ContextTokens, GeneratedTokens`` (Azure LLM inference traces: ``YYYY-MM-DD hh:mm:ss.f``
      datetimes, up to 9 fractional digits, made relative to the first row with integer nanoseconds).

    Times in seconds are taken as they are. Blank lines (no cells at all, as a trailing one) hold no request
    and are skipped. Any other column, a missing cell, a non-integer length or a negative time is an error
    naming the file and line. Ids are the id column or ``{id_prefix}-{row}``
    (row counted from 0).
    """
    # utf-8-sig: a byte-order mark (Excel writes one) is not part of the first column's name
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(utf8_lines(path, handle))
        try:
            return _read_rows(path, reader, id_prefix)
        except csv.Error as exc:  # a cell past csv's field size limit (or a NUL byte) was a bare _csv.Error
            raise WorkloadFormatError(path, f"expected CSV ({exc})", line=reader.line_num) from None


def _read_rows(path: PathLike, reader: Any, id_prefix: str) -> list[Session]:
    """The sessions of a CSV reader's rows (see :func:`read_request_csv`)."""
    header = next((row for row in reader if row), None)
    if header is None:
        raise WorkloadFormatError(path, "empty file; expected a header row", line=1)
    columns = _match_header(path, header, reader.line_num)
    index = {name: i for i, name in enumerate(header)}
    id_col = next((index[c] for c in _ID_COLUMNS if c in index), None)
    sessions: list[Session] = []
    first_ns: int | None = None
    seen: set[str] = set()
    for row in reader:
        line = reader.line_num  # (the row's last physical line: skipped blank lines count)
        if not row:  # a blank line; a row of empty cells (",,") has cells, and is refused below
            continue
        if len(row) != len(header):
            raise WorkloadFormatError(path, f"expected {len(header)} cells, got {len(row)}", line=line)
        time_text = row[index[columns.time]]
        if columns.time_kind == "seconds":
            arrival_s = _cell(path, line, columns.time, time_text, _seconds)
        else:
            stamp_ns = _cell(path, line, columns.time, time_text, _datetime_ns)
            first_ns = stamp_ns if first_ns is None else first_ns
            arrival_s = (stamp_ns - first_ns) / 1e9
        if arrival_s < 0:
            what = (
                "a time at or after the first row's" if columns.time_kind == "datetime" else "a time >= 0"
            )
            raise WorkloadFormatError(
                path, f"expected {what}, got {time_text!r}", line=line, field=columns.time
            )
        isl = _cell(path, line, columns.input, row[index[columns.input]], _count)
        osl = _cell(path, line, columns.output, row[index[columns.output]], _count)
        sid = row[id_col] if id_col is not None else f"{id_prefix}-{len(sessions)}"
        if not sid or sid in seen:
            raise WorkloadFormatError(
                path,
                f"expected a unique non-empty id, got {sid!r}",
                line=line,
                field=header[id_col] if id_col is not None else "id",
            )
        seen.add(sid)
        sessions.append(
            Session(id=sid, arrival_s=arrival_s, calls=(Call(append_tokens=isl, output_tokens=osl),))
        )
    return sessions


def _match_header(path: PathLike, header: list[str], line: int) -> _Columns:
    names = set(header)
    for columns in _COLUMN_SETS:
        needed = {columns.time, columns.input, columns.output}
        if needed <= names:
            extra = sorted(names - needed - set(_ID_COLUMNS))
            if extra or len(names) != len(header):
                raise WorkloadFormatError(
                    path,
                    f"unexpected or repeated column(s) {extra} for the {columns.name} " f"column set",
                    line=line,
                )
            if set(_ID_COLUMNS) <= names:  # (request_id was taken and id ignored without a word)
                raise WorkloadFormatError(
                    path, f"two id columns {list(_ID_COLUMNS)}; expected at most one", line=line
                )
            return columns
    known = "; ".join(",".join((c.time, c.input, c.output)) for c in _COLUMN_SETS)
    raise WorkloadFormatError(
        path, f"expected a header with one of the column sets [{known}], got {header}", line=line
    )


def _cell(path: PathLike, line: int, column: str, text: str, parse: Callable[[str], _T]) -> _T:
    try:
        return parse(text.strip())
    except ValueError as exc:
        raise WorkloadFormatError(path, f"{exc}, got {text!r}", line=line, field=column) from None


def _count(text: str) -> int:
    if _DIGITS.match(text) is None or int(text) < 1:
        raise ValueError("expected an integer >= 1 (a request has a prompt and generates at least one token)")
    if int(text) > INT64_MAX:
        raise ValueError("expected an integer of at most 2**63 - 1 (64 bits)")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("expected a time in seconds") from None
    if not math.isfinite(value):
        raise ValueError("expected a finite time in seconds")
    return value


def _datetime_ns(text: str) -> int:
    """Integer nanoseconds since 0001-01-01, exact for up to 9 fractional digits."""
    match = _DATETIME.match(text)
    if match is None:
        raise ValueError("expected a datetime 'YYYY-MM-DD hh:mm:ss[.fraction]'")
    try:
        whole = datetime.fromisoformat(match.group(1).replace("T", " "))
    except ValueError:
        raise ValueError("expected a valid calendar datetime") from None
    fraction = (match.group(2) or "").ljust(9, "0")
    seconds = (whole - datetime(1, 1, 1)).days * 86400 + whole.hour * 3600 + whole.minute * 60 + whole.second
    return seconds * 1_000_000_000 + int(fraction)
