"""The local Kafka service's pure helpers (no broker started here)."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator

import pytest

from cdc.dev import kafka


def _uuids(*first_bytes: int) -> Iterator[uuid.UUID]:
    for first in first_bytes:
        yield uuid.UUID(bytes=bytes([first]) + bytes(range(1, 16)))


def test_a_cluster_id_starting_with_a_dash_is_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xF8 encodes to '-' as the first URL-safe base64 character: kafka-storage would read it as an option
    # (CI failed once on exactly that: "argument --cluster-id/-t: expected one argument").
    drawn = _uuids(0xF8, 0xFB, 0x12)
    monkeypatch.setattr(uuid, "uuid4", lambda: next(drawn))

    cluster_id = kafka._cluster_id()

    assert not cluster_id.startswith("-")
    assert base64.urlsafe_b64decode(cluster_id + "==") == bytes([0x12]) + bytes(range(1, 16))
    assert next(drawn, None) is None  # the third draw was the one kept


def test_a_cluster_id_is_22_url_safe_characters_of_16_bytes() -> None:
    for _ in range(200):
        cluster_id = kafka._cluster_id()
        assert len(cluster_id) == 22
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
