"""Batched probe scoring: every (query, manipulation) pair of a prepared task, for one model.

Contexts of equal shape are stacked into one tensor batch and scored in a single forward pass per
chunk (for a model that takes row weights, shape groups too small to fill a call share one, padded with
zero-weight rows: :func:`merge_small_groups`; for a model that runs batches of several shapes in one pass,
every CPU call is filled with several groups: :func:`pack_groups`); the Python work per context is only the
plan, built once per (task, suite, seed) and reused for every checkpoint and for the reference model.

Scores (ICLMEM_SPEC.md, Stage II) for candidate distribution p over Y and true label y*:
``loss = -log p(y*)``, ``entropy = H(p)``, ``confidence = p(y*)``; all in float32. With ``decimals`` d (the
sweep's ``probe.output_decimals``) the same three are also read off the vector a deployed model returns, p
rounded to d decimals (:func:`rounded_distribution_scores`), as ``rounded_loss`` / ``rounded_entropy`` /
``rounded_confidence`` beside them (:func:`rounded_view` puts them in the plain columns' place).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from math import gcd
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch

from iclmem.allocator import retain_freed_memory
from probes.manipulations import (
    ContextPlan,
    Manipulation,
    PlannedContext,
    build_plans,
    group_by_shape,
    materialize_batch,
    suite_fingerprint,
)
from trainables.models.base import ContextBatch

SCORE_COLUMNS = ("loss", "entropy", "confidence")
ROUNDED_PREFIX = "rounded_"  # a score read off the candidate vector rounded to the output decimals
ROUNDED_SCORE_COLUMNS = tuple(f"{ROUNDED_PREFIX}{c}" for c in SCORE_COLUMNS)
Groups = tuple[tuple[Any, tuple[int, ...]], ...]  # (shape, indices into a plan's contexts)
TABLE_COLUMNS = ("query_id", "member", "manipulation", "category", *SCORE_COLUMNS)


@dataclass(frozen=True)
class ProbeQueries:
    """The probed rows of a task: members then non-members. Shapes: 2Q rows, F features."""

    query_ids: np.ndarray  # int64 [2Q]  row ids in the source table
    member: np.ndarray  # bool [2Q]
    labels: np.ndarray  # int64 [2Q]  y*: the label the run trained on (members) / the table's (non-members)
    features: np.ndarray  # float32 [2Q, F]
    n_classes: int
    # float32 [N', F]: the fine-tuning context C', whose feature statistics a model that normalises over its
    # context (``normalizes_over_context``) uses for probe contexts; None: the contexts' own
    reference_rows: np.ndarray | None = None
    # the task's column description (trainables.data.TableColumns), handed to the model that scores the
    # plan (``use_columns``); None: a bare matrix
    columns: Any = None

    @classmethod
    def from_task(cls, task: Any) -> ProbeQueries:
        idx = np.concatenate([np.asarray(task.member_idx), np.asarray(task.nonmember_idx)])
        member = np.zeros(len(idx), dtype=bool)
        member[: len(task.member_idx)] = True
        return cls(
            query_ids=np.asarray(task.row_ids)[idx].astype(np.int64),
            member=member,
            labels=np.asarray(task.labels)[idx].astype(np.int64),
            features=np.asarray(task.features, dtype=np.float32)[idx],
            n_classes=int(task.n_classes),
            reference_rows=np.asarray(task.features, dtype=np.float32)[np.asarray(task.context_idx)],
            columns=getattr(task, "columns", None),
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
    # representatives / unique groups per set of invariances, computed on first use
    _shortcuts: dict[frozenset[str], tuple[np.ndarray, Groups]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def suite_fingerprint(self) -> str:
        return suite_fingerprint(self.suite)

    def representatives(self, invariances: Collection[Any] = ()) -> np.ndarray:
        """int64 [len(planned)]: for each context, the first context of the same query that is identical
        to it under ``invariances`` (a model's :class:`~trainables.models.base.Invariance` set; none:
        byte-identical contexts only). A context is its own representative when no earlier one matches.
        Scoring the representatives and copying their scores gives every context its own scores, up to
        float rounding, for a model that has those invariances."""
        return self._shortcut(invariances)[0]

    def unique_groups(self, invariances: Collection[Any] = ()) -> tuple[tuple[Any, tuple[int, ...]], ...]:
        """Like ``groups``, over the representatives only."""
        return self._shortcut(invariances)[1]

    def forwards_saved(self, invariances: Collection[Any] = ()) -> float:
        """Share of contexts whose scores are copied from a representative instead of computed."""
        rep = self.representatives(invariances)
        return float(np.mean(rep != np.arange(rep.size))) if rep.size else 0.0

    def _shortcut(self, invariances: Collection[Any]) -> tuple[np.ndarray, Groups]:
        names = frozenset(str(getattr(i, "value", i)) for i in invariances)
        if names not in self._shortcuts:
            first: dict[tuple[int, bytes], int] = {}
            rep = np.empty(len(self.planned), dtype=np.int64)
            for i, entry in enumerate(self.planned):
                weights = None if self.row_weights is None else self.row_weights[i]
                key = (entry.query_index, canonical_context(entry.plan, weights, names))
                rep[i] = first.setdefault(key, i)
            unique = np.flatnonzero(rep == np.arange(rep.size))
            groups = []
            for shape, indices in self.groups:
                kept = tuple(i for i in indices if rep[i] == i)
                if kept:
                    groups.append((shape, kept))
            self._shortcuts[names] = (rep, tuple(groups))
            assert sum(len(g) for _, g in groups) == unique.size
        return self._shortcuts[names]

    @classmethod
    def build(cls, queries: ProbeQueries, suite: Sequence[Manipulation], seed: int,
              compress_rows: bool = False) -> ProbePlan:
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


def canonical_context(plan: ContextPlan, weights: np.ndarray | None, invariances: Collection[str] = ()) -> bytes:
    """Bytes equal for two contexts (of one query) exactly when they are identical under ``invariances``
    (``"row_order"``, ``"uniform_multiplicity"``; the latter only counts together with the former).

    A context is its kept columns, the query's distractor values and its rows (label, distractor
    values), each row with a multiplicity (``weights``, 1 when None). Under row order it is the multiset
    of rows: equal rows merged with their counts added, in a fixed order; under uniform multiplicity as
    well, the counts divided by their greatest common divisor (whole counts only)."""
    n = plan.n_rows
    w = np.ones(n, dtype=np.float64) if weights is None else np.asarray(weights, dtype=np.float64)
    head = (np.asarray(plan.shape[1:], dtype=np.int64).tobytes() + plan.keep_columns.tobytes()
            + plan.distractors[-1].tobytes())
    if "row_order" not in invariances:
        return bytes(head + plan.labels.tobytes() + plan.distractors[:-1].tobytes() + w.tobytes())
    rows = np.concatenate([plan.labels.astype("<i8").view(np.uint8).reshape(n, 8),
                           np.ascontiguousarray(plan.distractors[:-1]).view(np.uint8).reshape(n, -1)], axis=1)
    rows = np.ascontiguousarray(rows).view(np.dtype((np.void, rows.shape[1]))).ravel()
    distinct, inverse = np.unique(rows, return_inverse=True)  # sorted: a fixed order of the multiset
    counts = np.bincount(inverse.ravel(), weights=w, minlength=distinct.size)
    if "uniform_multiplicity" in invariances and np.all(counts == np.round(counts)) and counts.min() >= 1:
        whole = counts.astype(np.int64)
        divisor = 0
        for c in whole.tolist():
            divisor = gcd(divisor, c)
        counts = (whole // divisor).astype(np.float64)
    return bytes(head + distinct.tobytes() + counts.tobytes())


def score_columns(decimals: int | None = None) -> tuple[str, ...]:
    """The score columns of a scores table scored with ``decimals`` (None: the exact ones only)."""
    return SCORE_COLUMNS if decimals is None else (*SCORE_COLUMNS, *ROUNDED_SCORE_COLUMNS)


def rounding_floor(decimals: int) -> float:
    """The probability a rounded output of 0 is read as in a loss: half the last printed digit, 0.5 * 10^-d
    (the largest p that rounds to 0), so a rounded loss is finite and at most -log(0.5 * 10^-d)."""
    return 0.5 * 10.0 ** -int(decimals)


def rounded_distribution_scores(probs: np.ndarray, true_labels: np.ndarray, decimals: int) -> dict[str, np.ndarray]:
    """probs float [B, C] (the exact candidate distribution), true_labels int [B] -> rounded_loss,
    rounded_entropy, rounded_confidence, each float32 [B], read off p~ = round(p, decimals) as returned:
    ``rounded_confidence = p~(y*)``, ``rounded_loss = -log max(p~(y*), 0.5 * 10^-d)``,
    ``rounded_entropy = -sum p~ log p~`` over the candidates with p~ > 0.

    p~ is not renormalised: an attacker reads the vector as printed, whose sum differs from 1 by at most
    C * 0.5 * 10^-d, and without renormalising exp(-rounded_loss) = rounded_confidence wherever p~(y*) > 0 (a
    renormalised entropy would also move with the sum's rounding error, which carries no signal)."""
    p = np.round(np.asarray(probs, dtype=np.float64), int(decimals))  # [B, C]
    labels = np.asarray(true_labels, dtype=np.int64)
    confidence = p[np.arange(p.shape[0]), labels]
    positive = p > 0
    entropy = -np.where(positive, p * np.log(np.where(positive, p, 1.0)), 0.0).sum(axis=1)
    return {
        "rounded_loss": (-np.log(np.maximum(confidence, rounding_floor(decimals)))).astype(np.float32),
        "rounded_entropy": entropy.astype(np.float32),
        "rounded_confidence": confidence.astype(np.float32),
    }


def rounded_loss(loss: np.ndarray, decimals: int) -> np.ndarray:
    """float64: the loss -log p(y*) as read off p(y*) rounded to ``decimals``, -log max(round(exp(-loss), d),
    0.5 * 10^-d) (what a deployed model's printed probability gives; see :func:`rounded_distribution_scores`)."""
    p = np.round(np.exp(-np.asarray(loss, dtype=np.float64)), int(decimals))
    out: np.ndarray = -np.log(np.maximum(p, rounding_floor(decimals)))
    return out


def rounded_view(table: pd.DataFrame) -> pd.DataFrame:
    """A scores table scored with output decimals, its rounded columns in the plain ones' place (the same
    table contract, so every metric and verdict reads it unchanged)."""
    missing = [c for c in ROUNDED_SCORE_COLUMNS if c not in table.columns]
    if missing:
        from iclmem.errors import ProbeError

        raise ProbeError(f"a scores table without {missing}: it was scored without output decimals")
    return table.drop(columns=list(SCORE_COLUMNS)).rename(
        columns=dict(zip(ROUNDED_SCORE_COLUMNS, SCORE_COLUMNS, strict=True)))


def distribution_scores(log_probs: torch.Tensor, true_labels: torch.Tensor,
                        decimals: int | None = None) -> dict[str, np.ndarray]:
    """log_probs [B, C] float32, true_labels [B] -> loss, entropy, confidence, each float32 [B]; with
    ``decimals`` also their rounded counterparts (:func:`rounded_distribution_scores`)."""
    log_probs = log_probs.float()
    true_labels = true_labels.to(log_probs.device)
    probs = log_probs.exp()
    true_lp = log_probs.gather(1, true_labels[:, None]).squeeze(1)
    entropy = -(probs * log_probs).sum(dim=1)
    out = {
        "loss": (-true_lp).cpu().numpy().astype(np.float32),
        "entropy": entropy.cpu().numpy().astype(np.float32),
        "confidence": true_lp.exp().cpu().numpy().astype(np.float32),
    }
    if decimals is not None:
        out.update(rounded_distribution_scores(log_probs.double().exp().cpu().numpy(),
                                               true_labels.cpu().numpy(), decimals))
    return out


CPU_MAX_BATCH = 2048
CUDA_MAX_BATCH = 65536  # first try on a GPU; halved on every out-of-memory error


def model_device(model: Any) -> torch.device:
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else torch.device("cpu")


@torch.no_grad()
def score(model: Any, plan: ProbePlan, max_batch: int | None = None, shortcut: bool = True,
          merge: bool = True, decimals: int | None = None) -> pd.DataFrame:
    """Scores of every context of ``plan`` (:func:`_score`), timed as the probe's scoring phase."""
    from probes.stopwatch import phase

    with phase("score"):
        return _score(model, plan, max_batch, shortcut, merge, decimals)


def _score(model: Any, plan: ProbePlan, max_batch: int | None = None, shortcut: bool = True,
           merge: bool = True, decimals: int | None = None) -> pd.DataFrame:
    """One row per (query, manipulation): query_id, member, manipulation, category, loss, entropy, confidence,
    and with ``decimals`` rounded_loss, rounded_entropy, rounded_confidence (the outputs rounded to that many
    decimals: :func:`rounded_distribution_scores`).

    Rows come back in plan order (query-major, suite order), so tables from two models align row by row.
    With ``shortcut`` (the default) contexts identical under the model's declared ``invariances`` are
    scored once and their scores copied (:meth:`ProbePlan.representatives`). Runs on the model's device;
    ``max_batch`` contexts per forward (default: 2048 on CPU; on CUDA as many as fit, starting from
    ``CUDA_MAX_BATCH`` and halving on an out-of-memory error). Scores are float32 whatever the device.
    On CPU a call holds at most ``CPU_MAX_TOKENS`` tokens unless ``max_batch`` is given, and with ``merge``
    (the default) shape groups share forward calls: those too small to fill one are merged, their contexts
    padded with zero-weight rows, for models that take row weights (:func:`merge_small_groups`), and for
    models that run batches of several shapes in one pass (``packs_batches``) every call is filled with
    several groups (:func:`pack_groups`). ``merge=False``: one call per shape group (or chunk of one).
    """
    model.module.eval()
    # forward calls' activations are MBs each, freed and allocated again call after call: keep their pages
    # mapped instead of faulting them in again (see there: 9% of the forward on digits with one call per
    # shape group; score's packed calls for pfn-mini measure no page faults either way)
    retain_freed_memory()
    q = plan.queries
    _use_columns(model, q.columns)
    n = len(plan.planned)
    device = model_device(model)
    out = {k: np.empty(n, dtype=np.float32) for k in score_columns(decimals)}
    invariances: frozenset[Any] = frozenset(getattr(model, "invariances", ()))
    groups = plan.unique_groups(invariances) if shortcut else plan.groups
    if merge and device.type == "cpu" and _can_pad(model, plan):
        groups = merge_small_groups(groups)
    batch = max_batch or (CUDA_MAX_BATCH if device.type == "cuda" else CPU_MAX_BATCH)
    if merge and _packs(model, device, max_batch):  # every call filled to CPU_MAX_TOKENS across shape groups
        for chunks in pack_groups(groups):
            for chunk, scores in zip(chunks, _score_packed(model, plan, chunks, device, decimals)):
                _store(out, chunk, scores)
    else:
        for shape, indices in groups:
            start = 0
            while start < len(indices):
                chunk = indices[start : start + _chunk_size(batch, shape, max_batch, device)]
                try:
                    scores = _score_chunk(model, plan, chunk, device, decimals)
                except torch.OutOfMemoryError:
                    if batch == 1 or max_batch is not None:
                        raise
                    batch = max(1, min(batch, len(chunk)) // 2)  # batches sized to what the device holds
                    torch.cuda.empty_cache()
                    continue
                _store(out, chunk, scores)
                start += len(chunk)
    if shortcut:
        rep = plan.representatives(invariances)
        for key in out:
            out[key] = out[key][rep]
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


def _store(out: dict[str, np.ndarray], chunk: Sequence[int], scores: dict[str, np.ndarray]) -> None:
    """Write one chunk's scores into the plan-ordered score columns."""
    rows = np.asarray(chunk)
    for key, values in scores.items():
        out[key][rows] = values


def _use_columns(model: Any, columns: Any) -> None:
    """Hand a model the column description of the task it is about to score (the adapters' one hook)."""
    hook = getattr(model, "use_columns", None)
    if hook is not None:
        hook(columns)


def column_layout(plans: Sequence[ContextPlan]) -> np.ndarray:
    """int64 [B, F'+d]: the task column each materialised column of each plan is -- its kept columns, then
    -1 for every distractor column (the layout :func:`materialize_batch` writes)."""
    return np.stack([np.concatenate([p.keep_columns, np.full(p.n_distractors, -1, dtype=np.int64)])
                     for p in plans]).astype(np.int64)


def reference_batch(plans: Sequence[ContextPlan], reference_rows: np.ndarray) -> np.ndarray:
    """float32 [B, N', F'+d]: the reference rows laid out like each plan's context -- the plan's kept
    columns of C', then its distractor columns. Distractors are noise drawn for the probe, so their
    statistics are the context's own: N' evenly spaced order statistics of each distractor column over
    the context rows, which depend on the rows as a multiset only (so contexts that a row-order-invariant
    model treats as identical get identical references)."""
    ref = np.asarray(reference_rows, dtype=np.float32)
    out = []
    for plan in plans:
        kept = ref[:, plan.keep_columns]
        rows = plan.distractors[:-1]
        noise = np.sort(rows, axis=0)[np.arange(ref.shape[0]) * rows.shape[0] // ref.shape[0]]
        out.append(np.concatenate([kept, noise], axis=1))
    return np.ascontiguousarray(np.stack(out), dtype=np.float32)


CPU_MAX_TOKENS = 4096  # tokens (context + query rows) per CPU forward call: measured on pfn-mini (random tables of
# 11 tokens), ~5% more CPU time per token at 20k tokens per call than at 2-4k; on digits' score call ~2%
MERGE_BELOW = 256  # tokens: shape groups smaller than this are merged with others (merge_small_groups)
MERGE_MAX_PADDING = 1.3  # padded tokens / real tokens of a merged call at most


def _chunk_size(batch: int, shape: Any, max_batch: int | None, device: torch.device) -> int:
    """Contexts per forward call of a group of ``shape``: ``batch``, capped on CPU at CPU_MAX_TOKENS tokens."""
    if max_batch is not None or device.type != "cpu":
        return batch
    return max(1, min(batch, CPU_MAX_TOKENS // (int(shape.n_rows) + 1)))


def _can_pad(model: Any, plan: ProbePlan) -> bool:
    """Contexts may be padded with zero-weight rows: the model takes row weights, where a row of weight 0 is
    no row (pfn-mini: exp(logit + log 0) = 0; tests/test_fast_forward.py), and it does not normalise
    features over the context (reference statistics). Padding adds rows, not columns, so a column layout
    (per context) is unaffected."""
    return (plan.row_weights is not None and bool(getattr(model, "supports_context_weights", False))
            and not getattr(model, "normalizes_over_context", False))


def merge_small_groups(groups: Groups) -> Groups:
    """Shape groups of fewer than MERGE_BELOW tokens merged, within one feature count (kept + distractor
    columns), into groups whose contexts are padded to the largest row count among them: one forward call
    instead of several small ones, whose fixed cost per call their few tokens do not amortise. Groups taken
    in order of row count; a merged group closes when the next would push its padded tokens past
    MERGE_MAX_PADDING x its real tokens. The merged group's shape is that largest shape (rows padded to)."""
    out: list[tuple[Any, tuple[int, ...]]] = []
    small: dict[int, list[tuple[Any, tuple[int, ...]]]] = {}
    for shape, indices in groups:
        if len(indices) * (shape.n_rows + 1) < MERGE_BELOW:
            small.setdefault(shape.n_kept + shape.n_distractors, []).append((shape, indices))
        else:
            out.append((shape, indices))
    for members in small.values():
        members.sort(key=lambda g: g[0].n_rows)
        bins: list[list[tuple[Any, tuple[int, ...]]]] = []
        for group in members:
            if bins:
                candidate = bins[-1] + [group]
                real = sum(len(idx) * (shape.n_rows + 1) for shape, idx in candidate)
                padded = sum(len(idx) for _, idx in candidate) * (group[0].n_rows + 1)
                if padded <= MERGE_MAX_PADDING * real:
                    bins[-1] = candidate
                    continue
            bins.append([group])
        out += [(merged[-1][0], tuple(i for _, idx in merged for i in idx)) for merged in bins]
    return tuple(out)


def _materialize_padded(plan: ProbePlan, chunk: Sequence[int], query_rows: np.ndarray,
                        n_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``materialize_batch`` for plans of several row counts (one feature count): context_x [B, n_rows, F],
    context_y [B, n_rows], query_x [B, F] and row weights [B, n_rows], each context's rows padded with zero
    features, label 0 and weight 0 after its own."""
    assert plan.row_weights is not None
    q = plan.queries
    entries = [plan.planned[i] for i in chunk]
    n_features = entries[0].plan.n_kept + entries[0].plan.n_distractors
    batch = len(entries)
    context_x = np.zeros((batch, n_rows, n_features), dtype=np.float32)
    context_y = np.zeros((batch, n_rows), dtype=np.int64)
    query_x = np.empty((batch, n_features), dtype=np.float32)
    row_weight = np.zeros((batch, n_rows), dtype=np.float32)
    by_rows: dict[int, list[int]] = {}
    for b, entry in enumerate(entries):
        by_rows.setdefault(entry.plan.n_rows, []).append(b)
    for rows, positions in by_rows.items():
        at = np.asarray(positions)
        cx, cy, qx = materialize_batch([entries[b].plan for b in positions], q.features[query_rows[at]])
        context_x[at, :rows], context_y[at, :rows], query_x[at] = cx, cy, qx
        row_weight[at, :rows] = np.stack([plan.row_weights[chunk[b]] for b in positions])
    return context_x, context_y, query_x, row_weight


def _chunk_batch(plan: ProbePlan, chunk: Sequence[int], device: torch.device) -> tuple[ContextBatch, np.ndarray]:
    """The forward inputs of ``chunk`` (plan indices of one shape, or of a merged group) and each context's
    query row."""
    q = plan.queries
    entries = [plan.planned[i] for i in chunk]
    query_rows = np.fromiter((e.query_index for e in entries), dtype=np.int64, count=len(entries))
    n_rows = {e.plan.n_rows for e in entries}
    weight = None  # only models that take row multiplicities get them
    if len(n_rows) == 1:
        context_x, context_y, query_x = materialize_batch([e.plan for e in entries], q.features[query_rows])
        if plan.row_weights is not None:
            weight = torch.from_numpy(np.stack([plan.row_weights[i] for i in chunk])).to(device)  # [B, N]
    else:  # a merged chunk (merge_small_groups): each shape materialised, padded to N rows of weight 0
        assert plan.row_weights is not None
        context_x, context_y, query_x, row_weight = _materialize_padded(plan, chunk, query_rows, max(n_rows))
        weight = torch.from_numpy(row_weight).to(device)
    batch = ContextBatch(torch.from_numpy(context_x).to(device),  # [B, N, F']
                         torch.from_numpy(context_y).to(device),  # [B, N]
                         torch.from_numpy(query_x)[:, None, :].to(device),  # [B, 1, F']
                         weight)
    return batch, query_rows


def _score_chunk(model: Any, plan: ProbePlan, chunk: Sequence[int], device: torch.device,
                 decimals: int | None = None) -> dict[str, np.ndarray]:
    q = plan.queries
    entries = [plan.planned[i] for i in chunk]
    batch, query_rows = _chunk_batch(plan, chunk, device)
    reference = None
    if getattr(model, "normalizes_over_context", False) and q.reference_rows is not None:
        reference = torch.from_numpy(reference_batch([e.plan for e in entries], q.reference_rows)).to(device)
    layout_hook = getattr(model, "column_layout", None)
    layout = torch.from_numpy(column_layout([e.plan for e in entries]))
    weights = {} if batch.context_weight is None else {"context_weight": batch.context_weight}
    with contextlib.ExitStack() as stack:
        if reference is not None:
            stack.enter_context(model.feature_statistics(reference))
        if layout_hook is not None:
            stack.enter_context(layout_hook(layout))
        log_probs = model.log_probs(batch.context_x, batch.context_y, batch.query_x, q.n_classes, **weights)[:, 0]  # [B, C]
    return distribution_scores(log_probs, torch.from_numpy(q.labels[query_rows]), decimals)


def _packs(model: Any, device: torch.device, max_batch: int | None) -> bool:
    """Forward calls hold several shape groups (:func:`pack_groups`): CPU, default call sizes, and a model
    whose ``log_probs_many`` runs batches of any shapes in one pass (and reads no per-call hooks)."""
    return (bool(getattr(model, "packs_batches", False)) and device.type == "cpu" and max_batch is None
            and not getattr(model, "normalizes_over_context", False))


def pack_groups(groups: Groups, max_tokens: int = CPU_MAX_TOKENS) -> list[list[tuple[int, ...]]]:
    """Shape groups cut into forward calls of at most ``max_tokens`` tokens (context + query rows), each call a
    list of chunks of one group's contexts: groups in order, a call filled before the next opens, a group
    split between calls at a context boundary (a context larger than ``max_tokens`` gets a call of its own).
    Every context lands in exactly one chunk, in its group's order."""
    calls: list[list[tuple[int, ...]]] = []
    current: list[tuple[int, ...]] = []
    room = max_tokens
    for shape, indices in groups:
        tokens = int(shape.n_rows) + 1
        start = 0
        while start < len(indices):
            fits = room // tokens
            if fits <= 0 and current:
                calls.append(current)
                current, room = [], max_tokens
                continue
            take = min(len(indices) - start, max(1, fits))
            current.append(tuple(indices[start:start + take]))
            room -= take * tokens
            start += take
    if current:
        calls.append(current)
    return calls


def _score_packed(model: Any, plan: ProbePlan, chunks: Sequence[Sequence[int]],
                  device: torch.device, decimals: int | None = None) -> list[dict[str, np.ndarray]]:
    """The scores of several chunks (of different shapes) from one ``log_probs_many`` call."""
    q = plan.queries
    inputs = [_chunk_batch(plan, chunk, device) for chunk in chunks]
    log_probs = model.log_probs_many([batch for batch, _ in inputs], q.n_classes)
    return [distribution_scores(lp[:, 0], torch.from_numpy(q.labels[query_rows]), decimals)
            for lp, (_, query_rows) in zip(log_probs, inputs)]


class ICLPredictions(NamedTuple):
    """Ordinary in-context prediction per query (members then non-members, ``ProbeQueries`` order)."""

    loss: np.ndarray  # float32 [2Q] cross-entropy of the label as probed (members: the label trained on)
    p_true: np.ndarray  # float32 [2Q] p(label as probed)
    correct: np.ndarray  # bool [2Q] the most probable candidate is the label as probed
    # the same two on the table's own labels (task.original_labels): under a shuffled label mode the labels
    # as probed are permuted ones, and whether the model still predicts the task (collapse) is read here
    loss_original: np.ndarray  # float32 [2Q]
    p_original: np.ndarray  # float32 [2Q]


@torch.no_grad()
def icl_log_probs(model: Any, task: Any, query_features: np.ndarray, columns: Any = None) -> torch.Tensor:
    """Log-probs [M, C] (on CPU) of the model's ordinary in-context prediction of ``query_features``
    (float32 [M, F]) with the task's fine-tuning context C' and the labels the run trained on."""
    model.module.eval()
    device = model_device(model)
    _use_columns(model, columns if columns is not None else getattr(task, "columns", None))
    features = torch.from_numpy(np.array(task.features, dtype=np.float32))
    labels = torch.from_numpy(np.array(task.labels, dtype=np.int64))
    ctx = torch.from_numpy(np.array(task.context_idx))
    log_probs: torch.Tensor = model.log_probs(
        features[ctx][None].to(device), labels[ctx][None].to(device),
        torch.from_numpy(np.array(query_features, dtype=np.float32))[None].to(device), int(task.n_classes),
    )[0].cpu()
    return log_probs


def icl_predictions(model: Any, task: Any) -> ICLPredictions:
    """Ordinary in-context prediction of members and non-members with the fine-tuning context C'.

    The inputs of the loss ratio L_FT / L_base, of output_std, and of the utility columns (member and
    non-member ICL accuracy).
    """
    queries = ProbeQueries.from_task(task)
    log_probs = icl_log_probs(model, task, queries.features, queries.columns)  # [2Q, C]
    true_labels = torch.from_numpy(queries.labels)
    scores = distribution_scores(log_probs, true_labels)
    correct = (log_probs.argmax(dim=1) == true_labels).numpy()
    idx = np.concatenate([np.asarray(task.member_idx), np.asarray(task.nonmember_idx)])
    original = distribution_scores(log_probs, torch.from_numpy(np.asarray(task.original_labels, np.int64)[idx]))
    return ICLPredictions(scores["loss"], scores["confidence"], correct, original["loss"], original["confidence"])
