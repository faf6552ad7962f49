"""The report's tables, one import point: every public table function and the vocabulary they share, as
``from orchestrator.report import tables`` (or ``from orchestrator import report``) gives them. Nothing is
computed here; each table lives in the module of its job, all pure pandas (no file read or written):

* :mod:`~orchestrator.report.selection`: the shared vocabulary (outcomes, regimes, score kinds, the run key,
  the facet axes), a checkpoint's AUC and kind, each run's peak and last checkpoint, the fine-tuned rows;
* :mod:`~orchestrator.report.null_rates`: every rule's measured false-positive rate on the null splits;
* :mod:`~orchestrator.report.claims`: the claims beyond one run's headline and their measured rates;
* :mod:`~orchestrator.report.overview`: what the report's top says of the sweep (verdict line, completeness,
  sample sizes, no-op manipulations, blind baseline);
* :mod:`~orchestrator.report.thresholds`: the verdict rule and thresholds in force;
* :mod:`~orchestrator.report.paper_tables`: one function per table of the paper (:data:`PAPER_TABLES`).

Inputs live in a run directory (``RUN_DIR``) written by the sweep:

* ``results.parquet`` (required): one row per (run, checkpoint) with the outcome and metrics.
* ``split_report.parquet``, ``manipulation_auc.parquet``, ``roc/roc_<run_id>_e<epoch>.parquet`` and
  ``provenance.json`` (optional): a report section whose input is missing is skipped with a note.

Privacy: reports carry ids, metrics and configuration only, never a raw feature value or label. That is
enforced by construction, not by scrubbing: every reader keeps an explicit allow-list of columns
(:func:`public_results`, :func:`public_split_report`, ...), every report selects named columns, and
provenance is reduced to a fixed set of keys. A column or provenance field that is not on a list never
reaches a report, the HTML page or W&B.

Choices the method leaves open (``docs/METHOD.md``, "The outcome of a checkpoint" and "What each table is
computed from"):

* A checkpoint's AUC for peak selection is the highest calibrated AUC over the score kinds present
  (``auc_loss``, ``auc_entropy``, ``auc_confidence`` and the deciding kind's ``auc``), so the peak is
  "highest calibrated AUC over epochs and score kinds". The reported ``auc``/TPR columns stay those of the
  row's ``score_kind`` (the deciding kind); ``peak_auc``/``peak_kind`` are reported beside them.
* Epoch 0 is the base model: it is never a run's peak unless the run has no other checkpoint.
  Ties between checkpoints go to the earliest epoch.
* A run is keyed by ``(run_id, task)``: a ``multi_fixed`` run fine-tunes one model on several tasks and
  has one row per task and checkpoint.
* Run-level reports (rates per Q, Tabs. 8, 10–12, Fig. 6) use each run's peak checkpoint (its headline).
  By-epoch reports (Fig. 2) use every checkpoint; the share at an epoch is over the runs that have a
  checkpoint at that epoch (a diverged run stops contributing), or with ``cumulative=True`` the share of
  all runs flagged at any checkpoint up to that epoch.
* The main-regime reports default to ``regime="single_fixed"`` (the paper's main regime); pass ``None``
  to pool every regime. The realistic-regime comparison (Tab. 12) always spans all regimes.
"""

from orchestrator.report.claims import (
    CHECKPOINT_ANY_ATTACK,
    CLAIM_RATE_COLUMNS,
    CLAIMS,
    RUN_HEADLINE_ANY_ATTACK,
    TASK_ANY_RUN,
    TASK_PEAK,
    TASK_VERDICT,
    Claim,
    any_attack_error_rates,
    claim_error_rates,
    task_claim_error_rates,
    task_family_sizes,
    task_verdicts,
)
from orchestrator.report.null_rates import ERROR_RATE_LEVELS, null_error_rates, null_peak_auc_per_task, null_records
from orchestrator.report.overview import (
    blind_baseline_summary,
    checkpoint_schedule,
    missing_runs,
    noop_manipulations,
    outcome_summary,
    run_completeness,
    sample_sizes,
    scheduled_runs_per_regime,
)
from orchestrator.report.paper_tables import (
    PAPER_TABLES,
    TASK_TABLE_COLUMNS,
    calibration_impact,
    detectable_share_by_epoch,
    outcome_counts_per_q,
    outcome_rates_per_q,
    peak_vulnerability_per_task,
    perturbation_effectiveness,
    perturbation_ranking,
    regime_comparison,
    split_validation,
    task_characteristics,
    task_lr_q_table,
)
from orchestrator.report.selection import (
    BASE_MANIPULATION,
    DETECTABLE,
    FACET_AXES,
    MAIN_REGIME,
    OUTCOMES,
    REGIMES,
    RUN_KEY,
    SCORE_KINDS,
    checkpoint_auc,
    checkpoint_kind,
    competing_kinds,
    filter_regime,
    fine_tuned_rows,
    last_checkpoints,
    outcome_order,
    peak_checkpoints,
    run_key_columns,
)
from orchestrator.report.thresholds import (
    THRESHOLD_MEANINGS,
    norm_setting,
    rule_in_force,
    thresholds_in_force,
    verdict_rule_summary,
)
from orchestrator.runfolder.run_folder import public_manipulation_auc, public_results, public_split_report

__all__ = [
    "PAPER_TABLES",
    "OUTCOMES",
    "REGIMES",
    "SCORE_KINDS",
    "MAIN_REGIME",
    "DETECTABLE",
    "RUN_KEY",
    "FACET_AXES",
    "public_results",
    "public_split_report",
    "public_manipulation_auc",
    "competing_kinds",
    "checkpoint_auc",
    "checkpoint_kind",
    "filter_regime",
    "run_key_columns",
    "peak_checkpoints",
    "last_checkpoints",
    "outcome_order",
    "ERROR_RATE_LEVELS",
    "fine_tuned_rows",
    "null_records",
    "null_error_rates",
    "Claim",
    "CLAIMS",
    "CLAIM_RATE_COLUMNS",
    "TASK_PEAK",
    "TASK_ANY_RUN",
    "TASK_VERDICT",
    "CHECKPOINT_ANY_ATTACK",
    "RUN_HEADLINE_ANY_ATTACK",
    "task_family_sizes",
    "task_verdicts",
    "task_claim_error_rates",
    "any_attack_error_rates",
    "claim_error_rates",
    "verdict_rule_summary",
    "BASE_MANIPULATION",
    "checkpoint_schedule",
    "scheduled_runs_per_regime",
    "missing_runs",
    "run_completeness",
    "outcome_summary",
    "sample_sizes",
    "noop_manipulations",
    "outcome_counts_per_q",
    "outcome_rates_per_q",
    "TASK_TABLE_COLUMNS",
    "task_lr_q_table",
    "detectable_share_by_epoch",
    "peak_vulnerability_per_task",
    "null_peak_auc_per_task",
    "split_validation",
    "calibration_impact",
    "perturbation_ranking",
    "perturbation_effectiveness",
    "task_characteristics",
    "regime_comparison",
    "THRESHOLD_MEANINGS",
    "norm_setting",
    "thresholds_in_force",
    "rule_in_force",
    "blind_baseline_summary",
]
