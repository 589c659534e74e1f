# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled row codec: a pgoutput TupleData in, the row's and its key's bytes out, beside the reference
(``cdc.render.rows.render_parser``), which it must match byte for byte (tests/unit/test_codec.py).

``RowCodec(rendering, parsers, pieces, key_pieces)`` is a ``RowParser``: ``codec(buf, pos)`` returns
``(RenderedRow, position after the tuple)``, or raises ``Decline`` (the decoder's general path takes the
message) or IndexError (a length past the end: the general path too). Per column it either writes the
encoding itself (in JSON or Avro, the common direct types: integers, text, bool, uuid, UTC timestamptz,
fixed-scale numeric; ``rendering.direct``) or calls the reference's own Python function for it: the
column's direct renderer, or its converter and typed renderer. Text a native writer does not cover (a
non-ASCII string, a numeric of more than 18 digits, anything malformed) goes to the column's Python
renderer, which writes it or raises what the reference raises. ``cdc.compiled`` chooses between
this module and the reference.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_FromLongLong
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

from cdc.decoder.types.scalar import parse_int

# How a column's text becomes its encoding.
cdef enum:
    K_TYPED = 0  # converter, then the typed renderer (the reference's t_i(c_i(text)))
    K_PY = 1  # the reference's direct renderer r_i(text)
    K_INT = 2
    K_TEXT = 3
    K_BOOL = 4
    K_UUID = 5
    K_TSTZ = 6
    K_NUMERIC = 7

# How a key column's encoding is made (mirrors the branches of render_parser's generated source).
cdef enum:
    KEY_SAME = 0  # the row's encoding of the column
    KEY_SAME_OR_NULL = 1  # key_null when the value is NULL, else the row's encoding
    KEY_TYPED = 2  # key_typed(typed value); a NULL declines
    KEY_TYPED_OR_NULL = 3  # key_null when NULL, else key_typed(typed value)

_NATIVE = {"int": K_INT, "text": K_TEXT, "bool": K_BOOL, "uuid": K_UUID, "timestamptz": K_TSTZ, "numeric": K_NUMERIC}

cdef const char* _B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


cdef inline bint _is_digit(unsigned char c) noexcept nogil:
    return 48 <= c <= 57


cdef inline bint _is_hex(unsigned char c) noexcept nogil:
    return (48 <= c <= 57) or (97 <= c <= 102)


cdef object _int_of(const unsigned char* s, Py_ssize_t n):
    """``parse_int``'s value of ``s[:n]`` for the text it takes at every length up to 18 digits (an optional
    ``-``, then ASCII digits); None for anything else, which ``parse_int`` itself then takes or refuses."""
    cdef Py_ssize_t i = 1 if n > 0 and s[0] == 45 else 0
    cdef int64_t value = 0
    if n == i or n - i > 18:
        return None
    while i < n:
        if not _is_digit(s[i]):
            return None
        value = value * 10 + (s[i] - 48)
        i += 1
    return PyLong_FromLongLong(-value if s[0] == 45 else value)


cdef bytes _joined(bytes head, const char* middle, Py_ssize_t length, bytes end):
    """``head + middle[:length] + end`` as one new bytes object."""
    cdef Py_ssize_t h = PyBytes_GET_SIZE(head), e = PyBytes_GET_SIZE(end)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, h + length + e)
    cdef char* p = PyBytes_AS_STRING(out)
    memcpy(p, PyBytes_AS_STRING(head), h)
    memcpy(p + h, middle, length)
    memcpy(p + h + length, PyBytes_AS_STRING(end), e)
    return out


cdef class RowCodec:
    """A compiled ``RowParser`` for one relation's rendering."""

    cdef readonly bint rendered
    cdef int count
    cdef int key_count
    cdef int* kinds
    cdef int* args
    cdef int* key_mode
    cdef int* key_column
    cdef int* key_of  # column -> key position, or -1
    cdef char* int_key  # per column: its converter is parse_int (a key's value is then parsed here)
    cdef tuple renders  # per column: the reference's direct renderer or None
    cdef tuple converters  # per column: the typed value's parser
    cdef tuple typed  # per column: the typed renderer
    cdef tuple nulls  # per column: a NULL's encoding, or None
    cdef tuple pieces  # the row's bytes between the columns' encodings (count + 1)
    cdef tuple key_pieces  # the key's the same way (key_count + 1)
    cdef tuple key_names
    cdef tuple key_typed
    cdef tuple key_nulls
    cdef object row_class
    cdef object decline
    cdef object unescape  # copy_row: COPY's escapes out of a field (None: such a field declines)
    cdef bint avro  # the natives write Avro binary (after ``prefixes[i]``, a union's branch), else JSON
    cdef tuple prefixes
    # Scratch: the row's bytes as they are written, and where each column's encoding lies in them.
    cdef char* buf
    cdef Py_ssize_t cap
    cdef Py_ssize_t* starts
    cdef Py_ssize_t* ends

    def __cinit__(self):
        self.kinds = NULL
        self.args = NULL
        self.key_mode = NULL
        self.key_column = NULL
        self.key_of = NULL
        self.int_key = NULL
        self.buf = NULL
        self.starts = NULL
        self.ends = NULL

    def __init__(self, rendering, parsers, pieces, key_pieces, row_class, decline, unescape=None):
        cdef int i, j
        names = tuple(rendering.names)
        self.count = len(names)
        self.key_count = len(rendering.key_index)
        if len(parsers) != self.count or len(pieces) != self.count + 1 or len(key_pieces) != self.key_count + 1:
            raise ValueError("a rendering's parts do not match its columns")
        self.rendered = True
        n = self.count if self.count > 0 else 1
        k = self.key_count if self.key_count > 0 else 1
        self.kinds = <int*>PyMem_Malloc(n * sizeof(int))
        self.args = <int*>PyMem_Malloc(n * sizeof(int))
        self.key_of = <int*>PyMem_Malloc(n * sizeof(int))
        self.int_key = <char*>PyMem_Malloc(n * sizeof(char))
        self.starts = <Py_ssize_t*>PyMem_Malloc(n * sizeof(Py_ssize_t))
        self.ends = <Py_ssize_t*>PyMem_Malloc(n * sizeof(Py_ssize_t))
        self.key_mode = <int*>PyMem_Malloc(k * sizeof(int))
        self.key_column = <int*>PyMem_Malloc(k * sizeof(int))
        self.cap = 256
        self.buf = <char*>PyMem_Malloc(self.cap)
        if (self.kinds == NULL or self.args == NULL or self.key_of == NULL or self.int_key == NULL
                or self.starts == NULL or self.ends == NULL
                or self.key_mode == NULL or self.key_column == NULL or self.buf == NULL):
            raise MemoryError()
        self.renders = tuple(rendering.render)
        self.converters = tuple(parsers)
        self.typed = tuple(rendering.typed)
        self.nulls = tuple(rendering.null)
        self.pieces = tuple(bytes(p) for p in pieces)
        self.key_pieces = tuple(bytes(p) for p in key_pieces)
        self.key_typed = tuple(rendering.key_typed)
        self.key_nulls = tuple(rendering.key_null)
        self.key_names = tuple(names[i] for i in rendering.key_index)
        self.row_class = row_class
        self.decline = decline
        self.unescape = unescape
        self.avro = rendering.format == "avro"
        native = rendering.format in ("json", "avro") and len(rendering.direct) == self.count
        if self.avro and len(rendering.prefix) != self.count:
            native = False
        self.prefixes = tuple(bytes(p) for p in rendering.prefix) if self.avro and native else (b"",) * self.count
        for i in range(self.count):
            self.key_of[i] = -1
            self.args[i] = 0
            self.int_key[i] = self.converters[i] is parse_int
            if self.renders[i] is None:
                self.kinds[i] = K_TYPED
            elif native and rendering.direct[i] is not None and rendering.direct[i][0] in _NATIVE:
                self.kinds[i] = _NATIVE[rendering.direct[i][0]]
                self.args[i] = rendering.direct[i][1]
            else:
                self.kinds[i] = K_PY
        for j in range(self.key_count):
            i = rendering.key_index[j]
            self.key_column[j] = i
            self.key_of[i] = j
            direct = self.renders[i] is not None
            key_null = self.key_nulls[j]
            if direct and key_null == self.nulls[i]:
                self.key_mode[j] = KEY_SAME
            elif direct and key_null is not None:
                self.key_mode[j] = KEY_SAME_OR_NULL
            elif key_null is None:
                self.key_mode[j] = KEY_TYPED
            else:
                self.key_mode[j] = KEY_TYPED_OR_NULL

    def __dealloc__(self):
        PyMem_Free(self.kinds)
        PyMem_Free(self.args)
        PyMem_Free(self.key_mode)
        PyMem_Free(self.key_column)
        PyMem_Free(self.key_of)
        PyMem_Free(self.int_key)
        PyMem_Free(self.buf)
        PyMem_Free(self.starts)
        PyMem_Free(self.ends)

    cdef int _reserve(self, Py_ssize_t size, Py_ssize_t more) except -1:
        cdef Py_ssize_t want = size + more
        cdef char* grown
        if want <= self.cap:
            return 0
        want = max(want, 2 * self.cap)
        grown = <char*>PyMem_Realloc(self.buf, want)
        if grown == NULL:
            raise MemoryError()
        self.buf = grown
        self.cap = want
        return 0

    cdef Py_ssize_t _put(self, Py_ssize_t size, bytes data) except -1:
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
        self._reserve(size, n)
        memcpy(self.buf + size, PyBytes_AS_STRING(data), n)
        return size + n

    cdef Py_ssize_t _native(self, Py_ssize_t size, int kind, int arg, const unsigned char* s, Py_ssize_t n) except -2:
        """Write a direct type's JSON at ``size``; the new size, or -1 when the text is not one this covers."""
        cdef Py_ssize_t i
        cdef char* out
        if kind == K_INT:
            i = 1 if (n > 1 and s[0] == 45) else 0  # '-'
            if n == 0 or i == n:
                return -1
            while i < n:
                if not _is_digit(s[i]):
                    return -1
                i += 1
            self._reserve(size, n)
            memcpy(self.buf + size, s, n)
            return size + n
        if kind == K_TEXT:
            for i in range(n):
                if s[i] < 0x20 or s[i] > 0x7F or s[i] == 34 or s[i] == 92:  # control, non-ASCII, '"', '\'
                    return -1
            self._reserve(size, n + 2)
            out = self.buf + size
            out[0] = 34
            memcpy(out + 1, s, n)
            out[n + 1] = 34
            return size + n + 2
        if kind == K_BOOL:
            if n != 1 or (s[0] != 116 and s[0] != 102):
                return -1
            self._reserve(size, 5)
            if s[0] == 116:
                memcpy(self.buf + size, b"true", 4)
                return size + 4
            memcpy(self.buf + size, b"false", 5)
            return size + 5
        if kind == K_UUID:
            if n != 36:
                return -1
            for i in range(36):
                if i == 8 or i == 13 or i == 18 or i == 23:
                    if s[i] != 45:
                        return -1
                elif not _is_hex(s[i]):
                    return -1
            self._reserve(size, 38)
            out = self.buf + size
            out[0] = 34
            memcpy(out + 1, s, 36)
            out[37] = 34
            return size + 38
        if kind == K_TSTZ:
            return self._timestamptz(size, arg, s, n)
        if kind == K_NUMERIC:
            return self._numeric(size, arg, s, n)
        return -1

    cdef Py_ssize_t _timestamptz(self, Py_ssize_t size, int width, const unsigned char* s, Py_ssize_t n) except -2:
        """``YYYY-MM-DD HH:MM:SS[.f{1,6}]+00`` -> ``"YYYY-MM-DDTHH:MM:SS[.f{width}]Z"`` (zoned_timestamp_text)."""
        cdef Py_ssize_t i, digits, at
        cdef char* out
        if n < 22 or n > 29:
            return -1
        for i in range(19):
            if i == 4 or i == 7:
                if s[i] != 45:
                    return -1
            elif i == 10:
                if s[i] != 32:
                    return -1
            elif i == 13 or i == 16:
                if s[i] != 58:
                    return -1
            elif not _is_digit(s[i]):
                return -1
        if s[n - 3] != 43 or s[n - 2] != 48 or s[n - 1] != 48:  # "+00"
            return -1
        digits = n - 22
        if digits != 0:
            if s[19] != 46 or digits < 2:  # '.' and at least one digit
                return -1
            digits -= 1
            for i in range(20, 20 + digits):
                if not _is_digit(s[i]):
                    return -1
        self._reserve(size, 32)
        out = self.buf + size
        out[0] = 34
        memcpy(out + 1, s, 10)
        out[11] = 84  # 'T'
        memcpy(out + 12, s + 11, 8)
        i = 20
        if width > 0:
            out[i] = 46
            i += 1
            for at in range(width):
                out[i] = s[20 + at] if at < digits else 48
                i += 1
        out[i] = 90  # 'Z'
        out[i + 1] = 34
        return size + i + 2

    cdef Py_ssize_t _numeric(self, Py_ssize_t size, int scale, const unsigned char* s, Py_ssize_t n) except -2:
        """numeric(p, scale) text -> base64 of the unscaled value's minimal two's complement, quoted
        (fixed_numeric_bytes + b2a_base64); up to 18 digits, longer ones go to the reference."""
        cdef Py_ssize_t i, dot, ndigits = 0, length, o
        cdef bint negative = False
        cdef int64_t value = 0
        cdef uint64_t bits
        cdef unsigned char raw[9]
        cdef unsigned int triple
        cdef char* out
        dot = n - scale - 1 if scale else n
        if scale and (n <= scale or s[dot] != 46):
            return -1
        i = 0
        if n > 0 and s[0] == 45:
            negative = True
            i = 1
        while i < n:
            if i == dot and scale:
                i += 1
                continue
            if not _is_digit(s[i]):
                return -1
            if ndigits == 18:
                return -1  # the reference handles any size
            value = value * 10 + (s[i] - 48)
            ndigits += 1
            i += 1
        if ndigits == 0:
            return -1  # "", "-", "." ...: the reference raises
        if negative:
            value = -value
        # Minimal big-endian two's complement: (bit_length(v if v >= 0 else ~v)) // 8 + 1 bytes.
        bits = <uint64_t>(value if value >= 0 else ~value)
        length = 1
        while bits >= 0x80:
            bits >>= 8
            length += 1
        for i in range(length):
            raw[length - 1 - i] = <unsigned char>((<uint64_t>value >> (8 * i)) & 0xFF)
        self._reserve(size, 2 + 4 * ((length + 2) // 3))
        out = self.buf + size
        out[0] = 34
        o = 1
        i = 0
        while i < length:
            triple = raw[i] << 16
            if i + 1 < length:
                triple |= raw[i + 1] << 8
            if i + 2 < length:
                triple |= raw[i + 2]
            out[o] = _B64[(triple >> 18) & 63]
            out[o + 1] = _B64[(triple >> 12) & 63]
            out[o + 2] = _B64[(triple >> 6) & 63] if i + 1 < length else 61  # '='
            out[o + 3] = _B64[triple & 63] if i + 2 < length else 61
            o += 4
            i += 3
        out[o] = 34
        return size + o + 1

    cdef Py_ssize_t _long(self, Py_ssize_t size, int64_t n) except -1:
        """Avro's zig-zag varint of ``n`` at ``size`` (write_long)."""
        cdef uint64_t z = (<uint64_t>n << 1) ^ <uint64_t>(n >> 63)
        self._reserve(size, 10)
        while z >= 0x80:
            self.buf[size] = <char>((z & 0x7F) | 0x80)
            z >>= 7
            size += 1
        self.buf[size] = <char>z
        return size + 1

    cdef int _digits(self, const unsigned char* s, Py_ssize_t n, Py_ssize_t skip, int64_t* out) noexcept:
        """An optionally negative run of up to 18 ASCII digits (``skip``: a position to pass over, or -1)
        as ``*out``: 0, or -1 when it is not one (the reference decides then)."""
        cdef Py_ssize_t i = 0, ndigits = 0
        cdef bint negative = False
        cdef int64_t value = 0
        if n > 0 and s[0] == 45:
            negative = True
            i = 1
        while i < n:
            if i == skip:
                i += 1
                continue
            if not _is_digit(s[i]) or ndigits == 18:
                return -1
            value = value * 10 + (s[i] - 48)
            ndigits += 1
            i += 1
        if ndigits == 0:
            return -1
        out[0] = -value if negative else value
        return 0

    cdef Py_ssize_t _native_avro(self, Py_ssize_t size, int kind, int arg, bytes prefix, const unsigned char* s,
                                 Py_ssize_t n) except -2:
        """Write a direct type's Avro binary, after ``prefix`` (a nullable field's union branch), at ``size``;
        the new size, or -1 when the text is not one this covers (avro._avro_direct's renderers)."""
        cdef Py_ssize_t i, at, digits, length, start
        cdef int64_t value = 0
        cdef uint64_t bits
        cdef char* out
        if kind == K_INT:
            if self._digits(s, n, -1, &value) < 0:
                return -1
            size = self._put(size, prefix)
            return self._long(size, value)
        if kind == K_TEXT:
            for i in range(n):
                if s[i] > 0x7F:
                    return -1  # UTF-8 to validate: the reference
            size = self._put(size, prefix)
            size = self._long(size, n)
            self._reserve(size, n)
            memcpy(self.buf + size, s, n)
            return size + n
        if kind == K_BOOL:
            if n != 1 or (s[0] != 116 and s[0] != 102):
                return -1
            size = self._put(size, prefix)
            self._reserve(size, 1)
            self.buf[size] = 1 if s[0] == 116 else 0
            return size + 1
        if kind == K_UUID:
            if n != 36:
                return -1
            for i in range(36):
                if i == 8 or i == 13 or i == 18 or i == 23:
                    if s[i] != 45:
                        return -1
                elif not _is_hex(s[i]):
                    return -1
            size = self._put(size, prefix)
            self._reserve(size, 37)
            self.buf[size] = 0x48  # 36 as a zig-zag varint
            memcpy(self.buf + size + 1, s, 36)
            return size + 37
        if kind == K_TSTZ:
            # The JSON form, unquoted, after its length: written as JSON past the prefix and the length
            # byte (always one: 20 to 27 characters), then moved over the quote.
            start = self._put(size, prefix)
            length = self._timestamptz(start + 1, arg, s, n)
            if length < 0:
                return -1
            length = length - (start + 1) - 2  # without the quotes
            self.buf[start] = <char>(length << 1)
            for i in range(length):
                self.buf[start + 1 + i] = self.buf[start + 2 + i]
            return start + 1 + length
        if kind == K_NUMERIC:
            if arg and (n <= arg or s[n - arg - 1] != 46):
                return -1
            if self._digits(s, n, n - arg - 1 if arg else -1, &value) < 0:
                return -1
            bits = <uint64_t>(value if value >= 0 else ~value)
            length = 1
            while bits >= 0x80:
                bits >>= 8
                length += 1
            size = self._put(size, prefix)
            size = self._long(size, length)
            self._reserve(size, length)
            for i in range(length):
                self.buf[size + length - 1 - i] = <char>((<uint64_t>value >> (8 * i)) & 0xFF)
            return size + length
        return -1

    cdef Py_ssize_t _value(self, Py_ssize_t size, int i, const unsigned char* s, Py_ssize_t length, object owner,
                           list key_values, bint typed_keys=True) except -2:
        """Write column ``i``'s encoding of its text ``s[:length]`` (``owner``: those bytes as an object, or
        None) at ``size``, and its typed value into ``key_values`` when it is a key column; the new size.
        Without ``typed_keys`` (``copy_record``: no key dict) a key column whose key bytes are its row bytes
        gets True there, only to say it was not NULL."""
        cdef int j = self.key_of[i]
        cdef int kind = self.kinds[i]
        cdef Py_ssize_t written
        cdef object text = owner
        if kind == K_TYPED:
            if text is None:
                text = PyBytes_FromStringAndSize(<const char*>s, length)
            typed_value = self.converters[i](text)
            if j >= 0:
                key_values[j] = typed_value
            return self._put(size, <bytes?>self.typed[i](typed_value))
        written = -1
        if kind != K_PY:
            if self.avro:
                written = self._native_avro(size, kind, self.args[i], <bytes>self.prefixes[i], s, length)
            else:
                written = self._native(size, kind, self.args[i], s, length)
        if written >= 0:
            size = written
        else:
            if text is None:
                text = PyBytes_FromStringAndSize(<const char*>s, length)
            size = self._put(size, <bytes?>self.renders[i](text))
        if j >= 0:
            if not typed_keys and self.key_mode[j] <= KEY_SAME_OR_NULL:
                key_values[j] = True
                return size
            if self.int_key[i]:
                typed_value = _int_of(s, length)
                if typed_value is not None:
                    key_values[j] = typed_value
                    return size
            if text is None:
                text = PyBytes_FromStringAndSize(<const char*>s, length)
            key_values[j] = self.converters[i](text)
        return size

    cdef Py_ssize_t _null(self, Py_ssize_t size, int i) except -2:
        value = self.nulls[i]
        if value is None:
            raise self.decline
        return self._put(size, <bytes>value)

    cdef Py_ssize_t _key(self, Py_ssize_t size, list key_values, dict key) except -1:
        """The row's last piece at ``size``, then the key's bytes after it in the same scratch (the key columns'
        encodings copied from the row's); the end. ``key``: the key dict to fill, or None."""
        cdef int i, j, mode
        cdef Py_ssize_t length
        size = self._put(size, <bytes>self.pieces[self.count])
        for j in range(self.key_count):
            size = self._put(size, <bytes>self.key_pieces[j])
            i = self.key_column[j]
            mode = self.key_mode[j]
            typed_value = key_values[j]
            if key is not None:
                key[self.key_names[j]] = typed_value
            if mode == KEY_SAME or (mode == KEY_SAME_OR_NULL and typed_value is not None):
                length = self.ends[i] - self.starts[i]
                self._reserve(size, length)
                memcpy(self.buf + size, self.buf + self.starts[i], length)
                size += length
            elif typed_value is None:
                if mode == KEY_TYPED:
                    raise self.decline
                size = self._put(size, <bytes?>self.key_nulls[j])
            else:
                size = self._put(size, <bytes?>self.key_typed[j](typed_value))
        return self._put(size, <bytes>self.key_pieces[self.key_count])

    cdef object _finish(self, Py_ssize_t size, list key_values):
        """The row's last piece, then the key: the ``RenderedRow``."""
        cdef dict key = {}
        cdef Py_ssize_t row_end = size + PyBytes_GET_SIZE(<bytes>self.pieces[self.count])
        size = self._key(size, key_values, key)
        row = self.row_class.__new__(self.row_class)
        row.data = PyBytes_FromStringAndSize(self.buf, row_end)
        row.key = key
        row.key_data = PyBytes_FromStringAndSize(self.buf + row_end, size - row_end)
        return row

    cdef tuple _record(self, Py_ssize_t size, list key_values, bytes key_head, bytes key_end, bytes value_head,
                       bytes value_end):
        """The row's last piece, then the key: ``(key_head + key + key_end, value_head + row + value_end)``,
        each written once."""
        cdef Py_ssize_t row_end = size + PyBytes_GET_SIZE(<bytes>self.pieces[self.count])
        size = self._key(size, key_values, None)
        return (_joined(key_head, self.buf + row_end, size - row_end, key_end),
                _joined(value_head, self.buf, row_end, value_end))

    def __call__(self, object buffer, Py_ssize_t pos):
        # bytes from the decoder (feed, the spool); any other buffer as the reference takes it, copied.
        cdef bytes data = buffer if type(buffer) is bytes else bytes(buffer)
        cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t total = PyBytes_GET_SIZE(data)
        cdef Py_ssize_t size = 0, start, length
        cdef int i
        cdef unsigned char tag
        cdef list key_values = [None] * self.key_count
        if pos < 0 or pos + 2 > total:
            raise IndexError("tuple data past the end of the message")
        if s[pos] != (self.count >> 8) or s[pos + 1] != (self.count & 0xFF):
            raise self.decline
        pos += 2
        for i in range(self.count):
            size = self._put(size, <bytes>self.pieces[i])
            self.starts[i] = size
            if pos >= total:
                raise IndexError("tuple data past the end of the message")
            tag = s[pos]
            if tag == 116:  # 't'
                if pos + 5 > total:
                    raise IndexError("tuple data past the end of the message")
                length = (<Py_ssize_t>s[pos + 1] << 24) | (s[pos + 2] << 16) | (s[pos + 3] << 8) | s[pos + 4]
                start = pos + 5
                if start + length > total:
                    raise IndexError("a column's length runs past the end of the message")
                pos = start + length
                size = self._value(size, i, s + start, length, None, key_values)
            elif tag == 110:  # 'n'
                size = self._null(size, i)
                pos += 1
            else:
                raise self.decline
            self.ends[i] = size
        return self._finish(size, key_values), pos

    def copy_row(self, object buffer):
        """One line of ``COPY ... TO STDOUT`` in text format (its newline optional) -> the ``RenderedRow``
        of the same values, as ``__call__`` makes it of their pgoutput tuple: fields split at tabs, ``\\N``
        a NULL, and a field holding a backslash through the constructor's ``unescape``
        (``cdc.snapshot.copytext.unescape``) first. A line without the relation's number of fields raises
        ``decline``."""
        cdef list key_values = [None] * self.key_count
        return self._finish(self._copy_fields(buffer, key_values, True), key_values)

    def copy_record(self, object buffer, bytes key_head, bytes key_end, bytes value_head, bytes value_end):
        """The snapshot's record of one COPY line: ``(key_head + key + key_end, value_head + row + value_end)``
        with the key and row of ``copy_row(buffer)``, declining as it does, without the ``RenderedRow``, its
        key dict and the key columns' typed values that only the dict needs."""
        cdef list key_values = [None] * self.key_count
        return self._record(self._copy_fields(buffer, key_values, False), key_values, key_head, key_end, value_head,
                            value_end)

    cdef Py_ssize_t _copy_fields(self, object buffer, list key_values, bint typed_keys) except -1:
        """The line's columns written in the scratch (``copy_row``); the size before the row's last piece."""
        cdef bytes data = buffer if type(buffer) is bytes else bytes(buffer)
        cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t total = PyBytes_GET_SIZE(data)
        cdef Py_ssize_t size = 0, pos = 0, end
        cdef int i
        cdef bint escaped
        cdef bytes text
        if total > 0 and s[total - 1] == 10:  # '\n'
            total -= 1
        for i in range(self.count):
            if pos > total:
                raise self.decline  # fewer fields
            end = pos
            escaped = False
            while end < total and s[end] != 9:  # '\t'
                if s[end] == 92:
                    escaped = True
                end += 1
            size = self._put(size, <bytes>self.pieces[i])
            self.starts[i] = size
            if end - pos == 2 and s[pos] == 92 and s[pos + 1] == 78:  # \N
                size = self._null(size, i)
            elif escaped:
                if self.unescape is None:
                    raise self.decline
                text = <bytes?>self.unescape(PyBytes_FromStringAndSize(<const char*>s + pos, end - pos))
                size = self._value(size, i, <const unsigned char*>PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text),
                                   text, key_values, typed_keys)
            else:
                size = self._value(size, i, s + pos, end - pos, None, key_values, typed_keys)
            self.ends[i] = size
            pos = end + 1
        if pos != total + 1:
            raise self.decline  # more fields (or none at all)
        return size
