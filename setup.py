"""Build hook for the one compiled module, twin._blockpool (the KV block pool's per-block loops).

Everything else is declared in pyproject.toml. The extension is optional: where Cython or a C compiler is
missing, or the build fails, the install goes on without it and twin.kv_cache uses its pure-Python pool,
which gives the same results (only slower).
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython in the build environment: pure Python only
    extensions = []
else:
    extensions = cythonize(
        [Extension("twin._blockpool", ["twin/_blockpool.pyx"], optional=True)],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )

setup(ext_modules=extensions)
