"""Results aggregation: probe results on disk -> one results table per sweep, reports, W&B summary.

The table is rebuilt from the per-checkpoint result files every time, so appending is idempotent
(a result probed twice is one row) and ``iclmem report`` can rebuild everything from storage. Its ε lower-bound
and DP accountant columns are computed in :mod:`orchestrator.report.epsilon_columns`, the reference-model attacks' here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from iclmem.atomic import write_parquet_atomic
from iclmem.record import CHECKPOINT_KEY, RESULTS_SCHEMA_KEY, RESULTS_SCHEMA_VERSION, RUN_KEY, check_columns
from iclmem.runfolder import (
    FIGURES_DIR,
    MANIPULATION_AUC_FILE,
    NULL_QUERIES_SUFFIX,
    PROBES_DIR,
    QUERIES_SUFFIX,
    REFERENCE_RESULTS_FILE,
    RESULTS_FILE,
    SPLIT_REPORT_FILE,
    probe_stem,
    roc_path,
)
from orchestrator.report.epsilon_columns import epsilon_columns
from orchestrator.runfolder.run_folder import RunFolder
from orchestrator.schema.outputs import WandbConfig

# per-query tables of the stored probe results, by (run folder under probes/, result stem): what
# ``ProbeResult.load`` read, handed to the attacks so each table is read once
QueryTables = Mapping[tuple[str, str], pd.DataFrame]


def collect(run_dir: Path, keep_queries: bool = True) -> tuple[pd.DataFrame, pd.DataFrame,
                                                               dict[tuple[str, int], pd.DataFrame],
                                                               dict[tuple[str, str], pd.DataFrame],
                                                               dict[tuple[str, str], pd.DataFrame]]:
    """(results rows, manipulation AUCs, one ROC per (run, epoch), query tables by (run folder, stem), null-split
    query tables by (run folder, stem)) of every stored probe result that loads (checksums verified); the query
    and null query tables only with ``keep_queries`` (the reference-model attacks read them; without references
    they are not held in memory, and :func:`_query_table` / :func:`null_query_table` read them from the folder)."""
    rows: list[dict[str, Any]] = []
    manips: list[pd.DataFrame] = []
    rocs: dict[tuple[str, int], pd.DataFrame] = {}
    queries: dict[tuple[str, str], pd.DataFrame] = {}
    null_queries: dict[tuple[str, str], pd.DataFrame] = {}
    for folder, stem, result in RunFolder(run_dir).probe_results():
        rows.append(result.row)
        manips.append(result.manipulation_auc)
        if keep_queries and result.queries is not None:
            queries[(folder, stem)] = result.queries
        if keep_queries and result.null_queries is not None:
            null_queries[(folder, stem)] = result.null_queries
        # one ROC file per (run, epoch): a multi-task run's is its first task's (stems sort eNNNN-t0 first)
        rocs.setdefault((result.row["run_id"], int(result.row["epoch"])), result.roc)
    results = pd.DataFrame(rows)
    if not results.empty:
        results = results.sort_values(list(CHECKPOINT_KEY)).reset_index(drop=True)
        first = [c for c in CHECKPOINT_KEY if c in results.columns]
        results = results[first + [c for c in results.columns if c not in first]]
    manipulation_auc = pd.concat(manips, ignore_index=True) if manips else pd.DataFrame()
    return results, manipulation_auc, rocs, queries, null_queries


def split_report_table(prepared: Any) -> pd.DataFrame:
    """Split validation (paper Tab. 6) plus the task characteristics of Fig. 6."""
    import numpy as np

    rows = []
    skip = set(getattr(prepared, "reference_tasks", {}))  # a reference's half is not a split of the audit
    for task in prepared.tasks.values():
        if task.fingerprint in skip:
            continue
        report = task.split_report.to_dict()
        counts = np.bincount(np.asarray(task.original_labels), minlength=task.n_classes)
        rows.append({
            "task": task.name, "label_mode": task.label_mode.value, "seed": task.seed, "q": len(task.member_idx),
            "task_kind": task.task_kind.value, "n_rows": int(task.features.shape[0]), "n_classes": task.n_classes,
            "n_features": task.n_features, "majority_share": float(counts.max() / counts.sum()),
            **{k: v for k, v in report.items() if not isinstance(v, (list, dict))},
        })
    return pd.DataFrame(rows)


def aggregate(run_dir: Path, prepared: Any | None = None, log: Callable[[str], None] = print,
              wandb_mode: str | None = None, replace_fewer: bool = True, forced: str | None = None) -> pd.DataFrame:
    """Rebuild ``RUN_DIR/results.parquet`` (and the tables and report beside it) from the stored probe results.

    ``replace_fewer=False`` (``iclmem report`` without ``--force``) refuses, writing nothing, when the probe
    results cover fewer checkpoints than the results table already holds: a missing or pruned ``probes/``
    folder must not turn a table of results into an emptier one; and when there is no probe result at all
    (a sweep stopped before its first checkpoint was probed), saying so instead of writing an empty table. ``forced``: why the report was refused
    before ``iclmem report --force`` made it anyway (``sweep.json`` not the config of the results), shown at
    the report's top."""
    run_dir = Path(run_dir)
    folder = RunFolder(run_dir)
    sweep = folder.sweep_or_none  # the reference-model attacks need the query tables held in memory
    results, manipulation_auc, rocs, queries, _null_queries = collect(
        run_dir, keep_queries=sweep is not None and sweep.probe.references > 0)
    results, references = split_references(results)
    if not replace_fewer:
        stored_rows = folder.stored_result_rows()
        if results.empty and stored_rows == 0:
            raise nothing_to_report(folder)
        if len(results) < stored_rows:
            from iclmem.errors import DataError

            raise DataError(
                f"{run_dir / PROBES_DIR} holds results for {len(results)} checkpoint(s), but {run_dir / RESULTS_FILE} "
                f"has {stored_rows} row(s): rebuilding would drop {stored_rows - len(results)} (is {PROBES_DIR}/ "
                "missing or pruned?). Nothing was rewritten; `iclmem resume` probes missing checkpoints again, "
                "and `iclmem report --force` rebuilds from what is stored")
    if not references.empty:  # reference models are not audit targets: their rows live in a file of their own
        reference_ids = set(references["run_id"])
        rocs = {key: roc for key, roc in rocs.items() if key[0] not in reference_ids}
        if not manipulation_auc.empty:
            manipulation_auc = manipulation_auc[~manipulation_auc["run_id"].isin(reference_ids)].reset_index(drop=True)
        write_parquet_atomic(references, run_dir / REFERENCE_RESULTS_FILE)
    results = attack_columns(results, references, run_dir, log, queries=queries)
    results = epsilon_columns(results, log)
    check_columns(results.columns, str(run_dir / RESULTS_FILE))
    write_parquet_atomic(results, run_dir / RESULTS_FILE, metadata={RESULTS_SCHEMA_KEY: str(RESULTS_SCHEMA_VERSION)})
    write_parquet_atomic(manipulation_auc, run_dir / MANIPULATION_AUC_FILE)
    for (run_id, epoch), roc in rocs.items():
        write_parquet_atomic(roc, roc_path(run_dir, run_id, epoch))
    if prepared is not None:
        write_parquet_atomic(split_report_table(prepared), run_dir / SPLIT_REPORT_FILE)
    tables = write_risk_report_or_say_why(run_dir, results, references, queries, log)
    write_claim_ledger_or_say_why(run_dir, results, queries, tables, log)
    report = write_reports(run_dir, results, wandb_mode=wandb_mode, log=log, forced=forced)
    log(f"[iclmem] {len(results)} checkpoint results -> {run_dir / RESULTS_FILE}")
    if report is not None:
        log(f"[iclmem] report: {report}")
    return results


def write_risk_report_or_say_why(run_dir: Path, results: pd.DataFrame, references: pd.DataFrame,
                                 queries: QueryTables | None,
                                 log: Callable[[str], None]) -> Any:
    """The data owner's risk report's tables (``orchestrator.report.record_risk``), None when not built. The results are
    written by now: a source table that can no longer be read (moved, changed) costs the slices and is said,
    never the results."""
    from iclmem.errors import ConfigError, DataError
    from orchestrator.report.record_risk import write_risk_report

    try:
        return write_risk_report(run_dir, results,
                                 lambda run_id, epoch: _query_table(run_dir, run_id, epoch, queries or None), log,
                                 attack_scores=record_attack_scores(run_dir, references, queries or None,
                                                                    upstream_last_epochs(results)),
                                 null_query_table=lambda run_id, epoch: null_query_table(run_dir, run_id, epoch))
    except (ConfigError, DataError, OSError) as exc:
        log(f"[iclmem] WARNING: the risk report's tables were not built ({exc}); the results above are complete, "
            "and `iclmem report RUN_DIR` builds them once the task's table can be read again")
        return None


def write_claim_ledger_or_say_why(run_dir: Path, results: pd.DataFrame, queries: QueryTables | None, tables: Any,
                                  log: Callable[[str], None]) -> None:
    """The claim ledger (``orchestrator.report.claim_ledger``) from the results, every checkpoint's query and null-split
    query tables and the risk tables (``tables``: :class:`orchestrator.report.record_risk.RiskTables` or None). Written
    after the results: a table that cannot be read costs the ledger and is said, never the results."""
    from iclmem.errors import ConfigError, DataError
    from orchestrator.report.claim_ledger import claim_ledger, write_claim_ledger
    from orchestrator.report.record_risk import HIGH_RISK

    try:
        ledger = claim_ledger(results, lambda run_id, epoch: _query_table(run_dir, run_id, epoch, queries or None),
                              lambda run_id, epoch: null_query_table(run_dir, run_id, epoch), risk_bar=HIGH_RISK,
                              slice_claims=None if tables is None else tables.slice_risk,
                              slice_null=None if tables is None else tables.slice_null,
                              slice_rounded=None if tables is None else tables.slice_rounded,
                              value_slices=None if tables is None else tables.value_slices)
        write_claim_ledger(run_dir, ledger, log)
    except (ConfigError, DataError, OSError) as exc:
        log(f"[iclmem] WARNING: the claim ledger was not built ({exc}); the results above are complete, and "
            "`iclmem report RUN_DIR` builds it once every table can be read again")


def nothing_to_report(folder: RunFolder) -> Exception:
    """The error of ``iclmem report`` on a sweep folder that holds no probe result (and no results table): what
    its last driver recorded (``run_state.json``) and what to do, instead of an empty table written unsaid."""
    from iclmem.errors import DataError
    from iclmem.runfolder import RunStatus

    try:
        state = folder.run_state
    except DataError:
        state = None
    status = state["status"] if state is not None else None
    resume = f"`iclmem resume {folder.path}` continues it"
    try:
        from orchestrator.schema.trials import expand_grid

        trials = len(expand_grid(folder.sweep))
    except DataError:
        trials = None
    if trials == 0:
        how = ("its sweep is of regime context alone, which fine-tunes no checkpoint: its report (report.html, "
               "context_audits.parquet) is written by the sweep itself")
    elif status == RunStatus.RUNNING:  # no driver holds the folder (the lock was checked): this one was killed
        how = f"its driver ended before any checkpoint was probed (killed?); {resume}"
    elif status == RunStatus.INTERRUPTED:
        how = f"its sweep was interrupted before any checkpoint was probed; {resume}"
    elif status == RunStatus.FAILED:
        lines = str(state.get("note") or "").strip().splitlines() if state is not None else []
        why = lines[0][:300] if lines else "no cause recorded"
        how = (f"its sweep failed before any checkpoint was probed ({why}); fix that and run the sweep again "
               f"(`iclmem run SWEEP --out {folder.path}`)")
    elif status == RunStatus.COMPLETE:
        how = "its sweep finished without a checkpoint to probe"
    else:
        how = f"no driver recorded how its sweep ended; {resume}"
    return DataError(f"{folder.path} holds no probe result ({folder.path / PROBES_DIR} is empty or missing): {how}. "
                     "There is nothing to report and nothing was written (`iclmem report --force` writes the "
                     "empty table anyway)")


def write_reports(run_dir: Path, results: pd.DataFrame, wandb_mode: str | None = None,
                  log: Callable[[str], None] = print, forced: str | None = None) -> Path | None:
    """HTML report (with figures) always; the W&B sweep summary unless W&B is disabled. ``forced``: see
    :func:`aggregate`."""
    from orchestrator.report.html import write_html_report
    from orchestrator.report.wandb_logger import make_results_logger, resolve_wandb_mode

    if results.empty:
        return None
    report = write_html_report(run_dir, forced=forced)
    sweep = RunFolder(run_dir).sweep_or_none
    wandb_cfg = sweep.wandb if sweep is not None else WandbConfig()
    mode = resolve_wandb_mode(wandb_mode or wandb_cfg.mode)
    kind = "none" if mode == "disabled" else "wandb"
    logger = make_results_logger(kind, project=wandb_cfg.project, entity=wandb_cfg.entity,
                                 group=sweep.name if sweep is not None else run_dir.name,
                                 mode=mode) if kind == "wandb" else make_results_logger(kind)
    figures = {p.stem: p for p in sorted((run_dir / FIGURES_DIR).glob("*.png"))}
    try:
        logger.log_summary(run_dir, results, figures)
    finally:
        logger.finish()
    return report


# --------------------------------------------------------------------------------------------------
# Reference-model attacks (issue #16): LiRA online / offline and RMIA beside IclMem's calibrated score
# --------------------------------------------------------------------------------------------------


def _iclmem_statistic(table: pd.DataFrame) -> Any:
    """IclMem's calibrated probe loss: -(S - S_ref), the orientation of probes.metrics.membership_score."""
    return table["s_ref_loss"] - table["s_loss"]


def _known_context_logit(table: pd.DataFrame) -> Any:
    from probes.attacks.membership import logit_of_loss

    return pd.Series(logit_of_loss(table["known_context_loss"].to_numpy(np.float64)), index=table.index)


def _deployed_logit(table: pd.DataFrame) -> Any:
    from probes.attacks.membership import logit_of_loss

    return pd.Series(logit_of_loss(table[DEPLOYED_LOSS].to_numpy(np.float64)), index=table.index)


# recipe upstream's per-row loss as the package deploys the weights (probes.query_tables.deployed_statistics)
DEPLOYED_LOSS = "deployed_known_context_loss"


# the statistics the attacks run on: results-column prefix -> (LiRA statistic, RMIA log p(label)), both per query
# from a checkpoint's query table (probes.query_tables.query_table); higher statistic = more member-like. The probe's
# LiRA statistic is replaced by the per-manipulation logits when every table stores them (_lira_statistics).
ATTACK_STATISTICS: dict[str, tuple[Callable[[pd.DataFrame], Any], Callable[[pd.DataFrame], Any]]] = {
    "": (_iclmem_statistic, lambda t: -t["s_loss"]),
    # the known-context prediction with C': the logit of p(label), as Carlini et al. scale confidences
    "known_context_": (_known_context_logit, lambda t: -t["known_context_loss"]),
    # recipe upstream: the same prediction through the classifier the package deploys (its ensemble,
    # preprocessing, the run's seed), where the target and every reference stored it
    "deployed_known_context_": (_deployed_logit, lambda t: -t[DEPLOYED_LOSS]),
}
# the query-table column a prefix needs in the target and every reference table (none: always present)
ATTACK_STATISTIC_COLUMN = {"deployed_known_context_": DEPLOYED_LOSS}


def _lira_statistics(prefix: str, target: pd.DataFrame, references: list[pd.DataFrame]) -> tuple[Any, Any]:
    """(target [n] or [n, M], references [K, n] or [K, n, M]) of one statistic: for the probe, the logit of
    p(y*) under each of its M manipulations when the target and every reference stored them (the same ones),
    else the single per-query statistic of :data:`ATTACK_STATISTICS`."""
    from probes.attacks.membership import LOGIT_PREFIX

    if not prefix:
        columns = [c for c in target.columns if c.startswith(LOGIT_PREFIX)]
        if columns and all(set(columns) <= set(t.columns) for t in references):
            return (target[columns].to_numpy(np.float64),
                    np.stack([t[columns].to_numpy(np.float64) for t in references]))
    statistic = ATTACK_STATISTICS[prefix][0]
    return (np.asarray(statistic(target), np.float64),
            np.stack([np.asarray(statistic(t), np.float64) for t in references]))


def split_references(results: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(audited rows, reference-trial rows): a reference trial's rows carry ``reference_of``."""
    if results.empty or "reference_of" not in results.columns:
        return results, pd.DataFrame()
    is_ref = results["reference_of"].notna()
    audited = results.loc[~is_ref].drop(columns=["reference_of", "reference_index", "reference_training_seed"],
                                        errors="ignore")
    return audited.reset_index(drop=True), results.loc[is_ref].reset_index(drop=True)


def _query_table(run_dir: Path, run_id: str, epoch: int, queries: QueryTables | None = None) -> pd.DataFrame | None:
    """A checkpoint's query table: from ``queries`` (what :func:`collect` loaded) when given, else read from
    the run folder."""
    if queries is not None:
        return queries.get((run_id, probe_stem(epoch)))
    from iclmem.atomic import read_parquet_checked

    return read_parquet_checked(run_dir / PROBES_DIR / run_id / f"{probe_stem(epoch)}{QUERIES_SUFFIX}")


def null_query_table(run_dir: Path, run_id: str, epoch: int,
                     null_queries: QueryTables | None = None) -> pd.DataFrame | None:
    """A checkpoint's null-split query table (``probes.probe.ProbeResult.null_queries``: per null split and query,
    the statistics its verdict and known-context flag were computed from): from ``null_queries`` (what
    :func:`collect` loaded) when given, else read from the run folder; None when none was stored (no null split
    probed, or a result stored before null query tables existed)."""
    if null_queries is not None:
        return null_queries.get((run_id, probe_stem(epoch)))
    from iclmem.atomic import read_parquet_checked

    return read_parquet_checked(run_dir / PROBES_DIR / run_id / f"{probe_stem(epoch)}{NULL_QUERIES_SUFFIX}")


def checkpoint_attack_inputs(target: pd.DataFrame, references: list[pd.DataFrame]) -> dict[str, Any] | None:
    """Per statistic prefix (:data:`ATTACK_STATISTICS`), the attacks' inputs (``probes.attacks.membership.AttackInputs``) of
    one target checkpoint and its references' query tables, aligned by query id in ascending order; None when
    a reference scored other queries."""
    from probes.attacks.membership import AttackInputs, ReferenceStatistics

    target = target.set_index("query_id").sort_index()
    aligned = [t.set_index("query_id").reindex(target.index) for t in references]
    if any(t["member"].isna().any() for t in aligned):
        return None
    member = target["member"].to_numpy(bool)
    in_ref = np.stack([t["member"].to_numpy(bool) for t in aligned])
    out: dict[str, Any] = {}
    for prefix, (_, log_p) in ATTACK_STATISTICS.items():
        needed = ATTACK_STATISTIC_COLUMN.get(prefix)
        if needed is not None and not all(needed in t.columns for t in (target, *aligned)):
            continue
        stats = ReferenceStatistics(*_lira_statistics(prefix, target, aligned), in_ref)
        out[prefix] = AttackInputs(member=member, stats=stats, target_log_p=log_p(target).to_numpy(np.float64),
                                   reference_log_p=np.stack([log_p(t).to_numpy(np.float64) for t in aligned]))
    return out


def reference_checkpoints(references: pd.DataFrame, run_id: str, epoch: int,
                          target_last_epoch: int | None = None) -> list[tuple[str, int]]:
    """(reference run id, its epoch) of each reference of target checkpoint (``run_id``, ``epoch``), in
    reference order: each reference's checkpoint at the same epoch. A reference fine-tuned through a package's
    own fine-tuner (recipe upstream) may stop early, on its own validation loss, at another epoch than its
    target: the target's last checkpoint is then paired with each reference's last (the recipe's output against
    the recipe's output), and an earlier one with a reference's last when that reference ended before it (its
    weights at that epoch are its last ones). ``target_last_epoch``: the target's last epoch (None: pair by
    epoch only, as for recipe iclmem, whose references train every epoch their target does)."""
    if references.empty or "reference_of" not in references.columns:
        return []
    mine = references[references["reference_of"] == run_id]
    out = []
    for ref_id, rows in mine.sort_values("reference_index").groupby("run_id", sort=False):
        epochs = set(rows["epoch"].astype(int))
        if target_last_epoch is not None and (epoch == target_last_epoch or max(epochs) < epoch):
            out.append((str(ref_id), max(epochs)))
        elif epoch in epochs:
            out.append((str(ref_id), epoch))
    return out


def upstream_last_epochs(results: pd.DataFrame) -> dict[str, int]:
    """Run id -> last probed epoch, of every recipe-upstream target in ``results`` (see
    :func:`reference_checkpoints`)."""
    if results.empty or "model_options" not in results.columns:
        return {}
    from trainables.upstream import upstream_options

    def is_upstream(options: Any) -> bool:
        try:
            return isinstance(options, str) and upstream_options(json.loads(options))
        except ValueError:
            return False

    kinds = {o: is_upstream(o) for o in results["model_options"].unique()}
    upstream = results[results["model_options"].map(kinds).fillna(False).astype(bool)]
    return {str(k): int(v) for k, v in upstream.groupby("run_id")["epoch"].max().items()}


def record_attack_scores(run_dir: Path, references: pd.DataFrame, queries: QueryTables | None,
                         last_epochs: dict[str, int] | None = None) -> Callable[[str, int], dict[str, pd.Series]]:
    """For the risk report: ``(run_id, epoch) ->`` each reference-model attack's per-record score (``<prefix><attack>``,
    a Series by query id), or nothing for a checkpoint without all its references' tables. ``last_epochs``:
    :func:`upstream_last_epochs` of the audited results (recipe-upstream references paired by recipe output)."""
    last_epochs = last_epochs or {}
    from iclmem.vocab import Attack
    from probes.attacks.membership import attack_scores

    def scores(run_id: str, epoch: int) -> dict[str, pd.Series]:
        if references.empty or "reference_of" not in references.columns:
            return {}
        last = last_epochs.get(run_id)
        refs = reference_checkpoints(references, run_id, epoch, last)
        target = _query_table(run_dir, run_id, epoch, queries)
        tables = [_query_table(run_dir, ref_id, ref_epoch, queries) for ref_id, ref_epoch in refs]
        if target is None or not tables or any(t is None for t in tables):
            return {}
        built = checkpoint_attack_inputs(target, [t for t in tables if t is not None])
        if built is None:
            return {}
        ids = np.sort(target["query_id"].to_numpy(np.int64))
        return {f"{prefix}{attack.value}": pd.Series(attack_scores(attack, inputs.stats, inputs.target_log_p,
                                                                   inputs.reference_log_p), index=ids)
                for prefix, inputs in built.items() for attack in Attack}

    return scores


def attacks_for_checkpoint(target: pd.DataFrame, references: list[pd.DataFrame], *, n_resamples: int,
                           null_splits: int, seed: int, epsilon_delta: float | None = None,
                           thresholds: Any = None, n_checkpoints: int = 1,
                           ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The attack columns and ROC curves of one target checkpoint from its query table and its references'
    (``probes.query_tables.query_table``), aligned by query id; None when a reference scored other queries.
    ``thresholds`` (``probes.outcomes.OutcomeThresholds``, default the defaults) and ``n_checkpoints`` (of
    the run's headline family) decide each attack's verdict (``probes.attacks.membership.attack_verdict``)."""
    from probes.attacks.membership import evaluate_attacks
    from probes.metrics import roc_curve

    built = checkpoint_attack_inputs(target, references)
    if built is None:
        return None
    target = target.set_index("query_id").sort_index()
    member = target["member"].to_numpy(bool)
    columns: dict[str, Any] = {}
    curves: dict[str, Any] = {}
    for prefix, inputs in built.items():
        delta = {} if epsilon_delta is None else {"epsilon_delta": epsilon_delta}
        cols, roc = evaluate_attacks(inputs, prefix=prefix, n_resamples=n_resamples, null_splits=null_splits,
                                     seed=seed, thresholds=thresholds, n_checkpoints=n_checkpoints, **delta)
        columns.update(cols)
        if not prefix:
            curves.update(roc)
    iclmem = np.asarray(_iclmem_statistic(target), np.float64)
    curve = roc_curve(iclmem[member], iclmem[~member])
    curves["iclmem_calibrated_loss"] = {"fpr": [float(v) for v in curve.fpr], "tpr": [float(v) for v in curve.tpr]}
    return columns, curves


def attack_columns(results: pd.DataFrame, references: pd.DataFrame, run_dir: Path,
                   log: Callable[[str], None] = print, *, queries: QueryTables | None = None) -> pd.DataFrame:
    """The attacks' columns on every audited checkpoint whose K references (``probe.references`` in
    sweep.json) all have a result at the same epoch: per statistic (:data:`ATTACK_STATISTICS`) and attack,
    AUC with interval, TPR at 1% / 0.1% / the rule's alpha FPR with Clopper-Pearson intervals, the verdict
    under the sweep's rule (``outcome:`` in sweep.json) and null-split evidence with its false positives
    (:func:`probes.attacks.membership.evaluate_attacks`), each attack's run headline (:func:`attack_headline_columns`),
    and ``attack_roc`` (JSON: fpr / tpr of each attack on the probe statistic and of IclMem's calibrated
    loss score, for the report's ROC figure). ``queries``: the query tables :func:`collect` loaded (else
    they are read from the run folder)."""
    from probes.outcomes import OutcomeThresholds

    sweep = RunFolder(run_dir).sweep_or_none
    if results.empty or sweep is None or sweep.probe.references == 0:
        return results
    k_refs = sweep.probe.references
    epsilon_delta = sweep.outcome.epsilon_delta  # the δ of every ε_lb of the sweep
    thresholds = OutcomeThresholds.from_dict(sweep.outcome.model_dump())  # the rule IclMem's verdicts used
    n_null = sweep.probe.null_splits  # 0 means none, as for IclMem's own verdicts
    n_resamples = sweep.probe.bootstrap
    out = results.copy()
    out["attack_roc"] = None
    out["attack_references"] = 0
    last_epochs = upstream_last_epochs(out)
    missing = []
    added: list[str] = []
    filled: dict[str, list[Any]] = {}  # new columns, joined at once (adding them one by one fragments the frame)
    for i, row in out.iterrows():
        if bool(row.get("sanity_check", False)):
            continue
        run_id, epoch = str(row["run_id"]), int(row["epoch"])
        refs = reference_checkpoints(references, run_id, epoch, last_epochs.get(run_id))
        target = _query_table(run_dir, run_id, epoch, queries)
        tables = [_query_table(run_dir, ref_id, ref_epoch, queries) for ref_id, ref_epoch in refs]
        out.at[i, "attack_references"] = sum(t is not None for t in tables)
        if target is None or len(tables) < k_refs or any(t is None for t in tables):
            missing.append(f"{run_id} epoch {epoch}")
            continue
        computed = attacks_for_checkpoint(target, [t for t in tables if t is not None], n_resamples=n_resamples,
                                          null_splits=n_null, seed=int(row.get("seed", 0)),
                                          epsilon_delta=None if epsilon_delta is None else float(epsilon_delta),
                                          thresholds=thresholds, n_checkpoints=_family_checkpoints(out, row))
        if computed is None:
            missing.append(f"{run_id} epoch {epoch} (references scored other queries)")
            continue
        columns, curves = computed
        for key, value in columns.items():
            if key not in filled:
                filled[key] = [None] * len(out)
                added.append(key)
            filled[key][out.index.get_loc(i)] = value
        out.at[i, "attack_roc"] = json.dumps(curves)
    if missing:
        log(f"[iclmem] note: reference-model attacks not computed for {len(missing)} checkpoint(s) without all "
            f"{k_refs} reference results at the same epoch: {missing[:5]}")
    new = {k: v for k, v in filled.items() if k not in out.columns}
    for key, values in filled.items():
        if key in out.columns:
            out[key] = [v if v is not None else old for v, old in zip(values, out[key])]
    out = pd.concat([out, pd.DataFrame(new, index=out.index)], axis=1)
    for column in added:  # columns filled row by row start as object; numbers are stored as numbers
        if not column.endswith("null_evidence"):
            converted = pd.to_numeric(out[column], errors="coerce")
            if converted.notna().sum() == out[column].notna().sum():
                out[column] = converted
    return attack_headline_columns(out)


def _family_checkpoints(results: pd.DataFrame, row: pd.Series) -> int:
    """How many checkpoints the run's headline selects from: the probe's ``n_checkpoints_in_family`` (the
    sweep's schedule, as IclMem's own verdict used), else the run's audited checkpoints in the table."""
    recorded = row.get("n_checkpoints_in_family")
    if recorded is not None and pd.notna(recorded):
        return int(recorded)
    same = results["run_id"] == row["run_id"]
    if "sanity_check" in results.columns:
        same &= ~results["sanity_check"].fillna(False).astype(bool)
    return max(1, int(same.sum()))


def attack_headline_columns(results: pd.DataFrame) -> pd.DataFrame:
    """Each attack's run headline on every row of its run (:func:`probes.attacks.membership.attack_run_headline`):
    ``<attack>_run_outcome``, ``_run_epoch``, ``_run_auc`` (the verdict at the checkpoint with the attack's
    highest AUC) and ``_run_null_splits``, ``_run_null_memorization`` (null runs whose headline, picked the
    same way, is a memorization verdict: the attack's false positives at run level), for every statistic
    prefix of :data:`ATTACK_STATISTICS`. Rows without attack columns get None / NaN."""
    from iclmem.vocab import Attack
    from probes.attacks.membership import attack_run_headline

    keys = [c for c in RUN_KEY if c in results.columns]
    new: dict[str, list[Any]] = {}
    for prefix in ATTACK_STATISTICS:
        for attack in Attack:
            a = f"{prefix}{attack.value}_"
            if f"{a}auc" not in results.columns or f"{a}outcome" not in results.columns:
                continue
            has = results[f"{a}auc"].notna() & results[f"{a}outcome"].notna()
            for _, group in results[has].groupby(keys, sort=False, dropna=False):
                evidence = [json.loads(v) if isinstance(v, str) else [] for v in group[f"{a}null_evidence"]]
                head = attack_run_headline(group["epoch"].astype(int).tolist(), group[f"{a}auc"].astype(float).tolist(),
                                           group[f"{a}outcome"].astype(str).tolist(), evidence, prefix=a)
                for key, value in head.items():
                    column = new.setdefault(key, [None if key.endswith("outcome") else float("nan")] * len(results))
                    for i in group.index:
                        column[results.index.get_loc(i)] = value
    if not new:
        return results
    out = results.drop(columns=[c for c in new if c in results.columns])
    frame = pd.DataFrame(new, index=out.index)
    for key in new:
        if not key.endswith("outcome"):
            frame[key] = frame[key].astype(float)  # NaN on rows without the attack: one dtype, as run_epsilon_lb_epoch
    return pd.concat([out, frame], axis=1)
