"""Adapter for pfn-mini, the embedded model shipped with iclmem (weights under ``weights/``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch

from iclmem.errors import CheckpointError
from iclmem.vocab import InputContract
from trainables.models.base import MODELS, ContextBatch, Invariance, ModelAdapter, candidate_log_probs, read_weights
from trainables.models.checkpoints import DEFAULT_WEIGHTS, WEIGHTS_DIR, DefaultWeights, local_checkpoint
from trainables.models.pfn_mini import PfnMini, PfnMiniConfig

SHIPPED_WEIGHTS = WEIGHTS_DIR / "pfn_mini.safetensors"


class PfnMiniAdapter(ModelAdapter):
    name = "pfn-mini"
    supports_context_weights = True  # no positional encoding: context rows are a multiset
    # Rows are a multiset (no positional encoding), and k copies of every row weigh each key k-fold in
    # numerator and denominator of every softmax (with context_weight: a log k bias on every key).
    invariances = frozenset({Invariance.ROW_ORDER, Invariance.UNIFORM_MULTIPLICITY})
    # A small fixed-width model: today's preparation, whitened PCA down to data.max_features.
    input_contract = InputContract.REDUCED
    packs_batches = True  # PfnMini.forward_many: one CPU inference pass for batches of any shapes

    def __init__(self, module: PfnMini, options: dict[str, Any] | None = None) -> None:
        super().__init__(module, options)
        self.max_classes = module.config.max_classes
        self.max_features = module.config.max_features

    def _logits(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.module(context_x, context_y, query_x)
        return logits

    def _weighted_logits(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor,
                         context_weight: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.module(context_x, context_y, query_x, context_weight)
        return logits

    def log_probs_many(self, batches: Sequence[ContextBatch], n_classes: int) -> list[torch.Tensor]:
        self._require_classifier()
        for b in batches:
            self.check_shapes(b.context_x, b.context_y, b.query_x, n_classes)
        logits = cast(PfnMini, self.module).forward_many([(b.context_x.float(), b.context_y.long(),
                                                           b.query_x.float(), b.context_weight) for b in batches])
        return [candidate_log_probs(out, n_classes) for out in logits]


def _shipped(**_options: Any) -> Path:
    if not SHIPPED_WEIGHTS.is_file():
        raise CheckpointError(
            f"the shipped pfn-mini weights are missing at {SHIPPED_WEIGHTS}; reinstall iclmem or run "
            "`python -m trainables.models.pretrain_pfn_mini --export`"
        )
    return SHIPPED_WEIGHTS


DEFAULT_WEIGHTS.register("pfn-mini", DefaultWeights(
    weights="shipped", source="shipped with iclmem (trainables/models/weights/pfn_mini.safetensors)",
    licence="Apache-2.0, like iclmem (trained here on synthetic priors)", locate=_shipped))


@MODELS.decorator("pfn-mini")
def build_pfn_mini(weights: str | None = "shipped", seed: int = 0, **config: Any) -> PfnMiniAdapter:
    """``weights``: "shipped" (the packaged pretrained checkpoint), "random" (seeded init), or a file path."""
    torch.manual_seed(seed)
    module = PfnMini(PfnMiniConfig(**config))
    if weights == "shipped":
        module.load_state_dict(read_weights(_shipped()))
    elif weights not in (None, "random"):
        module.load_state_dict(read_weights(local_checkpoint(weights)))
    module.eval()
    return PfnMiniAdapter(module, {"weights": weights, "seed": seed, **config})


def shipped_provenance() -> dict[str, Any]:
    meta = SHIPPED_WEIGHTS.with_suffix(".json")
    return json.loads(meta.read_text()) if meta.is_file() else {}
