# One entry point. `make demo` runs the whole thing on local services; `make test` runs the suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test unit integration services-up services-down lint clean

$(STAMP): pyproject.toml scripts/system-deps.sh spark/jars-pom.xml
	bash scripts/system-deps.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	PYTHON=$(BIN)/python bash scripts/fetch-spark-jars.sh
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/cdc demo

# mypy --strict first: a type error fails the run before any test starts (.ci/run is `make test`).
test: lint
	$(BIN)/python -m pytest -p no:cacheprovider -ra --durations=20 tests

unit: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -ra tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -ra tests/integration

services-up: $(STAMP)
	$(BIN)/cdc dev up

services-down: $(STAMP)
	$(BIN)/cdc dev down

lint: $(STAMP)
	# Three runs: checked together, spark/ puts cdc_views on mypy's path and src/cdc's import-not-found ignores
	# (cli.py, demo.py: cdc_views is loaded from spark/ at run time) would be reported as unused.
	$(BIN)/mypy --strict src/cdc
	$(BIN)/mypy --strict spark
	$(BIN)/mypy --strict bench/compare_records.py

clean: services-down
	rm -rf .cdc-dev $(VENV)
