"""The run-folder layout: every file and folder a run writes under ``RUN_DIR``, named once.

The README's table "What a run writes" lists the same names; ``tests/test_atomic_writes.py`` checks that
each file here is written atomically."""

from __future__ import annotations

import time
from collections.abc import Iterable
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
DIVERGED_RUNS_FILE = "diverged_runs.json"  # the run ids whose training stopped on a NaN / inf loss (the driver)
# ``iclmem lm run | lm resume`` (``orchestrator.lm_sweep``) write RUN_STATE_FILE and CONSOLE_LOG_FILE too.

# An LM probe run folder (``iclmem lm run``; its provenance has ``kind = "lm"``)
# ``iclmem audit-context``: the deployed-context audit's folder
CONTEXT_AUDIT_FILE = "context_audit.parquet"  # one row per (target context, attack)
CONTEXT_ROC_FILE = "context_roc.parquet"  # (target, attack, fpr, tpr): each attack's ROC curve
CONTEXT_SCORES_FILE = "context_scores.parquet"  # one row per audited row: its id, member flag, each attack's score
CONTEXT_ROC_FIGURE = "context_roc.png"
CONTEXT_AUDITS_DIR = "context_audits"  # a sweep's regime context: one audit-context folder per audit (its run id)
CONTEXT_AUDITS_FILE = "context_audits.parquet"  # ... and every audit's rows, with its run id, task, model, Q, seed
LM_SWEEP_FILE = "lm_sweep.json"  # the validated LM sweep config, as resumed by ``iclmem lm resume``
LM_RESULTS_FILE = "lm_results.parquet"  # one row per model x dataset x probe x type x seed x variant x criterion
LM_REPORT_FILE = "lm_report.html"
LM_EXPOSURE_DIR = "lm_exposure"  # per-entity exposures and classes, one TSV per (model, dataset)
LM_UNITS_DIR = "lm_units"  # one stored result per work unit (exposure, NET type, NER type x seed)
LM_ASSETS_DIR = "lm_assets"  # the built-in synthetic model and dataset, built once per run folder

__all__ = [
    "FIGURES_DIR", "MANIPULATION_AUC_FILE", "PREPARED_DIR", "PROBES_DIR", "PROVENANCE_FILE", "REFERENCE_DIR",
    "REFERENCE_RESULTS_FILE", "REPORT_FILE", "RESULTS_FILE", "ROC_DIR", "SPLIT_REPORT_FILE", "SWEEP_FILE", "TUNE_DIR", "VERDICT_FILE",
    "WANDB_DIR", "LOCK_FILE", "DRIVER_FILE", "folder_kind", "roc_path", "existing_ancestor", "unwritable", "GROUND_TRUTH_FILE", "CONSOLE_LOG_FILE", "RUN_STATE_FILE", "RunStatus",
    "read_run_state", "write_run_state", "QUERIES_SUFFIX", "probe_stem",
    "LM_ASSETS_DIR", "LM_EXPOSURE_DIR", "LM_REPORT_FILE", "LM_RESULTS_FILE", "LM_SWEEP_FILE", "LM_UNITS_DIR",
]


def folder_kind(path: str | Path) -> str:
    """What ``path`` is: "missing", "empty", "tabular" (an iclmem sweep: ``sweep.json``), "lm" (an iclmem
    language-model run, by its provenance record), "audit" (an ``iclmem probe`` folder, likewise), or
    "foreign" (anything else: someone's files)."""
    from iclmem.errors import DataError
    from iclmem.provenance import Provenance

    folder = Path(path)
    if not folder.exists():
        return "missing"
    if not folder.is_dir():
        return "foreign"
    if not any(p.name not in LOCK_NAMES for p in folder.iterdir()):  # the lock of a command at work is no content
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


def unwritable(folder: str | Path) -> str | None:
    """Why iclmem could not write in ``folder`` (or create it), or None: checked before any work, so a
    read-only mount or a file in the way is one line of bad input, not a traceback after Stage I."""
    import os
    import tempfile

    target = existing_ancestor(folder)
    if not target.is_dir():
        return f"{target} is a file, not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".iclmem-write-check-", dir=target)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{target} is not writable ({exc.strerror or exc})"
    return None


def roc_path(run_dir: str | Path, run_id: str, epoch: int) -> Path:
    return Path(run_dir) / ROC_DIR / f"roc_{run_id}_e{int(epoch)}.parquet"


# One probe result under PROBES_DIR/<run_id>/: <stem>.json (the checksummed row), <stem>.manip.parquet,
# <stem>.roc.parquet and <stem>.queries.parquet; the sweep writes them, the aggregator reads them.
QUERIES_SUFFIX = ".queries.parquet"


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
                    note: str = "") -> None:
    """Record how this driver ends (or that it started): ``{"status", "incomplete_runs", "updated", "note"}``.

    ``incomplete_runs`` (INTERRUPTED only) are the run ids whose training had not finished when the sweep
    stopped; their rows in ``results.parquet`` (if any) cover only the checkpoints reached. The report
    reads this through :func:`read_run_state` to say the sweep is incomplete."""
    from iclmem.atomic import write_json_atomic

    write_json_atomic(Path(run_dir) / RUN_STATE_FILE, {
        "status": RunStatus(status).value,
        "incomplete_runs": sorted(set(incomplete_runs)),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "note": note,
    })


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
