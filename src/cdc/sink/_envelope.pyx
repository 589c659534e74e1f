# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled envelopes of the JSON and Avro formats. JSON: a row change whose rows the decoder rendered, in; its Kafka
records (topic, key bytes, value bytes: Debezium's envelope around the rows and the spliced source block,
headers), out, in one call. Beside the reference (``EventSerializer.reference_records`` of ``cdc.sink.json``),
which it must match byte for byte (tests/unit/test_envelope_codec.py), and which it hands every other event:
typed rows, a key change, truncates, messages, a source block that cannot be spliced.

``AvroRecords`` does the same for the Avro format (``cdc.sink.avro``; tests/unit/test_avro_envelope_codec.py):
the Confluent wire format around the envelope's Avro binary, its constant pieces (schema ids included) taken
from the serializer's own plan (``AvroTablePlan.envelope``, a ``cdc.sink.envelopes.AvroEnvelope``), which
alone registers schemas.

Both read the serializer through its public contracts only: ``plan(table)`` once per table, ``source_pieces(...)``
(a ``cdc.sink.records.SourcePieces``) once per transaction and table, and ``position_headers`` at each event.
``cdc.sink.envelopes`` builds them; ``cdc.compiled`` chooses between this module and the reference. The module
imports nothing of the package: what it needs of the Python side is handed to its constructors.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

# The envelope's constant text, between its parts (the template of cdc.sink.json._ENVELOPE_TEMPLATES).
cdef bytes _BEFORE = b'{"before":'
cdef bytes _AFTER = b',"after":'
cdef bytes _SOURCE = b',"source":'
cdef bytes _TRANSACTION = b',"transaction":'
cdef bytes _OP = b',"op":"'
cdef bytes _TS_MS = b'","ts_ms":'
cdef bytes _TS_US = b',"ts_us":'
cdef bytes _TS_NS = b',"ts_ns":'
cdef bytes _NULL = b"null"

cdef int _MAX_PLANS = 4096
cdef tuple _OP_TEXT = (b"c", b"r", b"u", b"d")  # by _Records._rows's op


cdef inline Py_ssize_t _digits(char* out, uint64_t v) noexcept nogil:
    """``v`` in decimal at ``out`` (room for 20); its length."""
    cdef char tmp[20]
    cdef Py_ssize_t n = 0, i
    while True:
        tmp[n] = <char>(48 + v % 10)
        n += 1
        v //= 10
        if v == 0:
            break
    for i in range(n):
        out[i] = tmp[n - 1 - i]
    return n


cdef inline char* _put(char* at, bytes piece) noexcept:
    cdef Py_ssize_t n = PyBytes_GET_SIZE(piece)
    memcpy(at, PyBytes_AS_STRING(piece), n)
    return at + n


cdef inline char* _put_raw(char* at, const char* text, Py_ssize_t n) noexcept nogil:
    memcpy(at, text, n)
    return at + n


cdef class _Records:
    """What the two compiled envelopes share: the serializer and its reference, the event's classes, which
    row changes they write themselves (``_rows``), the source block's pieces of the last transaction and
    table seen (``_source``; the format's ``_source_parts`` fetches them), and the position headers."""

    cdef object serializer
    cdef object reference  # the serializer's reference_records, for everything else
    cdef object change_class  # ChangeEvent
    cdef object row_class  # RenderedRow
    cdef object record_class  # Record
    cdef object op_create, op_read, op_update, op_delete
    cdef object position_headers  # cdc.sink.records.position_headers: headers outside a transaction
    cdef str lsn_header, commit_header, txid_header, ordinal_header
    cdef object clock
    cdef dict plans  # id(table) -> the format's plan of a table
    # the source block's pieces of the last transaction and table seen
    cdef object s_table, s_commit_lsn, s_xid, s_ts
    cdef bint s_snapshot
    cdef bytes s_head, s_middle, s_tail
    # the position headers that stay the same through the last transaction seen
    cdef object h_commit_lsn, h_xid
    cdef tuple h_commit, h_txid
    cdef object record_new
    # the rows of the event _rows last took: the envelope's before and after, and the row that gives the key
    cdef object before, after, keyed

    def __init__(self, serializer, reference, change_class, row_class, record_class, ops, position_headers,
                 header_names, clock):
        self.serializer = serializer
        self.reference = reference
        self.change_class = change_class
        self.row_class = row_class
        self.record_class = record_class
        self.op_create, self.op_read, self.op_update, self.op_delete = ops
        self.position_headers = position_headers
        self.lsn_header, self.commit_header, self.txid_header, self.ordinal_header = header_names
        self.clock = clock
        self.plans = {}
        self.s_table = None
        self.h_xid = None
        self.h_commit_lsn = None
        self.record_new = tuple.__new__

    cdef int _rows(self, event) except -2:
        """The op this envelope writes itself (0 create, 1 read, 2 update, 3 delete), its rows in ``before``,
        ``after`` and ``keyed``; -1 where the reference must take the event (not a row change, typed rows, a
        key change: Debezium's delete, tombstone and create)."""
        if type(event) is not self.change_class:
            return -1
        op = event.op
        row_class = self.row_class
        if op is self.op_create or op is self.op_read:
            after = event.after
            if type(after) is not row_class:
                return -1
            self.before = None  # the reference writes a create's or read's envelope without one, whatever the event holds
            self.after = self.keyed = after
            return 0 if op is self.op_create else 1
        if op is self.op_delete:
            before = event.before
            if type(before) is not row_class:
                return -1
            self.before = self.keyed = before
            self.after = None
            return 3
        if op is self.op_update:
            after = event.after
            before = event.before
            if type(after) is not row_class:
                return -1
            if before is not None and (type(before) is not row_class or before.key_data != after.key_data):
                return -1  # typed, or a key change (delete, tombstone, create)
            self.before = before
            self.after = self.keyed = after
            return 2
        return -1

    cdef bint _source(self, table, commit_ts_us, commit_lsn, xid, bint snapshot) except -1:
        """Whether the source block of this transaction and table can be spliced (its pieces in s_*)."""
        if (
            table is self.s_table
            and snapshot == self.s_snapshot
            and commit_lsn == self.s_commit_lsn
            and xid == self.s_xid
            and commit_ts_us == self.s_ts
        ):
            return True
        if not self._source_parts(table, commit_ts_us, commit_lsn, xid, snapshot):
            return False
        self.s_table, self.s_commit_lsn, self.s_xid, self.s_ts, self.s_snapshot = table, commit_lsn, xid, commit_ts_us, snapshot
        return True

    cdef bint _source_parts(self, table, commit_ts_us, commit_lsn, xid, bint snapshot) except -1:
        """The format's source pieces into s_head, s_middle, s_tail; False: they cannot be spliced."""
        raise NotImplementedError

    cdef tuple _headers(self, lsn, bytes lsn_text, commit_lsn, xid, ordinal):
        if commit_lsn is None or xid is None:
            return self.position_headers(lsn, commit_lsn, xid, ordinal)
        if not (xid == self.h_xid and commit_lsn == self.h_commit_lsn):
            self.h_commit = (self.commit_header, b"%d" % commit_lsn)
            self.h_txid = (self.txid_header, b"%d" % xid)
            self.h_commit_lsn, self.h_xid = commit_lsn, xid
        return ((self.lsn_header, lsn_text), self.h_commit, self.h_txid, (self.ordinal_header, b"%d" % ordinal))

    cdef inline object _record(self, topic, key, value, headers):
        return self.record_new(self.record_class, (topic, key, value, headers, None))


cdef class JsonRecords(_Records):
    """``records(event)`` of a ``JsonSerializer``: row changes of rendered rows compiled, the rest by ``reference``."""

    cdef bint schemas
    cdef object dumps  # orjson.dumps: a transaction block (transaction_metadata: true) as the reference writes it

    def __init__(self, serializer, reference, change_class, row_class, record_class, ops, position_headers,
                 header_names, bint schemas, clock, dumps):
        _Records.__init__(self, serializer, reference, change_class, row_class, record_class, ops, position_headers,
                          header_names, clock)
        self.schemas = schemas
        self.dumps = dumps

    cdef tuple _plan(self, table):
        """(table, topic, key_prefix, value_prefix), or None where the reference must take the event."""
        cdef object entry = self.plans.get(id(table))
        if entry is not None and (<tuple>entry)[0] is table:
            return <tuple>entry
        plan = self.serializer.plan(table)  # cdc.sink.json.JsonTablePlan
        if not plan.key_fields:
            return None  # the reference raises the error
        entry = (table, plan.topic, plan.key_prefix, plan.value_prefix)
        if len(self.plans) >= _MAX_PLANS:
            self.plans.clear()
        self.plans[id(table)] = entry
        return <tuple>entry

    cdef bint _source_parts(self, table, commit_ts_us, commit_lsn, xid, bint snapshot) except -1:
        pieces = self.serializer.source_pieces(table, commit_ts_us, commit_lsn, xid, snapshot)
        if pieces is None:
            return False
        self.s_head, self.s_middle, self.s_tail = pieces.head, pieces.middle, pieces.tail
        return True

    cdef bytes _value(self, tuple plan, before, after, bytes transaction, bytes op, const char* lsn_text,
                      Py_ssize_t lsn_len, const char* ms_text, Py_ssize_t ms_len, const char* us_text,
                      Py_ssize_t us_len, const char* ns_text, Py_ssize_t ns_len):
        """The envelope: [schema prefix] {"before":..,"after":..,"source":..,"transaction":..,"op":..,"ts_*":..} [}]."""
        cdef bytes value_prefix = <bytes>plan[3] if self.schemas else b""
        cdef bytes b = _NULL if before is None else <bytes>before
        cdef bytes a = _NULL if after is None else <bytes>after
        cdef Py_ssize_t n = (
            PyBytes_GET_SIZE(value_prefix) + PyBytes_GET_SIZE(_BEFORE) + PyBytes_GET_SIZE(b) + PyBytes_GET_SIZE(_AFTER)
            + PyBytes_GET_SIZE(a) + PyBytes_GET_SIZE(_SOURCE) + PyBytes_GET_SIZE(self.s_head) + lsn_len
            + PyBytes_GET_SIZE(self.s_middle) + lsn_len + PyBytes_GET_SIZE(self.s_tail) + PyBytes_GET_SIZE(_TRANSACTION)
            + PyBytes_GET_SIZE(transaction) + PyBytes_GET_SIZE(_OP)
            + PyBytes_GET_SIZE(op) + PyBytes_GET_SIZE(_TS_MS) + ms_len + PyBytes_GET_SIZE(_TS_US) + us_len
            + PyBytes_GET_SIZE(_TS_NS) + ns_len + 1 + (1 if self.schemas else 0)
        )
        cdef bytes out = PyBytes_FromStringAndSize(NULL, n)
        cdef char* at = PyBytes_AS_STRING(out)
        at = _put(at, value_prefix)
        at = _put(at, _BEFORE)
        at = _put(at, b)
        at = _put(at, _AFTER)
        at = _put(at, a)
        at = _put(at, _SOURCE)
        at = _put(at, self.s_head)
        at = _put_raw(at, lsn_text, lsn_len)
        at = _put(at, self.s_middle)
        at = _put_raw(at, lsn_text, lsn_len)
        at = _put(at, self.s_tail)
        at = _put(at, _TRANSACTION)
        at = _put(at, transaction)
        at = _put(at, _OP)
        at = _put(at, op)
        at = _put(at, _TS_MS)
        at = _put_raw(at, ms_text, ms_len)
        at = _put(at, _TS_US)
        at = _put_raw(at, us_text, us_len)
        at = _put(at, _TS_NS)
        at = _put_raw(at, ns_text, ns_len)
        at[0] = 125  # '}'
        if self.schemas:
            at[1] = 125
        return out

    def __call__(self, event):
        cdef int op = self._rows(event)
        if op < 0:
            return self.reference(event)
        before, after, keyed = self.before, self.after, self.keyed
        table = event.table
        cdef tuple plan = self._plan(table)
        if plan is None:
            return self.reference(event)
        commit_lsn, xid, commit_ts_us = event.commit_lsn, event.xid, event.commit_ts_us
        if not self._source(table, commit_ts_us, commit_lsn, xid, event.snapshot):
            return self.reference(event)
        lsn = event.lsn
        if not 0 <= lsn <= 0xFFFFFFFFFFFFFFFF:
            return self.reference(event)
        cdef char lsn_text[24]
        cdef Py_ssize_t lsn_len = _digits(lsn_text, <uint64_t>lsn)
        # The clock is read once an event, as the reference reads it; a reading outside 0..2^63 (before the
        # epoch, or past 2262) is written with Python's digits, as the reference writes any int.
        now = self.clock()
        cdef char ms_buf[24]
        cdef char us_buf[24]
        cdef char ns_buf[24]
        cdef const char* ms_text = ms_buf
        cdef const char* us_text = us_buf
        cdef const char* ns_text = ns_buf
        cdef Py_ssize_t ms_len, us_len, ns_len
        cdef int64_t now64
        cdef bytes ms_b, us_b, ns_b
        if 0 <= now < 0x8000000000000000:
            now64 = now
            ms_len = _digits(ms_buf, <uint64_t>(now64 // 1000000))
            us_len = _digits(us_buf, <uint64_t>(now64 // 1000))
            ns_len = _digits(ns_buf, <uint64_t>now64)
        else:
            ms_b, us_b, ns_b = b"%d" % (now // 1000000), b"%d" % (now // 1000), b"%d" % now
            ms_text, us_text, ns_text = ms_b, us_b, ns_b
            ms_len, us_len, ns_len = PyBytes_GET_SIZE(ms_b), PyBytes_GET_SIZE(us_b), PyBytes_GET_SIZE(ns_b)
        block = event.transaction
        cdef bytes transaction = _NULL if block is None else self.dumps(block.as_dict())
        headers = ()
        if self.serializer.position_headers:
            headers = self._headers(lsn, PyBytes_FromStringAndSize(lsn_text, lsn_len), commit_lsn, xid, event.ordinal)
        key = keyed.key_data
        if self.schemas:
            key = <bytes>plan[2] + key + b"}"
        topic = plan[1]
        if op == 3:  # a delete: its envelope, then the tombstone
            value = self._value(plan, before.data, None, transaction, <bytes>_OP_TEXT[3], lsn_text, lsn_len,
                                ms_text, ms_len, us_text, us_len, ns_text, ns_len)
            return [self._record(topic, key, value, headers), self._record(topic, key, None, headers)]
        value = self._value(plan, None if before is None else before.data, after.data, transaction,
                            <bytes>_OP_TEXT[op], lsn_text, lsn_len, ms_text, ms_len, us_text, us_len, ns_text, ns_len)
        return [self._record(topic, key, value, headers)]


# --- Avro ---------------------------------------------------------------------------------------------

cdef inline char* _varint(char* at, uint64_t z) noexcept nogil:
    """Avro's varint of an already zig-zagged ``z`` at ``at`` (room for 10); past its end."""
    while z >= 0x80:
        at[0] = <char>((z & 0x7F) | 0x80)
        at += 1
        z >>= 7
    at[0] = <char>z
    return at + 1


cdef inline uint64_t _zigzag(int64_t n) noexcept nogil:
    return (<uint64_t>n << 1) ^ <uint64_t>(n >> 63)


cdef inline int64_t _floor_div(int64_t n, int64_t d) noexcept nogil:
    """Python's ``n // d`` (d > 0): C's division truncates towards zero."""
    cdef int64_t q = n / d
    if n % d != 0 and n < 0:
        q -= 1
    return q


cdef class AvroRecords(_Records):
    """``records(event)`` of an ``AvroSerializer``: row changes of rendered rows compiled, the rest by ``reference``.

    The value is the Confluent wire format around the envelope's Avro binary: the plan's wire prefix, the
    ``before``/``after`` unions (their branch bytes and the rows' binaries), the source block spliced around
    its two per-event fields (``sequence``, ``lsn``), the transaction union, ``op`` and the three clock
    fields. Each constant piece is taken from the serializer's own compiled field writers by
    ``cdc.sink.envelopes.avro_envelope`` (which checks them against the varints written here), so the
    schemas, their ids and their registration stay the reference's.
    """

    cdef object clock_error  # clock_beyond_avro_long(ns): the reference's error for a clock past an Avro long
    cdef bytes seq_prefix, lsn_prefix  # the source's sequence and lsn fields before their values (union branch)

    def __init__(self, serializer, reference, change_class, row_class, record_class, ops, position_headers,
                 header_names, clock, clock_error, bytes seq_prefix, bytes lsn_prefix):
        _Records.__init__(self, serializer, reference, change_class, row_class, record_class, ops, position_headers,
                          header_names, clock)
        self.clock_error = clock_error
        self.seq_prefix = seq_prefix
        self.lsn_prefix = lsn_prefix

    cdef tuple _plan(self, table):
        """(topic, key prefix, wire prefix, before null, before tag, after null, after tag, no transaction,
        transaction writer, op c, op r, op u, op d, ts_ms prefix, ts_us prefix, ts_ns prefix), or None where
        the reference must take the event. The serializer's plan is made (and its schemas registered) by the
        serializer itself, as the reference would at this event."""
        cdef object entry = self.plans.get(id(table))
        if entry is not None and (<tuple>entry)[0] is table:
            return <tuple>(<tuple>entry)[1]
        e = self.serializer.plan(table).envelope  # cdc.sink.envelopes.AvroEnvelope, or None
        pieces = None if e is None else (
            e.topic, e.key_prefix, e.value_prefix, e.before_null, e.before_branch, e.after_null, e.after_branch,
            e.no_transaction, e.write_transaction, e.op_create, e.op_read, e.op_update, e.op_delete,
            e.ts_ms_prefix, e.ts_us_prefix, e.ts_ns_prefix,
        )
        if len(self.plans) >= _MAX_PLANS:
            self.plans.clear()
        self.plans[id(table)] = (table, pieces)
        return <tuple>pieces

    cdef bint _source_parts(self, table, commit_ts_us, commit_lsn, xid, bint snapshot) except -1:
        pieces = self.serializer.source_pieces(table, commit_ts_us, commit_lsn, xid, snapshot)
        if pieces is None:
            return False
        self.s_head, self.s_middle, self.s_tail = pieces.head, pieces.middle, pieces.tail
        return True

    cdef bytes _value(self, tuple plan, before, after, bytes transaction, bytes op, bint has_commit,
                      uint64_t commit_lsn, uint64_t lsn, const char* lsn_text, Py_ssize_t lsn_len, int64_t now):
        """wire prefix, before, after, source (head, sequence, middle, lsn, tail), transaction, op, ts_ms/us/ns."""
        cdef char seq[72]  # varint of the text's length, then ["<commit lsn>","<lsn>"] or [null,"<lsn>"]
        cdef char text[64]
        cdef char* t = text
        t[0] = 91  # '['
        t += 1
        if has_commit:
            t[0] = 34
            t = t + 1
            t += _digits(t, commit_lsn)
            t[0] = 34
            t += 1
        else:
            t = _put_raw(t, b"null", 4)
        t = _put_raw(t, b',"', 2)
        t = _put_raw(t, lsn_text, lsn_len)
        t = _put_raw(t, b'"]', 2)
        cdef Py_ssize_t text_len = t - text
        cdef char* s = _varint(seq, _zigzag(text_len))
        s = _put_raw(s, text, text_len)
        cdef Py_ssize_t seq_len = s - seq
        cdef char lsn_var[10]
        cdef Py_ssize_t lsn_var_len = _varint(lsn_var, _zigzag(<int64_t>lsn)) - lsn_var
        cdef char times[30]
        cdef char* m = _varint(times, _zigzag(_floor_div(now, 1000000)))
        cdef Py_ssize_t ms_len = m - times
        cdef char* u = _varint(m, _zigzag(_floor_div(now, 1000)))
        cdef Py_ssize_t us_len = u - m
        cdef Py_ssize_t ns_len = _varint(u, _zigzag(now)) - u
        cdef bytes b_head = <bytes>plan[3] if before is None else <bytes>plan[4]
        cdef bytes b = b"" if before is None else <bytes>before
        cdef bytes a_head = <bytes>plan[5] if after is None else <bytes>plan[6]
        cdef bytes a = b"" if after is None else <bytes>after
        cdef bytes wire = <bytes>plan[2]
        cdef bytes ms_prefix = <bytes>plan[13]
        cdef bytes us_prefix = <bytes>plan[14]
        cdef bytes ns_prefix = <bytes>plan[15]
        cdef Py_ssize_t n = (
            PyBytes_GET_SIZE(wire) + PyBytes_GET_SIZE(b_head) + PyBytes_GET_SIZE(b) + PyBytes_GET_SIZE(a_head)
            + PyBytes_GET_SIZE(a) + PyBytes_GET_SIZE(self.s_head) + PyBytes_GET_SIZE(self.seq_prefix) + seq_len
            + PyBytes_GET_SIZE(self.s_middle) + PyBytes_GET_SIZE(self.lsn_prefix) + lsn_var_len
            + PyBytes_GET_SIZE(self.s_tail) + PyBytes_GET_SIZE(transaction) + PyBytes_GET_SIZE(op)
            + PyBytes_GET_SIZE(ms_prefix) + ms_len + PyBytes_GET_SIZE(us_prefix) + us_len
            + PyBytes_GET_SIZE(ns_prefix) + ns_len
        )
        cdef bytes out = PyBytes_FromStringAndSize(NULL, n)
        cdef char* at = PyBytes_AS_STRING(out)
        at = _put(at, wire)
        at = _put(at, b_head)
        at = _put(at, b)
        at = _put(at, a_head)
        at = _put(at, a)
        at = _put(at, self.s_head)
        at = _put(at, self.seq_prefix)
        at = _put_raw(at, seq, seq_len)
        at = _put(at, self.s_middle)
        at = _put(at, self.lsn_prefix)
        at = _put_raw(at, lsn_var, lsn_var_len)
        at = _put(at, self.s_tail)
        at = _put(at, transaction)
        at = _put(at, op)
        at = _put(at, ms_prefix)
        at = _put_raw(at, times, ms_len)
        at = _put(at, us_prefix)
        at = _put_raw(at, m, us_len)
        at = _put(at, ns_prefix)
        at = _put_raw(at, u, ns_len)
        return out

    def __call__(self, event):
        cdef int op = self._rows(event)
        if op < 0:
            return self.reference(event)
        before, after, keyed = self.before, self.after, self.keyed
        table = event.table
        cdef tuple plan = self._plan(table)
        if plan is None:
            return self.reference(event)
        commit_lsn, xid, commit_ts_us = event.commit_lsn, event.xid, event.commit_ts_us
        lsn = event.lsn
        # an LSN past an Avro long, or one that is not a 64-bit position: the reference's answer (an error)
        if not 0 <= lsn < 0x8000000000000000 or not (commit_lsn is None or 0 <= commit_lsn <= 0xFFFFFFFFFFFFFFFF):
            return self.reference(event)
        if not self._source(table, commit_ts_us, commit_lsn, xid, event.snapshot):
            return self.reference(event)
        block = event.transaction
        cdef bytes transaction
        if block is None:
            transaction = <bytes>plan[7]
        else:
            try:
                transaction = plan[8](block.as_dict())
            except Exception:
                return self.reference(event)  # a block that does not fit: the reference's error
        cdef char lsn_text[24]
        cdef Py_ssize_t lsn_len = _digits(lsn_text, <uint64_t>lsn)
        clock = self.clock()
        if not -0x8000000000000000 <= clock <= 0x7FFFFFFFFFFFFFFF:
            raise self.clock_error(clock)  # the reference's error: ts_ns is an Avro long
        cdef int64_t now = clock
        headers = ()
        if self.serializer.position_headers:
            headers = self._headers(lsn, PyBytes_FromStringAndSize(lsn_text, lsn_len), commit_lsn, xid, event.ordinal)
        key = <bytes>plan[1] + keyed.key_data
        topic = plan[0]
        value = self._value(
            plan,
            None if before is None else before.data,
            None if after is None else after.data,
            transaction,
            <bytes>plan[9 + op],  # op c, r, u, d at 9..12, in _rows's order
            commit_lsn is not None,
            0 if commit_lsn is None else <uint64_t>commit_lsn,
            <uint64_t>lsn,
            lsn_text,
            lsn_len,
            now,
        )
        if op == 3:  # a delete: its envelope, then the tombstone
            return [self._record(topic, key, value, headers), self._record(topic, key, None, headers)]
        return [self._record(topic, key, value, headers)]
