# cython: language_level=3
"""A rendered JSON chunk's loop, compiled: ``cdc.snapshot.send.send_rendered`` (the reference there, which it
must match call for call: tests/unit/test_snapshot_send.py) with the loop's counters, the tail of the value
and the header copy in C. What it calls per line are C functions already (libpq's buffered line through
psycopg's ``PGconn``, the compiled row codec, confluent-kafka's ``produce``); the Python frames of the
reference's loop are what this removes."""

from cpython.bytes cimport PyBytes_GET_SIZE


def send_rendered(chunk):
    """The chunk's lines to Kafka; the number of rows."""
    cdef object get = chunk.get, read = chunk.read, record = chunk.record, produce = chunk.produce
    cdef bytes key_head = chunk.key_head, key_end = chunk.key_end, value_head = chunk.value_head
    cdef bytes value_middle = chunk.value_middle, value_end = chunk.value_end
    cdef object times = chunk.times, clock = chunk.clock
    cdef object topic = chunk.topic
    cdef Py_ssize_t limit = chunk.limit
    cdef object position = chunk.headers
    cdef dict headers_copy
    cdef object headers = position
    cdef bint with_ordinal = chunk.with_ordinal
    cdef object ordinal_header = chunk.ordinal_header
    cdef tuple declines = chunk.declines
    cdef long long progress_every = chunk.progress_every, clock_every = chunk.clock_every
    cdef long long ordinal = chunk.ordinal
    cdef long long n = 0
    cdef bytes tail = b""
    cdef object data, key, value, pair
    cdef Py_ssize_t nbytes
    while True:
        pair = get(1)
        nbytes = pair[0]
        if nbytes == 0:  # nothing buffered: psycopg waits for the socket (and sees the end, if it is that)
            data = read()
            if not data:
                break
        elif nbytes < 0:
            chunk.end()
            break
        else:
            data = pair[1]
        ordinal += 1
        if n % clock_every == 0:
            tail = value_middle + <bytes?>times(clock()) + value_end
        if n % progress_every == 0 and n:
            chunk.progress(n)
        n += 1
        try:
            key, value = record(data, key_head, key_end, value_head, tail)
        except declines:
            chunk.declined(data, ordinal)
            continue
        if with_ordinal:
            headers_copy = (<dict?>position).copy()
            headers_copy[ordinal_header] = b"%d" % ordinal
            headers = headers_copy
        if PyBytes_GET_SIZE(<bytes?>value) > limit:
            chunk.oversized(key, value, headers)
            continue
        while True:
            try:
                if headers is None:  # positional only: see send.py
                    produce(topic, value, key)
                else:
                    produce(topic, value, key, headers=headers)
                break
            except BufferError:
                chunk.wait()
    return n
