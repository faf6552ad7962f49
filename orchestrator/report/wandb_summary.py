"""What iclmem puts in W&B, computed from a run folder: pure (wandb is imported only by the W&B Report builder,
lazily); :mod:`orchestrator.report.wandb_logger` is the thin shell that hands these values to ``wandb``.

* The keys every logged value goes under (the loggers write them, :func:`build_wandb_report` reads them).
* The sweep-summary run: its config (:func:`summary_config`), the detectable-share history
  (:func:`share_history`), the outcome counts and rates (:func:`summary_scalars`), the ROC charts it shows
  (:func:`roc_selection`) and the public tables of its artifact (:func:`export_tables`).
* One trial's run: its config (:func:`trial_run_config`), training metrics (:func:`training_metrics`), probe
  metrics (:func:`probe_metrics`) and headline (:func:`run_headline`).
* The W&B Report over both (:func:`build_wandb_report`).

Privacy: everything here starts from the public allow-list of :mod:`orchestrator.report.tables` (training
results: numbers only), so a raw record cannot reach W&B through these functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from iclmem.errors import ConfigError
from iclmem.record import CHECKPOINT_ID, IDENTITY_COLUMNS, NEIGHBOURS, WANDB_LINE_GROUP, WANDB_WORKSPACE_GROUPBY
from iclmem.runfolder import MANIPULATION_AUC_FILE, RESULTS_FILE, SPLIT_REPORT_FILE
from orchestrator.report import tables as R
from orchestrator.runfolder.run_folder import RunFolder

if TYPE_CHECKING:  # wandb_workspaces is imported only by the builders below
    from wandb_workspaces.reports.v2 import Report
    from wandb_workspaces.reports.v2.interface import PanelTypes

# --------------------------------------------------------------------------------------------------
# Keys shared by the loggers and the report builder
# --------------------------------------------------------------------------------------------------

RESULTS_TABLE_KEY = "results_table"
LM_RESULTS_TABLE_KEY = "lm_results"  # the LM probe sweep's summary run
LM_F1_PREFIX = "mean_f1"
PEAK_TABLE_KEY = "peak_table"
# the data owner's risk report (orchestrator.report.record_risk): row ids and slice names, never row values
RISKIEST_TABLE_KEY = "risk/riskiest_records"
SLICE_RISK_TABLE_KEY = "risk/slice_risk"
CLAIM_LEDGER_TABLE_KEY = "claims/ledger"  # the claim ledger's made claims (claims.parquet): how much, how sure
CHANNEL_CROSSING_TABLE_KEY = "risk/channel_crossing"  # probe.two_channels: each channel within the other's strata
ROC_PREFIX = "roc"
SHARE_PREFIX = "detectable_share"
FIGURE_PREFIX = "figures"
EPOCH_KEY = "epoch"
PEAK_TABLE_FILE = "peak_checkpoints.parquet"  # in the summary run's artifact
# a wandb.Table of more rows is slow to render; the artifact holds every row
MAX_TABLE_ROWS = 10_000
# the sweep config values the summary run's config lists (``<column>_values``)
SUMMARY_CONFIG_COLUMNS: tuple[str, ...] = (*IDENTITY_COLUMNS[1:], "config_hash", "git_commit")

TRIAL_JOB_TYPE = "trial"
# The configuration one line of AUC over epochs stands for (runs differing only in seed are averaged).
TRIAL_LINE_GROUP: tuple[str, ...] = WANDB_LINE_GROUP
PROBE_PREFIX = "probe"
PEAK_PREFIX = "peak"
CHECKPOINT_AUC_KEY = f"{PROBE_PREFIX}/checkpoint_auc"  # what the HTML report plots over epochs
# Top-level config of a trial's run: what W&B's run table groups and filters by.
TRIAL_CONFIG_KEYS: tuple[str, ...] = (*IDENTITY_COLUMNS, "config_hash", "git_commit",
                                      # DP-SGD runs only (absent otherwise): group trial runs by ε in W&B
                                      "dp_target_epsilon", "dp_delta", "dp_max_grad_norm", "dp_noise_multiplier")
# Keys Tune adds to every reported result: bookkeeping, not training metrics (``time_this_iter_s`` and
# ``time_total_s`` are kept: per-epoch timing is worth plotting).
_TUNE_BOOKKEEPING = frozenset({
    "run_id", EPOCH_KEY, "config", "trial_id", "experiment_tag", "done", "should_checkpoint",
    "checkpoint_dir_name", "timestamp", "date", "pid", "hostname", "node_ip", "training_iteration",
    "timesteps_total", "episodes_total", "timesteps_since_restore", "iterations_since_restore",
    "time_since_restore",
})


def safe_key(part: Any) -> str:
    """``part`` as a piece of a W&B key or artifact name: characters W&B does not take become ``_``."""
    return re.sub(r"[^A-Za-z0-9_.\-=]+", "_", str(part))


def roc_key(run_id: str, epoch: int) -> str:
    """History/summary key of one ROC chart; its table is logged as ``<key>_table``."""
    return f"{ROC_PREFIX}/{safe_key(run_id)}_e{int(epoch)}"


def share_key(q: int) -> str:
    return f"{SHARE_PREFIX}/q={int(q)}"


def json_scalar(v: Any) -> Any:
    """``v`` as a plain JSON scalar (numpy numbers and vocabulary members unwrapped, a NaN float is None)."""
    if isinstance(v, Enum):  # a vocabulary member (iclmem.vocab): wandb would write its name, not its value
        return v.value
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return None if np.isnan(v) else float(v)
    if isinstance(v, (np.bool_,)):
        return bool(v)
    return v


def table_frame(df: pd.DataFrame) -> pd.DataFrame:
    """wandb.Table-friendly copy: plain Python scalars, NaN kept as None."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object:
            out[c] = out[c].map(lambda v: None if v is None or (isinstance(v, float) and np.isnan(v)) else str(v))
    return out.reset_index(drop=True)


# --------------------------------------------------------------------------------------------------
# The sweep-summary run
# --------------------------------------------------------------------------------------------------


def roc_selection(run_dir: str | Path, results: pd.DataFrame, max_curves: int) -> pd.DataFrame:
    """Peak checkpoints with a ROC file, highest peak AUC first (at most ``max_curves``)."""
    peaks = R.peak_checkpoints(R.public_results(results), regime=None)
    files = RunFolder(run_dir).roc_files()
    if peaks.empty or files.empty:
        return peaks.iloc[0:0]
    peaks = peaks.merge(files[list(CHECKPOINT_ID)], on=list(CHECKPOINT_ID), how="inner")
    peaks = peaks.drop_duplicates(list(CHECKPOINT_ID))
    return peaks.sort_values(["peak_auc", "run_id"], ascending=[False, True]).head(max_curves)


def summary_config(run_dir: str | Path, public: pd.DataFrame) -> dict[str, Any]:
    """The W&B config of the sweep-summary run: the folder's name, the number of checkpoints, the values
    each sweep axis took (``<column>_values``) and the public provenance."""
    cfg: dict[str, Any] = {"run_dir_name": Path(run_dir).name, "n_checkpoints": int(len(public))}
    for col in SUMMARY_CONFIG_COLUMNS:
        if col in public.columns:
            cfg[f"{col}_values"] = sorted({json_scalar(v) for v in public[col].dropna().unique()}, key=str)
    prov = RunFolder(run_dir).public_provenance()
    if prov:
        cfg["provenance"] = prov
    return cfg


def share_history(public: pd.DataFrame) -> list[dict[str, Any]]:
    """One history row per epoch: the detectable share per Q (main regime if present) under
    :func:`share_key`, stepped by :data:`EPOCH_KEY`. Per-configuration AUC over epochs lives in the trial
    runs (``probe/*``), where W&B groups it by config instead of key names."""
    main = R.MAIN_REGIME if "regime" in public.columns and (public["regime"] == R.MAIN_REGIME).any() else None
    share = R.detectable_share_by_epoch(public, regime=main)
    rows: list[dict[str, Any]] = []
    for epoch in sorted(set(share["epoch"].tolist())):
        row: dict[str, Any] = {EPOCH_KEY: int(epoch)}
        for r in share[share["epoch"] == epoch].itertuples(index=False):
            if pd.notna(r.share):
                row[share_key(r.q)] = float(r.share)
        rows.append(row)
    return rows


def summary_scalars(public: pd.DataFrame) -> dict[str, Any]:
    """The summary run's summary: runs and checkpoints, outcome counts at peak
    (``outcome_counts/<outcome>``), outcome rates per regime and Q (``outcome_rate/<regime>/q=<q>/<outcome>``)
    and the highest peak AUC."""
    peaks = R.peak_checkpoints(public, regime=None)
    summary: dict[str, Any] = {"n_runs": int(len(peaks)), "n_checkpoints": int(len(public))}
    counts = peaks["outcome"].value_counts()
    for o in R.outcome_order(peaks["outcome"]):
        summary[f"outcome_counts/{o}"] = int(counts.get(o, 0))
    for regime in sorted(peaks["regime"].unique()) if "regime" in peaks.columns else [None]:
        for q, rates in R.outcome_rates_per_q(public, regime=regime).iterrows():
            for o, v in rates.drop("n_runs").items():
                key = f"outcome_rate/{regime}/q={q}/{o}" if regime else f"outcome_rate/q={q}/{o}"
                summary[key] = float(v)
    if not peaks.empty:
        summary["max_peak_auc"] = float(peaks["peak_auc"].max())
    return summary


def export_tables(run_dir: str | Path, public: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The files of the summary run's results artifact, by file name: the public results, the
    peak-checkpoint table and, where the folder has them, the public split report and per-manipulation AUCs."""
    folder = RunFolder(run_dir)
    files = {RESULTS_FILE: public, PEAK_TABLE_FILE: R.task_lr_q_table(public, regime=None)}
    split = folder.split_report()
    if split is not None:
        files[SPLIT_REPORT_FILE] = split
    manip = folder.manipulation_auc()
    if manip is not None:
        files[MANIPULATION_AUC_FILE] = manip
    return files


def lm_summary_config(run_dir: str | Path, results: pd.DataFrame) -> dict[str, Any]:
    """The W&B config of the LM probe sweep's summary run: the models, datasets, probes and seeds it ran
    (names only: no sentence or entity string) and the public provenance."""
    config: dict[str, Any] = {"run_dir_name": Path(run_dir).name, "n_rows": int(len(results))}
    for col in ("model", "dataset", "probe", "seed"):
        config[f"{col}_values"] = sorted({json_scalar(v) for v in results[col].unique()}, key=str)
    prov = RunFolder(run_dir).public_provenance()
    if prov:
        config["provenance"] = prov
    return config


def lm_summary_scalars(results: pd.DataFrame) -> dict[str, float]:
    """Mean F1 per probe and variant (``mean_f1/<probe>/<variant>``) of the LM probe sweep."""
    out: dict[str, float] = {}
    for (probe, variant), group in results.groupby(["probe", "variant"]):
        mean = group["f1"].mean()
        if pd.notna(mean):
            out[f"{LM_F1_PREFIX}/{probe}/{variant}"] = float(mean)
    return out


# --------------------------------------------------------------------------------------------------
# A deployed-context audit's run (``iclmem audit-context --wandb``)
# --------------------------------------------------------------------------------------------------

CONTEXT_AUDIT_TABLE_KEY = "context_audit"
CONTEXT_AUDIT_FIGURE_KEY = f"{FIGURE_PREFIX}/context_roc"
CONTEXT_AUDIT_JOB_TYPE = "context-audit"
VALUE_AUDIT_TABLE_KEY = "value_audit"  # audit-context --attack label|attribute|file: the folder's table of rates
VALUE_AUDIT_JOB_TYPE = "value-audit"
# the columns of context_audit.parquet that go to W&B: ids, sizes and metrics (the table holds nothing else,
# but a column added there reaches W&B only once it is named here)
CONTEXT_AUDIT_COLUMNS: tuple[str, ...] = (
    "config_hash", "target", "attack", "context_size", "n_references", "heldout_accuracy", "auc", "auc_low",
    "auc_high", "p_value", "tpr_at_1pct", "tpr_at_1pct_low", "tpr_at_1pct_high", "tpr_at_0_1pct",
    "tpr_at_0_1pct_low", "tpr_at_0_1pct_high", "n_members", "n_nonmembers", "epsilon_lb", "outcome",
    "p_value_threshold", "null_splits", "null_auc", "null_memorization")


def context_audit_public(table: pd.DataFrame) -> pd.DataFrame:
    """The audit's table reduced to :data:`CONTEXT_AUDIT_COLUMNS`."""
    return table.loc[:, [c for c in CONTEXT_AUDIT_COLUMNS if c in table.columns]].copy()


def context_audit_config(run_dir: str | Path, provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The W&B config of an audit's run: the folder's name, the audit's name, the settings as resolved (model
    or estimator spec, sizes, seed: names and numbers; the task by name only) and the provenance allow-list."""
    settings = provenance.get("config", {}) if isinstance(provenance.get("config"), Mapping) else {}
    # the task by its name (the provenance's ``context-<name>``), not by the path of its file
    cfg: dict[str, Any] = {"run_dir_name": Path(run_dir).name, "audit_name": provenance.get("sweep_name"),
                           **{k: json_scalar(v) for k, v in settings.items()
                              if k != "task" and isinstance(v, (str, int, float))}}
    public = RunFolder(run_dir).public_provenance()
    if public:
        cfg["provenance"] = public
    return cfg


def value_audit_scalars(verdict: Mapping[str, Any]) -> dict[str, Any]:
    """A value-inference or saved-file audit's summary: its verdict's scalars, nested keys joined by ``/`` (found,
    trusted, the headline gains and their intervals; the saved file's shares); rates and flags only."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}/{k}" if prefix else str(k), v)
        elif isinstance(value, (bool, int, float, str)) or value is None:
            out[f"verdict/{prefix}"] = value

    walk("", verdict)
    return out


def context_audit_scalars(verdict: Mapping[str, Any], table: pd.DataFrame) -> dict[str, Any]:
    """The audit run's summary: ``verdict/outcome``, ``verdict/trusted``, ``verdict/strongest_attack``, and per
    target and attack ``<target>/<attack>/{auc,tpr_at_1pct,tpr_at_0_1pct,epsilon_lb,outcome}``."""
    out: dict[str, Any] = {"verdict/outcome": verdict.get("outcome"), "verdict/trusted": bool(verdict.get("trusted")),
                           "verdict/strongest_attack": verdict.get("strongest_attack"),
                           "seconds_per_reference": verdict.get("seconds_per_reference")}
    for row in context_audit_public(table).itertuples(index=False):
        for key in ("auc", "tpr_at_1pct", "tpr_at_0_1pct", "epsilon_lb", "outcome"):
            value = json_scalar(getattr(row, key))
            if value is not None and not (isinstance(value, float) and np.isnan(value)):
                out[f"{row.target}/{row.attack}/{key}"] = value
    return {k: v for k, v in out.items() if v is not None}


# --------------------------------------------------------------------------------------------------
# One trial's run
# --------------------------------------------------------------------------------------------------


def trial_run_config(identity: Mapping[str, Any], group: str | None) -> dict[str, Any]:
    """The flat W&B config of one trial's run: its ids and hyperparameters, and the sweep's name."""
    cfg = {k: json_scalar(identity[k]) for k in TRIAL_CONFIG_KEYS if k in identity}
    if group is not None:
        cfg["sweep"] = group
    return cfg


def training_metrics(result: Mapping[str, Any]) -> dict[str, Any]:
    """The numeric training metrics of one Tune result (Tune's bookkeeping and any non-number dropped,
    so no free text can reach W&B)."""
    out: dict[str, Any] = {}
    for k, v in result.items():
        if isinstance(k, str) and k not in _TUNE_BOOKKEEPING and isinstance(v, (bool, int, float, np.number)):
            out[k] = json_scalar(v)
    return out


def probe_metrics(row: Mapping[str, Any]) -> dict[str, Any]:
    """One probe row reduced to the public allow-list of :mod:`orchestrator.report.tables`, ids removed
    (they are the run's config), keys prefixed ``probe/``; missing values (None, NaN) left out. Adds
    :data:`CHECKPOINT_AUC_KEY`, the highest calibrated AUC over score kinds
    (:func:`orchestrator.report.tables.checkpoint_auc`)."""
    public = R.public_results(pd.DataFrame([dict(row)]))
    out: dict[str, Any] = {}
    best = R.checkpoint_auc(public).iloc[0]
    if pd.notna(best):
        out[CHECKPOINT_AUC_KEY] = float(best)
    for k, v in public.iloc[0].items():
        if k in TRIAL_CONFIG_KEYS or k == EPOCH_KEY:
            continue
        v = json_scalar(v)
        if v is None or (isinstance(v, float) and np.isnan(v)):
            continue
        out[f"{PROBE_PREFIX}/{k}"] = v
    return out


def run_headline(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Summary of one run from its probe rows: the last probed checkpoint's metrics (``probe/*``) and its
    peak checkpoint (``peak/*``, chosen by :func:`orchestrator.report.tables.peak_checkpoints`, as in the
    sweep summary's peak table)."""
    public = R.public_results(pd.DataFrame([dict(r) for r in rows]))
    if public.empty:
        return {}
    last = public.loc[public[EPOCH_KEY].astype(int).idxmax()]
    out = probe_metrics(last.to_dict())
    out[f"{PROBE_PREFIX}/last_epoch"] = int(last[EPOCH_KEY])
    peak = R.peak_checkpoints(public, regime=None).iloc[0]
    out[f"{PEAK_PREFIX}/epoch"] = int(peak[EPOCH_KEY])
    out[f"{PEAK_PREFIX}/outcome"] = json_scalar(peak["outcome"])
    if pd.notna(peak["peak_auc"]):
        out[f"{PEAK_PREFIX}/auc"] = float(peak["peak_auc"])
    if isinstance(peak.get("peak_kind"), str):
        out[f"{PEAK_PREFIX}/score_kind"] = json_scalar(peak["peak_kind"])
    return out


# W&B Report
# --------------------------------------------------------------------------------------------------


def build_wandb_report(
    entity: str, project: str, group: str, results_df: pd.DataFrame | None = None, *,
    run_dir: str | Path | None = None, roc_keys: Iterable[str] | None = None, tasks: Iterable[str] | None = None,
    title: str = "IclMem memorization audit", description: str = "", max_roc_panels: int = 8,
    publish: bool = False,
) -> Report:
    """Construct a W&B Report (``wandb_workspaces.reports.v2``) over the W&B runs of sweep ``group``.

    Blocks: an outcome section (peak-checkpoint table panel, outcome-count bar plot) and a ROC section
    (one custom line chart per ROC table) over the sweep-summary run, and an AUC-over-epochs section:
    per task, one line plot of the trial runs' :data:`CHECKPOINT_AUC_KEY` against ``epoch``, the runs
    grouped by configuration (:data:`TRIAL_LINE_GROUP`, mean over seeds). ROC keys and tasks come from
    ``roc_keys`` / ``tasks`` or are derived from ``results_df`` (and ``run_dir`` for the ROC files).
    Nothing touches the network unless ``publish`` is true, which calls ``report.save()``.
    """
    if any(c in str(group) for c in "'\"\\"):
        raise ConfigError(f"W&B group name {group!r} must not contain quotes or backslashes")
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    if results_df is not None:
        public = R.public_results(results_df)
        if roc_keys is None and run_dir is not None:
            sel = roc_selection(run_dir, public, max_roc_panels)
            roc_keys = [roc_key(r.run_id, r.epoch) for r in sel.itertuples(index=False)]
        if tasks is None:
            tasks = sorted(str(t) for t in public["task"].unique())
        outcomes = R.outcome_order(public["outcome"])
        qs = sorted(int(q) for q in public["q"].unique()) if "q" in public.columns else []
    else:
        outcomes, qs = list(R.OUTCOMES), []
    roc_keys = list(roc_keys or [])[:max_roc_panels]
    tasks = [str(t) for t in tasks or []]
    if any(c in t for t in tasks for c in "'\"\\"):
        raise ConfigError(f"W&B report: task names {tasks!r} must not contain quotes or backslashes")

    def runset() -> Any:
        return wr.Runset(entity=entity, project=project, name=f"group {group}",
                         filters=expr.And(expr.Metric("Group") == group))

    def trial_runset(task: str) -> Any:
        return wr.Runset(entity=entity, project=project, name=f"{task} trials",
                         filters=expr.And(expr.Metric("Group") == group, expr.Metric("JobType") == TRIAL_JOB_TYPE,
                                          expr.Config("task") == task),
                         groupby=[f"config.{k}" for k in TRIAL_LINE_GROUP])

    intro = description or (
        f"Sweep group `{group}`. Each run's headline is its peak checkpoint (highest calibrated AUC over "
        "epochs and score kinds). Outcomes: collapse, memorization, inversion, overfitting, no_signal.")
    outcome_panels: list[Any] = [
        wr.WeavePanelSummaryTable(table_name=PEAK_TABLE_KEY, layout=wr.Layout(x=0, y=0, w=24, h=12)),
        wr.BarPlot(title="Outcome counts at peak", metrics=[f"outcome_counts/{o}" for o in outcomes],
                   layout=wr.Layout(x=0, y=12, w=12, h=8)),
    ]
    if qs:
        outcome_panels.append(wr.LinePlot(title="Detectable share by epoch", x=EPOCH_KEY,
                                          y=[share_key(q) for q in qs], title_x="epoch", title_y="share",
                                          log_x=False, layout=wr.Layout(x=12, y=12, w=12, h=8)))
    roc_panels: list[PanelTypes] = [
        wr.CustomChart(query={"summaryTable": {"tableKey": f"{k}_table"}}, chart_name="wandb/line/v0",
                       chart_fields={"x": "fpr", "y": "tpr"}, chart_strings={"title": k},
                       layout=wr.Layout(x=(i % 2) * 12, y=(i // 2) * 8, w=12, h=8))
        for i, k in enumerate(roc_keys)
    ]
    auc_grids = [
        wr.PanelGrid(runsets=[trial_runset(task)], panels=[
            wr.LinePlot(title=f"AUC over epochs: {task}", x=EPOCH_KEY, y=[CHECKPOINT_AUC_KEY], title_x="epoch",
                        title_y="AUC(ΔS), mean over seeds", groupby_aggfunc="mean",
                        layout=wr.Layout(x=0, y=0, w=24, h=8))])
        for task in tasks
    ]
    blocks: list[Any] = [wr.MarkdownBlock(text=intro), wr.H2(text="Outcomes"),
                         wr.PanelGrid(runsets=[runset()], panels=outcome_panels)]
    blocks += [wr.H2(text="ROC curves (log-log in the HTML report)")]
    blocks += [wr.PanelGrid(runsets=[runset()], panels=roc_panels)] if roc_panels else \
              [wr.P(text="No ROC tables were logged.")]
    blocks += [wr.H2(text="AUC over epochs")]
    blocks += auc_grids or [wr.P(text="No tasks to plot.")]
    report = wr.Report(project=project, entity=entity, title=title[:128],
                       description=f"IclMem sweep {group}", blocks=blocks)
    if publish:
        publish_wandb_report(report)
    return report


def publish_wandb_report(report: Any) -> str:
    """Save a report built by :func:`build_wandb_report` to W&B (needs network and credentials)."""
    report.save()
    return str(getattr(report, "url", ""))


# Trial-run metrics the saved workspace plots against epoch, by section (keys the trial runs log)
WORKSPACE_SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Memorization", (CHECKPOINT_AUC_KEY, "probe/tpr_at_1pct", "probe/loss_ratio")),
    ("Training and utility", ("train_loss", "member_icl_accuracy", "nonmember_icl_accuracy")),
)
WORKSPACE_GROUPBY = WANDB_WORKSPACE_GROUPBY  # one line per setting, mean over seeds


def build_wandb_workspace(entity: str, project: str, group: str, *, publish: bool = False) -> Any:
    """A saved W&B workspace (``wandb_workspaces.workspaces``) over the trial runs of sweep ``group``: one section
    per entry of :data:`WORKSPACE_SECTIONS` (a line plot of each metric against ``epoch``), the runs grouped by
    :data:`WORKSPACE_GROUPBY` (task, lr, Q, label mode: one line per setting, mean over seeds). Nothing touches
    the network unless ``publish`` is true, which calls ``workspace.save()``."""
    if any(c in str(group) for c in "'\"\\"):
        raise ConfigError(f"W&B group name {group!r} must not contain quotes or backslashes")
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    sections = [ws.Section(name=name, is_open=True, panels=[
        wr.LinePlot(title=key, x=EPOCH_KEY, y=[key], title_x="epoch", groupby_aggfunc="mean")
        for key in keys]) for name, keys in WORKSPACE_SECTIONS]
    settings = ws.RunsetSettings(filters=[ws.Metric("Group") == group, ws.Metric("JobType") == TRIAL_JOB_TYPE],
                                 groupby=[ws.Config(k) for k in WORKSPACE_GROUPBY])
    workspace = ws.Workspace(entity=entity, project=project, name=f"iclmem {group}"[:128], sections=sections,
                             runset_settings=settings)
    if publish:
        workspace.save()  # type: ignore[no-untyped-call]  # wandb_workspaces leaves save() unannotated
    return workspace


# ------------------------------------------------------------------------------------------------- lineage
CHECKPOINT_ARTIFACT_TYPE = "model"
TASK_ARTIFACT_TYPE = "dataset"


def artifact_name(kind: str, key: str) -> str:
    """A W&B artifact name (letters, digits, ``-``, ``_``, ``.``) for ``kind`` and ``key``."""
    return f"{kind}-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in str(key))[:120]


def checkpoint_artifact_refs(public: pd.DataFrame) -> list[str]:
    """``checkpoint-<run id>:epoch-<n>`` of every fine-tuned checkpoint of a results table (the sanity-check
    rows of the untouched base model have none): what the summary run uses, for W&B's lineage."""
    if public.empty or "run_id" not in public.columns:
        return []
    tuned = public[~public["sanity_check"].fillna(False).astype(bool)] if "sanity_check" in public.columns else public
    pairs = sorted({(str(r), int(e)) for r, e in zip(tuned["run_id"], tuned[EPOCH_KEY], strict=True)})
    return [f"{artifact_name('checkpoint', r)}:epoch-{e}" for r, e in pairs]


def checkpoint_reference(checkpoint_uri: str) -> str:
    """The URI W&B records for a checkpoint: ``file://`` for a local folder, the storage URI (s3://, gs://)
    as it is otherwise. A reference: W&B keeps the address and checksums, never the weights."""
    return checkpoint_uri if "://" in checkpoint_uri else f"file://{checkpoint_uri}"


def checkpoint_metadata(run_id: str, epoch: int, manifest: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a checkpoint artifact says of itself: its run and epoch, and from the checkpoint's manifest (when
    the driver can read it) the weights' sha256, each file's sha256 and size, and the recipe."""
    out: dict[str, Any] = {"run_id": run_id, "epoch": int(epoch)}
    if manifest:
        out["weights_sha256"] = manifest.get("weights_sha256")
        out["files"] = {name: {"sha256": rec.get("sha256"), "bytes": rec.get("bytes", rec.get("size"))}
                        for name, rec in (manifest.get("files") or {}).items()}
        if "recipe" in manifest:
            out["recipe"] = manifest["recipe"]
    return out


def alert_for(row: Mapping[str, Any]) -> tuple[str, str] | None:
    """(title, text) of the W&B alert a probe row raises, or None: a memorization verdict, or a consistency check
    that finds a lower bound above the DP accountant's figure for the same checkpoint at the check's level
    (``consistency_level``). Ids and numbers only."""
    run_id, epoch = row.get("run_id"), row.get(EPOCH_KEY)
    outcome = str(row.get("outcome", ""))
    if outcome == "memorization":
        auc, tpr = row.get("auc"), row.get("tpr_at_1pct")
        numbers = ", ".join(f"{k} {float(v):.3f}" for k, v in (("AUC", auc), ("TPR@1%", tpr))
                            if v is not None and v == v)
        return (f"memorization: {run_id}", f"run {run_id}, epoch {epoch}: verdict memorization ({numbers})")
    # each bound against the accountant's figure for its own neighbour relation (iclmem.record.NEIGHBOURS)
    for flag, bound, limit, name in (("epsilon_consistent", "epsilon_lb", "dp_epsilon_replace_one", "ε lower bound"),
                                     ("gdp_consistent", "gdp_mu_lb", "dp_mu_replace_one", "GDP μ lower bound"),
                                     ("one_run_consistent", "one_run_epsilon_lb", "dp_epsilon", "one-run ε lower bound")):
        consistent = row.get(flag)
        if consistent is not None and consistent == consistent and not bool(consistent):
            # the check reads the bound at its share of the run's level (orchestrator.report.epsilon_columns), which the
            # message states: an excess at a level is evidence against the accountant's figure, not proof of a bug
            return (f"{name} above the accountant's: {run_id}",
                    f"run {run_id}, epoch {epoch}: {name} {row.get(bound)} ({NEIGHBOURS[bound]}) exceeds DP-SGD's "
                    f"{row.get(limit)} ({NEIGHBOURS[limit]}) at level {row.get('consistency_level')} (the check's "
                    "share of the run's consistency level)")
    return None
