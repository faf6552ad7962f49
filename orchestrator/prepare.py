"""The sweep driver: Stage I, fine-tuning on Ray Tune, probing as checkpoints land, aggregation.

Order of work, chosen so that mistakes cost nothing: the sweep file is validated and every task is
prepared (and checked against every model's limits) *before* Ray starts; then Tune runs the trials and a
callback hands each checkpoint to the probe pool the moment Tune has written it; at the end a catch-up
pass probes any checkpoint that has no result yet (after a crash or a resume), so results are complete
and each is computed once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from iclmem.errors import ConfigError, IclmemError
from iclmem.provenance import Provenance, git_commit
from iclmem.vocab import BASE_MODEL_ROW, Regime
from orchestrator.config import SweepConfig, TaskConfig, TrialSpec, expand_grid
from trainables.data import LabelMode, PreparedTask, PrepSettings, TaskSource, load_or_prepare

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
        return TaskSource(task.name, "carte", task.carte, task.target, task.task)
    if task.path:
        return TaskSource(task.name, "table", task.path, task.target, task.task)
    return TaskSource(task.builtin or task.name, "builtin", None, task.target, task.task)


@dataclass(frozen=True)
class PreparedSweep:
    sweep: SweepConfig
    trials: tuple[TrialSpec, ...]
    tasks: dict[str, PreparedTask]  # fingerprint -> prepared task
    trial_tasks: dict[str, tuple[str, ...]]  # run_id -> fingerprints of its tasks
    controls: tuple[tuple[str, dict[str, Any]], ...] = field(default=())  # (fingerprint, identity) per base-model control


def prepare_sweep(sweep: SweepConfig, cache_dir: Path, log: Callable[[str], None] = print,
                  source: str = "sweep") -> PreparedSweep:
    """Stage I for every (task, Q, label mode, seed) of the grid, after every model's weights are found;
    fails before any Ray work."""
    from trainables.models import build_model
    from trainables.models.checkpoints import locate_weights

    problems = []
    for index, model_cfg in enumerate(sweep.models):
        try:
            locate_weights(model_cfg.name, model_cfg.options)
        except IclmemError as exc:
            problems.append(f"models.{index}: {exc}")
    if problems:
        raise ConfigError(f"{source}: model weights not found (nothing was started):\n  - " + "\n  - ".join(problems))

    settings = PrepSettings(regression_bins=sweep.data.regression_bins, max_features=sweep.data.max_features,
                            context_size=sweep.data.context_size)
    by_name = {t.name: t for t in sweep.tasks}
    index_of = {t.name: i for i, t in enumerate(sweep.tasks)}
    tasks: dict[str, PreparedTask] = {}
    memo: dict[tuple, str] = {}
    trials = expand_grid(sweep)
    trial_tasks: dict[str, tuple[str, ...]] = {}
    errors: list[str] = []
    for trial in trials:
        keys = []
        # multi_random trains on a pool of Q + context_size member rows (all of them members), so its
        # split draws that many members and as many non-members.
        members = trial.q + sweep.data.context_size if trial.regime == Regime.MULTI_RANDOM else trial.q
        for name in trial.task.split("+"):
            memo_key = (name, members, trial.label_mode, trial.seed)
            if memo_key not in memo:
                try:
                    task = load_or_prepare(task_source(by_name[name]), settings, LabelMode(trial.label_mode),
                                           trial.seed, q=members, cache_dir=cache_dir)
                except Exception as exc:  # collect every task's problem, then fail once
                    if isinstance(exc, IclmemError):
                        errors.append(f"tasks.{index_of[name]} ({name!r}, q={trial.q}, label_mode={trial.label_mode}, "
                                      f"seed={trial.seed}): {exc}")
                        memo[memo_key] = ""
                        continue
                    raise
                tasks[task.fingerprint] = task
                memo[memo_key] = task.fingerprint
                log(f"prepared {name} members={members} {trial.label_mode} seed={trial.seed}: "
                    f"{task.features.shape[0]} rows, {task.n_features} features, {task.n_classes} classes")
            keys.append(memo[memo_key])
        trial_tasks[trial.run_id] = tuple(keys)
    if errors:
        raise ConfigError(f"{source}: Stage I failed before any cluster work:\n  - " + "\n  - ".join(dict.fromkeys(errors)))
    for model_cfg in sweep.models:
        model = build_model(model_cfg.name, **{**model_cfg.options, "weights": "random"})
        for task in tasks.values():
            if task.n_classes > model.max_classes:
                errors.append(f"tasks ({task.name!r}) has {task.n_classes} candidate labels; models ({model_cfg.name!r}) supports at most {model.max_classes}: lower data.regression_bins or choose another model")
            if task.n_features + 2 > model.max_features:  # the suite's distractors add up to 2 columns
                errors.append(f"task {task.name!r} has {task.n_features} features (+2 distractors); model {model_cfg.name!r} takes at most {model.max_features}: lower data.max_features")
    if errors:
        raise ConfigError(f"{source}: tasks do not fit the models:\n  - " + "\n  - ".join(dict.fromkeys(errors)))
    controls = []
    if sweep.probe.base_as_checkpoint:
        seen = set()
        for trial in trials:
            if trial.regime == Regime.MULTI_FIXED:  # its tasks are the single-task ones (same split)
                continue
            # multi_random's tasks are prepared with a member pool: one sanity check per task of the run
            for name, task_key in zip(trial.task.split("+"), trial_tasks[trial.run_id]):
                key = (name, trial.model, trial.q, trial.label_mode, trial.seed, trial.regime == Regime.MULTI_RANDOM)
                if key in seen:
                    continue
                seen.add(key)
                pool = "-pool" if trial.regime == Regime.MULTI_RANDOM else ""
                model_key = hashlib.sha1(json.dumps([trial.model, dict(trial.model_options)], sort_keys=True,
                                                    default=str).encode()).hexdigest()[:6]
                run_id = f"{name[:24]}-base{pool}-q{trial.q}-{trial.label_mode}-s{trial.seed}-{trial.model}-{model_key}"
                identity = {**_identity(trial, sweep), "task": name, "run_id": run_id, "regime": BASE_MODEL_ROW,
                            "lr": 0.0}
                controls.append((task_key, identity))
    return PreparedSweep(sweep, tuple(trials), tasks, trial_tasks, tuple(controls))


def _identity(trial: TrialSpec, sweep: SweepConfig) -> dict[str, Any]:
    return {"run_id": trial.run_id, "task": trial.task, "model": trial.model,
            "model_options": json.dumps(dict(trial.model_options), sort_keys=True), "regime": trial.regime,
            "lr": trial.lr, "q": trial.q, "label_mode": trial.label_mode, "seed": trial.seed,
            "config_hash": sweep.config_hash(), "git_commit": git_commit()}


def trial_config(trial: TrialSpec, prepared: PreparedSweep) -> dict[str, Any]:
    sweep = prepared.sweep
    t = sweep.training
    return {
        "run_id": trial.run_id,
        "task_keys": list(prepared.trial_tasks[trial.run_id]),
        "identity": _identity(trial, sweep),
        "torch_threads": sweep.resources.torch_threads_per_trial,
        "null_splits": sweep.probe.null_splits,  # recorded in each checkpoint's ground-truth log
        "finetune": {"model": trial.model, "model_options": dict(trial.model_options), "regime": trial.regime,
                     "lr": trial.lr, "epochs": t.epochs, "checkpoint_epochs": list(t.checkpoint_epochs),
                     "every_epoch": t.every_epoch, "grad_clip": t.grad_clip, "weight_decay": t.weight_decay,
                     "seed": trial.seed, "queries_per_step": trial.q if trial.regime == Regime.MULTI_RANDOM else None},
    }
