"""Where a sweep's results go beside its run folder: the risk report's slicing (``report:``) and W&B
(``wandb:``), with the limits W&B sets on the names it is given."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from iclmem.vocab import SliceFamily, WandbMode
from orchestrator.schema.config_base import StrictConfig, settings_default
from orchestrator.schema.slices import SliceSettings

# What W&B refuses in a project name (wandb's own check): a name with one of them fails at the first run
_WANDB_PROJECT_FORBIDDEN = "/\\#?%:"


_WANDB_PROJECT_MAX = 128


# W&B refuses an artifact name longer than this (wandb.sdk.artifacts._validators.NAME_MAXLEN), when the finished
# sweep logs it. The names a tabular sweep logs: the results artifact (orchestrator.report.wandb_logger,
# WandbResultsLogger._artifact: the prefix and the sweep's name) and each trial's checkpoint artifact
# (orchestrator.report.wandb_summary.artifact_name: the prefix and at most 120 characters of the run id);
# tests/test_validated_limits.py ties these to the code that builds the names
WANDB_NAME_MAX = 128


WANDB_RESULTS_ARTIFACT_PREFIX = "iclmem-results-"


WANDB_CHECKPOINT_ARTIFACT_PREFIX = "checkpoint-"


WANDB_ARTIFACT_KEY_MAX = 120


class SlicesConfig(StrictConfig):
    """``report.slices``: how the risk report groups a task's rows (orchestrator/schema/slices.py; docs/METHOD.md,
    "Per-record risk"). Defaults from :class:`orchestrator.schema.slices.SliceSettings`."""

    by: list[SliceFamily] = Field(default_factory=lambda: list(settings_default(SliceSettings, "by")))
    columns: list[str] = Field(default_factory=lambda: list(settings_default(SliceSettings, "columns")))
    outlier_quantiles: list[float] = Field(
        default_factory=lambda: list(settings_default(SliceSettings, "outlier_quantiles")))
    neighbours: int = Field(settings_default(SliceSettings, "neighbours"), ge=1)
    near_duplicate_radius: float = Field(settings_default(SliceSettings, "near_duplicate_radius"), ge=0.0)
    rare_level_rows: int = Field(settings_default(SliceSettings, "rare_level_rows"), ge=2)
    min_group_rows: int = Field(settings_default(SliceSettings, "min_group_rows"), ge=2)
    top_k: int = Field(settings_default(SliceSettings, "top_k"), ge=1)
    permutations: int = Field(settings_default(SliceSettings, "permutations"), ge=19, le=100_000)

    @field_validator("outlier_quantiles")
    @classmethod
    def _quantiles_inside(cls, value: list[float]) -> list[float]:
        if any(not 0.0 < q < 1.0 for q in value) or value != sorted(set(value)):
            raise ValueError(f"outlier_quantiles must rise strictly inside (0, 1), e.g. [0.5, 0.9]; got {value}")
        return value

    @field_validator("by", "columns")
    @classmethod
    def _distinct(cls, value: list[Any]) -> list[Any]:
        repeated = sorted({str(v) for v in value if value.count(v) > 1})
        if repeated:
            raise ValueError(f"{repeated} named more than once")
        return value

    @model_validator(mode="after")
    def _columns_need_their_family(self) -> SlicesConfig:
        if SliceFamily.COLUMN in self.by and not self.columns:
            raise ValueError("by names 'column' but columns is empty: name the source-table columns to slice by")
        return self


class ReportConfig(StrictConfig):
    """``report:``: what the aggregator builds beside the results (the data owner's risk report)."""

    slices: SlicesConfig = SlicesConfig()

    def slice_settings(self) -> SliceSettings:
        """The risk report's slicing from this block (the one place it becomes :class:`SliceSettings`)."""
        s = self.slices
        # naming columns is asking for their slices, whether or not ``by`` lists the family
        by = (*s.by, SliceFamily.COLUMN) if s.columns and SliceFamily.COLUMN not in s.by else tuple(s.by)
        return SliceSettings(by=by, columns=tuple(s.columns), outlier_quantiles=tuple(s.outlier_quantiles),
                             neighbours=s.neighbours, near_duplicate_radius=s.near_duplicate_radius,
                             rare_level_rows=s.rare_level_rows, min_group_rows=s.min_group_rows, top_k=s.top_k,
                             permutations=s.permutations)


class WandbConfig(StrictConfig):
    mode: WandbMode = WandbMode.OFFLINE
    project: str = "iclmem"
    entity: str | None = None

    @field_validator("project")
    @classmethod
    def _project_name(cls, value: str) -> str:
        if not value.strip():
            raise ValueError(f"the W&B project name is empty ({value!r}): name a project (default iclmem)")
        bad = sorted({c for c in value if c in _WANDB_PROJECT_FORBIDDEN})
        if bad:
            raise ValueError(f"the W&B project name {value!r} holds {' '.join(bad)}, which W&B refuses in a project "
                             "name")
        if len(value) > _WANDB_PROJECT_MAX:
            raise ValueError(f"the W&B project name is {len(value)} characters; W&B takes at most "
                             f"{_WANDB_PROJECT_MAX}")
        return value

    @field_validator("entity")
    @classmethod
    def _entity_name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError(f"the W&B entity is empty ({value!r}): name one, or leave it out for your default")
        return value
