"""Whether a model fine-tuned through its package's own fine-tuner memorized its members at all: the ground truth
a planted run is read against (a planted run is "missed" by an attack only when this says it memorized).

White-box and in the model's own frame: the deployed classifier (the package's ensemble, preprocessing and the
run's seed as its ``random_state``) predicts every audited row's trained label with the training rows as the
context, each row's own fold left out (``trainables.upstream.training_frame_losses``), once with the fine-tuned
weights and once with the base weights under the same seed and contexts. A row's score is how much fine-tuning
lowered its loss (base loss - fine-tuned loss); members against label-matched non-members, the AUC of that
score with its bootstrap interval. Members and non-members are exchangeable before fine-tuning (the matched
label design permutes both sides' labels alike), so an interval above 0.5 says the weights moved towards the
members' trained labels more than towards rows they never saw: memorization, whatever an auditor can see of it.

Pure: no Ray. Its own false-positive rate is measured on null splits (rows the run never trained on as both
sides, the training rows still the context): ``benchmarks/minis.py --parts upstream``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from iclmem.vocab import Calibration, ScoreKind
from probes.calibration import resolve_model
from probes.metrics import membership_metrics

__all__ = ["GroundTruth", "memorization_ground_truth"]

GROUND_TRUTH_FOLDS = 5


@dataclass(frozen=True)
class GroundTruth:
    """One run's ground truth: the AUC of the fine-tuning loss drop (members vs non-members) with its 95%
    bootstrap interval and one-sided p-value, the sizes, and ``memorized`` (the interval lies above 0.5)."""

    auc: float
    auc_low: float
    auc_high: float
    p_value: float
    n_members: int
    n_nonmembers: int
    folds: int
    memorized: bool

    def as_dict(self, prefix: str = "ground_truth_") -> dict[str, Any]:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}


def memorization_ground_truth(model: Any, base_model: Any, task: Any, *, seed: int | None = None,
                              members: np.ndarray | None = None, nonmembers: np.ndarray | None = None,
                              n_resamples: int = 200, bootstrap_seed: int = 0,
                              folds: int = GROUND_TRUTH_FOLDS) -> GroundTruth:
    """The ground truth of ``model`` (fine-tuned on ``task``'s members by its package's fine-tuner) against
    ``base_model`` (the weights it started from; a callable building them is resolved): ``members`` and
    ``nonmembers`` (row indices; default the task's own) scored in the training frame. A null split's rows as
    both sides measure the ground truth's own false-positive rate."""
    from trainables.upstream import training_frame_losses

    members = np.asarray(task.member_idx if members is None else members, dtype=np.int64)
    nonmembers = np.asarray(task.nonmember_idx if nonmembers is None else nonmembers, dtype=np.int64)
    audited = np.concatenate([members, nonmembers])
    fine_tuned = training_frame_losses(model, task, audited, seed=seed, folds=folds)
    base = training_frame_losses(resolve_model(base_model), task, audited, seed=seed, folds=folds)
    drop = base - fine_tuned  # higher = fine-tuning moved the row's trained label up = member-like
    metrics = membership_metrics(drop[: len(members)], drop[len(members):], ScoreKind.LOSS, Calibration.CALIBRATED,
                                 n_resamples=n_resamples, seed=bootstrap_seed)
    low = float(metrics.auc_interval.low)
    return GroundTruth(auc=float(metrics.auc), auc_low=low, auc_high=float(metrics.auc_interval.high),
                       p_value=float(metrics.p_value), n_members=len(members), n_nonmembers=len(nonmembers),
                       folds=folds, memorized=bool(low > 0.5))
