"""One Ray instance per test session (2 CPUs, no dashboard, bounded object store)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CARTE_DIR = SHARED / "data" / "carte"


@pytest.fixture(scope="session")
def ray_session():
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=300 * 1024 * 1024,
                 log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


# ------------------------------------------------------------------------------------------ fault ledger
FAULT_LEDGER = {"faults injected": 0, "sweeps completed": 0, "results identical": 0}


@pytest.fixture
def fault_ledger():
    """Fault tests record what they injected and whether the sweep finished with identical results."""

    def record(injected: int = 1, completed: bool = True, identical: bool = True) -> None:
        FAULT_LEDGER["faults injected"] += injected
        FAULT_LEDGER["sweeps completed"] += int(completed)
        FAULT_LEDGER["results identical"] += int(identical)

    return record


def pytest_terminal_summary(terminalreporter):
    if FAULT_LEDGER["faults injected"]:
        line = " / ".join(f"{k}: {v}" for k, v in FAULT_LEDGER.items())
        terminalreporter.write_line(f"fault suite: {line}")
