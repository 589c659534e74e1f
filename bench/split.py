"""An experiment, not the daemon: would splitting the daemon into two processes reach 0.6 of decoder-only?

One command: ``.venv/bin/python bench/split.py --rows 1000000 --runs 3``

``cdc run`` does everything per row in one Python thread: receive, decode, serialize, produce,
serve acknowledgments. ``bench/e2e.py`` shows that thread saturated while the machine has CPU to
spare. This benchmark measures the obvious split, built from the daemon's own parts:

- process A (this one): ``ReplicationStream`` + ``ChangeDecoder`` (rows rendered, as the daemon
  decodes for JSON) + ``JsonSerializer.records``; each transaction's records, with its begin and
  commit, marshalled and sent down a pipe; confirms to the server what B reports acknowledged;
- process B (a receiving thread, a 64-batch queue) unmarshals them and hands them to the daemon's
  ``AtLeastOnce`` delivery (idempotent producer, ``acks=all``, per-record acknowledgment tracking), and
  reports the acknowledged LSN.

Per run, over the same WAL (slots made before one workload, as in ``e2e.py``): the decoder-only
reader (typed events, the reference of the target) and the split, timed from the start of streaming
until everything up to the workload's end is acknowledged by Kafka. What it leaves out of the
daemon: column policies, outbox, DBLog windows, metrics, heartbeats, dead letters, reconnects,
byte budget, and any handling of B failing; its figure is an upper bound for such a design.
"""

from __future__ import annotations

import argparse
import marshal
import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import psycopg

from cdc import dev
from cdc.catalog import describe_tables
from cdc.config import TableConfig
from cdc.decoder.changes import ChangeDecoder
from cdc.event import ChangeEvent, TxBegin, TxCommit
from cdc.lsn import Lsn
from cdc.process import tune_gc
from cdc.render.codec import TableRenderer
from cdc.replication import ReplicationStream, protocol_for
from cdc.sink.delivery import AtLeastOnce
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.sink.kafka import TopicSpec, admin_client, ensure_topics, producer_config
from cdc.sink.record import Record
from cpu import self_cpu  # bench/cpu.py
from decoder import DB, PUBLICATION, TABLE, create_slots, read_with_cdc, setup_database, write_rows  # bench/decoder.py


def producer_process(bootstrap: str, data: Connection, acks: Connection) -> None:
    """Process B: records in, the acknowledged LSN out (whenever it moves). A thread receives, so that A
    never waits for B to finish a batch before it can hand over the next (up to 64 batches queued)."""
    tune_gc()
    delivery = AtLeastOnce(producer_config(bootstrap, {}, 1_000_000), max_record_bytes=1_000_000)
    send, tick, acknowledged = delivery.send, delivery.tick, delivery.acknowledged
    inbox: queue.Queue[bytes | None] = queue.Queue(maxsize=64)

    def receive() -> None:
        try:
            while True:
                inbox.put(data.recv_bytes())
        except EOFError:
            inbox.put(None)

    # The receiving thread needs the GIL between the chunks of a batch; with the default 5 ms switch
    # interval A waits on a full pipe while B's main thread produces.
    sys.setswitchinterval(0.0002)
    threading.Thread(target=receive, daemon=True).start()
    last = Lsn(0)
    while True:
        try:
            payload = inbox.get(timeout=0.005)
        except queue.Empty:
            payload = b""
        if payload is None:
            break
        if payload:
            batch: list[Any] = marshal.loads(payload)
            for item in batch:
                if item[0] is None:  # (None, "b", xid, commit_lsn) or (None, "c", xid, commit_lsn, end_lsn)
                    if item[1] == "b":
                        delivery.begin(TxBegin(item[2], Lsn(item[3]), 0))
                    else:
                        delivery.commit(TxCommit(item[2], Lsn(item[3]), Lsn(item[4]), 0, 0))
                else:
                    send(Record._make(item), TABLE)
        tick()
        now = acknowledged()
        if now > last:
            acks.send_bytes(b"%d %f" % (now, time.thread_time()))
            last = now


def split_run(dsn: str, bootstrap: str, slot: str, target: Lsn, prefix: str) -> tuple[float, float, float]:
    """Seconds until Kafka acknowledged everything up to ``target``; CPU seconds of A's and B's main threads."""
    tune_gc()
    serializer = JsonSerializer(JsonSettings(topic_prefix=prefix, database=DB), lambda _t: 3)
    ensure_topics(admin_client(bootstrap, {}), [TopicSpec(f"{prefix}.{TABLE}", 3, 1)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = describe_tables(conn, [TableConfig(name=TABLE)])
    decoder = ChangeDecoder(tables, {}, renderer=TableRenderer(serializer.row_rendering))
    ctx = multiprocessing.get_context("spawn")
    b_recv, a_send = ctx.Pipe(duplex=False)  # records: A -> B
    a_recv, b_send = ctx.Pipe(duplex=False)  # acknowledged LSNs: B -> A
    b = ctx.Process(target=producer_process, args=(bootstrap, b_recv, b_send), daemon=True)
    b.start()
    time.sleep(2.0)  # B imported and its producer connected before the clock starts
    stream = ReplicationStream(dsn)
    stream.connect()
    proto, options = protocol_for(stream.server_version, streaming=False)
    cpu0 = time.thread_time()
    started = time.perf_counter()
    stream.start(slot, PUBLICATION, Lsn(0), proto_version=proto, options=options, messages=False)
    feed, read, records = decoder.feed, stream.read, serializer.records
    batch: list[Any] = []
    acked = Lsn(0)
    b_cpu = 0.0
    txs = 0
    due = False
    try:
        while acked < target:
            frame = read(0.01)
            if frame is not None:
                for event in feed(frame[1], frame[0]):
                    if type(event) is ChangeEvent:
                        batch.extend([tuple(r) for r in records(event)])  # marshal writes plain tuples only
                    elif type(event) is TxBegin:
                        batch.append((None, "b", event.xid, int(event.commit_lsn)))
                    elif type(event) is TxCommit:
                        batch.append((None, "c", event.xid, int(event.commit_lsn), int(event.end_lsn)))
                        a_send.send_bytes(marshal.dumps(batch))
                        batch = []
                        txs += 1
                        due = txs % 16 == 0
                if not due:  # B's reports: a poll is a system call, once per 16 transactions or when idle
                    continue
            due = False
            while a_recv.poll():
                lsn, cpu = a_recv.recv_bytes().split()
                acked, b_cpu = Lsn(int(lsn)), float(cpu)
                stream.confirm(acked)
        elapsed = time.perf_counter() - started
        a_cpu = time.thread_time() - cpu0
    finally:
        stream.close()
        a_send.close()
        b.join(30)
    return elapsed, a_cpu, b_cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    endpoints = dev.up(dev.default_state_dir(), registry=False)
    dsn = setup_database(endpoints.postgres_dsn)
    runs = range(args.runs)
    create_slots(dsn, [f"bench_sdec_{i}" for i in runs] + [f"bench_split_{i}" for i in runs])
    target = write_rows(dsn, args.rows, 1000)
    stamp = time.strftime("%Y%m%d%H%M%S")
    dec_rates, split_rates = [], []
    try:
        for i in runs:
            own0 = self_cpu()
            seconds, rows = read_with_cdc(dsn, f"bench_sdec_{i}", target)
            dec_cpu = self_cpu() - own0
            assert rows == args.rows, f"decoded {rows} rows, expected {args.rows}"
            dec_rates.append(rows / seconds)
            elapsed, a_cpu, b_cpu = split_run(
                dsn, endpoints.kafka_bootstrap, f"bench_split_{i}", target, f"bench_split_{stamp}_{i}"
            )
            split_rates.append(args.rows / elapsed)
            print(
                f"run {i + 1}: decoder-only {rows / seconds:,.0f} rows/s ({dec_cpu / rows * 1e6:.1f} µs CPU a row); "
                f"split {args.rows / elapsed:,.0f} rows/s (main threads: A {a_cpu / args.rows * 1e6:.1f} µs, "
                f"B {b_cpu / args.rows * 1e6:.1f} µs a row)"
            )
    finally:
        admin = admin_client(endpoints.kafka_bootstrap, {})
        names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(f"bench_split_{stamp}")]
        if names:
            for future in admin.delete_topics(names, operation_timeout=30).values():
                future.result()
    dec, split = statistics.median(dec_rates), statistics.median(split_rates)
    print(
        f"median decoder-only {dec:,.0f} rows/s; two-process split {split:,.0f} rows/s; ratio {split / dec:.2f} "
        "(target of the daemon >= 0.60)"
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
