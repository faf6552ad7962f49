"""Rank statistics of membership scores: AUC, TPR at a fixed FPR, the ROC curve, the stratified bootstrap,
the Mann-Whitney p-value of an AUC and the Clopper-Pearson interval of a rate.

Pure numpy (scipy on use). The core every layer may use: the probes' per-checkpoint metrics
(``probes.metrics``) and Stage I's blind baseline (``trainables.data.blind``) both rank scores with it.
Shapes follow TensorFlow Privacy's ``membership_inference_attack`` data structures: typed frozen
dataclasses that carry the numbers, statistics as functions or methods.

Conventions used everywhere in this module

* **Members are the positive class.** Every statistic takes *membership scores*: higher means "more
  likely a member". Turning a raw score difference into one is the caller's job
  (``probes.metrics.membership_score`` for the probe's loss, entropy and confidence).
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

import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from iclmem.errors import ProbeError

__all__ = [
    "DEFAULT_ALPHAS",
    "DEFAULT_RESAMPLES",
    "LowResolutionWarning",
    "score_array",
    "member_rank_sums",
    "auc",
    "TprAtFpr",
    "allowed_false_positives",
    "tpr_at_fpr",
    "RocCurve",
    "roc_curve",
    "Interval",
    "NAN_INTERVAL",
    "bootstrap_indices",
    "BootstrapReplicates",
    "bootstrap_replicates",
    "BootstrapIntervals",
    "bootstrap_intervals",
    "EXACT_MAX_COST",
    "exact_cost",
    "mann_whitney_p",
    "mann_whitney_exact_p",
    "clopper_pearson",
]


# --------------------------------------------------------------------------------------------------
# scores in, and the coarse-estimate warning
# --------------------------------------------------------------------------------------------------


DEFAULT_ALPHAS: tuple[float, ...] = (0.01, 0.10)
# stratified bootstrap resamples of every interval, unless a caller (a sweep's probe.bootstrap) says otherwise
DEFAULT_RESAMPLES = 1000


# floor(alpha * n) is taken after adding this, so that e.g. 0.29 * 100 = 28.999999999999996 -> 29.
_FLOOR_EPS = 1e-9


class LowResolutionWarning(UserWarning):
    """TPR@alpha is estimated from fewer than 10 allowed false positives (alpha * n_nonmembers < 10)."""


def score_array(x: Any, name: str) -> np.ndarray:
    """float64 [n]: the scores as a flat array; refuses an empty one and NaN (``+-inf`` is kept)."""
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


def member_rank_sums(member: np.ndarray, nonmember: np.ndarray) -> np.ndarray:
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
    r = member_rank_sums(member, nonmember)
    return np.asarray((r - n_m * (n_m + 1) / 2.0) / (n_m * n_n), dtype=np.float64)


def auc(member_scores: Any, nonmember_scores: Any) -> float:
    """Area under the ROC curve = Mann-Whitney U / (n_m * n_n), ties between a member and a
    non-member counted 1/2. 1.0 = every member scores above every non-member; 0.5 = chance."""
    m = score_array(member_scores, "member scores")
    n = score_array(nonmember_scores, "non-member scores")
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
    m = score_array(member_scores, "member scores")
    n = score_array(nonmember_scores, "non-member scores")
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
    m = score_array(member_scores, "member scores")
    n = score_array(nonmember_scores, "non-member scores")
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


NAN_INTERVAL = Interval(float("nan"), float("nan"))


def bootstrap_indices(
    n_members: int, n_nonmembers: int, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0
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
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> BootstrapReplicates:
    """AUC and TPR@alpha on each of ``n_resamples`` stratified resamples, vectorised: the resampled
    scores form ``[B, n]`` matrices, AUC comes from row-wise average ranks and TPR from a row-wise
    partition (same rule as :func:`tpr_at_fpr`). Large B is processed in blocks of rows (results do
    not depend on the blocking); there is no Python loop over individual resamples."""
    m = score_array(member_scores, "member scores")
    n = score_array(nonmember_scores, "non-member scores")
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
        return NAN_INTERVAL
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(x, [tail, 100.0 - tail])
    return Interval(float(lo), float(hi))


def bootstrap_intervals(
    member_scores: Any,
    nonmember_scores: Any,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    n_resamples: int = DEFAULT_RESAMPLES,
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


# The p-value is the exact permutation one (:func:`mann_whitney_exact_p`) while counting it costs at most this
# many table updates (:func:`exact_cost`: 50 + 50 scores, or 5 against 600), else the normal approximation
# with the tie correction, accurate at such sizes. Without ties the exact null distribution of a split size is
# computed once and cached (a lookup per call after that); with ties it is counted per call (about 5 ms at
# 50 + 50 tied scores, under 1 ms at 30 + 30).
EXACT_MAX_COST = 60_000_000


def exact_cost(n_m: int, n_n: int) -> int:
    """Table updates of one exact count (:func:`mann_whitney_exact_p` with ties): N values x the smaller
    side's size x the width of its doubled rank sums."""
    n_all, k = n_m + n_n, min(n_m, n_n)
    return n_all * k * min(n_all * (n_all + 1), 2 * k * n_all)


def mann_whitney_p(member_scores: Any, nonmember_scores: Any) -> float:
    """One-sided Mann-Whitney p-value of "members score higher than non-members".

    The test of the AUC itself (AUC = U / (n_m n_n)): under the null hypothesis that the member and
    non-member scores are exchangeable (rows assigned to the two sides at random, the model trained on
    neither), ``P(p <= a) <= a``. Up to :data:`EXACT_MAX_COST` (a probe's split of up to 50 + 50 rows, a few
    canaries against hundreds of held-out rows) it is the exact permutation p-value
    (:func:`mann_whitney_exact_p`, ties as mid-ranks): the normal approximation misstates the deep tail a
    selection-aware bar of family_alpha / K reads when ties are many and the sides unequal (5 members against
    50 non-members, one tied score above the rest: 0.001 for an exact 0.09). Above it, scipy's normal
    approximation with the tie correction."""
    m = score_array(member_scores, "member scores")
    n = score_array(nonmember_scores, "non-member scores")
    if np.ptp(np.concatenate([m, n])) == 0.0:
        return 1.0  # every score equal: no evidence either way (scipy would divide by a zero variance)
    if exact_cost(m.size, n.size) <= EXACT_MAX_COST:
        return mann_whitney_exact_p(m, n)
    from scipy import stats  # imported on use: scipy.stats is slow to import

    return float(stats.mannwhitneyu(m, n, alternative="greater").pvalue)


def mann_whitney_exact_p(member_scores: Any, nonmember_scores: Any) -> float:
    """The exact one-sided permutation p-value of the Mann-Whitney test, ties included:
    ``P(R >= r)`` for the members' mid-rank sum ``R`` when the ``n_m`` member labels fall on the ``N``
    pooled scores uniformly at random (the scores held fixed), ``r`` the observed sum. Deterministic; equal
    to scipy's ``method="exact"`` without ties, and valid with them.

    Counted by dynamic programming (the shift algorithm) over the pooled scores' doubled mid-ranks, which
    are integers: the number of subsets of each size with each rank sum. Without ties the table depends on
    the sizes alone and is cached; with ties it is counted per call, only up to the sum the tail needs and
    on the smaller side. Cost ``O(N * min(n_m, n_n) * width)``, width at most ``N^2 / 2``: meant for
    ``N`` up to a few hundred (``C(N, n_m)`` must stay below float64's 1e308)."""
    m = score_array(member_scores, "member scores")
    n = score_array(nonmember_scores, "non-member scores")
    n_m, n_n = m.size, n.size
    pooled = np.concatenate([m, n])
    if np.ptp(pooled) == 0.0:
        return 1.0
    ranks, tied = _mid_ranks(pooled)
    r2 = np.rint(2.0 * ranks).astype(np.int64)  # doubled mid-ranks: integers
    observed = int(r2[:n_m].sum())
    if not tied:  # ranks 1..N: the sizes' cached upper tail of the members' rank sum
        return float(_untied_upper_tail(n_m, n_n)[observed // 2 - n_m * (n_m + 1) // 2])
    # P(R_m >= observed) = P(R_n <= total - observed), the non-members' lower tail, or
    # 1 - P(R_m <= observed - 1), the complement of the members' lower tail: whichever table is smaller
    lower_n = int(r2.sum()) - observed
    if n_n * (lower_n + 1) <= n_m * observed:
        return float(min(1.0, _lower_tail(r2, n_n, lower_n)))
    return float(min(1.0, max(0.0, 1.0 - _lower_tail(r2, n_m, observed - 1))))


def _mid_ranks(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """float64 [n]: 1-based ranks, ties sharing their mean (== scipy.stats.rankdata); and whether any tie."""
    order = np.argsort(x, kind="stable")
    v = x[order]
    starts = np.flatnonzero(np.r_[True, v[1:] != v[:-1]])
    ends = np.r_[starts[1:], v.size]  # exclusive
    out = np.empty(x.size, dtype=np.float64)
    out[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return out, bool(starts.size < x.size)


def _subset_sum_counts(values: np.ndarray, k: int, t: int) -> np.ndarray:
    """float64 [t + 1]: how many k-subsets of the non-negative integers ``values`` sum to each s <= t."""
    n_all = values.size
    # counts[j, s]: j-subsets of the values seen so far with sum s (sums above t never come back down)
    counts = np.zeros((k + 1, t + 1), dtype=np.float64)
    counts[0, 0] = 1.0
    for i, r in enumerate(np.sort(values)):
        if r > t:
            break  # ascending: no later value fits either
        hi = min(i, k - 1)  # sizes that can take value i
        lo = max(0, k - (n_all - i))  # sizes from which k is still reachable
        if lo <= hi:
            counts[lo + 1:hi + 2, r:] += counts[lo:hi + 1, :t + 1 - r].copy()
    return np.asarray(counts[k], dtype=np.float64)


def _lower_tail(r2: np.ndarray, k: int, t: int) -> float:
    """``P(S <= t)`` for the sum S of a uniformly random k-subset of the integers ``r2``."""
    if t < int(np.sort(r2)[:k].sum()):
        return 0.0
    return float(_subset_sum_counts(r2, k, t).sum() / math.comb(r2.size, k))


@functools.lru_cache(maxsize=64)
def _untied_upper_tail(n_m: int, n_n: int) -> np.ndarray:
    """float64 [n_m n_n + 1], read-only: ``P(U >= u)`` for u = 0..n_m n_n, U the Mann-Whitney statistic of
    n_m members among n_m + n_n untied scores (ranks 1..N)."""
    n_all = n_m + n_n
    k = min(n_m, n_n)  # U of the smaller side has the same distribution (U and n_m n_n - U are equidistributed)
    counts = _subset_sum_counts(np.arange(1, n_all + 1), k, k * (k + 1) // 2 + n_m * n_n)
    pmf = counts[k * (k + 1) // 2:][: n_m * n_n + 1] / math.comb(n_all, k)
    tail = np.minimum(1.0, np.cumsum(pmf[::-1])[::-1])
    tail.flags.writeable = False
    return tail


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
        return NAN_INTERVAL
    tail = (1.0 - confidence) / 2.0
    low = 0.0 if k == 0 else float(stats.beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(stats.beta.ppf(1.0 - tail, k + 1, n - k))
    return Interval(low, high)


def _is_count(v: Any) -> bool:
    return bool(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0)
