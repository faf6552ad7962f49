"""Label and attribute inference against a deployed in-context learner, each as a gain over what the attacker
gets without the model holding the row, with intervals, an imputation baseline and a never-in-context control.

Membership inference (:mod:`probes.context_audit`) asks whether a row was in the context. A data holder often
fears something else: that the deployed model gives away a *value* of a row it holds -- its label, or one
sensitive column -- to someone who knows the rest of the row. Jayaraman & Evans ("Are attribute inference attacks
just imputation?", CCS 2022) show that most of what such attacks recover is recovered as well by imputing the
value from the data distribution, without the model. So both attacks here are reported as *gains*: the attack's
success on a row minus the success of the same attacker without that row in the model, and members against
non-members.

Threat model and design (same population as the context audit, :class:`~probes.context_audit.ContextAuditInputs`):

* **P**: n = 2N rows, features float32 [n, F], labels int64 [n], member flags bool [n]; the deployed context
  is the members. The attacker knows a target row's features (all of them for label inference, all but the
  sensitive column for attribute inference) and its label (attribute inference only), and can query the
  deployed model; rows are identified by their position in P, never by their values.
* **References**: K contexts (K even, >= 2) from :func:`~probes.context_audit.reference_contexts`,
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
  (:class:`SensitiveAttribute`: categorical codes, or the bin centres of a numeric column binned at population
  quantiles, :func:`bin_numeric`; a row's true candidate is its code, or its own bin). For each candidate v the
  attacker sets x[s] = v and queries log p(y* | x_v, context) with the row's known label y*.
  :data:`InferenceAttack.ATTRIBUTE_MODEL` guesses the v with the highest value;
  :data:`InferenceAttack.ATTRIBUTE_CALIBRATED` the v with the highest value minus its mean under the
  references without the row (what the deployed model says about v beyond what the same model without the row
  says). The **imputation baseline** predicts the candidate from the other features and the one-hot label with
  a classifier fitted on an auxiliary pool of rows the caller gives (:class:`ImputationPool`: rows of the table
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
  ``trusted`` by the membership audit's rule (:func:`~probes.context_audit.distrust_reasons`): its control was
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
:class:`~probes.context_audit.ContextScorer` the caller gives. Results hold rates, intervals and per-row
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
from probes.context_audit import (
    LOG_P_FLOOR,
    MAX_REFERENCES,
    ContextAuditInputs,
    ContextScorer,
    distrust_reasons,
    reference_contexts,
    true_label_log_p,
)

__all__ = ["ATTRIBUTE_ATTACKS", "DEFAULT_CONFIDENCE", "AttributeAttackStats", "AttributeGroupStats", "AttributeInferenceResult",
           "AttributeInferenceTarget", "Estimate", "ImputationPool",
           "LabelGroupStats", "LabelInferenceResult", "LabelInferenceTarget", "SensitiveAttribute",
           "MIN_SLICE_SIDE", "ValueSliceTest", "attribute_inference", "bin_numeric", "gain_by_group", "label_inference",
           "value_slice_test"]


ATTRIBUTE_ATTACKS: tuple[InferenceAttack, ...] = (InferenceAttack.ATTRIBUTE_MODEL, InferenceAttack.ATTRIBUTE_CALIBRATED)
DEFAULT_CONFIDENCE = 0.95
# scores this close to a row's best count as tied with it (log-probabilities: far below any real difference, above
# the round-off of a mean over references)
TIE_TOLERANCE = 1e-9


# --------------------------------------------------------------------------------------------------
# the sensitive column and the imputation pool
# --------------------------------------------------------------------------------------------------


def _quantile_edges(fit_values: np.ndarray, n_bins: int) -> np.ndarray:
    """float64 [<= n_bins - 1]: interior edges at the quantiles of ``fit_values`` (bin b: edges[b-1] <= v <
    edges[b]), tied quantiles merged and any edge that would leave a bin without a fit value dropped."""
    edges = np.unique(np.quantile(fit_values, np.linspace(0.0, 1.0, n_bins + 1)[1:-1]))
    while edges.size:
        counts = np.bincount(np.searchsorted(edges, fit_values, side="right"), minlength=edges.size + 1)
        empty = np.flatnonzero(counts == 0)
        if not empty.size:
            break
        b = int(empty[0])
        edges = np.delete(edges, max(b - 1, 0))  # merge the empty bin into its lower neighbour (bin 0: its upper)
    return np.asarray(edges, dtype=np.float64)


def _finite_column(values: Any, name: str) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        raise DataError(f"{name}: no values")
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
        raise DataError(f"{name}: {bad.size} of {v.size} values are missing or infinite (first at row {int(bad[0])})")
    return v


def bin_numeric(values: Any, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """A numeric column cut into at most ``n_bins`` bins at its own quantiles: (bin index int64 [n], centres
    float64 [B]), a centre being the mean of the values in its bin. Tied values never straddle an edge, so a
    column with few distinct values gets fewer bins (each holding at least one value); fewer than 2 is refused."""
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 2:
        raise ProbeError(f"bin_numeric: n_bins must be an integer >= 2, got {n_bins!r}")
    v = _finite_column(values, "bin_numeric: values")
    edges = _quantile_edges(v, int(n_bins))
    if edges.size == 0:
        raise DataError("bin_numeric: the column has a single distinct value: nothing to infer")
    index = np.searchsorted(edges, v, side="right").astype(np.int64)
    centres = np.bincount(index, weights=v) / np.bincount(index)
    return index, centres


@dataclass(frozen=True, eq=False)
class SensitiveAttribute:
    """The column the attacker wants and the values it tries. ``candidates`` float [V]: the codes of a categorical
    column, or the bin centres of a binned numeric one. ``edges`` None: a row's true candidate is the candidate
    its value equals (any other value is refused); else float64 [V - 1], the interior bin edges, and a row's true
    candidate is its bin. Build one with :meth:`categorical` or :meth:`binned`."""

    column: int
    candidates: np.ndarray  # float32 [V]
    edges: np.ndarray | None = None  # float64 [V - 1] (binned numeric)

    def __post_init__(self) -> None:
        if isinstance(self.column, bool) or not isinstance(self.column, (int, np.integer)) or self.column < 0:
            raise ProbeError(f"attribute inference: sensitive_column must be a column index >= 0, got {self.column!r}")
        c = np.asarray(self.candidates, dtype=np.float32).reshape(-1)
        if c.size < 2:
            raise ProbeError(f"attribute inference: {c.size} candidate value(s); need >= 2 (one is no secret)")
        if not np.isfinite(c).all() or np.unique(c).size != c.size:
            raise ProbeError("attribute inference: the candidates must be finite and distinct")
        c.flags.writeable = False
        object.__setattr__(self, "column", int(self.column))
        object.__setattr__(self, "candidates", c)
        if self.edges is not None:
            e = np.asarray(self.edges, dtype=np.float64).reshape(-1)
            if e.size != c.size - 1 or not np.isfinite(e).all() or (np.diff(e) <= 0).any():
                raise ProbeError(f"attribute inference: a binned column needs {c.size - 1} increasing finite edges for"
                                 f" {c.size} candidates, got {e.size}")
            e.flags.writeable = False
            object.__setattr__(self, "edges", e)

    @property
    def n_candidates(self) -> int:
        return int(self.candidates.size)

    @property
    def is_binned(self) -> bool:
        return self.edges is not None

    def index_of(self, values: Any, name: str = "values") -> np.ndarray:
        """int64 [m]: each value's candidate (its bin, for a binned column); a categorical value that is not a
        candidate is refused (the message names rows, never values)."""
        v = _finite_column(values, f"attribute inference: {name} of column {self.column}")
        if self.edges is not None:
            return np.searchsorted(self.edges, v, side="right").astype(np.int64)
        v32 = v.astype(np.float32)
        order = np.argsort(self.candidates, kind="stable")
        ranked = self.candidates[order]
        pos = np.clip(np.searchsorted(ranked, v32), 0, ranked.size - 1)
        missing = np.flatnonzero(ranked[pos] != v32)
        if missing.size:
            raise DataError(f"attribute inference: {missing.size} of {v.size} {name} of column {self.column} are not"
                            f" among the {ranked.size} candidates (first at row {int(missing[0])})")
        return np.asarray(order[pos], dtype=np.int64)

    @classmethod
    def categorical(cls, population_x: Any, column: int, candidates: Any = None) -> SensitiveAttribute:
        """A categorical column: the candidates are ``candidates`` (e.g. every code of the table's column) or,
        by default, the distinct values the population holds."""
        x = _matrix(population_x, "population_x")
        _check_column(column, x.shape[1])
        values = _finite_column(x[:, column], f"attribute inference: column {column}")
        c = np.unique(values.astype(np.float32)) if candidates is None else candidates
        attribute = cls(column, np.asarray(c))
        attribute.index_of(values, "population values")  # refuses a population value that is not a candidate
        return attribute

    @classmethod
    def binned(cls, population_x: Any, column: int, n_bins: int) -> SensitiveAttribute:
        """A numeric column binned at the population's quantiles (:func:`bin_numeric`): the candidates are the
        bin centres, a row's true candidate is its own bin."""
        x = _matrix(population_x, "population_x")
        _check_column(column, x.shape[1])
        values = _finite_column(x[:, column], f"attribute inference: column {column}")
        _, centres = bin_numeric(values, n_bins)
        return cls(column, centres, _quantile_edges(values, int(n_bins)))


@dataclass(frozen=True, eq=False)
class ImputationPool:
    """Rows the imputation baseline is fitted on: features float32 [M, F] (the sensitive column included: its
    value is what the imputer learns to predict) and labels int64 [M]. Never the audited rows: the control's
    rows, or rows of the table outside P and every context."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        x = np.asarray(self.x, dtype=np.float32)
        y = np.asarray(self.y, dtype=np.int64).reshape(-1)
        if x.ndim != 2 or x.shape[0] == 0:
            raise DataError(f"attribute inference: the imputation pool is empty or not a matrix (features {x.shape});"
                            " the baseline needs rows outside P")
        if y.shape != (x.shape[0],):
            raise DataError(f"attribute inference: imputation pool features {x.shape} with labels {y.shape}")
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "y", y)


def _matrix(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim != 2:
        raise ProbeError(f"{name}: need a matrix [n, F], got shape {arr.shape}")
    return arr


def _check_column(column: int, n_features: int) -> None:
    if isinstance(column, bool) or not isinstance(column, (int, np.integer)) or not 0 <= column < n_features:
        raise ProbeError(f"attribute inference: sensitive_column {column!r} out of range for {n_features} features")


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

    @property
    def found(self) -> bool:
        return bool(self.deployed.found)

    @property
    def distrust(self) -> list[str]:
        """Why the result is not trusted (:func:`~probes.context_audit.distrust_reasons`); empty: trusted."""
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

    def __init__(self, member: np.ndarray, n_resamples: int, seed: int, confidence: float) -> None:
        self.members = np.flatnonzero(member)
        self.nonmembers = np.flatnonzero(~member)
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


# A value slice needs this many members and as many non-members to be tested: the sign-flip test of the members'
# gain on n members cannot give a p below 2**-n, and at 8 that floor (1/256 = 0.0039) is below the Bonferroni
# level over 10 slices (0.05 / 10 = 0.005); the permutation test's floor, 1 / C(16, 8) = 1.3e-5, is lower still.
# A smaller slice could never be exposed at that level, so it reads "too small to test" instead of "not exposed".
MIN_SLICE_SIDE = 8
DEFAULT_PERMUTATIONS = 9999  # Monte-Carlo draws where exact enumeration would take more (p resolution 1e-4)


@dataclass(frozen=True)
class ValueSliceTest:
    """The per-slice test of a value-inference audit's row gains (:func:`value_slice_test`). ``p_members``: the
    one-sided sign-flip p of the members' mean gain > 0; ``p_difference``: the one-sided permutation p of the
    members' mean gain > the non-members'; both nan when the slice is ``too_small`` (fewer than ``min_side``
    members or non-members). ``exposed``: both p-values at or below the slice's level (an intersection-union
    test: under no member effect, members and non-members exchangeable, the permutation test alone holds the
    level, whatever the gains' distribution)."""

    n_members: int
    n_nonmembers: int
    members_gain: float  # the members' mean gain (nan: no member)
    gain_difference: float  # the members' mean gain minus the non-members' (nan: a group is empty)
    p_members: float
    p_difference: float
    too_small: bool
    exposed: bool


def _is_count(value: Any, least: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= least


def _sign_flip_p(g: np.ndarray, permutations: int, rng: np.random.Generator) -> float:
    """One-sided p of sum(g) > 0 against the sign-flips of g: exact over all 2^n flips when there are at most
    ``permutations + 1`` of them, else Monte-Carlo (1 + #{flips at least as large}) / (1 + permutations)."""
    observed = float(g.sum())
    tol = 1e-9 * max(1.0, float(np.abs(g).sum()))  # round-off in the sums never counts against the observed
    n = g.size
    if 2 ** n <= permutations + 1:
        signs = 1.0 - 2.0 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)  # every sign vector, identity first
        return float(np.mean(signs @ g >= observed - tol))
    signs = rng.choice(np.array([-1.0, 1.0]), size=(int(permutations), n))
    return float((1 + np.sum(signs @ g >= observed - tol)) / (1 + int(permutations)))


def _combinations(n: int, k: int) -> np.ndarray:
    """int64 [C(n, k), k]: every k-subset of range(n)."""
    import itertools

    return np.array(list(itertools.combinations(range(n), k)), dtype=np.int64).reshape(-1, k)


def _permutation_p(g: np.ndarray, member: np.ndarray, permutations: int, rng: np.random.Generator) -> float:
    """One-sided p of the members' mean gain minus the non-members' against relabellings of the rows (the number of
    members fixed): exact over all C(n, m) member sets when there are at most ``permutations + 1``, else
    Monte-Carlo (1 + #{relabellings at least as large}) / (1 + permutations). With the group sizes fixed the
    difference grows with the members' sum, which is the statistic compared."""
    import math

    m = int(member.sum())
    observed = float(g[member].sum())
    tol = 1e-9 * max(1.0, float(np.abs(g).sum()))
    if math.comb(g.size, m) <= permutations + 1:
        return float(np.mean(g[_combinations(g.size, m)].sum(axis=1) >= observed - tol))
    shuffled = rng.permuted(np.broadcast_to(g, (int(permutations), g.size)), axis=1)
    return float((1 + np.sum(shuffled[:, :m].sum(axis=1) >= observed - tol)) / (1 + int(permutations)))


def value_slice_test(gain: Any, member: Any, *, alpha_slice: float, permutations: int = DEFAULT_PERMUTATIONS,
                     seed: int = 0, min_side: int = MIN_SLICE_SIDE) -> ValueSliceTest:
    """Whether a slice's members give their values away (:class:`ValueSliceTest`): per-row gains float [n] (a
    value-inference result's :meth:`row_gains`, restricted to the slice's rows) and member flags bool [n]. Exact
    small-sample tests in place of a bootstrap interval, which on a few rows a side is far too narrow:
    the sign-flip test of the members' mean gain and the permutation test of members against non-members, each
    enumerated exactly when it has at most ``permutations + 1`` arrangements, else drawn ``permutations`` times
    (from ``seed``). ``alpha_slice`` is the slice's level, the family's Bonferroni share already taken (e.g.
    0.05 / slices). Below ``min_side`` rows a side (:data:`MIN_SLICE_SIDE`, 8, by default: see there) the slice
    is too small to test: nan p-values, never exposed."""
    g = np.asarray(gain, dtype=np.float64)
    m = np.asarray(member)
    if g.ndim != 1 or m.shape != g.shape or m.dtype != np.bool_:
        raise ProbeError(f"value slice test: gains {g.shape} and member flags {m.shape} ({m.dtype}) must be 1-d of "
                         "one length, the flags boolean")
    if not np.isfinite(g).all():
        raise ProbeError("value slice test: a gain is missing or infinite")
    if not 0.0 < float(alpha_slice) < 1.0:
        raise ProbeError(f"value slice test: alpha_slice must lie in (0, 1), got {alpha_slice!r}")
    if not _is_count(permutations, 1) or not _is_count(min_side, 1):
        raise ProbeError(f"value slice test: permutations and min_side must be integers >= 1, got {permutations!r}, "
                         f"{min_side!r}")
    n_m, n_n = int(m.sum()), int((~m).sum())
    members_gain = float(g[m].mean()) if n_m else float("nan")
    difference = members_gain - float(g[~m].mean()) if n_m and n_n else float("nan")
    if n_m < min_side or n_n < min_side:
        return ValueSliceTest(n_m, n_n, members_gain, difference, float("nan"), float("nan"), True, False)
    rng = np.random.default_rng(seed)
    p_members = _sign_flip_p(g[m], int(permutations), rng)
    p_difference = _permutation_p(g, m, int(permutations), rng)
    exposed = bool(p_members <= alpha_slice and p_difference <= alpha_slice)
    return ValueSliceTest(n_m, n_n, members_gain, difference, p_members, p_difference, False, exposed)


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
    verdict (``probes.probe.blind_columns``' ``exchangeable``, as the membership audit reads it); None, not
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


def _imputer_features(x: np.ndarray, y: np.ndarray, column: int, n_classes: int) -> np.ndarray:
    """The imputer's inputs: every feature but the sensitive one, and the one-hot label."""
    return np.hstack([np.delete(x, column, axis=1).astype(np.float64), np.eye(n_classes)[y]])


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
    s, c = attribute.column, inputs.n_classes
    truth = attribute.index_of(pool.x[:, s], "imputation pool values")
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
                        imputer: Any = None, exchangeable: bool | None = None) -> AttributeInferenceResult:
    """Attribute inference on ``attribute``'s column against the deployed context and (when ``inputs`` has one)
    the control, with the imputation baseline fitted on ``pool`` (``imputer``: an unfitted scikit-learn
    classifier with ``predict_proba``, cloned; default standardised logistic regression). (K + 2) * V scorer
    calls, each on all of P with the sensitive column set to one candidate (see the module's docstring).
    ``exchangeable``: as for :func:`label_inference`."""
    _check_settings(n_references, n_resamples, confidence)
    x, y, c = inputs.population_x, inputs.population_y, inputs.n_classes
    _check_column(attribute.column, x.shape[1])
    if pool.x.shape[1] != x.shape[1]:
        raise DataError(f"attribute inference: the imputation pool has {pool.x.shape[1]} features, the population "
                        f"{x.shape[1]}")
    truth = attribute.index_of(x[:, attribute.column], "population values")
    imputation_hit = _expected_hit(_imputation_scores(pool, attribute, inputs, imputer), truth)
    queries = []
    for v in attribute.candidates:  # P with the sensitive column set to each candidate: [V] x [n, F]
        q = x.copy()
        q[:, attribute.column] = v
        queries.append(q)

    def candidate_log_p(cx: np.ndarray, cy: np.ndarray) -> np.ndarray:  # [V, n]: log p(y* | x_v, context)
        return np.stack([true_label_log_p(_log_probs(scorer, cx, cy, q, c), y) for q in queries])

    masks = reference_contexts(len(y), int(n_references), seed)
    ref_without = _mean_out(np.stack([candidate_log_p(x[m], y[m]) for m in masks]), ~masks)  # [V, n]
    level = 1.0 - (1.0 - float(confidence)) / len(ATTRIBUTE_ATTACKS)  # Bonferroni over the attacks
    targets = []
    for target, cx, cy in _contexts(inputs):
        target_lp = candidate_log_p(cx, cy)
        boot = _Resamples(inputs.member, int(n_resamples), seed, level)
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

