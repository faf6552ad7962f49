"""What the report's top says about the sweep as a whole: its one-line verdict, the checkpoints each run was
scheduled against those stored (and the runs with none), the sample sizes an AUC compares, the manipulations that
changed nothing for the audited model, and the blind baseline beside the verdicts. Pure pandas: the sweep's
config and the results rows in, tables and counts out."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np
import pandas as pd

from iclmem.record import CHECKPOINT_ID
from iclmem.runfolder import RunStatus
from iclmem.vocab import Outcome
from orchestrator.report.selection import (
    BASE_MANIPULATION,
    fine_tuned_rows,
    outcome_order,
    peak_checkpoints,
    run_key_columns,
)
from orchestrator.runfolder.run_folder import public_manipulation_auc
from orchestrator.schema.config import SweepConfig
from probes.metrics import allowed_false_positives

__all__ = [
    "checkpoint_schedule",
    "scheduled_runs_per_regime",
    "missing_runs",
    "run_completeness",
    "outcome_summary",
    "sample_sizes",
    "noop_manipulations",
    "blind_baseline_summary",
]


def checkpoint_schedule(sweep: SweepConfig | None) -> tuple[int, ...] | None:
    """The epochs every fine-tuning run of ``sweep`` writes a checkpoint at (``training.epochs``,
    ``checkpoint_epochs``, ``every_epoch``), or None without a sweep record."""
    if sweep is None:
        return None
    from trainables.spec import FinetuneSpec  # the schedule's one definition (the trainable's own)

    t = sweep.training
    kw: dict[str, Any] = {"epochs": t.epochs, "every_epoch": t.every_epoch}
    if t.checkpoint_epochs is not None:
        kw["checkpoint_epochs"] = tuple(t.checkpoint_epochs)
    return FinetuneSpec(**kw).schedule()


def scheduled_runs_per_regime(sweep: SweepConfig | None) -> dict[str, int] | None:
    """Per regime, how many runs (``(run_id, task)`` keys: a joint multi_fixed / multi_random run counts
    once per task) the sweep's grid schedules; None without a sweep record."""
    if sweep is None:
        return None
    from orchestrator.schema.trials import expand_grid

    out: dict[str, int] = {}
    for t in expand_grid(sweep):
        out[str(t.regime)] = out.get(str(t.regime), 0) + len(t.task.split("+"))
    return out


def missing_runs(results: pd.DataFrame, sweep: SweepConfig | None,
                 diverged: Collection[str] = ()) -> dict[str, tuple[int, int]]:
    """Regimes with scheduled runs that have no stored fine-tuned checkpoint at all (e.g. never started
    before an interruption): regime -> (missing, scheduled). A run of ``diverged`` (recorded by the driver as
    stopped by a NaN / inf loss, possibly before its first checkpoint) is a result, not missing."""
    scheduled = scheduled_runs_per_regime(sweep)
    if not scheduled or sweep is None:
        return {}
    ft = fine_tuned_rows(results)
    key = run_key_columns(ft)
    stored = ft.drop_duplicates(key)["regime"].value_counts() if "regime" in ft.columns else pd.Series(dtype=int)
    stored_ids = set(ft["run_id"].astype(str)) if "run_id" in ft.columns else set()
    ended: dict[str, int] = {}  # per regime: runs (x tasks) that diverged before storing any checkpoint
    if diverged:
        from orchestrator.schema.trials import expand_grid

        for trial in expand_grid(sweep):
            if trial.run_id in diverged and trial.run_id not in stored_ids:
                ended[str(trial.regime)] = ended.get(str(trial.regime), 0) + len(trial.task.split("+"))
    out = {r: (n - int(stored.get(r, 0)) - ended.get(r, 0), n) for r, n in scheduled.items()}
    return {r: v for r, v in out.items() if v[0] > 0}


def run_completeness(results: pd.DataFrame, schedule: tuple[int, ...] | None, *,
                     interrupted: bool = False, diverged: Collection[str] = ()) -> pd.DataFrame:
    """One row per fine-tuned run (``run_id``, ``task``): ``n_stored`` checkpoints of ``n_scheduled``,
    ``last_epoch`` and ``status``: ``complete``, ``incomplete`` (fewer stored than scheduled),
    ``interrupted`` (incomplete, and the sweep was stopped), ``diverged`` (a run of ``diverged``, the run
    ids the driver recorded as stopped by a NaN / inf loss: a result, not a gap), or ``unknown`` (no
    schedule to compare with)."""
    ft = fine_tuned_rows(results)
    key = run_key_columns(ft)
    cols = [*key, "n_stored", "n_scheduled", "last_epoch", "status"]
    rows = []
    for k, g in ft.groupby(key, sort=True, dropna=False):
        epochs = {int(e) for e in g["epoch"]}
        row = dict(zip(key, k if isinstance(k, tuple) else (k,)))
        n_stored = len(epochs & set(schedule)) if schedule else len(epochs)
        if schedule is None:
            status = "unknown"
        elif n_stored >= len(schedule):
            status = "complete"
        elif str(row.get("run_id")) in diverged:
            status = "diverged"
        else:
            status = RunStatus.INTERRUPTED.value if interrupted else "incomplete"
        rows.append({**row, "n_stored": n_stored, "n_scheduled": len(schedule) if schedule else np.nan,
                     "last_epoch": max(epochs), "status": status})
    return pd.DataFrame(rows, columns=cols)


def outcome_summary(results: pd.DataFrame) -> tuple[str, int]:
    """The one-line verdict of a sweep, e.g. ``"3 memorization, 5 no_signal, 1 collapse of 9 runs"``: every
    fine-tuned run at its headline (peak) checkpoint, under the sweep's rule, in precedence order. The
    base-model sanity checks are left out. Returns (line, number of runs)."""
    peaks = peak_checkpoints(fine_tuned_rows(results), regime=None)
    if peaks.empty:
        return "no fine-tuned run has a stored checkpoint", 0
    counts = peaks["outcome"].value_counts()
    parts = [f"{int(counts[o])} {o}" for o in outcome_order(peaks["outcome"]) if counts.get(o, 0)]
    return f"{', '.join(parts)} of {len(peaks)} run{'s' if len(peaks) != 1 else ''}", len(peaks)


def sample_sizes(results: pd.DataFrame) -> pd.DataFrame:
    """What each AUC compares: per Q, the members and non-members a checkpoint is probed on (from the
    results' ``n_members`` / ``n_nonmembers``; Stage I draws Q of each), and the false positives
    TPR@1% and TPR@10% allow (⌊α·n⌋ of n non-members)."""
    ft = fine_tuned_rows(results)
    if ft.empty or "q" not in ft.columns:
        return pd.DataFrame(columns=["q", "n_members", "n_nonmembers", "fp_allowed_at_1pct", "fp_allowed_at_10pct"])
    d = pd.DataFrame({"q": ft["q"].astype(int),
                      "n_members": (ft["n_members"] if "n_members" in ft.columns else ft["q"]).astype(int),
                      "n_nonmembers": (ft["n_nonmembers"] if "n_nonmembers" in ft.columns else ft["q"]).astype(int)})
    d = d.drop_duplicates().sort_values(["q", "n_members", "n_nonmembers"]).reset_index(drop=True)
    d["fp_allowed_at_1pct"] = [allowed_false_positives(0.01, n) for n in d["n_nonmembers"]]
    d["fp_allowed_at_10pct"] = [allowed_false_positives(0.10, n) for n in d["n_nonmembers"]]
    return d


def noop_manipulations(manipulation_auc: pd.DataFrame, results: pd.DataFrame | None = None, *,
                       tol: float = 1e-12) -> pd.DataFrame:
    """Manipulations that changed nothing for the audited model: per model, those whose per-manipulation
    AUC equals the ``base`` manipulation's at every fine-tuned checkpoint (e.g. position moves for a
    model that ignores row order, uniform row repetition for one that takes row multiplicities).

    Collapsed checkpoints are left out when others exist (a constant model makes every manipulation
    look alike). Columns: model, manipulation, category, n_checkpoints."""
    cols = ["model", "manipulation", "category", "n_checkpoints"]
    df = public_manipulation_auc(manipulation_auc)
    if df.empty or not {"run_id", "epoch", "manipulation", "auc"} <= set(df.columns):
        return pd.DataFrame(columns=cols)
    df = df[df["epoch"] > 0]
    if results is not None and not results.empty:
        info = fine_tuned_rows(results)
        info = info[[c for c in (*CHECKPOINT_ID, "model", "outcome") if c in info.columns]]
        info = info.drop_duplicates(list(CHECKPOINT_ID))
        df = df.merge(info, on=list(CHECKPOINT_ID), how="inner")
        if "outcome" in df.columns and (df["outcome"] != Outcome.COLLAPSE.value).any():
            df = df[df["outcome"] != Outcome.COLLAPSE.value]
    if "model" not in df.columns:
        df = df.assign(model="")
    base = df[df["manipulation"] == BASE_MANIPULATION][[*CHECKPOINT_ID, "auc"]].rename(columns={"auc": "_base"})
    if base.empty:
        return pd.DataFrame(columns=cols)
    others = df[df["manipulation"] != BASE_MANIPULATION].merge(base, on=list(CHECKPOINT_ID), how="inner")
    others["_same"] = (others["auc"].astype(float) - others["_base"].astype(float)).abs() <= tol
    if "category" not in others.columns:
        others["category"] = ""
    g = others.groupby(["model", "manipulation", "category"], sort=True)
    out = pd.DataFrame({"_all": g["_same"].all(), "n_checkpoints": g.size()}).reset_index()
    return out[out["_all"]].loc[:, cols].reset_index(drop=True)


def blind_baseline_summary(results: pd.DataFrame) -> dict[str, Any]:
    """Over the fine-tuned runs (one split each): how many, the blind AUC's median and range, how many are
    separable without the model (interval excluding 0.5) and how many use the paper's unmatched design."""
    ft = fine_tuned_rows(results)
    if ft.empty or "blind_auc" not in ft.columns:
        return {}
    runs = ft.drop_duplicates(run_key_columns(ft))
    aucs = runs["blind_auc"].astype(float).dropna()
    if aucs.empty:
        return {}
    separable = runs["blind_separable"].fillna(False).astype(bool) if "blind_separable" in runs.columns else None
    unmatched = (runs["label_design"] == "unmatched") if "label_design" in runs.columns else None
    not_exchangeable = (runs["exchangeable"].map(lambda v: v is False or v == 0) if "exchangeable" in runs.columns
                        else pd.Series(False, index=runs.index))
    return {"n_runs": int(len(aucs)), "median": float(aucs.median()), "low": float(aucs.min()),
            "high": float(aucs.max()), "n_separable": int(separable.sum()) if separable is not None else 0,
            "n_unmatched": int(unmatched.sum()) if unmatched is not None else 0,
            "n_not_exchangeable": int(not_exchangeable.sum())}
