"""Search view: one denormalized document per entity in an embedded tantivy index.

``build(documents, index_dir)`` rebuilds the index from zero in a sibling directory and swaps it
into place, so a reader never sees a half-built index and a failed build leaves the old one.
``update(index_dir, documents, doc_ids)`` replaces the given documents in place (the continuous
job). ``search(index_dir, query)`` answers a query (tantivy's query language over ``title`` and
``body``: words, "phrases", AND/OR, ``kind:order``) with the best documents as dicts.

Documents (see ``views.search_documents``): ``doc_id`` (``order:1``), ``kind``, ``title``, ``body``,
``data`` (the entity as JSON text, stored, not indexed for search).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import structlog
import tantivy

log = structlog.get_logger("cdc_views.search")

FIELDS = ("doc_id", "kind", "title", "body", "data")
WRITER_HEAP_BYTES = 64 * 1024 * 1024


class SearchIndexMissing(RuntimeError):
    """No index at the given directory."""


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("doc_id", stored=True, tokenizer_name="raw")
    builder.add_text_field("kind", stored=True, tokenizer_name="raw")
    builder.add_text_field("title", stored=True)
    builder.add_text_field("body", stored=True)
    builder.add_text_field("data", stored=True, index_option="basic", tokenizer_name="raw")
    return builder.build()


def _document(doc: dict[str, Any]) -> tantivy.Document:
    return tantivy.Document(**{f: str(doc.get(f) or "") for f in FIELDS})


def build(documents: Iterable[dict[str, Any]], index_dir: Path) -> int:
    """A new index of ``documents`` at ``index_dir`` (replacing any); returns how many were indexed."""
    return write_index(_schema(), (_document(doc) for doc in documents), index_dir, name="search")


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


def exists(index_dir: Path) -> bool:
    return index_dir.is_dir() and bool(tantivy.Index.exists(str(index_dir)))


def _open(index_dir: Path) -> tantivy.Index:
    if not exists(index_dir):
        raise SearchIndexMissing(f"no search index at {index_dir}: build it first (python spark/search_index.py ...)")
    return tantivy.Index.open(str(index_dir))


def update(index_dir: Path, documents: Iterable[dict[str, Any]], doc_ids: Iterable[str]) -> int:
    """Delete ``doc_ids`` and add ``documents`` (the current version of those that still exist)."""
    index = _open(index_dir) if exists(index_dir) else None
    if index is None:
        index_dir.mkdir(parents=True, exist_ok=True)
        index = tantivy.Index(_schema(), path=str(index_dir), reuse=False)
    writer = index.writer(heap_size=WRITER_HEAP_BYTES, num_threads=1)
    for doc_id in doc_ids:
        writer.delete_documents_by_term("doc_id", doc_id)
    added = 0
    for doc in documents:
        writer.add_document(_document(doc))
        added += 1
    writer.commit()
    writer.wait_merging_threads()
    return added


def _hit(searcher: tantivy.Searcher, address: tantivy.DocAddress, score: float | None) -> dict[str, Any]:
    stored = searcher.doc(address).to_dict()
    hit: dict[str, Any] = {f: (stored.get(f) or [""])[0] for f in ("doc_id", "kind", "title")}
    data = (stored.get("data") or ["{}"])[0]
    hit["data"] = json.loads(data) if data else {}
    if score is not None:
        hit["score"] = round(float(score), 4)
    return hit


def search(index_dir: Path | str, query: str, limit: int = 10) -> list[dict[str, Any]]:
    """The best ``limit`` documents for ``query``: ``[{doc_id, kind, title, data, score}]``."""
    index = _open(Path(index_dir))
    index.reload()
    searcher = index.searcher()
    try:
        parsed = index.parse_query(query, ["title", "body"])
    except ValueError as exc:
        raise ValueError(f"cannot parse search query {query!r}: {exc}") from exc
    return [_hit(searcher, address, score) for score, address in searcher.search(parsed, limit).hits]


def all_documents(index_dir: Path) -> Iterator[dict[str, Any]]:
    """Every document in the index (for verification): ``{doc_id, kind, title, body, data}``."""
    index = _open(index_dir)
    index.reload()
    searcher = index.searcher()
    total = searcher.num_docs
    if total == 0:
        return
    for _, address in searcher.search(tantivy.Query.all_query(), total).hits:
        stored = searcher.doc(address).to_dict()
        yield {f: (stored.get(f) or [""])[0] for f in FIELDS}
