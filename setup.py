"""The compiled row codec (``cdc.render._compiled``, the JSON and Avro envelopes around its rows,
``cdc.render._envelope``, the at-least-once delivery's per-record path, ``cdc.sink._delivery``, and the
decoder's fast path, ``cdc.decoder._changes``),
optional extensions: everything else is in pyproject.toml.

Cython is a build requirement (pyproject.toml), so ``pip install`` (editable or not) compiles
``src/cdc/render/_compiled.pyx`` on a machine with a C compiler and Python's headers. Where that fails
(no compiler, no headers, no Cython in a build without isolation) the install still succeeds without it,
with a warning, and the daemon runs on the pure-Python reference codec and says so at start-up
(``cdc.render.codec``).
"""

import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.extension import Extension

try:
    from Cython.Build import cythonize
except ImportError:  # a build without its build requirements (--no-build-isolation)
    cythonize = None


class OptionalBuildExt(build_ext):
    """build_ext that leaves the extension out, with a warning, on any failure: setuptools' own
    ``optional=True`` lets a missing compiler executable (OSError) fail the whole install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - anything: the package works without the extension
            _skipped(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            _skipped(exc)

    def copy_extensions_to_source(self) -> None:  # editable installs: nothing to copy when the build failed
        try:
            super().copy_extensions_to_source()
        except Exception as exc:  # noqa: BLE001
            _skipped(exc)

    def get_outputs(self) -> list[str]:  # only what was built: an editable install looks for each output
        import os

        return [path for path in super().get_outputs() if os.path.exists(path)]


def _skipped(exc: BaseException) -> None:
    print(
        f"WARNING: cdc.render._compiled was not built ({exc}); cdc runs on its pure-Python row codec. "
        "To build it: a C compiler and Python's headers (apt-get install gcc python3-dev), then reinstall.",
        file=sys.stderr,
    )


ext_modules = []
if cythonize is not None:
    try:
        ext_modules = cythonize(
            [
                Extension("cdc.render._compiled", ["src/cdc/render/_compiled.pyx"], optional=True),
                Extension("cdc.render._envelope", ["src/cdc/render/_envelope.pyx"], optional=True),
                Extension("cdc.sink._delivery", ["src/cdc/sink/_delivery.pyx"], optional=True),
                Extension("cdc.decoder._changes", ["src/cdc/decoder/_changes.pyx"], optional=True),
            ],
            compiler_directives={"language_level": "3"},
            build_dir="build/cython",  # its C source out of the package (and the wheel)
        )
    except Exception as exc:  # noqa: BLE001
        _skipped(exc)
else:
    _skipped(ImportError("Cython is not installed in the build environment"))

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
