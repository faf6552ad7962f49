"""Difficulty calibration against the reference (base) model, with reference scores computed once.

Reference scores depend only on (task, split, label mode, seed, suite, base model, probed rows): the
prepared task's fingerprint covers the first four, the suite fingerprint the fifth, the base model's
weight digest the sixth and a digest of the probed query ids, member flags and labels the last (a null
split of the same task probes other rows). Every run and epoch sharing those reuses one cached table.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from iclmem.atomic import read_parquet_checked, write_parquet_atomic
from probes.scoring import ProbePlan, score
from trainables.models.base import weights_digest


def model_digest(model: Any) -> str:
    """Digest of a model's name, options and weights: two equal digests give equal reference scores."""
    identity = json.dumps([model.name, model.options, weights_digest(model.module.state_dict())], sort_keys=True,
                          default=str)
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def queries_digest(plan: ProbePlan) -> str:
    """Which rows a plan probes, as whom and with which label: a task's real split and each of its null
    splits (same task fingerprint) probe different rows, so their reference scores must not share a key."""
    q = plan.queries
    h = hashlib.sha256()
    for arr in (q.query_ids, q.member, q.labels):
        a = np.ascontiguousarray(arr)
        h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()[:16]


def reference_key(task_fingerprint: str, plan: ProbePlan, base_digest: str, decimals: int | None = None) -> str:
    """The cache key of a plan's reference scores; ``decimals`` (the rounded outputs' columns, scored only
    with it) is part of it, so a table scored with other decimals or none is never read for it (without
    decimals the key is the one from before rounded outputs existed, so those caches stay valid)."""
    parts: list[Any] = [task_fingerprint, plan.suite_fingerprint, plan.seed, base_digest, queries_digest(plan)]
    if decimals is not None:
        parts.append(f"decimals={int(decimals)}")
    raw = json.dumps(parts)
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def resolve_model(model_or_factory: Any | Callable[[], Any]) -> Any:
    """A model, from the model itself or from a zero-argument factory (so a cache hit builds nothing)."""
    if callable(model_or_factory) and not hasattr(model_or_factory, "log_probs"):
        return model_or_factory()
    return model_or_factory


def reference_scores(
    cache_dir: str | Path, task_fingerprint: str, plan: ProbePlan, base_digest: str,
    base_model: Any | Callable[[], Any], decimals: int | None = None,
) -> pd.DataFrame:
    """Cached reference score table; ``base_model`` may be a zero-argument factory so a hit builds nothing.
    ``decimals``: also score the outputs rounded to that many decimals (``probes.scoring.score``)."""
    path = Path(cache_dir) / f"reference_{reference_key(task_fingerprint, plan, base_digest, decimals)}.parquet"
    cached = read_parquet_checked(path)
    if cached is not None and len(cached) == len(plan.planned):
        return cached
    from probes.stopwatch import phase

    with phase("reference"):  # the run's timings count it apart from the checkpoints' scoring
        table = score(resolve_model(base_model), plan, decimals=decimals)
        write_parquet_atomic(table, path)
    return table
