"""Cleaning: a source's raw table into the deduplicated, labelled, encoded table the split is drawn from.

:func:`build_table` in three steps: the rows are cleaned (missing targets, all-missing columns, duplicate
rows and feature vectors dropped; a target repeated among the features refused), the target becomes labels
(classes, or a regression target's quantile bins) and the feature columns are encoded for the settings'
input contract (:mod:`trainables.data.encoding`). Everything is fitted once on the whole cleaned table.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from iclmem.errors import DataError
from iclmem.vocab import ColumnKind, InputContract, TaskKind
from trainables.data.encoding import Encoded, encode_cells, encode_features, reduce_features
from trainables.data.sources import ResolvedSource, read_frame
from trainables.data.task import DISTRACTOR_COLUMNS, FeatureColumn, PrepSettings, TableColumns

__all__ = ["INFER_REGRESSION_MIN_UNIQUE", "Table", "build_table"]


# Above this many distinct values a numeric target with no declared task kind is taken as regression.
INFER_REGRESSION_MIN_UNIQUE = 20


# --------------------------------------------------------------------------------------------------
# The table the split is drawn from
# --------------------------------------------------------------------------------------------------


@dataclass
class Table:
    """The deduplicated, encoded task before the split."""

    features: np.ndarray  # float32
    labels: np.ndarray  # int64 true labels
    target_values: np.ndarray | None  # float64 true regression target
    row_ids: np.ndarray
    class_names: tuple[str, ...]
    bin_edges: tuple[float, ...] | None
    task: TaskKind
    counts: dict[str, Any]
    columns: TableColumns


def build_table(resolved: ResolvedSource, settings: PrepSettings) -> Table:
    """Clean a source's rows, label them and encode their features: the three steps below, in order.

    Called by ``prepare_task`` itself: the warnings of the steps name prepare_task's caller (their
    stacklevel counts the frames of build_table and prepare_task)."""
    name, target = resolved.source.name, resolved.target
    rows = _clean_rows(resolved)
    labelled = _target_labels(rows.frame[target], resolved.task, target, name, settings)
    features = _encode_for_contract(rows.frame[rows.feature_columns], settings, name)
    encoded = features.encoded
    return Table(
        features=np.ascontiguousarray(features.matrix, dtype=np.float32),
        labels=labelled.labels,
        target_values=labelled.values,
        row_ids=rows.frame.index.to_numpy(dtype=np.int64),
        class_names=labelled.class_names,
        bin_edges=labelled.bin_edges,
        task=labelled.task,
        counts=dict(
            **rows.counts,
            n_numeric_columns=encoded.n_numeric,
            n_categorical_columns=encoded.n_categorical,
            n_date_columns=encoded.n_dates,
            n_encoded_features=int(encoded.matrix.shape[1]),
            pca_explained_variance=features.explained,
            input_contract=settings.contract.value,
            pca_reason=features.reason,
        ),
        columns=TableColumns(settings.contract, target, tuple(features.columns)),
    )


# --------------------------------------------------------------------------------------------------
# Step 1: cleaning the rows
# --------------------------------------------------------------------------------------------------


@dataclass
class _Rows:
    """The source's rows left after cleaning (feature columns, then the target) and what cleaning dropped."""

    frame: pd.DataFrame  # indexed by row number in the source table as read
    feature_columns: list[str]
    # n_rows_source, n_missing_target, n_exact_duplicates, n_feature_duplicates, n_rows, dropped_columns
    counts: dict[str, Any]


def _clean_rows(resolved: ResolvedSource) -> _Rows:
    """Read the table; drop the rows with a missing target, the all-missing columns, exact copies of a row
    and every row whose feature vector another row shares; refuse a table that leaks its target."""
    name = resolved.source.name
    frame = read_frame(resolved)
    target = resolved.target
    _check_columns(frame, target, name)
    frame = frame.copy()
    frame.columns = [str(c) for c in frame.columns]
    n_rows_source = len(frame)
    # Row ids name rows of the source table as read, so the ground-truth log points at file rows.
    frame.index = pd.RangeIndex(n_rows_source)

    target_missing = frame[target].isna()
    if bool(target_missing.all()):  # said before the feature columns, which would all read "only missing" next
        raise DataError(f"task {name!r}: target column {target!r} has no values (all {n_rows_source} rows are "
                        f"missing); is {target!r} the right column?")
    frame = frame.loc[~target_missing]
    _check_leakage(frame, target, name)
    feature_columns = [c for c in frame.columns if c != target]

    dropped = tuple(c for c in feature_columns if frame[c].isna().all())
    for column in dropped:
        # stacklevel 4: _clean_rows, build_table, prepare_task, prepare_task's caller
        warnings.warn(f"task {name!r}: column {column!r} has only missing values and is dropped", stacklevel=4)
    feature_columns = [c for c in feature_columns if c not in dropped]
    if not feature_columns:
        raise DataError(f"task {name!r}: no feature columns left besides target {target!r}")
    if target in feature_columns:  # guarded by construction; kept so a refactor cannot leak the label
        raise DataError(f"task {name!r}: target column {target!r} would also be a feature")

    frame = frame[feature_columns + [target]]
    # Hashable, comparable values for duplicate detection (lists / dicts from parquet are not).
    comparable = frame.apply(lambda s: s.map(repr) if s.dtype == object else s)
    exact = comparable.duplicated(keep="first")
    frame, comparable = frame.loc[~exact], comparable.loc[~exact]
    # After exact duplicates are gone, rows sharing a feature vector disagree on the target. All of
    # them go (not all but one): keeping one would keep an arbitrary label, and any copy split across
    # members and non-members is the feature contamination the spec guards against.
    feature_dup = comparable.duplicated(subset=feature_columns, keep=False)
    frame = frame.loc[~feature_dup]

    if frame.empty:
        raise DataError(f"task {name!r}: no rows left after dropping missing targets and duplicates")
    counts = dict(
        n_rows_source=n_rows_source,
        n_missing_target=int(target_missing.sum()),
        n_exact_duplicates=int(exact.sum()),
        n_feature_duplicates=int(feature_dup.sum()),
        n_rows=len(frame),
        dropped_columns=dropped,
    )
    return _Rows(frame, feature_columns, counts)


def _check_columns(frame: pd.DataFrame, target: str, task_name: str) -> None:
    columns = [str(c) for c in frame.columns]
    duplicated = sorted({c for c in columns if columns.count(c) > 1})
    if duplicated:
        # A repeated target would otherwise slip into the features and leak the label.
        raise DataError(f"task {task_name!r}: duplicate column names {duplicated}; column names must be unique")
    if target not in columns:
        close = difflib.get_close_matches(target, columns, n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise DataError(f"task {task_name!r}: target column {target!r} not found; columns are {columns}{hint}")


def _check_leakage(frame: pd.DataFrame, target: str, task_name: str) -> None:
    """Refuse a feature column that is the target again (same values, or same name up to case):
    a model would read the label off the features and every membership signal would be an artifact."""
    target_values = frame[target]
    for column in frame.columns:
        if column == target:
            continue
        same_name = column.strip().lower() == target.strip().lower()
        if same_name or (len(frame) > 0 and frame[column].astype(str).equals(target_values.astype(str))):
            raise DataError(
                f"task {task_name!r}: target leakage: feature column {column!r} "
                f"{'has the same name as' if same_name else 'repeats'} the target column {target!r}; drop it"
            )


# --------------------------------------------------------------------------------------------------
# Step 2: the target as labels
# --------------------------------------------------------------------------------------------------


@dataclass
class _Labels:
    """The target as class labels: classes, or a regression target's quantile bins."""

    task: TaskKind
    labels: np.ndarray  # int64 true labels
    values: np.ndarray | None  # float64 true regression target; None for classification
    class_names: tuple[str, ...]
    bin_edges: tuple[float, ...] | None  # regression: the bin edges behind class_names


def _target_labels(target: pd.Series, task: TaskKind | None, column: str, name: str,
                   settings: PrepSettings) -> _Labels:
    """Label the cleaned rows: the task kind (declared, else inferred), then class codes or quantile bins;
    refuses a target with a single class."""
    task = task or _infer_task(target)
    target_values: np.ndarray | None = None
    bin_edges: tuple[float, ...] | None = None
    if task is TaskKind.REGRESSION:
        target_values = _numeric_target(target, column, name)
        labels, bin_edges, class_names = _quantile_bins(target_values, settings.regression_bins)
        if 2 <= len(class_names) < settings.regression_bins:
            warnings.warn(
                f"task {name!r}: tied values in regression target {column!r} leave {len(class_names)} quantile "
                f"bins instead of {settings.regression_bins}",
                stacklevel=4,  # _target_labels, build_table, prepare_task, prepare_task's caller
            )
    else:
        labels, class_names = _class_labels(target)

    if len(class_names) < 2:
        only = repr(class_names[0]) if class_names else "none"
        raise DataError(
            f"task {name!r}: target column {column!r} has a single class ({only}) after dropping missing "
            f"targets and duplicates; at least two are needed"
        )
    return _Labels(task, labels, target_values, class_names, bin_edges)


def _infer_task(target: pd.Series) -> TaskKind:
    numeric = pd.to_numeric(target, errors="coerce")
    n_unique = target.nunique()
    if numeric.notna().all() and n_unique > INFER_REGRESSION_MIN_UNIQUE:
        if bool(np.all(np.mod(numeric.to_numpy(dtype=np.float64), 1.0) == 0)):
            # Integer codes are as often class ids as counts; the guess decides the whole audit (bins
            # vs classes), so say which way it went and how to overrule it.
            warnings.warn(
                f"target column {target.name!r} holds {n_unique} distinct integers and is taken as regression "
                f"(cut into quantile bins); if they are class labels set `task: classification` on the task",
                stacklevel=5,  # _infer_task, _target_labels, build_table, prepare_task, prepare_task's caller
            )
        return TaskKind.REGRESSION
    return TaskKind.CLASSIFICATION


def _numeric_target(target: pd.Series, column: str, task_name: str) -> np.ndarray:
    if pd.api.types.is_bool_dtype(target):
        as_float: np.ndarray = target.to_numpy(dtype=np.float64)
        return as_float
    numeric = pd.to_numeric(target, errors="coerce").astype(np.float64)
    bad = numeric.isna() | ~np.isfinite(numeric.to_numpy())
    if bad.any():
        example = target[bad].iloc[0]
        raise DataError(
            f"task {task_name!r}: regression target column {column!r} has {int(bad.sum())} non-numeric value(s), "
            f"e.g. {example!r}"
        )
    values: np.ndarray = numeric.to_numpy()
    return values


def _quantile_bins(values: np.ndarray, n_bins: int) -> tuple[np.ndarray, tuple[float, ...], tuple[str, ...]]:
    """Cut a regression target into (at most) n_bins quantile bins: codes, edges, interval names.

    Edges are data values (inverted-CDF quantiles), so no bin is empty; tied values can merge bins,
    in which case fewer classes come out than asked for.
    """
    # Inverted-CDF quantile i/k is the ceil(i*n/k)-th smallest value; integer arithmetic because
    # float probabilities (0.6000000000000001) would shift an edge past a run of tied values. The
    # edges at 0 and 1 are the minimum and maximum, so every value has a bin.
    ordered = np.sort(values)
    n = len(ordered)
    ranks = [max((i * n + n_bins - 1) // n_bins - 1, 0) for i in range(n_bins + 1)]
    edges = np.unique(ordered[ranks])
    if len(edges) < 2:
        return np.zeros(len(values), dtype=np.int64), (float(edges[0]),), (f"[{edges[0]:.6g}, {edges[0]:.6g}]",)
    codes = np.searchsorted(edges[1:-1], values, side="left").astype(np.int64)

    def names(fmt: Callable[[float], str]) -> tuple[str, ...]:
        out = [f"[{fmt(edges[0])}, {fmt(edges[1])}]"]
        out += [f"({fmt(lo)}, {fmt(hi)}]" for lo, hi in zip(edges[1:-1], edges[2:])]
        return tuple(out)

    class_names = names(lambda v: f"{v:.6g}")
    if len(set(class_names)) < len(class_names):
        class_names = names(repr)
    return codes, tuple(float(e) for e in edges), class_names


def _class_labels(target: pd.Series) -> tuple[np.ndarray, tuple[str, ...]]:
    """Classification target -> (int64 codes, names sorted in the values' natural order)."""
    values = target
    if pd.api.types.is_float_dtype(values) and np.all(np.mod(values.to_numpy(), 1.0) == 0):
        # Integer classes read back as floats (a column with missing values) keep integer names.
        values = values.astype(np.int64)
    if pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        uniques = np.unique(values.to_numpy())
        codes = np.searchsorted(uniques, values.to_numpy()).astype(np.int64)
        return codes, tuple(str(u.item() if hasattr(u, "item") else u) for u in uniques)
    text = values.map(str).to_numpy()
    uniques = np.unique(text)
    return np.searchsorted(uniques, text).astype(np.int64), tuple(str(u) for u in uniques)


# --------------------------------------------------------------------------------------------------
# Step 3: the features for the input contract
# --------------------------------------------------------------------------------------------------


@dataclass
class _Features:
    """The feature matrix for the contract, its column descriptions, and whether (and why) PCA was applied."""

    encoded: Encoded  # the encoding before PCA (its counts go into the split report)
    matrix: np.ndarray
    explained: float | None  # share of variance PCA kept; None when it was not applied
    reason: str | None
    columns: list[FeatureColumn]


def _encode_for_contract(features: pd.DataFrame, settings: PrepSettings, name: str) -> _Features:
    """``cells``: one feature per real column, a table wider than the model takes refused; ``reduced`` /
    ``numeric``: the encoded columns, whitened PCA down to ``settings.max_features`` when wider."""
    contract = settings.contract
    if contract is InputContract.CELLS:
        if settings.max_features is not None and features.shape[1] > settings.max_features:
            raise DataError(
                f"task {name!r}: {features.shape[1]} feature columns, but a model that reads cells takes at most "
                f"{settings.max_features} (its column cap minus {DISTRACTOR_COLUMNS} probe distractor columns); "
                f"drop columns from the table"
            )
        encoded = encode_cells(features)
        return _Features(encoded, encoded.matrix, None, None, encoded.columns)
    encoded = encode_features(features)
    matrix, explained = reduce_features(encoded.matrix, settings.max_features)
    described, reason = encoded.columns, None
    if explained is not None:
        limit = ("data.max_features" if contract is InputContract.REDUCED else
                 f"the model's feature limit minus {DISTRACTOR_COLUMNS} probe distractor columns")
        reason = (f"{encoded.matrix.shape[1]} encoded features exceed {settings.max_features} ({limit}): "
                  f"whitened PCA to {settings.max_features} components")
        described = [FeatureColumn(f"component_{i + 1}", ColumnKind.COMPONENT) for i in range(matrix.shape[1])]
    return _Features(encoded, matrix, explained, reason, described)
