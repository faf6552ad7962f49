"""LM sweep files: the language-model probe family's YAML, validated on the same base as the tabular sweep
(``StrictConfig``: unknown keys are errors; every mistake reported at once with its path; ``include:`` of a
shared base file; relative paths relative to the file; the same probe-actor and W&B blocks)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from iclmem.vocab import ExposureMetric, LMProbe, NerVariant, values
from orchestrator.schema.config import config_hash_of
from orchestrator.schema.config_base import StrictConfig, settings_default
from orchestrator.schema.config_reading import validate_config
from orchestrator.schema.outputs import WandbConfig
from orchestrator.schema.resources import ProbeActorsConfig
from probes.lm.data import DATASET_FORMATS
from probes.lm.exposure import ThresholdRule, default_thresholds
from probes.lm.settings import DEFAULT_BATCH_SIZE, NerSettings

__all__ = ["LMDatasetConfig", "LMModelConfig", "LMSweepConfig", "NerConfig", "ThresholdConfig",
           "parse_lm_sweep"]

SYNTHETIC_FORMAT = "conll2003"  # the format of the built-in synthetic dataset
_DEVICE = re.compile(r"cpu|mps|cuda(:\d+)?")  # the torch devices the LM probe actors move their models to


class LMModelConfig(StrictConfig):
    name: str | None = None  # label in the results; default: the directory name
    path: str | None = None  # local directory transformers can load
    builtin: Literal["synthetic"] | None = None  # tiny GPT-2 trained on the generated world

    @model_validator(mode="after")
    def _one_source(self) -> LMModelConfig:
        if bool(self.path) == bool(self.builtin):
            raise ValueError("give exactly one of `path` (a local model directory) or `builtin: synthetic`")
        return self

    @property
    def label(self) -> str:
        return self.name or (Path(self.path).name if self.path else f"{self.builtin}-gpt2")


class ThresholdConfig(StrictConfig):
    metric: ExposureMetric
    memorized: float = Field(ge=0, le=1)
    unmemorized: float = Field(ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> ThresholdConfig:
        if self.unmemorized > self.memorized:
            raise ValueError("`unmemorized` must be <= `memorized`")
        return self


class LMDatasetConfig(StrictConfig):
    name: str
    path: str | None = None  # a folder of split files (BIO), or an entity-list file / folder
    builtin: Literal["synthetic"] | None = None  # the generated CoNLL-format data
    format: str = "bio"  # a DATASET_FORMATS name: an open registry, so checked against it, not an enum
    entity_types: list[str] | None = None  # default: every type in the data
    thresholds: list[ThresholdConfig] | None = None  # default: the paper's Tables 8-9 for the format

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        if v not in DATASET_FORMATS:
            raise ValueError(f"unknown format {v!r}; known: {', '.join(DATASET_FORMATS.names())}")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> LMDatasetConfig:
        if bool(self.path) == bool(self.builtin):
            raise ValueError("give exactly one of `path` or `builtin: synthetic`")
        if self.builtin and self.format not in ("bio", SYNTHETIC_FORMAT):
            raise ValueError(f"the builtin synthetic dataset is in {SYNTHETIC_FORMAT} format")
        return self

    @property
    def data_format(self) -> str:
        return SYNTHETIC_FORMAT if self.builtin else self.format

    def rules(self) -> tuple[ThresholdRule, ...]:
        if self.thresholds:
            # custom thresholds keep the format's one-word exclusion (the paper's, for MIT Movie and DBpedia)
            min_words = max(r.min_words for r in default_thresholds(self.data_format))
            return tuple(ThresholdRule(t.metric.value, t.memorized, t.unmemorized, min_words=min_words)
                         for t in self.thresholds)
        return default_thresholds(self.data_format)


class NerConfig(StrictConfig):
    """``ner:``: the few-shot NER probe's settings; every default is :class:`probes.lm.settings.NerSettings`'s."""

    shots: int = Field(settings_default(NerSettings, "shots"), ge=1)
    positives: int = Field(settings_default(NerSettings, "positives"), ge=0)
    max_new_tokens: int = Field(settings_default(NerSettings, "max_new_tokens"), ge=1)
    calibrate: bool = settings_default(NerSettings, "calibrate")
    variants: list[NerVariant] = Field(
        default_factory=lambda: [NerVariant(v) for v in settings_default(NerSettings, "variants")])
    test_seed: int = settings_default(NerSettings, "test_seed")
    negative_ratio: float = Field(settings_default(NerSettings, "negative_ratio"), gt=0)
    max_test_sentences: int | None = Field(settings_default(NerSettings, "max_test_sentences"), ge=1)
    batch_size: int = Field(settings_default(NerSettings, "batch_size"), ge=1)

    @model_validator(mode="after")
    def _positives_fit(self) -> NerConfig:
        if self.positives > self.shots:
            raise ValueError("`positives` cannot exceed `shots`")
        return self

    def settings(self) -> NerSettings:
        return NerSettings(self.shots, self.positives, self.max_new_tokens, self.calibrate,
                           tuple(v.value for v in self.variants), self.test_seed, self.negative_ratio,
                           self.max_test_sentences, self.batch_size)


class LMSweepConfig(StrictConfig):
    name: str = Field("lm", pattern=r"^[A-Za-z0-9_.-]+$")
    models: list[LMModelConfig] = Field(min_length=1)
    datasets: list[LMDatasetConfig] = Field(min_length=1)
    probes: list[LMProbe] = list(LMProbe)
    seeds: list[int] = [0, 1, 2]  # NER example draws; exposure and NET are deterministic
    ner: NerConfig = NerConfig()

    def config_hash(self) -> str:
        """Names a validated LM sweep (run folders, provenance): the hash of its JSON form."""
        return config_hash_of(self.model_dump(mode="json"))
    batch_size: int = Field(DEFAULT_BATCH_SIZE, ge=1)  # sequences per forward pass (exposure, NET)
    leading_space: bool = False  # exposure: True encodes " " + entity (the spec: no added space; probes.lm.exposure)
    device: str = "cpu"
    resources: ProbeActorsConfig = ProbeActorsConfig()
    wandb: WandbConfig = WandbConfig(project="iclmem-lm")

    @field_validator("device")
    @classmethod
    def _device_name(cls, v: str) -> str:
        if not _DEVICE.fullmatch(v):
            raise ValueError(f"device {v!r}: one of cpu, cuda, cuda:N (a GPU's index) or mps")
        return v

    @field_validator("probes")
    @classmethod
    def _probes(cls, v: list[LMProbe]) -> list[LMProbe]:
        if not v:
            raise ValueError(f"`probes` needs at least one of {', '.join(values(LMProbe))}")
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate probes: {[p.value for p in v]}")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if not v or len(set(v)) != len(v):
            raise ValueError("`seeds` must be a non-empty list of distinct integers")
        return v

    @model_validator(mode="after")
    def _unique_names(self) -> LMSweepConfig:
        for kind, names in (("model", [m.label for m in self.models]), ("dataset", [d.name for d in self.datasets])):
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"duplicate {kind} name(s) {dup}; give each a distinct `name`")
        return self

    def runs(self, probe: LMProbe) -> bool:
        return probe in self.probes


def parse_lm_sweep(data: dict[str, Any], source: str = "<lm sweep>") -> LMSweepConfig:
    return validate_config(LMSweepConfig, data, source)


def unavailable_device(cfg: LMSweepConfig) -> str | None:
    """Why ``cfg.device`` cannot run on this machine (CUDA asked for, none here; likewise MPS), or None."""
    if cfg.device == "cpu":
        return None
    import torch

    if cfg.device.startswith("cuda"):
        if not torch.cuda.is_available():
            return f"device {cfg.device}, but torch sees no CUDA device on this machine"
        index = int(cfg.device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            return f"device {cfg.device}, but torch sees {torch.cuda.device_count()} CUDA device(s) here"
    elif cfg.device == "mps" and not torch.backends.mps.is_available():
        return "device mps, but torch sees no MPS device on this machine"
    return None
