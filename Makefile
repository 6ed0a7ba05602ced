# vlzoo: `make demo` and `make test` each create .venv with the pinned dependencies when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.vlzoo-installed
BACKENDS := jax tensorflow torch
PYTEST_ARGS ?=

.PHONY: venv demo test test-jax test-tensorflow test-torch bench presets clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[all]"
	touch $(STAMP)

demo: $(STAMP)
	KERAS_BACKEND=$${KERAS_BACKEND:-jax} $(PY) -m vlzoo.cli demo

# The whole suite once per backend; tests that start every backend themselves (conformance, the
# demo, the notebooks) run once, in the torch pass (tests/backend_utils.py: run_once)
# (it starts one subprocess per backend itself).
test: $(STAMP)
	@set -e; for b in $(BACKENDS); do \
	  echo "=== KERAS_BACKEND=$$b ==="; \
	  KERAS_BACKEND=$$b $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) tests; \
	done

test-%: $(STAMP)
	KERAS_BACKEND=$* $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) tests

bench: $(STAMP)
	$(PY) tools/bench.py

presets: $(STAMP)
	$(PY) tools/build_presets.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
