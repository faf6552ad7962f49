"""The blind baseline: how well members and non-members can be told apart without the audited model.

A membership test compares two groups that should differ in one thing only: whether the model trained on
them. If the groups already differ before training (members scored on permuted labels, non-members on
true ones, as in the paper's ``shuffled_members`` design), any change of the model's accuracy or
confidence reads as membership. The blind baseline measures that: a multinomial logistic regression fitted
on the fine-tuning context C' alone (its features and the labels it is trained with) scores every query on
the label it is probed with; the statistic is that query's loss ``-log p(y_probed | x)``.

Orientation: members are the positive class and a *higher* blind loss counts as member-like (the labels
of the members are the harder ones to predict from C' when only they were permuted), so the paper's
unmatched design reads well above 0.5. Either direction away from 0.5 means the groups are separable
without the model; :attr:`BlindBaseline.separable` is the two-sided test (the 95% stratified-bootstrap
interval excludes 0.5). Stage I measures it on every draw of a split and redraws a separable one
(:mod:`trainables.data.split`); every probe row reports it (``probes.probe_columns.blind_columns``). Pure numpy /
scikit-learn (imported on use); no Ray, no torch.

Shapes: context features float32 [n_context, F] with labels int64 [n_context]; query features float32
[n, F] with labels int64 [n] and member flags bool [n].
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from iclmem.errors import ProbeError
from iclmem.stats import DEFAULT_RESAMPLES, auc, bootstrap_intervals
from iclmem.vocab import LabelDesign

__all__ = ["BlindBaseline", "exchangeable", "blind_losses", "blind_baseline", "blind_fit_rows", "task_blind_baseline",
           "compute_task_blind_baseline", "BLIND_RESAMPLES", "BLIND_SEED"]

# The blind losses are rounded to this many decimals before ranking, so that the last bits of the
# logistic regression's fit (which differ between CPUs' vector units) cannot reorder two queries and move
# the AUC, and with it Stage I's redraw decision, from one machine to another.
_LOSS_DECIMALS = 6
_P_FLOOR = 1e-12
BLIND_RESAMPLES = DEFAULT_RESAMPLES  # stratified bootstrap resamples of the blind AUC's interval
BLIND_SEED = 0


@dataclass(frozen=True)
class BlindBaseline:
    """Members-vs-non-members AUC of the C'-only scorer, with its 95% stratified-bootstrap interval."""

    auc: float
    auc_low: float
    auc_high: float
    n_members: int
    n_nonmembers: int

    @property
    def separable(self) -> bool:
        """True when the interval excludes 0.5: the groups differ before any training."""
        return bool(self.auc_low > 0.5 or self.auc_high < 0.5)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BlindBaseline:
        return cls(float(data["auc"]), float(data["auc_low"]), float(data["auc_high"]), int(data["n_members"]),
                   int(data["n_nonmembers"]))

    def columns(self, prefix: str = "blind_") -> dict[str, Any]:
        """The results-row columns: ``blind_auc``, ``blind_auc_low``, ``blind_auc_high``, ``blind_separable``."""
        return {f"{prefix}auc": self.auc, f"{prefix}auc_low": self.auc_low, f"{prefix}auc_high": self.auc_high,
                f"{prefix}separable": self.separable}


def exchangeable(label_design: str, blind: BlindBaseline | None) -> bool:
    """The one rule for whether a split's members and non-members are exchangeable before any training: a
    label design that treats both groups alike (not the paper's unmatched ``shuffled_members``) and, where
    the blind baseline was measured, an interval that contains 0.5. No membership claim and no ε lower
    bound rests on a split for which this is False. ``label_design`` is a ``LabelDesign`` value."""
    return LabelDesign(label_design) != LabelDesign.UNMATCHED and not (blind is not None and blind.separable)


def blind_losses(context_x: np.ndarray, context_y: np.ndarray, query_x: np.ndarray, query_y: np.ndarray,
                 n_classes: int) -> np.ndarray:
    """float64 [n]: each query's loss -log p(y | x) under a logistic regression fitted on C' alone."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    cx = np.asarray(context_x, dtype=np.float64)
    cy = np.asarray(context_y, dtype=np.int64)
    qx = np.asarray(query_x, dtype=np.float64)
    qy = np.asarray(query_y, dtype=np.int64)
    if cx.ndim != 2 or qx.ndim != 2 or cx.shape[1] != qx.shape[1] or len(cx) != len(cy) or len(qx) != len(qy):
        raise ProbeError(f"blind baseline: context {cx.shape} / {cy.shape} and queries {qx.shape} / {qy.shape} "
                         "do not fit together")
    present = np.unique(cy)
    p = np.full((len(qx), int(n_classes)), _P_FLOOR)
    if len(present) < 2:
        p[:, present] = 1.0  # a one-class context predicts its class for everything
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = LogisticRegression(C=1.0, max_iter=2000).fit(cx, cy)
        p[:, model.classes_] = np.maximum(model.predict_proba(qx), _P_FLOOR)
    loss: np.ndarray = np.round(-np.log(p[np.arange(len(qy)), qy]), _LOSS_DECIMALS)
    return loss


def blind_baseline(context_x: np.ndarray, context_y: np.ndarray, query_x: np.ndarray, query_y: np.ndarray,
                   member: np.ndarray, n_classes: int, n_resamples: int = BLIND_RESAMPLES,
                   seed: int = BLIND_SEED) -> BlindBaseline:
    """The blind AUC (members positive, higher blind loss = member-like) and its bootstrap interval."""
    member = np.asarray(member, dtype=bool)
    if member.all() or not member.any():
        raise ProbeError("blind baseline: needs at least one member and one non-member")
    loss = blind_losses(context_x, context_y, query_x, query_y, n_classes)
    value = auc(loss[member], loss[~member])
    interval = bootstrap_intervals(loss[member], loss[~member], alphas=(), n_resamples=n_resamples, seed=seed).auc
    return BlindBaseline(value, interval.low, interval.high, int(member.sum()), int((~member).sum()))


def blind_fit_rows(n_rows: int, member_idx: np.ndarray, nonmember_idx: np.ndarray,
                   context_idx: np.ndarray) -> np.ndarray:
    """The rows the blind scorer is fitted on: C', unless C' is part of the audited member pool
    (multi_random), where a scorer fitted on it would have seen members; then the rows no part of the split
    uses (C' itself when there are none)."""
    context = np.asarray(context_idx, dtype=np.int64)
    members = np.asarray(member_idx, dtype=np.int64)
    if not np.isin(context, members).any():
        return context
    used = np.zeros(int(n_rows), dtype=bool)
    used[members] = used[np.asarray(nonmember_idx, dtype=np.int64)] = used[context] = True
    free = np.flatnonzero(~used)
    return free if len(free) else context


# a split's baseline, remembered per (task fingerprint, members, non-members) in this process
_CACHE: dict[tuple[str, bytes, bytes], BlindBaseline] = {}
_CACHE_MAX = 512


def task_blind_baseline(task: Any, member_idx: np.ndarray | None = None,
                        nonmember_idx: np.ndarray | None = None) -> BlindBaseline:
    """The blind baseline of a prepared task's split (or of the given member / non-member positions, e.g.
    a null split), each row scored on the label it is probed with (``task.labels``)."""
    m = np.asarray(task.member_idx if member_idx is None else member_idx, dtype=np.int64)
    n = np.asarray(task.nonmember_idx if nonmember_idx is None else nonmember_idx, dtype=np.int64)
    # a split's baseline does not depend on the checkpoint: computed once per (task, split) in a process,
    # not again for every checkpoint and null split a probe actor scores
    key = (str(getattr(task, "fingerprint", id(task))), m.tobytes(), n.tobytes())
    if key in _CACHE:
        return _CACHE[key]
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = compute_task_blind_baseline(task, m, n)
    return _CACHE[key]


def compute_task_blind_baseline(task: Any, m: np.ndarray, n: np.ndarray) -> BlindBaseline:
    """The blind baseline of a prepared task's members ``m`` and non-members ``n`` (positions into its arrays),
    computed afresh (:func:`task_blind_baseline` remembers it): the scorer is fitted on the rows
    :func:`blind_fit_rows` names for the task's own split."""
    rows = np.concatenate([m, n])
    features, labels = np.asarray(task.features), np.asarray(task.labels)
    fit = blind_fit_rows(len(labels), np.asarray(task.member_idx), np.asarray(task.nonmember_idx),
                         np.asarray(task.context_idx))
    flags = np.concatenate([np.ones(len(m), dtype=bool), np.zeros(len(n), dtype=bool)])
    return blind_baseline(features[fit], labels[fit], features[rows], labels[rows], flags, task.n_classes)

