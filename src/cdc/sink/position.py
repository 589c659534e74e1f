"""Where a record sits in the source's commit order, read back from a record: its ``cdc.*`` position headers
when it has them, else the Debezium envelope's ``source`` block.

What replaces which header (``kafka.position_headers: false``):

==================  ====================================================================================
``cdc.lsn``         ``source.lsn`` (an int64), and the second element of ``source.sequence``
``cdc.commit_lsn``  the first element of ``source.sequence``: ``["<commit lsn>","<lsn>"]``, decimal
                    strings; this connector writes the event's own transaction's commit LSN there (null
                    for a message outside a transaction)
``cdc.txid``        ``source.txId``
``cdc.ordinal``     nothing: the envelope does not say it. Records of one commit are ordered by their
                    LSN instead; each schema history version records the LSN of its commit's last
                    change before it (``after_lsn``, ``cdc.schema_history``), so a reader places a
                    record by ``(commit LSN, LSN)``.
==================  ====================================================================================

A tombstone has no value, so without headers it has no position of its own: it follows its delete event
(same key, same partition, the record before it), whose envelope has the position. A reader that needs a
tombstone's position takes that record's (the Spark jobs do, ``cdc_views.reader.latest``). Records that
are not envelopes are not read for positions: outbox events keep their headers whatever the setting (their
value is the application's payload, with no source block), and the daemon's own topics (offsets, snapshot
progress, schema history) carry their positions in their values.

Pure: bytes in, values out. The Spark jobs compute the same with Spark expressions
(``cdc_views.reader.envelopes``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from cdc.sink.wire import COMMIT_LSN_HEADER, LSN_HEADER, ORDINAL_HEADER, TXID_HEADER


class PositionError(ValueError):
    """A record's position cannot be read; the message names what is wrong and the fix."""


@dataclass(frozen=True, slots=True)
class RecordPosition:
    """What a record says about its position; None where it says nothing."""

    lsn: int | None = None
    commit_lsn: int | None = None
    txid: int | None = None
    ordinal: int | None = None

    def or_else(self, other: RecordPosition) -> RecordPosition:
        """Each field from ``self``, or from ``other`` where ``self`` has none."""
        return RecordPosition(
            self.lsn if self.lsn is not None else other.lsn,
            self.commit_lsn if self.commit_lsn is not None else other.commit_lsn,
            self.txid if self.txid is not None else other.txid,
            self.ordinal if self.ordinal is not None else other.ordinal,
        )


_HEADER_FIELDS = {LSN_HEADER: "lsn", COMMIT_LSN_HEADER: "commit_lsn", TXID_HEADER: "txid", ORDINAL_HEADER: "ordinal"}


def from_headers(headers: Iterable[tuple[str, bytes | str | None]] | None) -> RecordPosition:
    """The ``cdc.*`` position headers (decimal ASCII), as a consumer gets them (``Message.headers()``)."""
    found: dict[str, int] = {}
    for name, value in headers or ():
        field = _HEADER_FIELDS.get(name)
        if field is None or value is None:
            continue
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        if not text.isdigit():
            raise PositionError(
                f"header {name} is {text[:40]!r}, not a decimal LSN or number; fix what wrote the record"
            )
        found[field] = int(text)
    return RecordPosition(**found)


def parse_sequence(sequence: str | None) -> tuple[int | None, int | None]:
    """``source.sequence``, ``'["<commit lsn>","<lsn>"]'`` (either may be null) -> (commit LSN, LSN)."""
    if sequence is None:
        return None, None
    try:
        items = orjson.loads(sequence)
    except orjson.JSONDecodeError:
        items = None
    if not isinstance(items, list) or len(items) != 2 or not all(_lsn_text(i) for i in items):
        raise PositionError(
            f"source.sequence is {sequence[:80]!r}, not a JSON array of two decimal LSN strings or nulls "
            '(["<commit lsn>","<lsn>"]); fix what wrote the record, or turn kafka.position_headers on'
        )
    return tuple(None if i is None else int(i) for i in items)  # type: ignore[return-value]


def _lsn_text(item: Any) -> bool:
    return item is None or (isinstance(item, str) and item.isdigit())


def from_source(source: Mapping[str, Any]) -> RecordPosition:
    """The envelope's ``source`` block (a dict: JSON parsed, or an Avro record decoded) -> its position."""
    commit_lsn, sequence_lsn = parse_sequence(source.get("sequence"))
    lsn, txid = source.get("lsn"), source.get("txId")
    for name, value in (("lsn", lsn), ("txId", txid)):
        if value is not None and type(value) is not int:
            raise PositionError(f"source.{name} is {value!r:.40}, not an integer; fix what wrote the record")
    return RecordPosition(lsn if lsn is not None else sequence_lsn, commit_lsn, txid, None)


def json_source(value: bytes) -> Mapping[str, Any]:
    """The ``source`` block of a JSON envelope, with or without the Kafka Connect schema block."""
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise PositionError(
            f"the value is not JSON ({e}); a JSON change record's value is a Debezium envelope"
        ) from None
    if isinstance(data, dict) and "payload" in data and "schema" in data:
        data = data["payload"]
    source = data.get("source") if isinstance(data, dict) else None
    if not isinstance(source, dict):
        raise PositionError("the value has no 'source' object: not a Debezium envelope (format json)")
    return source


def record_position(
    headers: Iterable[tuple[str, bytes | str | None]] | None,
    value: bytes | None,
    *,
    source: Mapping[str, Any] | None = None,
) -> RecordPosition:
    """A record's position: its headers first, the envelope's source block for what they lack. ``value``:
    a JSON envelope; for Avro pass the decoded ``source`` instead. A tombstone (no value, no source) has
    only what its headers say."""
    position = from_headers(headers)
    if position.lsn is not None and position.commit_lsn is not None and position.txid is not None:
        return position
    if source is None and value is not None:
        source = json_source(value)
    return position if source is None else position.or_else(from_source(source))
