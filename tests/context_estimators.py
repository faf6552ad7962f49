"""Estimator factories for ``iclmem audit-context --estimator tests.context_estimators:NAME`` in the tests:
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
        raise RuntimeError("tests.context_estimators.TABPFN_CHECKPOINT is not set")
    return TabPFNClassifier(model_path=TABPFN_CHECKPOINT, n_estimators=2, device="cpu", random_state=0)
