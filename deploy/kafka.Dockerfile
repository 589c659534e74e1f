# syntax=docker/dockerfile:1.7
#
# Kafka (KRaft, one broker+controller) for the quickstart, from the jars the project fetches with
# Maven (`cdc dev up` does the same): scripts/quickstart.sh copies them to build/quickstart/kafka/libs
# before building. Configured by KAFKA_* environment variables as the apache/kafka image is.
ARG BASE=docker.io/library/debian:bookworm-slim
FROM ${BASE}
# The JRE's post-install script links its man page: minimal bases have no man1 folder.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10002 kafka \
 && useradd --system --uid 10002 --gid kafka --home-dir /var/lib/kafka --shell /usr/sbin/nologin kafka \
 && mkdir -p /var/lib/kafka/data \
 && chown -R kafka:kafka /var/lib/kafka
COPY build/quickstart/kafka/libs /opt/kafka/libs
COPY deploy/images/kafka-entrypoint.sh /usr/local/bin/kafka-entrypoint
USER 10002:10002
EXPOSE 9092 19092
ENTRYPOINT ["kafka-entrypoint"]
