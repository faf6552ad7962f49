"""The tabular sweep driver: ``run_sweep`` (what ``iclmem run`` and ``iclmem resume`` call) takes a sweep from its
config to the results table: the run folder claimed and locked, Stage I, Ray, the Tune trials with the probe pools
fed by their checkpoints, the catch-up pass, aggregation and the run state recorded however it ends.

Everything a run writes lives under ``RUN_DIR``: ``prepared/`` (Stage I cache), ``tune/`` (Tune storage, unless
``storage_path`` is remote), ``probes/`` (one result per checkpoint, written atomically), ``results.parquet`` and
the reports, ``wandb/`` (offline runs), ``run_state.json`` (running / interrupted / failed / complete, and the runs
an interruption left unfinished) and ``console.log`` (what Ray, Tune and wandb printed).

The pieces it composes each have a module of their own: ``orchestrator.report.folder_claims`` (which folder it may write),
``orchestrator.driver.storage`` (Tune's storage and full disks), ``orchestrator.driver.console`` (Ctrl-C and the console),
``orchestrator.driver.progress`` (status line and watchdog), ``orchestrator.driver.probe_pools``, ``orchestrator.driver.tune_callbacks``,
``orchestrator.driver.failures`` (how a sweep that did not complete says why) and ``orchestrator.driver.sweep_timings``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from iclmem.errors import ConfigError, DiskFull, SweepInterrupted, SweepStalled, TrialsFailed
from iclmem.raysession import Console, ensure_ray, quiet_console
from iclmem.runfolder import (
    CONSOLE_LOG_FILE,
    PROBES_DIR,
    SWEEP_FILE,
    RunStatus,
    folder_kind,
    never_started,
    write_run_state,
)
from iclmem.runlock import hold_run_folder, refuse_if_held
from orchestrator.audits.context_audit import check_context_audits, finish_context_audits, submit_context_audits
from orchestrator.driver.console import DropRestoreHint, Interrupts, catch_interrupts, console_warnings
from orchestrator.driver.failures import (
    RefusedBeforeStart,
    disk_full_instead,
    raise_for_failures,
    refuse_unreachable_head,
    refuse_unreachable_storage,
    refuse_what_the_local_ray_lacks,
    report_probe_failures,
    trial_failures,
)
from orchestrator.driver.probe_pools import jobs_for, start_probe_pools
from orchestrator.driver.progress import Progress, Watchdog, incomplete_runs
from orchestrator.driver.storage import check_storage, storage_for
from orchestrator.driver.sweep_timings import Spent, TimeTrials, record_timings, trial_timer

# Tune pickles a run's callbacks into its tuner state under the module that defined them: run folders written
# before the driver was split by job name LogTrialResults, ProbeOnCheckpoint and TimeTrials here (then
# orchestrator.sweep), and resume through these names (MOVED_MODULES).
from orchestrator.driver.tune_callbacks import (
    LogTrialResults,  # noqa: F401
    ProbeOnCheckpoint,  # noqa: F401
    reattach,
    trial_of,
    trial_results_callback,
    tune_callback,
)
from orchestrator.report.folder_claims import (
    check_results_match,
    claim_run_folder,
    prepare_in_place_or_staged,
    record_sweep,
    require_writable,
)
from orchestrator.report.wandb_logger import WANDB_FINISH_TIMEOUT_S, TrialLogger
from orchestrator.runfolder.prepare import EXPERIMENT_NAME, PreparedSweep, trial_config
from orchestrator.runfolder.run_folder import RunFolder
from orchestrator.runfolder.timing import Phase, PhaseClock
from orchestrator.schema.config import SweepConfig
from orchestrator.schema.sweep_files import load_sweep
from trainables.spec import TUNE_AXIS

if TYPE_CHECKING:  # Tune is imported where the tuner is built
    from ray.tune import Tuner


# ------------------------------------------------------------------------------------------- the run folder
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
        assert config_path is not None, "a new run is given its sweep or the sweep file"
        sweep = load_sweep(config_path)
    if not resume:
        claim_run_folder(run_dir, sweep)  # someone else's folder is refused before anything touches it
    require_writable(run_dir, resume)
    # one driver per folder, from here to the end: a second `run`, `resume` or `report` is refused (exit 2)
    with hold_run_folder(run_dir, "iclmem resume" if resume else "iclmem run"):
        return _run_sweep_holding(config_path, run_dir, sweep=sweep, address=address, resume=resume,
                                  progress=progress, num_cpus=num_cpus, log=log, verbose=verbose,
                                  interrupts=interrupts, clock=clock, entered=entered, started_at=started_at)


def _continue_or_replace(run_dir: Path, sweep: SweepConfig, resume: bool,
                         log: Callable[[str], None]) -> tuple[bool, SweepConfig | None]:
    """Under the folder's lock: whether the sweep resumes (a new run of a folder holding the same config continues
    it), and the refused sweep of another config it replaces, if any."""
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
    return resume, replaced


def _run_sweep_holding(config_path: str | Path | None, run_dir: Path, *, sweep: SweepConfig, address: str | None,
                       resume: bool, progress: bool, num_cpus: int | None, log: Callable[[str], None], verbose: bool,
                       interrupts: Interrupts, clock: Any, entered: float, started_at: float | None) -> pd.DataFrame:
    """:func:`_run_sweep` once the folder's lock is held: Stage I, the drive, the state record."""
    # whether no driver of this folder has started any work yet: only then is a refusal after Stage I recorded as
    # one that leaves the folder to a corrected config (iclmem.runfolder.never_started)
    pristine = folder_kind(run_dir) in ("missing", "empty") or never_started(run_dir) is not None
    resume, replaced = _continue_or_replace(run_dir, sweep, resume, log)
    from orchestrator.report.wandb_logger import resolve_wandb_mode

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
            full = disk_full_instead(exc, run_dir, storage_for(sweep, run_dir), console.log_path, since=log_start)
            if full is not None:
                raise full from None
            write_run_state(run_dir, RunStatus.FAILED, note=f"{type(exc).__name__}: {exc}"[:2000])
            raise


# ------------------------------------------------------------------------------------------- the drive
@dataclass
class _Drive:
    """What one drive of a sweep holds from its start to its clean-up."""

    prepared: PreparedSweep
    run_dir: Path
    log: Callable[[str], None]
    clock: Any
    timer: TimeTrials
    trial_logger: Any
    progress: Progress
    spent: Spent = field(default_factory=Spent)
    storage: str = ""  # where Tune keeps checkpoints (orchestrator.driver.storage.storage_for)
    pool: Any = None  # the probe pools (orchestrator.driver.probe_pools.ProbePools), once started
    keeper: Any = None  # what stays of each checkpoint once probed (orchestrator.driver.checkpoint_keeping.CheckpointKeeper)
    ray_started: bool = False  # whether this driver started Ray (and stops it)
    finish_timeout: float | None = None  # how long the trial logger may take to close (bounded once stopped)

    @property
    def probes_dir(self) -> Path:
        return self.run_dir / PROBES_DIR


def _drive(prepared: PreparedSweep, run_dir: Path, *, address: str | None, resume: bool, progress: bool,
           num_cpus: int | None, log: Callable[[str], None], console: Console,
           interrupts: Interrupts, clock: Any = None, wall_from: float | None = None) -> pd.DataFrame:
    """Ray side of :func:`run_sweep`: probe pools, Tune, the catch-up pass and aggregation."""
    sweep = prepared.sweep
    clock = clock or PhaseClock()
    timer = trial_timer()
    trial_logger = trial_logger_for(sweep, run_dir)  # opens nothing until the first result
    restore_hint = DropRestoreHint()
    tune_logger = logging.getLogger("ray.tune.tune")
    tune_logger.addFilter(restore_hint)
    run = _Drive(prepared, run_dir, log, clock, timer, trial_logger, _progress(prepared, progress, log, console))
    interrupts.record = lambda: write_run_state(
        run_dir, RunStatus.INTERRUPTED, incomplete_runs(prepared, run.progress),
        note=f"stopped by a second Ctrl-C, clean-up skipped; {len(run.progress.verdicts)} checkpoint result(s) kept")
    try:
        refuse_unreachable_head(address)
        run.storage = storage_for(sweep, run_dir)
        refuse_unreachable_storage(run.storage)
        if prepared.trials:
            refuse_what_the_disk_lacks(run, resume, num_cpus)
        _start_ray(run, address, num_cpus)
        if not address:
            refuse_what_the_local_ray_lacks(prepared)
        audits = submit_context_audits(sweep, run_dir, log)  # regime context: Ray tasks beside the trials
        causes: dict[str, list[str]] = {}
        if prepared.trials:
            run.pool = start_probe_pools(prepared, run_dir)
            _probe_controls(run)
            grid = _fit(run, resume, interrupts)
            _stop_if_stalled(run)
            _stop_if_interrupted(run, interrupts)
            causes = trial_failures(grid)
            _catch_up(run, grid)
            _drain(run)
            _keep_checkpoints(run)
            run.trial_logger.finish()  # every row is in: close the trial runs before the summary run starts
            run.progress.show(force=True)
            report_probe_failures(run.pool, log)
        audit_failures = finish_context_audits(audits, sweep, run_dir, log)
        results = _aggregate(run)
        raise_for_failures(run_dir, run.storage, prepared, results, causes, audit_failures, run.pool,
                           console.log_path, log)
        write_run_state(run_dir, RunStatus.COMPLETE)
        interrupts.record = None  # a Ctrl-C during the shutdown below leaves a complete sweep complete
        run.spent.results = results
        return results
    except KeyboardInterrupt:  # outside Tune's loop: Ray start-up, the probe pools, the final drain
        run.finish_timeout = WANDB_FINISH_TIMEOUT_S
        write_run_state(run_dir, RunStatus.INTERRUPTED, incomplete_runs(prepared, run.progress),
                        note=f"stopped by Ctrl-C; {len(run.progress.verdicts)} checkpoint result(s) kept")
        raise
    finally:
        tune_logger.removeFilter(restore_hint)
        _shut_down(run)
        if run.spent.results is not None and prepared.trials:  # a complete sweep: what it spent, phase by phase
            record_timings(run_dir, prepared, run.spent, timer, clock, wall_from, resume, log)


def _progress(prepared: PreparedSweep, enabled: bool, log: Callable[[str], None], console: Console) -> Progress:
    """The sweep's status line, with the watchdog of ``resources.stall_timeout_min`` on Tune's loop."""
    progress = Progress(len(prepared.trials), enabled=enabled, log=log)
    progress.watchdog = Watchdog(prepared.sweep.resources.stall_timeout_min * 60)
    progress.console_log = console.log_path
    return progress


def refuse_what_the_disk_lacks(run: _Drive, resume: bool, num_cpus: int | None) -> None:
    """The bytes the sweep will write (``orchestrator.estimate.estimate_disk``), said on the console, and refused before Ray
    starts where they exceed the free space of the run folder's or Tune's storage disk. A resumed sweep is
    refused only for what it has yet to write (the folder's bytes already there are counted as written)."""
    from orchestrator.estimate.estimate_disk import check_room

    already = sum(p.stat().st_size for p in run.run_dir.rglob("*") if p.is_file()) if resume else 0
    line, problems = check_room(run.prepared, run.run_dir, run.storage, num_cpus or os.cpu_count() or 1, already)
    run.log(f"[iclmem] {line}")
    if problems:
        raise RefusedBeforeStart("not enough disk for this sweep, refused before Ray started:\n  - "
                                 + "\n  - ".join(problems))


def _start_ray(run: _Drive, address: str | None, num_cpus: int | None) -> None:
    """Ray (started here unless one runs already), and the workers the trials share, for the timings."""
    import ray

    with run.clock(Phase.RAY):
        run.ray_started = ensure_ray(address, num_cpus=num_cpus)
    available = ray.cluster_resources()  # type: ignore[no-untyped-call]  # ray's state API has no annotations
    gpus_per_trial = run.prepared.sweep.resources.gpus_per_trial
    run.spent.workers = int(available.get("GPU", 0) if gpus_per_trial > 0 else available.get("CPU", 0))


def _probe_controls(run: _Drive) -> None:
    """The control rows (``prepared.controls``) go to the probe pools first: they need no trial."""
    for key, identity in run.prepared.controls:
        from probes.actors import ProbeJob

        run.pool.submit(ProbeJob(identity, 0, None, key, str(run.probes_dir / identity["run_id"]), "e0000"))


def _fit(run: _Drive, resume: bool, interrupts: Interrupts) -> Any:
    """The trials on Tune (restored on resume), each checkpoint handed to the probe pools as it comes; Tune's grid."""
    from orchestrator.driver.checkpoint_keeping import CheckpointKeeper

    run.keeper = CheckpointKeeper(run.prepared.sweep.training.keep_checkpoints, log=run.log)
    callbacks = [tune_callback(run.pool, run.probes_dir, run.progress, run.trial_logger, run.keeper),
                 trial_results_callback(run.trial_logger), run.timer]
    tuner = _tuner(run.prepared, run.run_dir, callbacks, restore=resume, log=run.log)
    if resume:
        reattach(tuner, run.pool, run.probes_dir, run.progress, run.trial_logger, run.keeper)
    interrupts.in_tune = True
    fit_started = time.perf_counter()
    try:
        return tuner.fit()
    finally:
        interrupts.in_tune = False
        run.spent.fit_s = time.perf_counter() - fit_started


def _collect(run: _Drive, rows: list[dict[str, Any]]) -> None:
    """Probe rows the pools returned: counted for the status line and handed to the trial logger."""
    for row in rows:
        run.progress.outcome(row)
        run.trial_logger.log_probe(row)


def _stop_if_stalled(run: _Drive) -> None:
    """The watchdog stopped Tune: resumable, like an interruption, but exit 1."""
    stall = run.progress.stall
    if stall is None:
        return
    run.finish_timeout = WANDB_FINISH_TIMEOUT_S
    _collect(run, run.pool.poll())
    write_run_state(run.run_dir, RunStatus.INTERRUPTED, incomplete_runs(run.prepared, run.progress),
                    note=f"stopped for making no progress: {stall}"[:2000])
    raise SweepStalled(
        f"{stall}. The sweep was stopped ({len(run.progress.verdicts)} checkpoint result(s) kept in {run.run_dir}); "
        "give the trials resources the cluster has (resources.* in the sweep) or add nodes, then "
        f"`iclmem resume {run.run_dir}` (resources.stall_timeout_min sets this limit; 0 waits forever)")


def _stop_if_interrupted(run: _Drive, interrupts: Interrupts) -> None:
    """Ctrl-C during ``fit``: Tune has stopped the trials and saved its state. Results the probe pool has finished
    are on disk already (each is stored by its actor); those that came in are collected without waiting for the
    jobs still running: the catch-up pass of ``iclmem resume`` resubmits them."""
    if not interrupts.interrupted:
        return
    run.finish_timeout = WANDB_FINISH_TIMEOUT_S
    _collect(run, run.pool.poll())
    unfinished = incomplete_runs(run.prepared, run.progress)
    write_run_state(run.run_dir, RunStatus.INTERRUPTED, unfinished,
                    note=f"stopped by Ctrl-C; {len(run.progress.verdicts)} checkpoint result(s) kept")
    raise SweepInterrupted(str(run.run_dir))


def _catch_up(run: _Drive, grid: Any) -> None:
    """Every checkpoint on storage gets a result (already-probed ones return at once), and the checkpoint keeper
    knows every checkpoint and every trial that ended without error (a resumed driver saw none of them written)."""
    from orchestrator.driver.checkpoint_keeping import tune_checkpoint_location

    for result in grid:
        trial = trial_of(result.config)
        if trial is None:
            continue
        for checkpoint, metrics in result.best_checkpoints or []:
            jobs = jobs_for(trial, int(metrics["epoch"]), checkpoint, run.probes_dir)
            for job in jobs:
                run.pool.submit(job)
            run.keeper.add(trial.run_id, int(metrics["epoch"]), *tune_checkpoint_location(checkpoint),
                           [(job.out_dir, job.stem) for job in jobs])
        if result.error is None:
            run.keeper.finish(trial.run_id)


def _keep_checkpoints(run: _Drive) -> None:
    """Every probe is in: what ``training.keep_checkpoints`` lets go goes, and the console says how much."""
    run.keeper.settle()
    if run.keeper.runs:
        run.log(run.keeper.summary())


def _drain(run: _Drive) -> None:
    """Wait for every probe job; a drain that stops moving is stopped (resumable) by its own watchdog."""
    drain_started = time.perf_counter()
    try:
        drained = run.pool.drain(watchdog=Watchdog(run.prepared.sweep.resources.stall_timeout_min * 60))
        run.spent.drain_s = time.perf_counter() - drain_started
        run.spent.actor_start_s = run.pool.start_seconds()
    except SweepStalled as stalled:
        write_run_state(run.run_dir, RunStatus.INTERRUPTED, incomplete_runs(run.prepared, run.progress),
                        note=f"stopped for making no progress: {stalled}"[:2000])
        raise SweepStalled(f"{stalled}; every trial finished and the results stored are kept: `iclmem resume "
                           f"{run.run_dir}` probes the rest") from None
    _collect(run, drained)


def _aggregate(run: _Drive) -> pd.DataFrame:
    """The results table and the report; a sweep of regime context alone writes its context report only."""
    from orchestrator.report.aggregate import aggregate

    prepared, run_dir = run.prepared, run.run_dir
    with run.clock(Phase.REPORT):
        results = aggregate(run_dir, prepared, log=run.log) if prepared.trials else pd.DataFrame()
    if not prepared.trials:
        from orchestrator.report.context_audits import write_context_report

        run.log(f"[iclmem] report: {write_context_report(run_dir, f'IclMem report — {run_dir.name}')}")
    return results


def _shut_down(run: _Drive) -> None:
    """The trial logger closed, the probe pools and (when this driver started it) Ray stopped."""
    import ray

    # no-op once finished; on an error, flushes what the runs hold; after a Ctrl-C, for a bounded time
    run.trial_logger.finish(timeout=run.finish_timeout)
    if run.pool is not None:
        run.pool.shutdown()
    if run.ray_started:
        with run.clock(Phase.RAY):
            ray.shutdown()


# ------------------------------------------------------------------------------------------- Tune and W&B
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


# The flat modules a Tune state written before the orchestrator's folders (#59) names its callbacks by, and the
# module each is now; restoring such a state looks them up there.
MOVED_MODULES = {"orchestrator.sweep": "orchestrator.driver.sweep",
                 "orchestrator.tune_callbacks": "orchestrator.driver.tune_callbacks",
                 "orchestrator.sweep_timings": "orchestrator.driver.sweep_timings"}


def alias_moved_modules() -> None:
    """Make the old names of :data:`MOVED_MODULES` import as the modules they became (for unpickling only)."""
    from orchestrator.driver import sweep_timings, tune_callbacks

    now = {"orchestrator.driver.sweep": sys.modules[__name__], "orchestrator.driver.tune_callbacks": tune_callbacks,
           "orchestrator.driver.sweep_timings": sweep_timings}
    for old, new in MOVED_MODULES.items():
        sys.modules.setdefault(old, now[new])


def _tuner(prepared: PreparedSweep, run_dir: Path, callbacks: list[Any], restore: bool,
           log: Callable[[str], None] = print) -> Tuner:
    # ``callbacks``: Tune Callbacks, each built as a subclass of one of ours and of Tune's Callback (Tune imported
    # only there), which the factories' return types cannot say: Any
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
            alias_moved_modules()
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


def _flat_space(configs: list[dict[str, Any]]) -> dict[str, Any]:
    # One grid axis whose values are whole trial configs: Tune then names trials by index and each
    # trial's config is exactly what ``trial_config`` built (no cross product we did not ask for);
    # ``orchestrator.driver.tune_callbacks.trial_of`` reads the typed trial back.
    from ray import tune

    return {TUNE_AXIS: tune.grid_search(configs)}


def trial_logger_for(sweep: SweepConfig, run_dir: Path) -> TrialLogger:
    """The sweep's per-trial logger: W&B runs opened by this driver (offline unless the sweep asks for
    online and ``WANDB_API_KEY`` is set), or a no-op when W&B is disabled. wandb reads the key from this
    process's environment; nothing passes it to Ray."""
    from orchestrator.report.wandb_logger import make_trial_logger, resolve_wandb_mode

    mode = resolve_wandb_mode(sweep.wandb.mode)
    if mode == "disabled":
        return make_trial_logger(None)
    return make_trial_logger("wandb", run_dir=run_dir, project=sweep.wandb.project, group=sweep.name,
                             entity=sweep.wandb.entity, mode=mode, config_hash=sweep.config_hash())
