"""Empirical privacy-loss lower bounds from a membership attack (the DP hypothesis-testing audit).

If a training procedure is (ε, δ)-differentially private with respect to one row, then every test that
tells "the row was trained on" from "it was not" obeys, at every threshold (Kairouz et al. 2015):

    TPR ≤ e^ε · FPR + δ          and          1 − FPR − δ ≤ e^ε · (1 − TPR)

so an attack's measured rates imply ``ε ≥ max(log((TPR − δ) / FPR), log((1 − δ − FPR) / (1 − TPR)))``.
Rates measured on finitely many rows are replaced by their Clopper–Pearson bounds, each in the direction
that makes the bound smaller (TPR by its lower bound, FPR by its upper bound), and the result is the
maximum over the attack's thresholds (Jagielski et al. 2020, Nasr et al. 2021).

Conventions (as in :mod:`probes.metrics`): members are the positive class and higher scores mean
"member"; a threshold ``t`` predicts member iff ``score >= t``; every distinct score is a threshold, and
at each one both inequalities are read (:class:`BoundSide` says which gave the maximum).

* **Confidence.** Both rates use the ends of the two-sided ``confidence`` Clopper–Pearson interval
  (``(1 - confidence) / 2`` in each tail), so by the union bound TPR ≥ TPR_low *and* FPR ≤ FPR_high
  hold together with probability ≥ ``confidence`` at a given threshold.
* **Edges.** Clopper–Pearson never returns the degenerate rates: with 0 false positives FPR_high is
  ``1 - ((1 - confidence) / 2) ** (1 / n)`` > 0, and with every member found TPR_low is
  ``((1 - confidence) / 2) ** (1 / n)`` < 1, so the bound stays finite on a perfect attack and grows
  only with the number of rows (50 members and 50 non-members cap it at about 2.6).
* **No evidence is 0.** ε is non-negative by definition; a side whose numerator is not positive
  (``TPR_low <= δ``, ``1 - δ - FPR_high <= 0``) says nothing, and an attack no better than chance gives 0.
* **What the bound is not.** The maximum over every threshold (and, one level up, over checkpoints and
  score kinds) is not corrected for selection, as in the audit literature, so the bound has no stated
  confidence; and the rows of one run are not independent trials of one mechanism. It is the literature's
  figure, not a certified statement. A check against an accountant needs a level: the aggregator's reads
  the same two inequalities at a few thresholds fixed by the non-members, with simultaneous bounds
  (:func:`epsilon_from_rate_bounds`, via :meth:`probes.gdp.GridCounts.epsilon_lower_bound`).

Pure numpy/scipy: no torch, no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt

from iclmem.errors import ProbeError

__all__ = [
    "DEFAULT_EPSILON_DELTA",
    "BoundSide",
    "EpsilonBound",
    "clopper_pearson_bounds",
    "epsilon_from_counts",
    "epsilon_from_rate_bounds",
    "epsilon_lower_bound",
    "validate_delta",
]

# δ of the audit when none is configured: the customary δ of DP-SGD runs on small data (well below 1/n for
# the row counts an audit sees), and the default of ``training.dp_delta``, so the two are comparable.
DEFAULT_EPSILON_DELTA = 1e-5

FloatArray = npt.NDArray[np.float64]


class BoundSide(str, Enum):
    """Which DP inequality gave the bound: ``tpr`` is TPR ≤ e^ε FPR + δ, ``tnr`` is
    1 − FPR − δ ≤ e^ε (1 − TPR); ``none`` when no threshold gave a positive bound."""

    TPR = "tpr"
    TNR = "tnr"
    NONE = "none"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class EpsilonBound:
    """The ε lower bound of one attack and the operating point that gave it."""

    epsilon: float  # >= 0; 0 = no evidence of privacy loss
    delta: float
    confidence: float
    side: BoundSide
    threshold: float  # predict member iff score >= threshold (nan when side is none)
    true_positives: int
    false_positives: int
    n_members: int
    n_nonmembers: int
    tpr_low: float
    fpr_high: float

    def as_dict(self, prefix: str = "epsilon_lb") -> dict[str, float | int | str]:
        """Flat record: ``<prefix>`` (the bound), ``<prefix>_delta``, ``<prefix>_tpr_low``,
        ``<prefix>_fpr_high`` and ``<prefix>_side``."""
        return {
            prefix: self.epsilon,
            f"{prefix}_delta": self.delta,
            f"{prefix}_tpr_low": self.tpr_low,
            f"{prefix}_fpr_high": self.fpr_high,
            f"{prefix}_side": self.side.value,
        }


def validate_delta(delta: float, name: str = "delta") -> float:
    """δ as a float in [0, 1); :class:`ProbeError` naming ``name`` otherwise."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.integer, np.floating)):
        raise ProbeError(f"{name} must be a number in [0, 1), got {delta!r}")
    d = float(delta)
    if math.isnan(d) or not 0.0 <= d < 1.0:
        raise ProbeError(f"{name} must lie in [0, 1), got {delta!r}")
    return d


def _validate_confidence(confidence: float) -> float:
    c = float(confidence)
    if not 0.0 < c < 1.0:
        raise ProbeError(f"confidence must lie in (0, 1), got {confidence!r}")
    return c


def clopper_pearson_bounds(k: Any, n: int, confidence: float = 0.95) -> tuple[FloatArray, FloatArray]:
    """Lower and upper ends of the two-sided Clopper–Pearson interval of ``k / n`` (``k`` an int or an
    array of counts). ``k = 0`` has lower end 0 and ``k = n`` upper end 1, as the interval is exact."""
    from scipy import stats  # imported on use: scipy.stats is slow to import

    c = _validate_confidence(confidence)
    counts = np.atleast_1d(np.asarray(k, dtype=np.int64))
    if n < 1 or (counts < 0).any() or (counts > n).any():
        raise ProbeError(f"Clopper-Pearson needs counts 0 <= k <= n and n >= 1, got n={n}")
    tail = (1.0 - c) / 2.0
    kf = counts.astype(np.float64)
    with np.errstate(invalid="ignore"):
        # beta(0, .) and beta(., 0) are undefined; those ends are exact (0 and 1) and filled in below
        low = np.where(counts == 0, 0.0, stats.beta.ppf(tail, np.maximum(kf, 1.0), n - kf + 1.0))
        high = np.where(counts == n, 1.0, stats.beta.ppf(1.0 - tail, kf + 1.0, np.maximum(n - kf, 1.0)))
    return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)


def _bounds(tpr_low: FloatArray, fpr_high: FloatArray, delta: float) -> tuple[FloatArray, FloatArray]:
    """Both sides' ε at each operating point; -inf where a side says nothing."""
    num_tpr = tpr_low - delta
    num_tnr = 1.0 - delta - fpr_high
    with np.errstate(divide="ignore"):
        # fpr_high > 0 and tpr_low < 1 always (Clopper-Pearson), so only the numerators can vanish
        tpr_side = np.where(num_tpr > 0, np.log(np.maximum(num_tpr, 1e-300) / fpr_high), -np.inf)
        tnr_side = np.where(num_tnr > 0, np.log(np.maximum(num_tnr, 1e-300) / (1.0 - tpr_low)), -np.inf)
    return tpr_side, tnr_side


def epsilon_from_rate_bounds(tpr_low: Any, fpr_high: Any, delta: float) -> float:
    """The largest ε both DP inequalities prove at any of the operating points given as rate bounds
    (``tpr_low[i]`` below point i's TPR, ``fpr_high[i]`` above its FPR; the caller sees to it that they
    hold together at the level it states); 0 when none proves anything."""
    d = validate_delta(delta)
    low = np.atleast_1d(np.asarray(tpr_low, dtype=np.float64))
    high = np.atleast_1d(np.asarray(fpr_high, dtype=np.float64))
    if low.shape != high.shape or low.ndim != 1 or low.size == 0:
        raise ProbeError(f"rate bounds must be equal-length 1-d, got {low.shape} and {high.shape}")
    if not ((high > 0).all() and (low < 1).all()):
        raise ProbeError("rate bounds must keep FPR_high > 0 and TPR_low < 1 (Clopper-Pearson bounds do)")
    tpr_side, tnr_side = _bounds(low, high, d)
    return max(float(np.max(tpr_side)), float(np.max(tnr_side)), 0.0)


def epsilon_from_counts(true_positives: Any, false_positives: Any, n_members: int, n_nonmembers: int,
                        delta: float = DEFAULT_EPSILON_DELTA, confidence: float = 0.95,
                        thresholds: Any = None) -> EpsilonBound:
    """The bound over operating points given as counts (equal-length arrays, or one point as ints):
    ``true_positives[i]`` of ``n_members`` members and ``false_positives[i]`` of ``n_nonmembers``
    non-members predicted member at point ``i`` (its score threshold in ``thresholds``, if given)."""
    d = validate_delta(delta)
    c = _validate_confidence(confidence)
    tp = np.atleast_1d(np.asarray(true_positives, dtype=np.int64))
    fp = np.atleast_1d(np.asarray(false_positives, dtype=np.int64))
    if tp.shape != fp.shape or tp.ndim != 1 or tp.size == 0:
        raise ProbeError(f"true and false positive counts must be equal-length 1-d, got {tp.shape} and {fp.shape}")
    th = np.full(tp.size, np.nan) if thresholds is None else np.atleast_1d(np.asarray(thresholds, dtype=np.float64))
    if th.shape != tp.shape:
        raise ProbeError(f"thresholds must match the counts, got {th.shape} for {tp.shape}")
    tpr_low, _ = clopper_pearson_bounds(tp, n_members, c)
    _, fpr_high = clopper_pearson_bounds(fp, n_nonmembers, c)
    tpr_side, tnr_side = _bounds(tpr_low, fpr_high, d)
    best_tpr, best_tnr = int(np.argmax(tpr_side)), int(np.argmax(tnr_side))
    # ties between the sides go to the TPR side (the attack's own direction)
    if tpr_side[best_tpr] >= tnr_side[best_tnr]:
        i, value, side = best_tpr, float(tpr_side[best_tpr]), BoundSide.TPR
    else:
        i, value, side = best_tnr, float(tnr_side[best_tnr]), BoundSide.TNR
    if not value > 0.0:
        i, value, side = best_tpr, 0.0, BoundSide.NONE
    return EpsilonBound(
        epsilon=value,
        delta=d,
        confidence=c,
        side=side,
        threshold=float("nan") if side is BoundSide.NONE else float(th[i]),
        true_positives=int(tp[i]),
        false_positives=int(fp[i]),
        n_members=int(n_members),
        n_nonmembers=int(n_nonmembers),
        tpr_low=float(tpr_low[i]),
        fpr_high=float(fpr_high[i]),
    )


def _finite_scores(x: Any, name: str) -> FloatArray:
    arr = np.asarray(x, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ProbeError(f"{name}: no scores (need at least one member and one non-member)")
    if np.isnan(arr).any():
        raise ProbeError(f"{name}: {int(np.isnan(arr).sum())} of {arr.size} scores are NaN")
    return arr


def epsilon_lower_bound(member_scores: Any, nonmember_scores: Any, delta: float = DEFAULT_EPSILON_DELTA,
                        confidence: float = 0.95) -> EpsilonBound:
    """ε lower bound of the attack "member iff score >= t", maximised over every distinct score ``t``.

    ``member_scores`` / ``nonmember_scores``: membership scores (higher = member, see
    :func:`probes.metrics.membership_score`); ``delta``: the δ of the (ε, δ) statement tested."""
    m = _finite_scores(member_scores, "member scores")
    n = _finite_scores(nonmember_scores, "non-member scores")
    thresholds = np.unique(np.concatenate([m, n]))
    # counts of scores >= t: size minus count(< t)
    tp = m.size - np.searchsorted(np.sort(m), thresholds, side="left")
    fp = n.size - np.searchsorted(np.sort(n), thresholds, side="left")
    return epsilon_from_counts(tp, fp, int(m.size), int(n.size), delta, confidence, thresholds)
