"""The SparkSession every job uses: local jars only, Delta Lake enabled, UTC, small by default."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from cdc_views.jars import JarsMissing, job_jars

DEFAULT_MASTER = "local[2]"


def build_session(
    app_name: str,
    *,
    master: str | None = None,
    shuffle_partitions: int = 4,
    ui: bool = False,
    conf: Mapping[str, str] | None = None,
    quick_start: bool = False,
) -> SparkSession:
    """A SparkSession with the cached job jars on ``spark.jars`` (never ``spark.jars.packages``).

    ``master``: ``$CDC_SPARK_MASTER`` or ``local[2]`` unless given (under ``spark-submit``, the
    master it was given wins). Timestamps are UTC: the session time zone is ``UTC``.
    ``quick_start``: a JVM tuned for many small jobs (C1 JIT only, serial GC), as tests want;
    leave it off for large data, where the full JIT pays.
    """
    jars = job_jars()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.jars", ",".join(str(j) for j in jars))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(shuffle_partitions))
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .config("spark.driver.extraJavaOptions", _java_options(quick_start))
        .config("spark.executor.extraJavaOptions", _java_options(quick_start))
    )
    if quick_start:  # small data: interpreting beats compiling each plan
        builder = builder.config("spark.sql.codegen.wholeStage", "false").config("spark.sql.adaptive.enabled", "false")
    if _under_spark_submit():
        _check_submitted_jars(jars)
    else:
        builder = builder.master(master or os.environ.get("CDC_SPARK_MASTER", DEFAULT_MASTER))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("CDC_SPARK_LOG_LEVEL", "WARN"))
    return spark


def _java_options(quick_start: bool) -> str:
    # A 64 MiB thread stack: with the default one, the continuous job's first micro-batch over a few thousand
    # records from the daemon died with StackOverflowError in java.util.regex on the stream execution thread
    # (bench/spark_latency.py; the regular expressions Spark runs over generated code recurse per
    # character); the same run with -Xss64m went through. Reserved, not committed, per thread.
    options = "-Duser.timezone=UTC -Xss64m"
    if quick_start:
        options += " -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    return options


def _check_submitted_jars(jars: list[Path]) -> None:
    """Under spark-submit the driver's class path is fixed before Python runs: the jars must be given there."""
    SparkContext._ensure_initialized()  # connect to spark-submit's JVM, whose properties SparkConf reads
    submitted = SparkConf().get("spark.jars", "") or ""
    names = {Path(j).name for j in submitted.split(",") if j}
    missing = [j.name for j in jars if j.name not in names]
    if missing:
        raise JarsMissing(
            f"spark-submit was not given the job jars ({', '.join(missing)}): run it as "
            "`spark-submit $(.venv/bin/python spark/cdc_views/jars.py submit-args) spark/<job>.py ...`"
        )


def _under_spark_submit() -> bool:
    """Whether a JVM was already launched for this process (spark-submit sets this variable)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ
