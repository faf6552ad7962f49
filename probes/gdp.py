"""Gaussian differential privacy (f-DP) audit: a lower bound on μ from an attack's ROC, and its ε.

A mechanism is μ-GDP (Dong, Roth & Su 2022) when telling any two neighbouring training sets apart from its
output is at least as hard as telling N(0, 1) from N(μ, 1): every test with false-positive rate FPR has a
false-negative rate of at least Φ(Φ⁻¹(1 − FPR) − μ). One measured operating point (FPR, FNR) therefore
refutes every μ below

    μ(FPR, FNR) = Φ⁻¹(1 − FPR) − Φ⁻¹(FNR)

and the audit's bound is the largest such μ over a few thresholds of the attack, each rate replaced by its
one-sided Clopper–Pearson upper bound (which makes μ smaller). The classic (ε, δ) construction
(:mod:`probes.epsilon`) also keeps its single best threshold, but of every distinct score and uncorrected
for that choice; and its inequalities are straight lines in the ROC plane, so a point away from the
low-FPR corner (both error rates moderate) proves little ε, while the Gaussian curve bends and the same
point can refute a sizeable μ.

* **Thresholds.** The thresholds are fixed by the non-members alone: for each false-positive rate f of
  :data:`GDP_FPR_GRID` (seven rates), the k-th highest non-member score with k = max(1, ⌊f·n⌋), a
  threshold ``t`` flagging ``score >= t``. Rates that give the same k, and ks that land on tied scores,
  give one threshold, so T ≤ 7 thresholds are tried (T = 6 on 50 non-members, where 1 % and 2 % both give
  k = 1). The FPR at such an order statistic is bounded by Clopper–Pearson (conservatively: the population
  FPR at the k-th highest of n scores is Beta(k, n − k + 1), below the Beta(k + 1, n − k) the upper bound
  reads), and the members never influence which thresholds are tried.
* **Confidence.** At T thresholds there are 2T one-sided upper bounds (T on the FPR, T on the FNR); each
  is taken at ``β / (2T)`` (Bonferroni), so all of them hold together with probability ≥ 1 − β, and the
  best threshold, chosen after looking, is paid for. One score kind's bound uses β = :data:`GDP_BETA`
  (``confidence`` 0.95). The counts behind the bound (:class:`GridCounts`, written with the results row)
  let it be re-read at another level without the scores: the checkpoint headline, a maximum over K
  competing score kinds, reads each kind at ``GDP_BETA / K`` (``orchestrator.report.aggregate``), and the
  consistency checks against DP-SGD read them at their share of a run's level. (Every distinct score as a
  threshold, Bonferroni over a few hundred, measured no bound at all on 100 + 100 rows of a run whose
  classic bound was 0.45.)
* **From μ to ε.** A μ-GDP mechanism is (ε, δ(ε))-DP for every ε ≥ 0 with
  δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (their Corollary 2.13); :func:`gdp_epsilon` inverts it at the
  audit's δ. That ε is the ε of a mechanism whose trade-off curve is *exactly* Gaussian with that μ. It
  is a lower bound on a mechanism's ε only when the mechanism's curve is Gaussian: otherwise a μ_lb says
  nothing about its ε (a perfect attack on 50 + 50 rows reads μ_lb 2.33 and "ε" 12.1, where the classic
  bound of the same scores caps at 2.57; a pure ε = 3 randomised response is not 12-DP). DP-SGD with full
  batches (iclmem's fixed batches, sample rate 1) is a composition of Gaussian mechanisms, so the
  assumption holds there and its exact μ is known (:func:`trainables.dp.gaussian_mechanism_mu`): the aggregator derives
  the ε only on such runs and withholds it (NaN, with the reason) on every other.
* **Orientation** as everywhere in iclmem: members are the positive class, higher score = member, a
  threshold ``t`` predicts member iff ``score >= t``.

Pure numpy/scipy: no torch, no Ray.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from iclmem.errors import ProbeError
from probes.epsilon import epsilon_from_rate_bounds, validate_delta

# the false-positive rates whose thresholds are tried: few, so that the Bonferroni split over them costs
# little, and spread from the low-FPR corner (where memorization shows) to the middle (where a diffuse
# shift shows)
GDP_FPR_GRID: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
# the error probability of every μ lower bound iclmem reports: one score kind's own (confidence 0.95) and
# the checkpoint headline, whose K competing kinds share it (each read at GDP_BETA / K)
GDP_BETA = 0.05

__all__ = ["GDP_BETA", "GDP_FPR_GRID", "GdpBound", "GridCounts", "gdp_delta", "gdp_epsilon",
           "gdp_epsilon_at", "gdp_mu_lower_bound"]

FloatArray = npt.NDArray[np.float64]


def _normal() -> Any:
    from scipy import stats  # imported on use: scipy.stats is slow to import

    return stats.norm


def _check_beta(beta: float) -> float:
    b = float(beta)
    if not 0.0 < b < 1.0:
        raise ProbeError(f"an error probability beta must lie in (0, 1), got {beta!r}")
    return b


def _upper_bounds(k: npt.NDArray[np.int64], n: int, tail: float) -> FloatArray:
    """One-sided Clopper–Pearson upper bound of k / n at error probability ``tail`` (1 where k = n). Read
    with the survival function, so a tail far below 1e-16 (a strict consistency level) keeps its precision."""
    from scipy import stats

    kf = k.astype(np.float64)
    with np.errstate(invalid="ignore"):
        upper = np.where(k >= n, 1.0, stats.beta.isf(tail, kf + 1.0, np.maximum(n - kf, 1.0)))
    return np.asarray(upper, dtype=np.float64)


@dataclass(frozen=True)
class GridCounts:
    """An attack's errors at the thresholds of the false-positive grid: per threshold, the non-members
    flagged (``score >= t``) and the members missed (``score < t``). They are everything a bound read at
    those thresholds depends on, so the bound can be re-read at any level without the scores (the
    checkpoint headline shares its level among score kinds, the consistency checks among a run's checks)."""

    false_positives: tuple[int, ...]
    false_negatives: tuple[int, ...]
    n_members: int
    n_nonmembers: int

    def __post_init__(self) -> None:
        fp, fn = self.false_positives, self.false_negatives
        if len(fp) != len(fn) or not fp:
            raise ProbeError(f"grid counts need one false-positive and one false-negative count per threshold, "
                             f"got {len(fp)} and {len(fn)}")
        if self.n_members < 1 or self.n_nonmembers < 1:
            raise ProbeError(f"grid counts need members and non-members, got {self.n_members} and {self.n_nonmembers}")
        if not all(0 <= v <= self.n_nonmembers for v in fp) or not all(0 <= v <= self.n_members for v in fn):
            raise ProbeError(f"grid counts out of range: false positives {fp} of {self.n_nonmembers}, "
                             f"false negatives {fn} of {self.n_members}")

    @property
    def thresholds(self) -> int:
        """T: the thresholds the Bonferroni split counts."""
        return len(self.false_positives)

    def rate_upper_bounds(self, beta: float) -> tuple[FloatArray, FloatArray]:
        """Upper bounds of every threshold's FPR and FNR, each at ``beta / (2T)``: all 2T hold together
        with probability ≥ 1 − ``beta``."""
        tail = _check_beta(beta) / (2.0 * self.thresholds)
        fp = np.asarray(self.false_positives, dtype=np.int64)
        fn = np.asarray(self.false_negatives, dtype=np.int64)
        return _upper_bounds(fp, self.n_nonmembers, tail), _upper_bounds(fn, self.n_members, tail)

    def mu_bounds(self, beta: float) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(μ refuted at each threshold, -inf where a rate's bound is 1 and says nothing; the FPR and FNR
        upper bounds it was read from), all at error probability ``beta`` together."""
        fpr_high, fnr_high = self.rate_upper_bounds(beta)
        norm = _normal()
        with np.errstate(divide="ignore", invalid="ignore"):
            mu = norm.isf(fpr_high) - norm.ppf(fnr_high)  # Φ⁻¹(1 − FPR) − Φ⁻¹(FNR)
        return np.where(np.isfinite(mu), mu, -np.inf), fpr_high, fnr_high

    def mu_lower_bound(self, beta: float) -> float:
        """The μ lower bound at error probability ``beta`` (0: no evidence)."""
        mu, _, _ = self.mu_bounds(beta)
        return max(float(np.max(mu)), 0.0)

    def epsilon_lower_bound(self, delta: float, beta: float) -> float:
        """The classic (ε, δ) lower bound at the same thresholds and the same simultaneous rate bounds
        (:func:`probes.epsilon.epsilon_from_rate_bounds`): both DP inequalities at every threshold, valid
        at error probability ``beta`` after the choice of threshold (unlike the classic bound over every
        distinct score, which has no level)."""
        fpr_high, fnr_high = self.rate_upper_bounds(beta)
        return epsilon_from_rate_bounds(1.0 - fnr_high, fpr_high, validate_delta(delta))

    def to_json(self) -> str:
        return json.dumps({"false_positives": list(self.false_positives),
                           "false_negatives": list(self.false_negatives),
                           "n_members": self.n_members, "n_nonmembers": self.n_nonmembers})

    @classmethod
    def from_json(cls, text: str) -> GridCounts:
        try:
            d = json.loads(text)
            return cls(tuple(int(v) for v in d["false_positives"]), tuple(int(v) for v in d["false_negatives"]),
                       int(d["n_members"]), int(d["n_nonmembers"]))
        except (TypeError, ValueError, KeyError) as exc:
            raise ProbeError(f"not a GDP grid record: {text[:120]!r} ({exc})") from None


@dataclass(frozen=True)
class GdpBound:
    """The μ lower bound of one attack, the operating point that gave it, the counts it was read from, and
    the ε a mechanism with exactly that μ has at δ (a lower bound on ε only for a Gaussian mechanism)."""

    mu: float  # >= 0; 0 = no evidence
    epsilon: float  # ε at ``delta`` of a mechanism that is exactly μ-GDP (>= 0)
    delta: float
    confidence: float
    threshold: float  # nan when mu is 0
    fpr_high: float
    fnr_high: float
    n_members: int
    n_nonmembers: int
    grid: GridCounts

    def as_dict(self, prefix: str) -> dict[str, float | str]:
        """``<prefix>_gdp_mu_lb``, ``<prefix>_gdp_epsilon_lb`` and ``<prefix>_gdp_grid`` (the counts as
        JSON, for the aggregator to re-read at another level)."""
        return {f"{prefix}_gdp_mu_lb": self.mu, f"{prefix}_gdp_epsilon_lb": self.epsilon,
                f"{prefix}_gdp_grid": self.grid.to_json()}


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


def gdp_epsilon_at(mu: float, delta: float) -> float:
    """:func:`gdp_epsilon`, with δ = 0 allowed: a mechanism with μ > 0 is then (ε, 0)-DP for no finite ε."""
    if validate_delta(delta) == 0.0:
        return math.inf if mu > 0 else 0.0
    return gdp_epsilon(mu, delta)


def _grid_thresholds(nonmembers: FloatArray, fprs: tuple[float, ...]) -> FloatArray:
    """The thresholds tried: for each false-positive rate f of the grid, the k-th highest non-member score
    with k = max(1, floor(f·n)); equal ks and tied scores give one threshold. They depend on the
    non-members alone, so the members' side of the test is untouched by the choice, and the grid is fixed
    before any score is seen."""
    ordered = np.sort(nonmembers)[::-1]
    ks = sorted({max(1, int(math.floor(f * ordered.size))) for f in fprs})
    return np.unique(ordered[[k - 1 for k in ks]])


def gdp_mu_lower_bound(member_scores: Any, nonmember_scores: Any, delta: float, confidence: float = 1.0 - GDP_BETA,
                       fprs: tuple[float, ...] = GDP_FPR_GRID) -> GdpBound:
    """μ lower bound of the attack "member iff score >= t" at the thresholds of the false-positive grid
    ``fprs`` (Bonferroni over their 2T rate bounds, so it holds at ``confidence``), and the ε a mechanism
    with exactly that μ has at ``delta``."""
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
    grid = GridCounts(tuple(int(v) for v in fp), tuple(int(v) for v in fn), int(m.size), int(n.size))
    mu, fpr_high, fnr_high = grid.mu_bounds(1.0 - c)
    i = int(np.argmax(mu))
    value = float(mu[i]) if mu[i] > 0.0 else 0.0
    return GdpBound(mu=value, epsilon=gdp_epsilon_at(value, d), delta=d, confidence=c,
                    threshold=float(thresholds[i]) if value > 0.0 else math.nan, fpr_high=float(fpr_high[i]),
                    fnr_high=float(fnr_high[i]), n_members=int(m.size), n_nonmembers=int(n.size), grid=grid)
