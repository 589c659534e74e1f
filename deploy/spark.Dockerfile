# syntax=docker/dockerfile:1.7
#
# The Spark jobs of spark/ (warehouse, search index, joined views): Python 3.11, a Java 17 runtime
# (Spark 4 needs 17 or later; Debian bookworm's openjdk-17), pyspark and delta-spark from the
# project's `spark` extra (4.2.0 and 4.4.0: spark/README.md, "Versions"), and the jars the jobs put
# on spark.jars (Kafka source, spark-avro, Delta), fetched here at build time by the project's own
# `python -m cdc_views.jars fetch`, so that a job never downloads anything when it runs.
#
#   docker build -f deploy/spark.Dockerfile -t cdc-spark:local .
#   docker run --rm --network cdc_default cdc-spark:local --master 'local[2]' /opt/cdc/spark/warehouse.py ...
#
# The entry point is spark-submit with the jobs' jars (deploy/spark-submit.sh); arguments are
# spark-submit's, then the job and its own.
#
# Without a registry or package index (`make spark-image`, scripts/spark-image.sh with podman):
#   --build-arg BASE=localhost/cdc-base:bookworm-...  a local Debian base with python3 + venv
#   --build-arg DEPS=host-deps   the virtualenv from the host's wheels (build/spark-wheels/) and the
#                                jars from the host's cache (build/spark-cache/), nothing fetched here

ARG BASE=docker.io/library/python:3.11-slim-bookworm
ARG DEPS=index-deps

FROM ${BASE} AS index-deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
# Maven fetches the jars (spark/jars-pom.xml); a JRE runs it. Debian's stable packages are not
# pinned: their security updates are wanted.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends maven openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY spark ./spark
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir ".[spark]"
ENV CDC_CACHE_DIR=/opt/cdc-cache
WORKDIR /src/spark
RUN /opt/venv/bin/python -m cdc_views.jars fetch \
 && rm -rf /root/.m2

# The same /opt/venv and /opt/cdc-cache from what the host built and fetched (scripts/spark-image.sh).
FROM ${BASE} AS host-deps
COPY build/spark-cache /opt/cdc-cache
RUN --mount=type=bind,source=build/spark-wheels,target=/wheels \
    python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-index --find-links=/wheels \
        "$(ls /wheels/cdc-*.whl)[spark]"

FROM ${DEPS} AS deps

FROM ${BASE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="cdc-spark" \
      org.opencontainers.image.description="Spark jobs rebuilding views from the cdc topics" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# procps: Spark's launch scripts call ps.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 spark \
 && useradd --system --uid 10001 --gid spark --create-home --home-dir /home/spark --shell /usr/sbin/nologin spark \
 && mkdir -p /data/warehouse \
 && chown spark:spark /data/warehouse
COPY --from=deps /opt/venv /opt/venv
COPY --from=deps /opt/cdc-cache /opt/cdc-cache
COPY spark /opt/cdc/spark
COPY --chmod=755 deploy/spark-submit.sh /opt/cdc/bin/spark-submit-jobs
ENV PATH="/opt/venv/bin:${PATH}" \
    CDC_CACHE_DIR=/opt/cdc-cache \
    PYTHONPATH=/opt/cdc/spark \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python \
    PYTHONUNBUFFERED=1
WORKDIR /home/spark
USER 10001:10001
ENTRYPOINT ["/opt/cdc/bin/spark-submit-jobs"]
CMD ["--help"]
