"""Results aggregation: probe results on disk -> one results table per sweep, reports, W&B summary.

The table is rebuilt from the per-checkpoint result files every time, so appending is idempotent
(a result probed twice is one row) and ``iclmem report`` can rebuild everything from storage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from iclmem.atomic import write_parquet_atomic
from iclmem.runfolder import (
    FIGURES_DIR,
    MANIPULATION_AUC_FILE,
    PROBES_DIR,
    RESULTS_FILE,
    SPLIT_REPORT_FILE,
    SWEEP_FILE,
    roc_path,
)
from probes.probe import ProbeResult

ID_COLUMNS = ["run_id", "task", "model", "regime", "lr", "q", "label_mode", "seed", "epoch"]


def collect(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict[tuple[str, int], pd.DataFrame]]:
    rows, manips, rocs = [], [], {}
    for stored in sorted((run_dir / PROBES_DIR).glob("*/e*.json")):
        result = ProbeResult.load(stored.parent, stored.stem)
        if result is None:
            continue
        rows.append(result.row)
        manips.append(result.manipulation_auc)
        # one ROC file per (run, epoch): a multi-task run's is its first task's (stems sort eNNNN-t0 first)
        rocs.setdefault((result.row["run_id"], int(result.row["epoch"])), result.roc)
    results = pd.DataFrame(rows)
    if not results.empty:
        results = results.sort_values(ID_COLUMNS[:-1] + ["epoch"]).reset_index(drop=True)
        first = [c for c in ID_COLUMNS if c in results.columns]
        results = results[first + [c for c in results.columns if c not in first]]
    manipulation_auc = pd.concat(manips, ignore_index=True) if manips else pd.DataFrame()
    return results, manipulation_auc, rocs


def split_report_table(prepared: Any) -> pd.DataFrame:
    """Split validation (paper Tab. 6) plus the task characteristics of Fig. 6."""
    import numpy as np

    rows = []
    for task in prepared.tasks.values():
        report = task.split_report.to_dict()
        counts = np.bincount(np.asarray(task.original_labels), minlength=task.n_classes)
        rows.append({
            "task": task.name, "label_mode": task.label_mode.value, "seed": task.seed, "q": len(task.member_idx),
            "task_kind": task.task_kind.value, "n_rows": int(task.features.shape[0]), "n_classes": task.n_classes,
            "n_features": task.n_features, "majority_share": float(counts.max() / counts.sum()),
            **{k: v for k, v in report.items() if not isinstance(v, (list, dict))},
        })
    return pd.DataFrame(rows)


def aggregate(run_dir: Path, prepared: Any | None = None, log: Callable[[str], None] = print,
              wandb_mode: str | None = None) -> pd.DataFrame:
    run_dir = Path(run_dir)
    results, manipulation_auc, rocs = collect(run_dir)
    write_parquet_atomic(results, run_dir / RESULTS_FILE)
    write_parquet_atomic(manipulation_auc, run_dir / MANIPULATION_AUC_FILE)
    for (run_id, epoch), roc in rocs.items():
        write_parquet_atomic(roc, roc_path(run_dir, run_id, epoch))
    if prepared is not None:
        write_parquet_atomic(split_report_table(prepared), run_dir / SPLIT_REPORT_FILE)
    report = write_reports(run_dir, results, wandb_mode=wandb_mode, log=log)
    log(f"[iclmem] {len(results)} checkpoint results -> {run_dir / RESULTS_FILE}")
    if report is not None:
        log(f"[iclmem] report: {report}")
    return results


def write_reports(run_dir: Path, results: pd.DataFrame, wandb_mode: str | None = None,
                  log: Callable[[str], None] = print) -> Path | None:
    """HTML report (with figures) always; the W&B sweep summary unless W&B is disabled."""
    from orchestrator import reports
    from orchestrator.wandb_logger import make_results_logger, resolve_wandb_mode

    if results.empty:
        return None
    report = reports.write_html_report(run_dir)
    sweep_file = run_dir / SWEEP_FILE
    sweep = json.loads(sweep_file.read_text()) if sweep_file.is_file() else {}
    wandb_cfg = sweep.get("wandb", {})
    mode = resolve_wandb_mode(wandb_mode or wandb_cfg.get("mode", "offline"))
    kind = "none" if mode == "disabled" else "wandb"
    logger = make_results_logger(kind, project=wandb_cfg.get("project", "iclmem"), entity=wandb_cfg.get("entity"),
                                 group=sweep.get("name", run_dir.name), mode=mode) if kind == "wandb" else make_results_logger(kind)
    figures = {p.stem: p for p in sorted((run_dir / FIGURES_DIR).glob("*.png"))}
    try:
        logger.log_summary(run_dir, results, figures)
    finally:
        logger.finish()
    return report
