"""LM probe work units: what one worker computes for one (model, dataset[, type[, seed]]), and how its
result is stored. Ray-free; ``probes.actors.LMUnitWorker`` runs them, ``orchestrator.driver.lm_sweep`` plans them.

* exposure  per (model, dataset)                      per-entity exposures and classes
* net       per (model, dataset, entity type)         zero-shot type predictions (deterministic: no seed)
* ner       per (model, dataset, entity type, seed)   few-shot NER scores per test variant

A unit function takes the loaded model and dataset and the unit's own keyword parameters and returns
one table. A unit's result is stored as ``<stem>.parquet`` (page checksums) and, written last,
``<stem>.json`` with the unit's identity and the sha256 of the Parquet file: a unit whose files are
missing, partial or altered loads as None and is computed again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from iclmem.atomic import write_json_atomic, write_parquet_atomic
from iclmem.registry import Registry
from iclmem.vocab import LMProbe
from probes.lm.data import LMDataset
from probes.lm.exposure import ThresholdRule, classify_table, compute_exposure
from probes.lm.model import LanguageModel
from probes.lm.ner import run_ner
from probes.lm.net import predict_types
from probes.lm.settings import NerSettings

__all__ = ["LM_UNITS", "LMUnit", "LMUnitResult", "unit_key"]

LM_UNITS: Registry[Callable[..., pd.DataFrame]] = Registry("LM probe unit")


@LM_UNITS.decorator(LMProbe.EXPOSURE.value)
def exposure_unit(lm: LanguageModel, dataset: LMDataset, *, rules: Sequence[ThresholdRule], batch_size: int,
                  leading_space: bool) -> pd.DataFrame:
    ents = dataset.entities()
    table = compute_exposure(lm, ents["entity"].tolist(), ents["entity_type"].tolist(), batch_size, leading_space)
    return classify_table(table, rules)


@LM_UNITS.decorator(LMProbe.NET.value)
def net_unit(lm: LanguageModel, dataset: LMDataset, *, entity_type: str, types: Sequence[str],
             batch_size: int) -> pd.DataFrame:
    ents = dataset.entities()
    mine = ents[ents["entity_type"] == entity_type]["entity"].tolist()
    pred = predict_types(lm, mine, list(types), batch_size=batch_size)
    pred.insert(1, "entity_type", entity_type)
    return pred


@LM_UNITS.decorator(LMProbe.NER.value)
def ner_unit(lm: LanguageModel, dataset: LMDataset, *, entity_type: str, seed: int, settings: NerSettings,
             memorized: Mapping[str, Sequence[str]]) -> pd.DataFrame:
    return run_ner(lm, dataset.train, dataset.test, entity_type, seed, settings, memorized)


def _canonical(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


def unit_key(kind: str, model_path: str, dataset: str, device: str, params: Mapping[str, Any]) -> str:
    """A digest of everything a unit's result depends on in the config: a run folder reused with other
    settings computes new units instead of returning stale ones."""
    text = json.dumps({"kind": kind, "model": model_path, "dataset": dataset, "device": device, **params},
                      sort_keys=True, default=_canonical)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class LMUnit:
    """One LM work unit, as the probe pool sends it to a worker: ``params`` are the unit function's
    keyword arguments; the result is stored under ``out_dir/stem``."""

    kind: str  # an LMProbe value: the LM_UNITS entry to run
    model: str  # the model's label (the worker maps it to a local directory)
    dataset: str
    params: Mapping[str, Any]
    out_dir: str
    stem: str
    entity_type: str = ""
    seed: int = -1

    @property
    def identity(self) -> dict[str, Any]:
        return {"probe": self.kind, "model": self.model, "dataset": self.dataset, "entity_type": self.entity_type,
                "seed": self.seed}

    def run(self, lm: LanguageModel, dataset: LMDataset) -> pd.DataFrame:
        return LM_UNITS.get(self.kind)(lm, dataset, **self.params)


@dataclass(frozen=True)
class LMUnitResult:
    """A finished unit: ``row`` (its identity, time and node: what the pool reports) and its table."""

    row: dict[str, Any]
    table: pd.DataFrame
    notes: tuple[str, ...] = field(default=())  # for the driver's log; not stored

    def save(self, directory: str | Path, stem: str) -> Path:
        """Atomic and idempotent; the JSON, written after the table, is what makes the unit count as done."""
        directory = Path(directory)
        table_path = write_parquet_atomic(self.table, directory / f"{stem}.parquet")
        digest = hashlib.sha256(table_path.read_bytes()).hexdigest()
        return write_json_atomic(directory / f"{stem}.json", {"unit": self.row, "table_sha256": digest},
                                 allow_nan=True)

    @classmethod
    def load(cls, directory: str | Path, stem: str) -> LMUnitResult | None:
        """The stored unit, or None when it is missing, partial or fails its checksum (then it is recomputed)."""
        import warnings

        from iclmem.atomic import read_parquet_checked

        directory = Path(directory)
        table_path = directory / f"{stem}.parquet"
        try:
            stored = json.loads((directory / f"{stem}.json").read_text())
            digest = hashlib.sha256(table_path.read_bytes()).hexdigest()
        except (OSError, ValueError):
            return None
        if digest != stored.get("table_sha256"):
            warnings.warn(f"LM unit result {table_path} fails its checksum; recomputing", stacklevel=2)
            return None
        table = read_parquet_checked(table_path)
        return None if table is None else cls(dict(stored["unit"]), table)
