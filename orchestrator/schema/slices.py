"""The risk report's slices: which groups of a task's rows each row belongs to, by row id, never by value.

A slice is a family (:class:`iclmem.vocab.SliceFamily`) and a name. The rows are the task's rows as Stage I
cleans and encodes them (``trainables.data.table.build_table``: the same deduplication, so the row ids are the
ones the audit's query tables hold), and the source table's own columns for the categorical and user slices.

**No row value reaches a slice's name**: a class, category level or user-column level is named only when at
least ``min_group_rows`` rows of the task share it (a group, not a record; below that it is pooled into an
unnamed "fewer than N rows" slice); a numeric user column is cut at its quartiles and the slice names the
quartile, not its edges. A canary's planted value, held by one row, can therefore never be a slice's name
(``tests/test_record_risk_report.py`` plants one and scans every file written).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from iclmem.errors import ConfigError
from iclmem.vocab import SliceFamily

__all__ = ["SLICE_COLUMNS", "SliceSettings", "task_slices", "slice_masks"]

SLICE_COLUMNS: tuple[str, ...] = ("task", "row_id", "family", "slice")


@dataclass(frozen=True)
class SliceSettings:
    """The risk report's slicing (``report.slices`` in a sweep; its defaults are these)."""

    by: tuple[SliceFamily, ...] = (SliceFamily.CLASS, SliceFamily.OUTLIER, SliceFamily.NEAR_DUPLICATES,
                                   SliceFamily.RARE_CATEGORIES)
    columns: tuple[str, ...] = ()  # source-table columns to slice by (family ``column``)
    outlier_quantiles: tuple[float, ...] = (0.5, 0.9)  # cut points of the outlier score's bins
    neighbours: int = 5  # the outlier score: mean distance to this many nearest rows
    near_duplicate_radius: float = 0.1  # x the median nearest-row distance: closer rows are near-duplicates
    rare_level_rows: int = 10  # a category level held by fewer rows of the task is rare
    min_group_rows: int = 10  # a level is named only when at least this many rows share it
    top_k: int = 20  # riskiest member rows listed per task
    permutations: int = 500  # of the "leaks more than the rest" test, per slice


def _standardised(features: np.ndarray) -> np.ndarray:
    x = np.asarray(features, dtype=np.float64)
    x = np.where(np.isfinite(x), x, np.nan)
    centre = np.nanmean(x, axis=0) if x.size else np.zeros(x.shape[1])
    x = np.where(np.isnan(x), centre, x)
    scale = x.std(axis=0)
    out: np.ndarray = (x - x.mean(axis=0)) / np.where(scale > 0, scale, 1.0)
    return out


def _neighbour_distances(features: np.ndarray, k: int) -> np.ndarray:
    """[n, k] distances to each row's k nearest other rows in the standardised encoded space."""
    from sklearn.neighbors import NearestNeighbors

    x = _standardised(features)
    k = min(k, x.shape[0] - 1)
    distances, _ = NearestNeighbors(n_neighbors=k + 1).fit(x).kneighbors(x)
    out: np.ndarray = distances[:, 1:]  # the first neighbour is the row itself
    return out


def _quantile_label(low: float, high: float) -> str:
    return f"{low * 100:g}-{high * 100:g}% (most typical first)" if low == 0 else f"{low * 100:g}-{high * 100:g}%"


def _outlier_slices(distances: np.ndarray, quantiles: tuple[float, ...]) -> list[str]:
    score = distances.mean(axis=1)
    cuts = np.quantile(score, quantiles) if len(quantiles) else np.array([])
    edges = (0.0, *quantiles, 1.0)
    bins = np.searchsorted(cuts, score, side="right")
    return [f"outlier score {_quantile_label(edges[b], edges[b + 1])}" for b in bins]


def _near_duplicate_slices(distances: np.ndarray, radius: float) -> list[str]:
    nearest = distances[:, 0]
    positive = nearest[nearest > 0]
    scale = float(np.median(positive)) if positive.size else 0.0
    close = (distances <= radius * scale).sum(axis=1)
    return ["near-duplicates: 1 or more" if c > 0 else "near-duplicates: none" for c in close]


def _level_slices(column: str, values: pd.Series, min_rows: int) -> list[str | None]:
    """A categorical column's slice per row: the level when ``min_rows`` rows share it, else pooled."""
    counts = values.value_counts(dropna=True)
    named = set(counts.index[counts >= min_rows])
    return [None if pd.isna(v) else f"{column} = {v}" if v in named else f"{column}: levels of fewer than {min_rows} rows"
            for v in values]


def _is_categorical(values: pd.Series) -> bool:
    return not (pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values))


def _column_slices(column: str, values: pd.Series, min_rows: int) -> list[str | None]:
    """A user column's slice per row: its levels (pooled below ``min_rows``), or its quartiles when numeric
    with more than four distinct values."""
    if _is_categorical(values) or values.nunique(dropna=True) <= 4:
        return _level_slices(column, values.astype(object), min_rows)
    ranks = values.rank(method="first", pct=True)
    quartile = np.ceil(ranks * 4).clip(1, 4)
    return [None if pd.isna(q) else f"{column}: quartile {int(q)} of 4" for q in quartile]


def _rare_level_slices(frame: pd.DataFrame, target: str, rare_rows: int) -> dict[str, list[bool]]:
    """Per categorical column with a rare level (held by fewer than ``rare_rows`` rows): which rows hold one."""
    out: dict[str, list[bool]] = {}
    for column in frame.columns:
        if column == target or not _is_categorical(frame[column]):
            continue
        values = frame[column].map(repr).where(frame[column].notna())
        counts = values.value_counts(dropna=True)
        rare = values.map(counts).lt(rare_rows) & values.notna()
        if bool(rare.any()):
            out[f"{column}: rare level (fewer than {rare_rows} rows)"] = rare.tolist()
    return out


def task_slices(task: str, features: np.ndarray, labels: np.ndarray, class_names: tuple[str, ...],
                row_ids: np.ndarray, frame: pd.DataFrame, target: str, settings: SliceSettings) -> pd.DataFrame:
    """Every (row, slice) of one task: columns :data:`SLICE_COLUMNS`, one row per slice a row belongs to.

    ``features`` [n, f], ``labels`` [n] and ``row_ids`` [n] are Stage I's cleaned, encoded table
    (``build_table``); ``frame`` is the source table as read (row ``row_ids[i]`` of it is row i); ``target``
    its target column. A user column the table lacks is a :class:`ConfigError` naming it and the columns it has."""
    row_ids = np.asarray(row_ids, dtype=np.int64)
    raw = frame.iloc[row_ids].reset_index(drop=True)
    missing = [c for c in settings.columns if c not in raw.columns]
    if missing:
        raise ConfigError(f"report.slices.columns: task {task!r} has no column(s) {missing}; its columns are "
                          f"{[str(c) for c in raw.columns]}")
    if any(c == target for c in settings.columns):
        raise ConfigError(f"report.slices.columns: {target!r} is task {task!r}'s target; slice by it with "
                          f"report.slices.by: [class]")
    rows: list[tuple[int, str, str]] = []

    def add(family: SliceFamily, names: list[str | None] | list[str]) -> None:
        rows.extend((int(r), family.value, n) for r, n in zip(row_ids, names, strict=True) if n is not None)

    by = set(settings.by)
    if SliceFamily.CLASS in by:
        labels = np.asarray(labels, dtype=np.int64)
        counts = np.bincount(labels, minlength=len(class_names))
        add(SliceFamily.CLASS, [f"class {class_names[y]}" if counts[y] >= settings.min_group_rows
                                else f"a class of fewer than {settings.min_group_rows} rows" for y in labels])
    if by & {SliceFamily.OUTLIER, SliceFamily.NEAR_DUPLICATES} and len(row_ids) > 1:
        distances = _neighbour_distances(features, settings.neighbours)
        if SliceFamily.OUTLIER in by:
            add(SliceFamily.OUTLIER, _outlier_slices(distances, settings.outlier_quantiles))
        if SliceFamily.NEAR_DUPLICATES in by:
            add(SliceFamily.NEAR_DUPLICATES, _near_duplicate_slices(distances, settings.near_duplicate_radius))
    if SliceFamily.RARE_CATEGORIES in by:
        for name, flags in _rare_level_slices(raw, target, settings.rare_level_rows).items():
            add(SliceFamily.RARE_CATEGORIES, [name if f else None for f in flags])
    for column in settings.columns:
        add(SliceFamily.COLUMN, _column_slices(column, raw[column], settings.min_group_rows))
    out = pd.DataFrame(rows, columns=["row_id", "family", "slice"])
    out.insert(0, "task", task)
    return out


def slice_masks(slices: pd.DataFrame, row_ids: Any) -> dict[tuple[str, str], np.ndarray]:
    """(family, slice) -> boolean mask over ``row_ids`` (an audit's rows, in its order), from one task's
    :func:`task_slices` table; a slice none of the rows belongs to, or every row does, is left out (it contrasts
    nothing)."""
    ids = np.asarray(row_ids, dtype=np.int64)
    out: dict[tuple[str, str], np.ndarray] = {}
    for (family, name), group in slices.groupby(["family", "slice"], sort=False):
        mask = np.isin(ids, group["row_id"].to_numpy(np.int64))
        if mask.any() and not mask.all():
            out[(str(family), str(name))] = mask
    return out
