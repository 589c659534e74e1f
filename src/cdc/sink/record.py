"""What the sink hands to Kafka: bytes and a destination, nothing about Postgres."""

from __future__ import annotations

from typing import NamedTuple


class Record(NamedTuple):
    """One Kafka record. Immutable; a named tuple because one is built per row (a frozen dataclass
    costs several times as much to construct)."""

    topic: str
    key: bytes  # never None: every record on a compacted topic has a key (invariant 3)
    value: bytes | None  # None is a tombstone
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None  # None: the partitioner chooses from the key

    @property
    def size(self) -> int:
        """Bytes this record holds in memory, for the in-flight byte budget."""
        n = len(self.topic) + len(self.key) + (len(self.value) if self.value is not None else 0)
        for name, value in self.headers:
            n += len(name) + len(value)
        return n
