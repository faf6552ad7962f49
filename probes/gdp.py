"""Gaussian differential privacy (f-DP) audit: a lower bound on μ from an attack's whole ROC, and its ε.

A mechanism is μ-GDP (Dong, Roth & Su 2022) when telling any two neighbouring training sets apart from its
output is at least as hard as telling N(0, 1) from N(μ, 1): every test with false-positive rate FPR has a
false-negative rate of at least Φ(Φ⁻¹(1 − FPR) − μ). One measured operating point (FPR, FNR) therefore
refutes every μ below

    μ(FPR, FNR) = Φ⁻¹(1 − FPR) − Φ⁻¹(FNR)

and the audit's bound is the largest such μ over the attack's thresholds, each rate replaced by its
one-sided Clopper–Pearson upper bound (which makes μ smaller). Unlike the classic (ε, δ) construction
(:mod:`probes.epsilon`), which reads one corner of the ROC, every threshold is a test of the same
curve, so the points away from the corner count too.

* **Thresholds and confidence.** The thresholds are fixed by the non-members alone: for each false-positive
  rate f of a small grid (:data:`GDP_FPR_GRID`), the k-th highest non-member score, k = max(1, ⌊f·n⌋). The
  FPR at such an order statistic is bounded exactly by Clopper–Pearson, and the members never influence
  which thresholds are tried. The maximum is taken over the T thresholds, so each of the 2T upper bounds
  is taken at ``(1 − confidence) / (2T)`` (Bonferroni): the bound holds at ``confidence`` *after* choosing
  the best threshold. (Every distinct score as a threshold, Bonferroni over a few hundred, measured no
  bound at all on 100 + 100 rows of a run whose classic bound was 0.45.)
* **From μ to ε.** A μ-GDP mechanism is (ε, δ(ε))-DP for every ε ≥ 0 with
  δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (their Corollary 2.13); :func:`gdp_epsilon` inverts it at the
  audit's δ. This ε is a lower bound on the mechanism's ε only under the assumption that its trade-off
  curve is Gaussian. DP-SGD with full batches (iclmem's fixed batches, sample rate 1) is exactly a
  composition of Gaussian mechanisms, so that assumption holds and its exact μ is known
  (:func:`gaussian_mechanism_mu`): the audit's μ is compared with it directly, like with like.
* **Orientation** as everywhere in iclmem: members are the positive class, higher score = member, a
  threshold ``t`` predicts member iff ``score >= t``.

Pure numpy/scipy: no torch, no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from iclmem.errors import ProbeError
from probes.epsilon import validate_delta

# the false-positive rates whose thresholds are tried: few, so that the Bonferroni split over them costs
# little, and spread from the low-FPR corner (where memorization shows) to the middle (where a diffuse
# shift shows)
GDP_FPR_GRID: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)

__all__ = ["GDP_FPR_GRID", "GdpBound", "gdp_delta", "gdp_epsilon", "gdp_mu_lower_bound", "gaussian_mechanism_mu"]


@dataclass(frozen=True)
class GdpBound:
    """The μ lower bound of one attack, the operating point that gave it, and the ε it implies at δ."""

    mu: float  # >= 0; 0 = no evidence
    epsilon: float  # ε at ``delta`` of a mechanism that is exactly μ-GDP (>= 0)
    delta: float
    confidence: float
    threshold: float  # nan when mu is 0
    fpr_high: float
    fnr_high: float
    n_members: int
    n_nonmembers: int

    def as_dict(self, prefix: str = "gdp") -> dict[str, float]:
        return {f"{prefix}_mu_lb": self.mu, f"{prefix}_epsilon_lb": self.epsilon}


def _normal() -> Any:
    from scipy import stats  # imported on use: scipy.stats is slow to import

    return stats.norm


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of a μ-GDP mechanism (module docstring), computed in the log domain so that large ε/μ do not
    underflow to 0 − 0."""
    if not mu > 0:
        return 0.0
    norm = _normal()
    a = float(norm.logcdf(-epsilon / mu + mu / 2))
    b = float(epsilon + norm.logcdf(-epsilon / mu - mu / 2))
    if b >= a:  # equal up to rounding: δ is 0 to machine precision
        return 0.0
    return math.exp(a) * -math.expm1(b - a)


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε >= 0 with δ(ε) <= ``delta`` for a μ-GDP mechanism (0 when δ(0) <= delta already)."""
    d = validate_delta(delta)
    if d == 0.0:
        raise ProbeError("gdp_epsilon needs delta > 0: a μ-GDP mechanism with μ > 0 is (ε, 0)-DP for no finite ε")
    if not mu > 0 or gdp_delta(mu, 0.0) <= d:
        return 0.0
    lo, hi = 0.0, max(1.0, mu * mu)
    while gdp_delta(mu, hi) > d:  # δ(ε) decreases in ε: bracket the root
        lo, hi = hi, hi * 2.0
    for _ in range(200):  # bisection to a relative 1e-12: δ(ε) is monotone, no root-finder subtleties
        mid = 0.5 * (lo + hi)
        if gdp_delta(mu, mid) > d:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return hi


def _upper_bounds(k: np.ndarray, n: int, tail: float) -> np.ndarray:
    """One-sided Clopper–Pearson upper bound of k / n at error probability ``tail`` (1 where k = n)."""
    from scipy import stats

    kf = k.astype(np.float64)
    with np.errstate(invalid="ignore"):
        upper = np.where(k >= n, 1.0, stats.beta.ppf(1.0 - tail, kf + 1.0, np.maximum(n - kf, 1.0)))
    return np.asarray(upper, dtype=np.float64)


def _grid_thresholds(nonmembers: np.ndarray, fprs: tuple[float, ...]) -> np.ndarray:
    """The thresholds tried: for each false-positive rate f of the grid, the k-th highest non-member score
    with k = max(1, floor(f·n)). They depend on the non-members alone, so the members' side of the test
    is untouched by the choice, and the grid is fixed before any score is seen."""
    ordered = np.sort(nonmembers)[::-1]
    ks = sorted({max(1, int(math.floor(f * ordered.size))) for f in fprs})
    return np.unique(ordered[[k - 1 for k in ks]])


def gdp_mu_lower_bound(member_scores: Any, nonmember_scores: Any, delta: float, confidence: float = 0.95,
                       fprs: tuple[float, ...] = GDP_FPR_GRID) -> GdpBound:
    """μ lower bound of the attack "member iff score >= t" at the thresholds of the false-positive grid
    ``fprs`` (Bonferroni over them), and the ε it implies at ``delta``."""
    m = np.asarray(member_scores, dtype=np.float64).reshape(-1)
    n = np.asarray(nonmember_scores, dtype=np.float64).reshape(-1)
    if m.size == 0 or n.size == 0:
        raise ProbeError(f"the GDP bound needs members and non-members, got {m.size} and {n.size}")
    if np.isnan(m).any() or np.isnan(n).any():
        raise ProbeError("the GDP bound got NaN scores")
    c = float(confidence)
    if not 0.0 < c < 1.0:
        raise ProbeError(f"confidence must lie in (0, 1), got {confidence!r}")
    d = validate_delta(delta)
    thresholds = _grid_thresholds(n, fprs)
    fp = n.size - np.searchsorted(np.sort(n), thresholds, side="left")  # non-members with score >= t
    fn = np.searchsorted(np.sort(m), thresholds, side="left")  # members with score < t
    tail = (1.0 - c) / (2.0 * thresholds.size)
    fpr_high, fnr_high = _upper_bounds(fp, n.size, tail), _upper_bounds(fn, m.size, tail)
    norm = _normal()
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = norm.isf(fpr_high) - norm.ppf(fnr_high)  # Φ⁻¹(1 − FPR) − Φ⁻¹(FNR)
    mu = np.where(np.isfinite(mu), mu, -np.inf)  # an upper bound of 1 on either rate says nothing
    i = int(np.argmax(mu))
    if not mu[i] > 0.0:
        return GdpBound(mu=0.0, epsilon=0.0, delta=d, confidence=c, threshold=math.nan, fpr_high=float(fpr_high[i]),
                        fnr_high=float(fnr_high[i]), n_members=int(m.size), n_nonmembers=int(n.size))
    value = float(mu[i])
    return GdpBound(mu=value, epsilon=gdp_epsilon(value, d) if d > 0 else math.inf, delta=d, confidence=c,
                    threshold=float(thresholds[i]), fpr_high=float(fpr_high[i]), fnr_high=float(fnr_high[i]),
                    n_members=int(m.size), n_nonmembers=int(n.size))


def gaussian_mechanism_mu(noise_multiplier: float, steps: int, sensitivity: float = 1.0) -> float:
    """μ of ``steps`` full-batch Gaussian mechanisms with noise ``noise_multiplier`` × clip norm and a
    neighbour that moves the clipped sum by ``sensitivity`` × clip norm: sqrt(steps) · sensitivity / σ
    (GDP composes exactly: the μ of a composition is the root of the sum of squares). Sensitivity 1 is
    add/remove one row, 2 is replace one row."""
    if not noise_multiplier > 0:
        return math.inf
    return math.sqrt(max(int(steps), 0)) * float(sensitivity) / float(noise_multiplier)
