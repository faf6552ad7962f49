"""Result logging: two small logger interfaces with no-op defaults, and their W&B implementations.

:class:`WandbResultsLogger` writes one sweep-summary run (tables, figures, ROC charts, detectable share,
outcome counts, the results artifact); :class:`WandbTrialLogger` writes one run per trial from the sweep
driver (flat config, training and probe metrics against epoch), which W&B's run table can group and
filter by config.

* ``wandb`` is imported only inside methods, so importing this module (and running a sweep without
  W&B) never loads it.
* Offline by default: a run goes online only if the caller asks for ``mode="online"`` *and*
  ``WANDB_API_KEY`` is set in the environment. The key is never read beyond that presence check,
  never logged, never written; wandb itself picks it up from the environment.
* Files land under ``RUN_DIR/wandb/`` (``wandb.init(dir=RUN_DIR)``: wandb appends ``wandb/`` itself,
  giving ``RUN_DIR/wandb/offline-run-*/``). The exported results artifact is written to
  ``RUN_DIR/wandb/export/`` and referenced in place (immutable policy), so the run directory is complete
  for a later ``wandb sync``.
* Privacy: what is logged is computed by :mod:`orchestrator.report.wandb_summary` from the allow-listed
  public tables and columns of :mod:`orchestrator.report.tables` (training results: numbers only). The W&B
  config is built there from ids and provenance allow-lists, never from a caller's free-form config, so a
  raw record cannot reach W&B.

The keys, the values of each run and the W&B Report (:func:`orchestrator.report.wandb_summary.build_wandb_report`)
live in :mod:`orchestrator.report.wandb_summary`; this module only opens, writes and closes W&B runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import pandas as pd

from iclmem.atomic import write_json_atomic, write_parquet_atomic
from iclmem.errors import ConfigError
from iclmem.runfolder import PREPARED_DIR, TRIAL_RUNS_FILE, WANDB_DIR, WANDB_EXPORT_DIR
from orchestrator.report import tables as R
from orchestrator.report.wandb_summary import (
    CHANNEL_CROSSING_TABLE_KEY,
    CHECKPOINT_ARTIFACT_TYPE,
    CLAIM_LEDGER_TABLE_KEY,
    CONTEXT_AUDIT_FIGURE_KEY,
    CONTEXT_AUDIT_TABLE_KEY,
    EPOCH_KEY,
    FIGURE_PREFIX,
    LM_RESULTS_TABLE_KEY,
    MAX_TABLE_ROWS,
    PEAK_TABLE_FILE,
    PEAK_TABLE_KEY,
    RESULTS_TABLE_KEY,
    RISKIEST_TABLE_KEY,
    SHARE_PREFIX,
    SLICE_RISK_TABLE_KEY,
    TASK_ARTIFACT_TYPE,
    TRIAL_JOB_TYPE,
    alert_for,
    artifact_name,
    checkpoint_artifact_refs,
    checkpoint_metadata,
    checkpoint_reference,
    context_audit_config,
    context_audit_public,
    context_audit_scalars,
    export_tables,
    lm_summary_config,
    lm_summary_scalars,
    probe_metrics,
    roc_key,
    roc_selection,
    run_headline,
    safe_key,
    share_history,
    summary_config,
    summary_scalars,
    table_frame,
    training_metrics,
    trial_run_config,
)
from orchestrator.runfolder.run_folder import TRIAL_RUNS_REMEDY, RunFolder, read_trial_runs

if TYPE_CHECKING:
    from trainables.spec import TrialConfig

log = logging.getLogger(__name__)

__all__ = ["NullResultsLogger", "NullTrialLogger", "ResultsLogger", "TRIAL_RUNS_FILE", "TrialLogger", "TrialRunsLedger",
           "WandbResultsLogger", "WandbTrialLogger", "close_within", "make_results_logger", "make_trial_logger",
           "resolve_wandb_mode", "WANDB_FINISH_TIMEOUT_S"]


# --------------------------------------------------------------------------------------------------
# Logger interface
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class ResultsLogger(Protocol):
    def log_summary(self, run_dir: str | Path, results_df: pd.DataFrame,
                    figures: Mapping[str, str | Path | None] | None = None) -> None: ...

    def finish(self, timeout: float | None = None) -> bool: ...


def risk_tables_payload(folder: RunFolder) -> dict[str, Any]:
    """The risk report's tables as W&B tables: the riskiest rows of each task, every slice result (up to
    :data:`MAX_TABLE_ROWS`, the slices that leak more first) and the two channels' crossing; empty for a folder
    without them."""
    import wandb

    risk = folder.risk_tables()
    out: dict[str, Any] = {}
    riskiest = risk.get("riskiest")
    if riskiest is not None and not riskiest.empty:
        out[RISKIEST_TABLE_KEY] = wandb.Table(dataframe=table_frame(riskiest))
    slices = risk.get("slice_risk")
    if slices is not None and not slices.empty:
        ordered = slices.sort_values(["leaks_more", "exposed", "auc"], ascending=False, kind="mergesort")
        out[SLICE_RISK_TABLE_KEY] = wandb.Table(dataframe=table_frame(ordered.head(MAX_TABLE_ROWS)))
    crossing = risk.get("crossing")
    if crossing is not None and not crossing.empty:
        out[CHANNEL_CROSSING_TABLE_KEY] = wandb.Table(dataframe=table_frame(crossing.head(MAX_TABLE_ROWS)))
    ledger = folder.claim_ledger()
    if ledger is not None and not ledger.empty:  # the claims the summary can make, each with its null rate
        made = ledger[ledger["made"].astype(bool)]
        out[CLAIM_LEDGER_TABLE_KEY] = wandb.Table(dataframe=table_frame(made.head(MAX_TABLE_ROWS)))
        for reading, count in made["reading"].value_counts().items():
            out[f"claims/{reading}"] = int(count)
    return out


class NullResultsLogger:
    """The default: logs nothing."""

    def log_summary(self, run_dir: str | Path, results_df: pd.DataFrame,
                    figures: Mapping[str, str | Path | None] | None = None) -> None:
        return None

    def finish(self, timeout: float | None = None) -> bool:
        return True


_SAID: set[str] = set()  # the mode overrides this process has already named (each is said once)


def _say_once(line: str) -> None:
    """One warning line on stderr, once per process: the mode is resolved by every logger a command opens."""
    import sys

    if line not in _SAID:
        _SAID.add(line)
        print(f"iclmem: warning: {line}", file=sys.stderr, flush=True)


WandbRunMode = Literal["online", "offline", "disabled"]  # what a run is opened with (wandb.init's mode)


def resolve_wandb_mode(requested: str | None = "offline",
                       environ: Mapping[str, str] | None = None) -> WandbRunMode:
    """``online`` only when asked for and ``WANDB_API_KEY`` is present; ``disabled`` if asked; else offline.

    An environment ``WANDB_MODE`` of offline/disabled also wins over a request for online, and says so in one
    warning line on stderr naming ``WANDB_MODE`` (once per process): online must not turn offline unsaid.
    """
    env = os.environ if environ is None else environ
    req = (requested or "offline").lower()
    raw_env_mode = str(env.get("WANDB_MODE", ""))
    env_mode = raw_env_mode.lower()
    if req == "disabled":
        return "disabled"
    if env_mode == "disabled":
        if req == "online":
            _say_once(f"W&B online mode requested, but the environment sets WANDB_MODE={raw_env_mode}: nothing is "
                      "logged to W&B (unset WANDB_MODE to log online)")
        return "disabled"
    if req == "online":
        if env_mode in ("offline", "dryrun"):
            _say_once(f"W&B online mode requested, but the environment sets WANDB_MODE={raw_env_mode}: logging "
                      "offline (unset WANDB_MODE to log online)")
            return "offline"
        if env.get("WANDB_API_KEY"):
            return "online"
        log.warning("W&B online mode requested but WANDB_API_KEY is not set; logging offline")
        return "offline"
    if req not in ("offline", "dryrun"):
        raise ValueError(f"W&B mode must be 'offline', 'online' or 'disabled', not {requested!r}")
    return "offline"


def _quiet_settings() -> Any:
    """What every iclmem W&B run shares: no console capture, code, git state or system stats."""
    import wandb

    return wandb.Settings(console="off", save_code=False, disable_git=True, x_disable_stats=True, silent=True)


class WandbResultsLogger:
    """One W&B run per sweep (``job_type="sweep-summary"``) holding the sweep's results.

    ``log_summary`` logs: the public results table and the peak-checkpoint table (``wandb.Table``), the
    figures (``wandb.Image``), ROC charts of the top peak checkpoints, the detectable-share history
    against ``epoch``, outcome counts and rates in the summary, and the public results parquet as an
    artifact. Per-configuration metrics are the trial runs' (:class:`WandbTrialLogger`).
    """

    def __init__(self, project: str, group: str | None = None, *, entity: str | None = None,
                 name: str | None = None, mode: str = "offline", job_type: str = "sweep-summary",
                 tags: Iterable[str] = (), max_roc_curves: int = 20, teardown_on_finish: bool = True) -> None:
        self.project = project
        self.group = group
        self.entity = entity
        self.name = name
        self.mode = resolve_wandb_mode(mode)
        self.job_type = job_type
        self.tags = tuple(str(t) for t in tags)
        self.max_roc_curves = int(max_roc_curves)
        self.teardown_on_finish = bool(teardown_on_finish)
        self._run: Any = None  # the open wandb Run

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def run(self) -> Any:
        return self._run

    def _start(self, run_dir: Path, config: Mapping[str, Any]) -> Any:
        import wandb  # lazy: only a sweep that logs to W&B loads it

        self._run = wandb.init(project=self.project, entity=self.entity, group=self.group, name=self.name,
                               job_type=self.job_type, tags=list(self.tags), dir=str(run_dir),
                               mode=self.mode, config=dict(config), settings=_quiet_settings(),
                               reinit="create_new")
        return self._run

    def finish(self, timeout: float | None = None) -> bool:
        """Finish the summary run. With ``teardown_on_finish`` (default) also shut the wandb service down:
        ``run.finish()`` can return before the service has flushed the offline transaction log
        (``run-*.wandb``), and only the service's exit guarantees the file is complete on disk. Pass
        ``teardown_on_finish=False`` when other W&B runs in this process are still active. With ``timeout``
        (seconds), False if W&B has not finished by then (see :func:`close_within`)."""
        if self._run is None:
            return True
        import wandb

        run, self._run = self._run, None

        def close() -> None:
            run.finish()
            if self.teardown_on_finish:
                wandb.teardown()

        return close_within(close, timeout, "the summary run", Path(run.dir) if getattr(run, "dir", None) else
                            Path(WANDB_DIR))

    def __enter__(self) -> WandbResultsLogger:
        return self

    def __exit__(self, exc_type: Any, *_exc: Any) -> None:
        # a Ctrl-C while logging: wait for W&B no longer than the drivers do after one
        self.finish(timeout=WANDB_FINISH_TIMEOUT_S if exc_type is not None and issubclass(
            exc_type, KeyboardInterrupt) else None)

    # -- logging -----------------------------------------------------------------------------------

    def log_summary(self, run_dir: str | Path, results_df: pd.DataFrame,
                    figures: Mapping[str, str | Path | None] | None = None) -> None:
        import wandb

        run_dir = Path(run_dir)
        public = R.public_results(results_df)
        run = self._run or self._start(run_dir, summary_config(run_dir, public))
        if run is None or self.mode == "disabled":
            return
        run.define_metric(EPOCH_KEY)
        run.define_metric(f"{SHARE_PREFIX}/*", step_metric=EPOCH_KEY)
        for row in share_history(public):
            run.log(row)

        tables = export_tables(run_dir, public)
        payload: dict[str, Any] = {}
        if len(public) <= MAX_TABLE_ROWS:
            payload[RESULTS_TABLE_KEY] = wandb.Table(dataframe=table_frame(public))
        else:
            log.warning("results table has %d rows (> %d): logging the peak table only; the artifact holds "
                        "every row", len(public), MAX_TABLE_ROWS)
        payload[PEAK_TABLE_KEY] = wandb.Table(dataframe=table_frame(tables[PEAK_TABLE_FILE]))
        for fname, path in (figures or {}).items():
            if path is not None and Path(path).is_file():
                payload[f"{FIGURE_PREFIX}/{safe_key(fname)}"] = wandb.Image(str(path), caption=str(fname))
        folder = RunFolder(run_dir)
        payload.update(risk_tables_payload(folder))
        for r in roc_selection(run_dir, public, self.max_roc_curves).itertuples(index=False):
            roc = folder.roc(r.run_id, int(r.epoch))
            if roc is None or roc.empty:
                continue
            title = f"ROC {r.task} lr={float(r.lr):g} Q={r.q} epoch {int(r.epoch)} (AUC {float(r.auc):.3f})"
            table = wandb.Table(dataframe=roc.astype(float).sort_values(["fpr", "tpr"]))
            payload[roc_key(r.run_id, r.epoch)] = wandb.plot.line(table, "fpr", "tpr", title=title)
        run.log(payload)
        for k, v in summary_scalars(public).items():
            run.summary[k] = v
        if self.mode == "online":  # lineage: the results come from these checkpoints (W&B records uses online)
            for ref in checkpoint_artifact_refs(public):
                try:
                    run.use_artifact(ref)
                except Exception as exc:  # a checkpoint its trial run never logged (W&B off then): said, skipped
                    log.warning("W&B lineage: %s not found (%s)", ref, exc)
        run.log_artifact(self._artifact(run_dir, public, tables))

    def _artifact(self, run_dir: Path, public: pd.DataFrame, tables: Mapping[str, pd.DataFrame]) -> Any:
        import wandb

        export = run_dir / WANDB_DIR / WANDB_EXPORT_DIR
        export.mkdir(parents=True, exist_ok=True)
        name = safe_key(f"iclmem-results-{self.group or run_dir.name}").replace("=", "-")
        art = wandb.Artifact(name=name, type="iclmem-results",
                             description="IclMem results (public columns only: ids, config, metrics)",
                             metadata={"n_checkpoints": int(len(public))})
        for fname, df in tables.items():
            path = export / fname
            write_parquet_atomic(df, path)
            art.add_file(str(path), name=fname, policy="immutable", skip_cache=True)
        return art

    def log_context_audit(self, run_dir: str | Path, table: pd.DataFrame, verdict: Mapping[str, Any],
                          figure: Path | None = None) -> None:
        """A deployed-context audit's run: its public table (ids, sizes, metrics:
        :data:`~orchestrator.report.wandb_summary.CONTEXT_AUDIT_COLUMNS`), the verdict and each attack's
        numbers in the summary, the ROC figure. No row of the audited table reaches W&B."""
        import wandb

        run_dir = Path(run_dir)
        provenance = RunFolder(run_dir).provenance
        run = self._run or self._start(run_dir, context_audit_config(run_dir, provenance.to_dict() if provenance
                                                                     else {}))
        payload: dict[str, Any] = {CONTEXT_AUDIT_TABLE_KEY: wandb.Table(dataframe=table_frame(
            context_audit_public(table)))}
        if figure is not None and Path(figure).is_file():
            payload[CONTEXT_AUDIT_FIGURE_KEY] = wandb.Image(str(figure), caption="ROC, log-log")
        run.log(payload)
        for k, v in context_audit_scalars(verdict, table).items():
            run.summary[k] = v

    def log_value_audit(self, run_dir: str | Path, table: pd.DataFrame, verdict: Mapping[str, Any]) -> None:
        """A value-inference or saved-file audit's run (``iclmem audit-context --attack label|attribute|file``):
        its table of rates (:data:`~orchestrator.report.wandb_summary.VALUE_AUDIT_TABLE_KEY`) and its verdict's
        scalars in the summary. The table holds rates, AUCs and errors; no row of the audited table reaches W&B."""
        import wandb

        from orchestrator.report.wandb_summary import VALUE_AUDIT_TABLE_KEY, value_audit_scalars

        run_dir = Path(run_dir)
        provenance = RunFolder(run_dir).provenance
        run = self._run or self._start(run_dir, context_audit_config(run_dir, provenance.to_dict() if provenance
                                                                     else {}))
        run.log({VALUE_AUDIT_TABLE_KEY: wandb.Table(dataframe=table_frame(table))})
        for k, v in value_audit_scalars(verdict).items():
            run.summary[k] = v

    def log_lm_summary(self, run_dir: str | Path, results: pd.DataFrame, files: Iterable[Path] = ()) -> None:
        """The LM probe sweep's summary run: its results table (metrics, model, dataset and entity-type
        names and counts: no sentence or entity string), mean F1 per probe and variant in the summary, and
        ``files`` (the report and results table) as an artifact."""
        import wandb

        run_dir = Path(run_dir)
        run = self._run or self._start(run_dir, lm_summary_config(run_dir, results))
        run.log({LM_RESULTS_TABLE_KEY: wandb.Table(dataframe=table_frame(results))})
        for k, v in lm_summary_scalars(results).items():
            run.summary[k] = v
        art = wandb.Artifact(safe_key(f"iclmem-lm-{self.group or run_dir.name}").replace("=", "-"),
                             type="lm-results")
        for path in files:
            art.add_file(str(path), name=Path(path).name)
        run.log_artifact(art)


# --------------------------------------------------------------------------------------------------
# Per-trial runs: one W&B run per trial (and per base-model sanity check), written by the sweep driver
# --------------------------------------------------------------------------------------------------

@runtime_checkable
class TrialLogger(Protocol):
    """Receives, in the sweep driver, each trial's training results and each checkpoint's probe row."""

    def log_training(self, identity: Mapping[str, Any], result: Mapping[str, Any]) -> None: ...

    def log_probe(self, row: Mapping[str, Any]) -> None: ...

    def log_checkpoint(self, trial: TrialConfig, epoch: int, checkpoint_uri: str) -> None: ...

    def finish(self, timeout: float | None = None) -> bool: ...


class NullTrialLogger:
    """The default: logs nothing."""

    def log_training(self, identity: Mapping[str, Any], result: Mapping[str, Any]) -> None:
        return None

    def log_probe(self, row: Mapping[str, Any]) -> None:
        return None

    def log_checkpoint(self, trial: TrialConfig, epoch: int, checkpoint_uri: str) -> None:
        return None

    def finish(self, timeout: float | None = None) -> bool:
        return True


class TrialRunsLedger:
    """``RUN_DIR/wandb/trial_runs.json``: the W&B run id of every trial and the epochs each run already
    holds, so that a restarted driver (``iclmem resume``) continues the same runs and logs each epoch's
    training metrics and each checkpoint's probe row once.

    Run ids are ``<config hash>-<token>-<hash of run_id>``: deterministic within a run folder (the token
    is drawn once and stored here), and distinct between two run folders of the same sweep config, which
    would otherwise be merged into the same W&B runs by ``wandb sync`` or online resume.
    """

    REMEDY = TRIAL_RUNS_REMEDY

    def __init__(self, path: Path, config_hash: str) -> None:
        self.path = path
        data = self.read(path)
        self.token: str = data.get("token") or f"{str(config_hash)[:8]}-{secrets.token_hex(3)}"
        self.runs: dict[str, dict[str, Any]] = data.get("runs", {})

    @classmethod
    def read(cls, path: Path) -> dict[str, Any]:
        """The ledger's JSON (``{}`` when there is none yet); a damaged one is a one-line
        :class:`~iclmem.errors.DataError` naming the file (``iclmem resume`` checks it before any work, through
        ``RunFolder.trial_runs``). The run folder's reader reads it: ``orchestrator.runfolder.run_folder.read_trial_runs``."""
        return read_trial_runs(path) or {}

    def entry(self, run_id: str) -> dict[str, Any]:
        if run_id not in self.runs:
            digest = hashlib.sha1(run_id.encode()).hexdigest()[:10]
            self.runs[run_id] = {"wandb_id": f"{self.token}-{digest}", "trained_to": 0, "probed": []}
        return self.runs[run_id]

    def save(self) -> None:
        write_json_atomic(self.path, {"token": self.token, "runs": self.runs}, indent=1, sort_keys=True)


class WandbTrialLogger:
    """One W&B run per trial (``job_type="trial"``, grouped by sweep), opened by the sweep driver.

    Each run holds its trial's flat config (:data:`TRIAL_CONFIG_KEYS` and ``sweep``), its per-epoch
    training metrics (fed by a Tune callback's ``on_trial_result``) and its checkpoints' probe metrics and
    outcome as ``probe/*`` (fed by the driver's probe-pool polls), all against ``epoch``
    (``define_metric(step_metric="epoch")``), and in its summary the last checkpoint's ``probe/*`` and
    the peak checkpoint's ``peak/*``. The base-model sanity checks (regime ``base``, no training: a
    pipeline check, not a control) get a run each too, so the run table holds every row of the results
    table.

    Why in the driver, not Ray's ``WandbLoggerCallback`` (a logging actor per trial): probe results
    arrive in the driver, often after the trial has finished (the actor is gone by then) and after a
    driver restart; only a logger that lives where the rows arrive can put them into the trial's own
    run. It also keeps the W&B key out of Ray: wandb reads it from the driver's environment, while Ray's
    callback hands it to its actors through the runtime env, which Ray's agent logs in plain text.
    wandb ≥ 0.19.10 runs several runs in one process (``reinit="create_new"``); each stays open until
    :meth:`finish` (after the probe pool is drained), since a late probe row may still come, so a sweep
    holds as many open runs as it has trials and sanity checks. Run ids are
    deterministic per run folder (:class:`TrialRunsLedger`) and opened with ``resume="allow"``: online,
    a resumed sweep continues the same runs; offline, each driver writes its own
    ``offline-run-*-<id>`` folder under ``RUN_DIR/wandb/`` and ``wandb sync`` appends them in order.
    Probe rows are reduced to the public allow-list (:func:`probe_metrics`), training results to numbers.
    """

    def __init__(self, run_dir: str | Path, *, project: str, group: str | None, config_hash: str,
                 entity: str | None = None, mode: str = "offline", tags: Iterable[str] = ()) -> None:
        self.run_dir = Path(run_dir)
        self.project, self.group, self.entity = project, group, entity
        self.config_hash = str(config_hash)
        self.mode = resolve_wandb_mode(mode)
        self.tags = tuple(str(t) for t in tags)
        self._ledger: TrialRunsLedger | None = None  # read on first use: constructing touches no file
        self._runs: dict[str, Any] = {}
        self._rows: dict[str, dict[int, dict[str, Any]]] = {}  # run_id -> epoch -> public probe row
        self.unavailable: str | None = None  # why W&B could not open a run; then nothing more is tried

    @property
    def ledger(self) -> TrialRunsLedger:
        if self._ledger is None:
            self._ledger = TrialRunsLedger(self.run_dir / WANDB_DIR / TRIAL_RUNS_FILE, self.config_hash)
        return self._ledger

    @property
    def runs(self) -> Mapping[str, Any]:
        """The open W&B runs, by iclmem run_id."""
        return dict(self._runs)

    def _run_for(self, identity: Mapping[str, Any]) -> Any:
        """The trial's open run, opened on first use; None once W&B has failed to open one."""
        run_id = str(identity["run_id"])
        if run_id in self._runs or self.unavailable is not None:
            return self._runs.get(run_id)
        import wandb  # lazy: only a sweep that logs to W&B loads it

        entry = self.ledger.entry(run_id)
        self.ledger.save()  # the id is fixed before the run exists, so a restart reuses it
        try:
            run = wandb.init(project=self.project, entity=self.entity, group=self.group, name=run_id,
                             id=entry["wandb_id"], resume="allow", job_type=TRIAL_JOB_TYPE, tags=list(self.tags),
                             dir=str(self.run_dir), mode=self.mode, config=trial_run_config(identity, self.group),
                             settings=_quiet_settings(), reinit="create_new")
        except Exception as exc:  # any wandb failure: network, authentication, timeout, disk
            # This runs inside Tune's callbacks, where an exception aborts the whole sweep; W&B is a
            # copy of results that stay on disk, so it is switched off (loudly) instead. Not retried:
            # online, each attempt can block the sweep for wandb's init timeout.
            self.unavailable = f"{type(exc).__name__}: {exc}"
            log.warning("W&B could not open the run of trial %s (%s); no more trial runs are logged in this "
                        "sweep. Results, report and the W&B summary (iclmem report) are not affected.",
                        run_id, self.unavailable)
            return None
        run.define_metric(EPOCH_KEY)
        run.define_metric("*", step_metric=EPOCH_KEY)
        self._runs[run_id] = run
        return run

    def log_training(self, identity: Mapping[str, Any], result: Mapping[str, Any]) -> None:
        if self.mode == "disabled" or result.get(EPOCH_KEY) is None:
            return
        epoch = int(result[EPOCH_KEY])
        entry = self.ledger.entry(str(identity["run_id"]))
        if epoch <= int(entry["trained_to"]):
            return  # already in the run: logged before a driver restart, or re-run after a trial failure
        run = self._run_for(identity)
        if run is None:
            return
        run.log({EPOCH_KEY: epoch, **training_metrics(result)})
        entry["trained_to"] = epoch
        self.ledger.save()

    def log_probe(self, row: Mapping[str, Any]) -> None:
        if self.mode == "disabled":
            return
        run_id, epoch = str(row["run_id"]), int(row[EPOCH_KEY])
        public = R.public_results(pd.DataFrame([dict(row)])).iloc[0].to_dict()
        self._rows.setdefault(run_id, {})[epoch] = public
        run = self._run_for(public)
        if run is None:
            return
        entry = self.ledger.entry(run_id)
        if epoch not in entry["probed"]:  # a stored result comes back on every resume's catch-up pass
            run.log({EPOCH_KEY: epoch, **probe_metrics(public)})
            entry["probed"] = sorted([*entry["probed"], epoch])
            self.ledger.save()
        # Rows may arrive in any epoch order; the summary is recomputed from every row this driver saw
        # (a resumed driver sees them all again: its catch-up pass resubmits every checkpoint).
        run.summary.update(run_headline(self._rows[run_id].values()))
        alert = alert_for(public)
        if alert is not None and alert[0] not in entry.setdefault("alerted", []):
            run.alert(title=alert[0], text=alert[1], level="WARN")  # once per run and kind (wandb.AlertLevel.WARN)
            entry["alerted"] = [*entry["alerted"], alert[0]]
            self.ledger.save()

    def log_checkpoint(self, trial: TrialConfig, epoch: int, checkpoint_uri: str) -> None:
        """W&B lineage of a checkpoint: an artifact ``checkpoint-<run id>`` (alias ``epoch-<n>``) holding a
        reference to the checkpoint's storage URI, with its weights' and files' sha256 in the metadata (read
        from the checkpoint's manifest when the driver can reach it); no weights are uploaded. The trial's
        inputs, its prepared task and base weights, are artifacts the run uses (online; W&B records uses
        only online, so offline runs name them in their summary, ``inputs/*``)."""
        if self.mode == "disabled":
            return
        identity = trial.identity
        run = self._run_for(identity)
        if run is None:
            return
        import wandb

        run_id = str(identity["run_id"])
        entry = self.ledger.entry(run_id)
        if int(epoch) in entry.setdefault("checkpoints", []):
            return  # logged before a driver restart
        manifest = None
        local = None if "://" in checkpoint_uri and not checkpoint_uri.startswith("file://") else \
            Path(checkpoint_uri.removeprefix("file://"))
        if local is not None and (local / "checkpoint.json").is_file():
            try:
                manifest = json.loads((local / "checkpoint.json").read_text())
            except (OSError, ValueError):
                manifest = None
        artifact = wandb.Artifact(artifact_name("checkpoint", run_id), type=CHECKPOINT_ARTIFACT_TYPE,
                                  metadata=checkpoint_metadata(run_id, int(epoch), manifest))
        artifact.add_reference(checkpoint_reference(checkpoint_uri), checksum=False)
        if not entry.get("inputs"):
            entry["inputs"] = self._use_inputs(run, trial)
        run.log_artifact(artifact, aliases=[f"epoch-{int(epoch)}"])
        entry["checkpoints"] = sorted([*entry["checkpoints"], int(epoch)])
        self.ledger.save()

    def _use_inputs(self, run: Any, trial: TrialConfig) -> list[str]:
        """The trial's prepared task(s) and base weights as input artifacts: used by the run online, named in
        its summary offline. References to the files (with their checksums), never their contents."""
        import wandb

        inputs = []
        prepared = self.run_dir / PREPARED_DIR
        for key in trial.task_keys:
            art = wandb.Artifact(artifact_name("task", key), type=TASK_ARTIFACT_TYPE,
                                 metadata={"fingerprint": key, "task": trial.identity.get("task")})
            files = sorted(prepared.glob(f"{key}.*")) if prepared.is_dir() else []
            for path in files:
                art.add_reference(f"file://{path.resolve()}", checksum=True)
            if not files:  # prepared in data.cache_dir: named by its fingerprint
                # a scheme W&B does not know needs an entry name (wandb refuses it without one)
                art.add_reference(f"iclmem://prepared/{key}", name=f"prepared-{key[:16]}", checksum=False)
            inputs.append(art)
        model = str(trial.finetune.model)
        options = dict(trial.finetune.model_options)
        base = wandb.Artifact(artifact_name("base", f"{model}-{json.dumps(options, sort_keys=True)}"),
                              type=CHECKPOINT_ARTIFACT_TYPE, metadata={"model": model, "options": options})
        try:
            from trainables.models.checkpoints import locate_weights

            weights = locate_weights(model, options)
        except Exception:  # weights the driver cannot locate: the artifact names the model's options only
            weights = None
        if weights is not None:
            base.add_reference(f"file://{Path(weights).resolve()}", checksum=True)
        else:
            base.add_reference(f"iclmem://{model}/{options.get('weights', 'default')}", name=f"base-{model}",
                               checksum=False)
        inputs.append(base)
        if self.mode == "online":
            for art in inputs:
                run.use_artifact(art)
        else:
            run.summary.update({f"inputs/{a.type}/{i}": a.name for i, a in enumerate(inputs)})
        return [a.name for a in inputs]

    def finish(self, timeout: float | None = None) -> bool:
        """Finish every open run, then shut the wandb service down so the offline transaction logs are
        complete on disk (``run.finish()`` can return before the service has flushed them).

        With ``timeout`` (seconds) the driver waits no longer than that and returns False if W&B has not
        finished by then: after a Ctrl-C the wandb service may have got the same SIGINT (a terminal sends
        it to the whole process group) and ``run.finish()`` then waits for it forever. The runs' data is
        in their ``RUN_DIR/wandb`` folders up to the last flush; ``iclmem resume`` continues the same runs."""
        if not self._runs:
            return True
        import wandb

        runs, self._runs = list(self._runs.values()), {}

        def close() -> None:
            for run in runs:
                run.finish()
            wandb.teardown()

        return close_within(close, timeout, f"its {len(runs)} trial run(s)", self.run_dir / WANDB_DIR)


WANDB_FINISH_TIMEOUT_S = 10.0  # after a Ctrl-C, how long a driver waits for W&B to close its runs


def close_within(close: Callable[[], None], timeout: float | None, what: str, where: Path) -> bool:
    """Run ``close`` (finishing W&B runs); with ``timeout``, return False after that many seconds if it has
    not returned -- after a Ctrl-C the wandb service may have had the same SIGINT and never answer -- with a
    warning that names ``what`` was left and ``where`` its data is."""
    if timeout is None:
        close()
        return True
    import threading

    # a daemon thread: one that never returns must not keep the interrupted process alive
    closer = threading.Thread(target=close, name="iclmem-wandb-finish", daemon=True)
    closer.start()
    closer.join(timeout)
    if closer.is_alive():
        log.warning("W&B did not finish %s within %.0f s; left as they are under %s", what, timeout, where)
        return False
    return True


def make_trial_logger(kind: str | None = None, **kwargs: Any) -> TrialLogger:
    """``None``/``"none"`` -> :class:`NullTrialLogger`; ``"wandb"`` -> :class:`WandbTrialLogger`."""
    if kind in (None, "", "none", "null"):
        return NullTrialLogger()
    if kind == "wandb":
        return WandbTrialLogger(**kwargs)
    raise ConfigError(f"unknown trial logger {kind!r}: use 'none' or 'wandb'")


def make_results_logger(kind: str | None = None, **kwargs: Any) -> ResultsLogger:
    """``None``/``"none"`` -> :class:`NullResultsLogger`; ``"wandb"`` -> :class:`WandbResultsLogger`."""
    if kind in (None, "", "none", "null"):
        return NullResultsLogger()
    if kind == "wandb":
        return WandbResultsLogger(**kwargs)
    raise ValueError(f"unknown results logger {kind!r}: use 'none' or 'wandb'")
