"""The decoder against a real server, without Kafka: ReplicationStream + ChangeDecoder, as the daemon wires them.

``DecoderSession`` reads the catalog the way the daemon's start-up does (tables,
their types), creates the publication and the slot, starts replication with
the protocol ``protocol_for`` picks, and feeds every payload to a
``ChangeDecoder``. ``mark(conn, name)`` writes a logical message after a
workload; ``events_until(name)`` returns every event up to it, the marker's
own transaction left out.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from cdc.catalog import TableInfo, apply_publication, column_type_oids, describe_tables, load_types, plan_publication
from cdc.config import TableConfig
from cdc.decoder.changes import ChangeDecoder
from cdc.decoder.spool import Spool
from cdc.decoder.types import BUILTIN_TYPES
from cdc.event import ChangeEvent, Event, MessageEvent, PgType, TxBegin, TxCommit
from cdc.lsn import Lsn
from cdc.replication import ReplicationStream, protocol_for

MARKER = "cdc.test.marker"


def mark(conn: psycopg.Connection[Any], name: str) -> None:
    """A transactional logical message after the workload: the reader stops at it."""
    conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", (MARKER, name))


class DecoderSession:
    def __init__(
        self,
        dsn: str,
        *,
        slot: str,
        publication: str,
        tables: Sequence[str],
        streaming: bool = False,
        spool_dir: Path | None = None,
        work_mem: str | None = None,
        create_slot: bool = True,
    ) -> None:
        self.dsn = dsn
        self.slot = slot
        self.publication = publication
        self.table_names = list(tables)
        self.streaming = streaming
        self.spool_dir = spool_dir
        self.work_mem = work_mem
        self.create_slot = create_slot
        self.kinds: dict[str, int] = {}  # payloads received, by message type byte
        self.payloads: list[tuple[bytes, Lsn]] = []  # every payload received, to feed other decoders
        self.tables: dict[str, TableInfo] = {}
        self.types: dict[int, PgType] = {}
        self._stream: ReplicationStream | None = None
        self._decoder: ChangeDecoder | None = None
        self._spool: Spool | None = None
        self._pending: list[Event] = []

    @property
    def decoder(self) -> ChangeDecoder:
        assert self._decoder is not None
        return self._decoder

    def prepare(self) -> DecoderSession:
        """Catalog, publication and slot (changes from here on are captured); no streaming yet."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            self.tables = describe_tables(conn, [TableConfig(name=t) for t in self.table_names])
            oids = column_type_oids(conn, [t.oid for t in self.tables.values()])
            types = load_types(conn, [o for o in oids if o not in BUILTIN_TYPES])
            self.types = dict(types)
            apply_publication(conn, plan_publication(conn, self.publication, self.tables.keys()))
        if self.streaming:
            assert self.spool_dir is not None, "streaming needs a spool directory"
            self._spool = Spool(self.spool_dir)
        self._decoder = ChangeDecoder(self.tables, types, spool=self._spool)
        if self.create_slot:
            stream = ReplicationStream(self.dsn)
            stream.connect()
            try:
                stream.create_slot(self.slot)
            finally:
                stream.close()
        return self

    def start(self) -> DecoderSession:
        if self._decoder is None:
            self.prepare()
        conninfo = self.dsn
        if self.work_mem is not None:
            conninfo = psycopg.conninfo.make_conninfo(self.dsn, options=f"-c logical_decoding_work_mem={self.work_mem}")
        stream = ReplicationStream(conninfo, status_interval=1.0)
        stream.connect()
        proto, options = protocol_for(stream.server_version, streaming=self.streaming)
        stream.start(self.slot, self.publication, Lsn(0), proto_version=proto, options=options, messages=True)
        self._stream = stream
        self.decoder.reset()
        return self

    def events_until(self, marker: str, timeout: float = 60.0) -> list[Event]:
        """Every event up to the marker's transaction (left out), confirming commits as they pass."""
        assert self._stream is not None, "start() first"
        stream, feed, kinds = self._stream, self.decoder.feed, self.kinds
        deadline = time.monotonic() + timeout
        out, self._pending = self._pending, []
        while True:
            for i, event in enumerate(out):
                if isinstance(event, MessageEvent) and event.prefix == MARKER and event.content == marker.encode():
                    begin = i - 1
                    assert isinstance(out[begin], TxBegin), out[begin]
                    end = (
                        next(j for j in range(i, len(out)) if isinstance(out[j], TxCommit))
                        if any(isinstance(e, TxCommit) for e in out[i:])
                        else None
                    )
                    if end is not None:
                        self._pending = out[end + 1 :]
                        return out[:begin]
            if time.monotonic() > deadline:
                raise TimeoutError(f"marker {marker!r} not seen within {timeout}s; {len(out)} events so far")
            frame = stream.read(0.5)
            if frame is None:
                continue
            lsn, payload = frame
            kind = chr(payload[0])
            kinds[kind] = kinds.get(kind, 0) + 1
            self.payloads.append((bytes(payload), lsn))
            for event in feed(payload, lsn):
                out.append(event)
                if isinstance(event, TxCommit):
                    stream.confirm(event.end_lsn)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._spool is not None:
            self._spool.close()
            self._spool = None

    def __enter__(self) -> DecoderSession:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def transactions(events: Iterable[Event]) -> list[list[Event]]:
    """Events grouped by transaction, each from its TxBegin to its TxCommit (both included)."""
    groups: list[list[Event]] = []
    current: list[Event] | None = None
    for event in events:
        if isinstance(event, TxBegin):
            assert current is None, f"TxBegin inside a transaction: {event}"
            current = [event]
        elif current is not None:
            current.append(event)
            if isinstance(event, TxCommit):
                groups.append(current)
                current = None
        else:
            assert not isinstance(event, ChangeEvent), f"a change outside a transaction: {event}"
    assert current is None, "the last transaction did not commit"
    return groups


def changes(events: Iterable[Event], table: str | None = None) -> list[ChangeEvent]:
    return [e for e in events if isinstance(e, ChangeEvent) and (table is None or e.table.name == table)]
