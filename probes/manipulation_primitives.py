"""The eight primitives a manipulation composes: their phases, their parameters and what each does.

Each primitive rewrites the array of its :class:`Phase` for one query and is registered in ``PRIMITIVES``
with its parameter checks (:class:`ParamSpec`). How a manipulation runs its steps phase by phase, and
the rules of each phase, are in :mod:`probes.manipulations` (``apply`` and its docstring).

Primitives (registry ``PRIMITIVES``; parameters in brackets, all integers unless stated)
-------------------------------------------------------------------------------------------
==================  ==========  ==================================================================
primitive           phase       effect
==================  ==========  ==================================================================
skew_true           counts      true label's row count x ``repeat``
skew_incorrect      counts      ``k`` distinct random incorrect labels (k capped at m-1), each x ``repeat``
skew_mixed          counts      true label x ``true_repeat``; one random incorrect label x ``incorrect_repeat``
scale_uniform       counts      every row x ``factor``
scale_random        counts      every row x an independent draw from U{1..``max_factor``}
position            order       ``where`` (str) = random | first | last: move the true-label rows
drop_features       features    drop ``n`` random feature columns (default: 2, or 1 if < 3 features)
distractors         distractors append ``n`` columns of fresh N(0, 1) values, query row included
==================  ==========  ==================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from iclmem.errors import ConfigError
from iclmem.registry import Registry

__all__ = ["Phase", "StepContext", "ParamValue", "ParamSpec", "PrimitiveFn", "Primitive", "PRIMITIVES"]


class Phase(IntEnum):
    """Composition order of primitives (see :mod:`probes.manipulations`)."""

    COUNTS = 0
    ORDER = 1
    FEATURES = 2
    DISTRACTORS = 3


@dataclass(frozen=True)
class StepContext:
    """Facts about the query a primitive may need besides its phase's array."""

    true_label: int
    n_classes: int
    n_features: int


ParamValue = int | str


@dataclass(frozen=True)
class ParamSpec:
    """One primitive parameter: an int >= ``minimum`` or, with ``choices``, one of those strings.

    ``default`` None with ``required`` False means "absent": the primitive applies its own rule.
    """

    name: str
    required: bool = True
    default: ParamValue | None = None
    minimum: int = 1
    choices: tuple[str, ...] = ()

    def check(self, primitive: str, value: Any) -> ParamValue:
        if self.choices:
            if not isinstance(value, str) or value not in self.choices:
                raise ConfigError(
                    f"primitive {primitive!r}: {self.name} must be one of {list(self.choices)}, got {value!r}"
                )
            return value
        # bool is an int subclass; True as "repeat" is a typo, not a count.
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise ConfigError(f"primitive {primitive!r}: {self.name} must be an integer, got {value!r}")
        if int(value) < self.minimum:
            raise ConfigError(f"primitive {primitive!r}: {self.name} must be >= {self.minimum}, got {value!r}")
        return int(value)


# fn(array of its phase, context, rng, **params) -> new array. Arrays per phase:
#   COUNTS: int64 [m] rows per label; ORDER: int64 [N] labels in row order;
#   FEATURES: int64 [F'] kept columns; DISTRACTORS: float32 [N+1, d] distractor values.
PrimitiveFn = Callable[..., np.ndarray]


@dataclass(frozen=True)
class Primitive:
    name: str
    phase: Phase
    fn: PrimitiveFn
    params: tuple[ParamSpec, ...]
    doc: str

    def validate(self, raw: Mapping[str, Any]) -> tuple[tuple[str, ParamValue], ...]:
        """Checked parameters, defaults filled in, as sorted (name, value) pairs."""
        known = {p.name: p for p in self.params}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ConfigError(
                f"primitive {self.name!r} got unknown parameter(s) {unknown}; accepted: {sorted(known) or 'none'}"
            )
        out: dict[str, ParamValue] = {}
        for spec in self.params:
            if spec.name in raw:
                out[spec.name] = spec.check(self.name, raw[spec.name])
            elif spec.required and spec.default is None:
                raise ConfigError(f"primitive {self.name!r} needs parameter {spec.name!r}")
            elif spec.default is not None:
                out[spec.name] = spec.default
        return tuple(sorted(out.items()))


PRIMITIVES: Registry[Primitive] = Registry("manipulation primitive")


def _primitive(name: str, phase: Phase, *params: ParamSpec) -> Callable[[PrimitiveFn], PrimitiveFn]:
    def wrap(fn: PrimitiveFn) -> PrimitiveFn:
        PRIMITIVES.register(name, Primitive(name, phase, fn, params, (fn.__doc__ or "").strip()))
        return fn

    return wrap


def _incorrect_labels(ctx: StepContext) -> np.ndarray:
    labels = np.arange(ctx.n_classes, dtype=np.int64)
    return np.asarray(labels[labels != ctx.true_label])


@_primitive("skew_true", Phase.COUNTS, ParamSpec("repeat"))
def _skew_true(counts: np.ndarray, ctx: StepContext, rng: np.random.Generator, *, repeat: int) -> np.ndarray:
    """Multiply the true label's row count by ``repeat``."""
    out = counts.copy()
    out[ctx.true_label] *= repeat
    return out


@_primitive("skew_incorrect", Phase.COUNTS, ParamSpec("k"), ParamSpec("repeat"))
def _skew_incorrect(
    counts: np.ndarray, ctx: StepContext, rng: np.random.Generator, *, k: int, repeat: int
) -> np.ndarray:
    """Multiply the row counts of k distinct random incorrect labels by ``repeat``; k capped at m-1."""
    wrong = _incorrect_labels(ctx)
    chosen = rng.choice(wrong, size=min(k, wrong.size), replace=False)
    out = counts.copy()
    out[chosen] *= repeat
    return out


@_primitive("skew_mixed", Phase.COUNTS, ParamSpec("true_repeat"), ParamSpec("incorrect_repeat"))
def _skew_mixed(
    counts: np.ndarray, ctx: StepContext, rng: np.random.Generator, *, true_repeat: int, incorrect_repeat: int
) -> np.ndarray:
    """Multiply the true label's rows by ``true_repeat`` and one random incorrect label's by ``incorrect_repeat``."""
    wrong = _incorrect_labels(ctx)
    out = counts.copy()
    out[ctx.true_label] *= true_repeat
    out[wrong[rng.integers(wrong.size)]] *= incorrect_repeat
    return out


@_primitive("scale_uniform", Phase.COUNTS, ParamSpec("factor"))
def _scale_uniform(counts: np.ndarray, ctx: StepContext, rng: np.random.Generator, *, factor: int) -> np.ndarray:
    """Multiply every row count by ``factor``."""
    return counts * factor


@_primitive("scale_random", Phase.COUNTS, ParamSpec("max_factor"))
def _scale_random(
    counts: np.ndarray, ctx: StepContext, rng: np.random.Generator, *, max_factor: int
) -> np.ndarray:
    """Repeat every current row by its own draw from U{1..max_factor}."""
    rows = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    draws = rng.integers(1, max_factor + 1, size=rows.size, dtype=np.int64)
    return np.bincount(rows, weights=draws, minlength=counts.size).astype(np.int64)


@_primitive(
    "position",
    Phase.ORDER,
    ParamSpec("where", required=False, default="random", choices=("random", "first", "last")),
)
def _position(rows: np.ndarray, ctx: StepContext, rng: np.random.Generator, *, where: str) -> np.ndarray:
    """Move the true label's rows, as one block, to a uniformly random gap / the front / the end."""
    is_true = rows == ctx.true_label
    block, others = rows[is_true], rows[~is_true]
    if where == "first":
        gap = 0
    elif where == "last":
        gap = others.size
    else:
        gap = int(rng.integers(others.size + 1))
    return np.concatenate([others[:gap], block, others[gap:]])


@_primitive("drop_features", Phase.FEATURES, ParamSpec("n", required=False))
def _drop_features(
    keep: np.ndarray, ctx: StepContext, rng: np.random.Generator, *, n: int | None = None
) -> np.ndarray:
    """Drop n random kept columns (default 2, or 1 with fewer than 3), never the last one."""
    if n is None:
        n = 2 if keep.size >= 3 else 1
    n = min(n, keep.size - 1)  # keep >= 1 real column, else the query's own features vanish
    if n <= 0:
        return keep
    mask = np.ones(keep.size, dtype=bool)
    mask[rng.choice(keep.size, size=n, replace=False)] = False
    return keep[mask]  # boolean mask keeps the sorted order


@_primitive("distractors", Phase.DISTRACTORS, ParamSpec("n"))
def _distractors(dis: np.ndarray, ctx: StepContext, rng: np.random.Generator, *, n: int) -> np.ndarray:
    """Append n columns of fresh standard-normal values for every context row and the query row."""
    fresh = rng.standard_normal((dis.shape[0], n), dtype=np.float32)
    return np.concatenate([dis, fresh], axis=1)
