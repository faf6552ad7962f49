"""Ordinary in-context prediction of the audited rows with the known context C', never with a row in its own context.

What reads these predictions: the known-context baseline (``known_context_*``, and the per-query
``known_context_loss`` the reference-model attacks read), the utility columns (``member_icl_*``,
``nonmember_icl_*``) and the collapse indicators (``loss_ratio*``, ``output_std*``), on every checkpoint
and on the base model alike.

``single_fixed`` and ``multi_fixed`` draw C' apart from the members and non-members: every audited row is
predicted with all of C' in one forward pass, exactly as before this module existed.

``multi_random`` audits C' (Stage I puts it into the member pool, ``PrepSettings.context_in_pool``), so with
C' as context about 72% of the members (|C'| of Q + |C'|) would be predicted with themselves, label
included, in the context, and the untouched base model tells members from non-members without any
fine-tuning (pfn-mini on digits: known-context AUC 0.63; docs/METHOD.md, "The known-context baseline",
has the measurements). There every audited row is predicted with C' less one row of its own probed label:
itself when it is in C', otherwise a row of C' chosen by a hash of (task, row id). Leaving out only the
members' own rows is not enough: their contexts then hold one row fewer of their own label than the
non-members', the model's label prior moves, and the base AUC lands below chance (digits: 0.488). With
every row's context one row short of its own label, members and non-members see |C'| - 1 rows with the same
label counts relative to their own label, and for a classification task the members in C' and their
non-member partners (paired at random within a class by Stage I) are exchangeable before training.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from iclmem.errors import ProbeError
from iclmem.vocab import Regime
from probes.scoring import CPU_MAX_TOKENS, ICLPredictions, distribution_scores, icl_predictions, model_device

# Regimes that keep C' apart from the audited rows: a probed row found in C' there is a preparation bug.
FIXED_CONTEXT_REGIMES = frozenset({Regime.SINGLE_FIXED.value, Regime.MULTI_FIXED.value})
# Version of the leave-one-out rule: part of the base model's cache key, so a change to the rule can never
# read scores computed under the old one.
LEAVE_ONE_OUT_RULE = "loo1"


@dataclass(frozen=True)
class LeaveOneOutGroups:
    """Audited rows grouped by the C' row their context leaves out, padded to one shape for one batched pass.

    Shapes: B groups (distinct left-out rows), M rows in the largest group. A group smaller than M is padded
    with its own first row: queries never see each other (the adapter contract,
    tests/test_adapter_contract.py), so a padded copy changes no prediction; it is not read back."""

    dropped: np.ndarray  # int64 [B] position of the C' row group b's context leaves out
    rows: np.ndarray  # int64 [B, M] audited rows of group b, as indices into KnownContextPlan.query_rows
    real: np.ndarray  # bool [B, M] False where ``rows`` is padding


@dataclass(frozen=True)
class KnownContextPlan:
    """Which context every audited row of a task is predicted with.

    Shapes: R audited rows (the task's members then its non-members: ``ProbeQueries`` / ``ICLPredictions``
    order), N = |C'| context rows. Positions index the task's arrays (``features``, ``labels``)."""

    query_rows: np.ndarray  # int64 [R] positions of the audited rows
    context_rows: np.ndarray  # int64 [N] positions of C' (task.context_idx, in its order)
    # int64 [R] position of the C' row left out of each audited row's context (itself when it is in C'); None
    # when no audited row is in C' (single_fixed, multi_fixed): every row is predicted with all of C'
    left_out: np.ndarray | None

    @classmethod
    def for_task(cls, task: Any, regime: str | None = None) -> KnownContextPlan:
        """The plan of a prepared task. ``regime`` (the run's, when known) is checked against the split: a
        fixed-context regime whose C' holds an audited row is refused, since its numbers would silently
        change meaning. C' either holds no audited row or lies wholly inside the members (multi_random's
        pool); anything between is a split this probe does not know and is refused too."""
        members = np.asarray(task.member_idx, dtype=np.int64)
        nonmembers = np.asarray(task.nonmember_idx, dtype=np.int64)
        query_rows = np.concatenate([members, nonmembers])
        context_rows = np.asarray(task.context_idx, dtype=np.int64)
        in_context = np.isin(query_rows, context_rows)
        if not in_context.any():
            return cls(query_rows, context_rows, None)
        if regime in FIXED_CONTEXT_REGIMES:
            raise ProbeError(f"task {task.name!r}: regime {regime} keeps C' apart from the audited rows, but "
                             f"{int(in_context.sum())} of them are in C'")
        if np.isin(nonmembers, context_rows).any() or not np.isin(context_rows, members).all():
            raise ProbeError(f"task {task.name!r}: C' overlaps the audited rows only in part (a multi_random pool "
                             "holds all of C' among the members and none among the non-members)")
        labels = np.asarray(task.labels, dtype=np.int64)
        row_ids = np.asarray(task.row_ids, dtype=np.int64)
        salt = int(str(task.fingerprint)[:8], 16)
        left_out = query_rows.copy()  # a row in C' leaves itself out
        for i in np.flatnonzero(~in_context):
            same_label = context_rows[labels[context_rows] == labels[query_rows[i]]]
            # C' holds every label unless a shuffled mode permuted a label out of it; then any row of C' (the
            # row is still not in its own context, only its label counts differ from the others')
            candidates = same_label if len(same_label) else context_rows
            # a hash of (task, row): the choice depends on nothing but the row, never on which other rows
            # are audited or on whether the row is a member
            pick = np.random.default_rng([salt, int(row_ids[query_rows[i]])]).integers(len(candidates))
            left_out[i] = candidates[pick]
        return cls(query_rows, context_rows, left_out)

    @property
    def leaves_one_out(self) -> bool:
        return self.left_out is not None

    def context_of(self, i: int) -> np.ndarray:
        """int64 [N] or [N - 1]: positions of the context rows audited row ``i`` is predicted with."""
        if self.left_out is None:
            return self.context_rows
        kept: np.ndarray = self.context_rows[self.context_rows != self.left_out[i]]
        return kept

    def groups(self) -> LeaveOneOutGroups:
        """The batched forward pass's layout: rows that leave out the same C' row share one context."""
        if self.left_out is None:
            raise ProbeError("a plan that leaves nothing out is predicted in one forward pass, not in groups")
        dropped, group_of = np.unique(self.left_out, return_inverse=True)
        order = np.argsort(group_of, kind="stable")
        counts = np.bincount(group_of, minlength=len(dropped))
        rows = np.empty((len(dropped), int(counts.max())), dtype=np.int64)
        real = np.zeros(rows.shape, dtype=bool)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        for b, (start, count) in enumerate(zip(starts, counts)):
            own = order[start : start + count]
            rows[b, :count], rows[b, count:] = own, own[0]
            real[b, :count] = True
        return LeaveOneOutGroups(dropped.astype(np.int64), rows, real)

    def cache_tag(self) -> str:
        """Names the computation in a cache key: empty for the full C' (unchanged since before this module, so
        caches written then stay valid), else the rule's version and a digest of every row's context."""
        if self.left_out is None:
            return ""
        h = hashlib.sha256(LEAVE_ONE_OUT_RULE.encode())
        for a in (self.query_rows, self.context_rows, self.left_out):
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        return f"{LEAVE_ONE_OUT_RULE}_{h.hexdigest()[:12]}"


@torch.no_grad()
def leave_one_out_log_probs(model: Any, task: Any, plan: KnownContextPlan) -> torch.Tensor:
    """Log-probs [R, C] (on CPU) of every audited row with its own context of ``plan`` (|C'| - 1 rows, the
    labels the run trained on). The contexts share one shape, so they run as batched forward passes of
    [B, N - 1, F] contexts and [B, M, F] queries: on the CPU at most ``CPU_MAX_TOKENS`` tokens a call, on an
    accelerator all at once, halved on an out-of-memory error."""
    groups = plan.groups()
    model.module.eval()
    device = model_device(model)
    hook = getattr(model, "use_columns", None)
    if hook is not None:
        hook(getattr(task, "columns", None))
    features = torch.from_numpy(np.array(task.features, dtype=np.float32))
    labels = torch.from_numpy(np.array(task.labels, dtype=np.int64))
    contexts = np.stack([plan.context_rows[plan.context_rows != d] for d in groups.dropped])  # int64 [B, N - 1]
    queries = plan.query_rows[groups.rows]  # int64 [B, M]
    n_groups, tokens = len(groups.dropped), contexts.shape[1] + queries.shape[1]
    chunk = max(1, CPU_MAX_TOKENS // tokens) if device.type == "cpu" else n_groups
    out = torch.empty(len(plan.query_rows), int(task.n_classes), dtype=torch.float32)
    written = np.zeros(len(plan.query_rows), dtype=bool)
    start = 0
    while start < n_groups:
        part = slice(start, start + chunk)
        ctx, qry = torch.from_numpy(contexts[part]), torch.from_numpy(queries[part])
        try:
            log_probs = model.log_probs(features[ctx].to(device), labels[ctx].to(device), features[qry].to(device),
                                        int(task.n_classes)).cpu()  # [b, M, C]
        except torch.OutOfMemoryError:
            if chunk == 1:
                raise
            chunk = max(1, chunk // 2)  # contexts per pass sized to what the device holds
            torch.cuda.empty_cache()
            continue
        real = torch.from_numpy(groups.real[part])
        out[torch.from_numpy(groups.rows[part])[real]] = log_probs[real]
        written[groups.rows[part][groups.real[part]]] = True
        start += len(ctx)
    if not written.all():  # every audited row is the real entry of exactly one group
        raise ProbeError("leave-one-out prediction left an audited row without log-probabilities")
    return out


def predictions_from_log_probs(log_probs: torch.Tensor, task: Any, query_rows: np.ndarray) -> ICLPredictions:
    """``ICLPredictions`` of the audited rows ``query_rows`` from their log-probs [R, C] (the same reading as
    ``probes.scoring.icl_predictions``: the labels as probed, and the table's own labels)."""
    probed = torch.from_numpy(np.asarray(task.labels, dtype=np.int64)[query_rows])
    scores = distribution_scores(log_probs, probed)
    correct = (log_probs.argmax(dim=1) == probed).numpy()
    original = distribution_scores(log_probs, torch.from_numpy(np.asarray(task.original_labels, np.int64)[query_rows]))
    return ICLPredictions(scores["loss"], scores["confidence"], correct, original["loss"], original["confidence"])


def known_context_predictions(model: Any, task: Any, regime: str | None = None,
                              plan: KnownContextPlan | None = None) -> ICLPredictions:
    """Ordinary in-context prediction of the task's members then non-members with C', no row ever in its own
    context (module docstring); ``regime`` is checked by :meth:`KnownContextPlan.for_task`."""
    plan = plan or KnownContextPlan.for_task(task, regime)
    if plan.left_out is None:
        return icl_predictions(model, task)  # the fixed-context regimes: C' for every row, one forward pass
    return predictions_from_log_probs(leave_one_out_log_probs(model, task, plan), task, plan.query_rows)


__all__ = ["FIXED_CONTEXT_REGIMES", "LEAVE_ONE_OUT_RULE", "KnownContextPlan", "LeaveOneOutGroups", "known_context_predictions",
           "leave_one_out_log_probs", "predictions_from_log_probs"]
