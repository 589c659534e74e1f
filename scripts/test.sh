#!/usr/bin/env bash
# `make test`: the whole suite on PostgreSQL 15 (pytest-xdist workers, $CDC_TEST_WORKERS or 3;
# tests/conftest.py groups the tests) and, beside it, the version list on PostgreSQL 16, 17 and 18
# (scripts/test-versions.sh, each version with its own server beside the suite's Kafka; $PG_VERSION_REFERENCE's run on
# the pure-Python row codec and envelopes), then the unit
# tests again on the pure-Python row codec (make unit-reference), still beside the suite. The tests mostly
# wait on the servers, which is why a third worker pays (bench/README.md, "Figures behind the code's choices").
# With CDC_TEST_STOP_SERVICES=1 (CI) the services are stopped once, after the last session.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
: "${PG_VERSIONS:?PG_VERSIONS: the major versions to run}" "${PG_VERSION_TESTS:?PG_VERSION_TESTS: the test files}"
stop=${CDC_TEST_STOP_SERVICES:-0}
export CDC_TEST_STOP_SERVICES=0
mkdir -p build/test-versions
rm -f build/test-versions/versions.exit build/test-versions/reference.exit

workers=${CDC_TEST_WORKERS:-3}
CDC_TEST_STOP_SERVICES=0 "$PY" -m pytest -p no:cacheprovider -ra --durations=25 -n "$workers" -m "not cluster" tests &
suite=$!
sleep 20  # the suite starts the shared services (dev.up holds a lock; the version runs then reuse them)
{
  PYTHON=$PY bash scripts/test-versions.sh > build/test-versions/summary.log 2>&1
  echo $? > build/test-versions/versions.exit
  CDC_PURE_PYTHON=1 "$PY" -m pytest -p no:cacheprovider -q -ra -n 2 tests/unit > build/test-versions/reference.log 2>&1
  echo $? > build/test-versions/reference.exit
} &
beside=$!

wait "$suite"; suite_code=$?
wait "$beside"
versions_code=$(cat build/test-versions/versions.exit 2>/dev/null || echo 1)
reference_code=$(cat build/test-versions/reference.exit 2>/dev/null || echo 1)
echo "== the version runs (scripts/test-versions.sh, exit $versions_code)"
cat build/test-versions/summary.log
echo "== the unit tests on the pure-Python row codec (CDC_PURE_PYTHON=1, exit $reference_code)"
tail -n 15 build/test-versions/reference.log

if [ "$stop" = "1" ]; then
  PG_VERSIONS="$PG_VERSIONS" PYTHON="$PY" bash scripts/stop-test-services.sh
fi
echo "make test: suite exit $suite_code, versions exit $versions_code, pure-Python unit tests exit $reference_code"
[ "$suite_code" -eq 0 ] && [ "$versions_code" -eq 0 ] && [ "$reference_code" -eq 0 ]
