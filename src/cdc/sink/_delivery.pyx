# cython: language_level=3
"""The at-least-once delivery's per-record path, compiled: ``AtLeastOnce.send`` and the delivery report of
each record it produces (``cdc.sink.delivery``), beside the Python reference there, which it must match
(tests/unit/test_delivery_sender.py): the same ``produce`` calls, the same accounting (bytes and records in
flight, records delivered, the open transaction's pending count) and the same failure. It takes the records
of the common shape only: no headers, no partition, within the size limit. Every other record goes to the
reference's path (``slow``), which counts in the delivery itself; ``AtLeastOnce`` adds the two counts.

One ``Sender`` lives as long as its delivery; ``entry`` and ``failed`` are set at each source transaction's
Begin (the tracker's entry, and the closure that fails that transaction's tracker). The module imports nothing
of the package: what it needs of the Python side is handed to ``Sender`` (``cdc.compiled`` loads it).
"""


cdef class _Delivered:
    """confluent-kafka's ``on_delivery`` for one record: one small C object in place of a closure, its cells
    and two Python frames a record."""

    cdef Sender sender
    cdef object entry
    cdef object failed
    cdef long long size

    def __call__(self, err, msg):
        cdef Sender sender = self.sender
        sender.inflight_bytes -= self.size
        sender.inflight_records -= 1
        if err is not None:
            self.failed(err, msg)
            return
        sender.delivered += 1
        self.entry.pending -= 1


cdef class Sender:
    cdef public long long inflight_bytes
    cdef public long long inflight_records
    cdef public long long delivered
    cdef public object entry  # the open source transaction's tracker entry, or None
    cdef public object failed  # failed(err, msg): the reference's failure handling, bound to that transaction
    cdef object produce, poll, slow, classify, kafka_exception, sink_error, any_partition
    cdef Py_ssize_t max_bytes

    def __init__(self, produce, poll, Py_ssize_t max_bytes, slow, classify, kafka_exception, sink_error,
                 any_partition):
        self.produce = produce
        self.poll = poll
        self.max_bytes = max_bytes
        self.slow = slow  # slow(record, describe): the reference's send, for the records this does not take
        self.classify = classify  # classify(KafkaException, what) -> SinkError
        self.kafka_exception = kafka_exception
        self.sink_error = sink_error
        self.any_partition = any_partition  # cdc.sink.kafka.ANY_PARTITION: the partitioner's choice
        self.entry = None
        self.failed = None

    def send(self, record, describe):
        entry = self.entry
        if entry is None:
            raise self.sink_error(f"a record for {describe} arrived outside a source transaction")
        topic, key, value, headers, partition = record
        if headers or partition is not None or (value is not None and len(value) > self.max_bytes):
            return self.slow(record, describe)
        cdef long long size = len(topic) + len(key) + (0 if value is None else len(value))
        cdef _Delivered report = _Delivered.__new__(_Delivered)
        report.sender = self
        report.entry = entry
        report.failed = self.failed
        report.size = size
        entry.pending += 1
        try:
            while True:
                try:
                    self.produce(topic, value, key, self.any_partition, report)  # positional: see delivery.py
                    break
                except BufferError:
                    self.poll(0.05)
        except BaseException as e:  # not produced after all: uncount it, and let the error go on
            entry.pending -= 1
            if isinstance(e, self.kafka_exception):
                raise self.classify(e, f"cannot produce to {topic}") from None
            raise
        self.inflight_bytes += size
        self.inflight_records += 1
