"""The shipped minis as their packages deploy them: factories for ``iclmem audit-context --estimator``.

    iclmem audit-context iris --estimator trainables.models.deployed:tabpfn_mini_classifier --out audit-tabpfn
    iclmem audit-context iris --estimator trainables.models.deployed:tabicl_mini_classifier --out audit-tabicl

Each returns an unfitted package classifier (``TabPFNClassifier`` / ``TabICLClassifier``) on the shipped mini
checkpoint (``weights: mini``), with the package's own defaults: its preprocessing, its ensemble of feature and
class permutations, its subsampling. That is the path a user's official checkpoint takes when audited as
deployed; the raw network under it is what ``--model`` and a sweep's runs score. CPU, no download.
"""

from __future__ import annotations

from typing import Any

from trainables.models.checkpoints import mini_checkpoint


def package_classifier(model: str, **kwargs: Any) -> Any:
    """An unfitted ``TabICLClassifier`` (``model="tabicl"``) or ``TabPFNClassifier`` (``"tabpfn-v2"``) on the
    shipped mini, CPU, the package's defaults unless ``kwargs`` set them."""
    path = str(mini_checkpoint(model))
    if model == "tabicl":
        from tabicl import TabICLClassifier

        return TabICLClassifier(**{"model_path": path, "allow_auto_download": False, "device": "cpu", **kwargs})
    from tabpfn import TabPFNClassifier

    return TabPFNClassifier(**{"model_path": path, "device": "cpu", **kwargs})


def tabicl_mini_classifier() -> Any:
    """``TabICLClassifier`` on tabicl-mini, the package's defaults."""
    return package_classifier("tabicl")


def tabpfn_mini_classifier() -> Any:
    """``TabPFNClassifier`` on tabpfn-mini, the package's defaults."""
    return package_classifier("tabpfn-v2")
