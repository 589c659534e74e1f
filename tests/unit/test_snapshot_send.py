"""The rendered JSON chunk's loop (``cdc.snapshot.send``): the compiled loop (``cdc.snapshot._send``) against its
reference, call for call. A scripted chunk (lines buffered in libpq or read from the socket, an end seen by
libpq or by psycopg's read, lines the codec declines, oversized values, a producer queue that is full for a
while) goes through both; every call they make is logged, and the two logs and row counts must be equal.
The reference's own log is checked against what the worker relies on: ordinals, headers, the value's tail
renewed by the clock, progress at its interval."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.compiled import load
from cdc.decoder.rows import Decline
from cdc.snapshot import send

try:
    from cdc.snapshot._send import send_rendered as compiled_send
except ImportError as exc:  # pragma: no cover - a build without the compiled modules
    if not os.environ.get("CDC_PURE_PYTHON"):
        raise ImportError(f"the compiled snapshot loop is not built ({exc}): pip install -e . builds it") from exc
    pytest.skip("cdc.snapshot._send is not built and CDC_PURE_PYTHON is set", allow_module_level=True)

Loop = Callable[[send.RenderedChunk], int]
IMPLEMENTATIONS = {"reference": send.send_rendered, "compiled": compiled_send}


@dataclass
class Script:
    """A chunk's source: each step is ("buffered", line), ("socket", line), or the end ("libpq" or "read")."""

    steps: list[tuple[str, bytes]]
    full_every: int = 0  # the producer raises BufferError on every call whose number is a multiple (0: never)
    log: list[Any] = field(default_factory=list)
    at: int = 0
    produced: int = 0
    clock_now: int = 1_000

    def get(self, _async: int) -> tuple[int, Any]:
        kind, line = self.steps[self.at]
        self.log.append(("get", kind))
        if kind == "buffered":
            self.at += 1
            return len(line), memoryview(line)
        if kind == "libpq":
            return -1, b""
        return 0, b""

    def read(self) -> Any:
        kind, line = self.steps[self.at]
        self.log.append(("read", kind))
        if kind == "read":
            return b""
        self.at += 1
        return line

    def record(self, data: Any, key_head: bytes, key_end: bytes, value_head: bytes, tail: bytes) -> tuple[bytes, bytes]:
        line = bytes(data)
        self.log.append(("record", line, tail))
        if line.startswith(b"bad"):
            raise Decline("declined")
        if line.startswith(b"err"):
            raise ValueError("a value out of range")
        return key_head + line[:3] + key_end, value_head + line.rstrip(b"\n") + tail

    def produce(self, topic: str, value: bytes, key: bytes, headers: Any = None) -> None:
        self.produced += 1
        if self.full_every and self.produced % self.full_every == 0:
            self.log.append(("full", value))
            raise BufferError("queue full")
        self.log.append(("produce", topic, key, value, None if headers is None else dict(headers)))

    def clock(self) -> int:
        self.clock_now += 7
        return self.clock_now

    def chunk(
        self,
        *,
        with_ordinal: bool = True,
        limit: int = 40,
        progress_every: int = 4,
        clock_every: int = 3,
        headers: dict[str, Any] | None = None,
    ) -> send.RenderedChunk:
        log = self.log
        return send.RenderedChunk(
            get=self.get,
            read=self.read,
            end=lambda: log.append(("end",)),
            record=self.record,
            key_head=b"{k:",
            key_end=b"}",
            value_head=b"{v:",
            value_middle=b",t:",
            value_end=b"}",
            times=lambda ns: b"%d" % ns,
            clock=self.clock,
            produce=self.produce,
            wait=lambda: log.append(("wait",)),
            topic="t.public.x",
            limit=limit,
            headers={"cdc.lsn": b"0/10"} if headers is None and with_ordinal else headers,
            with_ordinal=with_ordinal,
            ordinal_header="cdc.ordinal",
            ordinal=100,
            declines=(Decline, ValueError),
            declined=lambda data, ordinal: log.append(("declined", bytes(data), ordinal)),
            oversized=lambda key, value, hdrs: log.append(("oversized", key, value, hdrs)),
            progress=lambda rows: log.append(("progress", rows)),
            progress_every=progress_every,
            clock_every=clock_every,
        )


def run(loop: Loop, steps: list[tuple[str, bytes]], full_every: int = 0, **options: Any) -> tuple[int, list[Any]]:
    script = Script(list(steps), full_every)
    rows = loop(script.chunk(**options))
    return rows, script.log


def both(steps: list[tuple[str, bytes]], full_every: int = 0, **options: Any) -> tuple[int, list[Any]]:
    reference = run(send.send_rendered, steps, full_every, **options)
    assert run(compiled_send, steps, full_every, **options) == reference
    return reference


def test_rows_go_to_the_producer_with_their_ordinals_and_the_clocked_tail() -> None:
    steps = [
        ("buffered", b"aa1\n"),
        ("socket", b"bb2\n"),
        ("buffered", b"cc3\n"),
        ("buffered", b"dd4\n"),
        ("buffered", b"ee5\n"),
        ("libpq", b""),
    ]
    rows, log = both(steps)
    assert rows == 5
    produced = [entry for entry in log if entry[0] == "produce"]
    assert [entry[3] for entry in produced] == [
        b"{v:aa1,t:1007}",
        b"{v:bb2,t:1007}",
        b"{v:cc3,t:1007}",
        b"{v:dd4,t:1014}",
        b"{v:ee5,t:1014}",
    ]
    assert [entry[4]["cdc.ordinal"] for entry in produced] == [b"101", b"102", b"103", b"104", b"105"]
    assert all(entry[4]["cdc.lsn"] == b"0/10" for entry in produced)
    assert [entry[2] for entry in produced][:2] == [b"{k:aa1}", b"{k:bb2}"]
    assert ("progress", 4) in log and log.index(("progress", 4)) < log.index(produced[4])
    assert log[-1] == ("end",)


def test_the_end_seen_by_psycopgs_read_ends_without_libpqs_end() -> None:
    rows, log = both([("buffered", b"aa1\n"), ("read", b"")])
    assert rows == 1
    assert log[-2:] == [("get", "read"), ("read", "read")]
    assert ("end",) not in log


def test_declined_and_oversized_lines_go_back_to_the_worker_with_their_ordinals() -> None:
    steps = [
        ("buffered", b"bad\n"),
        ("buffered", b"err\n"),
        ("buffered", b"ok1" + b"x" * 60 + b"\n"),
        ("buffered", b"ok2\n"),
        ("libpq", b""),
    ]
    rows, log = both(steps)
    assert rows == 4
    assert ("declined", b"bad\n", 101) in log and ("declined", b"err\n", 102) in log
    oversized = [entry for entry in log if entry[0] == "oversized"]
    assert len(oversized) == 1 and oversized[0][3]["cdc.ordinal"] == b"103"
    assert [entry[4]["cdc.ordinal"] for entry in log if entry[0] == "produce"] == [b"104"]


def test_a_full_queue_is_served_and_the_record_produced_again() -> None:
    steps = [("buffered", b"aa%d\n" % i) for i in range(6)] + [("libpq", b"")]
    rows, log = both(steps, full_every=2)
    assert rows == 6
    assert [entry[0] for entry in log].count("wait") == [entry[0] for entry in log].count("full") > 0
    assert [entry[3] for entry in log if entry[0] == "produce"] == [b"{v:aa%d,t:1007}" % i for i in range(3)] + [
        b"{v:aa%d,t:1014}" % i for i in range(3, 6)
    ]


def test_without_position_headers_the_records_carry_none() -> None:
    steps = [("buffered", b"aa1\n"), ("buffered", b"bb2\n"), ("libpq", b"")]
    rows, log = both(steps, with_ordinal=False)
    assert rows == 2
    assert [entry[4] for entry in log if entry[0] == "produce"] == [None, None]


_LINES = st.one_of(st.sampled_from([b"bad\n", b"err\n"]), st.binary(min_size=3, max_size=50).map(lambda b: b + b"\n"))


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(st.tuples(st.sampled_from(["buffered", "socket"]), _LINES), max_size=40),
    end=st.sampled_from(["libpq", "read"]),
    full_every=st.integers(0, 5).filter(lambda k: k != 1),  # 1: every call full, the record never produced
    progress_every=st.integers(1, 9),
    clock_every=st.integers(1, 9),
    with_ordinal=st.booleans(),
    limit=st.integers(10, 60),
)
def test_both_loops_make_the_same_calls(
    lines: list[tuple[str, bytes]],
    end: str,
    full_every: int,
    progress_every: int,
    clock_every: int,
    with_ordinal: bool,
    limit: int,
) -> None:
    rows, _ = both(
        lines + [(end, b"")],
        full_every,
        progress_every=progress_every,
        clock_every=clock_every,
        with_ordinal=with_ordinal,
        limit=limit,
    )
    assert rows == len(lines)


def test_the_worker_takes_the_compiled_loop_unless_the_reference_is_forced() -> None:
    forced = os.environ.get("CDC_PURE_PYTHON", "") not in ("", "0")
    assert send.SEND_RENDERED is (send.send_rendered if forced else compiled_send)
    assert load(force_reference=False).compiled("snapshot_send", "send_rendered") is compiled_send
    assert load(force_reference=True).compiled("snapshot_send", "send_rendered") is None
