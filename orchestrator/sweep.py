"""Ray side of a sweep: Tune trials, probe pool fed by a checkpoint callback, results table.

``run_sweep`` and ``resume_sweep`` are the entry points the CLI calls. Everything a run writes lives
under ``RUN_DIR``: ``prepared/`` (Stage I cache), ``tune/`` (Tune storage, unless ``storage_path`` is
remote), ``probes/`` (one result per checkpoint, written atomically), ``results.parquet`` and the
reports, ``wandb/`` (offline runs), ``run_state.json`` (running / interrupted / failed / complete, and
the runs an interruption left unfinished) and ``console.log`` (what Ray, Tune and wandb printed).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pandas as pd

from iclmem.atomic import write_json_atomic
from iclmem.errors import (
    EXIT_INTERRUPTED,
    ConfigError,
    DataError,
    DiskFull,
    SweepInterrupted,
    SweepStalled,
    TrialsFailed,
)
from iclmem.raysession import Console, ensure_ray, quiet_console
from iclmem.runfolder import (
    CONSOLE_LOG_FILE,
    PREPARED_DIR,
    PROBES_DIR,
    PROVENANCE_FILE,
    REFERENCE_DIR,
    RESULTS_FILE,
    RUN_STATE_FILE,
    SWEEP_FILE,
    TUNE_DIR,
    RunStatus,
    existing_ancestor,
    folder_kind,
    never_started,
    probe_stem,
    record_diverged_run,
    unwritable,
    write_run_state,
)
from iclmem.runlock import hold_run_folder, refuse_if_held
from orchestrator.config import SweepConfig, load_sweep
from orchestrator.context_audit import check_context_audits, finish_context_audits, submit_context_audits
from orchestrator.prepare import EXPERIMENT_NAME, PreparedSweep, prepare_sweep, provenance, trial_config
from orchestrator.run_folder import RunFolder
from orchestrator.wandb_logger import WANDB_FINISH_TIMEOUT_S


# ------------------------------------------------------------------------------------------- storage
def check_storage(storage_path: str) -> None:
    """Tune needs storage every node can reach: refuse a plain local path on a multi-host cluster."""
    import ray

    if "://" in storage_path:
        return
    hosts = {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    declared_shared = os.environ.get("ICLMEM_SHARED_STORAGE") or (
        os.environ.get("ICLMEM_STORAGE") and storage_path.startswith(os.environ["ICLMEM_STORAGE"].rstrip("/")))
    if len(hosts) > 1 and not declared_shared:
        raise ConfigError(
            f"storage_path {storage_path!r} is a local folder, but the cluster spans {len(hosts)} hosts: Tune "
            "writes checkpoints on the worker that produced them and restores trials on other nodes, so every "
            "node must see the same storage. Set storage_path to s3://..., gs://..., or an NFS mount present "
            "on every node (export ICLMEM_STORAGE=<shared root> as cluster.yaml does, or ICLMEM_SHARED_STORAGE=1 to "
            "confirm that storage_path is a shared mount)."
        )


_NO_SPACE = ("No space left on device", "[Errno 28]", "errno 28", "Disk quota exceeded", "[Errno 122]")


def is_disk_full(error: BaseException | str) -> bool:
    """Whether ``error`` (an exception with its causes, or a trial's error text) is a full disk or quota."""
    import errno

    seen: set[int] = set()
    current: BaseException | str | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(marker in str(current) for marker in _NO_SPACE):
            return True
        current = (current.__cause__ or current.__context__) if isinstance(current, BaseException) else None
    return False


FULL_DISK_BYTES = 2**20  # a folder with less room than this counts as full


def free_space(run_dir: Path, storage: str | None) -> list[tuple[str, str, int]]:
    """(what, folder, free bytes) of the run folder and a local Tune storage."""
    import shutil

    out = []
    for label, folder in (("run folder", str(run_dir)), ("Tune storage", storage)):
        if folder and "://" not in folder:
            try:
                out.append((label, folder, int(shutil.disk_usage(existing_ancestor(folder)).free)))
            except OSError:
                pass
    return out


def disk_full_error(run_dir: Path, storage: str | None, detail: str) -> DiskFull:
    """The error a sweep ends with when a disk ran full: which folders are short of room and how much each
    has, and how to continue. Records the run as interrupted (resumable) when the state can still be written."""
    where = [f"{label} {folder}: {free / 2**20:.1f} MiB free" for label, folder, free in free_space(run_dir, storage)]
    try:
        write_run_state(run_dir, RunStatus.INTERRUPTED, note=f"stopped: disk full ({detail})"[:2000])
        recorded = ""
    except OSError:
        recorded = f" ({RUN_STATE_FILE} could not be updated: no room)"
    return DiskFull(f"a disk ran full ({detail[:300]}); {'; '.join(where) or 'see the paths above'}. The sweep stopped "
                    f"with every stored result kept{recorded}: free space (or point storage_path elsewhere), then "
                    f"`iclmem resume {run_dir}`")


STORAGE_CHECK_TIMEOUT_S = 30.0  # a bucket that does not answer a listing in this time is refused


def unreachable_storage(storage_path: str, timeout_s: float = STORAGE_CHECK_TIMEOUT_S) -> str | None:
    """Why Tune could not keep checkpoints at ``storage_path``, or None: a local folder must be creatable and
    writable; a bucket (``s3://``, ``gs://`` ...) must answer a listing within ``timeout_s`` seconds. Checked
    before Ray starts: otherwise the first trial fails with a traceback (or the filesystem retries for
    minutes) after Stage I."""
    if "://" not in storage_path or storage_path.startswith("file://"):
        # a storage path is given to be written in, beside other experiments: probed even when it holds them
        return unwritable(storage_path.removeprefix("file://"), probe_foreign=True)
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            import pyarrow.fs

            filesystem, path = pyarrow.fs.FileSystem.from_uri(storage_path)
            filesystem.get_file_info(path)
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - any failure to reach the bucket is the answer
            outcome.append(str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__)

    worker = threading.Thread(target=probe, name="iclmem-storage-check", daemon=True)  # a hung client is left behind
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        return f"no answer within {timeout_s:g} s (network, credentials or the bucket's name)"
    return outcome[0]


# ------------------------------------------------------------------------------------------- progress
class Watchdog:
    """Notices a sweep that stopped moving: :meth:`observe` is given, at every step of the driver's loop, a
    value that changes whenever anything progresses (trial states, epochs reported, probe results) and
    whether work is visibly under way; it answers True once neither has happened for ``timeout_s``
    seconds (never with ``timeout_s`` 0). A trial that waits for resources no node gives leaves Tune's loop
    turning without progress: this is what turns that silent hang into an error."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s, self.clock = float(timeout_s), clock
        self._signature: Any = object()
        self._since = clock()

    def observe(self, signature: Any, busy: bool = False) -> bool:
        now = self.clock()
        if busy or signature != self._signature:
            self._signature, self._since = signature, now
            return False
        return self.timeout_s > 0 and now - self._since >= self.timeout_s

    @property
    def idle_s(self) -> float:
        return self.clock() - self._since


def _console_tail(console_log: Path | None, tail_bytes: int = 50_000, since: int = 0) -> str:
    """The end of the run's console log (what Ray and Tune printed), from byte ``since`` on (what this
    driver appended), or "" without one."""
    if console_log is None or not console_log.is_file():
        return ""
    with open(console_log, "rb") as handle:
        handle.seek(max(since, console_log.stat().st_size - tail_bytes))
        return handle.read().decode("utf-8", "replace")


# Lines of Ray's and Tune's log that say why nothing is scheduled (quoted when a sweep stalls)
_RAY_WAIT_REASONS = re.compile(r"insufficient|infeasible|cannot be scheduled|no available node|enough resources|"
                               r"waiting for resources|pending", re.IGNORECASE)


def ray_wait_reason(console_log: Path | None, tail_bytes: int = 200_000) -> str | None:
    """The last line of the run's console log (what Ray and Tune printed) that says why work waits."""
    for line in reversed(_console_tail(console_log, tail_bytes).splitlines()):
        if _RAY_WAIT_REASONS.search(line) and "[iclmem]" not in line:
            return " ".join(line.split())[:400]
    return None


def _resources_text(resources: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items()) if v and not k.startswith(("node:", "memory",
                     "object_store_memory", "accelerator_type"))) or "nothing"


def stall_reason(trials: list, idle_s: float, console_log: Path | None) -> str:
    """One paragraph: how long nothing moved, what waits and what it asks, what the cluster has, and Ray's own
    explanation from the console log when it gave one."""
    import ray

    pending = [t for t in trials if str(t.status) == "PENDING"]
    parts = [f"no progress for {idle_s / 60:.1f} min"]
    if pending:
        try:
            asks = dict(pending[0].placement_group_factory.required_resources)
        except Exception:  # noqa: BLE001 - the explanation must not fail on an internal attribute
            asks = {}
        parts.append(f"{len(pending)} trial(s) waiting to start, each asking {_resources_text(asks)}")
    try:
        parts.append(f"the cluster holds {_resources_text(ray.cluster_resources())} ("
                     f"{_resources_text(ray.available_resources())} free)")
    except Exception:  # noqa: BLE001
        pass
    quote = ray_wait_reason(console_log)
    if quote:
        parts.append(f'Ray says: "{quote}"')
    return "; ".join(parts)


class Progress:
    def __init__(self, n_trials: int, enabled: bool = True, log: Callable[[str], None] = print) -> None:
        self.n_trials, self.enabled, self.log = n_trials, enabled, log
        self.done = self.failed = self.running = 0
        self.watchdog: Watchdog | None = None  # set by the driver from resources.stall_timeout_min
        self.console_log: Path | None = None  # where Ray's messages go (quoted when the sweep stalls)
        self.stall: str | None = None  # why the sweep was stopped for making no progress
        self.verdicts: dict[tuple[str, int], str] = {}  # (run_id, epoch) -> outcome; a re-probe counts once
        self.trial_status: dict[str, str] = {}  # run_id -> Tune's status of its trial, as last seen
        self._last_line = ""
        self._last_time = 0.0

    def outcome(self, row: dict[str, Any]) -> None:
        self.verdicts[(row["run_id"], int(row["epoch"]))] = row["outcome"]

    def show(self, force: bool = False) -> None:
        """Print a status line when something changed, and at least every 30 s while work goes on."""
        counts: dict[str, int] = {}
        for outcome in self.verdicts.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        outcomes = " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "-"
        line = (f"[iclmem] trials {self.done}/{self.n_trials} done, {self.running} running, {self.failed} failed | "
                f"checkpoints probed {len(self.verdicts)} | outcomes {outcomes}")
        now = time.monotonic()
        if self.enabled and (force or line != self._last_line or now - self._last_time > 30):
            self.log(line)
            self._last_line, self._last_time = line, now


class ProbeOnCheckpoint:
    """Tune callback that hands each checkpoint to the probe pool the moment Tune has written it.

    Tune pickles its callbacks into the experiment state; the pool (live actor handles) is left out of
    that state and re-attached by ``iclmem resume``, since handles of a dead driver cannot be restored.
    """

    def __init__(self, pool: Any, probes_dir: Path, progress: Progress, trial_logger: Any) -> None:
        self.attach(pool, probes_dir, progress, trial_logger)

    def attach(self, pool: Any, probes_dir: Path, progress: Progress, trial_logger: Any) -> None:
        """``trial_logger`` (a :class:`orchestrator.wandb_logger.TrialLogger`) gets every probe row polled."""
        self.pool, self.probes_dir, self.progress, self.trial_logger = pool, probes_dir, progress, trial_logger
        self.submitted: set[tuple[str, str]] = set()

    def __getstate__(self) -> dict[str, Any]:
        return {"probes_dir": self.probes_dir}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.pool, self.progress, self.probes_dir, self.submitted = None, None, state["probes_dir"], set()
        self.trial_logger = None

    # Tune's Callback interface (duck-typed so this class stays importable without a Tune subclass).
    def on_trial_result(self, iteration, trials, trial, result, **info):
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

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        if self.pool is None:
            return
        epoch = int((trial.last_result or {}).get("epoch", -1))
        if self.trial_logger is not None:  # W&B lineage: the checkpoint by reference, with its inputs
            self.trial_logger.log_checkpoint(_unwrap(trial.config), epoch, checkpoint_uri(checkpoint))
        for job in jobs_for(_unwrap(trial.config), epoch, checkpoint, self.probes_dir):
            if (job.out_dir, job.stem) not in self.submitted:
                self.submitted.add((job.out_dir, job.stem))
                self.pool.submit(job)

    def on_step_end(self, iteration, trials, **info):
        if self.pool is None:
            return
        for row in self.pool.poll():
            self.progress.outcome(row)
            self.trial_logger.log_probe(row)
        for t in trials:
            run_id = _unwrap(t.config or {}).get("run_id")
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


def _tune_callback(pool: Any, probes_dir: Path, progress: Progress, trial_logger: Any):
    from ray.tune import Callback

    class _ProbeOnCheckpoint(ProbeOnCheckpoint, Callback):
        pass

    return _ProbeOnCheckpoint(pool, probes_dir, progress, trial_logger)


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

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.trial_logger is not None:
            self.trial_logger.log_training(_unwrap(trial.config)["identity"], result)


def _trial_results_callback(trial_logger: Any):
    from ray.tune import Callback

    class _LogTrialResults(LogTrialResults, Callback):
        pass

    return _LogTrialResults(trial_logger)


class TimeTrials:
    """Tune callback: each trial's wall time as the driver sees it (start to completion) and the epoch and save
    seconds its results report (``trainables.trainable.EPOCH_SECONDS`` / ``SAVE_SECONDS``), for the run's
    timings (``orchestrator.timing``). Left out of Tune's pickled state: a resumed driver times its own part."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.trial_s = self.epoch_s = self.save_s = self.work_wall_s = 0.0
        self.first_start: float | None = None
        self.last_end: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()

    def on_trial_start(self, iteration, trials, trial, **info):
        now = time.perf_counter()
        self.started[str(trial.trial_id)] = now
        self.first_start = now if self.first_start is None else self.first_start

    def on_trial_result(self, iteration, trials, trial, result, **info):
        from trainables.trainable import EPOCH_SECONDS, EPOCH_WALL_SECONDS, SAVE_SECONDS, SAVE_WALL_SECONDS

        self.epoch_s += float(result.get(EPOCH_SECONDS) or 0.0)
        self.save_s += float(result.get(SAVE_SECONDS) or 0.0)
        self.work_wall_s += float(result.get(EPOCH_WALL_SECONDS) or 0.0) + float(result.get(SAVE_WALL_SECONDS) or 0.0)

    def _ended(self, trial: Any) -> None:
        now = time.perf_counter()
        start = self.started.pop(str(trial.trial_id), None)
        if start is not None:
            self.trial_s += now - start
        self.last_end = now

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._ended(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._ended(trial)

    @property
    def span_s(self) -> float:
        """From the first trial's start to the last one's end."""
        if self.first_start is None or self.last_end is None:
            return 0.0
        return max(self.last_end - self.first_start, 0.0)


def _trial_timer():
    from ray.tune import Callback

    class _TimeTrials(TimeTrials, Callback):
        pass

    return _TimeTrials()


def checkpoint_uri(checkpoint: Any) -> str:
    """Where a Tune checkpoint is, as a URI: its local path, or ``s3://``/``gs://``... on a bucket (Tune keeps
    the path without the scheme and the pyarrow file system beside it)."""
    kind = str(getattr(getattr(checkpoint, "filesystem", None), "type_name", "local"))
    path = str(checkpoint.path)
    if kind in ("local", "") or "://" in path:
        return path
    return f"{'gs' if kind == 'gcs' else kind}://{path}"


def jobs_for(config: dict[str, Any], epoch: int, checkpoint: Any, probes_dir: Path) -> list:
    """One probe job per task of the run: a multi-task run (multi_fixed, multi_random) is probed on every
    one of its tasks, one results row per task (``task`` = that task's name; stems ``eNNNN-tI``)."""
    from probes.actors import ProbeJob

    keys = list(config["task_keys"])
    names = str(config["identity"]["task"]).split("+")
    jobs = []
    for i, key in enumerate(keys):
        identity = dict(config["identity"])
        stem = probe_stem(epoch)
        if len(keys) > 1:
            identity["task"] = names[i] if len(names) == len(keys) else f"{identity['task']}[{i}]"
            stem = f"{stem}-t{i}"
        jobs.append(ProbeJob(identity=identity, epoch=epoch, checkpoint=checkpoint, task_key=key,
                             out_dir=str(probes_dir / identity["run_id"]), stem=stem,
                             recipe={"finetune": config["finetune"], "task_keys": keys,
                                     "torch_threads": int(config.get("torch_threads", 1))}))
    return jobs


# ------------------------------------------------------------------------------------------- the sweep
def damaged_tune_state(experiment: str) -> str | None:
    """The newest experiment-state file of a local Tune experiment folder when it does not parse (Tune would
    restore no trial from it, or trials without their configs), else None. Buckets are left to Tune."""
    folder = Path(experiment)
    if "://" in experiment or not folder.is_dir():
        return None
    states = sorted(folder.glob("experiment_state-*.json"))
    if not states:
        return None
    try:
        json.loads(states[-1].read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return str(states[-1])
    return None


def _tuner(prepared: PreparedSweep, run_dir: Path, callbacks: list, restore: bool,
           log: Callable[[str], None] = print):
    from ray import tune

    from trainables.trainable import finetune_trainable

    sweep = prepared.sweep
    storage = storage_for(sweep, run_dir)
    check_storage(storage)
    res = sweep.resources
    trainable = tune.with_resources(
        tune.with_parameters(finetune_trainable, prepared=prepared.tasks),
        {"cpu": res.cpus_per_trial, "gpu": res.gpus_per_trial, **res.trial_resources},
    )
    if restore:
        path = f"{storage.rstrip('/')}/{EXPERIMENT_NAME}"
        damaged = damaged_tune_state(path)
        if damaged is None and tune.Tuner.can_restore(path):
            try:
                return tune.Tuner.restore(path, trainable=trainable, resume_errored=True)
            except Exception as exc:  # noqa: BLE001 - a state Tune cannot read is handled as damaged below
                damaged = f"{path} ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"
        if damaged is not None:
            aside = f"{path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
            os.rename(path, aside)
            log(f"[iclmem] WARNING Tune's experiment state {damaged} is damaged (a full disk, or a crash while it was "
                f"written): set aside as {aside}. The trials start again from epoch 0 (fine-tuning is deterministic: "
                "the same checkpoints), and every stored probe result is kept")
        # Stopped before Tune saved any state (e.g. Ctrl-C while the probe pool started): no trial has
        # a checkpoint yet, so starting them afresh loses nothing.
    configs = [trial_config(t, prepared) for t in prepared.trials]
    failure = tune.FailureConfig(max_failures=sweep.max_failures)
    run_config = tune.RunConfig(
        name=EXPERIMENT_NAME, storage_path=storage, failure_config=failure, callbacks=callbacks,
        checkpoint_config=tune.CheckpointConfig(num_to_keep=None), verbose=0,
    )
    # Reused trial actors: a trial starts in a process that already imported torch, Tune and iclmem (the
    # trainable is a pure function of its config and checkpoint: it sets its own threads and seeds, so a
    # reused process gives the same results; measured: a 4-trial sweep 28 s -> 13 s on 2 CPUs).
    tune_config = tune.TuneConfig(max_concurrent_trials=res.max_concurrent_trials, reuse_actors=True)
    return tune.Tuner(trainable, param_space=_flat_space(configs), tune_config=tune_config, run_config=run_config)


def reattach(tuner: Any, pool: Any, probes_dir: Path, progress: Progress, trial_logger: Any) -> None:
    """Give the restored callbacks the new driver's pool and trial logger. Tune offers no public hook
    for this; if its internals move, probing still completes (and probe rows still reach the trial
    logger) in the catch-up pass after ``fit``, while training metrics of the resumed epochs go unlogged."""
    try:
        callbacks = tuner._local_tuner.get_run_config().callbacks or []
    except AttributeError:
        return
    for callback in callbacks:
        if isinstance(callback, ProbeOnCheckpoint):
            callback.attach(pool, probes_dir, progress, trial_logger)
        elif isinstance(callback, LogTrialResults):
            callback.trial_logger = trial_logger


def storage_for(sweep: SweepConfig, run_dir: Path) -> str:
    """The sweep's storage_path; else $ICLMEM_STORAGE/<sweep>-<config hash> (set on clusters); else RUN_DIR/tune."""
    if sweep.storage_path:
        return sweep.storage_path
    shared = os.environ.get("ICLMEM_STORAGE")
    if shared:
        return f"{shared.rstrip('/')}/{sweep.name}-{sweep.config_hash()}"
    return str((run_dir / TUNE_DIR).resolve())


def _flat_space(configs: list[dict[str, Any]]) -> dict[str, Any]:
    # One grid axis whose values are whole trial configs: Tune then names trials by index and each
    # trial's config is exactly what ``trial_config`` built (no cross product we did not ask for).
    from ray import tune

    return {"__trial__": tune.grid_search(configs)}


def _unwrap(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("__trial__", config)


def trial_logger_for(sweep: SweepConfig, run_dir: Path):
    """The sweep's per-trial logger: W&B runs opened by this driver (offline unless the sweep asks for
    online and ``WANDB_API_KEY`` is set), or a no-op when W&B is disabled. wandb reads the key from this
    process's environment; nothing passes it to Ray."""
    from orchestrator.wandb_logger import make_trial_logger, resolve_wandb_mode

    mode = resolve_wandb_mode(sweep.wandb.mode)
    if mode == "disabled":
        return make_trial_logger(None)
    return make_trial_logger("wandb", run_dir=run_dir, project=sweep.wandb.project, group=sweep.name,
                             entity=sweep.wandb.entity, mode=mode, config_hash=sweep.config_hash())


# ------------------------------------------------------------------------------------------- Ctrl-C


class Interrupts:
    """SIGINT (Ctrl-C) while a sweep driver runs.

    The first stops the sweep. While ``Tuner.fit`` runs it is turned into Tune's own graceful stop,
    SIGUSR1 (Ray 2.x ``tune.py``: the loop ends after the current step, the experiment state is saved,
    trials are stopped), rather than a KeyboardInterrupt raised somewhere inside Tune's loop. Tune's
    own SIGINT handler is switched off (``TUNE_DISABLE_SIGINT_HANDLER``) because the driver must know
    the sweep was interrupted, which that handler only logs (with a ``Tuner.restore`` hint that is wrong
    for iclmem). Outside ``fit`` (Stage I, the final drain) it raises KeyboardInterrupt. A second SIGINT
    ends the process at once (``os._exit``): whatever clean-up is under way is abandoned."""

    def __init__(self) -> None:
        self.count = 0
        self.in_tune = False
        self.console_fd = 2  # where the second Ctrl-C's one line goes; the terminal under quiet_console
        self.run_dir = ""
        self.resume_command = "iclmem resume"  # what continues the sweep (``iclmem lm resume`` for LM sweeps)
        self.record: Callable[[], None] | None = None  # records the interruption in the run folder

    @property
    def interrupted(self) -> bool:
        return self.count > 0

    def handler(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count > 1:
            if self.record is not None:
                try:  # one small atomic write, so that the folder does not claim a driver is still running
                    self.record()
                except Exception:  # exiting at once matters more than the record
                    pass
            hint = f"; `{self.resume_command} {self.run_dir}` continues it" if self.run_dir else ""
            os.write(self.console_fd, f"iclmem: interrupted again, exiting at once{hint}\n".encode())
            os._exit(EXIT_INTERRUPTED)
        if self.in_tune and _tune_listens_to_sigusr1():
            os.kill(os.getpid(), signal.SIGUSR1)
            return
        raise KeyboardInterrupt


def _tune_listens_to_sigusr1() -> bool:
    handler = signal.getsignal(signal.SIGUSR1)
    return callable(handler) and getattr(handler, "__module__", "").startswith("ray.tune")


@contextmanager
def catch_interrupts() -> Iterator[Interrupts]:
    """Install :class:`Interrupts` for SIGINT and SIGTERM for the duration of a sweep (main thread only:
    Python delivers signals there; elsewhere the process's own handling stays)."""
    state = Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous = signal.getsignal(signal.SIGINT)
    previous_term = signal.getsignal(signal.SIGTERM)
    previous_usr1 = signal.getsignal(signal.SIGUSR1)
    previous_env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    signal.signal(signal.SIGINT, state.handler)
    # SIGTERM is how a scheduler stops a job (Slurm's scancel and time limit, Kubernetes deleting a pod): the
    # same clean stop as Ctrl-C, so the run is recorded interrupted and `iclmem resume` continues it
    signal.signal(signal.SIGTERM, state.handler)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGUSR1, previous_usr1)  # Tune leaves its handler installed after fit
        if previous_env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = previous_env


class _DropRestoreHint(logging.Filter):
    """Tune ends an interrupted run with "Resume experiment with: Tuner.restore(...)"; an iclmem sweep is
    continued with ``iclmem resume``, which the driver prints instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tuner.restore" not in record.getMessage()


# iclmem's own packages: a warning raised there is about the user's sweep (a dropped column, a damaged cache
# entry) and is shown on the console too, in one line; other packages' warnings go to the console log only.
OWN_PACKAGES = tuple(str(Path(__file__).resolve().parents[1] / name) + os.sep
                     for name in ("iclmem", "orchestrator", "trainables", "probes"))


@contextmanager
def console_warnings(console: Console) -> Iterator[None]:
    """While a quiet console is in force: every Python warning in full (with its source path) into the
    console log, and iclmem's own ones also as one line (each once) on the terminal."""
    original = warnings.showwarning
    shown: set[str] = set()

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        original(message, category, filename, lineno, file, line)
        text = f"[iclmem] warning: {message}"
        if str(filename).startswith(OWN_PACKAGES) and text not in shown:
            shown.add(text)
            console.error(text)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original


def probe_pool_key(model_cfg: Any) -> tuple[str, str]:
    """Which probe pool a model's runs are probed by: one pool per distinct model (name and options)."""
    return model_cfg.name, json.dumps(dict(model_cfg.options), sort_keys=True, default=str)


def probe_pool_count(sweep: Any) -> int:
    """How many probe pools a sweep with trials starts (``start_probe_pools``), each of
    ``resources.probe_actors`` actors."""
    return len({probe_pool_key(m) for m in sweep.models})


def unsatisfiable_resources(resources: Any, available: dict[str, float], pools: int = 1) -> list[str]:
    """What a single Ray node holding ``available`` (``ray.cluster_resources()``) can never give one trial or
    one probe actor of ``resources`` (the sweep's ``resources`` block), one line each naming the setting.
    ``pools``: the probe pools the sweep starts (:func:`probe_pool_count`; 0 without trials), whose actors
    all hold their share for the whole sweep."""
    asks = [("resources.cpus_per_trial", "CPU", resources.cpus_per_trial),
            ("resources.gpus_per_trial", "GPU", resources.gpus_per_trial),
            ("resources.cpus_per_probe_actor", "CPU", resources.cpus_per_probe_actor),
            ("resources.gpus_per_probe_actor", "GPU", resources.gpus_per_probe_actor)]
    asks += [(f"resources.trial_resources.{k}", k, v) for k, v in resources.trial_resources.items()]
    asks += [(f"resources.probe_resources.{k}", k, v) for k, v in resources.probe_resources.items()]
    problems = []
    for setting, kind, amount in asks:
        have = float(available.get(kind, 0.0))
        if amount and amount > have:
            problems.append(f"{setting}: {amount:g} {kind} asked, the local Ray has {have:g}"
                            + (" (no GPU found)" if kind == "GPU" and not have else ""))
    if problems:
        return problems
    # the probe actors start first and hold their share for the whole sweep: a trial must fit beside them
    for kind, per_trial, per_actor in (("CPU", resources.cpus_per_trial, resources.cpus_per_probe_actor),
                                       ("GPU", resources.gpus_per_trial, resources.gpus_per_probe_actor)):
        actors = resources.probe_actors * pools
        held = actors * per_actor
        have = float(available.get(kind, 0.0))
        if per_trial and held and per_trial + held > have:
            who = (f"{actors} probe actor(s)" if pools == 1 else
                   f"{actors} probe actors ({resources.probe_actors} for each of the sweep's {pools} models)")
            problems.append(f"resources.{kind.lower()}s_per_trial: {per_trial:g} {kind} asked, but the "
                            f"{who} hold {held:g} of the local Ray's {have:g} "
                            f"{kind} for the whole sweep: no trial could start (lower it, or "
                            f"resources.probe_actors / {kind.lower()}s_per_probe_actor)")
    return problems


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def failure_cause(error: BaseException | str) -> str:
    """One line for a trial's error: the last ``SomethingError: ...`` line of Ray's wrapped traceback (the
    trainable's own exception), without terminal colours; else the error's first line."""
    lines = [_ANSI.sub("", line).strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line]
    named = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b.*:", line)]
    cause = (named[-1] if named else lines[0] if lines else type(error).__name__)
    return cause[:300]


def trial_failures(grid: Any) -> dict[str, list[str]]:
    """Distinct causes of the trials Tune ended on an error, each with the run ids it stopped (sorted)."""
    causes: dict[str, list[str]] = {}
    for result in grid:
        if getattr(result, "error", None) is None:
            continue
        run_id = str(_unwrap(result.config or {}).get("run_id", "?"))
        causes.setdefault(failure_cause(result.error), []).append(run_id)
    return {cause: sorted(runs) for cause, runs in causes.items()}


def incomplete_runs(prepared: PreparedSweep, progress: Progress) -> list[str]:
    """Run ids whose trial Tune had not seen to the end (status TERMINATED) when the sweep stopped; a
    trial the driver never saw counts as incomplete."""
    return sorted(t.run_id for t in prepared.trials if progress.trial_status.get(t.run_id) != "TERMINATED")


def run_sweep(config_path: str | Path | None, run_dir: str | Path, *, sweep: SweepConfig | None = None,
              address: str | None = None, resume: bool = False, progress: bool = True,
              num_cpus: int | None = None, log: Callable[[str], None] = print,
              verbose: bool = True, started_at: float | None = None) -> pd.DataFrame:
    """Run (or resume) a whole sweep; returns the results table (also at ``RUN_DIR/results.parquet``).

    ``verbose=False`` (the command line's default) keeps what Ray, Tune, wandb and Python warnings print
    in ``RUN_DIR/console.log``; iclmem's own lines still reach the terminal. Ctrl-C raises
    :class:`SweepInterrupted` after a bounded clean-up, with ``run_state.json`` saying so
    (:func:`iclmem.runfolder.write_run_state`). ``started_at``: when the driver process started (``time.time()``
    seconds; the command line passes its own), so the run's timings count the driver's start; without it
    they start here."""
    with catch_interrupts() as interrupts:
        try:
            return _run_sweep(config_path, run_dir, sweep=sweep, address=address, resume=resume, progress=progress,
                              num_cpus=num_cpus, log=log, verbose=verbose, interrupts=interrupts,
                              started_at=started_at)
        except KeyboardInterrupt:
            # Stopped outside Tune's loop (Stage I, the drain): _run_sweep's clean-up has run and the state
            # is recorded where a folder exists.
            folder = Path(run_dir).resolve()
            if (folder / SWEEP_FILE).is_file():
                raise SweepInterrupted(str(folder)) from None
            raise SweepInterrupted(str(folder), hint="interrupted before the run folder was written \u2014 start "
                                   f"again with `iclmem run {config_path or 'CONFIG'} --out {folder}`") from None


def _run_sweep(config_path: str | Path | None, run_dir: str | Path, *, sweep: SweepConfig | None,
               address: str | None, resume: bool, progress: bool, num_cpus: int | None,
               log: Callable[[str], None], verbose: bool, interrupts: Interrupts,
               started_at: float | None = None) -> pd.DataFrame:
    from orchestrator.timing import Phase, PhaseClock

    clock = PhaseClock()  # the driver's phases, for RUN_DIR/timings.json
    entered = time.time()
    if started_at is not None:
        clock.add(Phase.DRIVER_START, entered - started_at)
    run_dir = Path(run_dir).resolve()
    refuse_if_held(run_dir)  # a folder another driver works in is refused as such, before anything is read
    if resume:
        if not (run_dir / SWEEP_FILE).is_file() and folder_kind(run_dir) == "lm":
            raise ConfigError(f"{run_dir} is a language-model probe run: continue it with `iclmem lm resume {run_dir}`")
        sweep = RunFolder(run_dir).sweep
        check_results_match(run_dir, sweep)
    elif sweep is None:
        sweep = load_sweep(config_path)
    if not resume:
        claim_run_folder(run_dir, sweep)  # someone else's folder is refused before anything touches it
    require_writable(run_dir, resume)
    # one driver per folder, from here to the end: a second `run`, `resume` or `report` is refused (exit 2)
    with hold_run_folder(run_dir, "iclmem resume" if resume else "iclmem run"):
        return _run_sweep_holding(config_path, run_dir, sweep=sweep, address=address, resume=resume,
                                  progress=progress, num_cpus=num_cpus, log=log, verbose=verbose,
                                  interrupts=interrupts, clock=clock, entered=entered, started_at=started_at)


def _run_sweep_holding(config_path: str | Path | None, run_dir: Path, *, sweep: SweepConfig, address: str | None,
                       resume: bool, progress: bool, num_cpus: int | None, log: Callable[[str], None], verbose: bool,
                       interrupts: Interrupts, clock: Any, entered: float, started_at: float | None) -> pd.DataFrame:
    """:func:`_run_sweep` once the folder's lock is held: Stage I, the drive, the state record."""
    from orchestrator.timing import Phase

    # whether no driver of this folder has started any work yet: only then is a refusal after Stage I recorded as
    # one that leaves the folder to a corrected config (iclmem.runfolder.never_started)
    pristine = folder_kind(run_dir) in ("missing", "empty") or never_started(run_dir) is not None
    replaced = None
    if resume:  # read again under the lock: what was checked before it may have changed since
        check_results_match(run_dir, sweep)
    elif claim_run_folder(run_dir, sweep):
        # the same config's folder: continue it as `iclmem resume` would, never re-train a finished trial
        check_results_match(run_dir, sweep)
        log(f"[iclmem] {run_dir} holds this sweep already: continuing it (finished trials are kept, as `iclmem "
            "resume` does)")
        resume = True
    elif folder_kind(run_dir) == "tabular":  # a refused sweep of another config that never started: replaced
        replaced = RunFolder(run_dir).sweep
        why = (never_started(run_dir) or "").strip().splitlines()
        log(f"[iclmem] {run_dir} holds the sweep {replaced.name!r} (hash {replaced.config_hash()}), refused before "
            f"any trial started ({why[0][:300] if why else 'refused'}): replacing it by this one")
    from orchestrator.wandb_logger import resolve_wandb_mode

    resolve_wandb_mode(sweep.wandb.mode)  # says now, on the terminal, when the environment overrides the mode
    source = str(config_path) if config_path else str(run_dir / SWEEP_FILE) if resume else f"sweep {sweep.name!r}"
    # Python warnings of Stage I are held until the run folder (and its console log) exists.
    with warnings.catch_warnings(record=True) as early_warnings, clock(Phase.STAGE_I):
        check_context_audits(sweep, log)  # regime context: its Stage I (in memory) before any folder or cluster work
        prepared = prepare_in_place_or_staged(sweep, run_dir, log=log if progress else (lambda _m: None),
                                              source=source, replace=replaced is not None)
    record_sweep(run_dir, sweep)
    write_run_state(run_dir, RunStatus.RUNNING)
    interrupts.run_dir = str(run_dir)
    log_file = run_dir / CONSOLE_LOG_FILE
    log_start = log_file.stat().st_size if log_file.is_file() else 0  # an earlier driver's lines are not ours
    with quiet_console(None if verbose else run_dir / CONSOLE_LOG_FILE) as console, \
            (console_warnings(console) if not verbose else nullcontext()):
        for w in early_warnings:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        interrupts.console_fd = console.err.fileno()
        if log is print:  # the default: iclmem's own lines go to the terminal, not into the console log
            log = console.line
        try:
            return _drive(prepared, run_dir, address=address, resume=resume, progress=progress, num_cpus=num_cpus,
                          log=log, console=console, interrupts=interrupts, clock=clock,
                          wall_from=started_at if started_at is not None else entered)
        except (KeyboardInterrupt, SweepInterrupted, SweepStalled, TrialsFailed, DiskFull):  # _drive recorded the state
            raise
        except RefusedBeforeStart as exc:  # nothing started: a corrected config may take the folder if nothing ever did
            write_run_state(run_dir, RunStatus.FAILED, note=f"{type(exc).__name__}: {exc}"[:2000], refused=pristine)
            raise
        except BaseException as exc:
            said = [line.strip() for line in _console_tail(console.log_path, since=log_start).splitlines()
                    if is_disk_full(line)]
            storage = storage_for(sweep, run_dir)
            full = [folder for _, folder, free in free_space(run_dir, storage) if free < FULL_DISK_BYTES]
            own = is_disk_full(exc)
            # Tune may fail on the damage a full disk did (a half-written state file), not on the disk itself
            if own or said or full:
                detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                raise disk_full_error(run_dir, storage, detail if own or not said else said[-1]) from None
            write_run_state(run_dir, RunStatus.FAILED, note=f"{type(exc).__name__}: {exc}"[:2000])
            raise


def _drive(prepared: PreparedSweep, run_dir: Path, *, address: str | None, resume: bool, progress: bool,
           num_cpus: int | None, log: Callable[[str], None], console: Console,
           interrupts: Interrupts, clock: Any = None, wall_from: float | None = None) -> pd.DataFrame:
    """Ray side of :func:`run_sweep`: probe pools, Tune, the catch-up pass and aggregation."""
    import ray

    from orchestrator.aggregate import aggregate
    from orchestrator.timing import Phase, PhaseClock

    clock = clock or PhaseClock()
    timer = _trial_timer()
    spent: dict[str, Any] = {"fit_s": 0.0, "drain_s": 0.0, "actor_start_s": 0.0, "workers": 0, "results": None}

    sweep = prepared.sweep
    trial_logger = trial_logger_for(sweep, run_dir)  # opens nothing until the first result
    restore_hint = _DropRestoreHint()
    tune_logger = logging.getLogger("ray.tune.tune")
    tune_logger.addFilter(restore_hint)
    pool = None
    started = False
    finish_timeout: float | None = None
    prog = Progress(len(prepared.trials), enabled=progress, log=log)
    stall_timeout_s = sweep.resources.stall_timeout_min * 60
    prog.watchdog = Watchdog(stall_timeout_s)
    prog.console_log = console.log_path
    interrupts.record = lambda: write_run_state(
        run_dir, RunStatus.INTERRUPTED, incomplete_runs(prepared, prog),
        note=f"stopped by a second Ctrl-C, clean-up skipped; {len(prog.verdicts)} checkpoint result(s) kept")
    try:
        if address:
            from iclmem.raysession import unreachable_address

            why = unreachable_address(address)
            if why:  # after the config and the tables were checked, before Ray: ray.init would retry for minutes
                raise RefusedBeforeStart(f"--address {address}: no Ray head there, {why}; start one with `ray start "
                                         "--head` (or give the address `ray status` prints), or drop --address to "
                                         "run on an embedded Ray")
        storage = storage_for(sweep, run_dir)
        why = unreachable_storage(storage)
        if why:  # before Ray and before any trial: Tune would fail on its first checkpoint
            raise RefusedBeforeStart(f"storage_path {storage}: cannot keep checkpoints there: {why}; fix storage_path "
                                     "in the sweep (or the credentials of its bucket). Stage I's results are kept")
        with clock(Phase.RAY):
            started = ensure_ray(address, num_cpus=num_cpus)
        available = ray.cluster_resources()
        spent["workers"] = int(available.get("GPU", 0) if sweep.resources.gpus_per_trial > 0 else available.get("CPU", 0))
        if not address:
            # one local node: a trial or actor asking for more than it holds would wait forever, silently
            problems = unsatisfiable_resources(sweep.resources, ray.cluster_resources(),
                                               pools=probe_pool_count(sweep) if prepared.trials else 0)
            if problems:
                raise RefusedBeforeStart("the local Ray cannot run this sweep (nothing was started; Stage I's results "
                                         "are kept):\n  - " + "\n  - ".join(problems))
        audits = submit_context_audits(sweep, run_dir, log)  # regime context: Ray tasks beside the trials
        causes: dict[str, list[str]] = {}
        if prepared.trials:
            pool = start_probe_pools(prepared, run_dir)
            probes_dir = run_dir / PROBES_DIR
            for key, identity in prepared.controls:
                from probes.actors import ProbeJob

                pool.submit(ProbeJob(identity, 0, None, key, str(probes_dir / identity["run_id"]), "e0000"))
            callbacks = [_tune_callback(pool, probes_dir, prog, trial_logger), _trial_results_callback(trial_logger),
                         timer]
            tuner = _tuner(prepared, run_dir, callbacks, restore=resume, log=log)
            if resume:
                reattach(tuner, pool, probes_dir, prog, trial_logger)
            interrupts.in_tune = True
            fit_started = time.perf_counter()
            try:
                grid = tuner.fit()
            finally:
                interrupts.in_tune = False
                spent["fit_s"] = time.perf_counter() - fit_started
            if prog.stall is not None:  # the watchdog stopped Tune: resumable, like an interruption, but exit 1
                finish_timeout = WANDB_FINISH_TIMEOUT_S
                for row in pool.poll():
                    prog.outcome(row)
                    trial_logger.log_probe(row)
                write_run_state(run_dir, RunStatus.INTERRUPTED, incomplete_runs(prepared, prog),
                                note=f"stopped for making no progress: {prog.stall}"[:2000])
                raise SweepStalled(
                    f"{prog.stall}. The sweep was stopped ({len(prog.verdicts)} checkpoint result(s) kept in {run_dir}); "
                    "give the trials resources the cluster has (resources.* in the sweep) or add nodes, then "
                    f"`iclmem resume {run_dir}` (resources.stall_timeout_min sets this limit; 0 waits forever)")
            if interrupts.interrupted:
                # Tune has stopped the trials and saved its state. Results the probe pool has finished are
                # on disk already (each is stored by its actor); collect those that came in without waiting
                # for the jobs still running: the catch-up pass of `iclmem resume` resubmits them.
                finish_timeout = WANDB_FINISH_TIMEOUT_S
                for row in pool.poll():
                    prog.outcome(row)
                    trial_logger.log_probe(row)
                unfinished = incomplete_runs(prepared, prog)
                write_run_state(run_dir, RunStatus.INTERRUPTED, unfinished,
                                note=f"stopped by Ctrl-C; {len(prog.verdicts)} checkpoint result(s) kept")
                raise SweepInterrupted(str(run_dir))
            causes = trial_failures(grid)
            # Catch-up: every checkpoint on storage gets a result (already-probed ones return at once).
            for result in grid:
                config = _unwrap(result.config or {})
                if not config:
                    continue
                for checkpoint, metrics in result.best_checkpoints or []:
                    for job in jobs_for(config, int(metrics["epoch"]), checkpoint, probes_dir):
                        pool.submit(job)
            drain_started = time.perf_counter()
            try:
                drained = pool.drain(watchdog=Watchdog(stall_timeout_s))
                spent["drain_s"] = time.perf_counter() - drain_started
                spent["actor_start_s"] = pool.start_seconds()
            except SweepStalled as stalled:
                write_run_state(run_dir, RunStatus.INTERRUPTED, incomplete_runs(prepared, prog),
                                note=f"stopped for making no progress: {stalled}"[:2000])
                raise SweepStalled(f"{stalled}; every trial finished and the results stored are kept: `iclmem resume "
                                   f"{run_dir}` probes the rest") from None
            for row in drained:
                prog.outcome(row)
                trial_logger.log_probe(row)
            trial_logger.finish()  # every row is in: close the trial runs before the summary run starts
            prog.show(force=True)
            for note in pool.notes:
                log(f"[iclmem] WARNING {note}")
            if pool.failed:
                failed = [f"{j.identity.get('run_id', '?')}/{j.stem}" for j, _ in pool.failed]
                log(f"[iclmem] {len(pool.failed)} probe job(s) failed after retries: {failed}; first error: {pool.failed[0][1][:2000]}")
        audit_failures = finish_context_audits(audits, sweep, run_dir, log)
        with clock(Phase.REPORT):
            results = aggregate(run_dir, prepared, log=log) if prepared.trials else pd.DataFrame()
        if not prepared.trials:
            from orchestrator.report.context_audits import write_context_report

            log(f"[iclmem] report: {write_context_report(run_dir, f'IclMem report — {run_dir.name}')}")
        from iclmem.errors import ProbeError

        where = f" (Ray's and Tune's messages are in {console.log_path})" if console.log_path else ""
        full = [cause for cause in causes if is_disk_full(cause)]
        if full:  # not the trials' fault: resumable once there is room
            raise disk_full_error(run_dir, storage, full[0])
        if causes:
            failed_runs = sorted({run for runs in causes.values() for run in runs})
            for cause, runs in causes.items():
                log(f"[iclmem] {len(runs)} trial(s) failed: {cause} ({', '.join(runs[:5])}"
                    f"{f', and {len(runs) - 5} more' if len(runs) > 5 else ''})")
            write_run_state(run_dir, RunStatus.FAILED, failed_runs,
                            note=f"{len(failed_runs)} trial(s) failed: " + "; ".join(causes)[:1800])
            raise TrialsFailed(
                f"{len(failed_runs)} of {len(prepared.trials)} trial(s) failed (causes above){where}; the "
                f"{len(results)} checkpoint result(s) stored are kept in {run_dir}. Fix what the cause names and "
                "run again.", causes)
        if audit_failures:
            raise ProbeError(f"{len(audit_failures)} context audit(s) failed (above); every other result is saved in "
                             f"{run_dir}. `iclmem resume {run_dir}` runs the missing ones again.")
        if pool is not None and pool.failed:
            raise ProbeError(
                f"{len(pool.failed)} checkpoint(s) could not be probed (first error above); every other result is "
                f"saved in {run_dir}. `iclmem resume {run_dir}` probes the missing ones again."
            )
        if results.empty and prepared.trials:
            raise ProbeError(f"the sweep produced no checkpoint result (no trial reached a scheduled checkpoint); "
                             f"see the trial errors{where} and the Tune logs under {run_dir}")
        write_run_state(run_dir, RunStatus.COMPLETE)
        interrupts.record = None  # a Ctrl-C during the shutdown below leaves a complete sweep complete
        spent["results"] = results
        return results
    except KeyboardInterrupt:  # outside Tune's loop: Ray start-up, the probe pools, the final drain
        finish_timeout = WANDB_FINISH_TIMEOUT_S
        write_run_state(run_dir, RunStatus.INTERRUPTED, incomplete_runs(prepared, prog),
                        note=f"stopped by Ctrl-C; {len(prog.verdicts)} checkpoint result(s) kept")
        raise
    finally:
        tune_logger.removeFilter(restore_hint)
        # no-op once finished; on an error, flushes what the runs hold; after a Ctrl-C, for a bounded time
        trial_logger.finish(timeout=finish_timeout)
        if pool is not None:
            pool.shutdown()
        if started:
            with clock(Phase.RAY):
                ray.shutdown()
        if spent["results"] is not None and prepared.trials:  # a complete sweep: what it spent, phase by phase
            record_timings(run_dir, prepared, spent, timer, clock, wall_from, resume, log)


def record_timings(run_dir: Path, prepared: PreparedSweep, spent: dict[str, Any], timer: TimeTrials, clock: Any,
                   wall_from: float | None, resumed: bool, log: Callable[[str], None]) -> None:
    """Writes RUN_DIR/timings.json (``orchestrator.timing``) and prints the wall time; beside the last
    ``iclmem estimate`` of this sweep when there is one. Never fails the sweep: its results are in."""
    from orchestrator.timing import Phase, RunTimings, comparison_lines, human, load_prediction, write_timings

    try:
        from iclmem.runfolder import REFERENCE_RESULTS_FILE

        results = spent["results"]
        # the reference trials' checkpoints (probe.references) are probed like any other, their rows kept apart
        references = run_dir / REFERENCE_RESULTS_FILE
        if references.is_file():
            results = pd.concat([results, pd.read_parquet(references)], ignore_index=True)

        def total(column: str) -> float:
            return float(pd.to_numeric(results[column], errors="coerce").fillna(0).sum()) if column in results else 0.0

        score_s, reference_s, plan_s = (total(f"probe_{n}_seconds") for n in ("score", "reference", "plan"))
        tune_fixed = max(spent["fit_s"] - timer.span_s, 0.0)
        clock.add(Phase.TUNE_FIXED, tune_fixed)
        work = {Phase.TRIALS.value: max(timer.trial_s - timer.work_wall_s, 0.0),
                Phase.FINETUNE.value: timer.epoch_s + timer.save_s,
                Phase.SCORING.value: score_s, Phase.REFERENCE.value: reference_s, Phase.PLANS.value: plan_s,
                Phase.PROBE_REST.value: max(total("probe_device_seconds") - score_s - reference_s - plan_s, 0.0),
                Phase.ACTOR_START.value: spent["actor_start_s"]}
        notes = (() if Phase.DRIVER_START.value in clock.seconds
                 else ("driver start not measured: run_sweep called from Python",))
        timings = RunTimings(
            wall_s=time.time() - (wall_from or time.time()), parallel_s=timer.span_s + spent["drain_s"],
            serial=dict(clock.seconds), work=work, workers=int(spent["workers"]),
            probe_actors=prepared.sweep.resources.probe_actors, trials=len(prepared.trials),
            checkpoints=int(len(results)), resumed=resumed, recorded_at=time.strftime("%Y-%m-%d %H:%M:%S"),
            notes=notes)
        write_timings(run_dir, timings)
        biggest = sorted(((v, k) for k, v in {**timings.serial, **timings.work}.items()), reverse=True)[:3]
        log(f"[iclmem] wall time {human(timings.wall_s)}; most of it: "
            + ", ".join(f"{k} {human(v)}" for v, k in biggest) + f" (per phase: {run_dir / 'timings.json'})")
        prediction = load_prediction(prepared.sweep.config_hash())
        if prediction is None:
            log(f"[iclmem] `iclmem estimate --compare {run_dir}` sets a prediction beside these times")
        else:
            summary = next(line for line in comparison_lines(prediction, timings) if line.startswith("predicted "))
            log(f"[iclmem] beside `iclmem estimate` of {prediction.created}: {summary}")
    except Exception as exc:  # noqa: BLE001 - the timings are a report on the run, never a reason to fail it
        log(f"[iclmem] WARNING the run's timings were not recorded: {type(exc).__name__}: {exc}")


class RefusedBeforeStart(ConfigError):
    """A sweep refused after Stage I, before any trial, probe or audit started (resources the local Ray does not
    have, an unreachable Ray head or storage). The folder keeps Stage I's cache; when no work of it had ever
    started, ``run_state.json`` records the refusal so that a corrected config may take the folder over
    (:func:`claim_run_folder`), instead of being sent to an ``iclmem resume`` that would be refused again."""


def require_writable(run_dir: Path, resume: bool) -> None:
    """A driver (tabular or LM, new or resumed) refuses a run folder it could not write, before any work."""
    problem = unwritable(run_dir)
    if problem:
        raise ConfigError(f"{'run folder' if resume else '--out'} {run_dir}: {problem}; nothing was started")


def results_config_mismatch(run_dir: Path, sweep: SweepConfig) -> str | None:
    """Why the stored results of ``run_dir`` cannot be attributed to ``sweep`` (its ``sweep.json``), or None when
    they can: the provenance record (written with ``sweep.json``, before any result) must name the same config
    hash, and a folder that holds results (``results.parquet`` or ``probes/``) must have that record. The one
    check ``resume``, ``run``'s continuation of a folder and ``report`` share; each says what it refuses."""
    try:
        record = RunFolder(run_dir).provenance
    except DataError as exc:
        raise DataError(f"{exc}; the folder's results cannot be attributed to a config") from None
    if record is None:
        held = [name for name in (RESULTS_FILE, f"{PROBES_DIR}/") if (run_dir / name.rstrip("/")).exists()]
        if not held:
            return None
        return (f"{run_dir} holds results ({' and '.join(held)}) but no {PROVENANCE_FILE}: the config they were "
                f"made with is unknown, so {SWEEP_FILE} (config hash {sweep.config_hash()}) cannot be checked "
                f"against them (was {PROVENANCE_FILE} deleted?)")
    if record.config_hash != sweep.config_hash():
        return (f"{run_dir / SWEEP_FILE} (config hash {sweep.config_hash()}) no longer matches the config its results "
                f"were made with ({run_dir / PROVENANCE_FILE}: hash {record.config_hash}, sweep {record.sweep_name!r}): "
                f"was {SWEEP_FILE} edited?")
    return None


def check_results_match(run_dir: Path, sweep: SweepConfig) -> None:
    """The stored results of ``run_dir`` were made by ``sweep`` (:func:`results_config_mismatch`): a
    ``sweep.json`` edited after the run started, or a provenance record deleted, would otherwise mix rows of
    two configs under one folder; :class:`ConfigError` says which (both hashes, or the missing file)."""
    problem = results_config_mismatch(run_dir, sweep)
    if problem is not None:
        raise ConfigError(
            f"{problem} Resuming would mix results of two configs. Run the sweep in a new folder (`iclmem run "
            f"SWEEP --out NEW`), or restore {SWEEP_FILE} and {PROVENANCE_FILE} to resume this one; nothing was "
            "changed")


def claim_run_folder(run_dir: Path, sweep: SweepConfig | None = None, *, kind: str = "tabular",
                     config_hash: str | None = None) -> bool:
    """A new sweep writes into a new or empty folder, or continues a run of the same config; never into
    someone else's files or over another sweep's results (which would be attributed to this config).

    ``kind`` is the run this driver writes (what :func:`iclmem.runfolder.folder_kind` calls it): "tabular"
    (``iclmem run``, of ``sweep``) or "lm" (``iclmem lm run``, of the LM sweep whose hash is ``config_hash``).
    Returns True when the folder holds a run of the same config (to be continued), False for a new or empty
    one, or a tabular sweep of another config that was refused before any work of it started
    (:func:`iclmem.runfolder.never_started`: it holds no result, so it claims nothing); raises
    :class:`ConfigError` (nothing written) for any other folder."""
    found = folder_kind(run_dir)
    if found in ("missing", "empty"):
        return False
    if config_hash is None:
        if sweep is None:
            raise TypeError("claim_run_folder needs the sweep or its config_hash")
        config_hash = sweep.config_hash()
    if kind == "lm":
        if found == "lm":
            from iclmem.provenance import Provenance

            record = Provenance.read(run_dir)  # an "lm" folder has one
            if record is not None and record.config_hash == config_hash:
                return True
            name, stored_hash = (record.sweep_name, record.config_hash) if record is not None else ("?", "?")
            raise ConfigError(
                f"{run_dir} holds a language-model probe run of another config ({name!r}, hash {stored_hash}; "
                f"this one is {config_hash}): continue that one with `iclmem lm resume {run_dir}`, or give "
                "--out a new folder")
        if found == "tabular":
            raise ConfigError(f"{run_dir} holds a tabular sweep (`iclmem run`); give --out a new folder")
    else:
        if found == "tabular":
            stored = RunFolder(run_dir).sweep
            if stored.config_hash() == config_hash:
                return True
            if never_started(run_dir) is not None:  # refused before any trial: nothing of it to continue
                return False
            raise ConfigError(
                f"{run_dir} holds a sweep of another config ({stored.name!r}, hash {stored.config_hash()}; "
                f"this one is {config_hash}): continue that one with `iclmem resume {run_dir}`, or give "
                "--out a new folder")
        if found == "lm":
            raise ConfigError(f"{run_dir} holds a language-model probe run; give --out a new folder")
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--out {run_dir}: {run_dir} is a file, not a folder; nothing was started")
    raise ConfigError(f"{run_dir} is not empty and is not an iclmem run folder: iclmem writes nothing among other "
                      "files; give --out a new or empty folder")


def record_sweep(run_dir: Path, sweep: SweepConfig) -> None:
    """``sweep.json`` (the validated config ``iclmem resume`` reads back) and ``provenance.json``."""
    write_json_atomic(run_dir / SWEEP_FILE, sweep.model_dump(mode="json"))
    provenance(sweep).write(run_dir)


def prepare_in_place_or_staged(sweep: SweepConfig, run_dir: Path, log: Callable[[str], None],
                               source: str = "sweep", replace: bool = False) -> PreparedSweep:
    """Stage I for a new run folder happens in a staging folder renamed into place on success, so a
    sweep refused for bad input leaves no partial output behind. With ``data.cache_dir`` the prepared
    tasks are read from (and added to) that shared cache instead of ``RUN_DIR/prepared``. ``replace``: the
    folder holds a refused sweep of another config (:func:`claim_run_folder`), whose Stage I cache this one
    replaces on success."""
    import shutil

    if sweep.data.cache_dir:
        prepared = prepare_sweep(sweep, Path(sweep.data.cache_dir).expanduser().resolve(), log=log, source=source)
        run_dir.mkdir(parents=True, exist_ok=True)
        return prepared
    if folder_kind(run_dir) not in ("missing", "empty") and not replace:  # (the lock held is no content)
        return prepare_sweep(sweep, run_dir / PREPARED_DIR, log=log, source=source)
    staging = run_dir.with_name(f".{run_dir.name}.staging")  # the folder's lock keeps it this driver's own
    shutil.rmtree(staging, ignore_errors=True)
    try:
        prepared = prepare_sweep(sweep, staging / PREPARED_DIR, log=log, source=source)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    run_dir.mkdir(parents=True, exist_ok=True)
    # the cache of a replaced sweep, or one a killed driver left (iclmem.runfolder.is_leftover), is not this one's
    shutil.rmtree(run_dir / PREPARED_DIR, ignore_errors=True)
    if (staging / PREPARED_DIR).exists():  # a sweep of regime context alone prepares nothing here
        (staging / PREPARED_DIR).rename(run_dir / PREPARED_DIR)
    shutil.rmtree(staging, ignore_errors=True)
    return prepared


class ProbePools:
    """One probe pool per model of the sweep, each holding that model's own base as the reference;
    jobs are routed by the (model, options) of the run they come from."""

    def __init__(self, pools: dict[tuple[str, str], Any]) -> None:
        self.pools = pools

    def submit(self, job: Any) -> None:
        self.pools[(job.identity["model"], job.identity["model_options"])].submit(job)

    def poll(self, timeout: float = 0.0) -> list[dict[str, Any]]:
        return [row for pool in self.pools.values() for row in pool.poll(timeout=timeout / len(self.pools))]

    def drain(self, watchdog: Watchdog | None = None, poll_every: float = 0.5) -> list[dict[str, Any]]:
        """Every pending job's row. With ``watchdog``: :class:`SweepStalled` once no job has finished for its
        timeout (probe actors waiting for resources no node gives)."""
        rows = self.poll()
        while self.pending:
            got = self.poll(timeout=poll_every)
            rows.extend(got)
            if watchdog is not None and watchdog.observe(len(rows)) and self.pending:
                raise SweepStalled(f"no progress for {watchdog.idle_s / 60:.1f} min: {self.pending} probe job(s) "
                                   "waiting, none finished (probe actors waiting for resources? see "
                                   "resources.cpus_per_probe_actor, gpus_per_probe_actor, probe_resources)")
        return rows

    @property
    def pending(self) -> int:
        return sum(len(pool.pending) for pool in self.pools.values())

    @property
    def failed(self) -> list:
        return [f for pool in self.pools.values() for f in pool.failed]

    @property
    def notes(self) -> list[str]:
        return [n for pool in self.pools.values() for n in pool.notes]

    def start_seconds(self) -> float:
        return sum(pool.start_seconds() for pool in self.pools.values())

    def shutdown(self) -> None:
        for pool in self.pools.values():
            pool.shutdown()


def checkpoints_per_run(sweep: SweepConfig) -> int:
    """How many checkpoints a run's headline selects from: the selection-aware rule's family size is this
    times the competing score kinds."""
    from trainables.finetune import FinetuneSpec

    t = sweep.training
    return len(FinetuneSpec(epochs=t.epochs, checkpoint_epochs=tuple(t.checkpoint_epochs),
                            every_epoch=t.every_epoch).schedule())


def start_probe_pools(prepared: PreparedSweep, run_dir: Path) -> ProbePools:
    import ray

    from probes.actors import ProbePool
    from probes.calibration import model_digest
    from probes.outcomes import OutcomeThresholds
    from probes.probe import ProbeSettings
    from trainables.models import build_model

    sweep = prepared.sweep
    thresholds = OutcomeThresholds.from_dict(sweep.outcome.model_dump())
    settings = ProbeSettings(n_resamples=sweep.probe.bootstrap, thresholds=thresholds,
                             null_splits=sweep.probe.null_splits, n_checkpoints=checkpoints_per_run(sweep),
                             canary_beta=sweep.canaries.beta, canary_delta=sweep.canaries.delta)
    res = sweep.resources
    options = res.actor_options()
    cache = run_dir / REFERENCE_DIR
    cache.mkdir(parents=True, exist_ok=True)
    tasks = ray.put(prepared.tasks)  # one copy in the object store for every pool
    pools = {}
    for model_cfg in sweep.models:
        key = probe_pool_key(model_cfg)
        if key in pools:
            continue
        base = build_model(model_cfg.name, **model_cfg.options)
        pools[key] = ProbePool(
            res.probe_actors, options,
            base_model_name=model_cfg.name, base_options=dict(model_cfg.options), base_skeleton=base.skeleton_options(),
            base_weights=ray.put(base.state_arrays()), base_digest=model_digest(base),
            tasks=tasks, suite_spec=sweep.probe.suite, settings=settings, cache_dir=str(cache),
            reference_tasks=dict(prepared.reference_tasks),
        )
    return ProbePools(pools)
