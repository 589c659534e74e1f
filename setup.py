"""The compiled row codec (``cdc.render._compiled``), an optional extension: everything else is in
pyproject.toml.

Cython is a build requirement (pyproject.toml), so ``pip install`` (editable or not) compiles
``src/cdc/render/_compiled.pyx`` on a machine with a C compiler and Python's headers. Where that fails
(no compiler, no headers, no Cython in a non-isolated build) the install still succeeds without it,
and the daemon runs on the pure-Python reference codec and says so at start-up (``cdc.render.codec``).
"""

from setuptools import setup
from setuptools.extension import Extension

try:
    from Cython.Build import cythonize
except ImportError:  # a build without its build requirements (--no-build-isolation): no extension
    ext_modules = []
else:
    ext_modules = cythonize(
        [Extension("cdc.render._compiled", ["src/cdc/render/_compiled.pyx"], optional=True)],
        compiler_directives={"language_level": "3"},
    )

setup(ext_modules=ext_modules)
