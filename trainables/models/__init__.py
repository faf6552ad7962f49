"""Model adapters. Importing this package registers the built-in ones in ``MODELS``."""

from typing import Any

from trainables.models import contexttab_adapter as _contexttab  # noqa: F401  (registers contexttab)
from trainables.models import embedded as _embedded  # noqa: F401  (registers pfn-mini)

# Optional adapters register always; their packages are imported lazily, when a model is built.
from trainables.models import tabicl_adapter as _tabicl  # noqa: F401  (registers tabicl)
from trainables.models import tabpfn_adapter as _tabpfn  # noqa: F401  (registers tabpfn-v2)
from trainables.models.base import MODELS, ModelAdapter, read_weights

__all__ = ["MODELS", "ModelAdapter", "build_model", "read_weights"]


def build_model(name: str, /, **options: Any) -> ModelAdapter:
    """Build a registered model (this package registered the built-in ones on import). Unknown names are
    answered with the registered ones."""
    return MODELS.get(name)(**options)
