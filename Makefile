# Two commands on a fresh machine: `make demo` and `make test` (README). Both build .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# The native codec must build here: a failed compile is an error, not a silent fallback.
export SHALLOWMIRROR_REQUIRE_NATIVE := 1
# `make test` runs the integration suite a second time on real Apache Kafka from KAFKA_HOME; only
# this test set-up falls back to the distribution shipped beside the project (../shared/kafka).
SHARED_KAFKA := $(abspath ../shared/kafka)
KAFKA_HOME ?= $(if $(wildcard $(SHARED_KAFKA)/bin/kafka-server-start.sh),$(SHARED_KAFKA))
export KAFKA_HOME

.PHONY: demo test lint bench fuzz clean install

install: $(STAMP)

$(STAMP): pyproject.toml setup.py $(wildcard native/*.pyx native/*.pxd)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -c "import shallowmirror.codec as c; assert c.IMPLEMENTATION == 'native', c.IMPLEMENTATION; print('shallowmirror installed; codec:', c.IMPLEMENTATION)"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m shallowmirror.demo

# Run 1: every test on embedded tansu. Run 2: the integration tests on Apache Kafka (KAFKA_HOME).
test: $(STAMP)
	$(PY) -m shallowmirror.testing.java_check
	$(PY) -m shallowmirror.testing.suite $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check shallowmirror tests benchmarks examples

bench: $(STAMP)
	$(PY) -m pytest benchmarks/codec --benchmark-only --benchmark-columns=median,ops --benchmark-sort=name

clean:
	rm -rf $(VENV) build *.egg-info shallowmirror/codec/*.so shallowmirror/codec/*.c native/*.c
