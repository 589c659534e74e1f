"""The messages of the pgoutput protocol, as ``cdc.decoder.pgoutput.decode`` returns them.

One frozen, slotted dataclass per message type (the table in ``cdc.decoder.pgoutput`` says
which byte each is and when the server sends it). LSNs are ``Lsn``; timestamps are
microseconds since the Unix epoch in fields named ``*_ts_us``; names, prefixes and GIDs are
``str``; column values stay ``bytes`` (see ``TupleData``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, TypeAlias

from cdc.lsn import Lsn

__all__ = [
    "UNCHANGED",
    "Begin",
    "BeginPrepare",
    "Column",
    "ColumnValue",
    "Commit",
    "CommitPrepared",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Message",
    "Origin",
    "Prepare",
    "Relation",
    "ReplicaIdentity",
    "RollbackPrepared",
    "StreamAbort",
    "StreamCommit",
    "StreamPrepare",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleData",
    "Type",
    "Unchanged",
    "Update",
]


class Unchanged(enum.Enum):
    """Type of ``UNCHANGED``: a TOASTed column an Update did not touch, so its value was not sent."""

    UNCHANGED = "u"

    def __repr__(self) -> str:
        return "UNCHANGED"


#: The value of a column sent as ``'u'``: unchanged TOAST, not a real value.
UNCHANGED: Final = Unchanged.UNCHANGED

#: One column of a tuple: ``None`` for NULL, ``UNCHANGED``, or the value's text or binary bytes.
ColumnValue: TypeAlias = bytes | None | Unchanged


class ReplicaIdentity(enum.StrEnum):
    """``pg_class.relreplident``: which old values Update and Delete carry."""

    DEFAULT = "d"  # the primary key
    NOTHING = "n"
    FULL = "f"  # the whole old row
    INDEX = "i"  # the columns of a chosen unique index


@dataclass(frozen=True, slots=True)
class TupleData:
    """The columns of one row, in the Relation's column order.

    ``values[i]`` is ``None`` (NULL), ``UNCHANGED`` (unchanged TOAST) or the
    column's bytes. The bytes are the type's text output unless bit ``i`` of
    ``binary_mask`` is set, in which case they are its binary send format
    (option ``binary 'true'``). In a Delete or Update old key under REPLICA
    IDENTITY DEFAULT/INDEX, non-key columns are sent as NULL.
    """

    values: tuple[ColumnValue, ...]
    binary_mask: int = 0

    def is_binary(self, index: int) -> bool:
        """Whether column ``index`` arrived in binary format."""
        return bool(self.binary_mask >> index & 1)


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: Lsn
    commit_ts_us: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    origin_lsn: Lsn
    name: str


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a Relation message."""

    name: str
    type_oid: int
    type_modifier: int  # atttypmod, -1 when the type has none
    is_key: bool  # part of the replica identity


@dataclass(frozen=True, slots=True)
class Relation:
    xid: int | None
    relation_id: int
    namespace: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Type:
    """A user-defined type used by a column of the Relation that follows."""

    xid: int | None
    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    xid: int | None
    relation_id: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """A changed row. At most one of ``old_key`` (``'K'``) and ``old`` (``'O'``) is set.

    ``old_key`` is sent when the replica identity key changed (REPLICA
    IDENTITY DEFAULT or INDEX), ``old`` with REPLICA IDENTITY FULL; neither
    when the key did not change under DEFAULT/INDEX.
    """

    xid: int | None
    relation_id: int
    old_key: TupleData | None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    """A deleted row. Exactly one of ``old_key`` (``'K'``) and ``old`` (``'O'``) is set."""

    xid: int | None
    relation_id: int
    old_key: TupleData | None
    old: TupleData | None


@dataclass(frozen=True, slots=True)
class Truncate:
    xid: int | None
    relation_ids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A ``pg_logical_emit_message`` record (message type ``'M'``)."""

    xid: int | None
    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """A streamed transaction (``subxid == xid``) or one of its subtransactions aborted.

    ``abort_lsn`` and ``abort_ts_us`` are sent only by protocol 4 with
    ``streaming 'parallel'``; otherwise they are None.
    """

    xid: int
    subxid: int
    abort_lsn: Lsn | None
    abort_ts_us: int | None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    prepare_end_lsn: Lsn
    rollback_end_lsn: Lsn
    prepare_ts_us: int
    rollback_ts_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts_us: int
    xid: int
    gid: str


Message: TypeAlias = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)
