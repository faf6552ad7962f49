"""The verdict rule and thresholds in force, as the report states them: read from the run's config
(``sweep.json``'s ``outcome`` block) or, without one, from the ``threshold_*`` columns every results row records;
what each setting means; and the rule the ``outcome`` column was decided by. Pure: no file is read here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from iclmem.runfolder import SWEEP_FILE
from iclmem.vocab import VerdictRule
from orchestrator.report.selection import competing_kinds, fine_tuned_rows
from orchestrator.schema.config import OutcomeConfig, SweepConfig

__all__ = [
    "THRESHOLD_MEANINGS",
    "norm_setting",
    "thresholds_in_force",
    "rule_in_force",
    "verdict_rule_summary",
]

# What each outcome setting means, for the thresholds table at the report's top.
THRESHOLD_MEANINGS: dict[str, str] = {
    "rule": "which rule decides memorization: paper (the paper's rule on each checkpoint alone) or "
            "selection_aware (the paper's rule and a p-value below family_alpha / K)",
    "strict": "strict mode: memorization also needs the calibrated AUC's 95% interval to lie above memorization_auc",
    "score_kinds": "the score kinds that compete for a checkpoint's maximum signal",
    "collapse_loss_ratio": "collapse when the loss ratio L_FT / L_base exceeds this (the smaller of the non-members' "
                           "true-label ratio and the spec's ratio on the labels as probed)",
    "collapse_output_std": "collapse when the standard deviation of the fine-tuned model's p(true label) over the non-members is below this",
    "memorization_auc": "memorization needs a calibrated AUC above this",
    "memorization_alpha": "the false-positive rate α at which memorization reads the TPR",
    "memorization_tpr_margin": "memorization needs TPR@α − α of at least this",
    "family_alpha": "selection_aware: the false-positive rate the run headline keeps, split over K = checkpoints × kinds",
    "inversion_auc": "inversion needs the uncalibrated loss AUC's 95% interval to lie below this",
    "overfitting_mu": "overfitting needs |μ_gap| (nats) at most this",
    "overfitting_sigma": "overfitting needs σ_gap (nats) at most this",
}


def norm_setting(key: str, value: Any) -> str:
    """A threshold as one comparable string, whether it came from sweep.json or a results column."""
    if key == "score_kinds":
        kinds = value.split(",") if isinstance(value, str) else list(value or [])
        return ", ".join(str(k).strip() for k in kinds if str(k).strip())
    if isinstance(value, (bool, np.bool_)) or key == "strict":
        return "yes" if bool(value) else "no"
    if isinstance(value, (int, float, np.integer, np.floating)):
        return f"{float(value):g}"
    return str(value)


def thresholds_in_force(results: pd.DataFrame, sweep: SweepConfig | None) -> tuple[dict[str, str], str, list[str]]:
    """The outcome settings in force, where they were read, and the ones the results disagree on.

    Read from the run's config (``sweep.json``'s ``outcome`` block) when there is one, else from the
    ``threshold_*`` columns every results row records. A setting the rows record differently from the
    config is returned in the third element (it would mean the rows were classified under another config).
    """
    recorded: dict[str, str] = {}
    ft = fine_tuned_rows(results)
    first = (ft if not ft.empty else results).iloc[0] if not results.empty else None
    if first is not None:
        for c in results.columns:
            if c.startswith("threshold_") and pd.notna(first[c]):
                recorded[c[len("threshold_"):]] = norm_setting(c[len("threshold_"):], first[c])
    config = sweep.outcome.model_dump(mode="json") if sweep is not None else None
    if config:
        first_keys = [k for k in THRESHOLD_MEANINGS if k in config]  # rule, strict, kinds first
        settings = {k: norm_setting(k, config[k]) for k in [*first_keys, *(k for k in config if k not in first_keys)]}
        source = f"the run's config ({SWEEP_FILE}, outcome block)"
    elif recorded:
        settings, source = dict(recorded), "the results table (threshold_* columns; no sweep.json)"
    else:
        return {}, "not recorded", []
    disagree = [k for k in settings if k in recorded and recorded[k] != settings[k]]
    return settings, source, disagree


def rule_in_force(results: pd.DataFrame, settings: Mapping[str, str]) -> str:
    """The VerdictRule value of the ``outcome`` column (e.g. ``selection_aware_strict``)."""
    if "rule" in settings:
        try:
            return VerdictRule.of(settings["rule"], settings.get("strict") == "yes").value
        except ValueError:
            pass
    if "rule" in results.columns and results["rule"].notna().any():
        return str(results["rule"].dropna().iloc[0])
    default = OutcomeConfig()  # neither config nor rows say: the schema's default rule
    return VerdictRule.of(default.rule, default.strict).value


def verdict_rule_summary(results: pd.DataFrame) -> dict[str, Any]:
    """The rule the sweep's ``outcome`` column uses and its thresholds, as recorded in the results."""
    out: dict[str, Any] = {}
    if results.empty:
        return out
    first = results.iloc[0]
    out["rule"] = first.get("rule", "paper")
    for c in results.columns:
        if c.startswith("threshold_"):
            out[c[len("threshold_"):]] = first[c]
    if "p_value_threshold" in results.columns:
        ft = fine_tuned_rows(results)
        if not ft.empty:
            out["p_value_threshold"] = float(ft["p_value_threshold"].iloc[0])
            out["family_size"] = int(ft["n_checkpoints_in_family"].iloc[0]) * len(competing_kinds(results))
    return out
