"""The models the pretraining loop trains (``PRETRAINABLE``): how each is built, fed, exported and recorded.

One :class:`Pretrainable` per small model (pfn-mini, tabicl-mini, tabpfn-mini): its adapter and constructor
config, its training defaults, the file its weights are exported to and how, the package versions its record
names and, where the package has one, its own scikit-learn classifier on the exported file. ``build`` makes
the model at its seeded random init; ``logits_of`` is the forward the loss and the evaluation run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from iclmem.atomic import atomic_write
from iclmem.errors import ConfigError
from iclmem.registry import Registry
from trainables.models.base import ModelAdapter
from trainables.models.checkpoints import MINI_CHECKPOINTS
from trainables.models.pretrain_prior import DRAW_WIDTH, POOL_TABLES

if TYPE_CHECKING:
    from trainables.models.pfn_mini import PfnMini

LogitsOf = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# ----------------------------------------------------------------------------------------- the models
@dataclass(frozen=True)
class TrainingDefaults:
    """A model's training settings when the command line gives none."""

    steps: int  # optimizer steps of the run (about one CPU hour; the cosine schedule spans them)
    batch_size: int  # tables per optimizer step (at most a pool batch's POOL_TABLES from the pool)
    # tables per forward/backward pass, the step's gradients accumulating over its passes; None: one pass
    micro_batch: int | None = None
    lr: float = 1e-3


@dataclass(frozen=True)
class Pretrainable:
    """One model the loop trains: how to build it, feed it, export it and record it."""

    name: str
    adapter: str  # the registered adapter (``build_model`` name) that builds, runs and exports the module
    config: Mapping[str, Any]  # constructor options of the model's own class
    defaults: TrainingDefaults
    weights_file: str  # the export's file name (the JSON record takes its stem)
    write_weights: Callable[[ModelAdapter, Path], Path]
    versions: tuple[str, ...]  # the packages whose versions the record names
    # pfn-mini reads exactly this many feature columns (zero padded); None: the model reads any width, and
    # batches are cut to their widest live column (padding is compute spent on nothing)
    fixed_width: int | None = None
    # the package's own scikit-learn classifier on an exported file, or None (pfn-mini has none)
    package_classifier: Callable[[Path], Any] | None = None
    export_format: str = ""


def _write_pfn_mini(adapter: ModelAdapter, path: Path) -> Path:
    from safetensors.torch import save_file

    module = cast("PfnMini", adapter.module)
    tensors = {k: v.detach().contiguous().clone() for k, v in module.state_dict().items()}
    metadata = {"config": json.dumps(module.config.to_dict())}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata), to_path=True)
    return path


def _write_package_checkpoint(adapter: ModelAdapter, path: Path) -> Path:
    # The adapters' own writer: the package's {"config", "state_dict"} file its loaders and fine-tuners read.
    write = getattr(adapter, "package_checkpoint", None)
    if write is None:
        raise ConfigError(f"the {adapter.name!r} adapter writes no package checkpoint")
    return Path(write(path))


def _tabicl_classifier(path: Path) -> Any:
    from tabicl import TabICLClassifier

    return TabICLClassifier(model_path=str(path), allow_auto_download=False, device="cpu")


def _tabpfn_classifier(path: Path) -> Any:
    from tabpfn import TabPFNClassifier

    return TabPFNClassifier(model_path=str(path), device="cpu")


PRETRAINABLE: Registry[Pretrainable] = Registry("pretrainable model")

PRETRAINABLE.register("pfn-mini", Pretrainable(
    name="pfn-mini", adapter="pfn-mini", config={}, fixed_width=DRAW_WIDTH,
    defaults=TrainingDefaults(steps=6000, batch_size=POOL_TABLES),
    weights_file="pfn_mini.safetensors", write_weights=_write_pfn_mini,
    versions=("torch", "numpy", "tabicl", "scikit-learn", "xgboost-cpu"),
    export_format="safetensors, config in the metadata (build_model('pfn-mini', weights=FILE))",
))

PRETRAINABLE.register("tabicl-mini", Pretrainable(
    name="tabicl-mini", adapter="tabicl",
    # TabICL v2's layout (the constructor's defaults: col_feature_group "same", target-aware columns,
    # qassmax-mlp-elementwise scalable softmax), with v2's two switches that differ from those defaults
    # (split-half RoPE, standard init); small: embeddings 16 wide, one column and one row block, 4 CLS tokens,
    # so the ICL transformer (4 blocks, 4 heads) is 64 wide.
    config={"max_classes": 10, "embed_dim": 16, "col_num_blocks": 1, "col_nhead": 2, "col_num_inds": 16,
            "row_num_blocks": 1, "row_nhead": 2, "row_num_cls": 4, "icl_num_blocks": 4, "icl_nhead": 4,
            "ff_factor": 2, "row_rope_interleaved": False, "zero_init": False},
    # 4 micro-batches of 8 tables: 0.74 s per step against 0.95 s in one pass of 32 on this CPU
    defaults=TrainingDefaults(steps=4400, batch_size=POOL_TABLES, micro_batch=8),
    weights_file=MINI_CHECKPOINTS["tabicl"], write_weights=_write_package_checkpoint,
    versions=("torch", "numpy", "tabicl", "scikit-learn", "xgboost-cpu"),
    package_classifier=_tabicl_classifier,
    export_format="tabicl's checkpoint: {'config', 'state_dict'} saved by torch (TabICLClassifier(model_path=FILE))",
))

PRETRAINABLE.register("tabpfn-mini", Pretrainable(
    name="tabpfn-mini", adapter="tabpfn-v2",
    # TabPFN v2's architecture (features in groups of 2, attention between features and between rows in every
    # layer), small: 32 wide, 4 layers of 2 heads.
    config={"max_num_classes": 10, "emsize": 32, "nlayers": 4, "nhead": 2, "features_per_group": 2},
    # every layer runs on every cell, so a step takes 16 tables to stay near a second
    defaults=TrainingDefaults(steps=3500, batch_size=16, lr=3e-3),
    weights_file=MINI_CHECKPOINTS["tabpfn-v2"], write_weights=_write_package_checkpoint,
    versions=("torch", "numpy", "tabicl", "tabpfn", "scikit-learn", "xgboost-cpu"),
    package_classifier=_tabpfn_classifier,
    export_format="tabpfn's v2 checkpoint: {'config', 'state_dict'} saved by torch (TabPFNClassifier(model_path=FILE))",
))


def build(spec: Pretrainable, seed: int) -> ModelAdapter:
    """The model at its seeded random init, in training mode."""
    from trainables.models import build_model

    adapter = build_model(spec.adapter, weights="random", seed=seed, **spec.config)
    adapter.module.train()
    return adapter


def logits_of(adapter: ModelAdapter) -> LogitsOf:
    """(context_x [B, N, F], context_y [B, N], query_x [B, M, F]) -> unnormalised scores [B, M, max_classes].

    The adapter's own forward, unnormalised: the loss masks each table's absent classes itself, and pfn-mini's
    recorded run computed its loss from exactly these scores."""
    return adapter._logits

