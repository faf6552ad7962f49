"""Membership-inference metrics for one checkpoint (IclMem Stage II, spec "Metrics").

Pure numpy/scipy/pandas. Shapes follow TensorFlow Privacy's ``membership_inference_attack``
data structures: typed frozen dataclasses that carry the numbers, metrics as functions or methods.

Conventions used everywhere in this module

* **Members are the positive class.** Every metric takes *membership scores*: higher means "more
  likely a member". :func:`membership_score` is the one place that turns a raw score difference into
  a membership score (``-delta`` for loss and entropy, ``+delta`` for confidence).
* **AUC** is the Mann-Whitney statistic ``P(s_member > s_nonmember) + 0.5 * P(tie)``.
* **TPR at FPR alpha** allows ``floor(alpha * n_nonmembers)`` false positives, predicts "member" iff
  ``score > threshold`` (strict) and breaks ties pessimistically; see :func:`tpr_at_fpr`.
* **Bootstrap** intervals are stratified (members and non-members resampled separately, with
  replacement, each to its own size), seeded, and fully vectorised over resamples; the interval is the
  percentile interval of the resampled statistic.
* NaN scores are refused with :class:`~iclmem.errors.ProbeError` (a NaN would silently poison ranks);
  ``+-inf`` is allowed and ranks like any other value.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from iclmem.errors import ProbeError
from iclmem.vocab import SCORE_KINDS, Calibration, ScoreKind
from probes.epsilon import DEFAULT_EPSILON_DELTA, EpsilonBound, epsilon_lower_bound
from probes.gdp import GdpBound, gdp_mu_lower_bound

__all__ = [
    "ScoreKind",
    "Calibration",
    "SCORE_KINDS",
    "SCORES_TABLE_COLUMNS",
    "DEFAULT_ALPHAS",
    "LowResolutionWarning",
    "membership_score",
    "auc",
    "TprAtFpr",
    "allowed_false_positives",
    "tpr_at_fpr",
    "RocCurve",
    "roc_curve",
    "Interval",
    "BootstrapReplicates",
    "bootstrap_indices",
    "bootstrap_replicates",
    "BootstrapIntervals",
    "bootstrap_intervals",
    "CheckpointMetrics",
    "membership_metrics",
    "mann_whitney_p",
    "clopper_pearson",
    "SplitScores",
    "MembershipInput",
    "validate_scores_table",
    "robustness_scores",
    "per_manipulation_auc",
    "GapStats",
    "gap_stats",
    "loss_ratio",
    "output_std",
]


# --------------------------------------------------------------------------------------------------
# vocabularies and orientation
# --------------------------------------------------------------------------------------------------


SCORES_TABLE_COLUMNS: tuple[str, ...] = (
    "query_id",
    "member",
    "manipulation",
    "category",
    "loss",
    "entropy",
    "confidence",
)

DEFAULT_ALPHAS: tuple[float, ...] = (0.01, 0.10)

# floor(alpha * n) is taken after adding this, so that e.g. 0.29 * 100 = 28.999999999999996 -> 29.
_FLOOR_EPS = 1e-9


class LowResolutionWarning(UserWarning):
    """TPR@alpha is estimated from fewer than 10 allowed false positives (alpha * n_nonmembers < 10)."""


def membership_score(kind: ScoreKind | str, delta: Any) -> np.ndarray:
    """Orient a score (difference) so that members are the positive class.

    THE single place orientation is written. Fine-tuning on a row lowers its loss and entropy and
    raises its confidence, so the membership score is ``-delta`` for ``loss`` and ``entropy`` and
    ``+delta`` for ``confidence``. Higher membership score = more likely a member. ``delta`` is usually
    ``Delta S = S - S_ref`` but the same orientation applies to ``S`` or ``S_ref`` alone.
    """
    kind = _kind(kind)
    arr = np.asarray(delta, dtype=np.float64)
    if kind in (ScoreKind.LOSS, ScoreKind.ENTROPY):
        return -arr
    return arr.copy()


def _kind(kind: ScoreKind | str) -> ScoreKind:
    try:
        return ScoreKind(kind)
    except ValueError:
        raise ProbeError(
            f"unknown score kind {kind!r}; expected one of {[k.value for k in ScoreKind]}"
        ) from None


def _scores(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ProbeError(f"{name}: no scores (need at least one member and one non-member)")
    n_nan = int(np.isnan(arr).sum())
    if n_nan:
        raise ProbeError(f"{name}: {n_nan} of {arr.size} scores are NaN")
    return arr


# --------------------------------------------------------------------------------------------------
# AUC
# --------------------------------------------------------------------------------------------------


def _member_rank_sums(member: np.ndarray, nonmember: np.ndarray) -> np.ndarray:
    """Row-wise sum of the members' average ranks in the pooled sample.

    ``member``: [B, n_m], ``nonmember``: [B, n_n]. Ranks are 1-based with ties sharing the mean rank
    (== scipy.stats.rankdata(method="average")), computed for all B rows at once.
    """
    b, n_m = member.shape
    pooled = np.concatenate([member, nonmember], axis=1)
    n = pooled.shape[1]
    order = np.argsort(pooled, axis=1, kind="stable")
    v = np.take_along_axis(pooled, order, axis=1)
    pos = np.broadcast_to(np.arange(n), (b, n))
    starts_group = np.ones((b, n), dtype=bool)
    starts_group[:, 1:] = v[:, 1:] != v[:, :-1]
    ends_group = np.ones((b, n), dtype=bool)
    ends_group[:, :-1] = starts_group[:, 1:]
    first = np.maximum.accumulate(np.where(starts_group, pos, 0), axis=1)
    last = np.minimum.accumulate(np.where(ends_group, pos, n - 1)[:, ::-1], axis=1)[:, ::-1]
    avg_rank = (first + last) / 2.0 + 1.0
    return np.asarray(np.where(order < n_m, avg_rank, 0.0).sum(axis=1), dtype=np.float64)


def _auc_rows(member: np.ndarray, nonmember: np.ndarray) -> np.ndarray:
    n_m, n_n = member.shape[1], nonmember.shape[1]
    r = _member_rank_sums(member, nonmember)
    return np.asarray((r - n_m * (n_m + 1) / 2.0) / (n_m * n_n), dtype=np.float64)


def auc(member_scores: Any, nonmember_scores: Any) -> float:
    """Area under the ROC curve = Mann-Whitney U / (n_m * n_n), ties between a member and a
    non-member counted 1/2. 1.0 = every member scores above every non-member; 0.5 = chance."""
    m = _scores(member_scores, "member scores")
    n = _scores(nonmember_scores, "non-member scores")
    return float(_auc_rows(m[None, :], n[None, :])[0])


# --------------------------------------------------------------------------------------------------
# TPR at fixed FPR
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TprAtFpr:
    """Result of the fixed-FPR threshold rule (see :func:`tpr_at_fpr`)."""

    tpr: float
    threshold: float  # predict member iff score > threshold
    realized_fpr: float  # n_false_positives / n_nonmembers, always <= alpha
    n_false_positives: int
    n_true_positives: int
    n_members: int
    n_nonmembers: int
    allowed_false_positives: int  # floor(alpha * n_nonmembers)
    alpha: float = float("nan")

    def as_dict(self) -> dict[str, float | int]:
        return {
            "tpr": self.tpr,
            "threshold": self.threshold,
            "realized_fpr": self.realized_fpr,
            "n_false_positives": self.n_false_positives,
            "n_true_positives": self.n_true_positives,
            "n_members": self.n_members,
            "n_nonmembers": self.n_nonmembers,
            "allowed_false_positives": self.allowed_false_positives,
            "alpha": self.alpha,
        }


def allowed_false_positives(alpha: float, n_nonmembers: int) -> int:
    """``floor(alpha * n_nonmembers)`` (with a 1e-9 guard against float round-off)."""
    alpha = float(alpha)
    if not (0.0 <= alpha <= 1.0) or math.isnan(alpha):
        raise ProbeError(f"alpha must lie in [0, 1], got {alpha!r}")
    return int(math.floor(alpha * n_nonmembers + _FLOOR_EPS))


def _thresholds_rows(nonmember: np.ndarray, k: int) -> np.ndarray:
    """Row-wise threshold: the (k+1)-th largest non-member score (``-inf`` if k >= n_nonmembers)."""
    b, n_n = nonmember.shape
    if k >= n_n:
        return np.full(b, -np.inf)
    # the (k+1)-th largest is the (n_n - k)-th smallest, i.e. index n_n - 1 - k of the ascending sort
    idx = n_n - 1 - k
    return np.partition(nonmember, idx, axis=1)[:, idx]


def tpr_at_fpr(member_scores: Any, nonmember_scores: Any, alpha: float) -> TprAtFpr:
    """True-positive rate at false-positive rate ``alpha`` (spec "Metrics", threshold rule).

    Rule: ``k = floor(alpha * n_nonmembers)`` false positives are allowed; a query is predicted member
    iff its score is strictly greater than the threshold; the threshold is the (k+1)-th largest
    non-member score, the lowest threshold whose FPR is <= alpha. Ties are broken pessimistically:
    when several scores equal the threshold none of them is counted positive (so the realized FPR can
    be below alpha when non-members tie across the cut, and a member tied with a non-member at the
    threshold is not detected). With k = 0 the threshold is the maximum non-member score. With
    k >= n_nonmembers (alpha = 1) the threshold is ``-inf``.

    Emits :class:`LowResolutionWarning` when ``alpha * n_nonmembers < 10``: the estimate then rests on
    fewer than ten false positives and is coarse.
    """
    m = _scores(member_scores, "member scores")
    n = _scores(nonmember_scores, "non-member scores")
    k = allowed_false_positives(alpha, n.size)
    if alpha * n.size < 10:
        warnings.warn(
            f"TPR@{alpha:g}: alpha * n_nonmembers = {alpha * n.size:g} < 10 "
            f"({k} false positive(s) allowed); the estimate is coarse",
            LowResolutionWarning,
            stacklevel=2,
        )
    t = float(_thresholds_rows(n[None, :], k)[0])
    fp = int((n > t).sum())
    tp = int((m > t).sum())
    return TprAtFpr(
        tpr=tp / m.size,
        threshold=t,
        realized_fpr=fp / n.size,
        n_false_positives=fp,
        n_true_positives=tp,
        n_members=int(m.size),
        n_nonmembers=int(n.size),
        allowed_false_positives=k,
        alpha=float(alpha),
    )


# --------------------------------------------------------------------------------------------------
# ROC curve
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RocCurve:
    """ROC points. ``thresholds`` descend from ``+inf``; point i predicts member iff
    ``score >= thresholds[i]`` (so every distinct score is a corner; the first point is (0, 0))."""

    fpr: np.ndarray
    tpr: np.ndarray
    thresholds: np.ndarray

    def auc(self) -> float:
        """Trapezoidal area; equals :func:`auc` (ties contribute the diagonal, i.e. 1/2)."""
        return float(np.sum(np.diff(self.fpr) * (self.tpr[1:] + self.tpr[:-1]) / 2.0))


def roc_curve(member_scores: Any, nonmember_scores: Any) -> RocCurve:
    m = _scores(member_scores, "member scores")
    n = _scores(nonmember_scores, "non-member scores")
    distinct = np.unique(np.concatenate([m, n]))[::-1]
    m_sorted, n_sorted = np.sort(m), np.sort(n)
    # number of scores >= t: size - count(< t)
    tp = m.size - np.searchsorted(m_sorted, distinct, side="left")
    fp = n.size - np.searchsorted(n_sorted, distinct, side="left")
    fpr = np.concatenate([[0.0], fp / n.size])
    tpr = np.concatenate([[0.0], tp / m.size])
    thresholds = np.concatenate([[np.inf], distinct])
    for a in (fpr, tpr, thresholds):
        a.flags.writeable = False
    return RocCurve(fpr=fpr, tpr=tpr, thresholds=thresholds)


# --------------------------------------------------------------------------------------------------
# stratified bootstrap
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """A two-sided interval (95% percentile bootstrap interval unless stated otherwise).
    ``nan`` bounds mean "not computed" (e.g. ``n_resamples = 0``)."""

    low: float
    high: float

    def contains(self, x: float) -> bool:
        return bool(self.low <= x <= self.high)


_NAN_INTERVAL = Interval(float("nan"), float("nan"))


def bootstrap_indices(
    n_members: int, n_nonmembers: int, n_resamples: int = 1000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified resampling index matrices ``([B, n_members], [B, n_nonmembers])``, drawn with
    replacement from ``np.random.default_rng(seed)`` (members first, then non-members)."""
    rng = np.random.default_rng(seed)
    mi = rng.integers(0, n_members, size=(n_resamples, n_members))
    ni = rng.integers(0, n_nonmembers, size=(n_resamples, n_nonmembers))
    return mi, ni


@dataclass(frozen=True, eq=False)
class BootstrapReplicates:
    """The statistic on every resample: ``auc[b]`` and ``tpr[alpha][b]``."""

    auc: np.ndarray
    tpr: dict[float, np.ndarray]
    member_idx: np.ndarray
    nonmember_idx: np.ndarray


# cap on elements of one [chunk, n_members + n_nonmembers] working matrix
_CHUNK_ELEMENTS = 1 << 22


def bootstrap_replicates(
    member_scores: Any,
    nonmember_scores: Any,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    n_resamples: int = 1000,
    seed: int = 0,
) -> BootstrapReplicates:
    """AUC and TPR@alpha on each of ``n_resamples`` stratified resamples, vectorised: the resampled
    scores form ``[B, n]`` matrices, AUC comes from row-wise average ranks and TPR from a row-wise
    partition (same rule as :func:`tpr_at_fpr`). Large B is processed in blocks of rows (results do
    not depend on the blocking); there is no Python loop over individual resamples."""
    m = _scores(member_scores, "member scores")
    n = _scores(nonmember_scores, "non-member scores")
    if n_resamples < 0:
        raise ProbeError(f"n_resamples must be >= 0, got {n_resamples}")
    mi, ni = bootstrap_indices(m.size, n.size, n_resamples, seed)
    ks = {float(a): allowed_false_positives(a, n.size) for a in alphas}
    aucs = np.empty(n_resamples)
    tprs = {a: np.empty(n_resamples) for a in ks}
    chunk = max(1, _CHUNK_ELEMENTS // (m.size + n.size))
    for lo in range(0, n_resamples, chunk):
        hi = min(n_resamples, lo + chunk)
        mb, nb = m[mi[lo:hi]], n[ni[lo:hi]]
        aucs[lo:hi] = _auc_rows(mb, nb)
        for a, k in ks.items():
            t = _thresholds_rows(nb, k)
            tprs[a][lo:hi] = (mb > t[:, None]).sum(axis=1) / m.size
    return BootstrapReplicates(auc=aucs, tpr=tprs, member_idx=mi, nonmember_idx=ni)


@dataclass(frozen=True)
class BootstrapIntervals:
    auc: Interval
    tpr: dict[float, Interval]
    n_resamples: int
    seed: int
    confidence: float


def _percentile_interval(x: np.ndarray, confidence: float) -> Interval:
    if x.size == 0:
        return _NAN_INTERVAL
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(x, [tail, 100.0 - tail])
    return Interval(float(lo), float(hi))


def bootstrap_intervals(
    member_scores: Any,
    nonmember_scores: Any,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> BootstrapIntervals:
    """Percentile intervals (default 95%) for AUC and TPR@alpha from the stratified bootstrap."""
    if not 0.0 < confidence < 1.0:
        raise ProbeError(f"confidence must lie in (0, 1), got {confidence!r}")
    reps = bootstrap_replicates(member_scores, nonmember_scores, alphas, n_resamples, seed)
    return BootstrapIntervals(
        auc=_percentile_interval(reps.auc, confidence),
        tpr={a: _percentile_interval(v, confidence) for a, v in reps.tpr.items()},
        n_resamples=int(n_resamples),
        seed=int(seed),
        confidence=float(confidence),
    )


# --------------------------------------------------------------------------------------------------
# significance of one AUC, and the interval of an error rate
# --------------------------------------------------------------------------------------------------


def mann_whitney_p(member_scores: Any, nonmember_scores: Any) -> float:
    """One-sided Mann-Whitney p-value of "members score higher than non-members".

    The test of the AUC itself (AUC = U / (n_m n_n)): under the null hypothesis that the member and
    non-member scores are exchangeable (rows assigned to the two sides at random, the model trained on
    neither), ``P(p <= a) <= a``. scipy's exact distribution for small samples without ties, else the
    normal approximation with the tie correction."""
    from scipy import stats  # imported on use: scipy.stats is slow to import

    m = _scores(member_scores, "member scores")
    n = _scores(nonmember_scores, "non-member scores")
    if np.ptp(np.concatenate([m, n])) == 0.0:
        return 1.0  # every score equal: no evidence either way (scipy would divide by a zero variance)
    return float(stats.mannwhitneyu(m, n, alternative="greater").pvalue)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> Interval:
    """Exact (Clopper-Pearson) two-sided interval of a binomial proportion ``k / n``: the rate of an
    event seen ``k`` times in ``n`` independent trials, e.g. memorization verdicts on null splits.
    ``n = 0`` gives ``(nan, nan)``."""
    from scipy import stats

    if not 0.0 < confidence < 1.0:
        raise ProbeError(f"confidence must lie in (0, 1), got {confidence!r}")
    if not (_is_count(k) and _is_count(n)) or k > n:
        raise ProbeError(f"clopper_pearson needs integers 0 <= k <= n, got k={k!r}, n={n!r}")
    if n == 0:
        return _NAN_INTERVAL
    tail = (1.0 - confidence) / 2.0
    low = 0.0 if k == 0 else float(stats.beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(stats.beta.ppf(1.0 - tail, k + 1, n - k))
    return Interval(low, high)


def _is_count(v: Any) -> bool:
    return bool(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0)


# --------------------------------------------------------------------------------------------------
# per-checkpoint metrics for one score kind
# --------------------------------------------------------------------------------------------------


def _alpha_label(alpha: float) -> str:
    return f"{alpha * 100:g}pct"


_V = TypeVar("_V")


def _lookup_alpha(table: Mapping[float, _V], alpha: float, what: str) -> _V:
    for a, v in table.items():
        if math.isclose(a, alpha, rel_tol=0.0, abs_tol=1e-12):
            return v
    raise ProbeError(f"{what} was not computed at alpha={alpha:g} (have {sorted(table)})")


@dataclass(frozen=True)
class CheckpointMetrics:
    """AUC and TPR@alpha (with bootstrap intervals) of one score kind under one calibration."""

    kind: ScoreKind
    calibration: Calibration
    auc: float
    auc_interval: Interval
    tpr: dict[float, TprAtFpr]  # alpha -> details
    tpr_interval: dict[float, Interval]  # alpha -> bootstrap interval of the TPR
    member_mean: float  # mean membership score of members (oriented)
    nonmember_mean: float
    n_resamples: int
    seed: int
    confidence: float = 0.95
    p_value: float = float("nan")  # one-sided Mann-Whitney p-value of the AUC (see mann_whitney_p)
    # the ε lower bound the attack implies (probes.epsilon), over every threshold of these scores
    epsilon: EpsilonBound | None = None
    # the Gaussian-DP μ lower bound of the same scores' whole ROC (probes.gdp) and the ε it implies at δ
    gdp: GdpBound | None = None

    def tpr_at(self, alpha: float) -> TprAtFpr:
        return _lookup_alpha(self.tpr, alpha, "TPR")

    def tpr_interval_at(self, alpha: float) -> Interval:
        return _lookup_alpha(self.tpr_interval, alpha, "TPR interval")

    @property
    def tpr_at_1pct(self) -> TprAtFpr:
        return self.tpr_at(0.01)

    @property
    def tpr_at_10pct(self) -> TprAtFpr:
        return self.tpr_at(0.10)

    @property
    def tpr_at_1pct_interval(self) -> Interval:
        return self.tpr_interval_at(0.01)

    @property
    def tpr_at_10pct_interval(self) -> Interval:
        return self.tpr_interval_at(0.10)

    @property
    def prefix(self) -> str:
        return f"{self.calibration.value}_{self.kind.value}"

    def as_dict(self, prefix: str | None = None) -> dict[str, float | int | str]:
        """Flat record, keys ``<calibration>_<kind>_<stat>``, e.g. ``calibrated_loss_auc``,
        ``calibrated_loss_tpr_at_1pct``, ``calibrated_loss_tpr_at_1pct_threshold``."""
        p = self.prefix if prefix is None else prefix
        out: dict[str, float | int | str] = {
            f"{p}_auc": self.auc,
            f"{p}_auc_low": self.auc_interval.low,
            f"{p}_auc_high": self.auc_interval.high,
            f"{p}_p_value": self.p_value,
        }
        for a, t in self.tpr.items():
            q = f"{p}_tpr_at_{_alpha_label(a)}"
            iv = self.tpr_interval.get(a, _NAN_INTERVAL)
            out[q] = t.tpr
            out[f"{q}_low"] = iv.low
            out[f"{q}_high"] = iv.high
            out[f"{q}_threshold"] = t.threshold
            out[f"{q}_realized_fpr"] = t.realized_fpr
            out[f"{q}_n_false_positives"] = t.n_false_positives
            out[f"{q}_n_true_positives"] = t.n_true_positives
            out[f"{q}_allowed_false_positives"] = t.allowed_false_positives
        out[f"{p}_n_members"] = next(iter(self.tpr.values())).n_members if self.tpr else -1
        out[f"{p}_n_nonmembers"] = next(iter(self.tpr.values())).n_nonmembers if self.tpr else -1
        if self.epsilon is not None:
            # ``<p>_epsilon_lb`` and the δ it was computed for (``<p>_epsilon_lb_delta``) travel together, so a
            # row never states a bound without its δ; the side (a word) stays out of this numeric record
            out[f"{p}_epsilon_lb"] = self.epsilon.epsilon
            out[f"{p}_epsilon_lb_delta"] = self.epsilon.delta
        if self.gdp is not None:
            # μ, its ε, and the counts behind them (JSON): the aggregator re-reads the counts at the level the
            # checkpoint headline and the consistency checks need (probes.gdp.GridCounts)
            out.update(self.gdp.as_dict(p))
        return out


def membership_metrics(
    member_scores: Any,
    nonmember_scores: Any,
    kind: ScoreKind | str,
    calibration: Calibration | str = Calibration.CALIBRATED,
    *,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    epsilon_delta: float = DEFAULT_EPSILON_DELTA,
) -> CheckpointMetrics:
    """All metrics of one kind from already-oriented membership scores (higher = member); the ε lower
    bound (:func:`probes.epsilon.epsilon_lower_bound`) and the Gaussian-DP μ bound
    (:func:`probes.gdp.gdp_mu_lower_bound`) at δ = ``epsilon_delta``, with Clopper-Pearson bounds at
    ``confidence``."""
    m = _scores(member_scores, "member scores")
    n = _scores(nonmember_scores, "non-member scores")
    alphas = tuple(dict.fromkeys(float(a) for a in alphas))
    tprs = {a: tpr_at_fpr(m, n, a) for a in alphas}
    if n_resamples > 0:
        bi = bootstrap_intervals(m, n, alphas, n_resamples, seed, confidence)
        auc_iv, tpr_iv = bi.auc, bi.tpr
    else:
        auc_iv, tpr_iv = _NAN_INTERVAL, {a: _NAN_INTERVAL for a in alphas}
    return CheckpointMetrics(
        kind=_kind(kind),
        calibration=Calibration(calibration),
        auc=auc(m, n),
        auc_interval=auc_iv,
        tpr=tprs,
        tpr_interval=tpr_iv,
        member_mean=float(m.mean()),
        nonmember_mean=float(n.mean()),
        n_resamples=int(n_resamples),
        seed=int(seed),
        confidence=float(confidence),
        p_value=mann_whitney_p(m, n),
        epsilon=epsilon_lower_bound(m, n, epsilon_delta, confidence),
        gdp=gdp_mu_lower_bound(m, n, epsilon_delta, confidence),
    )


# --------------------------------------------------------------------------------------------------
# per-query inputs: S and S_ref
# --------------------------------------------------------------------------------------------------


def _readonly(x: Any, name: str) -> np.ndarray:
    arr = np.array(x, dtype=np.float64).reshape(-1)
    n_nan = int(np.isnan(arr).sum())
    if n_nan:
        raise ProbeError(f"{name}: {n_nan} of {arr.size} scores are NaN")
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True, eq=False)
class SplitScores:
    """One score per member and per non-member query (raw or oriented, as the context says)."""

    members: np.ndarray
    nonmembers: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", _readonly(self.members, "members"))
        object.__setattr__(self, "nonmembers", _readonly(self.nonmembers, "nonmembers"))
        if self.members.size == 0 or self.nonmembers.size == 0:
            raise ProbeError(
                f"need at least one member and one non-member, got "
                f"{self.members.size} and {self.nonmembers.size}"
            )


@dataclass(frozen=True, eq=False)
class MembershipInput:
    """Per-query robustness scores ``S`` (fine-tuned) and ``S_ref`` (reference = base model), per
    score kind, members and non-members in the same order in both. Raw scores, not oriented."""

    fine_tuned: Mapping[ScoreKind, SplitScores]
    reference: Mapping[ScoreKind, SplitScores]
    member_ids: np.ndarray | None = None
    nonmember_ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        ft = {_kind(k): v for k, v in self.fine_tuned.items()}
        ref = {_kind(k): v for k, v in self.reference.items()}
        if set(ft) != set(ref):
            raise ProbeError(
                f"fine-tuned and reference scores cover different score kinds: "
                f"{sorted(k.value for k in ft)} vs {sorted(k.value for k in ref)}"
            )
        if not ft:
            raise ProbeError("no score kinds given")
        sizes = {(v.members.size, v.nonmembers.size) for v in (*ft.values(), *ref.values())}
        if len(sizes) != 1:
            raise ProbeError(f"score arrays differ in size across kinds/models: {sorted(sizes)}")
        object.__setattr__(self, "fine_tuned", ft)
        object.__setattr__(self, "reference", ref)

    @property
    def kinds(self) -> tuple[ScoreKind, ...]:
        return tuple(k for k in SCORE_KINDS if k in self.fine_tuned)

    @property
    def n_members(self) -> int:
        return next(iter(self.fine_tuned.values())).members.size

    @property
    def n_nonmembers(self) -> int:
        return next(iter(self.fine_tuned.values())).nonmembers.size

    def raw(self, kind: ScoreKind | str, calibration: Calibration | str) -> SplitScores:
        """Un-oriented per-query score: ``S - S_ref``, ``S`` or ``S_ref``."""
        kind, calibration = _kind(kind), Calibration(calibration)
        if kind not in self.fine_tuned:
            raise ProbeError(f"score kind {kind.value!r} not in this input")
        ft, ref = self.fine_tuned[kind], self.reference[kind]
        if calibration is Calibration.CALIBRATED:
            return SplitScores(ft.members - ref.members, ft.nonmembers - ref.nonmembers)
        if calibration is Calibration.UNCALIBRATED:
            return ft
        return ref

    def membership_scores(
        self, kind: ScoreKind | str, calibration: Calibration | str = Calibration.CALIBRATED
    ) -> SplitScores:
        """Oriented scores (higher = member), via :func:`membership_score`."""
        r = self.raw(kind, calibration)
        return SplitScores(membership_score(kind, r.members), membership_score(kind, r.nonmembers))

    def metrics(
        self,
        kind: ScoreKind | str,
        calibration: Calibration | str = Calibration.CALIBRATED,
        **kwargs: Any,
    ) -> CheckpointMetrics:
        """kwargs: ``alphas``, ``n_resamples``, ``seed``, ``confidence``, ``epsilon_delta`` of
        :func:`membership_metrics`."""
        s = self.membership_scores(kind, calibration)
        return membership_metrics(s.members, s.nonmembers, kind, calibration, **kwargs)

    def _all(self, calibration: Calibration, **kwargs: Any) -> dict[ScoreKind, CheckpointMetrics]:
        return {k: self.metrics(k, calibration, **kwargs) for k in self.kinds}

    def calibrated(self, **kwargs: Any) -> dict[ScoreKind, CheckpointMetrics]:
        """Metrics of ``Delta S = S - S_ref`` for every kind (the headline metrics)."""
        return self._all(Calibration.CALIBRATED, **kwargs)

    def uncalibrated(self, **kwargs: Any) -> dict[ScoreKind, CheckpointMetrics]:
        """Metrics of ``S`` alone (fine-tuned model, no difficulty calibration)."""
        return self._all(Calibration.UNCALIBRATED, **kwargs)

    def reference_only(self, **kwargs: Any) -> dict[ScoreKind, CheckpointMetrics]:
        """Metrics of ``S_ref`` alone (what the reference model's difficulty alone would flag)."""
        return self._all(Calibration.REFERENCE_ONLY, **kwargs)

    def calibration_impact(self, **kwargs: Any) -> pd.DataFrame:
        """One row per (kind, calibration) with AUC and TPRs, so calibration impact is visible."""
        rows = []
        for cal in Calibration:
            for kind, m in self._all(cal, **kwargs).items():
                row: dict[str, Any] = {"kind": kind.value, "calibration": cal.value}
                row.update(m.as_dict(prefix=""))
                rows.append({k.lstrip("_"): v for k, v in row.items()})
        return pd.DataFrame(rows)

    @classmethod
    def from_scores_tables(
        cls, fine_tuned: pd.DataFrame, reference: pd.DataFrame
    ) -> MembershipInput:
        """Build from two scores tables (fine-tuned, reference). Each is reduced to per-query
        robustness scores (:func:`robustness_scores`); the two must hold the same queries with the
        same member flags and the same manipulations."""
        s = robustness_scores(fine_tuned)
        r = robustness_scores(reference)
        if not s.index.equals(r.index):
            only_ft = s.index.difference(r.index)
            only_ref = r.index.difference(s.index)
            raise ProbeError(
                "fine-tuned and reference scores tables hold different queries "
                f"({len(only_ft)} only in fine-tuned, e.g. {list(only_ft[:3])}; "
                f"{len(only_ref)} only in reference, e.g. {list(only_ref[:3])})"
            )
        if not (s["member"].to_numpy() == r["member"].to_numpy()).all():
            bad = s.index[s["member"].to_numpy() != r["member"].to_numpy()]
            raise ProbeError(
                f"member flags differ between fine-tuned and reference tables for queries {list(bad[:5])}"
            )
        ft_manip = set(fine_tuned["manipulation"].unique())
        ref_manip = set(reference["manipulation"].unique())
        if ft_manip != ref_manip:
            raise ProbeError(
                "fine-tuned and reference tables use different manipulation suites: "
                f"only fine-tuned {sorted(ft_manip - ref_manip)[:5]}, "
                f"only reference {sorted(ref_manip - ft_manip)[:5]}"
            )
        mem = s["member"].to_numpy()
        kinds = [k for k in SCORE_KINDS if k.value in s.columns]
        ft = {k: SplitScores(s[k.value].to_numpy()[mem], s[k.value].to_numpy()[~mem]) for k in kinds}
        ref = {k: SplitScores(r[k.value].to_numpy()[mem], r[k.value].to_numpy()[~mem]) for k in kinds}
        return cls(
            fine_tuned=ft,
            reference=ref,
            member_ids=s.index.to_numpy()[mem],
            nonmember_ids=s.index.to_numpy()[~mem],
        )


# --------------------------------------------------------------------------------------------------
# scores tables: robustness score, per-manipulation AUC, gap statistics
# --------------------------------------------------------------------------------------------------


def validate_scores_table(df: pd.DataFrame, name: str = "scores table") -> pd.DataFrame:
    """Check the scores table contract (INTERFACES.md) and return it with ``member`` as bool.

    Refuses: missing columns, an empty table, duplicate (query_id, manipulation) rows, a query whose
    member flag varies, queries that were not all scored under the same manipulations, NaN scores,
    and a table with no members or no non-members."""
    missing = [c for c in SCORES_TABLE_COLUMNS if c not in df.columns]
    if missing:
        raise ProbeError(f"{name}: missing column(s) {missing}; expected {list(SCORES_TABLE_COLUMNS)}")
    if len(df) == 0:
        raise ProbeError(f"{name}: no rows")
    if df["member"].isna().any():
        raise ProbeError(f"{name}: column 'member' has missing values")
    for c in ("loss", "entropy", "confidence"):
        n_nan = int(pd.isna(df[c]).sum())
        if n_nan:
            raise ProbeError(f"{name}: column {c!r} has {n_nan} NaN value(s)")
    dup = df.duplicated(["query_id", "manipulation"])
    if dup.any():
        first = df.loc[dup, ["query_id", "manipulation"]].iloc[0].tolist()
        raise ProbeError(
            f"{name}: {int(dup.sum())} duplicate (query_id, manipulation) row(s), e.g. {first}"
        )
    out = df.copy()
    out["member"] = out["member"].astype(bool)
    flags = out.groupby("query_id", sort=False)["member"].nunique()
    if (flags > 1).any():
        raise ProbeError(
            f"{name}: member flag varies within query_id(s) {list(flags.index[flags > 1][:5])}"
        )
    counts = out.groupby("query_id", sort=False)["manipulation"].size()
    n_manip = out["manipulation"].nunique()
    if (counts != n_manip).any():
        short = counts.index[counts != n_manip]
        raise ProbeError(
            f"{name}: {len(short)} query(ies) were not scored under all {n_manip} manipulations, "
            f"e.g. query_id {short[0]!r} has {int(counts[short[0]])}"
        )
    per_query = out.groupby("query_id", sort=False)["member"].first()
    if per_query.all() or not per_query.any():
        raise ProbeError(f"{name}: needs both members and non-members")
    return out


def robustness_scores(df: pd.DataFrame) -> pd.DataFrame:
    """Robustness score ``S(q)`` = mean over manipulations of each score kind (spec "Scores").

    Returns a DataFrame indexed by ``query_id`` (sorted) with a bool ``member`` column and one column
    per score kind (``loss``, ``entropy``, ``confidence``). Raw scores, not oriented."""
    d = validate_scores_table(df)
    cols = [k.value for k in SCORE_KINDS]
    g = d.groupby("query_id", sort=True)
    out = g[cols].mean()
    out.insert(0, "member", g["member"].first().astype(bool))
    return out


def per_manipulation_auc(
    scores: pd.DataFrame,
    reference: pd.DataFrame | None = None,
    kinds: Iterable[ScoreKind | str] = SCORE_KINDS,
) -> pd.DataFrame:
    """AUC of each manipulation on its own (paper App. 7.3, "perturbation effectiveness").

    With ``reference`` the per-(query, manipulation) score is calibrated (``S - S_ref`` under the same
    manipulation); without it the fine-tuned score is used alone. Returns a DataFrame indexed by
    ``manipulation`` (suite order of first appearance) with ``category`` and one AUC column per kind."""
    kind_list = [_kind(k) for k in kinds]
    cols = [k.value for k in kind_list]
    d = validate_scores_table(scores, "fine-tuned scores table")
    if reference is not None:
        r = validate_scores_table(reference, "reference scores table")
        merged = d.merge(
            r[["query_id", "manipulation", "member", *cols]],
            on=["query_id", "manipulation"],
            how="outer",
            suffixes=("", "_ref"),
            indicator=True,
        )
        if (merged["_merge"] != "both").any():
            raise ProbeError(
                "fine-tuned and reference scores tables do not hold the same (query_id, manipulation) rows"
            )
        if (merged["member"].astype(bool) != merged["member_ref"].astype(bool)).any():
            raise ProbeError("member flags differ between fine-tuned and reference scores tables")
        for c in cols:
            merged[c] = merged[c] - merged[f"{c}_ref"]
        d = merged
    rows = []
    for manip, grp in d.groupby("manipulation", sort=False):
        mem = grp["member"].to_numpy(dtype=bool)
        row: dict[str, Any] = {"manipulation": manip, "category": grp["category"].iloc[0]}
        for k in kind_list:
            s = membership_score(k, grp[k.value].to_numpy())
            row[k.value] = auc(s[mem], s[~mem]) if mem.any() and (~mem).any() else float("nan")
        rows.append(row)
    return pd.DataFrame(rows).set_index("manipulation")


@dataclass(frozen=True)
class GapStats:
    """Context-overfitting gap statistics (spec "Metrics").

    ``per_manipulation[k]`` = g_k = mean member loss - mean non-member loss under manipulation k
    (fine-tuned model, raw probe loss, nats). ``mu_gap`` = mean of g_k over the suite;
    ``sigma_gap`` = POPULATION standard deviation (ddof=0) of g_k over the suite: the suite is the
    whole set being described, not a sample, and ddof=0 stays defined for a one-manipulation suite."""

    mu_gap: float
    sigma_gap: float
    per_manipulation: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        return {"mu_gap": self.mu_gap, "sigma_gap": self.sigma_gap}


def gap_stats(scores: pd.DataFrame) -> GapStats:
    d = validate_scores_table(scores)
    per: dict[str, float] = {}
    for manip, grp in d.groupby("manipulation", sort=False):
        mem = grp["member"].to_numpy(dtype=bool)
        loss = grp["loss"].to_numpy(dtype=np.float64)
        per[str(manip)] = float(loss[mem].mean() - loss[~mem].mean())
    g = np.fromiter(per.values(), dtype=np.float64)
    return GapStats(mu_gap=float(g.mean()), sigma_gap=float(g.std(ddof=0)), per_manipulation=per)


# --------------------------------------------------------------------------------------------------
# collapse indicators
# --------------------------------------------------------------------------------------------------


def loss_ratio(loss_ft: Any, loss_base: Any) -> float:
    """``L_FT / L_base``: mean ordinary in-context cross-entropy (context C', labels of D) of the
    fine-tuned model over that of the base model. Accepts per-query arrays or scalar means.
    A base loss of exactly 0 gives ``inf`` if the fine-tuned loss is positive, else 1.0."""
    ft = np.asarray(loss_ft, dtype=np.float64).reshape(-1)
    base = np.asarray(loss_base, dtype=np.float64).reshape(-1)
    if ft.size == 0 or base.size == 0:
        raise ProbeError("loss_ratio: empty loss array")
    if np.isnan(base).any():
        raise ProbeError("loss_ratio: base-model loss contains NaN")
    lf, lb = float(ft.mean()), float(base.mean())
    if math.isnan(lf):
        # a fine-tuned model that yields NaN losses has collapsed numerically
        return float("inf")
    if lb == 0.0:
        return float("inf") if lf > 0.0 else 1.0
    return lf / lb


def output_std(p_true: Any) -> float:
    """Population standard deviation (ddof=0) over queries of the fine-tuned model's probability of
    the true label; near zero means near-constant output."""
    p = np.asarray(p_true, dtype=np.float64).reshape(-1)
    if p.size == 0:
        raise ProbeError("output_std: empty probability array")
    return float(p.std(ddof=0))
