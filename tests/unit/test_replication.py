"""The replication transport's decisions that need no server: protocol choice and how a stream ends."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from psycopg import pq

from cdc.replication import (
    ConnectionLost,
    ReplicationError,
    SlotBusy,
    SlotGone,
    _copy_ended,
    classify_error,
    protocol_for,
)


@pytest.mark.parametrize(
    ("version", "streaming", "expected"),
    [
        (130012, True, (1, {})),
        (140010, False, (2, {})),
        (140010, True, (2, {"streaming": "on"})),
        (150018, True, (3, {"streaming": "on"})),
        (160004, True, (4, {"streaming": "on"})),
        (170000, False, (4, {})),
    ],
)
def test_the_protocol_is_the_newest_the_server_speaks_and_streaming_needs_postgres_14(
    version: int, streaming: bool, expected: tuple[int, dict[str, str]]
) -> None:
    assert protocol_for(version, streaming=streaming) == expected


def test_two_phase_and_parallel_streaming_are_never_asked_for() -> None:
    for version in (140000, 150000, 160000, 170000):
        _, options = protocol_for(version, streaming=True)
        assert "two_phase" not in options and options.get("streaming") != "parallel"


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ('ERROR:  replication slot "s" does not exist', SlotGone),
        (
            'ERROR:  cannot read from logical replication slot "s"\n'
            "DETAIL:  This slot has been invalidated because it exceeded the maximum reserved size.",
            SlotGone,
        ),
        ("ERROR:  requested WAL segment 000000010000000000000003 has already been removed", SlotGone),
        ('ERROR:  replication slot "s" is active for PID 4242', SlotBusy),
        ('ERROR:  publication "p" does not exist', ReplicationError),
    ],
)
def test_server_errors_are_classified_by_what_the_caller_must_do(message: str, kind: type[ReplicationError]) -> None:
    assert type(classify_error(message)) is kind


@dataclass
class FakeResult:
    status: pq.ExecStatus
    error_message: bytes = b""
    severity: bytes | None = None

    def error_field(self, field: pq.DiagnosticField) -> bytes | None:
        assert field == pq.DiagnosticField.SEVERITY_NONLOCALIZED
        return self.severity


@dataclass
class FakeConn:
    status: pq.ConnStatus = pq.ConnStatus.OK

    def get_error_message(self) -> bytes:
        return b"server closed the connection unexpectedly"


def ended(conn: FakeConn, result: FakeResult | None) -> ReplicationError:
    return _copy_ended(conn, result)  # type: ignore[arg-type]  # stand-ins for libpq's connection and result


def test_a_server_shutting_down_ends_the_copy_cleanly_and_that_means_reconnect() -> None:
    error = ended(FakeConn(), FakeResult(pq.ExecStatus.COMMAND_OK))

    assert type(error) is ConnectionLost
    assert "shutting down or restarting" in str(error)


def test_a_terminated_walsender_means_reconnect() -> None:
    result = FakeResult(
        pq.ExecStatus.FATAL_ERROR, b"FATAL:  terminating connection due to administrator command", b"FATAL"
    )

    assert type(ended(FakeConn(), result)) is ConnectionLost


def test_a_closed_socket_means_reconnect() -> None:
    assert type(ended(FakeConn(pq.ConnStatus.BAD), None)) is ConnectionLost


def test_a_dropped_slot_stays_slot_gone_whatever_the_severity() -> None:
    result = FakeResult(pq.ExecStatus.FATAL_ERROR, b'ERROR:  replication slot "s" does not exist', b"ERROR")

    assert type(ended(FakeConn(), result)) is SlotGone


def test_an_error_of_the_stream_itself_is_not_retried() -> None:
    result = FakeResult(pq.ExecStatus.FATAL_ERROR, b'ERROR:  publication "p" does not exist', b"ERROR")

    error = ended(FakeConn(), result)

    assert type(error) is ReplicationError and "publication" in str(error)
