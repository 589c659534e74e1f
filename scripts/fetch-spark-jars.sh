#!/usr/bin/env bash
# Fetches the jars the Spark jobs need (Spark's Kafka source, spark-avro, Delta Lake), matching the
# installed pyspark and delta-spark, from Maven Central into $CDC_CACHE_DIR/spark-jars
# (default ~/.cache/cdc). Run once after `pip install -e '.[spark]'`; later runs return at once.
# The jobs only read this cache: nothing is downloaded when a job runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
PYTHONPATH="spark${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m cdc_views.jars fetch
