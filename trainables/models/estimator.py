"""A scikit-learn-style classifier as iclmem sees a model: the black-box path.

A user's deployed estimator (``fit(X, y)`` and ``predict_proba(X)``: a ``TabPFNClassifier`` on fine-tuned
weights with its preprocessing and ensemble, a ``TabICLClassifier``, any classifier) is audited as it is
deployed, from class probabilities only: a context is a ``fit``, its queries one ``predict_proba``. It has no
weights iclmem can read and is never fine-tuned by iclmem.

* :func:`load_estimator_factory` -- ``MODULE:FACTORY`` imported and tried once (a :class:`ConfigError`
  naming the spec before any work);
* :func:`estimator_log_probs` -- log p(class | query, context) float64 [m, C] from one fit;
* :class:`CheckedEstimator` -- a user's estimator whose failing ``fit`` / ``predict_proba``, or probabilities
  that are not finite and >= 0, are one :class:`ModelError` naming its flag and spec
  (``--estimator MODULE:FACTORY``); ``iclmem audit-context`` and ``iclmem probe --estimator`` both wrap with it;
* :class:`PackageScoring` -- a mixin for an adapter whose package deploys its weights through the package's own
  estimator (TabPFN v2, TabICL under ``recipe="upstream"``): ``deployed_log_probs`` fits that estimator on
  each context, with the adapter's current weights written in the package's checkpoint format;
* :func:`recipe_options` -- the adapter options ``recipe``, ``n_estimators`` and ``finetuner``, checked;
* :class:`EstimatorAdapter` -- the same behind :class:`~trainables.models.base.ModelAdapter`'s
  ``log_probs`` (context_x [B, N, F], context_y [B, N], query_x [B, M, F] -> [B, M, C]), one fit per
  context b, so the probe engine scores it like any registered model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from iclmem.errors import ConfigError, DataError, ModelError
from trainables.models.base import ModelAdapter

# log p of a class the fitted estimator gives probability 0 (e.g. absent from its context)
LOG_P_FLOOR = float(np.log(1e-12))


def load_estimator_factory(spec: str, flag: str = "--estimator") -> Callable[[], Any]:
    """``MODULE:ATTRIBUTE``: a callable taking no argument and returning an unfitted classifier with ``fit``
    and ``predict_proba``, imported and called once to check it. Every failure (a module that is missing, does
    not parse or fails as it is imported, a factory that fails) is one :class:`ConfigError` naming ``flag``."""
    if ":" not in spec:
        raise ConfigError(f"{flag} {spec!r}: give MODULE:FACTORY, e.g. sklearn.linear_model:LogisticRegression")
    module_name, attr = spec.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{flag} {spec}: module {module_name!r} cannot be imported ({exc})") from None
    except SyntaxError as exc:
        raise ConfigError(f"{flag} {spec}: {exc.filename or 'its module'} does not parse (line {exc.lineno}: "
                          f"{exc.msg})") from None
    except Exception as exc:  # the module's own code failed as it was imported
        raise ConfigError(f"{flag} {spec}: importing its module failed ({type(exc).__name__}: {exc})") from None
    factory: Callable[[], Any] | None = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ConfigError(f"{flag} {spec}: {module_name} has no callable {attr!r}")
    try:
        probe = factory()
    except Exception as exc:  # a user's factory: any failure is theirs to see, named
        raise ConfigError(f"{flag} {spec}: calling {attr}() failed: {type(exc).__name__}: {exc}") from None
    missing = [m for m in ("fit", "predict_proba") if not callable(getattr(probe, m, None))]
    if missing:
        raise ConfigError(f"{flag} {spec}: {attr}() returned a {type(probe).__name__} without "
                          f"{' and '.join(missing)}; the audit needs a classifier with fit and predict_proba")
    return factory


class CheckedEstimator:
    """A user's estimator whose ``fit`` and ``predict_proba`` fail, or answer what no probability is, in one
    line naming it: ``{flag} {name}`` (e.g. ``--estimator good:NanProba``)."""

    def __init__(self, estimator: Any, name: str, flag: str = "--estimator") -> None:
        self._estimator, self._name, self._flag = estimator, name, flag

    def __getattr__(self, attr: str) -> Any:  # classes_ and the rest, as the estimator has them
        return getattr(self._estimator, attr)

    def _failed(self, method: str, exc: Exception) -> ModelError:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return ModelError(f"{self._flag} {self._name}: its {method} failed ({type(exc).__name__}: {text})")

    def fit(self, x: Any, y: Any) -> CheckedEstimator:
        try:
            self._estimator.fit(x, y)
        except Exception as exc:  # a user's estimator: any failure is theirs to see, named
            raise self._failed("fit", exc) from None
        return self

    def predict_proba(self, x: Any) -> np.ndarray:
        try:
            proba = np.asarray(self._estimator.predict_proba(x), dtype=np.float64)
        except Exception as exc:
            raise self._failed("predict_proba", exc) from None
        bad = {"NaN": np.isnan(proba), "infinite": np.isinf(proba), "negative": proba < 0}
        found = [f"{int(mask.sum())} {what}" for what, mask in bad.items() if mask.any()]
        if found:
            raise ModelError(f"{self._flag} {self._name}: predict_proba returned {' and '.join(found)} "
                             f"probabilities (of {proba.size}); class probabilities must be finite and >= 0")
        return proba


def estimator_log_probs(factory: Callable[[], Any], context_x: np.ndarray, context_y: np.ndarray,
                        query_x: np.ndarray, n_classes: int, name: str = "estimator") -> np.ndarray:
    """float64 [m, C]: log-probabilities of a fresh ``factory()`` fitted on the context, for each query, its
    ``predict_proba`` columns mapped to the classes 0..C-1 through ``classes_`` (a class it does not know gets
    :data:`LOG_P_FLOOR`), renormalised over the C candidates."""
    est = factory()
    est.fit(np.asarray(context_x), np.asarray(context_y))
    proba = np.asarray(est.predict_proba(np.asarray(query_x)), dtype=np.float64)
    classes = np.asarray(getattr(est, "classes_", np.arange(proba.shape[-1] if proba.ndim else 0)), dtype=np.int64)
    if proba.ndim != 2 or proba.shape != (len(query_x), len(classes)):
        raise DataError(f"{name}: predict_proba returned shape {proba.shape} for {len(query_x)} rows and "
                        f"{len(classes)} classes")
    if classes.min(initial=0) < 0 or classes.max(initial=0) >= n_classes:
        raise DataError(f"{name}: classes_ {classes.tolist()[:10]} are not labels 0..{n_classes - 1}")
    full = np.zeros((len(query_x), n_classes))
    full[:, classes] = proba
    with np.errstate(divide="ignore"):
        out = np.maximum(np.log(full), LOG_P_FLOOR)
    return out - np.logaddexp.reduce(out, axis=1, keepdims=True)


def recipe_options(name: str, recipe: str, n_estimators: int | None, finetuner: dict[str, Any] | None, task: str,
                   default_n_estimators: int) -> dict[str, Any]:
    """The options an adapter records for its ``recipe`` (none under iclmem's own loop): ``recipe``,
    ``n_estimators`` (the deployed estimator's ensemble) and ``finetuner`` (settings of the package's
    fine-tuner). :class:`ModelError` for a value under the wrong recipe or out of range."""
    from iclmem.vocab import Recipe

    try:
        value = Recipe(recipe)
    except ValueError:
        raise ModelError(f"recipe must be one of {[r.value for r in Recipe]}, got {recipe!r}") from None
    if value is Recipe.ICLMEM:
        if finetuner:
            raise ModelError("finetuner holds settings of the package's own fine-tuner: it applies with recipe "
                             "'upstream' only")
        if n_estimators is not None:
            raise ModelError("n_estimators is the deployed estimator's ensemble: it applies with recipe 'upstream' "
                             "only (recipe iclmem scores the raw network)")
        return {}
    if n_estimators is not None and (isinstance(n_estimators, bool) or int(n_estimators) != n_estimators
                                     or n_estimators < 1):
        raise ModelError(f"n_estimators must be a positive integer, got {n_estimators!r}")
    if task != "classification":
        raise ModelError(f"recipe 'upstream' fine-tunes and scores a {name} classifier (the package's classifier "
                         f"fine-tuner); this checkpoint is a {task} model")
    out: dict[str, Any] = {"recipe": value.value, "n_estimators": int(n_estimators or default_n_estimators)}
    if finetuner:
        out["finetuner"] = dict(sorted(finetuner.items()))
    return out


class PackageScoring:
    """Mixin for a :class:`ModelAdapter` whose package deploys the weights through its own estimator. The
    adapter gives :meth:`package_checkpoint` (its weights in the package's file format) and
    :meth:`package_estimator` (an unfitted estimator on such a file); the mixin gives
    :meth:`deployed_log_probs`. The file is rewritten, under a new name so the package's loader cache cannot
    serve the old one, whenever a parameter changed in place since the last call."""

    module: torch.nn.Module
    options: dict[str, Any]
    _deployed: tuple[tuple[int, ...], Any] | None = None
    _deployed_dir: Any = None

    def package_checkpoint(self, path: Any) -> Any:
        raise NotImplementedError

    def package_estimator(self, model_path: str) -> Any:
        raise NotImplementedError

    def _deployed_checkpoint(self) -> Any:
        import os
        import shutil
        import tempfile
        import weakref
        from pathlib import Path

        version = tuple(v for p in self.module.parameters() for v in (p.data_ptr(), p._version))
        if self._deployed is not None and self._deployed[0] == version:
            return self._deployed[1]
        if self._deployed_dir is None:
            self._deployed_dir = Path(tempfile.mkdtemp(prefix="iclmem-deployed-"))
            weakref.finalize(self, shutil.rmtree, str(self._deployed_dir), True)
        if self._deployed is not None:
            self._deployed[1].unlink(missing_ok=True)
        path = self.package_checkpoint(self._deployed_dir / f"weights-{len(os.listdir(self._deployed_dir))}.ckpt")
        self._deployed = (version, path)
        return path

    def deployed_estimator(self) -> Any:
        """An unfitted estimator of the package on the current weights, configured as the recipe deploys it."""
        return self.package_estimator(str(self._deployed_checkpoint()))

    def deployed_log_probs(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor,
                           n_classes: int) -> torch.Tensor:
        """log p as the package deploys these weights: context_x [B, N, F], context_y [B, N], query_x [B, M, F]
        -> [B, M, C], one fit of :meth:`deployed_estimator` per context b (its preprocessing and ensemble). The
        packages refuse contexts of identical rows (the probe's), so this scores real contexts (utility)."""
        self.check_shapes(context_x, context_y, query_x, n_classes)  # type: ignore[attr-defined]
        cx, cy, qx = (t.detach().cpu().numpy() for t in (context_x, context_y, query_x))
        name = f"{getattr(self, 'name', 'model')} (recipe upstream)"
        out = [estimator_log_probs(self.deployed_estimator, cx[b], cy[b].astype(np.int64), qx[b], n_classes, name)
               for b in range(cx.shape[0])]
        return torch.from_numpy(np.stack(out)).float().to(context_x.device)


class EstimatorAdapter(ModelAdapter):
    """A ``fit`` / ``predict_proba`` factory as a model adapter: each context of a batch is one fit (so a
    batch of B contexts costs B fits), its queries one ``predict_proba``. No weights (its module is empty) and
    nothing to fine-tune: the estimator is audited as the user deploys it. ``options["estimator"]`` is the
    factory's spec, so two estimators have different reference-score digests."""

    name = "estimator"
    max_classes = 100_000
    max_features = 1_000_000

    def __init__(self, factory: Callable[[], Any], spec: str, flag: str = "--estimator") -> None:
        super().__init__(torch.nn.Module(), {"estimator": spec})
        self.factory = factory
        self.spec = spec
        self.flag = flag  # the command-line flag that named it, for the one-line error of a failing fit

    def _checked(self) -> CheckedEstimator:
        return CheckedEstimator(self.factory(), self.spec, self.flag)

    def fit_once(self, context_x: np.ndarray, context_y: np.ndarray, query_x: np.ndarray,
                 n_classes: int) -> np.ndarray:
        """One checked fit and ``predict_proba`` (float64 [m, C] log-probabilities): an estimator that fails
        is a :class:`ModelError` naming ``{flag} {spec}`` before any folder is made."""
        return estimator_log_probs(self._checked, np.asarray(context_x), np.asarray(context_y, dtype=np.int64),
                                   np.asarray(query_x), n_classes, self.spec)

    def _logits(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor) -> torch.Tensor:
        raise ModelError("an estimator is scored through log_probs, which knows the number of classes")

    def log_probs(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor, n_classes: int,
                  context_weight: torch.Tensor | None = None) -> torch.Tensor:
        """context_x [B, N, F], context_y [B, N], query_x [B, M, F] -> [B, M, C] float32 log-probabilities."""
        self.check_shapes(context_x, context_y, query_x, n_classes)
        if context_weight is not None:
            raise ModelError(f"estimator {self.spec}: context row multiplicities are not taken")
        cx, cy, qx = (t.detach().cpu().numpy() for t in (context_x, context_y, query_x))
        out = [estimator_log_probs(self._checked, cx[b], cy[b].astype(np.int64), qx[b], n_classes, self.spec)
               for b in range(cx.shape[0])]
        return torch.from_numpy(np.stack(out)).float()
