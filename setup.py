"""Build hook for the one compiled module, twin._blockpool (the KV block pool's per-block loops).

Everything else is declared in pyproject.toml. The extension is optional: where Cython or a C compiler is
missing, or its build fails, the install goes on without it (with a warning) and twin.kv_cache uses its
pure-Python pool, which gives the same results, only slower.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing the install when the extension cannot be compiled."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as err:  # no compiler at all (DistutilsPlatformError and kin)
            self.warn(f"twin._blockpool not built ({err}); the pure-Python block pool will be used")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as err:  # the compiler failed (CCompilerError, DistutilsExecError)
            self.warn(f"{ext.name} not built ({err}); the pure-Python block pool will be used")


try:
    from Cython.Build import cythonize
except ImportError:  # no Cython in the build environment: pure Python only
    extensions = []
else:
    extensions = cythonize([Extension("twin._blockpool", ["twin/_blockpool.pyx"])],
                           compiler_directives={"language_level": "3"}, quiet=True)

setup(ext_modules=extensions, cmdclass={"build_ext": OptionalBuildExt})
