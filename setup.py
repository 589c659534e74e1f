"""The compiled row codec (``cdc.render._compiled``), the JSON and Avro envelopes around its rows
(``cdc.sink._envelope``), the at-least-once delivery's per-record path (``cdc.sink._delivery``), the
decoder's fast path (``cdc.decoder._changes``) and the snapshot's loop of a rendered JSON chunk
(``cdc.snapshot._send``): optional extensions (``cdc.compiled`` loads each, or its pure-Python reference);
everything else is in pyproject.toml.

Cython is a build requirement (pyproject.toml), so ``pip install`` (editable or not) compiles the
``.pyx`` modules on a machine with a C compiler and Python's headers. Where one fails (no compiler, no
headers, no Cython in a build without isolation, a module Cython cannot translate) the install still
succeeds without it, with a warning naming it, and the daemon runs on that module's pure-Python reference
and says so at start-up (the ``row_codec`` event, ``cdc.compiled``).
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
        except Exception as exc:
            _skipped(exc, "the compiled modules")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            _skipped(exc, ext.name)

    def copy_extensions_to_source(self) -> None:  # editable installs: nothing to copy when the build failed
        try:
            super().copy_extensions_to_source()
        except Exception as exc:
            _skipped(exc, "the compiled modules")

    def get_outputs(self) -> list[str]:  # only what was built: an editable install looks for each output
        import os

        return [path for path in super().get_outputs() if os.path.exists(path)]


def _skipped(exc: BaseException, what: str) -> None:
    print(
        f"WARNING: {what} was not built ({exc}); cdc runs on the pure-Python reference in its place. "
        "To build it: a C compiler and Python's headers (apt-get install gcc python3-dev), then reinstall.",
        file=sys.stderr,
    )


# One cythonize call per module: a module Cython cannot translate is left out alone, the others are built (each
# module's users take their pure-Python reference where that module is missing).
EXTENSIONS = (
    ("cdc.render._compiled", "src/cdc/render/_compiled.pyx"),
    ("cdc.sink._envelope", "src/cdc/sink/_envelope.pyx"),
    ("cdc.sink._delivery", "src/cdc/sink/_delivery.pyx"),
    ("cdc.decoder._changes", "src/cdc/decoder/_changes.pyx"),
    ("cdc.snapshot._send", "src/cdc/snapshot/_send.pyx"),
)
ext_modules = []
if cythonize is not None:
    for name, source in EXTENSIONS:
        try:
            ext_modules += cythonize(
                [Extension(name, [source], optional=True)],
                compiler_directives={"language_level": "3"},
                build_dir="build/cython",  # the C sources out of the package (and the wheel)
            )
        except Exception as exc:
            _skipped(exc, name)
else:
    _skipped(ImportError("Cython is not installed in the build environment"), "the compiled modules")

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
