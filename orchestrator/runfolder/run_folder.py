"""One reader of a sweep's run folder: every file the sweep writes there, read in one class.

The names are ``iclmem.runfolder``'s. The writers are elsewhere (``orchestrator.report.folder_claims.record_sweep``,
``iclmem.runfolder.write_run_state``, ``iclmem.provenance.Provenance.write``, ``orchestrator.report.aggregate`` through
``iclmem.atomic``, ``orchestrator.audits.context_audit.collect_sweep_audits``, ``orchestrator.runfolder.timing.write_timings``,
``orchestrator.report.wandb_logger.TrialRunsLedger.save``); the report, the W&B summary, aggregation and the CLI read a
folder only through :class:`RunFolder`. Reads are checked the way the writes are made: the sweep is validated
into a :class:`~orchestrator.schema.config.SweepConfig`, the run state, the provenance and the timings by their record
types, and every table with its page checksums verified (``iclmem.atomic``); the results and the reference
results also by their schema version and required columns. A damaged file is a
:class:`~iclmem.errors.DataError` naming it; an optional file that is absent reads as None.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from iclmem.atomic import parquet_metadata, read_json_object, read_parquet_verified
from iclmem.errors import DataError, ResultSchemaError
from iclmem.provenance import Provenance
from iclmem.record import RESULTS_SCHEMA_KEY, RESULTS_SCHEMA_VERSION, public_columns
from iclmem.runfolder import (
    CANARY_RANKING_FILE,
    CHANNEL_CROSSING_FILE,
    CLAIM_LEDGER_FILE,
    CONTEXT_AUDITS_DIR,
    CONTEXT_AUDITS_FILE,
    CONTEXT_SCORES_FILE,
    INFERENCE_ROWS_FILE,
    MANIPULATION_AUC_FILE,
    PROBES_DIR,
    RECORD_RISK_FILE,
    RECORD_SLICES_FILE,
    RECORD_STABILITY_FILE,
    REFERENCE_RESULTS_FILE,
    RESULTS_FILE,
    RISKIEST_RECORDS_FILE,
    ROC_DIR,
    ROW_SUFFIX,
    SLICE_RISK_FILE,
    SPLIT_REPORT_FILE,
    SWEEP_FILE,
    TIMINGS_FILE,
    TRIAL_RUNS_FILE,
    VALUE_SLICES_FILE,
    VERDICT_FILE,
    WANDB_DIR,
    RunStatus,
    read_diverged_runs,
    read_run_state,
    roc_path,
)
from orchestrator.runfolder.timing import RunTimings, read_timings
from orchestrator.schema.config import SweepConfig, read_stored_sweep

__all__ = ["RunFolder", "REQUIRED_RESULT_COLUMNS", "SPLIT_COLUMNS", "MANIPULATION_COLUMNS", "ROC_COLUMNS",
           "CONTEXT_AUDITS_COLUMNS", "TRIAL_RUNS_REMEDY", "public_results", "public_split_report",
           "public_manipulation_auc", "read_trial_runs"]

# what every results table this iclmem writes has; a table without them is of an older shape
REQUIRED_RESULT_COLUMNS: tuple[str, ...] = ("run_id", "task", "epoch", "outcome", "rule", "raw_memorization_flag",
                                            "calibrated_memorization_flag")
# the split and manipulation tables' public columns (the results row's are iclmem.record's)
SPLIT_COLUMNS: tuple[str, ...] = (
    "task", "label_mode", "seed", "q", "n_rows", "n_classes", "majority_share", "numeric_share",
    "tvd", "ks", "ks_pvalue", "wasserstein", "redraws", "exact_duplicates", "feature_duplicates",
    "input_contract", "pca_reason",  # one row per (task, model input contract)
    "label_design", "blind_auc", "blind_auc_low", "blind_auc_high", "blind_redraws",
)
MANIPULATION_COLUMNS: tuple[str, ...] = ("run_id", "task", "epoch", "manipulation", "category", "auc")
ROC_COLUMNS: tuple[str, ...] = ("fpr", "tpr")
# what every row of a sweep's context-audit table has: the audit's identity (orchestrator.audits.context_audit.
# collect_sweep_audits puts it in front) and the row's target context and attack
CONTEXT_AUDITS_COLUMNS: tuple[str, ...] = ("run_id", "task", "model", "q", "seed", "target", "attack")
_ROC_NAME = re.compile(r"^roc_(?P<run_id>.+)_e(?P<epoch>\d+)\.parquet$")  # the names roc_path gives
_REBUILD = "`iclmem report RUN_DIR --force` rebuilds it from the stored probe results"
_RECOLLECT = f"`iclmem resume RUN_DIR` collects it again from the audits' folders under {CONTEXT_AUDITS_DIR}/"
_REAUDIT = "`iclmem resume RUN_DIR` runs that audit again"
TRIAL_RUNS_REMEDY = "delete it to start the trials' W&B runs afresh (the results are not in it)"


def read_trial_runs(path: str | Path) -> dict[str, Any] | None:
    """The W&B trial-run ledger at ``path`` (``wandb/trial_runs.json``: ``{"token", "runs": {run_id: {...}}}``,
    written by ``orchestrator.report.wandb_logger.TrialRunsLedger.save``), or None when there is none yet. A damaged
    one, or a folder in its place, is a one-line :class:`~iclmem.errors.DataError` naming the file."""
    path = Path(path)
    if not path.exists():
        return None
    if not path.is_file():
        raise DataError(f"{path} is a folder, not the W&B trial-run ledger; {TRIAL_RUNS_REMEDY}")
    data = read_json_object(path, "W&B trial-run ledger", TRIAL_RUNS_REMEDY)
    runs, token = data.get("runs", {}), data.get("token", "")
    if (not isinstance(runs, dict) or not all(isinstance(v, dict) for v in runs.values())
            or not isinstance(token, (str, type(None)))):
        raise DataError(f"{path}: damaged, not the W&B trial-run ledger iclmem wrote (no mapping of runs); "
                        f"{TRIAL_RUNS_REMEDY}")
    return data


def public_results(results: pd.DataFrame) -> pd.DataFrame:
    """The results table reduced to the columns ``iclmem.record`` marks public (ids, config, metrics, verdicts)."""
    return results.loc[:, public_columns(results.columns)].copy()


def public_split_report(split: pd.DataFrame) -> pd.DataFrame:
    return split.loc[:, [c for c in SPLIT_COLUMNS if c in split.columns]].copy()


def public_manipulation_auc(manip: pd.DataFrame) -> pd.DataFrame:
    return manip.loc[:, [c for c in MANIPULATION_COLUMNS if c in manip.columns]].copy()


class RunFolder:
    """A sweep's run folder (``iclmem run --out``). Cheap to construct; each file is read when asked for."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    # ------------------------------------------------------------------------------ records
    @property
    def has_sweep(self) -> bool:
        return (self.path / SWEEP_FILE).is_file()

    @cached_property
    def sweep(self) -> SweepConfig:
        """The validated sweep (``sweep.json``); DataError when it is missing, damaged or not a sweep this
        iclmem accepts."""
        return read_stored_sweep(self.path)

    @cached_property
    def sweep_or_none(self) -> SweepConfig | None:
        """The sweep, or None for a folder without ``sweep.json`` (an audit folder); a damaged one is an error."""
        return self.sweep if self.has_sweep else None

    @property
    def run_state(self) -> dict[str, Any] | None:
        """How the last driver of this folder ended (``iclmem.runfolder.read_run_state``); None before any did."""
        return read_run_state(self.path)

    @property
    def interrupted(self) -> bool:
        """Whether the last driver was stopped before the sweep finished. A damaged state record reads as no
        record: the report says what is stored and never crashes on the marker."""
        try:
            state = self.run_state
        except DataError:
            return False
        return state is not None and state["status"] == RunStatus.INTERRUPTED

    def diverged_runs(self) -> frozenset[str]:
        """The runs whose training stopped on a NaN / inf loss, as the driver recorded them
        (``iclmem.runfolder.read_diverged_runs``). A damaged record reads as none, as a damaged run state
        does: the report says what is stored and never crashes on a marker."""
        try:
            return frozenset(read_diverged_runs(self.path))
        except DataError:
            return frozenset()

    @cached_property
    def provenance(self) -> Provenance | None:
        return Provenance.read(self.path)

    def public_provenance(self) -> dict[str, Any]:
        """The provenance fields that may leave the cluster (``{}`` when the folder has none)."""
        record = self.provenance
        return record.public() if record is not None else {}

    def written_by(self) -> str:
        """Which iclmem wrote the folder (its provenance), for messages about tables of another shape."""
        try:
            record = self.provenance
        except DataError:
            record = None
        return f"iclmem {record.iclmem_version}" if record is not None else "an iclmem that recorded no provenance"

    # ------------------------------------------------------------------------------ tables
    def results(self, *, public: bool = True) -> pd.DataFrame:
        """``results.parquet`` (checksums verified), reduced to its public columns unless ``public=False``.
        DataError when it is missing or damaged; ResultSchemaError, naming the iclmem that wrote it, when it
        records a newer schema or lacks a column every table of this iclmem has."""
        path = self.path / RESULTS_FILE
        if not path.is_file():
            raise DataError(f"{path}: results table not found (the sweep writes it after probing)")
        table = self._results_table(path, "results table")
        return public_results(table) if public else table

    def results_schema_version(self) -> int:
        """The schema version ``results.parquet`` records (``iclmem.record.RESULTS_SCHEMA_VERSION`` when written);
        1 for a table from before versions were recorded. ResultSchemaError when the recorded one is not a
        number."""
        return self._schema_version(self.path / RESULTS_FILE)

    def _schema_version(self, path: Path) -> int:
        value = parquet_metadata(path).get(RESULTS_SCHEMA_KEY, "1")
        try:
            return int(value)
        except ValueError:
            raise ResultSchemaError(f"{path}: results schema {value!r} is not a version number; {_REBUILD}") from None

    def _results_table(self, path: Path, what: str) -> pd.DataFrame:
        """A table of results rows at ``path``, checked as the aggregator writes it: every page checksum
        (DataError naming the file), then the schema version it records and the required columns
        (ResultSchemaError naming the iclmem that wrote it)."""
        table: pd.DataFrame = read_parquet_verified(path, what, _REBUILD)
        version = self._schema_version(path)
        if version > RESULTS_SCHEMA_VERSION:
            raise ResultSchemaError(f"{path}: results schema {version}, written by {self.written_by()}; this iclmem "
                                    f"reads schema {RESULTS_SCHEMA_VERSION} and older: read it with that iclmem or "
                                    "a newer one")
        missing = [c for c in REQUIRED_RESULT_COLUMNS if c not in table.columns]
        if missing:
            raise ResultSchemaError(f"{path}: missing required column(s) {missing}: a table written by "
                                    f"{self.written_by()} in a shape this iclmem no longer reads; {_REBUILD}")
        return table

    def stored_result_rows(self) -> int:
        """Rows of the stored results table (0 when there is none or it cannot be read): what a rebuild
        must not shrink."""
        import pyarrow.parquet as pq

        path = self.path / RESULTS_FILE
        if not path.is_file():
            return 0
        try:
            return int(pq.ParquetFile(path).metadata.num_rows)
        except Exception:  # noqa: BLE001 - an unreadable table holds nothing worth keeping
            return 0

    def reference_results(self) -> pd.DataFrame | None:
        """``reference_results.parquet`` (``probe.references``: the reference trials' own rows, every column as
        written: they are not audited runs and no report shows them), checked as :meth:`results` checks its
        table: checksums verified, the schema version and the required columns. None for a sweep without
        reference trials (no such file); DataError naming the file when it is damaged, ResultSchemaError when
        it is of a shape this iclmem does not read."""
        path = self.path / REFERENCE_RESULTS_FILE
        return self._results_table(path, "reference results table") if path.is_file() else None

    def split_report(self) -> pd.DataFrame | None:
        """The split validation table's public columns, or None."""
        path = self.path / SPLIT_REPORT_FILE
        if not path.is_file():
            return None
        return public_split_report(read_parquet_verified(path, "split report", "`iclmem resume RUN_DIR` writes it again"))

    def manipulation_auc(self) -> pd.DataFrame | None:
        """The per-manipulation AUC table's public columns, or None."""
        path = self.path / MANIPULATION_AUC_FILE
        if not path.is_file():
            return None
        return public_manipulation_auc(read_parquet_verified(path, "manipulation AUC table", _REBUILD))

    def context_audit_scores(self, run_id: str) -> pd.DataFrame | None:
        """The per-row scores of the sweep's context audit ``run_id`` (``context_audits/<run_id>/context_scores.parquet``:
        row id, member flag, one column ``<target>__<attack>`` per score), checksums verified; None without it."""
        path = self.path / CONTEXT_AUDITS_DIR / str(run_id) / CONTEXT_SCORES_FILE
        if not path.is_file():
            return None
        table: pd.DataFrame = read_parquet_verified(path, "context audit's per-row scores", _REAUDIT)
        return table

    def inference_rows(self, run_id: str) -> pd.DataFrame | None:
        """The per-row gains of the sweep's context audit ``run_id`` with ``probe.value_inference``
        (``context_audits/<run_id>/inference_rows.parquet``: row id, member flag, attack, gain), checksums verified;
        None without it."""
        path = self.path / CONTEXT_AUDITS_DIR / str(run_id) / INFERENCE_ROWS_FILE
        if not path.is_file():
            return None
        table: pd.DataFrame = read_parquet_verified(path, "context audit's per-row value-inference gains", _REAUDIT)
        return table

    def claim_ledger(self) -> pd.DataFrame | None:
        """The claim ledger (``orchestrator.report.claim_ledger``), checksums verified; None for a folder without one."""
        path = self.path / CLAIM_LEDGER_FILE
        return read_parquet_verified(path, f"claim ledger {CLAIM_LEDGER_FILE}", _REBUILD) if path.is_file() else None

    def risk_tables(self) -> dict[str, pd.DataFrame | None]:
        """The risk report's tables (``orchestrator.report.record_risk``), checksums verified, by short name: ``records``,
        ``slices``, ``slice_risk``, ``stability``, ``riskiest``, ``canaries``, ``crossing``, ``value_slices``; None for a table not written (a
        folder from before they existed, or a sweep with nothing they apply to). Row ids, never row values."""
        names = {"records": RECORD_RISK_FILE, "slices": RECORD_SLICES_FILE, "slice_risk": SLICE_RISK_FILE,
                 "stability": RECORD_STABILITY_FILE, "riskiest": RISKIEST_RECORDS_FILE, "canaries": CANARY_RANKING_FILE,
                 "crossing": CHANNEL_CROSSING_FILE, "value_slices": VALUE_SLICES_FILE}
        out: dict[str, pd.DataFrame | None] = {}
        for key, name in names.items():
            path = self.path / name
            out[key] = read_parquet_verified(path, f"risk report table {name}", _REBUILD) if path.is_file() else None
        return out

    def roc_files(self) -> pd.DataFrame:
        """Columns run_id, epoch, path for every ``roc/roc_<run_id>_e<epoch>.parquet`` present."""
        roc_dir = self.path / ROC_DIR
        rows = []
        if roc_dir.is_dir():
            for p in sorted(roc_dir.glob("roc_*.parquet")):
                m = _ROC_NAME.match(p.name)
                if m:
                    rows.append({"run_id": m["run_id"], "epoch": int(m["epoch"]), "path": p})
        return pd.DataFrame(rows, columns=["run_id", "epoch", "path"])

    def roc(self, run_id: str, epoch: int) -> pd.DataFrame | None:
        path = roc_path(self.path, run_id, epoch)
        if not path.is_file():
            return None
        return read_parquet_verified(path, "ROC curve", _REBUILD, columns=list(ROC_COLUMNS))

    def context_audits(self) -> pd.DataFrame | None:
        """``context_audits.parquet`` (a sweep's regime ``context``: every finished audit's rows, its run id,
        task, model, Q and seed in front; ``orchestrator.audits.context_audit.collect_sweep_audits``), checksums
        verified. None without it (a sweep without regime context, or before an audit finished); DataError
        naming the file when it is damaged or lacks :data:`CONTEXT_AUDITS_COLUMNS`."""
        path = self.path / CONTEXT_AUDITS_FILE
        if not path.is_file():
            return None
        table: pd.DataFrame = read_parquet_verified(path, "table of context audits", _RECOLLECT)
        missing = [c for c in CONTEXT_AUDITS_COLUMNS if c not in table.columns]
        if missing:
            raise DataError(f"{path}: not the table of context audits this iclmem writes (no column(s) {missing}); "
                            f"{_RECOLLECT}")
        return table

    def context_audit_verdict(self, run_id: str) -> dict[str, Any] | None:
        """The verdict of the sweep's context audit ``run_id`` (``context_audits/<run_id>/verdict.json``, as
        ``orchestrator.audits.context_audit.write_audit_folder`` wrote it, last: its presence marks the audit done),
        or None when that audit has none. DataError naming the file when it is not the JSON object written."""
        path = self.path / CONTEXT_AUDITS_DIR / str(run_id) / VERDICT_FILE
        if not path.is_file():
            return None
        return read_json_object(path, "context audit verdict", _REAUDIT)

    def timings(self) -> RunTimings | None:
        """What the sweep spent, phase by phase (``timings.json``, read by ``orchestrator.runfolder.timing.read_timings``
        into its record type), or None when there is none (a sweep that has not completed, or one from before
        the record). DataError naming the file when it is not such a record."""
        if not (self.path / TIMINGS_FILE).is_file():
            return None
        return read_timings(self.path)

    def trial_runs(self) -> dict[str, Any] | None:
        """The W&B trial-run ledger (``wandb/trial_runs.json``: the W&B run id of every trial and what each run
        already holds; :func:`read_trial_runs`), or None before the trials logged to W&B. DataError naming the
        file when it is damaged."""
        return read_trial_runs(self.path / WANDB_DIR / TRIAL_RUNS_FILE)

    def probe_results(self) -> Iterator[tuple[str, str, Any]]:
        """(run folder name, stem, ``probes.probe.ProbeResult``) of every stored probe result that loads
        (checksums verified; a damaged one is named and skipped, to be recomputed)."""
        from probes.probe import ProbeResult

        for stored in sorted((self.path / PROBES_DIR).glob(f"*/e*{ROW_SUFFIX}")):
            result = ProbeResult.load(stored.parent, stored.stem)
            if result is not None:
                yield stored.parent.name, stored.stem, result
