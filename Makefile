# Every target sets up the virtual environment it needs (.venv) on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUN ?= runs/listops
PYTEST_ARGS ?= -n 2

.PHONY: train test lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

# The main job: train the default model (listops-seed) on listops and write its report
# (--overwrite: running it again replaces the previous run in $(RUN)).
train: $(VENV)/.installed
	$(VENV)/bin/blocklab train --out $(RUN) --overwrite

# The whole test suite (also what .ci/run runs).
test: $(VENV)/.installed
	bash scripts/ensure-chromium.sh
	$(PY) -m pytest $(PYTEST_ARGS) -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check blocklab tests benchmarks scripts

bench: $(VENV)/.installed
	$(VENV)/bin/blocklab bench --quick

clean:
	rm -rf $(VENV) runs
