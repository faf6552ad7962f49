"""The one-run ε lower bound (Steinke, Nasr & Jagielski 2023): a DP audit from a single training run.

**Design.** m canaries are drawn before training, and each one is put into the training set independently
with probability 1/2 (the coin flips S ∈ {in, out}^m come from the run's seed and are written to its
ground-truth log). After training, an attack scores every canary; the guesser then guesses "in" for the
k₊ highest scores, "out" for the k₋ lowest, and abstains on the rest. r = k₊ + k₋ guesses are made and
v of them are right.

**Why one run suffices.** If training is ε-DP with respect to adding or removing one canary, then given
everything else, each canary's coin is still nearly fair after seeing the model: the guesser can do no
better than randomised response, which is right with probability q = e^ε / (1 + e^ε). Steinke et al.
show that the count of right guesses is then dominated by Binomial(r, q) even though the guesses depend
on each other (they are all read off one model), so

    P[V ≥ v] ≤ P[Binomial(r, q) ≥ v]                                                  (δ = 0)

and, for (ε, δ)-DP, the right side grows by 2mδ · max_{1 ≤ i ≤ v} P[v − i ≤ Binomial(r, q) < v] / i
(their Theorem for approximate DP). That sum is the p-value of the claim "training is (ε, δ)-DP" given
the v right guesses; the ε lower bound at confidence 1 − β is the largest ε whose claim is rejected at
level β (p-value ≤ β). Nothing here needs independent training runs: the randomness the bound uses is
the canaries' coins.

**Choosing k without peeking.** The guesser's k₊, k₋ must not be tuned on the same coins. The bound is
evaluated for every (k₊, k₋) of a grid fixed before the run (:func:`guess_grid`, a function of m alone)
and, where several attacks are read, for every attack; each of those G tests is run at level β / G and
the largest bound is reported (a union bound), so the reported maximum holds at 1 − β.

**Neighbours.** A canary is in or out: add/remove one row, the relation DP-SGD accountants state their ε
for. The bound is compared with the accountant's add/remove ε, never with the replace-one ε the
member / non-member audit plays (:mod:`probes.epsilon`).

Ties in the scores are broken by a fixed random order (``tie_seed``), independent of the coins, so an
attack that sees nothing (all scores equal) guesses at random and proves nothing.

Pure numpy/scipy: no torch, no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from iclmem.errors import ProbeError
from probes.epsilon import validate_delta

__all__ = ["GUESS_FRACTIONS", "OneRunBound", "guess_grid", "one_run_p_value", "one_run_epsilon",
           "one_run_audit", "one_run_audits"]

# the grid of guesses, as fractions r / m of the canaries, each made one-sided (all "in") and balanced
# (half "in", half "out"): from few confident guesses (large ε proven by few canaries) to many (small ε)
GUESS_FRACTIONS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.35, 0.5)


@dataclass(frozen=True)
class OneRunBound:
    """The one-run bound of one attack and the guesses that gave it."""

    epsilon: float  # >= 0; 0 = the claim "ε-DP" is not rejected for any ε > 0
    delta: float
    beta: float  # the bound holds with probability >= 1 - beta (over every test of the grid together)
    level: float  # the level each test of the grid was run at: beta / (number of tests)
    m: int  # canaries (each in with probability 1/2)
    n_in: int  # canaries the run trained on
    guesses_in: int  # k+ of the guesses that gave the bound
    guesses_out: int  # k-
    correct: int  # v
    tests: int  # G: the union bound's count

    @property
    def guesses(self) -> int:
        return self.guesses_in + self.guesses_out


def _q(epsilon: float) -> float:
    """Accuracy of ε-DP randomised response: e^ε / (1 + e^ε) (the logistic function, stable for large ε)."""
    return 1.0 / (1.0 + math.exp(-epsilon)) if epsilon < 700 else 1.0


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P-value of "training is (ε, δ)-DP" after ``v`` right guesses out of ``r`` on ``m`` canaries
    (module docstring): P[Bin(r, q) ≥ v] + 2mδ · max_i P[v − i ≤ Bin(r, q) < v] / i, capped at 1."""
    from scipy import stats

    m, r, v = int(m), int(r), int(v)
    if not 0 <= v <= r <= m:
        raise ProbeError(f"one-run audit needs 0 <= correct <= guesses <= canaries, got {v}, {r}, {m}")
    if epsilon < 0:
        raise ProbeError(f"epsilon must be >= 0, got {epsilon}")
    q = _q(float(epsilon))
    # P[Bin >= x] for x = v, v-1, ..., 0 in one call
    tails = stats.binom.sf(np.arange(v - 1, -2, -1), r, q)  # tails[i] = P[Bin >= v - i]
    p = float(tails[0])
    if delta > 0 and v > 0:
        i = np.arange(1, v + 1)
        window = tails[1:] - tails[0]  # P[v - i <= Bin < v]
        p += 2.0 * m * float(delta) * max(float(np.max(window / i)), 0.0)
    return min(p, 1.0)


def one_run_epsilon(m: int, r: int, v: int, delta: float, level: float) -> float:
    """The largest ε whose (ε, δ)-DP claim has p-value <= ``level`` (0 when even ε = 0 is not rejected):
    the p-value grows with ε, so a bisection on it is exact to 1e-9."""
    d = validate_delta(delta, "one-run delta")
    if not 0.0 < level < 1.0:
        raise ProbeError(f"the one-run test level must lie in (0, 1), got {level}")
    if r == 0 or one_run_p_value(m, r, v, 0.0, d) > level:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, d) <= level:
        lo, hi = hi, hi * 2.0
        if hi > 1e4:  # only a degenerate input (level ~ 1) gets here; never a real audit
            return lo
    while hi - lo > 1e-9 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if one_run_p_value(m, r, v, mid, d) <= level:
            lo = mid
        else:
            hi = mid
    return lo


def guess_grid(m: int, fractions: Sequence[float] = GUESS_FRACTIONS) -> tuple[tuple[int, int], ...]:
    """The (k₊, k₋) pairs tried on ``m`` canaries: for each fraction f, r = round(f·m) guesses made all
    "in" and made half "in", half "out"; a function of m alone, fixed before any score is seen."""
    pairs: dict[tuple[int, int], None] = {}
    for f in fractions:
        r = max(1, int(round(f * m)))
        pairs[(r, 0)] = None
        if r >= 2:
            pairs[(r - r // 2, r // 2)] = None
    return tuple(pairs)


def _order(scores: np.ndarray, tie_seed: int) -> np.ndarray:
    """Canary indices from the highest score to the lowest, ties in a fixed random order."""
    perm = np.random.default_rng([0x5EED, int(tie_seed)]).permutation(scores.size)
    by_score = np.argsort(-scores[perm], kind="stable")
    return perm[by_score]


def _validate(scores: Any, included: Any) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    inc = np.asarray(included).reshape(-1)
    if s.size != inc.size or s.size == 0:
        raise ProbeError(f"one-run audit needs one score per canary, got {s.size} scores for {inc.size} canaries")
    if np.isnan(s).any():
        raise ProbeError(f"one-run audit: {int(np.isnan(s).sum())} of {s.size} canary scores are NaN")
    return s, inc.astype(bool)


def one_run_audits(scores: Mapping[str, Any], included: Any, delta: float, beta: float = 0.05,
                   tie_seed: int = 0, fractions: Sequence[float] = GUESS_FRACTIONS) -> dict[str, OneRunBound]:
    """The one-run bound of every attack in ``scores`` (name -> one score per canary, higher = "in"),
    on the canaries' inclusion coins ``included``; the grid of guesses times the attacks share ``beta``
    (union bound), so every bound returned holds together at confidence 1 − ``beta``."""
    if not scores:
        raise ProbeError("one-run audit needs at least one attack's scores")
    if not 0.0 < float(beta) < 1.0:
        raise ProbeError(f"beta must lie in (0, 1), got {beta!r}")
    d = validate_delta(delta, "one-run delta")
    checked = {name: _validate(s, included) for name, s in scores.items()}
    inc = next(iter(checked.values()))[1]
    m = int(inc.size)
    grid = guess_grid(m, fractions)
    tests = len(grid) * len(checked)
    level = float(beta) / tests
    out: dict[str, OneRunBound] = {}
    for name, (s, _) in checked.items():
        order = _order(s, tie_seed)
        best = OneRunBound(0.0, d, float(beta), level, m, int(inc.sum()), 0, 0, 0, tests)
        for k_in, k_out in grid:
            top, bottom = order[:k_in], order[m - k_out:] if k_out else order[:0]
            v = int(inc[top].sum()) + int((~inc[bottom]).sum())
            eps = one_run_epsilon(m, k_in + k_out, v, d, level)
            if eps > best.epsilon:
                best = OneRunBound(eps, d, float(beta), level, m, int(inc.sum()), k_in, k_out, v, tests)
        out[name] = best
    return out


def one_run_audit(scores: Any, included: Any, delta: float, beta: float = 0.05, tie_seed: int = 0) -> OneRunBound:
    """The one-run bound of one attack (:func:`one_run_audits` with a single entry)."""
    return one_run_audits({"attack": scores}, included, delta, beta, tie_seed)["attack"]
