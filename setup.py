"""Build hook for the compiled parts of the twin: the Cython block pool (twin.core._blockpool: the KV block
pool's per-block loops and the chained block keys' hash loop) and the core's modules compiled ahead of time
with mypyc (twin/core/*.py but for the few listed in MYPYC_SKIP).

Everything else is declared in pyproject.toml. Both are optional: where Cython, mypyc or a C compiler is
missing, or a build fails, the install goes on without that part (with a warning) and the twin runs the
Python sources, which give the same results, only slower. ``SERVETWIN_NO_MYPYC=1`` at install time skips the
mypyc build. At run time twin/core/__init__.py decides whether the compiled modules are used
(``SERVETWIN_PURE_PYTHON=1``, or a source newer than its compiled module, runs the sources).
"""

import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

MYPYC_GROUP = "servetwin_core"
"""Name of the shared library the mypyc-compiled modules live in (``servetwin_core__mypyc``)."""

MYPYC_SKIP = {"__init__.py", "compiled.py", "errors.py", "clock.py"}
"""Core modules left to the interpreter: the package's loader, the compiled-helper lookup, the exception
classes (several built-in bases) and the clock's constants (nothing to gain)."""


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing the install when an extension cannot be compiled: no
    compiler at all (DistutilsPlatformError, raised by run) or a failed compile (CCompilerError,
    DistutilsExecError, raised by build_extension). A failed mypyc module leaves the others unused
    (twin/core/__init__.py loads the sources of every module when one is missing)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as err:
            self._skipped("the compiled extensions", err)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as err:
            self._skipped(ext.name, err)

    def _skipped(self, what: str, err: Exception) -> None:
        self.warn(f"{what} not built ({err}); the twin runs the Python sources instead")


def cython_extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:  # no Cython in the build environment
        return []
    return cythonize([Extension("twin.core._blockpool", ["twin/core/_blockpool.pyx"])],
                     compiler_directives={"language_level": "3"}, quiet=True)


def mypyc_extensions() -> list[Extension]:
    if os.environ.get("SERVETWIN_NO_MYPYC") == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:  # no mypy in the build environment
        return []
    sources = sorted(str(p) for p in Path("twin/core").glob("*.py") if p.name not in MYPYC_SKIP)
    try:
        return mypycify(sources, opt_level="3", group_name=MYPYC_GROUP)
    except BaseException as err:  # a type error mypyc refuses (it exits): run the sources
        print(f"warning: twin/core not compiled with mypyc ({err!r}); the twin runs the Python sources")
        return []


setup(ext_modules=cython_extensions() + mypyc_extensions(), cmdclass={"build_ext": OptionalBuildExt})
