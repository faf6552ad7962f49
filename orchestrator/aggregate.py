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
    results = epsilon_columns(results, log)
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


# --------------------------------------------------------------------------------------------------
# ε lower bounds against the DP accountant (issue #15)
# --------------------------------------------------------------------------------------------------


class EpsilonInconsistencyWarning(UserWarning):
    """An audited ε lower bound exceeds the DP accountant's ε for the same checkpoint: one of the two is wrong."""


def _kinds_of(row: pd.Series, all_kinds: list[str]) -> list[str]:
    listed = row.get("threshold_score_kinds")
    if isinstance(listed, str) and listed:
        return [k for k in listed.split(",") if k in all_kinds] or all_kinds
    return all_kinds


def epsilon_columns(results: pd.DataFrame, log: Callable[[str], None] = print) -> pd.DataFrame:
    """Adds, beside the per-kind bounds the probe wrote (``calibrated_<kind>_epsilon_lb``):

    * ``epsilon_lb``, ``epsilon_lb_kind``, ``epsilon_lb_delta``: the checkpoint's bound, the maximum over the
      competing score kinds (the family its verdict reads);
    * ``run_epsilon_lb`` (and ``_epoch``, ``_kind``): the run headline's, the maximum over the run's
      checkpoints and competing kinds;
    * DP-SGD rows (``dp_noise_multiplier`` set): ``dp_steps`` and ``dp_epsilon``, the accountant's ε after the
      checkpoint's epoch, and ``epsilon_consistent``: whether every calibrated kind's bound stays at or below
      it. False is a bug in the audit or in the accounting, printed as a warning; None where there is no
      accountant or the audit's δ is below the accountant's (then the bound is not comparable).
    """
    import math
    import warnings

    from iclmem.vocab import SCORE_KINDS

    if results.empty:
        return results
    out = results.copy()
    kinds = [k.value for k in SCORE_KINDS if f"calibrated_{k.value}_epsilon_lb" in out.columns]
    if not kinds:
        return out
    lb, lb_kind, lb_delta, any_kind = [], [], [], []
    for _, row in out.iterrows():
        values = {k: float(row[f"calibrated_{k}_epsilon_lb"]) for k in _kinds_of(row, kinds)
                  if pd.notna(row.get(f"calibrated_{k}_epsilon_lb"))}
        best = max(values, key=lambda k: values[k], default=None)
        lb.append(math.nan if best is None else values[best])
        lb_kind.append(best)
        lb_delta.append(math.nan if best is None else float(row[f"calibrated_{best}_epsilon_lb_delta"]))
        every = [float(row[f"calibrated_{k}_epsilon_lb"]) for k in kinds if pd.notna(row.get(f"calibrated_{k}_epsilon_lb"))]
        any_kind.append(max(every, default=math.nan))
    out["epsilon_lb"], out["epsilon_lb_kind"], out["epsilon_lb_delta"] = lb, lb_kind, lb_delta
    keys = [c for c in ("run_id", "task") if c in out.columns]
    # the epoch as a float (NaN when no checkpoint has a bound): one dtype in memory and read back from parquet
    out["run_epsilon_lb"], out["run_epsilon_lb_epoch"], out["run_epsilon_lb_kind"] = math.nan, math.nan, None
    for _, group in out.groupby(keys, sort=False, dropna=False):
        valid = group["epsilon_lb"].dropna()
        if valid.empty:
            continue
        top = valid.idxmax()
        out.loc[group.index, "run_epsilon_lb"] = float(valid.loc[top])
        out.loc[group.index, "run_epsilon_lb_epoch"] = float(out.at[top, "epoch"])
        out.loc[group.index, "run_epsilon_lb_kind"] = out.at[top, "epsilon_lb_kind"]
    if "dp_noise_multiplier" not in out.columns:
        return out
    from trainables.dp import DPSettings

    spent, steps, consistent = [], [], []
    inconsistent, not_comparable = [], []
    for i, row in out.iterrows():
        if pd.isna(row.get("dp_noise_multiplier")):
            spent.append(math.nan)
            steps.append(None)
            consistent.append(None)
            continue
        dp = DPSettings(**{f: row[f"dp_{f}"] for f in ("target_epsilon", "delta", "max_grad_norm", "noise_multiplier",
                                                     "epochs", "sample_rate", "steps_per_epoch", "accountant")})
        eps = dp.epsilon_at(int(row["epoch"]))
        spent.append(eps)
        steps.append(dp.steps_at(int(row["epoch"])))
        audit = any_kind[out.index.get_loc(i)]
        if math.isnan(audit):
            consistent.append(None)
        elif lb_delta[out.index.get_loc(i)] < dp.delta:
            # (ε, δ)-DP says nothing at a smaller δ, so a bound computed there may exceed ε legitimately
            consistent.append(None)
            not_comparable.append(str(row["run_id"]))
        else:
            ok = audit <= eps + 1e-9
            consistent.append(ok)
            if not ok:
                inconsistent.append(f"{row['run_id']} [{row.get('task')}] epoch {int(row['epoch'])}: "
                                    f"audited epsilon_lb {audit:.4g} > accountant epsilon {eps:.4g} (delta {dp.delta:g})")
    out["dp_epsilon"], out["dp_steps"], out["epsilon_consistent"] = spent, steps, consistent
    if not_comparable:
        log(f"[iclmem] note: epsilon_consistent is not checked for {len(set(not_comparable))} DP run(s) whose audit "
            "delta (outcome.epsilon_delta) is below training.dp_delta; set them equal to compare")
    if inconsistent:
        message = (f"{len(inconsistent)} checkpoint(s) have an audited epsilon lower bound ABOVE the DP accountant's "
                   "epsilon: a bug in the audit or in the DP accounting (or the members and non-members are not "
                   "exchangeable, e.g. shuffled member labels): " + "; ".join(inconsistent))
        log(f"[iclmem] WARNING {message}")
        warnings.warn(message, EpsilonInconsistencyWarning, stacklevel=2)
    return out
