"""Estimator factories for ``iclmem audit-context --estimator tests.audit_estimators:NAME`` in the tests:
each returns an unfitted scikit-learn classifier, as a user's factory would."""

from __future__ import annotations

from sklearn.dummy import DummyClassifier
from sklearn.ensemble import RandomForestClassifier


def forest() -> RandomForestClassifier:
    """Fully grown trees: a training row is predicted from leaves it built, so context rows are found."""
    return RandomForestClassifier(n_estimators=40, random_state=0)


def class_prior() -> DummyClassifier:
    """Predicts the context's class frequencies for every row: nothing of any one row is kept, so with
    label-matched members and non-members there is nothing to find."""
    return DummyClassifier(strategy="prior")


def not_a_classifier() -> object:
    return object()


# Set by the test that writes it: a tiny random TabPFN v2 checkpoint in tabpfn's own file format.
TABPFN_CHECKPOINT: str | None = None


def tabpfn_classifier():
    """TabPFN's own scikit-learn classifier on that checkpoint, with its preprocessing and a two-member
    ensemble: the estimator a user deploys, loaded from a local file (no download)."""
    from tabpfn import TabPFNClassifier

    if TABPFN_CHECKPOINT is None:
        raise RuntimeError("tests.audit_estimators.TABPFN_CHECKPOINT is not set")
    return TabPFNClassifier(model_path=TABPFN_CHECKPOINT, n_estimators=2, device="cpu", random_state=0)


# -- the black-box probe (`iclmem probe --estimator`) ---------------------------------------------------------
# Set by the test: the prepared features of the rows a "fine-tuned" estimator memorized, and their labels.
MEMORIZED: tuple[object, object] | None = None


class _CentroidSoftmax:
    """A context-fitted classifier with nothing of its own: softmax over minus squared distances to the
    context's class means (a class the context lacks is not predicted)."""

    def fit(self, x, y):
        import numpy as np

        self.classes_ = np.unique(np.asarray(y))
        self.means_ = np.stack([np.asarray(x)[np.asarray(y) == c].mean(axis=0) for c in self.classes_])
        return self

    def predict_proba(self, x):
        import numpy as np

        d = -((np.asarray(x)[:, None, : self.means_.shape[1]] - self.means_[None]) ** 2).sum(axis=2)
        d -= d.max(axis=1, keepdims=True)
        p = np.exp(d)
        return p / p.sum(axis=1, keepdims=True)


class _Memorizer(_CentroidSoftmax):
    """The same classifier with rows in its "weights": a query whose leading features equal a memorized row's
    gets that row's label with probability 0.9 (as a model fine-tuned to memorize them would)."""

    def __init__(self, rows, labels):
        import numpy as np

        self.rows, self.labels = np.asarray(rows, dtype=np.float32), np.asarray(labels)
        self.keys = {r.tobytes(): int(lab) for r, lab in zip(self.rows, self.labels, strict=True)}

    def predict_proba(self, x):
        import numpy as np

        p = super().predict_proba(x)
        width = self.rows.shape[1]
        for i, row in enumerate(np.asarray(x, dtype=np.float32)):
            label = self.keys.get(row[:width].tobytes()) if len(row) >= width else None
            if label is not None and label in set(self.classes_.tolist()):
                p[i] = 0.1 / max(1, len(self.classes_) - 1)
                p[i, list(self.classes_).index(label)] = 0.9
        return p


def centroid():
    return _CentroidSoftmax()


def memorizer():
    if MEMORIZED is None:
        raise RuntimeError("tests.audit_estimators.MEMORIZED is not set")
    return _Memorizer(*MEMORIZED)


# Set by the test that writes it: a tiny random TabICL checkpoint in tabicl's own file format.
TABICL_CHECKPOINT: str | None = None


def tabicl_classifier():
    """TabICL's own scikit-learn classifier on that checkpoint, with its ensemble of two (feature and class
    shuffles) and no download: the estimator a user deploys."""
    from tabicl import TabICLClassifier

    if TABICL_CHECKPOINT is None:
        raise RuntimeError("tests.audit_estimators.TABICL_CHECKPOINT is not set")
    return TabICLClassifier(n_estimators=2, model_path=TABICL_CHECKPOINT, allow_auto_download=False, device="cpu",
                            random_state=0)


def nearest_rows():
    """Distance-weighted 3 nearest neighbours: a row of the context is its own nearest neighbour at distance 0,
    so the model returns that row's label with certainty (a model that holds its rows)."""
    from sklearn.neighbors import KNeighborsClassifier

    return KNeighborsClassifier(n_neighbors=3, weights="distance")
