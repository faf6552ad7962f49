"""The pretraining data: TabICL's synthetic prior written to a pool, and the augmented batches a step trains on.

``generate_pool`` (``python -m trainables.models.pretrain --role generate``) fills a pool folder with prior
batches of ``POOL_TABLES`` tables from ``tabicl.prior.PriorDataset`` (mlp_scm and tree_scm, 2:1). The trainer
of :mod:`trainables.models.pretrain` draws a pool batch and augments it (``pool_batch``: feature and class
permutations, features standardised per table) or draws a cheap Gaussian-cluster batch (``gmm_batch``), and
cuts a batch to its widest live column for models that read any width (``trim_dead_columns``). ``PRIOR_TEXT``,
``PRIOR_SETTINGS`` and ``AUGMENTATION_TEXT`` are what an export's record says of this data.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from iclmem.atomic import atomic_write

# Tables per pool batch file: the generator's batch, whatever a model's step takes (pfn-mini's pool).
POOL_TABLES = 32
# The batches are drawn this wide (pfn-mini's fixed input); models that read any width get the columns up to
# the widest live one (``trim_dead_columns``).
DRAW_WIDTH = 20
PRIOR_SETTINGS: Mapping[str, Any] = {
    "batch_size_per_gp": 4, "min_features": 2, "max_features": 18, "max_classes": 10, "min_seq_len": 48,
    "max_seq_len": 320, "n_jobs": 1, "num_threads_per_generate": 1,
}
PRIOR_TEXT = "tabicl.prior.PriorDataset mlp_scm/tree_scm (2:1) pool + Gaussian-cluster share {gmm_share}"
AUGMENTATION_TEXT = ("per table: live feature columns and class ids permuted; per step: rows shuffled and a fresh "
                     "context/query split, the context 30-85 % of the rows; features standardised over all rows of "
                     "each table, clipped to +-6; logits of classes a table lacks masked")


# ----------------------------------------------------------------------------------------- generator
def generate_pool(pool: Path, seed: int, batch_size: int, max_batches: int) -> None:
    torch.set_num_threads(1)
    from tabicl.prior import PriorDataset

    pool.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - tabicl's prior draws from numpy's global generator: this seeds it
    random.seed(seed)
    priors = {kind: PriorDataset(batch_size=batch_size, prior_type=kind, **PRIOR_SETTINGS)
              for kind in ("mlp_scm", "tree_scm")}
    index = len(list(pool.glob("batch_*.pt")))
    while index < max_batches:
        kind = "mlp_scm" if index % 3 else "tree_scm"
        x, y, d, seq_lens, _ = priors[kind].get_batch()
        batch = {"x": x.float(), "y": y.long(), "d": d.long(), "seq_len": seq_lens.long()}
        atomic_write(pool / f"batch_{index:06d}.pt", lambda tmp, batch=batch: torch.save(batch, tmp), to_path=True)
        index += 1


# ----------------------------------------------------------------------------------------- batches
def standardize(x: torch.Tensor, n_features: torch.Tensor) -> torch.Tensor:
    # x: [B, L, F]; statistics over all rows of each table, as iclmem's preprocessing does per task.
    mean = x.mean(dim=1, keepdim=True)
    std = x.std(dim=1, keepdim=True).clamp_min(1e-6)
    out = ((x - mean) / std).clamp(-6, 6)
    live = torch.arange(x.shape[-1])[None, None, :] < n_features[:, None, None]
    return torch.where(live, out, torch.zeros_like(out))


def pool_batch(pool_files: list[Path], gen: torch.Generator, max_features: int,
               tables: int | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One pool batch, augmented: x [B, L, max_features] standardised, y [B, L], L. ``tables`` below the
    pool batch's size takes a random subset of its tables (drawn from ``gen``; none drawn otherwise)."""
    path = pool_files[int(torch.randint(len(pool_files), (1,), generator=gen))]
    data = torch.load(path, weights_only=True)
    x, y, d, seq_len = data["x"], data["y"], data["d"], data["seq_len"]
    if tables is not None and tables < x.shape[0]:
        keep = torch.randperm(x.shape[0], generator=gen)[:tables]
        x, y, d, seq_len = x[keep], y[keep], d[keep], seq_len[keep]
    length = int(seq_len.min())
    x, y = x[:, :length], y[:, :length]
    batch, _, width = x.shape
    # Augment: permute live feature columns and class ids per table, so pool batches can be reused.
    for b in range(batch):
        n = int(d[b])
        perm = torch.randperm(n, generator=gen)
        x[b, :, :n] = x[b, :, perm]
        n_cls = int(y[b].max()) + 1
        y[b] = torch.randperm(n_cls, generator=gen)[y[b]]
    if width < max_features:
        x = F.pad(x, (0, max_features - width))
    return standardize(x[..., :max_features], d), y, length


def gmm_batch(gen: torch.Generator, batch: int, max_features: int,
              max_classes: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Gaussian class clusters with a random share of irrelevant features and random scales."""
    length = int(torch.randint(48, 320, (1,), generator=gen))
    n_feat = torch.randint(1, max_features - 1, (batch,), generator=gen)
    n_cls = torch.randint(2, max_classes + 1, (batch,), generator=gen)
    x = torch.zeros(batch, length, max_features)
    y = torch.zeros(batch, length, dtype=torch.long)
    for b in range(batch):
        f, c = int(n_feat[b]), int(n_cls[b])
        spread = float(torch.empty(1).uniform_(0.3, 2.5, generator=gen))
        means = torch.randn(c, f, generator=gen) * spread
        relevant = torch.rand(f, generator=gen) < 0.7
        means[:, ~relevant] = 0
        scales = torch.empty(c, f).uniform_(0.5, 1.5, generator=gen)
        # The class weights come from torch's global generator (Dirichlet takes no generator): the resumable
        # state saves that generator too.
        weights = torch.distributions.Dirichlet(torch.full((c,), 2.0)).sample()
        labels = torch.multinomial(weights, length, replacement=True, generator=gen)
        x[b, :, :f] = means[labels] + torch.randn(length, f, generator=gen) * scales[labels]
        y[b] = labels
    return standardize(x, n_feat), y, length


def trim_dead_columns(x: torch.Tensor) -> torch.Tensor:
    """x [B, L, F] cut after its last column that is non-zero somewhere (at least one column kept): the
    columns after it are padding (or constant, standardised to zero) in every table."""
    live = (x != 0).flatten(0, 1).any(dim=0).nonzero()
    width = int(live.max()) + 1 if len(live) else 1
    return x[..., :width]
