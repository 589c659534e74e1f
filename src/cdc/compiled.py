"""The switch of the compiled extensions (the row codec and envelopes in ``cdc.render``, the decoder's fast path in
``cdc.decoder._changes``, the at-least-once sender in ``cdc.sink._delivery``, the snapshot's loop of a rendered
JSON chunk in ``cdc.snapshot._send``). Each has a pure-Python reference
that writes the same bytes and events; each user loads its own module and takes the reference when the module is
missing or when this switch asks for it. A leaf module, so that the decoder, the sink and the rendering can all
read it without importing each other."""

from __future__ import annotations

import os
from typing import Final

FORCE_REFERENCE_ENV: Final = "CDC_PURE_PYTHON"
"""Set to anything but ``""`` or ``"0"``: the pure-Python references, compiled modules or not."""


def reference_forced() -> bool:
    return os.environ.get(FORCE_REFERENCE_ENV, "") not in ("", "0")
