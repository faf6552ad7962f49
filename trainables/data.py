"""Stage I ground truth: load a task, prepare it once, split it into members / non-members / context.

The contract is `docs/INTERFACES.md` (PreparedTask) and the "Stage I — ground truth" section of the
method spec. Everything here is deterministic in (source bytes, settings, label mode, seed): the same
inputs give byte-identical arrays, and the sha256 fingerprint of those inputs names the cache entry.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import re
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from iclmem.atomic import atomic_write, write_json_atomic
from iclmem.errors import ConfigError, DataError, SplitError
from iclmem.registry import Registry
from iclmem.vocab import ColumnKind, InputContract, LabelDesign, LabelMode, SourceKind, TaskKind, values

__all__ = [
    "TaskKind",
    "LabelMode",
    "LabelDesign",
    "TaskSource",
    "PrepSettings",
    "SplitReport",
    "PreparedTask",
    "FeatureColumn",
    "TableColumns",
    "InputContract",
    "ColumnKind",
    "DISTRACTOR_COLUMNS",
    "contract_settings",
    "BuiltinTask",
    "BUILTIN_TASKS",
    "load_table",
    "prepare_task",
    "load_or_prepare",
    "task_fingerprint",
    "ground_truth_log",
    "null_split",
    "null_split_task",
    "save_prepared",
    "load_prepared",
]

# Bumped whenever preparation changes in a way that alters arrays, so stale cache entries are not reused.
# 2: tasks are prepared per input contract and carry their column description.
# 3: label-matched non-members under shuffled_members, the blind baseline in the split report and its check,
#    multi_random's member pool with C' in it.
PREP_FORMAT_VERSION = 3

# Distractor columns the probe suite may append to a context (the default suite's ``distractors_2``):
# a model's feature limit minus these is what Stage I may hand it.
DISTRACTOR_COLUMNS = 2

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

# Above this many distinct values a numeric target with no declared task kind is taken as regression.
INFER_REGRESSION_MIN_UNIQUE = 20

_MISSING_CATEGORY = "<missing>"


_SOURCE_KINDS: tuple[str, ...] = values(SourceKind)


# --------------------------------------------------------------------------------------------------
# Configuration objects
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSource:
    """Where a table comes from.

    * ``carte``: ``path`` is the directory holding ``<name>.parquet`` + ``config_<name>.json``, or
      ``<name>/raw.parquet`` + ``<name>/config_data.json`` (it may also be that ``<name>`` folder).
      ``target``/``task`` override the config when given.
    * ``table``: ``path`` is a CSV or parquet file; ``target`` is required; ``task`` is inferred when
      omitted.
    * ``builtin``: ``name`` is looked up in ``BUILTIN_TASKS``; ``path``/``target`` are unused.
    """

    name: str
    kind: SourceKind
    path: str | None = None
    target: str | None = None
    task: TaskKind | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"task source needs a non-empty name, got {self.name!r}")
        if self.kind not in _SOURCE_KINDS:
            raise ConfigError(
                f"task {self.name!r}: unknown source kind {self.kind!r}; expected one of {', '.join(_SOURCE_KINDS)}"
            )
        if self.task is not None and not isinstance(self.task, TaskKind):
            try:
                object.__setattr__(self, "task", TaskKind(self.task))
            except ValueError:
                raise ConfigError(
                    f"task {self.name!r}: unknown task kind {self.task!r}; expected classification or regression"
                ) from None
        if self.path is not None:
            object.__setattr__(self, "path", os.fspath(self.path))
        if self.kind in ("carte", "table") and not self.path:
            raise ConfigError(f"task {self.name!r}: a {self.kind} source needs a path")
        if self.kind == "table" and not self.target:
            raise ConfigError(f"task {self.name!r}: a plain table source needs the target column named (target=...)")


@dataclass(frozen=True)
class PrepSettings:
    """Every knob of Stage I preparation; all of it goes into the fingerprint."""

    regression_bins: int = 10
    # reduced / numeric contracts: PCA down to this many features when the encoded table is wider (None:
    # never reduce); cells contract: the most real columns accepted (never reduced: a cell is not a component)
    max_features: int | None = 16
    context_size: int = 128
    q: int = 50
    max_redraws: int = 20
    tvd_max: float = 0.05
    ks_max: float = 0.05
    contract: InputContract = InputContract.REDUCED  # what the model reads (iclmem.vocab.InputContract)
    # shuffled_members only: the non-members' labels permuted like the members' (matched, the default) or
    # left true (unmatched, the paper's design: the groups are separable before training)
    label_design: LabelDesign = LabelDesign.MATCHED
    # multi_random: the member pool is the Q members together with C' (spec: "each task's training pool is
    # its members together with C'"); as many non-members are drawn, C''s label counts included
    context_in_pool: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "contract", InputContract(self.contract))
        except ValueError:
            raise ConfigError(f"invalid preparation setting: unknown input contract {self.contract!r}; expected one "
                              f"of {', '.join(values(InputContract))}") from None
        try:
            object.__setattr__(self, "label_design", LabelDesign(self.label_design))
        except ValueError:
            raise ConfigError(f"invalid preparation setting: unknown label_design {self.label_design!r}; expected "
                              f"one of {', '.join(values(LabelDesign))}") from None

        def is_count(value: object, minimum: int) -> bool:
            return _is_int(value) and int(value) >= minimum  # type: ignore[call-overload]

        def is_share(value: object) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0

        problems = [
            (is_count(self.regression_bins, 2), f"regression_bins must be an integer >= 2, got {self.regression_bins!r}"),
            (
                self.max_features is None or is_count(self.max_features, 1),
                f"max_features must be None or an integer >= 1, got {self.max_features!r}",
            ),
            (is_count(self.context_size, 1), f"context_size must be an integer >= 1, got {self.context_size!r}"),
            (is_count(self.q, 2), f"q must be an integer >= 2 (a membership AUC compares at least two members with "
                                  f"two non-members), got {self.q!r}"),
            (is_count(self.max_redraws, 0), f"max_redraws must be an integer >= 0, got {self.max_redraws!r}"),
            (is_share(self.tvd_max), f"tvd_max must be a number in [0, 1], got {self.tvd_max!r}"),
            (is_share(self.ks_max), f"ks_max must be a number in [0, 1], got {self.ks_max!r}"),
            (isinstance(self.context_in_pool, bool), f"context_in_pool must be true or false, got {self.context_in_pool!r}"),
        ]
        for ok, message in problems:
            if not ok:
                raise ConfigError(f"invalid preparation setting: {message}")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass(frozen=True)
class SplitReport:
    """What preparation did to the table and how close the member / non-member split is."""

    # table cleaning
    n_rows_source: int  # rows read from the source
    n_missing_target: int  # rows dropped for a missing target
    n_exact_duplicates: int  # rows dropped as exact copies of an earlier row
    n_feature_duplicates: int  # rows dropped because another row has the same feature vector
    n_rows: int  # rows left (the length of every PreparedTask array)
    dropped_columns: tuple[str, ...]  # all-missing columns
    # preprocessing (task characteristics the aggregator reports against outcome)
    n_numeric_columns: int
    n_categorical_columns: int
    n_date_columns: int
    n_encoded_features: int  # after encoding, before PCA
    pca_explained_variance: float | None  # share of variance kept; None when PCA was not needed
    # split
    split_seed: int  # seed of the accepted draw (seed + redraws)
    redraws: int
    context_per_class: int
    tvd: float  # member vs non-member label (bin) distribution
    ks: float | None = None  # regression only, on the raw target values
    ks_pvalue: float | None = None
    wasserstein: float | None = None
    # what the features were prepared for, and why PCA was applied (None: it was not)
    input_contract: str = InputContract.REDUCED.value
    pca_reason: str | None = None
    # the blind baseline (probes/blind.py): members vs non-members scored by a model fitted on C' alone,
    # on the labels as probed; its interval excluding 0.5 means the groups differ before any training
    label_design: str = LabelDesign.MATCHED.value
    blind_auc: float | None = None
    blind_auc_low: float | None = None
    blind_auc_high: float | None = None
    blind_redraws: int = 0  # draws refused because their blind baseline was separable

    @property
    def exchangeable(self) -> bool:
        """False for the paper's unmatched shuffled_members design, or a split whose blind interval excludes
        0.5: its members and non-members can be told apart without the model, so no membership claim (and
        no ε lower bound) rests on it."""
        from probes.blind import BlindBaseline, exchangeable

        blind = None
        if self.blind_auc is not None and self.blind_auc_low is not None and self.blind_auc_high is not None:
            blind = BlindBaseline(self.blind_auc, self.blind_auc_low, self.blind_auc_high, 0, 0)
        return exchangeable(self.label_design, blind)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["dropped_columns"] = list(self.dropped_columns)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SplitReport:
        values = dict(data)
        values["dropped_columns"] = tuple(values.get("dropped_columns", ()))
        return cls(**values)


@dataclass(frozen=True)
class FeatureColumn:
    """One column of a prepared feature matrix: what a model that reads columns needs to know about it."""

    name: str  # the header shown to a model that reads column names
    kind: ColumnKind
    source: str | None = None  # the table column it comes from; None for a PCA component
    vocabulary: tuple[str, ...] = ()  # TEXT: feature value i (an integer code) is the cell string vocabulary[i]

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ColumnKind(self.kind))
        object.__setattr__(self, "vocabulary", tuple(str(v) for v in self.vocabulary))
        if (self.kind is ColumnKind.TEXT) != bool(self.vocabulary):
            raise DataError(f"feature column {self.name!r}: a text column needs its vocabulary, and only a text "
                            f"column has one")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind.value, "source": self.source}
        if self.vocabulary:
            out["vocabulary"] = list(self.vocabulary)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureColumn:
        return cls(str(data["name"]), ColumnKind(data["kind"]), data.get("source"), tuple(data.get("vocabulary", ())))


@dataclass(frozen=True)
class TableColumns:
    """The column description of a prepared task: the contract its features were prepared for, the
    target's name and one :class:`FeatureColumn` per feature column, in feature-matrix order."""

    contract: InputContract
    target: str
    columns: tuple[FeatureColumn, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "contract", InputContract(self.contract))
        object.__setattr__(self, "columns", tuple(self.columns))

    def __len__(self) -> int:
        return len(self.columns)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def kinds(self) -> tuple[ColumnKind, ...]:
        return tuple(c.kind for c in self.columns)

    @classmethod
    def numbers(cls, names: Sequence[str], target: str = "target",
                contract: InputContract = InputContract.NUMERIC) -> TableColumns:
        """A description of plain numeric columns with the given names."""
        return cls(contract, str(target), tuple(FeatureColumn(str(n), ColumnKind.NUMBER, str(n)) for n in names))

    def to_dict(self) -> dict[str, Any]:
        return {"contract": self.contract.value, "target": self.target, "columns": [c.to_dict() for c in self.columns]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableColumns:
        return cls(InputContract(data["contract"]), str(data["target"]),
                   tuple(FeatureColumn.from_dict(c) for c in data["columns"]))


# Every array of a PreparedTask and the dtype the contract fixes for it.
_ARRAY_DTYPES: dict[str, type[np.generic]] = {
    "features": np.float32,
    "labels": np.int64,
    "original_labels": np.int64,
    "row_ids": np.int64,
    "member_idx": np.int64,
    "nonmember_idx": np.int64,
    "context_idx": np.int64,
    "target_values": np.float64,
}
_ARRAY_FIELDS: tuple[str, ...] = tuple(name for name in _ARRAY_DTYPES if name != "target_values")


# eq=False: the generated __eq__/__hash__ would compare numpy arrays element-wise and fail; ours below
# compares arrays by dtype, shape and bytes.
@dataclass(frozen=True, eq=False)
class PreparedTask:
    """An immutable prepared task; every array is read-only."""

    name: str
    task_kind: TaskKind
    label_mode: LabelMode
    seed: int
    features: np.ndarray  # float32 [n_rows, n_features]
    labels: np.ndarray  # int64 [n_rows], after label mode
    original_labels: np.ndarray  # int64 [n_rows]
    row_ids: np.ndarray  # int64 [n_rows], row number in the source table
    class_names: tuple[str, ...]
    member_idx: np.ndarray  # int64 [q]
    nonmember_idx: np.ndarray  # int64 [q]
    context_idx: np.ndarray  # int64 [context_per_class * n_classes]
    split_report: SplitReport
    fingerprint: str
    # Additions to the interface (regression only, None for classification): the raw target values
    # after label mode, which the KS check uses, and the bin edges behind class_names.
    target_values: np.ndarray | None = None  # float64 [n_rows]
    bin_edges: tuple[float, ...] | None = None
    # What each feature column is (names, kinds, text vocabularies) and the contract it was prepared for;
    # None only for a task built by hand.
    columns: TableColumns | None = None

    def __post_init__(self) -> None:
        for name, dtype in _ARRAY_DTYPES.items():
            value = getattr(self, name)
            if value is not None:
                # A private C-ordered copy: nobody holding the input array can change the task.
                frozen = np.array(value, dtype=dtype, copy=True, order="C")
                frozen.flags.writeable = False
                object.__setattr__(self, name, frozen)
        object.__setattr__(self, "task_kind", TaskKind(self.task_kind))
        object.__setattr__(self, "label_mode", LabelMode(self.label_mode))
        object.__setattr__(self, "class_names", tuple(self.class_names))
        if self.columns is not None and len(self.columns) != self.features.shape[1]:
            raise DataError(f"task {self.name!r}: {len(self.columns)} column descriptions for "
                            f"{self.features.shape[1]} feature columns")

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def n_features(self) -> int:
        return int(self.features.shape[1])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PreparedTask):
            return NotImplemented
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
                    return False
                if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
                    return False
            elif a != b:
                return False
        return True

    def __hash__(self) -> int:
        return hash(self.fingerprint)


# --------------------------------------------------------------------------------------------------
# Built-in tasks (scikit-learn's bundled tables: no download)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltinTask:
    loader: Callable[[], pd.DataFrame]  # returns the table with its target in column `target`
    target: str
    task: TaskKind


BUILTIN_TASKS: Registry[BuiltinTask] = Registry("built-in task")


def _sklearn_loader(loader_name: str, names_as_labels: bool) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        from sklearn import datasets  # imported on use: importing this module stays cheap

        bunch = getattr(datasets, loader_name)(as_frame=True)
        frame = bunch.frame.copy()
        if names_as_labels:
            # Readable class names (e.g. "malignant") rather than bare codes; digits keep their digits.
            frame["target"] = np.asarray(bunch.target_names)[frame["target"].to_numpy()]
        return frame

    return load


def _register_builtins() -> None:
    classification, regression = TaskKind.CLASSIFICATION, TaskKind.REGRESSION
    for name, loader_name, names_as_labels, kind in (
        ("breast_cancer", "load_breast_cancer", True, classification),
        ("wine", "load_wine", True, classification),
        ("iris", "load_iris", True, classification),
        ("digits", "load_digits", False, classification),
        ("diabetes", "load_diabetes", False, regression),
    ):
        BUILTIN_TASKS.register(name, BuiltinTask(_sklearn_loader(loader_name, names_as_labels), "target", kind))


_register_builtins()


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ResolvedSource:
    """A source with its files found and its target / task kind settled."""

    source: TaskSource
    files: tuple[Path, ...]  # every file whose bytes define the task (data first)
    target: str
    task: TaskKind | None  # None: infer from the target values


def _resolve(source: TaskSource) -> _ResolvedSource:
    if source.kind == "builtin":
        try:
            builtin = BUILTIN_TASKS.get(source.name)
        except ConfigError as err:
            raise ConfigError(f"unknown built-in task {source.name!r}; known: {', '.join(BUILTIN_TASKS.names())}") from err
        return _ResolvedSource(source, (), source.target or builtin.target, source.task or builtin.task)

    assert source.path is not None  # TaskSource guarantees it for carte / table
    path = Path(source.path).expanduser()
    if source.kind == "table":
        if path.is_dir():
            raise DataError(
                f"task {source.name!r}: {path} is a folder, not a table file: give a .csv, .tsv or .parquet file "
                f"as `path`, or the folder as `carte:` if it holds a CARTE table"
            )
        if not path.is_file():
            raise DataError(f"task {source.name!r}: table file not found: {path}")
        assert source.target is not None
        return _ResolvedSource(source, (path,), source.target, source.task)

    # CARTE: try both layouts, then the case where `path` already is the task folder.
    candidates = [
        (path / f"{source.name}.parquet", path / f"config_{source.name}.json"),
        (path / source.name / "raw.parquet", path / source.name / "config_data.json"),
        (path / "raw.parquet", path / "config_data.json"),
    ]
    for data_file, config_file in candidates:
        if data_file.is_file() and config_file.is_file():
            break
    else:
        if not path.exists():
            raise DataError(f"task {source.name!r}: CARTE directory not found: {path}")
        tried = "; ".join(f"{d} + {c}" for d, c in candidates[:2])
        raise DataError(f"task {source.name!r}: no CARTE table found under {path} (tried {tried})")

    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DataError(f"task {source.name!r}: cannot read CARTE config {config_file}: {err}") from err
    if not isinstance(config, dict):
        raise DataError(f"task {source.name!r}: CARTE config {config_file} is not a JSON object")
    target = source.target or config.get("target_name")
    if not target:
        raise DataError(f"task {source.name!r}: CARTE config {config_file} has no 'target_name'")
    task = source.task
    if task is None:
        raw_task = config.get("task")
        if raw_task is None:
            raise DataError(f"task {source.name!r}: CARTE config {config_file} has no 'task' (classification|regression)")
        try:
            task = TaskKind(raw_task)
        except ValueError:
            raise DataError(
                f"task {source.name!r}: CARTE config {config_file} has task {raw_task!r}; expected classification or regression"
            ) from None
    return _ResolvedSource(source, (data_file, config_file), str(target), task)


def _read_frame(resolved: _ResolvedSource) -> pd.DataFrame:
    source = resolved.source
    if source.kind == "builtin":
        return BUILTIN_TASKS.get(source.name).loader()
    data_file = resolved.files[0]
    suffix = data_file.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(data_file)
        if suffix == ".csv":
            return pd.read_csv(data_file)
        if suffix == ".tsv":
            return pd.read_csv(data_file, sep="\t")
    except Exception as err:  # pandas / pyarrow raise many unrelated types for a malformed file
        raise DataError(f"task {source.name!r}: cannot read table {data_file}: {err}") from err
    raise DataError(f"task {source.name!r}: unsupported table format {data_file} (expected .csv, .tsv or .parquet)")


def load_table(source: TaskSource) -> tuple[pd.DataFrame, str, TaskKind | None]:
    """Read the raw table of a source: (frame, target column name, declared task kind or None)."""
    resolved = _resolve(source)
    return _read_frame(resolved), resolved.target, resolved.task


# --------------------------------------------------------------------------------------------------
# Cleaning and preprocessing
# --------------------------------------------------------------------------------------------------


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
                stacklevel=4,
            )
        return TaskKind.REGRESSION
    return TaskKind.CLASSIFICATION


def _numeric_target(target: pd.Series, column: str, task_name: str) -> np.ndarray:
    if pd.api.types.is_bool_dtype(target):
        return target.to_numpy(dtype=np.float64)
    numeric = pd.to_numeric(target, errors="coerce").astype(np.float64)
    bad = numeric.isna() | ~np.isfinite(numeric.to_numpy())
    if bad.any():
        example = target[bad].iloc[0]
        raise DataError(
            f"task {task_name!r}: regression target column {column!r} has {int(bad.sum())} non-numeric value(s), "
            f"e.g. {example!r}"
        )
    return numeric.to_numpy()


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


@dataclass
class _Encoded:
    matrix: np.ndarray  # float64 [n_rows, n_encoded]
    n_numeric: int
    n_categorical: int
    n_dates: int
    columns: list[FeatureColumn]  # one per matrix column


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
    return (matrix - mean) / np.where(std > 0, std, 1.0)


def _encode_features(features: pd.DataFrame) -> _Encoded:
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
                columns.extend(FeatureColumn(f"{name} = {c}", ColumnKind.NUMBER, name) for c in categories)
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
    return _Encoded(_standardize(matrix), n_numeric, n_categorical, n_dates, columns)


# ConTextTab's tokenizer (``is_valid=True``, its inference setting) clips a numeric column to these
# quantiles before standardising it; the cells contract does the same, once over the whole table.
CELL_CLIP_QUANTILES = (0.005, 0.995)


def _encode_cells(features: pd.DataFrame) -> _Encoded:
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
    return _Encoded(matrix, n_numeric, n_categorical, n_dates, columns)


def _reduce(matrix: np.ndarray, max_features: int | None) -> tuple[np.ndarray, float | None]:
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


@dataclass
class _Table:
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


def _build_table(resolved: _ResolvedSource, settings: PrepSettings) -> _Table:
    name = resolved.source.name
    frame = _read_frame(resolved)
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
        warnings.warn(f"task {name!r}: column {column!r} has only missing values and is dropped", stacklevel=3)
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
    task = resolved.task or _infer_task(frame[target])
    target_values: np.ndarray | None = None
    bin_edges: tuple[float, ...] | None = None
    if task is TaskKind.REGRESSION:
        target_values = _numeric_target(frame[target], target, name)
        labels, bin_edges, class_names = _quantile_bins(target_values, settings.regression_bins)
        if 2 <= len(class_names) < settings.regression_bins:
            warnings.warn(
                f"task {name!r}: tied values in regression target {target!r} leave {len(class_names)} quantile "
                f"bins instead of {settings.regression_bins}",
                stacklevel=3,
            )
    else:
        labels, class_names = _class_labels(frame[target])

    if len(class_names) < 2:
        only = repr(class_names[0]) if class_names else "none"
        raise DataError(
            f"task {name!r}: target column {target!r} has a single class ({only}) after dropping missing "
            f"targets and duplicates; at least two are needed"
        )

    contract = settings.contract
    if contract is InputContract.CELLS:
        if settings.max_features is not None and len(feature_columns) > settings.max_features:
            raise DataError(
                f"task {name!r}: {len(feature_columns)} feature columns, but a model that reads cells takes at most "
                f"{settings.max_features} (its column cap minus {DISTRACTOR_COLUMNS} probe distractor columns); "
                f"drop columns from the table"
            )
        encoded = _encode_cells(frame[feature_columns])
        matrix, explained, reason = encoded.matrix, None, None
        described = encoded.columns
    else:
        encoded = _encode_features(frame[feature_columns])
        matrix, explained = _reduce(encoded.matrix, settings.max_features)
        described, reason = encoded.columns, None
        if explained is not None:
            limit = ("data.max_features" if contract is InputContract.REDUCED else
                     f"the model's feature limit minus {DISTRACTOR_COLUMNS} probe distractor columns")
            reason = (f"{encoded.matrix.shape[1]} encoded features exceed {settings.max_features} ({limit}): "
                      f"whitened PCA to {settings.max_features} components")
            described = [FeatureColumn(f"component_{i + 1}", ColumnKind.COMPONENT) for i in range(matrix.shape[1])]
    return _Table(
        features=np.ascontiguousarray(matrix, dtype=np.float32),
        labels=labels,
        target_values=target_values,
        row_ids=frame.index.to_numpy(dtype=np.int64),
        class_names=class_names,
        bin_edges=bin_edges,
        task=task,
        counts=dict(
            n_rows_source=n_rows_source,
            n_missing_target=int(target_missing.sum()),
            n_exact_duplicates=int(exact.sum()),
            n_feature_duplicates=int(feature_dup.sum()),
            n_rows=len(frame),
            dropped_columns=dropped,
            n_numeric_columns=encoded.n_numeric,
            n_categorical_columns=encoded.n_categorical,
            n_date_columns=encoded.n_dates,
            n_encoded_features=int(encoded.matrix.shape[1]),
            pca_explained_variance=explained,
            input_contract=contract.value,
            pca_reason=reason,
        ),
        columns=TableColumns(contract, target, tuple(described)),
    )


# --------------------------------------------------------------------------------------------------
# Split
# --------------------------------------------------------------------------------------------------

# Independent random streams per purpose, so e.g. a redraw of the split never changes the label shuffle.
_STREAM_SHUFFLE_ALL = 1
_STREAM_SHUFFLE_MEMBERS = 2
_STREAM_SPLIT = 3
_STREAM_NULL = 4
_STREAM_REFERENCE = 5
_STREAM_SHUFFLE_NONMEMBERS = 6
_STREAM_SHUFFLE_UNUSED = 7


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([stream, seed])


def _allocate(class_counts: np.ndarray, total: int) -> np.ndarray:
    """Proportional allocation of `total` draws over classes (largest remainder, ties to lower index)."""
    share = class_counts / class_counts.sum() * total
    alloc = np.floor(share).astype(np.int64)
    remainder = share - alloc
    order = np.lexsort((np.arange(len(share)), -remainder))
    alloc[order[: total - int(alloc.sum())]] += 1
    return alloc


def _tvd(a: np.ndarray, b: np.ndarray, n_classes: int) -> float:
    pa = np.bincount(a, minlength=n_classes) / max(len(a), 1)
    pb = np.bincount(b, minlength=n_classes) / max(len(b), 1)
    return float(0.5 * np.abs(pa - pb).sum())


@dataclass
class _Split:
    members: np.ndarray
    nonmembers: np.ndarray
    context: np.ndarray
    tvd: float
    ks: float | None
    ks_pvalue: float | None
    wasserstein: float | None


def _draw_split(
    labels: np.ndarray,
    target_values: np.ndarray | None,
    n_classes: int,
    member_alloc: np.ndarray,
    per_class_context: int,
    rng: np.random.Generator,
    context_in_pool: bool = False,
) -> _Split:
    members: list[np.ndarray] = []
    nonmembers: list[np.ndarray] = []
    context: list[np.ndarray] = []

    def pair_up(pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if target_values is not None:
            # Matched pairs: sort the pool by target (random order among ties, from the permutation)
            # and send one row of each adjacent pair to each side. Member and non-member ECDFs then
            # differ by at most one row anywhere, so KS <= 1/q; independent draws of q = 50 rows
            # would almost never reach KS < 0.05.
            pool = pool[np.argsort(target_values[pool], kind="stable")]
        pairs = pool.reshape(-1, 2)
        flip = rng.integers(0, 2, size=len(pairs))
        return pairs[np.arange(len(pairs)), flip], pairs[np.arange(len(pairs)), 1 - flip]

    for c in range(n_classes):
        rows = rng.permutation(np.flatnonzero(labels == c))
        if context_in_pool:
            # C' is part of the member pool: its rows are paired with as many non-member rows of the class
            # (a fair coin per pair, as for the members), so the pool and the non-members match in labels
            start = 2 * per_class_context
            in_pool, out_pool = pair_up(rows[:start])
            context.append(in_pool)
            members.append(in_pool)
            nonmembers.append(out_pool)
        else:
            start = per_class_context
            context.append(rows[:per_class_context])
        chosen, left = pair_up(rows[start : start + 2 * member_alloc[c]])
        members.append(chosen)
        nonmembers.append(left)
    m = np.sort(np.concatenate(members)).astype(np.int64)
    n = np.sort(np.concatenate(nonmembers)).astype(np.int64)
    ctx = np.sort(np.concatenate(context)).astype(np.int64)
    ks = pvalue = wasserstein = None
    if target_values is not None:
        from scipy import stats  # imported on use: scipy.stats is slow to import

        result = stats.ks_2samp(target_values[m], target_values[n])
        ks, pvalue = float(result.statistic), float(result.pvalue)
        wasserstein = float(stats.wasserstein_distance(target_values[m], target_values[n]))
    return _Split(m, n, ctx, _tvd(labels[m], labels[n], n_classes), ks, pvalue, wasserstein)


def _distance(split: _Split) -> float:
    """The statistic the check is about: KS for regression, TVD for classification."""
    return split.tvd if split.ks is None else split.ks


def _split_passes(split: _Split, task: TaskKind, settings: PrepSettings) -> bool:
    if task is TaskKind.REGRESSION:
        assert split.ks is not None
        return split.ks < settings.ks_max
    return split.tvd < settings.tvd_max


def _check_sizes(name: str, table: _Table, labels: np.ndarray, settings: PrepSettings) -> tuple[np.ndarray, int]:
    n_rows, n_classes = len(labels), len(table.class_names)
    needed = 2 * settings.q + settings.context_size * (2 if settings.context_in_pool else 1)
    if n_rows < needed:
        raise DataError(
            f"task {name!r}: too few rows: 2*q + context_size = 2*{settings.q} + {settings.context_size} = {needed} "
            f"rows are needed, but only {n_rows} remain after dropping missing targets and duplicates"
        )
    # C' must hold the same number of rows of every label; when context_size is not a multiple of the
    # number of classes the context is floor(context_size / n_classes) rows per class, i.e. slightly
    # smaller than context_size, rather than breaking uniformity.
    per_class = settings.context_size // n_classes
    if per_class < 1:
        raise ConfigError(
            f"task {name!r}: context_size {settings.context_size} is smaller than the number of classes "
            f"({n_classes}); a uniform context needs at least one row per class"
        )
    counts = np.bincount(labels, minlength=n_classes)
    alloc = _allocate(counts, settings.q)
    context_rows = 2 * per_class if settings.context_in_pool else per_class
    for c in range(n_classes):
        need_c = context_rows + 2 * int(alloc[c])
        if counts[c] < need_c:
            context_part = (f"{per_class} for the uniform context and {per_class} non-members matching it"
                            if settings.context_in_pool else f"{per_class} for the uniform context")
            raise DataError(
                f"task {name!r}: class {table.class_names[c]!r} has {counts[c]} rows but {need_c} are needed "
                f"({context_part} + 2*{alloc[c]} for members and non-members); "
                f"lower q or context_size"
            )
    return alloc, per_class


# --------------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------------


def _effective_settings(settings: PrepSettings, q: int | None, context_size: int | None) -> PrepSettings:
    changes: dict[str, int] = {}
    if q is not None:
        changes["q"] = q
    if context_size is not None:
        changes["context_size"] = context_size
    return dataclasses.replace(settings, **changes) if changes else settings


def contract_settings(settings: PrepSettings, contract: InputContract | str, model_max_features: int) -> PrepSettings:
    """Stage I settings for a model that reads ``contract`` and takes at most ``model_max_features`` feature
    columns, the probe's distractor columns included. ``reduced`` keeps ``settings.max_features``
    (``data.max_features``); ``numeric`` applies PCA only when the encoded table is wider than the model's
    own limit minus the distractors; ``cells`` never reduces and refuses a table wider than that."""
    try:
        contract = InputContract(contract)
    except ValueError:
        raise ConfigError(f"unknown input contract {contract!r}; expected one of {', '.join(values(InputContract))}") from None
    if contract is InputContract.REDUCED:
        return dataclasses.replace(settings, contract=contract)
    limit = int(model_max_features) - DISTRACTOR_COLUMNS
    if limit < 1:
        raise ConfigError(f"a model taking {model_max_features} feature columns leaves none beside the probe's "
                          f"{DISTRACTOR_COLUMNS} distractor columns")
    return dataclasses.replace(settings, contract=contract, max_features=limit)


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fingerprint(resolved: _ResolvedSource, settings: PrepSettings, label_mode: LabelMode, seed: int) -> str:
    if label_mode is not LabelMode.SHUFFLED_MEMBERS:
        # the design only changes shuffled_members: elsewhere both give the same arrays, and one cache entry
        settings = dataclasses.replace(settings, label_design=LabelDesign.MATCHED)
    source = resolved.source
    if source.kind == "builtin":
        import sklearn

        # Bundled tables change only with scikit-learn itself.
        identity: Any = {"builtin": source.name, "sklearn": sklearn.__version__}
    else:
        # File contents, not paths: a moved copy of the same table reuses its cache entry.
        identity = [{"file": p.name, "sha256": _file_digest(p)} for p in resolved.files]
    payload = {
        "version": PREP_FORMAT_VERSION,
        "name": source.name,
        "kind": source.kind,
        "identity": identity,
        "target": resolved.target,
        "task": resolved.task.value if resolved.task else None,
        "settings": {**dataclasses.asdict(settings), "contract": settings.contract.value,
                     "label_design": settings.label_design.value},
        "label_mode": label_mode.value,
        "seed": int(seed),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def task_fingerprint(
    source: TaskSource,
    settings: PrepSettings = PrepSettings(),
    label_mode: LabelMode | str = LabelMode.NORMAL,
    seed: int = 0,
    q: int | None = None,
    context_size: int | None = None,
) -> str:
    """sha256 over the source's bytes (or built-in identity) and every setting; names the cache entry."""
    settings = _effective_settings(settings, q, context_size)
    return _fingerprint(_resolve(source), settings, LabelMode(label_mode), seed)


def prepare_task(
    source: TaskSource,
    settings: PrepSettings = PrepSettings(),
    label_mode: LabelMode | str = LabelMode.NORMAL,
    seed: int = 0,
    q: int | None = None,
    context_size: int | None = None,
) -> PreparedTask:
    """Load, clean, encode and split one task (spec Stage I). `q` / `context_size` override settings."""
    if not _is_int(seed) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    try:
        label_mode = LabelMode(label_mode)
    except ValueError:
        raise ConfigError(
            f"unknown label_mode {label_mode!r}; expected one of {', '.join(m.value for m in LabelMode)}"
        ) from None
    settings = _effective_settings(settings, q, context_size)
    resolved = _resolve(source)
    fingerprint = _fingerprint(resolved, settings, label_mode, seed)
    table = _build_table(resolved, settings)
    name = source.name
    n_classes = len(table.class_names)

    labels = table.labels.copy()
    target_values = None if table.target_values is None else table.target_values.copy()
    if label_mode is LabelMode.SHUFFLED_ALL:
        # Before the split, over the whole table: the split below is then stratified by (and the
        # context uniform over) the labels the model is actually trained on.
        perm = _rng(seed, _STREAM_SHUFFLE_ALL).permutation(len(labels))
        labels = labels[perm]
        if target_values is not None:
            target_values = target_values[perm]

    alloc, per_class = _check_sizes(name, table, labels, settings)

    # Under shuffled_members the paper's (unmatched) design scores members on permuted labels and
    # non-members on true ones; every other (mode, design) treats members and non-members alike, so their
    # blind baseline must sit at chance, and a draw whose blind interval excludes 0.5 is redrawn.
    design = settings.label_design if label_mode is LabelMode.SHUFFLED_MEMBERS else LabelDesign.MATCHED
    check_blind = design is LabelDesign.MATCHED

    # the one owner of the blind scorer (pure numpy / scikit-learn)
    from probes.blind import blind_baseline, blind_fit_rows

    accepted: tuple[_Split, np.ndarray, np.ndarray | None, Any] | None = None
    best: _Split | None = None
    blind_refused: list[float] = []
    redraws = 0
    for redraws in range(settings.max_redraws + 1):
        draw_seed = seed + redraws
        candidate = _draw_split(labels, target_values, n_classes, alloc, per_class, _rng(draw_seed, _STREAM_SPLIT),
                                settings.context_in_pool)
        if not _split_passes(candidate, table.task, settings):
            if best is None or _distance(candidate) < _distance(best):
                best = candidate
            continue
        scored, scored_values = _scored_labels(labels, target_values, candidate, label_mode, design, draw_seed)
        rows = np.concatenate([candidate.members, candidate.nonmembers])
        flags = np.arange(len(rows)) < len(candidate.members)
        fit = blind_fit_rows(len(labels), candidate.members, candidate.nonmembers, candidate.context)
        blind = blind_baseline(table.features[fit], scored[fit], table.features[rows], scored[rows], flags, n_classes)
        if check_blind and blind.separable:
            blind_refused.append(blind.auc)
            continue
        accepted = (candidate, scored, scored_values, blind)
        break
    if accepted is None:
        if blind_refused:
            raise SplitError(
                f"task {name!r}, label_mode {label_mode.value}: every member / non-member draw that passed the "
                f"distribution check had members and non-members separable without the model ({len(blind_refused)} "
                f"draws, blind AUC {min(blind_refused):.3f}..{max(blind_refused):.3f}, interval excluding 0.5) after "
                f"{settings.max_redraws} redraws (seeds {seed}..{seed + settings.max_redraws}); raise q or "
                f"max_redraws, or use another seed"
            )
        assert best is not None
        if table.task is TaskKind.REGRESSION:
            detail = (
                f"best KS statistic {best.ks:.4f} >= ks_max {settings.ks_max} "
                f"(with q={settings.q} distinct targets KS cannot go below 1/q = {1 / settings.q:.4f})"
            )
        else:
            detail = f"best label TVD {best.tvd:.4f} >= tvd_max {settings.tvd_max}"
        raise SplitError(
            f"task {name!r}: no member / non-member split passed the distribution check after "
            f"{settings.max_redraws} redraws (seeds {seed}..{seed + settings.max_redraws}); {detail}"
        )
    split, labels, target_values, blind = accepted

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
        blind_redraws=len(blind_refused),
    )
    return PreparedTask(
        name=name,
        task_kind=table.task,
        label_mode=label_mode,
        seed=int(seed),
        features=table.features,
        labels=labels,
        original_labels=table.labels,
        row_ids=table.row_ids,
        class_names=table.class_names,
        member_idx=split.members,
        nonmember_idx=split.nonmembers,
        context_idx=split.context,
        split_report=report,
        fingerprint=fingerprint,
        target_values=target_values,
        bin_edges=table.bin_edges,
        columns=table.columns,
    )


def _scored_labels(labels: np.ndarray, target_values: np.ndarray | None, split: _Split, label_mode: LabelMode,
                   design: LabelDesign, draw_seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The labels every row is trained and probed with, given one draw of the split.

    ``shuffled_members``: the members' labels are permuted among the members. Under the matched design the
    non-members' labels are permuted among the non-members, and the labels of the rows no part of the split
    uses (the null splits' pool) among those rows, each by an independent stream of ``draw_seed``: a
    uniform random permutation within each group, so before training the two groups are exchangeable, labels
    as scored included, and each keeps its label counts (the TVD / KS check still holds). C' keeps its true
    labels in both designs, unless it is part of the member pool (multi_random), where it is permuted with
    the members. Other modes: the labels unchanged (``shuffled_all`` permuted the whole table
    before the split)."""
    scored = labels.copy()
    values_out = None if target_values is None else target_values.copy()
    if label_mode is not LabelMode.SHUFFLED_MEMBERS:
        return scored, values_out
    groups = [(split.members, _STREAM_SHUFFLE_MEMBERS)]
    if design is LabelDesign.MATCHED:
        used = np.zeros(len(labels), dtype=bool)
        used[split.members] = used[split.nonmembers] = used[split.context] = True
        groups += [(split.nonmembers, _STREAM_SHUFFLE_NONMEMBERS), (np.flatnonzero(~used), _STREAM_SHUFFLE_UNUSED)]
    for rows, stream in groups:
        perm = _rng(draw_seed, stream).permutation(len(rows))
        scored[rows] = labels[rows[perm]]
        if values_out is not None and target_values is not None:
            values_out[rows] = target_values[rows[perm]]
    return scored, values_out


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
    if not _is_int(index) or index < 0:
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
    rng = np.random.default_rng([_STREAM_NULL, int(task.seed), int(index)])
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
    if n_rows < 2 or not _is_int(index) or index < 0:
        raise ConfigError(f"a reference half needs >= 2 rows and an index >= 0, got {n_rows}, {index!r}")
    rng = np.random.default_rng([_STREAM_REFERENCE, int(seed), int(index) // 2])
    half = np.zeros(n_rows, dtype=bool)
    half[rng.permutation(n_rows)[: n_rows // 2]] = True
    return half if index % 2 == 0 else ~half


def reference_task(task: PreparedTask, index: int) -> PreparedTask:
    """The task reference model ``index`` of a target run fine-tunes and is probed on: the target's
    population P = members + non-members (in that order) cut by :func:`reference_half` into its members
    and its non-members; C', the labels (a shuffled_members target's shuffled member labels included, so
    "in" means trained on the same row and label) and every other field unchanged. It has a fingerprint of
    its own, covering its member set, so nothing keyed by fingerprint (probe plans, cached base-model
    scores) is shared with the target or another reference."""
    population = np.concatenate([task.member_idx, task.nonmember_idx])
    half = reference_half(len(population), index, task.seed)
    members, nonmembers = np.sort(population[half]), np.sort(population[~half])
    digest = hashlib.sha256(f"{task.fingerprint}|reference|{int(index)}|".encode() + members.astype(np.int64).tobytes())
    return dataclasses.replace(task, member_idx=members, nonmember_idx=nonmembers, fingerprint=digest.hexdigest())


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


# --------------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------------


def save_prepared(task: PreparedTask, cache_dir: str | os.PathLike[str]) -> Path:
    """Write `<cache_dir>/<fingerprint>.npz` and `.json`; the json is written last and marks completion."""
    directory = Path(cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {name: getattr(task, name) for name in _ARRAY_FIELDS}
    if task.target_values is not None:
        arrays["target_values"] = task.target_values
    meta = {
        "format_version": PREP_FORMAT_VERSION,
        "name": task.name,
        "task_kind": task.task_kind.value,
        "label_mode": task.label_mode.value,
        "seed": task.seed,
        "class_names": list(task.class_names),
        "bin_edges": None if task.bin_edges is None else list(task.bin_edges),
        "split_report": task.split_report.to_dict(),
        "fingerprint": task.fingerprint,
        "columns": None if task.columns is None else task.columns.to_dict(),
    }
    npz_path = directory / f"{task.fingerprint}.npz"
    json_path = directory / f"{task.fingerprint}.json"
    # several workers may prepare the same task at once: each file is replaced whole
    atomic_write(npz_path, lambda h: np.savez(h, **arrays))
    write_json_atomic(json_path, meta)
    return npz_path


def load_prepared(fingerprint: str, cache_dir: str | os.PathLike[str]) -> PreparedTask | None:
    """The cached task named by `fingerprint`, or None if absent or unreadable."""
    directory = Path(cache_dir)
    npz_path = directory / f"{fingerprint}.npz"
    json_path = directory / f"{fingerprint}.json"
    if not (npz_path.is_file() and json_path.is_file()):
        return None
    try:
        meta = json.loads(json_path.read_text())
        if meta.get("format_version") != PREP_FORMAT_VERSION or meta.get("fingerprint") != fingerprint:
            return None
        with np.load(npz_path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        return PreparedTask(
            name=meta["name"],
            task_kind=TaskKind(meta["task_kind"]),
            label_mode=LabelMode(meta["label_mode"]),
            seed=int(meta["seed"]),
            class_names=tuple(meta["class_names"]),
            split_report=SplitReport.from_dict(meta["split_report"]),
            fingerprint=fingerprint,
            bin_edges=None if meta["bin_edges"] is None else tuple(float(v) for v in meta["bin_edges"]),
            target_values=arrays.get("target_values"),
            columns=None if meta.get("columns") is None else TableColumns.from_dict(meta["columns"]),
            **{name: arrays[name] for name in _ARRAY_FIELDS},
        )
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, json.JSONDecodeError,
            DataError) as err:
        # A damaged entry is recomputed, not trusted.
        warnings.warn(f"ignoring damaged prepared-task cache entry {npz_path} ({err}); recomputing it", stacklevel=2)
        return None


def load_or_prepare(
    source: TaskSource,
    settings: PrepSettings = PrepSettings(),
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
