"""How a tabular sweep that did not complete says why: refusals before any work (:class:`RefusedBeforeStart`: a
Ray head or storage that does not answer, resources the local Ray does not have), trials that failed (one line per
distinct cause, with the runs it stopped), probe jobs and context audits that failed, and a full disk found behind
any of these (:func:`disk_full_instead`). Each ends the sweep with the error the command line turns into its
message and exit code, the run state recorded where the run goes on from."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from iclmem.errors import ConfigError, DiskFull, ProbeError, TrialsFailed, is_disk_full
from iclmem.runfolder import RunStatus, write_run_state
from orchestrator.driver.probe_pools import probe_pool_count, unsatisfiable_resources
from orchestrator.driver.progress import console_tail
from orchestrator.driver.storage import FULL_DISK_BYTES, disk_full_error, free_space, unreachable_storage
from orchestrator.driver.tune_callbacks import run_id_of

if TYPE_CHECKING:
    from orchestrator.runfolder.prepare import PreparedSweep


class RefusedBeforeStart(ConfigError):
    """A sweep refused after Stage I, before any trial, probe or audit started (resources the local Ray does not
    have, an unreachable Ray head or storage). The folder keeps Stage I's cache; when no work of it had ever
    started, ``run_state.json`` records the refusal so that a corrected config may take the folder over
    (:func:`orchestrator.report.folder_claims.claim_run_folder`), instead of being sent to an ``iclmem resume`` that
    would be refused again."""


def refuse_unreachable_head(address: str | None) -> None:
    """:class:`RefusedBeforeStart` when ``--address`` names no Ray head that answers."""
    if address:
        from iclmem.raysession import unreachable_address

        why = unreachable_address(address)
        if why:  # after the config and the tables were checked, before Ray: ray.init would retry for minutes
            raise RefusedBeforeStart(f"--address {address}: no Ray head there, {why}; start one with `ray start "
                                     "--head` (or give the address `ray status` prints), or drop --address to "
                                     "run on an embedded Ray")


def refuse_unreachable_storage(storage: str) -> None:
    """:class:`RefusedBeforeStart` when Tune could not keep checkpoints at ``storage``
    (:func:`~orchestrator.driver.storage.unreachable_storage`)."""
    why = unreachable_storage(storage)
    if why:  # before Ray and before any trial: Tune would fail on its first checkpoint
        raise RefusedBeforeStart(f"storage_path {storage}: cannot keep checkpoints there: {why}; fix storage_path "
                                 "in the sweep (or the credentials of its bucket). Stage I's results are kept")


def refuse_what_the_local_ray_lacks(prepared: PreparedSweep) -> None:
    """:class:`RefusedBeforeStart` when the one local Ray node cannot give a trial or probe actor what it asks
    (:func:`~orchestrator.driver.probe_pools.unsatisfiable_resources`): it would wait forever, silently."""
    import ray

    sweep = prepared.sweep
    problems = unsatisfiable_resources(sweep.resources, ray.cluster_resources(),  # type: ignore[no-untyped-call]  # ray's state API has no annotations
                                       pools=probe_pool_count(sweep) if prepared.trials else 0)
    if problems:
        raise RefusedBeforeStart("the local Ray cannot run this sweep (nothing was started; Stage I's results "
                                 "are kept):\n  - " + "\n  - ".join(problems))


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
        run_id = run_id_of(result.config) or "?"
        causes.setdefault(failure_cause(result.error), []).append(run_id)
    return {cause: sorted(runs) for cause, runs in causes.items()}


def report_probe_failures(pool: Any, log: Callable[[str], None]) -> None:
    """The probe pools' notes, and the probe jobs that failed after their retries (with the first error)."""
    for note in pool.notes:
        log(f"[iclmem] WARNING {note}")
    if pool.failed:
        failed = [f"{j.identity.get('run_id', '?')}/{j.stem}" for j, _ in pool.failed]
        log(f"[iclmem] {len(pool.failed)} probe job(s) failed after retries: {failed}; first error: {pool.failed[0][1][:2000]}")


def raise_for_failures(run_dir: Path, storage: str, prepared: PreparedSweep, results: pd.DataFrame,
                       causes: dict[str, list[str]], audit_failures: Any, pool: Any, console_log: Path | None,
                       log: Callable[[str], None]) -> None:
    """The error a sweep whose results are aggregated ends with when not all of it succeeded, first that applies:
    a trial stopped by a full disk (:class:`DiskFull`, resumable), failed trials (:class:`TrialsFailed`, recorded
    failed), failed context audits, checkpoints not probed, or no checkpoint result at all (:class:`ProbeError`).
    Returns when the sweep is complete."""
    where = f" (Ray's and Tune's messages are in {console_log})" if console_log else ""
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


def disk_full_instead(exc: BaseException, run_dir: Path, storage: str, console_log: Path | None,
                      since: int) -> DiskFull | None:
    """The :class:`DiskFull` a sweep that failed on ``exc`` ends with instead (recorded interrupted, resumable)
    when a disk ran full: ``exc`` says so, what Ray and Tune printed since byte ``since`` of the console log does,
    or a folder has less than :data:`~orchestrator.driver.storage.FULL_DISK_BYTES` left. None otherwise."""
    said = [line.strip() for line in console_tail(console_log, since=since).splitlines() if is_disk_full(line)]
    full = [folder for _, folder, free in free_space(run_dir, storage) if free < FULL_DISK_BYTES]
    own = is_disk_full(exc)
    # Tune may fail on the damage a full disk did (a half-written state file), not on the disk itself
    if own or said or full:
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return disk_full_error(run_dir, storage, detail if own or not said else said[-1])
    return None
