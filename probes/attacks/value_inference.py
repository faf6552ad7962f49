"""Label and attribute inference against a deployed in-context learner, each as a gain over what the attacker
gets without the model holding the row, with intervals, an imputation baseline and a never-in-context control.

Membership inference (:mod:`probes.attacks.context`) asks whether a row was in the context. A data holder often
fears something else: that the deployed model gives away a *value* of a row it holds -- its label, or one
sensitive column -- to someone who knows the rest of the row. Jayaraman & Evans ("Are attribute inference attacks
just imputation?", CCS 2022) show that most of what such attacks recover is recovered as well by imputing the
value from the data distribution, without the model. So both attacks here are reported as *gains*: the attack's
success on a row minus the success of the same attacker without that row in the model, and members against
non-members.

Threat model and design (same population as the context audit, :class:`~probes.attacks.context.ContextAuditInputs`):

* **P**: n = 2N rows, features float32 [n, F], labels int64 [n], member flags bool [n]; the deployed context
  is the members. The attacker knows a target row's features (all of them for label inference, all but the
  sensitive column for attribute inference) and its label (attribute inference only), and can query the
  deployed model; rows are identified by their position in P, never by their values.
* **References**: K contexts (K even, >= 2) from :func:`~probes.attacks.context.reference_contexts`,
  complementary random halves of P, so every row is in exactly K/2 of them and *out* of the other K/2. The
  references that lack a row are "the same model without the row": the same weights, a context of the same
  size from the same distribution. They do not depend on the target, so one set serves the deployed context
  and the control.
* **Label inference** (the label is the secret; :data:`InferenceAttack.LABEL`): the attacker queries the
  deployed model at the row's features and guesses the most probable class. Per row: ``correct`` under the
  deployed context, the same averaged over the references without the row (the *accuracy without the row*),
  their difference (the *accuracy gain*), and the *confidence gain*, log p(y* | x, deployed) minus its mean
  under the references without the row (the calibrated loss of the context audit). Per group (members,
  non-members): the means, and the headline is a difference in differences, members' accuracy gain minus
  non-members' accuracy gain, as is the confidence gain's. The accuracy gain decides ``found``: a confidence
  shift that does not move the argmax gives the attacker no label; the confidence gain is reported beside it.
* **Attribute inference** on one sensitive column s with a finite set of V candidate values
  (:class:`~probes.attacks.value_inputs.SensitiveAttribute`: categorical codes, or the bin centres of a numeric
  column binned at population quantiles, :func:`~probes.attacks.value_inputs.bin_numeric`; a row's true candidate is its code, or its own bin). For each candidate v the
  attacker sets x[s] = v and queries log p(y* | x_v, context) with the row's known label y*.
  :data:`InferenceAttack.ATTRIBUTE_MODEL` guesses the v with the highest value;
  :data:`InferenceAttack.ATTRIBUTE_CALIBRATED` the v with the highest value minus its mean under the
  references without the row (what the deployed model says about v beyond what the same model without the row
  says). The **imputation baseline** predicts the candidate from the other features and the one-hot label with
  a classifier fitted on an auxiliary pool of rows the caller gives (:class:`~probes.attacks.value_inputs.ImputationPool`: rows of the table
  never in any context, the control rows, ...; never the targets). Per group and attack: attack accuracy,
  imputation accuracy, gain = attack - imputation; headline: members' gain minus non-members' gain.
* **found** (both attacks): the lower bound of the members' gain *and* the lower bound of the members-minus-
  non-members difference are both above 0. The members' gain alone can come from a model that generalises
  better than the baseline (statistical inference, not disclosure of a member); the difference alone can come
  from the attack doing *worse* on non-members -- the calibrated attribute attack removes what the model
  generalises, so on non-members it guesses, and a column imputation already predicts perfectly would show a
  large difference with no member disclosed beyond imputation. Requiring both (an intersection-union test)
  keeps the level of each interval. The two attribute attacks are one family: their intervals are at the
  Bonferroni level 1 - (1 - confidence) / 2, and the attribute verdict is found when either attack's is.
* **Control** (:data:`~iclmem.vocab.ContextTarget.CONTROL`): the same attacks with the control context (rows
  outside P with the members' label counts) as the deployed model. No row of P was in it, members and
  non-members are exchangeable there, so every headline is ~0 and ``found`` must be False. A result is
  ``trusted`` by the membership audit's rule (:func:`~probes.attacks.context.distrust_reasons`): its control was
  run and found nothing, and the split is exchangeable (the blind baseline, members against non-members without
  the model, cannot tell them apart): a difference between members and non-members that the rows' own labels and
  features already give is no disclosure by the model.
* **Intervals**: stratified percentile bootstrap (:func:`iclmem.stats.bootstrap_indices`: rows resampled
  within members and within non-members), the same resamples for every statistic of one target, so a gain's
  interval and its parts agree. Ties in an argmax (a model that gives two classes or candidates the same
  score) are broken uniformly at random *in expectation*: a row scores 1/k when its true value is among k tied
  best, so a model that cannot tell values apart scores chance, never the first candidate's frequency.

Scorer calls are batched: one call per (context, candidate) with all n rows of P stacked as queries (label
inference: one per context). Pure numpy / scipy / scikit-learn; no Ray, no torch: the model is a
:class:`~probes.attacks.context.ContextScorer` the caller gives. Results hold rates, intervals and per-row
outcomes aligned with P (row ids are positions), never a feature value or a guessed value.

Its closed vocabularies, :class:`~iclmem.vocab.InferenceAttack` and :class:`~iclmem.vocab.InferenceGroup`, are
declared in :mod:`iclmem.vocab`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from iclmem.errors import DataError, ProbeError
from iclmem.stats import DEFAULT_RESAMPLES, NAN_INTERVAL, Interval, bootstrap_indices
from iclmem.vocab import ContextTarget, InferenceAttack, InferenceGroup
from probes.attacks.context import (
    LOG_P_FLOOR,
    MAX_REFERENCES,
    ContextAuditInputs,
    ContextScorer,
    distrust_reasons,
    reference_contexts,
    true_label_log_p,
)
from probes.attacks.value_inputs import ImputationPool, SensitiveAttribute, check_column

__all__ = ["ATTRIBUTE_ATTACKS", "DEFAULT_CONFIDENCE", "AttributeAttackStats", "AttributeGroupStats", "AttributeInferenceResult",
           "AttributeInferenceTarget", "Estimate", "LabelGroupStats", "LabelInferenceResult", "LabelInferenceTarget",
           "attribute_inference", "gain_by_group", "label_inference"]


ATTRIBUTE_ATTACKS: tuple[InferenceAttack, ...] = (InferenceAttack.ATTRIBUTE_MODEL, InferenceAttack.ATTRIBUTE_CALIBRATED)
DEFAULT_CONFIDENCE = 0.95
# scores this close to a row's best count as tied with it (log-probabilities: far below any real difference, above
# the round-off of a mean over references)
TIE_TOLERANCE = 1e-9


# --------------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """A statistic and its bootstrap interval (``confidence`` is the target's; nan bounds: not resampled)."""

    value: float
    low: float
    high: float

    @property
    def interval(self) -> Interval:
        return Interval(self.low, self.high)


@dataclass(frozen=True)
class LabelGroupStats:
    """Label inference over one group (members or non-members) under one target context."""

    n_rows: int
    accuracy: Estimate  # the target context's argmax is the row's label
    accuracy_without_row: Estimate  # the same, averaged over the references that lack the row
    accuracy_gain: Estimate  # accuracy - accuracy_without_row
    confidence_gain: Estimate  # log p(y*) under the target minus its mean under the references without the row


@dataclass(frozen=True, eq=False)
class LabelInferenceTarget:
    """Label inference under one target context (the deployed one or the control)."""

    target: ContextTarget
    members: LabelGroupStats
    nonmembers: LabelGroupStats
    accuracy_gain_difference: Estimate  # members' accuracy gain minus non-members': the headline
    confidence_gain_difference: Estimate  # likewise for the confidence gain (reported; does not decide)
    confidence: float
    found: bool  # the lower bounds of members' accuracy gain and of the difference both above 0
    row_accuracy_gain: np.ndarray  # float64 [n], aligned with P
    row_confidence_gain: np.ndarray  # float64 [n], aligned with P


class _Verdict:
    """``found`` (on the deployed context) and ``trusted`` (the membership audit's rule: a control was run and
    found nothing where there is nothing to find, and the blind baseline found the split exchangeable) of a
    result holding ``deployed`` and ``control`` targets and the split's ``exchangeable`` (None: not measured)."""

    deployed: Any
    control: Any
    exchangeable: bool | None
    imputation_row_correct: Any  # an attribute result's (AttributeInferenceResult); a label result has none

    @property
    def found(self) -> bool:
        return bool(self.deployed.found)

    @property
    def distrust(self) -> list[str]:
        """Why the result is not trusted (:func:`~probes.attacks.context.distrust_reasons`); empty: trusted."""
        control = self.control
        if control is None:
            found: list[str] = []
        elif hasattr(control, "attacks"):
            found = [a.attack.value for a in control.attacks if a.found]
        else:
            found = [InferenceAttack.LABEL.value] if control.found else []
        return distrust_reasons(control_run=control is not None, control_found=found,
                                exchangeable=self.exchangeable, what="values are given away")

    @property
    def trusted(self) -> bool:
        return not self.distrust

    def row_gains(self) -> dict[str, np.ndarray]:
        """attack -> float64 [n] aligned with P: each row's gain on the deployed context (label: the accuracy gain
        over the references without the row; attribute: the attack's hit minus the imputer's), what a per-slice
        breakdown averages."""
        deployed = self.deployed
        if hasattr(deployed, "row_accuracy_gain"):
            return {InferenceAttack.LABEL.value: np.asarray(deployed.row_accuracy_gain, dtype=np.float64)}
        imputed = np.asarray(self.imputation_row_correct, dtype=np.float64)
        return {a.attack.value: np.asarray(a.row_correct, dtype=np.float64) - imputed for a in deployed.attacks}


@dataclass(frozen=True, eq=False)
class LabelInferenceResult(_Verdict):
    """Label inference against the deployed context, and against the control when one was given."""

    deployed: LabelInferenceTarget
    control: LabelInferenceTarget | None
    n_references: int
    seed: int
    n_resamples: int
    exchangeable: bool | None = None  # the split's blind-baseline verdict; None: not measured (never trusted)

    def to_rows(self) -> list[dict[str, Any]]:
        """One dict per (target, group, statistic): ``attack``, ``target``, ``group``, ``statistic``, ``value``,
        ``low``, ``high``, ``confidence``, ``n_rows``, ``n_references``, ``found`` (the target's)."""
        rows: list[dict[str, Any]] = []
        for t in (self.deployed, self.control):
            if t is None:
                continue
            base = {"attack": InferenceAttack.LABEL.value, "target": t.target.value, "confidence": t.confidence,
                    "n_references": self.n_references, "found": t.found}
            for group, stats in ((InferenceGroup.MEMBERS, t.members), (InferenceGroup.NONMEMBERS, t.nonmembers)):
                for name in ("accuracy", "accuracy_without_row", "accuracy_gain", "confidence_gain"):
                    rows.append(_row(base, group, name, getattr(stats, name), stats.n_rows))
            n_all = t.members.n_rows + t.nonmembers.n_rows
            rows.append(_row(base, InferenceGroup.DIFFERENCE, "accuracy_gain", t.accuracy_gain_difference, n_all))
            rows.append(_row(base, InferenceGroup.DIFFERENCE, "confidence_gain", t.confidence_gain_difference, n_all))
        return rows


@dataclass(frozen=True)
class AttributeGroupStats:
    """One attribute attack over one group under one target context."""

    n_rows: int
    attack_accuracy: Estimate
    imputation_accuracy: Estimate
    gain: Estimate  # attack_accuracy - imputation_accuracy


@dataclass(frozen=True, eq=False)
class AttributeAttackStats:
    """One attribute attack under one target context."""

    attack: InferenceAttack
    members: AttributeGroupStats
    nonmembers: AttributeGroupStats
    gain_difference: Estimate  # members' gain minus non-members': the headline
    found: bool  # the lower bounds of members' gain and of the difference both above 0
    row_correct: np.ndarray  # float64 [n] aligned with P: the guess is the row's value (1/k among k tied)


@dataclass(frozen=True, eq=False)
class AttributeInferenceTarget:
    """The attribute attacks under one target context; ``confidence`` is each interval's (Bonferroni over the
    attacks)."""

    target: ContextTarget
    attacks: tuple[AttributeAttackStats, ...]
    confidence: float

    @property
    def found(self) -> bool:
        return any(a.found for a in self.attacks)

    def attack(self, attack: InferenceAttack) -> AttributeAttackStats:
        for a in self.attacks:
            if a.attack == InferenceAttack(attack):
                return a
        raise KeyError(attack)


@dataclass(frozen=True, eq=False)
class AttributeInferenceResult(_Verdict):
    """Attribute inference on one sensitive column against the deployed context, and the control's when given."""

    deployed: AttributeInferenceTarget
    control: AttributeInferenceTarget | None
    sensitive_column: int
    n_candidates: int
    binned: bool
    n_references: int
    seed: int
    n_resamples: int
    imputation_row_correct: np.ndarray  # float64 [n] aligned with P: the imputer's guess is the row's value
    n_imputation_rows: int
    exchangeable: bool | None = None  # the split's blind-baseline verdict; None: not measured (never trusted)

    def to_rows(self) -> list[dict[str, Any]]:
        """One dict per (target, attack, group, statistic): ``attack``, ``target``, ``group``, ``statistic``,
        ``value``, ``low``, ``high``, ``confidence``, ``n_rows``, ``n_references``, ``sensitive_column``,
        ``n_candidates``, ``binned``, ``found`` (the attack's under that target)."""
        rows: list[dict[str, Any]] = []
        for t in (self.deployed, self.control):
            if t is None:
                continue
            for a in t.attacks:
                base = {"attack": a.attack.value, "target": t.target.value, "confidence": t.confidence,
                        "n_references": self.n_references, "sensitive_column": self.sensitive_column,
                        "n_candidates": self.n_candidates, "binned": self.binned, "found": a.found}
                for group, stats in ((InferenceGroup.MEMBERS, a.members), (InferenceGroup.NONMEMBERS, a.nonmembers)):
                    for name in ("attack_accuracy", "imputation_accuracy", "gain"):
                        rows.append(_row(base, group, name, getattr(stats, name), stats.n_rows))
                rows.append(_row(base, InferenceGroup.DIFFERENCE, "gain", a.gain_difference,
                                 a.members.n_rows + a.nonmembers.n_rows))
        return rows


def _row(base: dict[str, Any], group: InferenceGroup, statistic: str, est: Estimate, n_rows: int) -> dict[str, Any]:
    return {**base, "group": group.value, "statistic": statistic, "value": est.value, "low": est.low,
            "high": est.high, "n_rows": n_rows}


# --------------------------------------------------------------------------------------------------
# the shared machinery: settings, scoring, ties, the bootstrap
# --------------------------------------------------------------------------------------------------


def _check_settings(n_references: int, n_resamples: int, confidence: float) -> None:
    if (isinstance(n_references, bool) or not isinstance(n_references, (int, np.integer)) or n_references < 2
            or n_references % 2 or n_references > MAX_REFERENCES):
        raise ProbeError(f"inference attacks: n_references={n_references!r}; need an even number from 2 to "
                         f"{MAX_REFERENCES} (every row is then out of exactly half of them)")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 0:
        raise ProbeError(f"inference attacks: n_resamples must be an integer >= 0, got {n_resamples!r}")
    if not 0.0 < float(confidence) < 1.0:
        raise ProbeError(f"inference attacks: confidence must lie in (0, 1), got {confidence!r}")


def _contexts(inputs: ContextAuditInputs) -> list[tuple[ContextTarget, np.ndarray, np.ndarray]]:
    """(target, context features, context labels): the deployed context, then the control's when given."""
    x, y = inputs.population_x, inputs.population_y
    out = [(ContextTarget.DEPLOYED, x[inputs.member], y[inputs.member])]
    if inputs.control_x is not None and inputs.control_y is not None:
        out.append((ContextTarget.CONTROL, inputs.control_x, inputs.control_y))
    return out


def _log_probs(scorer: ContextScorer, context_x: np.ndarray, context_y: np.ndarray, query_x: np.ndarray,
               n_classes: int) -> np.ndarray:
    """float64 [m, C]: the scorer's log-probabilities, shape- and NaN-checked, floored at LOG_P_FLOOR."""
    lp = np.asarray(scorer(context_x, context_y, query_x), dtype=np.float64)
    if lp.shape != (len(query_x), n_classes):
        raise ProbeError(f"inference attacks: the scorer returned log-probabilities {lp.shape} for {len(query_x)} "
                         f"queries over {n_classes} classes")
    if np.isnan(lp).any():
        raise ProbeError("inference attacks: the scorer returned NaN log-probabilities")
    return np.maximum(lp, LOG_P_FLOOR)


def _expected_hit(scores: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """float64 [..., n]: scores [..., V, n] over V choices for n rows; the chance that the argmax, ties broken
    uniformly, is ``truth`` [n]: 1/k when the true choice is among k tied best, else 0."""
    best = scores.max(axis=-2, keepdims=True)
    top = scores >= best - TIE_TOLERANCE
    on_truth = np.take_along_axis(top, np.broadcast_to(truth, top.shape[:-2] + (1, truth.size)), axis=-2)[..., 0, :]
    return np.asarray(on_truth / top.sum(axis=-2), dtype=np.float64)


def _mean_out(values: np.ndarray, out: np.ndarray) -> np.ndarray:
    """[..., n]: the mean of ``values`` [K, ..., n] over the references that lack each row (``out`` bool [K, n])."""
    w = out.astype(np.float64)
    w = w.reshape(w.shape[:1] + (1,) * (values.ndim - 2) + w.shape[1:])
    return np.asarray((values * w).sum(axis=0) / w.sum(axis=0), dtype=np.float64)


class _Resamples:
    """The stratified bootstrap of one target: every statistic is a mean over members, over non-members, or the
    difference of the two, each taken on the same resamples."""

    def __init__(self, member: np.ndarray, n_resamples: int, seed: int, confidence: float,
                 scored: np.ndarray | None = None) -> None:
        # scored (bool, aligned with member): the rows a statistic is taken over; None: every row
        kept = np.ones(len(member), dtype=bool) if scored is None else np.asarray(scored, dtype=bool)
        self.members = np.flatnonzero(member & kept)
        self.nonmembers = np.flatnonzero(~member & kept)
        mi, ni = bootstrap_indices(self.members.size, self.nonmembers.size, n_resamples, seed)
        self.member_idx = self.members[mi]  # [B, n_members], positions in P
        self.nonmember_idx = self.nonmembers[ni]
        self.confidence = confidence

    def _interval(self, replicates: np.ndarray) -> Interval:
        # the percentile interval, as iclmem.stats' bootstrap intervals take it
        if replicates.size == 0:
            return NAN_INTERVAL
        tail = (1.0 - self.confidence) / 2.0 * 100.0
        lo, hi = np.percentile(replicates, [tail, 100.0 - tail])
        return Interval(float(lo), float(hi))

    def group(self, values: np.ndarray, group: InferenceGroup) -> Estimate:
        rows, idx = ((self.members, self.member_idx) if group == InferenceGroup.MEMBERS
                     else (self.nonmembers, self.nonmember_idx))
        ci = self._interval(values[idx].mean(axis=1))
        return Estimate(float(values[rows].mean()), ci.low, ci.high)

    def difference(self, values: np.ndarray) -> Estimate:
        value = float(values[self.members].mean() - values[self.nonmembers].mean())
        ci = self._interval(values[self.member_idx].mean(axis=1) - values[self.nonmember_idx].mean(axis=1))
        return Estimate(value, ci.low, ci.high)


def gain_by_group(gains: Any, member: Any, *, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                  confidence: float = DEFAULT_CONFIDENCE) -> tuple[Estimate, Estimate]:
    """(members' mean gain, members' minus non-members' mean gain) of per-row gains (:meth:`row_gains` of a
    result, or a slice of them), with stratified percentile bootstrap intervals at ``confidence``: what a
    per-slice breakdown of a value-inference audit reports."""
    g = np.asarray(gains, dtype=np.float64)
    m = np.asarray(member, dtype=bool)
    if g.shape != m.shape or not m.any() or m.all():
        raise ProbeError(f"inference attacks: {g.shape} gains for {m.shape} member flags; both groups needed")
    _check_settings(2, int(n_resamples), float(confidence))
    boot = _Resamples(m, int(n_resamples), seed, float(confidence))
    return boot.group(g, InferenceGroup.MEMBERS), boot.difference(g)


def _found(members_gain: Estimate, difference: Estimate) -> bool:
    return bool(members_gain.low > 0.0 and difference.low > 0.0)  # nan bounds (no resamples): never found


# --------------------------------------------------------------------------------------------------
# label inference
# --------------------------------------------------------------------------------------------------


def label_inference(scorer: ContextScorer, inputs: ContextAuditInputs, *, n_references: int, seed: int = 0,
                    n_resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE,
                    exchangeable: bool | None = None) -> LabelInferenceResult:
    """Label inference against the deployed context and (when ``inputs`` has one) the control: K + 1 or K + 2
    scorer calls, each on all of P (see the module's docstring). ``exchangeable``: the split's blind-baseline
    verdict (``probes.probe_columns.blind_columns``' ``exchangeable``, as the membership audit reads it); None, not
    measured, leaves the result untrusted."""
    _check_settings(n_references, n_resamples, confidence)
    x, y, c = inputs.population_x, inputs.population_y, inputs.n_classes
    masks = reference_contexts(len(y), int(n_references), seed)
    ref_lp = np.stack([_log_probs(scorer, x[m], y[m], x, c) for m in masks])  # [K, n, C]
    ref_hit = _expected_hit(ref_lp.transpose(0, 2, 1), y)  # [K, n]
    ref_conf = ref_lp[:, np.arange(len(y)), y]  # [K, n]
    out = ~masks
    hit_without, conf_without = _mean_out(ref_hit, out), _mean_out(ref_conf, out)
    targets = []
    for target, cx, cy in _contexts(inputs):
        lp = _log_probs(scorer, cx, cy, x, c)
        hit = _expected_hit(lp.T, y)
        acc_gain = hit - hit_without
        conf_gain = true_label_log_p(lp, y) - conf_without
        boot = _Resamples(inputs.member, int(n_resamples), seed, float(confidence))
        groups = {g: LabelGroupStats(int(idx.size), boot.group(hit, g), boot.group(hit_without, g),
                                     boot.group(acc_gain, g), boot.group(conf_gain, g))
                  for g, idx in ((InferenceGroup.MEMBERS, boot.members), (InferenceGroup.NONMEMBERS, boot.nonmembers))}
        acc_diff = boot.difference(acc_gain)
        members = groups[InferenceGroup.MEMBERS]
        targets.append(LabelInferenceTarget(target, members, groups[InferenceGroup.NONMEMBERS], acc_diff,
                                            boot.difference(conf_gain), float(confidence),
                                            _found(members.accuracy_gain, acc_diff), _frozen(acc_gain),
                                            _frozen(conf_gain)))
    return LabelInferenceResult(targets[0], targets[1] if len(targets) > 1 else None, int(n_references), int(seed),
                                int(n_resamples), _exchangeable(exchangeable))


def _exchangeable(value: bool | None) -> bool | None:
    return None if value is None else bool(value)


def _frozen(a: np.ndarray) -> np.ndarray:
    out = np.array(a, dtype=np.float64)
    out.flags.writeable = False
    return out


# --------------------------------------------------------------------------------------------------
# attribute inference
# --------------------------------------------------------------------------------------------------


def _imputer_features(x: np.ndarray, y: np.ndarray, columns: tuple[int, ...], n_classes: int) -> np.ndarray:
    """The imputer's inputs: every feature but the sensitive ones (a one-hot column's every indicator), and the
    one-hot label."""
    return np.hstack([np.delete(x, list(columns), axis=1).astype(np.float64), np.eye(n_classes)[y]])


def _default_imputer() -> Any:
    # Multinomial logistic regression on standardised features: well defined on a pool of a few dozen rows,
    # deterministic, with no neighbourhood size or bandwidth to tune, and unable to memorise a row it could
    # later be asked about. It is the baseline a data holder can always reproduce; where the column depends on
    # the others non-linearly, pass a stronger ``imputer`` (k-NN, boosting): a weak imputer inflates the gain.
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))


def _imputation_scores(pool: ImputationPool, attribute: SensitiveAttribute, inputs: ContextAuditInputs,
                       imputer: Any) -> np.ndarray:
    """float64 [V, n]: the imputer's probability of each candidate for each row of P (0 for a candidate the
    pool never shows, so it is never the imputer's guess)."""
    s, c = attribute.feature_columns, inputs.n_classes
    truth = attribute.truth(pool.x, "imputation pool values")
    if pool.y.min() < 0 or pool.y.max() >= c:
        raise DataError(f"attribute inference: imputation pool labels must lie in 0..{c - 1}")
    query = _imputer_features(inputs.population_x, inputs.population_y, s, c)
    scores = np.zeros((attribute.n_candidates, len(query)))
    seen = np.unique(truth)
    if seen.size == 1:  # a pool with one value: the imputer can only guess it
        scores[seen[0]] = 1.0
        return scores
    from sklearn.base import clone

    model = clone(imputer) if imputer is not None else _default_imputer()
    model.fit(_imputer_features(pool.x, pool.y, s, c), truth)
    proba = np.asarray(model.predict_proba(query), dtype=np.float64)
    scores[np.asarray(model.classes_, dtype=np.int64)] = proba.T
    return scores


def attribute_inference(scorer: ContextScorer, inputs: ContextAuditInputs, attribute: SensitiveAttribute,
                        pool: ImputationPool, *, n_references: int, seed: int = 0,
                        n_resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE,
                        imputer: Any = None, exchangeable: bool | None = None,
                        scored: np.ndarray | None = None) -> AttributeInferenceResult:
    """Attribute inference on ``attribute``'s column against the deployed context and (when ``inputs`` has one)
    the control, with the imputation baseline fitted on ``pool`` (``imputer``: an unfitted scikit-learn
    classifier with ``predict_proba``, cloned; default standardised logistic regression). (K + 2) * V scorer
    calls, each on all of P with the sensitive column set to one candidate (see the module's docstring).
    ``exchangeable``: as for :func:`label_inference`. ``scored`` (bool [n], aligned with P; None: every row): the
    rows whose sensitive value is their own; a row whose cell was missing in the table holds what Stage I filled
    in, no secret to infer, so it stays in the contexts (as the deployed model holds it) and out of every
    statistic."""
    _check_settings(n_references, n_resamples, confidence)
    x, y, c = inputs.population_x, inputs.population_y, inputs.n_classes
    if scored is not None:
        scored = np.asarray(scored, dtype=bool).reshape(-1)
        if scored.size != len(y):
            raise DataError(f"attribute inference: {scored.size} scored flags for {len(y)} rows of P")
        for group, rows in (("members", inputs.member), ("non-members", ~inputs.member)):
            if int((scored & rows).sum()) < 2:
                raise DataError(f"attribute inference: {int((scored & rows).sum())} of the {int(rows.sum())} audited "
                                f"{group} have a value in the sensitive column (the others were missing in the "
                                "table); at least 2 needed")
    for column in attribute.feature_columns:
        check_column(column, x.shape[1])
    if pool.x.shape[1] != x.shape[1]:
        raise DataError(f"attribute inference: the imputation pool has {pool.x.shape[1]} features, the population "
                        f"{x.shape[1]}")
    truth = attribute.truth(x, "population values")
    imputation_hit = _expected_hit(_imputation_scores(pool, attribute, inputs, imputer), truth)
    # P with the sensitive column set to each candidate: [V] x [n, F]
    queries = [attribute.with_candidate(x, j) for j in range(attribute.n_candidates)]

    def candidate_log_p(cx: np.ndarray, cy: np.ndarray) -> np.ndarray:  # [V, n]: log p(y* | x_v, context)
        return np.stack([true_label_log_p(_log_probs(scorer, cx, cy, q, c), y) for q in queries])

    masks = reference_contexts(len(y), int(n_references), seed)
    ref_without = _mean_out(np.stack([candidate_log_p(x[m], y[m]) for m in masks]), ~masks)  # [V, n]
    level = 1.0 - (1.0 - float(confidence)) / len(ATTRIBUTE_ATTACKS)  # Bonferroni over the attacks
    targets = []
    for target, cx, cy in _contexts(inputs):
        target_lp = candidate_log_p(cx, cy)
        boot = _Resamples(inputs.member, int(n_resamples), seed, level, scored)
        attacks = []
        for attack, scores in ((InferenceAttack.ATTRIBUTE_MODEL, target_lp),
                               (InferenceAttack.ATTRIBUTE_CALIBRATED, target_lp - ref_without)):
            hit = _expected_hit(scores, truth)
            gain = hit - imputation_hit
            groups = {g: AttributeGroupStats(int(idx.size), boot.group(hit, g), boot.group(imputation_hit, g),
                                             boot.group(gain, g))
                      for g, idx in ((InferenceGroup.MEMBERS, boot.members),
                                     (InferenceGroup.NONMEMBERS, boot.nonmembers))}
            diff = boot.difference(gain)
            members = groups[InferenceGroup.MEMBERS]
            attacks.append(AttributeAttackStats(attack, members, groups[InferenceGroup.NONMEMBERS], diff,
                                                _found(members.gain, diff), _frozen(hit)))
        targets.append(AttributeInferenceTarget(target, tuple(attacks), level))
    return AttributeInferenceResult(targets[0], targets[1] if len(targets) > 1 else None, attribute.column,
                                    attribute.n_candidates, attribute.is_binned, int(n_references), int(seed),
                                    int(n_resamples), _frozen(imputation_hit), int(len(pool.y)),
                                    _exchangeable(exchangeable))

