"""The sweep driver: Stage I, fine-tuning on Ray Tune, probing as checkpoints land, aggregation.

Order of work, chosen so that mistakes cost nothing: the sweep file is validated and every task is
prepared (and checked against every model's limits) *before* Ray starts; then Tune runs the trials and a
callback hands each checkpoint to the probe pool the moment Tune has written it; at the end a catch-up
pass probes any checkpoint that has no result yet (after a crash or a resume), so results are complete
and each is computed once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iclmem.errors import ConfigError, IclmemError
from iclmem.provenance import Provenance, git_commit
from iclmem.vocab import BASE_MODEL_ROW, InputContract, Regime, SourceKind, TrialRole
from orchestrator.schema.config import SweepConfig, TaskConfig
from orchestrator.schema.trials import TrialSpec, expand_grid
from trainables.data import (
    DISTRACTOR_COLUMNS,
    LabelMode,
    PreparedTask,
    PrepSettings,
    TaskSource,
    load_or_prepare,
    reference_task,
)

EXPERIMENT_NAME = "tune"


# ------------------------------------------------------------------------------------------- provenance
def provenance(sweep: SweepConfig) -> Provenance:
    from trainables.models.embedded import shipped_provenance

    recipe = {k: v for k, v in shipped_provenance().items() if k in ("command", "seed", "steps", "versions")}
    return Provenance.collect(kind="tabular", sweep_name=sweep.name, config=sweep.model_dump(mode="json"),
                              config_hash=sweep.config_hash(), seeds=sweep.grid.seed, embedded_model=recipe)


# ------------------------------------------------------------------------------------------- Stage I
def task_source(task: TaskConfig) -> TaskSource:
    if task.carte:
        return TaskSource(task.name, SourceKind.CARTE, task.carte, task.target, task.task)
    if task.path:
        return TaskSource(task.name, SourceKind.TABLE, task.path, task.target, task.task)
    return TaskSource(task.builtin or task.name, SourceKind.BUILTIN, None, task.target, task.task)


def check_slice_columns(sweep: Any, source: str = "sweep") -> None:
    """Refuse, before any work, a ``report.slices.columns`` entry that a task's source table lacks (or that is
    its target): a :class:`ConfigError` naming the setting, the task, its file and the columns it has."""
    from iclmem.errors import ConfigError
    from trainables.data.sources import read_frame, resolve_source

    for task in sweep.tasks:
        resolved = resolve_source(task_source(task))
        columns = [str(c) for c in read_frame(resolved).columns]
        where = f"{resolved.files[0]}" if resolved.files else f"built-in table {task.name!r}"
        missing = [c for c in sweep.report.slices.columns if c not in columns]
        if missing:
            raise ConfigError(f"{source}: report.slices.columns names {missing}, which task {task.name!r} "
                              f"({where}) does not have; its columns are {columns}")
        if resolved.target in sweep.report.slices.columns:
            raise ConfigError(f"{source}: report.slices.columns names {resolved.target!r}, task {task.name!r}'s "
                              "target; slice by it with report.slices.by: [class]")


@dataclass(frozen=True)
class PreparedSweep:
    sweep: SweepConfig
    trials: tuple[TrialSpec, ...]
    tasks: dict[str, PreparedTask]  # fingerprint -> prepared task
    trial_tasks: dict[str, tuple[str, ...]]  # run_id -> fingerprints of its tasks
    controls: tuple[tuple[str, dict[str, Any]], ...] = field(default=())  # (fingerprint, identity) per base-model control
    # fingerprint of a reference trial's task -> fingerprint of its target's task (probe.references)
    reference_tasks: dict[str, str] = field(default_factory=dict)


def check_models(sweep: SweepConfig, source: str = "sweep") -> None:
    """Every model of the sweep is found and builds with its options, and a weights file the sweep names
    (``options.weights: /path``) loads into it: a :class:`ConfigError` naming each model at fault (its index,
    its option or its file), before any table is read or any folder written."""
    from trainables.models import build_model
    from trainables.models.checkpoints import DEFAULT_WEIGHTS, HUB, MINI, RANDOM, locate_weights

    missing, broken = [], []
    for index, model_cfg in enumerate(sweep.models):
        name, options = model_cfg.name, dict(model_cfg.options)
        try:
            path = locate_weights(name, options)
        except IclmemError as exc:
            missing.append(f"models.{index}: {exc}")
            continue
        where = f"models.{index} ({name})"
        try:  # random weights: the options alone, no file read
            build_model(name, **{**options, "weights": RANDOM})
        except Exception as exc:  # an adapter's constructor: any failure is the options' to name
            broken.append(f"{where}: {_option_problem(options, exc)}")
            continue
        weights = options.get("weights")
        default = DEFAULT_WEIGHTS.get(name).weights if name in DEFAULT_WEIGHTS else None
        if path is None or not isinstance(weights, str) or weights in (RANDOM, HUB, MINI, default):
            continue  # the shipped or official weights: located above, loaded by every trial alike
        try:  # a file the user named: it must load into this model, or every trial would fail on it
            build_model(name, **options)
        except Exception as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            why = why if len(why) <= 160 else why[:157] + "..."
            broken.append(f"{where}: weights file {path} does not load into {name} ({why})")
    if missing:
        raise ConfigError(f"{source}: model weights not found (nothing was started):\n  - " + "\n  - ".join(missing))
    if len(broken) == 1:
        raise ConfigError(f"{source}: {broken[0]}; nothing was started")
    if broken:
        raise ConfigError(f"{source}: {len(broken)} models do not build (nothing was started):\n  - "
                          + "\n  - ".join(broken))


def _option_problem(options: dict[str, Any], exc: Exception) -> str:
    """One line for a model that its options do not build: an unknown option by name, else the error."""
    import re

    if isinstance(exc, IclmemError):
        return str(exc)
    unknown = re.search(r"unexpected keyword argument '([^']+)'", str(exc))
    if isinstance(exc, TypeError) and unknown:
        return f"unknown option {unknown.group(1)!r} in options {options} (see the model's adapter; `iclmem models`)"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"options {options} do not build the model ({type(exc).__name__}: {text})"


def prepare_sweep(sweep: SweepConfig, cache_dir: Path, log: Callable[[str], None] = print,
                  source: str = "sweep") -> PreparedSweep:
    """Stage I for every (task, Q, label mode, seed, model input contract) of the grid, after every model's
    weights are found; each trial (and its base-model control) is mapped to the tasks prepared for its own
    model's contract. Fails before any Ray work."""
    from trainables.models import build_model

    check_models(sweep, source)
    if sweep.report.slices.columns:  # the risk report reads them after the sweep: refuse a missing one now
        check_slice_columns(sweep, source)

    settings = sweep.data.prep_settings()
    trials = expand_grid(sweep)
    # Each model (name + options) once, with random weights: its input contract and limits decide how
    # Stage I prepares the tasks it meets (the weights themselves were located above).
    models: dict[str, Any] = {}
    for spec in [(m.name, m.options) for m in sweep.models] + [(t.model, dict(t.model_options)) for t in trials]:
        key = _model_key(*spec)
        if key not in models:
            models[key] = build_model(spec[0], **{**spec[1], "weights": "random"})
    by_name = {t.name: t for t in sweep.tasks}
    index_of = {t.name: i for i, t in enumerate(sweep.tasks)}
    tasks: dict[str, PreparedTask] = {}
    memo: dict[tuple[str, int, str, int, PrepSettings], str] = {}
    trial_tasks: dict[str, tuple[str, ...]] = {}
    reference_tasks: dict[str, str] = {}
    errors: list[str] = []
    failed: dict[tuple[int, str, str], list[str]] = {}
    for trial in trials:
        model = models[_model_key(trial.model, dict(trial.model_options))]
        # once per (task, Q, label mode, seed, model contract): models reading the same contract with the
        # same limits share a preparation; the member / non-member / context split is the same for all
        model_settings = model.prep_settings(settings)
        keys = []
        # multi_random trains on a pool of the Q members together with C' (all of them members), so its
        # split puts C' in the pool and draws as many non-members, C''s label counts included.
        pooled = trial.regime == Regime.MULTI_RANDOM
        if pooled:
            model_settings = dataclasses.replace(model_settings, context_in_pool=True)
        members = trial.q
        for name in trial.task.split("+"):
            memo_key = (name, members, trial.label_mode, trial.seed, model_settings)
            if memo_key not in memo:
                try:
                    task = load_or_prepare(task_source(by_name[name]), model_settings, LabelMode(trial.label_mode),
                                           trial.seed, q=members, cache_dir=cache_dir)
                except Exception as exc:  # collect every task's problem, then fail once
                    if isinstance(exc, IclmemError):
                        # A table that cannot be read fails the same way for every (Q, label mode, seed):
                        # one line per task and message, naming how many combinations it stopped.
                        failed.setdefault((index_of[name], name, str(exc)), []).append(
                            f"q={trial.q}, label_mode={trial.label_mode}, seed={trial.seed}, model {trial.model!r}")
                        memo[memo_key] = ""
                        continue
                    raise
                tasks[task.fingerprint] = task
                memo[memo_key] = task.fingerprint
                report = task.split_report
                pca = f"; {report.pca_reason}" if report.pca_reason else ""
                pool = f" + C' ({len(task.context_idx)} rows) in the pool" if pooled else ""
                log(f"prepared {name} members={members}{pool} {trial.label_mode} seed={trial.seed} for "
                    f"{report.input_contract} inputs: {task.features.shape[0]} rows, {task.n_features} features, "
                    f"{task.n_classes} classes{pca}")
            keys.append(memo[memo_key])
        if trial.role == TrialRole.REFERENCE and keys[0]:
            # single_fixed only (config validation): the target's task, cut into this reference's half
            ref = reference_task(tasks[keys[0]], int(trial.reference_index or 0))
            tasks[ref.fingerprint] = ref
            reference_tasks[ref.fingerprint] = keys[0]
            keys = [ref.fingerprint]
        trial_tasks[trial.run_id] = tuple(keys)
        if len(keys) > 1 and model.input_contract == InputContract.CELLS and "" not in keys:
            if len({tasks[k].columns for k in keys}) > 1:
                errors.append(f"model {trial.model!r} reads each task's columns, but regime {trial.regime} fine-tunes "
                              f"it on tasks with different columns ({trial.task}) at once: use grid.regime "
                              f"single_fixed for it")
    errors[:0] = [f"tasks.{index} ({name!r}, {combos[0]}"
                  + (f"; and {len(combos) - 1} more combination(s) of Q / label mode / seed / model" if len(combos) > 1 else "")
                  + f"): {message}" for (index, name, message), combos in failed.items()]
    if errors:
        raise ConfigError(f"{source}: Stage I failed before any cluster work:\n  - " + "\n  - ".join(dict.fromkeys(errors)))
    for trial in trials:  # each task against the model that will read it, with the numbers it will read
        model = models[_model_key(trial.model, dict(trial.model_options))]
        for task in (tasks[k] for k in trial_tasks[trial.run_id]):
            if task.n_classes > model.max_classes:
                errors.append(f"tasks ({task.name!r}) has {task.n_classes} candidate labels; models ({trial.model!r}) supports at most {model.max_classes}: lower data.regression_bins or choose another model")
            if task.n_features + DISTRACTOR_COLUMNS > model.max_features:  # the suite's distractors add up to 2 columns
                errors.append(f"task {task.name!r} has {task.n_features} features (+{DISTRACTOR_COLUMNS} distractors); model {trial.model!r} takes at most {model.max_features}: lower data.max_features")
    if errors:
        raise ConfigError(f"{source}: tasks do not fit the models:\n  - " + "\n  - ".join(dict.fromkeys(errors)))
    controls = []
    if sweep.probe.base_as_checkpoint:
        seen = set()
        for trial in trials:
            # multi_fixed's tasks are the single-task ones (same split); a reference trial's base model is its
            # target's, probed on the target's split already
            if trial.regime == Regime.MULTI_FIXED or trial.role == TrialRole.REFERENCE:
                continue
            # multi_random's tasks are prepared with a member pool: one sanity check per task of the run
            for name, task_key in zip(trial.task.split("+"), trial_tasks[trial.run_id]):
                control = (name, trial.model, trial.q, trial.label_mode, trial.seed, trial.regime == Regime.MULTI_RANDOM)
                if control in seen:
                    continue
                seen.add(control)
                pool = "-pool" if trial.regime == Regime.MULTI_RANDOM else ""
                model_key = hashlib.sha1(json.dumps([trial.model, dict(trial.model_options)], sort_keys=True,
                                                    default=str).encode()).hexdigest()[:6]
                run_id = f"{name[:24]}-base{pool}-q{trial.q}-{trial.label_mode}-s{trial.seed}-{trial.model}-{model_key}"
                identity = {**_identity(trial, sweep), "task": name, "run_id": run_id, "regime": BASE_MODEL_ROW,
                            "lr": 0.0}
                controls.append((task_key, identity))
    return PreparedSweep(sweep, tuple(trials), tasks, trial_tasks, tuple(controls), reference_tasks)


def _model_key(name: str, options: dict[str, Any]) -> str:
    return json.dumps([name, dict(options)], sort_keys=True, default=str)


def _identity(trial: TrialSpec, sweep: SweepConfig) -> dict[str, Any]:
    """The columns every results row of the trial carries: its identity (``RunIdentity``) and the run columns
    beside it, the model's options (as JSON) next to the model, where results rows have always carried them."""
    identity: dict[str, Any] = {}
    for column, value in trial.identity.as_dict().items():
        identity[column] = value
        if column == "model":
            identity["model_options"] = json.dumps(dict(trial.model_options), sort_keys=True)
    return {**identity, "config_hash": sweep.config_hash(), "git_commit": git_commit(),
            # only on reference trials, so a target's results row keeps exactly the columns it had before
            **({"reference_of": trial.reference_of, "reference_index": trial.reference_index,
                "reference_training_seed": training_seed(trial)}
               if trial.role == TrialRole.REFERENCE else {})}


def training_seed(trial: TrialSpec) -> int:
    """The seed a trial's fine-tuning draws its randomness from (initialisation, batch draws, dropout, DP
    noise): the run's seed for a target; for a reference fine-tune one derived from (run seed, reference
    index) (trainables.finetune.reference_training_seed), never its target's, whose DP noise it would
    otherwise replay. Stage I (which rows are members) stays under the run seed for both."""
    from trainables.finetune import reference_training_seed

    if trial.role == TrialRole.REFERENCE:
        return reference_training_seed(trial.seed, int(trial.reference_index or 0))
    return trial.seed


def trial_config(trial: TrialSpec, prepared: PreparedSweep) -> dict[str, Any]:
    """One trial's whole config, as Tune holds it (``trainables.spec.TrialConfig.to_tune``; the trainable and
    the driver's callbacks rebuild the typed trial with ``TrialConfig.from_tune``). A DP-SGD trial (finite
    ``trial.dp``) also carries its calibrated DP settings in ``finetune`` (so a lost checkpoint is
    recomputed with the same noise) and its static DP statement in ``identity`` (so every results row
    names it; the ε spent at each checkpoint is added by the aggregator)."""
    import math

    sweep = prepared.sweep
    t = sweep.training
    identity = _identity(trial, sweep)
    finetune: dict[str, Any] = {"model": trial.model, "model_options": dict(trial.model_options), "regime": trial.regime,
                "lr": trial.lr, "epochs": t.epochs, "checkpoint_epochs": list(t.checkpoint_epochs),
                "every_epoch": t.every_epoch, "grad_clip": t.grad_clip, "weight_decay": t.weight_decay,
                "seed": training_seed(trial), "queries_per_step": trial.q if trial.regime == Regime.MULTI_RANDOM else None}
    if math.isfinite(trial.dp):
        from trainables.dp import DPSettings

        # fixed batches: a member row is a query in one step per epoch (single_fixed: the only step;
        # multi_fixed: its task's step), so epochs Gaussian steps at sample rate 1
        dp = DPSettings.calibrate(trial.dp, t.dp_delta, t.dp_max_grad_norm, t.epochs, t.dp_accountant)
        finetune["dp"] = dp.as_dict()
        identity.update({f"dp_{k}": v for k, v in dp.as_dict().items()})
    if sweep.canaries.enabled:
        # a reference trains with the target's recipe, canaries included (the same canaries: they are drawn
        # from the run seed and the task, which the reference shares), so its "in" and "out" distributions
        # are those of the recipe the target ran; the probe does not audit a reference's canaries
        finetune["canaries"] = sweep.canaries.settings()
    from trainables.spec import FinetuneSpec, TrialConfig

    return TrialConfig(run_id=trial.run_id, task_keys=tuple(prepared.trial_tasks[trial.run_id]), identity=identity,
                       finetune=FinetuneSpec(**finetune), torch_threads=sweep.resources.torch_threads_per_trial,
                       null_splits=sweep.probe.null_splits,  # recorded in each checkpoint's ground-truth log
                       ).to_tune()
