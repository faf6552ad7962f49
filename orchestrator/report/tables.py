"""The report's tables: one pure pandas function per table of the paper (no file read or written here).

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

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from iclmem.errors import DataError
from iclmem.record import ATTACK_VERDICT_COLUMN
from iclmem.runfolder import SWEEP_FILE, RunStatus
from iclmem.vocab import BASE_MODEL_ROW, Outcome, OutcomeRule, Regime, ScoreKind, VerdictRule, values
from iclmem.vocab import DETECTABLE as _DETECTABLE
from iclmem.vocab import MAIN_REGIME as _MAIN_REGIME
from orchestrator.config import OutcomeConfig, SweepConfig
from orchestrator.run_folder import public_manipulation_auc, public_results, public_split_report
from probes.attacks import attack_peak
from probes.metrics import allowed_false_positives, clopper_pearson

# The paper's tables and figures (ICLMEM_SPEC, "Reports the aggregator must be able to produce"), one
# function each; its docstring starts with the reference and says what it is computed from.
PAPER_TABLES: dict[str, str] = {
    "outcome rates per Q": "outcome_rates_per_q", "Tabs. 10–11": "task_lr_q_table",
    "Fig. 2": "detectable_share_by_epoch", "Tab. 8": "peak_vulnerability_per_task", "Tab. 6": "split_validation",
    "App. 7.4": "calibration_impact", "App. 7.3": "perturbation_effectiveness", "Fig. 6": "task_characteristics",
    "Tab. 12": "regime_comparison",
}

__all__ = [
    "PAPER_TABLES",
    "OUTCOMES",
    "REGIMES",
    "SCORE_KINDS",
    "MAIN_REGIME",
    "DETECTABLE",
    "RUN_KEY",
    "FACET_AXES",
    "public_results",
    "public_split_report",
    "public_manipulation_auc",
    "competing_kinds",
    "checkpoint_auc",
    "checkpoint_kind",
    "filter_regime",
    "run_key_columns",
    "peak_checkpoints",
    "last_checkpoints",
    "outcome_order",
    "ERROR_RATE_LEVELS",
    "fine_tuned_rows",
    "null_records",
    "null_error_rates",
    "Claim",
    "CLAIMS",
    "CLAIM_RATE_COLUMNS",
    "TASK_PEAK",
    "TASK_ANY_RUN",
    "TASK_VERDICT",
    "CHECKPOINT_ANY_ATTACK",
    "RUN_HEADLINE_ANY_ATTACK",
    "task_family_sizes",
    "task_verdicts",
    "task_claim_error_rates",
    "any_attack_error_rates",
    "claim_error_rates",
    "verdict_rule_summary",
    "BASE_MANIPULATION",
    "checkpoint_schedule",
    "scheduled_runs_per_regime",
    "missing_runs",
    "run_completeness",
    "outcome_summary",
    "sample_sizes",
    "noop_manipulations",
    "outcome_counts_per_q",
    "outcome_rates_per_q",
    "TASK_TABLE_COLUMNS",
    "task_lr_q_table",
    "detectable_share_by_epoch",
    "peak_vulnerability_per_task",
    "null_peak_auc_per_task",
    "split_validation",
    "calibration_impact",
    "perturbation_ranking",
    "perturbation_effectiveness",
    "task_characteristics",
    "regime_comparison",
    "THRESHOLD_MEANINGS",
    "norm_setting",
    "thresholds_in_force",
    "rule_in_force",
    "blind_baseline_summary",
]

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


def filter_regime(results: pd.DataFrame, regime: str | None) -> pd.DataFrame:
    if regime is None or "regime" not in results.columns:
        return results
    return results[results["regime"] == regime]


def run_key_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in RUN_KEY if c in df.columns]


def peak_checkpoints(results: pd.DataFrame, *, regime: str | None = None) -> pd.DataFrame:
    """One row per run: its peak checkpoint (highest calibrated AUC over epochs and score kinds).

    Adds ``peak_auc``, ``peak_kind``, ``n_checkpoints`` and ``last_epoch``. The base checkpoint (epoch 0)
    is a candidate only for runs without any other; ties go to the earliest epoch.
    """
    df = filter_regime(results, regime).copy()
    if df.empty:
        return df.assign(peak_auc=pd.Series(dtype=float), peak_kind=pd.Series(dtype=object),
                         n_checkpoints=pd.Series(dtype=int), last_epoch=pd.Series(dtype=int))
    key = run_key_columns(df)
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
    df = filter_regime(results, regime)
    key = run_key_columns(df)
    return df.sort_values(key + ["epoch"], kind="mergesort").drop_duplicates(key, keep="last").reset_index(drop=True)


def outcome_order(values: Iterable[str]) -> list[str]:
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


def fine_tuned_rows(results: pd.DataFrame) -> pd.DataFrame:
    df = results
    if "epoch" in df.columns:
        df = df[df["epoch"] > 0]
    if "regime" in df.columns:
        df = df[df["regime"] != BASE_MODEL_ROW]
    return df


def null_records(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (checkpoint, null split) of the fine-tuned checkpoints: the run key, epoch, null split
    index, its calibrated AUC per score kind and its verdict per rule (from ``null_evidence``)."""
    df = fine_tuned_rows(results)
    if "null_evidence" not in df.columns:
        return pd.DataFrame()
    key = run_key_columns(df)
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
    recs = _with_competing_null_scores(recs, results)
    heads = _null_run_headlines(recs)
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


def _with_competing_null_scores(recs: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """Null records with ``_auc``, the highest calibrated AUC over the competing kinds (what a headline or a
    peak is picked by), and ``_p``, the smallest one-sided p-value over them (NaN where the records carry none)."""
    kinds = competing_kinds(results)
    aucs = [f"auc_{k}" for k in kinds if f"auc_{k}" in recs.columns]
    ps = [f"p_value_{k}" for k in kinds if f"p_value_{k}" in recs.columns]
    return recs.assign(_auc=recs[aucs].astype(float).max(axis=1),
                       _p=recs[ps].astype(float).min(axis=1) if ps else np.nan)


def _null_run_headlines(recs: pd.DataFrame) -> pd.DataFrame:
    """One null trial per (run, null split index): the one the run's headline picks on that null split (the
    highest ``_auc``, ties to the earliest epoch), as :func:`peak_checkpoints` picks it on the real split."""
    key = [c for c in RUN_KEY if c in recs.columns] + ["null_index"]
    return (recs.assign(_neg=-recs["_auc"].fillna(-np.inf))
            .sort_values(key + ["_neg", "epoch"], kind="mergesort").drop_duplicates(key, keep="first")
            .drop(columns="_neg"))


def _null_records_in_scope(results: pd.DataFrame, regime: str | None, by: tuple[str, ...]) -> pd.DataFrame:
    """:func:`null_records` of ``regime``'s fine-tuned checkpoints with ``_auc`` / ``_p`` and the grid axes
    ``by`` (taken from each run's rows: the null records carry only the run key)."""
    scoped = filter_regime(results, regime)
    recs = null_records(scoped)
    if recs.empty:
        return recs
    recs = _with_competing_null_scores(recs, results)
    missing = [c for c in by if c in scoped.columns and c not in recs.columns]
    if missing:
        key = [c for c in run_key_columns(scoped) if c in recs.columns]
        recs = recs.merge(scoped[key + missing].drop_duplicates(key), on=key, how="left")
    return recs


# --------------------------------------------------------------------------------------------------
# Claims beyond one run's headline (#43): the task-level peak, and IclMem or any attack
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A memorization claim the report makes beyond one run's headline, and whether the selection-aware
    rule's bound covers it (at most ``family_alpha`` false positives: it is a Bonferroni over one run's
    checkpoints x competing kinds, so a maximum or an OR over more than that family is outside it)."""

    name: str
    meaning: str
    covered: bool


TASK_PEAK = Claim("task_peak", "the verdict at a task's peak (Tab. 8: the highest calibrated AUC over the task's "
                  "runs, epochs and competing kinds), a maximum over runs", covered=False)
TASK_ANY_RUN = Claim("task_any_run", "some run of the task has a memorization headline (Tab. 8: n_memorization "
                     "above 0), an OR over runs", covered=False)
TASK_VERDICT = Claim("task_verdict", "Tab. 8's task_verdict: the selection-aware rule at some checkpoint of the task "
                     "with a competing kind's p-value below family_alpha / F, F = checkpoints x competing kinds "
                     "summed over the task's runs (Bonferroni over every run)", covered=True)
CHECKPOINT_ANY_ATTACK = Claim("checkpoint_any_attack", "IclMem or any reference-model attack (LiRA online, LiRA "
                              "offline, RMIA, on either statistic) says memorization at a checkpoint, an OR over "
                              "verdicts", covered=False)
RUN_HEADLINE_ANY_ATTACK = Claim("run_headline_any_attack", "IclMem's run headline or any attack's run headline says "
                                "memorization, an OR over verdicts", covered=False)
CLAIMS: tuple[Claim, ...] = (TASK_PEAK, TASK_ANY_RUN, TASK_VERDICT, CHECKPOINT_ANY_ATTACK, RUN_HEADLINE_ANY_ATTACK)
CLAIM_RATE_COLUMNS: tuple[str, ...] = ("rule", "claim", "covered", "n_null", "n_memorization", "fpr", "fpr_low",
                                       "fpr_high")


def _claim_rate(rule: str, claim: Claim, hits: pd.Series, confidence: float) -> dict[str, Any]:
    k, n = int(hits.astype(bool).sum()), int(len(hits))
    iv = clopper_pearson(k, n, confidence)
    return {"rule": rule, "claim": claim.name, "covered": claim.covered, "n_null": n, "n_memorization": k,
            "fpr": k / n if n else float("nan"), "fpr_low": iv.low, "fpr_high": iv.high}


def _recorded_rule(results: pd.DataFrame) -> str:
    """The VerdictRule value the results' ``outcome`` column was decided by (the schema's default if unrecorded)."""
    if "rule" in results.columns and results["rule"].notna().any():
        return str(results["rule"].dropna().iloc[0])
    default = OutcomeConfig()
    return VerdictRule.of(default.rule, default.strict).value


def _family_alpha(results: pd.DataFrame) -> float:
    if "threshold_family_alpha" in results.columns and results["threshold_family_alpha"].notna().any():
        return float(results["threshold_family_alpha"].dropna().iloc[0])
    return float(OutcomeConfig().family_alpha)


def task_family_sizes(results: pd.DataFrame, *, regime: str | None = MAIN_REGIME,
                      by: tuple[str, ...] = ()) -> pd.DataFrame:
    """Per task (and value of ``by``, as Tab. 8 groups it): ``task_family_size`` F, the tests a task verdict
    pays for: every run's selection-aware family (its checkpoints as the probe counted them,
    ``n_checkpoints_in_family``, else its stored fine-tuned checkpoints) times the competing kinds, summed
    over the task's runs."""
    ft = fine_tuned_rows(filter_regime(results, regime))
    by = tuple(c for c in by if c in ft.columns)
    group = ["task", *by]
    if ft.empty or "task" not in ft.columns:
        return pd.DataFrame(columns=[*group, "task_family_size"])
    key = run_key_columns(ft)
    stored = ft.groupby(key, sort=False, dropna=False)["epoch"].transform("size").astype(float)
    declared = (ft["n_checkpoints_in_family"].astype(float) if "n_checkpoints_in_family" in ft.columns
                else pd.Series(np.nan, index=ft.index))
    runs = ft.assign(_k=declared.fillna(stored)).drop_duplicates(key)
    sizes = runs.groupby(group, sort=True, dropna=False)["_k"].sum() * len(competing_kinds(results))
    return sizes.astype(int).rename("task_family_size").reset_index()


def task_verdicts(results: pd.DataFrame, *, regime: str | None = MAIN_REGIME, by: tuple[str, ...] = ()) -> pd.DataFrame:
    """Tab. 8's controlled task-level claim, per task (and value of ``by``): ``task_verdict`` is memorization
    when some fine-tuned checkpoint of the task is memorization under the selection-aware rule (strict as the
    sweep's rule) and one of its competing kinds' calibrated p-values lies below ``task_p_value_threshold`` =
    family_alpha / F (:func:`task_family_sizes`), else no_signal. Under the null every p-value is valid, so by
    Bonferroni over the F tests of all the task's runs its false-positive rate is at most family_alpha, which
    the task's peak verdict and "some run says memorization" (maxima over runs) do not keep. Empty when the
    rows carry no per-kind calibrated p-value."""
    ft = fine_tuned_rows(filter_regime(results, regime))
    by = tuple(c for c in by if c in ft.columns)
    columns = ["task", *by, "task_verdict", "task_p_value_threshold", "task_family_size"]
    ps = [f"calibrated_{k}_p_value" for k in competing_kinds(results) if f"calibrated_{k}_p_value" in ft.columns]
    outcome = f"outcome_{VerdictRule.of(OutcomeRule.SELECTION_AWARE, _recorded_rule(results).endswith('_strict')).value}"
    if ft.empty or not ps or outcome not in ft.columns:
        return pd.DataFrame(columns=columns)
    sizes = task_family_sizes(results, regime=regime, by=by)
    d = ft.assign(_p=ft[ps].astype(float).min(axis=1)).merge(sizes, on=["task", *by], how="left")
    d["task_p_value_threshold"] = _family_alpha(results) / d["task_family_size"]
    d["_hit"] = (d[outcome] == DETECTABLE) & (d["_p"] < d["task_p_value_threshold"])
    out = (d.groupby(["task", *by], sort=True, dropna=False)
           .agg(_hit=("_hit", "any"), task_p_value_threshold=("task_p_value_threshold", "first"),
                task_family_size=("task_family_size", "first")).reset_index())
    out["task_verdict"] = np.where(out["_hit"], DETECTABLE, Outcome.NO_SIGNAL.value)
    return out.loc[:, columns]


def task_claim_error_rates(results: pd.DataFrame, *, regime: str | None = MAIN_REGIME, by: tuple[str, ...] = (),
                           confidence: float = 0.95) -> pd.DataFrame:
    """The measured false-positive rate of Tab. 8's task-level claims under every rule, from the null splits
    (columns :data:`CLAIM_RATE_COLUMNS`). One trial per (task [, value of ``by``], null split index j): null
    split j of every run of the task stands in for the real split, and the claim is decided on those exactly
    as Tab. 8 decides it on the real ones. :data:`TASK_PEAK`: the verdict of the null trial with the highest
    competing-kind AUC over the task's runs and epochs (ties to the earliest epoch); :data:`TASK_ANY_RUN`: any
    run's null headline (:func:`null_error_rates`' run_headline trial) is memorization; :data:`TASK_VERDICT`
    (selection-aware rules only): some null trial of the task is memorization with a competing kind's p-value
    below family_alpha / F, F from the real runs (:func:`task_verdicts`). A task with R runs has up to R
    times a run's false-positive rate under the first two. Trials share rows and runs, so the Clopper-Pearson
    interval is exact only for independent trials."""
    recs = _null_records_in_scope(results, regime, by)
    if recs.empty:
        return pd.DataFrame(columns=list(CLAIM_RATE_COLUMNS))
    by = tuple(c for c in by if c in recs.columns)
    group = ["task", *by, "null_index"]
    key = [c for c in RUN_KEY if c in recs.columns]
    peaks = (recs.assign(_neg=-recs["_auc"].fillna(-np.inf))
             .sort_values([*group, "_neg", "epoch", *key], kind="mergesort").drop_duplicates(group, keep="first"))
    heads = _null_run_headlines(recs)
    with_bar = recs.merge(task_family_sizes(results, regime=regime, by=by), on=["task", *by], how="left")
    bar = _family_alpha(results) / with_bar["task_family_size"]
    rows = []
    for rule in VerdictRule:
        col = f"outcome_{rule.value}"
        if col not in recs.columns:
            continue
        rows.append(_claim_rate(rule.value, TASK_PEAK, peaks[col] == DETECTABLE, confidence))
        any_run = (heads[col] == DETECTABLE).groupby([heads[c] for c in group], dropna=False).any()
        rows.append(_claim_rate(rule.value, TASK_ANY_RUN, any_run, confidence))
        if rule.rule is OutcomeRule.SELECTION_AWARE and with_bar["_p"].notna().any():
            hit = (with_bar[col] == DETECTABLE) & (with_bar["_p"] < bar)
            rows.append(_claim_rate(rule.value, TASK_VERDICT,
                                    hit.groupby([with_bar[c] for c in group], dropna=False).any(), confidence))
    return pd.DataFrame(rows, columns=list(CLAIM_RATE_COLUMNS))


def _attack_prefixes(results: pd.DataFrame) -> list[str]:
    """The column prefix (``[known_context_]<attack>_``) of every attack whose null splits the results hold."""
    out = []
    for c in results.columns:
        m = ATTACK_VERDICT_COLUMN.match(str(c))
        if m and m.group(3) == "outcome" and f"{m.group(1) or ''}{m.group(2)}_null_evidence" in results.columns:
            out.append(f"{m.group(1) or ''}{m.group(2)}_")
    return sorted(out)


def _attack_null_records(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (fine-tuned checkpoint, attack, attack null split): run key, epoch, ``prefix``,
    ``null_index``, the attack's null AUC and its verdict (from ``<attack>_null_evidence``)."""
    ft = fine_tuned_rows(results)
    key = run_key_columns(ft)
    rows = []
    for prefix in _attack_prefixes(ft):
        for _, r in ft[ft[f"{prefix}null_evidence"].map(lambda v: isinstance(v, str))].iterrows():
            for rec in json.loads(r[f"{prefix}null_evidence"]):
                rows.append({**{k: r[k] for k in key}, "epoch": int(r["epoch"]), "prefix": prefix,
                             "null_index": int(rec["index"]), "auc": float(rec["auc"]),
                             "memorization": rec["outcome"] == DETECTABLE})
    return pd.DataFrame(rows, columns=[*key, "epoch", "prefix", "null_index", "auc", "memorization"])


def any_attack_error_rates(results: pd.DataFrame, *, rule: str | None = None, confidence: float = 0.95) -> pd.DataFrame:
    """The measured false-positive rate of "IclMem or any attack says memorization" (columns
    :data:`CLAIM_RATE_COLUMNS`; empty without attack null splits), over every fine-tuned checkpoint with
    attack columns, under ``rule`` (the sweep's: the attacks' verdicts are decided by it; default the rule
    the results record). Null split j of IclMem (rows the run never saw) and attack null split j (half the
    non-members labelled member) are both nulls of the same checkpoint and are paired by j.
    :data:`CHECKPOINT_ANY_ATTACK`: one trial per (checkpoint, j), a false positive when IclMem's null verdict
    or any attack's is memorization. :data:`RUN_HEADLINE_ANY_ATTACK`: one trial per (run, j), IclMem's null
    headline (:func:`null_error_rates`) or any attack's (its null AUC's highest checkpoint, ties to the
    earliest, as :func:`probes.attacks.attack_run_headline` picks it). Each verdict keeps family_alpha alone;
    their OR over IclMem and six attack verdicts can reach seven times that."""
    attacks = _attack_null_records(results)
    if attacks.empty:
        return pd.DataFrame(columns=list(CLAIM_RATE_COLUMNS))
    rule = rule or _recorded_rule(results)
    col = f"outcome_{rule}"
    key = [c for c in RUN_KEY if c in attacks.columns]
    recs = null_records(results)
    if not recs.empty and col in recs.columns:
        recs = _with_competing_null_scores(recs, results)
        iclmem = recs.assign(memorization=recs[col] == DETECTABLE)
        iclmem_heads = _null_run_headlines(recs)
        iclmem_heads = iclmem_heads.assign(memorization=iclmem_heads[col] == DETECTABLE)
    else:  # no IclMem null splits: the OR is over the attacks alone
        iclmem = iclmem_heads = pd.DataFrame(columns=[*key, "epoch", "null_index", "memorization"])
    audited = attacks[[*key, "epoch"]].drop_duplicates()
    trial = [*key, "epoch", "null_index"]
    at_checkpoints = pd.concat([attacks[[*trial, "memorization"]],
                                iclmem.merge(audited, on=[*key, "epoch"])[[*trial, "memorization"]]])
    checkpoint_hits = at_checkpoints.groupby(trial, sort=True)["memorization"].any()
    heads = []
    for (_, j), d in attacks.groupby(["prefix", "null_index"], sort=True):
        for _, run in d.groupby(key, sort=False):
            peak = attack_peak(run["epoch"].tolist(), run["auc"].tolist())
            if peak is not None:
                heads.append({**{c: run[c].iloc[0] for c in key}, "null_index": int(j),
                              "memorization": bool(run["memorization"].iloc[peak])})
    audited_runs = attacks[key].drop_duplicates()
    run_trials = pd.concat([pd.DataFrame(heads, columns=[*key, "null_index", "memorization"]),
                            iclmem_heads.merge(audited_runs, on=key)[[*key, "null_index", "memorization"]]])
    run_hits = run_trials.groupby([*key, "null_index"], sort=True)["memorization"].any()
    return pd.DataFrame([_claim_rate(rule, CHECKPOINT_ANY_ATTACK, checkpoint_hits, confidence),
                         _claim_rate(rule, RUN_HEADLINE_ANY_ATTACK, run_hits, confidence)],
                        columns=list(CLAIM_RATE_COLUMNS))


def claim_error_rates(results: pd.DataFrame, *, regime: str | None = MAIN_REGIME, by: tuple[str, ...] = (),
                      rule: str | None = None, confidence: float = 0.95) -> pd.DataFrame:
    """Every claim of :data:`CLAIMS` with its measured false-positive rate: :func:`task_claim_error_rates`
    (over ``regime`` and ``by``, as Tab. 8 is computed) then :func:`any_attack_error_rates` (under ``rule``)."""
    parts = [t for t in (task_claim_error_rates(results, regime=regime, by=by, confidence=confidence),
                         any_attack_error_rates(results, rule=rule, confidence=confidence)) if not t.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(CLAIM_RATE_COLUMNS))


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
        ft = fine_tuned_rows(results)
        if not ft.empty:
            out["p_value_threshold"] = float(ft["p_value_threshold"].iloc[0])
            out["family_size"] = int(ft["n_checkpoints_in_family"].iloc[0]) * len(competing_kinds(results))
    return out


# --------------------------------------------------------------------------------------------------
# The sweep as configured: its rule and thresholds, its checkpoint schedule, what is stored of it
# --------------------------------------------------------------------------------------------------

BASE_MANIPULATION = "base"  # the unmanipulated multiple-choice context every other manipulation varies


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
        from orchestrator.config import expand_grid

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
    """Outcome rates per Q (the spec's first report), as counts: runs per outcome for each Q, each run at
    its peak checkpoint (index ``q``; columns ``n_runs`` then one per outcome). With ``by``
    (e.g. ``("label_mode",)``) the index is (*by, q): runs of different label modes, models or DP ε are
    counted apart, never pooled into one rate."""
    runs = _headline(results, at, regime)
    outcomes = outcome_order(runs["outcome"]) if not runs.empty else list(OUTCOMES)
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
    """Outcome rates per Q (the spec's first report): share of runs per outcome for each Q, from each run's
    results row at its peak checkpoint (rows sum to 1), with ``n_runs``; ``by`` as in
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
    """Tabs. 10–11: per run (task × lr × Q [× model, label mode, seed]) at its peak checkpoint: outcome,
    AUC, TPR at 1% and 10% FPR and the epoch, from the results rows of the fine-tuned runs."""
    peaks = peak_checkpoints(results, regime=regime)
    cols = [c for c in TASK_TABLE_COLUMNS if c in peaks.columns]
    order = [c for c in ("task", "q", "lr", "model", "label_mode", "seed", "run_id") if c in peaks.columns]
    return peaks.loc[:, cols].sort_values(order, kind="mergesort").reset_index(drop=True)


def detectable_share_by_epoch(
    results: pd.DataFrame, *, regime: str | None = MAIN_REGIME, cumulative: bool = False,
    by: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Fig. 2: share of runs whose checkpoint is flagged ``memorization``, per (Q, epoch), from every
    checkpoint's results row, and per value of
    each column in ``by`` (e.g. ``label_mode``: shares of different label modes are never pooled then)."""
    df = filter_regime(results, regime).copy()
    key = run_key_columns(df)
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
    """Tab. 8: per task, the run/checkpoint with the highest calibrated AUC, and the detectable share, from
    each run's peak checkpoint.

    ``detectable_share`` = share of the task's runs whose peak checkpoint is flagged memorization. With
    ``by`` (e.g. ``("label_mode",)``) one row per task and value of those columns: a planted label mode's
    runs never raise a normal one's share.

    The peak's ``outcome`` and ``n_memorization`` > 0 are maxima over the task's runs: the selection-aware
    bound (one run's family) does not cover them (:func:`task_claim_error_rates` measures how often they
    are false on the null splits). ``task_verdict`` (:func:`task_verdicts`) is the task-level claim that
    keeps family_alpha; ``null_peak_auc`` (:func:`null_peak_auc_per_task`) is what the peak AUC reaches by
    chance.
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
    # the peak and n_memorization are maxima over runs, outside a run's family_alpha: the controlled task claim
    controlled = task_verdicts(results, regime=regime, by=by)
    if not controlled.empty:
        out = out.merge(controlled, on=["task", *by], how="left")
    return out.sort_values(["peak_auc", "task", *by], ascending=[False, True, *([True] * len(by))],
                           kind="mergesort").reset_index(drop=True)


def null_peak_auc_per_task(results: pd.DataFrame, *, regime: str | None = MAIN_REGIME,
                           by: tuple[str, ...] = ()) -> pd.DataFrame:
    """The null counterpart of each task's peak AUC: the same maximum (over the task's runs, epochs and
    competing score kinds) taken on null split j instead of the real split, for every null split index j;
    ``null_peak_auc`` is its 95th percentile over j (with one null split per checkpoint, that one maximum),
    ``null_peak_n`` the number of indices. A peak AUC below it is what chance reaches with that much
    selection, so "peak AUC 0.67" is read against it rather than against 0.5."""
    recs = _null_records_in_scope(results, regime, by)
    if recs.empty or not any(f"auc_{k}" in recs.columns for k in competing_kinds(results)):
        return pd.DataFrame()
    by = tuple(c for c in by if c in recs.columns)
    per_index = recs.groupby(["task", *by, "null_index"], sort=True)["_auc"].max().reset_index()
    rows = []
    for group, d in per_index.groupby(["task", *by], sort=True):
        group = group if isinstance(group, tuple) else (group,)
        rows.append({**dict(zip(("task", *by), group)), "null_peak_auc": float(np.percentile(d["_auc"], 95)),
                     "null_peak_n": int(len(d))})
    return pd.DataFrame(rows)


def split_validation(split_report: pd.DataFrame, *, tvd_max: float = 0.05, ks_max: float = 0.05) -> pd.DataFrame:
    """Tab. 6: member vs non-member distribution checks, one row per (task, label mode, seed, Q), from the
    split report Stage I writes (``split_report.parquet``: TVD, KS, p-value, Wasserstein).

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
    """App. 7.4: memorization flags with and without difficulty calibration, per Q and overall, from the
    results rows' ``calibrated_memorization_flag`` and ``raw_memorization_flag``.

    Both flags apply the same memorization rule (the sweep's, over the same competing score kinds): the
    calibrated flag to ΔS = S - S_ref (``calibrated_memorization_flag``), the raw flag to S alone
    (``raw_memorization_flag``). Collapsed checkpoints are left out (the paper compares over non-collapsed
    checkpoints: collapse takes precedence, so a collapsed checkpoint would count as a raw-only flag).
    ``level="run"`` counts a run as flagged if any of its checkpoints is. Also the mean AUC of the
    calibrated, uncalibrated and reference-only scores (of each row's headline kind).
    """
    df = filter_regime(results, regime).copy()
    if not include_base:
        df = fine_tuned_rows(df)
    # both flags are in every results table RunFolder reads (REQUIRED_RESULT_COLUMNS)
    df["_raw"] = df["raw_memorization_flag"].astype(bool)
    df["_cal"] = df["calibrated_memorization_flag"].astype(bool)
    df = df[df["outcome"] != Outcome.COLLAPSE.value]
    key = run_key_columns(df)
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
    """App. 7.3: manipulations (or categories) ranked by mean per-manipulation AUC (rank 1 = highest), from
    ``manipulation_auc.parquet``.

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
    """App. 7.3: from ``manipulation_auc.parquet`` and the results rows, over the checkpoints with detectable
    memorization only (``outcome == memorization``), each
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
    flagged = fine_tuned_rows(results)
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
    """Fig. 6: per task, cardinality / majority-class share / size / numeric share against outcomes, from
    the split report and the results rows.

    Characteristics are the median over the task's split reports (they do not depend on the split);
    outcome shares are over the task's runs at their peak checkpoints.
    """
    split = public_split_report(split_report)
    chars = [c for c in ("n_classes", "majority_share", "n_rows", "numeric_share") if c in split.columns]
    ch = split.groupby("task")[chars].median()
    peaks = peak_checkpoints(results, regime=regime)
    outcomes = outcome_order(peaks["outcome"]) if not peaks.empty else list(OUTCOMES)
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
    """Tab. 12: single_fixed vs multi_fixed vs multi_random, per (regime[, task], Q), from the results rows
    of every regime at each run's peak checkpoint."""
    peaks = peak_checkpoints(results, regime=None)
    if "regime" not in peaks.columns:
        peaks = peaks.assign(regime=MAIN_REGIME)
    keys = ["regime"] + (["task"] if by_task else []) + ["q"]
    outcomes = outcome_order(peaks["outcome"]) if not peaks.empty else list(OUTCOMES)
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
# The verdict rule and thresholds in force, and the blind baseline beside the verdicts
# --------------------------------------------------------------------------------------------------

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


def norm_setting(key: str, value: Any) -> str:
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
    ft = fine_tuned_rows(results)
    first = (ft if not ft.empty else results).iloc[0] if not results.empty else None
    if first is not None:
        for c in results.columns:
            if c.startswith("threshold_") and pd.notna(first[c]):
                recorded[c[len("threshold_"):]] = norm_setting(c[len("threshold_"):], first[c])
    config = sweep.outcome.model_dump(mode="json") if sweep is not None else None
    if config:
        first_keys = [k for k in THRESHOLD_MEANINGS if k in config]  # rule, strict, kinds first
        settings = {k: norm_setting(k, config[k]) for k in [*first_keys, *(k for k in config if k not in first_keys)]}
        source = f"the run's config ({SWEEP_FILE}, outcome block)"
    elif recorded:
        settings, source = dict(recorded), "the results table (threshold_* columns; no sweep.json)"
    else:
        return {}, "not recorded", []
    disagree = [k for k in settings if k in recorded and recorded[k] != settings[k]]
    return settings, source, disagree


def rule_in_force(results: pd.DataFrame, settings: Mapping[str, str]) -> str:
    """The VerdictRule value of the ``outcome`` column (e.g. ``selection_aware_strict``)."""
    if "rule" in settings:
        try:
            return VerdictRule.of(settings["rule"], settings.get("strict") == "yes").value
        except ValueError:
            pass
    if "rule" in results.columns and results["rule"].notna().any():
        return str(results["rule"].dropna().iloc[0])
    default = OutcomeConfig()  # neither config nor rows say: the schema's default rule
    return VerdictRule.of(default.rule, default.strict).value


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
