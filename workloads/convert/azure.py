"""Azure LLM inference traces (CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``) -> one-call sessions."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from workloads.errors import WorkloadFormatError
from workloads.sessions import Session
from workloads.traces import read_request_csv

PathLike = str | os.PathLike[str]


def convert_azure(inputs: Sequence[PathLike]) -> list[Session]:
    """Each file's rows, times relative to its own first row; ids ``{file stem}-{row}``.

    Any of :func:`workloads.traces.read_request_csv`'s column sets is accepted, so Vidur request lists
    convert the same way.
    """
    sessions: list[Session] = []
    stems: dict[str, PathLike] = {}
    for path in inputs:
        stem = Path(path).name.split(".")[0]
        # (by name, not identity: the same path object listed twice passed ``is``, and its ids repeated)
        if stem in stems:
            raise WorkloadFormatError(path, f"its session ids ({stem}-N) would repeat those of {stems[stem]}, "
                                            f"whose name starts the same")
        stems[stem] = path
        sessions.extend(read_request_csv(path, id_prefix=stem))
    return sessions
