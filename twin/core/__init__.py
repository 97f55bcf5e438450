"""The twin's pure core: state machines and engine rules, no SimPy.

Requests and their token streams, the KV cache and block pool, the scheduler with its engine policies, the
decode cohort, fast-forward planning, the flow network of KV links, step prices and the ledger. Everything
here counts time in integer nanoseconds (:mod:`twin.core.clock`) handed in by the caller and never runs an
environment: the SimPy processes in :mod:`twin.shell` drive it. A test imports every module here with
SimPy made unimportable.

The install compiles most of these modules ahead of time with mypyc (setup.py); the compiled modules give
the same results as the sources, byte for byte, in less time. This package's loader decides which run:
the compiled ones where all of them are built and none is older than its source, the sources otherwise, or
always with ``SERVETWIN_PURE_PYTHON=1`` (which also turns off the Cython block pool,
:mod:`twin.core.compiled`). :data:`COMPILED` says which. A source edited after the build runs as written
(with a warning to rebuild: ``pip install -e .``), never the stale compiled module beside it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Sequence

_HERE = Path(__file__).resolve().parent
_SHARED_LIBRARY = "servetwin_core__mypyc"
"""The shared library of the compiled modules (setup.py MYPYC_GROUP)."""


def compiled_modules(folder: Path) -> dict[str, Path]:
    """Module name -> its compiled file, for the modules in ``folder`` that have a source and a compiled file."""
    out: dict[str, Path] = {}
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for so in folder.glob(f"*{suffix}"):
            name = so.name[:-len(suffix)]
            if (folder / f"{name}.py").exists():
                out.setdefault(name, so)
    return out


def use_compiled(folder: Path, built: dict[str, Path], pure: bool, library: Path | None) -> tuple[bool, str]:
    """Whether to run the compiled modules ``built`` of ``folder``, and why not (empty when they run).
    ``pure``: SERVETWIN_PURE_PYTHON=1; ``library``: their shared library, which holds their code (each
    module's own file only loads it, and a rebuild may leave it as it was), or None where it is missing."""
    if not built or pure:
        return False, ""
    if library is None:
        return False, f"compiled modules found but not their library {_SHARED_LIBRARY}"
    built_ns = library.stat().st_mtime_ns
    stale = sorted(n for n in built if (folder / f"{n}.py").stat().st_mtime_ns > built_ns)
    if stale:
        return False, f"{', '.join(s + '.py' for s in stale)} changed since the core was compiled"
    return True, ""


def _library() -> Path | None:
    spec = importlib.util.find_spec(_SHARED_LIBRARY)
    return Path(spec.origin) if spec is not None and spec.origin is not None else None


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds this package's modules that have a compiled file at their Python source instead."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in self.names:
            return None
        return importlib.util.spec_from_file_location(fullname, _HERE / f"{name}.py")


_built = compiled_modules(_HERE)
COMPILED, _why_not = use_compiled(_HERE, _built, os.environ.get("SERVETWIN_PURE_PYTHON") == "1",
                                  _library() if _built else None)
"""Whether this process runs the mypyc-compiled core (False: the Python sources)."""
if _why_not:
    warnings.warn(f"twin.core: {_why_not}; running the Python sources (rebuild: pip install -e .)",
                  RuntimeWarning, stacklevel=2)
if _built and not COMPILED:
    sys.meta_path.insert(0, _SourceFinder(set(_built)))
