"""The one-run ε bound (probes/one_run.py) and the Gaussian-DP bound (probes/gdp.py): against a reference
implementation's numbers, closed forms, simulated mechanisms of known ε / μ, and DP-SGD's own accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from iclmem.errors import ProbeError
from probes.gdp import gdp_delta, gdp_epsilon, gdp_mu_lower_bound
from probes.one_run import guess_grid, one_run_audit, one_run_audits, one_run_epsilon, one_run_p_value
from trainables.dp import gaussian_mechanism_mu

# (m, r, v, level, δ, ε lower bound): outputs of the one-run audit's reference algorithm -- the p-value and
# the ε search of Steinke, Nasr & Jagielski (2023), "Privacy auditing with one (1) training run", appendix
# code, as implemented in google-deepmind/jax_privacy, jax_privacy/auditing.py (_one_run_p_value and
# _epsilon_one_run, commit 03a095e) -- run with scipy 1.17.1 on 2026-12-02 and copied here as numbers.
REFERENCE_ONE_RUN = [
    (1000, 100, 100, 0.05, 0.0, 3.492965),
    (1000, 100, 100, 0.05, 1e-05, 3.465376),
    (1000, 100, 90, 0.05, 1e-05, 1.626143),
    (1000, 500, 400, 0.05, 1e-05, 1.197969),
    (1000, 50, 45, 0.05, 1e-06, 1.392791),
    (256, 64, 60, 0.05, 1e-05, 1.835316),
    (256, 128, 100, 0.01, 1e-05, 0.771410),
    (100, 10, 10, 0.05, 0.0, 1.051873),
    (10000, 1000, 950, 0.05, 1e-05, 2.690996),
    (256, 64, 40, 0.05, 1e-05, 0.058232),
    (256, 26, 20, 0.0025, 1e-05, 0.0),
]

# (μ, δ, ε): opacus 1.6.0, opacus.accountants.analysis.gdp.eps_from_mu (Meta's implementation of Dong, Roth
# & Su's Corollary 2.13), run on 2026-12-02 and copied here as numbers.
REFERENCE_GDP = [
    (0.5, 1e-5, 1.993091), (1.0, 1e-5, 4.377178), (2.0, 1e-5, 9.997256), (4.0, 1e-5, 24.381611),
    (1.0, 1e-3, 3.138671), (0.2, 1e-2, 0.263231), (8.0, 1e-6, 69.243964),
]


@pytest.mark.parametrize(("m", "r", "v", "level", "delta", "expected"), REFERENCE_ONE_RUN)
def test_the_one_run_bound_reproduces_the_reference_implementations_numbers(m, r, v, level, delta, expected):
    assert one_run_epsilon(m, r, v, delta, level) == pytest.approx(expected, abs=2e-6)


def test_with_every_guess_right_and_no_delta_the_one_run_bound_is_the_closed_form():
    # P[Bin(r, q) >= r] = q^r = level  =>  q = level^(1/r), ε = log(q / (1 - q))
    for r in (5, 20, 80):
        q = 0.05 ** (1 / r)
        assert one_run_epsilon(1000, r, r, 0.0, 0.05) == pytest.approx(math.log(q / (1 - q)), rel=1e-7)


def test_the_one_run_p_value_grows_with_epsilon_and_delta_and_is_the_binomial_tail_at_delta_zero():
    from scipy import stats

    ps = [one_run_p_value(500, 100, 80, e, 1e-5) for e in (0.0, 0.5, 1.0, 2.0)]
    assert ps == sorted(ps)
    assert ps[0] < 1e-3 < ps[-1]
    assert one_run_p_value(500, 100, 80, 1.0, 0.0) == pytest.approx(
        stats.binom.sf(79, 100, math.exp(1) / (1 + math.exp(1))), rel=1e-12)
    assert one_run_p_value(500, 100, 80, 1.0, 1e-4) > one_run_p_value(500, 100, 80, 1.0, 0.0)
    with pytest.raises(ProbeError, match="correct <= guesses <= canaries"):
        one_run_p_value(10, 20, 5, 1.0, 0.0)


def test_the_guess_grid_depends_on_m_alone_and_never_overlaps_top_and_bottom():
    grid = guess_grid(128)
    assert grid == guess_grid(128)
    assert (6, 0) in grid
    assert (32, 32) in grid
    assert all(k_in + k_out <= 64 for k_in, k_out in grid)


def _randomised_response(rng: np.random.Generator, m: int, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """An ε-DP mechanism at its tightest: each canary's coin reported truthfully with probability
    e^ε / (1 + e^ε), a score of ±1 plus a tiny jitter to order the guesses."""
    coins = rng.random(m) < 0.5
    truthful = rng.random(m) < 1 / (1 + math.exp(-epsilon))
    shown = np.where(truthful, coins, ~coins)
    return np.where(shown, 1.0, -1.0) + rng.normal(0, 1e-3, m), coins


def test_the_one_run_bound_exceeds_the_true_epsilon_of_a_tight_mechanism_rarely_and_finds_a_strong_one():
    """Randomised response at ε = 1 is exactly 1-DP; over 200 audits the bound at β = 0.05 may exceed 1 in
    at most 5% of them (it is under 1% here: the union bound over the grid is conservative). At ε = 4 the
    same 1,000 canaries prove well over 2."""
    rng = np.random.default_rng(2023)
    over = sum(one_run_audit(*_randomised_response(rng, 1000, 1.0), delta=0.0, beta=0.05).epsilon > 1.0
               for _ in range(200))
    assert over <= 10
    strong = [one_run_audit(*_randomised_response(rng, 1000, 4.0), delta=1e-5, beta=0.05).epsilon for _ in range(5)]
    assert min(strong) > 2.0


def test_an_attack_that_sees_nothing_proves_nothing_and_ties_are_broken_independently_of_the_coins():
    coins = np.random.default_rng(0).random(256) < 0.5
    flat = one_run_audit(np.zeros(256), coins, delta=1e-5)
    assert flat.epsilon == 0.0
    # a perfect attack on the same coins
    perfect = one_run_audits({"a": coins.astype(float), "b": np.zeros(256)}, coins, delta=1e-5, beta=0.05)
    assert perfect["a"].epsilon > 2.0
    assert perfect["b"].epsilon == 0.0
    assert perfect["a"].tests == 2 * len(guess_grid(256))
    assert perfect["a"].correct == perfect["a"].guesses
    with pytest.raises(ProbeError, match="one score per canary"):
        one_run_audit(np.zeros(3), coins, delta=1e-5)


@pytest.mark.parametrize(("mu", "delta", "expected"), REFERENCE_GDP)
def test_the_gdp_conversion_reproduces_opacus_numbers(mu, delta, expected):
    assert gdp_epsilon(mu, delta) == pytest.approx(expected, abs=2e-6)
    assert gdp_delta(mu, gdp_epsilon(mu, delta)) == pytest.approx(delta, rel=1e-6)


def test_the_gdp_conversion_agrees_with_the_installed_opacus_on_a_grid():
    from opacus.accountants.analysis.gdp import eps_from_mu

    for mu in (0.1, 0.3, 1.0, 3.0):
        for delta in (1e-6, 1e-5, 1e-3):
            assert gdp_epsilon(mu, delta) == pytest.approx(eps_from_mu(mu=mu, delta=delta), rel=1e-6, abs=1e-8)


def test_the_gdp_mu_bound_is_below_and_near_the_true_mu_of_gaussian_scores_and_zero_without_signal():
    rng = np.random.default_rng(7)
    for mu in (0.5, 1.0, 2.0):
        bound = gdp_mu_lower_bound(rng.normal(mu, 1, 20_000), rng.normal(0, 1, 20_000), delta=1e-5)
        assert 0.8 * mu < bound.mu < mu
        assert bound.epsilon == pytest.approx(gdp_epsilon(bound.mu, 1e-5))
    # no signal: a positive bound would be a false claim; at confidence 0.95 it may happen in 5% of trials
    false = sum(gdp_mu_lower_bound(rng.normal(0, 1, 200), rng.normal(0, 1, 200), 1e-5).mu > 0 for _ in range(100))
    assert false <= 5


def test_dp_sgds_exact_mu_gives_an_epsilon_the_accountants_bound_from_above():
    """Full-batch DP-SGD is a composition of Gaussian mechanisms: μ = sqrt(steps) / σ exactly. Its ε at δ is
    the true one, so Opacus's RDP accountant (an upper bound) is above it and the PRV accountant (numerical,
    near-exact) is within a few percent of it: a wrong μ formula would miss both."""
    from iclmem.vocab import Neighbours
    from trainables.dp import DPSettings, epsilon_spent

    dp = DPSettings.calibrate(4.0, 1e-5, 1.0, 25)
    exact = gdp_epsilon(dp.mu_at(25), 1e-5)
    assert exact < dp.epsilon_at(25)
    assert exact == pytest.approx(epsilon_spent(dp.noise_multiplier, 1.0, 25, 1e-5, "prv"),
                                                                rel=0.03)
    assert dp.mu_at(25, Neighbours.REPLACE_ONE) == pytest.approx(2 * dp.mu_at(25))
    assert gaussian_mechanism_mu(dp.noise_multiplier, 25) == pytest.approx(5 / dp.noise_multiplier)
    assert math.isnan(DPSettings.calibrate(4.0, 1e-5, 1.0, 25, sample_rate=0.5).mu_at(25))


def test_the_gdp_counts_reproduce_the_bound_and_re_read_it_at_any_level():
    """The probe records the counts behind a μ bound; read at the same β they give the same bound, at a
    stricter β a smaller one (the aggregator's headline and checks read them so), and they survive JSON."""
    from probes.gdp import GridCounts

    rng = np.random.default_rng(11)
    bound = gdp_mu_lower_bound(rng.normal(1.0, 1, 400), rng.normal(0, 1, 400), delta=1e-5)
    assert bound.grid.mu_lower_bound(0.05) == pytest.approx(bound.mu, rel=1e-12)
    assert 0 < bound.grid.mu_lower_bound(0.05 / 3) < bound.mu
    assert bound.grid.mu_lower_bound(1e-12) < bound.grid.mu_lower_bound(0.05 / 3)
    assert GridCounts.from_json(bound.grid.to_json()) == bound.grid
    assert bound.as_dict("calibrated_loss")["calibrated_loss_gdp_grid"] == bound.grid.to_json()
    with pytest.raises(ProbeError, match="not a GDP grid record"):
        GridCounts.from_json('{"false_positives": [1]}')
    with pytest.raises(ProbeError, match="out of range"):
        GridCounts((51,), (0,), 50, 50)


def test_the_gdp_thresholds_and_their_bonferroni_split_are_what_the_docs_say():
    """On 50 distinct non-member scores the grid 1 %, 2 %, 5 %, 10 %, 20 %, 30 %, 50 % gives k = 1, 1, 2, 5, 10,
    15, 25: T = 6 thresholds, the k-th highest non-member score each, so k false positives; each of the 2T
    one-sided Clopper-Pearson upper bounds is read at β / (2T)."""
    from scipy import stats

    rng = np.random.default_rng(5)
    nonmembers, members = rng.random(50), rng.random(50) + 0.3
    grid = gdp_mu_lower_bound(members, nonmembers, delta=1e-5).grid
    assert sorted(grid.false_positives) == [1, 2, 5, 10, 15, 25]  # by threshold, lowest first
    assert grid.thresholds == 6
    fpr_high, fnr_high = grid.rate_upper_bounds(0.05)
    tail = 0.05 / 12
    for i, (fp, fn) in enumerate(zip(grid.false_positives, grid.false_negatives)):
        assert fpr_high[i] == pytest.approx(stats.beta.ppf(1 - tail, fp + 1, 50 - fp), rel=1e-9)
        assert fnr_high[i] == pytest.approx(1.0 if fn == 50 else stats.beta.ppf(1 - tail, fn + 1, 50 - fn), rel=1e-9)
        # members below the k-th highest non-member score are the misses
        assert fn == int((members < np.sort(nonmembers)[::-1][fp - 1]).sum())


def test_the_grids_classic_bound_applies_both_inequalities_to_the_simultaneous_rate_bounds():
    from probes.gdp import GridCounts

    grid = GridCounts((1, 5, 25), (30, 10, 2), 50, 50)
    fpr_high, fnr_high = grid.rate_upper_bounds(0.01)
    delta = 1e-5
    by_hand = max(0.0, *(math.log((1 - b - delta) / a) for a, b in zip(fpr_high, fnr_high)),
                  *(math.log((1 - a - delta) / b) for a, b in zip(fpr_high, fnr_high)))
    assert grid.epsilon_lower_bound(delta, 0.01) == pytest.approx(by_hand, rel=1e-12)
    assert grid.epsilon_lower_bound(delta, 1e-6) < grid.epsilon_lower_bound(delta, 0.01)
    # no signal proves nothing
    assert GridCounts((1, 25), (49, 25), 50, 50).epsilon_lower_bound(delta, 0.05) == 0.0


def test_a_pure_dp_mechanism_converts_its_mu_to_an_epsilon_far_above_its_own():
    """Randomised response at ε = 3 (each row's membership reported truthfully with probability e^3 / (1 + e^3))
    is exactly 3-DP, and no attack's classic bound exceeds 3. Its μ bound is real, but the ε a Gaussian
    mechanism of that μ has at δ = 1e-5 is about 19: the conversion is a bound only on the Gaussian curve,
    which is why the aggregator derives it only for full-batch DP-SGD."""
    from probes.epsilon import epsilon_lower_bound

    rng = np.random.default_rng(3)
    n, p = 20_000, math.exp(3) / (1 + math.exp(3))
    members = (rng.random(n) < p) + rng.normal(0, 1e-6, n)
    nonmembers = (rng.random(n) > p) + rng.normal(0, 1e-6, n)
    bound = gdp_mu_lower_bound(members, nonmembers, delta=1e-5)
    assert bound.mu > 3.0
    assert bound.epsilon > 15.0
    assert epsilon_lower_bound(members, nonmembers, 1e-5).epsilon <= 3.0
