"""Builds the Cython codec from native/ into shallowmirror.codec.

Every ``native/<name>.pyx`` becomes the extension ``shallowmirror.codec.<name>``, except the
engine's loops (``PACKAGE_OF``). The build is
mandatory when ``SHALLOWMIRROR_REQUIRE_NATIVE=1`` (CI, production images); otherwise a failed
compile leaves the pure-Python twin in charge and says so.
"""

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
REQUIRE_NATIVE = os.environ.get("SHALLOWMIRROR_REQUIRE_NATIVE") == "1"
#: Native modules that are not the codec's: the package each one is built into.
PACKAGE_OF = {"_cloops": "shallowmirror.engine", "_csend": "shallowmirror.net"}


def native_extensions():
    from Cython.Build import cythonize
    from setuptools import Extension

    sources = sorted((HERE / "native").glob("*.pyx"))
    extensions = [
        Extension(
            f"{PACKAGE_OF.get(src.stem, 'shallowmirror.codec')}.{src.stem}",
            [str(src.relative_to(HERE))],
            extra_compile_args=["-O3"],
        )
        for src in sources
    ]
    return cythonize(
        extensions,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    )


class OptionalBuildExt(build_ext):
    """Compile the codec; fall back to the twin unless the native build is required."""

    def run(self):
        try:
            super().run()
        except Exception as err:  # noqa: BLE001 - any compiler failure
            self._fallback(err)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as err:  # noqa: BLE001
            self._fallback(err)

    def _fallback(self, err):
        if REQUIRE_NATIVE:
            raise
        print(f"shallowmirror: native codec not built ({err}); the pure-Python twin will be used",
              file=sys.stderr)


setup(ext_modules=native_extensions(), cmdclass={"build_ext": OptionalBuildExt})
