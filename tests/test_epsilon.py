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
    from orchestrator.config import parse_sweep

    base = {"name": "s", "tasks": [{"name": "iris"}]}
    assert parse_sweep({**base, "outcome": {"epsilon_delta": 0.0}}).outcome.epsilon_delta == 0.0
    with pytest.raises(ConfigError, match="epsilon_delta"):
        parse_sweep({**base, "outcome": {"epsilon_delta": 2}})
    # the default is left out of the hash (pinned below in tests/test_configs.py), a set value is not
    assert parse_sweep({**base, "outcome": {"epsilon_delta": 1e-5}}).config_hash() == parse_sweep(base).config_hash()
    assert parse_sweep({**base, "outcome": {"epsilon_delta": 1e-6}}).config_hash() != parse_sweep(base).config_hash()


# ------------------------------------------------------------------------------------------- the aggregator
def _rows() -> pd.DataFrame:
    """Three runs: no DP; DP whose audit stays below its accountant's ε; DP with a planted ε_lb of 5
    against an accountant's ε near 1 (the inconsistency the aggregator must flag)."""
    dp = {"dp_target_epsilon": 1.0, "dp_delta": 1e-5, "dp_max_grad_norm": 1.0, "dp_noise_multiplier": 40.625,
          "dp_epochs": 100, "dp_sample_rate": 1.0, "dp_steps_per_epoch": 1, "dp_accountant": "rdp"}
    out = []
    for run, epoch, lb_loss, lb_entropy, extra in [
        ("plain", 10, 0.4, 0.9, {}), ("plain", 100, 1.7, 0.2, {}),
        ("dp-ok", 10, 0.0, 0.1, dp), ("dp-ok", 100, 0.3, 0.0, dp),
        ("dp-bad", 100, 5.0, 0.0, dp),
    ]:
        out.append({"run_id": run, "task": "t", "epoch": epoch, "outcome": "no_signal", "sanity_check": False,
                    "label_mode": "normal", "lr": 1e-3, "threshold_score_kinds": "loss,entropy",
                    "calibrated_loss_epsilon_lb": lb_loss, "calibrated_loss_epsilon_lb_delta": 1e-5,
                    "calibrated_entropy_epsilon_lb": lb_entropy, "calibrated_entropy_epsilon_lb_delta": 1e-5,
                    "calibrated_confidence_epsilon_lb": 0.0, "calibrated_confidence_epsilon_lb_delta": 1e-5,
                    **{k: math.nan for k in dp}, **extra})
    return pd.DataFrame(out)


def test_the_aggregator_flags_an_audit_above_the_accountant_loudly():
    from orchestrator.aggregate import EpsilonInconsistencyWarning, epsilon_columns
    from trainables.dp import epsilon_spent

    printed: list[str] = []
    with pytest.warns(EpsilonInconsistencyWarning, match="dp-bad"):
        out = epsilon_columns(_rows(), log=printed.append)
    assert any("WARNING" in line and "dp-bad" in line and "ABOVE" in line for line in printed)
    by = {(r.run_id, r.epoch): r for r in out.itertuples()}
    assert by[("dp-bad", 100)].epsilon_consistent is False
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
    from orchestrator.aggregate import epsilon_columns

    printed: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = epsilon_columns(_rows().query("run_id != 'dp-bad'"), log=printed.append)
    assert not printed
    assert out["epsilon_consistent"].dropna().all()


def test_an_audit_delta_below_the_accountants_is_not_compared():
    from orchestrator.aggregate import epsilon_columns

    rows = _rows()
    rows["calibrated_loss_epsilon_lb_delta"] = 0.0
    rows["calibrated_entropy_epsilon_lb_delta"] = 0.0
    printed: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = epsilon_columns(rows, log=printed.append)
    assert out["epsilon_consistent"].isna().all()
    assert any("not checked" in line for line in printed)


# ------------------------------------------------------------------------------------------- the report
def test_the_report_section_shows_a_row_per_run_and_the_figure(tmp_path):
    from orchestrator.aggregate import epsilon_columns
    from orchestrator.report.epsilon import EPSILON_FIGURE, epsilon_section_html, epsilon_table

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
    assert "dp-bad" not in page
    assert "salary" not in page
    assert f"figures/{EPSILON_FIGURE}" in page
    assert epsilon_section_html(results.drop(columns=["epsilon_lb"]), tmp_path / "f2") == ""


def test_each_bound_is_checked_against_the_accountants_figure_for_its_own_neighbour_relation():
    """dp-ok at epoch 100: add/remove ε 0.995, replace-one ε about twice that; μ = √100 / 40.625 = 0.246
    add/remove, 0.492 replace-one. A one-run bound (add/remove) of 1.5 sits between the two εs: above its own
    relation's figure, so inconsistent though below the replace-one one; a GDP μ (replace-one) of 0.4 sits
    between the two μs: below its own relation's figure, so consistent though above the add/remove one."""
    from iclmem.record import NEIGHBOURS
    from iclmem.vocab import Neighbours
    from orchestrator.aggregate import EpsilonInconsistencyWarning, epsilon_columns

    rows = _rows()
    rows = rows[rows["run_id"] != "dp-bad"].reset_index(drop=True)
    at = (rows["run_id"] == "dp-ok") & (rows["epoch"] == 100)
    rows["one_run_epsilon_lb"], rows["one_run_delta"] = math.nan, math.nan
    rows.loc[at, "one_run_epsilon_lb"], rows.loc[at, "one_run_delta"] = 1.5, 1e-5
    for kind in ("loss", "entropy", "confidence"):
        rows[f"calibrated_{kind}_gdp_mu_lb"], rows[f"calibrated_{kind}_gdp_epsilon_lb"] = 0.0, 0.0
    rows.loc[at, "calibrated_loss_gdp_mu_lb"] = 0.4
    printed: list[str] = []
    with pytest.warns(EpsilonInconsistencyWarning, match="one-run"):
        out = epsilon_columns(rows, log=printed.append)
    row = out[at].iloc[0]
    assert row["dp_epsilon"] < 1.5 < row["dp_epsilon_replace_one"]
    assert row["dp_mu"] < 0.4 < row["dp_mu_replace_one"]
    assert row["dp_mu"] == pytest.approx(10 / 40.625)
    assert row["one_run_consistent"] is False
    assert row["gdp_consistent"] is True
    assert (row["gdp_mu_lb"], row["gdp_mu_lb_kind"]) == (0.4, "loss")
    assert any("one-run epsilon_lb 1.5 > accountant's add/remove epsilon" in line for line in printed)
    assert NEIGHBOURS["one_run_epsilon_lb"] is Neighbours.ADD_REMOVE
    assert NEIGHBOURS["gdp_mu_lb"] is NEIGHBOURS["epsilon_lb"] is Neighbours.REPLACE_ONE
