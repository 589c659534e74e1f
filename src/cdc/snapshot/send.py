"""A rendered JSON chunk's loop: COPY lines in, records to the bulk producer out (``cdc.snapshot.worker``'s
``_copy_chunk_rendered``), and the loader of its compiled form (``cdc.snapshot._send``).

Per line the loop calls the row codec's ``copy_record`` (the line's key and value, the envelope's constant
parts around them), copies the position headers with the row's ordinal, and produces with no per-record
callback; it reads the next line from libpq directly (``copyout.line_calls``). Everything that is not that
common case goes back to the worker through a callback: a line the codec declines (the typed path reads
it and raises what is wrong), an oversized record (the delivery's size limit and dead letters), the
producer's full queue (``BufferError``: wait, then produce again), progress every ``progress_every`` rows.
``send_rendered`` is the reference; the compiled loop must make the same calls with the same arguments, in
the same order (tests/unit/test_snapshot_send.py). ``SEND_RENDERED`` is the one ``cdc.compiled`` chose.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from cdc.compiled import CHOSEN
from cdc.render.rows import CopyRecord

__all__ = ["SEND_RENDERED", "RenderedChunk", "send_rendered"]

Headers = dict[str, str | bytes | None]


@dataclass(frozen=True, slots=True)
class RenderedChunk:
    """What the loop needs of one chunk: where its lines come from, how they are written, where they go."""

    get: Callable[[int], tuple[int, Any]]  # libpq's buffered line (PGconn.get_copy_data(1)): (> 0, line), 0, -1
    read: Callable[[], Any]  # waits for the socket (psycopg's Copy.read); empty: the COPY ended
    end: Callable[[], None]  # libpq reported the end (get gave -1): read the COPY's result
    record: CopyRecord  # the row codec: (line, key_head, key_end, value_head, value_end) -> (key, value)
    key_head: bytes
    key_end: bytes
    value_head: bytes
    value_middle: bytes  # the value's end is value_middle + times(now) + value_end, renewed every clock_every
    value_end: bytes
    times: Callable[[int], bytes]  # time.time_ns() -> the envelope's processing time, as JSON
    clock: Callable[[], int]  # time.time_ns
    produce: Callable[..., None]  # the bulk producer's (topic, value, key, headers=...)
    wait: Callable[[], Any]  # the producer's queue is full: serve it
    topic: str
    limit: int  # a larger value goes to ``oversized``
    headers: Headers | None  # the position headers, copied per record when ``with_ordinal``
    with_ordinal: bool
    ordinal_header: str
    ordinal: int  # the chunk's first row has ordinal + 1
    declines: tuple[type[BaseException], ...]  # what the codec raises on a line it does not cover
    declined: Callable[[Any, int], None]  # (line, ordinal): the typed path
    oversized: Callable[[bytes, bytes, Headers | None], None]  # (key, value, headers): the delivery
    progress: Callable[[int], None]  # rows so far, every progress_every rows
    progress_every: int
    clock_every: int


def send_rendered(chunk: RenderedChunk) -> int:
    """The chunk's lines to Kafka; the number of rows."""
    get, read, record, produce = chunk.get, chunk.read, chunk.record, chunk.produce
    key_head, key_end, value_head = chunk.key_head, chunk.key_end, chunk.value_head
    topic, limit, position, with_ordinal = chunk.topic, chunk.limit, chunk.headers, chunk.with_ordinal
    ordinal_header, declines = chunk.ordinal_header, chunk.declines
    progress_every, clock_every = chunk.progress_every, chunk.clock_every
    headers = position
    ordinal = chunk.ordinal
    n = 0
    tail = b""
    while True:
        nbytes, data = get(1)
        if nbytes == 0:  # nothing buffered: psycopg waits for the socket (and sees the end, if it is that)
            data = read()
            if not data:
                break
        elif nbytes < 0:
            chunk.end()
            break
        ordinal += 1
        if n % clock_every == 0:
            tail = chunk.value_middle + chunk.times(chunk.clock()) + chunk.value_end
        if n % progress_every == 0 and n:
            chunk.progress(n)
        n += 1
        try:
            key, value = record(data, key_head, key_end, value_head, tail)
        except declines:
            chunk.declined(data, ordinal)
            continue
        if with_ordinal:
            headers = position.copy()  # type: ignore[union-attr]  # with_ordinal: the chunk has position headers
            headers[ordinal_header] = b"%d" % ordinal
        if len(value) > limit:
            chunk.oversized(key, value, headers)
            continue
        while True:
            try:
                # Positional alone when there are no headers: given any keyword, confluent-kafka's argument
                # parsing looks up each of its optional keywords by name, on every call (bench/README.md).
                if headers is None:
                    produce(topic, value, key)
                else:
                    produce(topic, value, key, headers=headers)
                break
            except BufferError:
                chunk.wait()
    return n


SEND_RENDERED: Final[Callable[[RenderedChunk], int]] = (
    CHOSEN.compiled("snapshot_send", "send_rendered") or send_rendered
)
"""The chunk loop that runs: the compiled one (``cdc.snapshot._send``), or the reference (not built, or
``CDC_PURE_PYTHON`` set)."""
