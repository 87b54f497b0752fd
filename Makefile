# Every target sets itself up on a fresh machine that has only Python and pip.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
REF_VENV := .venv-ref
REF_STAMP := $(REF_VENV)/.installed
BACKENDS := tensorflow jax torch
# The install does not byte-compile the ~22,700 files of the backends (pip's default: 85 of its 193 s on the
# 2-core host); a process compiles what it imports and keeps it for the next. So the processes here may write
# bytecode even where the shell sets PYTHONDONTWRITEBYTECODE, which would make every test process compile
# its imports again.
unexport PYTHONDONTWRITEBYTECODE
# Each backend's pass runs in 2 worker processes (pytest-xdist); `--dist loadscope` keeps a module on one
# worker, so its module-scoped fixtures (a trained job, a built model) run once. `--no-loadscope-reorder` keeps
# the order tests/conftest.py gives (the longest modules first, tests/module_durations.json) instead of xdist's
# (most tests first), which left a long few-test module running alone at the end. PYTEST_ARGS="-n 0" runs serially.
XDIST := -n 2 --dist loadscope --no-loadscope-reorder

.PHONY: help demo test test-tensorflow test-jax test-torch test-differential test-writers install reference-env bench clean \
	device-wheels device-check

# The first target: `make` alone lists the others.
help:
	@echo "make demo            train a small ViT on scikit-learn's digits and print held-out accuracy"
	@echo "make test            the whole test suite once per backend (tensorflow, jax, torch), 2 workers each"
	@echo "make test-jax        one backend (also test-tensorflow, test-torch); PYTEST_ARGS=... passes options"
	@echo "make test-differential  N processes against one on every engine, drawn configurations, a table"
	@echo "                     (DIFFERENTIAL_CASES=60, DIFFERENTIAL_SEED=...; ~1-2 min a configuration on 2 cores)"
	@echo "make test-writers    kill / ENOSPC / EACCES at every file-system call of every writer; prints a table"
	@echo "make install         create .venv: the package with all three backends and the test tools (~4 GB)"
	@echo "make bench           speed and memory against timm and Hugging Face (builds .venv-ref, ~6 GB; ~15 min)"
	@echo "make reference-env   only the side environment with timm (.venv-ref), for fixtures and benchmarks"
	@echo "make device-wheels   the wheels the GPU machine lacks (keras, namex, optree) into .device-wheels/"
	@echo "make device-check    the GPU check (benchmarks/device_check.sh): tests, fine-tuning, timings; needs a GPU"
	@echo "make clean           remove .venv, .venv-ref and build outputs"

$(STAMP): pyproject.toml requirements/constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -c requirements/constraints.txt -e ".[all,test]"
	touch $@

install: $(STAMP)

# Train a small ViT on scikit-learn's handwritten digits and print held-out accuracy.
demo: $(STAMP)
	$(VENV)/bin/keras-vit train

# The whole suite once per backend, each in its own pytest run; fails if any backend fails.
test: $(STAMP)
	@status=0; for backend in $(BACKENDS); do \
		echo "=== KERAS_BACKEND=$$backend ==="; \
		KERAS_BACKEND=$$backend $(PY) -m pytest -q -p no:cacheprovider $(XDIST) $(PYTEST_ARGS) || status=1; \
	done; exit $$status

# A static pattern rule: make skips implicit rules for .PHONY targets, so `test-%` alone never ran.
$(addprefix test-,$(BACKENDS)): test-%: $(STAMP)
	KERAS_BACKEND=$* $(PY) -m pytest -q -p no:cacheprovider $(XDIST) $(PYTEST_ARGS)

# The differential check's wide sample: DIFFERENTIAL_CASES configurations drawn from DIFFERENTIAL_SEED (by
# default a new seed, printed), shared out over torchrun, JAX processes and TensorFlow workers; prints a table
# of the weight, log.csv and printed-line differences. Replay one with
# `python -m tests.distribution.differential --seed S --index I --engine E`.
DIFFERENTIAL_CASES ?= 60
DIFFERENTIAL_SEED ?=
test-differential: $(STAMP)
	$(PY) -m tests.distribution.differential --cases $(DIFFERENTIAL_CASES) $(if $(DIFFERENTIAL_SEED),--seed $(DIFFERENTIAL_SEED))

# Every writer at every file-system call it makes (counted): killed there, or that call failing with ENOSPC,
# or with EACCES; then the checks of tests/reliability/fault_harness.py. Prints a table (writer, calls, cases
# per mode, holding, failing); CI runs a sample of it (tests/reliability/test_every_call.py). The writers run
# in a torch process forked per case; the SavedModel export, which Keras makes from TensorFlow only and which
# cannot run in a fork, in a new TensorFlow process per case. HARNESS_ARGS="--writers preset --modes kill" etc.
test-writers: $(STAMP)
	@status=0; \
	KERAS_BACKEND=torch $(PY) -m tests.reliability.fault_harness $(HARNESS_ARGS) || status=1; \
	KERAS_BACKEND=tensorflow $(PY) -m tests.reliability.fault_harness --writers export-saved_model $(HARNESS_ARGS) \
		|| status=1; \
	exit $$status

# Side environment with timm (needs a CUDA build of torch for torchvision): fixtures and benchmarks only.
$(REF_STAMP): requirements/reference.txt
	test -x $(REF_VENV)/bin/python || $(PYTHON) -m venv $(REF_VENV)
	$(REF_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements/reference.txt
	touch $@

reference-env: $(REF_STAMP)

# keras_vit on torch, jax and tensorflow against timm and Hugging Face ViT (CPU, ~15 min on 2 cores):
# images/s forward and per training step, peak memory, GFLOP/s vs the matmul ceiling.
# Prints a ratio table and writes benchmarks/results/*.json. BENCH_ARGS="--rounds 2" etc. passes options.
bench: $(STAMP) $(REF_STAMP)
	$(PY) benchmarks/run.py --python $(PY) --ref-python $(REF_VENV)/bin/python $(BENCH_ARGS)

# The GPU machine has Python 3.12, torch, jax, timm and pytest but no keras: the wheels it lacks
# (requirements/device.txt) travel with the working tree in .device-wheels/ (carried: it is ignored).
# pip picks CPython 3.12 manylinux x86_64 wheels whatever this machine runs; the check refuses a second
# version of a package, a requirement neither the machine nor the folder has, and a folder over 64 MiB.
DEVICE_WHEELS := .device-wheels
DEVICE_PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64,--platform $(p))
device-wheels: requirements/device.txt
	rm -rf $(DEVICE_WHEELS).partial && mkdir -p $(DEVICE_WHEELS).partial
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--python-version 3.12 --implementation cp $(DEVICE_PLATFORMS) -d $(DEVICE_WHEELS).partial -r requirements/device.txt
	$(PYTHON) benchmarks/device_check.py --check-wheels $(DEVICE_WHEELS).partial --requirements requirements/device.txt
	rm -rf $(DEVICE_WHEELS) && mv $(DEVICE_WHEELS).partial $(DEVICE_WHEELS)

# Run on the GPU machine as `bash benchmarks/device_check.sh` (docs/performance.md, "The GPU check"); here,
# without a GPU, it refuses at once. DEVICE_CHECK_ARGS=--cpu-smoke runs its tiny CPU version.
device-check:
	PYTHON=$(if $(wildcard $(PY)),$(PY),$(PYTHON)) bash benchmarks/device_check.sh $(DEVICE_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(REF_VENV) build *.egg-info
