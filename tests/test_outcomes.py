"""probes.outcomes: rule precedence, strict mode, recorded thresholds, evidence builder, peak checkpoint."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from iclmem.errors import ConfigError, ProbeError
from probes.metrics import Calibration, CheckpointMetrics, GapStats, Interval, ScoreKind, TprAtFpr
from probes.outcomes import (
    CheckpointOutcome,
    Outcome,
    OutcomeEvidence,
    OutcomeThresholds,
    build_evidence,
    classify,
    peak_checkpoint,
    rule_checks,
)

pytestmark = pytest.mark.filterwarnings("ignore::probes.metrics.LowResolutionWarning")

N = 50


def _tpr(alpha: float, tpr: float) -> TprAtFpr:
    k = int(alpha * N)
    return TprAtFpr(
        tpr=tpr, threshold=0.0, realized_fpr=k / N, n_false_positives=k,
        n_true_positives=round(tpr * N), n_members=N, n_nonmembers=N,
        allowed_false_positives=k, alpha=alpha,
    )


def _cm(kind, cal=Calibration.CALIBRATED, auc=0.5, ci=(0.4, 0.6), tpr10=0.1, tpr1=0.01, p=None) -> CheckpointMetrics:
    # p: the AUC's one-sided p-value; by default tiny for a raised AUC, so the selection-aware rule (the
    # default) agrees with the paper's and the precedence tests below test precedence
    p = (1e-6 if auc > 0.5 else 0.5) if p is None else p
    return CheckpointMetrics(
        kind=ScoreKind(kind), calibration=Calibration(cal), auc=auc, auc_interval=Interval(*ci),
        tpr={0.01: _tpr(0.01, tpr1), 0.10: _tpr(0.10, tpr10)},
        tpr_interval={0.01: Interval(0.0, 0.05), 0.10: Interval(max(tpr10 - 0.1, 0), tpr10 + 0.1)},
        member_mean=0.0, nonmember_mean=0.0, n_resamples=1000, seed=0, p_value=p,
    )


def _quiet(**overrides) -> OutcomeEvidence:
    """Evidence where no rule holds (-> no_signal); override fields to build each outcome."""
    fields = dict(
        calibrated={k: _cm(k) for k in ScoreKind},
        uncalibrated_loss=_cm("loss", Calibration.UNCALIBRATED),
        member_mean_probe_loss=1.0,
        nonmember_mean_probe_loss=1.0,
        gap=GapStats(mu_gap=0.05, sigma_gap=0.05, per_manipulation={}),
        loss_ratio=1.0,
        output_std=0.2,
    )
    fields.update(overrides)
    return OutcomeEvidence(**fields)


def _with_kind(kind, **kw):
    cal = {k: _cm(k) for k in ScoreKind}
    cal[ScoreKind(kind)] = _cm(kind, **kw)
    return cal


def _inverted_loss(**overrides) -> OutcomeEvidence:
    base = dict(
        member_mean_probe_loss=1.3,
        nonmember_mean_probe_loss=1.0,
        uncalibrated_loss=_cm("loss", Calibration.UNCALIBRATED, auc=0.38, ci=(0.30, 0.46)),
    )
    base.update(overrides)
    return _quiet(**base)


def _only(verdict_checks: dict[str, bool], outcome: Outcome) -> bool:
    return [k for k, v in verdict_checks.items() if v] == [outcome.value]


# ------------------------------------------------------------------ one evidence per outcome


def test_outcome_values_are_the_spec_vocabulary():
    assert [o.value for o in Outcome] == ["collapse", "memorization", "inversion", "overfitting", "no_signal"]


def test_high_loss_ratio_is_collapse_and_nothing_else():
    v = classify(_quiet(loss_ratio=5.5))
    assert v.outcome is Outcome.COLLAPSE
    assert v.score_kind is None
    assert v.reasons == {"loss_ratio": 5.5, "output_std": 0.2}
    assert _only(v.checks, Outcome.COLLAPSE)


def test_near_constant_output_is_collapse_even_below_the_loss_ratio():
    v = classify(_quiet(loss_ratio=1.1, output_std=0.005))
    assert v.outcome is Outcome.COLLAPSE


def test_loss_ratio_exactly_five_is_not_collapse():
    assert classify(_quiet(loss_ratio=5.0)).outcome is Outcome.NO_SIGNAL


def test_collapse_takes_precedence_over_memorization():
    ev = _quiet(loss_ratio=8.0, calibrated=_with_kind("loss", auc=0.7, tpr10=0.4))
    assert rule_checks(ev)[Outcome.MEMORIZATION]
    assert classify(ev).outcome is Outcome.COLLAPSE


def test_calibrated_signal_above_thresholds_is_memorization_and_nothing_else():
    v = classify(_quiet(calibrated=_with_kind("entropy", auc=0.62, ci=(0.55, 0.7), tpr10=0.25)))
    assert v.outcome is Outcome.MEMORIZATION
    assert v.score_kind is ScoreKind.ENTROPY
    assert v.reasons["auc"] == 0.62
    assert v.reasons["tpr"] == 0.25
    assert v.reasons["tpr_minus_alpha"] == pytest.approx(0.15)
    assert _only(v.checks, Outcome.MEMORIZATION)


def test_memorization_tpr_margin_boundary():
    # TPR@10% - 0.10 >= 0.10: 0.20 qualifies, 0.19 does not
    assert classify(_quiet(calibrated=_with_kind("loss", auc=0.55, tpr10=0.20))).outcome is Outcome.MEMORIZATION
    assert classify(_quiet(calibrated=_with_kind("loss", auc=0.55, tpr10=0.19))).outcome is Outcome.NO_SIGNAL


def test_memorization_needs_auc_above_one_half():
    ev = _quiet(calibrated=_with_kind("loss", auc=0.5, tpr10=0.3))
    assert classify(ev).outcome is Outcome.NO_SIGNAL


def test_when_several_kinds_qualify_the_highest_auc_decides():
    cal = {
        ScoreKind.LOSS: _cm("loss", auc=0.60, tpr10=0.40),
        ScoreKind.ENTROPY: _cm("entropy", auc=0.66, tpr10=0.21),
        ScoreKind.CONFIDENCE: _cm("confidence", auc=0.70, tpr10=0.15),  # AUC highest but TPR too low
    }
    v = classify(_quiet(calibrated=cal))
    assert v.outcome is Outcome.MEMORIZATION
    assert v.score_kind is ScoreKind.ENTROPY


def test_members_with_higher_probe_loss_and_auc_interval_below_half_is_inversion_only():
    v = classify(_inverted_loss())
    assert v.outcome is Outcome.INVERSION
    assert v.score_kind is ScoreKind.LOSS
    assert v.reasons["member_mean_probe_loss"] == 1.3
    assert v.reasons["uncalibrated_loss_auc_high"] == 0.46
    assert _only(v.checks, Outcome.INVERSION)


def test_inversion_needs_the_whole_interval_below_half():
    ev = _inverted_loss(uncalibrated_loss=_cm("loss", Calibration.UNCALIBRATED, auc=0.45, ci=(0.38, 0.51)))
    assert classify(ev).outcome is Outcome.NO_SIGNAL


def test_inversion_needs_members_to_have_the_higher_mean_loss():
    ev = _inverted_loss(member_mean_probe_loss=0.9)
    assert classify(ev).outcome is Outcome.NO_SIGNAL


def test_inverted_loss_run_whose_entropy_still_shows_memorization_is_memorization():
    ev = _inverted_loss(calibrated=_with_kind("entropy", auc=0.6, ci=(0.53, 0.67), tpr10=0.3))
    checks = rule_checks(ev)
    assert checks[Outcome.INVERSION]
    assert checks[Outcome.MEMORIZATION]
    v = classify(ev)
    assert v.outcome is Outcome.MEMORIZATION
    assert v.score_kind is ScoreKind.ENTROPY


def test_small_flat_gap_is_overfitting_only():
    v = classify(_quiet(gap=GapStats(mu_gap=-0.008, sigma_gap=0.004, per_manipulation={"base": -0.008})))
    assert v.outcome is Outcome.OVERFITTING
    assert v.score_kind is None
    assert v.reasons == {"mu_gap": -0.008, "sigma_gap": 0.004}
    assert _only(v.checks, Outcome.OVERFITTING)


def test_gap_with_spread_is_not_overfitting():
    assert classify(_quiet(gap=GapStats(0.0, 0.02, {}))).outcome is Outcome.NO_SIGNAL


def test_nothing_holds_is_no_signal_with_the_numbers_recorded():
    v = classify(_quiet())
    assert v.outcome is Outcome.NO_SIGNAL
    assert v.score_kind is None
    assert _only(v.checks, Outcome.NO_SIGNAL)
    for key in ("loss_ratio", "output_std", "mu_gap", "sigma_gap", "calibrated_loss_auc", "uncalibrated_loss_auc_high"):
        assert key in v.reasons


def test_nan_evidence_satisfies_no_rule():
    ev = _quiet(loss_ratio=float("nan"), output_std=float("nan"), gap=GapStats(float("nan"), float("nan"), {}))
    assert classify(ev).outcome is Outcome.NO_SIGNAL


# ------------------------------------------------------------------ strict mode, thresholds


def test_strict_mode_flips_borderline_memorization():
    ev = _quiet(calibrated=_with_kind("loss", auc=0.55, ci=(0.48, 0.62), tpr10=0.22))
    assert classify(ev).outcome is Outcome.MEMORIZATION
    v = classify(ev, OutcomeThresholds(strict=True))
    assert v.outcome is Outcome.NO_SIGNAL
    assert v.thresholds["strict"] is True


def test_strict_mode_keeps_clear_memorization():
    ev = _quiet(calibrated=_with_kind("loss", auc=0.65, ci=(0.56, 0.74), tpr10=0.3))
    assert classify(ev, OutcomeThresholds(strict=True)).outcome is Outcome.MEMORIZATION


def test_thresholds_are_recorded_in_the_verdict():
    assert classify(_quiet()).thresholds == OutcomeThresholds().as_dict() == {
        "collapse_loss_ratio": 5.0, "collapse_output_std": 0.01, "memorization_auc": 0.5,
        "memorization_tpr_margin": 0.10, "memorization_alpha": 0.10, "inversion_auc": 0.5,
        "overfitting_mu": 0.01, "overfitting_sigma": 0.01, "strict": False,
        "rule": "selection_aware", "family_alpha": 0.05, "score_kinds": "loss,entropy",
        "epsilon_delta": 1e-5,  # the ε lower bound's δ (probes.epsilon), stated with every verdict
    }
    th = OutcomeThresholds(collapse_loss_ratio=3.0)
    v = classify(_quiet(loss_ratio=4.0), th)
    assert v.outcome is Outcome.COLLAPSE
    assert v.thresholds["collapse_loss_ratio"] == 3.0
    assert v.as_dict()["outcome"] == "collapse"


def test_thresholds_from_dict_refuse_unknown_and_invalid_settings():
    assert OutcomeThresholds.from_dict({"strict": True}).strict is True
    with pytest.raises(ConfigError, match="unknown"):
        OutcomeThresholds.from_dict({"collapse_ratio": 5})
    with pytest.raises(ConfigError):
        OutcomeThresholds(overfitting_mu=-1.0)
    with pytest.raises(ConfigError):
        OutcomeThresholds(memorization_alpha=1.5)


def test_evidence_refuses_mislabelled_metrics():
    with pytest.raises(ProbeError):
        _quiet(uncalibrated_loss=_cm("loss", Calibration.CALIBRATED))
    with pytest.raises(ProbeError):
        _quiet(calibrated={ScoreKind.LOSS: _cm("entropy")})


# ------------------------------------------------------------------ evidence builder from scores tables


def _tables(member_drop: float, n: int = 40, seed: int = 0):
    """Reference and fine-tuned scores tables; fine-tuning lowers member loss by member_drop."""
    rng = np.random.default_rng(seed)
    manips = [("base", "base"), ("position_first", "position"), ("skew_true_x2", "skew_true")]
    difficulty = rng.uniform(0.5, 1.5, 2 * n)
    rows_ref, rows_ft = [], []
    for q in range(2 * n):
        member = q < n
        for j, (name, cat) in enumerate(manips):
            base_loss = difficulty[q] + 0.1 * j
            for rows, loss in ((rows_ref, base_loss), (rows_ft, base_loss - (member_drop if member else 0.0))):
                p = math.exp(-loss)
                rows.append(dict(query_id=1000 + q, member=member, manipulation=name, category=cat,
                                 loss=loss, entropy=loss * 0.8, confidence=p))
    return pd.DataFrame(rows_ft), pd.DataFrame(rows_ref)


def test_build_evidence_from_tables_detects_memorization():
    ft, ref = _tables(member_drop=0.2)
    ev = build_evidence(ft, ref, loss_ratio=0.9, output_std=0.1, n_resamples=200, seed=1)
    assert ev.calibrated[ScoreKind.LOSS].auc == 1.0
    assert ev.member_mean_probe_loss < ev.nonmember_mean_probe_loss
    assert ev.gap.per_manipulation.keys() == {"base", "position_first", "skew_true_x2"}
    v = classify(ev)
    assert v.outcome is Outcome.MEMORIZATION
    d = CheckpointOutcome(epoch=5, evidence=ev, verdict=v).as_dict()
    assert d["outcome"] == "memorization"
    assert d["calibrated_loss_auc"] == 1.0
    assert d["threshold_collapse_loss_ratio"] == 5.0


def test_build_evidence_from_identical_tables_with_high_loss_ratio_is_collapse():
    ft, ref = _tables(member_drop=0.0)
    ev = OutcomeEvidence.from_scores(ft, ref, loss_ratio=7.0, output_std=0.3, n_resamples=50)
    assert ev.calibrated[ScoreKind.ENTROPY].auc == 0.5
    assert classify(ev).outcome is Outcome.COLLAPSE


def test_build_evidence_computes_tpr_at_a_custom_memorization_alpha():
    ft, ref = _tables(member_drop=0.2)
    th = OutcomeThresholds(memorization_alpha=0.05)
    ev = build_evidence(ft, ref, 1.0, 0.1, thresholds=th, n_resamples=20)
    assert ev.calibrated[ScoreKind.LOSS].tpr_at(0.05).tpr == 1.0
    assert classify(ev, th).outcome is Outcome.MEMORIZATION


# ------------------------------------------------------------------ headline


def test_peak_checkpoint_picks_highest_calibrated_auc_over_epochs_and_kinds():
    rows = [
        {"epoch": 1, "calibrated_loss_auc": 0.55, "calibrated_entropy_auc": 0.52, "calibrated_confidence_auc": 0.54},
        {"epoch": 10, "calibrated_loss_auc": 0.58, "calibrated_entropy_auc": 0.67, "calibrated_confidence_auc": 0.6},
        {"epoch": 50, "calibrated_loss_auc": 0.61, "calibrated_entropy_auc": float("nan"), "calibrated_confidence_auc": 0.5},
    ]
    p = peak_checkpoint(rows)
    assert (p.index, p.epoch, p.score_kind, p.auc) == (1, 10, ScoreKind.ENTROPY, 0.67)
    assert peak_checkpoint(pd.DataFrame(rows)).epoch == 10


def test_peak_checkpoint_ties_go_to_the_earlier_epoch_and_accepts_checkpoint_outcomes():
    ev_a = _quiet(calibrated=_with_kind("loss", auc=0.7))
    ev_b = _quiet(calibrated=_with_kind("confidence", auc=0.7))
    rows = [CheckpointOutcome(25, ev_b, classify(ev_b)), CheckpointOutcome(5, ev_a, classify(ev_a))]
    p = peak_checkpoint(rows)
    assert (p.epoch, p.score_kind, p.index) == (5, ScoreKind.LOSS, 1)


def test_peak_checkpoint_without_any_auc_is_an_error():
    with pytest.raises(ProbeError):
        peak_checkpoint([{"epoch": 1}])


def test_the_untouched_base_model_cannot_be_inverted_or_overfitted():
    """The control run: a raw member/non-member gap that fine-tuning did not cause is not inversion,
    and a flat gap profile without fine-tuning is not context overfitting."""
    import dataclasses

    inverted = _inverted_loss()
    assert classify(inverted).outcome == Outcome.INVERSION
    assert classify(dataclasses.replace(inverted, fine_tuned=False)).outcome == Outcome.NO_SIGNAL
    flat = _quiet(gap=GapStats(0.0, 0.0, {}))
    assert classify(flat).outcome == Outcome.OVERFITTING
    assert classify(dataclasses.replace(flat, fine_tuned=False)).outcome == Outcome.NO_SIGNAL


# ------------------------------------------------------------------ competing kinds and the selection-aware rule


def test_only_the_competing_score_kinds_decide_memorization():
    # the paper's "maximum signal" is over loss and entropy: a confidence-only signal decides nothing by
    # default, and decides when confidence is made to compete
    ev = _quiet(calibrated=_with_kind("confidence", auc=0.9, ci=(0.8, 0.95), tpr10=0.6))
    assert classify(ev).outcome is Outcome.NO_SIGNAL
    v = classify(ev, OutcomeThresholds(score_kinds=("loss", "entropy", "confidence")))
    assert v.outcome is Outcome.MEMORIZATION
    assert v.score_kind is ScoreKind.CONFIDENCE


def test_peak_checkpoint_picks_only_among_competing_kinds():
    rows = [{"epoch": 1, "calibrated_loss_auc": 0.6, "calibrated_confidence_auc": 0.9},
            {"epoch": 2, "calibrated_loss_auc": 0.7, "calibrated_confidence_auc": 0.5}]
    assert peak_checkpoint(rows).epoch == 1
    peak = peak_checkpoint(rows, kinds=OutcomeThresholds().score_kinds)
    assert peak.epoch == 2
    assert peak.score_kind is ScoreKind.LOSS


def test_selection_aware_rule_needs_the_p_value_below_family_alpha_over_k():
    # K = 4 checkpoints x 2 competing kinds = 8: threshold 0.05 / 8 = 0.00625
    th = OutcomeThresholds()
    assert th.p_value_threshold(4) == pytest.approx(0.05 / 8)
    passes = _quiet(calibrated=_with_kind("loss", auc=0.7, tpr10=0.4, p=0.006))
    fails = _quiet(calibrated=_with_kind("loss", auc=0.7, tpr10=0.4, p=0.007))
    assert classify(passes, th, n_checkpoints=4).outcome is Outcome.MEMORIZATION
    v = classify(passes, th, n_checkpoints=4)
    assert v.reasons["p_value"] == 0.006
    assert v.reasons["p_value_threshold"] == pytest.approx(0.00625)
    assert classify(fails, th, n_checkpoints=4).outcome is Outcome.NO_SIGNAL
    # more checkpoints to select from: a stricter bar
    assert classify(passes, th, n_checkpoints=5).outcome is Outcome.NO_SIGNAL
    # the paper's rule ignores the p-value
    assert classify(fails, OutcomeThresholds(rule="paper"), n_checkpoints=4).outcome is Outcome.MEMORIZATION


def test_unknown_rule_or_score_kind_is_refused():
    with pytest.raises(ConfigError, match="rule"):
        OutcomeThresholds(rule="holm")
    with pytest.raises(ConfigError, match="score_kinds"):
        OutcomeThresholds(score_kinds=("loss", "brier"))
    with pytest.raises(ConfigError, match="family_alpha"):
        OutcomeThresholds(family_alpha=0.0)
