"""The compiled helpers of ``twin.core._blockpool`` (Cython), looked up in one place.

Where the extension is built (setup.py), ``compiled(name)`` is its attribute ``name``; where it is not built,
or is an older build without that name, or ``SERVETWIN_PURE_PYTHON=1`` is set (for comparisons), it is None and
the caller keeps its pure-Python version, which gives the same results. (The core's modules compiled with
mypyc are chosen by the package's loader, twin/core/__init__.py.)
"""

from __future__ import annotations

import os
from typing import Any


def compiled(name: str) -> Any | None:
    if os.environ.get("SERVETWIN_PURE_PYTHON") == "1":
        return None
    try:
        import twin.core._blockpool as module
    except ImportError:  # not built (no C compiler or Cython at install time)
        return None
    return getattr(module, name, None)
