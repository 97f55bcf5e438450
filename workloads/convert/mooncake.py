"""Mooncake traces (JSONL of ``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``) -> sessions.

``hash_ids`` name the prompt's 512-token blocks (equal ids = equal prefix blocks), so they become
``Call.block_hashes`` with ``hash_block_tokens = 512``; mapping them to the engine's block size is the
simulator's job. Arrival is ``timestamp / 1000`` s as written (the released traces start at 0). A line
must have exactly these four keys and ``ceil(input_length / 512)`` ids.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from workloads.errors import WorkloadFormatError, is_finite, parse_json, utf8_lines
from workloads.sessions import INT64_MAX, Call, Session

PathLike = str | os.PathLike[str]
MOONCAKE_BLOCK_TOKENS = 512
_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def convert_mooncake(
    inputs: Sequence[PathLike], *, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> list[Session]:
    """Every request of the given trace files; ids ``{file stem}-{row}`` (row from 0)."""
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise ValueError(f"block_tokens must be an integer >= 1, got {block_tokens!r}")
    sessions: list[Session] = []
    stems: dict[str, PathLike] = {}
    for path in inputs:
        stem = Path(path).name.split(".")[0]
        # (by name, not identity: the same path object listed twice passed ``is``, and its ids repeated)
        if stem in stems:
            raise WorkloadFormatError(path, f"its session ids ({stem}-N) would repeat those of {stems[stem]}, "
                                            f"whose name starts the same")
        stems[stem] = path
        with open(path, encoding="utf-8") as handle:
            row = 0
            for number, text in enumerate(utf8_lines(path, handle), start=1):
                if not text.strip():  # a blank line (a trailing one, as editors leave) holds no request
                    continue
                sessions.append(_request(path, number, text, f"{stem}-{row}", block_tokens))
                row += 1
    return sessions


def _request(path: PathLike, line: int, text: str, sid: str, block_tokens: int) -> Session:
    obj = parse_json(path, text, line)
    if not isinstance(obj, dict):
        raise WorkloadFormatError(path, "expected a request object", line=line)
    for key in _KEYS:
        if key not in obj:
            raise WorkloadFormatError(path, f"missing; expected keys {list(_KEYS)}", line=line, field=key)
    extra = sorted(set(obj) - set(_KEYS))
    if extra:
        raise WorkloadFormatError(
            path, f"unknown key; expected keys {list(_KEYS)}", line=line, field=extra[0]
        )
    stamp = obj["timestamp"]
    # (an integer beyond any float, compared exactly, passed ``< inf`` and made ``stamp / 1000`` overflow)
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not (is_finite(stamp) and stamp >= 0):
        raise WorkloadFormatError(
            path, f"expected milliseconds >= 0, got {stamp!r}", line=line, field="timestamp"
        )
    lengths = []
    for key in ("input_length", "output_length"):
        value = obj[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WorkloadFormatError(path, f"expected an integer >= 1 (a request has a prompt and generates at "
                                            f"least one token), got {value!r}", line=line, field=key)
        if value > INT64_MAX:  # the session-script reader refuses it: the converted file would not read back
            raise WorkloadFormatError(path, f"expected an integer of at most 2**63 - 1 (64 bits), got {value}",
                                      line=line, field=key)
        lengths.append(value)
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        raise WorkloadFormatError(
            path, f"expected an array of block ids, got {ids!r}", line=line, field="hash_ids"
        )
    for i, h in enumerate(ids):
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= INT64_MAX:
            raise WorkloadFormatError(
                path, f"expected an integer id >= 0 of at most 2**63 - 1 (64 bits), got {h!r}", line=line,
                field=f"hash_ids[{i}]"
            )
    need = -(-lengths[0] // block_tokens)
    if len(ids) != need:
        raise WorkloadFormatError(
            path,
            f"expected ceil({lengths[0]} / {block_tokens}) = {need} ids, got {len(ids)}",
            line=line,
            field="hash_ids",
        )
    return Session(
        id=sid,
        arrival_s=stamp / 1000.0,
        calls=(
            Call(
                append_tokens=lengths[0],
                output_tokens=lengths[1],
                block_hashes=tuple(ids),
                hash_block_tokens=block_tokens,
            ),
        ),
    )
