"""Counting a sweep's work, step 1 of ``iclmem estimate`` (``orchestrator/estimate/estimate.py``): what the grid
implies, before anything is measured or launched.

**Count** the grid's work with the sweep's own expansion (``expand_grid``), per (model, Q, task)
(:class:`CostKey`; a multi-task run counts once on each of its tasks): runs and what they fine-tune on
(their tasks, DP-SGD or not), fine-tuning steps, checkpoints probed, probe contexts (checkpoints x 2Q x
|suite| per run, plus the base-model control per reference when ``probe.base_as_checkpoint``),
references (one per task x model x Q x label mode x seed, computed once and shared) and the contexts
sharing saves; reference trials (``probe.references``) are runs of the grid like any other.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class CostKey(NamedTuple):
    """What unit costs are measured for: a model at a Q on a task (tasks differ in features, classes, rows and
    context statistics, so each is measured on its own)."""

    model: str
    q: int
    task: str


@dataclass(frozen=True)
class Work:
    """The work a grid implies; per-(model, Q, task) counts are keyed by :class:`CostKey` (a multi-task run
    counts once for each of its tasks: it steps on each every epoch and each checkpoint is probed on each)."""

    runs: int
    epochs: int
    schedule: tuple[int, ...]
    suite: int
    tasks: tuple[str, ...]
    runs_by: dict[CostKey, int]
    steps: int
    eval_forwards: int
    checkpoint_jobs: dict[CostKey, int]
    probe_contexts: dict[CostKey, int]
    controls: dict[CostKey, int]
    control_contexts: dict[CostKey, int]
    references: dict[CostKey, int]
    reference_contexts: dict[CostKey, int]
    reference_contexts_saved: int
    prepared_tasks: int
    model_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the runs by what they fine-tune on: (the keys of their tasks, DP-SGD or not) -> runs
    compositions: dict[tuple[tuple[CostKey, ...], bool], int] = field(default_factory=dict)
    prepared_by_task: dict[str, int] = field(default_factory=dict)  # Stage I preparations per task
    dp_epsilon: float | None = None  # a target ε of the grid's DP-SGD runs (their step cost does not depend on it)
    # what decides how many trials run at once on N workers (Tune reuses a trial's actor for the next trial)
    trial_share: float = 1.0  # CPUs (GPUs for a GPU sweep) per trial
    probe_share: float = 0.0  # CPUs (GPUs) the probe actors hold together
    max_concurrent_trials: int | None = None
    # what the aggregation after the last trial reads (orchestrator.estimate.estimate_predict.report_s): null splits per
    # checkpoint, and whether a W&B summary run is written
    null_splits: int = 0
    wandb: bool = False

    def trial_slots(self, workers: int) -> int:
        """Trials running at once on ``workers``: what the probe actors leave, over a trial's share."""
        free = max(workers - self.probe_share, self.trial_share)
        slots = max(int(math.floor(free / self.trial_share + 1e-9)), 1)
        if self.max_concurrent_trials:
            slots = min(slots, self.max_concurrent_trials)
        return min(slots, max(self.runs, 1))

    @property
    def checkpoints(self) -> int:
        return len(self.schedule)

    def total(self, name: str) -> int:
        return sum(getattr(self, name).values())

    @property
    def dp_runs(self) -> int:
        return sum(n for (_, dp), n in self.compositions.items() if dp)


def canary_settings(sweep: Any) -> Any:
    """The sweep's ``trainables.canaries.CanarySettings``, or None without canaries."""
    from trainables.canaries import CanarySettings

    canaries = getattr(sweep, "canaries", None)
    settings = canaries.settings() if canaries is not None else None
    return None if settings is None else CanarySettings.from_value(settings)


def count_work(sweep: Any) -> Work:
    """Count the work of a loaded sweep (``orchestrator.schema.sweep_files.load_sweep``)."""
    from orchestrator.schema.trials import expand_grid
    from probes.actors import suite_for

    trials = expand_grid(sweep)
    t = sweep.training
    suite = len(suite_for(sweep.probe.suite))  # the manipulation suite, as the probe actors build it
    schedule = t.schedule()
    keys_of = {tr.run_id: tuple(CostKey(tr.model, tr.q, task) for task in tr.task.split("+")) for tr in trials}
    runs_by = Counter(k for tr in trials for k in keys_of[tr.run_id])
    compositions = Counter((keys_of[tr.run_id], math.isfinite(tr.dp)) for tr in trials)
    refs = Counter((task, tr.model, tr.q, tr.label_mode, tr.seed) for tr in trials for task in tr.task.split("+"))
    references = Counter(CostKey(key[1], key[2], key[0]) for key in refs)
    controls = references if sweep.probe.base_as_checkpoint else Counter()
    steps = sum(t.epochs * len(keys_of[tr.run_id]) for tr in trials)

    def contexts(counter: Mapping[CostKey, int], per: int) -> dict[CostKey, int]:
        return {k: n * per * 2 * k.q * suite for k, n in counter.items()}

    prepared = {(task, tr.q, tr.label_mode, tr.seed) for tr in trials for task in tr.task.split("+")}
    probe_contexts = contexts(runs_by, len(schedule))
    canaries = canary_settings(sweep)
    if canaries is not None:
        # every fine-tuned checkpoint also scores each canary, inserted or held out, under the whole suite
        probe_contexts = {k: v + runs_by[k] * len(schedule) * canaries.n_canaries * suite
                          for k, v in probe_contexts.items()}
    reference_contexts = contexts(references, 1)
    if canaries is not None:  # and the base model scores them once per reference (cached beside its scores)
        reference_contexts = {k: v + references[k] * canaries.n_canaries * suite
                              for k, v in reference_contexts.items()}
    finite = [tr.dp for tr in trials if math.isfinite(tr.dp)]
    return Work(
        runs=len(trials), epochs=t.epochs, schedule=tuple(schedule), suite=suite,
        tasks=tuple(tk.name for tk in sweep.tasks), runs_by=dict(runs_by), steps=steps,
        eval_forwards=2 * t.epochs * len(trials),
        checkpoint_jobs={k: n * len(schedule) for k, n in runs_by.items()},
        probe_contexts=probe_contexts, controls=dict(controls),
        control_contexts=contexts(controls, 1), references=dict(references),
        reference_contexts=reference_contexts,
        reference_contexts_saved=sum((runs - 1) * 2 * key[2] * suite for key, runs in refs.items()),
        prepared_tasks=len(prepared),
        model_options={m.name: dict(m.options) for m in sweep.models},
        compositions=dict(compositions),
        prepared_by_task=dict(Counter(p[0] for p in prepared)),
        dp_epsilon=min(finite) if finite else None,
        null_splits=int(sweep.probe.null_splits), wandb=str(sweep.wandb.mode) != "disabled",
        **_shares(sweep.resources),
    )


def _shares(res: Any) -> dict[str, Any]:
    gpu = res.gpus_per_trial > 0
    return {"trial_share": float(res.gpus_per_trial if gpu else res.cpus_per_trial),
            "probe_share": float(res.probe_actors * (res.gpus_per_probe_actor if gpu else res.cpus_per_probe_actor)),
            "max_concurrent_trials": res.max_concurrent_trials}
