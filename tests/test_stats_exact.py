"""The exact Mann-Whitney p-value (#56 finding 8): the permutation distribution of the members' mid-rank
sum, counted rather than approximated, so that ties and small or unequal sides keep the level the
selection-aware bar (family_alpha / K, deep in the tail) relies on."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from scipy import stats

from iclmem.stats import EXACT_MAX_COST, exact_cost, mann_whitney_exact_p, mann_whitney_p


def _enumerated_p(m: np.ndarray, n: np.ndarray) -> float:
    """P(R >= r) by listing every assignment of the member labels (small samples only)."""
    pooled = np.concatenate([m, n])
    ranks = stats.rankdata(pooled)
    observed = ranks[: m.size].sum()
    sums = np.array([ranks[list(c)].sum() for c in itertools.combinations(range(pooled.size), m.size)])
    return float((sums >= observed - 1e-9).mean())


def test_exact_p_equals_the_enumerated_permutation_p_with_ties() -> None:
    rng = np.random.default_rng(0)
    for _ in range(60):
        a, b = int(rng.integers(1, 7)), int(rng.integers(1, 7))
        m, n = rng.integers(0, 4, a).astype(float), rng.integers(0, 4, b).astype(float)
        if np.ptp(np.concatenate([m, n])) == 0.0:
            continue
        assert mann_whitney_exact_p(m, n) == pytest.approx(_enumerated_p(m, n), abs=1e-12)


def test_exact_p_equals_scipys_exact_p_without_ties_for_unequal_sides() -> None:
    rng = np.random.default_rng(1)
    for a, b in ((1, 9), (5, 40), (30, 30), (41, 7), (50, 50)):
        m, n = rng.normal(0.4, 1, a), rng.normal(size=b)
        ref = stats.mannwhitneyu(m, n, alternative="greater", method="exact").pvalue
        assert mann_whitney_exact_p(m, n) == pytest.approx(ref, rel=1e-9, abs=1e-15)
        assert mann_whitney_p(m, n) == pytest.approx(ref, rel=1e-9, abs=1e-15)


def test_exact_p_holds_its_level_where_ties_make_the_normal_approximation_anti_conservative() -> None:
    # a near-constant score (a collapsed or rounded checkpoint): 10 members, 40 non-members, 2-4 rows above
    # the rest. Conditional on the pooled scores the exact p is valid for any of them; the normal
    # approximation with the tie correction rejects at about 2-3 times the level.
    level, draws = 0.01, 2000
    margin = 3 * np.sqrt(level * (1 - level) / draws)
    exact_rates, normal_rates = [], []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        pooled = np.zeros(50)
        high = rng.choice(50, 2 + seed % 3, replace=False)
        pooled[high] = rng.integers(1, 3, high.size)
        seen: dict[tuple[float, ...], tuple[float, float]] = {}
        hits_exact = hits_normal = 0
        for _ in range(draws):
            perm = rng.permutation(50)
            m, n = pooled[perm[:10]], pooled[perm[10:]]
            key = tuple(np.sort(m))
            if key not in seen:
                seen[key] = (mann_whitney_p(m, n), float(stats.mannwhitneyu(m, n, alternative="greater").pvalue))
            p_exact, p_normal = seen[key]
            hits_exact += p_exact <= level
            hits_normal += p_normal <= level
        exact_rates.append(hits_exact / draws)
        normal_rates.append(hits_normal / draws)
    assert max(exact_rates) <= level + margin, exact_rates
    assert float(np.mean(normal_rates)) >= 1.5 * level, normal_rates  # the failure the exact p removes


def test_the_normal_approximation_misstates_a_lone_tied_outlier_on_unequal_sides() -> None:
    m, n = np.r_[1.0, np.zeros(4)], np.zeros(50)
    assert mann_whitney_p(m, n) == pytest.approx(5 / 55)  # P(the one high row is a member)
    assert stats.mannwhitneyu(m, n, alternative="greater").pvalue < 0.002


def test_exact_p_is_used_up_to_a_probe_split_and_is_cheap_there() -> None:
    assert exact_cost(50, 50) <= EXACT_MAX_COST
    assert exact_cost(5, 600) <= EXACT_MAX_COST
    assert exact_cost(200, 200) > EXACT_MAX_COST
    rng = np.random.default_rng(2)
    mann_whitney_p(rng.normal(size=50), rng.normal(size=50))  # the untied table of 50 + 50, cached
    t0 = time.perf_counter()
    for _ in range(50):
        mann_whitney_p(rng.normal(0.2, 1, 50), rng.normal(size=50))
    assert (time.perf_counter() - t0) / 50 < 0.005
    # far above the bound: the normal approximation, equal to scipy's
    m, n = rng.normal(0.1, 1, 300), rng.normal(size=300)
    assert mann_whitney_p(m, n) == pytest.approx(stats.mannwhitneyu(m, n, alternative="greater").pvalue)


def test_exact_p_edge_cases() -> None:
    assert mann_whitney_p(np.zeros(5), np.zeros(5)) == 1.0
    assert mann_whitney_exact_p([1.0], [0.0]) == pytest.approx(0.5)
    assert mann_whitney_exact_p([0.0], [1.0]) == pytest.approx(1.0)
    assert mann_whitney_exact_p(np.arange(5.0) + 10, np.arange(5.0)) == pytest.approx(1 / 252)
    assert mann_whitney_exact_p([np.inf, 1.0], [-np.inf, 0.0]) == pytest.approx(1 / 6)
