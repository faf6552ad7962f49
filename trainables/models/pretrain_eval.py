"""In-context accuracy of a pretraining model on three small real tables, and of classifiers on the same rows.

breast_cancer, wine and iris (scikit-learn's copies), each standardised once over the whole table and cut to
``EVAL_FEATURES`` PCA components past that width, split 50/50 (stratified) per seed into context and queries.
``evaluate`` scores the raw module as iclmem drives it (the curve's points and an export's final accuracy);
``evaluate_classifier`` scores a scikit-learn classifier (logistic regression, a package's own classifier)
fitted on each context split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from trainables.models.base import ModelAdapter
from trainables.models.pretrain_models import LogitsOf, logits_of

EVAL_FEATURES = 16


def eval_tables() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_breast_cancer, load_iris, load_wine

    return {name: loader(return_X_y=True) for name, loader in
            (("breast_cancer", load_breast_cancer), ("wine", load_wine), ("iris", load_iris))}


def prepare_eval_features(x: np.ndarray, max_features: int = EVAL_FEATURES) -> np.ndarray:
    """Standardise once over the whole table and, past max_features, keep the leading PCA components."""
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    x = StandardScaler().fit_transform(x)
    if x.shape[1] > max_features:
        x = StandardScaler().fit_transform(PCA(n_components=max_features, random_state=0).fit_transform(x))
    clipped: np.ndarray = np.clip(x, -6, 6).astype(np.float32)
    return clipped


@torch.no_grad()
def icl_predict(model: LogitsOf, x_ctx: np.ndarray, y_ctx: np.ndarray, x_query: np.ndarray,
                n_classes: int) -> np.ndarray:
    """Labels [M] predicted by ``model`` (a pfn-mini module, or ``logits_of(adapter)``) for the queries."""
    logits = model(torch.from_numpy(x_ctx)[None], torch.from_numpy(y_ctx).long()[None], torch.from_numpy(x_query)[None])
    return logits[0, :, :n_classes].argmax(-1).numpy()


def eval_splits(seeds: Sequence[int]) -> list[tuple[str, int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(table, seed, classes, context x, context y, query x, query y) for every table and seed: 50/50
    stratified splits of the prepared features."""
    from sklearn.model_selection import train_test_split

    splits = []
    for name, (x, y) in eval_tables().items():
        x = prepare_eval_features(x)
        for seed in seeds:
            xa, xb, ya, yb = train_test_split(x, y, test_size=0.5, stratify=y, random_state=seed)
            splits.append((name, seed, int(y.max()) + 1, xa, ya, xb, yb))
    return splits


def _mean_by_table(scores: list[tuple[str, float]]) -> dict[str, float]:
    tables = dict.fromkeys(name for name, _ in scores)
    return {name: float(np.mean([s for n, s in scores if n == name])) for name in tables}


def evaluate(adapter: ModelAdapter, seeds: Sequence[int] = (0,)) -> dict[str, float]:
    """In-context accuracy of the raw module (as iclmem drives it) per table, averaged over ``seeds``."""
    adapter.module.eval()
    try:
        scores = [(name, float((icl_predict(logits_of(adapter), xa, ya, xb, n) == yb).mean()))
                  for name, _, n, xa, ya, xb, yb in eval_splits(seeds)]
    finally:
        adapter.module.train()
    return _mean_by_table(scores)


def evaluate_classifier(make: Callable[[], Any], seeds: Sequence[int]) -> dict[str, float]:
    """Accuracy of a scikit-learn classifier fitted on each context split and scored on its queries."""
    import warnings

    scores = []
    for name, _, _, xa, ya, xb, yb in eval_splits(seeds):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence and package notices on these small tables
            scores.append((name, float((make().fit(xa, ya).predict(xb) == yb).mean())))
    return _mean_by_table(scores)

