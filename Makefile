# The two commands of the README. Both install what they need first (idempotent, no downloads at run time).
PYTHON ?= python3
PIP_INSTALL = $(PYTHON) -m pip install --disable-pip-version-check -q

.PHONY: install quickstart test

install:
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e '.[dev]'

quickstart: install
	RAY_USAGE_STATS_ENABLED=0 WANDB_MODE=offline iclmem run configs/quickstart.yaml --out runs/quickstart

test: install
	RAY_USAGE_STATS_ENABLED=0 WANDB_MODE=offline WANDB_SILENT=true $(PYTHON) -m pytest -q -p no:cacheprovider tests
