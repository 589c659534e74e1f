"""What the decoder's parts share, public and typed: the relation cache's entries and the transaction in decoding.

``ChangeDecoder`` (``cdc.decoder.changes``), its streamed-transaction part (``cdc.decoder.streamed``) and the
fast path of row changes, in Python (``cdc.decoder.fast``) or compiled (``cdc.decoder._changes``), hand one
``TxState`` to each other and read and advance the decoding through its attributes, never through each
other's private ones. Its ``commit_lsn`` and ``ordinal`` are the sequence of the next event: the pair that
orders the events of one transaction (``EventSequenceKey{commit_lsn, tx_ordinal}`` in supabase/etl).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdc.decoder.rows import RowParser
from cdc.event import TableSchema
from cdc.lsn import Lsn


@dataclass(frozen=True, slots=True)
class DecodedRelation:
    """A captured table as its last Relation message described it: what its changes are decoded with."""

    schema: TableSchema
    names: tuple[str, ...]
    converters: tuple[Callable[[bytes], Any], ...]
    key_names: tuple[str, ...]
    seq: int = 0  # receipt order of the Relation message it came from
    parse: RowParser | None = None  # the fast path's row parser (see cdc.decoder.fast)
    # The replica identity's columns are the configured key's: an old-key tuple ('K') then holds exactly
    # the key columns, so a rendered one is the typed path's before row.
    key_is_identity: bool = True
    rendered: bool = False  # ``parse`` is the renderer's: its rows are in the sink format


@dataclass(slots=True)
class TxState:
    """The transaction in decoding, and the relation cache its changes are decoded with.

    Set at a Begin (``begin``), cleared at its Commit (``end``); a streamed transaction's replay does the
    same around its events, and swaps in its own copy of ``relations`` while it runs. Each event of the
    transaction takes the next ``ordinal``; a row change also sets ``last_lsn``.
    """

    relations: dict[int, DecodedRelation] = field(default_factory=dict)  # relation id -> its entry
    xid: int | None = None  # None: between transactions
    commit_lsn: Lsn = Lsn(0)
    commit_ts: int = 0  # microseconds since the Unix epoch
    ordinal: int = 0  # of the transaction's last event so far (its count)
    last_lsn: int = 0  # of the transaction's last row change (0: none yet)

    def begin(self, xid: int, commit_lsn: Lsn, commit_ts: int) -> None:
        self.xid, self.commit_lsn, self.commit_ts, self.ordinal, self.last_lsn = xid, commit_lsn, commit_ts, 0, 0

    def end(self) -> int:
        """Leave the transaction; returns its count of events."""
        count = self.ordinal
        self.xid, self.ordinal = None, 0
        return count
