#!/bin/bash
# Entry point of deploy/postgres.Dockerfile: the same interface as the official postgres image's,
# so deploy/docker-compose.yml works with either. On an empty data directory it runs initdb with
# POSTGRES_USER/POSTGRES_PASSWORD, creates POSTGRES_DB and runs /docker-entrypoint-initdb.d/*.sql
# (with the container's environment, which the scripts read with \getenv); then it execs postgres
# with the arguments given (`postgres -c wal_level=logical ...`).
set -euo pipefail
bin=/usr/lib/postgresql/15/bin
export PGDATA=${PGDATA:-/var/lib/postgresql/data}
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ "${1:-}" = postgres ]; then shift; fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "postgres-entrypoint: POSTGRES_PASSWORD is not set; the superuser needs a password" >&2
    exit 1
  fi
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  "$bin/initdb" -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 > /dev/null
  rm -f "$pwfile"
  # Other containers connect over the network, with a password; replication too (the connector).
  printf '%s\n' 'host all all all scram-sha-256' 'host replication all all scram-sha-256' >> "$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
  # Initialisation listens on its socket only, so nothing connects before the scripts have run.
  "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=''" -w start > /dev/null
  if [ "$db" != postgres ]; then
    psql -v ON_ERROR_STOP=1 -U "$user" -d postgres -qc "CREATE DATABASE \"$db\""
  fi
  for script in /docker-entrypoint-initdb.d/*.sql; do
    [ -e "$script" ] || continue
    echo "postgres-entrypoint: running $script" >&2
    psql -v ON_ERROR_STOP=1 -U "$user" -d "$db" -q -f "$script"
  done
  "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop > /dev/null
  echo "postgres-entrypoint: initialised $PGDATA" >&2
fi
exec "$bin/postgres" -D "$PGDATA" "$@"
