"""probes.metrics: orientation, AUC, TPR@FPR threshold rule, ROC, bootstrap, scores-table helpers."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm, rankdata

from iclmem.errors import ProbeError
from iclmem.stats import member_rank_sums
from probes.metrics import (
    Calibration,
    LowResolutionWarning,
    MembershipInput,
    ScoreKind,
    SplitScores,
    auc,
    bootstrap_intervals,
    bootstrap_replicates,
    gap_stats,
    loss_ratio,
    membership_metrics,
    membership_score,
    output_std,
    per_manipulation_auc,
    robustness_scores,
    roc_curve,
    tpr_at_fpr,
)

# tiny hand-made fixtures sit far below 10 allowed false positives; tests that care use pytest.warns
pytestmark = pytest.mark.filterwarnings("ignore::probes.metrics.LowResolutionWarning")


def _quiet_tpr(m, n, alpha):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LowResolutionWarning)
        return tpr_at_fpr(m, n, alpha)


# ------------------------------------------------------------------ orientation


@pytest.mark.parametrize(
    ("kind", "expected"),
    [(ScoreKind.LOSS, [-1.0, 2.0]), (ScoreKind.ENTROPY, [-1.0, 2.0]), (ScoreKind.CONFIDENCE, [1.0, -2.0])],
)
def test_membership_score_orientation_per_kind(kind, expected):
    np.testing.assert_array_equal(membership_score(kind, [1.0, -2.0]), expected)
    np.testing.assert_array_equal(membership_score(kind.value, [1.0, -2.0]), expected)


@pytest.mark.parametrize("kind", list(ScoreKind))
def test_fine_tuning_that_fits_members_gives_members_higher_membership_score(kind):
    # fine-tuning on a member lowers its loss and entropy and raises its confidence
    delta_member = -0.3 if kind in (ScoreKind.LOSS, ScoreKind.ENTROPY) else +0.3
    s = membership_score(kind, [delta_member, 0.0])
    assert s[0] > s[1]


def test_membership_score_rejects_unknown_kind():
    with pytest.raises(ProbeError):
        membership_score("perplexity", [1.0])


# ------------------------------------------------------------------ AUC / TPR on extreme scorers


def test_perfect_scorer_has_auc_one_and_tpr_at_1pct_one():
    m, n = np.arange(100, 200.0), np.arange(0, 100.0)
    assert auc(m, n) == 1.0
    t = _quiet_tpr(m, n, 0.01)
    assert t.tpr == 1.0
    assert t.n_false_positives <= 1
    assert t.realized_fpr <= 0.01


def test_flipped_scorer_has_auc_zero_and_tpr_zero():
    m, n = np.arange(0, 100.0), np.arange(100, 200.0)
    assert auc(m, n) == 0.0
    assert _quiet_tpr(m, n, 0.01).tpr == 0.0
    assert _quiet_tpr(m, n, 0.10).tpr == 0.0


def test_all_tied_scores_give_auc_half_and_tpr_zero_pessimistic_ties():
    m, n = np.full(100, 0.3), np.full(100, 0.3)
    assert auc(m, n) == 0.5
    for alpha in (0.01, 0.10, 0.5):
        t = _quiet_tpr(m, n, alpha)
        assert t.tpr == 0.0
        assert t.n_false_positives == 0
        assert t.threshold == 0.3


def test_zero_allowed_false_positives_uses_max_nonmember_score_and_warns():
    rng = np.random.default_rng(1)
    n = rng.normal(size=50)
    m = np.concatenate([[n.max(), n.max() + 1.0, n.max() - 1.0], rng.normal(size=47) - 5])
    with pytest.warns(LowResolutionWarning):
        t = tpr_at_fpr(m, n, 0.01)  # 0.01 * 50 = 0.5 -> floor 0 allowed false positives
    assert t.allowed_false_positives == 0
    assert t.threshold == n.max()
    assert t.n_false_positives == 0
    assert t.realized_fpr == 0.0
    assert t.n_true_positives == 1  # the member tied with the max non-member is not detected
    assert t.tpr == 1 / 50


def test_enough_nonmembers_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tpr_at_fpr(np.arange(10.0), np.arange(1000.0), 0.01)  # 0.01 * 1000 = 10


def test_hand_worked_five_vs_five_example():
    m = [0.9, 0.8, 0.6, 0.4, 0.3]
    n = [0.7, 0.5, 0.4, 0.2, 0.1]
    # pairs won: 5 + 5 + 4 + (2 + 0.5 tie) + 2 = 18.5 of 25
    assert auc(m, n) == pytest.approx(0.74)

    t = _quiet_tpr(m, n, 0.2)  # one allowed false positive: threshold = 2nd largest non-member
    assert (t.allowed_false_positives, t.threshold) == (1, 0.5)
    assert (t.n_false_positives, t.realized_fpr) == (1, 0.2)
    assert (t.n_true_positives, t.tpr) == (3, 0.6)
    assert (t.n_members, t.n_nonmembers, t.alpha) == (5, 5, 0.2)

    t = _quiet_tpr(m, n, 0.4)  # two allowed: threshold 0.4; member 0.4 ties a non-member -> not detected
    assert (t.allowed_false_positives, t.threshold) == (2, 0.4)
    assert (t.n_false_positives, t.realized_fpr) == (2, 0.4)
    assert (t.n_true_positives, t.tpr) == (3, 0.6)

    t = _quiet_tpr(m, n, 0.1)  # floor(0.5) = 0 allowed: threshold = max non-member
    assert (t.allowed_false_positives, t.threshold, t.n_false_positives) == (0, 0.7, 0)
    assert (t.n_true_positives, t.tpr) == (2, 0.4)


def test_nonmember_ties_across_the_cut_are_all_excluded_so_realized_fpr_may_fall_below_alpha():
    m = [0.9, 0.8, 0.6, 0.55, 0.3]
    n = [0.7, 0.5, 0.5, 0.2, 0.1]
    t = _quiet_tpr(m, n, 0.4)  # two allowed, but the 2nd and 3rd largest tie at 0.5
    assert t.threshold == 0.5
    assert (t.n_false_positives, t.realized_fpr) == (1, 0.2)
    assert (t.n_true_positives, t.tpr) == (4, 0.8)


def test_alpha_one_accepts_everything():
    t = _quiet_tpr([0.0, 1.0], [0.5, 2.0], 1.0)
    assert t.threshold == -np.inf
    assert t.tpr == 1.0
    assert t.realized_fpr == 1.0


def test_floor_of_alpha_times_n_is_robust_to_float_round_off():
    # 0.29 * 100 == 28.999999999999996 in floating point
    t = _quiet_tpr(np.arange(100.0), np.arange(100.0), 0.29)
    assert t.allowed_false_positives == 29


def test_nan_scores_are_refused():
    with pytest.raises(ProbeError):
        auc([0.1, np.nan], [0.2])
    with pytest.raises(ProbeError):
        tpr_at_fpr([0.1], [], 0.1)


def test_auc_matches_scipy_mann_whitney_with_ties():
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(3)
    m, n = rng.integers(0, 6, 40).astype(float), rng.integers(0, 5, 33).astype(float)
    u = mannwhitneyu(m, n).statistic
    assert auc(m, n) == pytest.approx(u / (40 * 33))


def test_row_wise_ranks_equal_scipy_average_ranks():
    rng = np.random.default_rng(4)
    x = rng.integers(0, 4, size=(6, 11)).astype(float)
    x[0, 3] = np.inf
    got = member_rank_sums(x[:, :5], x[:, 5:])
    want = rankdata(x, axis=1)[:, :5].sum(axis=1)
    np.testing.assert_allclose(got, want)


# ------------------------------------------------------------------ ROC


def test_roc_curve_area_equals_mann_whitney_auc_and_ends_at_one_one():
    rng = np.random.default_rng(5)
    m = np.round(rng.normal(0.5, 1, 30), 1)
    n = np.round(rng.normal(0.0, 1, 25), 1)
    r = roc_curve(m, n)
    assert r.auc() == pytest.approx(auc(m, n))
    assert (r.fpr[0], r.tpr[0], r.fpr[-1], r.tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert r.thresholds[0] == np.inf
    assert np.all(np.diff(r.thresholds) < 0)
    assert np.all(np.diff(r.fpr) >= 0)
    assert np.all(np.diff(r.tpr) >= 0)


# ------------------------------------------------------------------ bootstrap


def test_vectorised_bootstrap_matches_naive_loop():
    rng = np.random.default_rng(6)
    m = rng.integers(0, 5, 7).astype(float)
    n = rng.integers(0, 5, 9).astype(float)
    alphas = (0.1, 0.25, 0.5)
    reps = bootstrap_replicates(m, n, alphas, n_resamples=50, seed=11)
    assert reps.member_idx.shape == (50, 7)
    assert reps.nonmember_idx.shape == (50, 9)
    for b in range(50):
        mb, nb = m[reps.member_idx[b]], n[reps.nonmember_idx[b]]
        assert reps.auc[b] == pytest.approx(auc(mb, nb))
        for a in alphas:
            assert reps.tpr[a][b] == _quiet_tpr(mb, nb, a).tpr


def test_bootstrap_is_seeded_and_resamples_members_and_nonmembers_separately():
    m, n = np.arange(10.0), np.arange(100.0, 130.0)
    r1 = bootstrap_replicates(m, n, n_resamples=20, seed=3)
    r2 = bootstrap_replicates(m, n, n_resamples=20, seed=3)
    np.testing.assert_array_equal(r1.auc, r2.auc)
    # stratified: a member index never points into the non-members, sizes preserved
    assert r1.member_idx.max() < 10
    assert r1.nonmember_idx.max() < 30
    assert np.all(r1.auc == 0.0)  # every resample keeps the perfect (flipped) separation


def test_bootstrap_interval_covers_true_auc_of_gaussian_scores():
    shift = 0.5
    true_auc = norm.cdf(shift / math.sqrt(2.0))
    rng = np.random.default_rng(2024)
    hits = 0
    n_rep = 200
    for r in range(n_rep):
        m = rng.normal(shift, 1.0, 100)
        n = rng.normal(0.0, 1.0, 100)
        iv = bootstrap_intervals(m, n, alphas=(), n_resamples=300, seed=r).auc
        hits += iv.contains(true_auc)
    coverage = hits / n_rep
    assert 0.88 <= coverage <= 0.99, coverage


def test_membership_metrics_bundle_auc_tprs_and_intervals():
    rng = np.random.default_rng(7)
    m, n = rng.normal(1, 1, 200), rng.normal(0, 1, 200)
    cm = membership_metrics(m, n, "loss", "calibrated", n_resamples=200, seed=1)
    assert cm.kind is ScoreKind.LOSS
    assert cm.calibration is Calibration.CALIBRATED
    assert cm.auc_interval.low < cm.auc < cm.auc_interval.high
    assert cm.tpr_at_1pct.alpha == 0.01
    assert cm.tpr_at_10pct.alpha == 0.10
    assert cm.tpr_at_10pct_interval.low <= cm.tpr_at_10pct.tpr <= cm.tpr_at_10pct_interval.high
    d = cm.as_dict()
    assert d["calibrated_loss_auc"] == cm.auc
    assert d["calibrated_loss_tpr_at_10pct_threshold"] == cm.tpr_at_10pct.threshold
    with pytest.raises(ProbeError):
        cm.tpr_at(0.05)


def test_zero_resamples_gives_nan_intervals():
    cm = membership_metrics([1.0, 2.0], [0.0, 0.5], "confidence", n_resamples=0)
    assert math.isnan(cm.auc_interval.low)
    assert cm.auc == 1.0


# ------------------------------------------------------------------ scores tables


def _table(loss_m, loss_n, manips=("base", "position_first")):
    """Tiny scores table: members get losses loss_m[i] + j, non-members loss_n[i] + j (j = manip index)."""
    rows = []
    qid = 0
    for member, losses in ((True, loss_m), (False, loss_n)):
        for l in losses:
            for j, name in enumerate(manips):
                x = l + j
                rows.append(
                    dict(query_id=qid, member=member, manipulation=name, category=name.split("_")[0],
                         loss=x, entropy=x / 2, confidence=math.exp(-x))
                )
            qid += 1
    return pd.DataFrame(rows)


def test_robustness_score_is_mean_over_manipulations_per_query():
    df = _table([1.0, 2.0], [3.0])
    s = robustness_scores(df)
    assert list(s.index) == [0, 1, 2]
    assert list(s["member"]) == [True, True, False]
    np.testing.assert_allclose(s["loss"], [1.5, 2.5, 3.5])
    np.testing.assert_allclose(s["entropy"], [0.75, 1.25, 1.75])
    np.testing.assert_allclose(s.loc[0, "confidence"], (math.exp(-1) + math.exp(-2)) / 2)


def test_scores_table_with_missing_manipulation_is_refused():
    df = _table([1.0], [2.0]).iloc[:-1]
    with pytest.raises(ProbeError, match="manipulations"):
        robustness_scores(df)


def test_scores_table_missing_column_is_refused():
    with pytest.raises(ProbeError, match="entropy"):
        robustness_scores(_table([1.0], [2.0]).drop(columns="entropy"))


def test_membership_input_separates_calibrated_uncalibrated_and_reference_only():
    # the reference model already finds members easy (difficulty confound); fine-tuning changes nothing
    ref = _table([0.1, 0.2, 0.3], [1.1, 1.2, 1.3])
    ft = ref.copy()
    mi = MembershipInput.from_scores_tables(ft, ref)
    assert mi.n_members == 3
    assert mi.n_nonmembers == 3
    kw = dict(n_resamples=50, seed=0)
    assert mi.uncalibrated(**kw)[ScoreKind.LOSS].auc == 1.0  # raw S flags members ...
    assert mi.reference_only(**kw)[ScoreKind.LOSS].auc == 1.0
    assert mi.calibrated(**kw)[ScoreKind.LOSS].auc == 0.5  # ... calibration removes the confound
    impact = mi.calibration_impact(**kw)
    assert set(impact["calibration"]) == {"calibrated", "uncalibrated", "reference_only"}
    assert len(impact) == 9


def test_membership_input_calibrated_detects_members_whose_loss_dropped():
    ref = _table([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    ft = _table([0.5, 0.6, 0.7], [1.0, 1.1, 0.9])
    mi = MembershipInput.from_scores_tables(ft, ref)
    for kind in ScoreKind:
        assert mi.metrics(kind, Calibration.CALIBRATED, n_resamples=0).auc == 1.0


def test_membership_input_refuses_mismatched_tables():
    ft = _table([1.0, 2.0], [3.0])
    ref = _table([1.0], [3.0, 4.0])  # query 1 is a non-member here
    with pytest.raises(ProbeError, match="member flags"):
        MembershipInput.from_scores_tables(ft, ref)
    with pytest.raises(ProbeError):
        MembershipInput(fine_tuned={"loss": SplitScores([1.0], [2.0])}, reference={})


def test_per_manipulation_auc_uncalibrated_and_calibrated():
    ft = _table([0.5, 0.6], [1.0, 1.1])
    t = per_manipulation_auc(ft)
    assert list(t.index) == ["base", "position_first"]
    assert list(t["category"]) == ["base", "position"]
    assert (t[["loss", "entropy", "confidence"]] == 1.0).all().all()
    ref = ft.copy()
    tc = per_manipulation_auc(ft, ref)
    assert (tc[["loss", "entropy", "confidence"]] == 0.5).all().all()


def test_gap_stats_use_population_std_over_manipulations():
    df = _table([1.0, 2.0], [2.0, 3.0])
    # shift the member losses of the second manipulation by +0.5: g = [-1.0, -0.5]
    df.loc[df["member"] & (df["manipulation"] == "position_first"), "loss"] += 0.5
    g = gap_stats(df)
    assert g.per_manipulation == {"base": -1.0, "position_first": -0.5}
    assert g.mu_gap == pytest.approx(-0.75)
    assert g.sigma_gap == pytest.approx(0.25)  # ddof=0; ddof=1 would give 0.3536


def test_loss_ratio_and_output_std():
    assert loss_ratio([2.0, 4.0], [1.0, 1.0]) == 3.0
    assert loss_ratio(6.0, 1.2) == pytest.approx(5.0)
    assert loss_ratio(1.0, 0.0) == math.inf
    assert loss_ratio([np.nan], [1.0]) == math.inf
    assert output_std([0.2, 0.2, 0.2]) == pytest.approx(0.0, abs=1e-12)
    assert output_std([0.0, 1.0]) == 0.5
