"""Task sources: where a table comes from and how its raw rows are read.

The built-in tables (scikit-learn's bundled ones: no download), a CARTE folder in either of its two layouts,
or a plain CSV / TSV / parquet file. :func:`resolve_source` finds a source's files and settles its target
column and task kind (every file found names the task's fingerprint); :func:`read_frame` reads its rows
as they are, before any cleaning.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from iclmem.errors import ConfigError, DataError
from iclmem.registry import Registry
from iclmem.vocab import TaskKind
from trainables.data.task import TaskSource

__all__ = ["BuiltinTask", "BUILTIN_TASKS", "ResolvedSource", "resolve_source", "read_frame", "load_table"]


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
class ResolvedSource:
    """A source with its files found and its target / task kind settled."""

    source: TaskSource
    files: tuple[Path, ...]  # every file whose bytes define the task (data first)
    target: str
    task: TaskKind | None  # None: infer from the target values


def resolve_source(source: TaskSource) -> ResolvedSource:
    """Find a source's files and settle its target column and task kind (raises DataError / ConfigError)."""
    if source.kind == "builtin":
        try:
            builtin = BUILTIN_TASKS.get(source.name)
        except ConfigError as err:
            raise ConfigError(f"unknown built-in task {source.name!r}; known: {', '.join(BUILTIN_TASKS.names())}") from err
        return ResolvedSource(source, (), source.target or builtin.target, source.task or builtin.task)

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
        return ResolvedSource(source, (path,), source.target, source.task)

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
    return ResolvedSource(source, (data_file, config_file), str(target), task)


def read_frame(resolved: ResolvedSource) -> pd.DataFrame:
    """The raw table of a resolved source, as read (no cleaning)."""
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
    resolved = resolve_source(source)
    return read_frame(resolved), resolved.target, resolved.task
