"""Stage I end to end: :func:`prepare_task` turns a task source into a :class:`PreparedTask`, in named steps.

The contract is ``docs/INTERFACES.md`` (PreparedTask) and the "Stage I — ground truth" section of the
method spec. The steps: check the arguments; settle the settings and the source, and name the result (its
fingerprint, :mod:`trainables.data.cache`); build the cleaned, encoded table (:mod:`trainables.data.table`);
under ``shuffled_all`` permute the labels over the whole table; check there are rows enough; draw the split
until one passes the distribution and blind checks (:mod:`trainables.data.split`); assemble the task and its
split report. :func:`load_or_prepare` is the same, cached on disk under the fingerprint.
"""

from __future__ import annotations

import os

import numpy as np

from iclmem.errors import ConfigError
from iclmem.vocab import LabelDesign, LabelMode
from trainables.data.cache import load_prepared, resolved_fingerprint, save_prepared, task_fingerprint
from trainables.data.sources import resolve_source
from trainables.data.split import (
    STREAM_SHUFFLE_ALL,
    AcceptedSplit,
    check_sizes,
    draw_accepted_split,
    split_label_design,
    stream_rng,
)
from trainables.data.table import Table, build_table
from trainables.data.task import (
    DEFAULT_SETTINGS,
    PreparedTask,
    PrepSettings,
    SplitReport,
    TaskSource,
    effective_settings,
    is_int,
)

__all__ = ["prepare_task", "load_or_prepare"]


def prepare_task(
    source: TaskSource,
    settings: PrepSettings = DEFAULT_SETTINGS,
    label_mode: LabelMode | str = LabelMode.NORMAL,
    seed: int = 0,
    q: int | None = None,
    context_size: int | None = None,
) -> PreparedTask:
    """Load, clean, encode and split one task (spec Stage I). `q` / `context_size` override settings."""
    label_mode = _checked_label_mode(label_mode, seed)
    settings = effective_settings(settings, q, context_size)
    resolved = resolve_source(source)
    fingerprint = resolved_fingerprint(resolved, settings, label_mode, seed)
    # called from here and nowhere else: the warnings of build_table's steps name prepare_task's caller
    table = build_table(resolved, settings)
    labels, target_values = _labels_before_split(table, label_mode, seed)
    alloc, per_class = check_sizes(source.name, table, labels, settings)
    design = split_label_design(settings, label_mode)
    accepted = draw_accepted_split(source.name, table, labels, target_values, alloc, per_class, settings, label_mode,
                                   design, seed)
    return _prepared_task(source.name, table, label_mode, seed, fingerprint, accepted, per_class, design)


def _checked_label_mode(label_mode: LabelMode | str, seed: int) -> LabelMode:
    """The label mode as a LabelMode; refuses a negative or non-integer seed first, then an unknown mode."""
    if not is_int(seed) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    try:
        return LabelMode(label_mode)
    except ValueError:
        raise ConfigError(
            f"unknown label_mode {label_mode!r}; expected one of {', '.join(m.value for m in LabelMode)}"
        ) from None


def _labels_before_split(table: Table, label_mode: LabelMode, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Copies of the table's labels (and regression values) the split is drawn on."""
    labels = table.labels.copy()
    target_values = None if table.target_values is None else table.target_values.copy()
    if label_mode is LabelMode.SHUFFLED_ALL:
        # Before the split, over the whole table: the split below is then stratified by (and the
        # context uniform over) the labels the model is actually trained on.
        perm = stream_rng(seed, STREAM_SHUFFLE_ALL).permutation(len(labels))
        labels = labels[perm]
        if target_values is not None:
            target_values = target_values[perm]
    return labels, target_values


def _prepared_task(name: str, table: Table, label_mode: LabelMode, seed: int, fingerprint: str,
                   accepted: AcceptedSplit, per_class: int, design: LabelDesign) -> PreparedTask:
    """The prepared task of the accepted draw, with the split report of the whole preparation."""
    split, blind, redraws = accepted.split, accepted.blind, accepted.redraws
    report = SplitReport(
        **table.counts,
        split_seed=seed + redraws,
        redraws=redraws,
        context_per_class=per_class,
        tvd=split.tvd,
        ks=split.ks,
        ks_pvalue=split.ks_pvalue,
        wasserstein=split.wasserstein,
        label_design=design.value,
        blind_auc=blind.auc,
        blind_auc_low=blind.auc_low,
        blind_auc_high=blind.auc_high,
        blind_redraws=accepted.blind_redraws,
    )
    return PreparedTask(
        name=name,
        task_kind=table.task,
        label_mode=label_mode,
        seed=int(seed),
        features=table.features,
        labels=accepted.labels,
        original_labels=table.labels,
        row_ids=table.row_ids,
        class_names=table.class_names,
        member_idx=split.members,
        nonmember_idx=split.nonmembers,
        context_idx=split.context,
        split_report=report,
        fingerprint=fingerprint,
        target_values=accepted.target_values,
        bin_edges=table.bin_edges,
        columns=table.columns,
    )


def load_or_prepare(
    source: TaskSource,
    settings: PrepSettings = DEFAULT_SETTINGS,
    label_mode: LabelMode | str = LabelMode.NORMAL,
    seed: int = 0,
    q: int | None = None,
    context_size: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> PreparedTask:
    """`prepare_task`, cached on disk under the fingerprint when `cache_dir` is given."""
    if cache_dir is None:
        return prepare_task(source, settings, label_mode, seed, q, context_size)
    fingerprint = task_fingerprint(source, settings, label_mode, seed, q, context_size)
    cached = load_prepared(fingerprint, cache_dir)
    if cached is not None:
        return cached
    task = prepare_task(source, settings, label_mode, seed, q, context_size)
    save_prepared(task, cache_dir)
    return task
