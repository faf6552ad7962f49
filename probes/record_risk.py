"""Per-record and per-slice membership risk: whose rows an attack exposes, and which groups leak more.

Pure numpy / scipy, no Ray, no torch. The inputs are one attack's membership scores of an audit's rows
(higher = more member-like, as :func:`probes.metrics.membership_score` orients them) and which rows were members.

* **A record's risk** (:func:`membership_posterior`) is the posterior probability that the row is a member given
  its score, at a stated prior: Song & Mittal's "privacy risk score" (USENIX Security 2021), P(in | score),
  with the score's member and non-member distributions learnt from the audit's *other* rows. The map from score
  to P(in | score) is fitted by isotonic regression (the maximum-likelihood monotone map: a higher score never
  means a lower risk) and cross-fitted over folds, so a row's own membership never enters its own risk. The
  fitted map holds the audit's base rate of members; :func:`at_prior` moves the odds to another prior (the share
  of a population that a deployed model was trained on, say). With no signal the risk of every row is the prior.
* **Stability** (:func:`rank_stability`): the same rows' membership scores under two audits (seeds, reference
  sets; scores, not the risks' cross-fitted steps): the Spearman correlation and the share of one's top k that
  recur in the other's. Jälkö et al. (2024) show that a pooled TPR says little about one record; this says how
  much one audit's ranking of records can be trusted.
* **Ground truth for a ranking** (:func:`precision_at_k`): canaries and planted outliers are the rows known to
  be most exposed; the share of the k riskiest rows that are among them.
* **Slices** (:func:`slice_leakage`): for each group of rows, the attack's AUC with its bootstrap interval,
  TPR at 1% FPR (with the low-resolution flag when fewer than ten false positives decide it), the ε lower bound
  (only where the caller says the rows are exchangeable), the one-sided Mann-Whitney p-value of "members score
  higher" with Holm's correction over the slices, and a permutation test of "this slice leaks more than the
  rest" (AUC of the slice minus AUC of the rest, slice labels permuted within members and within non-members so
  each side keeps its size), Holm-corrected over the slices. A sweep corrects over a run's whole family instead
  and measures how often the same tests fire on null splits (``orchestrator.report.record_risk``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from iclmem.errors import ProbeError
from iclmem.stats import LowResolutionWarning, auc, bootstrap_intervals, mann_whitney_p, tpr_at_fpr

__all__ = ["DEFAULT_FOLDS", "PosteriorMap", "SliceLeakage", "Stability", "at_prior", "holm", "membership_posterior", "posterior_map",
           "precision_at_k", "rank_stability", "slice_leakage"]

DEFAULT_FOLDS = 5
# below this many members (or non-members) in a slice its AUC is not computed: an interval from fewer rows is
# wider than the range that matters, and the permutation test has no power
MIN_SLICE_SIDE = 5
TPR_ALPHA = 0.01


def _scores_and_members(scores: Any, member: Any) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    m = np.asarray(member, dtype=bool).reshape(-1)
    if s.shape != m.shape:
        raise ProbeError(f"{s.size} scores for {m.size} member flags")
    if not np.isfinite(s).all():
        raise ProbeError(f"{int((~np.isfinite(s)).sum())} of {s.size} membership scores are not finite")
    return s, m


def _stratified_folds(member: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Fold number of each row: members and non-members dealt round-robin in a seeded random order, so every
    fold holds both (as far as the counts allow)."""
    rng = np.random.default_rng(seed)
    fold = np.empty(member.size, dtype=np.int64)
    for side in (True, False):
        rows = np.flatnonzero(member == side)
        fold[rng.permutation(rows)] = np.arange(rows.size) % folds
    return fold


def _isotonic_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool-adjacent-violators: the non-decreasing step function of ``x`` closest to ``y`` in squared error, as
    (sorted distinct x, fitted value at each); tied x share one value (the mean of their y)."""
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order].astype(np.float64)
    distinct, start = np.unique(xs, return_index=True)
    sums = np.add.reduceat(ys, start)
    counts = np.diff(np.append(start, xs.size)).astype(np.float64)
    blocks: list[list[float]] = []  # [sum, count, number of distinct x in the block]
    for s, c in zip(sums, counts, strict=True):
        blocks.append([float(s), float(c), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s2, c2, k2 = blocks.pop()
            blocks[-1][0] += s2
            blocks[-1][1] += c2
            blocks[-1][2] += k2
    fitted = np.concatenate([np.full(int(k), s / c) for s, c, k in blocks])
    return distinct, fitted


def _isotonic_predict(distinct: np.ndarray, fitted: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The fitted step function at ``x``: linear between fitted points, flat beyond them."""
    if distinct.size == 1:
        return np.full(x.shape, fitted[0])
    out: np.ndarray = np.interp(x, distinct, fitted)
    return out


def at_prior(posterior: Any, base_rate: float, prior: float) -> np.ndarray:
    """Posterior probabilities fitted where members were ``base_rate`` of the rows, moved to ``prior``: the
    likelihood ratio is kept, the prior odds replaced."""
    p = np.asarray(posterior, dtype=np.float64)
    for name, value in (("base rate", base_rate), ("prior", prior)):
        if not 0.0 < value < 1.0:
            raise ProbeError(f"the {name} must lie strictly between 0 and 1, got {value!r}")
    with np.errstate(divide="ignore"):
        odds = p / (1.0 - p) * (prior / (1.0 - prior)) / (base_rate / (1.0 - base_rate))
    out: np.ndarray = np.where(np.isinf(odds), 1.0, odds / (1.0 + odds))
    return out


def membership_posterior(scores: Any, member: Any, *, prior: float | None = None, folds: int = DEFAULT_FOLDS,
                         seed: int = 0) -> np.ndarray:
    """Each row's risk: P(member | its score), cross-fitted (see the module's docstring), at ``prior`` (default:
    the audit's own share of members). A fold's map is fitted on the other folds; its values are kept inside
    [1 / (2 n), 1 - 1 / (2 n)] for n rows fitted on, as n rows cannot tell a certainty from a rate below 1 / n."""
    s, m = _scores_and_members(scores, member)
    n_members, n_rows = int(m.sum()), m.size
    if n_members == 0 or n_members == n_rows:
        raise ProbeError(f"a membership posterior needs members and non-members ({n_members} of {n_rows} rows are members)")
    if folds < 2 or folds > min(n_members, n_rows - n_members):
        raise ProbeError(f"folds must lie in [2, {min(n_members, n_rows - n_members)}] (the smaller side's rows), got {folds}")
    fold = _stratified_folds(m, folds, seed)
    risk = np.empty(n_rows, dtype=np.float64)
    base_rate = n_members / n_rows
    for f in range(folds):
        train, test = fold != f, fold == f
        distinct, fitted = _isotonic_fit(s[train], m[train].astype(np.float64))
        floor = 1.0 / (2.0 * int(train.sum()))
        p = np.clip(_isotonic_predict(distinct, fitted, s[test]), floor, 1.0 - floor)
        # the fold's map holds its training rows' base rate; put every fold at the audit's
        risk[test] = at_prior(p, float(m[train].mean()), base_rate)
    return risk if prior is None else at_prior(risk, base_rate, prior)


@dataclass(frozen=True)
class PosteriorMap:
    """P(member | score) fitted on all of an audit's rows, for records that were not among them (canaries
    scored with the same statistic): the isotonic map, kept inside [1 / (2 n), 1 - 1 / (2 n)]."""

    distinct: np.ndarray
    fitted: np.ndarray
    n_rows: int

    def __call__(self, scores: Any) -> np.ndarray:
        floor = 1.0 / (2.0 * self.n_rows)
        out: np.ndarray = np.clip(_isotonic_predict(self.distinct, self.fitted, np.asarray(scores, np.float64)),
                                  floor, 1.0 - floor)
        return out


def posterior_map(scores: Any, member: Any) -> PosteriorMap:
    """The map of :func:`membership_posterior` fitted on every row (no row of the fit may be scored by it: that
    is what the cross-fitting is for), at the rows' own share of members."""
    s, m = _scores_and_members(scores, member)
    if not m.any() or m.all():
        raise ProbeError(f"a membership posterior needs members and non-members ({int(m.sum())} of {m.size} rows are members)")
    distinct, fitted = _isotonic_fit(s, m.astype(np.float64))
    return PosteriorMap(distinct, fitted, int(m.size))


@dataclass(frozen=True)
class Stability:
    """How far two audits agree on which records are most at risk (over the records both scored)."""

    n_common: int
    spearman: float  # rank correlation of the two audits' values; nan with fewer than three common records
    top_k: int
    top_k_overlap: float  # share of the first audit's k highest common records among the second's k highest

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rank_stability(ids_a: Any, risk_a: Any, ids_b: Any, risk_b: Any, top_k: int) -> Stability:
    """The agreement of two audits' values (membership scores, or risks) on the records both scored (matched by
    id); ``top_k`` is capped at the number of common records."""
    from scipy.stats import spearmanr

    a = dict(zip(np.asarray(ids_a).tolist(), np.asarray(risk_a, dtype=np.float64).tolist(), strict=True))
    b = dict(zip(np.asarray(ids_b).tolist(), np.asarray(risk_b, dtype=np.float64).tolist(), strict=True))
    common = sorted(set(a) & set(b))
    k = min(int(top_k), len(common))
    if k < 1:
        return Stability(len(common), float("nan"), k, float("nan"))
    ra = np.array([a[i] for i in common])
    rb = np.array([b[i] for i in common])
    rho = float("nan")
    if len(common) >= 3 and np.ptp(ra) > 0 and np.ptp(rb) > 0:
        rho = float(spearmanr(ra, rb).statistic)
    top_a = {common[i] for i in np.argsort(-ra, kind="stable")[:k]}
    top_b = {common[i] for i in np.argsort(-rb, kind="stable")[:k]}
    return Stability(len(common), rho, k, len(top_a & top_b) / k)


def precision_at_k(scores: Any, positive: Any, k: int) -> float:
    """Share of the ``k`` highest-scored rows that are ``positive`` (ties at the cut: the expected share over
    every order of the tied rows, so a ranking that cannot separate rows gets their mean, not a lucky draw)."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    pos = np.asarray(positive, dtype=bool).reshape(-1)
    if s.shape != pos.shape:
        raise ProbeError(f"{s.size} scores for {pos.size} positive flags")
    if not 1 <= k <= s.size:
        raise ProbeError(f"k must lie in [1, {s.size}], got {k}")
    cut = np.sort(s)[::-1][k - 1]
    above = s > cut
    tied = s == cut
    from_tied = k - int(above.sum())
    hits = float(pos[above].sum()) + from_tied * float(pos[tied].mean())
    return hits / k


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjustment (family-wise error); nan p-values stay nan and are not counted."""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    order = finite[np.argsort(p[finite], kind="stable")]
    m = order.size
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


@dataclass(frozen=True)
class SliceLeakage:
    """One slice's membership leakage under one attack (see the module's docstring)."""

    slice: str
    n_members: int
    n_nonmembers: int
    auc: float
    auc_low: float
    auc_high: float
    tpr_at_1pct: float
    tpr_at_1pct_low_resolution: bool  # fewer than ten false positives decide it: a coarse estimate
    epsilon_lb: float  # nan unless the rows were exchangeable before training (the bound's assumption)
    p_value: float  # one-sided Mann-Whitney, members score higher
    p_holm: float  # ... Holm-adjusted over the slices
    exposed: bool  # p_holm below the level
    auc_rest: float  # the attack's AUC on every other row
    p_more: float  # permutation p-value of AUC(slice) > AUC(rest)
    p_more_holm: float
    leaks_more: bool  # p_more_holm below the level

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _slice_aucs(s: np.ndarray, m: np.ndarray, inside: np.ndarray) -> tuple[float, float]:
    return auc(s[inside & m], s[inside & ~m]), auc(s[~inside & m], s[~inside & ~m])


def _random_subsets(n: int, k: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` indicator rows over ``n`` items, each with ``k`` ones at uniformly random places (a uniform
    k-subset): the k smallest of n uniform keys, drawn for every row at once (no Python loop over rows)."""
    out = np.zeros((count, n))
    if k == 0 or count == 0:
        return out
    if k >= n:
        return np.ones((count, n))
    picked = np.argpartition(rng.random((count, n)), k - 1, axis=1)[:, :k]
    np.put_along_axis(out, picked, 1.0, axis=1)
    return out


def _more_than_rest(s: np.ndarray, m: np.ndarray, inside: np.ndarray, permutations: int,
                    rng: np.random.Generator) -> float:
    """Permutation p-value of AUC(slice) - AUC(rest) >= the observed: the slice's rows redrawn at random among
    the members (as many as it holds) and among the non-members (likewise). All permutations at once: with
    C[i, j] = 1 when member i outscores non-member j (1/2 on a tie), a group's AUC is the mean of C over its
    members' rows and non-members' columns, so every permutation's slice wins are one matrix product
    (a C) summed against b: O(permutations x members x non-members) in BLAS, no Python loop."""
    sm, sn = s[m], s[~m]
    wins = (sm[:, None] > sn[None, :]) + 0.5 * (sm[:, None] == sn[None, :])
    k_m, k_n = int(inside[m].sum()), int(inside[~m].sum())
    a = np.vstack([inside[m].astype(float)[None, :], _random_subsets(sm.size, k_m, permutations, rng)])
    b = np.vstack([inside[~m].astype(float)[None, :], _random_subsets(sn.size, k_n, permutations, rng)])
    total = wins.sum()
    slice_wins = ((a @ wins) * b).sum(axis=1)
    rest_wins = total - a @ wins.sum(axis=1) - b @ wins.sum(axis=0) + slice_wins
    difference = slice_wins / (k_m * k_n) - rest_wins / ((sm.size - k_m) * (sn.size - k_n))
    hits = int((difference[1:] >= difference[0] - 1e-12).sum())
    return (1 + hits) / (1 + permutations)


def slice_leakage(scores: Any, member: Any, slices: Mapping[str, Any], *, alpha: float = 0.05,
                  n_resamples: int = 200, permutations: int = 500, seed: int = 0,
                  exchangeable: bool = False, epsilon_delta: float = 1e-5) -> list[SliceLeakage]:
    """Each slice's leakage (``slices``: name -> boolean mask over the rows), in the order given. A slice with
    fewer than :data:`MIN_SLICE_SIDE` members or non-members keeps its counts and nan metrics, and is left out
    of both Holm families. ``exchangeable``: the audit's members and non-members were exchangeable before
    training (then, and only then, the ε lower bound is one)."""
    from probes.epsilon import epsilon_lower_bound

    s, m = _scores_and_members(scores, member)
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for name, mask in slices.items():
        inside = np.asarray(mask, dtype=bool).reshape(-1)
        if inside.shape != s.shape:
            raise ProbeError(f"slice {name!r}: a mask of {inside.size} rows for {s.size} scores")
        n_m, n_n = int((inside & m).sum()), int((inside & ~m).sum())
        row: dict[str, Any] = {"slice": name, "n_members": n_m, "n_nonmembers": n_n}
        nan = float("nan")
        rest_ok = int((~inside & m).sum()) >= MIN_SLICE_SIDE and int((~inside & ~m).sum()) >= MIN_SLICE_SIDE
        if n_m < MIN_SLICE_SIDE or n_n < MIN_SLICE_SIDE:
            row.update(auc=nan, auc_low=nan, auc_high=nan, tpr_at_1pct=nan, tpr_at_1pct_low_resolution=True,
                       epsilon_lb=nan, p_value=nan, auc_rest=nan, p_more=nan)
            rows.append(row)
            continue
        sm, sn = s[inside & m], s[inside & ~m]
        interval = bootstrap_intervals(sm, sn, (TPR_ALPHA,), n_resamples, seed) if n_resamples > 0 else None
        with warnings.catch_warnings():  # the flag below says it, once per slice, in the table
            warnings.simplefilter("ignore", LowResolutionWarning)
            tpr = tpr_at_fpr(sm, sn, TPR_ALPHA)
        row.update(auc=auc(sm, sn), auc_low=interval.auc.low if interval else nan,
                   auc_high=interval.auc.high if interval else nan, tpr_at_1pct=tpr.tpr,
                   tpr_at_1pct_low_resolution=bool(TPR_ALPHA * n_n < 10),
                   epsilon_lb=epsilon_lower_bound(sm, sn, epsilon_delta).epsilon if exchangeable else nan,
                   p_value=mann_whitney_p(sm, sn))
        if rest_ok:
            row["auc_rest"] = _slice_aucs(s, m, inside)[1]
            row["p_more"] = _more_than_rest(s, m, inside, permutations, rng)
        else:
            row["auc_rest"] = row["p_more"] = nan
        rows.append(row)
    p_holm = holm([r["p_value"] for r in rows])
    p_more_holm = holm([r["p_more"] for r in rows])
    out = []
    for r, ph, pm in zip(rows, p_holm, p_more_holm, strict=True):
        out.append(SliceLeakage(**r, p_holm=float(ph), exposed=bool(ph < alpha), p_more_holm=float(pm),
                                leaks_more=bool(pm < alpha)))
    return out
