"""Per-record and per-slice risk (probes/record_risk.py): planted signal found, no signal not, on 5 seeds each."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from iclmem.errors import ProbeError
from probes.record_risk import at_prior, holm, membership_posterior, precision_at_k, rank_stability, slice_leakage

SEEDS = range(5)


def _audit(seed: int, shift: float, n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    member = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    return rng.normal(size=2 * n) + shift * member, member


@pytest.mark.parametrize("seed", SEEDS)
def test_a_planted_signal_gives_members_a_higher_risk_and_no_signal_gives_everyone_the_prior(seed):
    scores, member = _audit(seed, shift=2.0)
    risk = membership_posterior(scores, member, seed=seed)
    # measured over seeds 0-4: 0.52-0.72 with the shift, -0.02-0.03 without it
    assert risk[member].mean() - risk[~member].mean() > 0.35
    assert ((risk > 0) & (risk < 1)).all()
    null_scores, _ = _audit(seed + 100, shift=0.0)
    null_risk = membership_posterior(null_scores, member, seed=seed)
    assert abs(null_risk[member].mean() - null_risk[~member].mean()) < 0.1
    assert abs(null_risk.mean() - 0.5) < 0.05


def test_cross_fitting_keeps_a_rows_own_membership_out_of_its_risk_on_noise():
    """Fitted in-sample (a row's own flag in its own map) pure noise gives members a mean edge of 0.02-0.08 per
    seed, 0.050 averaged over these five; cross-fitted, -0.02-0.05 per seed, 0.010 averaged. The bar sits between."""
    _, member = _audit(0, shift=0.0)
    edges = []
    for seed in SEEDS:
        scores, _ = _audit(seed + 100, shift=0.0)
        risk = membership_posterior(scores, member, seed=seed)
        edges.append(risk[member].mean() - risk[~member].mean())
    assert np.mean(edges) < 0.03, edges


def test_the_risk_moves_to_another_prior_keeping_the_likelihood_ratio():
    p = np.array([0.5, 0.8, 0.2])
    moved = at_prior(p, base_rate=0.5, prior=0.1)
    np.testing.assert_allclose(moved[0], 0.1)
    np.testing.assert_allclose(moved[1] / (1 - moved[1]), 4.0 / 9.0)
    scores, member = _audit(1, shift=2.0)
    np.testing.assert_allclose(membership_posterior(scores, member, prior=0.01, seed=1),
                               at_prior(membership_posterior(scores, member, seed=1), 0.5, 0.01))


def test_a_posterior_needs_both_sides_and_enough_rows_per_fold():
    with pytest.raises(ProbeError, match="members and non-members"):
        membership_posterior([1.0, 2.0, 3.0], [True, True, True])
    with pytest.raises(ProbeError, match="folds"):
        membership_posterior([1.0, 2.0, 3.0, 4.0], [True, False, True, False], folds=5)
    with pytest.raises(ProbeError, match="not finite"):
        membership_posterior([1.0, np.nan, 3.0, 4.0], [True, False, True, False], folds=2)


def test_precision_at_k_counts_the_planted_rows_among_the_riskiest_and_averages_ties():
    assert precision_at_k([5, 4, 3, 2, 1], [1, 1, 0, 0, 0], 2) == 1.0
    assert precision_at_k([5, 4, 3, 2, 1], [0, 0, 0, 1, 1], 2) == 0.0
    # every score tied: the expected share, the positives' base rate
    assert precision_at_k([1, 1, 1, 1], [1, 0, 0, 0], 2) == pytest.approx(0.25)
    with pytest.raises(ProbeError, match="k must lie"):
        precision_at_k([1, 2], [True, False], 3)


def test_rank_stability_is_one_for_the_same_ranking_and_near_zero_for_unrelated_ones():
    ids = np.arange(200)
    risk = np.random.default_rng(0).random(200)
    same = rank_stability(ids, risk, ids[::-1], risk[::-1], top_k=20)
    assert same.spearman == pytest.approx(1.0)
    assert same.top_k_overlap == 1.0
    assert same.n_common == 200
    rhos = [rank_stability(ids, risk, ids, np.random.default_rng(s + 1).random(200), top_k=20).spearman for s in SEEDS]
    assert max(abs(r) for r in rhos) < 0.25
    partial = rank_stability(ids[:50], risk[:50], ids[25:], risk[25:], top_k=10)
    assert partial.n_common == 25


def test_reference_set_stability_compares_the_scores_of_attacks_that_read_references_and_leaves_out_the_loss():
    """The plain loss reads no reference, so its two halves are the same numbers (Spearman 1 by construction): it is
    left out. The others are compared on their members' scores, not on the risks' isotonic steps (issue #56 #11)."""
    from scipy.stats import spearmanr

    from iclmem.runfolder import REFERENCE_HALF_PREFIX
    from orchestrator.report.record_risk import _reference_set_stability

    rng = np.random.default_rng(0)
    n = 64
    member = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    loss = rng.normal(size=2 * n) + member
    a = rng.normal(size=2 * n) + member
    b = a + rng.normal(scale=0.5, size=2 * n)  # the other half: the same signal, other noise
    table = pd.DataFrame({"row_id": np.arange(2 * n) + 1000, "member": member, "deployed__loss": loss,
                          f"{REFERENCE_HALF_PREFIX}a__loss": loss, f"{REFERENCE_HALF_PREFIX}b__loss": loss.copy(),
                          f"{REFERENCE_HALF_PREFIX}a__rmia": a, f"{REFERENCE_HALF_PREFIX}b__rmia": b})
    audits = pd.DataFrame({"run_id": ["ctx"], "task": ["t"]})
    out = _reference_set_stability(audits, lambda _run: table, top_k=10).set_index("attack")
    assert list(out.index) == ["rmia"]
    row = out.loc["rmia"]
    assert row["between"] == "reference_sets"
    assert row["n_common"] == n
    assert row["spearman"] == pytest.approx(spearmanr(a[member], b[member]).statistic)
    top_a, top_b = set(np.argsort(-a[member])[:10]), set(np.argsort(-b[member])[:10])
    assert row["top_k_overlap"] == pytest.approx(len(top_a & top_b) / 10)


def test_seed_stability_compares_the_scores_on_the_rows_both_runs_trained_on():
    """Two seeds that score their shared rows in the same order agree fully: the comparison reads the scores (the
    risk column here is unrelated noise, which a comparison of risks would report as disagreement)."""
    from orchestrator.report.record_risk import _stability

    rng = np.random.default_rng(1)
    frames = []
    for run, ids in (("a", np.arange(0, 80)), ("b", np.arange(20, 100))):
        score = ids / 10.0 + (0.0 if run == "a" else 3.0)  # the same order on the shared rows
        frames.append(pd.DataFrame({"run_id": run, "task": "t", "epoch": 2, "channel": "fine_tuned_weights",
                                    "attack": "probe", "row_id": ids, "member": True, "score": score,
                                    "risk": rng.random(ids.size), "canary_copies": np.nan}))
    records = pd.concat(frames, ignore_index=True)
    results = pd.DataFrame({"run_id": ["a", "b"], "task": "t", "model": "m", "seed": [0, 1]})
    (row,) = _stability(records, {"a": 2, "b": 2}, results, top_k=10).to_dict("records")
    assert row["between"] == "seeds"
    assert row["n_common"] == 60
    assert row["spearman"] == pytest.approx(1.0)
    assert row["top_k_overlap"] == 1.0


def test_holm_adjusts_step_down_and_keeps_nan_out_of_the_family():
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    out = holm([0.01, np.nan, 0.04])
    assert np.isnan(out[1])
    np.testing.assert_allclose(out[[0, 2]], [0.02, 0.04])


@pytest.mark.parametrize("seed", SEEDS)
def test_the_slice_that_was_made_to_leak_leaks_more_than_the_rest_and_the_others_do_not(seed):
    scores, member = _audit(seed, shift=0.0)
    planted = np.zeros(member.size, bool)
    planted[:20] = True
    planted[60:80] = True
    scores[:20] += 2.0  # the slice's members alone are exposed
    unrelated = np.random.default_rng(seed + 7).random(member.size) < 0.5
    out = {r.slice: r for r in slice_leakage(scores, member, {"planted": planted, "rest": ~planted,
                                                              "unrelated": unrelated}, seed=seed)}
    assert out["planted"].leaks_more
    assert out["planted"].exposed
    assert out["planted"].auc_low > 0.6
    assert not out["rest"].leaks_more
    assert not out["unrelated"].leaks_more


def test_a_slice_too_small_keeps_its_counts_and_no_metric_and_epsilon_only_when_exchangeable():
    scores, member = _audit(0, shift=2.0)
    tiny = np.zeros(member.size, bool)
    tiny[[0, 1, 2, 3, 60, 61, 62, 63, 64, 65]] = True  # 4 members: under MIN_SLICE_SIDE (5), too small to test
    rows = slice_leakage(scores, member, {"tiny": tiny, "all": np.ones(member.size, bool)}, seed=0,
                         permutations=50)
    assert rows[0].n_members == 4
    assert rows[0].n_nonmembers == 6
    assert np.isnan(rows[0].auc)
    assert np.isnan(rows[1].epsilon_lb)
    assert np.isnan(rows[1].p_more)
    bounded = slice_leakage(scores, member, {"all": np.ones(member.size, bool)}, exchangeable=True,
                            permutations=10)
    assert bounded[0].epsilon_lb > 0
    with pytest.raises(ProbeError, match="slice 'bad'"):
        slice_leakage(scores, member, {"bad": np.ones(3, bool)})


# ------------------------------------------------------------------------------------------- slices
def _table(n: int = 120):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"age": rng.integers(18, 90, n), "city": rng.choice(["Lyon", "Oslo", "Rome"], n),
                          "note": [f"unique-token-{i:04d}" for i in range(n)], "y": rng.integers(0, 2, n)})
    frame.loc[:2, "city"] = "Tiny"  # a level of 3 rows: rare, and never named
    features = rng.normal(size=(n, 4))
    features[5] = 40.0  # the one far outlier
    return frame, features


def test_slices_name_groups_never_a_value_fewer_than_min_group_rows_share():
    from iclmem.vocab import SliceFamily
    from orchestrator.schema.slices import SliceSettings, slice_masks, task_slices

    frame, features = _table()
    settings = SliceSettings(by=(*SliceSettings().by, SliceFamily.COLUMN), columns=("city", "age"))
    slices = task_slices("t", features, frame["y"].to_numpy(), ("no", "yes"), np.arange(len(frame)), frame, "y",
                         settings)
    names = set(slices["slice"])
    assert {"class no", "class yes", "city = Lyon", "city = Oslo", "city = Rome",
            "city: levels of fewer than 10 rows", "age: quartile 1 of 4", "age: quartile 4 of 4"} <= names
    assert "note: rare level (fewer than 10 rows)" in names  # every note is unique: all rare, none named
    assert "city: rare level (fewer than 10 rows)" in names
    assert not any("unique-token" in s or "Tiny" in s for s in names)
    top = slices[(slices["family"] == "outlier") & (slices["slice"] == "outlier score 90-100%")]["row_id"]
    assert 5 in set(top)  # the planted outlier is in the top bin
    masks = slice_masks(slices[slices["family"] == "class"], np.arange(10))
    assert sum(m.sum() for m in masks.values()) == 10


def test_a_slice_column_the_table_lacks_is_refused_before_any_work_naming_it():
    from iclmem.errors import ConfigError
    from orchestrator.runfolder.prepare import check_slice_columns
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "report": {"slices": {"columns": ["petal"]}}})
    with pytest.raises(ConfigError, match=r"report.slices.columns names \['petal'\].*'iris'"):
        check_slice_columns(sweep)
    target = parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "report": {"slices": {"columns": ["target"]}}})
    with pytest.raises(ConfigError, match="target"):
        check_slice_columns(target)
    with pytest.raises(ConfigError, match="columns is empty"):
        parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "report": {"slices": {"by": ["column"]}}})


def test_seed_stability_compares_every_pair_of_few_seeds_and_each_seed_with_the_next_of_many():
    """The stability table grows with the runs, not with their square: 32 seeds give 32 pairs (a ring), not 496;
    every seed is in two of them, and a handful of seeds still gives every pair."""
    from orchestrator.report.record_risk import ALL_PAIRS_UP_TO, seed_pairs

    few = [f"r{i}" for i in range(ALL_PAIRS_UP_TO)]
    assert len(seed_pairs(few)) == ALL_PAIRS_UP_TO * (ALL_PAIRS_UP_TO - 1) // 2
    many = [f"r{i:02d}" for i in range(32)]
    pairs = seed_pairs(many)
    assert len(pairs) == 32
    assert len(set(map(frozenset, pairs))) == 32
    assert all(sum(run in pair for pair in pairs) == 2 for run in many)
