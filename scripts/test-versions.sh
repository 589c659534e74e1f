#!/usr/bin/env bash
# `make test-versions`: the version list (PG_VERSION_TESTS) on each PostgreSQL major version of
# PG_VERSIONS, the versions side by side. Each run has its own PostgreSQL server (CDC_TEST_PG) beside
# the suite's one Kafka; the tests spend most of their time waiting on the servers, so three runs side
# by side take little longer than one. Each run's output goes to build/test-versions/<version>.log and
# is printed when it ends. With CDC_TEST_STOP_SERVICES=1 (CI) the services are stopped once, after the
# last run, not by each run (the first to finish would stop Kafka under the others).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
: "${PG_VERSIONS:?PG_VERSIONS: the major versions to run}" "${PG_VERSION_TESTS:?PG_VERSION_TESTS: the test files}"
stop=${CDC_TEST_STOP_SERVICES:-0}
export CDC_TEST_STOP_SERVICES=0
mkdir -p build/test-versions
declare -A pids
for v in $PG_VERSIONS; do
  # Its own temporary folder (TMPDIR: the daemons' default spool folders, named by slot, and pytest's
  # --basetemp): side-by-side sessions use the same slot names on their own servers, and must not
  # clean up each other's folders.
  tmp="/tmp/cdc-test-pg$v"
  rm -rf "$tmp" && mkdir -p "$tmp" && chmod 755 "$tmp"
  # shellcheck disable=SC2086  # the file list is split on purpose
  # PG_VERSION_REFERENCE's run is on the pure-Python row codec and envelopes (CDC_PURE_PYTHON=1): the
  # reference through the same integration tests as the compiled codec on the other versions.
  pure=0
  if [ "$v" = "${PG_VERSION_REFERENCE:-}" ]; then pure=1; fi
  CDC_PURE_PYTHON=$pure TMPDIR=$tmp CDC_TEST_PG=$v "$PY" -m pytest -p no:cacheprovider -ra --basetemp "$tmp/pytest" $PG_VERSION_TESTS \
    > "build/test-versions/$v.log" 2>&1 &
  pids[$v]=$!
  sleep 2  # the first run starts the shared services (dev.up holds a lock; the others then reuse them)
done
failed=()
for v in $PG_VERSIONS; do
  if wait "${pids[$v]}"; then code=0; else code=$?; fi
  if [ "$v" = "${PG_VERSION_REFERENCE:-}" ]; then how=", pure-Python row codec (CDC_PURE_PYTHON=1)"; else how=""; fi
  echo "== PostgreSQL $v (exit $code)$how"
  # The summary: failures in full, the rest as pytest's short summary.
  if [ "$code" -ne 0 ]; then cat "build/test-versions/$v.log"; failed+=("$v"); else
    grep -E '^(row codec:|tests/|SKIPPED|=+ .* (passed|failed|error))' "build/test-versions/$v.log" || true
  fi
done
if [ "$stop" = "1" ]; then
  PG_VERSIONS="$PG_VERSIONS" PYTHON="$PY" bash scripts/stop-test-services.sh
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "test-versions: failed on PostgreSQL ${failed[*]}" >&2
  exit 1
fi
