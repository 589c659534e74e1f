"""``cdc.snapshot.copyout.lines`` over a fake libpq connection: buffered lines straight from libpq, waiting
and the end left to psycopg's ``read``, and libpq's own end (-1) read as psycopg reads it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import pq

from cdc.snapshot.copyout import lines


class FakeResult:
    def __init__(self, status: pq.ExecStatus) -> None:
        self.status = status


class FakePGconn:
    """``get_copy_data(1)`` answers from ``script`` (a line, 0 for nothing buffered, -1 for the end)."""

    def __init__(self, script: list[bytes | int], results: list[FakeResult]) -> None:
        self.script = script
        self.results = results

    def get_copy_data(self, async_: int) -> tuple[int, Any]:
        assert async_ == 1
        step = self.script.pop(0)
        if isinstance(step, bytes):
            return len(step), memoryview(step)
        return step, b""

    def get_result(self) -> FakeResult | None:
        return self.results.pop(0) if self.results else None


class FakeConnection:
    def __init__(self, pgconn: FakePGconn) -> None:
        self.pgconn = pgconn
        self.info = type("Info", (), {"encoding": "utf-8"})()


class FakeCopy:
    def __init__(self, pgconn: FakePGconn, reads: list[bytes]) -> None:
        self.connection = FakeConnection(pgconn)
        self.reads = reads
        self._finished = False

    def read(self) -> memoryview:
        return memoryview(self.reads.pop(0) if self.reads else b"")


def test_buffered_lines_come_from_libpq_and_waits_and_the_end_from_psycopg() -> None:
    pgconn = FakePGconn([b"1\ta\n", b"2\tb\n", 0, b"4\td\n", 0], [])
    copy = FakeCopy(pgconn, [b"3\tc\n", b""])
    got = [bytes(line) for line in lines(copy)]  # type: ignore[arg-type]  # a stand-in for psycopg.Copy
    assert got == [b"1\ta\n", b"2\tb\n", b"3\tc\n", b"4\td\n"]
    assert copy.reads == [] and pgconn.script == []


def test_the_end_libpq_reports_reads_the_result_and_finishes_the_copy() -> None:
    pgconn = FakePGconn([b"1\n", -1], [FakeResult(pq.ExecStatus.COMMAND_OK)])
    copy = FakeCopy(pgconn, [])
    assert [bytes(line) for line in lines(copy)] == [b"1\n"]  # type: ignore[arg-type]  # a stand-in for psycopg.Copy
    assert copy._finished


def test_two_results_at_the_end_are_an_error_as_in_psycopg() -> None:
    pgconn = FakePGconn([-1], [FakeResult(pq.ExecStatus.COMMAND_OK), FakeResult(pq.ExecStatus.TUPLES_OK)])
    with pytest.raises(psycopg.ProgrammingError):
        list(lines(FakeCopy(pgconn, [])))  # type: ignore[arg-type]  # a stand-in for psycopg.Copy


def test_a_copy_without_psycopgs_state_is_read_by_psycopg_alone() -> None:
    class Plain:
        def __init__(self) -> None:
            self.reads = [b"1\n", b"2\n", b""]

        def read(self) -> memoryview:
            return memoryview(self.reads.pop(0))

    assert [bytes(line) for line in lines(Plain())] == [b"1\n", b"2\n"]  # type: ignore[arg-type]  # a stand-in for psycopg.Copy
