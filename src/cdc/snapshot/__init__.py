"""Snapshots: the initial copy under the slot's exported snapshot, and DBLog while streaming.

What an operator sees (``snapshot:`` section, ``cdc.snapshot.config``):

- ``mode``: ``initial`` (default: copy when the slot is created, resume an interrupted copy),
  ``initial_only``, ``no_data``, ``when_needed`` (also after an invalidated slot), ``always``;
  the table in ``cdc.snapshot.modes`` says what each does at start-up.
- The initial copy runs in ``workers`` processes, chunks of about ``chunk_rows`` rows cut by
  the primary key (heap pages for tables without a usable key), each chunk recorded in the
  progress topic (``<topic_prefix>.__cdc_snapshot``) once Kafka acknowledged it. Interrupted,
  it resumes: the next start streams from the slot's consistent point at once and reads the
  chunks not recorded while streaming, with DBLog watermarks over the same key ranges.
- While streaming: a table added to ``tables`` (at start, or on SIGHUP), a row in the signal
  table, or ``cdc snapshot --config FILE TABLE...`` starts a DBLog snapshot of it;
  streaming never pauses. Tables need a primary key (or a unique index over NOT NULL
  columns) for that.
- Progress: ``snapshot_progress`` / ``snapshot_table_progress`` log events (rows done,
  pg_class estimate, rows/s, ETA), ``SnapshotProgress`` values for the metrics endpoint,
  a progress bar on a terminal.

The pieces, each usable alone:

- ``service.Snapshots``: what the pipeline talks to (its wiring is described there).
- ``initial.InitialSnapshot``: parallel, chunked, resumable copy at the slot's consistent point.
- ``incremental.IncrementalCoordinator``: the pure watermark logic fed by the stream.
- ``reader.IncrementalReader``: runs DBLog chunks and watermarks on its own connection.
- ``copytext``: COPY text lines to the stream's typed rows.
- ``plan``, ``state``, ``modes``, ``progress``, ``output``, ``signals``.

Import each from its module (``from cdc.snapshot.service import Snapshots``): this package
imports nothing, so the configuration can embed ``cdc.snapshot.config`` without pulling in the
snapshot machinery (which reads the catalog, which reads the configuration).
"""
