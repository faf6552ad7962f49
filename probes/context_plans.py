"""A manipulated context as data (:class:`ContextPlan`) and the arrays it becomes (:func:`materialize`).

The multiple-choice base context ``C_base`` for a query ``q = (x_q, y*)`` over ``m = |Y|`` candidate
labels holds ``m`` rows, each a copy of ``x_q``, labelled ``0, 1, ..., m-1`` in sorted order. Every
context row carries the query's own features, so a manipulated context is fully described by a
:class:`ContextPlan` -- the label of each row, the kept feature columns, and the values of any
distractor columns -- and :func:`materialize` / :func:`materialize_batch` turn plans into arrays, the
kept columns first and the distractor columns after them, the last distractor row the query's.

Which plan a query gets under which manipulation is :mod:`probes.manipulations`' job (``apply``,
``build_plans``, ``group_by_shape``); this module only holds plans and materialises them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from iclmem.errors import ProbeError

__all__ = ["PlanShape", "ContextPlan", "materialize", "materialize_batch"]


class PlanShape(NamedTuple):
    """What must agree for plans to share a batch: rows N, kept columns F', distractor columns d."""

    n_rows: int
    n_kept: int
    n_distractors: int


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class ContextPlan:
    """One manipulated context for one query. Arrays are read-only.

    labels:        int64   [N]       label of each context row, in row order
    keep_columns:  int64   [F']      feature columns of x_q kept, sorted ascending
    distractors:   float32 [N+1, d]  distractor values; rows 0..N-1 context, row N the query
    """

    labels: np.ndarray
    keep_columns: np.ndarray
    distractors: np.ndarray

    def __post_init__(self) -> None:
        labels = np.asarray(self.labels)
        keep = np.asarray(self.keep_columns)
        dis = np.asarray(self.distractors)
        if labels.ndim != 1 or labels.dtype != np.int64 or labels.size == 0:
            raise ProbeError(f"plan labels must be a non-empty int64 vector, got {labels.dtype} {labels.shape}")
        if keep.ndim != 1 or keep.dtype != np.int64:
            raise ProbeError(f"plan keep_columns must be an int64 vector, got {keep.dtype} {keep.shape}")
        if keep.size and (keep[0] < 0 or not bool((keep[1:] > keep[:-1]).all())):
            raise ProbeError("plan keep_columns must be sorted, unique and non-negative")
        if dis.ndim != 2 or dis.dtype != np.float32 or dis.shape[0] != labels.size + 1:
            raise ProbeError(
                f"plan distractors must be float32 [N+1={labels.size + 1}, d], got {dis.dtype} {dis.shape}"
            )
        if keep.size + dis.shape[1] == 0:
            raise ProbeError("plan has no feature columns at all")
        # object.__setattr__: the dataclass is frozen; we only swap in read-only contiguous copies.
        object.__setattr__(self, "labels", _frozen(labels))
        object.__setattr__(self, "keep_columns", _frozen(keep))
        object.__setattr__(self, "distractors", _frozen(dis))

    @property
    def n_rows(self) -> int:
        return int(self.labels.size)

    @property
    def n_kept(self) -> int:
        return int(self.keep_columns.size)

    @property
    def n_distractors(self) -> int:
        return int(self.distractors.shape[1])

    @property
    def n_columns(self) -> int:
        """Width of the materialised rows, F' + d."""
        return self.n_kept + self.n_distractors

    @property
    def shape(self) -> PlanShape:
        return PlanShape(self.n_rows, self.n_kept, self.n_distractors)

    def to_bytes(self) -> bytes:
        """Canonical byte form: equal bytes <=> identical contexts (used for equality and hashing)."""
        header = np.asarray(self.shape, dtype=np.int64).tobytes()
        return header + self.labels.tobytes() + self.keep_columns.tobytes() + self.distractors.tobytes()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ContextPlan):
            return NotImplemented
        return self.to_bytes() == other.to_bytes()

    def __hash__(self) -> int:
        return hash(self.to_bytes())


def materialize(plan: ContextPlan, x_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Context rows and query row of one plan: (float32 [N, F'+d], float32 [F'+d])."""
    x = np.asarray(x_q, dtype=np.float32)
    if x.ndim != 1:
        raise ProbeError(f"x_q must be one feature vector, got shape {x.shape}")
    if plan.n_kept and int(plan.keep_columns[-1]) >= x.size:
        raise ProbeError(f"plan keeps column {int(plan.keep_columns[-1])} but x_q has {x.size} features")
    kept = x[plan.keep_columns]
    query_x = np.concatenate([kept, plan.distractors[-1]])
    context_x = np.concatenate(
        [np.broadcast_to(kept, (plan.n_rows, plan.n_kept)), plan.distractors[:-1]], axis=1
    )
    return np.ascontiguousarray(context_x, dtype=np.float32), query_x.astype(np.float32, copy=False)


def materialize_batch(
    plans: Sequence[ContextPlan], X_q: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised :func:`materialize` for plans of one :class:`PlanShape`, plan b with query row X_q[b].

    Returns context_x float32 [B, N, F'+d], context_y int64 [B, N], query_x float32 [B, F'+d] -- the
    layout ``ModelAdapter.log_probs`` takes (add the query axis with ``query_x[:, None]``).
    """
    if len(plans) == 0:
        raise ProbeError("materialize_batch needs at least one plan")
    X = np.asarray(X_q, dtype=np.float32)
    if X.ndim != 2 or X.shape[0] != len(plans):
        raise ProbeError(f"X_q must be [B={len(plans)}, F], got shape {X.shape}")
    shape = plans[0].shape
    if any(p.shape != shape for p in plans):
        raise ProbeError("materialize_batch needs plans of one shape; group them with group_by_shape first")
    n_rows, n_kept, _ = shape
    keep = np.stack([p.keep_columns for p in plans])  # [B, F']
    if n_kept and int(keep.max()) >= X.shape[1]:
        raise ProbeError(f"a plan keeps column {int(keep.max())} but X_q has {X.shape[1]} features")
    kept = np.take_along_axis(X, keep, axis=1)  # [B, F'] -- each plan keeps its own columns
    dis = np.stack([p.distractors for p in plans])  # [B, N+1, d]
    context_x = np.concatenate(
        [np.broadcast_to(kept[:, None, :], (len(plans), n_rows, n_kept)), dis[:, :-1]], axis=2
    )
    query_x = np.concatenate([kept, dis[:, -1]], axis=1)
    context_y = np.stack([p.labels for p in plans])
    return (
        np.ascontiguousarray(context_x, dtype=np.float32),
        np.ascontiguousarray(context_y, dtype=np.int64),
        np.ascontiguousarray(query_x, dtype=np.float32),
    )
