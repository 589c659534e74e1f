# syntax=docker/dockerfile:1.7
#
# PostgreSQL 15 from Debian's own package, with the official postgres image's interface
# (POSTGRES_DB/USER/PASSWORD, /docker-entrypoint-initdb.d/*.sql, data in /var/lib/postgresql/data),
# for the quickstart (deploy/docker-compose.yml, deploy/podman/quickstart.yaml). Built from the
# repository root: scripts/quickstart.sh images (podman), or `docker compose build`.
ARG BASE=docker.io/library/debian:bookworm-slim
FROM ${BASE}
# Debian's stable packages are not pinned: their security updates are wanted.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* /var/lib/postgresql/15 /etc/postgresql/15/main \
 && mkdir -p /var/lib/postgresql/data /docker-entrypoint-initdb.d \
 && chown postgres:postgres /var/lib/postgresql/data \
 && chmod 700 /var/lib/postgresql/data
# The example shop (compose mounts the same folder over it).
COPY deploy/postgres/ /docker-entrypoint-initdb.d/
COPY deploy/images/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PATH="/usr/lib/postgresql/15/bin:${PATH}" PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["postgres-entrypoint"]
CMD ["postgres"]
