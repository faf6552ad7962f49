"""Adapter for TabPFN v2 (Hollmann et al., Nature 2025), through the installed ``tabpfn`` package.

* Weights: an official v2 checkpoint file loaded by ``tabpfn.model_loading.load_model`` (the package's
  own loader: architecture from the checkpoint config, key translation, criterion borders), a
  safetensors file written by this adapter, ``"random"`` (seeded init of the real ``TabPFNV2``
  architecture with any config option), or ``"hub"``: the default v2 checkpoint from TabPFN's model
  cache or the local Hugging Face cache, downloaded (by tabpfn's own code) only with
  ``allow_download=True``. A missing local file fails at once. tabpfn 9.x has no telemetry module; the
  adapter still sets ``TABPFN_DISABLE_TELEMETRY=1`` (honoured by older releases) before importing it.
* Scores: raw logits of the architecture below ``TabPFNClassifier`` -- no ensemble, preprocessing
  pipeline, class permutation or temperature (``softmax_temperature`` option, default 1), so batching,
  preprocessing and label order stay iclmem's. Computed in float32 with autocast off.
* Labels: TabPFN v2 densifies class labels by rank among the labels present in the context. With
  ``densify_labels=False`` (default) that step is skipped, so label ``j`` always enters the target
  encoder as ``j`` and leaves as output column ``j``; when every label is present in the context the
  two are identical, and when one is missing the others keep their index.
* Caveat (architecture, not wrapper): the v2 encoder removes features that are constant over all rows
  and standardises features on the context rows; a probe context of identical rows therefore carries
  its information in the labels and the varying (distractor) columns only.
* ``recipe="upstream"`` (a sweep's ``models: [{name: tabpfn-v2, recipe: upstream}]``, fine-tuned by
  ``tabpfn.finetuning.FinetunedTabPFNClassifier``, see ``trainables.upstream``): ``deployed_log_probs`` scores
  the weights as the package deploys them -- each context one ``TabPFNClassifier.fit`` on these weights, its
  queries one ``predict_proba`` -- for the run's utility (in-context accuracy with C'). That classifier is the
  one the fine-tuner deploys after fitting (``deployed_settings``): its ``n_estimators``-member ensemble
  (``n_estimators_final_inference``), the ``extra_classifier_kwargs`` and ``inference_config`` of the
  ``finetuner`` option (class and feature shifts, preprocessing), and the run's seed as ``random_state`` (the
  seed the fine-tuner drew its fitted ensemble from). The probe's zero-information
  contexts repeat the query row, which the package refuses ("All features are constant"), so the probe
  scores the network as for every run.
* Regression checkpoints output a bar distribution; ``candidate_log_probs`` scores candidate values
  with tabpfn's ``FullSupportBarDistribution`` (``candidate_log_probs``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from iclmem.atomic import atomic_write
from iclmem.errors import CheckpointError, ModelError
from iclmem.vocab import InputContract, Recipe
from trainables.models.base import MODELS, Invariance, NativeRegressionAdapter, read_weights
from trainables.models.checkpoints import DEFAULT_WEIGHTS, DefaultWeights, checkpoint_file, not_cached
from trainables.models.estimator import PackageScoring, recipe_options
from trainables.models.extras import float32_compute, register_extra, require_extra, safetensors_metadata, saved_options

NAME = "tabpfn-v2"
EXTRA = "tabpfn"
ARCHITECTURE = "tabpfn_v2"
# TabPFN v2's documented limits (the architecture itself has no hard feature cap).
DEFAULT_MAX_FEATURES = 500
# the ensemble of the estimator FinetunedTabPFNClassifier deploys after fine-tuning (n_estimators_final_inference)
DEFAULT_DEPLOYED_N_ESTIMATORS = 2
TASKS = ("classification", "regression")
ESTIMATOR = {"classification": "classifier", "regression": "regressor"}

register_extra(NAME, EXTRA, ("tabpfn",), ("tabpfn",))


def _import_tabpfn() -> None:
    os.environ.setdefault("TABPFN_DISABLE_TELEMETRY", "1")
    require_extra("tabpfn", EXTRA)


def classifier_kwargs(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """A fine-tuner's ``extra_classifier_kwargs`` (a sweep file's mapping) as ``TabPFNClassifier`` takes them: a
    deep copy, each mapping in ``inference_config.PREPROCESS_TRANSFORMS`` made tabpfn's ``PreprocessorConfig``
    (``tabpfn.preprocessing.PreprocessorConfig``; YAML gives ``{name: none, categorical_name: numeric}``). The
    settings are checked before any work by ``trainables.upstream_recipes.check_finetuner_settings``."""
    out = copy.deepcopy(dict(extra or {}))
    config = out.get("inference_config")
    if isinstance(config, Mapping) and config.get("PREPROCESS_TRANSFORMS") is not None:
        _import_tabpfn()
        from tabpfn.preprocessing import PreprocessorConfig

        out["inference_config"] = {**config, "PREPROCESS_TRANSFORMS": [
            PreprocessorConfig(**step) if isinstance(step, Mapping) else step
            for step in config["PREPROCESS_TRANSFORMS"]]}
    return out


class TabPFNV2Adapter(PackageScoring, NativeRegressionAdapter):
    name = NAME
    # Numbers, unreduced: PCA only when the encoded table exceeds this model's own feature limit.
    input_contract = InputContract.NUMERIC
    # Attention between items has no positional encoding, and densified labels rank the labels present,
    # which no reordering changes. Only row order is declared.
    invariances = frozenset({Invariance.ROW_ORDER})
    normalizes_over_context = True
    regressor_hint = ("this TabPFN v2 model is a regressor: score target values with candidate_log_probs "
                      "(the adapter API; sweeps score regression targets as quantile bins), or load a classifier checkpoint for binned targets")

    def __init__(
        self,
        module: torch.nn.Module,
        options: dict[str, Any] | None = None,
        criterion: torch.nn.Module | None = None,
    ) -> None:
        super().__init__(module, options)
        self.task = str(self.options.get("task", "classification"))
        self.criterion = criterion  # FullSupportBarDistribution for regressors, not part of the weights
        config = self.options.get("config", {})
        self.max_classes = int(config.get("max_num_classes", 0)) if self.task == "classification" else 0
        self.max_features = int(self.options.get("max_features", DEFAULT_MAX_FEATURES))
        self.softmax_temperature = float(self.options.get("softmax_temperature", 1.0))
        self.n_estimators = int(self.options.get("n_estimators", DEFAULT_DEPLOYED_N_ESTIMATORS))
        cast(Any, module).use_multiclass_target_encoding = (bool(self.options.get("densify_labels", False))
                                                            and self.task == "classification")

    # -------------------------------------------------------------------------------- scored as deployed
    def package_checkpoint(self, path: str | Path) -> Path:
        """These weights in tabpfn's own checkpoint format (``{"config", "state_dict"}``, what
        ``TabPFNClassifier(model_path=...)`` and the package's fine-tuner load)."""
        state = {k: v.detach().cpu() for k, v in self.module.state_dict().items()}
        atomic_write(Path(path), lambda tmp: torch.save({"config": self.options["config"], "state_dict": state}, tmp),
                     to_path=True)
        return Path(path)

    # the seed of the deployed classifier's ensemble (its class shifts, feature shuffles, preprocessing): set by
    # trainables.upstream to the run's seed while it scores a run as deployed; None: the ``seed`` option
    deployed_random_state: int | None = None

    def package_estimator(self, model_path: str) -> Any:
        """An unfitted ``TabPFNClassifier`` on ``model_path``, configured as the recipe deploys it: under recipe
        upstream, the classifier ``FinetunedTabPFNClassifier`` deploys after fitting (:meth:`deployed_settings`)."""
        from tabpfn import TabPFNClassifier

        if self.options.get("recipe") == Recipe.UPSTREAM.value:
            return TabPFNClassifier(model_path=model_path, **self.deployed_settings())
        return TabPFNClassifier(model_path=model_path, n_estimators=self.n_estimators, device=str(self.device),
                                random_state=int(self.options.get("seed", 0)), ignore_pretraining_limits=True)

    def deployed_settings(self) -> dict[str, Any]:
        """The keywords (but ``model_path``) of the ``TabPFNClassifier`` that ``FinetunedTabPFNClassifier``
        deploys after fitting (``finetuned_inference_classifier_``, tabpfn 9.2 ``finetuned_base._fit``
        ``final_inference_eval_config``): the user's ``extra_classifier_kwargs`` of the ``finetuner`` option, its
        ``inference_config`` with the fine-tuner's own settings over it (no GPU preprocessing, no text or date
        transforms, ``SUBSAMPLE_SAMPLES`` its ``n_inference_subsample_samples``), ``n_estimators`` members (its
        ``n_estimators_final_inference``), pretraining limits ignored, ``random_state`` the run's seed
        (:attr:`deployed_random_state`, else the ``seed`` option)."""
        finetuner = dict(self.options.get("finetuner") or {})
        extra = classifier_kwargs(finetuner.get("extra_classifier_kwargs"))
        extra.pop("model_path", None)
        inference = dict(extra.pop("inference_config", None) or {})
        inference.update(ENABLE_GPU_PREPROCESSING=False, TRANSFORM_TEXT=False, TRANSFORM_DATES=False,
                         SUBSAMPLE_SAMPLES=finetuner.get("n_inference_subsample_samples"))
        seed = self.deployed_random_state
        return {**extra, "ignore_pretraining_limits": True, "device": str(self.device),
                "random_state": int(self.options.get("seed", 0) if seed is None else seed),
                "inference_config": inference, "n_estimators": self.n_estimators}

    # -------------------------------------------------------------------------------- forward
    def _forward(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor) -> torch.Tensor:
        """[B, M, n_out] raw decoder outputs, float32, autocast off."""
        x = torch.cat([context_x, query_x], dim=1).transpose(0, 1)  # [N+M, B, F], TabPFN is rows-first
        y = context_y.float().transpose(0, 1)  # [N, B]
        with float32_compute(x.device), self._frozen_feature_statistics(getattr(self, "_reference_x", None)):
            out: torch.Tensor = self.module(x, y, only_return_standard_out=True)  # [M, B, n_out]
        return out.transpose(0, 1).float()

    @contextlib.contextmanager
    def _frozen_feature_statistics(self, reference_x: torch.Tensor | None) -> Iterator[None]:
        """TabPFN v2 fits its feature preprocessing on every forward: which features are constant (over
        all rows), the imputation means and the standard scaler (over the context rows), the feature-group
        scaling. With ``reference_x`` [B, R, F] those statistics are fitted on the reference rows once,
        through the architecture's own ``_embed_features``, and the forward reuses them (its cached-inference
        path, ``feature_cache``), so a probe context whose rows all repeat the query still shows the model
        the query's features, standardised as the fine-tuning context C' would standardise them."""
        if reference_x is None:
            yield
            return
        module: Any = self.module
        reference = reference_x.float().to(self.device).transpose(0, 1)  # [R, B, F]
        x_rsf, groups, _rows, batch = module._pad_and_group_features(reference)
        _, fitted = module._embed_features(x_rsf, num_train_labels=reference.shape[0], num_feature_groups=groups,
                                           batch_size=batch)
        embed = module._embed_features

        def with_reference_statistics(x: torch.Tensor, **kwargs: Any) -> Any:
            return embed(x, **{**kwargs, "feature_cache": fitted})

        module._embed_features = with_reference_statistics  # an instance attribute over the method
        try:
            yield
        finally:
            del module._embed_features

    def _require_regressor(self) -> None:
        if self.task != "regression" or self.criterion is None:
            raise ModelError("candidate_log_probs needs a TabPFN v2 regression checkpoint")

    def label_ids(self, context_y: torch.Tensor) -> torch.Tensor:
        """The class ids the network sees for ``context_y`` (the labels themselves unless densifying)."""
        if not self.module.use_multiclass_target_encoding:
            return context_y.long()
        return torch.stack([torch.searchsorted(torch.unique(row), row) for row in context_y.long()])

    def _candidate_log_density(self, outputs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """tabpfn's bar distribution over the bucket logits [B, M, buckets]; the criterion returns
        -log density, one call per candidate to keep memory at [B, M, buckets]."""
        assert self.criterion is not None  # candidate_log_probs calls _require_regressor first
        criterion = self.criterion.to(outputs.device)
        return torch.stack([-criterion(outputs, z[..., c]) for c in range(z.shape[-1])], dim=-1)

    # -------------------------------------------------------------------------------- weights
    # A regressor's bucket borders travel with its weights (they are not module state): a probe actor's
    # reference model is built from skeleton_options (random borders) and gets the real ones here.
    BORDERS_KEY = "__criterion__.borders"

    def state_arrays(self) -> dict[str, np.ndarray]:
        arrays = super().state_arrays()
        if self.criterion is not None:
            arrays[self.BORDERS_KEY] = cast(torch.Tensor, self.criterion.borders).detach().cpu().numpy()
        return arrays

    def load_state_arrays(self, arrays: dict[str, np.ndarray], copy: bool = True) -> None:
        arrays = dict(arrays)
        borders = arrays.pop(self.BORDERS_KEY, None)
        super().load_state_arrays(arrays, copy=copy)
        if borders is not None:
            from tabpfn.architectures.shared.bar_distribution import FullSupportBarDistribution

            self.criterion = FullSupportBarDistribution(torch.tensor(np.array(borders)))

    def metadata(self) -> dict[str, str]:
        meta = super().metadata()
        meta["architecture_name"] = ARCHITECTURE
        if self.criterion is not None:
            borders = cast(torch.Tensor, self.criterion.borders).detach().cpu()
            meta["regression_borders"] = json.dumps({"dtype": str(borders.dtype).removeprefix("torch."),
                                                     "values": borders.tolist()})
        return meta


# ------------------------------------------------------------------------------------------ loading
def _parse_config(config: dict[str, Any]) -> Any:
    from tabpfn.architectures import tabpfn_v2

    try:
        parsed, _unused = tabpfn_v2.parse_config(config)
    except Exception as exc:  # pydantic.ValidationError
        raise ModelError(f"invalid TabPFN v2 config {config}: {exc}") from exc
    return parsed


def _config_dict(parsed: Any) -> dict[str, Any]:
    import dataclasses

    return cast(dict[str, Any], json.loads(json.dumps(dataclasses.asdict(parsed), default=str)))


def _random_borders(num_buckets: int) -> torch.Tensor:
    """Borders for a randomly initialised regressor: equal-width buckets over [-4, 4] (z-scored targets)."""
    return torch.linspace(-4.0, 4.0, num_buckets + 1)


def _hub_path(task: str, allow_download: bool) -> Path:
    """The default v2 checkpoint from TabPFN's cache or the local HF cache; tabpfn downloads it if allowed."""
    from tabpfn.constants import ModelVersion
    from tabpfn.model_loading import ModelSource, download_model, get_cache_dir

    source = ModelSource.get_classifier_v2() if task == "classification" else ModelSource.get_regressor_v2()
    path: Path = get_cache_dir() / source.default_filename
    if path.is_file():
        return path
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(source.repo_id, source.default_filename, local_files_only=True))
    except Exception:
        pass
    if not allow_download:
        raise not_cached(f"the TabPFN v2 {ESTIMATOR[task]} checkpoint {source.default_filename!r} of "
                         f"{source.repo_id!r} (nor in TabPFN's cache {path.parent})")
    path.parent.mkdir(parents=True, exist_ok=True)
    result = download_model(path, version=ModelVersion.V2, which=ESTIMATOR[task], model_name=source.default_filename)
    if result != "ok" or not path.is_file():
        raise CheckpointError(f"could not download the TabPFN v2 {ESTIMATOR[task]} checkpoint to {path}: {result}")
    return path


def _load_official(path: Path, task: str | None) -> tuple[torch.nn.Module, Any, dict[str, Any], str]:
    """(module, criterion or None, config dict, task) via tabpfn's own checkpoint loader."""
    from tabpfn import model_loading
    from tabpfn.architectures.tabpfn_v2 import TabPFNV2
    from tabpfn.checkpoint import Checkpoint

    try:
        resolved = str(path.resolve())
        # Read through tabpfn's own (LRU-cached) reader so load_model below does not read the file again.
        cached = getattr(model_loading, "_load_checkpoint_cached", None)
        checkpoint = cached(resolved, Checkpoint(resolved).identity()) if cached else Checkpoint(resolved).load()
    except Exception as exc:
        raise CheckpointError(f"{path} is not a readable TabPFN checkpoint: {exc}") from exc
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint or "config" not in checkpoint:
        raise CheckpointError(f"{path} is not a TabPFN checkpoint (expected 'config' and 'state_dict')")
    architecture = checkpoint.get("architecture_name", ARCHITECTURE)
    if architecture != ARCHITECTURE:
        raise ModelError(f"{path} is a TabPFN {architecture!r} checkpoint; the {NAME!r} adapter loads v2 checkpoints only")
    if task is None:
        has_borders = any("criterion." in k for k in checkpoint["state_dict"])
        task = "regression" if has_borders else "classification"
    try:
        module, criterion, config, _inference_config = model_loading.load_model(
            path=path, estimator_type=ESTIMATOR[task]
        )
    except Exception as exc:
        raise CheckpointError(f"tabpfn could not load {path} as a {ESTIMATOR[task]}: {exc}") from exc
    finally:
        if cached is not None:
            cached.cache_clear()  # the raw checkpoint need not outlive the built module
    cache_size = getattr(model_loading, "_get_built_model_cache_size", lambda: 0)()
    if cache_size > 0:
        # tabpfn's built-model cache (TABPFN_MODEL_CACHE_SIZE) shares modules by reference; fine-tuning
        # this one must not reach other holders.
        module = copy.deepcopy(module)
    if not isinstance(module, TabPFNV2):
        raise ModelError(f"{path} did not load as a TabPFN v2 architecture (got {type(module).__name__})")
    return module, criterion if task == "regression" else None, _config_dict(config), task


def _load_saved(path: Path, task: str | None) -> tuple[torch.nn.Module, Any, dict[str, Any], str]:
    """A safetensors file written by this adapter: config and borders in the metadata."""
    from tabpfn.architectures import tabpfn_v2
    from tabpfn.architectures.shared.bar_distribution import FullSupportBarDistribution

    options = saved_options(path, NAME)
    if "config" not in options:
        raise CheckpointError(f"{path} carries no TabPFN v2 config in its metadata (not written by the {NAME} adapter?)")
    stored_task = options.get("task", "classification")
    if task is not None and task != stored_task:
        raise ModelError(f"task={task!r} but {path} holds a TabPFN v2 {stored_task} model")
    module = tabpfn_v2.get_architecture(_parse_config(options["config"]))
    try:
        module.load_state_dict(read_weights(path))
    except RuntimeError as exc:
        raise CheckpointError(f"{path} does not match the TabPFN v2 architecture: {exc}") from exc
    criterion = None
    if stored_task == "regression":
        raw = safetensors_metadata(path).get("regression_borders")
        if raw is None:
            raise CheckpointError(f"{path} is a TabPFN v2 regressor without regression_borders in its metadata")
        spec = json.loads(raw)
        borders = torch.tensor(spec["values"], dtype=getattr(torch, spec.get("dtype", "float32")))
        criterion = FullSupportBarDistribution(borders)
    return module, criterion, dict(options["config"]), stored_task


def _official_checkpoint(task: str | None = None, allow_download: bool = False, **_options: Any) -> Path:
    require_extra("tabpfn", EXTRA)
    return _hub_path(task or "classification", allow_download)


DEFAULT_WEIGHTS.register(NAME, DefaultWeights(
    weights="hub", source="Prior-Labs/TabPFN-v2-clf and -reg: tabpfn's default v2 checkpoints",
    licence="Prior Labs' TabPFN licence (its own terms, not Apache-2.0: read it on the model card)",
    locate=_official_checkpoint))


@MODELS.decorator(NAME)
def build_tabpfn_v2(
    weights: str | None = "hub",
    task: str | None = None,
    allow_download: bool = False,
    seed: int = 0,
    softmax_temperature: float = 1.0,
    densify_labels: bool = False,
    max_features: int = DEFAULT_MAX_FEATURES,
    recipe: str = Recipe.ICLMEM.value,
    n_estimators: int | None = None,
    finetuner: dict[str, Any] | None = None,
    **config: Any,
) -> TabPFNV2Adapter:
    """TabPFN v2 classifier or regressor.

    ``weights``: a checkpoint path (official ``.ckpt``/``.safetensors`` or one saved by this adapter),
    ``"random"`` (seeded init; ``config`` = ``TabPFNV2Config`` fields, e.g. ``emsize=16, nlayers=1,
    nhead=2``; regressors take ``num_buckets`` and get equal-width borders on [-4, 4]), or ``"hub"``.
    ``task`` defaults to what the checkpoint is. ``softmax_temperature`` divides the logits
    (TabPFNClassifier uses 0.9; default 1 = raw logits). ``densify_labels=True`` restores TabPFN's
    rank-of-present-labels encoding (breaks the fixed label-to-index mapping when a label is absent).
    ``recipe="upstream"``: fine-tuned by the package's fine-tuner, its utility scored as deployed
    (``TabPFNClassifier`` with ``n_estimators`` members, default 2 as the package deploys, and the settings of
    ``finetuner``: ``TabPFNV2Adapter.deployed_settings``); ``n_estimators``
    is refused under iclmem's recipe (raw logits only); ``finetuner``: settings of the package's fine-tuner
    other than those the sweep sets (``trainables.upstream_recipes.check_finetuner_settings``).
    """
    if task is not None and task not in TASKS:
        raise ModelError(f"task must be one of {TASKS}, got {task!r}")
    if softmax_temperature <= 0:
        raise ModelError(f"softmax_temperature must be positive, got {softmax_temperature}")
    weights = "random" if weights is None else str(weights)
    path = None if weights in ("random", "hub") else checkpoint_file(NAME, weights)  # fail before any import
    _import_tabpfn()

    if weights == "random":
        from tabpfn.architectures import tabpfn_v2
        from tabpfn.architectures.shared.bar_distribution import FullSupportBarDistribution

        task = task or "classification"
        cfg = dict(config)
        if task == "classification":
            cfg.setdefault("max_num_classes", 10)
        else:
            cfg.setdefault("max_num_classes", 0)  # TabPFNV2 takes n_out = max_num_classes or num_buckets
            cfg.setdefault("num_buckets", 5000)
        parsed = _parse_config(cfg)
        if task == "regression" and (parsed.max_num_classes != 0 or parsed.num_buckets < 2):
            raise ModelError("a TabPFN v2 regressor needs max_num_classes=0 and num_buckets >= 2")
        if task == "classification" and parsed.max_num_classes < 2:
            raise ModelError("a TabPFN v2 classifier needs max_num_classes >= 2")
        torch.manual_seed(seed)
        module = tabpfn_v2.get_architecture(parsed)
        criterion = FullSupportBarDistribution(_random_borders(parsed.num_buckets)) if task == "regression" else None
        cfg = _config_dict(parsed)
    else:
        if weights == "hub":
            path = _official_checkpoint(task, allow_download)
        assert path is not None
        is_ours = path.suffix == ".safetensors" and safetensors_metadata(path).get("model") == NAME
        module, criterion, cfg, task = (_load_saved if is_ours else _load_official)(path, task)
        clashes = {k: (v, cfg.get(k)) for k, v in config.items() if cfg.get(k) != v}
        if clashes:
            raise ModelError(f"options {clashes} (given, stored) disagree with the checkpoint {path}")
    module.float().eval()
    options = {
        "weights": weights,
        "task": task,
        "seed": seed,
        "softmax_temperature": softmax_temperature,
        "densify_labels": densify_labels,
        "max_features": max_features,
        "config": cfg,
    }
    options.update(recipe_options(NAME, recipe, n_estimators, finetuner, task, DEFAULT_DEPLOYED_N_ESTIMATORS))
    return TabPFNV2Adapter(module, options, criterion=criterion)
