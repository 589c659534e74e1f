# cython: language_level=3, boundscheck=False, wraparound=False
"""The decoder's fast path compiled: an Insert, Update or Delete of a known relation, parsed by the relation's
row parser and made into its ``ChangeEvent`` in one call, in place of ``cdc.decoder.fast.FastChangesReference``
and ``change_event`` (two Python frames and twelve descriptor calls a row). It must yield what they yield
(tests/unit/test_decoder_fast_path.py compares the two over every op and shape) and declines (None) wherever
they decline: the general path then decodes the message and names what is wrong with it.

Built by ``cdc.decoder.fast.build_fast_change`` (``FastChanges(tx, reference, ...)``: what it needs of the Python
side is handed to it, it imports nothing of the package, see ``cdc.compiled``), and called as the reference is,
``fast(kind, buf, at, lsn)``. It works on the public ``TxState`` (``cdc.decoder.state``) only: at each call it
reads ``tx.relations`` (which a streamed transaction swaps), ``commit_lsn``, ``xid`` and ``commit_ts``, and
advances ``ordinal`` and ``last_lsn``.
"""

cdef extern from "Python.h":
    ctypedef struct PyObject
    ctypedef int (*descrsetfunc)(PyObject*, PyObject*, PyObject*) except -1
    ctypedef struct _TypeObject "PyTypeObject":
        descrsetfunc tp_descr_set
    _TypeObject* Py_TYPE(PyObject*)

cdef enum:
    _INSERT = 0x49  # 'I'
    _UPDATE = 0x55  # 'U'
    _DELETE = 0x44  # 'D'
    _NEW = 0x4E  # 'N'
    _OLD_KEY = 0x4B  # 'K'
    _OLD = 0x4F  # 'O'
    _FIELDS = 12


cdef class FastChanges:
    cdef object tx  # the decoder's TxState
    cdef object reference  # cdc.decoder.fast.FastChangesReference over the same tx, for a buffer that is not bytes
    cdef object change_class  # ChangeEvent
    cdef object new  # object.__new__
    cdef object op_create, op_update, op_delete
    cdef object key_of  # cdc.decoder.fast.key_of
    cdef tuple declines  # cdc.decoder.fast.FAST_PATH_DECLINES
    cdef object nothing_unchanged
    cdef tuple descriptors  # ChangeEvent's slots, in field order (their tp_descr_set fills them)
    cdef PyObject* descriptor[_FIELDS]  # borrowed from descriptors
    cdef descrsetfunc setters[_FIELDS]

    def __init__(self, tx, reference, change_class, ops, key_of, tuple declines, nothing_unchanged):
        self.tx = tx
        self.reference = reference
        self.change_class = change_class
        self.new = object.__new__
        self.op_create, self.op_update, self.op_delete = ops
        self.key_of = key_of
        self.declines = declines
        self.nothing_unchanged = nothing_unchanged
        slots = change_class.__slots__
        if len(slots) != _FIELDS:
            raise TypeError(f"ChangeEvent has {len(slots)} slots, the compiled decoder fills {_FIELDS}")
        self.descriptors = tuple(change_class.__dict__[name] for name in slots)
        cdef int i
        for i in range(_FIELDS):
            self.descriptor[i] = <PyObject*>self.descriptors[i]
            self.setters[i] = Py_TYPE(self.descriptor[i]).tp_descr_set
            if self.setters[i] == NULL:
                raise TypeError(f"ChangeEvent.{slots[i]} is not a settable slot")

    cdef inline int _set(self, int i, object event, object value) except -1:
        return self.setters[i](self.descriptor[i], <PyObject*>event, <PyObject*>value)

    def __call__(self, int kind, object buffer, Py_ssize_t at, lsn):
        """The event of the change at ``buffer[at:]``, or None to let the general path decode it."""
        if type(buffer) is not bytes:
            return self.reference(kind, buffer, at, lsn)
        cdef bytes buf = <bytes>buffer
        cdef Py_ssize_t n = len(buf)
        if at + 5 > n:
            return None
        cdef const unsigned char* p = buf
        cdef unsigned int relation_id = (p[at] << 24) | (p[at + 1] << 16) | (p[at + 2] << 8) | p[at + 3]
        tx = self.tx
        rel = tx.relations.get(relation_id)
        if rel is None:
            return None
        parse = rel.parse
        if parse is None:
            return None
        cdef int marker = p[at + 4]
        cdef Py_ssize_t pos
        try:
            if kind == _INSERT:
                if marker != _NEW:
                    return None
                after, end = parse(buf, at + 5)
                before = None
                op = self.op_create
            elif kind == _UPDATE:
                before = None
                pos = at + 5
                if marker == _OLD_KEY or marker == _OLD:
                    old, pos = parse(buf, pos)
                    before = old if marker == _OLD else self.key_of(old, rel)
                    if pos >= n:
                        return None
                    marker = p[pos]
                    pos += 1
                if marker != _NEW:
                    return None
                after, end = parse(buf, pos)
                op = self.op_update
            elif kind == _DELETE:
                if marker == _OLD_KEY:
                    old, end = parse(buf, at + 5)
                    before = self.key_of(old, rel)
                elif marker == _OLD:
                    before, end = parse(buf, at + 5)
                else:
                    return None
                after = None
                op = self.op_delete
            else:
                return None
            if end != n:
                return None
        except Exception as exc:
            if isinstance(exc, self.declines):
                return None
            raise
        ordinal = tx.ordinal + 1
        tx.ordinal = ordinal
        tx.last_lsn = lsn
        event = self.new(self.change_class)
        self._set(0, event, op)
        self._set(1, event, rel.schema)
        self._set(2, event, before)
        self._set(3, event, after)
        self._set(4, event, tx.commit_lsn)
        self._set(5, event, lsn)
        self._set(6, event, tx.xid)
        self._set(7, event, ordinal)
        self._set(8, event, tx.commit_ts)
        self._set(9, event, False)
        self._set(10, event, self.nothing_unchanged)
        self._set(11, event, None)
        return event
