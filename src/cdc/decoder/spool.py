"""Streamed in-progress transactions, kept on disk until they commit.

With ``streaming 'on'`` (protocol 2+) the server sends a large transaction in
blocks before it commits, interleaved with other transactions. Events must go
out in commit order and only once committed, so the raw pgoutput payloads of
each streamed top-level transaction are appended to a file of their own, with
the LSN they arrived at and the (sub)transaction xid they carry. At Stream
Commit the file is read back in order (``SpooledTransaction.replay``), each
record saying whether its subtransaction was rolled back; at Stream Abort of
the whole transaction the file is deleted.

Memory stays bounded whatever the transaction's size: a write buffer per open
transaction, a read buffer during a replay, and the set of aborted
subtransaction xids. Disk use is the size of the payloads plus 16 bytes a
record.

One directory per slot. ``Spool(directory)`` takes an exclusive lock on it
(two daemons on one directory would delete each other's files) and deletes the
files a previous process left: after a restart the server streams every
uncommitted transaction again from its first block.

Record layout: ``>IQI`` (payload length, LSN, xid of the subtransaction or the
transaction) then the payload.
"""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Generator
from pathlib import Path
from typing import BinaryIO, Final

import structlog

from cdc.lsn import Lsn

__all__ = ["Spool", "SpoolError", "SpooledTransaction"]

log = structlog.get_logger(__name__)

_RECORD: Final = struct.Struct(">IQI")  # payload length, lsn, subxid
_SUFFIX: Final = ".spool"
_LOCK_NAME: Final = ".lock"
DEFAULT_BUFFER_BYTES: Final = 64 * 1024


class SpoolError(Exception):
    """The spool cannot keep or give back a streamed transaction; the message says why and what to do."""


class SpooledTransaction:
    """The payloads of one streamed top-level transaction, in arrival order, in one file."""

    __slots__ = ("xid", "path", "records", "bytes", "_aborted", "_file", "_buffer_bytes")

    def __init__(self, xid: int, path: Path, buffer_bytes: int) -> None:
        self.xid = xid
        self.path = path
        self.records = 0
        self.bytes = 0
        self._aborted: set[int] = set()
        self._buffer_bytes = buffer_bytes
        try:
            self._file: BinaryIO | None = open(path, "wb", buffering=buffer_bytes)
        except OSError as e:
            raise SpoolError(_io_message("create", path, e)) from None

    def append(self, payload: bytes | memoryview, lsn: int, subxid: int) -> None:
        """Keep one payload (any message of a stream block) with the LSN it arrived at and its xid."""
        file = self._file
        if file is None:
            raise SpoolError(f"streamed transaction {self.xid} is closed: nothing can be added to it")
        size = len(payload)
        try:
            file.write(_RECORD.pack(size, lsn, subxid))
            file.write(payload)
        except OSError as e:
            raise SpoolError(_io_message("write", self.path, e)) from None
        self.records += 1
        self.bytes += size + _RECORD.size

    def abort_subtransaction(self, subxid: int) -> None:
        """ROLLBACK TO SAVEPOINT: the records of ``subxid`` replay as aborted (it may have none)."""
        self._aborted.add(subxid)

    def is_aborted(self, subxid: int) -> bool:
        return subxid in self._aborted

    def replay(self) -> Generator[tuple[bytes, Lsn, bool], None, None]:
        """Every record in arrival order: ``(payload, lsn, whether its subtransaction aborted)``.

        Ends the writing at once; reads lazily through a fixed buffer; the file
        is deleted when the iteration ends (or is abandoned).
        """
        self._close_writer()
        return self._records()

    def _records(self) -> Generator[tuple[bytes, Lsn, bool], None, None]:
        aborted = self._aborted
        header = _RECORD
        header_size = header.size
        try:
            reader = open(self.path, "rb", buffering=self._buffer_bytes)
        except OSError as e:
            raise SpoolError(_io_message("read", self.path, e)) from None
        try:
            read = reader.read
            for index in range(self.records):
                head = read(header_size)
                if len(head) != header_size:
                    raise SpoolError(self._truncated(index))
                size, lsn, subxid = header.unpack(head)
                payload = read(size)
                if len(payload) != size:
                    raise SpoolError(self._truncated(index))
                yield payload, Lsn(lsn), subxid in aborted
        except OSError as e:
            raise SpoolError(_io_message("read", self.path, e)) from None
        finally:
            reader.close()
            self.discard()

    def discard(self) -> None:
        """Close and delete the file (Stream Abort, after a replay, or on reset). Safe to call twice."""
        self._close_writer()
        try:
            self.path.unlink(missing_ok=True)
        except OSError as e:
            log.warning("spool_delete_failed", path=str(self.path), error=str(e))

    def _close_writer(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError as e:
                raise SpoolError(_io_message("write", self.path, e)) from None

    def _truncated(self, index: int) -> str:
        return (
            f"the spool file {self.path} of streamed transaction {self.xid} ends at record {index} of "
            f"{self.records}: it was truncated or changed behind the daemon's back. Restart the daemon; the server "
            "streams the transaction again."
        )


class Spool:
    """The spool directory of one slot: one file per streamed transaction not yet committed or aborted."""

    def __init__(self, directory: Path, *, buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> None:
        self.directory = directory
        self._buffer_bytes = buffer_bytes
        self._open: dict[int, SpooledTransaction] = {}
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._lock = open(directory / _LOCK_NAME, "a+b")
        except OSError as e:
            raise SpoolError(_io_message("create", directory, e)) from None
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise SpoolError(
                f"the spool directory {directory} is in use by another process. Give each daemon (each slot) "
                "a spool directory of its own."
            ) from None
        self._clean()

    def _clean(self) -> None:
        """Delete what a previous process left: those transactions will be streamed again from the start."""
        removed = 0
        for path in self.directory.glob("*" + _SUFFIX):
            try:
                path.unlink()
            except OSError as e:
                raise SpoolError(_io_message("delete", path, e)) from None
            removed += 1
        if removed:
            log.info("spool_cleaned", directory=str(self.directory), files=removed)

    def begin(self, xid: int) -> SpooledTransaction:
        """A new, empty file for streamed transaction ``xid`` (replacing one of the same xid, if any)."""
        old = self._open.pop(xid, None)
        if old is not None:
            old.discard()
        txn = SpooledTransaction(xid, self.directory / f"{xid}{_SUFFIX}", self._buffer_bytes)
        self._open[xid] = txn
        return txn

    def get(self, xid: int) -> SpooledTransaction | None:
        return self._open.get(xid)

    def pop(self, xid: int) -> SpooledTransaction | None:
        """Take transaction ``xid`` out of the open set (to replay or discard it)."""
        return self._open.pop(xid, None)

    def discard_all(self) -> None:
        """Delete every open transaction (a new connection streams them again)."""
        for txn in self._open.values():
            txn.discard()
        self._open.clear()

    @property
    def open_transactions(self) -> int:
        return len(self._open)

    def close(self) -> None:
        """Delete the open transactions and release the directory. Safe to call twice."""
        self.discard_all()
        self._lock.close()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _io_message(action: str, path: Path, error: OSError) -> str:
    reason = os.strerror(error.errno) if error.errno else str(error)
    return (
        f"cannot {action} {path} to spool a streamed transaction: {reason}. Fix: give the spool directory "
        "enough free space (about the size of the largest transaction's changes) and write permission."
    )
