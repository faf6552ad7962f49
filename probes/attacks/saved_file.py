"""What a saved, fitted TabICL or TabPFN classifier file holds of its context, and what an attacker gets from it.

TabICL's documentation says a fitted estimator saved with ``save(path, save_training_data=False,
save_kv_cache=True)`` "is useful for data privacy since the KV cache encodes the training context and enables
prediction without raw data". This module tests that claim on the shipped minis
(:mod:`trainables.models.deployed`), and does the same for TabPFN's saved fit state. Findings (tabicl 2.2.0,
tabpfn 9.2.0, read from their code and measured by the functions below on Stage I's breast-cancer split with
``--file-pca``: N = 40 context rows, F = 16 whitened PCA components, C = 2 classes; the packages' defaults, 8
ensemble members. The audit's default is the table's own 30 columns: the shapes below then have 30 where they
have 16; its figures are in docs/METHOD.md, "The saved file", and benchmarks/RESULTS.md, "Saved files"):

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
(x_i, y_i) anyone with the file, the exact checkpoint and the package's code can evaluate (the threat
model: docs/METHOD.md). :func:`probes.attacks.saved_file_cache.cache_match_attack` recomputes
it for every candidate row and every label and finds each context row the attacker's pool holds: 40 of 40
members at their own position with their own label, 0 of 40 non-members (relative squared distance <= 1.4e-15
for members, >= 3.8e-3 for any other row; AUC 1.0); a file of other rows matches nothing. Inverting it by
L-BFGS on x (:func:`~probes.attacks.saved_file_cache.reconstruct_context`: no candidate row; the attacker's
sample of the table, the audit's non-members, gives only a start and a scale) gives every label back and nearly
every row's features within 0.1 column std in every cell, where the sample's mean, its class mean and even its
row nearest the truth get no row (on the table's 30 columns, seeds 0-2: docs/METHOD.md). Where it stops: it
recomputes layer 0 only (layers >= 1 need the other rows; not needed); a column the unique filter dropped is
not in the cache (its constant is the stored column mean, used as such); a cell the network barely
distinguishes stays off; a table much wider than the row representation (64 numbers in tabicl-mini) cannot be
pinned down; a few rows start in local minima (random restarts, never from a sample
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
  [4, 16] hold raw values too. :func:`~probes.attacks.saved_file_cache.reconstruct_context` reads the rows out of the pass-through columns
  (error 0, 40/40 rows and labels); :func:`~probes.attacks.saved_file_cache.cache_match_attack` compares the stored rows with each candidate
  preprocessed by the stored pipeline (40/40 members, 0 non-members).
* ``fit_mode="fit_with_cache"`` (1.0 MB): ``X_train`` is set to None, but ``y_train`` [40] stays, in context
  order; ``kv_caches[g]`` (one ``TabPFNV2Cache`` per member here) holds ``kv[l]``, l = 0..3, key and value
  bfloat16 (autocast on CPU) [20, 40, 1, 16] (19 feature groups and the target column, the first
  multi-query head only), ``feature_cache`` (the fitted column statistics, [19, 2]) and the embedded empty
  target [1, 32]; 37 of 640 cells are in the bytes (the ``quantiles_``). Layer 0's entry of a row depends on
  the row and its label only: recomputed under the same autocast it matches bit for bit, and
  :func:`~probes.attacks.saved_file_cache.cache_match_attack` finds 40/40 members with position and label, 0 non-members. Feature
  reconstruction through this cache is not implemented (bfloat16 K/V under autocast, and TabPFN's CPU
  preprocessing is numpy, not differentiable): :func:`~probes.attacks.saved_file_cache.reconstruct_context` says so.

Loading either file runs pickle: a file from someone else runs their code, so :func:`load_saved` is for files
one wrote (:func:`fit_and_save`). Results hold row ids, shapes and metrics, never a feature value or a label.
Torch runs on one thread inside these functions: the per-row forwards are tiny, and on a shared machine two
threads contend (measured 50-100x slower on two shared cores).
"""

from __future__ import annotations

import hashlib
import itertools
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from iclmem.errors import CheckpointError, DataError, ModelError, ProbeError
from iclmem.stats import DEFAULT_RESAMPLES, LowResolutionWarning
from iclmem.vocab import ContextAttack, ContextTarget

TABICL = "tabicl"
TABPFN = "tabpfn-v2"
# what each package's classifier is fitted with before saving: TabICL's KV cache ("kv": K/V of every ICL layer,
# "repr": the ICL input tokens), TabPFN's fit_mode
MODES: Mapping[str, tuple[str, ...]] = {TABICL: ("kv", "repr"), TABPFN: ("fit_preprocessors", "fit_with_cache")}
FILE_NAMES: Mapping[str, str] = {TABICL: "tabicl_fitted.pkl", TABPFN: "tabpfn_fitted.tabpfn_fit"}
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


def checked_table(x: Any, y: Any | None, what: str) -> tuple[np.ndarray, np.ndarray | None]:
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
def one_torch_thread() -> Iterator[None]:
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
    x, y = checked_table(context_x, context_y, "context")
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
    with one_torch_thread():
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
    x, y = checked_table(context_x, context_y, "context")
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
    q, _ = checked_table(query_x, None, "query")
    with one_torch_thread():
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
    """The deployed-context audit (:func:`probes.attacks.context.evaluate_context_audit`) with the target's
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
    """A :class:`probes.attacks.context.ContextScorer` that answers from a saved file for the contexts it holds
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
        with one_torch_thread():
            return estimator_log_probs(factory, context_x, context_y, query_x, self.n_classes, name)


def membership_through_file(saved: SavedFile, inputs: Any, *, control: SavedFile | None = None,
                            n_references: int = 8, seed: int = 0, n_resamples: int = DEFAULT_RESAMPLES,
                            null_splits: int = 5) -> FileMembershipResult:
    """The context audit of ``inputs`` (:class:`probes.attacks.context.ContextAuditInputs`) with the deployed
    context's scores read from ``saved`` (fitted on P's members in P's order) and, if given, the control's
    from ``control`` (fitted on ``inputs.control_x``); the ``n_references`` reference contexts refitted."""
    from probes.attacks.context import evaluate_context_audit

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


__all__ = ["ByteScan", "FILE_NAMES", "FileMembershipResult", "MODES", "MembershipRow", "SaveReloadResult", "SavedFile",
           "StoredArray", "TABICL", "TABPFN", "checked_table", "context_digest", "fit_and_save", "load_saved",
           "membership_through_file", "one_torch_thread", "save_and_reload", "scan_file"]
