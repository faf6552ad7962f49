"""ε lower bounds (probes/epsilon.py) on hand-computable counts, checked against scipy's beta quantiles
computed here independently; their place in the metrics, the sweep config and the aggregator's
consistency check against the DP accountant; the report's ε section."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from iclmem.errors import ConfigError, ProbeError
from probes.epsilon import BoundSide, clopper_pearson_bounds, epsilon_from_counts, epsilon_lower_bound

pytestmark = pytest.mark.filterwarnings("ignore::probes.metrics.LowResolutionWarning")


def _cp(k: int, n: int) -> tuple[float, float]:
    """Two-sided 95% Clopper-Pearson ends straight from the beta quantiles (the textbook formula)."""
    low = 0.0 if k == 0 else stats.beta.ppf(0.025, k, n - k + 1)
    high = 1.0 if k == n else stats.beta.ppf(0.975, k + 1, n - k)
    return float(low), float(high)


def _by_hand(tp: int, fp: int, n_m: int, n_n: int, delta: float) -> float:
    tpr_low, _ = _cp(tp, n_m)
    _, fpr_high = _cp(fp, n_n)
    sides = []
    if tpr_low - delta > 0:
        sides.append(math.log((tpr_low - delta) / fpr_high))
    if 1 - delta - fpr_high > 0:
        sides.append(math.log((1 - delta - fpr_high) / (1 - tpr_low)))
    return max([0.0, *sides])


@pytest.mark.parametrize("delta", [0.0, 1e-5, 0.05])
def test_tpr_45_of_50_at_fpr_1_of_50(delta):
    bound = epsilon_from_counts(45, 1, 50, 50, delta)
    assert bound.epsilon == pytest.approx(_by_hand(45, 1, 50, 50, delta), rel=1e-12)
    tpr_low, _ = _cp(45, 50)
    _, fpr_high = _cp(1, 50)
    # the TPR side decides here: log(0.7819 / 0.1065) = 1.99 at delta 0
    assert bound.side is BoundSide.TPR
    assert bound.epsilon == pytest.approx(math.log((tpr_low - delta) / fpr_high), rel=1e-12)
    assert (bound.tpr_low, bound.fpr_high) == (pytest.approx(tpr_low), pytest.approx(fpr_high))
    if delta == 0.0:
        assert bound.epsilon == pytest.approx(1.9938, abs=1e-4)
    # the point estimates alone would claim log(0.9 / 0.02) = 3.8: the intervals are what keep it honest
    assert bound.epsilon < math.log(0.9 / 0.02)


def test_zero_false_positives_give_a_finite_bound():
    """0 FPs: FPR_high is the exact upper end 1 - 0.025^(1/n) > 0, never 0 (which would make ε infinite)."""
    bound = epsilon_from_counts(40, 0, 50, 50, 0.0)
    fpr_high = 1 - 0.025 ** (1 / 50)
    assert bound.fpr_high == pytest.approx(fpr_high, rel=1e-10)
    assert bound.fpr_high == pytest.approx(stats.beta.ppf(0.975, 1, 50), rel=1e-10)
    assert math.isfinite(bound.epsilon)
    assert bound.epsilon > 0
    assert bound.epsilon == pytest.approx(_by_hand(40, 0, 50, 50, 0.0), rel=1e-12)


def test_tpr_one_gives_a_finite_bound():
    """Every member found: TPR_low is 0.025^(1/n) < 1, so the TNR side's 1 / (1 - TPR_low) stays finite."""
    bound = epsilon_from_counts(50, 5, 50, 50, 1e-5)
    assert bound.tpr_low == pytest.approx(0.025 ** (1 / 50), rel=1e-10)
    assert bound.tpr_low < 1
    assert bound.epsilon == pytest.approx(_by_hand(50, 5, 50, 50, 1e-5), rel=1e-12)


def test_a_perfect_attack_is_capped_by_the_row_count():
    """TPR 1 at 0 FPs: ε_lb = log((0.025^(1/n) - δ) / (1 - 0.025^(1/n))), about 2.57 at n = 50, and larger
    with more rows (the bound can only grow with evidence)."""
    a = 0.025 ** (1 / 50)
    bound = epsilon_from_counts(50, 0, 50, 50, 0.0)
    assert bound.epsilon == pytest.approx(math.log(a / (1 - a)), rel=1e-10)
    assert bound.epsilon == pytest.approx(2.5696, abs=1e-3)
    assert epsilon_from_counts(500, 0, 500, 500, 0.0).epsilon > bound.epsilon + 1.5


def test_scores_are_maximised_over_every_threshold():
    """Two-valued scores have three operating points (t = +inf: nothing flagged; t = 1: 45 members and
    1 non-member; t = 0: everyone), and the bound is the largest of them, computed here by hand."""
    members = np.r_[np.ones(45), np.zeros(5)]
    nonmembers = np.r_[np.ones(1), np.zeros(49)]
    bound = epsilon_lower_bound(members, nonmembers, 1e-5)
    expected = max(_by_hand(tp, fp, 50, 50, 1e-5) for tp, fp in [(0, 0), (45, 1), (50, 50)])
    assert bound.epsilon == pytest.approx(expected, rel=1e-12)
    assert (bound.true_positives, bound.false_positives, bound.threshold) == (45, 1, 1.0)


def test_the_tnr_side_decides_when_the_attack_is_sure_about_non_members():
    """Few false negatives matter more than few false positives here: 1 - δ - FPR_high over 1 - TPR_low."""
    bound = epsilon_from_counts(49, 20, 50, 50, 0.0)
    tpr_low, _ = _cp(49, 50)
    _, fpr_high = _cp(20, 50)
    assert bound.side is BoundSide.TNR
    assert bound.epsilon == pytest.approx(math.log((1 - fpr_high) / (1 - tpr_low)), rel=1e-12)


def test_no_evidence_is_zero():
    rng = np.random.default_rng(0)
    same = rng.normal(size=50)
    assert epsilon_lower_bound(same, same).epsilon == 0.0  # identical samples
    assert epsilon_lower_bound(np.zeros(30), np.zeros(30)).side is BoundSide.NONE
    # members scoring *lower* prove nothing for "member iff score >= t"
    assert epsilon_lower_bound(np.zeros(50), np.ones(50)).epsilon == 0.0


def test_a_larger_delta_never_raises_the_bound():
    values = [epsilon_from_counts(45, 1, 50, 50, d).epsilon for d in (0.0, 1e-5, 1e-2, 0.2, 0.7)]
    assert values == sorted(values, reverse=True)
    assert values[-1] < values[0]


def test_clopper_pearson_agrees_with_the_metrics_module():
    from probes.metrics import clopper_pearson

    for k in (0, 1, 17, 50):
        low, high = clopper_pearson_bounds(k, 50)
        iv = clopper_pearson(k, 50)
        assert (low[0], high[0]) == (pytest.approx(iv.low, abs=1e-15), pytest.approx(iv.high, abs=1e-15))


@pytest.mark.parametrize("delta", [1.0, -1e-6, float("nan"), "0.1", True])
def test_a_bad_delta_is_refused(delta):
    with pytest.raises(ProbeError, match="delta"):
        epsilon_from_counts(45, 1, 50, 50, delta)


def test_bad_counts_and_scores_are_refused():
    with pytest.raises(ProbeError):
        epsilon_from_counts(51, 1, 50, 50)
    with pytest.raises(ProbeError, match="NaN"):
        epsilon_lower_bound([0.1, float("nan")], [0.2])
    with pytest.raises(ProbeError, match="no scores"):
        epsilon_lower_bound([], [0.2])


# ------------------------------------------------------------------------------------------- in the metrics
def test_every_metrics_record_states_its_bound_and_delta():
    from probes.metrics import membership_metrics

    rng = np.random.default_rng(1)
    m, n = rng.normal(1.0, 1.0, 60), rng.normal(0.0, 1.0, 60)
    cm = membership_metrics(m, n, "loss", n_resamples=0, epsilon_delta=1e-3)
    d = cm.as_dict()
    assert d["calibrated_loss_epsilon_lb"] == epsilon_lower_bound(m, n, 1e-3).epsilon > 0
    assert d["calibrated_loss_epsilon_lb_delta"] == 1e-3


def test_outcome_epsilon_delta_reaches_the_evidence():
    from probes.outcomes import OutcomeThresholds, build_evidence

    rows = []
    rng = np.random.default_rng(2)
    for q in range(40):
        member = q < 20
        for manip in ("base", "other"):
            loss = rng.normal(0.5 if member else 1.0, 0.2)
            rows.append({"query_id": q, "member": member, "manipulation": manip, "category": "c",
                         "loss": loss, "entropy": loss, "confidence": -loss})
    ft = pd.DataFrame(rows)
    ref = ft.assign(loss=1.0, entropy=1.0, confidence=-1.0)
    ev = build_evidence(ft, ref, 1.0, 0.1, thresholds=OutcomeThresholds(epsilon_delta=0.01), n_resamples=0)
    d = ev.as_dict()
    assert d["calibrated_loss_epsilon_lb_delta"] == 0.01
    assert d["calibrated_loss_epsilon_lb"] > 0
    with pytest.raises(ConfigError, match="epsilon_delta"):
        OutcomeThresholds(epsilon_delta=1.0)


def test_outcome_epsilon_delta_is_a_sweep_setting_that_keeps_default_hashes():
    from orchestrator.schema.config import parse_sweep

    base = {"name": "s", "tasks": [{"name": "iris"}]}
    assert parse_sweep({**base, "outcome": {"epsilon_delta": 0.0}}).outcome.epsilon_delta == 0.0
    with pytest.raises(ConfigError, match="epsilon_delta"):
        parse_sweep({**base, "outcome": {"epsilon_delta": 2}})
    # the default is left out of the hash (pinned below in tests/test_configs.py), a set value is not
    assert parse_sweep({**base, "outcome": {"epsilon_delta": 1e-5}}).config_hash() == parse_sweep(base).config_hash()
    assert parse_sweep({**base, "outcome": {"epsilon_delta": 1e-6}}).config_hash() != parse_sweep(base).config_hash()


def test_every_metrics_record_carries_the_gdp_counts_it_was_read_from_and_keeps_them_private():
    from iclmem.record import check_columns, is_public
    from probes.gdp import GridCounts
    from probes.metrics import membership_metrics

    rng = np.random.default_rng(3)
    m, n = rng.normal(1.0, 1.0, 80), rng.normal(0.0, 1.0, 80)
    d = membership_metrics(m, n, "entropy", n_resamples=0).as_dict()
    grid = GridCounts.from_json(d["calibrated_entropy_gdp_grid"])
    assert grid.mu_lower_bound(0.05) == pytest.approx(d["calibrated_entropy_gdp_mu_lb"], rel=1e-12)
    check_columns(d, "test")
    # counts for the aggregator to re-read, not a metric: they stay in the run folder
    assert not is_public("calibrated_entropy_gdp_grid")
    assert is_public("calibrated_entropy_gdp_mu_lb")


# ------------------------------------------------------------------------------------------- the aggregator
DP_RUN = {"dp_target_epsilon": 1.0, "dp_delta": 1e-5, "dp_max_grad_norm": 1.0, "dp_noise_multiplier": 40.625,
          "dp_epochs": 100, "dp_sample_rate": 1.0, "dp_steps_per_epoch": 1, "dp_accountant": "rdp"}
KINDS = ("loss", "entropy", "confidence")


def _gaussian_grid(mu_true: float, n: int = 1000):
    """The GDP grid counts a Gaussian attack of separation ``mu_true`` gives, in expectation, on n + n rows
    (``mu_true`` 0: no signal)."""
    from scipy.stats import norm

    from probes.gdp import GDP_FPR_GRID, GridCounts

    ks = sorted({max(1, math.floor(f * n)) for f in GDP_FPR_GRID})
    return GridCounts(tuple(ks), tuple(round(n * norm.cdf(norm.isf(k / n) - mu_true)) for k in ks), n, n)


def _row(run: str, epoch: int, grids: dict | None = None, dp: dict | None = None, **columns) -> dict:
    """One checkpoint's results row: ids, classic bounds 0 unless given, the GDP counts of every kind (no
    signal unless given in ``grids``), DP-SGD's settings when ``dp``."""
    grids = {k: _gaussian_grid(0.0) for k in KINDS} | (grids or {})
    row = {"run_id": run, "task": "t", "epoch": epoch, "outcome": "no_signal", "sanity_check": False,
           "label_mode": "normal", "lr": 1e-3, "threshold_score_kinds": "loss,entropy",
           **{k2: math.nan for k2 in DP_RUN}, **(dp or {})}
    for kind in KINDS:
        row[f"calibrated_{kind}_epsilon_lb"], row[f"calibrated_{kind}_epsilon_lb_delta"] = 0.0, 1e-5
        row[f"calibrated_{kind}_gdp_grid"] = grids[kind].to_json()
    return {**row, **columns}


def _rows() -> pd.DataFrame:
    """Three runs: no DP; DP whose audit stays below its accountant's figures; DP with a planted attack far above
    its accountant's ε near 1 (a classic ε_lb of 5 and the counts of a Gaussian attack of separation 4, which
    no level explains: the inconsistency the aggregator must flag)."""
    out = []
    for run, epoch, lb_loss, lb_entropy, dp, grids in [
        ("plain", 10, 0.4, 0.9, None, None), ("plain", 100, 1.7, 0.2, None, None),
        ("dp-ok", 10, 0.0, 0.1, DP_RUN, None), ("dp-ok", 100, 0.3, 0.0, DP_RUN, None),
        ("dp-bad", 100, 5.0, 0.0, DP_RUN, {"loss": _gaussian_grid(4.0)}),
    ]:
        out.append(_row(run, epoch, grids, dp, calibrated_loss_epsilon_lb=lb_loss,
                        calibrated_entropy_epsilon_lb=lb_entropy))
    return pd.DataFrame(out)


def test_the_aggregator_flags_an_audit_above_the_accountant_loudly():
    from orchestrator.report.epsilon_columns import EpsilonInconsistencyWarning, epsilon_columns
    from trainables.dp import epsilon_spent

    printed: list[str] = []
    with pytest.warns(EpsilonInconsistencyWarning, match="dp-bad"):
        out = epsilon_columns(_rows(), log=printed.append)
    (warning,) = [line for line in printed if "WARNING" in line]
    assert "dp-bad" in warning
    assert "dp-ok" not in warning
    # an attack no level explains: beyond chance, and only then is a bug named
    assert "beyond chance" in warning
    assert "bug in the audit or in the DP accounting" in warning
    by = {(r.run_id, r.epoch): r for r in out.itertuples()}
    assert by[("dp-bad", 100)].epsilon_consistent is False
    assert by[("dp-bad", 100)].gdp_consistent is False
    assert by[("dp-ok", 10)].epsilon_consistent is True
    assert by[("dp-ok", 100)].epsilon_consistent is True
    assert by[("plain", 100)].epsilon_consistent is None
    # the accountant's ε at each checkpoint: epoch e = e Gaussian steps at sample rate 1
    assert by[("dp-ok", 10)].dp_epsilon == pytest.approx(epsilon_spent(40.625, 1.0, 10, 1e-5))
    assert by[("dp-ok", 100)].dp_epsilon == pytest.approx(0.9954, abs=1e-3)
    assert by[("dp-ok", 100)].dp_steps == 100
    # checkpoint bound: max over the competing kinds; run headline: max over the run's checkpoints
    assert (by[("plain", 10)].epsilon_lb, by[("plain", 10)].epsilon_lb_kind) == (0.9, "entropy")
    assert {by[("plain", e)].run_epsilon_lb for e in (10, 100)} == {1.7}
    assert by[("plain", 10)].run_epsilon_lb_epoch == 100
    assert by[("plain", 10)].run_epsilon_lb_kind == "loss"


def test_a_consistent_sweep_prints_no_warning():
    from orchestrator.report.epsilon_columns import epsilon_columns

    printed: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = epsilon_columns(_rows().query("run_id != 'dp-bad'"), log=printed.append)
    assert not printed
    assert out["epsilon_consistent"].dropna().all()


def test_the_checks_read_the_bounds_at_the_accountants_delta_whatever_the_audits():
    """An audit at δ = 0 (below the accountant's 1e-5) used to leave the check undone: the check now re-reads
    the counts at the accountant's own δ, so it always compares."""
    from orchestrator.report.epsilon_columns import epsilon_columns

    rows = _rows().query("run_id != 'dp-bad'").copy()
    for kind in KINDS:
        rows[f"calibrated_{kind}_epsilon_lb_delta"] = 0.0
    printed: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = epsilon_columns(rows, log=printed.append)
    assert not printed
    dp = out[out["run_id"] == "dp-ok"]
    assert dp["epsilon_consistent"].tolist() == [True, True]
    assert dp["gdp_consistent"].tolist() == [True, True]


def test_a_runs_checks_share_the_consistency_level():
    """A DP run of ten checkpoints, each with a classic and a GDP check, and a one-run bound at the last: 21
    checks, each read at 0.05 / 21, so the run's flag errs with probability at most 0.05 in all. A run
    without DP has no check and no level."""
    from orchestrator.report.epsilon_columns import CONSISTENCY_LEVEL, epsilon_columns

    one_run = {"one_run_epsilon_lb": 0.1, "one_run_m": 128, "one_run_guesses": 64, "one_run_correct": 36,
               "one_run_tests": 20, "one_run_delta": 1e-5}
    rows = [_row("dp", e, dp=DP_RUN, **(one_run if e == 100 else {})) for e in range(10, 101, 10)]
    rows += [_row("plain", 100)]
    out = epsilon_columns(pd.DataFrame(rows), log=lambda _m: None)
    dp = out[out["run_id"] == "dp"]
    assert CONSISTENCY_LEVEL == 0.05
    assert dp["consistency_level"].tolist() == [pytest.approx(0.05 / 21)] * 10
    assert dp["one_run_consistent"].tolist() == [None] * 9 + [True]
    assert math.isnan(out.loc[out["run_id"] == "plain", "consistency_level"].iloc[0])


def test_an_excess_that_the_runs_other_checks_explain_is_not_flagged_and_none_is_called_a_bug():
    """Counts whose μ bound at 95% (0.58) exceeds DP-SGD's exact replace-one μ (0.49) -- the old flag, every
    bound at its own 95%, called that a bug. Alone in its run (2 checks), the GDP check at 0.05 / 2 still finds
    an excess: flagged at that level, not beyond chance, so no bug is named. As the last of ten checkpoints (20
    checks), the check at 0.05 / 20 does not: the run's checks share the level."""
    from orchestrator.report.epsilon_columns import EpsilonInconsistencyWarning, epsilon_columns

    borderline = {"loss": _gaussian_grid(0.8)}
    mu_replace = 2 * 10 / 40.625  # DP-SGD's exact replace-one μ after 100 full-batch steps at σ = 40.625
    assert borderline["loss"].mu_lower_bound(0.05) > mu_replace
    printed: list[str] = []
    with pytest.warns(EpsilonInconsistencyWarning, match="at level 0.025"):
        alone = epsilon_columns(pd.DataFrame([_row("dp", 100, borderline, DP_RUN)]), log=printed.append)
    assert alone["gdp_consistent"].tolist() == [False]
    assert alone["epsilon_consistent"].tolist() == [True]
    assert alone["consistency_level"].tolist() == [0.025]
    (warning,) = printed
    assert "exceed the accountant at level 0.05 per run" in warning
    assert "GDP mu_lb" in warning
    assert "DP-SGD's exact replace-one mu 0.4923" in warning
    assert "bug" not in warning
    assert "beyond chance" not in warning

    run = [_row("dp", e, borderline if e == 100 else None, DP_RUN) for e in range(10, 101, 10)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shared = epsilon_columns(pd.DataFrame(run), log=lambda _m: None)
    assert shared["gdp_consistent"].tolist() == [True] * 10


def test_the_gdp_headline_pays_for_its_choice_among_the_competing_kinds():
    """gdp_mu_lb is the largest of the K competing kinds' bounds, each re-read at 0.05 / K: below the largest
    per-kind figure at 0.05, and a kind that does not compete never sets it."""
    from orchestrator.report.epsilon_columns import epsilon_columns

    grids = {"loss": _gaussian_grid(1.0), "entropy": _gaussian_grid(0.9), "confidence": _gaussian_grid(1.5)}
    two = _row("a", 10, grids)
    three = _row("b", 10, grids, threshold_score_kinds="loss,entropy,confidence")
    out = epsilon_columns(pd.DataFrame([two, three]), log=lambda _m: None).set_index("run_id")
    assert out.loc["a", "gdp_mu_lb_kind"] == "loss"
    assert out.loc["a", "gdp_mu_lb"] == pytest.approx(grids["loss"].mu_lower_bound(0.05 / 2), rel=1e-12)
    assert out.loc["a", "gdp_mu_lb"] < grids["loss"].mu_lower_bound(0.05)
    assert out.loc["b", "gdp_mu_lb_kind"] == "confidence"
    assert out.loc["b", "gdp_mu_lb"] == pytest.approx(grids["confidence"].mu_lower_bound(0.05 / 3), rel=1e-12)


def _perfect_attack_rows() -> pd.DataFrame:
    """A perfect attack on 50 + 50 rows (distinct scores), every kind's record as the probe writes it, in a
    run without DP, a full-batch DP-SGD run and a DP-SGD run with sampled batches."""
    from probes.metrics import membership_metrics

    rng = np.random.default_rng(0)
    members, nonmembers = 10 + rng.random(50), rng.random(50)
    record: dict = {}
    for kind in KINDS:
        record.update(membership_metrics(members, nonmembers, kind, n_resamples=0, epsilon_delta=1e-5).as_dict())
    record.update(membership_metrics(members, nonmembers, "loss", "uncalibrated", n_resamples=0,
                                     epsilon_delta=1e-5).as_dict())
    base = {"task": "t", "epoch": 10, "outcome": "memorization", "sanity_check": False, "label_mode": "normal",
            "lr": 1e-3, "threshold_score_kinds": "loss,entropy", **record}
    return pd.DataFrame([{**base, "run_id": "plain", **{k: math.nan for k in DP_RUN}},
                         {**base, "run_id": "dp", **DP_RUN},
                         {**base, "run_id": "sampled", **DP_RUN, "dp_sample_rate": 0.5}])


def test_a_perfect_attack_without_dp_keeps_its_mu_but_converts_it_to_no_epsilon():
    """μ_lb 2.33 on 50 + 50 rows would read "ε" 12.1 where the classic bound caps at 2.57: that ε is a bound
    only for a Gaussian mechanism. Without DP-SGD, and under DP-SGD with sampled batches, every GDP ε is NaN
    with the reason; full-batch DP-SGD keeps it; μ_lb is kept everywhere."""
    from orchestrator.report.epsilon_columns import epsilon_columns
    from probes.gdp import gdp_epsilon

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the perfect attack exceeds the DP runs' accountants: not this test's point
        out = epsilon_columns(_perfect_attack_rows(), log=lambda _m: None).set_index("run_id")
    plain, dp, sampled = out.loc["plain"], out.loc["dp"], out.loc["sampled"]
    assert plain["calibrated_loss_gdp_mu_lb"] == pytest.approx(2.327, abs=1e-3)
    assert plain["gdp_mu_lb"] > 2.0
    assert plain["epsilon_lb"] == pytest.approx(2.5696, abs=1e-3)
    for row in (plain, sampled):
        assert math.isnan(row["gdp_epsilon_lb"])
        assert all(math.isnan(row[f"calibrated_{k}_gdp_epsilon_lb"]) for k in KINDS)
        assert math.isnan(row["uncalibrated_loss_gdp_epsilon_lb"])
    assert plain["gdp_epsilon_lb_withheld"].startswith("not a DP-SGD run")
    assert "sampled batches (sample rate 0.5)" in sampled["gdp_epsilon_lb_withheld"]
    assert dp["gdp_epsilon_lb_withheld"] is None
    assert dp["gdp_mu_lb"] == plain["gdp_mu_lb"]
    assert dp["gdp_epsilon_lb"] == pytest.approx(gdp_epsilon(dp["gdp_mu_lb"], 1e-5), rel=1e-9)
    assert dp["calibrated_loss_gdp_epsilon_lb"] == pytest.approx(12.07, abs=0.01)


def test_gdp_bounds_are_withheld_with_the_split_when_it_is_not_exchangeable():
    from orchestrator.report.epsilon_columns import epsilon_columns

    row = _row("r", 10, {"loss": _gaussian_grid(2.0)}, DP_RUN, exchangeable=False, label_design="unmatched",
               blind_auc=0.9)
    out = epsilon_columns(pd.DataFrame([row]), log=lambda _m: None).iloc[0]
    assert math.isnan(out["gdp_mu_lb"])
    assert math.isnan(out["epsilon_lb"])
    assert out["calibrated_loss_gdp_grid"] is None
    assert out["gdp_consistent"] is None
    assert out["epsilon_consistent"] is None
    assert "separable" in out["epsilon_lb_withheld"]


# ------------------------------------------------------------------------------------------- the report
def test_the_report_section_shows_a_row_per_run_and_the_figure(tmp_path):
    from orchestrator.report.epsilon import EPSILON_FIGURE, epsilon_section_html, epsilon_table
    from orchestrator.report.epsilon_columns import epsilon_columns

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = epsilon_columns(_rows(), log=lambda _m: None)
    results["secret_feature"] = "row 17: salary 123456"  # nothing outside the allow-list reaches the page
    table = epsilon_table(results)
    assert list(table["run_id"]) == ["dp-bad", "dp-ok", "plain"]
    assert table.set_index("run_id").loc["dp-bad", "consistent"] is False
    assert math.isinf(table.set_index("run_id").loc["plain", "dp_target_epsilon"])
    page = epsilon_section_html(results, tmp_path / "figures")
    assert (tmp_path / "figures" / EPSILON_FIGURE).stat().st_size > 0
    assert "classic ε_lb (replace-one)" in page
    assert "accountant ε (add/remove)" in page
    assert "bounds ≤ accountant (level 0.05)" in page
    assert "dp-bad" not in page
    assert "salary" not in page
    assert f"figures/{EPSILON_FIGURE}" in page
    assert epsilon_section_html(results.drop(columns=["epsilon_lb"]), tmp_path / "f2") == ""


def test_the_report_states_each_bounds_own_delta_and_confidence(tmp_path):
    """The classic and GDP ε are read at outcome.epsilon_delta, the one-run ε at canaries.delta: the note
    names each (it used to say every bound was read at the first), and the level of every figure."""
    from orchestrator.report.epsilon import epsilon_section_html
    from orchestrator.report.epsilon_columns import epsilon_columns

    rows = _rows().query("run_id != 'dp-bad'").copy()
    rows["one_run_epsilon_lb"], rows["one_run_delta"] = 0.2, 1e-6
    rows["one_run_m"], rows["one_run_guesses"], rows["one_run_correct"], rows["one_run_tests"] = 128, 64, 36, 20
    results = epsilon_columns(rows, log=lambda _m: None)
    page = epsilon_section_html(results, tmp_path / "figures")
    assert "Every bound is read at" not in page
    assert "Classic ε_lb (δ = 1e-05)" in page
    assert "One-run ε_lb (δ = 1e-06, canaries.delta)" in page
    assert "no stated confidence" in page
    assert "at 95% per checkpoint" in page
    assert "only where the training is Gaussian (full-batch DP-SGD)" in page
    assert "a bug in the audit" not in page.split("persists at level 1e-06")[0]


def test_each_bound_is_checked_against_the_accountants_figure_for_its_own_neighbour_relation():
    """dp-ok at epoch 100: add/remove ε 0.995, replace-one ε 2.13; μ = √100 / 40.625 = 0.246 add/remove, 0.492
    replace-one. The run has five checks (classic and GDP at both checkpoints, one-run at the last), each read at
    0.01. A one-run bound (add/remove) that reads 1.6 there sits between the two εs: above its own relation's
    figure, so inconsistent though below the replace-one one; a GDP μ (replace-one) that reads 0.33 sits
    between the two μs: below its own relation's figure, so consistent though above the add/remove one."""
    from iclmem.record import NEIGHBOURS
    from iclmem.vocab import Neighbours
    from orchestrator.report.epsilon_columns import EpsilonInconsistencyWarning, epsilon_columns
    from probes.one_run import one_run_epsilon

    one_run = {"one_run_epsilon_lb": 1.7, "one_run_delta": 1e-5, "one_run_m": 128, "one_run_guesses": 64,
               "one_run_correct": 62, "one_run_tests": 20}
    rows = pd.DataFrame([_row("dp-ok", 10, dp=DP_RUN),
                         _row("dp-ok", 100, {"loss": _gaussian_grid(0.6)}, DP_RUN, **one_run)])
    at_check = one_run_epsilon(128, 64, 62, 1e-5, 0.01 / 20)
    mu_at_check = _gaussian_grid(0.6).mu_lower_bound(0.01 / 3)
    printed: list[str] = []
    with pytest.warns(EpsilonInconsistencyWarning, match="one-run"):
        out = epsilon_columns(rows, log=printed.append)
    row = out.iloc[1]
    assert row["consistency_level"] == pytest.approx(0.01)
    assert row["dp_epsilon"] < at_check < row["dp_epsilon_replace_one"]
    assert row["dp_mu"] < mu_at_check < row["dp_mu_replace_one"]
    assert row["dp_mu"] == pytest.approx(10 / 40.625)
    assert row["one_run_consistent"] is False
    assert row["gdp_consistent"] is True
    assert row["gdp_mu_lb_kind"] == "loss"
    assert any(f"one-run epsilon_lb {at_check:.4g} > the accountant's add/remove epsilon" in line for line in printed)
    assert NEIGHBOURS["one_run_epsilon_lb"] is Neighbours.ADD_REMOVE
    assert NEIGHBOURS["gdp_mu_lb"] is NEIGHBOURS["epsilon_lb"] is Neighbours.REPLACE_ONE
