"""The white-box attacks on a saved, fitted TabICL or TabPFN classifier file (what
:mod:`probes.attacks.saved_file` saves and loads; its docstring says what each package's file stores):
:func:`cache_match_attack` recomputes, for every candidate row of the attacker's :class:`Pool` and every label,
the first-layer cache entry that row would have produced and matches it against the stored ones;
:func:`reconstruct_context` rebuilds the context rows' features from the file alone and scores them against
imputation without it. Results hold row ids and metrics, never a feature value or a label.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from iclmem.errors import DataError, ProbeError
from iclmem.stats import DEFAULT_RESAMPLES, LowResolutionWarning, auc, bootstrap_intervals, tpr_at_fpr
from probes.attacks.saved_file import MODES, TABICL, TABPFN, SavedFile, checked_table, load_saved, one_torch_thread

# A candidate (row, label) "is" a cached entry when their relative squared distance is below this: a context
# row recomputed lands at ~1e-15 (float32 rounding; TabPFN's bfloat16 cache: 0), any other row measured here
# (breast cancer, iris, wine) at >= 6e-4
MATCH_TOLERANCE = 1e-8
# a reconstructed cell is "recovered" within this many pool standard deviations of the truth
RECONSTRUCTION_TOLERANCE = 0.1
# a reconstruction whose recomputed entries are this close (relative squared distance) to the stored ones has
# converged to the row (measured: 1e-9 and below); above it, a local minimum, and the row starts again
RESIDUAL_CONVERGED = 1e-6
RESTART_ROUNDS = 2  # rounds of random restarts for the rows still unconverged
# L-BFGS iterations of the reconstruction: on breast cancer's 30 columns, 300 left half the rows short of the
# tolerance (20 of 40, median cell error 0.019 std), 900 rebuilt 38 of 40 (0.0017 std) in about the same time
MAX_ITER = 900


# ------------------------------------------------------------------------------------------ the attacker's pool
@dataclass(frozen=True)
class Pool:
    """The attacker's candidate rows, and the truth about them that only scoring reads: ``member`` flags the
    rows claimed to be in the file's context (the positives an AUC ranks), ``context_position`` each row's
    position in the file's context (-1: not in it), ``y`` the rows' labels. For a control file fitted on
    other rows, ``member`` stays the audited split and ``context_position`` is -1 throughout."""

    x: np.ndarray  # float32 [n, F]
    y: np.ndarray  # int64 [n]
    member: np.ndarray  # bool [n]
    context_position: np.ndarray  # int64 [n]
    row_ids: np.ndarray  # int64 [n]

    def __post_init__(self) -> None:
        x, _ = checked_table(self.x, None, "pool")
        n = len(x)
        y = np.asarray(self.y, dtype=np.int64)
        member = np.asarray(self.member, dtype=bool)
        pos = np.asarray(self.context_position, dtype=np.int64)
        ids = np.asarray(self.row_ids, dtype=np.int64)
        if y.shape != (n,) or member.shape != (n,) or pos.shape != (n,) or ids.shape != (n,):
            raise DataError(f"saved-file audit: pool of {n} rows with labels {y.shape}, member flags {member.shape}, "
                            f"context positions {pos.shape}, row ids {ids.shape}: one each per row")
        taken = pos[pos >= 0]
        if len(np.unique(taken)) != len(taken):
            raise DataError("saved-file audit: two pool rows claim the same context position")
        for name, value in (("x", x), ("y", y), ("member", member), ("context_position", pos), ("row_ids", ids)):
            value.flags.writeable = False
            object.__setattr__(self, name, value)

    @classmethod
    def from_audit(cls, inputs: Any, row_ids: Any = None, in_context: bool = True) -> Pool:
        """The population of a context audit (:class:`probes.attacks.context.ContextAuditInputs`) as the pool of
        the file fitted on its members in P's order (``in_context``), or of a file holding none of them."""
        member = np.asarray(inputs.member, dtype=bool)
        pos = np.full(len(member), -1, dtype=np.int64)
        if in_context:
            pos[member] = np.arange(int(member.sum()))
        ids = np.arange(len(member)) if row_ids is None else np.asarray(row_ids)
        return cls(np.asarray(inputs.population_x), np.asarray(inputs.population_y), member, pos, ids)


def _check_pool(saved: SavedFile, pool: Pool) -> None:
    if pool.x.shape[1] != saved.n_features:
        raise DataError(f"saved-file audit: pool rows have {pool.x.shape[1]} features, {saved.path} "
                        f"{saved.n_features}")
    if pool.context_position.max(initial=-1) >= saved.n_context:
        raise DataError(f"saved-file audit: a pool row claims context position {pool.context_position.max()}, "
                        f"the file holds {saved.n_context} rows")


# ------------------------------------------------------------------------------------------ TabICL's cache entries
def _tabicl_cache(est: Any) -> Mapping[str, Any]:
    cache = getattr(est, "model_kv_cache_", None)
    if not cache:
        raise ProbeError("saved-file audit: the TabICL file holds no KV cache (fitted without kv_cache=True?)")
    if getattr(est, "cache_mode_", "kv") not in MODES[TABICL]:
        raise ProbeError(f"saved-file audit: TabICL cache mode {est.cache_mode_!r} is not one of {MODES[TABICL]}")
    return dict(cache)


def _tabicl_reference(cache: Any, mode: str) -> Any:
    """The stored per-row entries of one normalisation method's cache: float [B, N, D] (layer 0's K and V of
    every context row, heads flattened, or the ICL input tokens for ``repr``)."""
    import torch

    if mode == "repr":
        return cache.row_repr.float()
    entry = cache.icl_cache.kv[0]
    return torch.cat([entry.key.transpose(1, 2).flatten(2), entry.value.transpose(1, 2).flatten(2)], dim=-1).float()


def _tabicl_entries(net: Any, xs: Any, ys: Any, cache: Any, mode: str) -> Any:
    """The cache entries rows ``xs`` [B, n, F] (preprocessed, permuted as each member's) with labels ``ys``
    [B, n] (each member's class permutation applied) would have had as context rows: float [B, n, D].

    A context row's path, run through the network's own modules: its cells grouped and embedded, its label
    added (the column embedder is target-aware), the set transformer's second attention against the stored
    column summaries (``col_cache``: its first attention, over the column, is what needs the other rows, and
    it is stored), the row interaction (per row), the ICL label embedding, and layer 0's K/V projection
    (per row). Differentiable in ``xs``."""
    import torch
    import torch.nn.functional as F

    ce = net.col_embedder
    if ce.feature_group:
        grouped = F.pad(ce.feature_grouping(xs), (0, 0, ce.reserve_cls_tokens, 0), value=-100.0)
        features = grouped.transpose(1, 2)  # (B, G+C, n, group)
    else:
        features = F.pad(xs, (ce.reserve_cls_tokens, 0), value=-100.0).transpose(1, 2).unsqueeze(-1)
    src = ce.in_linear(features)
    if ce.target_aware:
        src = src + ce.y_encoder(ys[:, None, :].expand(-1, features.shape[1], -1).float())
    src = ce.tf_col.forward_with_cache(src, col_cache=cache.col_cache, use_cache=True, store_cache=False)
    if ce.affine:
        src = features * ce.ln_w(ce.out_w(src)) + ce.ln_b(ce.out_b(src))
    rows = net.row_interactor._train_forward(src.transpose(1, 2))  # (B, n, D): the training path, per row
    tokens = rows + net.icl_predictor.y_encoder(ys.float())
    if mode == "repr":
        return tokens
    encoder = net.icl_predictor.tf_icl
    _, k, v = encoder.blocks[0](q=tokens, train_size=tokens.shape[1], rope=encoder.rope, need_kv=True)
    return torch.cat([k.transpose(1, 2).flatten(2), v.transpose(1, 2).flatten(2)], dim=-1)


def _tabicl_distances(est: Any, mode: str, pool_x: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Squared distances [n_pool, C, N] between each candidate (row, label)'s recomputed entries and each
    stored entry, summed over every ensemble member, and the stored entries' squared norms [N]."""
    import torch

    caches = _tabicl_cache(est)
    eg = est.ensemble_generator_
    views = eg.transform(est.X_encoder_.transform(pool_x), mode="test")
    n_ctx = int(est.n_samples_in_)
    dist = np.zeros((len(pool_x), n_classes, n_ctx))
    norms = np.zeros(n_ctx)
    with torch.no_grad():
        for method, (xs,) in views.items():
            cache = caches[method]
            ref = _tabicl_reference(cache, mode).double()  # (B, N, D)
            norms += (ref**2).sum(dim=(0, 2)).numpy()
            shuffles = np.asarray(eg.class_shuffles_[method])  # (B, C): member b's label for class c
            x_t = torch.as_tensor(xs, dtype=torch.float32)
            for c in range(n_classes):
                ys = torch.as_tensor(np.repeat(shuffles[:, c:c + 1], len(pool_x), axis=1), dtype=torch.float32)
                cand = _tabicl_entries(est.model_, x_t, ys, cache, mode).double()
                dist[:, c, :] += (torch.cdist(cand, ref) ** 2).sum(dim=0).numpy()
    return dist, norms


# ------------------------------------------------------------------------------------------ TabPFN's stored rows
def _tabpfn_members(est: Any) -> list[Any]:
    return list(est.executor_.ensemble_members)


def _class_permutation(member: Any, n_classes: int) -> np.ndarray:
    perm = getattr(member.config, "class_permutation", None)
    return np.arange(n_classes) if perm is None else np.asarray(perm, dtype=np.int64)


def _tabpfn_row_distances(est: Any, pool_x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fit_preprocessors: squared distances [n_pool, N] between each candidate preprocessed by each member's
    stored pipeline and that member's stored preprocessed context row, summed over members; row norms [N]."""
    dist: np.ndarray | None = None
    norms: np.ndarray | None = None
    for m in _tabpfn_members(est):
        if m.X_train is None:
            raise ProbeError("saved-file audit: the TabPFN file stores no preprocessed context (fit_with_cache)")
        stored = np.asarray(m.X_train, dtype=np.float64)
        cand = np.asarray(m.transform_X_test(pool_x), dtype=np.float64)
        d = ((cand[:, None, :] - stored[None]) ** 2).sum(axis=-1)
        dist = d if dist is None else dist + d
        norms = (stored**2).sum(axis=1) + (0.0 if norms is None else norms)
    assert dist is not None
    assert norms is not None
    return dist, norms


def _tabpfn_cache_distances(est: Any, pool_x: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """fit_with_cache: squared distances [n_pool, C, N] between each candidate (row, label)'s recomputed layer-0
    K/V and the stored ones, summed over the members, and the stored entries' squared norms [N].

    A context row's layer-0 entry, through the network's own functions: its cells through the member's stored
    CPU and GPU preprocessing and the stored column statistics (``feature_cache``), its label embedded, the
    attention between the row's own cells, and the K/V projection of the attention between rows. Run under
    the autocast the cache was built with (bfloat16 on CPU), it matches the stored entry bit for bit."""
    import torch
    from tabpfn.utils import get_autocast_context

    ex = est.executor_
    members = _tabpfn_members(est)
    n_ctx = int(est.n_train_samples_)
    n = len(pool_x)
    dist = np.zeros((n, n_classes, n_ctx))
    norms = np.zeros(n_ctx)
    for group, cache in zip(ex.cache_groups, ex.kv_caches, strict=True):
        net = est.models_[members[group[0]].config._model_index]
        if type(net).__name__ != "TabPFNV2":
            raise ProbeError(f"saved-file audit: recomputing TabPFN cache entries is implemented for the TabPFN v2 "
                             f"architecture (tabpfn-mini's), not {type(net).__name__}")
        xs, ys = [], []
        for i in group:
            m = members[i]
            x = torch.as_tensor(m.transform_X_test(pool_x), dtype=torch.float32).unsqueeze(1)
            if m.gpu_preprocessor is not None:
                x = m.gpu_preprocessor(x, feature_schema=m.feature_schema, num_train_rows=None,
                                       use_fitted_cache=True).x
            perm = _class_permutation(m, n_classes)
            xs.append(x.repeat(n_classes, 1, 1))  # rows label-major: (C * n, 1, F)
            ys.append(torch.as_tensor(np.repeat(perm, n), dtype=torch.float32)[:, None])
        x_all, y_all = torch.cat(xs, dim=1), torch.cat(ys, dim=1)
        if len(group) == 1:
            y_all = y_all[:, 0]
        with get_autocast_context(torch.device("cpu"), enabled=bool(est.use_autocast_)), torch.inference_mode():
            x_rsf, n_groups, n_rows, batch = net._pad_and_group_features(x_all)
            emb_x, _ = net._embed_features(x_rsf, num_train_labels=n_rows, num_feature_groups=n_groups,
                                           batch_size=batch, feature_cache=cache.feature_cache)
            emb_y, _, _ = net._embed_targets(y_all, num_rows=n_rows, num_train_labels=n_rows, batch_size=batch)
            _, kv = net.blocks[0]([torch.cat((emb_x, emb_y[:, :, None]), dim=2)], n_rows, None, return_kv=True)
        cand = torch.cat([kv.key, kv.value], dim=-1).double().transpose(0, 1).flatten(1)  # (C*n, cols*D)
        stored = cache.kv[0]
        ref = torch.cat([stored.key, stored.value], dim=-1).double().transpose(0, 1).flatten(1)  # (N, cols*D)
        d = (torch.cdist(cand, ref) ** 2).numpy().reshape(n_classes, n, n_ctx)
        dist += d.transpose(1, 0, 2)
        norms += (ref**2).sum(dim=1).numpy()
    return dist, norms


# ------------------------------------------------------------------------------------------ (c) cache matching
@dataclass(frozen=True)
class CacheAttackResult:
    """The white-box matching attack on one saved file: each candidate row's (and label's) recomputed entry
    against every stored one. Per pool row the score is -log10 of its smallest relative squared distance
    (higher = member), matched when below :data:`MATCH_TOLERANCE`; rates over the pool's ``member`` rows and
    the others; the AUC of the score over ``member`` with its stratified bootstrap interval; for the rows
    truly in the context (``context_position`` >= 0): the share matched at their own position, and with
    their own label (a row not matched counts as a miss)."""

    model: str
    mode: str
    matched_on: str  # what was recomputed and compared
    n_pool: int
    n_members: int
    n_in_context: int
    member_matched: float  # share of ``member`` rows matched to some entry
    nonmember_matched: float
    position_accuracy: float  # rows in the context matched at their own position (nan: none in the pool)
    label_accuracy: float  # rows in the context matched, with their own label recovered
    auc: float
    auc_low: float
    auc_high: float
    tpr_at_1pct: float
    member_distance_max: float  # largest smallest-relative-distance of a row in the context
    other_distance_min: float  # smallest relative distance of a row not in the context
    row_ids: tuple[int, ...]
    scores: tuple[float, ...]  # aligned with row_ids
    seconds: float


def cache_match_attack(saved: SavedFile, pool: Pool, *, n_resamples: int = DEFAULT_RESAMPLES,
                       seed: int = 0) -> CacheAttackResult:
    """Which pool rows the saved file holds, where, and with which label, from the file and the public
    weights alone (:func:`load_saved`); the pool's truth is read only to score it (see :class:`Pool`)."""
    _check_pool(saved, pool)
    start = time.perf_counter()
    with one_torch_thread():
        est = load_saved(saved)
        classes = np.asarray(est.classes_)
        n_classes = len(classes)
        if saved.model == TABICL:
            dist, norms = _tabicl_distances(est, saved.mode, pool.x, n_classes)
            matched_on = (("ICL layer-0 K/V" if saved.mode == "kv" else "ICL input tokens")
                          + " of every (row, label), all ensemble members")
        elif saved.mode == "fit_with_cache":
            dist, norms = _tabpfn_cache_distances(est, pool.x, n_classes)
            matched_on = "layer-0 between-rows K/V of every (row, label), all ensemble members, under autocast"
        else:
            row_dist, norms = _tabpfn_row_distances(est, pool.x)
            dist = row_dist[:, None, :]
            matched_on = "stored preprocessed rows against each candidate through the stored pipelines"
    rel = dist / np.maximum(norms, 1e-300)[None, None, :]
    flat = rel.reshape(len(pool.x), -1)
    best = flat.min(axis=1)
    arg = flat.argmin(axis=1)
    n_ctx = rel.shape[2]
    label_idx, position = arg // n_ctx, arg % n_ctx
    if saved.model == TABPFN and saved.mode == "fit_preprocessors":
        # the label is not part of the match: it is read from the stored labels at the matched position
        first = _tabpfn_members(est)[0]
        label_idx = np.argsort(_class_permutation(first, n_classes))[np.asarray(first.y_train, dtype=np.int64)][position]
    recovered = classes[label_idx]
    matched = best < MATCH_TOLERANCE
    scores = -np.log10(np.maximum(best, 1e-300))
    inside = pool.context_position >= 0
    hit_position = matched & (position == pool.context_position)
    member, nonmember = scores[pool.member], scores[~pool.member]
    if len(member) and len(nonmember):
        area = auc(member, nonmember)
        interval = bootstrap_intervals(member, nonmember, n_resamples=n_resamples, seed=seed).auc
        with warnings.catch_warnings():  # 1% of a few dozen non-members allows no false positive: coarse, known
            warnings.simplefilter("ignore", LowResolutionWarning)
            tpr = tpr_at_fpr(member, nonmember, 0.01).tpr
        low, high = interval.low, interval.high
    else:
        area = low = high = tpr = float("nan")

    def share(mask: np.ndarray, of: np.ndarray) -> float:
        return float(mask[of].mean()) if of.any() else float("nan")

    return CacheAttackResult(
        model=saved.model, mode=saved.mode, matched_on=matched_on, n_pool=len(pool.x),
        n_members=int(pool.member.sum()), n_in_context=int(inside.sum()),
        member_matched=share(matched, pool.member), nonmember_matched=share(matched, ~pool.member),
        position_accuracy=share(hit_position, inside),
        label_accuracy=share(hit_position & (recovered == pool.y), inside),
        auc=area, auc_low=low, auc_high=high, tpr_at_1pct=tpr,
        member_distance_max=float(best[inside].max()) if inside.any() else float("nan"),
        other_distance_min=float(best[~inside].min()) if (~inside).any() else float("nan"),
        row_ids=tuple(int(i) for i in pool.row_ids), scores=tuple(float(s) for s in scores),
        seconds=time.perf_counter() - start)


# ------------------------------------------------------------------------------------------ (c) reconstruction
@dataclass(frozen=True)
class ErrorSummary:
    """Errors of guessed context cells against the true ones, per cell of the table's columns, in each column's
    standard deviation (``column_std`` of :func:`reconstruct_context`; a column encoded as several features, such
    as a one-hot category, counts as one cell, its error the largest of its features'): the median cell error,
    the root mean square, the share of cells within :data:`RECONSTRUCTION_TOLERANCE`, and the rows with every
    cell within it (``rows_rebuilt`` of ``n_rows``; ``rows_within`` their share)."""

    median_abs: float  # the median cell error, in column standard deviations
    rmse: float
    cells_within: float
    rows_within: float
    rows_rebuilt: int = 0
    n_rows: int = 0


def _errors(guess: np.ndarray, truth: np.ndarray, scale: np.ndarray, groups: np.ndarray) -> ErrorSummary:
    """``groups[j]``: the table column feature j encodes (features of one column share a group)."""
    e_features = np.abs(guess - truth) / scale
    e = np.stack([e_features[:, groups == g].max(axis=1) for g in np.unique(groups)], axis=1)
    within = e <= RECONSTRUCTION_TOLERANCE
    rows = np.asarray(within.all(axis=1))
    return ErrorSummary(float(np.median(e)), float(np.sqrt((e**2).mean())), float(within.mean()),
                        float(rows.mean()), int(rows.sum()), len(rows))


@dataclass(frozen=True)
class ReconstructionResult:
    """Every context row's features guessed from the file (``method``), against three guesses without the file
    from the attacker's sample of the table (``n_sample`` pool rows, none of them a target unless
    ``sample_holds_targets``): its mean, its mean over the row's true class (a baseline given the label), and
    its row nearest the truth (an oracle: the best any lookup in that sample could do). ``label_accuracy``: the
    labels the file gives back without the pool. Scored on the context rows the pool holds (``n_scored`` of
    ``n_context``), per cell of ``n_columns`` columns (``unit``: "column", the table's own columns, encoded as
    ``n_features`` features; "component": whitened PCA components, each its own cell)."""

    model: str
    mode: str
    method: str
    n_context: int
    n_scored: int
    n_features: int
    label_accuracy: float
    reconstruction: ErrorSummary
    pool_mean: ErrorSummary
    class_mean: ErrorSummary
    nearest_other_row: ErrorSummary
    fit_residual_median: float  # the attack's own residual (relative squared distance), median over rows
    seconds: float
    n_columns: int = 0
    unit: str = "column"
    n_sample: int = 0
    sample_holds_targets: bool = False

    @property
    def best_imputation(self) -> ErrorSummary:
        """The guess without the file that rebuilds the most rows (ties: the lowest median cell error)."""
        return max((self.pool_mean, self.class_mean, self.nearest_other_row),
                   key=lambda e: (e.rows_rebuilt, -e.median_abs))


def _tabicl_none_preprocessing(est: Any) -> Callable[[Any], Any]:
    """The file's "none" normalisation (unique filter, scaler with clipping, soft outlier clipping; the imputer
    is the identity on complete rows) as a differentiable torch function of raw rows [n, F] (float64); the
    caller checks it against the package's own transform."""
    import torch

    eg = est.ensemble_generator_
    pp = eg.preprocessors_.get("none")
    if pp is None or pp.normalizer_ is not None:
        raise ProbeError("saved-file audit: reconstruction inverts the ensemble members without normalisation "
                         f"('none'); this file has {sorted(eg.preprocessors_)}")
    keep = torch.as_tensor(np.asarray(eg.unique_filter_.features_to_keep_))
    ss, clip = pp.standard_scaler_, pp.outlier_remover_
    mean, scale = torch.as_tensor(ss.mean_), torch.as_tensor(ss.scale_)
    lower, upper = torch.as_tensor(clip.lower_bounds_), torch.as_tensor(clip.upper_bounds_)

    def transform(x: Any) -> Any:
        z = ((x[:, keep] - mean) / scale).clamp(ss.clip_min, ss.clip_max)
        z = torch.maximum(-torch.log1p(z.abs()) + lower, z)
        return torch.minimum(torch.log1p(z.abs()) + upper, z)

    return transform


def _reconstruct_tabicl(est: Any, mode: str, sample_x: np.ndarray, n_classes: int, max_iter: int, restarts: int,
                        seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """L-BFGS on every context row's raw features, for each label, so that its recomputed entries in the
    "none" members match the stored ones; the label with the lowest residual wins. A row left with a residual
    above :data:`RESIDUAL_CONVERGED` (a local minimum) starts again from ``restarts`` random points of the
    sample's per-feature normal at once (never from a sample row), for up to :data:`RESTART_ROUNDS` rounds.
    The first start is the sample's mean; the sample's std scales the search; a column the unique filter
    dropped is its stored (constant) mean. ``sample_x``: the attacker's rows of the table, none of them a
    target (:func:`reconstruct_context`). Returns the guesses [N, F], the label indices [N] and the
    residuals [N]."""
    import torch

    transform = _tabicl_none_preprocessing(est)
    eg = est.ensemble_generator_
    check = transform(torch.as_tensor(np.array(sample_x), dtype=torch.float64)).numpy()
    package = eg.preprocessors_["none"].transform(eg.unique_filter_.transform(est.X_encoder_.transform(sample_x)))
    if np.abs(check - package).max() > 1e-4:
        raise ProbeError("saved-file audit: this TabICL's 'none' preprocessing is not the one reconstruction "
                         f"inverts (differs by {np.abs(check - package).max():.2g}); a package update?")
    cache = _tabicl_cache(est)["none"]
    shuffles = np.asarray(eg.class_shuffles_["none"])  # (B, C)
    feature_shuffles = [list(s) for s in eg.feature_shuffles_["none"]]
    n_ctx = int(est.n_samples_in_)
    ref = _tabicl_reference(cache, mode).detach()  # (B, N, D)
    mu = torch.as_tensor(sample_x.mean(axis=0), dtype=torch.float64)
    sd = torch.as_tensor(sample_x.std(axis=0) + 1e-9, dtype=torch.float64)
    stats = getattr(getattr(est.X_encoder_, "tfm_", None), "statistics_", None)
    dropped = ~np.asarray(eg.unique_filter_.features_to_keep_)
    if stats is not None and dropped.any():
        mu[torch.as_tensor(dropped)] = torch.as_tensor(np.asarray(stats, dtype=np.float64)[dropped])

    def solve(u0: np.ndarray, entries: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(guesses, residuals) of candidates: stored entry ``entries[r]`` with label ``labels[r]``, from u0."""
        u = torch.tensor(u0, dtype=torch.float64, requires_grad=True)
        target = ref[:, torch.as_tensor(entries)]  # (B, k, D)
        norm = (target**2).sum(dim=(0, 2))
        ys = torch.as_tensor(shuffles[:, labels], dtype=torch.float32)  # (B, k)
        opt = torch.optim.LBFGS([u], lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe",
                                tolerance_grad=1e-12, tolerance_change=1e-15)

        def residuals() -> Any:
            z = transform(mu + sd * u).float()
            views = torch.stack([z[:, s] for s in feature_shuffles])  # (B, k, F')
            return ((_tabicl_entries(est.model_, views, ys, cache, mode) - target) ** 2).sum(dim=(0, 2)) / norm

        def closure() -> Any:
            opt.zero_grad()
            loss = residuals().sum()
            loss.backward()
            return loss

        opt.step(closure)  # type: ignore[no-untyped-call]  # torch leaves LBFGS.step unannotated
        with torch.no_grad():
            return (mu + sd * u).numpy(), residuals().numpy().astype(np.float64)

    n_features = sample_x.shape[1]
    entries = np.tile(np.arange(n_ctx), n_classes)
    labels = np.repeat(np.arange(n_classes), n_ctx)
    guesses, res = solve(np.zeros((len(entries), n_features)), entries, labels)
    res = res.reshape(n_classes, n_ctx)
    label_idx = res.argmin(axis=0)
    best = guesses.reshape(n_classes, n_ctx, -1)[label_idx, np.arange(n_ctx)]
    best_res = res[label_idx, np.arange(n_ctx)]
    rng = np.random.default_rng(seed)
    for _ in range(RESTART_ROUNDS):
        again = np.flatnonzero(best_res > RESIDUAL_CONVERGED)
        if not len(again) or restarts < 1:
            break
        # ``restarts`` random starts for each of these rows, and every label again (a wrong label may have won only
        # because the right one was stuck), solved as one batch
        rows = np.tile(again, restarts * n_classes)
        labs = np.repeat(np.arange(n_classes), restarts * len(again))
        g, r = solve(rng.normal(size=(len(rows), n_features)), rows, labs)
        for row in again:
            mine = np.flatnonzero(rows == row)
            top = mine[np.argmin(r[mine])]
            if r[top] < best_res[row]:
                best[row], best_res[row], label_idx[row] = g[top], r[top], labs[top]
    return best, label_idx, best_res


def _read_tabpfn_rows(est: Any, sample_x: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fit_preprocessors: the raw rows read out of the stored preprocessed context. Which stored column
    passes which raw feature through unchanged is found the attacker's way: sample rows through the stored
    pipeline, an output column equal to an input column on every sample row. A feature no member passes
    through is left at the sample mean. Labels: the stored labels, the class permutation undone."""
    n_ctx = int(est.n_train_samples_)
    guess = np.tile(sample_x.mean(axis=0).astype(np.float64), (n_ctx, 1))
    found = np.zeros(sample_x.shape[1], dtype=bool)
    probe = sample_x.astype(np.float64)
    for m in _tabpfn_members(est):
        out = np.asarray(m.transform_X_test(sample_x), dtype=np.float64)
        stored = np.asarray(m.X_train, dtype=np.float64)
        for j in np.flatnonzero(~found):
            same = np.flatnonzero((out == probe[:, j:j + 1]).all(axis=0))
            if len(same) and np.ptp(probe[:, j]) > 0:
                guess[:, j], found[j] = stored[:, same[0]], True
    first = _tabpfn_members(est)[0]
    labels = np.argsort(_class_permutation(first, n_classes))[np.asarray(first.y_train, dtype=np.int64)]
    residual = np.where(found.all(), 0.0, np.nan) * np.ones(n_ctx)
    return guess, labels, residual


def _column_groups(columns: Any, n_features: int) -> tuple[np.ndarray, str]:
    """Which table column each feature encodes (one group per column), and the unit of a cell: "column" (the
    table's columns, a one-hot category one cell) or "component" (PCA components: a source of None)."""
    if columns is None:
        return np.arange(n_features), "column"
    sources = list(columns)
    if len(sources) != n_features:
        raise DataError(f"saved-file audit: {len(sources)} column sources for {n_features} features")
    if any(src is None for src in sources):
        return np.arange(n_features), "component"
    names = {name: i for i, name in enumerate(dict.fromkeys(sources))}
    return np.asarray([names[src] for src in sources]), "column"


def reconstruct_context(saved: SavedFile, pool: Pool, *, sample: Any = None, column_std: Any = None,
                        columns: Any = None, max_iter: int = MAX_ITER, restarts: int = 8,
                        seed: int = 0) -> ReconstructionResult:
    """Every row of the saved context rebuilt from the file (TabICL: :func:`_reconstruct_tabicl`, ``max_iter``
    L-BFGS iterations; TabPFN fit_preprocessors: read out), scored on the context rows the pool holds against
    the guesses without the file of :class:`ReconstructionResult`.

    ``sample`` (bool mask over the pool): the attacker's own rows of the table, the only rows the attack and the
    guesses read -- their mean and std (TabICL: start and scale of the search), their pipeline outputs
    (TabPFN: which stored columns pass a raw feature through), their class means and nearest rows (the
    guesses). Default: the pool rows outside the context (the audit's non-members), so no statistic the attack
    uses includes a target; a mask holding context rows is allowed (to measure what that changes) and said in
    ``sample_holds_targets``. ``column_std`` [F]: the unit of a cell's error (default: the pool's std; the
    audit passes the column's std over the whole prepared table); scoring only. ``columns`` [F]: the table
    column each feature encodes (``FeatureColumn.source``; None for a PCA component), so that the error is
    per cell of the table's columns; default: each feature its own column."""
    _check_pool(saved, pool)
    if saved.model == TABPFN and saved.mode == "fit_with_cache":
        raise ProbeError("saved-file audit: feature reconstruction from a TabPFN fit_with_cache file is not "
                         "implemented (its cache is bfloat16 under autocast and its CPU preprocessing is not "
                         "differentiable); its labels are stored in plain and cache_match_attack finds its rows")
    inside = np.flatnonzero(pool.context_position >= 0)
    if not len(inside):
        raise ProbeError("saved-file audit: no pool row is in the saved context, so there is nothing to score a "
                         "reconstruction against")
    mask = pool.context_position < 0 if sample is None else np.asarray(sample, dtype=bool)
    if mask.shape != (len(pool.x),) or mask.sum() < 2:
        raise DataError(f"saved-file audit: the attacker's sample is a mask over the pool's {len(pool.x)} rows "
                        f"with at least 2 rows, got {mask.shape} with {int(mask.sum())}")
    groups, unit = _column_groups(columns, pool.x.shape[1])
    sample_x, sample_y = pool.x[mask], pool.y[mask]
    start = time.perf_counter()
    with one_torch_thread():
        est = load_saved(saved)
        classes = np.asarray(est.classes_)
        if saved.model == TABICL:
            guess, label_idx, residual = _reconstruct_tabicl(est, saved.mode, sample_x, len(classes), max_iter,
                                                             restarts, seed)
            method = (f"L-BFGS ({max_iter} iterations; unconverged rows restarted from {restarts} random points, "
                      f"{RESTART_ROUNDS} rounds) on the raw "
                      "features, every label tried, matching the recomputed entries of the 'none' ensemble "
                      "members to the stored ones")
        else:
            guess, label_idx, residual = _read_tabpfn_rows(est, sample_x, len(classes))
            method = "raw features read from the stored preprocessed context's pass-through columns"
    positions = pool.context_position[inside]
    truth = pool.x[inside].astype(np.float64)
    got = guess[positions]
    scale = (pool.x.std(axis=0) if column_std is None else np.asarray(column_std)).astype(np.float64) + 1e-9
    if scale.shape != (pool.x.shape[1],):
        raise DataError(f"saved-file audit: column_std {scale.shape} for {pool.x.shape[1]} features")
    mean = np.tile(sample_x.mean(axis=0), (len(inside), 1))
    overall = sample_x.mean(axis=0)
    class_means = {c: sample_x[sample_y == c].mean(axis=0) if (sample_y == c).any() else overall
                   for c in np.unique(pool.y)}
    by_class = np.stack([class_means[c] for c in pool.y[inside]])
    others = sample_x.astype(np.float64)
    d = ((truth[:, None, :] - others[None]) ** 2 / scale**2).sum(axis=-1)
    sample_index = np.flatnonzero(mask)
    d[sample_index[None, :] == inside[:, None]] = np.inf  # never the row itself, should the sample hold it
    nearest = others[d.argmin(axis=1)]

    def score(g: np.ndarray) -> ErrorSummary:
        return _errors(g, truth, scale, groups)

    return ReconstructionResult(
        model=saved.model, mode=saved.mode, method=method, n_context=saved.n_context, n_scored=len(inside),
        n_features=pool.x.shape[1], label_accuracy=float((classes[label_idx[positions]] == pool.y[inside]).mean()),
        reconstruction=score(got), pool_mean=score(mean), class_mean=score(by_class),
        nearest_other_row=score(nearest), fit_residual_median=float(np.median(residual)),
        seconds=time.perf_counter() - start, n_columns=len(np.unique(groups)), unit=unit,
        n_sample=int(mask.sum()), sample_holds_targets=bool((mask & (pool.context_position >= 0)).any()))


__all__ = ["CacheAttackResult", "ErrorSummary", "MATCH_TOLERANCE", "MAX_ITER", "Pool", "RECONSTRUCTION_TOLERANCE", "RESIDUAL_CONVERGED",
           "RESTART_ROUNDS", "ReconstructionResult", "cache_match_attack", "reconstruct_context"]
