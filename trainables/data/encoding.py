"""Column encoding: how each table column is read (number, date or text) and turned into feature columns.

Two encodings, one per kind of model input (``iclmem.vocab.InputContract``): :func:`encode_features`
(standardized numbers, one-hot or ordinal text, for the ``reduced`` and ``numeric`` contracts, then
:func:`reduce_features`, a whitened PCA, when the table is too wide) and :func:`encode_cells` (one feature
per real column, for a model that reads cells). Each is fitted once on the whole deduplicated table,
never on a context, and describes every feature column it makes (:class:`~trainables.data.task.FeatureColumn`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from iclmem.vocab import ColumnKind
from trainables.data.task import ONE_HOT_SEPARATOR, FeatureColumn

__all__ = [
    "ONE_HOT_MAX_CATEGORIES",
    "NUMERIC_PARSE_MIN_SHARE",
    "DATE_PARSE_MIN_SHARE",
    "CELL_CLIP_QUANTILES",
    "Encoded",
    "encode_features",
    "encode_cells",
    "missing_cells",
    "reduce_features",
]


# A string column with at most this many distinct values (missing counted as one) is one-hot encoded;
# more distinct values are ordinal-encoded into a single column so the feature count stays bounded.
ONE_HOT_MAX_CATEGORIES = 10

# An object column is read as numbers when at least this share of its non-missing values parse as
# numbers (CARTE stores years and keys as strings, with a few words such as "N.V." mixed in).
NUMERIC_PARSE_MIN_SHARE = 0.9

# Same idea for dates; a stricter share because date parsing is permissive.
DATE_PARSE_MIN_SHARE = 0.95
_DATE_LIKE = re.compile(
    r"^\s*\d{1,4}[-/.]\d{1,2}[-/.]\d{1,4}"  # 2020-01-31, 31/01/2020, 31.01.20
    r"([ T]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?)?"  # optional time of day
    r"\s*(Z|[+-]\d{2}:?\d{2})?\s*$"  # optional zone
)

_MISSING_CATEGORY = "<missing>"


# --------------------------------------------------------------------------------------------------
# Reading a column: numbers, dates, text
# --------------------------------------------------------------------------------------------------


def _as_text(series: pd.Series) -> pd.Series:
    """Values as strings with missing values as their own category (missingness can be informative)."""
    return series.astype(object).where(series.notna(), _MISSING_CATEGORY).astype(str)


def _strings(series: pd.Series) -> pd.Series:
    """Stripped string values of the non-missing entries."""
    return series[series.notna()].astype(str).str.strip()


def _parse_numeric(series: pd.Series) -> pd.Series | None:
    strings = _strings(series)
    if strings.empty:
        return None
    parsed = pd.to_numeric(strings, errors="coerce")
    if parsed.notna().mean() < NUMERIC_PARSE_MIN_SHARE:
        return None
    return parsed.astype(np.float64).reindex(series.index)


def _parse_dates(series: pd.Series) -> pd.Series | None:
    strings = _strings(series)
    if strings.empty or strings.str.match(_DATE_LIKE).mean() < DATE_PARSE_MIN_SHARE:
        return None
    parsed = pd.to_datetime(strings, errors="coerce", utc=True, format="mixed")
    if parsed.notna().mean() < DATE_PARSE_MIN_SHARE:
        return None
    return parsed.reindex(series.index)


def _dates_to_days(values: pd.Series) -> pd.Series:
    if getattr(values.dt, "tz", None) is not None:
        values = values.dt.tz_convert("UTC").dt.tz_localize(None)
    as_ns = values.astype("datetime64[ns]")
    days = as_ns.astype("int64").astype(np.float64) / 86_400e9
    return days.where(as_ns.notna(), np.nan)


def missing_cells(series: pd.Series) -> np.ndarray:
    """bool [n]: the cells of a table column that hold no value as Stage I reads it (empty, or a number or date
    column's entry that does not parse): the encoders fill them in (a number column's median or mean) or code them
    as a category of their own, so the feature there is no value the row has."""
    kind, values = _column_type(series)
    missing = series.isna().to_numpy(dtype=bool)
    if values is not None:
        missing |= values.isna().to_numpy(dtype=bool)
        if kind is ColumnKind.NUMBER:
            missing |= ~np.isfinite(values.to_numpy(dtype=np.float64, na_value=np.nan))
    return np.asarray(missing, dtype=bool)


def _column_type(series: pd.Series) -> tuple[ColumnKind, pd.Series | None]:
    """How Stage I reads a table column: (NUMBER, numbers), (DATE, timestamps) or (TEXT, None).

    Object columns are parsed: CARTE stores years and keys as strings, with a few words mixed in."""
    if pd.api.types.is_bool_dtype(series) or pd.api.types.is_numeric_dtype(series):
        return ColumnKind.NUMBER, series
    if pd.api.types.is_datetime64_any_dtype(series):
        return ColumnKind.DATE, series
    parsed = _parse_numeric(series)
    if parsed is not None:
        return ColumnKind.NUMBER, parsed
    dates = _parse_dates(series)
    if dates is not None:
        return ColumnKind.DATE, dates
    return ColumnKind.TEXT, None


def _standardize(matrix: np.ndarray) -> np.ndarray:
    mean = matrix.mean(axis=0)
    std = matrix.std(axis=0)
    # Constant columns become 0 rather than NaN.
    standardized: np.ndarray = (matrix - mean) / np.where(std > 0, std, 1.0)
    return standardized


# --------------------------------------------------------------------------------------------------
# Encoding a table
# --------------------------------------------------------------------------------------------------


@dataclass
class Encoded:
    """An encoded table: its feature matrix, one description per matrix column, and how many table columns
    were read as numbers, text and dates."""

    matrix: np.ndarray  # float64 [n_rows, n_encoded]
    n_numeric: int
    n_categorical: int
    n_dates: int
    columns: list[FeatureColumn]  # one per matrix column


def encode_features(features: pd.DataFrame) -> Encoded:
    """Encode every feature column into standardized numbers, fitted on the given (whole) table.

    Why fitted once on the whole deduplicated table: a probe context may consist of identical rows,
    and statistics fitted there would map every feature to zero (spec, Stage I.1).
    """
    blocks: list[np.ndarray] = []
    columns: list[FeatureColumn] = []
    n_numeric = n_categorical = n_dates = 0

    def numeric_block(name: str, values: pd.Series, header: str) -> None:
        col = values.to_numpy(dtype=np.float64, na_value=np.nan)
        missing = ~np.isfinite(col)
        median = float(np.median(col[~missing])) if (~missing).any() else 0.0
        blocks.append(np.where(missing, median, col)[:, None])
        columns.append(FeatureColumn(header, ColumnKind.NUMBER, name))
        # A missing-value indicator keeps e.g. non-vintage wines ("N.V." in a year column) distinct
        # from the median year they are imputed with; only added when something was missing.
        if missing.any():
            blocks.append(missing.astype(np.float64)[:, None])
            columns.append(FeatureColumn(f"{name} (missing)", ColumnKind.NUMBER, name))

    for name in features.columns:
        series = features[name]
        kind, values = _column_type(series)
        if kind is ColumnKind.NUMBER:
            assert values is not None
            numeric_block(name, values, name)
            n_numeric += 1
        elif kind is ColumnKind.DATE:
            assert values is not None
            numeric_block(name, _dates_to_days(values), f"{name} (days)")
            n_dates += 1
        else:
            text = _as_text(series)
            categories = np.sort(text.unique())
            codes = np.searchsorted(categories, text.to_numpy()).astype(np.int64)
            if len(categories) <= ONE_HOT_MAX_CATEGORIES:
                blocks.append(np.eye(len(categories), dtype=np.float64)[codes])
                columns.extend(FeatureColumn(f"{name}{ONE_HOT_SEPARATOR}{c}", ColumnKind.NUMBER, name)
                               for c in categories)
            else:
                # High cardinality: one ordinal column (rank of the value among the sorted distinct
                # strings). Ordinal rather than frequency encoding because frequency maps every
                # unique value (track names, wine names) to the same number and erases the row
                # identity a memorization probe is about; ordinal keeps distinct values distinct
                # while adding a single feature, so the feature count stays bounded.
                blocks.append(codes.astype(np.float64)[:, None])
                columns.append(FeatureColumn(f"{name} (rank)", ColumnKind.NUMBER, name))
            n_categorical += 1

    matrix = np.hstack(blocks) if blocks else np.empty((len(features), 0))
    return Encoded(_standardize(matrix), n_numeric, n_categorical, n_dates, columns)


# ConTextTab's tokenizer (``is_valid=True``, its inference setting) clips a numeric column to these
# quantiles before standardising it; the cells contract does the same, once over the whole table.
CELL_CLIP_QUANTILES = (0.005, 0.995)


def encode_cells(features: pd.DataFrame) -> Encoded:
    """One feature per real table column (the cells contract), fitted once on the whole table.

    * numbers: missing cells filled with the column mean, clipped to the table's 0.5 / 99.5 % quantiles and
      standardised -- what ConTextTab's tokenizer does over a context, done once over the table because a
      zero-information probe context would standardise every column to nothing;
    * text: the integer code of the cell string (``str`` of the value, as the tokenizer embeds it, so a
      missing cell reads ``nan`` / ``None`` there and here) in the column's sorted vocabulary;
    * dates: whole days since 1970-01-01 (UTC), exact in float32, NaN when missing; the adapter decodes
      them into the model's year / month / day / weekday codes.
    """
    blocks: list[np.ndarray] = []
    columns: list[FeatureColumn] = []
    n_numeric = n_categorical = n_dates = 0
    for name in features.columns:
        series = features[name]
        kind, values = _column_type(series)
        if kind is ColumnKind.NUMBER:
            assert values is not None
            col = values.to_numpy(dtype=np.float64, na_value=np.nan)
            finite = np.isfinite(col)
            col = np.where(finite, col, col[finite].mean() if finite.any() else 0.0)
            lo, hi = np.quantile(col, CELL_CLIP_QUANTILES)
            blocks.append(_standardize(np.clip(col, lo, hi)[:, None]))
            columns.append(FeatureColumn(name, ColumnKind.NUMBER, name))
            n_numeric += 1
        elif kind is ColumnKind.DATE:
            assert values is not None
            days = np.floor(_dates_to_days(values).to_numpy(dtype=np.float64, na_value=np.nan))
            blocks.append(days[:, None])
            columns.append(FeatureColumn(name, ColumnKind.DATE, name))
            n_dates += 1
        else:
            text = series.astype(str)
            vocabulary = np.sort(text.unique())
            blocks.append(np.searchsorted(vocabulary, text.to_numpy()).astype(np.float64)[:, None])
            columns.append(FeatureColumn(name, ColumnKind.TEXT, name, tuple(str(v) for v in vocabulary)))
            n_categorical += 1
    matrix = np.hstack(blocks) if blocks else np.empty((len(features), 0))
    return Encoded(matrix, n_numeric, n_categorical, n_dates, columns)


def reduce_features(matrix: np.ndarray, max_features: int | None) -> tuple[np.ndarray, float | None]:
    """PCA down to max_features, fitted once on the whole table; (features, explained variance share).

    Eigen-decomposition of the d x d covariance instead of an SVD of the n x d table: the same
    components, far cheaper for tall tables, and a fixed sign convention (largest loading positive)
    makes the output deterministic.
    """
    if max_features is None or matrix.shape[1] <= max_features:
        return matrix, None
    centered = matrix - matrix.mean(axis=0)
    covariance = centered.T @ centered / max(len(centered), 1)
    eigenvalues, eigenvectors = np.linalg.eigh(covariance)
    order = np.argsort(-eigenvalues, kind="stable")[:max_features]
    values, vectors = np.clip(eigenvalues[order], 0.0, None), eigenvectors[:, order]
    signs = np.sign(vectors[np.argmax(np.abs(vectors), axis=0), np.arange(vectors.shape[1])])
    vectors = vectors * np.where(signs == 0, 1.0, signs)
    # Whitened: every output feature has unit variance, like the standardized features without PCA.
    scale = np.sqrt(np.where(values > 1e-12, values, 1.0))
    reduced = centered @ vectors / scale
    total = float(np.clip(eigenvalues, 0.0, None).sum())
    return reduced, (float(values.sum() / total) if total > 0 else 1.0)

