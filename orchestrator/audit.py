"""``iclmem probe``: audit one fine-tuned checkpoint against its base model, without a sweep or Ray.

The checkpoint is a folder written by iclmem (``checkpoint.json`` + ``model.safetensors``) or a plain
weights file of a registered model (``--model``). Members are the rows the model was fine-tuned on:
by default those of iclmem's own split for (task, Q, label mode, seed); for a model fine-tuned
elsewhere pass ``members`` (a file of row ids, one per line) and non-members are drawn from the other
rows with the same label distribution.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from iclmem.atomic import json_safe, write_json_atomic
from iclmem.errors import ConfigError, DataError
from iclmem.runfolder import VERDICT_FILE
from probes.calibration import model_digest
from probes.manipulations import default_suite
from probes.outcomes import OutcomeThresholds
from probes.probe import ProbeSettings, probe_checkpoint
from probes.scoring import ProbePlan, ProbeQueries
from trainables.data import PrepSettings, TaskSource, load_or_prepare
from trainables.finetune import META_FILE, load_checkpoint_model
from trainables.models import build_model


def parse_task(spec: str) -> TaskSource:
    """``iris`` (built-in), ``DIR:name`` (CARTE folder), or ``FILE.csv:target`` / ``FILE.parquet:target``."""
    if ":" not in spec:
        return TaskSource(spec, "builtin")
    left, right = spec.rsplit(":", 1)
    if left.endswith((".csv", ".parquet")):
        return TaskSource(Path(left).stem, "table", left, right)
    return TaskSource(right, "carte", left)


def with_members(task: Any, member_row_ids: np.ndarray, seed: int) -> Any:
    """The task re-split around externally given members (row ids of the source table)."""
    position = {int(r): i for i, r in enumerate(task.row_ids)}
    missing = [int(r) for r in member_row_ids if int(r) not in position]
    if missing:
        raise DataError(f"member row ids not in the table (after deduplication): {missing[:10]}")
    members = np.array([position[int(r)] for r in member_row_ids], dtype=np.int64)
    rest = np.setdiff1d(np.arange(len(task.row_ids)), members)
    context = np.setdiff1d(np.asarray(task.context_idx), members)
    rest = np.setdiff1d(rest, context)
    rng = np.random.default_rng(seed)
    labels = np.asarray(task.labels)
    nonmembers = []
    for label, count in zip(*np.unique(labels[members], return_counts=True)):
        pool = rest[labels[rest] == label]
        if len(pool) < count:
            raise DataError(f"not enough non-member rows of label {task.class_names[label]!r} to match the members")
        nonmembers.append(rng.choice(pool, size=count, replace=False))
    return dataclasses.replace(task, member_idx=members, nonmember_idx=np.sort(np.concatenate(nonmembers)),
                               context_idx=context)


def audit_checkpoint(checkpoint: str, task: str, *, base_model: str = "pfn-mini", base_options: dict | None = None,
                     out: str | None = None, q: int = 50, label_mode: str = "normal", seed: int = 0,
                     bootstrap: int = 1000, members: str | None = None, context_size: int = 128) -> dict[str, Any]:
    path = Path(checkpoint)
    if not path.exists():
        raise ConfigError(f"checkpoint not found: {path}")
    source = parse_task(task)
    out_dir = Path(out) if out else Path("runs") / f"audit-{source.name}"
    prepared = load_or_prepare(source, PrepSettings(context_size=context_size), label_mode, seed, q=q,
                               cache_dir=out_dir / "prepared")
    if members:
        ids = np.array([int(line) for line in Path(members).read_text().split() if line.strip()], dtype=np.int64)
        prepared = with_members(prepared, ids, seed)
    base = build_model(base_model, **(base_options or {"weights": "shipped"}))
    if path.is_dir() and (path / META_FILE).is_file():
        model = load_checkpoint_model(path)
    else:
        model = build_model(base_model, **{**(base_options or {}), "weights": str(path)})
    plan = ProbePlan.build(ProbeQueries.from_task(prepared), default_suite(), seed,
                           compress_rows=base.supports_context_weights)
    settings = ProbeSettings(n_resamples=bootstrap, thresholds=OutcomeThresholds())
    identity = {"run_id": f"audit-{path.name}", "task": source.name, "model": base_model, "regime": "external",
                "lr": float("nan"), "q": len(prepared.member_idx), "label_mode": label_mode, "seed": seed}
    result = probe_checkpoint(model, prepared, plan, out_dir / "reference", model_digest(base), base, settings,
                              identity, epoch=-1)
    result.save(out_dir / "probes", path.name)
    write_json_atomic(out_dir / VERDICT_FILE, json_safe(result.row), default=str)
    return result.row
