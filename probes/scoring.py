"""Batched probe scoring: every (query, manipulation) pair of a prepared task, for one model.

Contexts of equal shape are stacked into one tensor batch and scored in a single forward pass per
chunk; the Python work per context is only the plan, built once per (task, suite, seed) and reused for
every checkpoint and for the reference model.

Scores (ICLMEM_SPEC.md, Stage II) for candidate distribution p over Y and true label y*:
``loss = -log p(y*)``, ``entropy = H(p)``, ``confidence = p(y*)``; all in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from probes.manipulations import (
    ContextPlan,
    Manipulation,
    PlannedContext,
    build_plans,
    group_by_shape,
    materialize_batch,
    suite_fingerprint,
)

SCORE_COLUMNS = ("loss", "entropy", "confidence")
TABLE_COLUMNS = ("query_id", "member", "manipulation", "category", *SCORE_COLUMNS)


@dataclass(frozen=True)
class ProbeQueries:
    """The probed rows of a task: members then non-members. Shapes: 2Q rows, F features."""

    query_ids: np.ndarray  # int64 [2Q]  row ids in the source table
    member: np.ndarray  # bool [2Q]
    labels: np.ndarray  # int64 [2Q]  y*: the label the run trained on (members) / the table's (non-members)
    features: np.ndarray  # float32 [2Q, F]
    n_classes: int

    @classmethod
    def from_task(cls, task: Any) -> "ProbeQueries":
        idx = np.concatenate([np.asarray(task.member_idx), np.asarray(task.nonmember_idx)])
        member = np.zeros(len(idx), dtype=bool)
        member[: len(task.member_idx)] = True
        return cls(
            query_ids=np.asarray(task.row_ids)[idx].astype(np.int64),
            member=member,
            labels=np.asarray(task.labels)[idx].astype(np.int64),
            features=np.asarray(task.features, dtype=np.float32)[idx],
            n_classes=int(task.n_classes),
        )


@dataclass(frozen=True)
class ProbePlan:
    """All contexts of one probe, grouped by shape; independent of the model being probed.

    With ``row_weights`` (for models with ``supports_context_weights``) every context without
    distractor columns is stored as its distinct rows and their multiplicities: a context of all-identical
    features differs only in labels, so "true label x5, every row x10" becomes m rows and m counts.
    """

    queries: ProbeQueries
    suite: tuple[Manipulation, ...]
    seed: int
    planned: tuple[PlannedContext, ...]
    groups: tuple[tuple[Any, tuple[int, ...]], ...]  # (shape, indices into planned)
    row_weights: tuple[np.ndarray, ...] | None = None  # float32 [N] per planned context, or None

    @property
    def suite_fingerprint(self) -> str:
        return suite_fingerprint(self.suite)

    @classmethod
    def build(cls, queries: ProbeQueries, suite: Sequence[Manipulation], seed: int,
              compress_rows: bool = False) -> "ProbePlan":
        planned = build_plans(
            suite, seed, queries.query_ids, queries.labels, queries.n_classes, queries.features.shape[1]
        )
        weights = None
        if compress_rows:
            planned, weights = _compress(planned)
        groups = tuple((shape, tuple(idx)) for shape, idx in group_by_shape(planned).items())
        return cls(queries, tuple(suite), seed, tuple(planned), groups, weights)


def _compress(planned: Sequence[PlannedContext]) -> tuple[list[PlannedContext], tuple[np.ndarray, ...]]:
    """Distinct rows with multiplicities for every context whose rows differ only in their label."""
    out, weights = [], []
    for entry in planned:
        plan = entry.plan
        if plan.n_distractors:
            out.append(entry)
            weights.append(np.ones(plan.n_rows, dtype=np.float32))
            continue
        labels, counts = np.unique(plan.labels, return_counts=True)
        compact = ContextPlan(labels=labels.astype(np.int64), keep_columns=plan.keep_columns,
                              distractors=np.zeros((len(labels) + 1, 0), dtype=np.float32))
        out.append(PlannedContext(entry.query_index, entry.manipulation_index, compact))
        weights.append(counts.astype(np.float32))
    return out, tuple(weights)


def distribution_scores(log_probs: torch.Tensor, true_labels: torch.Tensor) -> dict[str, np.ndarray]:
    """log_probs [B, C] float32, true_labels [B] -> loss, entropy, confidence, each float32 [B]."""
    log_probs = log_probs.float()
    probs = log_probs.exp()
    true_lp = log_probs.gather(1, true_labels[:, None]).squeeze(1)
    entropy = -(probs * log_probs).sum(dim=1)
    return {
        "loss": (-true_lp).numpy().astype(np.float32),
        "entropy": entropy.numpy().astype(np.float32),
        "confidence": true_lp.exp().numpy().astype(np.float32),
    }


@torch.no_grad()
def score(model: Any, plan: ProbePlan, max_batch: int = 2048) -> pd.DataFrame:
    """One row per (query, manipulation): query_id, member, manipulation, category, loss, entropy, confidence.

    Rows come back in plan order (query-major, suite order), so tables from two models align row by row.
    """
    model.module.eval()
    q = plan.queries
    n = len(plan.planned)
    out = {k: np.empty(n, dtype=np.float32) for k in SCORE_COLUMNS}
    for _shape, indices in plan.groups:
        for start in range(0, len(indices), max_batch):
            chunk = indices[start : start + max_batch]
            entries = [plan.planned[i] for i in chunk]
            query_rows = np.fromiter((e.query_index for e in entries), dtype=np.int64, count=len(entries))
            context_x, context_y, query_x = materialize_batch([e.plan for e in entries], q.features[query_rows])
            weights = {}  # only models that take row multiplicities get the keyword
            if plan.row_weights is not None:
                weights["context_weight"] = torch.from_numpy(np.stack([plan.row_weights[i] for i in chunk]))  # [B, N]
            log_probs = model.log_probs(
                torch.from_numpy(context_x),  # [B, N, F']
                torch.from_numpy(context_y),  # [B, N]
                torch.from_numpy(query_x)[:, None, :],  # [B, 1, F']
                q.n_classes,
                **weights,
            )[:, 0]  # [B, C]
            scores = distribution_scores(log_probs, torch.from_numpy(q.labels[query_rows]))
            for key, values in scores.items():
                out[key][np.asarray(chunk)] = values
    query_index = np.fromiter((p.query_index for p in plan.planned), dtype=np.int64, count=n)
    manip_index = np.fromiter((p.manipulation_index for p in plan.planned), dtype=np.int64, count=n)
    names = np.array([m.name for m in plan.suite], dtype=object)
    categories = np.array([m.category for m in plan.suite], dtype=object)
    return pd.DataFrame(
        {
            "query_id": q.query_ids[query_index],
            "member": q.member[query_index],
            "manipulation": names[manip_index],
            "category": categories[manip_index],
            **out,
        }
    )


@torch.no_grad()
def icl_predictions(model: Any, task: Any) -> tuple[np.ndarray, np.ndarray]:
    """Ordinary in-context prediction of members and non-members with the fine-tuning context C'.

    Returns (cross-entropy per query, p(true label) per query), each float32 [2Q]; the inputs of the
    loss ratio L_FT / L_base and of output_std.
    """
    model.module.eval()
    queries = ProbeQueries.from_task(task)
    features = torch.from_numpy(np.array(task.features, dtype=np.float32))
    labels = torch.from_numpy(np.array(task.labels, dtype=np.int64))
    ctx = torch.from_numpy(np.array(task.context_idx))
    log_probs = model.log_probs(
        features[ctx][None], labels[ctx][None], torch.from_numpy(queries.features)[None], queries.n_classes
    )[0]  # [2Q, C]
    scores = distribution_scores(log_probs, torch.from_numpy(queries.labels))
    return scores["loss"], scores["confidence"]
