# Two commands do everything (see README.md):
#   make lab   — set up (first time only) and open the workbook in JupyterLab
#   make test  — set up (first time only) and run every test
# Both are idempotent: set-up is redone only when pyproject.toml changes.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup bytecode lab test test-under-load test-unit test-integration test-notebooks demo bench gpu-wheels gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; assert (3, 10) <= v <= (3, 12), f"Python 3.10-3.12 needed, found {v}: set PYTHON=python3.11"'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	# torch first: DeepSpeed's build imports it (hence --no-build-isolation below, which
	# also keeps pip from fetching a second, multi-GB torch into a build environment).
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet --no-build-isolation deepspeed==0.19.8
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# The workbook's own package, compiled to bytecode before it is used. Every job starts 2-4
# fresh rank interpreters that import ~40 utils modules each, and every notebook kernel more; where
# PYTHONDONTWRITEBYTECODE is set (containers, CI images) none of them writes the cache, so
# each would compile those sources again (40-60 ms a rank, measured). Files already
# up to date are skipped; a source edited later is recompiled by Python as usual.
bytecode: setup
	@$(PY) -m compileall -q utils

lab: bytecode
	$(VENV)/bin/jupyter lab --notebook-dir=. chapters/01_course_intro.ipynb

test: bytecode
	$(PY) -m pytest $(PYTEST_ARGS)

# The whole suite while a busy loop takes one of the cores (tests/with_cpu_hog.sh): every
# assert must hold on a slow, shared machine, not only on a quiet one (docs/suite-time.md).
test-under-load: bytecode
	bash tests/with_cpu_hog.sh $(PY) -m pytest $(PYTEST_ARGS)

test-unit: bytecode
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: bytecode
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

# The chapter and lab-solution notebooks, executed cell by cell by nbval.
test-notebooks: bytecode
	$(PY) -m pytest chapters solutions $(PYTEST_ARGS)

# Headless, e.g. on a GPU node over SSH: a real pipeline job, its timeline as standalone
# HTML and a Chrome trace (open in https://ui.perfetto.dev) under demo-output/.
demo: bytecode
	$(PY) -m utils.ui.demo --out demo-output

bench: setup
	$(PY) benchmarks/tracer_overhead.py

# The GPU check's inputs for a node without a package registry (the lent GPU machine:
# Python 3.12): DeepSpeed as a pure-Python wheel, hjson and pydantic, into .whl/.
gpu-wheels: setup
	$(PY) benchmarks/gpu_wheels.py --python 3.12 --dest .whl

# On a GPU node, from the project root: this project's venv if there is one, else the node's
# python3 with the wheels of .whl/ (see README.md).
gpu-check:
	PYTHON=$(if $(wildcard $(PY)),$(PY),$(PYTHON)) bash benchmarks/gpu_node.sh gpu-check-out

clean:
	rm -rf runs demo-output .pytest_cache gpu-check-out
