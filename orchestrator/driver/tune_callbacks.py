"""The Tune callbacks of a sweep driver: each checkpoint handed to the probe pools the moment Tune wrote it (and the
watchdog fed at every step of Tune's loop), each trial's results handed to the trial logger, and both re-attached
to a resumed driver's pool and logger (Tune pickles callbacks into its experiment state, live handles left out)."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iclmem.runfolder import record_diverged_run
from orchestrator.driver.checkpoint_keeping import CheckpointKeeper, tune_checkpoint_location
from orchestrator.driver.probe_pools import jobs_for
from orchestrator.driver.progress import Progress, stall_reason
from trainables.spec import TUNE_AXIS, TrialConfig

if TYPE_CHECKING:  # Tune is imported only where a callback is built
    from ray.tune import Checkpoint
    from ray.tune.experiment import Trial


def trial_of(config: Mapping[str, Any] | None) -> TrialConfig | None:
    """The typed trial (:class:`trainables.spec.TrialConfig`) of a config as Tune holds it (the one grid axis,
    ``trainables.spec.TUNE_AXIS``, the driver gives Tune); None for a trial Tune has no config of. The driver's
    one reader of Tune's trial configs: nothing past it reads Tune's keys."""
    raw = (config or {}).get(TUNE_AXIS, config or {})
    return TrialConfig.from_tune(raw) if raw else None


def run_id_of(config: Mapping[str, Any] | None) -> str | None:
    """The run id of a config as Tune holds it, without rebuilding the whole trial (the progress line reads
    every trial's at every step of a sweep of hundreds); None for a trial Tune has no config of."""
    raw = (config or {}).get(TUNE_AXIS, config or {})
    return str(raw["run_id"]) if raw else None  # TrialConfig.to_tune's key


def checkpoint_uri(checkpoint: Any) -> str:
    """Where a Tune checkpoint is, as a URI: its local path, or ``s3://``/``gs://``... on a bucket (Tune keeps
    the path without the scheme and the pyarrow file system beside it)."""
    kind = str(getattr(getattr(checkpoint, "filesystem", None), "type_name", "local"))
    path = str(checkpoint.path)
    if kind in ("local", "") or "://" in path:
        return path
    return f"{'gs' if kind == 'gcs' else kind}://{path}"


class ProbeOnCheckpoint:
    """Tune callback that hands each checkpoint to the probe pool the moment Tune has written it.

    Tune pickles its callbacks into the experiment state; the pool (live actor handles) is left out of
    that state and re-attached by ``iclmem resume``, since handles of a dead driver cannot be restored.
    """

    def __init__(self, pool: Any, probes_dir: Path, progress: Progress, trial_logger: Any,
                 keeper: CheckpointKeeper | None = None) -> None:
        self.attach(pool, probes_dir, progress, trial_logger, keeper)

    def attach(self, pool: Any, probes_dir: Path, progress: Progress, trial_logger: Any,
               keeper: CheckpointKeeper | None = None) -> None:
        """``trial_logger`` (a :class:`orchestrator.report.wandb_logger.TrialLogger`) gets every probe row polled;
        ``keeper`` is told of every checkpoint, every finished trial and every step (``training.keep_checkpoints``)."""
        self.pool, self.probes_dir, self.trial_logger, self.keeper = pool, probes_dir, trial_logger, keeper
        self.progress: Progress | None = progress  # None in a restored callback until reattached
        self.submitted: set[tuple[str, str]] = set()

    def __getstate__(self) -> dict[str, Any]:
        return {"probes_dir": self.probes_dir}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.pool, self.progress, self.probes_dir, self.submitted = None, None, state["probes_dir"], set()
        self.trial_logger, self.keeper = None, None

    # Tune's Callback interface (duck-typed so this class stays importable without a Tune subclass).
    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any],
                        **info: Any) -> None:
        from trainables.trainable import DAMAGED_CHECKPOINT_METRIC

        damaged = (result or {}).get(DAMAGED_CHECKPOINT_METRIC)
        if damaged and self.progress is not None:  # the trial's own warning stays on its node
            self.progress.log(f"[iclmem] WARNING {damaged}")
        if (result or {}).get("diverged") and result.get("run_id"):
            # the trainable stops a run whose loss went NaN / inf: recorded, the report calls it diverged
            record_diverged_run(self.probes_dir.parent, str(result["run_id"]))
            if self.progress is not None:
                self.progress.log(f"[iclmem] run {result['run_id']} diverged at epoch {result.get('epoch')} (NaN or "
                                  "infinite loss): stopped there; its earlier checkpoints stand")

    def on_checkpoint(self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: Checkpoint,
                      **info: Any) -> None:
        if self.pool is None:
            return
        epoch = int((trial.last_result or {}).get("epoch", -1))
        # the probe first: what W&B does with the checkpoint must never cost the audit its result
        typed = trial_of(trial.config)
        if typed is None:
            return
        jobs = jobs_for(typed, epoch, checkpoint, self.probes_dir)
        for job in jobs:
            if (job.out_dir, job.stem) not in self.submitted:
                self.submitted.add((job.out_dir, job.stem))
                self.pool.submit(job)
        if self.keeper is not None and jobs:  # after the submit: the keeper may remove the previous one's resume state
            self.keeper.add(typed.run_id, epoch, *tune_checkpoint_location(checkpoint),
                            [(job.out_dir, job.stem) for job in jobs])
        if self.trial_logger is not None:  # W&B lineage: the checkpoint by reference, with its inputs
            self.trial_logger.log_checkpoint(typed, epoch, checkpoint_uri(checkpoint))

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        run_id = run_id_of(trial.config)
        if self.keeper is not None and run_id is not None:  # no resume point any more (a failed trial keeps its own)
            self.keeper.finish(str(run_id))

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if self.pool is None or self.progress is None:  # attached together (a restored callback has neither)
            return
        for row in self.pool.poll():
            self.progress.outcome(row)
            self.trial_logger.log_probe(row)
        if self.keeper is not None:  # checkpoints whose probes just came in may lose their weights
            self.keeper.settle()
        for t in trials:
            run_id = run_id_of(t.config)
            if run_id is not None:
                self.progress.trial_status[str(run_id)] = str(t.status)
        self.progress.running = sum(t.status == "RUNNING" for t in trials)
        self.progress.done = sum(t.status == "TERMINATED" for t in trials)
        self.progress.failed = sum(t.status == "ERROR" for t in trials)
        self.progress.show()
        watchdog = self.progress.watchdog
        if watchdog is not None and self.progress.stall is None:
            moved = (tuple(sorted((str(t.trial_id), str(t.status), int((t.last_result or {}).get("training_iteration", 0)))
                                  for t in trials)), len(self.progress.verdicts))
            if watchdog.observe(moved, busy=self.progress.running > 0):
                self.progress.stall = stall_reason(trials, watchdog.idle_s, self.progress.console_log)
                os.kill(os.getpid(), signal.SIGUSR1)  # Tune's own graceful stop: state saved, trials stopped


def tune_callback(pool: Any, probes_dir: Path, progress: Progress, trial_logger: Any,
                  keeper: CheckpointKeeper | None = None) -> ProbeOnCheckpoint:
    """A :class:`ProbeOnCheckpoint` that is also a Tune ``Callback`` (Tune imported only here)."""
    from ray.tune import Callback

    class _ProbeOnCheckpoint(ProbeOnCheckpoint, Callback):
        pass

    return _ProbeOnCheckpoint(pool, probes_dir, progress, trial_logger, keeper)


class LogTrialResults:
    """Tune callback that hands each result a trial reports (its epoch's training metrics) to the trial
    logger, in the driver. Like :class:`ProbeOnCheckpoint`, the logger (open W&B runs) is left out of
    Tune's pickled experiment state and re-attached by ``iclmem resume``."""

    def __init__(self, trial_logger: Any) -> None:
        self.trial_logger = trial_logger

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.trial_logger = None

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any],
                        **info: Any) -> None:
        if self.trial_logger is not None:
            typed = trial_of(trial.config)
            if typed is not None:
                self.trial_logger.log_training(typed.identity, result)


def trial_results_callback(trial_logger: Any) -> LogTrialResults:
    """A :class:`LogTrialResults` that is also a Tune ``Callback``."""
    from ray.tune import Callback

    class _LogTrialResults(LogTrialResults, Callback):
        pass

    return _LogTrialResults(trial_logger)


def reattach(tuner: Any, pool: Any, probes_dir: Path, progress: Progress, trial_logger: Any,
             keeper: CheckpointKeeper | None = None) -> None:
    """Give the restored callbacks the new driver's pool and trial logger. Tune offers no public hook
    for this; if its internals move, probing still completes (and probe rows still reach the trial
    logger) in the catch-up pass after ``fit``, while training metrics of the resumed epochs go unlogged."""
    try:
        callbacks = tuner._local_tuner.get_run_config().callbacks or []
    except AttributeError:
        return
    for callback in callbacks:
        if isinstance(callback, ProbeOnCheckpoint):
            callback.attach(pool, probes_dir, progress, trial_logger, keeper)
        elif isinstance(callback, LogTrialResults):
            callback.trial_logger = trial_logger
