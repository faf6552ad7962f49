"""Splits derived from a prepared task: the null splits, the reference models' halves, and the ground-truth log.

A null split (:func:`null_split`) is a fake member / non-member split of rows the run never saw: probed like
the real one, its memorization verdicts are false positives by construction. A reference half
(:func:`reference_half`) is which half of a target's population reference model ``index`` trains on. Both
are drawn from streams of their own (:mod:`trainables.data.split`), so the same task and index always give
the same rows. :func:`ground_truth_log` records which rows played which part (spec Stage I.6).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

from iclmem.errors import ConfigError, DataError
from trainables.data.split import STREAM_NULL, STREAM_REFERENCE
from trainables.data.task import PreparedTask, is_int

__all__ = ["null_split", "null_split_task", "reference_half", "reference_task", "ground_truth_log"]


def null_split(task: PreparedTask, index: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``index``-th null split of a task: positions (into the task's arrays) of a fake "member" set and
    a fake "non-member" set, two disjoint sets of rows the run never saw (neither members, nor
    non-members, nor the context C'), with the members' label counts on both sides.

    Probed on a fine-tuned checkpoint exactly like the real split, its memorization verdicts are false
    positives by construction, so their share measures the verdict rule's false-positive rate. Each split
    is drawn afresh from the unused rows (splits of one task may share rows; within a split the two sides
    never do), from a stream of its own: the same task and index always give the same split. When a class
    has too few unused rows, every class's count is scaled down by the same factor (the label distribution
    stays that of the members, the split is smaller: its sizes are recorded in the results row)."""
    if not is_int(index) or index < 0:
        raise ConfigError(f"null split index must be a non-negative integer, got {index!r}")
    n_classes = task.n_classes
    used = np.zeros(len(task.labels), dtype=bool)
    used[task.member_idx] = used[task.nonmember_idx] = used[task.context_idx] = True
    labels = np.asarray(task.labels)
    want = np.bincount(labels[task.member_idx], minlength=n_classes)
    free = [np.flatnonzero(~used & (labels == c)) for c in range(n_classes)]
    scale = min([1.0] + [len(free[c]) // 2 / want[c] for c in range(n_classes) if want[c] > 0])
    take = np.floor(want * scale + 1e-9).astype(np.int64)
    if take.sum() < 2:
        raise DataError(
            f"task {task.name!r}: too few rows outside the members, non-members and context for a null split "
            f"({int((~used).sum())} unused rows); lower q or context_size, or set probe.null_splits: 0"
        )
    rng = np.random.default_rng([STREAM_NULL, int(task.seed), int(index)])
    fake_members, fake_nonmembers = [], []
    for c in range(n_classes):
        rows = rng.permutation(free[c])[: 2 * take[c]]
        fake_members.append(rows[: take[c]])
        fake_nonmembers.append(rows[take[c]:])
    return (np.sort(np.concatenate(fake_members)).astype(np.int64),
            np.sort(np.concatenate(fake_nonmembers)).astype(np.int64))


def null_split_task(task: PreparedTask, index: int) -> PreparedTask:
    """The task with its member / non-member sets replaced by null split ``index`` (everything else, C'
    and the labels included, unchanged), so the probe code runs on it as on the real split."""
    members, nonmembers = null_split(task, index)
    return dataclasses.replace(task, member_idx=members, nonmember_idx=nonmembers)


def reference_half(n_rows: int, index: int, seed: int) -> np.ndarray:
    """bool [n]: which of the n rows of a target's population reference model ``index`` trains on.

    References come in complementary pairs (2j, 2j+1) drawn from a stream of (seed, j): with K even every
    row is "in" for exactly half of the references (an odd last one takes a random half alone), every
    reference trains on half of the rows, and reference k's half does not depend on K (adding references
    keeps the earlier ones)."""
    if n_rows < 2 or not is_int(index) or index < 0:
        raise ConfigError(f"a reference half needs >= 2 rows and an index >= 0, got {n_rows}, {index!r}")
    rng = np.random.default_rng([STREAM_REFERENCE, int(seed), int(index) // 2])
    half = np.zeros(n_rows, dtype=bool)
    half[rng.permutation(n_rows)[: n_rows // 2]] = True
    return half if index % 2 == 0 else ~half


def reference_task(task: PreparedTask, index: int) -> PreparedTask:
    """The task reference model ``index`` of a target run fine-tunes and is probed on: the target's
    population P = members + non-members (in that order) cut by :func:`reference_half` into its members
    and its non-members; C', the labels (a shuffled_members target's shuffled member labels included, so
    "in" means trained on the same row and label) and every other field unchanged. It has a fingerprint of
    its own, covering its member set, so nothing keyed by fingerprint (probe plans, cached base-model
    scores) is shared with the target or another reference. Its ``canary_label`` is the target's rare_label
    canary label, so a reference with canaries trains on exactly the target's canaries (same rows, copies and
    labels: the canaries' draws depend on nothing else its half changes), not on ones drawn under the
    rarest label of its own half."""
    from trainables.canaries import canary_label

    population = np.concatenate([task.member_idx, task.nonmember_idx])
    half = reference_half(len(population), index, task.seed)
    members, nonmembers = np.sort(population[half]), np.sort(population[~half])
    digest = hashlib.sha256(f"{task.fingerprint}|reference|{int(index)}|".encode() + members.astype(np.int64).tobytes())
    return dataclasses.replace(task, member_idx=members, nonmember_idx=nonmembers, fingerprint=digest.hexdigest(),
                               canary_label=canary_label(task))


def ground_truth_log(task: PreparedTask, null_splits: int = 0) -> dict[str, Any]:
    """The spec's ground-truth record (Stage I.6): which rows played which part, and the labels trained on;
    with ``null_splits`` also the row ids of each null split probed (see :func:`null_split`)."""

    def ids(idx: np.ndarray) -> list[int]:
        return [int(v) for v in task.row_ids[idx]]

    def labels(values: np.ndarray, idx: np.ndarray) -> list[int]:
        return [int(v) for v in values[idx]]

    return {
        "task": task.name,
        "fingerprint": task.fingerprint,
        "task_kind": task.task_kind.value,
        "label_mode": task.label_mode.value,
        "label_design": task.split_report.label_design,
        "seed": task.seed,
        "split_seed": task.split_report.split_seed,
        "class_names": list(task.class_names),
        "member_row_ids": ids(task.member_idx),
        "nonmember_row_ids": ids(task.nonmember_idx),
        "context_row_ids": ids(task.context_idx),
        "member_labels": labels(task.labels, task.member_idx),
        "nonmember_labels": labels(task.labels, task.nonmember_idx),
        "context_labels": labels(task.labels, task.context_idx),
        "member_original_labels": labels(task.original_labels, task.member_idx),
        "nonmember_original_labels": labels(task.original_labels, task.nonmember_idx),
        "context_original_labels": labels(task.original_labels, task.context_idx),
        "split_report": task.split_report.to_dict(),
        # each null split's rows with the labels they are probed with and their true labels
        "null_splits": [
            {"index": j, "member_row_ids": ids(m), "nonmember_row_ids": ids(n),
             "member_labels": labels(task.labels, m), "nonmember_labels": labels(task.labels, n),
             "member_original_labels": labels(task.original_labels, m),
             "nonmember_original_labels": labels(task.original_labels, n)}
            for j, (m, n) in ((j, null_split(task, j)) for j in range(null_splits))
        ],
    }
