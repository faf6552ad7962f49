"""The deployed-context audit: was a row in a fitted in-context learner's context?

A fitted TabPFN- or TabICL-style classifier keeps its training rows as its context, and every prediction
attends to them; whether a row was in that context is the membership question a model owner faces before
releasing predictions, with or without fine-tuning. A reference "model" is the same weights with another
context, so reference attacks with many references cost forward passes, not fine-tunes.

Design (members positive, members and non-members exchangeable):

* **P**: 2N rows of the table split label-matched into N members and N non-members (Stage I's split,
  ``trainables.data.prepare_task`` with q = N). The deployed context is the members, in P's order.
* **References**: K contexts (K even), complementary pairs of random halves of P
  (``trainables.data.reference_half``), so every row of P is in exactly K/2 of them and each holds N rows
  of P, as the deployed context does. They do not depend on the target, so one set serves the deployed
  context and the control.
* **Statistics**: every row of P scored under the deployed context and under each reference:
  log p(y* | x, context), the label the row has in the table.
* **Attacks** (:class:`~iclmem.vocab.ContextAttack`, higher = member): ``loss`` (the known-context loss:
  log p(y*) under the deployed context), ``calibrated_loss`` (that minus its mean under the references
  without the row: the difference-to-reference calibration of the IclMem probe, with the reference
  contexts as the reference model), LiRA online and offline on φ = logit p(y*) and RMIA on log p(y*)
  (:mod:`probes.attacks.membership`, as the sweep's reference attacks, Carlini et al.'s fixed variance below 64
  references).
* **Control** (:data:`~iclmem.vocab.ContextTarget.CONTROL`): the same attacks against a context of N rows
  outside P with the members' label counts, so no row of P was in it: every attack must say
  ``no_signal`` there, or the audit's verdict is not trusted (:func:`audit_verdict`).

Each attack is judged by IclMem's memorization rule (:func:`probes.attacks.membership.attack_verdict`); the
selection-aware family is the attacks (:data:`ATTACK_FAMILY`), since the verdict reads all of them.

Pure numpy: the model is a :class:`ContextScorer` the caller gives (a torch adapter or a scikit-learn
estimator behind it, :mod:`orchestrator.audits.context_audit`); no Ray. Shapes: population features float32
[n, F] with labels int64 [n] and member flags bool [n] (n = 2N); a context float32 [N, F] with labels
int64 [N]; a scorer returns log-probabilities float [m, C] of m queries over the C classes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from iclmem.errors import ProbeError
from iclmem.stats import DEFAULT_RESAMPLES
from iclmem.vocab import ContextAttack, ContextTarget, Outcome
from probes.attacks.membership import ReferenceStatistics, lira_offline, lira_online, logit_of_loss, rmia, score_columns
from probes.epsilon import DEFAULT_EPSILON_DELTA
from probes.outcomes import OutcomeThresholds

# log p(y*) is floored here: an estimator that gives a row's label probability 0 (a class missing from a
# reference context) must not make a statistic infinite
LOG_P_FLOOR = float(np.log(1e-12))
ATTACK_FAMILY = len(ContextAttack)  # the selection-aware family of one audit's verdict: its attacks
MAX_REFERENCES = 256


class ContextScorer(Protocol):
    """log p(class | query, context): float [m, C] for m queries, C classes, under the given context."""

    def __call__(self, context_x: np.ndarray, context_y: np.ndarray, query_x: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class ContextAuditInputs:
    """What one audit scores: the population P (members first or not: ``member`` says), its labels, the
    classes, and the control's context (rows outside P with the members' label counts; None: no control)."""

    population_x: np.ndarray  # float32 [n, F]
    population_y: np.ndarray  # int64 [n]
    member: np.ndarray  # bool [n]: in the deployed context
    n_classes: int
    control_x: np.ndarray | None = None  # float32 [N, F]
    control_y: np.ndarray | None = None  # int64 [N]

    def __post_init__(self) -> None:
        x = np.asarray(self.population_x, dtype=np.float32)
        y = np.asarray(self.population_y, dtype=np.int64)
        m = np.asarray(self.member, dtype=bool)
        if x.ndim != 2 or y.shape != (len(x),) or m.shape != (len(x),):
            raise ProbeError(f"context audit: population features {x.shape}, labels {y.shape}, member flags {m.shape}:"
                             " need [n, F], [n], [n]")
        if m.sum() < 2 or (~m).sum() < 2:
            raise ProbeError(f"context audit: {int(m.sum())} members and {int((~m).sum())} non-members; need >= 2 each")
        if self.n_classes < 2 or y.min() < 0 or y.max() >= self.n_classes:
            raise ProbeError(f"context audit: labels must lie in 0..{self.n_classes - 1}")
        for name, value in (("population_x", x), ("population_y", y), ("member", m)):
            value.flags.writeable = False
            object.__setattr__(self, name, value)
        if (self.control_x is None) != (self.control_y is None):
            raise ProbeError("context audit: the control needs both its features and its labels")
        if self.control_x is not None and self.control_y is not None:
            cx = np.asarray(self.control_x, dtype=np.float32)
            cy = np.asarray(self.control_y, dtype=np.int64)
            if cx.ndim != 2 or cx.shape[1] != x.shape[1] or cy.shape != (len(cx),):
                raise ProbeError(f"context audit: control context {cx.shape} with labels {cy.shape}: need [N, {x.shape[1]}]"
                                 " and [N]")
            object.__setattr__(self, "control_x", cx)
            object.__setattr__(self, "control_y", cy)

    @property
    def context_size(self) -> int:
        """N: the rows of the deployed context (and of each reference and the control)."""
        return int(self.member.sum())


def reference_contexts(n_rows: int, n_references: int, seed: int) -> np.ndarray:
    """bool [K, n]: which rows of P reference context k holds (complementary pairs of random halves:
    ``trainables.data.reference_half``, the sweep's reference models' draw)."""
    from trainables.data import reference_half

    if n_references < 2 or n_references % 2 or n_references > MAX_REFERENCES:
        raise ProbeError(f"context audit: {n_references} references; need an even number from 2 to {MAX_REFERENCES}"
                         " (every row is then in exactly half of them)")
    return np.stack([reference_half(n_rows, k, seed) for k in range(n_references)])


def true_label_log_p(log_probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """float64 [m]: log p(y*) of each query from its log-probabilities [m, C], floored at :data:`LOG_P_FLOOR`."""
    lp = np.asarray(log_probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if lp.ndim != 2 or lp.shape[0] != len(y):
        raise ProbeError(f"context audit: the scorer returned log-probabilities {lp.shape} for {len(y)} queries")
    picked = lp[np.arange(len(y)), y]
    if np.isnan(picked).any():
        raise ProbeError("context audit: the scorer returned NaN log-probabilities")
    return np.maximum(picked, LOG_P_FLOOR)


@dataclass(frozen=True)
class ContextStatistics:
    """Every row of P scored under one target context and under the K references."""

    target_log_p: np.ndarray  # float64 [n]
    target_correct: np.ndarray  # bool [n]: the target's most probable class is the row's label
    reference_log_p: np.ndarray  # float64 [K, n]
    in_reference: np.ndarray  # bool [K, n]

    @property
    def n_references(self) -> int:
        return int(self.reference_log_p.shape[0])


@dataclass(frozen=True)
class ReferenceScores:
    """The references' scores of P (shared by every target) and the seconds their forward passes took."""

    log_p: np.ndarray  # float64 [K, n]
    in_reference: np.ndarray  # bool [K, n]
    seconds: float

    @property
    def seconds_per_reference(self) -> float:
        return float(self.seconds / max(1, int(self.log_p.shape[0])))

    def first(self, k: int) -> ReferenceScores:
        """The first ``k`` references (``k`` even): exactly the set an audit with ``k`` references draws, since
        reference k's context does not depend on K (``trainables.data.reference_half``)."""
        if k < 2 or k % 2 or k > self.log_p.shape[0]:
            raise ProbeError(f"context audit: {k} of {self.log_p.shape[0]} references; need an even number >= 2")
        return ReferenceScores(self.log_p[:k], self.in_reference[:k], self.seconds_per_reference * k)

    def halves(self) -> tuple[ReferenceScores, ReferenceScores] | None:
        """Two disjoint reference sets, each of whole complementary pairs (so every row is in exactly half of each):
        the first ⌊pairs/2⌋ pairs and the rest. A row's risk under one against the other is its stability across
        reference sets (Jälkö et al.: a record's exposure measured with other references can differ). None with
        fewer than two pairs."""
        pairs = int(self.log_p.shape[0]) // 2
        if pairs < 2:
            return None
        cut = 2 * (pairs // 2)
        per = self.seconds_per_reference
        return (ReferenceScores(self.log_p[:cut], self.in_reference[:cut], per * cut),
                ReferenceScores(self.log_p[cut:], self.in_reference[cut:], per * (self.log_p.shape[0] - cut)))


def score_references(scorer: ContextScorer, inputs: ContextAuditInputs, n_references: int, seed: int,
                     progress: Callable[[int, int], None] | None = None) -> ReferenceScores:
    """P scored under each of the K reference contexts (``progress(k, K)`` after each)."""
    masks = reference_contexts(len(inputs.population_y), n_references, seed)
    x, y = inputs.population_x, inputs.population_y
    out = np.empty(masks.shape, dtype=np.float64)
    start = time.perf_counter()
    for k, mask in enumerate(masks):
        out[k] = true_label_log_p(scorer(x[mask], y[mask], x), y)
        if progress is not None:
            progress(k + 1, len(masks))
    return ReferenceScores(out, masks, time.perf_counter() - start)


def target_statistics(scorer: ContextScorer, inputs: ContextAuditInputs, references: ReferenceScores,
                      target: ContextTarget) -> ContextStatistics:
    """P scored under the deployed context (the members) or the control's, beside the references' scores."""
    x, y = inputs.population_x, inputs.population_y
    if ContextTarget(target) == ContextTarget.DEPLOYED:
        cx, cy = x[inputs.member], y[inputs.member]
    elif inputs.control_x is None or inputs.control_y is None:
        raise ProbeError("context audit: no control context was given")
    else:
        cx, cy = inputs.control_x, inputs.control_y
    log_probs = np.asarray(scorer(cx, cy, x), dtype=np.float64)
    log_p = true_label_log_p(log_probs, y)
    return ContextStatistics(log_p, log_probs.argmax(axis=1) == y, references.log_p, references.in_reference)


def context_attack_scores(stats: ContextStatistics) -> dict[ContextAttack, np.ndarray]:
    """Each attack's per-row membership score (higher = member) from one target's statistics."""
    out_ref = ~stats.in_reference
    n_out = out_ref.sum(axis=0)
    mean_out = np.where(n_out > 0, np.where(out_ref, stats.reference_log_p, 0.0).sum(axis=0) / np.maximum(n_out, 1), 0.0)
    # LiRA's statistic φ = log p - log(1 - p), computed from the loss -log p (stable near p = 1)
    lira_stats = ReferenceStatistics(logit_of_loss(-stats.target_log_p), logit_of_loss(-stats.reference_log_p),
                                     stats.in_reference)
    return {
        ContextAttack.LOSS: stats.target_log_p.copy(),
        ContextAttack.CALIBRATED_LOSS: stats.target_log_p - mean_out,
        ContextAttack.LIRA_ONLINE: lira_online(lira_stats),
        ContextAttack.LIRA_OFFLINE: lira_offline(lira_stats),
        ContextAttack.RMIA: rmia(stats.target_log_p, stats.reference_log_p),
    }


@dataclass(frozen=True)
class ContextAuditResult:
    """One audit: a row per (target, attack) and each one's ROC curve and scores, and the verdict. A row:
    ``target``, ``attack``, ``context_size``, ``n_references``, ``heldout_accuracy`` (the target context's
    accuracy on the non-members), then the attack's columns (:func:`probes.attacks.membership.score_columns`, unprefixed:
    ``auc``, ``tpr_at_1pct``, ``epsilon_lb``, ``outcome``, ``null_memorization``, ...)."""

    rows: tuple[dict[str, Any], ...]
    curves: Mapping[tuple[str, str], Mapping[str, Sequence[float]]]
    scores: Mapping[tuple[str, str], np.ndarray]  # (target, attack) -> float64 [n], aligned with P
    verdict: ContextVerdict
    seconds_per_reference: float
    blind: Mapping[str, Any] = field(default_factory=dict)
    # attack -> its scores of P on the deployed context under each of two disjoint reference sets
    # (:meth:`ReferenceScores.halves`): the records' stability across reference sets; empty with K < 4
    reference_halves: Mapping[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def rows_of(self, target: ContextTarget) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["target"] == ContextTarget(target).value]

    def row(self, target: ContextTarget, attack: ContextAttack) -> dict[str, Any]:
        for r in self.rows:
            if r["target"] == ContextTarget(target).value and r["attack"] == ContextAttack(attack).value:
                return r
        raise KeyError((target, attack))


@dataclass(frozen=True)
class ContextVerdict:
    """The audit's verdict: ``memorization`` when an attack's memorization rule holds on the deployed
    context, else ``no_signal``; ``trusted`` only when the control gave ``no_signal`` under every attack and
    the split is exchangeable (the blind baseline's interval holds 0.5). ``strongest`` is the attack with the
    highest TPR at 1% FPR on the deployed context (ties: the higher AUC)."""

    outcome: Outcome
    trusted: bool
    strongest: ContextAttack
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome.value, "trusted": self.trusted, "strongest_attack": self.strongest.value,
                "reason": self.reason}


def audit_verdict(rows: Sequence[Mapping[str, Any]], exchangeable: bool = True) -> ContextVerdict:
    """The verdict of an audit's rows (see :class:`ContextVerdict`)."""
    deployed = [r for r in rows if r["target"] == ContextTarget.DEPLOYED.value]
    control = [r for r in rows if r["target"] == ContextTarget.CONTROL.value]
    if not deployed:
        raise ProbeError("context audit: no row of the deployed context")
    strongest = max(deployed, key=lambda r: (float(r["tpr_at_1pct"]), float(r["auc"])))
    hits = [r["attack"] for r in deployed if r["outcome"] == Outcome.MEMORIZATION.value]
    false_alarms = [r["attack"] for r in control if r["outcome"] == Outcome.MEMORIZATION.value]
    outcome = Outcome.MEMORIZATION if hits else Outcome.NO_SIGNAL
    reasons = [f"memorization under {', '.join(hits)}" if hits else "no attack's memorization rule holds"]
    distrust = distrust_reasons(control_run=bool(control), control_found=false_alarms, exchangeable=exchangeable,
                                what="memorization")
    return ContextVerdict(outcome, not distrust, ContextAttack(strongest["attack"]), "; ".join(reasons + distrust))


def distrust_reasons(*, control_run: bool, control_found: Sequence[str], exchangeable: bool | None,
                     what: str) -> list[str]:
    """Why a deployed-context verdict is not to be trusted; none: it is trusted. The one rule for membership
    (:func:`audit_verdict`) and value inference (:mod:`probes.attacks.value_inference`): a never-in-context control was
    run, none of its attacks (``control_found``) finds ``what`` there, and the split is exchangeable (its label
    design treats both groups alike and the blind baseline's interval holds 0.5; None: not measured, which is
    not trusted either)."""
    reasons = []
    if not control_run:
        reasons.append("no never-in-context control was run (the table has too few rows outside P)")
    elif control_found:
        reasons.append(f"the never-in-context control says {what} under {', '.join(control_found)}")
    if exchangeable is None:
        reasons.append("no blind baseline was measured (members against non-members without the model)")
    elif not exchangeable:
        reasons.append("members and non-members are separable without the model (blind baseline)")
    return reasons


def evaluate_context_audit(scorer: ContextScorer, inputs: ContextAuditInputs, *, n_references: int, seed: int = 0,
                           n_resamples: int = DEFAULT_RESAMPLES, null_splits: int = 5,
                           thresholds: OutcomeThresholds | None = None, epsilon_delta: float = DEFAULT_EPSILON_DELTA,
                           blind: Mapping[str, Any] | None = None, exchangeable: bool = True,
                           progress: Callable[[int, int], None] | None = None,
                           references: ReferenceScores | None = None) -> ContextAuditResult:
    """Score P under the references, the deployed context and (if given) the control; every attack's
    metrics, null splits and verdict per target; the audit's verdict. ``references``: P already scored under
    the K reference contexts (:meth:`ReferenceScores.first` of a larger set gives the audit with fewer)."""
    th = thresholds or OutcomeThresholds()
    if references is None:
        references = score_references(scorer, inputs, n_references, seed, progress)
    elif references.log_p.shape != (n_references, len(inputs.population_y)):
        raise ProbeError(f"context audit: reference scores {references.log_p.shape} for {n_references} references "
                         f"and {len(inputs.population_y)} rows")
    targets = [ContextTarget.DEPLOYED] + ([ContextTarget.CONTROL] if inputs.control_x is not None else [])
    rows: list[dict[str, Any]] = []
    curves: dict[tuple[str, str], Mapping[str, Sequence[float]]] = {}
    all_scores: dict[tuple[str, str], np.ndarray] = {}
    for target in targets:
        stats = target_statistics(scorer, inputs, references, target)
        # the non-members were never in the deployed context: its accuracy on them is held-out accuracy
        heldout = float(stats.target_correct[~inputs.member].mean())
        for attack, scores in context_attack_scores(stats).items():
            cols, curve = score_columns(scores, inputs.member, "", n_resamples=n_resamples, null_splits=null_splits,
                                        seed=seed, epsilon_delta=epsilon_delta, thresholds=th,
                                        n_checkpoints=ATTACK_FAMILY)
            rows.append({"target": target.value, "attack": attack.value, "context_size": inputs.context_size,
                         "n_references": n_references, "heldout_accuracy": heldout, **cols})
            curves[(target.value, attack.value)] = curve
            all_scores[(target.value, attack.value)] = scores
    verdict = audit_verdict(rows, exchangeable)
    halves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    split = references.halves()
    if split is not None:  # the deployed context's attacks under two disjoint reference sets
        first, second = (context_attack_scores(target_statistics(scorer, inputs, half, ContextTarget.DEPLOYED))
                         for half in split)
        halves = {attack.value: (first[attack], second[attack]) for attack in first}
    return ContextAuditResult(tuple(rows), curves, all_scores, verdict, references.seconds_per_reference,
                              dict(blind or {}), halves)


__all__ = ["ATTACK_FAMILY", "ContextAuditInputs", "ContextAuditResult", "ContextScorer", "ContextStatistics",
           "ContextVerdict", "MAX_REFERENCES", "ReferenceScores", "audit_verdict", "context_attack_scores",
           "distrust_reasons",
           "evaluate_context_audit", "reference_contexts", "score_references", "target_statistics",
           "true_label_log_p"]
