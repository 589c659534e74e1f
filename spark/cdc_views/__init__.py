"""Spark jobs that rebuild derived views from the change topics, in batch and continuously.

Modules, in the order data flows through them:

* ``jars``: the Kafka source, spark-avro and Delta Lake jars, fetched once into the cache.
* ``session``: the SparkSession every job uses (those jars, Delta, UTC).
* ``tables``: the captured tables' columns (from the source catalog) and the connector's encoding.
* ``history``: the schema history topic (a Decimal's scale per table and position, JSON without schemas).
* ``avro``: Avro topics in the Confluent wire format, decoded by Spark's ``from_avro``.
* ``envelope``: Kafka records -> one classified row per record (key, position, operation).
* ``reader``: topics from offset 0 -> latest row per key; tombstones, truncate markers, bad records.
* ``decode``: Debezium values -> typed Spark columns (Spark expressions, no Python UDFs).
* ``toast``: the connector's placeholder for unchanged TOASTed values, resolved before any write.
* ``warehouse``: Delta tables written by an LSN-guarded MERGE.
* ``declared``: the views and search indexes the user declares (``spark:`` in cdc.yaml).
* ``search``: writing a tantivy index so that a reader never sees a half-built one.
* ``jobs``: the batch job (``rebuild``) and the continuous one (``start_continuous``).
* ``verify``: every view against the source database.
* ``demo``: ``rebuild_and_verify(...)`` for ``cdc demo``.
* ``cli``: ``python -m cdc_views ...``; ``spark/*.py`` are the ``spark-submit`` entry points.
"""
