"""Drawing the split: which rows are members, non-members and the fine-tuning context C', with the blind check.

Members and non-members are drawn stratified by label (regression: matched pairs on the target), C' is
uniform over the labels. A draw is kept when members and non-members are close in distribution (label
TVD, or KS on a regression target) and, unless the design is the paper's unmatched one, when a scorer
fitted on C' alone cannot tell them apart (the blind baseline, :mod:`trainables.data.blind`); otherwise the
next seed is drawn, up to ``max_redraws`` times (:func:`draw_accepted_split`). Under ``shuffled_members``
the labels as scored are permuted per group here too. Every random draw of Stage I comes from a stream of
its own (``STREAM_*``), so e.g. a redraw of the split never changes the label shuffle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iclmem.errors import ConfigError, DataError, SplitError
from iclmem.vocab import LabelDesign, LabelMode, TaskKind
from trainables.data.blind import BlindBaseline, blind_baseline, blind_fit_rows
from trainables.data.table import Table
from trainables.data.task import PrepSettings

__all__ = [
    "STREAM_SHUFFLE_ALL",
    "STREAM_SHUFFLE_MEMBERS",
    "STREAM_SPLIT",
    "STREAM_NULL",
    "STREAM_REFERENCE",
    "STREAM_SHUFFLE_NONMEMBERS",
    "STREAM_SHUFFLE_UNUSED",
    "stream_rng",
    "Split",
    "check_sizes",
    "split_label_design",
    "AcceptedSplit",
    "draw_accepted_split",
]


# Independent random streams per purpose, so e.g. a redraw of the split never changes the label shuffle.
STREAM_SHUFFLE_ALL = 1
STREAM_SHUFFLE_MEMBERS = 2
STREAM_SPLIT = 3
STREAM_NULL = 4
STREAM_REFERENCE = 5
STREAM_SHUFFLE_NONMEMBERS = 6
STREAM_SHUFFLE_UNUSED = 7


def stream_rng(seed: int, stream: int) -> np.random.Generator:
    """The generator of one purpose's stream for one seed."""
    return np.random.default_rng([stream, seed])


# --------------------------------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------------------------------


def check_sizes(name: str, table: Table, labels: np.ndarray, settings: PrepSettings) -> tuple[np.ndarray, int]:
    """Refuse a table too small for the settings; (members per class, context rows per class)."""
    n_rows, n_classes = len(labels), len(table.class_names)
    needed = 2 * settings.q + settings.context_size * (2 if settings.context_in_pool else 1)
    if n_rows < needed:
        raise DataError(
            f"task {name!r}: too few rows: 2*q + context_size = 2*{settings.q} + {settings.context_size} = {needed} "
            f"rows are needed, but only {n_rows} remain after dropping missing targets and duplicates"
        )
    # C' must hold the same number of rows of every label; when context_size is not a multiple of the
    # number of classes the context is floor(context_size / n_classes) rows per class, i.e. slightly
    # smaller than context_size, rather than breaking uniformity.
    per_class = settings.context_size // n_classes
    if per_class < 1:
        raise ConfigError(
            f"task {name!r}: context_size {settings.context_size} is smaller than the number of classes "
            f"({n_classes}); a uniform context needs at least one row per class"
        )
    counts = np.bincount(labels, minlength=n_classes)
    alloc = _allocate(counts, settings.q)
    context_rows = 2 * per_class if settings.context_in_pool else per_class
    for c in range(n_classes):
        need_c = context_rows + 2 * int(alloc[c])
        if counts[c] < need_c:
            context_part = (f"{per_class} for the uniform context and {per_class} non-members matching it"
                            if settings.context_in_pool else f"{per_class} for the uniform context")
            raise DataError(
                f"task {name!r}: class {table.class_names[c]!r} has {counts[c]} rows but {need_c} are needed "
                f"({context_part} + 2*{alloc[c]} for members and non-members); "
                f"lower q or context_size"
            )
    return alloc, per_class


def _allocate(class_counts: np.ndarray, total: int) -> np.ndarray:
    """Proportional allocation of `total` draws over classes (largest remainder, ties to lower index)."""
    share = class_counts / class_counts.sum() * total
    alloc: np.ndarray = np.floor(share).astype(np.int64)
    remainder = share - alloc
    order = np.lexsort((np.arange(len(share)), -remainder))
    alloc[order[: total - int(alloc.sum())]] += 1
    return alloc


# --------------------------------------------------------------------------------------------------
# The draw Stage I keeps
# --------------------------------------------------------------------------------------------------


def split_label_design(settings: PrepSettings, label_mode: LabelMode) -> LabelDesign:
    """The label design in force: ``settings.label_design`` under ``shuffled_members``, else matched.

    Under shuffled_members the paper's (unmatched) design scores members on permuted labels and
    non-members on true ones; every other (mode, design) treats members and non-members alike, so their
    blind baseline must sit at chance, and a draw whose blind interval excludes 0.5 is redrawn."""
    return settings.label_design if label_mode is LabelMode.SHUFFLED_MEMBERS else LabelDesign.MATCHED


@dataclass(frozen=True, eq=False)
class AcceptedSplit:
    """The draw Stage I keeps, with the labels every row is trained and probed with under it."""

    split: Split
    labels: np.ndarray  # int64 [n_rows], as scored (see _scored_labels)
    target_values: np.ndarray | None  # float64 [n_rows], as scored; None for classification
    blind: BlindBaseline
    redraws: int  # draws before this one: its seed is seed + redraws
    blind_redraws: int  # draws refused because their blind baseline was separable


def draw_accepted_split(name: str, table: Table, labels: np.ndarray, target_values: np.ndarray | None,
                        alloc: np.ndarray, per_class: int, settings: PrepSettings, label_mode: LabelMode,
                        design: LabelDesign, seed: int) -> AcceptedSplit:
    """Draw from seeds ``seed``, ``seed + 1``, ... until a split passes the distribution check and (matched
    design) the blind check; raises SplitError, saying which check failed, after ``settings.max_redraws``
    redraws. ``labels`` / ``target_values``: the labels before the split (after ``shuffled_all``)."""
    n_classes = len(table.class_names)
    check_blind = design is LabelDesign.MATCHED
    best: Split | None = None
    blind_refused: list[float] = []
    for redraws in range(settings.max_redraws + 1):
        draw_seed = seed + redraws
        candidate = _draw_split(labels, target_values, n_classes, alloc, per_class, stream_rng(draw_seed, STREAM_SPLIT),
                                settings.context_in_pool)
        if not _split_passes(candidate, table.task, settings):
            if best is None or _distance(candidate) < _distance(best):
                best = candidate
            continue
        scored, scored_values = _scored_labels(labels, target_values, candidate, label_mode, design, draw_seed)
        rows = np.concatenate([candidate.members, candidate.nonmembers])
        flags = np.arange(len(rows)) < len(candidate.members)
        fit = blind_fit_rows(len(labels), candidate.members, candidate.nonmembers, candidate.context)
        blind = blind_baseline(table.features[fit], scored[fit], table.features[rows], scored[rows], flags, n_classes)
        if check_blind and blind.separable:
            blind_refused.append(blind.auc)
            continue
        return AcceptedSplit(candidate, scored, scored_values, blind, redraws, len(blind_refused))
    if blind_refused:
        raise SplitError(
            f"task {name!r}, label_mode {label_mode.value}: every member / non-member draw that passed the "
            f"distribution check had members and non-members separable without the model ({len(blind_refused)} "
            f"draws, blind AUC {min(blind_refused):.3f}..{max(blind_refused):.3f}, interval excluding 0.5) after "
            f"{settings.max_redraws} redraws (seeds {seed}..{seed + settings.max_redraws}); raise q or "
            f"max_redraws, or use another seed"
        )
    assert best is not None
    if table.task is TaskKind.REGRESSION:
        detail = (
            f"best KS statistic {best.ks:.4f} >= ks_max {settings.ks_max} "
            f"(with q={settings.q} distinct targets KS cannot go below 1/q = {1 / settings.q:.4f})"
        )
    else:
        detail = f"best label TVD {best.tvd:.4f} >= tvd_max {settings.tvd_max}"
    raise SplitError(
        f"task {name!r}: no member / non-member split passed the distribution check after "
        f"{settings.max_redraws} redraws (seeds {seed}..{seed + settings.max_redraws}); {detail}"
    )


# --------------------------------------------------------------------------------------------------
# One draw
# --------------------------------------------------------------------------------------------------


@dataclass
class Split:
    """One draw: positions of the members, non-members and C' (sorted), and how close the two groups are."""

    members: np.ndarray
    nonmembers: np.ndarray
    context: np.ndarray
    tvd: float
    ks: float | None
    ks_pvalue: float | None
    wasserstein: float | None


def _draw_split(
    labels: np.ndarray,
    target_values: np.ndarray | None,
    n_classes: int,
    member_alloc: np.ndarray,
    per_class_context: int,
    rng: np.random.Generator,
    context_in_pool: bool = False,
) -> Split:
    members: list[np.ndarray] = []
    nonmembers: list[np.ndarray] = []
    context: list[np.ndarray] = []

    def pair_up(pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if target_values is not None:
            # Matched pairs: sort the pool by target (random order among ties, from the permutation)
            # and send one row of each adjacent pair to each side. Member and non-member ECDFs then
            # differ by at most one row anywhere, so KS <= 1/q; independent draws of q = 50 rows
            # would almost never reach KS < 0.05.
            pool = pool[np.argsort(target_values[pool], kind="stable")]
        pairs = pool.reshape(-1, 2)
        flip = rng.integers(0, 2, size=len(pairs))
        return pairs[np.arange(len(pairs)), flip], pairs[np.arange(len(pairs)), 1 - flip]

    for c in range(n_classes):
        rows = rng.permutation(np.flatnonzero(labels == c))
        if context_in_pool:
            # C' is part of the member pool: its rows are paired with as many non-member rows of the class
            # (a fair coin per pair, as for the members), so the pool and the non-members match in labels
            start = 2 * per_class_context
            in_pool, out_pool = pair_up(rows[:start])
            context.append(in_pool)
            members.append(in_pool)
            nonmembers.append(out_pool)
        else:
            start = per_class_context
            context.append(rows[:per_class_context])
        chosen, left = pair_up(rows[start : start + 2 * member_alloc[c]])
        members.append(chosen)
        nonmembers.append(left)
    m = np.sort(np.concatenate(members)).astype(np.int64)
    n = np.sort(np.concatenate(nonmembers)).astype(np.int64)
    ctx = np.sort(np.concatenate(context)).astype(np.int64)
    ks = pvalue = wasserstein = None
    if target_values is not None:
        from scipy import stats  # imported on use: scipy.stats is slow to import

        result = stats.ks_2samp(target_values[m], target_values[n])
        ks, pvalue = float(result.statistic), float(result.pvalue)
        wasserstein = float(stats.wasserstein_distance(target_values[m], target_values[n]))
    return Split(m, n, ctx, _tvd(labels[m], labels[n], n_classes), ks, pvalue, wasserstein)


def _distance(split: Split) -> float:
    """The statistic the check is about: KS for regression, TVD for classification."""
    return split.tvd if split.ks is None else split.ks


def _split_passes(split: Split, task: TaskKind, settings: PrepSettings) -> bool:
    if task is TaskKind.REGRESSION:
        assert split.ks is not None
        return split.ks < settings.ks_max
    return split.tvd < settings.tvd_max


def _tvd(a: np.ndarray, b: np.ndarray, n_classes: int) -> float:
    pa = np.bincount(a, minlength=n_classes) / max(len(a), 1)
    pb = np.bincount(b, minlength=n_classes) / max(len(b), 1)
    return float(0.5 * np.abs(pa - pb).sum())


# --------------------------------------------------------------------------------------------------
# The labels as scored
# --------------------------------------------------------------------------------------------------


def _scored_labels(labels: np.ndarray, target_values: np.ndarray | None, split: Split, label_mode: LabelMode,
                   design: LabelDesign, draw_seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The labels every row is trained and probed with, given one draw of the split.

    ``shuffled_members``: the members' labels are permuted among the members. Under the matched design the
    non-members' labels are permuted among the non-members, and the labels of the rows no part of the split
    uses (the null splits' pool) among those rows, each by an independent stream of ``draw_seed``: a
    uniform random permutation within each group, so before training the two groups are exchangeable, labels
    as scored included, and each keeps its label counts (the TVD / KS check still holds). C' keeps its true
    labels in both designs, unless it is part of the member pool (multi_random), where it is permuted with
    the members. Other modes: the labels unchanged (``shuffled_all`` permuted the whole table
    before the split)."""
    scored = labels.copy()
    values_out = None if target_values is None else target_values.copy()
    if label_mode is not LabelMode.SHUFFLED_MEMBERS:
        return scored, values_out
    groups = [(split.members, STREAM_SHUFFLE_MEMBERS)]
    if design is LabelDesign.MATCHED:
        used = np.zeros(len(labels), dtype=bool)
        used[split.members] = used[split.nonmembers] = used[split.context] = True
        groups += [(split.nonmembers, STREAM_SHUFFLE_NONMEMBERS), (np.flatnonzero(~used), STREAM_SHUFFLE_UNUSED)]
    for rows, stream in groups:
        perm = stream_rng(draw_seed, stream).permutation(len(rows))
        scored[rows] = labels[rows[perm]]
        if values_out is not None and target_values is not None:
            values_out[rows] = target_values[rows[perm]]
    return scored, values_out
