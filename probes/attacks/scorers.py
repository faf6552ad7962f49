"""The two scorers every audit of a context shares (:class:`probes.attacks.context.ContextScorer`: a fitted
context's log-probabilities float64 [m, C] for m queries): a registered model's adapter, one forward pass of
the queries against the context (:class:`AdapterScorer`, torch), and a scikit-learn-style classifier fitted
afresh on each context (:class:`EstimatorScorer`). Used by the probe's context channel
(``probe.two_channels``), the deployed-context audit and the value-inference audits; no Ray."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["AdapterScorer", "EstimatorScorer"]


class AdapterScorer:
    """A registered model's adapter as a :class:`probes.attacks.context.ContextScorer`: one forward pass of
    the queries (in chunks of ``chunk`` rows; a query attends to the context, not to other queries) against
    the given context."""

    def __init__(self, adapter: Any, n_classes: int, columns: Any = None, chunk: int = 2048) -> None:
        self.adapter, self.n_classes, self.chunk = adapter, int(n_classes), int(chunk)
        hook = getattr(adapter, "use_columns", None)
        if hook is not None:
            hook(columns)
        adapter.module.eval()

    def __call__(self, context_x: np.ndarray, context_y: np.ndarray, query_x: np.ndarray) -> np.ndarray:
        import torch

        device = self.adapter.device
        # writable and contiguous (a copy only where not): torch.from_numpy shares memory, and the audits hand
        # read-only arrays
        cx = torch.from_numpy(np.require(context_x, np.float32, ["C", "W"]))[None].to(device)
        cy = torch.from_numpy(np.require(context_y, np.int64, ["C", "W"]))[None].to(device)
        out = []
        with torch.no_grad():
            for start in range(0, len(query_x), self.chunk):
                q = torch.from_numpy(np.require(query_x[start:start + self.chunk], np.float32, ["C", "W"]))
                out.append(self.adapter.log_probs(cx, cy, q[None].to(device), self.n_classes)[0].cpu().numpy())
        return np.concatenate(out).astype(np.float64)


class EstimatorScorer:
    """A scikit-learn-style classifier as a :class:`probes.attacks.context.ContextScorer`: a fresh estimator
    from ``factory()`` fitted on each context, ``predict_proba`` on the queries
    (:func:`trainables.models.estimator.estimator_log_probs`). A ``fit`` or ``predict_proba`` that fails, and
    probabilities that are not finite and >= 0, are a :class:`~iclmem.errors.ModelError` naming the estimator (``name``,
    its ``MODULE:FACTORY``), through :class:`trainables.models.estimator.CheckedEstimator`."""

    def __init__(self, factory: Callable[[], Any], n_classes: int, name: str = "estimator") -> None:
        self.factory, self.n_classes, self.name = factory, int(n_classes), name

    def __call__(self, context_x: np.ndarray, context_y: np.ndarray, query_x: np.ndarray) -> np.ndarray:
        from trainables.models.estimator import CheckedEstimator, estimator_log_probs

        return estimator_log_probs(lambda: CheckedEstimator(self.factory(), self.name), context_x, context_y,
                                   query_x, self.n_classes, self.name)
