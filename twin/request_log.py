"""The per-request table of a run, written to disk as requests end and read back a chunk or a column at a time.

A run keeps no row in memory past a chunk: a million-request table is a quarter of a gigabyte, and held in
memory it was most of what a long run's resident memory grew by. :class:`RequestLog` writes each ended
request's row into a temporary file at the row's place (request ids are 0 .. n - 1, numbered as a run
sends them), so the file is the table in submission order whatever order requests end in; its text
(session names, failure reasons) goes to a second file the rows point into. :class:`RequestTable` reads
them back: a column at a time for the summary, a chunk at a time for requests.csv, the whole table only
where a caller asks for it (:attr:`twin.results.Results.requests`).

The files are anonymous (unlinked when made): the operating system reclaims them when the table is let go
or the process ends, however it ends. They are made in the temporary directory (``TMPDIR``); a
million-request run writes about 300 MB there.
"""

from __future__ import annotations

import tempfile
from typing import IO, Iterator, Sequence

import numpy as np

from twin.core.errors import InvariantError
from twin.core.lifecycle import TERMINAL, KVState
from twin.core.request import NO_TIME, Request, Status

NS = 1e9
"""Nanoseconds a second, as the table's seconds are taken from the requests' integer nanoseconds."""

REQUEST_FIELDS: list[tuple[str, str]] = [
    ("id", "i8"), ("session", "O"), ("turn", "i4"), ("worker", "i4"), ("status", "O"), ("fail_reason", "O"),
    ("priority", "i4"), ("arrival_s", "f8"), ("queued_s", "f8"), ("first_scheduled_s", "f8"),
    ("first_token_s", "f8"), ("finish_s", "f8"), ("prompt_tokens", "i8"), ("output_tokens", "i8"),
    ("cached_tokens", "i8"), ("host_hit_tokens", "i8"), ("recomputed_tokens", "i8"), ("preemptions", "i4"), ("ttft_s", "f8"),
    ("tpot_s", "f8"), ("e2e_s", "f8"), ("queue_s", "f8"), ("max_itl_s", "f8"),
    # Disaggregated systems only (NaN / -1 / empty otherwise): the KV lifecycle of the request.
    ("prefill_worker", "i4"), ("kv_state", "O"), ("kv_staged_s", "f8"), ("kv_pull_s", "f8"),
    ("kv_resident_s", "f8"), ("kv_expired_s", "f8"), ("staged_wait_s", "f8"), ("transfer_s", "f8"),
    ("transfer_bytes", "i8"), ("reused_blocks", "i8"),
]
"""The columns of requests.csv and of :attr:`twin.results.Results.requests`, with their numpy types."""

STATUS_NAMES: tuple[str, ...] = tuple(s.name.lower() for s in sorted(Status))
"""A status's name in the table, by its value (the stored code)."""
KV_STATE_NAMES: tuple[str, ...] = ("",) + tuple(k.name.lower() for k in sorted(KVState))
"""A KV state's name in the table by its stored code: the state's value + 1, 0 for a request with no KV
lifecycle (colocated), which the table leaves empty."""
_CODED = {"status": STATUS_NAMES, "kv_state": KV_STATE_NAMES}
"""Text columns of a few values, stored as one-byte codes."""
_TEXT = ("session", "fail_reason")
"""Text columns of any value, stored in the text file: where each starts there and its length in bytes."""


def _stored_fields() -> list[tuple[str, str]]:
    fields: list[tuple[str, str]] = []
    for name, kind in REQUEST_FIELDS:
        if name in _CODED:
            fields.append((name, "u1"))
        elif name in _TEXT:
            fields += [(f"{name}@", "i8"), (f"{name}#", "i4")]
        else:
            fields.append((name, kind))
    return fields + [("written", "u1")]


STORED = np.dtype(_stored_fields())
"""A row as the log's file holds it: numbers as they are, codes for status and KV state, text as where it
starts in the text file and its length, and a mark that the row was written (unwritten places read 0)."""
_TABLE = np.dtype(REQUEST_FIELDS)


def _kv_columns(r: Request) -> tuple[object, ...]:
    kv = r.kv
    if kv is None:
        nan = float("nan")
        return (-1, "", nan, nan, nan, nan, nan, nan, 0, 0)
    wait = kv.staged_wait_ns
    moved = kv.transferred
    return (kv.prefill_worker, kv.state.name.lower(), kv.time_s(KVState.STAGED), kv.time_s(KVState.PULLING),
            kv.time_s(KVState.RESIDENT), kv.time_s(KVState.EXPIRED), float("nan") if wait is None else wait / NS,
            kv.transfer_ns / NS if moved else float("nan"), kv.transfer_bytes, kv.reused_blocks)


def _t(ns: int) -> float:
    return float("nan") if ns == NO_TIME else ns / NS


def request_row(r: Request) -> tuple[object, ...]:
    """The request's row of requests.csv (:data:`REQUEST_FIELDS`), as it stands now."""
    arrival = r.arrival_ns / NS
    first = _t(r.first_token_ns)
    finish = _t(r.finish_ns) if r.status is Status.FINISHED else float("nan")
    out = r.num_output_tokens
    tpot = (finish - first) / (out - 1) if out > 1 else float("nan")
    # The largest gap between two tokens: none with fewer than two (it read 0.0, a max of nothing).
    max_itl = r.max_itl_ns / NS if out > 1 else float("nan")
    return (
        r.id, r.session, r.turn, r.worker, STATUS_NAMES[r.status], r.fail_reason, r.priority, arrival,
        _t(r.queued_ns), _t(r.first_scheduled_ns), first, _t(r.finish_ns), r.prompt_tokens, out,
        max(r.cached_tokens, 0), r.host_hit_tokens, r.recomputed_tokens, r.preemptions, first - arrival, tpot,
        finish - arrival, _t(r.first_scheduled_ns) - arrival, max_itl, *_kv_columns(r),
    )


def request_table(requests: Sequence[Request]) -> np.ndarray:
    """One row per request, in the given order (a numpy structured array)."""
    table = np.zeros(len(requests), dtype=REQUEST_FIELDS)
    for i, r in enumerate(requests):
        table[i] = request_row(r)
    return table


# RequestLog._write stores a row by these places: the text and coded columns among the first six, then the
# KV state's.
_KV_STATE = [name for name, _ in REQUEST_FIELDS].index("kv_state")
assert [name for name, _ in REQUEST_FIELDS][:6] == ["id", "session", "turn", "worker", "status", "fail_reason"]


class _Files:
    """The log's two anonymous files, closed when neither the log nor its table holds them any more."""

    def __init__(self) -> None:
        self.rows: IO[bytes] = tempfile.TemporaryFile(prefix="twin-requests-")
        self.text: IO[bytes] = tempfile.TemporaryFile(prefix="twin-requests-text-")

    def __del__(self) -> None:
        self.rows.close()
        self.text.close()


class RequestLog:
    """The rows of requests that have ended, written as they end, so that a run keeps no request object
    past its end (a row is a few hundred bytes, a request with its block keys and session tens of kilobytes)
    and no row past its chunk. :meth:`close` gives the table (:class:`RequestTable`).

    A row is written once nothing more happens to its request: it ended, and a disaggregated request's KV
    reached the end of its lifecycle (a request can finish while its staged KV still waits to be freed).
    Those that ended before their KV are held (:attr:`held`) and written when it ends, or at the run's end.
    """

    def __init__(self, chunk_rows: int = 16_384) -> None:
        self.chunk_rows = chunk_rows
        self._files = _Files()
        self._chunk = np.zeros(chunk_rows, dtype=STORED)
        self._filled = 0
        """Rows in :attr:`_chunk` not yet in the file."""
        self._text = bytearray()
        self._text_at = 0
        """Bytes of text already in its file."""
        self._size = 0
        """Rows the file has room for."""
        self.written = 0
        self.rows = 0
        """One more than the largest request id written (the table's length once every row is in)."""
        self.held: dict[int, Request] = {}
        self.count = 0
        """Requests ended so far (written or held)."""
        self.failed_without_reason: list[str] = []
        """Requests that failed with no reason given (an invariant the run checks at its end)."""
        self._closed: RequestTable | None = None

    def add(self, req: Request) -> None:
        """``req`` has ended."""
        self.count += 1
        if req.status is Status.FAILED and not req.fail_reason:
            self.failed_without_reason.append(repr(req))
        if req.kv is not None and req.kv.state not in TERMINAL:
            self.held[req.id] = req
            return
        self._write(req)
        if self.held:
            for rid in [rid for rid, r in self.held.items() if r.kv is not None and r.kv.state in TERMINAL]:
                self._write(self.held.pop(rid))

    def _write(self, req: Request) -> None:
        row = request_row(req)
        text = self._text
        at = self._text_at + len(text)
        session = req.session.encode("utf-8")
        reason = req.fail_reason.encode("utf-8")
        text += session
        text += reason
        self._chunk[self._filled] = (
            row[0], at, len(session), row[2], row[3], int(req.status), at + len(session), len(reason),
            *row[6:_KV_STATE], 0 if req.kv is None else int(req.kv.state) + 1, *row[_KV_STATE + 1:], 1)
        self._filled += 1
        self.written += 1
        if self._filled == self.chunk_rows:
            self._flush()

    def _flush(self) -> None:
        """Put the chunk's rows at their places in the file, and the text they point to after the text."""
        if self._text:
            self._files.text.write(self._text)
            self._text_at += len(self._text)
            self._text = bytearray()
        if not self._filled:
            return
        rows = self._chunk[:self._filled]
        ids = rows["id"]
        lo, hi = int(ids.min()), int(ids.max()) + 1
        if hi > self._size:
            self._files.rows.truncate(hi * STORED.itemsize)   # (the gap reads as zeros: unwritten)
            self._size = hi
        self.rows = max(self.rows, hi)
        # A mapping of only the range the chunk covers, let go at once: written pages leave this process's
        # memory (the file's pages are the system's cache, not the run's).
        place = np.memmap(self._files.rows, dtype=STORED, mode="r+", offset=lo * STORED.itemsize, shape=(hi - lo,))
        place[ids - lo] = rows
        place.flush()
        del place
        self._filled = 0

    def close(self) -> RequestTable:
        """The table of every row, held ones included (written once: the log takes no more rows)."""
        if self._closed is not None:
            return self._closed
        for req in self.held.values():
            self._write(req)
        self.held.clear()
        self._flush()
        self._files.text.flush()
        self._chunk = self._chunk[:0]
        if self.written != self.rows:
            raise InvariantError(f"request ids are not 0 .. {self.rows - 1}: {self.written} rows written")
        self._closed = RequestTable(self._files, self.rows)
        return self._closed


READ_ROWS = 8192
"""Rows read from the file at once (2.3 MB of stored rows)."""


def _read_at(f: IO[bytes], n: int, at: int) -> bytes:
    """``n`` bytes of ``f`` from ``at`` (fewer at its end)."""
    f.seek(at)
    return f.read(n)


class RequestTable:
    """The per-request table a :class:`RequestLog` wrote, read from its files: :meth:`column` (what the
    summary reads), :meth:`chunks` (what requests.csv is written from) or :meth:`table` (all of it)."""

    def __init__(self, files: _Files, rows: int) -> None:
        self._files = files
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def _raw(self, lo: int, hi: int) -> np.ndarray:
        """Stored rows lo .. hi - 1, checked to be the rows of those ids."""
        n = hi - lo
        data = _read_at(self._files.rows, n * STORED.itemsize, lo * STORED.itemsize)
        raw = np.frombuffer(data, dtype=STORED, count=len(data) // STORED.itemsize)
        if len(raw) != n or not raw["written"].all() or not np.array_equal(raw["id"], np.arange(lo, hi)):
            raise InvariantError(f"the request log's rows {lo} .. {hi - 1} are not those requests' rows")
        return raw

    def _spans(self, rows: int) -> Iterator[tuple[int, int]]:
        for lo in range(0, self.rows, rows):
            yield lo, min(lo + rows, self.rows)

    def _text(self, raw: np.ndarray, name: str) -> np.ndarray:
        """A text column of stored rows, as Python strings (an object array)."""
        at, length = raw[f"{name}@"], raw[f"{name}#"]
        out = np.full(len(raw), "", dtype=object)
        some = np.flatnonzero(length)
        if not len(some):
            return out
        start = int(at[some].min())
        end = int((at[some] + length[some]).max())
        text = self._files.text
        if end - start <= max(1 << 20, 8 * int(length[some].sum())):
            data = _read_at(text, end - start, start)
            for i, a, n in zip(some.tolist(), (at[some] - start).tolist(), length[some].tolist()):
                out[i] = data[a:a + n].decode("utf-8")
        else:   # (rows whose text lies far apart: read each, not what lies between)
            for i, a, n in zip(some.tolist(), at[some].tolist(), length[some].tolist()):
                out[i] = _read_at(text, n, a).decode("utf-8")
        return out

    def _decode(self, raw: np.ndarray, name: str) -> np.ndarray:
        if name in _TEXT:
            return self._text(raw, name)
        if name in _CODED:
            return np.array(_CODED[name], dtype=object)[raw[name]]
        return raw[name]

    def chunks(self, rows: int = READ_ROWS) -> Iterator[np.ndarray]:
        """The table a chunk of ``rows`` rows at a time, in request-id order (:data:`REQUEST_FIELDS`)."""
        for lo, hi in self._spans(rows):
            raw = self._raw(lo, hi)
            chunk = np.zeros(hi - lo, dtype=_TABLE)
            for name, _ in REQUEST_FIELDS:
                chunk[name] = self._decode(raw, name)
            yield chunk

    def column(self, name: str) -> np.ndarray:
        """One column of every row, in request-id order (its numpy type; text as Python strings)."""
        kind = _TABLE[name]
        out = np.empty(self.rows, dtype=kind)
        for lo, hi in self._spans(READ_ROWS):
            out[lo:hi] = self._decode(self._raw(lo, hi), name)
        return out

    __getitem__ = column

    def table(self) -> np.ndarray:
        """The whole table in memory (:data:`REQUEST_FIELDS`, a numpy structured array)."""
        out = np.zeros(self.rows, dtype=_TABLE)
        for lo, chunk in zip(range(0, self.rows, READ_ROWS), self.chunks(READ_ROWS)):
            out[lo:lo + len(chunk)] = chunk
        return out
