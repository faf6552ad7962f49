"""The one iris sweep the two cluster rehearsals lose a node in (tests/test_node_loss.py: a simulated cluster
loses a worker node; tests/test_slurm_rehearsal.py: the sbatch script's job loses its second node), and its
uninterrupted reference (tests/conftest.py ``rehearsal_reference``): the same sweep run once on the session's
Ray, whose table both rehearsals must give back. Only where trials and probe actors may run differs between the
three, which no result depends on; the epochs leave a trial on the lost node running long enough after its
checkpoints for the node to be lost while it trains."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LRS = [1e-1, 1e-2, 1e-3]
EPOCHS, CHECKPOINT_EPOCHS = 60, [1, 30, 60]


def rehearsal_sweep(resources: dict[str, Any]) -> dict[str, Any]:
    """The rehearsal sweep, its trials and probe actors placed by ``resources``."""
    return {
        "name": "node-loss-rehearsal",
        "tasks": [{"name": "iris"}],
        "grid": {"lr": LRS, "q": [30]},
        "data": {"context_size": 60},
        "training": {"epochs": EPOCHS, "checkpoint_epochs": CHECKPOINT_EPOCHS},
        "probe": {"suite": ["base", "position_first", "skew_true_x2"], "bootstrap": 50},
        "wandb": {"mode": "disabled"},
        "max_failures": 2,
        "resources": resources,
    }


def run_reference(root: Path) -> Any:
    """The results table of the rehearsal sweep on one node (the session's Ray, no `worker` resource asked for)."""
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.schema.config import parse_sweep

    sweep = rehearsal_sweep({"cpus_per_trial": 0.5, "probe_actors": 1, "cpus_per_probe_actor": 0.5})
    return run_sweep(None, root / "reference", sweep=parse_sweep(sweep), progress=False)
