"""bench/compare_records.py against this tree on both sides: the same records, and a doctored byte is found.

The tool's run is real (a git worktree of HEAD, both daemons, the workload, the three formats); the second half
changes one thing at a time in the captured records and checks that the comparison names it, so the
normalization (the envelope's top-level clock, the slot name) cannot be hiding anything else.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _load_tool() -> Any:
    spec = importlib.util.spec_from_file_location("compare_records", REPO / "bench" / "compare_records.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compare_records"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


tool = _load_tool()


@pytest.fixture(scope="module")
def captured(services: Any, dev_state_dir: Path) -> tuple[int, dict[str, Any], dict[str, Any]]:
    captures: dict[str, Any] = {}
    slots: dict[str, Any] = {}
    code = tool.run("HEAD", REPO, ["json", "json-schemas", "avro"], dev_state_dir, 300.0, captures=captures)
    registry = tool.Registry(services.schema_registry_url) if services.schema_registry_url else None
    return code, captures, {"registry": registry, "slots": slots}


def _normalized(records: list[Any], fmt: str, extra: dict[str, Any], renames: dict[str, str]) -> list[Any]:
    lookup = extra["registry"].schema_text if fmt == "avro" else None
    return tool.normalize(records, renames, lookup)


def _slot_renames(base: list[Any], cur: list[Any]) -> dict[str, str]:
    """The two sides' slot names, from the key of the snapshot progress record (``<slot>/covered``)."""
    (b,) = [r.key for r in base if r.topic.endswith(".__cdc_snapshot")]
    (c,) = [r.key for r in cur if r.topic.endswith(".__cdc_snapshot")]
    return {c.decode().split("/")[0]: b.decode().split("/")[0]}


def test_this_tree_against_its_own_head_is_the_same_in_every_format(captured: Any) -> None:
    code, captures, _ = captured
    assert code == 0
    assert sorted(captures) == ["avro", "json", "json-schemas"]
    for fmt, sides in captures.items():
        topics = {r.topic.rsplit(".", 1)[-1] for r in sides["baseline"]}
        assert {"kinds", "kv", "full_ident", "bulk", "sentinel", "message", "transaction"} <= topics, fmt
        assert len(sides["baseline"]) == len(sides["current"]) > 4000, fmt


@pytest.mark.parametrize("fmt", ["json", "json-schemas", "avro"])
def test_one_changed_byte_anywhere_but_the_clock_is_a_named_difference(captured: Any, fmt: str) -> None:
    _, captures, extra = captured
    base, cur = captures[fmt]["baseline"], captures[fmt]["current"]
    renames = _slot_renames(base, cur)
    a = _normalized(base, fmt, extra, {})
    assert tool.compare(a, _normalized(cur, fmt, extra, renames)) == []

    i = next(n for n, r in enumerate(cur) if r.topic.endswith(".public.kinds") and r.value)
    target = cur[i]

    def diffs_with(doctored: Any) -> list[Any]:
        return tool.compare(a, _normalized([*cur[:i], doctored, *cur[i + 1 :]], fmt, extra, renames))

    # one byte of the value, in the middle (a column value or Avro body byte)
    value = bytearray(target.value)
    middle = len(value) // 2
    value[middle] ^= 0x01
    found = diffs_with(replace(target, value=bytes(value)))
    assert [(d.topic, d.partition, d.offset, d.part) for d in found] == [
        (target.topic, target.partition, target.offset, "value")
    ]
    # the key, a header, the partition
    key = bytearray(target.key)
    key[-2] ^= 0x01
    assert [d.part for d in diffs_with(replace(target, key=bytes(key)))] == ["key"]
    headers = ((target.headers[0][0], target.headers[0][1] + b"0"), *target.headers[1:])
    assert [d.part for d in diffs_with(replace(target, headers=headers))] == ["headers"]
    assert [d.part for d in diffs_with(replace(target, partition=target.partition + 1))] == ["partition"]
    # order: two records of one partition swapped
    j = next(n for n in range(i + 1, len(cur)) if cur[n].topic == target.topic and cur[n].partition == target.partition
             and cur[n].value != target.value)
    swapped = list(cur)
    swapped[i], swapped[j] = replace(cur[j], offset=target.offset), replace(target, offset=cur[j].offset)
    assert {(d.offset, d.part) for d in tool.compare(a, _normalized(swapped, fmt, extra, renames))} >= {
        (target.offset, "value"), (cur[j].offset, "value")
    }
    # a record missing
    assert [d.part for d in tool.compare(a, _normalized(cur[:i] + cur[i + 1 :], fmt, extra, renames))][:1] == [
        "count"
    ]
    # without the slot rename the snapshot progress key differs: the normalization is what makes it equal
    assert [d.part for d in tool.compare(a, _normalized(cur, fmt, extra, {}))] == ["key"]


def test_the_json_clock_normalization_touches_the_envelopes_top_level_clock_only() -> None:
    doc = b'{"before":null,"after":{"ts_ms":1},"source":{"ts_ms":5,"ts_us":6,"ts_ns":7},"op":"c","ts_ms":9,"ts_us":10,"ts_ns":11}'
    assert tool.normalize_json_clock(doc) == (
        b'{"before":null,"after":{"ts_ms":1},"source":{"ts_ms":5,"ts_us":6,"ts_ns":7},"op":"c","ts_ms":0,"ts_us":0,"ts_ns":0}'
    )
    wrapped = b'{"schema":{"fields":[{"field":"ts_ms"}]},"payload":' + doc + b"}"
    assert tool.normalize_json_clock(wrapped) == b'{"schema":{"fields":[{"field":"ts_ms"}]},"payload":' + (
        tool.normalize_json_clock(doc) + b"}"
    )
    not_an_envelope = b'{"status":"END","ts_ms":123}'  # transaction metadata: commit time, compared as it is
    assert tool.normalize_json_clock(not_an_envelope) == not_an_envelope
    source_changed = doc.replace(b'"ts_ms":5', b'"ts_ms":4')
    assert tool.normalize_json_clock(source_changed) != tool.normalize_json_clock(doc)
