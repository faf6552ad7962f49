"""The base of every sweep-file block (tabular and LM): strict validation, and the settings a block's defaults
are read from. Apart from :mod:`orchestrator.schema.config` so that the schema's blocks and the LM schema share it."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, Strict, ValidationInfo, field_validator

__all__ = ["MAX_BOOTSTRAP", "SEED_MAX", "StrictConfig", "settings_default"]

# numpy's legacy RandomState and scikit-learn's random_state take seeds in [0, 2**32): a larger one fails
# inside Stage I or a trial, so the schema refuses it
SEED_MAX = 2**32 - 1
# The most bootstrap resamples a probe draws (probe.bootstrap, `iclmem probe --bootstrap`, `iclmem audit-context
# --bootstrap`). The intervals' endpoints are settled to well under 0.01 AUC by a few thousand resamples; 100,000
# keeps a probe's index arrays (resamples x (members + non-members) int64, probes.metrics.bootstrap_indices) at
# 160 MB for Q = 100 and 1.6 GB for Q = 1000, while 1e12 could never be held and fails every probe after training.
MAX_BOOTSTRAP = 100_000


def settings_default(settings: type, name: str) -> Any:
    """The default of field ``name`` of a lower layer's settings dataclass (``FinetuneSpec``, ``PrepSettings``,
    ``ProbeSettings``, ``CanarySettings``): a schema default is read from there, never written a second time
    (tests/test_defaults.py ties every schema block to the settings it builds)."""
    found = {f.name: f for f in dataclasses.fields(settings)}[name]
    if found.default is not dataclasses.MISSING:
        return found.default
    assert found.default_factory is not dataclasses.MISSING, f"{settings.__name__}.{name} has no default"
    return found.default_factory()


class StrictConfig(BaseModel):
    """Every block of a sweep file (tabular and LM): unknown keys are errors, a boolean is never a number (YAML
    reads ``true``, ``yes`` and ``on`` as booleans, which pydantic would take as 1), and a number is finite
    unless a setting says otherwise (``grid.dp``, where ``.inf`` means no DP)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        found = _boolean_where_number(field.annotation, value) if field is not None else None
        if found is not None:
            where, flag = found
            raise ValueError(f"a number is meant{f' at {where}' if where else ''}, got the boolean "
                             f"{str(flag).lower()} (YAML reads true/false, yes/no and on/off as booleans)")
        return value


def _boolean_where_number(annotation: Any, value: Any, where: str = "") -> tuple[str, bool] | None:
    """(where in ``value``, the boolean) for the first boolean given where ``annotation`` asks for a number (an
    int or a float, alone, in a list or as a mapping's value), or None. A setting that admits a boolean (or
    anything) takes it as it is."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *metadata = typing.get_args(annotation)
        if any(isinstance(m, Strict) and m.strict for m in metadata):  # pydantic refuses a boolean there itself
            return None
        return _boolean_where_number(base, value, where)
    if origin in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
        if any(m is bool or m is Any for m in members):
            return None
        return next((found for m in members if (found := _boolean_where_number(m, value, where)) is not None), None)
    if isinstance(value, bool):
        return (where, value) if annotation in (int, float) else None
    args = typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset) and isinstance(value, (list, tuple)) and args:
        return next((found for i, item in enumerate(value)
                     if (found := _boolean_where_number(args[0], item, f"{where}[{i}]")) is not None), None)
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return next((found for key, item in value.items()
                     if (found := _boolean_where_number(args[1], item, f"{where}.{key}" if where else str(key)))
                     is not None), None)
    return None
