"""LM probe sweeps: a small YAML validated with pydantic, fanned out as Ray tasks, one results table.

``run_lm_sweep(config_path, run_dir)`` is the entry point (the CLI calls it). Work units:

* exposure  per (model, dataset)                      - needed by NET subsets and NER "test seen"
* net       per (model, dataset, entity type)         - NET is deterministic, so no seed axis
* ner       per (model, dataset, entity type, seed)   - BIO datasets with a train and a test split

Each unit is one Ray task (``@ray.remote``) running the function registered under its name in
:data:`LM_TASKS`. NER tasks take the exposure task's result as a Ray dependency, so exposure, NET and
NER run concurrently as far as the dependencies allow. Datasets are read and checked in the driver
before Ray starts (every config or data mistake costs nothing) and shipped once with ``ray.put``.

Outputs in ``RUN_DIR``: ``lm_results.parquet`` (atomic), ``lm_report.html`` (Tables 2-6),
``lm_exposure/<model>__<dataset>.tsv`` (per-entity exposures and memorized / unmemorized /
unclassified classes: the entity lists are the product) and ``lm_sweep.json`` (config and versions).
Logs carry counts and names of models, datasets and types, never sentences.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Literal

import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from iclmem.errors import ConfigError, DataError, ProbeError
from iclmem.registry import Registry
from probes.lm.data import DATASET_FORMATS, LMDataset, canonical_type, load_dataset
from probes.lm.exposure import (
    ThresholdRule,
    classify_table,
    compute_exposure,
    default_thresholds,
    exposure_counts,
    memorized_lists,
)
from probes.lm.model import load_lm
from probes.lm.ner import VARIANTS, NerSettings, run_ner
from probes.lm.net import f1_table, predict_types
from probes.lm.report import write_lm_report

__all__ = [
    "LMSweepConfig",
    "load_lm_sweep",
    "parse_lm_sweep",
    "run_lm_sweep",
    "LM_TASKS",
    "RESULT_COLUMNS",
    "RESULTS_FILE",
    "REPORT_FILE",
    "EXPOSURE_DIR",
    "main",
]

RESULTS_FILE = "lm_results.parquet"
REPORT_FILE = "lm_report.html"
EXPOSURE_DIR = "lm_exposure"
RESULT_COLUMNS = ("model", "dataset", "dataset_format", "probe", "entity_type", "seed", "variant", "criterion",
                  "f1", "precision", "recall", "count", "n_eval", "baseline_f1")

log = logging.getLogger("iclmem.lm")


# ------------------------------------------------------------------------------------------- config
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LMModelConfig(_Strict):
    name: str | None = None  # label in the results; default: the directory name
    path: str | None = None  # local directory transformers can load
    builtin: Literal["synthetic"] | None = None  # tiny GPT-2 trained on the generated world

    @model_validator(mode="after")
    def _one_source(self) -> "LMModelConfig":
        if bool(self.path) == bool(self.builtin):
            raise ValueError("give exactly one of `path` (a local model directory) or `builtin: synthetic`")
        return self

    @property
    def label(self) -> str:
        return self.name or (Path(self.path).name if self.path else f"{self.builtin}-gpt2")


class ThresholdConfig(_Strict):
    metric: Literal["word", "transition"]
    memorized: float = Field(ge=0, le=1)
    unmemorized: float = Field(ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> "ThresholdConfig":
        if self.unmemorized > self.memorized:
            raise ValueError("`unmemorized` must be <= `memorized`")
        return self


class LMDatasetConfig(_Strict):
    name: str
    path: str | None = None  # a folder of split files (BIO), or an entity-list file / folder
    builtin: Literal["synthetic"] | None = None  # the generated CoNLL-format data
    format: str = "bio"  # conll2003 | wnut2017 | mit_movie | bio | entity_list
    entity_types: list[str] | None = None  # default: every type in the data
    thresholds: list[ThresholdConfig] | None = None  # default: the paper's Tables 8-9 for the format

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        if v not in DATASET_FORMATS:
            raise ValueError(f"unknown format {v!r}; known: {', '.join(DATASET_FORMATS.names())}")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "LMDatasetConfig":
        if bool(self.path) == bool(self.builtin):
            raise ValueError("give exactly one of `path` or `builtin: synthetic`")
        if self.builtin and self.format not in ("bio", "conll2003"):
            raise ValueError("the builtin synthetic dataset is in conll2003 format")
        return self

    def rules(self) -> tuple[ThresholdRule, ...]:
        fmt = "conll2003" if self.builtin else self.format
        if self.thresholds:
            return tuple(ThresholdRule(t.metric, t.memorized, t.unmemorized) for t in self.thresholds)
        return default_thresholds(fmt)


class NerConfig(_Strict):
    shots: int = Field(16, ge=1)
    positives: int = Field(9, ge=0)
    max_new_tokens: int = Field(15, ge=1)
    calibrate: bool = True
    variants: list[Literal["as-is", "seen", "unseen"]] = list(VARIANTS)
    test_seed: int = 0
    negative_ratio: float = Field(2.0, gt=0)
    max_test_sentences: int | None = Field(None, ge=1)
    batch_size: int = Field(8, ge=1)

    @model_validator(mode="after")
    def _positives_fit(self) -> "NerConfig":
        if self.positives > self.shots:
            raise ValueError("`positives` cannot exceed `shots`")
        return self

    def settings(self) -> NerSettings:
        return NerSettings(self.shots, self.positives, self.max_new_tokens, self.calibrate, tuple(self.variants),
                           self.test_seed, self.negative_ratio, self.max_test_sentences, self.batch_size)


class LMSweepConfig(_Strict):
    name: str = "lm"
    models: list[LMModelConfig] = Field(min_length=1)
    datasets: list[LMDatasetConfig] = Field(min_length=1)
    probes: list[str] = ["exposure", "net", "ner"]
    seeds: list[int] = [0, 1, 2]
    ner: NerConfig = NerConfig()
    batch_size: int = Field(32, ge=1)  # sequences per forward pass (exposure, NET)
    leading_space: bool = True  # exposure: encode entities as " " + entity (see probes.lm.exposure)
    device: str = "cpu"
    cpus_per_task: float = Field(1.0, gt=0)
    ray_address: str | None = None  # join this cluster; default: an initialized Ray, else a local one
    wandb: dict[str, str] = Field(default_factory=lambda: {"mode": "offline", "project": "iclmem-lm"})

    @field_validator("probes")
    @classmethod
    def _known_probes(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("`probes` needs at least one of exposure, net, ner")
        unknown = [p for p in v if p not in LM_TASKS]
        if unknown:
            raise ValueError(f"unknown probe(s) {unknown}; known: {', '.join(LM_TASKS.names())}")
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate probes: {v}")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if not v or len(set(v)) != len(v):
            raise ValueError("`seeds` must be a non-empty list of distinct integers")
        return v

    @model_validator(mode="after")
    def _unique_names(self) -> "LMSweepConfig":
        for kind, names in (("model", [m.label for m in self.models]), ("dataset", [d.name for d in self.datasets])):
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"duplicate {kind} name(s) {dup}; give each a distinct `name`")
        return self


def parse_lm_sweep(raw: Any, source: str = "<lm sweep>") -> LMSweepConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        return LMSweepConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{source}: {len(exc.errors())} problem(s)"]
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"]) or "(top level)"
            lines.append(f"  {where}: {e['msg']}")
        raise ConfigError("\n".join(lines)) from None


def load_lm_sweep(path: str | Path) -> LMSweepConfig:
    """Read and validate an LM sweep YAML; relative paths are relative to the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"LM sweep file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    cfg = parse_lm_sweep(raw, str(path))

    def fix(p: str | None) -> str | None:
        if p is None or Path(p).is_absolute():
            return p
        return str((path.parent / p).resolve())

    return cfg.model_copy(update={
        "models": [m.model_copy(update={"path": fix(m.path)}) for m in cfg.models],
        "datasets": [d.model_copy(update={"path": fix(d.path)}) for d in cfg.datasets],
    })


# ------------------------------------------------------------------------------------------- units
LM_TASKS: Registry[Callable[..., Any]] = Registry("LM probe")


@LM_TASKS.decorator("exposure")
def exposure_unit(model_path: str, device: str, dataset: LMDataset, rules: tuple[ThresholdRule, ...],
                  batch_size: int, leading_space: bool) -> pd.DataFrame:
    lm = load_lm(model_path, device)
    ents = dataset.entities()
    table = compute_exposure(lm, ents["entity"].tolist(), ents["entity_type"].tolist(), batch_size, leading_space)
    return classify_table(table, rules)


@LM_TASKS.decorator("net")
def net_unit(model_path: str, device: str, dataset: LMDataset, entity_type: str, types: list[str],
             batch_size: int) -> pd.DataFrame:
    lm = load_lm(model_path, device)
    ents = dataset.entities()
    mine = ents[ents["entity_type"] == entity_type]["entity"].tolist()
    pred = predict_types(lm, mine, types, batch_size=batch_size)
    pred.insert(1, "entity_type", entity_type)
    return pred


@LM_TASKS.decorator("ner")
def ner_unit(model_path: str, device: str, dataset: LMDataset, entity_type: str, seed: int,
             settings: NerSettings, exposure: pd.DataFrame | None, rule: ThresholdRule | None) -> pd.DataFrame:
    lm = load_lm(model_path, device)
    memorized = memorized_lists(exposure, rule) if exposure is not None and rule is not None else {}
    return run_ner(lm, dataset.train, dataset.test, entity_type, seed, settings, memorized)


def _ray():
    import ray

    return ray


_REMOTE: Any = None


def _remote_unit():
    global _REMOTE
    if _REMOTE is None:
        ray = _ray()

        @ray.remote
        def run_unit(kind: str, **kwargs: Any) -> Any:
            return LM_TASKS.get(kind)(**kwargs)

        _REMOTE = run_unit
    return _REMOTE


def _ensure_ray(address: str | None) -> bool:
    """Join an initialized Ray, or ``address``, or start a local one (2 CPUs, no dashboard).
    True when this call started Ray (and the sweep should shut it down)."""
    ray = _ray()
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        ray.init(address=address)
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    return True


# ------------------------------------------------------------------------------------------- driver
def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _resolve(cfg: LMSweepConfig, run_dir: Path) -> tuple[dict[str, str], dict[str, LMDataset], dict[str, str]]:
    """Model paths, loaded datasets (with their format) - before any cluster work."""
    need_synthetic = any(m.builtin for m in cfg.models) or any(d.builtin for d in cfg.datasets)
    synth_model = synth_data = None
    if need_synthetic:
        from probes.lm.synthetic import build_synthetic_assets

        log.info("lm sweep: building the synthetic model and dataset")
        synth_model, synth_data = build_synthetic_assets(run_dir / "lm_assets" / "synthetic")
    models: dict[str, str] = {}
    for m in cfg.models:
        path = str(synth_model) if m.builtin else str(m.path)
        if not Path(path).is_dir():
            raise ConfigError(f"model {m.label!r}: directory {path} does not exist")
        models[m.label] = path
    datasets: dict[str, LMDataset] = {}
    formats: dict[str, str] = {}
    for d in cfg.datasets:
        fmt = "conll2003" if d.builtin else d.format
        path = synth_data if d.builtin else d.path
        types = [canonical_type(t) for t in d.entity_types] if d.entity_types else None
        ds = load_dataset(path, fmt, d.name, types)
        if "ner" in cfg.probes and not ds.supports_ner and not DATASET_FORMATS.get(fmt).is_entity_list:
            raise DataError(f"dataset {d.name!r}: NER needs a train and a test split file in {path}")
        if ds.entities().empty:
            raise DataError(f"dataset {d.name!r}: no entity found in {path}")
        datasets[d.name] = ds
        formats[d.name] = fmt
    return models, datasets, formats


def _net_rows(model: str, dataset: str, fmt: str, preds: pd.DataFrame, exposure: pd.DataFrame | None,
              rules: tuple[ThresholdRule, ...], types: list[str]) -> list[dict[str, Any]]:
    rows = []

    def add(frame: pd.DataFrame, variant: str, criterion: str) -> None:
        for r in f1_table(frame["entity_type"], frame["predicted"], types).to_dict("records"):
            rows.append({"model": model, "dataset": dataset, "dataset_format": fmt, "probe": "net", "seed": -1,
                         "variant": variant, "criterion": criterion, "n_eval": len(frame), **r})

    add(preds, "all", "")
    if exposure is not None:
        joined = preds.merge(exposure, on=["entity", "entity_type"], how="left")
        for rule in rules:
            col = f"class_{rule.metric}"
            for variant in ("memorized", "unmemorized"):
                add(joined[joined[col] == variant], variant, rule.metric)
    return rows


def run_lm_sweep(config_path: str | Path, run_dir: str | Path, *, config: LMSweepConfig | None = None
                 ) -> pd.DataFrame:
    """Run the LM probes of a sweep file into ``run_dir`` and return the results table
    (:data:`RESULT_COLUMNS`, one row per model x dataset x probe x type x seed x variant x criterion)."""
    t0 = time.time()
    cfg = config or load_lm_sweep(config_path)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    models, datasets, formats = _resolve(cfg, run_dir)
    rules = {d.name: d.rules() for d in cfg.datasets}
    settings = cfg.ner.settings()

    started = _ensure_ray(cfg.ray_address)
    ray = _ray()
    try:
        unit = _remote_unit().options(num_cpus=cfg.cpus_per_task)
        refs_ds = {name: ray.put(ds) for name, ds in datasets.items()}
        need_exposure = ("exposure" in cfg.probes or "net" in cfg.probes
                         or ("ner" in cfg.probes and "seen" in settings.variants))
        exp_refs: dict[tuple[str, str], Any] = {}
        net_refs: dict[tuple[str, str], list[Any]] = {}
        ner_refs: list[tuple[tuple[str, str, str, int], Any]] = []
        for mname, mpath in models.items():
            for dname, ds in datasets.items():
                common = {"model_path": mpath, "device": cfg.device, "dataset": refs_ds[dname]}
                types = ds.types()
                if need_exposure:
                    exp_refs[(mname, dname)] = unit.remote("exposure", rules=rules[dname], batch_size=cfg.batch_size,
                                                           leading_space=cfg.leading_space, **common)
                if "net" in cfg.probes:
                    net_refs[(mname, dname)] = [unit.remote("net", entity_type=t, types=types,
                                                            batch_size=cfg.batch_size, **common) for t in types]
                if "ner" in cfg.probes and ds.supports_ner:
                    for t in types:
                        for seed in cfg.seeds:
                            ner_refs.append(((mname, dname, t, seed), unit.remote(
                                "ner", entity_type=t, seed=seed, settings=settings,
                                exposure=exp_refs.get((mname, dname)), rule=rules[dname][0], **common)))
        n_units = len(exp_refs) + sum(len(v) for v in net_refs.values()) + len(ner_refs)
        log.info("lm sweep %s: %d unit(s) on %d model(s) x %d dataset(s)", cfg.name, n_units, len(models),
                 len(datasets))

        def get(ref: Any, what: str) -> Any:
            try:
                return ray.get(ref)
            except Exception as exc:  # RayTaskError wraps the unit's own error
                cause = getattr(exc, "cause", None) or exc
                raise ProbeError(f"LM probe unit {what} failed: {type(cause).__name__}: {cause}") from exc

        rows: list[dict[str, Any]] = []
        exposures = {k: get(v, f"exposure {k}") for k, v in exp_refs.items()}
        (run_dir / EXPOSURE_DIR).mkdir(exist_ok=True)
        for (mname, dname), table in exposures.items():
            _write_tsv(table, run_dir / EXPOSURE_DIR / f"{_safe(mname)}__{_safe(dname)}.tsv")
            for r in exposure_counts(table, rules[dname]):
                rows.append({"model": mname, "dataset": dname, "dataset_format": formats[dname],
                             "probe": "exposure", "seed": -1, **r})
        for (mname, dname), refs in net_refs.items():
            preds = pd.concat([get(r, f"net {(mname, dname)}") for r in refs], ignore_index=True)
            rows += _net_rows(mname, dname, formats[dname], preds, exposures.get((mname, dname)), rules[dname],
                              datasets[dname].types())
        for (mname, dname, t, seed), ref in ner_refs:
            for r in get(ref, f"ner {(mname, dname, t, seed)}").to_dict("records"):
                rows.append({"model": mname, "dataset": dname, "dataset_format": formats[dname], "probe": "ner",
                             "entity_type": t, "seed": seed, "criterion": "", "baseline_f1": float("nan"),
                             **{k: r[k] for k in ("variant", "f1", "precision", "recall", "count", "n_eval")}})
    finally:
        if started:
            ray.shutdown()

    results = _results_frame(rows)
    from probes.calibration import write_parquet_atomic

    write_parquet_atomic(results, run_dir / RESULTS_FILE)
    write_lm_report(results, run_dir / REPORT_FILE, title=f"LM probes - {cfg.name}")
    _write_json(run_dir / "lm_sweep.json", {"config": cfg.model_dump(mode="json"), "versions": _versions(),
                                            "ner_settings": asdict(settings), "seconds": round(time.time() - t0, 1)})
    log_lm_results_to_wandb(results, run_dir, cfg)
    log.info("lm sweep %s: %d result row(s) in %.0fs -> %s", cfg.name, len(results), time.time() - t0, run_dir)
    return results


def log_lm_results_to_wandb(results: Any, run_dir: Path, cfg: LMSweepConfig) -> None:
    """One W&B summary run per LM sweep (offline unless online is asked for and a key is in the
    environment): the results table (metrics, names and counts only), F1 summaries and the HTML report."""
    from orchestrator.wandb_logger import resolve_wandb_mode

    mode = resolve_wandb_mode(cfg.wandb.get("mode", "offline"))
    if mode == "disabled" or results.empty:
        return
    import wandb

    run = wandb.init(project=cfg.wandb.get("project", "iclmem-lm"), group=cfg.name, job_type="lm-summary",
                     dir=str(run_dir), mode=mode, config={"sweep": cfg.name, "probes": list(cfg.probes),
                                                          "seeds": list(cfg.seeds)}, reinit="finish_previous")
    try:
        run.log({"lm_results": wandb.Table(dataframe=results.reset_index(drop=True))})
        for (probe, variant), group in results.groupby(["probe", "variant"], dropna=False):
            run.summary[f"mean_f1/{probe}/{variant}"] = float(group["f1"].mean())
        artifact = wandb.Artifact(f"iclmem-lm-{cfg.name}", type="lm-results")
        artifact.add_file(str(run_dir / REPORT_FILE))
        artifact.add_file(str(run_dir / RESULTS_FILE))
        run.log_artifact(artifact)
    finally:
        run.finish()


def _results_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))
    for c in ("model", "dataset", "dataset_format", "probe", "entity_type", "variant", "criterion"):
        df[c] = df[c].fillna("").astype(str)
    df["seed"] = df["seed"].astype("int64")
    for c in ("count", "n_eval"):
        df[c] = df[c].fillna(0).astype("int64")
    for c in ("f1", "precision", "recall", "baseline_f1"):
        df[c] = df[c].astype("float64")
    return df


def _write_tsv(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    frame.to_csv(tmp, sep="\t", index=False)
    os.replace(tmp, path)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)


def _versions() -> dict[str, str]:
    from iclmem.provenance import package_versions

    return package_versions(("torch", "transformers", "tokenizers", "ray", "pandas"))


def main(argv: list[str] | None = None) -> int:
    """``python -m probes.lm.sweep CONFIG RUN_DIR``."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m probes.lm.sweep", description=__doc__.split("\n")[0])
    p.add_argument("config")
    p.add_argument("run_dir")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    df = run_lm_sweep(args.config, args.run_dir)
    print(f"{len(df)} rows -> {Path(args.run_dir) / RESULTS_FILE}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
