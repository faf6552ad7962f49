"""The aggregator's reports: one pure pandas function per table or figure of the paper, and an HTML page.

Inputs live in a run directory (``RUN_DIR``) written by the sweep:

* ``results.parquet`` (required): one row per (run, checkpoint) with the outcome and metrics.
* ``split_report.parquet``, ``manipulation_auc.parquet``, ``roc/roc_<run_id>_e<epoch>.parquet`` and
  ``provenance.json`` (optional): a report section whose input is missing is skipped with a note.

Privacy: reports carry ids, metrics and configuration only, never a raw feature value or label. That is
enforced by construction, not by scrubbing: every reader keeps an explicit allow-list of columns
(:func:`public_results`, :func:`public_split_report`, ...), every report selects named columns, and
provenance is reduced to a fixed set of keys. A column or provenance field that is not on a list never
reaches a report, the HTML page or W&B.

Choices the method leaves open (``docs/METHOD.md``, "The outcome of a checkpoint" and "What each table is
computed from"):

* A checkpoint's AUC for peak selection is the highest calibrated AUC over the score kinds present
  (``auc_loss``, ``auc_entropy``, ``auc_confidence`` and the deciding kind's ``auc``), so the peak is
  "highest calibrated AUC over epochs and score kinds". The reported ``auc``/TPR columns stay those of the
  row's ``score_kind`` (the deciding kind); ``peak_auc``/``peak_kind`` are reported beside them.
* Epoch 0 is the base model: it is never a run's peak unless the run has no other checkpoint.
  Ties between checkpoints go to the earliest epoch.
* A run is keyed by ``(run_id, task)``: a ``multi_fixed`` run fine-tunes one model on several tasks and
  has one row per task and checkpoint.
* Run-level reports (rates per Q, Tabs. 8, 10–12, Fig. 6) use each run's peak checkpoint (its headline).
  By-epoch reports (Fig. 2) use every checkpoint; the share at an epoch is over the runs that have a
  checkpoint at that epoch (a diverged run stops contributing), or with ``cumulative=True`` the share of
  all runs flagged at any checkpoint up to that epoch.
* The main-regime reports default to ``regime="single_fixed"`` (the paper's main regime); pass ``None``
  to pool every regime. The realistic-regime comparison (Tab. 12) always spans all regimes.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from iclmem import runfolder as _runfolder
from iclmem.atomic import write_text_atomic
from iclmem.errors import DataError
from iclmem.provenance import PUBLIC_FIELDS
from iclmem.record import public_columns
from iclmem.runfolder import (
    FIGURES_DIR,
    LM_REPORT_FILE,
    MANIPULATION_AUC_FILE,
    REPORT_FILE,
    SPLIT_REPORT_FILE,
    SWEEP_FILE,
    RunStatus,
)
from iclmem.vocab import BASE_MODEL_ROW, Outcome, Regime, ScoreKind, VerdictRule, values
from iclmem.vocab import DETECTABLE as _DETECTABLE
from iclmem.vocab import MAIN_REGIME as _MAIN_REGIME
from orchestrator.config import SweepConfig
from orchestrator.run_folder import MANIPULATION_COLUMNS, SPLIT_COLUMNS, RunFolder
from probes.metrics import allowed_false_positives, clopper_pearson

OUTCOMES: tuple[str, ...] = values(Outcome)
REGIMES: tuple[str, ...] = values(Regime)
SCORE_KINDS: tuple[str, ...] = values(ScoreKind)
MAIN_REGIME: str = _MAIN_REGIME.value
DETECTABLE: str = _DETECTABLE.value
RUN_KEY: tuple[str, ...] = ("run_id", "task")
# Grid axes that change what a run is (not just its noise): figures and by-epoch tables split by every one
# of them that varies rather than pooling, e.g. normal against shuffled member labels. Seeds are
# replicates and may be averaged, which the page then says.
FACET_AXES: tuple[str, ...] = ("model", "regime", "label_mode", "dp_target_epsilon")


# --------------------------------------------------------------------------------------------------
# Allow-lists: the only columns / fields any report, page or logger ever sees.
# --------------------------------------------------------------------------------------------------

# The results row's columns, their meanings and which may leave the cluster are declared once, in
# iclmem.record; the split and manipulation tables are the report's own.
def public_results(results: pd.DataFrame) -> pd.DataFrame:
    """The results table reduced to allow-listed columns (ids, config, metrics, verdicts)."""
    return results.loc[:, public_columns(results.columns)].copy()


def public_split_report(split: pd.DataFrame) -> pd.DataFrame:
    return split.loc[:, [c for c in SPLIT_COLUMNS if c in split.columns]].copy()


def public_manipulation_auc(manip: pd.DataFrame) -> pd.DataFrame:
    return manip.loc[:, [c for c in MANIPULATION_COLUMNS if c in manip.columns]].copy()


# --------------------------------------------------------------------------------------------------
# Readers (tolerant: optional inputs give None)
# --------------------------------------------------------------------------------------------------


def load_results(run_dir: str | Path) -> pd.DataFrame:
    """``RUN_DIR/results.parquet`` reduced to its public columns (:meth:`RunFolder.results`)."""
    return RunFolder(run_dir).results()


def load_split_report(run_dir: str | Path) -> pd.DataFrame | None:
    return RunFolder(run_dir).split_report()


def load_manipulation_auc(run_dir: str | Path) -> pd.DataFrame | None:
    return RunFolder(run_dir).manipulation_auc()


def load_provenance(run_dir: str | Path) -> dict[str, Any]:
    """The public fields of the run's provenance record (``{}`` when the folder has none)."""
    return RunFolder(run_dir).public_provenance()


def list_roc_files(run_dir: str | Path) -> pd.DataFrame:
    """Columns run_id, epoch, path for every ``roc/roc_<run_id>_e<epoch>.parquet`` present."""
    return RunFolder(run_dir).roc_files()


def load_roc(run_dir: str | Path, run_id: str, epoch: int) -> pd.DataFrame | None:
    return RunFolder(run_dir).roc(run_id, epoch)


# --------------------------------------------------------------------------------------------------
# Checkpoint and run selection
# --------------------------------------------------------------------------------------------------


def competing_kinds(df: pd.DataFrame) -> tuple[str, ...]:
    """The score kinds that compete for a checkpoint's maximum signal, as the sweep's ``outcome.score_kinds``
    recorded them (``threshold_score_kinds``); every kind for results that predate the setting."""
    if "threshold_score_kinds" in df.columns:
        recorded = {k for v in df["threshold_score_kinds"].dropna().unique() for k in str(v).split(",") if k}
        kinds = tuple(k for k in SCORE_KINDS if k in recorded)
        if kinds:
            return kinds
    return SCORE_KINDS


def _kind_auc_columns(df: pd.DataFrame) -> list[str]:
    return [f"auc_{k}" for k in competing_kinds(df) if f"auc_{k}" in df.columns]


def checkpoint_auc(df: pd.DataFrame) -> pd.Series:
    """Highest calibrated AUC of each checkpoint over the competing score kinds present (NaN-safe)."""
    cols = _kind_auc_columns(df) + (["auc"] if "auc" in df.columns and not _kind_auc_columns(df) else [])
    if not cols:
        raise DataError("results have no calibrated AUC column (auc or auc_<kind>)")
    return df[cols].astype(float).max(axis=1, skipna=True)


def checkpoint_kind(df: pd.DataFrame) -> pd.Series:
    """The score kind that gives :func:`checkpoint_auc` (the deciding ``score_kind`` when it ties)."""
    cols = _kind_auc_columns(df)
    best = checkpoint_auc(df)
    fallback = (df["score_kind"].astype(object) if "score_kind" in df.columns
                else pd.Series(None, index=df.index, dtype=object))
    if not cols:
        return fallback
    out = fallback.copy()
    vals = df[cols].astype(float)
    for i in df.index:
        sk = fallback.get(i)
        row = vals.loc[i]
        if isinstance(sk, str) and f"auc_{sk}" in cols and row[f"auc_{sk}"] == best[i]:
            continue
        if "auc" in df.columns and isinstance(sk, str) and df.at[i, "auc"] == best[i]:
            continue
        if row.notna().any():
            out[i] = str(row.idxmax())[len("auc_"):]
    return out


def _filter_regime(results: pd.DataFrame, regime: str | None) -> pd.DataFrame:
    if regime is None or "regime" not in results.columns:
        return results
    return results[results["regime"] == regime]


def _run_key(df: pd.DataFrame) -> list[str]:
    return [c for c in RUN_KEY if c in df.columns]


def peak_checkpoints(results: pd.DataFrame, *, regime: str | None = None) -> pd.DataFrame:
    """One row per run: its peak checkpoint (highest calibrated AUC over epochs and score kinds).

    Adds ``peak_auc``, ``peak_kind``, ``n_checkpoints`` and ``last_epoch``. The base checkpoint (epoch 0)
    is a candidate only for runs without any other; ties go to the earliest epoch.
    """
    df = _filter_regime(results, regime).copy()
    if df.empty:
        return df.assign(peak_auc=pd.Series(dtype=float), peak_kind=pd.Series(dtype=object),
                         n_checkpoints=pd.Series(dtype=int), last_epoch=pd.Series(dtype=int))
    key = _run_key(df)
    df["peak_auc"] = checkpoint_auc(df)
    df["peak_kind"] = checkpoint_kind(df)
    grp = df.groupby(key, sort=False, dropna=False)
    df["n_checkpoints"] = grp["epoch"].transform("size")
    df["last_epoch"] = grp["epoch"].transform("max")
    has_trained = grp["epoch"].transform(lambda e: bool((e > 0).any()))
    df["_demote"] = (df["epoch"] == 0) & has_trained
    df["_neg_auc"] = -df["peak_auc"].fillna(-np.inf)
    df = df.sort_values(key + ["_demote", "_neg_auc", "epoch"], kind="mergesort")
    peaks = df.drop_duplicates(subset=key, keep="first").drop(columns=["_demote", "_neg_auc"])
    return peaks.reset_index(drop=True)


def last_checkpoints(results: pd.DataFrame, *, regime: str | None = None) -> pd.DataFrame:
    df = _filter_regime(results, regime)
    key = _run_key(df)
    return df.sort_values(key + ["epoch"], kind="mergesort").drop_duplicates(key, keep="last").reset_index(drop=True)


def _outcome_order(values: Iterable[str]) -> list[str]:
    extra = sorted({str(v) for v in values if pd.notna(v)} - set(OUTCOMES))
    return list(OUTCOMES) + extra


def _headline(results: pd.DataFrame, at: str, regime: str | None) -> pd.DataFrame:
    if at == "peak":
        return peak_checkpoints(results, regime=regime)
    if at == "last":
        return last_checkpoints(results, regime=regime)
    raise ValueError(f"at must be 'peak' or 'last', not {at!r}")


# --------------------------------------------------------------------------------------------------
# Verdict rule and its measured error rate (null splits)
# --------------------------------------------------------------------------------------------------

ERROR_RATE_LEVELS: tuple[str, ...] = ("checkpoint", "run_headline")


def _fine_tuned_rows(results: pd.DataFrame) -> pd.DataFrame:
    df = results
    if "epoch" in df.columns:
        df = df[df["epoch"] > 0]
    if "regime" in df.columns:
        df = df[df["regime"] != BASE_MODEL_ROW]
    return df


def null_records(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (checkpoint, null split) of the fine-tuned checkpoints: the run key, epoch, null split
    index, its calibrated AUC per score kind and its verdict per rule (from ``null_evidence``)."""
    df = _fine_tuned_rows(results)
    if "null_evidence" not in df.columns:
        return pd.DataFrame()
    key = _run_key(df)
    rows = []
    for _, r in df.iterrows():
        raw = r["null_evidence"]
        if not isinstance(raw, str):
            continue
        for rec in json.loads(raw):
            rows.append({**{k: r[k] for k in key}, "epoch": int(r["epoch"]), "null_index": int(rec["index"]),
                         **{k: v for k, v in rec.items() if k != "index"}})
    return pd.DataFrame(rows)


def null_error_rates(results: pd.DataFrame, *, confidence: float = 0.95) -> pd.DataFrame:
    """Empirical false-positive rate of every verdict rule on the null splits, with Clopper-Pearson intervals.

    Each level also comes ``_non_collapsed``: over the trials whose verdict under that rule is not collapse
    (a collapsed checkpoint's null trials cannot be false positives, so counting them dilutes the rate).

    A null split labels two disjoint sets of never-trained rows member / non-member, so a memorization
    verdict on it is a false positive by construction. ``checkpoint`` level: one trial per (fine-tuned
    checkpoint, null split). ``run_headline`` level: one trial per (run, null split index): the run's
    headline is picked on the null split exactly as on the real split (the checkpoint with the highest
    calibrated AUC over epochs and the competing score kinds, ties to the earliest epoch) and its verdict
    counts. Trials of one checkpoint share the model and may share rows, so they are not independent: the
    interval is the binomial one, exact only for independent trials."""
    recs = null_records(results)
    columns = ["rule", "level", "n_null", "n_memorization", "fpr", "fpr_low", "fpr_high"]
    if recs.empty:
        return pd.DataFrame(columns=columns)
    kinds = [f"auc_{k}" for k in competing_kinds(results) if f"auc_{k}" in recs.columns]
    recs["_auc"] = recs[kinds].astype(float).max(axis=1)
    key = [c for c in RUN_KEY if c in recs.columns] + ["null_index"]
    heads = (recs.assign(_neg=-recs["_auc"].fillna(-np.inf))
             .sort_values(key + ["_neg", "epoch"], kind="mergesort").drop_duplicates(key, keep="first"))
    rows = []
    for rule in VerdictRule:
        col = f"outcome_{rule.value}"
        if col not in recs.columns:
            continue
        # a null trial on a collapsed checkpoint is a collapse whatever its AUC, so it can never be a false
        # positive: the rate over the trials that could be is given beside the rate over all
        live, heads_live = recs[recs[col] != Outcome.COLLAPSE.value], heads[heads[col] != Outcome.COLLAPSE.value]
        for level, d in (("checkpoint", recs), ("run_headline", heads), ("checkpoint_non_collapsed", live),
                         ("run_headline_non_collapsed", heads_live)):
            k, n = int((d[col] == DETECTABLE).sum()), int(len(d))
            iv = clopper_pearson(k, n, confidence)
            rows.append({"rule": rule.value, "level": level, "n_null": n, "n_memorization": k,
                         "fpr": k / n if n else float("nan"), "fpr_low": iv.low, "fpr_high": iv.high})
    return pd.DataFrame(rows, columns=columns)


def verdict_rule_summary(results: pd.DataFrame) -> dict[str, Any]:
    """The rule the sweep's ``outcome`` column uses and its thresholds, as recorded in the results."""
    out: dict[str, Any] = {}
    if results.empty:
        return out
    first = results.iloc[0]
    out["rule"] = first.get("rule", "paper")
    for c in results.columns:
        if c.startswith("threshold_"):
            out[c[len("threshold_"):]] = first[c]
    if "p_value_threshold" in results.columns:
        ft = _fine_tuned_rows(results)
        if not ft.empty:
            out["p_value_threshold"] = float(ft["p_value_threshold"].iloc[0])
            out["family_size"] = int(ft["n_checkpoints_in_family"].iloc[0]) * len(competing_kinds(results))
    return out


# --------------------------------------------------------------------------------------------------
# The sweep as configured: its rule and thresholds, its checkpoint schedule, what is stored of it
# --------------------------------------------------------------------------------------------------

# The run folder's state record (iclmem.runfolder.RUN_STATE_FILE, written by the sweep driver): a driver
# stopped by Ctrl-C leaves ``status: interrupted`` there (see ``was_interrupted``).
STATE_FILE: str = _runfolder.RUN_STATE_FILE
BASE_MANIPULATION = "base"  # the unmanipulated multiple-choice context every other manipulation varies


def was_interrupted(run_dir: str | Path) -> bool:
    """Whether the sweep was stopped before it finished (:attr:`RunFolder.interrupted`)."""
    return RunFolder(run_dir).interrupted


def checkpoint_schedule(sweep: SweepConfig | None) -> tuple[int, ...] | None:
    """The epochs every fine-tuning run of ``sweep`` writes a checkpoint at (``training.epochs``,
    ``checkpoint_epochs``, ``every_epoch``), or None without a sweep record."""
    if sweep is None:
        return None
    from trainables.finetune import FinetuneSpec  # the schedule's one definition (the trainable's own)

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
    from orchestrator.config import expand_grid

    out: dict[str, int] = {}
    for t in expand_grid(sweep):
        out[str(t.regime)] = out.get(str(t.regime), 0) + len(t.task.split("+"))
    return out


def missing_runs(results: pd.DataFrame, sweep: SweepConfig | None) -> dict[str, tuple[int, int]]:
    """Regimes with scheduled runs that have no stored fine-tuned checkpoint at all (e.g. never started
    before an interruption): regime -> (missing, scheduled)."""
    scheduled = scheduled_runs_per_regime(sweep)
    if not scheduled:
        return {}
    ft = _fine_tuned_rows(results)
    key = _run_key(ft)
    stored = ft.drop_duplicates(key)["regime"].value_counts() if "regime" in ft.columns else pd.Series(dtype=int)
    return {r: (n - int(stored.get(r, 0)), n) for r, n in scheduled.items() if int(stored.get(r, 0)) < n}


def run_completeness(results: pd.DataFrame, schedule: tuple[int, ...] | None, *,
                     interrupted: bool = False) -> pd.DataFrame:
    """One row per fine-tuned run (``run_id``, ``task``): ``n_stored`` checkpoints of ``n_scheduled``,
    ``last_epoch`` and ``status``: ``complete``, ``incomplete`` (fewer stored than scheduled),
    ``interrupted`` (incomplete, and the sweep was stopped), ``diverged`` (stopped by a NaN loss: a
    result, not a gap), or ``unknown`` (no schedule to compare with)."""
    ft = _fine_tuned_rows(results)
    key = _run_key(ft)
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
        elif "diverged" in g.columns and g["diverged"].fillna(False).astype(bool).any():
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
    peaks = peak_checkpoints(_fine_tuned_rows(results), regime=None)
    if peaks.empty:
        return "no fine-tuned run has a stored checkpoint", 0
    counts = peaks["outcome"].value_counts()
    parts = [f"{int(counts[o])} {o}" for o in _outcome_order(peaks["outcome"]) if counts.get(o, 0)]
    return f"{', '.join(parts)} of {len(peaks)} run{'s' if len(peaks) != 1 else ''}", len(peaks)


def sample_sizes(results: pd.DataFrame) -> pd.DataFrame:
    """What each AUC compares: per Q, the members and non-members a checkpoint is probed on (from the
    results' ``n_members`` / ``n_nonmembers``; Stage I draws Q of each), and the false positives
    TPR@1% and TPR@10% allow (⌊α·n⌋ of n non-members)."""
    ft = _fine_tuned_rows(results)
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
        info = _fine_tuned_rows(results)
        info = info[[c for c in ("run_id", "epoch", "model", "outcome") if c in info.columns]]
        info = info.drop_duplicates(["run_id", "epoch"])
        df = df.merge(info, on=["run_id", "epoch"], how="inner")
        if "outcome" in df.columns and (df["outcome"] != Outcome.COLLAPSE.value).any():
            df = df[df["outcome"] != Outcome.COLLAPSE.value]
    if "model" not in df.columns:
        df = df.assign(model="")
    base = df[df["manipulation"] == BASE_MANIPULATION][["run_id", "epoch", "auc"]].rename(columns={"auc": "_base"})
    if base.empty:
        return pd.DataFrame(columns=cols)
    others = df[df["manipulation"] != BASE_MANIPULATION].merge(base, on=["run_id", "epoch"], how="inner")
    others["_same"] = (others["auc"].astype(float) - others["_base"].astype(float)).abs() <= tol
    if "category" not in others.columns:
        others["category"] = ""
    g = others.groupby(["model", "manipulation", "category"], sort=True)
    out = pd.DataFrame({"_all": g["_same"].all(), "n_checkpoints": g.size()}).reset_index()
    return out[out["_all"]].loc[:, cols].reset_index(drop=True)


# --------------------------------------------------------------------------------------------------
# Paper reports
# --------------------------------------------------------------------------------------------------


def outcome_counts_per_q(
    results: pd.DataFrame, *, regime: str | None = MAIN_REGIME, at: Literal["peak", "last"] = "peak",
    by: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Runs per outcome for each Q (index ``q``; columns ``n_runs`` then one per outcome). With ``by``
    (e.g. ``("label_mode",)``) the index is (*by, q): runs of different label modes, models or DP ε are
    counted apart, never pooled into one rate."""
    runs = _headline(results, at, regime)
    outcomes = _outcome_order(runs["outcome"]) if not runs.empty else list(OUTCOMES)
    by = tuple(c for c in by if c in runs.columns)
    index = [runs[c] for c in by] + [runs["q"]]
    table = pd.crosstab(index, runs["outcome"]).reindex(columns=outcomes, fill_value=0)
    table.columns.name = None
    table.insert(0, "n_runs", table.sum(axis=1))
    return table.sort_index().astype(int)


def outcome_rates_per_q(
    results: pd.DataFrame, *, regime: str | None = MAIN_REGIME, at: Literal["peak", "last"] = "peak",
    by: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Share of runs per outcome for each Q (rows sum to 1), with ``n_runs``; ``by`` as in
    :func:`outcome_counts_per_q`."""
    counts = outcome_counts_per_q(results, regime=regime, at=at, by=by)
    rates = counts.drop(columns="n_runs").div(counts["n_runs"].replace(0, np.nan), axis=0)
    rates.insert(0, "n_runs", counts["n_runs"])
    return rates


TASK_TABLE_COLUMNS = (
    "task", "q", "lr", "model", "regime", "label_mode", "seed", "run_id", "outcome",
    *(f"outcome_{r}" for r in values(VerdictRule)), "auc", "auc_low",
    "auc_high", "p_value", "blind_auc", "tpr_at_1pct", "tpr_at_10pct", "n_members", "n_nonmembers", "loss_ratio",
    "known_context_auc", "epoch", "score_kind", "peak_auc", "peak_kind",
)


def task_lr_q_table(results: pd.DataFrame, *, regime: str | None = MAIN_REGIME) -> pd.DataFrame:
    """Tabs. 10–11: per run (task × lr × Q [× model, label mode, seed]) at its peak checkpoint."""
    peaks = peak_checkpoints(results, regime=regime)
    cols = [c for c in TASK_TABLE_COLUMNS if c in peaks.columns]
    order = [c for c in ("task", "q", "lr", "model", "label_mode", "seed", "run_id") if c in peaks.columns]
    return peaks.loc[:, cols].sort_values(order, kind="mergesort").reset_index(drop=True)


def detectable_share_by_epoch(
    results: pd.DataFrame, *, regime: str | None = MAIN_REGIME, cumulative: bool = False,
    by: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Fig. 2: share of runs whose checkpoint is flagged ``memorization``, per (Q, epoch), and per value of
    each column in ``by`` (e.g. ``label_mode``: shares of different label modes are never pooled then)."""
    df = _filter_regime(results, regime).copy()
    key = _run_key(df)
    by = tuple(c for c in by if c in df.columns)
    df["_flag"] = df["outcome"] == DETECTABLE
    rows = []
    for group, dq in df.groupby([*by, "q"], sort=True):
        group = group if isinstance(group, tuple) else (group,)
        extra, q = dict(zip(by, group[:-1])), group[-1]
        epochs = sorted(dq["epoch"].unique())
        n_all = dq.drop_duplicates(key).shape[0]
        for e in epochs:
            if cumulative:
                upto = dq[dq["epoch"] <= e]
                flagged = upto[upto["_flag"]].drop_duplicates(key).shape[0]
                n = n_all
            else:
                at = dq[dq["epoch"] == e]
                n = at.drop_duplicates(key).shape[0]
                flagged = at[at["_flag"]].drop_duplicates(key).shape[0]
            rows.append({**extra, "q": q, "epoch": int(e), "n_runs": int(n), "n_detectable": int(flagged),
                         "share": flagged / n if n else np.nan})
    return pd.DataFrame(rows, columns=[*by, "q", "epoch", "n_runs", "n_detectable", "share"])


def peak_vulnerability_per_task(results: pd.DataFrame, *, regime: str | None = MAIN_REGIME,
                                by: tuple[str, ...] = ()) -> pd.DataFrame:
    """Tab. 8: per task, the run/checkpoint with the highest calibrated AUC, and the detectable share.

    ``detectable_share`` = share of the task's runs whose peak checkpoint is flagged memorization. With
    ``by`` (e.g. ``("label_mode",)``) one row per task and value of those columns: a planted label mode's
    runs never raise a normal one's share.
    """
    peaks = peak_checkpoints(results, regime=regime)
    by = tuple(c for c in by if c in peaks.columns)
    rows = []
    for group, d in peaks.groupby(["task", *by], sort=True):
        group = group if isinstance(group, tuple) else (group,)
        best = d.sort_values(["peak_auc", "epoch"], ascending=[False, True], kind="mergesort",
                             na_position="last").iloc[0]
        n_mem = int((d["outcome"] == DETECTABLE).sum())
        row = {**dict(zip(("task", *by), group)), "n_runs": len(d), "n_memorization": n_mem,
               "detectable_share": n_mem / len(d), "peak_auc": best["peak_auc"], "peak_kind": best.get("peak_kind")}
        for c in ("auc_low", "auc_high", "tpr_at_1pct", "tpr_at_10pct", "outcome", "lr", "q", "epoch", "run_id"):
            if c in d.columns:
                row[c] = best[c]
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    null_peaks = null_peak_auc_per_task(results, regime=regime, by=by)
    if not null_peaks.empty:
        out = out.merge(null_peaks, on=["task", *by], how="left")
    return out.sort_values(["peak_auc", "task", *by], ascending=[False, True, *([True] * len(by))],
                           kind="mergesort").reset_index(drop=True)


def null_peak_auc_per_task(results: pd.DataFrame, *, regime: str | None = MAIN_REGIME,
                           by: tuple[str, ...] = ()) -> pd.DataFrame:
    """The null counterpart of each task's peak AUC: the same maximum (over the task's runs, epochs and
    competing score kinds) taken on null split j instead of the real split, for every null split index j;
    ``null_peak_auc`` is its 95th percentile over j (with one null split per checkpoint, that one maximum),
    ``null_peak_n`` the number of indices. A peak AUC below it is what chance reaches with that much
    selection, so "peak AUC 0.67" is read against it rather than against 0.5."""
    scoped = _filter_regime(results, regime)
    recs = null_records(scoped)
    if recs.empty:
        return pd.DataFrame()
    kinds = [f"auc_{k}" for k in competing_kinds(results) if f"auc_{k}" in recs.columns]
    if not kinds:
        return pd.DataFrame()
    by = tuple(c for c in by if c in scoped.columns)
    missing = [c for c in by if c not in recs.columns]
    if missing:  # the grid axes a run is split by come from its rows
        key = [c for c in _run_key(scoped) if c in recs.columns]
        recs = recs.merge(scoped[key + missing].drop_duplicates(key), on=key, how="left")
    recs["_auc"] = recs[kinds].astype(float).max(axis=1)
    per_index = recs.groupby(["task", *by, "null_index"], sort=True)["_auc"].max().reset_index()
    rows = []
    for group, d in per_index.groupby(["task", *by], sort=True):
        group = group if isinstance(group, tuple) else (group,)
        rows.append({**dict(zip(("task", *by), group)), "null_peak_auc": float(np.percentile(d["_auc"], 95)),
                     "null_peak_n": int(len(d))})
    return pd.DataFrame(rows)


def split_validation(split_report: pd.DataFrame, *, tvd_max: float = 0.05, ks_max: float = 0.05) -> pd.DataFrame:
    """Tab. 6: member vs non-member distribution checks, one row per (task, label mode, seed, Q).

    ``statistic`` names the check that applies (TVD for classification, KS for regression) and
    ``passed`` whether it is under its threshold.
    """
    df = public_split_report(split_report)
    tvd = df["tvd"].astype(float) if "tvd" in df.columns else pd.Series(np.nan, index=df.index)
    ks = df["ks"].astype(float) if "ks" in df.columns else pd.Series(np.nan, index=df.index)
    df["statistic"] = np.where(tvd.notna(), "tvd", np.where(ks.notna(), "ks", "none"))
    df["passed"] = np.where(tvd.notna(), tvd < tvd_max, np.where(ks.notna(), ks < ks_max, False))
    order = [c for c in ("task", "label_mode", "seed", "q") if c in df.columns]
    return df.sort_values(order, kind="mergesort").reset_index(drop=True)


def calibration_impact(
    results: pd.DataFrame, *, regime: str | None = MAIN_REGIME, level: Literal["checkpoint", "run"] = "checkpoint",
    include_base: bool = False,
) -> pd.DataFrame:
    """App. 7.4: memorization flags with and without difficulty calibration, per Q and overall.

    Both flags apply the same memorization rule (the sweep's, over the same competing score kinds): the
    calibrated flag to ΔS = S - S_ref (``calibrated_memorization_flag``), the raw flag to S alone
    (``raw_memorization_flag``). Collapsed checkpoints are left out (the paper compares over non-collapsed
    checkpoints: collapse takes precedence, so a collapsed checkpoint would count as a raw-only flag).
    ``level="run"`` counts a run as flagged if any of its checkpoints is. Also the mean AUC of the
    calibrated, uncalibrated and reference-only scores (of each row's headline kind).
    """
    df = _filter_regime(results, regime).copy()
    if not include_base:
        df = _fine_tuned_rows(df)
    if "raw_memorization_flag" in df.columns:
        raw, cal = df["raw_memorization_flag"].astype(bool), df["calibrated_memorization_flag"].astype(bool)
    elif "raw_outcome" in df.columns:  # results that predate the flags
        raw, cal = df["raw_outcome"] == DETECTABLE, df["outcome"] == DETECTABLE
    else:
        raise DataError("results have no raw_memorization_flag or raw_outcome column: calibration impact needs it")
    df["_raw"], df["_cal"] = raw, cal
    df = df[df["outcome"] != Outcome.COLLAPSE.value]
    key = _run_key(df)
    if level == "run":
        agg = {"_cal": "any", "_raw": "any", "q": "first"}
        for c in ("auc", "raw_auc", "ref_auc"):
            if c in df.columns:
                agg[c] = "max"
        df = df.groupby(key, sort=False).agg(agg).reset_index()
    elif level != "checkpoint":
        raise ValueError(f"level must be 'checkpoint' or 'run', not {level!r}")

    def summarise(d: pd.DataFrame) -> dict[str, Any]:
        row = {"n": len(d), "calibrated_flags": int(d["_cal"].sum()), "raw_flags": int(d["_raw"].sum()),
               "both": int((d["_cal"] & d["_raw"]).sum()), "calibrated_only": int((d["_cal"] & ~d["_raw"]).sum()),
               "raw_only": int((~d["_cal"] & d["_raw"]).sum())}
        for c in ("auc", "raw_auc", "ref_auc"):
            row[f"mean_{c}"] = float(d[c].mean()) if c in d.columns else np.nan
        return row

    rows = [{"q": str(q), **summarise(d)} for q, d in df.groupby("q", sort=True)]
    rows.append({"q": "all", **summarise(df)})
    return pd.DataFrame(rows).set_index("q")


def perturbation_ranking(
    manipulation_auc: pd.DataFrame, *, results: pd.DataFrame | None = None, at_peak: bool = False,
    include_base: bool = False, by: Literal["manipulation", "category"] = "manipulation",
) -> pd.DataFrame:
    """App. 7.3: manipulations (or categories) ranked by mean per-manipulation AUC (rank 1 = highest).

    ``at_peak`` keeps only each run's peak checkpoint (needs ``results``); otherwise every checkpoint
    except the base model (epoch 0) unless ``include_base``.
    """
    df = public_manipulation_auc(manipulation_auc)
    if not include_base and "epoch" in df.columns:
        df = df[df["epoch"] > 0]
    if at_peak:
        if results is None:
            raise ValueError("at_peak=True needs the results table")
        peaks = peak_checkpoints(results, regime=None)[["run_id", "epoch"]].drop_duplicates()
        df = df.merge(peaks, on=["run_id", "epoch"], how="inner")
    if by == "manipulation":
        keys = ["manipulation"] + (["category"] if "category" in df.columns else [])
    elif by == "category":
        keys = ["category"]
    else:
        raise ValueError(f"by must be 'manipulation' or 'category', not {by!r}")
    g = df.groupby(keys, sort=False)["auc"]
    out = pd.DataFrame({"mean_auc": g.mean(), "std_auc": g.std(ddof=1), "median_auc": g.median(), "n": g.size()})
    out = out.reset_index().sort_values(["mean_auc", keys[0]], ascending=[False, True], kind="mergesort")
    out.insert(0, "rank", np.arange(1, len(out) + 1))
    return out.reset_index(drop=True)


def perturbation_effectiveness(
    manipulation_auc: pd.DataFrame, results: pd.DataFrame, *, by: Literal["manipulation", "category"] = "manipulation",
) -> pd.DataFrame:
    """App. 7.3: over the checkpoints with detectable memorization only (``outcome == memorization``), each
    manipulation's AUC (calibrated loss) on its own minus the AUC of the unmanipulated multiple-choice
    context (the ``base`` manipulation) at the same checkpoint: how much a manipulation exposes members
    beyond the plain probe. Manipulations (or categories) ranked by the mean of that Δ (rank 1 = the one
    that exposes members best). A checkpoint whose suite has no ``base`` manipulation is compared with its
    overall AUC(ΔS) instead (``auc_loss``); ``mean_delta_auc_vs_suite`` gives that comparison for every
    row, and ``reference`` says which one ``mean_delta_auc`` used. Empty when no checkpoint is flagged."""
    cols = ["rank", by, "mean_delta_auc", "std_delta_auc", "mean_delta_auc_vs_suite", "mean_auc", "n", "reference"]
    df = public_manipulation_auc(manipulation_auc)
    if df.empty or results.empty or "auc_loss" not in results.columns:
        return pd.DataFrame(columns=cols)
    flagged = _fine_tuned_rows(results)
    flagged = flagged[flagged["outcome"] == DETECTABLE][["run_id", "epoch", "auc_loss"]].drop_duplicates(["run_id", "epoch"])
    df = df.merge(flagged, on=["run_id", "epoch"], how="inner")
    if df.empty:
        return pd.DataFrame(columns=cols)
    if by not in ("manipulation", "category"):
        raise ValueError(f"by must be 'manipulation' or 'category', not {by!r}")
    base = (df[df["manipulation"] == BASE_MANIPULATION][["run_id", "epoch", "auc"]]
            .drop_duplicates(["run_id", "epoch"]).rename(columns={"auc": "_base_auc"}))
    df = df.merge(base, on=["run_id", "epoch"], how="left")
    df["delta_auc_vs_suite"] = df["auc"] - df["auc_loss"]
    df["delta_auc"] = (df["auc"] - df["_base_auc"]).where(df["_base_auc"].notna(), df["delta_auc_vs_suite"])
    df["_reference"] = np.where(df["_base_auc"].notna(), BASE_MANIPULATION, "overall")
    keys = ["manipulation", "category"] if by == "manipulation" and "category" in df.columns else [by]
    g = df.groupby(keys, sort=False)
    out = pd.DataFrame({"mean_delta_auc": g["delta_auc"].mean(), "std_delta_auc": g["delta_auc"].std(ddof=1),
                        "mean_delta_auc_vs_suite": g["delta_auc_vs_suite"].mean(),
                        "mean_auc": g["auc"].mean(), "n": g.size(),
                        "reference": g["_reference"].agg(lambda v: "+".join(sorted(set(v))))}).reset_index()
    out = out.sort_values(["mean_delta_auc", keys[0]], ascending=[False, True], kind="mergesort")
    out.insert(0, "rank", np.arange(1, len(out) + 1))
    return out.reset_index(drop=True)


def task_characteristics(
    results: pd.DataFrame, split_report: pd.DataFrame, *, regime: str | None = MAIN_REGIME
) -> pd.DataFrame:
    """Fig. 6: per task, cardinality / majority-class share / size / numeric share against outcomes.

    Characteristics are the median over the task's split reports (they do not depend on the split);
    outcome shares are over the task's runs at their peak checkpoints.
    """
    split = public_split_report(split_report)
    chars = [c for c in ("n_classes", "majority_share", "n_rows", "numeric_share") if c in split.columns]
    ch = split.groupby("task")[chars].median()
    peaks = peak_checkpoints(results, regime=regime)
    outcomes = _outcome_order(peaks["outcome"]) if not peaks.empty else list(OUTCOMES)
    rates = pd.crosstab(peaks["task"], peaks["outcome"], normalize="index").reindex(columns=outcomes, fill_value=0.0)
    rates.columns = [f"{o}_share" for o in rates.columns]
    per = peaks.groupby("task").agg(n_runs=("outcome", "size"), max_peak_auc=("peak_auc", "max"))
    out = ch.join(per, how="inner").join(rates, how="left")
    if "n_classes" in out.columns:
        out["n_classes"] = out["n_classes"].round().astype(int)
    out.index.name = "task"
    return out.reset_index().sort_values(["memorization_share", "task"], ascending=[False, True],
                                         kind="mergesort").reset_index(drop=True)


def regime_comparison(results: pd.DataFrame, *, by_task: bool = False) -> pd.DataFrame:
    """Tab. 12: single_fixed vs multi_fixed vs multi_random, per (regime[, task], Q) at peak checkpoints."""
    peaks = peak_checkpoints(results, regime=None)
    if "regime" not in peaks.columns:
        peaks = peaks.assign(regime=MAIN_REGIME)
    keys = ["regime"] + (["task"] if by_task else []) + ["q"]
    outcomes = _outcome_order(peaks["outcome"]) if not peaks.empty else list(OUTCOMES)
    rows = []
    for k, d in peaks.groupby(keys, sort=False):
        row = dict(zip(keys, k if isinstance(k, tuple) else (k,)))
        row["n_runs"] = len(d)
        for o in outcomes:
            row[f"{o}_rate"] = float((d["outcome"] == o).mean())
        row["mean_peak_auc"] = float(d["peak_auc"].mean())
        row["max_peak_auc"] = float(d["peak_auc"].max())
        for c in ("tpr_at_1pct", "tpr_at_10pct"):
            if c in d.columns:
                row[f"max_{c}"] = float(d[c].max())
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    rank = {r: i for i, r in enumerate(REGIMES)}
    out["_r"] = out["regime"].map(lambda r: rank.get(r, len(REGIMES)))
    return out.sort_values(["_r"] + keys, kind="mergesort").drop(columns="_r").reset_index(drop=True)


# --------------------------------------------------------------------------------------------------
# HTML page
# --------------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em;color:#222;max-width:1400px}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table.data{border-collapse:collapse;font-size:13px;margin:.5em 0}
table.data th,table.data td{border:1px solid #ddd;padding:3px 7px;text-align:right}
table.data th{background:#f3f3f3} table.data tr:nth-child(even) td{background:#fafafa}
.note{color:#8a5a00;background:#fff7e0;border-left:4px solid #f0b400;padding:.4em .8em}
.scroll{overflow-x:auto;max-width:100%}
.caption{color:#555;font-size:13px} figure{margin:1em 0} figure img{max-width:100%;border:1px solid #eee}
dl.prov{display:grid;grid-template-columns:max-content auto;gap:2px 12px;font-size:13px}
dl.prov dt{font-weight:600} dl.prov dd{margin:0;font-family:monospace}
#summary{background:#f6f8fb;border:1px solid #d8dee8;padding:.2em 1.2em 1em}
p.verdict{font-size:18px} .warn{color:#9a2a00} table.data td.text{text-align:left;white-space:normal}
dl.defs dt{font-weight:600;margin-top:.5em} dl.defs dd{margin:0 0 0 1.5em;max-width:70em}
"""

# Sets data-img-total / data-img-loaded on <body> once every image has loaded (or failed), and each image's
# decoded size as data-size, so a headless browser can check that the page is complete and what it drew
# (`chromium --dump-dom`).
_IMG_CHECK_JS = """
window.addEventListener('load', function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) {
    imgs[i].setAttribute('data-size', imgs[i].naturalWidth + 'x' + imgs[i].naturalHeight);
    if (imgs[i].complete && imgs[i].naturalWidth > 0) { ok++; imgs[i].setAttribute('data-loaded', '1'); }
    else { imgs[i].setAttribute('data-loaded', '0'); }
  }
  document.body.setAttribute('data-img-total', String(imgs.length));
  document.body.setAttribute('data-img-loaded', String(ok));
});
"""


def _fmt_value(col: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        if col == "lr" or col.endswith("_pvalue") or col.endswith("p_value"):  # a p of 2e-7 must not read 0.000
            return f"{float(v):.3g}"
        if float(v).is_integer() and col in ("q", "seed", "epoch", "n_rows", "n_classes"):
            return str(int(v))
        return f"{float(v):.3f}"
    return str(v)


def df_to_html(df: pd.DataFrame, *, index: bool = False) -> str:
    """A small, escaped HTML table (floats to 3 decimals, learning rates in %g)."""
    d = df.reset_index() if index else df
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in d.columns)
    body = []
    for row in d.itertuples(index=False, name=None):
        cells = "".join(f"<td>{html.escape(_fmt_value(str(c), v))}</td>" for c, v in zip(d.columns, row))
        body.append(f"<tr>{cells}</tr>")
    return f'<div class="scroll"><table class="data"><thead><tr>{head}</tr></thead>' \
           f'<tbody>{"".join(body)}</tbody></table></div>'


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _img(run_dir: Path, path: Path, alt: str, embed: bool) -> str:
    if embed:
        src = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
    else:
        src = path.relative_to(run_dir).as_posix()
    return f'<figure><img src="{html.escape(src)}" alt="{html.escape(alt)}"><figcaption class="caption">' \
           f"{html.escape(alt)}</figcaption></figure>"


def _provenance_html(prov: Mapping[str, Any], results: pd.DataFrame) -> str:
    items: list[tuple[str, str]] = []
    for k in PUBLIC_FIELDS:
        if k in prov:
            items.append((k, str(prov[k])))
    for col in ("config_hash", "git_commit"):
        if col in results.columns and col not in prov:
            vals = sorted({str(v) for v in results[col].dropna().unique()})
            if vals:
                shown = ", ".join(vals[:5]) + (f" (+{len(vals) - 5} more)" if len(vals) > 5 else "")
                items.append((f"{col} (results)", shown))
    for name, version in prov.get("packages", {}).items():
        items.append((f"package {name}", version))
    items.append(("report generated", _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")))
    dl = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items)
    return f'<dl class="prov">{dl}</dl>'


# What each outcome setting means, for the thresholds table at the report's top.
THRESHOLD_MEANINGS: dict[str, str] = {
    "rule": "which rule decides memorization: paper (the paper's rule on each checkpoint alone) or "
            "selection_aware (the paper's rule and a p-value below family_alpha / K)",
    "strict": "strict mode: memorization also needs the calibrated AUC's 95% interval to lie above memorization_auc",
    "score_kinds": "the score kinds that compete for a checkpoint's maximum signal",
    "collapse_loss_ratio": "collapse when the loss ratio L_FT / L_base exceeds this (the smaller of the non-members' "
                           "true-label ratio and the spec's ratio on the labels as probed)",
    "collapse_output_std": "collapse when the standard deviation of the fine-tuned model's p(true label) over the non-members is below this",
    "memorization_auc": "memorization needs a calibrated AUC above this",
    "memorization_alpha": "the false-positive rate α at which memorization reads the TPR",
    "memorization_tpr_margin": "memorization needs TPR@α − α of at least this",
    "family_alpha": "selection_aware: the false-positive rate the run headline keeps, split over K = checkpoints × kinds",
    "inversion_auc": "inversion needs the uncalibrated loss AUC's 95% interval to lie below this",
    "overfitting_mu": "overfitting needs |μ_gap| (nats) at most this",
    "overfitting_sigma": "overfitting needs σ_gap (nats) at most this",
}


def _norm_setting(key: str, value: Any) -> str:
    """A threshold as one comparable string, whether it came from sweep.json or a results column."""
    if key == "score_kinds":
        kinds = value.split(",") if isinstance(value, str) else list(value or [])
        return ", ".join(str(k).strip() for k in kinds if str(k).strip())
    if isinstance(value, (bool, np.bool_)) or key == "strict":
        return "yes" if bool(value) else "no"
    if isinstance(value, (int, float, np.integer, np.floating)):
        return f"{float(value):g}"
    return str(value)


def thresholds_in_force(results: pd.DataFrame, sweep: SweepConfig | None) -> tuple[dict[str, str], str, list[str]]:
    """The outcome settings in force, where they were read, and the ones the results disagree on.

    Read from the run's config (``sweep.json``'s ``outcome`` block) when there is one, else from the
    ``threshold_*`` columns every results row records. A setting the rows record differently from the
    config is returned in the third element (it would mean the rows were classified under another config).
    """
    recorded: dict[str, str] = {}
    ft = _fine_tuned_rows(results)
    first = (ft if not ft.empty else results).iloc[0] if not results.empty else None
    if first is not None:
        for c in results.columns:
            if c.startswith("threshold_") and pd.notna(first[c]):
                recorded[c[len("threshold_"):]] = _norm_setting(c[len("threshold_"):], first[c])
    config = sweep.outcome.model_dump(mode="json") if sweep is not None else None
    if config:
        first_keys = [k for k in THRESHOLD_MEANINGS if k in config]  # rule, strict, kinds first
        settings = {k: _norm_setting(k, config[k]) for k in [*first_keys, *(k for k in config if k not in first_keys)]}
        source = f"the run's config ({SWEEP_FILE}, outcome block)"
    elif recorded:
        settings, source = dict(recorded), "the results table (threshold_* columns; no sweep.json)"
    else:
        return {}, "not recorded", []
    disagree = [k for k in settings if k in recorded and recorded[k] != settings[k]]
    return settings, source, disagree


def _rule_in_force(results: pd.DataFrame, settings: Mapping[str, str]) -> str:
    """The VerdictRule value of the ``outcome`` column (e.g. ``selection_aware_strict``)."""
    if "rule" in settings:
        try:
            return VerdictRule.of(settings["rule"], settings.get("strict") == "yes").value
        except ValueError:
            pass
    if "rule" in results.columns and results["rule"].notna().any():
        return str(results["rule"].dropna().iloc[0])
    from orchestrator.config import OutcomeConfig  # neither config nor rows say: the schema's default rule

    default = OutcomeConfig()
    return VerdictRule.of(default.rule, default.strict).value


def _rule_sentence(settings: Mapping[str, str], rule: str, p_threshold: str | None) -> str:
    """The outcome precedence with this sweep's numbers in it (HTML)."""
    g = {k: html.escape(v) for k, v in settings.items()}
    alpha = g.get("memorization_alpha", "0.1")
    try:
        alpha_pct = f"{float(settings.get('memorization_alpha', 0.1)) * 100:g}%"
    except ValueError:
        alpha_pct = alpha
    mem = (f"for some competing score kind ({g.get('score_kinds', 'loss, entropy')}), calibrated AUC &gt; "
           f"{g.get('memorization_auc', '0.5')} and TPR@{alpha_pct} − {alpha} ≥ {g.get('memorization_tpr_margin', '0.1')}")
    if rule.endswith("_strict"):
        mem += f", and the AUC's 95% interval above {g.get('memorization_auc', '0.5')} (strict)"
    if rule.startswith(VerdictRule.SELECTION_AWARE.value):
        mem += (", and a one-sided Mann–Whitney p-value below family_alpha / K = "
                + (html.escape(p_threshold) if p_threshold else f"{g.get('family_alpha', '0.05')} / K"))
    return ("A checkpoint's outcome is the first of these that holds: "
            f"<b>collapse</b> (loss ratio &gt; {g.get('collapse_loss_ratio', '5')} or output std &lt; "
            f"{g.get('collapse_output_std', '0.01')}) → <b>memorization</b> ({mem}) → <b>inversion</b> (mean member "
            "probe loss above the non-members' and the uncalibrated loss AUC's 95% interval below "
            f"{g.get('inversion_auc', '0.5')}) → <b>overfitting</b> (|μ_gap| ≤ {g.get('overfitting_mu', '0.01')} and "
            f"σ_gap ≤ {g.get('overfitting_sigma', '0.01')} nats) → <b>no_signal</b>.")


def _status_cell(row: Mapping[str, Any]) -> str:
    if row["status"] == "unknown":
        return f"{int(row['n_stored'])} stored"
    return f"{int(row['n_stored'])} of {int(row['n_scheduled'])}"


def _completeness_html(comp: pd.DataFrame, schedule: tuple[int, ...] | None, interrupted: bool,
                       missing: Mapping[str, tuple[int, int]]) -> str:
    """The report-top lines on what is stored of the sweep."""
    lines = []
    if interrupted:
        lines.append("<li class=\"warn\"><b>Interrupted:</b> the sweep was stopped before it finished (as the run "
                     f"folder's {html.escape(STATE_FILE)} records). Continue it with "
                     "<code>iclmem resume RUN_DIR</code>; the numbers here cover only what was stored.</li>")
    if schedule is None:
        lines.append(f"<li>Completeness not checked: no {SWEEP_FILE} with a training schedule in the run folder.</li>")
        return "".join(lines)
    sched = ", ".join(str(e) for e in schedule)
    gaps = comp[comp["status"].isin(["incomplete", "interrupted"])]
    diverged = comp[comp["status"] == "diverged"]
    n = len(comp)
    n_complete = int((comp["status"] == "complete").sum())
    if n_complete == n:
        lines.append(f"<li>Every one of the {n} fine-tuned runs has all {len(schedule)} scheduled checkpoints "
                     f"(epochs {html.escape(sched)}).</li>")
    elif gaps.empty:
        lines.append(f"<li>{n_complete} of the {n} fine-tuned runs have all {len(schedule)} scheduled checkpoints "
                     f"(epochs {html.escape(sched)}).</li>")
    else:
        word = "interrupted" if interrupted else "incomplete"
        items = "".join(f"<li><code>{html.escape(str(r['run_id']))}</code>"
                        + (f" ({html.escape(str(r['task']))})" if "task" in r else "")
                        + f": {_status_cell(r)} checkpoints, last epoch {int(r['last_epoch'])}</li>"
                        for r in gaps.head(20).to_dict("records"))
        more = f"<li>… and {len(gaps) - 20} more</li>" if len(gaps) > 20 else ""
        lines.append(f"<li class=\"warn\"><b>{len(gaps)} of {n} runs are {word}</b>: fewer stored checkpoints "
                     f"than the {len(schedule)} scheduled (epochs {html.escape(sched)}); their headline is the "
                     f"peak of what is stored.<ul>{items}{more}</ul></li>")
    if not diverged.empty:
        lines.append(f"<li>{len(diverged)} run(s) diverged (NaN loss) and stopped early: a result, not a gap.</li>")
    for regime, (k, total) in sorted(missing.items()):
        lines.append(f"<li class=\"warn\"><b>{k} of the {total} {html.escape(regime)} runs the grid schedules have "
                     "no stored checkpoint</b> and are in no table.</li>")
    return "".join(lines)


def blind_baseline_summary(results: pd.DataFrame) -> dict[str, Any]:
    """Over the fine-tuned runs (one split each): how many, the blind AUC's median and range, how many are
    separable without the model (interval excluding 0.5) and how many use the paper's unmatched design."""
    ft = _fine_tuned_rows(results)
    if ft.empty or "blind_auc" not in ft.columns:
        return {}
    runs = ft.drop_duplicates(_run_key(ft))
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


def _blind_items(results: pd.DataFrame) -> list[str]:
    b = blind_baseline_summary(results)
    if not b:
        return []
    items = [f"<li><b>Blind baseline:</b> members vs non-members scored by a model fitted on C′ alone (no "
             f"fine-tuned model, labels as probed): AUC median {b['median']:.3f} (range {b['low']:.3f}–"
             f"{b['high']:.3f}) over {b['n_runs']} run{'s' if b['n_runs'] != 1 else ''}; {b['n_separable']} "
             "separable (95% interval excluding 0.5). Column <code>blind_auc</code> beside every verdict.</li>"]
    if b["n_not_exchangeable"]:
        why = (f"{b['n_unmatched']} use the paper's unmatched design (<code>data.label_design: unmatched</code>: "
               "members scored on permuted labels, non-members on true ones)" if b["n_unmatched"] else
               "their blind interval excludes 0.5")
        items.append(f'<li class="warn"><b>Members and non-members are separable without the model in '
                     f"{b['n_not_exchangeable']} of {b['n_runs']} runs</b>: {why}. Their AUCs and verdicts measure "
                     "the difference between the groups' labels as much as membership: read each against its "
                     "blind AUC. No ε lower bound is given for them.</li>")
    return items


def _summary_html(results: pd.DataFrame, sweep: SweepConfig | None, comp: pd.DataFrame,
                  schedule: tuple[int, ...] | None, interrupted: bool, noops: pd.DataFrame,
                  settings: Mapping[str, str], rule: str, source: str = "") -> str:
    """The report's top: the verdict in one line, the rule in force, what was run and what is stored."""
    line, n_runs = outcome_summary(results)
    ft = _fine_tuned_rows(results)
    n_controls = len(results) - len(ft)
    strict = "on" if rule.endswith("_strict") else "off"
    controls = (f" The {n_controls} base-model checkpoint{'s' if n_controls != 1 else ''} (the untouched base "
                "model probed at epoch 0: a pipeline sanity check whose ΔS is zero by construction, not a "
                f"control) {'are' if n_controls != 1 else 'is'} counted apart and left out of every count above."
                if n_controls else " No base-model sanity check was probed.")
    epochs = sorted({int(e) for e in ft["epoch"]}) if not ft.empty else []
    items = [
        f"<li><b>Rule in force:</b> <code>{html.escape(settings.get('rule', rule.removesuffix('_strict')))}</code>, "
        f"strict mode {strict}; "
        + (f"thresholds read from {html.escape(source)} (<a href=\"#verdict-rule\">listed below</a>).</li>"
           if settings else "thresholds not recorded: no sweep.json and no threshold_* columns in the results.</li>"),
        f"<li><b>What was run:</b> {n_runs} fine-tuned run{'s' if n_runs != 1 else ''} with {len(ft)} "
        f"checkpoint{'s' if len(ft) != 1 else ''} (epochs {html.escape(', '.join(map(str, epochs)) or 'none')})."
        f"{controls}</li>",
        _completeness_html(comp, schedule, interrupted, missing_runs(results, sweep)),
        *_blind_items(results),
    ]
    if not noops.empty:
        for model, d in noops.groupby("model", sort=True):
            names = ", ".join(d["manipulation"])
            items.append(f"<li><b>No-op manipulations for {html.escape(str(model) or 'the audited model')}:</b> "
                         f"{len(d)} ({html.escape(names)}) gave the same per-manipulation AUC as the unmanipulated "
                         "base context at every fine-tuned checkpoint; see "
                         "<a href=\"#perturbations\">perturbations</a>.</li>")
    return (f'<section id="summary"><h2>Summary</h2><p class="verdict"><b>Outcome:</b> {html.escape(line)} '
            "(each fine-tuned run at its headline checkpoint: the highest calibrated AUC over epochs and "
            f"score kinds).</p><ul>{''.join(items)}</ul></section>")


def _definitions_html(results: pd.DataFrame, settings: Mapping[str, str]) -> str:
    """What every number of the report means, with this sweep's sample sizes."""
    sizes = sample_sizes(results)
    kinds = settings.get("score_kinds") or ", ".join(competing_kinds(results))
    compare = "; ".join(f"Q = {r['q']}: {r['n_members']} members vs {r['n_nonmembers']} non-members"
                        for r in sizes.to_dict("records")) or "no fine-tuned checkpoint"
    few = sizes[sizes["fp_allowed_at_1pct"] == 0]  # fewer than 100 non-members
    tpr_note = ""
    if not few.empty:
        ns = ", ".join(str(n) for n in sorted(set(few["n_nonmembers"])))
        tpr_note = (f" <span class=\"warn\">In this sweep {ns} non-members allow ⌊0.01·n⌋ = 0 false positives, so "
                    "TPR@1% is the share of members scoring above <em>every</em> non-member: it rests on the one "
                    "highest non-member score and is no estimate of a 1% false-positive rate.</span> Such cells "
                    "carry the note “0 FP allowed” next to the number.")
    items = [
        ("Q, members, non-members", "Q is the number of member rows a run fine-tunes on (its queries); Stage I "
         "also draws as many non-members, rows of the same task the model never saw, with matching labels."),
        ("Score kinds", "For each query and each manipulated multiple-choice context: loss = −log p(true "
         "label), entropy = H(p) over the candidate labels, confidence = p(true label). A query's score S "
         f"is the mean over the manipulation suite. Competing for the maximum signal here: {html.escape(kinds)}."),
        ("ΔS (calibrated score)", "ΔS = S − S_ref, S_ref being the same probe on the untouched base model with "
         "identical contexts. It removes how hard a row is for any model. Members are the positive class: "
         "the membership score is −ΔS for loss and entropy and +ΔS for confidence."),
        ("AUC", "The probability that a random member has a higher membership score than a random "
         "non-member (ties count half); 0.5 is chance. An AUC compares the n members with the n "
         f"non-members of one checkpoint: {html.escape(compare)}. “raw” AUCs use S alone, “ref” AUCs S_ref alone."),
        ("TPR@1%, TPR@10%", "The share of members flagged at the threshold that flags at most ⌊α·n⌋ of the n "
         "non-members (α = 1% or 10%; ties broken against the attacker)." + tpr_note),
        ("Loss ratio", "L_FT / L_base: mean cross-entropy of ordinary in-context prediction (context C′, members "
         "and non-members as queries) of the fine-tuned model over the base model's. 1 = unchanged; above "
         f"{html.escape(settings.get('collapse_loss_ratio', '5'))} the checkpoint is a collapse. Shown in the "
         "run tables (column loss_ratio)."),
        ("p-value", "One-sided Mann–Whitney p-value of the deciding kind's ΔS (members above non-members)."),
        ("Headline / peak", "A run's headline checkpoint is the one with the highest calibrated AUC over its "
         "epochs and the competing score kinds; run-level tables and the summary use it."),
    ]
    dl = "".join(f"<dt>{html.escape(k)}</dt><dd>{v}</dd>" for k, v in items)
    return f'<section id="definitions"><h2>What the numbers mean</h2><dl class="defs">{dl}</dl></section>'


def _tpr_1pct_display(df: pd.DataFrame) -> pd.DataFrame:
    """``tpr_at_1pct`` as text with "0 FP allowed" beside every value that rests on fewer than 100
    non-members (⌊0.01·n⌋ = 0), so the number is never read without its caveat."""
    if "tpr_at_1pct" not in df.columns:
        return df
    n = df["n_nonmembers"] if "n_nonmembers" in df.columns else df["q"] if "q" in df.columns else None
    if n is None:
        return df
    out = df.copy()
    cells = []
    for v, k in zip(out["tpr_at_1pct"], n):
        text = _fmt_value("tpr_at_1pct", v)
        if text and pd.notna(k) and allowed_false_positives(0.01, int(k)) == 0:  # fewer than 100 non-members
            text += f" (0 FP allowed: {int(k)} non-members)"
        cells.append(text)
    out["tpr_at_1pct"] = cells
    return out


def _run_table_display(table: pd.DataFrame, comp: pd.DataFrame) -> pd.DataFrame:
    """A run table with its completeness (``checkpoints`` stored of scheduled, ``status``) and TPR@1% caveat."""
    key = [c for c in RUN_KEY if c in table.columns and c in comp.columns]
    out = table
    if key and not comp.empty:
        c = comp.assign(checkpoints=[_status_cell(r) for r in comp.to_dict("records")])[[*key, "checkpoints", "status"]]
        out = table.merge(c, on=key, how="left")
    return _tpr_1pct_display(out)


def _noop_html(noops: pd.DataFrame) -> str:
    """The perturbation section's word on manipulations that changed nothing for the audited model."""
    if noops.empty:
        return ""
    out = []
    for model, d in noops.groupby("model", sort=True):
        out.append(f"<p class=\"note\"><b>{len(d)} manipulation(s) are no-ops for "
                   f"{html.escape(str(model) or 'the audited model')}:</b> their per-manipulation AUC equals the "
                   f"<code>{BASE_MANIPULATION}</code> context's at every one of its fine-tuned checkpoints "
                   f"({int(d['n_checkpoints'].min())} or more). The model is invariant to what they change (e.g. "
                   "row order for position moves, uniform repetition for a model that weights rows by "
                   "multiplicity), so they add no evidence and their ranking below only repeats the base's: "
                   f"{html.escape(', '.join(d['manipulation']))}.</p>")
    return "".join(out)


def _grid_axes_note(results: pd.DataFrame) -> str:
    """Which grid axes vary in the sweep and how the figures treat them (faceted, or seeds averaged)."""
    varying = [a for a in FACET_AXES if a in results.columns and results[a].nunique(dropna=False) > 1]
    seeds = results["seed"].nunique() if "seed" in results.columns else 1
    parts = []
    if varying:
        parts.append(f" Figures draw one panel per value of {', '.join(varying)}, never pooling them")
    if seeds > 1:
        parts.append(f"{'; lines' if varying else ' Lines'} average over {seeds} seeds")
    return ("".join(parts) + ".") if parts else ""


def write_html_report(
    run_dir: str | Path, *, title: str | None = None, make_figures: bool = True, embed_images: bool = False,
    regime: str | None = "auto",
) -> Path:
    """Write ``RUN_DIR/report.html``: every paper table, the figures and a provenance block.

    Figures are written to ``RUN_DIR/figures/`` and referenced by relative path (they load from
    ``file://``), or embedded as base64 with ``embed_images``. ``regime="auto"`` uses single_fixed for
    the main-regime sections when the sweep has it, else pools every regime. Missing optional inputs skip
    their section with a note. Only allow-listed columns are read, so no raw value can reach the page.
    """
    folder = RunFolder(run_dir)
    run_dir = folder.path
    results = folder.results()
    split = folder.split_report()
    manip = folder.manipulation_auc()
    prov = load_provenance(run_dir)
    if regime == "auto":
        regime = MAIN_REGIME if "regime" in results.columns and (results["regime"] == MAIN_REGIME).any() else None

    figs: dict[str, Path | None] = {}
    fig_notes: dict[str, str] = {}
    if make_figures:
        from orchestrator import figures as _figures  # matplotlib only when figures are wanted

        figs, fig_notes = _figures.make_all_figures(run_dir, results, manipulation_auc=manip, regime=regime)

    parts: list[str] = []

    def section(hid: str, heading: str, caption: str, body: str) -> None:
        parts.append(f'<section id="{hid}"><h2>{html.escape(heading)}</h2>'
                     f'<p class="caption">{html.escape(caption)}</p>{body}</section>')

    def figure(name: str, alt: str) -> str:
        p = figs.get(name)
        if p is not None and Path(p).is_file():
            return _img(run_dir, Path(p), alt, embed_images)
        if not make_figures:
            return ""
        return _note(f"Figure '{name}' not drawn: {fig_notes.get(name, 'no data')}.")

    def optional(fn, *args, **kwargs) -> tuple[pd.DataFrame | None, str | None]:
        try:
            return fn(*args, **kwargs), None
        except (KeyError, ValueError, TypeError, DataError) as exc:  # malformed optional input
            return None, f"section could not be built ({type(exc).__name__})"

    scope = f"regime {regime}" if regime else "all regimes"
    sweep = folder.sweep_or_none
    interrupted = folder.interrupted
    schedule = checkpoint_schedule(sweep)
    comp = run_completeness(results, schedule, interrupted=interrupted)
    settings, source, disagree = thresholds_in_force(results, sweep)
    rule = _rule_in_force(results, settings)
    noops = noop_manipulations(manip, results) if manip is not None else pd.DataFrame()
    parts.append(_summary_html(results, sweep, comp, schedule, interrupted, noops, settings, rule, source))
    parts.append(_verdict_rule_html(results, settings, source, disagree, rule))
    parts.append(_definitions_html(results, settings))
    facets = _grid_axes_note(_filter_regime(results, regime))
    parts.append(f"<p>The sections below cover {html.escape(scope)}. Rows of regime <code>{BASE_MODEL_ROW}</code> "
                 "are the pipeline sanity check (the untouched base model probed as a checkpoint: ΔS is zero by "
                 "construction, so its AUC is 0.5 whatever the data; it checks the pipeline, it is not a control "
                 f"and cannot fail). The controls are the null splits above.{html.escape(facets)}</p>")

    from orchestrator.epsilon_report import epsilon_section_html

    privacy = epsilon_section_html(results, run_dir / FIGURES_DIR)
    if privacy:
        parts.append(f'<section id="privacy">{privacy}</section>')
    from orchestrator.attacks_report import attacks_section_html

    parts.append(attacks_section_html(results, run_dir / FIGURES_DIR))  # empty unless probe.references is on
    from orchestrator.canaries_report import canaries_section_html

    canaries = canaries_section_html(results, run_dir / FIGURES_DIR)  # empty unless the sweep has canaries
    if canaries:
        parts.append(f'<section id="canaries">{canaries}</section>')
    section("provenance", "Provenance", "Configuration hash, code version and package versions.",
            _provenance_html(prov, results) + ("" if prov else _note("provenance.json not found; values "
                                                                       "shown come from the results table.")))
    facet_axes = [a for a in FACET_AXES if a in results.columns and _filter_regime(results, regime)[a].nunique(dropna=False) > 1]
    facet_caption = f" (one panel per {' × '.join(facet_axes)})" if facet_axes else ""
    counts = outcome_counts_per_q(results, regime=regime, by=tuple(facet_axes))
    rates = outcome_rates_per_q(results, regime=regime, by=tuple(facet_axes))
    apart = f"; {', '.join(facet_axes)} counted apart" if facet_axes else ""
    section("outcome-rates", "Outcome rates per Q", f"Runs at their peak checkpoint ({scope}{apart}): counts, then "
            "shares.",
            df_to_html(counts, index=True) + df_to_html(rates, index=True))
    section("task-table", "Task × learning rate × Q (Tabs. 10–11)",
            "Outcome under the sweep's rule and under each rule, AUC (deciding kind, with 95% interval and "
            "p-value), TPR@1%, TPR@10% (same kind), members and non-members the AUC compares, loss ratio, the "
            "known-context baseline's AUC and epoch at each run's peak; checkpoints stored of those scheduled.",
            df_to_html(_run_table_display(task_lr_q_table(results, regime=regime), comp))
            + figure("outcome_heatmap", "Outcome at peak" + facet_caption))
    section("detectable-by-epoch", "Detectable runs by epoch (Fig. 2)",
            "Share of runs flagged memorization at each checkpoint epoch, per Q.",
            df_to_html(detectable_share_by_epoch(results, regime=regime, by=tuple(facet_axes)))
            + figure("detectable_share", "Share of detectable runs by epoch" + facet_caption))
    section("peak-vulnerability", "Peak vulnerability per task (Tab. 8)",
            "Highest calibrated AUC of each task over its runs, and the share of runs flagged memorization.",
            df_to_html(_tpr_1pct_display(peak_vulnerability_per_task(results, regime=regime, by=tuple(facet_axes)))))
    section("auc-epochs", "AUC over epochs", "Calibrated AUC (best score kind) per checkpoint, by learning rate; "
            "the dashed line is chance (0.5).",
            figure("auc_over_epochs", "AUC over epochs per learning rate" + facet_caption))
    section("roc", "ROC curves", "Calibrated deciding score at each run's peak checkpoint, log-log axes; the "
            "legend names every grid axis that differs between the curves, the dashed diagonal is chance.",
            figure("roc_curves", "ROC curves at peak checkpoints"))

    if split is None:
        body = _note(f"{SPLIT_REPORT_FILE} not found; section skipped.")
    else:
        t, err = optional(split_validation, split)
        body = _note(err) if err else df_to_html(t)
    section("split-validation", "Split validation (Tab. 6)",
            "Members vs non-members: TVD (classification) or KS with p-value and Wasserstein (regression); the label "
            "design, the blind baseline (AUC of a model fitted on C' alone, with its 95% interval) and the draws "
            "Stage I refused because their groups were separable without the model.", body)

    t, err = optional(calibration_impact, results, regime=regime)
    section("calibration", "Calibration impact (App. 7.4)",
            "Memorization flags from the calibrated score ΔS vs the uncalibrated score S, the same rule on "
            "both, per non-collapsed fine-tuned checkpoint.",
            _note(err) if err else df_to_html(t, index=True))

    if manip is None:
        body = _note(f"{MANIPULATION_AUC_FILE} not found; section skipped.")
    else:
        t, err = optional(perturbation_effectiveness, manip, results)
        t2, err2 = optional(perturbation_effectiveness, manip, results, by="category")
        body = (_noop_html(noops) + (_note(err) if err else df_to_html(t)) + (_note(err2) if err2 else df_to_html(t2))
                + figure("perturbation_ranking", "Mean per-manipulation ΔAUC"))
    section("perturbations", "Perturbation effectiveness (App. 7.3)",
            "Over checkpoints with detectable memorization: each manipulation's AUC (calibrated loss) minus the "
            "AUC of the unmanipulated context (base) at the same checkpoint, ranked by the mean of that "
            "difference; mean_delta_auc_vs_suite is the same against the checkpoint's overall AUC(ΔS).", body)

    if split is None:
        body = _note(f"{SPLIT_REPORT_FILE} not found; section skipped.")
    else:
        t, err = optional(task_characteristics, results, split, regime=regime)
        body = _note(err) if err else df_to_html(t)
    section("task-characteristics", "Task characteristics vs outcome (Fig. 6)",
            "Cardinality, majority-class share, size and numeric share against outcome shares at peak.", body)

    section("regimes", "Realistic regimes (Tab. 12)",
            "single_fixed vs multi_fixed vs multi_random at peak checkpoints, per Q.",
            df_to_html(regime_comparison(results)))

    return write_text_atomic(run_dir / REPORT_FILE, _page(title or f"IclMem report — {run_dir.name}", parts))


def _verdict_rule_html(results: pd.DataFrame, settings: Mapping[str, str] | None = None, source: str = "",
                       disagree: list[str] | None = None, rule: str | None = None) -> str:
    """The rule in use, its thresholds (with what each means), and its measured false-positive rate."""
    if settings is None:
        settings, source, disagree = thresholds_in_force(results, {})
    rule = rule or _rule_in_force(results, settings)
    summary = verdict_rule_summary(results)
    p_thr = None
    if "p_value_threshold" in summary and "family_size" in summary:
        p_thr = f"{settings.get('family_alpha', '0.05')} / {summary['family_size']} = {summary['p_value_threshold']:.3g}"
    rows = "".join(f"<tr><td><code>{html.escape(k)}</code></td><td>{html.escape(v)}</td>"
                   f"<td class=\"text\">{html.escape(THRESHOLD_MEANINGS.get(k, ''))}</td></tr>"
                   for k, v in settings.items())
    if p_thr:
        rows += ("<tr><td><code>p_value_threshold</code></td>"
                 f"<td>{html.escape(p_thr)}</td><td class=\"text\">derived: family_alpha / K, K = checkpoints of a "
                 "run × competing kinds</td></tr>")
    table = ('<div class="scroll"><table class="data"><thead><tr><th>setting</th><th>value</th><th>meaning</th>'
             f"</tr></thead><tbody>{rows}</tbody></table></div>") if rows else _note("No thresholds recorded.")
    head = (f'<section id="verdict-rule"><h2>Verdict rule: {html.escape(rule)}</h2>'
            f"<p>{_rule_sentence(settings, rule, p_thr)}</p>"
            '<p class="caption">The <code>outcome</code> column uses this rule; <code>outcome_&lt;rule&gt;</code> '
            "gives every rule's verdict. selection_aware = the paper's rule AND a one-sided Mann-Whitney p-value "
            "of the deciding (checkpoint, score kind) below family_alpha / K (K = checkpoints x competing kinds), "
            "so the run headline, a maximum over that family, keeps its false-positive rate at most "
            f"family_alpha. Settings read from {html.escape(source)}.</p>" + table)
    if disagree:
        head += _note(f"The results rows record other values than the config for {', '.join(disagree)}: they were "
                      "classified under another configuration.")
    rates = null_error_rates(results)
    if rates.empty:
        return head + _note("No null splits were probed (probe.null_splits: 0): the false-positive rate "
                            "of the verdicts is not measured for this sweep.") + "</section>"
    mine = rates[(rates["rule"] == rule) & (rates["level"] == "run_headline")]
    line = ""
    if not mine.empty:
        r = mine.iloc[0]
        line = (f"<p><b>Measured false-positive rate of this rule at run-headline level: {int(r['n_memorization'])} "
                f"of {int(r['n_null'])} null splits ({r['fpr']:.1%}; 95% Clopper-Pearson interval "
                f"{r['fpr_low']:.1%}–{r['fpr_high']:.1%}).</b>"
                + (" Few null splits make a wide interval: raise <code>probe.null_splits</code> or add seeds to "
                   "narrow it." if r["fpr_high"] > 0.10 else "") + "</p>")
    return (head + line + "<p class=\"caption\">Null splits: two disjoint sets of rows the run never saw, "
            "labelled member and non-member with the members' label counts, probed on every fine-tuned "
            "checkpoint (under shuffled_members with label-matched non-members, both sides carry labels permuted "
            "among the unused rows, as the real split's do). Every memorization verdict on them is a false "
            "positive; the _non_collapsed levels count only the trials a collapse verdict did not pre-empt.</p>"
            + df_to_html(rates) + "</section>")


def _page(title: str, parts: Iterable[str]) -> str:
    """The report page around its sections: one style for the tabular and the LM report."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f"<script>{_IMG_CHECK_JS}</script></head>"
        f"<body><h1>{html.escape(title)}</h1>{''.join(parts)}</body></html>\n"
    )


def write_lm_html_report(run_dir: str | Path, results: pd.DataFrame, *, title: str | None = None) -> Path:
    """Write ``RUN_DIR/lm_report.html``: the provenance block and the LM probes' Tables 2-6
    (``probes.lm.report``). Numbers, model, dataset and entity-type names only, never a sentence or an entity."""
    from probes.lm.report import lm_report_section

    run_dir = Path(run_dir)
    prov = load_provenance(run_dir)
    provenance = (f'<section id="provenance"><h2>Provenance</h2>{_provenance_html(prov, results)}'
                  + ("" if prov else _note("provenance.json not found.")) + "</section>")
    return write_text_atomic(run_dir / LM_REPORT_FILE,
                             _page(title or f"LM probes — {run_dir.name}", [provenance, lm_report_section(results)]))
