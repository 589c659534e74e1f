"""reload_needs_restart names the keys that changed (cdc.pipeline.reload.changed_keys)."""

from __future__ import annotations

from cdc.pipeline.reload import changed_keys


def test_changed_keys_are_the_dotted_paths_that_differ() -> None:
    old = {"limits": {"max_inflight_bytes": 1, "dead_letter_topic": None}, "status_interval_s": 1.0, "format": "json"}
    new = {"limits": {"max_inflight_bytes": 2, "dead_letter_topic": None}, "status_interval_s": 2.0, "format": "json"}
    assert changed_keys(old, new) == ["limits.max_inflight_bytes", "status_interval_s"]
    assert changed_keys(old, old) == []
    assert changed_keys({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}) == ["a.c"]
