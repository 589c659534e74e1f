"""What can stop a snapshot, each with the problem and the fix in its message."""

from __future__ import annotations


class SnapshotError(Exception):
    """A snapshot cannot go on. The slot and the progress topic stay as they are, so the next start resumes."""


class SnapshotImportError(SnapshotError):
    """The exported snapshot can no longer be imported (its exporter ran another command or went away)."""


class SnapshotInterrupted(SnapshotError):
    """The snapshot was stopped (stop requested, or every worker died) before every chunk was in Kafka."""


class SnapshotRefused(SnapshotError):
    """A snapshot that cannot be done as asked: unknown table, no key for an incremental snapshot."""
