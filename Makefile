# NPLT Assistant. `make run` and `make test` are the two commands a user needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
HOST   ?= 127.0.0.1
PORT   ?= 0

.PHONY: run test server client bench fuzz soak cluster clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

## run: start a local server (offline agent, 127.0.0.1) and open the TUI on it
run: $(VENV)/.installed
	$(PY) scripts/run_local.py --host $(HOST) --port $(PORT)

## server: only the server, in the foreground (port 9999 unless PORT is set)
server: $(VENV)/.installed
	$(VENV)/bin/nplt-server --host $(HOST) $(if $(filter-out 0,$(PORT)),--port $(PORT))

## test: the whole suite; src/protocol's branch coverage is measured by its own tests (tracing every
##       other test too cost ~50 % more CPU for the same protocol report); the rest runs in
##       TEST_WORKERS pytest-xdist workers, by default one per CPU this process may use (nproc), at
##       most 4: one worker left a core idle (most tests wait on servers, subprocesses and sockets),
##       two halved the time on 2 cores
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ "$$n" -gt 4 ] && n=4; echo $$n)
test: $(VENV)/.installed-dev
	$(PY) -m pytest --cov --cov-branch --cov-report=term-missing:skip-covered tests/protocol; \
	  first=$$?; $(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal --ignore=tests/protocol; rest=$$?; \
	  [ $$first -eq 0 ] && [ $$rest -eq 0 ]

## bench: every benchmark script, printing figures (LOCOMO=path to LoCoMo json for the recall bench,
##        CMRC=path to a SQuAD-format json such as CMRC 2018 for the knowledge-base bench)
bench: $(VENV)/.installed-dev
	for b in bench/codec.py bench/storage.py bench/roundtrip.py bench/load.py bench/turns.py bench/memory_turn.py bench/tui.py bench/kb_upload.py bench/abandoned_fragments.py; do \
		[ -f $$b ] && $(PY) $$b || exit 1; done
	$(if $(LOCOMO),$(PY) bench/locomo_recall.py $(LOCOMO))
	$(if $(CMRC),$(PY) bench/kb_recall.py $(CMRC))

## cluster: embedded PostgreSQL + two server nodes on loopback sharing it (Ctrl+C stops all); NODES=3 for more
cluster: $(VENV)/.installed-dev
	$(PY) scripts/cluster.py --nodes $(or $(NODES),2) --host $(HOST) --port $(PORT)

## fuzz: long property-based runs (not part of make test)
fuzz: $(VENV)/.installed-dev
	NPLT_FUZZ=1 $(PY) -m pytest -q -p no:cacheprovider tests/protocol tests/memory

## soak: the bounded loopback attack campaign of issue 15 (fuzz, SIGKILL restarts, overload, provider
## faults), one table (docs/soak.md); SOAK_PROFILE=tiny for a ~30 s run
soak: $(VENV)/.installed-dev
	$(PY) bench/soak.py --profile $(or $(SOAK_PROFILE),full)

clean:
	rm -rf $(VENV) .pytest_cache .coverage build src/*.egg-info
