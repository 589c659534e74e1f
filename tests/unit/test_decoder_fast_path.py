"""The decoder's compiled fast path (cdc.decoder._changes) against its Python reference
(cdc.decoder.fast.FastChangesReference): the same payloads fed to a decoder on each must give
the same events, field by field (rendered rows by their bytes and key), the same transaction state after
each, and the same errors. Rows rendered for JSON and typed, every op and replica identity, NULLs, unchanged
TOAST, key changes, short and malformed messages; hypothesis for the rest."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings

from cdc.decoder.changes import CHOSEN_FAST_CHANGES, ChangeDecoder
from cdc.decoder.fast import FastChangesReference
from cdc.event import ChangeEvent
from cdc.lsn import Lsn
from cdc.render.codec import TableRenderer
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.rendering import RenderedRow
from tests.support.envelope_workload import TABLES, transactions, workload
from tests.support.pgoutput import delete, insert, relation, tuple_data, update

try:
    from cdc.decoder._changes import FastChanges
except ImportError as exc:  # pragma: no cover - a build without the compiled modules
    if CHOSEN_FAST_CHANGES is not None or not os.environ.get("CDC_PURE_PYTHON"):
        raise ImportError(f"the compiled decoder fast path is not built ({exc}): pip install -e . builds it") from exc
    pytest.skip("cdc.decoder._changes is not built and CDC_PURE_PYTHON is set", allow_module_level=True)


def new_decoder(compiled: bool, rendered: bool) -> ChangeDecoder:
    renderer = None
    if rendered:
        ser = JsonSerializer(JsonSettings(topic_prefix="p", database="db"), lambda topic: 2)
        renderer = TableRenderer(ser.row_rendering)
    tables = {f"{info.schema}.{info.name}": info for info, _, _ in TABLES.values()}
    # each side chosen here, whatever CDC_PURE_PYTHON says
    decoder = ChangeDecoder(tables, {}, renderer=renderer, fast_changes=FastChanges if compiled else None)
    fast = decoder.fast_change
    chosen = fast if compiled else getattr(fast, "__self__", None)  # the reference: a bound method
    assert isinstance(chosen, FastChanges if compiled else FastChangesReference)
    for rel, (info, columns, identity) in TABLES.items():
        decoder.feed(relation(rel, info.schema, info.name, identity, columns), Lsn(0x10))
    return decoder


def plain(value: Any) -> Any:
    """An event's fields as comparable values (a RenderedRow compares by identity, a NaN numeric unequal to
    itself: typed values by their repr)."""
    if isinstance(value, RenderedRow):
        return ("rendered", value.data, value.key_data, plain(value.key))
    if isinstance(value, dict):
        return ("typed", tuple((k, type(v).__name__, repr(v)) for k, v in value.items()))
    if isinstance(value, ChangeEvent):
        return ("change", *(plain(getattr(value, name)) for name in ChangeEvent.__slots__))
    return value


def run(decoder: ChangeDecoder, payloads: Sequence[tuple[bytes, int]]) -> list[Any]:
    out: list[Any] = []
    for payload, lsn in payloads:
        try:
            events = [plain(e) for e in decoder.feed(payload, Lsn(lsn))]
        except Exception as exc:
            events = [(type(exc).__name__, str(exc))]
        tx = decoder.tx
        state = (tx.ordinal, tx.last_lsn, tx.xid, tx.commit_lsn, tx.commit_ts)
        out.append((events, state))
    return out


def compare(payloads: Sequence[tuple[bytes, int]], rendered: bool) -> list[Any]:
    reference = run(new_decoder(False, rendered), payloads)
    compiled = run(new_decoder(True, rendered), payloads)
    assert compiled == reference
    return reference


def malformed() -> list[tuple[bytes, int]]:
    """Changes the fast path must decline (the general path then names what is wrong, or decodes it)."""
    good = insert(
        16384,
        tuple_data(
            b"7", b"n", b"1.50", b"2026-01-02 03:04:05+00", b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", b"{}", b"x"
        ),
    )
    return [
        (good[:3], 0x100),  # shorter than a relation id
        (good[:5], 0x101),  # no tuple marker
        (good[:-1], 0x102),  # a cut tuple
        (good + b"\x00", 0x103),  # a byte after the tuple
        (good[:5] + b"X" + good[6:], 0x104),  # an unknown tuple marker
        (insert(99999, tuple_data(b"1")), 0x105),  # an unknown relation
        (update(16384, tuple_data(b"1", None, None, None, None, None, None), key=tuple_data(b"1"))[:-3], 0x106),
        (delete(16385, key=tuple_data(b"1", None, None))[:7], 0x107),
    ]


@pytest.mark.parametrize("rendered", [True, False])
def test_every_op_and_shape_gives_the_same_events_and_state(rendered: bool) -> None:
    seen = compare(workload(), rendered)
    changes = [e for events, _ in seen for e in events if isinstance(e, tuple) and e[0] == "change"]
    assert len(changes) >= 15 and {e[1] for e in changes} >= {"c", "u", "d"}
    assert any(e[0] == "rendered" for c in changes for e in c[3:5] if isinstance(e, tuple)) == rendered


@pytest.mark.parametrize("rendered", [True, False])
def test_malformed_changes_decline_to_the_general_path_alike(rendered: bool) -> None:
    begin_and_all = workload()[:1] + malformed()
    seen = compare(begin_and_all, rendered)
    errors = [e for events, _ in seen for e in events if isinstance(e, tuple) and e[0] != "change"]
    assert len(errors) >= 5, errors  # named by the general path


@settings(max_examples=200, deadline=None)
@given(transactions())
def test_random_transactions_give_the_same_events(payloads: list[tuple[bytes, int]]) -> None:
    compare(payloads, True)
    compare(payloads, False)
