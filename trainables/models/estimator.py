"""A scikit-learn-style classifier as iclmem sees a model: the black-box path.

A user's deployed estimator (``fit(X, y)`` and ``predict_proba(X)``: a ``TabPFNClassifier`` on fine-tuned
weights with its preprocessing and ensemble, a ``TabICLClassifier``, any classifier) is audited as it is
deployed, from class probabilities only: a context is a ``fit``, its queries one ``predict_proba``. It has no
weights iclmem can read and is never fine-tuned by iclmem.

* :func:`load_estimator_factory` -- ``MODULE:FACTORY`` imported and tried once (a :class:`ConfigError`
  naming the spec before any work);
* :func:`estimator_log_probs` -- log p(class | query, context) float64 [m, C] from one fit;
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
    and ``predict_proba``, imported and called once to check it."""
    if ":" not in spec:
        raise ConfigError(f"{flag} {spec!r}: give MODULE:FACTORY, e.g. sklearn.linear_model:LogisticRegression")
    module_name, attr = spec.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{flag} {spec}: module {module_name!r} cannot be imported ({exc})") from None
    factory = getattr(module, attr, None)
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


class EstimatorAdapter(ModelAdapter):
    """A ``fit`` / ``predict_proba`` factory as a model adapter: each context of a batch is one fit (so a
    batch of B contexts costs B fits), its queries one ``predict_proba``. No weights (its module is empty) and
    nothing to fine-tune: the estimator is audited as the user deploys it. ``options["estimator"]`` is the
    factory's spec, so two estimators have different reference-score digests."""

    name = "estimator"
    max_classes = 100_000
    max_features = 1_000_000

    def __init__(self, factory: Callable[[], Any], spec: str) -> None:
        super().__init__(torch.nn.Module(), {"estimator": spec})
        self.factory = factory
        self.spec = spec

    def _logits(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor) -> torch.Tensor:
        raise ModelError("an estimator is scored through log_probs, which knows the number of classes")

    def log_probs(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor, n_classes: int,
                  context_weight: torch.Tensor | None = None) -> torch.Tensor:
        """context_x [B, N, F], context_y [B, N], query_x [B, M, F] -> [B, M, C] float32 log-probabilities."""
        self.check_shapes(context_x, context_y, query_x, n_classes)
        if context_weight is not None:
            raise ModelError(f"estimator {self.spec}: context row multiplicities are not taken")
        cx, cy, qx = (t.detach().cpu().numpy() for t in (context_x, context_y, query_x))
        out = [estimator_log_probs(self.factory, cx[b], cy[b].astype(np.int64), qx[b], n_classes, self.spec)
               for b in range(cx.shape[0])]
        return torch.from_numpy(np.stack(out)).float()
