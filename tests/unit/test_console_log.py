"""The console log: an error of several lines prints as lines, not as one string with literal \\n."""

from __future__ import annotations

from cdc.log import MultilineBelow


def test_a_value_of_several_lines_is_printed_below_the_event_indented() -> None:
    line = MultilineBelow()(None, "error", {"event": "fatal", "error": "first problem\nsecond problem", "kind": "X"})
    lines = line.splitlines()
    assert "fatal" in lines[0] and "kind" in lines[0] and "first problem" not in lines[0]
    assert lines[1:] == ["    error: first problem", "      second problem"]
    assert "\\n" not in line


def test_a_value_of_one_line_stays_on_the_event_line() -> None:
    line = MultilineBelow()(None, "info", {"event": "ready", "slot": "s1"})
    assert len(line.splitlines()) == 1 and "s1" in line
