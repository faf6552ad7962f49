"""Reference-model membership attacks: LiRA (online, offline) and RMIA, on per-query statistics.

Pure numpy / scipy, no Ray. The inputs are one statistic per query on the audited (target) checkpoint
and on each of K reference checkpoints (fine-tuned with the same recipe on random halves of the target's
population P = members and non-members), and which queries each reference trained on. Orientation as in
``probes.metrics.membership_score``: a higher statistic is more member-like.

* **LiRA online** (Carlini et al. 2022, "Membership Inference Attacks From First Principles"): per query,
  Gaussians fitted to its statistics under the references that trained on it (in) and those that did not
  (out); score = log N(s; mu_in, sigma_in) - log N(s; mu_out, sigma_out). With few references a per-query
  variance is noise, so, as Carlini et al. do below 64 shadow models ("fixed variance"), one global
  standard deviation of all in-statistics (and one of all out-statistics) replaces it; the means stay
  per query (the median, as in their code). **The statistic, as Carlini et al. score augmentations**:
  the logit-scaled confidence φ = log p(y*) - log(1 - p(y*)) under each of the probe's M manipulations
  (for the known-context statistic, the one context C'), each (query, manipulation) with its own Gaussians
  (the pooled deviation is then one per manipulation), and the query's score the mean of its M
  per-manipulation scores. A run folder written before the per-manipulation logits were stored falls
  back to one base-calibrated statistic per query.
* **LiRA offline**: one-sided, out-references only: score = -log P(S >= s) under N(mu_out, sigma_out).
* **RMIA** (Zarifzadeh et al. 2024, "Low-Cost High-Power Membership Inference Attacks"):
  LR(x) = p(x | target) / mean_k p(x | reference_k), with p(x | model) the model's probability of the
  query's label (here exp(-S_loss): the geometric mean of p(y*) over the probe's manipulations), and
  score(x) = share of population samples z with LR(x) / LR(z) > gamma (gamma = 1). Our adaptation: the
  population samples z are the other queries of the audit (members and non-members alike; there are no
  spare rows of P that no model saw), and Pr(x) is the mean over all K references (each query is in about
  half of them, the paper's online setting), so no offline scaling factor a is needed. For any fixed
  population the score is a non-decreasing function of LR(x), so every ROC-based figure (AUC, TPR at a
  FPR, the ε bound) is that of LR(x) itself: another population (e.g. rows no model saw) could only merge
  ranks into ties, not reorder them (tests/test_attacks.py).

**Verdicts.** Every attack is judged by IclMem's own memorization rule (``probes.outcomes.memorization_holds``,
the sweep's ``OutcomeThresholds``): at each checkpoint it is ``memorization`` or ``no_signal``
(:func:`attack_verdict`), and so is each of its attack null splits, whose memorization verdicts are false
positives. Under ``selection_aware`` the family of an attack's run headline (:func:`attack_run_headline`:
the checkpoint with the attack's highest AUC) is the run's checkpoints times its one score
(:data:`ATTACK_COMPETING_SCORES`), so the p-value bar is ``family_alpha / checkpoints``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from iclmem.errors import ProbeError
from iclmem.stats import DEFAULT_RESAMPLES
from iclmem.vocab import Attack, Calibration, Outcome, ScoreKind
from probes.epsilon import DEFAULT_EPSILON_DELTA, epsilon_lower_bound
from probes.metrics import CheckpointMetrics, clopper_pearson, membership_metrics, roc_curve
from probes.outcomes import OutcomeThresholds, memorization_holds, peak_checkpoint

# Below this many in- (and out-) references per query the variance is pooled over all queries (Carlini et
# al. fix the variance below 64 shadow models, i.e. 32 in and 32 out per example).
PER_QUERY_VARIANCE_MIN = 32
RMIA_GAMMA = 1.0
_SIGMA_FLOOR = 1e-12  # keeps a degenerate (constant) statistic from dividing by zero
# A query table's per-manipulation LiRA statistics: ``logit_<manipulation name>`` (probes.query_tables.query_table)
LOGIT_PREFIX = "logit_"
_LOGIT_LOSS_FLOOR = 1e-12  # p(y*) = 1 would make the logit infinite: the loss is floored here first


def logit_of_loss(loss: Any) -> np.ndarray:
    """φ = log p - log(1 - p) of p = exp(-loss), computed from the loss without forming p (stable near p = 1,
    where 1 - p underflows): φ = -loss - log(1 - exp(-loss))."""
    x = np.maximum(np.asarray(loss, dtype=np.float64), _LOGIT_LOSS_FLOOR)
    return np.asarray(-x - np.log(-np.expm1(-x)), dtype=np.float64)


@dataclass(frozen=True)
class ReferenceStatistics:
    """One statistic per query (or one per query and manipulation) on the target and on each reference,
    and which references trained on each query.

    ``target``: float64 [n], or [n, M] with one column per probe manipulation; ``references``: float64
    [K, n] (or [K, n, M]); ``in_reference``: bool [K, n], True where reference k fine-tuned on query i (with
    the same label the target would have trained it on). With M columns LiRA fits one Gaussian per
    (query, manipulation) and averages the per-manipulation scores, as Carlini et al. score augmentations."""

    target: np.ndarray
    references: np.ndarray
    in_reference: np.ndarray

    def __post_init__(self) -> None:
        t = np.asarray(self.target, dtype=np.float64)
        t = t.reshape(-1) if t.ndim != 2 else t
        r = np.asarray(self.references, dtype=np.float64)
        m = np.asarray(self.in_reference, dtype=bool)
        if r.ndim != t.ndim + 1 or r.shape[1:] != t.shape or m.shape != r.shape[:2]:
            raise ProbeError(f"reference statistics: target {t.shape}, references {r.shape}, in-reference mask "
                             f"{m.shape}: need target [n] (or [n, M]), references [K, n] (or [K, n, M]), mask [K, n]")
        if r.shape[0] < 1:
            raise ProbeError("reference statistics: no reference model")
        if not (np.isfinite(t).all() and np.isfinite(r).all()):
            raise ProbeError("reference statistics: non-finite statistic (NaN or infinite score)")
        for name, value in (("target", t), ("references", r), ("in_reference", m)):
            value.flags.writeable = False
            object.__setattr__(self, name, value)

    @property
    def n_references(self) -> int:
        return int(self.references.shape[0])

    @property
    def n_manipulations(self) -> int:
        """M: the statistics per query (1 for a single statistic)."""
        return 1 if self.target.ndim == 1 else int(self.target.shape[1])


@dataclass(frozen=True)
class GaussianFit:
    """Per-query (per (query, manipulation) with M statistics: [n, M]) Gaussian parameters of the in- and
    out-reference statistics (NaN mean: no such reference)."""

    mu_in: np.ndarray
    sigma_in: np.ndarray
    mu_out: np.ndarray
    sigma_out: np.ndarray
    global_variance: bool  # True: the sigmas are the pooled (Carlini "fixed variance") ones


def _broadcast_mask(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The [K, n] mask shaped to broadcast over [K, n] or [K, n, M] values."""
    return mask.reshape(mask.shape + (1,) * (values.ndim - mask.ndim))


def _masked_median(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    masked = np.where(_broadcast_mask(mask, values), values, np.nan)
    out = np.full(values.shape[1:], np.nan)
    has = mask.any(axis=0)
    out[has] = np.nanmedian(masked[:, has], axis=0)
    return out


def _sigma(values: np.ndarray, mask: np.ndarray, per_query: bool) -> np.ndarray:
    if per_query:
        masked = np.where(_broadcast_mask(mask, values), values, np.nan)
        with np.errstate(invalid="ignore"):
            sd = np.nanstd(masked, axis=0)
        return np.asarray(np.maximum(np.nan_to_num(sd, nan=_SIGMA_FLOOR), _SIGMA_FLOOR), dtype=np.float64)
    pooled = values[mask]  # [count] or [count, M]: one pooled deviation per manipulation
    sd = np.std(pooled, axis=0) if pooled.shape[0] > 1 else np.zeros(pooled.shape[1:])
    return np.asarray(np.broadcast_to(np.maximum(sd, _SIGMA_FLOOR), values.shape[1:]), dtype=np.float64).copy()


def _per_query(scores: np.ndarray) -> np.ndarray:
    """[n] scores from [n] or [n, M] per-manipulation ones (their mean: Carlini et al.'s combination of
    augmentations)."""
    return np.asarray(scores.mean(axis=1) if scores.ndim == 2 else scores, dtype=np.float64)


def fit_gaussians(stats: ReferenceStatistics, per_query_min: int = PER_QUERY_VARIANCE_MIN) -> GaussianFit:
    """Per-query means of the in and out statistics; per-query standard deviations only when every query
    has at least ``per_query_min`` in- and out-references, else one pooled deviation per side."""
    r, m = stats.references, stats.in_reference
    n_in, n_out = m.sum(axis=0), (~m).sum(axis=0)
    per_query = bool(min(int(n_in.min()), int(n_out.min())) >= per_query_min)
    return GaussianFit(mu_in=_masked_median(r, m), sigma_in=_sigma(r, m, per_query),
                       mu_out=_masked_median(r, ~m), sigma_out=_sigma(r, ~m, per_query),
                       global_variance=not per_query)


def lira_offline(stats: ReferenceStatistics, fit: GaussianFit | None = None) -> np.ndarray:
    """-log P(S >= s) under each query's out-Gaussian: large when the target's statistic sits far above
    what models that never saw the query give it. A query no reference left out scores 0 (no evidence)."""
    return _per_query(_lira_offline_each(stats, fit or fit_gaussians(stats)))


def _lira_offline_each(stats: ReferenceStatistics, fit: GaussianFit) -> np.ndarray:
    from scipy.stats import norm  # imported on use: scipy.stats is slow to import (0.6 s of every probe actor's start)

    score = -norm.logsf(stats.target, loc=np.nan_to_num(fit.mu_out), scale=fit.sigma_out)
    return np.asarray(np.where(np.isnan(fit.mu_out), 0.0, score), dtype=np.float64)


def lira_online(stats: ReferenceStatistics, fit: GaussianFit | None = None) -> np.ndarray:
    """log N(s; mu_in, sigma_in) - log N(s; mu_out, sigma_out) per query. A query with no in-reference
    falls back to its offline score, one with no out-reference to 0."""
    from scipy.stats import norm

    fit = fit or fit_gaussians(stats)
    s = stats.target
    ratio = (norm.logpdf(s, loc=np.nan_to_num(fit.mu_in), scale=fit.sigma_in)
             - norm.logpdf(s, loc=np.nan_to_num(fit.mu_out), scale=fit.sigma_out))
    offline = _lira_offline_each(stats, fit)
    out = np.where(np.isnan(fit.mu_in), offline, ratio)
    return _per_query(np.where(np.isnan(fit.mu_out), 0.0, out))


def rmia(target_log_p: np.ndarray, reference_log_p: np.ndarray, gamma: float = RMIA_GAMMA) -> np.ndarray:
    """RMIA scores from log p(x | model) of each query on the target [n] and on the references [K, n]:
    the share of the other queries z with LR(x) / LR(z) > gamma (see the module docstring)."""
    t = np.asarray(target_log_p, dtype=np.float64).reshape(-1)
    r = np.asarray(reference_log_p, dtype=np.float64)
    if r.ndim != 2 or r.shape[1] != t.size or r.shape[0] < 1 or t.size < 2:
        raise ProbeError(f"RMIA: target {t.shape}, references {r.shape}: need [n] and [K, n], n >= 2")
    if not (np.isfinite(t).all() and np.isfinite(r).all()):
        raise ProbeError("RMIA: non-finite log-probability")
    if not gamma > 0:
        raise ProbeError(f"RMIA: gamma must be > 0, got {gamma}")
    # log Pr(x) = log mean_k p(x | ref_k), computed stably in log space
    log_pr = np.logaddexp.reduce(r, axis=0) - np.log(r.shape[0])
    log_lr = t - log_pr
    # LR(x)/LR(z) > gamma  <=>  log LR(z) < log LR(x) - log gamma; z ranges over the other queries
    sorted_lr = np.sort(log_lr)
    below = np.searchsorted(sorted_lr, log_lr - np.log(gamma), side="left")
    self_counted = (log_lr < log_lr - np.log(gamma)).astype(np.int64)  # only when gamma < 1
    return np.asarray((below - self_counted) / (t.size - 1), dtype=np.float64)


def attack_scores(attack: Attack, stats: ReferenceStatistics, target_log_p: np.ndarray | None = None,
                  reference_log_p: np.ndarray | None = None) -> np.ndarray:
    """One attack's per-query membership scores (higher = member)."""
    attack = Attack(attack)
    if attack == Attack.LIRA_ONLINE:
        return lira_online(stats)
    if attack == Attack.LIRA_OFFLINE:
        return lira_offline(stats)
    if target_log_p is None or reference_log_p is None:
        raise ProbeError("RMIA needs the log-probabilities of the queries' labels on the target and references")
    return rmia(target_log_p, reference_log_p)


_STREAM_ATTACK_NULL = 18


def attack_null_split(n_nonmembers: int, index: int, seed: int) -> np.ndarray:
    """bool [n_nonmembers]: a random half of the target's non-members labelled "member" (the rest stay
    "non-member"). The target trained on none of them, but each is in about half of the references, so
    every attack is defined on them exactly as on the real split: its detections there are false positives."""
    if n_nonmembers < 2:
        raise ProbeError(f"an attack null split needs >= 2 non-members, got {n_nonmembers}")
    rng = np.random.default_rng([_STREAM_ATTACK_NULL, int(seed), int(index)])
    fake = np.zeros(n_nonmembers, dtype=bool)
    fake[rng.permutation(n_nonmembers)[: n_nonmembers // 2]] = True
    return fake


ATTACK_ALPHAS: tuple[float, ...] = (0.01, 0.001)  # TPR at 1% and 0.1% FPR, with Clopper-Pearson intervals
# An attack's run headline is the maximum of its one score over the run's checkpoints: the selection-aware
# family is checkpoints x 1 (IclMem's own is checkpoints x competing score kinds).
ATTACK_COMPETING_SCORES = 1


def attack_alphas(thresholds: OutcomeThresholds) -> tuple[float, ...]:
    """The FPRs an attack's TPR is reported at: 1%, 0.1% and the verdict rule's ``memorization_alpha``."""
    return tuple(dict.fromkeys([*ATTACK_ALPHAS, float(thresholds.memorization_alpha)]))


def attack_verdict(m: CheckpointMetrics, thresholds: OutcomeThresholds, n_checkpoints: int) -> Outcome:
    """One attack's outcome at one checkpoint: ``memorization`` when IclMem's memorization rule
    (:func:`probes.outcomes.memorization_holds`, the sweep's thresholds and rule) holds on the attack's
    metrics, with the selection-aware family ``n_checkpoints`` x :data:`ATTACK_COMPETING_SCORES`; else
    ``no_signal`` (collapse, inversion and overfitting describe the model, not an attack's scores)."""
    holds = memorization_holds(m, thresholds, n_checkpoints, n_competing=ATTACK_COMPETING_SCORES)
    return Outcome.MEMORIZATION if holds else Outcome.NO_SIGNAL


def attack_metric_columns(scores: np.ndarray, member: np.ndarray, prefix: str, *, n_resamples: int,
                          seed: int = 0, epsilon_delta: float = DEFAULT_EPSILON_DELTA,
                          thresholds: OutcomeThresholds | None = None, n_checkpoints: int = 1) -> dict[str, Any]:
    """AUC with its stratified-bootstrap interval and Mann-Whitney p-value, TPR at 1%, 0.1% and the rule's
    ``memorization_alpha`` FPR with Clopper-Pearson intervals over the members (the counts behind each TPR
    are kept too), the ε lower bound the attack proves at δ = ``epsilon_delta``
    (:func:`probes.epsilon.epsilon_lower_bound`, the same construction as IclMem's own score), and the
    attack's verdict under ``thresholds`` (:func:`attack_verdict`; default: ``OutcomeThresholds()``) with
    the p-value bar it used, as ``<prefix>auc``, ``<prefix>tpr_at_1pct``, ``<prefix>tpr_at_0_1pct_low``,
    ``<prefix>epsilon_lb``, ``<prefix>outcome``, ``<prefix>p_value_threshold``, ..."""
    th = thresholds or OutcomeThresholds()
    alphas = attack_alphas(th)
    member = np.asarray(member, dtype=bool)
    m = membership_metrics(scores[member], scores[~member], ScoreKind.LOSS, Calibration.CALIBRATED,
                           alphas=alphas, n_resamples=n_resamples, seed=seed)
    out: dict[str, Any] = {f"{prefix}auc": m.auc, f"{prefix}auc_low": m.auc_interval.low,
                           f"{prefix}auc_high": m.auc_interval.high, f"{prefix}p_value": m.p_value}
    for alpha in alphas:
        t = m.tpr_at(alpha)
        cp = clopper_pearson(t.n_true_positives, t.n_members)
        label = f"{prefix}tpr_at_{alpha * 100:g}pct".replace(".", "_")  # 0.1% -> tpr_at_0_1pct (no dot in a key)
        out.update({label: t.tpr, f"{label}_low": cp.low, f"{label}_high": cp.high,
                    f"{label}_realized_fpr": t.realized_fpr, f"{label}_n_true_positives": t.n_true_positives})
    out[f"{prefix}n_members"], out[f"{prefix}n_nonmembers"] = int(member.sum()), int((~member).sum())
    out[f"{prefix}epsilon_lb"] = epsilon_lower_bound(scores[member], scores[~member], epsilon_delta).epsilon
    out[f"{prefix}outcome"] = attack_verdict(m, th, n_checkpoints).value
    out[f"{prefix}p_value_threshold"] = th.p_value_threshold(n_checkpoints, ATTACK_COMPETING_SCORES)
    return out


@dataclass(frozen=True)
class AttackInputs:
    """Everything the attacks read for one target checkpoint, aligned by query: the target's member flags
    [n]; per statistic, the LiRA statistic (higher = member) and log p(label) for RMIA on the target [n]
    and on the references [K, n]; which references trained on each query [K, n]."""

    member: np.ndarray
    stats: ReferenceStatistics
    target_log_p: np.ndarray
    reference_log_p: np.ndarray


def evaluate_attacks(inputs: AttackInputs, *, prefix: str = "", n_resamples: int = DEFAULT_RESAMPLES, null_splits: int = 1,
                     seed: int = 0, epsilon_delta: float = DEFAULT_EPSILON_DELTA,
                     thresholds: OutcomeThresholds | None = None, n_checkpoints: int = 1,
                     ) -> tuple[dict[str, Any], dict[str, dict[str, list[float]]]]:
    """Every attack's metric columns and verdict on the real split (``<prefix><attack>_auc``, ...,
    ``_outcome``; :func:`attack_metric_columns`) and on ``null_splits`` attack null splits
    (:func:`attack_null_split`: ``<prefix><attack>_null_auc`` (their mean), ``_null_detections`` (splits
    whose AUC interval lies above 0.5), ``_null_memorization`` (splits the same verdict rule calls
    memorization: false positives) and ``_null_evidence`` (JSON, per split: sizes, AUC, interval, p-value,
    TPR at ``memorization_alpha`` and verdict)), and the ROC curve (fpr, tpr) of each attack.
    ``thresholds`` / ``n_checkpoints``: the sweep's verdict rule and how many checkpoints the run's
    headline selects from (:func:`attack_verdict`)."""
    th = thresholds or OutcomeThresholds()
    member = np.asarray(inputs.member, dtype=bool)
    columns: dict[str, Any] = {f"{prefix}attack_references": inputs.stats.n_references,
                               f"{prefix}attack_global_variance": fit_gaussians(inputs.stats).global_variance}
    curves: dict[str, dict[str, list[float]]] = {}
    for attack in Attack:
        scores = attack_scores(attack, inputs.stats, inputs.target_log_p, inputs.reference_log_p)
        cols, curves[attack.value] = score_columns(scores, member, f"{prefix}{attack.value}_", n_resamples=n_resamples,
                                                   null_splits=null_splits, seed=seed, epsilon_delta=epsilon_delta,
                                                   thresholds=th, n_checkpoints=n_checkpoints)
        columns.update(cols)
    return columns, curves


def score_columns(scores: np.ndarray, member: np.ndarray, prefix: str, *, n_resamples: int, null_splits: int,
                  seed: int = 0, epsilon_delta: float = DEFAULT_EPSILON_DELTA,
                  thresholds: OutcomeThresholds | None = None, n_checkpoints: int = 1,
                  ) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """One membership score's columns (higher = member; :func:`attack_metric_columns` on the real split, and
    ``null_splits`` attack null splits of its non-members, see :func:`evaluate_attacks`) and its ROC curve
    (fpr, tpr). The one implementation behind every attack of a sweep and of the deployed-context audit."""
    th = thresholds or OutcomeThresholds()
    member = np.asarray(member, dtype=bool)
    scores = np.asarray(scores, dtype=np.float64)
    columns = attack_metric_columns(scores, member, prefix, n_resamples=n_resamples, seed=seed,
                                    epsilon_delta=epsilon_delta, thresholds=th, n_checkpoints=n_checkpoints)
    curve = roc_curve(scores[member], scores[~member])
    nonmember_pos = np.flatnonzero(~member)
    records: list[dict[str, Any]] = []
    for j in range(null_splits):
        fake = attack_null_split(len(nonmember_pos), j, seed)
        sub = scores[nonmember_pos]
        m = membership_metrics(sub[fake], sub[~fake], ScoreKind.LOSS, Calibration.CALIBRATED,
                               alphas=(0.01, th.memorization_alpha), n_resamples=n_resamples, seed=seed)
        records.append({"index": j, "n_members": int(fake.sum()), "n_nonmembers": int((~fake).sum()),
                        "auc": m.auc, "auc_low": m.auc_interval.low, "auc_high": m.auc_interval.high,
                        "p_value": m.p_value, "tpr_at_alpha": m.tpr_at(th.memorization_alpha).tpr,
                        "outcome": attack_verdict(m, th, n_checkpoints).value})
    columns[f"{prefix}null_splits"] = null_splits
    columns[f"{prefix}null_auc"] = float(np.mean([r["auc"] for r in records])) if records else float("nan")
    columns[f"{prefix}null_detections"] = sum(r["auc_low"] > 0.5 for r in records)
    columns[f"{prefix}null_memorization"] = sum(r["outcome"] == Outcome.MEMORIZATION.value for r in records)
    columns[f"{prefix}null_evidence"] = json.dumps(records, sort_keys=True)
    return columns, {"fpr": [float(v) for v in curve.fpr], "tpr": [float(v) for v in curve.tpr]}


def attack_peak(epochs: Sequence[int], aucs: Sequence[float]) -> int | None:
    """Position of one attack's run headline among a run's checkpoints: the highest AUC, ties to the
    earliest epoch, NaN skipped -- :func:`probes.outcomes.peak_checkpoint`, IclMem's own peak selection, on
    the attack's one score. None when no checkpoint has an AUC."""
    rows = [{"epoch": int(e), f"calibrated_{ScoreKind.LOSS.value}_auc": float(a)} for e, a in zip(epochs, aucs)]
    if all(math.isnan(r[f"calibrated_{ScoreKind.LOSS.value}_auc"]) for r in rows):
        return None
    return peak_checkpoint(rows, kinds=(ScoreKind.LOSS,)).index


def attack_run_headline(epochs: Sequence[int], aucs: Sequence[float], outcomes: Sequence[str],
                        null_evidence: Sequence[Sequence[Mapping[str, Any]]], prefix: str = "") -> dict[str, Any]:
    """One attack's run headline from its per-checkpoint columns (one entry per checkpoint of the run: epoch,
    ``<attack>_auc``, ``<attack>_outcome`` and the parsed ``<attack>_null_evidence`` records):

    * ``<prefix>run_outcome``, ``_run_epoch``, ``_run_auc``: the verdict at the checkpoint with the attack's
      highest AUC (:func:`attack_peak`), as IclMem's run headline is its peak checkpoint's;
    * ``<prefix>run_null_splits``, ``_run_null_memorization``: attack null split j of every checkpoint is one
      null run (the same rows throughout); its headline is picked on the null split exactly as on the real
      one (highest null AUC) and counted when its verdict is memorization -- a false positive."""
    if not len(epochs) == len(aucs) == len(outcomes) == len(null_evidence):
        raise ProbeError("attack run headline: one epoch, AUC, outcome and null evidence per checkpoint")
    out: dict[str, Any] = {f"{prefix}run_outcome": None, f"{prefix}run_epoch": math.nan, f"{prefix}run_auc": math.nan}
    peak = attack_peak(epochs, aucs)
    if peak is not None:
        out[f"{prefix}run_outcome"] = str(outcomes[peak])
        out[f"{prefix}run_epoch"] = float(epochs[peak])
        out[f"{prefix}run_auc"] = float(aucs[peak])
    heads = null_headline_outcomes(epochs, null_evidence)
    out[f"{prefix}run_null_splits"] = len(heads)
    out[f"{prefix}run_null_memorization"] = sum(o == Outcome.MEMORIZATION.value for o in heads.values())
    return out


def null_headline_outcomes(epochs: Sequence[int], null_evidence: Sequence[Sequence[Mapping[str, Any]]]
                           ) -> dict[int, str | None]:
    """Per attack null split j (one null run: the same rows at every checkpoint): the verdict at its headline,
    the checkpoint of highest null AUC (:func:`attack_peak`), picked as on the real split; None where no AUC is
    finite. ``null_evidence``: per checkpoint, its parsed ``<attack>_null_evidence`` records."""
    by_split: dict[int, list[tuple[int, float, str]]] = {}
    for epoch, records in zip(epochs, null_evidence):
        for r in records:
            by_split.setdefault(int(r["index"]), []).append((int(epoch), float(r["auc"]), str(r["outcome"])))
    out: dict[int, str | None] = {}
    for j, trials in by_split.items():
        head = attack_peak([t[0] for t in trials], [t[1] for t in trials])
        out[j] = None if head is None else trials[head][2]
    return out


__all__ = ["LOGIT_PREFIX", "logit_of_loss", "AttackInputs", "evaluate_attacks", "attack_metric_columns", "ATTACK_ALPHAS", "ReferenceStatistics", "GaussianFit", "fit_gaussians", "lira_online", "lira_offline", "rmia",
           "attack_scores", "attack_null_split", "PER_QUERY_VARIANCE_MIN",
           "RMIA_GAMMA", "ATTACK_COMPETING_SCORES", "attack_alphas", "attack_verdict", "attack_peak",
           "attack_run_headline", "null_headline_outcomes"]
