# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=
# pytest workers: the suite mostly waits on real processes and deadlines, so 2 workers on
# 2 cores halve its wall time (JOBS=0 runs it in one process). Each file runs whole, in
# order, on one worker (--dist loadfile): a module's tests share its daemon, in sequence.
JOBS ?= 2

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/robotd run --config config/sim.toml $(ARGS)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -p no:cacheprovider -n $(JOBS) --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	$(PY) bench/loop.py --seconds 10

clean:
	rm -rf $(VENV) build *.egg-info
