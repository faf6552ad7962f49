"""The results row: every column of ``results.parquet``, what it means, and whether it may leave the cluster.

This is the one declaration of the row that crosses the three layers. The probe writes a row and checks it
here (:func:`check_row`: an unknown column, or a missing identity column, is an error at the writer, not a
silent NaN at a reader); aggregation orders the table by :data:`CHECKPOINT_KEY`; the report, the figures and
the W&B logger read only :func:`is_public` columns and group runs by :data:`IDENTITY_COLUMNS` /
:data:`GRID_AXES` and by the named groupings below them (:data:`RUN_KEY`, :data:`CONFIGURATION_KEY`,
:data:`FACET_AXES`, each table's order, ...). Nothing else lists identity columns (tests/test_grouping.py
refuses a literal of two or more of them in orchestrator/ or probes/).

A column is either named (:data:`COLUMNS`) or one of a family of names built from a closed vocabulary
(:data:`FAMILIES`, e.g. ``auc_<score kind>`` or ``<attack>_tpr_at_1pct``). ``public`` marks the columns that
are ids, config numbers, metrics or verdicts; the rest (per-canary JSON records, the probe actor's node,
timing) stay in the run folder and never reach W&B or the HTML page.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

from iclmem.errors import ResultSchemaError
from iclmem.vocab import Attack, CanaryKind, Neighbours, ScoreKind, VerdictRule, values

__all__ = ["ATTACK_CHANNELS", "ATTACK_VERDICT_COLUMN", "ATTACK_VERDICT_SUFFIXES", "CANARY_TABLE_ORDER", "CHECKPOINT_ID",
           "CHECKPOINT_KEY", "COLUMNS", "CONFIGURATION_KEY", "EPOCH_CURVE_LINE", "EPSILON_TABLE_ORDER", "FACET_AXES",
           "FAMILIES", "FRONTIER_GROUP", "FRONTIER_LINE", "FRONTIER_SETTING", "GRID_AXES", "IDENTITY_COLUMNS",
           "INTEGER_COLUMNS", "NEIGHBOURS", "OUTCOME_GRID_CELL", "PAPER_RUN_ORDER", "RESULTS_SCHEMA_KEY",
           "NULL_TRIAL_KEY", "RESULTS_SCHEMA_VERSION", "ROW_KEY", "RUN_KEY", "SLICE_AUDIT_KEY", "SPLIT_REPORT_ORDER",
           "VOLATILE_COLUMNS", "WANDB_LINE_GROUP", "WANDB_WORKSPACE_GROUPBY", "Column", "ColumnFamily",
           "RunIdentity", "check_columns", "check_row", "column_meaning", "is_public", "is_result_column",
           "public_columns"]


@dataclass(frozen=True)
class RunIdentity:
    """Which run of the grid a row belongs to: a fine-tuning trial, a base-model control (``regime`` "base",
    ``lr`` 0) or an external audit (``regime`` "external", ``lr`` NaN). With ``epoch`` it keys a checkpoint."""

    run_id: str  # unique in the sweep; names the run's folder under probes/
    task: str  # the task's name (a multi-task run's rows are one per task)
    model: str  # the model's registry name
    regime: str  # fine-tuning regime (iclmem.vocab.Regime), "base" or "external"
    lr: float  # learning rate (0 for the base model, NaN for an external checkpoint)
    q: int  # number of member rows
    label_mode: str  # iclmem.vocab.LabelMode
    seed: int  # the trial's seed (split, shuffles, training)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunIdentity:
        """The identity of a results row; a row without one of its columns is refused, naming it."""
        missing = [c for c in IDENTITY_COLUMNS if c not in row]
        if missing:
            raise ResultSchemaError(f"a results row lacks the identity column(s) {missing} "
                                    f"(it has {sorted(row)[:12]}...)")
        return cls(**{c: row[c] for c in IDENTITY_COLUMNS})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# The results table's schema: recorded in results.parquet's metadata by the aggregator, checked by the run-folder
# reader (orchestrator.runfolder.run_folder). Raise it when a column changes meaning or a required one is added; a table
# from before versions were recorded reads as version 1.
RESULTS_SCHEMA_VERSION = 2
RESULTS_SCHEMA_KEY = "iclmem_results_schema"

IDENTITY_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RunIdentity))
CHECKPOINT_KEY: tuple[str, ...] = (*IDENTITY_COLUMNS, "epoch")
# the grid's axes: what makes two runs different experiments rather than one run (the DP-SGD target ε is an
# axis of the grid too, though not of a run's identity: a non-DP run has none)
GRID_AXES: tuple[str, ...] = (*(c for c in IDENTITY_COLUMNS if c != "run_id"), "dp_target_epsilon")
# columns that hold integers: check_row refuses a row in which they do not; the report prints them without decimals
INTEGER_COLUMNS: tuple[str, ...] = ("q", "seed", "epoch")

# ---- how readers group and order results rows, each grouping named once, here
# a run on one of its tasks (a multi-task run has rows per task): what a run's headline, its ε over its
# checkpoints, its attacks' run verdicts and its row of a per-run table are computed per
RUN_KEY: tuple[str, ...] = ("run_id", "task")
# one results row: a run's checkpoint on one of its tasks (per-record tables split it further by channel
# and attack)
ROW_KEY: tuple[str, ...] = (*RUN_KEY, "epoch")
# one null trial of a run: its null split j (every null split goes through the run's headline selection alone)
NULL_TRIAL_KEY: tuple[str, ...] = (*RUN_KEY, "null_index")
# one checkpoint of a run's weights, all its tasks together: what ROC files, manipulation AUC rows and peak
# checkpoints are matched on
CHECKPOINT_ID: tuple[str, ...] = ("run_id", "epoch")
# a run's grid configuration without its seed: runs sharing it are one experiment drawn with other seeds, whose
# record rankings the risk report compares (``recipe``: the model's training recipe, where a table has it)
CONFIGURATION_KEY: tuple[str, ...] = ("task", "model", "regime", "recipe", "lr", "q", "label_mode",
                                      "dp_target_epsilon")
# grid axes that change what a run is (not just its noise): figures and by-epoch tables split by every one of
# them that varies rather than pooling, e.g. normal against shuffled member labels. Seeds are replicates and
# may be averaged, which the page then says.
FACET_AXES: tuple[str, ...] = ("model", "regime", "label_mode", "dp_target_epsilon")
# the leakage-utility frontier (orchestrator.report.frontier): one panel per task, one frontier (a line) per
# model, recipe and regime in it; a point is one setting of the grid at one checkpoint
FRONTIER_LINE: tuple[str, ...] = ("model", "recipe", "regime")
FRONTIER_GROUP: tuple[str, ...] = ("task", *FRONTIER_LINE)
FRONTIER_SETTING: tuple[str, ...] = ("lr", "q", "epoch", "dp_target_epsilon")
# W&B summary run: the configuration one line of AUC over epochs stands for (runs differing only in seed are
# averaged)
WANDB_LINE_GROUP: tuple[str, ...] = ("model", "regime", "label_mode", "lr", "q")
# W&B saved workspace: the trial runs' grouping, one line per setting (mean over seeds)
WANDB_WORKSPACE_GROUPBY: tuple[str, ...] = ("task", "lr", "q", "label_mode")
# figure of AUC over epochs: in a task's panel, one line per learning rate and Q (seeds averaged)
EPOCH_CURVE_LINE: tuple[str, ...] = ("lr", "q")
# figure of outcomes: in a Q's panel, one cell per task (row) and learning rate (column)
OUTCOME_GRID_CELL: tuple[str, ...] = ("task", "lr")
# record-level risk by slice (orchestrator.report.risk.worst_runs): one audit, a run's attack on one task and
# channel, whose slice families' pooled AUCs are compared; task and channel lead, as the worst-run table reads
SLICE_AUDIT_KEY: tuple[str, ...] = ("task", "channel", "run_id", "attack")
# the order of the report's per-run tables
PAPER_RUN_ORDER: tuple[str, ...] = ("task", "q", "lr", "model", "label_mode", "seed", "run_id")  # Tabs. 10-11
SPLIT_REPORT_ORDER: tuple[str, ...] = ("task", "label_mode", "seed", "q")  # the split validation (Tab. 6)
EPSILON_TABLE_ORDER: tuple[str, ...] = ("task", "label_mode", "dp_target_epsilon", "run_id")  # ε lower bounds
CANARY_TABLE_ORDER: tuple[str, ...] = ("task", "run_id", "epoch")  # canary exposure, per checkpoint


class Column(NamedTuple):
    name: str
    meaning: str
    public: bool = True


class ColumnFamily(NamedTuple):
    pattern: re.Pattern[str]
    meaning: str
    public: bool = True


def _columns(*cols: Column) -> dict[str, Column]:
    return {c.name: c for c in cols}


_RUN_META = "; recorded with every row"
COLUMNS: dict[str, Column] = _columns(
    # ---- identity (RunIdentity) and checkpoint
    *(Column(f.name, f"run identity ({f.name}); see RunIdentity") for f in fields(RunIdentity)),
    Column("epoch", "checkpoint epoch (0: before fine-tuning; -1: an external checkpoint of unknown epoch)"),
    Column("model_options", "the model's constructor options as sorted JSON (architecture of the checkpoint)", False),
    Column("reference_of", "a reference trial's target run_id (reference rows live in reference_results.parquet)",
           False),
    Column("reference_index", "a reference trial's index among its target's references", False),
    Column("reference_training_seed", "a reference trial's training seed, derived from (run seed, reference_index): "
           "its own initialisation, batch draws and DP noise", False),
    Column("config_hash", "hash of the sweep config that produced the row" + _RUN_META),
    Column("git_commit", "git commit of the code that produced the row" + _RUN_META),
    Column("dp_target_epsilon", "the grid's DP-SGD target ε (inf: no DP-SGD)"),
    # ---- the verdict (probes.outcomes) and the numbers that decided it
    Column("outcome", "the checkpoint's outcome under the sweep's verdict rule (iclmem.vocab.Outcome)"),
    Column("rule", "the verdict rule in force (iclmem.vocab.VerdictRule)"),
    Column("reasons", "which outcome checks held, per outcome (JSON-like dict)", False),
    Column("score_kind", "the score kind of the headline AUC (iclmem.vocab.ScoreKind)"),
    Column("outcome_score_kind", "the score kind whose test decided memorization (None when none did)"),
    Column("auc", "headline calibrated membership AUC (members positive)"),
    Column("auc_low", "lower end of the headline AUC's bootstrap interval"),
    Column("auc_high", "upper end of the headline AUC's bootstrap interval"),
    Column("tpr_at_1pct", "headline TPR at 1% FPR"),
    Column("tpr_at_10pct", "headline TPR at 10% FPR"),
    Column("p_value", "one-sided p-value of the headline memorization test"),
    Column("p_value_threshold", "the p-value the rule requires (family-wise corrected under selection_aware)"),
    Column("n_checkpoints_in_family", "checkpoints of the run the selection-aware correction counts"),
    Column("loss_ratio", "collapse indicator: fine-tuned / base ICL loss on C' (ours)"),
    Column("output_std", "collapse indicator: std of the fine-tuned model's outputs (ours)"),
    Column("loss_ratio_true", "loss ratio on the true labels of the split (spec's collapse indicator, beside ours)"),
    Column("loss_ratio_spec", "loss ratio as the spec defines it"),
    Column("output_std_spec", "output std as the spec defines it"),
    Column("mu_gap", "overfitting: mean member/non-member loss gap over the manipulation suite (nats)"),
    Column("sigma_gap", "overfitting: std of that gap over the suite (nats)"),
    Column("member_mean_probe_loss", "mean raw probe loss of the members (inversion check)", False),
    Column("nonmember_mean_probe_loss", "mean raw probe loss of the non-members (inversion check)", False),
    Column("raw_auc", "uncalibrated headline AUC (fine-tuned scores alone)"),
    Column("ref_auc", "reference-only AUC (base-model scores alone): what the split shows before training"),
    Column("raw_outcome", "memorization or no_signal from the uncalibrated scores alone"),
    Column("raw_score_kind", "the score kind that flagged raw memorization (None when none did)"),
    Column("raw_memorization_flag", "whether the uncalibrated scores alone pass the memorization test"),
    Column("known_context_memorization_flag", "whether the base-calibrated known-context loss passes the memorization "
           "test (its own family, one score per checkpoint; never on a collapsed checkpoint): the second "
           "channel beside the zero-information outcome"),
    Column("deployed_known_context_memorization_flag", "recipe upstream: the same test on the known-context loss "
           "scored as the package deploys the weights (its preprocessing and ensemble), calibrated by the base "
           "weights deployed alike"),
    Column("calibrated_memorization_flag", "whether the calibrated scores pass the memorization test"),
    Column("fine_tuned", "whether the checkpoint differs from the base model"),
    Column("sanity_check", "the untouched base model probed as a checkpoint (ΔS ≡ 0 by construction)"),
    Column("n_members", "members scored"),
    Column("n_nonmembers", "non-members scored"),
    Column("null_splits", "null splits probed (rows never trained on, labelled member at random)"),
    Column("null_evidence", "per null split: sizes, AUC, interval and p-value, known-context flag, and with "
           "output_decimals the rounded re-test's outcome, AUC per kind and known-context flag (JSON)"),
    Column("null_known_context_flags", "null splits on which the known-context flag was set (false positives of "
           "that channel)"),
    # ---- the rounded re-test (probe.output_decimals; absent from a row probed without one): the same verdict,
    # headline kind and known-context flag on the outputs rounded as a deployed model returns them
    Column("output_decimals", "the decimals the rounded re-test rounds every output probability to (absent: none)"),
    Column("rounded_outcome", "the outcome under the sweep's verdict rule on the outputs rounded to output_decimals "
           "(same thresholds, family and bootstrap seed)"),
    Column("rounded_auc", "the headline score kind's calibrated AUC on the rounded outputs"),
    Column("rounded_auc_low", "lower end of that AUC's bootstrap interval"),
    Column("rounded_auc_high", "upper end of that AUC's bootstrap interval"),
    Column("rounded_p_value", "one-sided p-value of the headline score kind's memorization test on the rounded "
           "outputs"),
    Column("rounded_known_context_calibrated_auc", "the base-calibrated known-context loss attack's AUC with p(y*) "
           "rounded to output_decimals (on the checkpoint and on the base model)"),
    Column("rounded_known_context_calibrated_auc_low", "lower end of that AUC's bootstrap interval"),
    Column("rounded_known_context_calibrated_auc_high", "upper end of that AUC's bootstrap interval"),
    Column("rounded_known_context_calibrated_p_value", "one-sided p-value of that attack's memorization test"),
    Column("rounded_known_context_memorization_flag", "the known-context memorization flag (same rule and family) "
           "on the rounded known-context loss"),
    # ---- exchangeability of members and non-members (trainables.data.blind)
    Column("label_design", "how non-members' labels are treated under shuffled_members (LabelDesign)"),
    Column("blind_auc", "blind baseline: AUC of a classifier on C' alone separating members before training"),
    Column("blind_auc_low", "lower end of the blind baseline's interval"),
    Column("blind_auc_high", "upper end of the blind baseline's interval"),
    Column("blind_separable", "whether the blind baseline separates the groups (interval above 0.5)"),
    Column("exchangeable", "whether members and non-members are exchangeable before training"),
    # ---- utility with C' (probes.probe_columns.icl_utility_columns)
    Column("member_icl_accuracy", "ICL accuracy on the members with C' as context"),
    Column("nonmember_icl_accuracy", "ICL accuracy on the non-members with C' as context"),
    Column("member_icl_loss", "ICL loss on the members"),
    Column("nonmember_icl_loss", "ICL loss on the non-members"),
    # recipe upstream: the same, scored as the package deploys the weights (probes.probe_columns.deployed_utility_columns)
    Column("deployed_member_icl_accuracy", "recipe upstream: ICL accuracy on the members, as the package deploys"),
    Column("deployed_nonmember_icl_accuracy", "recipe upstream: ICL accuracy on the non-members, as deployed"),
    Column("deployed_member_icl_loss", "recipe upstream: ICL loss on the members, as deployed"),
    Column("deployed_nonmember_icl_loss", "recipe upstream: ICL loss on the non-members, as deployed"),
    # ---- ε lower bounds (orchestrator.report.aggregate.epsilon_columns) and DP-SGD's accountant
    Column("epsilon_lb", "ε lower bound from the headline attack's error rates"),
    Column("epsilon_lb_kind", "which attack and score the ε lower bound comes from"),
    Column("epsilon_lb_delta", "the δ of the ε lower bound"),
    Column("epsilon_lb_withheld", "why the ε lower bound is withheld (NaN) at this checkpoint, if it is"),
    Column("run_epsilon_lb", "the run's largest ε lower bound over its checkpoints"),
    Column("run_epsilon_lb_epoch", "the epoch of the run's largest ε lower bound"),
    Column("run_epsilon_lb_kind", "the attack and score of the run's largest ε lower bound"),
    Column("epsilon_consistent", "whether the classic (ε, δ) check at the grid's thresholds, read at "
           "consistency_level, stays within the accountant's replace-one ε (False: exceeds it at that level)"),
    Column("gdp_mu_lb", "Gaussian-DP μ lower bound at 95%, the largest over the competing score kinds, each "
           "read at 0.05 / K (Bonferroni over the K kinds; replace-one)"),
    Column("gdp_mu_lb_kind", "which score the GDP μ lower bound comes from"),
    Column("gdp_epsilon_lb", "the ε at epsilon_lb_delta of a mechanism exactly gdp_mu_lb-GDP (replace-one): a "
           "lower bound only for a Gaussian mechanism, so NaN except on full-batch DP-SGD runs"),
    Column("gdp_epsilon_lb_withheld", "why no ε is derived from the GDP μ bounds at this checkpoint, if none is"),
    Column("gdp_consistent", "whether the GDP μ check, read at consistency_level, stays within DP-SGD's exact "
           "replace-one μ (False: exceeds it at that level)"),
    Column("dp_mu", "DP-SGD's exact Gaussian-DP μ up to this checkpoint (add/remove; full batches only)"),
    Column("dp_mu_replace_one", "DP-SGD's exact Gaussian-DP μ for replace-one neighbours"),
    Column("one_run_consistent", "whether the one-run check, read at consistency_level, stays within the "
           "accountant's add/remove ε (False: exceeds it at that level)"),
    Column("consistency_level", "the level each consistency check of the run is read at: 0.05 shared by the "
           "run's checks (Bonferroni), so the run's flags together err with probability <= 0.05"),
    Column("dp_delta", "DP-SGD δ"),
    Column("dp_max_grad_norm", "DP-SGD per-example clipping norm"),
    Column("dp_noise_multiplier", "DP-SGD noise multiplier (calibrated to the target ε)"),
    Column("dp_accountant", "the accountant that calibrated the noise"),
    Column("dp_epsilon", "ε the accountant spent up to this checkpoint (add/remove neighbours)"),
    Column("dp_epsilon_replace_one", "ε up to this checkpoint for replace-one neighbours"),
    Column("dp_steps", "DP-SGD steps up to this checkpoint"),
    Column("dp_epochs", "DP-SGD epochs the noise was calibrated for", False),
    Column("dp_sample_rate", "DP-SGD sampling rate", False),
    Column("dp_steps_per_epoch", "DP-SGD steps per epoch", False),
    # ---- reference-model attacks (orchestrator.report.aggregate.attack_columns)
    Column("attack_references", "reference models behind the LiRA / RMIA columns"),
    Column("attack_global_variance", "whether LiRA used a global variance (too few references per row)"),
    Column("known_context_attack_references", "reference models behind the known-context attack columns"),
    Column("known_context_attack_global_variance", "global variance for the known-context attacks"),
    Column("deployed_known_context_attack_references", "recipe upstream: reference models behind the attack "
           "columns on the known-context loss as the package deploys the weights"),
    Column("deployed_known_context_attack_global_variance", "global variance for those attacks"),
    Column("attack_roc", "each attack's ROC curve (JSON fpr / tpr)"),
    # ---- canaries (probes.canaries.summary_columns)
    Column("canary_records", "every canary's exposure and rank (JSON; ids, no row values)", False),
    Column("canary_scores", "every canary's membership statistics, inserted and held out (JSON: id, kind, copies, "
           "probe_stat, known_context_stat; the risk report ranks them beside the rows)", False),
    Column("canary_holdout", "held-out canaries each exposure is ranked against"),
    Column("canary_exposure_max", "the largest measurable exposure, log2(holdout + 1)"),
    Column("canary_p_value", "one-sided rank test of inserted against held-out canaries (probe statistic)"),
    Column("canary_known_context_p_value", "the same rank test on the known-context statistic"),
    Column("canary_beta", "the level of the canaries' tests and the one-run bound's error probability"),
    Column("canary_detected", "canary_p_value below canary_beta: the inserted canaries are told apart"),
    # ---- the one-run ε lower bound of one_run canaries (probes.one_run)
    Column("one_run_epsilon_lb", "one-run ε lower bound (add/remove), the larger of both canary statistics"),
    Column("one_run_epsilon_lb_attack", "which canary statistic gave the one-run bound"),
    Column("one_run_epsilon_lb_probe", "one-run ε lower bound of the probe statistic"),
    Column("one_run_epsilon_lb_known_context", "one-run ε lower bound of the known-context statistic"),
    Column("one_run_guesses", "guesses (top k+ and bottom k- canaries) behind the one-run bound"),
    Column("one_run_correct", "right guesses among them"),
    Column("one_run_m", "canaries of the one-run design (each in with probability 1/2)"),
    Column("one_run_n_in", "canaries the coins put into training"),
    Column("one_run_delta", "the δ of the one-run claim tested"),
    Column("one_run_beta", "the one-run bound holds with probability 1 - beta"),
    Column("one_run_tests", "tests of the union bound (guess grid x statistics)"),
    # ---- where and how long (probes.actors)
    Column("probe_seconds", "wall time of the checkpoint's probe", False),
    Column("probe_device_seconds", "device-seconds of the probe (CPU time on a CPU, wall time on a GPU)", False),
    Column("probe_score_seconds", "of which scoring the checkpoint's contexts (null splits, canaries)", False),
    Column("probe_reference_seconds", "of which base-model reference scores (when not cached yet)", False),
    Column("probe_plan_seconds", "of which building the task's probe plan (once per task and actor)", False),
    Column("probe_node", "Ray node the probe ran on", False),
)

_KINDS = "|".join(values(ScoreKind))
_ATTACKS = "|".join(values(Attack))
_RULES = "|".join(values(VerdictRule))
# the verdict columns of every reference-model attack (probes.attacks.membership): ids, verdicts and counts
ATTACK_VERDICT_SUFFIXES: tuple[str, ...] = ("outcome", "p_value_threshold", "null_memorization", "run_outcome",
                                            "run_epoch", "run_auc", "run_null_splits", "run_null_memorization")
# the statistic an attack reads: the probe's (no prefix), the known-context loss, or that loss as the package
# deploys the weights (recipe upstream)
_ATTACK_STATISTIC = "(known_context_|deployed_known_context_)?"
# ... each by name, as the report, the claim ledger and the benchmarks call it (orchestrator.report.aggregate.ATTACK_STATISTICS
# computes them)
ATTACK_CHANNELS: dict[str, str] = {"": "zero-information probe", "known_context_": "known context C'",
                                   "deployed_known_context_": "known context C' as the package deploys the weights"}
ATTACK_VERDICT_COLUMN = re.compile(rf"^{_ATTACK_STATISTIC}({_ATTACKS})_({'|'.join(ATTACK_VERDICT_SUFFIXES)})$")
FAMILIES: tuple[ColumnFamily, ...] = (
    ColumnFamily(re.compile(rf"^(auc|auc_low|auc_high|raw_auc|ref_auc|tpr_at_1pct|tpr_at_10pct)_({_KINDS})$"),
                 "the headline metric for one score kind (calibrated, raw, reference-only)"),
    ColumnFamily(re.compile(rf"^(tpr|fpr|threshold|raw_tpr|ref_tpr)_at_\d+pct(_low|_high)?(_({_KINDS}))?$"),
                 "a point of the ROC at a fixed false-positive rate, with its Clopper-Pearson interval"),
    ColumnFamily(re.compile(rf"^(outcome|null_memorization)_({_RULES})(_strict)?$"),
                 "the outcome (and null-split false memorizations) under each verdict rule"),
    ColumnFamily(re.compile(r"^(deployed_)?known_context_(calibrated_)?(auc|auc_low|auc_high|p_value|"
                            r"tpr_at_\d+pct(_low|_high)?)$"),
                 "the known-context loss attack (each audited row predicted with C' as its context); deployed_: "
                 "recipe upstream, scored as the package deploys the weights"),
    # listed before the kind's metric set, which would match it too: these counts are the aggregator's input
    ColumnFamily(re.compile(rf"^(calibrated|uncalibrated|reference_only)_({_KINDS})_gdp_grid$"),
                 "one score kind's false positives and negatives at the GDP grid's thresholds (JSON): what the "
                 "aggregator re-reads the GDP and consistency bounds from at their levels", False),
    ColumnFamily(re.compile(rf"^(calibrated|uncalibrated|reference_only)_({_KINDS})_[a-z0-9_]+$"),
                 "one score kind's full metric set under one calibration"),
    ColumnFamily(re.compile(r"^threshold_[a-z_]+$"), "an outcome threshold in force (probes.outcomes)"),
    ColumnFamily(re.compile(rf"^{_ATTACK_STATISTIC}({_ATTACKS})_(auc|auc_low|auc_high|p_value|n_members|n_nonmembers"
                            r"|tpr_at_[0-9_]+pct(_low|_high|_realized_fpr|_n_true_positives)?"
                            r"|null_splits|null_auc|null_detections|null_evidence|epsilon_lb)$"),
                 "a reference-model attack's metric (LiRA online/offline, RMIA) on the probe or known-context "
                 "statistic (deployed_: recipe upstream's, as the package deploys the weights)"),
    ColumnFamily(ATTACK_VERDICT_COLUMN, "a reference-model attack's verdict, null false positives and run headline"),
    ColumnFamily(re.compile(rf"^canary_(({'|'.join(values(CanaryKind))})_)?(exposure|known_context_exposure|label_rank)"
                            r"_c\d+$"),
                 "canary exposure (bits) or label rank, per canary kind and number of copies"),
    ColumnFamily(re.compile(r"^canary_p_value_c\d+$"),
                 "rank test of the canaries inserted with that many copies against the held-out ones"),
)

# Where and how long a checkpoint's probe ran: the columns two runs of the same sweep may differ in (a resumed,
# interrupted or re-scheduled run gives the same results otherwise, and the tests compare all the rest)
VOLATILE_COLUMNS: tuple[str, ...] = ("probe_seconds", "probe_device_seconds", "probe_score_seconds",
                                     "probe_reference_seconds", "probe_plan_seconds", "probe_node")

# The neighbour relation every ε / μ column is stated for (iclmem.vocab.Neighbours), declared once: the report
# prints it beside each number and the consistency checks compare a bound only with the accountant's figure
# for the same relation. The member / non-member audit plays replace-one (which row of a pair is trained);
# one_run canaries are in or out (add/remove), the relation DP-SGD accountants state.
NEIGHBOURS: dict[str, Neighbours] = {
    "epsilon_lb": Neighbours.REPLACE_ONE, "run_epsilon_lb": Neighbours.REPLACE_ONE,
    "gdp_mu_lb": Neighbours.REPLACE_ONE, "gdp_epsilon_lb": Neighbours.REPLACE_ONE,
    "one_run_epsilon_lb": Neighbours.ADD_REMOVE,
    "dp_epsilon": Neighbours.ADD_REMOVE, "dp_mu": Neighbours.ADD_REMOVE,
    "dp_epsilon_replace_one": Neighbours.REPLACE_ONE, "dp_mu_replace_one": Neighbours.REPLACE_ONE,
}


def _lookup(name: object) -> Column | ColumnFamily | None:
    if not isinstance(name, str):
        return None
    if name in COLUMNS:
        return COLUMNS[name]
    return next((f for f in FAMILIES if f.pattern.match(name)), None)


def is_result_column(name: object) -> bool:
    return _lookup(name) is not None


def is_public(name: object) -> bool:
    """Whether a column may leave the cluster (report, W&B): ids, config numbers, metrics and verdicts."""
    entry = _lookup(name)
    return entry is not None and entry.public


def column_meaning(name: str) -> str:
    entry = _lookup(name)
    if entry is None:
        raise ResultSchemaError(f"{name!r} is not a results column (iclmem.record declares them)")
    return entry.meaning


def public_columns(columns: Iterable[object]) -> list[str]:
    return [c for c in columns if isinstance(c, str) and is_public(c)]


def check_row(row: Mapping[str, Any], where: str) -> None:
    """Refuse a results row with an unknown column or without its identity, naming ``where`` it was written."""
    unknown = sorted(str(c) for c in row if not is_result_column(c))
    if unknown:
        raise ResultSchemaError(f"{where}: column(s) {unknown} are not declared in iclmem.record; declare each "
                                "with its meaning (and whether it may leave the cluster) before writing it")
    missing = [c for c in CHECKPOINT_KEY if c not in row]
    if missing:
        raise ResultSchemaError(f"{where}: the row lacks {missing} (every row carries {list(CHECKPOINT_KEY)})")
    bad = [c for c in INTEGER_COLUMNS if not _is_int(row[c])]
    if bad:
        raise ResultSchemaError(f"{where}: {bad} must be integers, got {[row[c] for c in bad]}")


def check_columns(columns: Iterable[object], where: str) -> None:
    """Refuse a results table with an undeclared column (the aggregator's check before it writes)."""
    unknown = sorted(str(c) for c in columns if not is_result_column(c))
    if unknown:
        raise ResultSchemaError(f"{where}: column(s) {unknown} are not declared in iclmem.record")


def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and number == int(number)  # finite first: int(inf) raises
