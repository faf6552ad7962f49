"""The sweep's ``canaries:`` block: planted canary rows and strings whose exposure the probe measures (read into
:class:`trainables.canaries.CanarySettings`, whose defaults it takes)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from iclmem.vocab import CanaryDesign, CanaryKind
from orchestrator.schema.config_base import StrictConfig, settings_default
from probes.settings import ProbeSettings
from trainables.canaries import CanarySettings


class CanaryConfig(StrictConfig):
    """Canary rows inserted into every audited run's fine-tuning members (trainables/canaries.py). Design
    ``exposure``: for each kind, ``per_group`` canaries per copy count, each trained that many times per
    step, and ``holdout`` never-trained ones that their exposure and rank test are measured against
    (probes/canaries.py). Design ``one_run``: for each kind, ``m`` canaries each trained once with
    probability 1/2, for the one-run ε bound (probes/one_run.py). ``beta``: the audit's error probability
    (the one-run bound holds at 1 − beta; a rank test's p-value below beta marks the canaries detected);
    ``delta``: the δ of the one-run claim tested (unset: ``outcome.epsilon_delta``). No kinds = off."""

    kinds: list[CanaryKind] = []
    design: CanaryDesign = settings_default(CanarySettings, "design")
    copies: list[int] = list(settings_default(CanarySettings, "copies"))
    per_group: int = Field(settings_default(CanarySettings, "per_group"), ge=1, le=256)
    holdout: int = Field(settings_default(CanarySettings, "holdout"), ge=4, le=4096)
    m: int = Field(settings_default(CanarySettings, "m"), ge=16, le=65536)
    beta: float = Field(settings_default(ProbeSettings, "canary_beta"), gt=0, lt=0.5)
    delta: float | None = Field(None, ge=0, lt=1)

    @model_validator(mode="after")
    def _design_fields(self) -> CanaryConfig:
        # a field of the other design is refused, never silently ignored (one left at its default is not in
        # force either way, and the sweep.json a run folder keeps lists every field)
        def changed(names: tuple[str, ...]) -> list[str]:
            return [n for n in names if getattr(self, n) != type(self).model_fields[n].default]

        if self.design is CanaryDesign.ONE_RUN:
            stray = changed(("copies", "per_group", "holdout"))
            if stray:
                raise ValueError(f"design one_run inserts each of m canaries once with probability 1/2 (the one-run "
                                 f"bound's unit is one row): {', '.join(stray)} belong(s) to design exposure; "
                                 "set m instead")
        elif changed(("m", "delta")):
            stray = changed(("m", "delta"))
            raise ValueError(f"{', '.join(stray)} belong(s) to design one_run (the one-run ε bound); set "
                             "design: one_run, or per_group / holdout / copies for design exposure")
        return self

    @field_validator("kinds", "copies")
    @classmethod
    def _distinct(cls, values: list[Any]) -> list[Any]:
        if len(set(values)) != len(values):
            raise ValueError(f"duplicate values: {[str(getattr(v, 'value', v)) for v in values]}")
        return values

    @field_validator("copies")
    @classmethod
    def _copy_counts(cls, values: list[int]) -> list[int]:
        if not values or min(values) < 1:
            raise ValueError(f"copy counts must be >= 1 and at least one, got {values}")
        return values

    @property
    def enabled(self) -> bool:
        return bool(self.kinds)

    def settings(self) -> dict[str, Any] | None:
        """The ``trainables.canaries.CanarySettings`` of a run (as a dict), or None when off."""
        if not self.enabled:
            return None
        from trainables.canaries import CanarySettings

        return CanarySettings(tuple(self.kinds), tuple(self.copies), self.per_group, self.holdout, self.design,
                              self.m).as_dict()
