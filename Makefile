# vlzoo: `make demo` and `make test` each create .venv with the pinned dependencies when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.vlzoo-installed
BACKENDS := jax tensorflow torch
PYTEST_ARGS ?=
# Two pytest-xdist workers (CI has 2 cores; most test time is single-threaded compilation), each given
# whole test files (`--dist loadfile`: a file's module fixtures, the models they build and the functions
# Keras compiles for them, are made once, not once per worker), longest first (tests/conftest.py orders
# them by tests/durations.json; `--no-loadscope-reorder` keeps that order). Not `--dist loadgroup`: with
# pytest 9.2 and xdist 3.8 the group marks do not keep tests together.
WORKERS ?= 2
# JAX programs in the tests are compiled with LLVM's optimisations off (JAX_DISABLE_MOST_OPTIMIZATIONS:
# backend optimisation level 0, no expensive LLVM passes; XLA's HLO passes and fusions, which decide
# the numerics, are unchanged): tiny models compile a third faster and run no slower that matters.
# They also share JAX's persistent compilation cache, a fresh directory for each `make` run: the two
# workers and the processes the tests start (examples, hub workers, conformance) compile many of the
# same small programs; a hit loads the executable XLA compiled before, so results are unchanged.
JAX_CACHE := JAX_COMPILATION_CACHE_DIR=$$cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
	JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
# Temporary files (pytest's, TensorFlow's autograph sources, the processes the tests start) go to the same
# directory, removed when the run ends.
# Python writes its bytecode caches even where the environment says not to (`PYTHONDONTWRITEBYTECODE`, set on
# some CI hosts): pytest then keeps each test module with its asserts rewritten (tests/__pycache__, ignored by
# git), so that the six workers of a run and the processes the tests start compile it once, not each.
PYTEST_RUN := PYTHONDONTWRITEBYTECODE= JAX_DISABLE_MOST_OPTIMIZATIONS=1 $(JAX_CACHE) TMPDIR=$$cache $(PY) -m pytest -p no:cacheprovider \
	-n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)
# One OpenMP thread per worker (PyTorch's and numpy's pools): with PyTorch's default of a thread per core,
# the two workers' pools spin against each other on CI's two cores, and the torch pass ran half as fast
# (docs/benchmarks.md, Quick start). TensorFlow's intra-op pool gets one thread too (`TF_NUM_INTRAOP_THREADS=1`: its
# two threads per worker spun the same way; the inter-op pool, which tf.distribute's collectives need, keeps its
# default, and the multi-process launches the tests start keep TensorFlow's defaults, tests/parallel_worker.py).
# JAX's own pools keep their defaults (no gain measured there).
# XLA's CPU fusions are emitted by its older elemental emitter (`--xla_cpu_use_fusion_emitters=false`): the
# same fused HLO, compiled about a third faster (docs/benchmarks.md, Quick start); `make test-numerics` keeps
# XLA's default emitters, so the numerically sensitive files also run on the code users' programs get.
# Each pass ends by checking its share of the test time budget, scaled to this host (tests/budget.py);
# `VLZOO_TEST_BUDGET=0 make test` leaves the check off (a host shared with other work).
PYTEST := VLZOO_TEST_BUDGET=$${VLZOO_TEST_BUDGET:-1} OMP_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 \
	XLA_FLAGS=--xla_cpu_use_fusion_emitters=false $(PYTEST_RUN) tests
# `make test-numerics`: the numerically sensitive files under arithmetic that another host can produce (other
# thread counts than `make test`'s: one for TensorFlow and XLA, four for PyTorch; oneDNN, XLA and ATen capped
# to AVX2), each on every backend. A comparison that fails only here depends on the summation order, not on
# the code (tests/margins.py). The property tests draw 30 cases each there (`make test`: 4 on JAX, 10 on the
# others). For contributors; not part of `make test` or CI.
NUMERICS_FILES := tests/test_gradient_caching.py tests/test_precision.py tests/test_conformance.py \
	tests/test_contrastive_losses.py tests/test_filip_loss.py tests/test_sparc_loss.py tests/test_stair.py \
	tests/test_degenerate.py tests/test_properties.py tests/test_locking.py tests/test_loss_shares.py \
	tests/test_family_contract.py
PERTURBATIONS ?= threads isa
threads_ENV := OMP_NUM_THREADS=4 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 \
	XLA_FLAGS=--xla_cpu_multi_thread_eigen=false
isa_ENV := ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 XLA_FLAGS=--xla_cpu_max_isa=AVX2
# TensorFlow reads the CPU's own flags and sends bfloat16 convolutions to oneDNN, which has no kernel for them
# once capped to AVX2 (an AVX2 CPU gets TensorFlow's Eigen kernels instead): its bfloat16 tests sit that pass out.
# On a CPU with AVX512-FP16 (Intel Xeon) float16 goes the same way and the process dies (segmentation fault in
# test_filip_loss's float16 case, the code before the family registry included): those sit it out too.
isa_tensorflow_ARGS := -k "not bfloat16 and not float16"

.PHONY: venv demo test $(addprefix test-,$(BACKENDS)) test-numerics bench presets clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[all]"
	$(PY) -m pip install -q --no-deps -c constraints.txt clip-benchmark
	touch $(STAMP)

# TensorFlow's C++ logs ("failed call to cuInit", "Could not find cuda drivers": errors in looks only)
# are hidden unless VLZOO_VERBOSE=1 or TF_CPP_MIN_LOG_LEVEL is set: vlzoo.cli sets the same default,
# but on Keras's TensorFlow backend `import vlzoo` loads TensorFlow first.
demo: $(STAMP)
	KERAS_BACKEND=$${KERAS_BACKEND:-jax} $(if $(filter-out 0,$(VLZOO_VERBOSE)),,TF_CPP_MIN_LOG_LEVEL=$${TF_CPP_MIN_LOG_LEVEL:-3} )$(PY) -m vlzoo.cli demo

# The whole suite once per backend; tests that start every backend themselves (conformance, the
# demo, the notebooks) run once, in the torch pass (tests/backend_utils.py: run_once).
test: $(STAMP)
	@set -e; cache=$$(mktemp -d); trap 'rm -rf "$$cache"' EXIT; for b in $(BACKENDS); do \
	  echo "=== KERAS_BACKEND=$$b ==="; \
	  KERAS_BACKEND=$$b $(PYTEST); \
	done

# One backend's pass: make test-jax, test-tensorflow or test-torch.
$(addprefix test-,$(BACKENDS)): test-%: $(STAMP)
	@set -e; cache=$$(mktemp -d); trap 'rm -rf "$$cache"' EXIT; KERAS_BACKEND=$* $(PYTEST)

test-numerics: $(STAMP)
	@base=$$(mktemp -d); trap 'rm -rf "$$base"' EXIT; failed=; for p in $(PERTURBATIONS); do for b in $(BACKENDS); do \
	  cache=$$base/$$p; echo "=== $$p: KERAS_BACKEND=$$b ==="; \
	  case $$p in threads) env="$(threads_ENV)";; isa) env="$(isa_ENV)";; esac; \
	  if [ $$p/$$b = isa/tensorflow ]; then set -- $(isa_tensorflow_ARGS); else set --; fi; \
	  env $$env VLZOO_HYPOTHESIS_EXAMPLES=$${VLZOO_HYPOTHESIS_EXAMPLES:-30} KERAS_BACKEND=$$b $(PYTEST_RUN) "$$@" $(NUMERICS_FILES) || failed="$$failed $$p/$$b"; \
	done; done; if [ -n "$$failed" ]; then echo "test-numerics failed:$$failed"; exit 1; fi

bench: $(STAMP)
	$(PY) tools/bench.py --markdown docs/benchmarks.md

presets: $(STAMP)
	$(PY) tools/build_presets.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
