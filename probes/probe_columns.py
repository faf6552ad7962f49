"""The columns of a probe's results row that are read off one checkpoint's predictions beside its membership
metrics: the collapse indicators the verdict reads, the split's blind baseline, the checkpoint's in-context
utility, a package fine-tune's deployed utility and the seed its package deploys it under. Pure functions of
predictions (numpy), the task and the run's identity; no Ray."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from iclmem.vocab import LabelDesign
from probes.metrics import loss_ratio, output_std
from trainables.data.blind import exchangeable, task_blind_baseline


def collapse_indicators(predictions: Any, loss_base: np.ndarray, loss_base_original: np.ndarray,
                        member: np.ndarray) -> dict[str, float]:
    """The collapse indicators the verdict reads, and the two views they are taken from.

    * ``loss_ratio_true`` / ``output_std`` : on the non-members' own (table) labels: rows the run never
      trained on, scored on the truth, say whether the model still predicts the task.
    * ``loss_ratio_spec`` / ``output_std_spec``: the spec's, over members and non-members on the labels as
      probed (members: the labels trained on).
    * ``loss_ratio`` (what the rule compares with ``collapse_loss_ratio``): the smaller of the two ratios, so
      a checkpoint is called collapsed only when its loss exploded whichever labels it is read on. Each view
      alone misreads a shuffled label mode (docs/METHOD.md, "Collapse"): on true labels, a model that
      memorised permuted member labels unlearns the task for unseen rows (measured: ratio 19-46 at chance
      accuracy, while the members are found with AUC 0.72-0.75); on the labels as probed, a model that got
      better at the true task reads as worse on permuted labels (ratio 5.3-5.4 for a model that never saw
      the audited rows). The true-label view also decides near-constant output (``output_std``)."""
    member = np.asarray(member, dtype=bool)
    ratio_true = loss_ratio(float(np.mean(predictions.loss_original[~member])),
                            float(np.mean(np.asarray(loss_base_original)[~member])))
    ratio_spec = loss_ratio(float(np.mean(predictions.loss)), float(np.mean(loss_base)))
    return {"loss_ratio": min(ratio_true, ratio_spec), "output_std": output_std(np.asarray(predictions.p_original)[~member]),
            "loss_ratio_true": ratio_true, "loss_ratio_spec": ratio_spec, "output_std_spec": output_std(predictions.p_true)}


def blind_columns(task: Any) -> dict[str, Any]:
    """The split's blind baseline (trainables.data.blind: members vs non-members scored by a model fitted on C'
    alone), its label design and whether the split is exchangeable (a design that treats both groups
    alike and a blind interval containing 0.5): no membership claim and no ε bound rests on one that is not."""
    blind = task_blind_baseline(task)
    design = getattr(task.split_report, "label_design", LabelDesign.MATCHED.value)
    return {**blind.columns(), "label_design": design, "exchangeable": exchangeable(design, blind)}


def icl_utility_columns(predictions: Any, member: np.ndarray) -> dict[str, float]:
    """Utility of the checkpoint with C': in-context accuracy and mean loss on the members (the labels the
    run trained on) and on the non-members -- what a DP-SGD run trades against its ε."""
    member = np.asarray(member, dtype=bool)
    return {f"{side}_icl_{name}": float(np.mean(values[mask]))
            for side, mask in (("member", member), ("nonmember", ~member))
            for name, values in (("accuracy", np.asarray(predictions.correct, dtype=np.float64)),
                                 ("loss", np.asarray(predictions.loss, dtype=np.float64)))}


def deployed_utility_columns(model: Any, task: Any, seed: int | None = None) -> dict[str, float]:
    """A model fine-tuned by its package's own fine-tuner (``recipe`` upstream): the same utility as the
    package deploys the weights (``deployed_member_icl_accuracy`` ... ``deployed_nonmember_icl_loss``; see
    ``trainables.upstream.deployed_utility``; ``seed``: the deployed classifier's ``random_state``, default the
    task's); empty for every other model."""
    from trainables.upstream import deployed_utility, upstream_options

    if not upstream_options(getattr(model, "options", {})):
        return {}

    return {f"deployed_{k}": v for k, v in deployed_utility(model, task, seed=seed).items()}


def deployed_seed(identity: Mapping[str, Any]) -> int | None:
    """The ``random_state`` of the classifier a run's package deploys: the seed the run trained under (a
    reference fine-tune's own training seed, ``reference_training_seed``, so its deployed ensemble draws fresh
    preprocessing and shifts as its fine-tuning drew fresh batches; a target's run seed), None when unknown (the
    task's seed is then used)."""
    for key in ("reference_training_seed", "seed"):
        value = identity.get(key)
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            return int(value)
    return None
