"""The run-folder layout: every file and folder a run writes under ``RUN_DIR``, named once.

Every kind of folder :func:`folder_kind` tells apart is laid out here: a tabular sweep (``iclmem run``), its
W&B folder, stored probe results and regime-``context`` audits; an LM run (``iclmem lm run``); a checkpoint's
audit (``iclmem probe``) and a deployed-context audit (``iclmem audit-context``). Code and tests build paths
from these names, never from spelled-out strings; a sweep's files are read back through
``orchestrator.runfolder.run_folder.RunFolder``, a method per file.

docs/RUN_FOLDER.md and the README's table "What a run writes" list the same names (``tests/test_docs.py``
checks that every ``*_FILE`` / ``*_DIR`` here is documented); ``tests/test_atomic_writes.py`` checks that each
file here is written atomically."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterable, Iterator
from enum import Enum
from pathlib import Path
from typing import Any

from iclmem.provenance import PROVENANCE_FILE

RESULTS_FILE = "results.parquet"  # one row per (run, checkpoint)
REFERENCE_RESULTS_FILE = "reference_results.parquet"  # probe.references: the reference trials' own rows
SPLIT_REPORT_FILE = "split_report.parquet"
MANIPULATION_AUC_FILE = "manipulation_auc.parquet"
SWEEP_FILE = "sweep.json"  # the validated sweep config, as resumed by ``iclmem resume``
REPORT_FILE = "report.html"
VERDICT_FILE = "verdict.json"  # ``iclmem probe``: one checkpoint's verdict
ROC_DIR = "roc"
FIGURES_DIR = "figures"
PROBES_DIR = "probes"  # one stored result per checkpoint
REFERENCE_DIR = "reference"  # base-model scores, computed once
PREPARED_DIR = "prepared"  # Stage I cache
GROUND_TRUTH_FILE = "ground_truth.json"  # in every checkpoint folder: the rows each part used, trained labels
TUNE_DIR = "tune"  # Tune storage when no shared storage is configured
WANDB_DIR = "wandb"
TRIAL_RUNS_FILE = "trial_runs.json"  # under WANDB_DIR: the W&B run id of every trial and what each run holds
WANDB_EXPORT_DIR = "export"  # under WANDB_DIR: the exported results artifact, referenced in place
# What Ray, Tune, wandb and Python warnings print while ``iclmem run | resume`` drives a sweep (Ray's
# token-auth and "performance bottleneck" warnings, TensorBoard hints, warnings with their source paths):
# kept here instead of on the console unless ``--verbose``. Append-only, as a log is.
CONSOLE_LOG_FILE = "console.log"
RUN_STATE_FILE = "run_state.json"  # how the last driver of this folder ended (:class:`RunStatus`); see ``write_run_state``
# One command at a time per run folder (``iclmem.runlock``): ``run``, ``resume`` and ``report`` flock LOCK_FILE (an
# empty file) while they work, and DRIVER_FILE says who holds it (pid, host, start, command); both are removed
# when the holder ends, and left behind only by a driver that was killed (the next command takes over).
LOCK_FILE = "driver.lock"
DRIVER_FILE = "driver.json"
LOCK_NAMES = frozenset({LOCK_FILE, DRIVER_FILE})
# What a killed iclmem process can leave in a folder besides the lock: a file of ``iclmem.atomic`` caught half-written
# under its temporary name (``.<name>.<8 random characters of tempfile.mkstemp>.tmp``, <name> one iclmem writes at
# the top of a folder, or a prepared task), and the probe file of an older ``unwritable``. They are no content: a
# folder holding only these (and the lock) is still empty, and a folder holding them is still iclmem's.
_TEMP_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")
_WRITE_CHECK = re.compile(r"^\.iclmem-write-check-[a-z0-9_]{8}$")
_WRITE_CHECK_PREFIX = ".iclmem-write-check-"
# Stage I's cache, as ``trainables.data.save_prepared`` names it: ``<fingerprint>.npz`` and ``.json``
_PREPARED_ENTRY = re.compile(r"^[0-9a-f]{16,64}\.(npz|json)$")
DIVERGED_RUNS_FILE = "diverged_runs.json"  # the run ids whose training stopped on a NaN / inf loss (the driver)
TIMINGS_FILE = "timings.json"  # what a complete sweep spent, phase by phase (``orchestrator.runfolder.timing``)
# ``iclmem lm run | lm resume`` (``orchestrator.driver.lm_sweep``) write RUN_STATE_FILE and CONSOLE_LOG_FILE too.

# ``iclmem audit-context``: the deployed-context audit's folder (with PROVENANCE_FILE and VERDICT_FILE, as
# ``iclmem probe``'s folder has them beside PREPARED_DIR, REFERENCE_DIR and PROBES_DIR)
CONTEXT_AUDIT_FILE = "context_audit.parquet"  # one row per (target context, attack)
CONTEXT_ROC_FILE = "context_roc.parquet"  # (target, attack, fpr, tpr): each attack's ROC curve
CONTEXT_SCORES_FILE = "context_scores.parquet"  # one row per audited row: its id, member flag, each attack's score
# ... and, beside the ``<target>__<attack>`` columns, the deployed context's scores under each of two disjoint
# reference sets (``reference_set_a__<attack>``, ``..._b__``): the risk report reads them for the records' stability
REFERENCE_HALF_PREFIX = "reference_set_"
CONTEXT_ROC_FIGURE = "context_roc.png"
INFERENCE_FILE = "inference.parquet"  # audit-context --attack label|attribute: per target x attack x group x statistic
INFERENCE_ROWS_FILE = "inference_rows.parquet"  # a sweep's value inference: per row id, member flag, attack: its gain
VALUE_SLICES_FILE = "value_slices.parquet"  # per context audit x value attack x slice: members' gain minus non-members'
SAVED_DIR = "saved"  # audit-context --attack file: the saved files (the audited one, the control's)
SAVED_FILE_TABLE = "saved_file.parquet"  # audit-context --attack file: per target x measure x statistic
# A sweep's regime ``context``: the audit-context folders and their rows in one table
CONTEXT_AUDITS_DIR = "context_audits"  # one audit-context folder per audit (its run id)
CONTEXT_AUDITS_FILE = "context_audits.parquet"  # every audit's rows, with its run id, task, model, Q, seed in front
# The data owner's risk report (orchestrator.report.record_risk), beside results.parquet: row ids, never row values
RECORD_RISK_FILE = "record_risk.parquet"  # per audit x attack x row: member, score, risk, rank among the members
RECORD_SLICES_FILE = "record_slices.parquet"  # per task x row: the slices it belongs to
SLICE_RISK_FILE = "slice_risk.parquet"  # per run (headline checkpoint) x attack x slice: the slice's leakage
RECORD_STABILITY_FILE = "record_stability.parquet"  # per pair of runs differing in seed x attack: rank agreement
RISKIEST_RECORDS_FILE = "riskiest_records.parquet"  # per task: the top-k member rows by risk
CANARY_RANKING_FILE = "canary_ranking.parquet"  # per run x attack x copy count: precision@k of the ranking on the canaries
CHANNEL_CROSSING_FILE = "channel_crossing.parquet"  # per run x channel x attack x stratum of the other channel: AUC
# every statement about leakage the console, the first screen or W&B makes: effect size, family, null rate, rounding
CLAIM_LEDGER_FILE = "claims.parquet"
RISK_TABLE_FILES = (RECORD_RISK_FILE, RECORD_SLICES_FILE, SLICE_RISK_FILE, RECORD_STABILITY_FILE,
                    RISKIEST_RECORDS_FILE, CANARY_RANKING_FILE, CHANNEL_CROSSING_FILE, VALUE_SLICES_FILE,
                    CLAIM_LEDGER_FILE)

# An LM probe run folder (``iclmem lm run``; its provenance has ``kind = "lm"``)
LM_SWEEP_FILE = "lm_sweep.json"  # the validated LM sweep config, as resumed by ``iclmem lm resume``
LM_RESULTS_FILE = "lm_results.parquet"  # one row per model x dataset x probe x type x seed x variant x criterion
LM_REPORT_FILE = "lm_report.html"
LM_EXPOSURE_DIR = "lm_exposure"  # per-entity exposures and classes, one TSV per (model, dataset)
LM_UNITS_DIR = "lm_units"  # one stored result per work unit (exposure, NET type, NER type x seed)
LM_ASSETS_DIR = "lm_assets"  # the built-in synthetic model and dataset, built once per run folder

# What a tabular sweep's folder holds at its top (files, folders) and under WANDB_DIR: ``iclmem resume`` and ``report``
# refuse a folder where one of them has the other kind (a folder named run_state.json, a file named prepared), naming
# it, before they read or write anything
SWEEP_TOP_FILES = (RESULTS_FILE, REFERENCE_RESULTS_FILE, SPLIT_REPORT_FILE, MANIPULATION_AUC_FILE, SWEEP_FILE, REPORT_FILE,
                   CONSOLE_LOG_FILE, RUN_STATE_FILE, LOCK_FILE, DRIVER_FILE, DIVERGED_RUNS_FILE, TIMINGS_FILE,
                   CONTEXT_AUDITS_FILE, CLAIM_LEDGER_FILE, PROVENANCE_FILE, *RISK_TABLE_FILES)
SWEEP_TOP_DIRS = (ROC_DIR, FIGURES_DIR, PROBES_DIR, REFERENCE_DIR, PREPARED_DIR, TUNE_DIR, WANDB_DIR, CONTEXT_AUDITS_DIR)
SWEEP_WANDB_ENTRIES = ((TRIAL_RUNS_FILE, "file"), (WANDB_EXPORT_DIR, "folder"))

__all__ = [
    "SWEEP_TOP_FILES", "SWEEP_TOP_DIRS", "SWEEP_WANDB_ENTRIES",
    "FIGURES_DIR", "MANIPULATION_AUC_FILE", "PREPARED_DIR", "PROBES_DIR", "PROVENANCE_FILE", "REFERENCE_DIR",
    "REFERENCE_RESULTS_FILE", "REPORT_FILE", "RESULTS_FILE", "ROC_DIR", "SPLIT_REPORT_FILE", "SWEEP_FILE", "TUNE_DIR", "VERDICT_FILE",
    "WANDB_DIR", "LOCK_FILE", "DRIVER_FILE", "folder_kind", "roc_path", "existing_ancestor", "unwritable", "GROUND_TRUTH_FILE",
    "is_leftover", "content", "undo_if_refused", "remove_temp_leftovers", "CONSOLE_LOG_FILE", "RUN_STATE_FILE", "RunStatus",
    "read_run_state", "write_run_state", "never_started", "QUERIES_SUFFIX", "NULL_QUERIES_SUFFIX", "probe_stem",
    "LM_ASSETS_DIR", "LM_EXPOSURE_DIR", "LM_REPORT_FILE", "LM_RESULTS_FILE", "LM_SWEEP_FILE", "LM_UNITS_DIR",
    "DIVERGED_RUNS_FILE", "TIMINGS_FILE", "TRIAL_RUNS_FILE", "WANDB_EXPORT_DIR", "CONTEXT_AUDIT_FILE", "CONTEXT_ROC_FILE",
    "CONTEXT_SCORES_FILE", "REFERENCE_HALF_PREFIX", "CONTEXT_ROC_FIGURE", "CONTEXT_AUDITS_DIR", "CONTEXT_AUDITS_FILE", "ROW_SUFFIX",
    "MANIPULATION_SUFFIX", "ROC_SUFFIX", "LOCK_NAMES", "record_diverged_run", "read_diverged_runs",
    "RECORD_RISK_FILE", "RECORD_SLICES_FILE", "SLICE_RISK_FILE", "RECORD_STABILITY_FILE", "RISKIEST_RECORDS_FILE",
    "CANARY_RANKING_FILE", "RISK_TABLE_FILES", "INFERENCE_FILE", "INFERENCE_ROWS_FILE", "VALUE_SLICES_FILE", "CHANNEL_CROSSING_FILE", "CLAIM_LEDGER_FILE", "SAVED_DIR", "SAVED_FILE_TABLE",
]


def _top_level_files() -> frozenset[str]:
    """Every file name iclmem writes at the top of a run or audit folder (the constants of this module; the
    W&B ledger TRIAL_RUNS_FILE is written under WANDB_DIR, never at the top)."""
    return frozenset({value for name, value in globals().items() if name.isupper() and isinstance(value, str)
                      and name.endswith("_FILE") and value != TRIAL_RUNS_FILE} | {CONTEXT_ROC_FIGURE})


def _is_temp_leftover(entry: Path, names: frozenset[str] | None = None) -> bool:
    found = _TEMP_LEFTOVER.match(entry.name)
    if found is None or not entry.is_file():
        return False
    return found["name"] in (names if names is not None else _top_level_files()) or bool(
        _PREPARED_ENTRY.match(found["name"]))


def is_leftover(path: str | Path) -> bool:
    """Whether ``path`` is what a killed iclmem process leaves behind and no content: the folder's lock and its
    holder record (``iclmem.runlock``), a file of ``iclmem.atomic`` caught under its temporary name, an old
    write-check file, or a ``prepared/`` folder of Stage I's cache alone (a driver killed between Stage I and
    ``sweep.json``). Never someone's file: each is a name (and for ``prepared/`` a content) only iclmem writes."""
    entry = Path(path)
    name = entry.name
    if name in LOCK_NAMES or _WRITE_CHECK.match(name):
        return entry.is_file()
    if _is_temp_leftover(entry):
        return True
    if name == PREPARED_DIR and entry.is_dir() and not entry.is_symlink():
        return all((_PREPARED_ENTRY.match(p.name) and p.is_file()) or _is_temp_leftover(p, frozenset())
                   for p in entry.iterdir())
    return False


def remove_temp_leftovers(path: str | Path) -> list[str]:
    """Remove the files a killed iclmem process left half-written under a temporary name (and old write-check
    files) at the top of the folder ``path``; the names removed. Only for a command that holds the folder's
    lock (``iclmem.runlock``): no other iclmem command is writing there."""
    folder = Path(path)
    removed = []
    for entry in sorted(folder.iterdir()) if folder.is_dir() else ():
        if _is_temp_leftover(entry) or (_WRITE_CHECK.match(entry.name) and entry.is_file()):
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
                removed.append(entry.name)
    return removed


def content(path: str | Path) -> list[Path]:
    """The entries of the folder ``path`` that are content, i.e. not :func:`is_leftover` (empty for a missing
    folder)."""
    folder = Path(path)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if not is_leftover(p))


def folder_kind(path: str | Path) -> str:
    """What ``path`` is: "missing", "empty" (nothing but what a command at work or a killed one leaves:
    :func:`is_leftover`), "tabular" (an iclmem sweep: ``sweep.json``), "lm" (an iclmem language-model run, by
    its provenance record), "audit" (an ``iclmem probe`` folder, likewise), or "foreign" (anything else:
    someone's files)."""
    from iclmem.errors import DataError
    from iclmem.provenance import Provenance

    folder = Path(path)
    if not folder.exists():
        return "missing"
    if not folder.is_dir():
        return "foreign"
    if not content(folder):  # the lock of a command at work, or a killed one's leftovers, is no content
        return "empty"
    if (folder / SWEEP_FILE).is_file():
        return "tabular"
    try:
        record = Provenance.read(folder)  # the provenance record's one reader
    except DataError:  # a provenance.json that is not iclmem's
        return "foreign"
    return record.kind if record is not None and record.kind in ("lm", "audit") else "foreign"


def existing_ancestor(path: str | Path) -> Path:
    """``path`` (``~`` expanded, made absolute) if it exists, else the nearest of its parents that does: where
    a folder would be created, and so what decides whether it can be."""
    target = Path(path).expanduser().absolute()
    while not target.exists() and target != target.parent:
        target = target.parent
    return target


def unwritable(folder: str | Path, *, probe_foreign: bool = False) -> str | None:
    """Why iclmem could not write in ``folder`` (or create it), or None: checked before any work, so a
    read-only mount or a file in the way is one line of bad input, not a traceback after Stage I.

    Nothing is written among someone's files: permissions and a read-only mount are read (``os.access``,
    ``statvfs``); then the write is tried only where iclmem would write anyway: a missing ``folder`` is created
    and removed again (as the command would create it), an empty or iclmem folder gets a probe file that is
    removed at once. A folder of other files (``/``, ``~``, someone's project) gets no probe: the command
    refuses it as not its own. ``probe_foreign``: probe such a folder too (a storage path given to be
    written in, which holds other experiments)."""
    import errno
    import os
    import tempfile

    requested = Path(folder).expanduser().absolute()
    target = existing_ancestor(requested)
    if not target.is_dir():
        return f"{target} is a file, not a folder"
    if not os.access(target, os.W_OK | os.X_OK):
        return f"{target} is not writable ({os.strerror(errno.EACCES)})"
    try:
        if os.statvfs(target).f_flag & os.ST_RDONLY:
            return f"{target} is not writable ({os.strerror(errno.EROFS)})"
    except OSError:
        pass
    try:
        if target != requested:  # the folder the command would create, created and removed
            first = requested
            while first.parent != target:
                first = first.parent
            try:
                os.mkdir(first)
            except FileExistsError:  # made since by someone else: the command decides what it is
                return None
            os.rmdir(first)
        elif probe_foreign or folder_kind(target) != "foreign":
            fd, probe = tempfile.mkstemp(prefix=_WRITE_CHECK_PREFIX, dir=target)
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        return f"{target} is not writable ({exc.strerror or exc})"
    return None


@contextlib.contextmanager
def undo_if_refused(folder: str | Path) -> Iterator[None]:
    """Run a command's work in ``folder``; when it ends in refused input (an error of exit status 2, e.g. a
    table or member file found bad during Stage I) and the folder was new or empty when the block began, remove
    what the block wrote there: a refusal leaves nothing behind (no provenance record, no prepared rows). A
    folder that held content already (an earlier run of the same work) is left to the command, which checks
    before it writes. Any other end (a crash, Ctrl-C) keeps what was written, for the command to continue."""
    from iclmem.errors import EXIT_BAD_INPUT, DiskFull, is_disk_full

    path = Path(folder)
    kind = folder_kind(path)
    if kind not in ("missing", "empty"):
        yield
        return
    before = None if kind == "missing" else {p.name for p in path.iterdir()}
    try:
        yield
    except BaseException as exc:
        # a disk that ran full mid-way leaves half an audit, which no command continues: undone like a refusal
        full = isinstance(exc, OSError) and is_disk_full(exc)
        if (full or getattr(exc, "exit_code", None) == EXIT_BAD_INPUT) and path.is_dir():
            if before is None:
                for entry in path.iterdir():
                    if entry.name not in LOCK_NAMES:  # a lock held around the block is its holder's to remove
                        _remove(entry)
                with contextlib.suppress(OSError):
                    path.rmdir()
            else:
                for entry in path.iterdir():
                    if entry.name not in before and entry.name not in LOCK_NAMES:
                        _remove(entry)
        if full:
            raise DiskFull(f"{path}: the disk ran full while this command wrote there ({str(exc).strip()[:200]}); what it "
                           "had written there was removed. Free some space and run the command again") from exc
        raise


def _remove(entry: Path) -> None:
    import shutil

    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()


def roc_path(run_dir: str | Path, run_id: str, epoch: int) -> Path:
    return Path(run_dir) / ROC_DIR / f"roc_{run_id}_e{int(epoch)}.parquet"


# One probe result under PROBES_DIR/<run_id>/: <stem>.json (the checksummed row), <stem>.manip.parquet,
# <stem>.roc.parquet, <stem>.queries.parquet and <stem>.null_queries.parquet; the sweep writes them, the
# aggregator reads them.
ROW_SUFFIX = ".json"  # the checksummed results row; written last, it marks the result complete
MANIPULATION_SUFFIX = ".manip.parquet"  # per-manipulation AUC
ROC_SUFFIX = ".roc.parquet"  # the deciding score's ROC points
QUERIES_SUFFIX = ".queries.parquet"  # per query: what the reference-model attacks read
# per null split and query: the statistics each null split's verdict and known-context flag were computed from
NULL_QUERIES_SUFFIX = ".null_queries.parquet"


def probe_stem(epoch: int) -> str:
    """The file stem of a checkpoint's probe result (a multi-task run appends ``-t<i>`` per task)."""
    return f"e{int(epoch):04d}"


class RunStatus(str, Enum):
    """How the last driver of a run folder stands, as ``RUN_STATE_FILE`` records it."""

    RUNNING = "running"  # a driver is at work, or died without a word (killed, machine lost)
    INTERRUPTED = "interrupted"  # stopped by Ctrl-C: ``incomplete_runs`` lists the runs it left unfinished
    FAILED = "failed"  # ended on an error (e.g. checkpoints that could not be probed)
    COMPLETE = "complete"  # every run trained and every checkpoint probed

    def __str__(self) -> str:
        return self.value


def write_run_state(run_dir: str | Path, status: RunStatus, incomplete_runs: Iterable[str] = (),
                    note: str = "", *, refused: bool = False) -> None:
    """Record how this driver ends (or that it started): ``{"status", "incomplete_runs", "updated", "note"}``.

    ``incomplete_runs`` (INTERRUPTED only) are the run ids whose training had not finished when the sweep
    stopped; their rows in ``results.parquet`` (if any) cover only the checkpoints reached. The report
    reads this through :func:`read_run_state` to say the sweep is incomplete. ``refused`` (FAILED only): the
    sweep was refused after Stage I before any trial, probe or audit of it ever started (resources no local
    Ray has, unreachable storage or Ray head), and no earlier driver of the folder started one: ``"refused":
    true`` is added, and the folder holds no result of its config, so a run of another config may take it
    (:func:`never_started`)."""
    from iclmem.atomic import write_json_atomic

    state: dict[str, Any] = {
        "status": RunStatus(status).value,
        "incomplete_runs": sorted(set(incomplete_runs)),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "note": note,
    }
    if refused:
        state["refused"] = True
    write_json_atomic(Path(run_dir) / RUN_STATE_FILE, state)


# what a sweep that ever started work leaves in its folder (with its trials' storage, which may be elsewhere)
_STARTED_MARKERS = (RESULTS_FILE, REFERENCE_RESULTS_FILE, PROBES_DIR, REFERENCE_DIR, TUNE_DIR, WANDB_DIR, ROC_DIR,
                    CONTEXT_AUDITS_DIR, CONTEXT_AUDITS_FILE, DIVERGED_RUNS_FILE, TIMINGS_FILE, REPORT_FILE)


def never_started(run_dir: str | Path) -> str | None:
    """The note of the refusal that ended ``run_dir``'s sweep, when it never started any work: its last driver
    recorded a refusal before any trial (``write_run_state(..., refused=True)``, which only a driver of a folder
    where no work had started writes) and the folder holds no result, trial, probe, reference score or audit.
    Such a folder holds only the refused config and Stage I's cache: it claims nothing, and ``iclmem run``
    of a corrected config may take it over. None for any other folder."""
    from iclmem.errors import DataError

    try:
        state = read_run_state(run_dir)
    except DataError:
        return None
    if state is None or state["status"] != RunStatus.FAILED or state.get("refused") is not True:
        return None
    if any((Path(run_dir) / name).exists() for name in _STARTED_MARKERS):
        return None
    return str(state.get("note") or "refused before any trial started")


def read_run_state(run_dir: str | Path) -> dict[str, Any] | None:
    """The folder's run state (``status`` as a :class:`RunStatus`), or None for a folder written before
    the state was recorded. :class:`~iclmem.errors.DataError` when the file is not a run state."""
    import json

    from iclmem.errors import DataError

    path = Path(run_dir) / RUN_STATE_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
        state["status"] = RunStatus(state["status"])
        state["incomplete_runs"] = [str(r) for r in state.get("incomplete_runs", [])]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: not an iclmem run state ({exc})") from exc
    return dict(state)


def record_diverged_run(run_dir: str | Path, run_id: str) -> None:
    """Add ``run_id`` to the folder's diverged runs (``diverged_runs.json``: ``{"runs": [...]}``, sorted): a run
    whose loss went NaN or infinite stops by design, and the report shows it as ``diverged``, not as a gap.
    Kept across drivers: a resumed sweep adds to the file, never replaces it."""
    from iclmem.atomic import write_json_atomic

    runs = set(read_diverged_runs(run_dir))
    if run_id in runs:
        return
    write_json_atomic(Path(run_dir) / DIVERGED_RUNS_FILE, {"runs": sorted(runs | {str(run_id)})})


def read_diverged_runs(run_dir: str | Path) -> list[str]:
    """The run ids :func:`record_diverged_run` recorded (empty without the file);
    :class:`~iclmem.errors.DataError` when the file is not such a record."""
    import json

    from iclmem.errors import DataError

    path = Path(run_dir) / DIVERGED_RUNS_FILE
    if not path.is_file():
        return []
    try:
        runs = json.loads(path.read_text())["runs"]
        if not isinstance(runs, list):
            raise TypeError("runs is not a list")
        return [str(r) for r in runs]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: not an iclmem record of diverged runs ({exc})") from exc
