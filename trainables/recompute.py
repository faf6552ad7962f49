"""Recomputing a lost or damaged checkpoint's weights: the run's fine-tuning re-run from its config up to the
epoch, through iclmem's loop (:class:`trainables.finetune.Finetuner`) or the package's own fine-tuner
(:func:`trainables.upstream.recompute_upstream_model`), and the recomputed weights checked against the hash
the lost checkpoint recorded. It sits above both fine-tuners, so neither imports the other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from iclmem.errors import CheckpointError
from trainables.finetune import Finetuner, FinetuneSpec
from trainables.models import ModelAdapter
from trainables.models.base import weights_digest
from trainables.upstream import is_upstream, recompute_upstream_model

__all__ = ["check_recomputed", "recompute_checkpoint_model"]


def recompute_checkpoint_model(spec: FinetuneSpec, tasks: Sequence[Any], epoch: int,
                               expected_sha256: str | None = None, torch_threads: int | None = None) -> ModelAdapter:
    """Re-run a run's fine-tuning from its config up to ``epoch`` (training is a deterministic function
    of spec, tasks and seed) and return the model, for a checkpoint that was lost or corrupted.

    With ``expected_sha256`` (``weights_sha256`` from the lost checkpoint's manifest, see
    :func:`weights_digest`) the recomputed weights must hash the same, or :class:`CheckpointError` says
    the recomputation differs.
    ``torch_threads`` is the thread count the run trained with (the trainable's default is 1): CPU
    reductions split over another number of threads may round differently."""

    previous = torch.get_num_threads()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    try:
        if is_upstream(spec):
            model = recompute_upstream_model(spec, tasks, epoch)
            check_recomputed(model, epoch, expected_sha256)
            return model
        finetuner = Finetuner(spec, list(tasks))
        while finetuner.epoch < epoch:
            result = finetuner.run_epoch()
            if result.diverged:
                raise CheckpointError(f"recomputing epoch {epoch}: the run diverged at epoch {result.epoch}")
    finally:
        torch.set_num_threads(previous)
    check_recomputed(finetuner.model, epoch, expected_sha256)
    return finetuner.model


def check_recomputed(model: ModelAdapter, epoch: int, expected_sha256: str | None) -> None:
    if expected_sha256 is not None:
        actual = weights_digest(model.module.state_dict())
        if actual != expected_sha256:
            raise CheckpointError(
                f"recomputed epoch {epoch} weights hash {actual[:12]}..., not the {expected_sha256[:12]}... "
                "recorded with the lost checkpoint: fine-tuning is not reproducible here (another thread "
                "count, other package versions or other hardware?)")
