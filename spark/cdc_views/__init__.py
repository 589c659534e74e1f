"""Spark jobs that rebuild derived views from the change topics, in batch and continuously.

Modules, in the order data flows through them:

* ``jars``: the Kafka source, spark-avro and Delta Lake jars, fetched once into the cache.
* ``session``: the SparkSession every job uses (those jars, Delta, UTC).
* ``tables``: the captured tables' columns (from the source catalog) and the connector's encoding.
* ``decode``: Debezium JSON values -> typed Spark columns (Spark expressions, no Python UDFs).
* ``reader``: topics from offset 0 -> latest row per key; tombstones, truncate markers, bad records.
* ``warehouse``: Delta tables written by an LSN-guarded MERGE.
* ``views``: the joined view and the search documents, as DataFrame functions.
* ``search``: the tantivy index: build, update, ``search(index_dir, query)``.
* ``jobs``: the batch job (``rebuild``) and the continuous one (``start_continuous``).
* ``verify``: every view against the source database.
* ``demo``: ``rebuild_and_verify(...)`` for ``cdc demo``.
* ``cli``: ``python -m cdc_views ...``; ``spark/*.py`` are the ``spark-submit`` entry points.
"""
