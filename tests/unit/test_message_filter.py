"""MessageFilter: which logical messages are published (Debezium's message.prefix include/exclude lists,
full-match regular expressions), and the daemon's own heartbeat prefix never."""

from __future__ import annotations

import pytest

from cdc.config import MessagesConfig
from cdc.event import MessageEvent
from cdc.lsn import Lsn
from cdc.observe import Stats
from cdc.pipeline.stages import MessageFilter, emitted_prefix


def message(prefix: str) -> MessageEvent:
    return MessageEvent(prefix, b"x", True, Lsn(1), Lsn(1), 7, 1, 0)


def passed(f: MessageFilter, *prefixes: str) -> list[str]:
    return [p for p in prefixes if f.process(message(p)) is not None]


def test_without_lists_everything_but_the_own_heartbeat_prefix_is_published() -> None:
    stats = Stats()
    f = MessageFilter(None, [], ["heartbeat"], None, stats)
    assert passed(f, "audit", "heartbeat", "cdc.outbox", "app.x") == ["audit", "cdc.outbox", "app.x"]
    assert stats.messages_left_out == {"heartbeat": 1}


def test_include_publishes_only_full_matches() -> None:
    f = MessageFilter([r"app\..*", "audit"], [], [], None, Stats())
    assert passed(f, "app.orders", "audit", "audit2", "xapp.y", "other") == ["app.orders", "audit"]


def test_exclude_leaves_out_full_matches() -> None:
    stats = Stats()
    f = MessageFilter(None, [r"cdc\..*", "heartbeat"], [], None, stats)
    assert passed(f, "cdc.outbox", "heartbeat", "heartbeats", "app") == ["heartbeats", "app"]
    assert stats.messages_left_out == {"cdc.outbox": 1, "heartbeat": 1}


def test_the_own_outbox_prefix_passes_on_to_its_route_whatever_the_lists_say() -> None:
    f = MessageFilter(["audit"], [], [], "cdc.outbox", Stats())
    assert passed(f, "cdc.outbox", "other") == ["cdc.outbox"]


def test_the_heartbeat_prefix_is_read_from_the_action_query() -> None:
    assert emitted_prefix("SELECT pg_logical_emit_message(false, 'heartbeat', now()::text)") == "heartbeat"
    assert emitted_prefix("select PG_LOGICAL_EMIT_MESSAGE( true ,'it''s', 'x')") == "it's"
    assert emitted_prefix("UPDATE hb SET ts = now()") is None
    assert emitted_prefix(None) is None


def test_include_and_exclude_together_or_a_bad_regex_are_refused() -> None:
    with pytest.raises(ValueError, match="set include or exclude, not both"):
        MessagesConfig(include=["a"], exclude=["b"])
    with pytest.raises(ValueError, match="is not a regular expression"):
        MessagesConfig(exclude=["("])
