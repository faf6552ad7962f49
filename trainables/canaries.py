"""Canaries: crafted rows inserted into a run's fine-tuning members, 1, 2, 4 or 8 times each.

A canary is a secret the run may memorize: a row with a label the rest of the table does not predict.
Two kinds (``iclmem.vocab.CanaryKind``):

* ``outlier``: every number 4-6 of its column's standard deviations from the column's mean (random
  sign), every text cell a random word of its column's vocabulary, a label drawn uniformly at random;
* ``rare_label``: the features of a real row the run never sees (jittered by 0.1 standard deviation per
  number, so no canary equals a table row) under the label that is rarest among the members, drawn from
  rows of other labels. A reference model trains on its target's canaries: its task carries the target's
  label (``PreparedTask.canary_label``, set by ``reference_task``), not the rarest of its own half.

Two designs (``iclmem.vocab.CanaryDesign``):

* ``exposure``: for each kind, ``per_group`` canaries are inserted with each copy count of ``copies`` and
  ``holdout`` more are drawn the same way but never inserted: the held-out canaries are the reference
  distribution a canary's exposure and its rank test are measured against (``probes.canaries``).
* ``one_run``: for each kind, ``m`` canaries are drawn, and each is inserted once or not at all by a fair
  coin of its own (independent of every other draw, from the run's seed): the design of the one-run ε
  bound (``probes.one_run``), whose unit is one row added or removed. The coins are the ``copies`` (1 or
  0) the ground-truth log records.

Inserted and held-out canaries of one kind are exchangeable draws of one generator, so an untrained model
cannot tell them apart.

Everything here is a pure function of (prepared task, settings): the trainable, a probe actor and a
recomputed checkpoint all rebuild the same canaries. Canary ids are negative (-1, -2, ...): they never
collide with a table's row numbers, and every table of results shows at a glance which rows are canaries.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from iclmem.errors import ConfigError
from iclmem.vocab import CanaryDesign, CanaryKind, ColumnKind

DEFAULT_COPIES: tuple[int, ...] = (1, 2, 4, 8)
DEFAULT_ONE_RUN_M = 128  # one_run canaries per kind (benchmarks/one_run.py measures what that buys)
_STREAM_CANARY = 6  # beside trainables/data/split.py's STREAM_* streams: the canaries' random draws never share theirs
_STREAM_COINS = 7  # the one_run inclusion coins: a stream of their own, so they are independent of the draws
OUTLIER_SIGMAS = (4.0, 6.0)  # an outlier number lies this many of its column's standard deviations out
JITTER_SIGMAS = 0.1  # a rare_label canary's numbers are moved by this many standard deviations (Gaussian)


@dataclass(frozen=True)
class CanarySettings:
    """Which canaries a run gets: kinds x copy counts x ``per_group`` inserted, ``holdout`` per kind held out."""

    kinds: tuple[CanaryKind, ...]
    copies: tuple[int, ...] = DEFAULT_COPIES
    per_group: int = 4
    holdout: int = 32
    design: CanaryDesign = CanaryDesign.EXPOSURE
    m: int = DEFAULT_ONE_RUN_M  # one_run only: canaries per kind, each inserted with probability 1/2

    def __post_init__(self) -> None:
        kinds = tuple(CanaryKind(k) for k in self.kinds)
        design = CanaryDesign(self.design)
        copies = tuple(int(c) for c in self.copies) if design is CanaryDesign.EXPOSURE else (1,)
        object.__setattr__(self, "kinds", kinds)
        object.__setattr__(self, "copies", copies)
        object.__setattr__(self, "design", design)
        if not kinds or len(set(kinds)) != len(kinds):
            raise ConfigError(f"canary kinds must be distinct and at least one, got {[k.value for k in kinds]}")
        if not copies or len(set(copies)) != len(copies) or min(copies) < 1:
            raise ConfigError(f"canary copy counts must be distinct integers >= 1, got {list(copies)}")
        if int(self.per_group) < 1 or int(self.holdout) < 1:
            raise ConfigError(f"canaries need per_group >= 1 and holdout >= 1, got {self.per_group}, {self.holdout}")
        if design is CanaryDesign.ONE_RUN and int(self.m) < 16:
            raise ConfigError(f"one_run canaries need m >= 16 per kind (the bound's guesses are fractions of m), "
                              f"got {self.m}")

    def as_dict(self) -> dict[str, Any]:
        if self.design is CanaryDesign.ONE_RUN:
            # the exposure design's dict is unchanged by the one_run fields, so its runs keep their ids
            return {"kinds": [k.value for k in self.kinds], "design": self.design.value, "m": int(self.m)}
        return {"kinds": [k.value for k in self.kinds], "copies": list(self.copies),
                "per_group": int(self.per_group), "holdout": int(self.holdout)}

    @classmethod
    def from_value(cls, value: CanarySettings | Mapping[str, Any]) -> CanarySettings:
        if isinstance(value, CanarySettings):
            return value
        data = dict(value)
        return cls(kinds=tuple(data["kinds"]), copies=tuple(data.get("copies", cls.copies)),
                   per_group=int(data.get("per_group", cls.per_group)), holdout=int(data.get("holdout", cls.holdout)),
                   design=CanaryDesign(data.get("design", cls.design)), m=int(data.get("m", cls.m)))

    @property
    def per_kind(self) -> int:
        """Canaries drawn per kind, inserted and held out."""
        if self.design is CanaryDesign.ONE_RUN:
            return int(self.m)
        return self.per_group * len(self.copies) + self.holdout

    @property
    def n_canaries(self) -> int:
        """Canaries of a run, inserted and held out: the extra queries every checkpoint's probe scores."""
        return len(self.kinds) * self.per_kind

    @property
    def n_inserted_rows(self) -> int:
        """Query rows the canaries add to each fine-tuning step (every copy is one row); for one_run the
        expected number (half the canaries: which ones is the coins')."""
        if self.design is CanaryDesign.ONE_RUN:
            return self.n_canaries // 2
        return len(self.kinds) * self.per_group * sum(self.copies)


# eq=False: arrays compare by content through the fingerprint, not element-wise
@dataclass(frozen=True, eq=False)
class CanarySet:
    """The canaries of one run. Shapes: n canaries (inserted, then held out, kind by kind), F features."""

    ids: np.ndarray  # int64 [n], negative
    kinds: tuple[CanaryKind, ...]  # [n]
    copies: np.ndarray  # int64 [n]: how often it is a fine-tuning query row; 0 = held out (never trained)
    features: np.ndarray  # float32 [n, F], in the task's prepared feature space
    labels: np.ndarray  # int64 [n]: the label it is (or would be) trained with
    source_row_ids: np.ndarray  # int64 [n]: the table row a rare_label canary's features come from; -1 for outliers
    settings: CanarySettings
    fingerprint: str

    def __post_init__(self) -> None:
        for name, dtype in (("ids", np.int64), ("copies", np.int64), ("features", np.float32),
                            ("labels", np.int64), ("source_row_ids", np.int64)):
            frozen = np.array(getattr(self, name), dtype=dtype, copy=True, order="C")
            frozen.flags.writeable = False
            object.__setattr__(self, name, frozen)

    def __len__(self) -> int:
        return int(self.ids.size)

    @property
    def inserted(self) -> np.ndarray:
        """bool [n]: canaries the run trains on."""
        return self.copies > 0

    def training_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(features float32 [R, F], labels int64 [R]) of every inserted copy, R = sum of copies: the query
        rows the canaries add to each fine-tuning step."""
        repeat = np.repeat(np.arange(len(self)), self.copies)
        return self.features[repeat], self.labels[repeat]

    def log(self) -> dict[str, Any]:
        """The ground-truth record of the canaries (ids, kinds, copies, labels, source rows; no feature
        values: they are rebuilt from the task and the settings)."""
        return {"settings": self.settings.as_dict(), "fingerprint": self.fingerprint,
                "ids": [int(v) for v in self.ids], "kinds": [k.value for k in self.kinds],
                "copies": [int(v) for v in self.copies], "labels": [int(v) for v in self.labels],
                "source_row_ids": [int(v) for v in self.source_row_ids]}


def _column_kinds(task: Any) -> tuple[ColumnKind, ...]:
    columns = getattr(task, "columns", None)
    if columns is None:
        return (ColumnKind.NUMBER,) * int(np.asarray(task.features).shape[1])
    return tuple(columns.kinds)


def rarest_member_label(task: Any) -> int:
    """The label fewest members are trained with (ties: the smaller label), among labels with any rows."""
    counts = np.bincount(np.asarray(task.labels)[np.asarray(task.member_idx)], minlength=task.n_classes)
    present = np.bincount(np.asarray(task.labels), minlength=task.n_classes) > 0
    candidates = np.flatnonzero(present)
    return int(candidates[np.argmin(counts[candidates])])


def canary_label(task: Any) -> int:
    """The label a rare_label canary of ``task`` is trained with: the task's ``canary_label`` where it carries
    one (a reference task carries its target's, so references train on the target's canaries), else the
    rarest label among its own members (:func:`rarest_member_label`)."""
    fixed = getattr(task, "canary_label", None)
    return rarest_member_label(task) if fixed is None else int(fixed)


def make_canaries(task: Any, settings: CanarySettings | Mapping[str, Any]) -> CanarySet:
    """The canaries of a run on prepared ``task`` (see the module docstring); deterministic in both."""
    settings = CanarySettings.from_value(settings)
    features = np.asarray(task.features, dtype=np.float64)
    labels = np.asarray(task.labels)
    kinds = _column_kinds(task)
    mean, std = features.mean(axis=0), features.std(axis=0)
    columns = getattr(task, "columns", None)
    vocab_sizes = [len(c.vocabulary) for c in columns.columns] if columns is not None else [0] * len(kinds)
    used = np.zeros(len(labels), dtype=bool)
    used[np.asarray(task.member_idx)] = used[np.asarray(task.nonmember_idx)] = used[np.asarray(task.context_idx)] = True
    rare = canary_label(task)

    # seeded by (seed, task name), not the task's fingerprint: `iclmem probe` re-prepares the task under
    # another fingerprint and must rebuild the very canaries the run trained on
    rng = np.random.default_rng([_STREAM_CANARY, int(task.seed), zlib.crc32(str(task.name).encode())])
    out_features, out_labels, out_kinds, out_copies, out_sources = [], [], [], [], []
    coins = np.random.default_rng([_STREAM_COINS, int(task.seed), zlib.crc32(str(task.name).encode())])
    for kind in settings.kinds:
        n = settings.per_kind
        if settings.design is CanaryDesign.ONE_RUN:
            copies = (coins.random(n) < 0.5).astype(np.int64)  # in (1 copy) or out, each by its own fair coin
        else:
            copies = np.concatenate([np.repeat(settings.copies, settings.per_group),
                                     np.zeros(settings.holdout, dtype=np.int64)])
        rows = np.empty((n, len(kinds)))
        source = np.full(n, -1, dtype=np.int64)
        picked = np.zeros(n, dtype=np.int64)
        if kind is CanaryKind.OUTLIER:
            sign = rng.choice([-1.0, 1.0], size=(n, len(kinds)))
            rows[:] = mean + sign * rng.uniform(*OUTLIER_SIGMAS, size=(n, len(kinds))) * std
            label = rng.integers(task.n_classes, size=n)
        else:
            # rows of other labels, preferring rows the run never sees in any part
            pool = np.flatnonzero(~used & (labels != rare))
            if pool.size < n:
                pool = np.flatnonzero(labels != rare)
            if pool.size == 0:
                raise ConfigError(f"task {task.name!r}: every row has label {rare}: no rare_label canary can be drawn")
            picked = rng.choice(pool, size=n, replace=pool.size < n)
            rows[:] = features[picked] + rng.normal(0.0, JITTER_SIGMAS, size=(n, len(kinds))) * std
            source = np.asarray(task.row_ids)[picked].astype(np.int64)
            label = np.full(n, rare, dtype=np.int64)
        for j, col_kind in enumerate(kinds):
            if col_kind is ColumnKind.TEXT:
                # a word of the column's vocabulary: a random one for an outlier, the source row's otherwise
                rows[:, j] = rng.integers(vocab_sizes[j], size=n) if kind is CanaryKind.OUTLIER else features[picked, j]
            elif col_kind is ColumnKind.DATE:
                rows[:, j] = np.round(rows[:, j])
        out_features.append(rows)
        out_labels.append(label)
        out_kinds.extend([kind] * n)
        out_copies.append(copies)
        out_sources.append(source)
    feats = np.concatenate(out_features).astype(np.float32)
    total = feats.shape[0]
    ids = -np.arange(1, total + 1, dtype=np.int64)
    copies_all, labels_all = np.concatenate(out_copies).astype(np.int64), np.concatenate(out_labels).astype(np.int64)
    # the fingerprint covers what a canary is (settings, features, labels, copies), not which preparation of
    # the task it was drawn from, so a rebuilt set can be checked against the one a run recorded
    digest = hashlib.sha256(json.dumps(settings.as_dict()).encode() + feats.tobytes() + labels_all.tobytes()
                            + copies_all.tobytes())
    return CanarySet(ids=ids, kinds=tuple(out_kinds), copies=copies_all,
                     features=feats, labels=labels_all, source_row_ids=np.concatenate(out_sources),
                     settings=settings, fingerprint=digest.hexdigest())


__all__ = ["CanarySettings", "CanarySet", "canary_label", "make_canaries", "rarest_member_label", "DEFAULT_COPIES"]
