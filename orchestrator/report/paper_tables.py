"""The paper's tables and figures' data: one pure pandas function per table (outcome rates per Q, Tabs. 6, 8,
10–12, Figs. 2 and 6, App. 7.3 and 7.4), each docstring naming its table and what it is computed from; each
run-level table reads every run at its peak checkpoint (:func:`orchestrator.report.selection.peak_checkpoints`).
No file is read or written here."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pandas as pd

from iclmem.record import CHECKPOINT_ID, PAPER_RUN_ORDER, SPLIT_REPORT_ORDER
from iclmem.vocab import Outcome, VerdictRule, values
from orchestrator.report.claims import task_verdicts
from orchestrator.report.null_rates import null_peak_auc_per_task
from orchestrator.report.selection import (
    BASE_MANIPULATION,
    DETECTABLE,
    MAIN_REGIME,
    OUTCOMES,
    REGIMES,
    filter_regime,
    fine_tuned_rows,
    last_checkpoints,
    outcome_order,
    peak_checkpoints,
    run_key_columns,
)
from orchestrator.runfolder.run_folder import public_manipulation_auc, public_split_report

__all__ = [
    "PAPER_TABLES",
    "outcome_counts_per_q",
    "outcome_rates_per_q",
    "TASK_TABLE_COLUMNS",
    "task_lr_q_table",
    "detectable_share_by_epoch",
    "peak_vulnerability_per_task",
    "split_validation",
    "calibration_impact",
    "perturbation_ranking",
    "perturbation_effectiveness",
    "task_characteristics",
    "regime_comparison",
]

# The paper's tables and figures (ICLMEM_SPEC, "Reports the aggregator must be able to produce"), one
# function each; its docstring starts with the reference and says what it is computed from.
PAPER_TABLES: dict[str, str] = {
    "outcome rates per Q": "outcome_rates_per_q", "Tabs. 10–11": "task_lr_q_table",
    "Fig. 2": "detectable_share_by_epoch", "Tab. 8": "peak_vulnerability_per_task", "Tab. 6": "split_validation",
    "App. 7.4": "calibration_impact", "App. 7.3": "perturbation_effectiveness", "Fig. 6": "task_characteristics",
    "Tab. 12": "regime_comparison",
}


def _headline(results: pd.DataFrame, at: str, regime: str | None) -> pd.DataFrame:
    if at == "peak":
        return peak_checkpoints(results, regime=regime)
    if at == "last":
        return last_checkpoints(results, regime=regime)
    raise ValueError(f"at must be 'peak' or 'last', not {at!r}")


def outcome_counts_per_q(
    results: pd.DataFrame, *, regime: str | None = MAIN_REGIME, at: Literal["peak", "last"] = "peak",
    by: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Outcome rates per Q (the spec's first report), as counts: runs per outcome for each Q, each run at
    its peak checkpoint (index ``q``; columns ``n_runs`` then one per outcome). With ``by``
    (e.g. ``("label_mode",)``) the index is (*by, q): runs of different label modes, models or DP ε are
    counted apart, never pooled into one rate."""
    runs = _headline(results, at, regime)
    outcomes = outcome_order(runs["outcome"]) if not runs.empty else list(OUTCOMES)
    by = tuple(c for c in by if c in runs.columns)
    index = [runs[c] for c in by] + [runs["q"]]
    table = pd.crosstab(index, runs["outcome"]).reindex(columns=outcomes, fill_value=0)
    table.columns.name = None
    table.insert(0, "n_runs", table.sum(axis=1))
    return table.sort_index().astype(int)


def outcome_rates_per_q(
    results: pd.DataFrame, *, regime: str | None = MAIN_REGIME, at: Literal["peak", "last"] = "peak",
    by: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Outcome rates per Q (the spec's first report): share of runs per outcome for each Q, from each run's
    results row at its peak checkpoint (rows sum to 1), with ``n_runs``; ``by`` as in
    :func:`outcome_counts_per_q`."""
    counts = outcome_counts_per_q(results, regime=regime, at=at, by=by)
    rates = counts.drop(columns="n_runs").div(counts["n_runs"].replace(0, np.nan), axis=0)
    rates.insert(0, "n_runs", counts["n_runs"])
    return rates


TASK_TABLE_COLUMNS = (
    "task", "q", "lr", "model", "regime", "label_mode", "seed", "run_id", "outcome",
    *(f"outcome_{r}" for r in values(VerdictRule)), "auc", "auc_low",
    "auc_high", "p_value", "blind_auc", "tpr_at_1pct", "tpr_at_10pct", "n_members", "n_nonmembers", "loss_ratio",
    "known_context_auc", "epoch", "score_kind", "peak_auc", "peak_kind",
)


def task_lr_q_table(results: pd.DataFrame, *, regime: str | None = MAIN_REGIME) -> pd.DataFrame:
    """Tabs. 10–11: per run (task × lr × Q [× model, label mode, seed]) at its peak checkpoint: outcome,
    AUC, TPR at 1% and 10% FPR and the epoch, from the results rows of the fine-tuned runs."""
    peaks = peak_checkpoints(results, regime=regime)
    cols = [c for c in TASK_TABLE_COLUMNS if c in peaks.columns]
    order = [c for c in PAPER_RUN_ORDER if c in peaks.columns]
    return peaks.loc[:, cols].sort_values(order, kind="mergesort").reset_index(drop=True)


def detectable_share_by_epoch(
    results: pd.DataFrame, *, regime: str | None = MAIN_REGIME, cumulative: bool = False,
    by: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Fig. 2: share of runs whose checkpoint is flagged ``memorization``, per (Q, epoch), from every
    checkpoint's results row, and per value of
    each column in ``by`` (e.g. ``label_mode``: shares of different label modes are never pooled then)."""
    df = filter_regime(results, regime).copy()
    key = run_key_columns(df)
    by = tuple(c for c in by if c in df.columns)
    df["_flag"] = df["outcome"] == DETECTABLE
    rows = []
    for group, dq in df.groupby([*by, "q"], sort=True):
        group = group if isinstance(group, tuple) else (group,)
        extra, q = dict(zip(by, group[:-1])), group[-1]
        epochs = sorted(dq["epoch"].unique())
        n_all = dq.drop_duplicates(key).shape[0]
        for e in epochs:
            if cumulative:
                upto = dq[dq["epoch"] <= e]
                flagged = upto[upto["_flag"]].drop_duplicates(key).shape[0]
                n = n_all
            else:
                at = dq[dq["epoch"] == e]
                n = at.drop_duplicates(key).shape[0]
                flagged = at[at["_flag"]].drop_duplicates(key).shape[0]
            rows.append({**extra, "q": q, "epoch": int(e), "n_runs": int(n), "n_detectable": int(flagged),
                         "share": flagged / n if n else np.nan})
    return pd.DataFrame(rows, columns=[*by, "q", "epoch", "n_runs", "n_detectable", "share"])


def peak_vulnerability_per_task(results: pd.DataFrame, *, regime: str | None = MAIN_REGIME,
                                by: tuple[str, ...] = ()) -> pd.DataFrame:
    """Tab. 8: per task, the run/checkpoint with the highest calibrated AUC, and the detectable share, from
    each run's peak checkpoint.

    ``detectable_share`` = share of the task's runs whose peak checkpoint is flagged memorization. With
    ``by`` (e.g. ``("label_mode",)``) one row per task and value of those columns: a planted label mode's
    runs never raise a normal one's share.

    The peak's ``outcome`` and ``n_memorization`` > 0 are maxima over the task's runs: the selection-aware
    bound (one run's family) does not cover them (:func:`task_claim_error_rates` measures how often they
    are false on the null splits). ``task_verdict`` (:func:`task_verdicts`) is the task-level claim that
    keeps family_alpha; ``null_peak_auc`` (:func:`null_peak_auc_per_task`) is what the peak AUC reaches by
    chance.
    """
    peaks = peak_checkpoints(results, regime=regime)
    by = tuple(c for c in by if c in peaks.columns)
    rows = []
    for group, d in peaks.groupby(["task", *by], sort=True):
        group = group if isinstance(group, tuple) else (group,)
        best = d.sort_values(["peak_auc", "epoch"], ascending=[False, True], kind="mergesort",
                             na_position="last").iloc[0]
        n_mem = int((d["outcome"] == DETECTABLE).sum())
        row = {**dict(zip(("task", *by), group)), "n_runs": len(d), "n_memorization": n_mem,
               "detectable_share": n_mem / len(d), "peak_auc": best["peak_auc"], "peak_kind": best.get("peak_kind")}
        for c in ("auc_low", "auc_high", "tpr_at_1pct", "tpr_at_10pct", "outcome", "lr", "q", "epoch", "run_id"):
            if c in d.columns:
                row[c] = best[c]
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    null_peaks = null_peak_auc_per_task(results, regime=regime, by=by)
    if not null_peaks.empty:
        out = out.merge(null_peaks, on=["task", *by], how="left")
    # the peak and n_memorization are maxima over runs, outside a run's family_alpha: the controlled task claim
    controlled = task_verdicts(results, regime=regime, by=by)
    if not controlled.empty:
        out = out.merge(controlled, on=["task", *by], how="left")
    return out.sort_values(["peak_auc", "task", *by], ascending=[False, True, *([True] * len(by))],
                           kind="mergesort").reset_index(drop=True)


def split_validation(split_report: pd.DataFrame, *, tvd_max: float = 0.05, ks_max: float = 0.05) -> pd.DataFrame:
    """Tab. 6: member vs non-member distribution checks, one row per (task, label mode, seed, Q), from the
    split report Stage I writes (``split_report.parquet``: TVD, KS, p-value, Wasserstein).

    ``statistic`` names the check that applies (TVD for classification, KS for regression) and
    ``passed`` whether it is under its threshold.
    """
    df = public_split_report(split_report)
    tvd = df["tvd"].astype(float) if "tvd" in df.columns else pd.Series(np.nan, index=df.index)
    ks = df["ks"].astype(float) if "ks" in df.columns else pd.Series(np.nan, index=df.index)
    df["statistic"] = np.where(tvd.notna(), "tvd", np.where(ks.notna(), "ks", "none"))
    df["passed"] = np.where(tvd.notna(), tvd < tvd_max, np.where(ks.notna(), ks < ks_max, False))
    order = [c for c in SPLIT_REPORT_ORDER if c in df.columns]
    return df.sort_values(order, kind="mergesort").reset_index(drop=True)


def calibration_impact(
    results: pd.DataFrame, *, regime: str | None = MAIN_REGIME, level: Literal["checkpoint", "run"] = "checkpoint",
    include_base: bool = False,
) -> pd.DataFrame:
    """App. 7.4: memorization flags with and without difficulty calibration, per Q and overall, from the
    results rows' ``calibrated_memorization_flag`` and ``raw_memorization_flag``.

    Both flags apply the same memorization rule (the sweep's, over the same competing score kinds): the
    calibrated flag to ΔS = S - S_ref (``calibrated_memorization_flag``), the raw flag to S alone
    (``raw_memorization_flag``). Collapsed checkpoints are left out (the paper compares over non-collapsed
    checkpoints: collapse takes precedence, so a collapsed checkpoint would count as a raw-only flag).
    ``level="run"`` counts a run as flagged if any of its checkpoints is. Also the mean AUC of the
    calibrated, uncalibrated and reference-only scores (of each row's headline kind).
    """
    df = filter_regime(results, regime).copy()
    if not include_base:
        df = fine_tuned_rows(df)
    # both flags are in every results table RunFolder reads (REQUIRED_RESULT_COLUMNS)
    df["_raw"] = df["raw_memorization_flag"].astype(bool)
    df["_cal"] = df["calibrated_memorization_flag"].astype(bool)
    df = df[df["outcome"] != Outcome.COLLAPSE.value]
    key = run_key_columns(df)
    if level == "run":
        agg = {"_cal": "any", "_raw": "any", "q": "first"}
        for c in ("auc", "raw_auc", "ref_auc"):
            if c in df.columns:
                agg[c] = "max"
        df = df.groupby(key, sort=False).agg(agg).reset_index()
    elif level != "checkpoint":
        raise ValueError(f"level must be 'checkpoint' or 'run', not {level!r}")

    def summarise(d: pd.DataFrame) -> dict[str, Any]:
        row: dict[str, float] = {"n": len(d), "calibrated_flags": int(d["_cal"].sum()), "raw_flags": int(d["_raw"].sum()),
               "both": int((d["_cal"] & d["_raw"]).sum()), "calibrated_only": int((d["_cal"] & ~d["_raw"]).sum()),
               "raw_only": int((~d["_cal"] & d["_raw"]).sum())}
        for c in ("auc", "raw_auc", "ref_auc"):
            row[f"mean_{c}"] = float(d[c].mean()) if c in d.columns else np.nan
        return row

    rows = [{"q": str(q), **summarise(d)} for q, d in df.groupby("q", sort=True)]
    rows.append({"q": "all", **summarise(df)})
    return pd.DataFrame(rows).set_index("q")


def perturbation_ranking(
    manipulation_auc: pd.DataFrame, *, results: pd.DataFrame | None = None, at_peak: bool = False,
    include_base: bool = False, by: Literal["manipulation", "category"] = "manipulation",
) -> pd.DataFrame:
    """App. 7.3: manipulations (or categories) ranked by mean per-manipulation AUC (rank 1 = highest), from
    ``manipulation_auc.parquet``.

    ``at_peak`` keeps only each run's peak checkpoint (needs ``results``); otherwise every checkpoint
    except the base model (epoch 0) unless ``include_base``.
    """
    df = public_manipulation_auc(manipulation_auc)
    if not include_base and "epoch" in df.columns:
        df = df[df["epoch"] > 0]
    if at_peak:
        if results is None:
            raise ValueError("at_peak=True needs the results table")
        peaks = peak_checkpoints(results, regime=None)[list(CHECKPOINT_ID)].drop_duplicates()
        df = df.merge(peaks, on=list(CHECKPOINT_ID), how="inner")
    if by == "manipulation":
        keys = ["manipulation"] + (["category"] if "category" in df.columns else [])
    elif by == "category":
        keys = ["category"]
    else:
        raise ValueError(f"by must be 'manipulation' or 'category', not {by!r}")
    g = df.groupby(keys, sort=False)["auc"]
    out = pd.DataFrame({"mean_auc": g.mean(), "std_auc": g.std(ddof=1), "median_auc": g.median(), "n": g.size()})
    out = out.reset_index().sort_values(["mean_auc", keys[0]], ascending=[False, True], kind="mergesort")
    out.insert(0, "rank", np.arange(1, len(out) + 1))
    return out.reset_index(drop=True)


def perturbation_effectiveness(
    manipulation_auc: pd.DataFrame, results: pd.DataFrame, *, by: Literal["manipulation", "category"] = "manipulation",
) -> pd.DataFrame:
    """App. 7.3: from ``manipulation_auc.parquet`` and the results rows, over the checkpoints with detectable
    memorization only (``outcome == memorization``), each
    manipulation's AUC (calibrated loss) on its own minus the AUC of the unmanipulated multiple-choice
    context (the ``base`` manipulation) at the same checkpoint: how much a manipulation exposes members
    beyond the plain probe. Manipulations (or categories) ranked by the mean of that Δ (rank 1 = the one
    that exposes members best). A checkpoint whose suite has no ``base`` manipulation is compared with its
    overall AUC(ΔS) instead (``auc_loss``); ``mean_delta_auc_vs_suite`` gives that comparison for every
    row, and ``reference`` says which one ``mean_delta_auc`` used. Empty when no checkpoint is flagged."""
    cols = ["rank", by, "mean_delta_auc", "std_delta_auc", "mean_delta_auc_vs_suite", "mean_auc", "n", "reference"]
    df = public_manipulation_auc(manipulation_auc)
    if df.empty or results.empty or "auc_loss" not in results.columns:
        return pd.DataFrame(columns=cols)
    flagged = fine_tuned_rows(results)
    flagged = flagged[flagged["outcome"] == DETECTABLE][[*CHECKPOINT_ID, "auc_loss"]].drop_duplicates(list(CHECKPOINT_ID))
    df = df.merge(flagged, on=list(CHECKPOINT_ID), how="inner")
    if df.empty:
        return pd.DataFrame(columns=cols)
    if by not in ("manipulation", "category"):
        raise ValueError(f"by must be 'manipulation' or 'category', not {by!r}")
    base = (df[df["manipulation"] == BASE_MANIPULATION][[*CHECKPOINT_ID, "auc"]]
            .drop_duplicates(list(CHECKPOINT_ID)).rename(columns={"auc": "_base_auc"}))
    df = df.merge(base, on=list(CHECKPOINT_ID), how="left")
    df["delta_auc_vs_suite"] = df["auc"] - df["auc_loss"]
    df["delta_auc"] = (df["auc"] - df["_base_auc"]).where(df["_base_auc"].notna(), df["delta_auc_vs_suite"])
    df["_reference"] = np.where(df["_base_auc"].notna(), BASE_MANIPULATION, "overall")
    keys = ["manipulation", "category"] if by == "manipulation" and "category" in df.columns else [by]
    g = df.groupby(keys, sort=False)
    out = pd.DataFrame({"mean_delta_auc": g["delta_auc"].mean(), "std_delta_auc": g["delta_auc"].std(ddof=1),
                        "mean_delta_auc_vs_suite": g["delta_auc_vs_suite"].mean(),
                        "mean_auc": g["auc"].mean(), "n": g.size(),
                        "reference": g["_reference"].agg(lambda v: "+".join(sorted(set(v))))}).reset_index()
    out = out.sort_values(["mean_delta_auc", keys[0]], ascending=[False, True], kind="mergesort")
    out.insert(0, "rank", np.arange(1, len(out) + 1))
    return out.reset_index(drop=True)


def task_characteristics(
    results: pd.DataFrame, split_report: pd.DataFrame, *, regime: str | None = MAIN_REGIME
) -> pd.DataFrame:
    """Fig. 6: per task, cardinality / majority-class share / size / numeric share against outcomes, from
    the split report and the results rows.

    Characteristics are the median over the task's split reports (they do not depend on the split);
    outcome shares are over the task's runs at their peak checkpoints.
    """
    split = public_split_report(split_report)
    chars = [c for c in ("n_classes", "majority_share", "n_rows", "numeric_share") if c in split.columns]
    ch = split.groupby("task")[chars].median()
    peaks = peak_checkpoints(results, regime=regime)
    outcomes = outcome_order(peaks["outcome"]) if not peaks.empty else list(OUTCOMES)
    rates = pd.crosstab(peaks["task"], peaks["outcome"], normalize="index").reindex(columns=outcomes, fill_value=0.0)
    rates.columns = [f"{o}_share" for o in rates.columns]
    per = peaks.groupby("task").agg(n_runs=("outcome", "size"), max_peak_auc=("peak_auc", "max"))
    out = ch.join(per, how="inner").join(rates, how="left")
    if "n_classes" in out.columns:
        out["n_classes"] = out["n_classes"].round().astype(int)
    out.index.name = "task"
    return out.reset_index().sort_values(["memorization_share", "task"], ascending=[False, True],
                                         kind="mergesort").reset_index(drop=True)


def regime_comparison(results: pd.DataFrame, *, by_task: bool = False) -> pd.DataFrame:
    """Tab. 12: single_fixed vs multi_fixed vs multi_random, per (regime[, task], Q), from the results rows
    of every regime at each run's peak checkpoint."""
    peaks = peak_checkpoints(results, regime=None)
    if "regime" not in peaks.columns:
        peaks = peaks.assign(regime=MAIN_REGIME)
    keys = ["regime"] + (["task"] if by_task else []) + ["q"]
    outcomes = outcome_order(peaks["outcome"]) if not peaks.empty else list(OUTCOMES)
    rows = []
    for k, d in peaks.groupby(keys, sort=False):
        row = dict(zip(keys, k if isinstance(k, tuple) else (k,)))
        row["n_runs"] = len(d)
        for o in outcomes:
            row[f"{o}_rate"] = float((d["outcome"] == o).mean())
        row["mean_peak_auc"] = float(d["peak_auc"].mean())
        row["max_peak_auc"] = float(d["peak_auc"].max())
        for c in ("tpr_at_1pct", "tpr_at_10pct"):
            if c in d.columns:
                row[f"max_{c}"] = float(d[c].max())
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    rank = {r: i for i, r in enumerate(REGIMES)}
    out["_r"] = out["regime"].map(lambda r: rank.get(r, len(REGIMES)))
    return out.sort_values(["_r"] + keys, kind="mergesort").drop(columns="_r").reset_index(drop=True)
