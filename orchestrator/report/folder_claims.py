"""Which run folder a driver may write in, tabular (``orchestrator.driver.sweep``) or LM (``orchestrator.driver.lm_sweep``): a
new or empty folder, or a run of the same config to be continued; never someone else's files or another config's
results. Also what makes a folder a sweep's (:func:`record_sweep`) and the check that its stored results are that
config's (:func:`results_config_mismatch`), and Stage I written into a new folder only once it succeeded
(:func:`prepare_in_place_or_staged`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from iclmem.atomic import write_json_atomic
from iclmem.errors import ConfigError, DataError
from iclmem.runfolder import (
    PREPARED_DIR,
    PROBES_DIR,
    PROVENANCE_FILE,
    RESULTS_FILE,
    SWEEP_FILE,
    folder_kind,
    never_started,
    unwritable,
)
from orchestrator.runfolder.prepare import PreparedSweep, prepare_sweep, provenance
from orchestrator.runfolder.run_folder import RunFolder
from orchestrator.schema.config import SweepConfig


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
