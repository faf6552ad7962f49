"""What Stage I takes and gives: the records of a task, all frozen.

:class:`TaskSource` (where a table comes from), :class:`PrepSettings` (every knob of preparation, with
:func:`contract_settings` for a model's input contract), :class:`SplitReport` (what preparation did and how
close the split is), :class:`FeatureColumn` / :class:`TableColumns` (what each feature column is) and
:class:`PreparedTask` (the prepared arrays, read-only). The contract is ``docs/INTERFACES.md``
(PreparedTask). No I/O here; the code that fills these records is in the sibling modules.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from iclmem.errors import ConfigError, DataError
from iclmem.vocab import ColumnKind, InputContract, LabelDesign, LabelMode, SourceKind, TaskKind, values
from trainables.data.blind import BlindBaseline, exchangeable

__all__ = [
    "DISTRACTOR_COLUMNS",
    "TaskSource",
    "PrepSettings",
    "DEFAULT_SETTINGS",
    "is_int",
    "effective_settings",
    "contract_settings",
    "SplitReport",
    "FeatureColumn",
    "TableColumns",
    "ARRAY_FIELDS",
    "PreparedTask",
]

# Distractor columns the probe suite may append to a context (the default suite's ``distractors_2``):
# a model's feature limit minus these is what Stage I may hand it.
DISTRACTOR_COLUMNS = 2

_SOURCE_KINDS: tuple[str, ...] = values(SourceKind)


# --------------------------------------------------------------------------------------------------
# What a task is and how it is prepared
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
            return is_int(value) and int(value) >= minimum  # type: ignore[call-overload]

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


def is_int(value: object) -> bool:
    """An integer (numpy's included), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


# the settings prepare_task, load_or_prepare and task_fingerprint use when given none
DEFAULT_SETTINGS = PrepSettings()


def effective_settings(settings: PrepSettings, q: int | None, context_size: int | None) -> PrepSettings:
    """The settings with ``q`` / ``context_size`` overridden where given (the arguments of ``prepare_task``)."""
    changes: dict[str, Any] = {}
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


# --------------------------------------------------------------------------------------------------
# What preparation gives
# --------------------------------------------------------------------------------------------------


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
    # the blind baseline (trainables/data/blind.py): members vs non-members scored by a model fitted on C' alone,
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


# a text column's one-hot indicators are named "<source> = <level>" (trainables.data.encoding writes them)
ONE_HOT_SEPARATOR = " = "


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

    @property
    def one_hot_source(self) -> str | None:
        """The table column this is one level's one-hot indicator of; None for any other column."""
        if self.source is not None and self.name.startswith(f"{self.source}{ONE_HOT_SEPARATOR}"):
            return self.source
        return None

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
ARRAY_FIELDS: tuple[str, ...] = tuple(name for name in _ARRAY_DTYPES if name != "target_values")


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
    # The label a rare_label canary is trained with (trainables.canaries); None: the rarest label among this
    # task's own members. A reference task (trainables.data.derived_splits.reference_task) carries its
    # target's, so every reference trains on exactly its target's canaries, whatever its own half holds.
    canary_label: int | None = None

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
