"""Read and write session scripts (JSONL, gzip when the name ends ``.gz``); see ``workloads/FORMAT.md``.

The reader is strict: every malformed line raises :class:`WorkloadFormatError` naming the file, the line
number, the field path (``calls[3].output``) and what was expected. Unknown keys are errors, because a
misspelt optional key would otherwise be dropped silently.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from typing import IO, Any, cast

from workloads.errors import WorkloadFormatError, is_finite, parse_json
from workloads.sessions import (FORMAT_NAME, FORMAT_VERSION, INT64_MAX, Call, Session, kept_stream,
                                session_to_dict)

PathLike = str | os.PathLike[str]

_SESSION_KEYS = frozenset({"id", "arrival_s", "prefix_group", "prefix_tokens", "priority", "calls"})
_CALL_KEYS = frozenset(
    {
        "append",
        "output",
        "wait_s",
        "min_interval_s",
        "keep",
        "block_hashes",
        "hash_block_tokens",
        "subagents",
        "fork_context",
    }
)


def _open_read(path: PathLike) -> IO[str]:
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def write_sessions(path: PathLike, sessions: Iterable[Session], source: str, **meta: Any) -> None:
    """Write a header line ``{"format", "version", "source", **meta}`` then one session per line.

    Every session is first checked as :func:`read_workload` checks its line, and nothing is written when
    one fails: the writer used to write whatever it was given, so a NaN arrival left a file cut after the
    header (which reads as an empty workload), and an empty id, a duplicate name or a bool count gave a
    file the reader refuses. (``hash_block_tokens`` without ``block_hashes`` is still left out, as
    :func:`session_to_dict` does; a Session cannot hold ``prefix_tokens`` without a ``prefix_group``.)
    """
    header: dict[str, Any] = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "source": source}
    for key, value in meta.items():
        if key in header:
            raise ValueError(f"meta key {key!r} is reserved")
        header[key] = value
    encoded = [_dump(header)]
    checks = _FileChecks(path)
    for number, session in enumerate(sessions, start=2):
        try:
            obj = session_to_dict(session)
            checks.add(number, _parse_session(path, number, obj))
        except RecursionError:  # (session_to_dict recurses per sub-agent level too)
            raise WorkloadFormatError(
                path, "sub-agents nested too deeply; nothing was written", line=number, field="calls"
            ) from None
        except WorkloadFormatError as exc:
            raise WorkloadFormatError(
                path, f"{exc.detail}; nothing was written", line=number, field=exc.field
            ) from None
        encoded.append(_dump(obj))
    with contextlib.ExitStack() as stack:
        raw: IO[bytes] = stack.enter_context(open(path, "wb"))
        if str(path).endswith(".gz"):
            # mtime=0 keeps the bytes identical between runs.
            raw = cast(
                IO[bytes], stack.enter_context(gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0))
            )
        for line in encoded:
            raw.write(line)


def _dump(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")


def read_sessions(path: PathLike) -> list[Session]:
    """All sessions of a session-script file (the header is checked, then dropped)."""
    return read_workload(path)[1]


def read_workload(path: PathLike) -> tuple[dict[str, Any], list[Session]]:
    """The header object and the sessions of a session-script file."""
    header: dict[str, Any] | None = None
    sessions: list[Session] = []
    checks = _FileChecks(path)
    try:
        with _open_read(path) as lines:
            for number, text in enumerate(_lines(lines), start=1):
                if header is None:
                    header = _parse_header(path, number, text)
                    continue
                if not text.strip():  # a blank line (a trailing one, as editors leave) holds no session
                    continue
                session = _parse_session(path, number, _parse_json(path, number, text))
                checks.add(number, session)
                sessions.append(session)
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile, zlib.error) as exc:
        # (a truncated gzip file is an EOFError; one whose compressed bytes are damaged is a zlib.error)
        if isinstance(exc, FileNotFoundError):
            raise
        raise WorkloadFormatError(path, f"cannot read: {exc}") from exc
    if header is None:
        raise WorkloadFormatError(
            path, f'empty file; expected a header line {{"format": "{FORMAT_NAME}", ...}}', line=1
        )
    return header, sessions


def _lines(stream: IO[str]) -> Iterator[str]:
    for text in stream:
        yield text.rstrip("\n").rstrip("\r")


def _parse_json(path: PathLike, number: int, text: str) -> Any:
    return parse_json(path, text, number, parse_constant=_reject_constant)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid number here")


def _parse_header(path: PathLike, number: int, text: str) -> dict[str, Any]:
    obj = _parse_json(path, number, text)
    if not isinstance(obj, dict):
        raise WorkloadFormatError(path, f"expected the header object, got {type(obj).__name__}", line=number)
    if obj.get("format") != FORMAT_NAME:
        raise WorkloadFormatError(
            path, f"expected {FORMAT_NAME!r}, got {obj.get('format')!r}", line=number, field="format"
        )
    version = obj.get("version")
    # (1.0 == 1 in Python: a float version was taken for version 1, though integers must be JSON integers)
    if version != FORMAT_VERSION or not isinstance(version, int) or isinstance(version, bool):
        raise WorkloadFormatError(
            path,
            f"expected version {FORMAT_VERSION} (the version this reader knows), " f"got {version!r}",
            line=number,
            field="version",
        )
    if not isinstance(obj.get("source"), str):
        raise WorkloadFormatError(
            path, f"expected a string, got {obj.get('source')!r}", line=number, field="source"
        )
    return obj


def _parse_session(path: PathLike, number: int, obj: Any) -> Session:
    parser = _Parser(path, number)
    try:
        session = parser.session(obj, "")
        parser.check_streams(session, "", None)
    except RecursionError:
        # the parser recurses per sub-agent level, about as deep as json's decoder goes
        raise WorkloadFormatError(path, "sub-agents nested too deeply", line=number, field="calls") from None
    return session


class _FileChecks:
    """What is checked across the lines of one file: unique ids and names, one length per prefix group."""

    def __init__(self, path: PathLike) -> None:
        self.path = path
        self.seen: dict[str, int] = {}
        self.names: dict[str, tuple[int, str]] = {}
        self.group_prefix: dict[str, tuple[int, int]] = {}

    def add(self, number: int, session: Session) -> None:
        if session.id in self.seen:
            raise WorkloadFormatError(
                self.path,
                f"duplicate session id {session.id!r} (first on line {self.seen[session.id]})",
                line=number,
                field="id",
            )
        self.seen[session.id] = number
        _check_names(self.path, number, session, self.names)
        _check_group(self.path, number, session, self.group_prefix)


class _Parser:
    """Builds sessions from one line's JSON, raising errors with the field path."""

    def __init__(self, path: PathLike, line: int) -> None:
        self.path = path
        self.line = line

    def fail(self, field: str, message: str) -> WorkloadFormatError:
        return WorkloadFormatError(self.path, message, line=self.line, field=field or None)

    def obj(self, value: Any, where: str, allowed: frozenset[str], what: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a {what} object, got {_kind(value)}")
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(_join(where, unknown[0]), f"unknown key; expected one of {sorted(allowed)}")
        return value

    def int_(self, value: Any, where: str, *, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"expected an integer >= {minimum}, got {_kind(value)}")
        if value < minimum:
            raise self.fail(where, f"expected an integer >= {minimum}, got {value}")
        if value > INT64_MAX:
            raise self.fail(where, f"expected an integer of at most 2**63 - 1 (64 bits), got {value}")
        return value

    def float_(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not is_finite(value):
            raise self.fail(where, f"expected a finite number >= 0, got {_kind(value)}")
        if value < 0:
            raise self.fail(where, f"expected a finite number >= 0, got {value}")
        return float(value)

    def session(self, value: Any, where: str) -> Session:
        obj = self.obj(value, where, _SESSION_KEYS, "session")
        for key in ("id", "calls"):
            if key not in obj:
                raise self.fail(_join(where, key), "missing; a session needs 'id' and 'calls'")
        sid = obj["id"]
        if not isinstance(sid, str) or not sid:
            raise self.fail(_join(where, "id"), f"expected a non-empty string, got {_kind(sid)}")
        arrival = obj.get("arrival_s")
        arrival_s = None if arrival is None else self.float_(arrival, _join(where, "arrival_s"))
        group = obj.get("prefix_group")
        if group is not None and (not isinstance(group, str) or not group):
            raise self.fail(
                _join(where, "prefix_group"), f"expected a non-empty string or null, got {_kind(group)}"
            )
        prefix_tokens = self.int_(obj.get("prefix_tokens", 0), _join(where, "prefix_tokens"))
        if prefix_tokens and group is None:
            raise self.fail(_join(where, "prefix_tokens"), "expected only together with 'prefix_group'")
        priority = obj.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise self.fail(_join(where, "priority"), f"expected an integer, got {_kind(priority)}")
        if abs(priority) > INT64_MAX:
            raise self.fail(_join(where, "priority"), f"expected an integer of at most 2**63 - 1 in size (64 bits), "
                                                      f"got {priority}")
        calls_value = obj["calls"]
        if not isinstance(calls_value, list) or not calls_value:
            raise self.fail(
                _join(where, "calls"), f"expected a non-empty list of calls, got {_kind(calls_value)}"
            )
        calls = tuple(self.call(c, f"{_join(where, 'calls')}[{i}]") for i, c in enumerate(calls_value))
        return Session(
            id=sid,
            calls=calls,
            arrival_s=arrival_s,
            prefix_group=group,
            prefix_tokens=prefix_tokens,
            priority=priority,
        )

    def call(self, value: Any, where: str) -> Call:
        obj = self.obj(value, where, _CALL_KEYS, "call")
        for key in ("append", "output"):
            if key not in obj:
                raise self.fail(_join(where, key), "missing; a call needs 'append' and 'output'")
        keep = obj.get("keep")
        hashes_value = obj.get("block_hashes")
        hashes: tuple[int, ...] | None = None
        if hashes_value is not None:
            if not isinstance(hashes_value, list):
                raise self.fail(
                    _join(where, "block_hashes"), f"expected a list of integers, got {_kind(hashes_value)}"
                )
            hashes = tuple(
                self.int_(h, f"{_join(where, 'block_hashes')}[{i}]") for i, h in enumerate(hashes_value)
            )
        elif "hash_block_tokens" in obj:
            raise self.fail(_join(where, "hash_block_tokens"), "expected only together with 'block_hashes'")
        subs_value = obj.get("subagents", [])
        if not isinstance(subs_value, list):
            raise self.fail(
                _join(where, "subagents"), f"expected a list of sessions, got {_kind(subs_value)}"
            )
        subs = tuple(self.session(s, f"{_join(where, 'subagents')}[{i}]") for i, s in enumerate(subs_value))
        fork = obj.get("fork_context", False)
        if not isinstance(fork, bool):
            raise self.fail(_join(where, "fork_context"), f"expected true or false, got {_kind(fork)}")
        return Call(
            append_tokens=self.int_(obj["append"], _join(where, "append")),
            output_tokens=self.int_(obj["output"], _join(where, "output"), minimum=1),
            wait_after_s=self.float_(obj.get("wait_s", 0.0), _join(where, "wait_s")),
            min_interval_s=self.float_(obj.get("min_interval_s", 0.0), _join(where, "min_interval_s")),
            keep_tokens=None if keep is None else self.int_(keep, _join(where, "keep")),
            block_hashes=hashes,
            hash_block_tokens=self.int_(
                obj.get("hash_block_tokens", 512), _join(where, "hash_block_tokens"), minimum=1
            ),
            subagents=subs,
            fork_context=fork,
        )

    def check_streams(self, session: Session, where: str, context: int | None) -> None:
        """``keep`` may not exceed the stream it cuts; block hashes must cover the prompt."""
        stream = 0
        prefix = session.prefix_tokens if context is None else context
        for k, call in enumerate(session.calls):
            call_where = f"{_join(where, 'calls')}[{k}]"
            if call.keep_tokens is not None and call.keep_tokens > stream:
                raise self.fail(
                    _join(call_where, "keep"),
                    f"expected at most the stream length before this call ({stream}), "
                    f"got {call.keep_tokens}",
                )
            stream = kept_stream(call, stream) + call.append_tokens
            prompt = prefix + stream
            if prompt < 1:
                raise self.fail(
                    _join(call_where, "append"),
                    "expected a prompt of at least one token (prefix + kept stream + append is 0)",
                )
            if prompt > INT64_MAX:
                raise self.fail(
                    _join(call_where, "append"),
                    f"expected a prompt of at most 2**63 - 1 tokens (prefix + kept stream + append is {prompt})",
                )
            if call.block_hashes is not None:
                need = -(-call.append_tokens // call.hash_block_tokens)
                if len(call.block_hashes) != need:
                    raise self.fail(
                        _join(call_where, "block_hashes"),
                        f"expected ceil({call.append_tokens} appended tokens / {call.hash_block_tokens}) = "
                        f"{need} ids (they name the prompt after the prefix), got {len(call.block_hashes)}",
                    )
            for i, sub in enumerate(call.subagents):
                self.check_streams(
                    sub,
                    f"{_join(call_where, 'subagents')}[{i}]",
                    prompt + call.output_tokens if call.fork_context else None,
                )
            stream += call.output_tokens


def _subagents(session: Session, where: str = "") -> Iterator[tuple[Session, str, str]]:
    """``session`` and every sub-agent under it, depth first in file order: (session, its name to the twin
    (``parent/id`` for a sub-agent), its place in the line ('' for the top-level session))."""

    def walk(s: Session, name: str, where: str) -> Iterator[tuple[Session, str, str]]:
        yield s, name, where
        for k, call in enumerate(s.calls):
            for i, sub in enumerate(call.subagents):
                yield from walk(sub, f"{name}/{sub.id}", f"{_join(where, 'calls')}[{k}].subagents[{i}]")

    return walk(session, session.id, where)


def _check_names(path: PathLike, number: int, session: Session, names: dict[str, tuple[int, str]]) -> None:
    """Every session the twin will run has its own name: a sub-agent is named ``parent/id`` (its requests'
    ``session`` column, and the identity of the tokens it writes), so two sub-agents of one parent with the
    same id, or a sub-agent and another session that come out with the same name, would be one session to
    the twin (the second's prompt served from the first's KV)."""
    for _, name, where in _subagents(session):
        first = names.get(name)
        if first is not None:
            raise WorkloadFormatError(
                path,
                f"session name {name!r} is also that of the session at line {first[0]}"
                f"{', field ' + first[1] if first[1] else ''}; sub-agents are named parent/id, and every name "
                "must be unique in the file",
                line=number,
                field=_join(where, "id"),
            )
        names[name] = (number, _join(where, "id") if where else "")


def _check_group(path: PathLike, number: int, session: Session, seen: dict[str, tuple[int, int]]) -> None:
    """Every session of a prefix group, sub-agents included, gives the group the same length."""
    for s, _, where in _subagents(session):
        if s.prefix_group is None:
            continue
        first = seen.setdefault(s.prefix_group, (s.prefix_tokens, number))
        if first[0] != s.prefix_tokens:
            raise WorkloadFormatError(
                path,
                f"expected {first[0]} for group {s.prefix_group!r} (as on line {first[1]}), "
                f"got {s.prefix_tokens}",
                line=number,
                field=_join(where, "prefix_tokens"),
            )


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value[:40]!r}"
    return type(value).__name__.replace("dict", "object").replace("list", "array")
