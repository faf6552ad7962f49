"""How iclmem drives each package's own fine-tuner (``recipe: upstream``): one :class:`UpstreamRecipe` per model,
registered in :data:`UPSTREAM_RECIPES` (TabPFN v2's ``FinetunedTabPFNClassifier``, TabICL's
``FinetunedTabICLClassifier``): which of the fine-tuner's keywords the sweep sets and from where
(:data:`SWEEP_SETTINGS`), how it is built on the base weights with iclmem's logger hook, the per-epoch files it
writes and whether it resumes from them, the epoch it deploys, and the check of a model's ``finetuner`` option
(:func:`check_finetuner_settings`) before any work. The loop that runs a recipe is :mod:`trainables.upstream`."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from iclmem.errors import CheckpointError, ConfigError
from iclmem.registry import Registry
from iclmem.vocab import Recipe
from trainables.keyword_types import keyword_type_problem

__all__ = ["SWEEP_SETTINGS", "UPSTREAM_RECIPES", "UpstreamRecipe", "check_finetuner_settings"]

SWEEP_SETTINGS = {"epochs": "training.epochs", "lr": "grid.lr", "weight_decay": "training.weight_decay",
                  "grad_clip": "training.grad_clip", "seed": "grid.seed", "n_estimators": "the model's n_estimators",
                  "device": "the trial's resources", "interval": "iclmem (a checkpoint every epoch)"}


@dataclass(frozen=True)
class UpstreamRecipe:
    """How one package's fine-tuner is driven.

    ``keywords``: the fine-tuner's keyword -> the sweep setting it gets (:data:`SWEEP_SETTINGS`);
    ``build(settings, base_file, hook)``: the fine-tuner on those keywords, the base weights and the logger
    hook (None for all three: its class); ``reserved``: further keywords iclmem sets in ``build``;
    ``epoch_files``: the per-epoch checkpoints it wrote into a folder, by epoch; ``resumes``: whether the
    package continues from such a file in its folder (``resume_name(rows, epoch)``), else a restarted run is
    recomputed from epoch 0 (deterministic in the seed) up to its checkpoint; ``best_epoch(folder, rows)``:
    the epoch whose weights it deploys, where its files say (None where they do not)."""

    model: str
    package: str
    finetuner_class: str
    keywords: dict[str, str]
    build: Callable[[dict[str, Any] | None, Path | None, Any], Any]
    reserved: frozenset[str]
    epoch_files: Callable[[Path], list[tuple[int, Path]]]
    resumes: bool
    resume_name: Callable[[int, int], str]
    best_epoch: Callable[[Path, int], int | None]
    progress_module: str = ""  # the module whose ``tqdm`` draws the package's per-epoch bar (none: no bar)
    # what a setting holds, beyond its name (``check(model, settings)``: a ConfigError naming the setting)
    check: Callable[[str, dict[str, Any]], None] | None = None

    def record(self) -> dict[str, str]:
        from importlib.metadata import version

        return {"recipe": Recipe.UPSTREAM.value, "package": self.package, "version": version(self.package),
                "finetuner": self.finetuner_class}

    def set_by_iclmem(self) -> frozenset[str]:
        return frozenset(self.keywords) | self.reserved


UPSTREAM_RECIPES: Registry[UpstreamRecipe] = Registry("upstream fine-tuning recipe")


def check_finetuner_settings(model: str, settings: dict[str, Any]) -> None:
    """A model's ``finetuner`` option: keywords of its package's fine-tuner, none of them set by iclmem
    (:class:`ConfigError` naming the key and where the sweep sets it, or the keywords the package takes), and
    what the recipe checks inside them (TabPFN's ``extra_classifier_kwargs`` and its ``inference_config``)."""
    import inspect

    if not isinstance(settings, dict):
        raise ConfigError(f"model {model}: options.finetuner must be a mapping of the package fine-tuner's keywords")
    recipe = UPSTREAM_RECIPES.get(model)
    finetuner = recipe.build(None, None, None)
    taken = set(inspect.signature(finetuner.__init__).parameters) - {"self"}
    for key in settings:
        if key in recipe.set_by_iclmem():
            source = recipe.keywords.get(key)
            raise ConfigError(f"model {model}: options.finetuner.{key} is set by iclmem"
                              + (f" from {SWEEP_SETTINGS[source]}" if source else
                                 " (the base weights, the logger hook and downloads are iclmem's)"))
        if key not in taken:
            raise ConfigError(f"model {model}: options.finetuner.{key} is not a keyword of {recipe.finetuner_class}; "
                              f"it takes: {', '.join(sorted(taken - recipe.set_by_iclmem()))}")
        # the value, against the keyword's annotation: Python checks none, and a quoted "false" is a true string
        problem = keyword_type_problem(finetuner.__init__, key, settings[key], recipe.finetuner_class)
        if problem is not None:
            raise ConfigError(f"model {model}: options.finetuner.{key} {problem}")
    if recipe.check is not None:
        recipe.check(model, settings)


# ------------------------------------------------------------------------------------------------ TabPFN v2
def _tabpfn_finetuner(settings: dict[str, Any] | None, base: Path | None, hook: Any) -> Any:
    """FinetunedTabPFNClassifier: the logger is its ``experiment_logger`` keyword, the base weights its
    classifier's ``model_path`` beside the user's ``extra_classifier_kwargs`` (``PREPROCESS_TRANSFORMS`` of
    their ``inference_config`` made ``PreprocessorConfig``: :func:`~trainables.models.tabpfn_adapter.classifier_kwargs`)."""
    os.environ.setdefault("TABPFN_DISABLE_TELEMETRY", "1")
    from tabpfn.finetuning import FinetunedTabPFNClassifier

    from trainables.models.tabpfn_adapter import classifier_kwargs

    if settings is None:
        return FinetunedTabPFNClassifier
    given = dict(settings)
    extra = classifier_kwargs(given.pop("extra_classifier_kwargs", None))
    return FinetunedTabPFNClassifier(**given, experiment_logger=hook,
                                     extra_classifier_kwargs={**extra, "model_path": str(base)})


# keywords of TabPFNClassifier inside extra_classifier_kwargs that iclmem or the package's fine-tuner sets
_TABPFN_CLASSIFIER_SET = {
    "model_path": "by iclmem (the run's base weights, then the package's own checkpoint on resume)",
    "n_estimators": "by the package's fine-tuner from its n_estimators_finetune, n_estimators_validation and "
                    "n_estimators_final_inference (the last from the model's n_estimators)",
    "random_state": f"by the package's fine-tuner from its random_state ({SWEEP_SETTINGS['seed']})",
    "device": f"by the package's fine-tuner from its device ({SWEEP_SETTINGS['device']})",
    "ignore_pretraining_limits": "by the package's fine-tuner (True)",
    "fit_mode": "by the package's fine-tuner",
    "differentiable_input": "by the package's fine-tuner",
}
# fields of its inference_config that the package's fine-tuner sets over the user's
_TABPFN_INFERENCE_SET = {
    "ENABLE_GPU_PREPROCESSING": "by the package's fine-tuner (False)",
    "TRANSFORM_TEXT": "by the package's fine-tuner (False: it trains on numeric arrays)",
    "TRANSFORM_DATES": "by the package's fine-tuner (False: it trains on numeric arrays)",
    "N_ESTIMATORS": _TABPFN_CLASSIFIER_SET["n_estimators"],
}


def _check_tabpfn_settings(model: str, settings: dict[str, Any]) -> None:
    """TabPFN's ``extra_classifier_kwargs``: keywords of ``TabPFNClassifier`` that neither iclmem nor the
    fine-tuner sets; its ``inference_config``: fields of tabpfn's ``InferenceConfig`` (each of
    ``PREPROCESS_TRANSFORMS`` a ``PreprocessorConfig``'s fields) with values it takes, checked by tabpfn's own
    validation on the v2 classifier defaults. A :class:`ConfigError` names the setting by its path."""
    import dataclasses
    import inspect

    extra = settings.get("extra_classifier_kwargs")
    if extra is None:
        return
    where = f"model {model}: options.finetuner.extra_classifier_kwargs"
    if not isinstance(extra, Mapping):
        raise ConfigError(f"{where} must be a mapping of tabpfn.TabPFNClassifier's keywords")
    from tabpfn import TabPFNClassifier
    from tabpfn.constants import ModelVersion
    from tabpfn.inference_config import InferenceConfig
    from tabpfn.preprocessing import PreprocessorConfig

    taken = set(inspect.signature(TabPFNClassifier.__init__).parameters) - {"self"}
    for key in extra:
        if key in _TABPFN_CLASSIFIER_SET:
            raise ConfigError(f"{where}.{key} is set {_TABPFN_CLASSIFIER_SET[key]}")
        if key not in taken:
            raise ConfigError(f"{where}.{key} is not a keyword of tabpfn.TabPFNClassifier; it takes: "
                              f"{', '.join(sorted(taken - set(_TABPFN_CLASSIFIER_SET)))}")
    config = extra.get("inference_config")
    if config is None:
        return
    where += ".inference_config"
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where} must be a mapping of fields of tabpfn's InferenceConfig")
    fields = {f.name for f in dataclasses.fields(InferenceConfig)}
    for key in config:
        if key in _TABPFN_INFERENCE_SET:
            raise ConfigError(f"{where}.{key} is set {_TABPFN_INFERENCE_SET[key]}")
        if key not in fields:
            raise ConfigError(f"{where}.{key} is not a field of tabpfn's InferenceConfig "
                              f"(tabpfn.inference_config.InferenceConfig); it has: "
                              f"{', '.join(sorted(f for f in fields - set(_TABPFN_INFERENCE_SET) if not f.startswith('_')))}")
    steps = config.get("PREPROCESS_TRANSFORMS")
    if steps is not None:
        if not isinstance(steps, list) or not steps:
            raise ConfigError(f"{where}.PREPROCESS_TRANSFORMS must be a non-empty list of PreprocessorConfig "
                              "settings (e.g. [{name: none, categorical_name: numeric}])")
        known = {f.name for f in dataclasses.fields(PreprocessorConfig)}
        for i, step in enumerate(steps):
            if not isinstance(step, Mapping | PreprocessorConfig):
                raise ConfigError(f"{where}.PREPROCESS_TRANSFORMS[{i}] must be a mapping of PreprocessorConfig's "
                                  f"fields ({', '.join(sorted(known))})")
            for key in step if isinstance(step, Mapping) else ():
                if key not in known:
                    raise ConfigError(f"{where}.PREPROCESS_TRANSFORMS[{i}].{key} is not a field of tabpfn's "
                                      f"PreprocessorConfig; it has: {', '.join(sorted(known))}")
    # the values, as tabpfn validates them (pydantic: a Literal, a type), on the defaults of a v2 classifier
    try:
        dataclasses.replace(InferenceConfig.get_default("multiclass", ModelVersion.V2), **dict(config))
    except Exception as exc:  # pydantic's ValidationError, or TypeError / ValueError
        errors = getattr(exc, "errors", None)
        if callable(errors):
            first = errors()[0]
            # the field's path; pydantic's names of a union's branches (``literal['no','all']``) left out
            path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.get("loc", ())
                           if isinstance(p, int) or str(p).isidentifier())
            raise ConfigError(f"{where}{path}: {first.get('msg')} (given {first.get('input')!r})") from None
        raise ConfigError(f"{where}: {type(exc).__name__}: {exc}") from None


_TABPFN_FILE = re.compile(r"^checkpoint_.+_(\d+)\.pth$")


def _tabpfn_epoch_files(folder: Path) -> list[tuple[int, Path]]:
    """The package's interval checkpoints ``checkpoint_<rows>_<epoch>.pth``, by epoch (its own resume sorts
    the names as strings, so iclmem keeps one file there at a time)."""
    found = [(int(m.group(1)), p) for p in folder.glob("checkpoint_*.pth") if (m := _TABPFN_FILE.match(p.name))]
    return sorted(found)


def _tabpfn_resume_name(rows: int, epoch: int) -> str:
    from tabpfn.finetuning.train_util import get_checkpoint_name

    return str(get_checkpoint_name(rows, epoch))


def _tabpfn_best_epoch(folder: Path, rows: int) -> int | None:
    """The epoch of ``checkpoint_<rows>_best.pth`` (written when an epoch beats the base weights on
    validation); 0 when none did: the package then deploys the base weights."""
    from tabpfn.finetuning.train_util import _format_train_size

    path = folder / f"checkpoint_{_format_train_size(rows)}_best.pth"
    if not path.is_file():
        return 0
    return int(torch.load(path, map_location="cpu", weights_only=False).get("epoch", 0))


UPSTREAM_RECIPES.register("tabpfn-v2", UpstreamRecipe(
    model="tabpfn-v2", package="tabpfn", finetuner_class="tabpfn.finetuning.FinetunedTabPFNClassifier",
    keywords={"device": "device", "epochs": "epochs", "learning_rate": "lr", "weight_decay": "weight_decay",
              "grad_clip_value": "grad_clip", "random_state": "seed", "save_checkpoint_interval": "interval",
              "n_estimators_final_inference": "n_estimators"},
    build=_tabpfn_finetuner, reserved=frozenset({"experiment_logger"}),
    epoch_files=_tabpfn_epoch_files, resumes=True, resume_name=_tabpfn_resume_name, best_epoch=_tabpfn_best_epoch,
    progress_module="tabpfn.finetuning.finetuned_base", check=_check_tabpfn_settings))


# ------------------------------------------------------------------------------------------------ TabICL
def _tabicl_finetuner(settings: dict[str, Any] | None, base: Path | None, hook: Any) -> Any:
    """FinetunedTabICLClassifier: its logger comes from its ``_make_experiment_logger`` hook (the package
    builds a W&B logger there from ``wandb_kwargs``), so a subclass returns iclmem's; the base weights are its
    ``model_path``, downloads off."""
    from tabicl._finetune import FinetunedTabICLClassifier

    if settings is None:
        return FinetunedTabICLClassifier

    class WithCheckpointHook(FinetunedTabICLClassifier):  # type: ignore[misc]
        def _make_experiment_logger(self) -> Any:
            return hook

    return WithCheckpointHook(**settings, model_path=str(base), allow_auto_download=False, verbose=False)


_TABICL_FILE = re.compile(r"^epoch(\d+)\.ckpt$")


def _tabicl_epoch_files(folder: Path) -> list[tuple[int, Path]]:
    """The package's interval checkpoints ``epoch<N>.ckpt``, by epoch."""
    return sorted((int(m.group(1)), p) for p in folder.glob("epoch*.ckpt") if (m := _TABICL_FILE.match(p.name)))


def _no_resume(rows: int, epoch: int) -> str:
    raise CheckpointError("TabICL's fine-tuner does not resume from a checkpoint")


def _tabicl_best_epoch(folder: Path, rows: int) -> int | None:
    return None  # its best.ckpt records the run's last epoch, not the best one's


UPSTREAM_RECIPES.register("tabicl", UpstreamRecipe(
    model="tabicl", package="tabicl", finetuner_class="tabicl._finetune.FinetunedTabICLClassifier",
    keywords={"device": "device", "epochs": "epochs", "learning_rate": "lr", "weight_decay": "weight_decay",
              "grad_clip": "grad_clip", "random_state": "seed", "save_interval": "interval",
              "n_estimators_inference": "n_estimators"},
    build=_tabicl_finetuner, reserved=frozenset({"model_path", "allow_auto_download", "verbose", "wandb_kwargs"}),
    epoch_files=_tabicl_epoch_files, resumes=False, resume_name=_no_resume, best_epoch=_tabicl_best_epoch))
