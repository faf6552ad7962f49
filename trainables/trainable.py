"""The Ray Tune function trainable: a thin shell around ``trainables.finetune.Finetuner``.

It is a pure function of (config, checkpoint): it rebuilds everything from ``config``, resumes from
``tune.get_checkpoint()`` when Tune restarts it (a retried failure or a restored sweep), and reports
metrics and checkpoint together with ``tune.report``. Epoch 0 (the base model) is never saved per run:
the reference model is shared by every run instead.
"""

from __future__ import annotations

import functools
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from ray import tune

from iclmem.atomic import write_json_atomic
from iclmem.clock import device_clock
from iclmem.errors import CorruptCheckpointError
from iclmem.runfolder import GROUND_TRUTH_FILE
from iclmem.vocab import Regime
from trainables.data import ground_truth_log
from trainables.finetune import EpochResult, Finetuner, FinetuneSpec
from trainables.spec import TrialConfig
from trainables.upstream import UpstreamEnd, UpstreamFinetuner, is_upstream

# The metric a trial reports (with its first result after a resume) when the checkpoint it was to resume
# from was damaged: the driver prints it on the console, since the trial's own stderr may be on another node
DAMAGED_CHECKPOINT_METRIC = "damaged_checkpoint"
# seconds of the epoch's fine-tuning (step and evaluation) and of its checkpoint's save, reported with the
# epoch's metrics: the driver sums them into the run's timings (orchestrator.runfolder.timing). Device-seconds: the
# process's CPU time on a CPU (a trial sharing its cores with others is not charged their time), wall time
# on a GPU; the wall times beside them give the trial's own overhead (its wall time less its work)
EPOCH_SECONDS = "epoch_seconds"
SAVE_SECONDS = "save_seconds"
EPOCH_WALL_SECONDS = "epoch_wall_seconds"
SAVE_WALL_SECONDS = "save_wall_seconds"


def resume_or_recompute(finetuner: Finetuner | UpstreamFinetuner, directory: str | Path, run_id: str,
                        damaged: list[str] | None = None) -> bool:
    """Restore ``finetuner`` from a checkpoint folder. A checkpoint that fails its checksum is not used:
    the run is recomputed from epoch 0 (fine-tuning is deterministic in its config and seed, so the
    recomputed checkpoints equal the lost ones) with a warning naming the file, also appended to
    ``damaged``. Returns True if restored."""
    try:
        finetuner.restore(directory)
        return True
    except CorruptCheckpointError as exc:
        message = f"run {run_id}: {exc}; recomputing the run from epoch 0 instead of resuming from it"
        warnings.warn(message, stacklevel=2)
        print(f"[iclmem] WARNING {message}", file=sys.stderr, flush=True)
        if damaged is not None:
            damaged.append(message)
        return False


def draws(spec: FinetuneSpec, tasks: list[Any], epoch: int) -> dict[str, Any]:
    """multi_random's per-epoch draws up to ``epoch`` (row ids of each epoch's context and queries, per
    task), for the ground-truth log; they are a pure function of the run's seed, so they are recomputed
    rather than kept. Other regimes train on the fixed (C', members) pair the log already names."""
    if spec.regime != Regime.MULTI_RANDOM:
        return {}
    from trainables.finetune import random_draw

    out = []
    for e in range(1, epoch + 1):
        per_task = []
        for t in tasks:
            ctx, queries = random_draw(t, e, spec.seed, spec.queries_per_step)
            per_task.append({"task": t.name, "context_row_ids": [int(v) for v in t.row_ids[ctx]],
                             "query_row_ids": [int(v) for v in t.row_ids[queries]]})
        out.append({"epoch": e, "tasks": per_task})
    return {"multi_random_draws": out}


def dp_metrics(finetuner: Finetuner) -> dict[str, Any]:
    """A DP-SGD run's privacy statement after the current epoch, as flat numeric metrics (``dp_epsilon``:
    the accountant's ε spent so far; ``dp_target_epsilon``, ``dp_delta``, ``dp_noise_multiplier``,
    ``dp_max_grad_norm``, ``dp_steps``, ``dp_sample_rate``); empty without DP. Every reported metric is in
    the checkpoint's manifest too (``Finetuner.save`` also writes the whole record under ``dp``)."""
    record = finetuner.dp_record()
    if record is None:
        return {}
    keys = ("epsilon", "target_epsilon", "delta", "noise_multiplier", "max_grad_norm", "steps", "sample_rate")
    return {f"dp_{k}": record[k] for k in keys}


def ground_truth_record(trial: TrialConfig, tasks: list[Any]) -> dict[str, Any]:
    """What goes next to every checkpoint: which rows were members, non-members, C' and null splits, and the
    labels the run trained on (the spec's ground-truth log)."""
    return {"run_id": trial.run_id, "regime": trial.finetune.regime.value,
            "tasks": [ground_truth_log(t, trial.null_splits) for t in tasks]}


def report_checkpoint(metrics: dict[str, Any], ground_truth: dict[str, Any], save: Any) -> None:
    """``tune.report`` of ``metrics`` with a checkpoint folder: ``save(folder)`` writes the weights and state,
    then the ground-truth log goes beside them."""
    with tempfile.TemporaryDirectory() as tmp:
        started, wall = time.process_time(), time.perf_counter()
        save(tmp)
        write_json_atomic(Path(tmp) / GROUND_TRUTH_FILE, ground_truth, default=str)
        # the save's seconds travel with the epoch's metrics (the run's timings, orchestrator.runfolder.timing); a save is
        # the CPU's work whatever the device
        metrics = {**metrics, SAVE_SECONDS: time.process_time() - started,
                   SAVE_WALL_SECONDS: time.perf_counter() - wall}
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))


def finetune_trainable(config: dict[str, Any], prepared: dict[str, Any] | None = None) -> None:
    """``prepared`` maps task fingerprints to prepared tasks; bound with ``tune.with_parameters`` so the
    tasks travel through the object store to any node, with no shared file system needed for them."""
    import torch

    trial = TrialConfig.from_tune(config)  # the sweep driver passes each whole trial config as one grid value
    torch.set_num_threads(trial.torch_threads)
    spec = trial.finetune
    assert prepared is not None  # always bound (tune.with_parameters(finetune_trainable, prepared=...))
    if is_upstream(spec):
        upstream_trainable(trial, [prepared[key] for key in trial.task_keys])
        return
    # the device is auto: CUDA exactly when Ray gave this trial GPUs (resources.gpus_per_trial), else the CPU
    finetuner = Finetuner(spec, [prepared[key] for key in trial.task_keys])
    checkpoint = tune.get_checkpoint()
    damaged: list[str] = []
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            resume_or_recompute(finetuner, directory, trial.run_id, damaged)
    schedule = set(spec.schedule())
    identity = {"run_id": trial.run_id}
    ground_truth = ground_truth_record(trial, finetuner.tasks)
    if finetuner.canaries is not None:  # the canaries inserted into the members (ids, kinds, copies, labels)
        ground_truth["canaries"] = finetuner.canaries.log()

    clock = device_clock(finetuner.device)
    while finetuner.epoch < spec.epochs:
        started, wall = clock(), time.perf_counter()
        result = finetuner.run_epoch()
        metrics = {**identity, "epoch": result.epoch, "train_loss": result.train_loss,
                   "diverged": result.diverged, **result.metrics, **dp_metrics(finetuner),
                   EPOCH_SECONDS: clock() - started, EPOCH_WALL_SECONDS: time.perf_counter() - wall}
        if damaged:  # once, with the first result after the resume
            metrics[DAMAGED_CHECKPOINT_METRIC] = damaged.pop()
        if result.diverged:
            # Divergence is a result: stop cleanly; the last good checkpoint stays the latest one.
            tune.report(metrics)
            return
        if result.epoch in schedule:
            report_checkpoint(metrics, {**ground_truth, **draws(spec, finetuner.tasks, result.epoch)},
                              functools.partial(finetuner.save, metrics=metrics))
        else:
            tune.report(metrics)


def upstream_trainable(trial: TrialConfig, tasks: list[Any]) -> None:
    """The same trial through the package's own fine-tuner (``trainables.upstream``): resumed from Tune's
    checkpoint (the package continues from its own saved state), one ``tune.report`` per epoch from the
    package's logger hook, a checkpoint at every scheduled epoch and at the epoch the package's early
    stopping ends the run on (``stopped_early`` 1, ``upstream_best_epoch``: the epoch it deploys)."""
    spec = trial.finetune
    finetuner = UpstreamFinetuner(spec, tasks)
    checkpoint = tune.get_checkpoint()
    damaged: list[str] = []
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            resume_or_recompute(finetuner, directory, trial.run_id, damaged)
    if finetuner.epoch >= spec.epochs:
        return
    schedule = set(spec.schedule())
    identity = {"run_id": trial.run_id}
    ground_truth = ground_truth_record(trial, finetuner.tasks)

    clock = device_clock(finetuner.device)
    last = [clock(), time.perf_counter()]  # the package runs its epochs: an epoch is the time between two hook calls

    def on_epoch(result: EpochResult, package_file: Path, end: UpstreamEnd | None) -> None:
        metrics: dict[str, Any] = {
            **identity, "epoch": result.epoch, "train_loss": result.train_loss, "diverged": result.diverged,
            **result.metrics, EPOCH_SECONDS: clock() - last[0], EPOCH_WALL_SECONDS: time.perf_counter() - last[1]}
        if damaged:
            metrics[DAMAGED_CHECKPOINT_METRIC] = damaged.pop()
        if end is not None:
            metrics["stopped_early"] = int(end.stopped_early)
            if end.best_epoch is not None:  # where the package's files say which epoch it deploys
                metrics["upstream_best_epoch"] = end.best_epoch
        if result.diverged or not (result.epoch in schedule or (end is not None and end.stopped_early)):
            tune.report(metrics)
        else:
            report_checkpoint(metrics, ground_truth, lambda folder: finetuner.save(folder, package_file, metrics))
        last[:] = [clock(), time.perf_counter()]  # the save and Tune's report are not the next epoch's

    finetuner.run(on_epoch)
