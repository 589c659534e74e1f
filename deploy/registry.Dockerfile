# syntax=docker/dockerfile:1.7
#
# Apicurio Registry 3 for the quickstart, from the distribution the project fetches with Maven
# (`cdc dev up` runs the same one): scripts/quickstart.sh copies it to build/quickstart/registry/app
# before building. Configured by environment variables as the apicurio/apicurio-registry image is.
ARG BASE=docker.io/library/debian:bookworm-slim
FROM ${BASE}
# curl: the compose healthcheck asks /health/ready.
# The JRE's post-install script links its man page: minimal bases have no man1 folder.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10003 registry \
 && useradd --system --uid 10003 --gid registry --home-dir /nonexistent --no-create-home \
            --shell /usr/sbin/nologin registry
COPY build/quickstart/registry/app /opt/apicurio/app
COPY deploy/images/registry-entrypoint.sh /usr/local/bin/registry-entrypoint
USER 10003:10003
EXPOSE 8080
ENTRYPOINT ["registry-entrypoint"]
