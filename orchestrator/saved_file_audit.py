"""What a saved, fitted TabICL or TabPFN classifier file holds of its context, and what an attacker gets from it.

TabICL's documentation says a fitted estimator saved with ``save(path, save_training_data=False,
save_kv_cache=True)`` "is useful for data privacy since the KV cache encodes the training context and enables
prediction without raw data". This module tests that claim on the shipped minis
(:mod:`trainables.models.deployed`), and does the same for TabPFN's saved fit state. Findings (tabicl 2.2.0,
tabpfn 9.2.0, read from their code and measured by the functions below on Stage I's breast-cancer split: N = 40
context rows, F = 16 prepared features, C = 2 classes; the packages' defaults, 8 ensemble members):

**TabICL** (``TabICLClassifier(kv_cache=True)``, ``save(..., save_training_data=False)``: one pickle, 0.999 MB
here; tabicl-mini's weights are not in it). ``__getstate__`` drops the network (reloaded on load from
``model_path``: the public checkpoint), and ``save_training_data=False`` sets ``ensemble_generator_.X_``,
``.y_`` and every ``preprocessors_[m].X_transformed_`` to None. No context row or column (float32 or float64,
row- or column-major) and no label vector (any relabelling, five dtypes) is left in the file's bytes; one of
the 640 cells' float32 bytes occurs, by coincidence, inside a layer-1 key tensor (:class:`ByteScan`). Loaded
back it predicts exactly as the fitted classifier (largest probability difference 0.0). What it keeps:

* ``model_kv_cache_``: one ``TabICLCache`` per normalisation method (``"none"``, ``"power"``), each holding
  that method's B = 4 members (each its own feature and class permutation), ``train_shape`` (4, 40, 16):

  - ``col_cache.kv[0]`` key and value, float32 [4, 20, 2, 16, 8] (20 = 16 feature groups + 4 CLS slots,
    2 heads, 16 inducing points, head size 8): the column embedder's set-transformer summary of each
    column, target-aware (the labels are added to the cells before the inducing points attend to them). Not
    per row, but all that a context row's column embedding needs beside the row itself and its label.
  - ``icl_cache.kv[l]``, l = 0..3, key and value float32 [4, 4, 40, 16] (4 heads of 16): the K/V of every
    context row, in context order. Layer 0's are ``W · LN(R(x) + E(y))``, a function of the row's features
    and label alone (R, the row representation, is per row given the column summaries; E the label
    embedding). Layers >= 1 mix the rows.
  - (``kv_cache="repr"`` instead: ``row_repr`` float32 [4, 40, 64], the ICL input tokens R(x) + E(y).)

* the fitted preprocessing: per method ``standard_scaler_`` (column means and stds), the power transform's
  lambdas and inner scaler, ``X_min_``/``X_max_`` [1, 16] (each column's minimum and maximum, scaled: with
  the stored mean and std all 32 raw extremes come back within 1e-6, :attr:`ByteScan.extremes_recovered`),
  the outlier clipper's means, stds and bounds; ``X_encoder_``'s column means; the unique filter's mask; the
  feature and class permutations; ``classes_``; ``n_samples_in_``.

So the file is not free of its rows: layer 0's entry of context row i is a deterministic function of
(x_i, y_i) anyone with the file and the public weights can evaluate. :func:`cache_match_attack` recomputes
it for every candidate row and every label and finds each context row the attacker's pool holds: 40 of 40
members at their own position with their own label, 0 of 40 non-members (relative squared distance <= 1.4e-15
for members, >= 3.8e-3 for any other row; AUC 1.0); a file of other rows matches nothing. Inverting it by
L-BFGS on x (:func:`reconstruct_context`, pool-free: the pool gives only a scale and a start) gives every
label back (40/40) and the features of 39 of 40 rows within 0.1 pool std in every cell (99.8% of cells,
median error 1.5e-4 std), where the pool mean, the class mean and even the nearest other pool row chosen
with the truth get 9-14% of cells and no row (iris and wine: 100% of rows). Where it stops: it recomputes
layer 0 only (layers >= 1 need the other rows; not needed); a column the unique filter dropped is not in the
cache (its constant is the stored column mean, used as such); a cell the network barely distinguishes (here
one outlier, a column's maximum, which the stored ``X_max_`` gives back anyway) stays off; a table much wider than the row representation (64 numbers in
tabicl-mini) cannot be pinned down; a few rows start in local minima (random restarts, never from a pool
row). The loss attack through the loaded file (:func:`membership_through_file`, 8 refitted references) also
finds membership: loss AUC 0.78 [0.68, 0.88], RMIA 0.90 [0.81, 0.96], every attack's verdict memorization;
the control file no_signal. **The privacy claim does not hold**: without its raw data the file still
identifies, labels and reconstructs its rows.

**TabPFN** (``save_fit_state``: a ``.tabpfn_fit`` zip of ``init_params.json``, ``fitted_attrs.joblib``,
``executor_state.joblib``; the weights are left out and reloaded from the checkpoint).

* ``fit_mode="fit_preprocessors"`` (the default; 38.5 kB here): ``executor_.ensemble_members[k].X_train``
  float64 [40, 38] (members 0-3) or [40, 17] (4-7) is the preprocessed context in context order, and with
  ``append_original`` every raw feature is one of its columns, unchanged (all 16 raw columns and all 640
  cells are in the bytes as float64); ``.y_train`` int64 [40] is the labels in context order under the
  member's class permutation (the label vector is in the bytes). The quantile transformers' ``quantiles_``
  [4, 16] hold raw values too. :func:`reconstruct_context` reads the rows out of the pass-through columns
  (error 0, 40/40 rows and labels); :func:`cache_match_attack` compares the stored rows with each candidate
  preprocessed by the stored pipeline (40/40 members, 0 non-members).
* ``fit_mode="fit_with_cache"`` (1.0 MB): ``X_train`` is set to None, but ``y_train`` [40] stays, in context
  order; ``kv_caches[g]`` (one ``TabPFNV2Cache`` per member here) holds ``kv[l]``, l = 0..3, key and value
  bfloat16 (autocast on CPU) [20, 40, 1, 16] (19 feature groups and the target column, the first
  multi-query head only), ``feature_cache`` (the fitted column statistics, [19, 2]) and the embedded empty
  target [1, 32]; 37 of 640 cells are in the bytes (the ``quantiles_``). Layer 0's entry of a row depends on
  the row and its label only: recomputed under the same autocast it matches bit for bit, and
  :func:`cache_match_attack` finds 40/40 members with position and label, 0 non-members. Feature
  reconstruction through this cache is not implemented (bfloat16 K/V under autocast, and TabPFN's CPU
  preprocessing is numpy, not differentiable): :func:`reconstruct_context` says so.

Loading either file runs pickle: a file from someone else runs their code, so :func:`load_saved` is for files
one wrote (:func:`fit_and_save`). Results hold row ids, shapes and metrics, never a feature value or a label.
Torch runs on one thread inside these functions: the per-row forwards are tiny, and on a shared machine two
threads contend (measured 50-100x slower on two shared cores).
"""

from __future__ import annotations

import hashlib
import itertools
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from iclmem.errors import CheckpointError, DataError, ModelError, ProbeError
from iclmem.stats import DEFAULT_RESAMPLES, LowResolutionWarning, auc, bootstrap_intervals, tpr_at_fpr
from iclmem.vocab import ContextAttack, ContextTarget

TABICL = "tabicl"
TABPFN = "tabpfn-v2"
# what each package's classifier is fitted with before saving: TabICL's KV cache ("kv": K/V of every ICL layer,
# "repr": the ICL input tokens), TabPFN's fit_mode
MODES: Mapping[str, tuple[str, ...]] = {TABICL: ("kv", "repr"), TABPFN: ("fit_preprocessors", "fit_with_cache")}
FILE_NAMES: Mapping[str, str] = {TABICL: "tabicl_fitted.pkl", TABPFN: "tabpfn_fitted.tabpfn_fit"}
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
LABEL_DTYPES = (np.int64, np.int32, np.int8, np.float32, np.float64)
MAX_LABEL_RELABELLINGS = 120  # 5! : the label-vector scan tries every relabelling of up to 5 classes
# attributes rebuilt on load, not read from the file: the public weights and device state
_REBUILT_ON_LOAD = frozenset({"model_", "models_", "model_caches", "inference_config_", "device_", "devices_",
                              "model_path_"})


# ------------------------------------------------------------------------------------------ saving
@dataclass(frozen=True)
class SavedFile:
    """A fitted package classifier saved by :func:`fit_and_save`. ``context_digest`` is the sha256 of the
    context it was fitted on (float32 features, int64 labels), so that an audit can check it is given the
    file of the context it scores; the file itself cannot say."""

    model: str  # TABICL or TABPFN
    mode: str  # one of MODES[model]
    path: str
    n_context: int
    n_features: int
    n_classes: int
    context_digest: str


def context_digest(context_x: np.ndarray, context_y: np.ndarray) -> str:
    """sha256 of a context (features as float32, labels as int64), the key a saved file is filed under."""
    h = hashlib.sha256(np.ascontiguousarray(context_x, dtype=np.float32).tobytes())
    h.update(np.ascontiguousarray(context_y, dtype=np.int64).tobytes())
    return h.hexdigest()


def _checked_model(model: str, mode: str | None) -> str:
    if model not in MODES:
        raise ModelError(f"saved-file audit: model {model!r} has no saved-file format here; one of "
                         f"{', '.join(MODES)}")
    if mode is None:
        return MODES[model][0]
    if mode not in MODES[model]:
        raise ModelError(f"saved-file audit: {model} mode {mode!r}; one of {', '.join(MODES[model])}")
    return mode


def _checked_table(x: Any, y: Any | None, what: str) -> tuple[np.ndarray, np.ndarray | None]:
    xa = np.asarray(x, dtype=np.float32)
    if xa.ndim != 2 or len(xa) < 2 or not np.isfinite(xa).all():
        raise DataError(f"saved-file audit: {what} features {xa.shape} must be a finite [n >= 2, F] table")
    if y is None:
        return xa, None
    ya = np.asarray(y)
    if ya.shape != (len(xa),) or not np.issubdtype(ya.dtype, np.integer):
        raise DataError(f"saved-file audit: {what} labels {ya.shape} {ya.dtype} must be integers, one per row")
    return xa, ya.astype(np.int64)


def _mode_options(model: str, mode: str) -> dict[str, Any]:
    return {"kv_cache": mode} if model == TABICL else {"fit_mode": mode}


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    """Torch on one thread for the block (see the module docstring), the caller's setting restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _fit_and_save(model: str, context_x: Any, context_y: Any, folder: str | Path,
                  mode: str | None) -> tuple[SavedFile, Any]:
    from trainables.models.deployed import package_classifier

    mode = _checked_model(model, mode)
    x, y = _checked_table(context_x, context_y, "context")
    assert y is not None
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    path = out / FILE_NAMES[model]
    est = package_classifier(model, **_mode_options(model, mode))
    try:
        est.fit(x, y)
        if model == TABICL:
            # the configuration TabICL's docs recommend for privacy: the KV cache instead of the training data
            est.save(path, save_model_weights=False, save_training_data=False, save_kv_cache=True)
        else:
            est.save_fit_state(path)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise ModelError(f"saved-file audit: fitting or saving {model} ({mode}) on a context of {x.shape} failed: "
                         f"{exc}") from exc
    saved = SavedFile(model, mode, str(path), len(x), x.shape[1], int(len(np.unique(y))), context_digest(x, y))
    return saved, est


def fit_and_save(model: str, context_x: Any, context_y: Any, folder: str | Path, *,
                 mode: str | None = None) -> SavedFile:
    """Fit the package classifier on the shipped mini (:func:`trainables.models.deployed.package_classifier`)
    on the context and save it to ``folder`` the package's own way: TabICL with its KV cache (``mode`` "kv",
    default, or "repr") and ``save_training_data=False``; TabPFN by ``save_fit_state`` after a fit in
    ``mode`` (its ``fit_mode``: "fit_preprocessors", the default, or "fit_with_cache")."""
    with _one_torch_thread():
        return _fit_and_save(model, context_x, context_y, folder, mode)[0]


def load_saved(saved: SavedFile) -> Any:
    """The classifier in ``saved.path``, loaded by its package's loader on CPU (the weights come from the
    public checkpoint, as the loaders do). A file that is not the saved classifier is a CheckpointError."""
    path = Path(saved.path)
    if not path.is_file():
        raise CheckpointError(f"saved-file audit: no saved {saved.model} file at {path}")
    try:
        if saved.model == TABICL:
            from tabicl import TabICLClassifier

            est = TabICLClassifier.load(path, device="cpu")
        else:
            from tabpfn import TabPFNClassifier

            est = TabPFNClassifier.load_from_fit_state(path, device="cpu")
    except Exception as exc:  # a corrupt pickle or zip can raise almost anything
        raise CheckpointError(f"saved-file audit: {path} does not load as a fitted {saved.model} classifier: "
                              f"{type(exc).__name__}: {exc}") from exc
    n_seen = getattr(est, "n_samples_in_", getattr(est, "n_train_samples_", None))
    if n_seen is not None and int(n_seen) != saved.n_context:
        raise CheckpointError(f"saved-file audit: {path} holds a context of {n_seen} rows, not {saved.n_context}")
    return est


# ------------------------------------------------------------------------------------------ (a) save and reload
@dataclass(frozen=True)
class StoredArray:
    """One array or tensor the loaded file holds (its attribute path, shape, dtype), the public weights left
    out: what the file carries of its context."""

    path: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ByteScan:
    """The context searched for in the file's bytes (each zip member decompressed): whole rows and whole
    columns as contiguous float32 / float64 (what an array stored in row- or column-major order would be),
    single cells, and the label vector in context order (every relabelling of up to 5 classes, in
    :data:`LABEL_DTYPES`). ``cells_in_arrays``: cells found, as float64, among the values of every float array the
    loaded file holds. ``extremes_recovered`` (TabICL only, else None): column minima and maxima given back
    within 1e-6 by the stored scaled ``X_min_``/``X_max_`` and scaler, of 2F."""

    n_rows: int
    n_cells: int
    rows_float32: int
    rows_float64: int
    columns_float32: int
    columns_float64: int
    cells_float32: int
    cells_float64: int
    labels_stored: bool
    cells_in_arrays: int
    extremes_recovered: int | None


@dataclass(frozen=True)
class SaveReloadResult:
    """A fit saved and loaded back: the loaded classifier predicts as the original (``max_abs_prob_diff``
    over the queries' probabilities), the file's members and sizes, what it stores, what of the context its
    bytes hold."""

    saved: SavedFile
    files: tuple[tuple[str, int], ...]  # (name, bytes): the file, and for a zip its members (uncompressed)
    max_abs_prob_diff: float
    n_queries: int
    stored: tuple[StoredArray, ...]
    scan: ByteScan

    def stored_at(self, fragment: str) -> tuple[StoredArray, ...]:
        """The stored arrays whose path contains ``fragment``."""
        return tuple(s for s in self.stored if fragment in s.path)


def _file_blobs(path: Path) -> dict[str, bytes]:
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            return {name: z.read(name) for name in z.namelist()}
    return {path.name: path.read_bytes()}


def _walk_arrays(obj: Any, path: str, seen: set[int], out: list[tuple[str, Any]], depth: int = 0) -> None:
    """Every numpy array and torch tensor reachable from ``obj`` through attributes, dicts, lists and tuples,
    the attributes rebuilt on load and torch modules (the weights) left out."""
    import types

    import torch

    if id(obj) in seen or depth > 16:
        return
    seen.add(id(obj))
    if isinstance(obj, (np.ndarray, torch.Tensor)):
        out.append((path, obj))
    elif isinstance(obj, (torch.nn.Module, type, types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            if k not in _REBUILT_ON_LOAD:
                _walk_arrays(v, f"{path}[{k!r}]", seen, out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk_arrays(v, f"{path}[{i}]", seen, out, depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (str, bytes, Path)):
        for k, v in vars(obj).items():
            if k not in _REBUILT_ON_LOAD:
                _walk_arrays(v, f"{path}.{k}", seen, out, depth + 1)


def _stored_arrays(est: Any) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    _walk_arrays(est, "est", set(), found)
    return found


def _as_numpy(a: Any) -> np.ndarray:
    import torch

    if isinstance(a, torch.Tensor):
        t = a.detach().cpu()
        return np.asarray((t.float() if t.dtype == torch.bfloat16 else t).numpy())
    return np.asarray(a)


def _label_vectors(y: np.ndarray) -> Iterator[np.ndarray]:
    classes = np.unique(y)
    codes = np.searchsorted(classes, y)
    perms = itertools.permutations(range(len(classes)))
    for perm in itertools.islice(perms, MAX_LABEL_RELABELLINGS):
        yield np.asarray(perm)[codes]
    yield y


def _tabicl_extremes(est: Any, x: np.ndarray) -> int:
    """Column minima and maxima of the context recovered from the stored power preprocessor (of 2F)."""
    eg = est.ensemble_generator_
    pp = eg.preprocessors_.get("power") if hasattr(eg, "preprocessors_") else None
    if pp is None or getattr(pp, "X_min_", None) is None:
        return 0
    keep = np.asarray(eg.unique_filter_.features_to_keep_)
    ss = pp.standard_scaler_
    lo = np.asarray(pp.X_min_).ravel() * ss.scale_ + ss.mean_
    hi = np.asarray(pp.X_max_).ravel() * ss.scale_ + ss.mean_
    kept = x[:, keep].astype(np.float64)
    tol = 1e-6 * (1.0 + np.abs(kept).max(axis=0))
    return int((np.abs(lo - kept.min(axis=0)) <= tol).sum() + (np.abs(hi - kept.max(axis=0)) <= tol).sum())


def scan_file(saved: SavedFile, context_x: Any, context_y: Any, loaded: Any | None = None) -> ByteScan:
    """What of the context the saved file's bytes and stored arrays hold (see :class:`ByteScan`)."""
    x, y = _checked_table(context_x, context_y, "context")
    assert y is not None
    if context_digest(x, y) != saved.context_digest:
        raise ProbeError(f"saved-file audit: the context given is not the one {saved.path} was fitted on")
    blobs = list(_file_blobs(Path(saved.path)).values())

    def found(pattern: bytes) -> bool:
        return any(pattern in b for b in blobs)

    def count(arrays: Iterator[np.ndarray]) -> int:
        return sum(found(np.ascontiguousarray(a).tobytes()) for a in arrays)

    x64 = x.astype(np.float64)
    labels = any(found(np.ascontiguousarray(v.astype(dt)).tobytes()) for v in _label_vectors(y) for dt in LABEL_DTYPES)
    est = loaded if loaded is not None else load_saved(saved)
    arrays = [_as_numpy(a) for _, a in _stored_arrays(est)]
    values = [a.astype(np.float64).ravel() for a in arrays if a.dtype.kind == "f"]
    pool = np.unique(np.concatenate(values)) if values else np.zeros(0)
    in_arrays = int(np.isin(x64.ravel(), pool).sum())
    return ByteScan(
        n_rows=len(x), n_cells=x.size,
        rows_float32=count(iter(x)), rows_float64=count(iter(x64)),
        columns_float32=count(iter(x.T)), columns_float64=count(iter(x64.T)),
        cells_float32=count(iter(x.reshape(-1, 1))), cells_float64=count(iter(x64.reshape(-1, 1))),
        labels_stored=labels, cells_in_arrays=in_arrays,
        extremes_recovered=_tabicl_extremes(est, x) if saved.model == TABICL else None)


def save_and_reload(model: str, context_x: Any, context_y: Any, query_x: Any, folder: str | Path, *,
                    mode: str | None = None) -> SaveReloadResult:
    """Fit on the context, save (:func:`fit_and_save`), load back (:func:`load_saved`); compare the two
    classifiers' probabilities on the queries; list what the file stores and scan it for the context."""
    q, _ = _checked_table(query_x, None, "query")
    with _one_torch_thread():
        saved, original = _fit_and_save(model, context_x, context_y, folder, mode)
        loaded = load_saved(saved)
        if q.shape[1] != saved.n_features:
            raise DataError(f"saved-file audit: queries have {q.shape[1]} features, the context {saved.n_features}")
        p0 = np.asarray(original.predict_proba(q), dtype=np.float64)
        p1 = np.asarray(loaded.predict_proba(q), dtype=np.float64)
        stored = tuple(StoredArray(p, tuple(int(s) for s in a.shape), str(a.dtype)) for p, a in _stored_arrays(loaded))
        scan = scan_file(saved, context_x, context_y, loaded)
    path = Path(saved.path)
    files = [(path.name, path.stat().st_size)]
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            files += [(f"{path.name}/{i.filename}", i.file_size) for i in z.infolist()]
    return SaveReloadResult(saved, tuple(files), float(np.abs(p0 - p1).max()), len(q), stored, scan)


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
        x, _ = _checked_table(self.x, None, "pool")
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
        """The population of a context audit (:class:`probes.context_audit.ContextAuditInputs`) as the pool of
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
    with _one_torch_thread():
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
    """Errors of guessed context cells against the true ones, in pool standard deviations per feature: the
    median absolute error, the root mean square, the share of cells within :data:`RECONSTRUCTION_TOLERANCE`
    and the share of rows with every cell within it."""

    median_abs: float
    rmse: float
    cells_within: float
    rows_within: float


def _errors(guess: np.ndarray, truth: np.ndarray, scale: np.ndarray) -> ErrorSummary:
    e = np.abs(guess - truth) / scale
    within = e <= RECONSTRUCTION_TOLERANCE
    return ErrorSummary(float(np.median(e)), float(np.sqrt((e**2).mean())), float(within.mean()),
                        float(within.all(axis=1).mean()))


@dataclass(frozen=True)
class ReconstructionResult:
    """Every context row's features guessed from the file alone (``method``), against imputation from the
    pool without the file: the pool mean, the pool mean of the row's true class (a baseline that is given
    the label), and the pool row nearest the truth other than the row itself (an oracle: the best any
    pool lookup could do for a row the pool does not hold). ``label_accuracy``: the labels the file gives
    back without the pool. Scored on the context rows the pool holds (``n_scored`` of ``n_context``)."""

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


def _reconstruct_tabicl(est: Any, mode: str, pool_x: np.ndarray, n_classes: int, max_iter: int, restarts: int,
                        seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """L-BFGS on every context row's raw features, for each label, so that its recomputed entries in the
    "none" members match the stored ones; the label with the lowest residual wins. A row left with a residual
    above :data:`RESIDUAL_CONVERGED` (a local minimum) starts again from ``restarts`` random points of the
    pool's per-feature normal at once (never from a pool row: the pool may hold the row itself), for up to
    :data:`RESTART_ROUNDS` rounds. The first start is the pool mean; the pool's std scales the search; a
    column the unique filter dropped is its stored (constant) mean. Returns the guesses [N, F], the label
    indices [N] and the residuals [N]."""
    import torch

    transform = _tabicl_none_preprocessing(est)
    eg = est.ensemble_generator_
    check = transform(torch.as_tensor(np.array(pool_x), dtype=torch.float64)).numpy()
    package = eg.preprocessors_["none"].transform(eg.unique_filter_.transform(est.X_encoder_.transform(pool_x)))
    if np.abs(check - package).max() > 1e-4:
        raise ProbeError("saved-file audit: this TabICL's 'none' preprocessing is not the one reconstruction "
                         f"inverts (differs by {np.abs(check - package).max():.2g}); a package update?")
    cache = _tabicl_cache(est)["none"]
    shuffles = np.asarray(eg.class_shuffles_["none"])  # (B, C)
    feature_shuffles = [list(s) for s in eg.feature_shuffles_["none"]]
    n_ctx = int(est.n_samples_in_)
    ref = _tabicl_reference(cache, mode).detach()  # (B, N, D)
    mu = torch.as_tensor(pool_x.mean(axis=0), dtype=torch.float64)
    sd = torch.as_tensor(pool_x.std(axis=0) + 1e-9, dtype=torch.float64)
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

    n_features = pool_x.shape[1]
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


def _read_tabpfn_rows(est: Any, pool_x: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fit_preprocessors: the raw rows read out of the stored preprocessed context. Which stored column
    passes which raw feature through unchanged is found the attacker's way: pool rows through the stored
    pipeline, an output column equal to an input column on every pool row. A feature no member passes
    through is left at the pool mean. Labels: the stored labels, the class permutation undone."""
    n_ctx = int(est.n_train_samples_)
    guess = np.tile(pool_x.mean(axis=0).astype(np.float64), (n_ctx, 1))
    found = np.zeros(pool_x.shape[1], dtype=bool)
    probe = pool_x.astype(np.float64)
    for m in _tabpfn_members(est):
        out = np.asarray(m.transform_X_test(pool_x), dtype=np.float64)
        stored = np.asarray(m.X_train, dtype=np.float64)
        for j in np.flatnonzero(~found):
            same = np.flatnonzero((out == probe[:, j:j + 1]).all(axis=0))
            if len(same) and np.ptp(probe[:, j]) > 0:
                guess[:, j], found[j] = stored[:, same[0]], True
    first = _tabpfn_members(est)[0]
    labels = np.argsort(_class_permutation(first, n_classes))[np.asarray(first.y_train, dtype=np.int64)]
    residual = np.where(found.all(), 0.0, np.nan) * np.ones(n_ctx)
    return guess, labels, residual


def reconstruct_context(saved: SavedFile, pool: Pool, *, max_iter: int = 300, restarts: int = 8,
                        seed: int = 0) -> ReconstructionResult:
    """Every row of the saved context rebuilt from the file (TabICL: :func:`_reconstruct_tabicl`, ``max_iter``
    L-BFGS iterations; TabPFN fit_preprocessors: read out), scored on the context rows the pool holds against
    the imputation baselines of :class:`ReconstructionResult`. The pool serves the attack only as a scale
    and a starting point (its mean and std) and, for TabPFN, to find the pass-through columns."""
    _check_pool(saved, pool)
    if saved.model == TABPFN and saved.mode == "fit_with_cache":
        raise ProbeError("saved-file audit: feature reconstruction from a TabPFN fit_with_cache file is not "
                         "implemented (its cache is bfloat16 under autocast and its CPU preprocessing is not "
                         "differentiable); its labels are stored in plain and cache_match_attack finds its rows")
    inside = np.flatnonzero(pool.context_position >= 0)
    if not len(inside):
        raise ProbeError("saved-file audit: no pool row is in the saved context, so there is nothing to score a "
                         "reconstruction against")
    start = time.perf_counter()
    with _one_torch_thread():
        est = load_saved(saved)
        classes = np.asarray(est.classes_)
        if saved.model == TABICL:
            guess, label_idx, residual = _reconstruct_tabicl(est, saved.mode, pool.x, len(classes), max_iter,
                                                             restarts, seed)
            method = (f"L-BFGS ({max_iter} iterations; unconverged rows restarted from {restarts} random points, "
                      f"{RESTART_ROUNDS} rounds) on the raw "
                      "features, every label tried, matching the recomputed entries of the 'none' ensemble "
                      "members to the stored ones")
        else:
            guess, label_idx, residual = _read_tabpfn_rows(est, pool.x, len(classes))
            method = "raw features read from the stored preprocessed context's pass-through columns"
    positions = pool.context_position[inside]
    truth = pool.x[inside].astype(np.float64)
    got = guess[positions]
    scale = pool.x.std(axis=0).astype(np.float64) + 1e-9
    mean = np.tile(pool.x.mean(axis=0), (len(inside), 1))
    class_means = {c: pool.x[pool.y == c].mean(axis=0) for c in np.unique(pool.y)}
    by_class = np.stack([class_means[c] for c in pool.y[inside]])
    others = pool.x.astype(np.float64)
    d = ((truth[:, None, :] - others[None]) ** 2 / scale**2).sum(axis=-1)
    d[np.arange(len(inside)), inside] = np.inf  # not the row itself
    nearest = others[d.argmin(axis=1)]
    return ReconstructionResult(
        model=saved.model, mode=saved.mode, method=method, n_context=saved.n_context, n_scored=len(inside),
        n_features=pool.x.shape[1], label_accuracy=float((classes[label_idx[positions]] == pool.y[inside]).mean()),
        reconstruction=_errors(got, truth, scale), pool_mean=_errors(mean, truth, scale),
        class_mean=_errors(by_class, truth, scale), nearest_other_row=_errors(nearest, truth, scale),
        fit_residual_median=float(np.median(residual)), seconds=time.perf_counter() - start)


# ------------------------------------------------------------------------------------------ (b) membership
@dataclass(frozen=True)
class MembershipRow:
    """One attack of the context audit on one target, scored through saved files: AUC with its stratified
    bootstrap interval, TPR at 1% FPR, the attack's verdict."""

    target: str  # ContextTarget: "deployed" (the audited file), "never_in_context" (the control's file)
    attack: str
    auc: float
    auc_low: float
    auc_high: float
    tpr_at_1pct: float
    outcome: str


@dataclass(frozen=True)
class FileMembershipResult:
    """The deployed-context audit (:func:`probes.context_audit.evaluate_context_audit`) with the target's
    log p(y*|x) read from the saved file (and the control's, ``never_in_context``, from its saved file), the
    references refitted: the loss attack is the file's own signal, the calibrated ones use the references.
    The split's blind baseline is Stage I's (it was drawn until it passed); it is not rerun here."""

    model: str
    mode: str
    context_size: int
    n_references: int
    heldout_accuracy: float
    rows: tuple[MembershipRow, ...]
    outcome: str
    trusted: bool
    reason: str
    coarse: tuple[str, ...] = ()  # the TPRs resting on fewer than 10 allowed false positives (e.g. "TPR@0.01")

    def row(self, target: ContextTarget | str, attack: ContextAttack | str) -> MembershipRow:
        for r in self.rows:
            if r.target == ContextTarget(target).value and r.attack == ContextAttack(attack).value:
                return r
        raise KeyError((target, attack))


class _AsFitted:
    """A classifier loaded from a file, as the fresh estimator ``estimator_log_probs`` fits: its ``fit`` keeps
    the file's context (the digest check in :class:`_SavedContextScorer` has made sure it is that one)."""

    def __init__(self, est: Any) -> None:
        self.est = est
        self.classes_ = est.classes_

    def fit(self, x: Any, y: Any) -> _AsFitted:
        return self

    def predict_proba(self, x: Any) -> Any:
        return self.est.predict_proba(x)


class _SavedContextScorer:
    """A :class:`probes.context_audit.ContextScorer` that answers from a saved file for the contexts it holds
    one for (by :func:`context_digest`) and refits the same package classifier for any other (the
    references)."""

    def __init__(self, model: str, mode: str, n_classes: int, files: Mapping[str, Any]) -> None:
        self.model, self.mode, self.n_classes, self.files = model, mode, int(n_classes), dict(files)

    def __call__(self, context_x: np.ndarray, context_y: np.ndarray, query_x: np.ndarray) -> np.ndarray:
        from trainables.models.deployed import package_classifier
        from trainables.models.estimator import CheckedEstimator, estimator_log_probs

        name = f"{self.model} ({self.mode})"
        loaded = self.files.get(context_digest(context_x, context_y))
        factory: Callable[[], Any]
        if loaded is not None:
            factory = lambda: _AsFitted(loaded)
        else:
            factory = lambda: CheckedEstimator(
                package_classifier(self.model, **_mode_options(self.model, self.mode)), name)
        with _one_torch_thread():
            return estimator_log_probs(factory, context_x, context_y, query_x, self.n_classes, name)


def membership_through_file(saved: SavedFile, inputs: Any, *, control: SavedFile | None = None,
                            n_references: int = 8, seed: int = 0, n_resamples: int = DEFAULT_RESAMPLES,
                            null_splits: int = 5) -> FileMembershipResult:
    """The context audit of ``inputs`` (:class:`probes.context_audit.ContextAuditInputs`) with the deployed
    context's scores read from ``saved`` (fitted on P's members in P's order) and, if given, the control's
    from ``control`` (fitted on ``inputs.control_x``); the ``n_references`` reference contexts refitted."""
    from probes.context_audit import evaluate_context_audit

    x, y = np.asarray(inputs.population_x), np.asarray(inputs.population_y)
    member = np.asarray(inputs.member, dtype=bool)
    files = {}
    if context_digest(x[member], y[member]) != saved.context_digest:
        raise ProbeError(f"saved-file audit: {saved.path} was not fitted on the audit's members (in P's order)")
    files[saved.context_digest] = load_saved(saved)
    if control is not None:
        if inputs.control_x is None or context_digest(inputs.control_x, inputs.control_y) != control.context_digest:
            raise ProbeError(f"saved-file audit: {control.path} was not fitted on the audit's control context")
        if (control.model, control.mode) != (saved.model, saved.mode):
            raise ProbeError(f"saved-file audit: the control file is {control.model} ({control.mode}), the audited "
                             f"one {saved.model} ({saved.mode})")
        files[control.context_digest] = load_saved(control)
    elif inputs.control_x is not None:
        raise ProbeError("saved-file audit: the audit has a control context but no control file was given")
    scorer = _SavedContextScorer(saved.model, saved.mode, inputs.n_classes, files)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LowResolutionWarning)
        result = evaluate_context_audit(scorer, inputs, n_references=n_references, seed=seed,
                                        n_resamples=n_resamples, null_splits=null_splits)
    coarse = sorted({str(w.message).split(":")[0] for w in caught if issubclass(w.category, LowResolutionWarning)})
    rows = tuple(MembershipRow(str(r["target"]), str(r["attack"]), float(r["auc"]), float(r["auc_low"]),
                               float(r["auc_high"]), float(r["tpr_at_1pct"]), str(r["outcome"]))
                 for r in result.rows)
    heldout = float(result.rows_of(ContextTarget.DEPLOYED)[0]["heldout_accuracy"])
    return FileMembershipResult(saved.model, saved.mode, int(member.sum()), n_references, heldout, rows,
                                result.verdict.outcome.value, result.verdict.trusted, result.verdict.reason,
                                tuple(coarse))


__all__ = ["ByteScan", "CacheAttackResult", "ErrorSummary", "FILE_NAMES", "FileMembershipResult", "MATCH_TOLERANCE",
           "MODES", "MembershipRow", "Pool", "RECONSTRUCTION_TOLERANCE", "RESIDUAL_CONVERGED", "RESTART_ROUNDS",
           "ReconstructionResult", "SaveReloadResult", "SavedFile", "StoredArray", "TABICL", "TABPFN",
           "cache_match_attack", "context_digest", "fit_and_save", "load_saved", "membership_through_file",
           "reconstruct_context", "save_and_reload", "scan_file"]
