"""Two channels, same rows: a fine-tuned checkpoint deployed with some of the rows it was fine-tuned on.

An in-context learner that a model owner fine-tunes and then deploys leaks a row through two channels: the
weights it was fine-tuned on (IclMem's probe, the known-context prediction) and the context the deployed model
holds at every prediction. A data owner must know which one exposes a row, and whether a row that reaches both
is more exposed than one that reaches either. Auditing the channels on different rows or different models
cannot say; this module audits them on the *same* rows of the same checkpoint.

Design. The probe's 2Q query rows (Q members the run fine-tuned on, Q non-members) are crossed with a second,
independent membership: the deployed context, half of the members and half of the non-members, drawn within
each (fine-tuned, label) cell (:func:`deployed_context_mask`), so every row falls in one of four cells:

    =================  ====================  ==========================
                       in the context        not in the context
    fine-tuned on      both channels (B)     weights only (F)
    not fine-tuned     context only (C)      neither (O)
    =================  ====================  ==========================

The *weights channel* is the probe's scores, members F ∪ B against C ∪ O. The *context channel* is the
deployed-context audit (:mod:`probes.attacks.context`) run on the fine-tuned checkpoint itself: members C ∪ B (the
deployed context, Q rows) against F ∪ O, calibrated by K reference contexts that are random halves of the same
2Q rows on the same weights, so what the weights learnt cancels in every reference-calibrated attack and what
is left is the context's own exposure. :func:`channel_crossing` then measures each channel within each stratum
of the other: the context channel among rows fine-tuned on (B against F) and among rows not (C against O), the
weights channel among rows in the context (B against C) and among rows not (F against O). A context channel
that is stronger on the fine-tuned rows says that fine-tuning on a row raised its exposure through the
context as well.

Shapes: queries' features float32 [n, F], labels int64 [n], flags bool [n] (n = 2Q); a scorer returns
log-probabilities float [m, C] (:class:`probes.attacks.context.ContextScorer`; a registered model's adapter
as one: :class:`probes.attacks.scorers.AdapterScorer`). Pure numpy; no Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from iclmem.errors import ProbeError
from iclmem.stats import auc, bootstrap_intervals
from iclmem.vocab import Channel, ContextTarget
from probes.attacks.context import (
    MAX_REFERENCES,
    ContextAuditInputs,
    ContextScorer,
    context_attack_scores,
    score_references,
    target_statistics,
)

__all__ = ["CONTEXT_CHANNEL_PREFIX", "CONTEXT_CONTROL_PREFIX", "IN_CONTEXT_COLUMN", "ChannelCell",
           "channel_crossing", "context_channel_scores", "context_channel_targets", "control_context_rows",
           "deployed_context_mask"]

# the query table's columns of the context channel: the deployed-context flag and one score per attack
IN_CONTEXT_COLUMN = "in_deployed_context"
CONTEXT_CHANNEL_PREFIX = "context_channel__"
# ... and each attack's score of the same rows with the control as the deployed context (rows none of which is
# scored), under the same in-context flags: a null of the context channel
CONTEXT_CONTROL_PREFIX = "context_control__"
# the stream of the deployed context's draw: apart from Stage I's and the references' (trainables.data.split)
_STREAM_DEPLOYED_CONTEXT = 11


def deployed_context_mask(fine_tuned: Any, labels: Any, seed: int) -> np.ndarray:
    """bool [n]: the rows placed in the deployed context, half of each (fine-tuned, label) cell (an odd cell
    gives its spare row to the context or not by a fair draw, so the context holds about half of the rows), drawn
    from ``seed`` on a stream of its own. Both memberships are then independent of each other and of the label."""
    ft = np.asarray(fine_tuned, dtype=bool)
    y = np.asarray(labels, dtype=np.int64)
    if ft.shape != y.shape or ft.ndim != 1:
        raise ProbeError(f"two channels: {ft.shape} fine-tuned flags for {y.shape} labels")
    rng = np.random.default_rng([_STREAM_DEPLOYED_CONTEXT, int(seed)])
    mask = np.zeros(len(y), dtype=bool)
    for flag in (True, False):
        for label in np.unique(y):
            cell = np.flatnonzero((ft == flag) & (y == label))
            take = len(cell) // 2 + int(len(cell) % 2 == 1 and rng.random() < 0.5)
            mask[rng.permutation(cell)[:take]] = True
    return mask


def context_channel_scores(scorer: ContextScorer, features: Any, labels: Any, in_context: Any, n_classes: int,
                           n_references: int, seed: int, control: tuple[Any, Any] | None = None
                           ) -> dict[str, np.ndarray]:
    """Each deployed-context attack's per-row score (higher = in the context), named by
    :class:`~iclmem.vocab.ContextAttack`: the rows scored under the deployed context (the rows of ``in_context``)
    and under ``n_references`` reference contexts (random halves of the same rows, every row in half of them),
    all through ``scorer`` (the fine-tuned checkpoint). ``control`` = (features, labels) of a context that holds
    none of the rows: the same attacks with it as the deployed context, scored against the same references and
    the same ``in_context`` flags, so any separation they show is the audit's own false signal (the control)."""
    if n_references < 2 or n_references % 2 or n_references > MAX_REFERENCES:
        raise ProbeError(f"two channels: {n_references} reference contexts; need an even number from 2 to "
                         f"{MAX_REFERENCES}")
    scored = context_channel_targets(scorer, features, labels, in_context, n_classes, n_references, seed, control)
    return scored[ContextTarget.DEPLOYED if control is None else ContextTarget.CONTROL]


def context_channel_targets(scorer: ContextScorer, features: Any, labels: Any, in_context: Any, n_classes: int,
                            n_references: int, seed: int, control: tuple[Any, Any] | None = None
                            ) -> dict[ContextTarget, dict[str, np.ndarray]]:
    """:func:`context_channel_scores` of the deployed context and, with ``control``, of the control too, against
    one set of reference contexts (scored once: the references are most of the work)."""
    if n_references < 2 or n_references % 2 or n_references > MAX_REFERENCES:
        raise ProbeError(f"two channels: {n_references} reference contexts; need an even number from 2 to "
                         f"{MAX_REFERENCES}")
    cx, cy = (None, None) if control is None else control
    inputs = ContextAuditInputs(np.asarray(features, dtype=np.float32), np.asarray(labels, dtype=np.int64),
                                np.asarray(in_context, dtype=bool), int(n_classes), cx, cy)
    references = score_references(scorer, inputs, n_references, seed)
    targets = [ContextTarget.DEPLOYED] + ([ContextTarget.CONTROL] if control is not None else [])
    return {t: {attack.value: values for attack, values in
                context_attack_scores(target_statistics(scorer, inputs, references, t)).items()} for t in targets}


def control_context_rows(context_labels: Any, free_rows: Any, free_labels: Any, seed: int) -> np.ndarray | None:
    """int64 [N]: the context channel's control, as many of ``free_rows`` as the deployed context holds rows of
    each label (``context_labels``: the deployed context's labels, N of them; ``free_rows`` / ``free_labels``: rows
    the run never saw and the probe does not score, so the control holds none of the audited rows), drawn from
    ``seed`` on a stream of its own; None when a label has too few free rows (then there is no control)."""
    wanted = np.asarray(context_labels, dtype=np.int64)
    rows = np.asarray(free_rows, dtype=np.int64)
    labels = np.asarray(free_labels, dtype=np.int64)
    if rows.shape != labels.shape:
        raise ProbeError(f"two channels: {rows.shape} free rows for {labels.shape} labels")
    rng = np.random.default_rng([_STREAM_DEPLOYED_CONTEXT, int(seed), 1])
    picked = []
    for label, count in zip(*np.unique(wanted, return_counts=True), strict=True):
        pool = rows[labels == label]
        if len(pool) < count:
            return None
        picked.append(rng.permutation(pool)[:count])
    return np.concatenate(picked) if picked else None


@dataclass(frozen=True)
class ChannelCell:
    """One channel's attack measured within one stratum of the other membership: AUC of its members against
    its non-members among those rows, with a 95% bootstrap interval."""

    channel: Channel  # whose membership the AUC separates
    attack: str
    stratum: str  # "fine_tuned" / "not_fine_tuned" (context channel) or "in_context" / "not_in_context" (weights)
    n_members: int
    n_nonmembers: int
    auc: float
    auc_low: float
    auc_high: float

    def as_dict(self) -> dict[str, Any]:
        return {"channel": self.channel.value, "attack": self.attack, "stratum": self.stratum,
                "n_members": self.n_members, "n_nonmembers": self.n_nonmembers, "auc": self.auc,
                "auc_low": self.auc_low, "auc_high": self.auc_high}


def channel_crossing(fine_tuned: Any, in_context: Any, weights_scores: Mapping[str, Any],
                     context_scores: Mapping[str, Any], n_resamples: int = 200, seed: int = 0) -> list[ChannelCell]:
    """Each channel within each stratum of the other (see the module's table): the weights channel's attacks
    (fine-tuned against not) among rows in the context and among rows not; the context channel's (in the
    context against not) among rows fine-tuned on and among rows not. A stratum with fewer than two members or
    non-members of the measured channel gets NaN."""
    ft = np.asarray(fine_tuned, dtype=bool)
    ctx = np.asarray(in_context, dtype=bool)
    if ft.shape != ctx.shape:
        raise ProbeError(f"two channels: {ft.shape} fine-tuned flags against {ctx.shape} context flags")
    plan = ((Channel.FINE_TUNED_WEIGHTS, weights_scores, ft, ((ctx, "in_context"), (~ctx, "not_in_context"))),
            (Channel.DEPLOYED_CONTEXT, context_scores, ctx, ((ft, "fine_tuned"), (~ft, "not_fine_tuned"))))
    cells = []
    for channel, scores, member, strata in plan:
        for attack, values in scores.items():
            score = np.asarray(values, dtype=np.float64)
            if score.shape != ft.shape:
                raise ProbeError(f"two channels: attack {attack!r} scores {score.shape} rows, not {ft.shape}")
            for stratum, name in strata:
                keep = stratum & np.isfinite(score)
                m, n = score[keep & member], score[keep & ~member]
                if min(len(m), len(n)) < 2:
                    cells.append(ChannelCell(channel, attack, name, len(m), len(n), *(float("nan"),) * 3))
                    continue
                interval = bootstrap_intervals(m, n, alphas=(), n_resamples=n_resamples, seed=seed).auc
                cells.append(ChannelCell(channel, attack, name, len(m), len(n), auc(m, n), interval.low,
                                         interval.high))
    return cells

