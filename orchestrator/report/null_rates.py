"""The verdicts' measured error rate: every rule's false-positive rate on the null splits (two disjoint sets of
rows the run never saw, labelled member and non-member), per checkpoint and per run headline, and what a task's
peak AUC reaches on them by chance. Pure pandas, from the results rows' ``null_evidence``."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from iclmem.vocab import Outcome, VerdictRule
from orchestrator.report.selection import (
    DETECTABLE,
    MAIN_REGIME,
    RUN_KEY,
    competing_kinds,
    filter_regime,
    fine_tuned_rows,
    run_key_columns,
)
from probes.metrics import clopper_pearson

__all__ = [
    "ERROR_RATE_LEVELS",
    "null_records",
    "null_error_rates",
    "with_competing_null_scores",
    "null_run_headlines",
    "null_records_in_scope",
    "null_peak_auc_per_task",
]

ERROR_RATE_LEVELS: tuple[str, ...] = ("checkpoint", "run_headline")


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
    recs = with_competing_null_scores(recs, results)
    heads = null_run_headlines(recs)
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


def with_competing_null_scores(recs: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """Null records with ``_auc``, the highest calibrated AUC over the competing kinds (what a headline or a
    peak is picked by), and ``_p``, the smallest one-sided p-value over them (NaN where the records carry none)."""
    kinds = competing_kinds(results)
    aucs = [f"auc_{k}" for k in kinds if f"auc_{k}" in recs.columns]
    ps = [f"p_value_{k}" for k in kinds if f"p_value_{k}" in recs.columns]
    return recs.assign(_auc=recs[aucs].astype(float).max(axis=1),
                       _p=recs[ps].astype(float).min(axis=1) if ps else np.nan)


def null_run_headlines(recs: pd.DataFrame) -> pd.DataFrame:
    """One null trial per (run, null split index): the one the run's headline picks on that null split (the
    highest ``_auc``, ties to the earliest epoch), as :func:`peak_checkpoints` picks it on the real split."""
    key = [c for c in RUN_KEY if c in recs.columns] + ["null_index"]
    return (recs.assign(_neg=-recs["_auc"].fillna(-np.inf))
            .sort_values(key + ["_neg", "epoch"], kind="mergesort").drop_duplicates(key, keep="first")
            .drop(columns="_neg"))


def null_records_in_scope(results: pd.DataFrame, regime: str | None, by: tuple[str, ...]) -> pd.DataFrame:
    """:func:`null_records` of ``regime``'s fine-tuned checkpoints with ``_auc`` / ``_p`` and the grid axes
    ``by`` (taken from each run's rows: the null records carry only the run key)."""
    scoped = filter_regime(results, regime)
    recs = null_records(scoped)
    if recs.empty:
        return recs
    recs = with_competing_null_scores(recs, results)
    missing = [c for c in by if c in scoped.columns and c not in recs.columns]
    if missing:
        key = [c for c in run_key_columns(scoped) if c in recs.columns]
        recs = recs.merge(scoped[key + missing].drop_duplicates(key), on=key, how="left")
    return recs


def null_peak_auc_per_task(results: pd.DataFrame, *, regime: str | None = MAIN_REGIME,
                           by: tuple[str, ...] = ()) -> pd.DataFrame:
    """The null counterpart of each task's peak AUC: the same maximum (over the task's runs, epochs and
    competing score kinds) taken on null split j instead of the real split, for every null split index j;
    ``null_peak_auc`` is its 95th percentile over j (with one null split per checkpoint, that one maximum),
    ``null_peak_n`` the number of indices. A peak AUC below it is what chance reaches with that much
    selection, so "peak AUC 0.67" is read against it rather than against 0.5."""
    recs = null_records_in_scope(results, regime, by)
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
