"""Fine-tuning through a package's own fine-tuner (``models: [{name: tabpfn-v2, recipe: upstream}]``), as pure
torch and the package: no Ray here.

iclmem's own loop (:class:`trainables.finetune.Finetuner`) steps the raw network on (C', members as queries).
Users who fine-tune TabPFN do it through ``tabpfn.finetuning.FinetunedTabPFNClassifier``: its preprocessing
and ensemble, its own context/query chunking of the training rows, warm-up + cosine learning-rate schedule,
validation and early stopping. :class:`UpstreamFinetuner` runs that fine-tuner unchanged on one prepared task:

* training rows: the Q members with the labels the run trains on (the package splits them into its own
  context and query chunks each epoch); validation rows (the package's early stopping): C', which the
  package never trains on and the probe never audits;
* from the sweep: epochs, lr, weight decay, gradient clipping, seed, device, and the deployed ensemble
  (``n_estimators`` of the model's options: TabPFN's ``n_estimators_final_inference``, default 2, TabICL's
  ``n_estimators_inference``, default 8; the fine-tuning and validation ensembles stay the package's);
  everything else is the package's default, early stopping included, unless the
  model's ``finetuner`` option sets it (``{early_stopping: false}``: any keyword of the package's
  fine-tuner but those above, checked by :func:`check_finetuner_settings` before any work). TabPFN's
  ``extra_classifier_kwargs`` (its ``TabPFNClassifier``'s keywords, ``inference_config`` among them: e.g.
  ``{CLASS_SHIFT_METHOD: null, FEATURE_SHIFT_METHOD: null, FINGERPRINT_FEATURE: false, PREPROCESS_TRANSFORMS:
  [{name: none, categorical_name: numeric}]}`` switches its ensemble augmentation off) are merged with the
  base weights iclmem sets there (``model_path``, refused in them), each field and value checked against tabpfn's
  own ``InferenceConfig`` before any work;
* checkpoints by epoch: the package writes its own checkpoint after every epoch (``save_checkpoint_interval
  = 1`` into a working folder) and calls its experiment-logger hook (``experiment_logger``: ``log_step``,
  ``log_epoch``, ``finish``) after each; :class:`_CheckpointHook` hands each new file to the caller from that
  hook, in the trainer's own thread, so the Tune trainable reports it as every trial's checkpoint. The
  package's file (weights, optimizer, epoch) is kept in the checkpoint as :data:`UPSTREAM_STATE_FILE`; on
  resume it is put back where the package looks for it and the package continues from it (its own resume);
* a run the package stops early (no validation improvement for its patience) ends at that epoch: its last
  checkpoint is the last epoch trained, ``stopped_early`` is 1 in its metrics and ``upstream_best_epoch``
  names the epoch whose weights the package deploys;
* scored: the run's utility metrics (in-context accuracy and loss with C', members and non-members) as the
  package deploys the weights (``TabPFNV2Adapter.deployed_log_probs``: one fit per context of the classifier
  the package's fine-tuner deploys after fitting -- its ensemble size, class and feature shifts, preprocessing
  and ``inference_config`` as the ``finetuner`` option sets them, the run's seed its ``random_state``); the
  probe scores the network as for every run, since the
  package refuses the probe's zero-information contexts (copies of one row: "All features are constant").

Refused at validation (``orchestrator.schema.config``), named: DP-SGD, canaries, regimes other than single_fixed --
the package's fine-tuner has no per-row clipping, no canary insertion and fits one table. Reference fine-tunes
(``probe.references``) run through the same fine-tuner and recipe, each under its own training seed (the
package's ``random_state``) and with that seed as its deployed classifier's ``random_state`` (docs/METHOD.md,
"References through a package's own fine-tuner").
"""

from __future__ import annotations

import contextlib
import math
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from iclmem.atomic import atomic_write, write_json_atomic
from iclmem.errors import CheckpointError, ConfigError
from iclmem.vocab import Recipe, Regime
from trainables.finetune import (
    META_FILE,
    MODEL_FILE,
    EpochResult,
    FinetuneSpec,
    file_record,
    fixed_batch,
    icl_utility,
    require_files,
    verify_checkpoint,
)
from trainables.models import ModelAdapter, build_model, read_weights
from trainables.models.base import resolve_device, weights_digest
from trainables.upstream_recipes import UPSTREAM_RECIPES, UpstreamRecipe, check_finetuner_settings

if TYPE_CHECKING:
    from trainables.models.estimator import PackageScoring

UPSTREAM_STATE_FILE = "upstream_state.pth"


def is_upstream(spec: FinetuneSpec) -> bool:
    """Whether ``spec`` fine-tunes through the package's own fine-tuner."""
    return upstream_options(spec.model_options)


def upstream_options(options: Mapping[str, Any]) -> bool:
    """Whether a model's options name the upstream recipe (its package fine-tunes and deploys the weights)."""
    return str(options.get("recipe", Recipe.ICLMEM.value)) == Recipe.UPSTREAM.value


# What the sweep sets, by name (UpstreamFinetuner.finetuner_values), and where a user sets it in a sweep file.
# ------------------------------------------------------------------------------------------------ the loop
class _Stop(Exception):
    """Raised from the hook to end the package's ``fit`` (a diverged epoch, or a recomputation that has its
    epoch)."""


def _metric_name(key: str) -> str:
    return "upstream_" + re.sub(r"[^0-9a-z]+", "_", key.lower()).strip("_")


class _CheckpointHook:
    """The package's experiment logger (``setup``, ``log_step``, ``log_epoch``, ``finish``): after each call,
    every checkpoint file the package wrote since the last one goes to ``on_file(epoch, path, metrics,
    final)``, with the metrics the package logged for that epoch (``log_epoch`` comes before the epoch's file
    is written, so they wait here for it); ``final`` when it comes from ``finish``, after the package's last
    epoch (the sweep's last, or the one its early stopping ended on)."""

    def __init__(self, folder: Path, recipe: UpstreamRecipe, last_epoch: int,
                 on_file: Callable[[int, Path, dict[str, float], bool], None]) -> None:
        self.folder, self.recipe, self.last_epoch, self.on_file = folder, recipe, last_epoch, on_file
        self.logged: dict[int, dict[str, float]] = {}
        self.seen: set[int] = set()  # every epoch whose file the package wrote (or was given to resume from)

    def setup(self, config: dict[str, Any]) -> None:
        return None

    def log_step(self, metrics: dict[str, float], step: int) -> None:
        self.poll()

    def log_epoch(self, metrics: dict[str, float], step: int) -> None:
        epoch = int(metrics.get("train/epoch", -2)) + 1  # the package counts epochs from 0 here, its files from 1
        self.logged[epoch] = {_metric_name(k): float(v) for k, v in metrics.items()
                              if k != "train/epoch" and isinstance(v, int | float) and math.isfinite(float(v))}
        self.poll()

    def finish(self) -> None:
        self.poll(final=True)

    def poll(self, final: bool = False) -> None:
        listed = self.recipe.epoch_files(self.folder)  # once per call: it runs after every training step
        self.seen.update(e for e, _ in listed)
        files = [(e, p) for e, p in listed if e > self.last_epoch]
        for i, (epoch, path) in enumerate(files):
            self.last_epoch = epoch
            self.on_file(epoch, path, self.logged.pop(epoch, {}), final and i == len(files) - 1)
        for _epoch, path in listed[:-1]:  # the newest stays for the package's resume
            path.unlink(missing_ok=True)


@contextlib.contextmanager
def _quiet_progress(module_name: str) -> Iterator[None]:
    """The package draws a tqdm bar per epoch; in a trial's log (and Tune's console) that is noise, and
    tqdm reads TQDM_DISABLE only when imported, so the bar of the fine-tuner's module is switched off."""
    import sys

    module = sys.modules.get(module_name)
    bar = getattr(module, "tqdm", None)
    if bar is None:
        yield
        return
    def silent(*args: Any, **kwargs: Any) -> Any:
        return bar(*args, **{**kwargs, "disable": True})  # the package passes its own ``disable``

    module.tqdm = silent  # type: ignore[union-attr]
    try:
        yield
    finally:
        module.tqdm = bar  # type: ignore[union-attr]


@dataclass(frozen=True)
class UpstreamEnd:
    """How the package's run ended: the last epoch trained, whether its early stopping ended it before the
    sweep's epochs, and the epoch whose weights it deploys (its best validation epoch, 0 when none beat the base weights; None
    when it diverged)."""

    last_epoch: int
    stopped_early: bool
    best_epoch: int | None


class _Deployed:
    """An adapter seen through its ``deployed_log_probs`` (what :func:`icl_metrics` calls ``log_probs``)."""

    def __init__(self, model: ModelAdapter) -> None:
        self.module = model.module
        self.device = model.device
        self._model = model

    def log_probs(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor,
                  n_classes: int) -> torch.Tensor:
        return cast("PackageScoring", self._model).deployed_log_probs(context_x, context_y, query_x, n_classes)


class UpstreamFinetuner:
    """One run of a package's fine-tuner on one prepared task, with iclmem's checkpoint format. The same
    surface as :class:`~trainables.finetune.Finetuner` where the trainable needs it (``spec``, ``tasks``,
    ``model``, ``epoch``, ``canaries``, ``evaluate``, ``save``, ``restore``); ``run`` replaces the epoch loop,
    since the package's ``fit`` runs every epoch itself."""

    def __init__(self, spec: FinetuneSpec, tasks: Sequence[Any], device: str | torch.device | None = None) -> None:
        if not is_upstream(spec):
            raise ConfigError(f"model {spec.model!r} is not fine-tuned with recipe upstream")
        self.recipe = UPSTREAM_RECIPES.get(spec.model)
        if len(tasks) != 1 or spec.regime != Regime.SINGLE_FIXED:
            raise ConfigError(f"recipe upstream fine-tunes one table: regime single_fixed with one task, not "
                              f"{spec.regime.value} with {len(tasks)}")
        if spec.dp is not None or spec.canaries is not None:
            raise ConfigError(f"recipe upstream ({self.recipe.finetuner_class}) has no DP-SGD and no canaries")
        if spec.model_options.get("finetuner"):  # a sweep checked them as it was read; a direct caller here
            check_finetuner_settings(spec.model, dict(spec.model_options["finetuner"]))
        self.spec = spec
        self.tasks = list(tasks)
        self.task = self.tasks[0]
        self.canaries = None
        torch.manual_seed(spec.seed)
        self.model: ModelAdapter = build_model(spec.model, **spec.model_options)
        self.model.use_columns(getattr(self.task, "columns", None))
        self.device = resolve_device(device)
        self.model.to(self.device)
        self.epoch = 0
        self._resume_state: Path | None = None
        self._resume_digest: str | None = None
        self.epochs_run = 0  # epochs the package trained in this process (a resumed TabPFN run: only those after)
        self._base_state = {k: v.detach().clone() for k, v in self.model.module.state_dict().items()}

    # ---------------------------------------------------------------------------------------- data
    def training_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(X members [Q, F], y [Q] as the run trains them, X C' [N, F], y C') -- fit's training and validation."""
        x = np.asarray(self.task.features, dtype=np.float32)
        y = np.asarray(self.task.labels, dtype=np.int64)
        members, context = np.asarray(self.task.member_idx), np.asarray(self.task.context_idx)
        return x[members], y[members], x[context], y[context]

    def finetuner_settings(self) -> dict[str, Any]:
        """What iclmem passes the package's fine-tuner: the model's ``finetuner`` settings, then the sweep's
        under the package's keywords (everything else is the package's default)."""
        values = {"device": str(self.device), "epochs": self.spec.epochs, "lr": self.spec.lr,
                  "weight_decay": self.spec.weight_decay, "grad_clip": self.spec.grad_clip, "seed": self.spec.seed,
                  "interval": 1, "n_estimators": int(self.model.options.get("n_estimators", 2))}
        return {**dict(self.model.options.get("finetuner") or {}),
                **{keyword: values[source] for keyword, source in self.recipe.keywords.items()}}

    def evaluate(self) -> dict[str, float]:
        """In-context accuracy and loss with C' as the context, on members and non-members, scored as the
        package deploys the weights (its deployed classifier, the run's seed its ``random_state``)."""
        return deployed_utility(self.model, self.task, seed=self.spec.seed)

    # ---------------------------------------------------------------------------------------- running
    def run(self, on_epoch: Callable[[EpochResult, Path, UpstreamEnd | None], bool | None]) -> UpstreamEnd:
        """Run the package's fine-tuner from the current epoch to ``spec.epochs`` (or its early stop).
        ``on_epoch(result, package_file, end)`` after every epoch, with this object's model holding that
        epoch's weights; ``result.metrics`` holds the package's logged metrics (``upstream_*``) and, at the
        spec's scheduled epochs and the last, the utility as deployed; ``end`` is set for the package's last
        epoch. ``on_epoch`` returns True to stop there (the run is not finished). A diverged epoch (loss or
        weights not finite) is passed on and ends it."""
        x, y, x_val, y_val = self.training_rows()
        outcome: list[UpstreamEnd] = []

        resumed_at, resumed_digest = self.epoch, self._resume_digest
        schedule = set(self.spec.schedule())

        def on_file(epoch: int, path: Path, logged: dict[str, float], final: bool) -> None:
            state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
            if epoch <= resumed_at:  # recomputing up to the checkpoint a run restarts from (no package resume)
                self.model.module.load_state_dict(state)
                if epoch == resumed_at and resumed_digest is not None:
                    actual = weights_digest(self.model.module.state_dict())
                    if actual != resumed_digest:
                        raise CheckpointError(f"recomputing up to epoch {epoch} gave weights {actual[:12]}..., not the "
                                              f"checkpoint's {resumed_digest[:12]}...: the package's fine-tuning is "
                                              "not reproducible here")
                return
            finite = all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
            loss = float(logged.get("upstream_train_mean_loss", math.nan))
            self.epoch = epoch
            if finite:
                self.model.module.load_state_dict(state)
            # the utility as deployed costs a fit of the package's estimator per context: computed where a
            # checkpoint is written (scheduled epochs and the last); every epoch carries the package's own metrics
            metrics = self.evaluate() if finite and (epoch in schedule or final) else {}
            diverged = not finite or not math.isfinite(loss) or not all(math.isfinite(v) for v in metrics.values())
            end = None
            if final or diverged:
                # the package deploys its best validation epoch (0: the base weights, when none beat them)
                best = None if diverged else self.recipe.best_epoch(path.parent, len(y))
                end = UpstreamEnd(epoch, not diverged and epoch < self.spec.epochs, best)
                outcome.append(end)
            result = EpochResult(epoch, loss, diverged, {} if diverged else {**metrics, **logged})
            if on_epoch(result, path, end) or diverged:
                raise _Stop

        with tempfile.TemporaryDirectory(prefix="iclmem-upstream-") as tmp:
            work, folder = Path(tmp), Path(tmp) / "checkpoints"
            folder.mkdir()
            start = self.epoch
            if self._resume_state is not None and self.recipe.resumes:
                # the package continues from the newest file in its folder
                base = self._base_file(work)
                shutil.copyfile(self._resume_state, folder / self.recipe.resume_name(len(y), self.epoch))
            else:
                if self._resume_state is not None:  # no resume in the package: recomputed up to the checkpoint
                    self.model.module.load_state_dict(self._base_state)
                    start = 0
                base = self._base_file(work)
            hook = _CheckpointHook(folder, self.recipe, start, on_file)
            finetuner = self.recipe.build(self.finetuner_settings(), base, hook)
            given = {e for e, _ in self.recipe.epoch_files(folder)}  # the state a resumed package starts from
            try:
                with contextlib.suppress(_Stop), _quiet_progress(self.recipe.progress_module):
                    finetuner.fit(x, y, X_val=x_val, y_val=y_val, output_dir=folder)
            finally:
                self.epochs_run += len(hook.seen - given)
        return outcome[-1] if outcome else UpstreamEnd(self.epoch, False, None)

    # ---------------------------------------------------------------------------------------- checkpoints
    def save(self, directory: str | Path, package_file: Path, metrics: dict[str, Any] | None = None) -> Path:
        """iclmem's checkpoint folder: the weights (safetensors, what the probe loads), the package's own
        checkpoint of the epoch (weights, optimizer; what a resumed run continues from) and the manifest with
        both files' sizes and sha256, written last (as :meth:`Finetuner.save`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write(directory / MODEL_FILE, self.model.save, to_path=True)
        atomic_write(directory / UPSTREAM_STATE_FILE, lambda tmp: shutil.copyfile(package_file, tmp), to_path=True)
        manifest = {"epoch": self.epoch, "model": self.spec.model, "model_options": self.spec.model_options,
                    "spec": self.spec.to_dict(), "metrics": metrics or {}, "recipe": self.recipe.record(),
                    "finetuner_settings": self.finetuner_settings(),
                    "files": {n: file_record(directory / n) for n in (MODEL_FILE, UPSTREAM_STATE_FILE)},
                    "weights_sha256": weights_digest(self.model.module.state_dict())}
        write_json_atomic(directory / META_FILE, manifest, indent=2, default=str, allow_nan=True)
        return directory

    def restore(self, directory: str | Path) -> None:
        """Continue from a checkpoint folder (verified first: :class:`CorruptCheckpointError` names a damaged
        file before any state changes)."""
        directory = Path(directory)
        manifest = verify_checkpoint(directory)
        require_files(directory, manifest, (MODEL_FILE, UPSTREAM_STATE_FILE))
        if UPSTREAM_STATE_FILE not in manifest.get("files", {}):
            raise CheckpointError(f"{directory} holds no {UPSTREAM_STATE_FILE}: not written by recipe upstream, so "
                                  "the package's fine-tuner cannot continue from it")
        self.model.module.load_state_dict(read_weights(directory / MODEL_FILE))
        self._resume_state = directory / UPSTREAM_STATE_FILE
        self._resume_digest = manifest.get("weights_sha256")
        self.epoch = int(manifest["epoch"])

    def _base_file(self, folder: Path) -> Path:
        """The base weights in the package's format, for the fine-tuner to load."""
        current = {k: v.detach().clone() for k, v in self.model.module.state_dict().items()}
        self.model.module.load_state_dict(self._base_state)
        try:
            return Path(self.model.package_checkpoint(folder / "base.ckpt"))  # type: ignore[attr-defined]
        finally:
            self.model.module.load_state_dict(current)


@contextlib.contextmanager
def _deployed_seed(model: ModelAdapter, task: Any, seed: int | None) -> Iterator[None]:
    """The adapter's deployed classifier drawn from the run's seed (``deployed_random_state``), as the package's
    fine-tuner deploys it (its ``random_state`` is the run's seed): ``seed``, else the task's (Stage I's seed,
    the run's). A reference fine-tune passes its own training seed (``probes.probe_columns.deployed_seed``), so its
    ensemble is drawn afresh as its batches are. The base model scored on the same task draws the same
    ensemble, so the deployed known-context channel compares like with like."""
    seed = getattr(task, "seed", None) if seed is None else seed
    if seed is None or not hasattr(model, "deployed_random_state"):
        yield
        return
    previous = model.deployed_random_state
    model.deployed_random_state = int(seed)
    try:
        yield
    finally:
        model.deployed_random_state = previous


def deployed_utility(model: ModelAdapter, task: Any, seed: int | None = None) -> dict[str, float]:
    """``member_icl_accuracy`` ... ``nonmember_icl_loss`` of ``model`` with C' as the context, scored as its
    package deploys it (``deployed_log_probs``: the classifier its fine-tuner deploys, ``seed`` -- default the
    task's, the run's -- its ``random_state``): what a model owner's users would get."""
    with _deployed_seed(model, task, seed):
        return icl_utility(_Deployed(model), task)  # type: ignore[arg-type]


def _label_nll(deployed: _Deployed, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor,
               query_y: torch.Tensor, n_classes: int) -> np.ndarray:
    """float64 [n_query]: the deployed classifier's NLL of each query's label (``query_y`` [1, n_query]) with
    (``context_x`` [1, n_ctx, F], ``context_y`` [1, n_ctx]) as the context."""
    lp = deployed.log_probs(context_x, context_y, query_x, n_classes).reshape(-1, n_classes)
    labels = query_y.reshape(-1).to(lp.device)
    return (-lp[torch.arange(len(labels)), labels]).double().cpu().numpy()


def deployed_losses(model: ModelAdapter, task: Any, seed: int | None = None) -> np.ndarray:
    """float64 [n_members + n_nonmembers]: each audited row's loss (NLL of the label the run trained on) with C'
    as the context, scored as the package deploys the weights (``deployed_log_probs``: the classifier its
    fine-tuner deploys, its preprocessing and ensemble, ``seed`` -- default the task's, the run's -- its
    ``random_state``), members first: the known-context attack on what the package fine-tuned. The package
    trained the weights on its own preprocessed features, so a memorized row may show here and not through the
    raw network on iclmem's encoding (benchmarks/RESULTS.md, "Planted runs through the packages' own
    fine-tuners")."""
    deployed = _Deployed(model)
    losses = []
    was_training = model.module.training
    model.module.eval()
    try:
        with torch.no_grad(), _deployed_seed(model, task, seed):
            for rows in (task.member_idx, task.nonmember_idx):
                batch = fixed_batch(task, rows).to(model.device)
                losses.append(_label_nll(deployed, batch.context_x, batch.context_y, batch.query_x, batch.query_y,
                                         batch.n_classes))
    finally:
        model.module.train(was_training)
    return np.concatenate(losses)


def training_frame_losses(model: ModelAdapter, task: Any, audited: np.ndarray, seed: int | None = None,
                          folds: int = 5) -> np.ndarray:
    """float64 [len(audited)]: each audited row's loss (NLL of the label the run trained on) in the frame the
    package fine-tuned in -- the training rows (``task.member_idx`` with their trained labels) as the context --
    scored as the package deploys the weights (``deployed_log_probs``, ``seed`` its ``random_state``).

    The training rows are cut into ``folds`` folds (a permutation drawn from ``seed``) and every audited row is
    given one (members: the fold that holds them; other rows: dealt round-robin in a drawn order); a row is then
    predicted with the training rows outside its fold as the context, so a member never sees itself and every
    audited row, member or not, sees a context of the same size drawn the same way. The package's own fine-tuning
    steps predict members from chunks of the other members, so this is where what it fitted shows first; with
    C' as the context (:func:`deployed_losses`) the rows are scored as an auditor who knows C' would."""
    audited = np.asarray(audited, dtype=np.int64)
    training = np.asarray(task.member_idx, dtype=np.int64)
    folds = max(2, min(int(folds), len(training)))
    rng = np.random.default_rng([0x67, 0 if seed is None else int(seed)])
    fold_of_training = np.empty(len(training), dtype=np.int64)
    fold_of_training[rng.permutation(len(training))] = np.arange(len(training)) % folds
    position = {int(r): i for i, r in enumerate(training)}
    fold = np.empty(len(audited), dtype=np.int64)
    others = [i for i, r in enumerate(audited) if int(r) not in position]
    for i, r in enumerate(audited):
        if int(r) in position:
            fold[i] = fold_of_training[position[int(r)]]
    fold[np.asarray(others, dtype=np.int64)[rng.permutation(len(others))]] = np.arange(len(others)) % folds
    x = torch.from_numpy(np.array(task.features, dtype=np.float32))
    y = torch.from_numpy(np.array(task.labels, dtype=np.int64))
    deployed = _Deployed(model)
    losses = np.full(len(audited), np.nan)
    was_training = model.module.training
    model.module.eval()
    try:
        with torch.no_grad(), _deployed_seed(model, task, seed):
            for f in range(folds):
                queries = np.flatnonzero(fold == f)
                if not len(queries):
                    continue
                context = torch.from_numpy(training[fold_of_training != f])
                rows = torch.from_numpy(audited[queries])
                losses[queries] = _label_nll(deployed, x[context][None].to(model.device),
                                             y[context][None].to(model.device), x[rows][None].to(model.device),
                                             y[rows][None].to(model.device), task.n_classes)
    finally:
        model.module.train(was_training)
    return losses


def recompute_upstream_model(spec: FinetuneSpec, tasks: Sequence[Any], epoch: int) -> ModelAdapter:
    """The weights after ``epoch`` epochs, recomputed by running the package's fine-tuner again (for a lost
    checkpoint; the package seeds its chunking and preprocessing from the spec's seed)."""
    finetuner = UpstreamFinetuner(spec, tasks)
    reached: list[bool] = []

    def stop_at(result: EpochResult, _path: Path, _end: UpstreamEnd | None) -> bool:
        if result.diverged:
            raise CheckpointError(f"recomputing epoch {epoch}: the run diverged at epoch {result.epoch}")
        reached.append(result.epoch >= epoch)
        return result.epoch >= epoch

    finetuner.run(stop_at)
    if not any(reached):
        raise CheckpointError(f"recomputing epoch {epoch}: the package's fine-tuner stopped at epoch "
                              f"{finetuner.epoch} (early stopping) before reaching it")
    return finetuner.model
