"""Stage II context manipulations: which context plans a query is probed with, and the suites naming them.

A manipulation is a named, categorised composition of primitive steps (:class:`Manipulation`, :func:`step`;
the eight primitives and their parameters are in :mod:`probes.manipulation_primitives`). :func:`apply` draws
one manipulation's :class:`~probes.context_plans.ContextPlan` for one query, :func:`build_plans` every
(query, manipulation) plan of a probe and :func:`group_by_shape` batches them for
:func:`~probes.context_plans.materialize_batch`. The suites -- the default 48, or one built from a config's
list -- are the rest of this module.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from iclmem.errors import ConfigError, ProbeError, UnknownNameError
from iclmem.registry import Registry
from probes.context_plans import ContextPlan, PlanShape, materialize_batch
from probes.manipulation_primitives import PRIMITIVES, ParamValue, Phase, StepContext

__all__ = [
    "Step",
    "step",
    "Manipulation",
    "ContextPlan",
    "PlannedContext",
    "PlanShape",
    "Suite",
    "MANIPULATIONS",
    "DEFAULT_CATEGORY_COUNTS",
    "rng_for",
    "apply",
    "materialize_batch",  # not used here: probes/scoring.py takes it from this module with the plans it batches
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
