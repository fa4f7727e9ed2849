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

$(STAMP): pyproject.toml setup.py $(wildcard native/*.pyx native/*.pxd native/*.pxi native/*.h)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -c "import shallowmirror.codec as c, shallowmirror.engine.hotpath as h, shallowmirror.net.connection as n; assert c.IMPLEMENTATION == h.IMPLEMENTATION == n.SEND_IMPLEMENTATION == 'native', (c.IMPLEMENTATION, h.IMPLEMENTATION, n.SEND_IMPLEMENTATION); print('shallowmirror installed; codec, engine loops and send path:', c.IMPLEMENTATION)"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m shallowmirror.demo

# Run 1: every test on embedded tansu. Run 2: the integration tests on Apache Kafka (KAFKA_HOME).
test: $(STAMP)
	$(PY) -m shallowmirror.testing.java_check
	$(PY) -m shallowmirror.testing.suite $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check shallowmirror tests benchmarks

bench: $(STAMP)
	$(PY) -m pytest benchmarks/codec --benchmark-only --benchmark-columns=median,ops --benchmark-sort=name

# Long fuzz (minutes; not in `make test` or CI): every codec fuzz module (record sets, Fetch and
# Produce frames, deep paths, the argument boundary) in its own child process limited to
# FUZZ_MEMORY_KB of address space, FUZZ_EXAMPLES cases per test. A crash, a hang (pytest-timeout),
# native and twin disagreeing, or memory beyond the limit fails the run; logs in build/fuzz/.
FUZZ_EXAMPLES ?= 20000
FUZZ_MEMORY_KB ?= 2097152
FUZZ_TIMEOUT_S ?= 3600
fuzz: $(STAMP)
	@mkdir -p build/fuzz
	@for module in tests/unit/codec/test_fuzz_*.py; do \
	  log=build/fuzz/$$(basename $$module .py).log; \
	  echo "fuzz: $$module ($(FUZZ_EXAMPLES) cases per test, $(FUZZ_MEMORY_KB) KiB address space)"; \
	  if ! ( ulimit -v $(FUZZ_MEMORY_KB) && SHALLOWMIRROR_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) \
	         $(PY) -m pytest -q --timeout=$(FUZZ_TIMEOUT_S) --hypothesis-show-statistics \
	         $$module ) > $$log 2>&1; then tail -n 60 $$log; echo "fuzz: FAILED ($$log)"; exit 1; fi; \
	  tail -n 1 $$log; \
	done
	@cat build/fuzz/*.log | awk '/passing, [0-9]+ failing/ {n += $$2; f += $$4} \
	  END {print "fuzz: " n " cases passed, " f " failed, in every module"}'

clean:
	rm -rf $(VENV) build *.egg-info shallowmirror/codec/*.so shallowmirror/codec/*.c shallowmirror/engine/*.so native/*.c
