"""Adapter for TabICL (Qu et al.), through the installed ``tabicl`` package's own model class.

* Weights: an official checkpoint file (``.ckpt`` with ``config`` + ``state_dict``, loaded with
  ``weights_only=True``), a safetensors file written by this adapter, ``"random"`` (seeded init of the
  real architecture, any constructor option), or ``"hub"``: the official checkpoint from the local
  Hugging Face cache, downloaded only with ``allow_download=True``. A missing local file fails at once.
* Scores: the raw module below ``TabICLClassifier`` -- no ensembling, feature shuffles or preprocessing
  (iclmem fits preprocessing once per task). The forward composes the module's column embedder, row
  interactor and ICL predictor exactly as ``TabICL._train_forward`` does, in float32 with autocast off
  (TabICL's inference path autocasts to bf16 on CPU), and returns all ``max_classes`` logits so label
  ``j`` is always output column ``j``: the wrapper's label encoder and its slicing to the classes
  present in the context are bypassed, so duplicating or dropping context rows never moves a label.
  The result equals ``TabICL.forward`` in eval mode with AMP off whenever every label is present.
* Regression checkpoints (``max_classes == 0``) predict quantiles; ``candidate_log_probs`` turns them
  into TabICL's own ``QuantileDistribution`` and scores candidate values (``candidate_log_probs``).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, cast

import torch

from iclmem.atomic import atomic_write
from iclmem.errors import CheckpointError, ModelError
from iclmem.vocab import InputContract, Recipe
from trainables.models.base import MODELS, Invariance, NativeRegressionAdapter, read_weights
from trainables.models.checkpoints import DEFAULT_WEIGHTS, DefaultWeights, checkpoint_file, hub_checkpoint
from trainables.models.estimator import PackageScoring, recipe_options
from trainables.models.extras import float32_compute, register_extra, require_extra, saved_options

NAME = "tabicl"
EXTRA = "tabicl"
HUB_REPO = "jingang/TabICL"
DEFAULT_CHECKPOINTS = {
    "classification": "tabicl-classifier-v2-20260212.ckpt",
    "regression": "tabicl-regressor-v2-20260212.ckpt",
}
# TabICL has no architectural feature limit; this caps what a sweep may ask of it.
DEFAULT_MAX_FEATURES = 500
TASKS = ("classification", "regression")

register_extra(NAME, EXTRA, ("tabicl",), ("tabicl",))


class TabICLAdapter(PackageScoring, NativeRegressionAdapter):
    name = NAME
    # Numbers, unreduced: PCA only when the encoded table exceeds this model's own feature limit.
    input_contract = InputContract.NUMERIC
    # No positional encoding over rows (RoPE in the row interactor runs over columns). Repeating every
    # row is not a symmetry: the column embedder's outputs move (tests/test_invariance.py measures it).
    invariances = frozenset({Invariance.ROW_ORDER})
    regressor_hint = ("this TabICL checkpoint is a regressor (max_classes=0): score target values with "
                      "candidate_log_probs (the adapter API; sweeps score regression targets as quantile bins), or load a classifier checkpoint for binned targets")

    def __init__(self, module: torch.nn.Module, options: dict[str, Any] | None = None) -> None:
        super().__init__(module, options)
        self.task = "regression" if int(cast(Any, module).max_classes) == 0 else "classification"
        self.max_classes = int(cast(Any, module).max_classes)
        self.max_features = int(self.options.get("max_features", DEFAULT_MAX_FEATURES))
        self.softmax_temperature = float(self.options.get("softmax_temperature", 1.0))

    # -------------------------------------------------------------------------------- forward
    def _forward(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor) -> torch.Tensor:
        """[B, M, out_dim] raw outputs (class logits or quantiles), float32, autocast off."""
        n_context = context_y.shape[1]
        x = torch.cat([context_x, query_x], dim=1)
        y = context_y.float()
        m: Any = self.module
        with float32_compute(x.device):
            # TabICL._train_forward, called per stage so the module's train/eval flag only toggles dropout
            # (its eval path would route through the autocasting InferenceManager).
            embeddings = m.col_embedder._train_forward(x, y, None, False)
            representations = m.row_interactor._train_forward(embeddings, None)
            out: torch.Tensor = m.icl_predictor._icl_predictions(representations, y)
        return out[:, n_context:].float()

    def _require_regressor(self) -> None:
        if self.task != "regression":
            raise ModelError("candidate_log_probs needs a TabICL regression checkpoint (max_classes=0)")

    # recipe upstream (trainables.upstream): the weights as tabicl's own estimator deploys them
    def package_checkpoint(self, path: str | Path) -> Path:
        """These weights in tabicl's checkpoint format (``{"config", "state_dict"}``, what ``TabICLClassifier
        (model_path=...)`` and the package's fine-tuner load)."""
        state = {k: v.detach().cpu() for k, v in self.module.state_dict().items()}
        atomic_write(Path(path), lambda tmp: torch.save({"config": self.options["config"], "state_dict": state}, tmp),
                     to_path=True)
        return Path(path)

    # the seed of the deployed classifier's ensemble (its class shifts, feature shuffles, normalisations): set by
    # trainables.upstream to the run's seed while it scores a run as deployed; None: the ``seed`` option
    deployed_random_state: int | None = None

    def package_estimator(self, model_path: str) -> Any:
        """An unfitted ``TabICLClassifier`` on ``model_path`` with the recipe's ensemble, no download. Under recipe
        upstream it is the classifier ``FinetunedTabICLClassifier`` deploys after fitting (its ``_final_estimator_``),
        built by the fine-tuner's own ``_create_inner_estimator`` from the ``finetuner`` option: the model's
        ``n_estimators`` members (its ``n_estimators_inference``), its ``norm_methods``, ``feat_shuffle_method``,
        ``class_shuffle_method``, ``outlier_threshold``, ``softmax_temperature``, ``average_logits``,
        ``support_many_classes`` and ``extra_classifier_kwargs``, and the run's seed as ``random_state``
        (:attr:`deployed_random_state`, else the ``seed`` option)."""
        from tabicl import TabICLClassifier

        n_estimators = int(self.options.get("n_estimators", 8))
        if self.options.get("recipe") == Recipe.UPSTREAM.value:
            from tabicl._finetune import FinetunedTabICLClassifier

            seed = self.deployed_random_state
            finetuner = FinetunedTabICLClassifier(
                **dict(self.options.get("finetuner") or {}), model_path=model_path, allow_auto_download=False,
                verbose=False, n_estimators_inference=n_estimators, device=str(self.device),
                random_state=int(self.options.get("seed", 0) if seed is None else seed))
            return finetuner._create_inner_estimator(n_estimators=n_estimators, device=self.device)
        return TabICLClassifier(model_path=model_path, n_estimators=n_estimators,
                                allow_auto_download=False, device=str(self.device),
                                random_state=int(self.options.get("seed", 0)))

    def label_ids(self, context_y: torch.Tensor) -> torch.Tensor:
        """The class ids the network sees for ``context_y``: the labels themselves (one fixed mapping)."""
        return context_y.long()

    def _candidate_log_density(self, outputs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """TabICL's ``QuantileDistribution`` over the predicted quantiles [B, M, Q]."""
        log_density: torch.Tensor = cast(Any, self.module).quantile_dist(outputs).log_prob(z)
        return log_density


# ------------------------------------------------------------------------------------------ loading
def _full_config(tabicl_cls: type[Any], config: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments with the installed tabicl's defaults filled in (stored with saved weights)."""
    params = inspect.signature(tabicl_cls.__init__).parameters
    unknown = sorted(set(config) - set(params) - {"self"})
    if unknown:
        raise ModelError(f"unknown TabICL option(s) {unknown}; TabICL takes {sorted(set(params) - {'self'})}")
    full = {k: p.default for k, p in params.items() if k != "self" and p.default is not inspect.Parameter.empty}
    full.update(config)
    return full


def _read_checkpoint(path: Path) -> tuple[dict[str, Any] | None, dict[str, torch.Tensor]]:
    """(architecture config or None, state dict) from an official .ckpt or an iclmem safetensors file."""
    if path.suffix == ".safetensors":
        options = saved_options(path, NAME)
        return options.get("config"), read_weights(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path} is not a TabICL checkpoint readable with weights_only=True: {exc}") from exc
    if not isinstance(checkpoint, dict) or "config" not in checkpoint or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} is not a TabICL checkpoint (expected a dict with 'config' and 'state_dict')")
    return dict(checkpoint["config"]), checkpoint["state_dict"]


def _official_checkpoint(task: str | None = None, checkpoint_version: str | None = None,
                         allow_download: bool = False, **_options: Any) -> Path:
    return hub_checkpoint(HUB_REPO, checkpoint_version or DEFAULT_CHECKPOINTS[task or "classification"],
                          allow_download=allow_download)


DEFAULT_WEIGHTS.register(NAME, DefaultWeights(
    weights="hub", source=f"{HUB_REPO}: {DEFAULT_CHECKPOINTS['classification']} (regressor: "
                          f"{DEFAULT_CHECKPOINTS['regression']})",
    licence="TabICL's released weights, under the terms on their Hugging Face model card",
    locate=_official_checkpoint))


@MODELS.decorator(NAME)
def build_tabicl(
    weights: str | None = "hub",
    task: str | None = None,
    checkpoint_version: str | None = None,
    allow_download: bool = False,
    seed: int = 0,
    softmax_temperature: float = 1.0,
    max_features: int = DEFAULT_MAX_FEATURES,
    recipe: str = "iclmem",
    n_estimators: int | None = None,
    finetuner: dict[str, Any] | None = None,
    **config: Any,
) -> TabICLAdapter:
    """TabICL classifier or regressor.

    ``weights``: a checkpoint path, ``"random"`` (seeded init; ``config`` = TabICL constructor options,
    e.g. ``embed_dim=16, icl_num_blocks=1``), or ``"hub"`` (``checkpoint_version`` of
    ``jingang/TabICL`` from the local HF cache; fetched only with ``allow_download=True``).
    ``task`` defaults to what the checkpoint is (``max_classes == 0`` means regression).
    ``softmax_temperature`` divides the logits (TabICLClassifier uses 0.9; default 1 = raw logits).
    ``recipe="upstream"``: fine-tuned by tabicl's ``FinetunedTabICLClassifier`` (``trainables.upstream``), its
    utility scored as that fine-tuner deploys the weights (``TabICLClassifier`` with ``n_estimators`` members,
    default 8, the package's, and the ensemble settings of ``finetuner``: ``package_estimator``);
    ``finetuner``: that fine-tuner's settings other than the sweep's.
    """
    if task is not None and task not in TASKS:
        raise ModelError(f"task must be one of {TASKS}, got {task!r}")
    if softmax_temperature <= 0:
        raise ModelError(f"softmax_temperature must be positive, got {softmax_temperature}")
    weights = "random" if weights is None else str(weights)
    path = None if weights in ("random", "hub") else checkpoint_file(NAME, weights)  # fail before any import
    require_extra("tabicl", EXTRA)
    from tabicl._model.tabicl import TabICL

    if weights == "random":
        cfg = dict(config)
        if task == "regression":
            cfg.setdefault("max_classes", 0)
        cfg = _full_config(TabICL, cfg)
        state = None
    else:
        if weights == "hub":
            path = _official_checkpoint(task, checkpoint_version, allow_download)
        assert path is not None
        stored, state = _read_checkpoint(path)
        if stored is None and not config:
            raise CheckpointError(f"{path} carries no TabICL config; pass the architecture options it was built with")
        cfg = _full_config(TabICL, stored if stored is not None else config)
        clashes = {k: (v, cfg.get(k)) for k, v in config.items() if k in cfg and cfg[k] != v}
        if clashes:
            raise ModelError(f"options {clashes} (given, stored) disagree with the checkpoint {path}")
    checkpoint_task = "regression" if int(cfg["max_classes"]) == 0 else "classification"
    if task is not None and task != checkpoint_task:
        raise ModelError(f"task={task!r} but the TabICL {'checkpoint' if state is not None else 'config'} is a "
                         f"{checkpoint_task} model (max_classes={cfg['max_classes']})")

    torch.manual_seed(seed)
    module = TabICL(**cfg)
    if state is not None:
        try:
            module.load_state_dict(state)
        except RuntimeError as exc:
            raise CheckpointError(f"{path} does not match the TabICL architecture: {exc}") from exc
    module.eval()
    options = {
        "weights": weights,
        "task": checkpoint_task,
        "seed": seed,
        "softmax_temperature": softmax_temperature,
        "max_features": max_features,
        "config": json.loads(json.dumps(cfg, default=str)),
    }
    if weights == "hub":
        options["checkpoint_version"] = checkpoint_version or DEFAULT_CHECKPOINTS[checkpoint_task]
    # the deployed ensemble: FinetunedTabICLClassifier's n_estimators_inference default
    options.update(recipe_options(NAME, recipe, n_estimators, finetuner, checkpoint_task, 8))
    return TabICLAdapter(module, options)
