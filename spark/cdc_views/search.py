"""Writing a tantivy index so that a reader never sees a half-built one (the declared indexes, declared.py).

``write_index(schema, documents, path)`` builds the index in a sibling directory and swaps it into
place; a failed build leaves the old one.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

import structlog
import tantivy

log = structlog.get_logger("cdc_views.search")

WRITER_HEAP_BYTES = 64 * 1024 * 1024


def write_index(schema: tantivy.Schema, documents: Iterable[tantivy.Document], path: Path, *, name: str) -> int:
    """A new tantivy index of ``documents`` built beside ``path``, then swapped into place, so a reader never
    sees a half-built one; returns how many were indexed. Logs progress every 100,000 documents."""
    started = time.monotonic()
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = path.with_name(f".{path.name}.building-{os.getpid()}")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir()
    index = tantivy.Index(schema, path=str(fresh), reuse=False)
    writer = index.writer(heap_size=WRITER_HEAP_BYTES, num_threads=1)
    count = 0
    for doc in documents:
        writer.add_document(doc)
        count += 1
        if count % 100_000 == 0:
            log.info("index.progress", index=name, documents=count)
    writer.commit()
    writer.wait_merging_threads()
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    if path.exists():
        os.replace(path, old)
    os.replace(fresh, path)
    shutil.rmtree(old, ignore_errors=True)
    log.info("index.built", index=name, path=str(path), documents=count, seconds=round(time.monotonic() - started, 2))
    return count
