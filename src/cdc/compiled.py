"""The one place that chooses, at start-up, between each compiled extension and its pure-Python reference, in
the manner of psycopg's ``psycopg/pq/__init__.py``: the choice is made once, when this module is imported
(``CHOSEN``), reported once (``log_choice``, the ``row_codec`` event), and every object that has a compiled
form is handed the chosen class or function when it is built. Nothing else imports an extension or reads
``CDC_PURE_PYTHON``.

The extensions (``ROLES``) and their references, each pair writing the same bytes and events:

- ``row_codec``: ``cdc.render._compiled.RowCodec``, the decoder's and the snapshot's rendered rows; the
  reference is ``cdc.render.rows.render_parser`` (``cdc.render.codec.TableRenderer`` is built with one);
- ``envelope``: ``cdc.sink._envelope.JsonRecords``/``AvroRecords``, a serializer's ``records`` of a row change
  of rendered rows; the reference is ``EventSerializer.reference_records`` (``cdc.sink.envelopes``);
- ``delivery``: ``cdc.sink._delivery.Sender``, the at-least-once delivery's ``send``; the reference is
  ``AtLeastOnce.send_reference``;
- ``decoder``: ``cdc.decoder._changes.FastChanges``, the decoder's fast path of a row change;
- ``snapshot_send``: ``cdc.snapshot._send.send_rendered``, a rendered JSON snapshot chunk's loop; the
  reference is ``cdc.snapshot.send.send_rendered``.

Each extension imports nothing of this package at its own import (what it needs of the Python side is handed
to it when its objects are built), so loading one here pulls in no layer: a leaf module, which the decoder,
the rendering, the sink and the snapshot can all import. The modules are named by string for that reason:
this module depends on the extensions, never on their packages' Python modules.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final, Literal

import structlog

FORCE_REFERENCE_ENV: Final = "CDC_PURE_PYTHON"
"""Set to anything but ``""`` or ``"0"``: the pure-Python references, compiled modules or not."""

Role = Literal["row_codec", "envelope", "delivery", "decoder", "snapshot_send"]

ROLES: Final[dict[Role, str]] = {
    "row_codec": "cdc.render._compiled",
    "envelope": "cdc.sink._envelope",
    "delivery": "cdc.sink._delivery",
    "decoder": "cdc.decoder._changes",
    "snapshot_send": "cdc.snapshot._send",
}
"""Each compiled extension by what it does."""

BUILD_FIX: Final = (
    "reinstall the package where a C compiler and Python's headers are present (pip install -e . builds "
    "the compiled modules with Cython; e.g. apt-get install gcc python3-dev), or ignore this: the reference "
    "writes the same records, more slowly"
)


def reference_forced() -> bool:
    """Whether ``CDC_PURE_PYTHON`` asks for the references."""
    return os.environ.get(FORCE_REFERENCE_ENV, "") not in ("", "0")


@dataclass(frozen=True, slots=True)
class Choice:
    """What start-up chose: the compiled module of each role that runs, and why each other one does not."""

    forced: bool  # CDC_PURE_PYTHON asked for the references
    modules: Mapping[Role, ModuleType] = field(default_factory=dict)
    missing: Mapping[Role, str] = field(default_factory=dict)  # role -> why its reference runs

    def module(self, role: Role) -> ModuleType | None:
        """The compiled module of ``role``, or None: its reference runs."""
        return self.modules.get(role)

    def compiled(self, role: Role, name: str) -> Any:
        """The class or function ``name`` of ``role``'s compiled module, or None: its reference runs."""
        module = self.modules.get(role)
        return None if module is None else getattr(module, name)

    def implementation(self, role: Role) -> Literal["compiled", "reference"]:
        return "compiled" if role in self.modules else "reference"


def load(*, force_reference: bool | None = None) -> Choice:
    """Import every compiled extension, or note why not (``force_reference``: default ``CDC_PURE_PYTHON``)."""
    forced = reference_forced() if force_reference is None else force_reference
    if forced:
        return Choice(True, {}, dict.fromkeys(ROLES, f"{FORCE_REFERENCE_ENV} is set"))
    modules: dict[Role, ModuleType] = {}
    missing: dict[Role, str] = {}
    for role, name in ROLES.items():
        try:
            modules[role] = importlib.import_module(name)
        except ImportError as exc:
            missing[role] = f"{name} is not built: {exc}"
    return Choice(False, modules, missing)


CHOSEN: Final = load()
"""The choice of this process, made once at its first import of this module."""


def log_choice(log: Any = None, choice: Choice = CHOSEN) -> None:
    """Say once at start-up what runs: the ``row_codec`` event naming each role's implementation, or, when
    the row codec is not compiled although ``CDC_PURE_PYTHON`` did not ask for that, the warning
    ``row_codec_not_compiled`` with the fix."""
    log = log if log is not None else structlog.get_logger(__name__)
    fields = {
        "decoder": choice.implementation("decoder"),
        "delivery": choice.implementation("delivery"),
        "snapshot": choice.implementation("snapshot_send"),
    }
    codec = choice.module("row_codec")
    if codec is not None:
        envelope = choice.implementation("envelope")
        log.info(
            "row_codec",
            implementation="compiled",
            module=codec.__file__,
            json_envelope=envelope,
            avro_envelope=envelope,
            **fields,
        )
    elif choice.forced:
        log.info("row_codec", implementation="reference", reason=choice.missing["row_codec"], **fields)
    else:
        log.warning(
            "row_codec_not_compiled",
            implementation="reference",
            reason=choice.missing["row_codec"],
            fix=BUILD_FIX,
            **fields,
        )
