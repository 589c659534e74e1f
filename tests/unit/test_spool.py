"""The spool: streamed transactions on disk, one file each, read back in order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc.decoder.spool import Spool, SpoolError
from cdc.lsn import Lsn


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    with Spool(tmp_path / "spool") as spool:
        yield spool


def test_records_come_back_in_arrival_order_with_their_lsn_and_whether_their_subtransaction_aborted(
    spool: Spool,
) -> None:
    txn = spool.begin(900)
    txn.append(b"I first", 0x10, 900)
    txn.append(memoryview(b"..I second.."), 0x20, 901)
    txn.append(b"", 0x30, 902)
    txn.abort_subtransaction(901)

    assert list(txn.replay()) == [
        (b"I first", Lsn(0x10), False),
        (b"..I second..", Lsn(0x20), True),
        (b"", Lsn(0x30), False),
    ]


def test_a_replayed_transaction_file_is_deleted(spool: Spool) -> None:
    txn = spool.begin(900)
    txn.append(b"x", 1, 900)
    assert txn.path.exists()

    assert len(list(txn.replay())) == 1

    assert not txn.path.exists()


def test_a_replay_stopped_early_still_deletes_the_file(spool: Spool) -> None:
    txn = spool.begin(900)
    for i in range(3):
        txn.append(b"x", i, 900)
    replay = txn.replay()
    next(replay)

    replay.close()

    assert not txn.path.exists()


def test_records_reach_the_disk_rather_than_memory_once_past_the_buffer(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool", buffer_bytes=4096) as spool:
        txn = spool.begin(900)
        for i in range(100):
            txn.append(b"y" * 1000, i, 900)

        assert txn.path.stat().st_size > 90_000
        assert txn.bytes == 100 * (1000 + 16)


def test_a_new_spool_deletes_the_files_a_previous_process_left(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    (directory / "123.spool").write_bytes(b"stale")
    (directory / "notes.txt").write_text("not ours")

    with Spool(directory):
        assert sorted(p.name for p in directory.iterdir()) == [".lock", "notes.txt"]


def test_a_second_spool_on_the_same_directory_is_refused(spool: Spool) -> None:
    with pytest.raises(SpoolError, match="in use by another process"):
        Spool(spool.directory)


def test_a_spool_directory_that_cannot_be_created_is_an_error_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")

    with pytest.raises(SpoolError, match="cannot create .* Fix: give the spool directory"):
        Spool(tmp_path / "file" / "spool")


def test_a_truncated_spool_file_is_an_error_naming_the_file(spool: Spool) -> None:
    txn = spool.begin(900)
    txn.append(b"0123456789", 1, 900)
    txn.append(b"0123456789", 2, 900)
    replay = txn.replay()  # the file is complete from here on
    with open(txn.path, "r+b") as f:
        f.truncate(30)

    assert next(replay) == (b"0123456789", Lsn(1), False)
    with pytest.raises(SpoolError, match=r"900.spool of streamed transaction 900 ends at record 1 of 2"):
        next(replay)


def test_beginning_a_transaction_again_starts_it_afresh(spool: Spool) -> None:
    old = spool.begin(900)
    old.append(b"from a dropped connection", 1, 900)

    new = spool.begin(900)
    new.append(b"again", 2, 900)

    assert list(new.replay()) == [(b"again", Lsn(2), False)]
    assert spool.open_transactions == 1


def test_discard_all_deletes_every_open_transaction(spool: Spool) -> None:
    for xid in (900, 901):
        spool.begin(xid).append(b"x", 1, xid)

    spool.discard_all()

    assert list(spool.directory.glob("*.spool")) == []
    assert spool.open_transactions == 0


def test_appending_to_a_replayed_transaction_is_an_error(spool: Spool) -> None:
    txn = spool.begin(900)
    list(txn.replay())

    with pytest.raises(SpoolError, match="closed"):
        txn.append(b"late", 3, 900)
