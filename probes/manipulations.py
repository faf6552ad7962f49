"""Stage II context manipulations: from one query to the contexts it is probed with.

The multiple-choice base context ``C_base`` for a query ``q = (x_q, y*)`` over ``m = |Y|`` candidate
labels holds ``m`` rows, each a copy of ``x_q``, labelled ``0, 1, ..., m-1`` in sorted order. Every
context row carries the query's own features, so a manipulated context is fully described by a
:class:`ContextPlan` -- the label of each row, the kept feature columns, and the values of any
distractor columns -- and :func:`materialize` / :func:`materialize_batch` turn plans into arrays.

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

Composition order (fixed, so every combination is well-defined whatever order a suite lists steps in;
steps of the same phase run in the order listed):

1. **counts** -- the label multiset. It starts at one row per candidate; the skew and scale steps
   *multiply* per-label row counts, so "x2" means "twice as many rows as before" and stacking steps
   multiplies (skew_true x2 then scale_uniform x5 gives the true label 10 rows). ``scale_random`` draws
   one multiplier per current row, so a label with c rows gets the sum of c draws.
2. The multiset is laid out in sorted label order (copies of a label adjacent), as in ``C_base``.
3. **order** -- ``position`` moves *all* rows of the true label as one contiguous block: to the front,
   to the end, or into one of the ``n_other + 1`` gaps between the other rows chosen uniformly (the
   block's original gap included, so "random" is an unbiased draw, not a forced move). The other rows
   keep their relative order.
4. **features** -- ``drop_features`` removes columns from the kept set, never the last one: a context
   with no real feature left would not show the model its query at all. With 1 feature it drops
   nothing (the manipulation degenerates to its counterpart without the drop); with 2 features it
   drops 1; otherwise 2 (or ``n``, capped at kept-1). Kept columns stay sorted. The columns are those of
   the task as Stage I prepared it for the model's input contract: real table columns for ``cells``
   (ConTextTab) and, unreduced, encoded ones for ``numeric`` (a category's one-hot columns count one by
   one); PCA components only where PCA was applied.
5. **distractors** -- drawn last, once the number of rows N is known: ``[N+1, n]`` standard-normal
   float32 values (features are standardised in Stage I, so N(0, 1) matches their scale), the last row
   belonging to the query. Distractor columns follow the kept columns in the materialised arrays.

Edge cases: ``n_classes`` must be >= 2 and ``n_features`` >= 1 (else :class:`ProbeError`). For binary
tasks ``skew_incorrect`` with k = 2 or 3 equals k = 1 (there is only one incorrect label); those suite
entries stay, with their names, so every task reports the same 48 manipulations.

Seeding: every random choice for (run seed, query id, manipulation name) comes from
:func:`rng_for`, a PCG64 generator seeded from a blake2b hash of the three -- never Python's salted
``hash()`` -- so reruns, workers and the reference model all see byte-identical contexts. Two
manipulations with different names draw independently (hence ``drop_features_a`` / ``_b`` are two
draws).

Default suite (:func:`default_suite`): 48 manipulations in 11 categories, in this order::

    base (1):            base
    position (3):        position_random, position_first, position_last
    skew_true (3):       skew_true_x2, skew_true_x3, skew_true_x5
    skew_incorrect (9):  skew_incorrect_k1_x2, skew_incorrect_k1_x3, skew_incorrect_k1_x5,
                         skew_incorrect_k2_x2, skew_incorrect_k2_x3, skew_incorrect_k2_x5,
                         skew_incorrect_k3_x2, skew_incorrect_k3_x3, skew_incorrect_k3_x5
    skew_mixed (3):      skew_mixed_t2_i3, skew_mixed_t3_i2, skew_mixed_t5_i2
    scale_uniform (3):   scale_uniform_x2, scale_uniform_x5, scale_uniform_x10
    scale_random (3):    scale_random_f2, scale_random_f5, scale_random_f10
    drop_features (2):   drop_features_a, drop_features_b
    distractors (2):     distractors_1, distractors_2
    combo2 (9):          combo2_random_skew_true_x2, combo2_random_skew_true_x3,
                         combo2_random_skew_true_x5, combo2_random_scale_uniform_x2,
                         combo2_random_scale_uniform_x5, combo2_random_scale_uniform_x10,
                         combo2_random_drop_features, combo2_random_distractors_1,
                         combo2_random_distractors_2
    combo3 (10):         combo3_random_skew_true_x2_drop_features,
                         combo3_random_skew_true_x2_distractors_1,
                         combo3_random_skew_true_x3_drop_features,
                         combo3_random_skew_true_x3_distractors_1,
                         combo3_random_skew_true_x5_drop_features,
                         combo3_random_skew_true_x5_distractors_1,
                         combo3_random_skew_incorrect_k1_x2_distractors_1,
                         combo3_random_skew_incorrect_k1_x3_distractors_1,
                         combo3_first_scale_uniform_x5_drop_features,
                         combo3_last_scale_random_f5_distractors_2

Suites are data: :func:`suite_from_spec` builds one from a YAML-like list whose entries are either a
registered manipulation name or ``{name, category?, steps: [{primitive, **params}, ...]}``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np

from iclmem.errors import ConfigError, ProbeError, UnknownNameError
from iclmem.registry import Registry

__all__ = [
    "Phase",
    "ParamSpec",
    "Primitive",
    "Step",
    "step",
    "Manipulation",
    "ContextPlan",
    "PlannedContext",
    "PlanShape",
    "Suite",
    "PRIMITIVES",
    "MANIPULATIONS",
    "DEFAULT_CATEGORY_COUNTS",
    "rng_for",
    "apply",
    "materialize",
    "materialize_batch",
    "default_suite",
    "suite_from_spec",
    "suite_to_spec",
    "suite_fingerprint",
    "build_plans",
    "group_by_shape",
]

# Bumping this changes every random draw; do it only together with a note in the results' metadata.
_RNG_PERSON = b"iclmem.probes.v1"  # blake2b personalisation, exactly 16 bytes
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


# --------------------------------------------------------------------------------------------------
# Plans and materialisation
# --------------------------------------------------------------------------------------------------


class PlanShape(NamedTuple):
    """What must agree for plans to share a batch: rows N, kept columns F', distractor columns d."""

    n_rows: int
    n_kept: int
    n_distractors: int


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class ContextPlan:
    """One manipulated context for one query. Arrays are read-only.

    labels:        int64   [N]       label of each context row, in row order
    keep_columns:  int64   [F']      feature columns of x_q kept, sorted ascending
    distractors:   float32 [N+1, d]  distractor values; rows 0..N-1 context, row N the query
    """

    labels: np.ndarray
    keep_columns: np.ndarray
    distractors: np.ndarray

    def __post_init__(self) -> None:
        labels = np.asarray(self.labels)
        keep = np.asarray(self.keep_columns)
        dis = np.asarray(self.distractors)
        if labels.ndim != 1 or labels.dtype != np.int64 or labels.size == 0:
            raise ProbeError(f"plan labels must be a non-empty int64 vector, got {labels.dtype} {labels.shape}")
        if keep.ndim != 1 or keep.dtype != np.int64:
            raise ProbeError(f"plan keep_columns must be an int64 vector, got {keep.dtype} {keep.shape}")
        if keep.size and (keep[0] < 0 or not bool((keep[1:] > keep[:-1]).all())):
            raise ProbeError("plan keep_columns must be sorted, unique and non-negative")
        if dis.ndim != 2 or dis.dtype != np.float32 or dis.shape[0] != labels.size + 1:
            raise ProbeError(
                f"plan distractors must be float32 [N+1={labels.size + 1}, d], got {dis.dtype} {dis.shape}"
            )
        if keep.size + dis.shape[1] == 0:
            raise ProbeError("plan has no feature columns at all")
        # object.__setattr__: the dataclass is frozen; we only swap in read-only contiguous copies.
        object.__setattr__(self, "labels", _frozen(labels))
        object.__setattr__(self, "keep_columns", _frozen(keep))
        object.__setattr__(self, "distractors", _frozen(dis))

    @property
    def n_rows(self) -> int:
        return int(self.labels.size)

    @property
    def n_kept(self) -> int:
        return int(self.keep_columns.size)

    @property
    def n_distractors(self) -> int:
        return int(self.distractors.shape[1])

    @property
    def n_columns(self) -> int:
        """Width of the materialised rows, F' + d."""
        return self.n_kept + self.n_distractors

    @property
    def shape(self) -> PlanShape:
        return PlanShape(self.n_rows, self.n_kept, self.n_distractors)

    def to_bytes(self) -> bytes:
        """Canonical byte form: equal bytes <=> identical contexts (used for equality and hashing)."""
        header = np.asarray(self.shape, dtype=np.int64).tobytes()
        return header + self.labels.tobytes() + self.keep_columns.tobytes() + self.distractors.tobytes()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ContextPlan):
            return NotImplemented
        return self.to_bytes() == other.to_bytes()

    def __hash__(self) -> int:
        return hash(self.to_bytes())


def materialize(plan: ContextPlan, x_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Context rows and query row of one plan: (float32 [N, F'+d], float32 [F'+d])."""
    x = np.asarray(x_q, dtype=np.float32)
    if x.ndim != 1:
        raise ProbeError(f"x_q must be one feature vector, got shape {x.shape}")
    if plan.n_kept and int(plan.keep_columns[-1]) >= x.size:
        raise ProbeError(f"plan keeps column {int(plan.keep_columns[-1])} but x_q has {x.size} features")
    kept = x[plan.keep_columns]
    query_x = np.concatenate([kept, plan.distractors[-1]])
    context_x = np.concatenate(
        [np.broadcast_to(kept, (plan.n_rows, plan.n_kept)), plan.distractors[:-1]], axis=1
    )
    return np.ascontiguousarray(context_x, dtype=np.float32), query_x.astype(np.float32, copy=False)


def materialize_batch(
    plans: Sequence[ContextPlan], X_q: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised :func:`materialize` for plans of one :class:`PlanShape`, plan b with query row X_q[b].

    Returns context_x float32 [B, N, F'+d], context_y int64 [B, N], query_x float32 [B, F'+d] -- the
    layout ``ModelAdapter.log_probs`` takes (add the query axis with ``query_x[:, None]``).
    """
    if len(plans) == 0:
        raise ProbeError("materialize_batch needs at least one plan")
    X = np.asarray(X_q, dtype=np.float32)
    if X.ndim != 2 or X.shape[0] != len(plans):
        raise ProbeError(f"X_q must be [B={len(plans)}, F], got shape {X.shape}")
    shape = plans[0].shape
    if any(p.shape != shape for p in plans):
        raise ProbeError("materialize_batch needs plans of one shape; group them with group_by_shape first")
    n_rows, n_kept, _ = shape
    keep = np.stack([p.keep_columns for p in plans])  # [B, F']
    if n_kept and int(keep.max()) >= X.shape[1]:
        raise ProbeError(f"a plan keeps column {int(keep.max())} but X_q has {X.shape[1]} features")
    kept = np.take_along_axis(X, keep, axis=1)  # [B, F'] -- each plan keeps its own columns
    dis = np.stack([p.distractors for p in plans])  # [B, N+1, d]
    context_x = np.concatenate(
        [np.broadcast_to(kept[:, None, :], (len(plans), n_rows, n_kept)), dis[:, :-1]], axis=2
    )
    query_x = np.concatenate([kept, dis[:, -1]], axis=1)
    context_y = np.stack([p.labels for p in plans])
    return (
        np.ascontiguousarray(context_x, dtype=np.float32),
        np.ascontiguousarray(context_y, dtype=np.int64),
        np.ascontiguousarray(query_x, dtype=np.float32),
    )


# --------------------------------------------------------------------------------------------------
# Primitives
# --------------------------------------------------------------------------------------------------


class Phase(IntEnum):
    """Composition order of primitives (see module docstring)."""

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


# --------------------------------------------------------------------------------------------------
# Manipulations
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One primitive with checked parameters, as sorted (name, value) pairs so the step is hashable."""

    primitive: str
    params: tuple[tuple[str, ParamValue], ...] = ()

    @property
    def kwargs(self) -> dict[str, ParamValue]:
        return dict(self.params)

    @property
    def phase(self) -> Phase:
        return PRIMITIVES.get(self.primitive).phase

    def to_spec(self) -> dict[str, ParamValue]:
        return {"primitive": self.primitive, **self.kwargs}


def step(primitive: str, **params: Any) -> Step:
    """A validated :class:`Step`; unknown primitive -> UnknownNameError, bad parameter -> ConfigError."""
    return Step(primitive, PRIMITIVES.get(primitive).validate(params))


def _check_name(what: str, name: Any) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        # Names become parquet values, file names and plot labels: keep them plain.
        raise ConfigError(f"{what} must match {_NAME_RE.pattern} (letters, digits, _ . -), got {name!r}")
    return name


@dataclass(frozen=True)
class Manipulation:
    """A named, categorised composition of primitive steps.

    Steps are validated and stored in composition order (stable sort by :class:`Phase`), so two
    manipulations that do the same thing compare equal whatever order their steps were written in.
    """

    name: str
    category: str
    steps: tuple[Step, ...] = field(default=())

    def __post_init__(self) -> None:
        _check_name("manipulation name", self.name)
        _check_name(f"category of manipulation {self.name!r}", self.category)
        checked = []
        for s in self.steps:
            if not isinstance(s, Step):
                raise ConfigError(f"manipulation {self.name!r}: steps must be Step objects, got {s!r}")
            # Re-validate: a Step built by hand bypasses step().
            checked.append(Step(s.primitive, PRIMITIVES.get(s.primitive).validate(s.kwargs)))
        checked.sort(key=lambda s: s.phase)  # list.sort is stable: same-phase steps keep their order
        object.__setattr__(self, "steps", tuple(checked))

    def to_spec(self) -> dict[str, Any]:
        return {"name": self.name, "category": self.category, "steps": [s.to_spec() for s in self.steps]}


Suite = tuple[Manipulation, ...]


def rng_for(seed: int, query_id: int, manipulation_name: str) -> np.random.Generator:
    """The generator for every random choice of one (run seed, query id, manipulation name).

    blake2b (not Python's per-process salted ``hash()``) so every process and rerun agrees; PCG64 named
    explicitly so a change of numpy's default bit generator cannot change the contexts.
    """
    key = f"{int(seed)}:{int(query_id)}:{manipulation_name}".encode()
    digest = hashlib.blake2b(key, digest_size=16, person=_RNG_PERSON).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest, "little")))


def apply(
    manipulation: Manipulation,
    true_label: int,
    n_classes: int,
    n_features: int,
    rng: np.random.Generator,
) -> ContextPlan:
    """The context plan of ``manipulation`` for a query with label ``true_label`` (composition order
    in the module docstring)."""
    if isinstance(n_classes, bool) or int(n_classes) < 2:
        raise ProbeError(f"a multiple-choice probe needs at least 2 candidate labels, got n_classes={n_classes}")
    if int(n_features) < 1:
        raise ProbeError(f"a probe needs at least one feature column, got n_features={n_features}")
    if not 0 <= int(true_label) < int(n_classes):
        raise ProbeError(f"true_label {true_label} outside the candidate set [0, {n_classes})")
    ctx = StepContext(int(true_label), int(n_classes), int(n_features))
    by_phase: dict[Phase, list[Step]] = {p: [] for p in Phase}
    for s in manipulation.steps:  # already in composition order
        by_phase[s.phase].append(s)

    def run(phase: Phase, array: np.ndarray) -> np.ndarray:
        for s in by_phase[phase]:
            array = PRIMITIVES.get(s.primitive).fn(array, ctx, rng, **s.kwargs)
        return array

    counts = run(Phase.COUNTS, np.ones(ctx.n_classes, dtype=np.int64))
    rows = run(Phase.ORDER, np.repeat(np.arange(ctx.n_classes, dtype=np.int64), counts))
    keep = run(Phase.FEATURES, np.arange(ctx.n_features, dtype=np.int64))
    distractors = run(Phase.DISTRACTORS, np.zeros((rows.size + 1, 0), dtype=np.float32))
    return ContextPlan(labels=rows, keep_columns=keep, distractors=distractors)


# --------------------------------------------------------------------------------------------------
# Suites
# --------------------------------------------------------------------------------------------------

MANIPULATIONS: Registry[Manipulation] = Registry("manipulation")

# The spec's table, category -> count; default_suite() is checked against it at import.
DEFAULT_CATEGORY_COUNTS: dict[str, int] = {
    "base": 1,
    "position": 3,
    "skew_true": 3,
    "skew_incorrect": 9,
    "skew_mixed": 3,
    "scale_uniform": 3,
    "scale_random": 3,
    "drop_features": 2,
    "distractors": 2,
    "combo2": 9,
    "combo3": 10,
}


def _build_default_suite() -> Suite:
    m: list[Manipulation] = []

    def add(name: str, category: str, *steps: Step) -> None:
        m.append(Manipulation(name, category, steps))

    rand = step("position", where="random")
    first, last = step("position", where="first"), step("position", where="last")
    drop, dis1, dis2 = step("drop_features"), step("distractors", n=1), step("distractors", n=2)

    add("base", "base")
    for where in ("random", "first", "last"):
        add(f"position_{where}", "position", step("position", where=where))
    for r in (2, 3, 5):
        add(f"skew_true_x{r}", "skew_true", step("skew_true", repeat=r))
    for k in (1, 2, 3):
        for r in (2, 3, 5):
            add(f"skew_incorrect_k{k}_x{r}", "skew_incorrect", step("skew_incorrect", k=k, repeat=r))
    for a, b in ((2, 3), (3, 2), (5, 2)):
        add(f"skew_mixed_t{a}_i{b}", "skew_mixed", step("skew_mixed", true_repeat=a, incorrect_repeat=b))
    for f in (2, 5, 10):
        add(f"scale_uniform_x{f}", "scale_uniform", step("scale_uniform", factor=f))
    for f in (2, 5, 10):
        add(f"scale_random_f{f}", "scale_random", step("scale_random", max_factor=f))
    # Two draws of the same primitive: the names differ, so rng_for gives them independent columns.
    add("drop_features_a", "drop_features", drop)
    add("drop_features_b", "drop_features", drop)
    add("distractors_1", "distractors", dis1)
    add("distractors_2", "distractors", dis2)

    for r in (2, 3, 5):
        add(f"combo2_random_skew_true_x{r}", "combo2", rand, step("skew_true", repeat=r))
    for f in (2, 5, 10):
        add(f"combo2_random_scale_uniform_x{f}", "combo2", rand, step("scale_uniform", factor=f))
    add("combo2_random_drop_features", "combo2", rand, drop)
    add("combo2_random_distractors_1", "combo2", rand, dis1)
    add("combo2_random_distractors_2", "combo2", rand, dis2)

    for r in (2, 3, 5):
        add(f"combo3_random_skew_true_x{r}_drop_features", "combo3", rand, step("skew_true", repeat=r), drop)
        add(f"combo3_random_skew_true_x{r}_distractors_1", "combo3", rand, step("skew_true", repeat=r), dis1)
    for r in (2, 3):
        add(
            f"combo3_random_skew_incorrect_k1_x{r}_distractors_1",
            "combo3",
            rand,
            step("skew_incorrect", k=1, repeat=r),
            dis1,
        )
    add("combo3_first_scale_uniform_x5_drop_features", "combo3", first, step("scale_uniform", factor=5), drop)
    add("combo3_last_scale_random_f5_distractors_2", "combo3", last, step("scale_random", max_factor=5), dis2)

    suite = tuple(m)
    counts: dict[str, int] = {}
    for x in suite:
        counts[x.category] = counts.get(x.category, 0) + 1
    # Fail at import rather than ship a suite that silently disagrees with the spec's table.
    if counts != DEFAULT_CATEGORY_COUNTS or len(suite) != 48:
        raise ProbeError(f"default suite disagrees with the spec's table: {counts}")
    return suite


_DEFAULT_SUITE: Suite = _build_default_suite()
for _m in _DEFAULT_SUITE:
    MANIPULATIONS.register(_m.name, _m)


def default_suite() -> Suite:
    """The spec's 48 manipulations in 11 categories, in table order (names in the module docstring)."""
    return _DEFAULT_SUITE


def _step_from_spec(owner: str, raw: Any) -> Step:
    if not isinstance(raw, Mapping) or "primitive" not in raw:
        raise ConfigError(f"manipulation {owner!r}: each step must be a mapping with a 'primitive' key, got {raw!r}")
    params = {k: v for k, v in raw.items() if k != "primitive"}
    try:
        return step(raw["primitive"], **params)
    except UnknownNameError as exc:
        raise UnknownNameError(f"manipulation {owner!r}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"manipulation {owner!r}: {exc}") from None


def suite_from_spec(spec: Sequence[str | Mapping[str, Any]]) -> Suite:
    """Build a suite from a YAML-like list.

    Each entry is either the name of a registered manipulation (e.g. ``skew_true_x2``) or a mapping
    ``{name: str, category: str = "custom", steps: [{primitive: str, **params}, ...]}``. Errors are
    ConfigError (empty suite, duplicate name, bad entry or parameter, a custom entry reusing a
    registered name -- results would then carry a known name with a different meaning) and
    UnknownNameError (unknown manipulation or primitive; the message lists the known ones).
    """
    if isinstance(spec, (str, bytes, Mapping)) or not isinstance(spec, Iterable):
        raise ConfigError(f"a manipulation suite must be a list of names or mappings, got {type(spec).__name__}")
    entries = list(spec)
    if not entries:
        raise ConfigError("the manipulation suite is empty")
    out: list[Manipulation] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            manipulation = MANIPULATIONS.get(entry)
        elif isinstance(entry, Mapping):
            unknown = sorted(set(entry) - {"name", "category", "steps"})
            if unknown:
                raise ConfigError(f"suite entry {i}: unknown key(s) {unknown}; accepted: name, category, steps")
            name = _check_name(f"suite entry {i} name", entry.get("name"))
            if name in MANIPULATIONS:
                raise ConfigError(
                    f"suite entry {i}: {name!r} is a registered manipulation; list it by name alone "
                    f"or give the custom one another name"
                )
            steps = entry.get("steps")
            if not isinstance(steps, Sequence) or isinstance(steps, (str, bytes)):
                raise ConfigError(f"manipulation {name!r}: 'steps' must be a list (may be empty), got {steps!r}")
            manipulation = Manipulation(
                name, entry.get("category", "custom"), tuple(_step_from_spec(name, s) for s in steps)
            )
        else:
            raise ConfigError(f"suite entry {i} must be a manipulation name or a mapping, got {entry!r}")
        if manipulation.name in seen:
            raise ConfigError(f"manipulation name {manipulation.name!r} appears twice in the suite")
        seen.add(manipulation.name)
        out.append(manipulation)
    return tuple(out)


def suite_to_spec(suite: Sequence[Manipulation]) -> list[dict[str, Any]]:
    """Fully expanded spec of a suite (every entry as a mapping): what a result should record."""
    return [m.to_spec() for m in suite]


def suite_fingerprint(suite: Sequence[Manipulation]) -> str:
    """Stable hash of a suite's expanded spec; reference scores are reusable only under the same one."""
    text = json.dumps(suite_to_spec(suite), sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16, person=_RNG_PERSON).hexdigest()


# --------------------------------------------------------------------------------------------------
# Plans for many queries
# --------------------------------------------------------------------------------------------------


class PlannedContext(NamedTuple):
    query_index: int  # position in the query_ids / true_labels arrays, not the query id itself
    manipulation_index: int  # position in the suite
    plan: ContextPlan


def build_plans(
    suite: Sequence[Manipulation],
    seed: int,
    query_ids: np.ndarray,
    true_labels: np.ndarray,
    n_classes: int,
    n_features: int,
) -> list[PlannedContext]:
    """One plan per (query, manipulation), query-major, each drawn from ``rng_for(seed, query_id, name)``."""
    if len(suite) == 0:
        raise ConfigError("the manipulation suite is empty")
    ids = np.asarray(query_ids)
    labels = np.asarray(true_labels)
    if ids.ndim != 1 or labels.shape != ids.shape:
        raise ProbeError(f"query_ids and true_labels must be vectors of one length, got {ids.shape} and {labels.shape}")
    if not (np.issubdtype(ids.dtype, np.integer) and np.issubdtype(labels.dtype, np.integer)) and ids.size:
        raise ProbeError(f"query_ids and true_labels must be integers, got {ids.dtype} and {labels.dtype}")
    out: list[PlannedContext] = []
    for qi, (qid, label) in enumerate(zip(ids.tolist(), labels.tolist())):
        for mi, manipulation in enumerate(suite):
            rng = rng_for(seed, qid, manipulation.name)
            out.append(PlannedContext(qi, mi, apply(manipulation, label, n_classes, n_features, rng)))
    return out


def group_by_shape(planned: Sequence[PlannedContext | ContextPlan]) -> dict[PlanShape, list[int]]:
    """Indices into ``planned`` grouped by :class:`PlanShape`, groups and indices in first-seen order,
    so each group can go through :func:`materialize_batch` in one call."""
    groups: dict[PlanShape, list[int]] = {}
    for i, item in enumerate(planned):
        plan = item.plan if isinstance(item, PlannedContext) else item
        groups.setdefault(plan.shape, []).append(i)
    return groups
