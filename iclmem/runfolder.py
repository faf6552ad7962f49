"""The run-folder layout: every file and folder a run writes under ``RUN_DIR``, named once.

The README's table "What a run writes" lists the same names; ``tests/test_atomic_writes.py`` checks that
each file here is written atomically."""

from __future__ import annotations

from pathlib import Path

from iclmem.provenance import PROVENANCE_FILE

RESULTS_FILE = "results.parquet"  # one row per (run, checkpoint)
SPLIT_REPORT_FILE = "split_report.parquet"
MANIPULATION_AUC_FILE = "manipulation_auc.parquet"
SWEEP_FILE = "sweep.json"  # the validated sweep config, as resumed by ``iclmem resume``
REPORT_FILE = "report.html"
VERDICT_FILE = "verdict.json"  # ``iclmem probe``: one checkpoint's verdict
ROC_DIR = "roc"
FIGURES_DIR = "figures"
PROBES_DIR = "probes"  # one stored result per checkpoint
REFERENCE_DIR = "reference"  # base-model scores, computed once
PREPARED_DIR = "prepared"  # Stage I cache and ground-truth logs
TUNE_DIR = "tune"  # Tune storage when no shared storage is configured
WANDB_DIR = "wandb"

__all__ = [
    "FIGURES_DIR", "MANIPULATION_AUC_FILE", "PREPARED_DIR", "PROBES_DIR", "PROVENANCE_FILE", "REFERENCE_DIR",
    "REPORT_FILE", "RESULTS_FILE", "ROC_DIR", "SPLIT_REPORT_FILE", "SWEEP_FILE", "TUNE_DIR", "VERDICT_FILE",
    "WANDB_DIR", "roc_path",
]


def roc_path(run_dir: str | Path, run_id: str, epoch: int) -> Path:
    return Path(run_dir) / ROC_DIR / f"roc_{run_id}_e{int(epoch)}.parquet"
