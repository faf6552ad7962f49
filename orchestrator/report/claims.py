"""Claims beyond one run's headline (#43) and their measured false-positive rates: the task-level peak and "some
run of the task" (maxima over runs, outside the selection-aware bound), Tab. 8's controlled ``task_verdict``, and
"IclMem or any reference-model attack" (an OR over verdicts). Pure pandas, from the results rows and their null
splits (:mod:`orchestrator.report.null_rates`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from iclmem.record import ATTACK_VERDICT_COLUMN
from iclmem.vocab import Outcome, OutcomeRule, VerdictRule
from orchestrator.report.null_rates import (
    null_records,
    null_records_in_scope,
    null_run_headlines,
    with_competing_null_scores,
)
from orchestrator.report.selection import (
    DETECTABLE,
    MAIN_REGIME,
    RUN_KEY,
    competing_kinds,
    filter_regime,
    fine_tuned_rows,
    run_key_columns,
)
from orchestrator.schema.config import OutcomeConfig
from probes.attacks.membership import attack_peak
from probes.metrics import clopper_pearson

__all__ = [
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
    "recorded_rule",
]


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


def recorded_rule(results: pd.DataFrame) -> str:
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
    outcome = f"outcome_{VerdictRule.of(OutcomeRule.SELECTION_AWARE, recorded_rule(results).endswith('_strict')).value}"
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
    recs = null_records_in_scope(results, regime, by)
    if recs.empty:
        return pd.DataFrame(columns=list(CLAIM_RATE_COLUMNS))
    by = tuple(c for c in by if c in recs.columns)
    group = ["task", *by, "null_index"]
    key = [c for c in RUN_KEY if c in recs.columns]
    peaks = (recs.assign(_neg=-recs["_auc"].fillna(-np.inf))
             .sort_values([*group, "_neg", "epoch", *key], kind="mergesort").drop_duplicates(group, keep="first"))
    heads = null_run_headlines(recs)
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
    earliest, as :func:`probes.attacks.membership.attack_run_headline` picks it). Each verdict keeps family_alpha alone;
    their OR over IclMem and six attack verdicts can reach seven times that."""
    attacks = _attack_null_records(results)
    if attacks.empty:
        return pd.DataFrame(columns=list(CLAIM_RATE_COLUMNS))
    rule = rule or recorded_rule(results)
    col = f"outcome_{rule}"
    key = [c for c in RUN_KEY if c in attacks.columns]
    recs = null_records(results)
    if not recs.empty and col in recs.columns:
        recs = with_competing_null_scores(recs, results)
        iclmem = recs.assign(memorization=recs[col] == DETECTABLE)
        iclmem_heads = null_run_headlines(recs)
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
