# The two commands of the README. Both install what they need first (idempotent, no downloads at run time).
PYTHON ?= python3
PIP_INSTALL = $(PYTHON) -m pip install --disable-pip-version-check -q

.PHONY: install quickstart test test-fast test-avx2 lint image

# Installs when needed: the first time, when pyproject.toml changed since, or when the installed package is
# another checkout's (an editable install points at one folder); `rm .installed` forces it.
install:
	@if [ .installed -nt pyproject.toml ] && $(PYTHON) -I -c "import pathlib, orchestrator; \
	    assert pathlib.Path(orchestrator.__file__).resolve().parents[1] == pathlib.Path.cwd().resolve()" 2>/dev/null; \
	then echo "iclmem is installed from this checkout and pyproject.toml is unchanged: nothing to install"; \
	else $(PIP_INSTALL) torch==2.13.0 && $(PIP_INSTALL) -e '.[dev]' && touch .installed; fi

quickstart: install
	RAY_USAGE_STATS_ENABLED=0 WANDB_MODE=offline iclmem run configs/quickstart.yaml --out runs/quickstart

PYTEST = RAY_USAGE_STATS_ENABLED=0 WANDB_MODE=offline WANDB_SILENT=true $(PYTHON) -m pytest -q -p no:cacheprovider -p no:benchmark

# Two pytest-xdist workers, each a pytest session with its own session Ray (tests/conftest.py), tests handed
# to whichever is free. A single test or file runs as usual: $(PYTEST) tests/test_x.py
test: install lint
	$(PYTEST) -n 2 --dist loadgroup --no-loadscope-reorder --durations=15 tests

# The same suite on AVX2 code paths, as on a CPU without AVX-512 (an AVX2-only AMD EPYC, say): ATen's kernels,
# MKL's, OpenBLAS's and numba's compiled attention are all forced to AVX2, so the weights a planted run ends with
# are the ones such a machine computes. Not CI (it doubles the time); run it before changing a planted assertion.
AVX2_CODE_PATHS = ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 OPENBLAS_CORETYPE=Haswell NUMBA_CPU_NAME=haswell
test-avx2: install lint
	$(AVX2_CODE_PATHS) $(PYTEST) -n 2 --dist loadgroup --no-loadscope-reorder --durations=15 tests

# For development, before every commit: no model training, no sweep, no Ray cluster or actor (the tests marked
# slow are left out; `make test` runs them all), on two xdist workers: 2:10 here from a clean clone (3:07 on
# one). It installs nothing when nothing changed.
test-fast: install
	$(PYTEST) -n 2 --dist loadgroup --no-loadscope-reorder -m "not slow" tests

# ruff on the tree; mypy --strict on all four packages (configured in pyproject.toml)
lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

# The container image (Dockerfile; KubeRay's and Slurm's image): CPU torch wheels by default, TORCH_VARIANT=cu126
# for CUDA nodes. Checked offline first (pins, base image, secrets, user); the build needs Docker.
IMAGE ?= iclmem:0.1.0
TORCH_VARIANT ?= cpu
image:
	$(PYTHON) -m orchestrator.cli cluster-check Dockerfile
	@command -v docker >/dev/null 2>&1 || { echo "make image: Docker is not installed here; the Dockerfile passed its checks above"; exit 2; }
	docker build --build-arg TORCH_VARIANT=$(TORCH_VARIANT) -t $(IMAGE) .
