#!/bin/sh
# The Spark image's entry point: spark-submit with the jobs' jars (Kafka source, spark-avro, Delta)
# from the image's cache put on --jars, then the caller's arguments. Without them a job refuses to
# start ("spark-submit was not given the job jars").
set -eu
# shellcheck disable=SC2046  # the jar list is one --jars argument pair, split on purpose
exec spark-submit $(python3 -m cdc_views.jars submit-args) "$@"
