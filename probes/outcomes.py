"""Outcome of a checkpoint (IclMem spec "Outcome of a checkpoint") and a run's headline checkpoint.

The rules are evaluated in a fixed order and the first that holds decides:

1. collapse      -- ``L_FT / L_base > collapse_loss_ratio`` or ``output_std < collapse_output_std``
2. memorization  -- for some competing score kind (``score_kinds``; the paper's: loss and entropy),
                    calibrated ``AUC > memorization_auc`` and ``TPR@alpha - alpha >= memorization_tpr_margin``
                    (alpha = ``memorization_alpha``); strict mode also needs the AUC interval's lower
                    bound ``> memorization_auc``. Under ``rule: selection_aware`` (the default) the kind's
                    one-sided Mann-Whitney p-value must also lie below ``family_alpha / K``, K = checkpoints
                    of the run x competing kinds (Bonferroni over the family the run headline picks its
                    maximum from); ``rule: paper`` is the paper's rule alone.
                    If several kinds qualify the one with the highest AUC decides.
3. inversion     -- mean member probe loss > mean non-member probe loss (fine-tuned, uncalibrated)
                    AND the uncalibrated loss AUC's bootstrap interval lies entirely below
                    ``inversion_auc`` (0.5, chance).
4. overfitting   -- ``|mu_gap| <= overfitting_mu`` and ``sigma_gap <= overfitting_sigma`` (nats)
5. no_signal     -- otherwise

Every threshold is a field of :class:`OutcomeThresholds` and is recorded in each :class:`Verdict`.
NaN evidence never satisfies a rule (every comparison with NaN is false).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from iclmem.errors import ConfigError, ProbeError
from iclmem.stats import DEFAULT_RESAMPLES
from iclmem.vocab import PRECEDENCE, Outcome, OutcomeRule, VerdictRule
from probes.epsilon import DEFAULT_EPSILON_DELTA
from probes.metrics import (
    SCORE_KINDS,
    Calibration,
    CheckpointMetrics,
    GapStats,
    MembershipInput,
    ScoreKind,
    gap_stats,
    robustness_scores,
)

__all__ = [
    "Outcome",
    "OutcomeThresholds",
    "OutcomeEvidence",
    "build_evidence",
    "Verdict",
    "rule_checks",
    "classify",
    "CheckpointOutcome",
    "PeakCheckpoint",
    "peak_checkpoint",
]

# absorbs float round-off in "TPR - alpha >= margin" (e.g. 0.3 - 0.1 = 0.19999999999999998)
_TPR_EPS = 1e-12


@dataclass(frozen=True)
class OutcomeThresholds:
    """Outcome rule settings; defaults are the spec's."""

    collapse_loss_ratio: float = 5.0
    collapse_output_std: float = 0.01
    memorization_auc: float = 0.5
    memorization_tpr_margin: float = 0.10
    memorization_alpha: float = 0.10
    inversion_auc: float = 0.5
    overfitting_mu: float = 0.01
    overfitting_sigma: float = 0.01
    strict: bool = False
    # which rule decides memorization (iclmem.vocab.OutcomeRule) and, for selection_aware, the family-wise
    # false-positive rate the run headline keeps
    rule: OutcomeRule = OutcomeRule.SELECTION_AWARE
    family_alpha: float = 0.05
    # the score kinds that compete for "the maximum signal" (paper: loss and entropy)
    score_kinds: tuple[ScoreKind, ...] = (ScoreKind.LOSS, ScoreKind.ENTROPY)
    # δ of the ε lower bound reported with every verdict (probes.epsilon); not a verdict threshold, kept
    # here so that it is one setting of the sweep's ``outcome:`` block and reaches every metric the rule reads
    epsilon_delta: float = DEFAULT_EPSILON_DELTA

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "rule", OutcomeRule(self.rule))
        except ValueError:
            raise ConfigError(f"outcome 'rule' must be one of {[r.value for r in OutcomeRule]}, got {self.rule!r}") from None
        kinds = self.score_kinds.split(",") if isinstance(self.score_kinds, str) else self.score_kinds
        try:
            kinds = tuple(dict.fromkeys(ScoreKind(k) for k in kinds))
        except (ValueError, TypeError):
            raise ConfigError(
                f"outcome 'score_kinds' must list kinds of {[k.value for k in ScoreKind]}, got {self.score_kinds!r}"
            ) from None
        if not kinds:
            raise ConfigError("outcome 'score_kinds' must name at least one score kind")
        object.__setattr__(self, "score_kinds", tuple(k for k in SCORE_KINDS if k in kinds))
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in ("rule", "score_kinds"):
                continue
            if f.name == "strict":
                if not isinstance(v, (bool, np.bool_)):
                    raise ConfigError(f"outcome threshold 'strict' must be true or false, got {v!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
                raise ConfigError(f"outcome threshold {f.name!r} must be a number, got {v!r}")
            if math.isnan(v) or v < 0:
                raise ConfigError(f"outcome threshold {f.name!r} must be >= 0, got {v!r}")
        if not self.epsilon_delta < 1.0:
            raise ConfigError(f"outcome 'epsilon_delta' must lie in [0, 1), got {self.epsilon_delta!r}")
        if not 0.0 < self.family_alpha < 1.0:
            raise ConfigError(f"outcome threshold 'family_alpha' must lie in (0, 1), got {self.family_alpha!r}")
        if not 0.0 < self.memorization_alpha < 1.0:
            raise ConfigError(
                f"outcome threshold 'memorization_alpha' must lie in (0, 1), got {self.memorization_alpha!r}"
            )
        for name in ("memorization_auc", "inversion_auc"):
            if getattr(self, name) > 1.0:
                raise ConfigError(f"outcome threshold {name!r} must lie in [0, 1], got {getattr(self, name)!r}")

    def as_dict(self) -> dict[str, float | bool | str]:
        out: dict[str, float | bool | str] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "strict":
                out[f.name] = bool(v)
            elif f.name == "rule":
                out[f.name] = v.value
            elif f.name == "score_kinds":
                out[f.name] = ",".join(k.value for k in v)
            else:
                out[f.name] = float(v)
        return out

    @property
    def verdict_rule(self) -> VerdictRule:
        return VerdictRule.of(self.rule, self.strict)

    def for_rule(self, rule: VerdictRule | str) -> OutcomeThresholds:
        """The same thresholds under another rule (the null-split error rates measure every rule)."""
        rule = VerdictRule(rule)
        return dataclasses.replace(self, rule=rule.rule, strict=rule.strict)

    def family_size(self, n_checkpoints: int, n_competing: int | None = None) -> int:
        """K of the selection-aware rule: the (checkpoint, score kind) pairs a run headline picks from.
        ``n_competing``: how many scores compete per checkpoint when that is not the competing score kinds
        (a reference-model attack's headline picks from its one score over the checkpoints:
        ``probes.attacks.membership.attack_verdict``)."""
        n = len(self.score_kinds) if n_competing is None else int(n_competing)
        if n < 1:
            raise ProbeError(f"a selection-aware family needs >= 1 competing score per checkpoint, got {n_competing!r}")
        return max(1, int(n_checkpoints)) * n

    def p_value_threshold(self, n_checkpoints: int, n_competing: int | None = None) -> float:
        """The p-value a deciding kind must stay below under ``selection_aware`` (0 <= p < this)."""
        return self.family_alpha / self.family_size(n_checkpoints, n_competing)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> OutcomeThresholds:
        d = dict(d or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown outcome threshold(s) {unknown}; known: {sorted(known)}")
        return cls(**d)


@dataclass(frozen=True)
class OutcomeEvidence:
    """What the classifier reads for one checkpoint.

    ``calibrated``: metrics of Delta S per score kind; must include TPR at ``memorization_alpha``.
    ``uncalibrated_loss``: metrics of the fine-tuned loss S alone (oriented: members positive), with
    a bootstrap interval. ``member_mean_probe_loss`` / ``nonmember_mean_probe_loss``: mean raw probe loss
    S(q) (fine-tuned, uncalibrated). ``gap``: gap statistics of the fine-tuned scores table.
    ``loss_ratio`` and ``output_std``: the collapse indicators (see probes.metrics)."""

    calibrated: Mapping[ScoreKind, CheckpointMetrics]
    uncalibrated_loss: CheckpointMetrics
    member_mean_probe_loss: float
    nonmember_mean_probe_loss: float
    gap: GapStats
    loss_ratio: float
    output_std: float
    # False for the untouched base model probed as if it were a checkpoint (the control run). Inversion
    # and overfitting describe what fine-tuning did ("members have the higher probe loss *after
    # fine-tuning*"); without fine-tuning a raw member/non-member gap is the task's own (e.g. shuffled
    # member labels are harder for any model), so those two rules cannot hold for the control.
    fine_tuned: bool = True

    def __post_init__(self) -> None:
        cal = {ScoreKind(k): v for k, v in self.calibrated.items()}
        if not cal:
            raise ProbeError("outcome evidence needs calibrated metrics for at least one score kind")
        for k, m in cal.items():
            if m.kind is not k or m.calibration is not Calibration.CALIBRATED:
                raise ProbeError(
                    f"evidence.calibrated[{k.value!r}] holds {m.calibration.value} {m.kind.value} metrics"
                )
        u = self.uncalibrated_loss
        if u.kind is not ScoreKind.LOSS or u.calibration is not Calibration.UNCALIBRATED:
            raise ProbeError(
                f"evidence.uncalibrated_loss holds {u.calibration.value} {u.kind.value} metrics"
            )
        object.__setattr__(self, "calibrated", cal)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in SCORE_KINDS:
            if k in self.calibrated:
                out.update(self.calibrated[k].as_dict())
        out.update(self.uncalibrated_loss.as_dict())
        out["member_mean_probe_loss"] = self.member_mean_probe_loss
        out["nonmember_mean_probe_loss"] = self.nonmember_mean_probe_loss
        out.update(self.gap.as_dict())
        out["loss_ratio"] = self.loss_ratio
        out["output_std"] = self.output_std
        out["fine_tuned"] = self.fine_tuned
        return out

    @classmethod
    def from_scores(
        cls,
        fine_tuned: pd.DataFrame,
        reference: pd.DataFrame,
        loss_ratio: float,
        output_std: float,
        **kwargs: Any,
    ) -> OutcomeEvidence:
        return build_evidence(fine_tuned, reference, loss_ratio, output_std, **kwargs)


def build_evidence(
    fine_tuned: pd.DataFrame,
    reference: pd.DataFrame,
    loss_ratio: float,
    output_std: float,
    *,
    thresholds: OutcomeThresholds | None = None,
    alphas: Sequence[float] = (0.01, 0.10),
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = 0.95,
    model_was_fine_tuned: bool = True,
) -> OutcomeEvidence:
    """Evidence from the fine-tuned and reference scores tables of one checkpoint plus the collapse
    indicators. TPR is computed at ``alphas`` and at ``thresholds.memorization_alpha``."""
    th = thresholds or OutcomeThresholds()
    all_alphas = tuple(dict.fromkeys([*map(float, alphas), float(th.memorization_alpha)]))
    mi = MembershipInput.from_scores_tables(fine_tuned, reference)
    kw = dict(alphas=all_alphas, n_resamples=n_resamples, seed=seed, confidence=confidence,
              epsilon_delta=th.epsilon_delta)
    s = robustness_scores(fine_tuned)
    mem = s["member"].to_numpy(dtype=bool)
    loss = s["loss"].to_numpy(dtype=np.float64)
    return OutcomeEvidence(
        calibrated=mi.calibrated(**kw),
        uncalibrated_loss=mi.metrics(ScoreKind.LOSS, Calibration.UNCALIBRATED, **kw),
        member_mean_probe_loss=float(loss[mem].mean()),
        nonmember_mean_probe_loss=float(loss[~mem].mean()),
        gap=gap_stats(fine_tuned),
        loss_ratio=float(loss_ratio),
        output_std=float(output_std),
        fine_tuned=bool(model_was_fine_tuned),
    )


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    score_kind: ScoreKind | None  # the deciding kind (memorization: best AUC; inversion: loss)
    reasons: dict[str, float]  # the numbers that decided it
    thresholds: dict[str, float | bool | str]
    checks: dict[str, bool] = dataclasses.field(default_factory=dict)  # every rule, evaluated alone

    def as_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "score_kind": None if self.score_kind is None else self.score_kind.value,
            "reasons": dict(self.reasons),
            "thresholds": dict(self.thresholds),
            "checks": dict(self.checks),
        }


def _collapse(ev: OutcomeEvidence, th: OutcomeThresholds) -> tuple[bool, dict[str, float]]:
    holds = bool(ev.loss_ratio > th.collapse_loss_ratio or ev.output_std < th.collapse_output_std)
    return holds, {"loss_ratio": float(ev.loss_ratio), "output_std": float(ev.output_std)}


def memorization_holds(m: Any, th: OutcomeThresholds, n_checkpoints: int = 1, n_competing: int | None = None) -> bool:
    """The memorization rule on one score kind's metrics (calibrated, or raw for ``raw_outcome``):
    AUC above the threshold, TPR at alpha at least alpha + margin, in strict mode the AUC interval's
    lower bound above the threshold too, and under ``selection_aware`` the kind's one-sided Mann-Whitney
    p-value below ``family_alpha / K`` (K = ``n_checkpoints`` x competing kinds, or x ``n_competing`` when
    given: a reference-model attack's own family). The one place this rule is written."""
    tpr = m.tpr_at(th.memorization_alpha).tpr
    ok = m.auc > th.memorization_auc and tpr - th.memorization_alpha >= th.memorization_tpr_margin - _TPR_EPS
    if th.strict:
        ok = ok and m.auc_interval.low > th.memorization_auc
    if th.rule is OutcomeRule.SELECTION_AWARE:
        ok = ok and m.p_value < th.p_value_threshold(n_checkpoints, n_competing)
    return bool(ok)


def _memorization(
    ev: OutcomeEvidence, th: OutcomeThresholds, n_checkpoints: int = 1
) -> tuple[bool, ScoreKind | None, dict[str, float]]:
    best: tuple[float, int, ScoreKind, dict[str, float]] | None = None
    for order, kind in enumerate(SCORE_KINDS):
        m = ev.calibrated.get(kind)
        if kind not in th.score_kinds or m is None or not memorization_holds(m, th, n_checkpoints):
            continue
        if best is None or m.auc > best[0]:
            tpr = m.tpr_at(th.memorization_alpha).tpr
            reasons = {
                "auc": float(m.auc),
                "auc_low": float(m.auc_interval.low),
                "auc_high": float(m.auc_interval.high),
                "tpr": float(tpr),
                "alpha": float(th.memorization_alpha),
                "tpr_minus_alpha": float(tpr - th.memorization_alpha),
                "p_value": float(m.p_value),
                "p_value_threshold": float(th.p_value_threshold(n_checkpoints)),
            }
            best = (m.auc, order, kind, reasons)
    if best is None:
        return False, None, {}
    return True, best[2], best[3]


def _inversion(ev: OutcomeEvidence, th: OutcomeThresholds) -> tuple[bool, dict[str, float]]:
    u = ev.uncalibrated_loss
    holds = bool(
        ev.fine_tuned
        and ev.member_mean_probe_loss > ev.nonmember_mean_probe_loss
        and u.auc_interval.high < th.inversion_auc
    )
    return holds, {
        "member_mean_probe_loss": float(ev.member_mean_probe_loss),
        "nonmember_mean_probe_loss": float(ev.nonmember_mean_probe_loss),
        "uncalibrated_loss_auc": float(u.auc),
        "uncalibrated_loss_auc_low": float(u.auc_interval.low),
        "uncalibrated_loss_auc_high": float(u.auc_interval.high),
    }


def _overfitting(ev: OutcomeEvidence, th: OutcomeThresholds) -> tuple[bool, dict[str, float]]:
    holds = bool(ev.fine_tuned and abs(ev.gap.mu_gap) <= th.overfitting_mu and ev.gap.sigma_gap <= th.overfitting_sigma)
    return holds, {"mu_gap": float(ev.gap.mu_gap), "sigma_gap": float(ev.gap.sigma_gap)}


def _rules(evidence: OutcomeEvidence, th: OutcomeThresholds,
           n_checkpoints: int = 1) -> dict[Outcome, tuple[bool, ScoreKind | None, dict[str, float]]]:
    """Every rule but no_signal, evaluated on its own: (holds, deciding score kind, the numbers it read)."""
    collapse, r_col = _collapse(evidence, th)
    inversion, r_inv = _inversion(evidence, th)
    overfitting, r_ovf = _overfitting(evidence, th)
    return {
        Outcome.COLLAPSE: (collapse, None, r_col),
        Outcome.MEMORIZATION: _memorization(evidence, th, n_checkpoints),
        Outcome.INVERSION: (inversion, ScoreKind.LOSS, r_inv),
        Outcome.OVERFITTING: (overfitting, None, r_ovf),
    }


def rule_checks(evidence: OutcomeEvidence, thresholds: OutcomeThresholds | None = None,
                n_checkpoints: int = 1) -> dict[Outcome, bool]:
    """Every rule evaluated on its own, ignoring precedence (no_signal: none of the others holds)."""
    c = {o: holds for o, (holds, _k, _r) in _rules(evidence, thresholds or OutcomeThresholds(), n_checkpoints).items()}
    c[Outcome.NO_SIGNAL] = not any(c.values())
    return c


def classify(evidence: OutcomeEvidence, thresholds: OutcomeThresholds | None = None,
             n_checkpoints: int = 1) -> Verdict:
    """Outcome of one checkpoint: the first rule, in :data:`PRECEDENCE` order, that holds.
    ``n_checkpoints``: how many checkpoints the run's headline selects from (the selection-aware rule's
    family is that many times the competing score kinds)."""
    th = thresholds or OutcomeThresholds()
    rules = _rules(evidence, th, n_checkpoints)
    checks = {o.value: holds for o, (holds, _k, _r) in rules.items()}
    checks[Outcome.NO_SIGNAL.value] = not any(checks.values())
    rec = th.as_dict()
    for outcome in PRECEDENCE:
        if outcome is Outcome.NO_SIGNAL:
            break
        holds, kind, reasons = rules[outcome]
        if holds:
            return Verdict(outcome=outcome, score_kind=kind, reasons=reasons, thresholds=rec, checks=checks)
    # no_signal: record the numbers every rule looked at
    no_signal: dict[str, float] = {}
    for outcome in (Outcome.COLLAPSE, Outcome.INVERSION, Outcome.OVERFITTING):
        no_signal.update(rules[outcome][2])
    for kind, m in evidence.calibrated.items():
        no_signal[f"calibrated_{kind.value}_auc"] = float(m.auc)
        no_signal[f"calibrated_{kind.value}_tpr"] = float(m.tpr_at(th.memorization_alpha).tpr)
    return Verdict(outcome=Outcome.NO_SIGNAL, score_kind=None, reasons=no_signal, thresholds=rec, checks=checks)


# --------------------------------------------------------------------------------------------------
# headline: peak checkpoint of a run
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointOutcome:
    """One checkpoint's evidence and verdict."""

    epoch: int
    evidence: OutcomeEvidence
    verdict: Verdict

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "epoch": int(self.epoch),
            "outcome": self.verdict.outcome.value,
            "outcome_score_kind": None if self.verdict.score_kind is None else self.verdict.score_kind.value,
        }
        out.update(self.evidence.as_dict())
        out.update({f"threshold_{k}": v for k, v in self.verdict.thresholds.items()})
        return out


@dataclass(frozen=True)
class PeakCheckpoint:
    index: int  # position of the row in the input sequence
    epoch: int
    score_kind: ScoreKind
    auc: float
    row: Any  # the input row itself


def _row_aucs(row: Any) -> tuple[int, dict[ScoreKind, float]]:
    if isinstance(row, CheckpointOutcome):
        return int(row.epoch), {k: float(m.auc) for k, m in row.evidence.calibrated.items()}
    if isinstance(row, Mapping):
        d = row
    elif isinstance(row, pd.Series):
        d = row.to_dict()
    elif hasattr(row, "as_dict"):
        d = row.as_dict()
    else:
        raise ProbeError(f"peak_checkpoint: cannot read a row of type {type(row).__name__}")
    if "epoch" not in d:
        raise ProbeError("peak_checkpoint: row has no 'epoch'")
    aucs = {}
    for k in SCORE_KINDS:
        key = f"calibrated_{k.value}_auc"
        if key in d and d[key] is not None:
            aucs[k] = float(d[key])
    return int(d["epoch"]), aucs


def peak_checkpoint(rows: Iterable[Any], kinds: Iterable[ScoreKind | str] = SCORE_KINDS) -> PeakCheckpoint:
    """The run's headline: the checkpoint with the highest calibrated AUC over epochs and score kinds.

    ``rows``: :class:`CheckpointOutcome` objects, or flat records (mappings / pandas rows) with an
    ``epoch`` and ``calibrated_<kind>_auc`` keys (as written by :meth:`CheckpointOutcome.as_dict`).
    NaN AUCs are skipped. Ties go to the earlier epoch, then to the kind order loss, entropy,
    confidence. ``kinds``: the score kinds that compete (``OutcomeThresholds.score_kinds``)."""
    competing = {ScoreKind(k) for k in kinds}
    if isinstance(rows, pd.DataFrame):
        rows = [r for _, r in rows.iterrows()]
    best: tuple[float, int, int, int, ScoreKind, Any] | None = None
    for i, row in enumerate(rows):
        epoch, aucs = _row_aucs(row)
        for order, k in enumerate(SCORE_KINDS):
            if k not in competing:
                continue
            a = aucs.get(k, float("nan"))
            if math.isnan(a):
                continue
            # maximise auc; then minimise epoch, kind order
            key = (a, -epoch, -order)
            if best is None or key > (best[0], -best[1], -best[2]):
                best = (a, epoch, order, i, k, row)
    if best is None:
        raise ProbeError("peak_checkpoint: no checkpoint with a calibrated AUC")
    a, epoch, _, i, k, row = best
    return PeakCheckpoint(index=i, epoch=epoch, score_kind=k, auc=a, row=row)
