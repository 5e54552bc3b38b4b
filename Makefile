# Every target sets up the virtual environment it needs (.venv) on first use, and says so first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUN ?= runs/listops
PYTEST_ARGS ?= -n 2
DOCS_PAGES ?=

.PHONY: train test lint bench gpu-check docs docs-check results clean

# blocklab alone (what `make train` needs), then the test extra on top for the targets that test or lint.
$(VENV)/.base-installed: pyproject.toml
	@echo "make: creating $(VENV) and installing blocklab (pip, from pyproject.toml)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed: $(VENV)/.base-installed pyproject.toml
	@echo "make: installing the test extra into $(VENV) (transformers, TransformerLens, ray, playwright, ...)"
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	@echo "make: installing the docs extra into $(VENV) (mkdocs, mkdocs-material, mkdocstrings, cogapp)"
	$(PY) -m pip install --quiet -e '.[test,docs]'
	touch $@

# The main job: train the default model (listops-seed) on listops and write its report
# (--overwrite: running it again replaces the previous run in $(RUN)).
train: $(VENV)/.base-installed
	$(VENV)/bin/blocklab train --out $(RUN) --overwrite

# The whole test suite (also what .ci/run runs). The HTML tests need a browser:
# scripts/ensure-chromium.sh says so and installs Debian's chromium (root only) when it is missing.
test: $(VENV)/.installed
	bash scripts/ensure-chromium.sh
	$(PY) -m pytest $(PYTEST_ARGS) -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check blocklab tests benchmarks scripts

bench: $(VENV)/.installed
	$(VENV)/bin/blocklab bench --quick

# On a lent GPU: the CUDA tests and every GPU figure against its peers in one run (scripts/gpu-check.sh).
gpu-check: $(VENV)/.installed
	bash scripts/gpu-check.sh

# Regenerate every output shown in README.md and docs/ from real runs (DOCS_PAGES=docs/x.md for some pages;
# times and rates are measured on this machine), then build the site into site/.
docs: $(VENV)/.docs-installed
	$(PY) scripts/docgen.py write $(DOCS_PAGES)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# CI: fail when a shown output differs from what the code prints (machine-dependent numbers masked), a shown
# command does not parse or a Python block is not run; then the strict site build (a broken link fails).
docs-check: $(VENV)/.docs-installed
	$(PY) scripts/docgen.py check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# Re-run the long runs the docs show from their committed results (the full bench, the full claims run, the
# benchmark scripts, the ablation example; an hour or more); then `make docs`. On a quiet machine, the release
# numbers: `make results docs`.
results: $(VENV)/.installed
	$(VENV)/bin/blocklab bench --json benchmarks/results/bench.json --plot benchmarks/results/bench.png
	$(VENV)/bin/blocklab claims --json benchmarks/results/claims.json
	$(PY) scripts/docgen.py record

clean:
	rm -rf $(VENV) runs site
