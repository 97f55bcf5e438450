"""Build hook for the one compiled module, twin.core._blockpool (the KV block pool's per-block loops and the
chained block keys' hash loop).

Everything else is declared in pyproject.toml. The extension is optional: where Cython or a C compiler is
missing, or its build fails, the install goes on without it (with a warning) and twin.core.kv_cache and
twin.core.tokens use their pure-Python pool and key loop, which give the same results, only slower.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing the install when the extension cannot be compiled: no
    compiler at all (DistutilsPlatformError, raised by run) or a failed compile (CCompilerError,
    DistutilsExecError, raised by build_extension)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as err:
            self._skipped(err)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as err:
            self._skipped(err)

    def _skipped(self, err: Exception) -> None:
        self.warn(f"twin.core._blockpool not built ({err}); the pure-Python block pool will be used")


try:
    from Cython.Build import cythonize
except ImportError:  # no Cython in the build environment: pure Python only
    extensions = []
else:
    extensions = cythonize([Extension("twin.core._blockpool", ["twin/core/_blockpool.pyx"])],
                           compiler_directives={"language_level": "3"}, quiet=True)

setup(ext_modules=extensions, cmdclass={"build_ext": OptionalBuildExt})
