"""Azure LLM inference traces (CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``) -> one-call sessions."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from workloads.sessions import Session
from workloads.traces import read_request_csv

PathLike = str | os.PathLike[str]


def convert_azure(inputs: Sequence[PathLike]) -> list[Session]:
    """Each file's rows, times relative to its own first row; ids ``{file stem}-{row}``.

    Any of :func:`workloads.traces.read_request_csv`'s column sets is accepted, so Vidur request lists
    convert the same way.
    """
    sessions: list[Session] = []
    for path in inputs:
        sessions.extend(read_request_csv(path, id_prefix=Path(path).name.split(".")[0]))
    return sessions
