"""The error every reader and converter raises for bad input: it names the file, position and expectation."""

from __future__ import annotations

import os


class WorkloadFormatError(ValueError):
    """Malformed workload input: ``path[:line]: field: what was expected``."""

    def __init__(
        self, path: str | os.PathLike[str], message: str, *, line: int | None = None, field: str | None = None
    ) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.detail = message
        where = self.path if line is None else f"{self.path}:{line}"
        text = f"{where}: {field}: {message}" if field else f"{where}: {message}"
        super().__init__(text)
