"""The prepared-task cache: the fingerprint that names a prepared task, and writing and reading entries.

Everything Stage I does is deterministic in (source bytes, settings, label mode, seed): the same inputs give
byte-identical arrays, and the sha256 fingerprint of those inputs (:func:`task_fingerprint`) names the
entry ``<cache_dir>/<fingerprint>.npz`` (the arrays) + ``.json`` (the rest, written last: it marks the
entry complete). ``trainables.data.prepare.load_or_prepare`` reads an entry before preparing anew.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from iclmem.atomic import atomic_write, write_json_atomic
from iclmem.errors import DataError
from iclmem.vocab import LabelDesign, LabelMode, TaskKind
from trainables.data.sources import ResolvedSource, resolve_source
from trainables.data.task import (
    ARRAY_FIELDS,
    DEFAULT_SETTINGS,
    PreparedTask,
    PrepSettings,
    SplitReport,
    TableColumns,
    TaskSource,
    effective_settings,
)

__all__ = ["PREP_FORMAT_VERSION", "resolved_fingerprint", "task_fingerprint", "save_prepared", "load_prepared"]


# Bumped whenever preparation changes in a way that alters arrays, so stale cache entries are not reused.
# 2: tasks are prepared per input contract and carry their column description.
# 3: label-matched non-members under shuffled_members, the blind baseline in the split report and its check,
#    multi_random's member pool with C' in it.
PREP_FORMAT_VERSION = 3


# --------------------------------------------------------------------------------------------------
# The fingerprint
# --------------------------------------------------------------------------------------------------


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resolved_fingerprint(resolved: ResolvedSource, settings: PrepSettings, label_mode: LabelMode, seed: int) -> str:
    """:func:`task_fingerprint` of a source already resolved, with the settings already in force."""
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
    settings: PrepSettings = DEFAULT_SETTINGS,
    label_mode: LabelMode | str = LabelMode.NORMAL,
    seed: int = 0,
    q: int | None = None,
    context_size: int | None = None,
) -> str:
    """sha256 over the source's bytes (or built-in identity) and every setting; names the cache entry."""
    settings = effective_settings(settings, q, context_size)
    return resolved_fingerprint(resolve_source(source), settings, LabelMode(label_mode), seed)


# --------------------------------------------------------------------------------------------------
# Entries
# --------------------------------------------------------------------------------------------------


def save_prepared(task: PreparedTask, cache_dir: str | os.PathLike[str]) -> Path:
    """Write `<cache_dir>/<fingerprint>.npz` and `.json`; the json is written last and marks completion."""
    directory = Path(cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {name: getattr(task, name) for name in ARRAY_FIELDS}
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
            **{name: arrays[name] for name in ARRAY_FIELDS},
        )
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, json.JSONDecodeError,
            DataError) as err:
        # A damaged entry is recomputed, not trusted.
        warnings.warn(f"ignoring damaged prepared-task cache entry {npz_path} ({err}); recomputing it", stacklevel=2)
        return None
