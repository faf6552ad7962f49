"""The session's one small real sweep (tests/conftest.py ``real_sweep``): Ray Tune, pfn-mini, W&B offline,
its ground truth planted. The end-to-end checks (test_pipeline.py), the report's and the W&B summary's tests
read the run folder it writes, so the live row shape is what they exercise, and it is built once.

The grid plants: lr 1e-1 must collapse, label-shuffled members fine-tuned at lr 1e-3 for 40 epochs must be
detected as memorization, every fine-tuned checkpoint is probed on a null split too, and the untouched base
model probed as if it were a checkpoint (the pipeline sanity check) must give exactly no signal. Every
fine-tuned checkpoint is also deployed with a context of half its rows (``probe.two_channels``). A canary
string in a text column and a W&B key in the environment must reach no file a reader would see.
"""

from __future__ import annotations

from pathlib import Path

CANARY = "CANARY-q7x3-do-not-leak"
FAKE_WANDB_KEY = "local-0123456789abcdef0123456789abcdef01234567"  # shaped like a real key; never sent


def canary_table(path: Path) -> Path:
    """digits plus a text column whose every value holds a canary string. Digits: with label-matched
    non-members (#29) a binary table's planted signal is too weak to assert (breast_cancer, Q = 50, 30
    epochs: AUC 0.52-0.71, TPR@10% 0.10-0.22, no seed of three called memorization), ten classes keep it
    (AUC 0.76-0.89, TPR@10% 0.36-0.78, every seed)."""
    from sklearn.datasets import load_digits

    data = load_digits(as_frame=True).frame
    data.insert(0, "patient_note", [f"{CANARY}-{i:04d}" for i in range(len(data))])
    data.to_csv(path, index=False)
    return path


def run_real_sweep(root: Path) -> tuple[Path, object, list[str]]:
    """(run folder, results table, driver log lines) of the planted sweep, run into ``root / "run"``."""
    import pytest

    from orchestrator.driver.sweep import run_sweep
    from orchestrator.schema.config import parse_sweep

    table = canary_table(root / "patients.csv")
    sweep = parse_sweep({
        "name": "e2e",
        "tasks": [{"name": "patients", "path": str(table), "target": "target", "task": "classification"}],
        "grid": {"lr": [1e-1, 1e-3], "q": [50], "label_mode": ["normal", "shuffled_members"]},
        "training": {"epochs": 40, "checkpoint_epochs": [1, 10, 40]},
        # two channels, same rows: every fine-tuned checkpoint also deployed with half its members and non-members
        # 3 null splits per checkpoint: 12 null trials per run claim, enough for the claim ledger to read a rate
        "probe": {"bootstrap": 200, "two_channels": True, "context_references": 8, "null_splits": 3},
        "resources": {"cpus_per_trial": 1, "cpus_per_probe_actor": 1},
        "wandb": {"mode": "offline", "project": "iclmem-test"},
    })
    run_dir = root / "run"
    logs: list[str] = []
    with pytest.MonkeyPatch.context() as env:  # a W&B key in the environment, as on a real cluster
        env.setenv("WANDB_API_KEY", FAKE_WANDB_KEY)
        results = run_sweep(None, run_dir, sweep=sweep, log=logs.append)
    return run_dir, results, logs
