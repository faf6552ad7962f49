"""Model adapters. Importing this package registers the built-in ones in ``MODELS``."""

from trainables.models.base import MODELS, ModelAdapter, build_model, read_weights
from trainables.models import embedded as _embedded  # noqa: F401  (registers pfn-mini)

__all__ = ["MODELS", "ModelAdapter", "build_model", "read_weights"]
