"""Whether one slice of the audited rows gives its values away: exact small-sample tests of a value-inference
audit's per-row gains (:meth:`probes.attacks.value_inference.LabelInferenceResult.row_gains`), for the report's
per-slice breakdown (:mod:`probes.record_risk`). A bootstrap interval on a few rows a side is far too narrow;
the sign-flip test of the members' mean gain and the permutation test of members against non-members hold their
level on any slice size, and a slice too small to ever reach its level says so. Pure numpy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from iclmem.errors import ProbeError

__all__ = ["DEFAULT_PERMUTATIONS", "MIN_SLICE_SIDE", "ValueSliceTest", "value_slice_test"]


# A value slice needs this many members and as many non-members to be tested: the sign-flip test of the members'
# gain on n members cannot give a p below 2**-n, and at 8 that floor (1/256 = 0.0039) is below the Bonferroni
# level over 10 slices (0.05 / 10 = 0.005); the permutation test's floor, 1 / C(16, 8) = 1.3e-5, is lower still.
# A smaller slice could never be exposed at that level, so it reads "too small to test" instead of "not exposed".
MIN_SLICE_SIDE = 8
DEFAULT_PERMUTATIONS = 9999  # Monte-Carlo draws where exact enumeration would take more (p resolution 1e-4)


@dataclass(frozen=True)
class ValueSliceTest:
    """The per-slice test of a value-inference audit's row gains (:func:`value_slice_test`). ``p_members``: the
    one-sided sign-flip p of the members' mean gain > 0; ``p_difference``: the one-sided permutation p of the
    members' mean gain > the non-members'; both nan when the slice is ``too_small`` (fewer than ``min_side``
    members or non-members). ``exposed``: both p-values at or below the slice's level (an intersection-union
    test: under no member effect, members and non-members exchangeable, the permutation test alone holds the
    level, whatever the gains' distribution)."""

    n_members: int
    n_nonmembers: int
    members_gain: float  # the members' mean gain (nan: no member)
    gain_difference: float  # the members' mean gain minus the non-members' (nan: a group is empty)
    p_members: float
    p_difference: float
    too_small: bool
    exposed: bool


def _is_count(value: Any, least: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and bool(value >= least)


def _sign_flip_p(g: np.ndarray, permutations: int, rng: np.random.Generator) -> float:
    """One-sided p of sum(g) > 0 against the sign-flips of g: exact over all 2^n flips when there are at most
    ``permutations + 1`` of them, else Monte-Carlo (1 + #{flips at least as large}) / (1 + permutations)."""
    observed = float(g.sum())
    tol = 1e-9 * max(1.0, float(np.abs(g).sum()))  # round-off in the sums never counts against the observed
    n = g.size
    if 2 ** n <= permutations + 1:
        signs = 1.0 - 2.0 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)  # every sign vector, identity first
        return float(np.mean(signs @ g >= observed - tol))
    signs = rng.choice(np.array([-1.0, 1.0]), size=(int(permutations), n))
    return float((1 + np.sum(signs @ g >= observed - tol)) / (1 + int(permutations)))


def _combinations(n: int, k: int) -> np.ndarray:
    """int64 [C(n, k), k]: every k-subset of range(n)."""
    import itertools

    return np.array(list(itertools.combinations(range(n), k)), dtype=np.int64).reshape(-1, k)


def _permutation_p(g: np.ndarray, member: np.ndarray, permutations: int, rng: np.random.Generator) -> float:
    """One-sided p of the members' mean gain minus the non-members' against relabellings of the rows (the number of
    members fixed): exact over all C(n, m) member sets when there are at most ``permutations + 1``, else
    Monte-Carlo (1 + #{relabellings at least as large}) / (1 + permutations). With the group sizes fixed the
    difference grows with the members' sum, which is the statistic compared."""
    import math

    m = int(member.sum())
    observed = float(g[member].sum())
    tol = 1e-9 * max(1.0, float(np.abs(g).sum()))
    if math.comb(g.size, m) <= permutations + 1:
        return float(np.mean(g[_combinations(g.size, m)].sum(axis=1) >= observed - tol))
    shuffled = rng.permuted(np.broadcast_to(g, (int(permutations), g.size)), axis=1)
    return float((1 + np.sum(shuffled[:, :m].sum(axis=1) >= observed - tol)) / (1 + int(permutations)))


def value_slice_test(gain: Any, member: Any, *, alpha_slice: float, permutations: int = DEFAULT_PERMUTATIONS,
                     seed: int = 0, min_side: int = MIN_SLICE_SIDE) -> ValueSliceTest:
    """Whether a slice's members give their values away (:class:`ValueSliceTest`): per-row gains float [n] (a
    value-inference result's :meth:`row_gains`, restricted to the slice's rows) and member flags bool [n]. Exact
    small-sample tests in place of a bootstrap interval, which on a few rows a side is far too narrow:
    the sign-flip test of the members' mean gain and the permutation test of members against non-members, each
    enumerated exactly when it has at most ``permutations + 1`` arrangements, else drawn ``permutations`` times
    (from ``seed``). ``alpha_slice`` is the slice's level, the family's Bonferroni share already taken (e.g.
    0.05 / slices). Below ``min_side`` rows a side (:data:`MIN_SLICE_SIDE`, 8, by default: see there) the slice
    is too small to test: nan p-values, never exposed."""
    g = np.asarray(gain, dtype=np.float64)
    m = np.asarray(member)
    if g.ndim != 1 or m.shape != g.shape or m.dtype != np.bool_:
        raise ProbeError(f"value slice test: gains {g.shape} and member flags {m.shape} ({m.dtype}) must be 1-d of "
                         "one length, the flags boolean")
    if not np.isfinite(g).all():
        raise ProbeError("value slice test: a gain is missing or infinite")
    if not 0.0 < float(alpha_slice) < 1.0:
        raise ProbeError(f"value slice test: alpha_slice must lie in (0, 1), got {alpha_slice!r}")
    if not _is_count(permutations, 1) or not _is_count(min_side, 1):
        raise ProbeError(f"value slice test: permutations and min_side must be integers >= 1, got {permutations!r}, "
                         f"{min_side!r}")
    n_m, n_n = int(m.sum()), int((~m).sum())
    members_gain = float(g[m].mean()) if n_m else float("nan")
    difference = members_gain - float(g[~m].mean()) if n_m and n_n else float("nan")
    if n_m < min_side or n_n < min_side:
        return ValueSliceTest(n_m, n_n, members_gain, difference, float("nan"), float("nan"), True, False)
    rng = np.random.default_rng(seed)
    p_members = _sign_flip_p(g[m], int(permutations), rng)
    p_difference = _permutation_p(g, m, int(permutations), rng)
    exposed = bool(p_members <= alpha_slice and p_difference <= alpha_slice)
    return ValueSliceTest(n_m, n_n, members_gain, difference, p_members, p_difference, False, exposed)
