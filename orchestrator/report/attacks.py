"""The report's reference-model attacks section: IclMem's calibrated score beside LiRA and RMIA.

Reads only the columns in :data:`ATTACK_REPORT_COLUMNS` (ids, config, metrics and the ROC curves'
fpr / tpr, which ``orchestrator.report.aggregate.attack_columns`` writes), so no raw value reaches the page.

* :func:`attack_table` -- one row per audited run, at its checkpoint with the highest LiRA-online AUC
  (ties: the earliest): AUC [95% interval] and TPR@1% of IclMem's calibrated score and of each attack,
  and each attack's null-split AUC;
* :func:`attack_verdict_table` -- one row per (run, statistic, attack): the attack's run headline under the
  sweep's verdict rule (its checkpoint with the highest AUC, the AUC, p-value and the bar it had to pass)
  and its measured false positives on the attack null splits, at run-headline and at checkpoint level;
* :func:`attack_roc_figure` -- log-log ROC of those checkpoints, down to the smallest FPR the counts allow
  (1 / number of non-members);
* :func:`attacks_section_html` -- both as an HTML fragment (empty without attack columns).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from iclmem.record import ATTACK_CHANNELS, ATTACK_VERDICT_SUFFIXES, CHECKPOINT_KEY, RUN_KEY
from iclmem.vocab import Attack
from orchestrator.report.parts import html_table, paragraph, save_png, section_html

__all__ = ["ATTACK_REPORT_COLUMNS", "ATTACKS_FIGURE",
           "attack_table", "attack_verdict_table", "attack_roc_figure", "attacks_section_html"]

ATTACKS_FIGURE = "attacks_roc.png"
_ATTACKS = [a.value for a in Attack]
# the statistics the attacks run on (orchestrator.report.aggregate.ATTACK_STATISTICS): column prefix -> report name
# (IclMem's own score on the probe is −ΔS; LiRA reads the per-manipulation logits of p(y*), RMIA p(y*) itself)
_STATISTICS = ATTACK_CHANNELS
ATTACK_REPORT_COLUMNS: tuple[str, ...] = tuple(dict.fromkeys((
    *CHECKPOINT_KEY, "sanity_check", "outcome",
    "auc", "auc_low", "auc_high", "tpr_at_1pct", "calibrated_loss_auc", "calibrated_loss_auc_low",
    "calibrated_loss_auc_high", "calibrated_loss_tpr_at_1pct", "attack_references", "attack_roc",
    *(f"{a}_{stat}" for a in _ATTACKS for stat in ("auc", "auc_low", "auc_high", "tpr_at_1pct", "tpr_at_1pct_low",
                                                   "tpr_at_1pct_high", "tpr_at_0_1pct", "null_auc",
                                                   "null_detections", "n_nonmembers")),
    *(f"{p}{a}_{stat}" for p in _STATISTICS for a in _ATTACKS
      for stat in ("auc", "auc_low", "auc_high", "p_value", "null_splits", *ATTACK_VERDICT_SUFFIXES)),
)))


def _public(results: pd.DataFrame) -> pd.DataFrame:
    df = results.loc[:, [c for c in ATTACK_REPORT_COLUMNS if c in results.columns]].copy()
    if "sanity_check" in df.columns:
        df = df[~df["sanity_check"].fillna(False).astype(bool)]
    return df


def _peaks(results: pd.DataFrame) -> pd.DataFrame:
    df = _public(results)
    key = f"{Attack.LIRA_ONLINE.value}_auc"
    if df.empty or key not in df.columns or df[key].isna().all():
        return pd.DataFrame()
    df = df[df[key].notna()]
    rows = []
    for _, group in df.groupby(list(RUN_KEY), sort=True):
        group = group.sort_values("epoch")
        rows.append(group.loc[group[key].astype(float).idxmax()])
    return pd.DataFrame(rows).reset_index(drop=True)


def _interval(row: pd.Series, prefix: str) -> str:
    auc, low, high = (row.get(f"{prefix}auc"), row.get(f"{prefix}auc_low"), row.get(f"{prefix}auc_high"))
    if auc is None or pd.isna(auc):
        return "–"
    return f"{float(auc):.3f} [{float(low):.2f}, {float(high):.2f}]"


def _num(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{float(value):.3f}"


def attack_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per audited run at its peak LiRA-online checkpoint (see the module docstring)."""
    peaks = _peaks(results)
    if peaks.empty:
        return pd.DataFrame()
    rows = []
    for _, row in peaks.iterrows():
        out = {"task": row["task"], "run_id": row["run_id"], "label_mode": row.get("label_mode"),
               "epoch": int(row["epoch"]), "K": int(row.get("attack_references", 0)),
               "IclMem calibrated loss AUC": _interval(row, "calibrated_loss_"),
               "IclMem TPR@1%": _num(row.get("calibrated_loss_tpr_at_1pct"))}
        for a in _ATTACKS:
            out[f"{a} AUC"] = _interval(row, f"{a}_")
            out[f"{a} TPR@1%"] = _num(row.get(f"{a}_tpr_at_1pct"))
            out[f"{a} null AUC"] = _num(row.get(f"{a}_null_auc"))
        rows.append(out)
    return pd.DataFrame(rows)


def _count(value: float | None) -> int | None:
    return None if value is None or pd.isna(value) else int(float(value))


def _judged_attacks(df: pd.DataFrame) -> Iterator[tuple[str, str, str]]:
    """(statistic, attack, column prefix) of every attack whose run headline the results hold."""
    for p, statistic in _STATISTICS.items():
        for a in _ATTACKS:
            if f"{p}{a}_run_outcome" in df.columns:
                yield statistic, a, f"{p}{a}_"


def attack_verdict_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (audited run, statistic, attack) with verdict columns (see the module docstring):
    ``headline epoch``, ``AUC`` [95% interval] and ``p-value`` at it, ``p-value bar`` (``family_alpha /
    checkpoints`` under selection_aware), ``verdict`` (the run headline's), ``null FP (run headline)`` (null
    runs whose headline is memorization, of the null runs) and ``null FP (checkpoints)`` (memorization
    verdicts on the attack null splits of every checkpoint, of the null splits probed)."""
    df = _public(results)
    rows = []
    for statistic, a, c in _judged_attacks(df):
        for (run_id, task), group in df[df[f"{c}run_outcome"].notna()].groupby(list(RUN_KEY), sort=True):
            first = group.iloc[0]
            epoch = first.get(f"{c}run_epoch")
            at = group[group["epoch"].astype(float) == float(epoch)] if pd.notna(epoch) else group.iloc[:0]
            head = at.iloc[0] if len(at) else first
            k_run, n_run = _count(first.get(f"{c}run_null_memorization")), _count(first.get(f"{c}run_null_splits"))
            k_ckpt = group[f"{c}null_memorization"].sum() if f"{c}null_memorization" in group.columns else None
            n_ckpt = group[f"{c}null_splits"].sum() if f"{c}null_splits" in group.columns else None
            rows.append({
                "task": task, "run_id": run_id, "label_mode": first.get("label_mode"), "statistic": statistic,
                "attack": a, "headline epoch": "–" if pd.isna(epoch) else int(epoch),
                "AUC": _interval(head, c) if len(at) else "–",
                "p-value": f"{float(head[f'{c}p_value']):.2g}" if len(at) and pd.notna(head.get(f"{c}p_value")) else "–",
                "p-value bar": (f"{float(head[f'{c}p_value_threshold']):.2g}"
                                if len(at) and pd.notna(head.get(f"{c}p_value_threshold")) else "–"),
                "verdict": str(first[f"{c}run_outcome"]),
                "null FP (run headline)": "–" if k_run is None or n_run is None else f"{k_run} / {n_run}",
                "null FP (checkpoints)": ("–" if k_ckpt is None or n_ckpt is None
                                          else f"{int(k_ckpt)} / {int(n_ckpt)}"),
            })
    return pd.DataFrame(rows)


def _verdict_summary(results: pd.DataFrame) -> str:
    """Per statistic and attack, over the sweep: runs called memorization and null runs that were (false
    positives), at run-headline level."""
    df = _public(results)
    parts = []
    for statistic, a, c in _judged_attacks(df):
        runs = df[df[f"{c}run_outcome"].notna()].drop_duplicates(list(RUN_KEY))
        if runs.empty:
            continue
        found = int((runs[f"{c}run_outcome"] == "memorization").sum())
        k = int(runs[f"{c}run_null_memorization"].fillna(0).sum()) if f"{c}run_null_memorization" in runs else 0
        n = int(runs[f"{c}run_null_splits"].fillna(0).sum()) if f"{c}run_null_splits" in runs else 0
        parts.append(f"{a} on the {statistic}: memorization in {found} of {len(runs)} runs, "
                     f"{k} of {n} null runs (false positives)")
    return "; ".join(parts)


def attack_roc_figure(results: pd.DataFrame, path: str | Path) -> Path | None:
    """Log-log ROC curves (one panel per run at its peak checkpoint): IclMem calibrated loss, LiRA online /
    offline, RMIA, and the chance diagonal; the FPR axis starts at 1 / n_nonmembers, the smallest non-zero
    FPR those counts can show. None (nothing written) without ROC data."""
    peaks = _peaks(results)
    if peaks.empty or "attack_roc" not in peaks.columns:
        return None
    from matplotlib.figure import Figure

    n = len(peaks)
    fig = Figure(figsize=(4.2 * min(n, 3), 3.8 * math.ceil(n / 3)), layout="constrained")
    for i, (_, row) in enumerate(peaks.iterrows()):
        ax = fig.add_subplot(math.ceil(n / 3), min(n, 3), i + 1)
        curves = json.loads(row["attack_roc"]) if isinstance(row["attack_roc"], str) else {}
        n_non = row.get(f"{Attack.LIRA_ONLINE.value}_n_nonmembers")
        floor = 1.0 / float(n_non) if n_non is not None and pd.notna(n_non) and float(n_non) > 0 else 1e-3
        for name, curve in curves.items():
            fpr = [max(f, floor) for f in curve["fpr"]]  # FPR 0 is drawn at the resolution floor (log axis)
            ax.plot(fpr, [max(t, floor) for t in curve["tpr"]], label=name, drawstyle="steps-post")
        ax.plot([floor, 1], [floor, 1], color="grey", linestyle=":", label="chance")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(floor, 1)
        ax.set_ylim(floor, 1.05)
        ax.set_xlabel(f"FPR (floor 1/{int(round(1 / floor))})")
        ax.set_ylabel("TPR")
        ax.set_title(f"{row['task']} {row.get('label_mode', '')} e{int(row['epoch'])} ({str(row['run_id'])[-6:]})",
                     fontsize=8)
        ax.legend(fontsize=6, loc="lower right")
    return save_png(fig, path)


def attacks_section_html(results: pd.DataFrame, figure_dir: str | Path) -> str:
    """The section (heading, what the attacks are, the table, the figure); empty without attack columns."""
    table = attack_table(results)
    if table.empty:
        return ""
    figure = attack_roc_figure(results, Path(figure_dir) / ATTACKS_FIGURE)
    note = ("Reference-model attacks on the same checkpoints (probe.references = K reference fine-tunes per run, "
            "each on a random half of the run's members and non-members, with a training seed of its own). LiRA "
            "online: per query and per manipulation of the probe suite, Gaussians of the logit of the model's "
            "probability of the query's label, log p − log(1 − p), under references that trained on the query and "
            "those that did not, the query's score the mean over the manipulations (on the known context C': the "
            "one logit with C' as context); LiRA offline: the out-references only; RMIA: the query's probability "
            "of its label (the geometric mean over the manipulations) divided by its mean over the references, "
            "ranked among the other queries. IclMem's own score beside them is the base-calibrated −ΔS. Each run at its checkpoint with the highest LiRA-online AUC; AUC with "
            "its bootstrap 95% interval; null AUC: the attack on a random half of the non-members labelled "
            "member (rows the run never trained on), which must stay near 0.5. Reference trials are not audited "
            "runs: their rows are in reference_results.parquet, not in the tables above.")
    blocks = [paragraph(note), html_table(table)]
    verdicts = attack_verdict_table(results)
    if not verdicts.empty:
        verdict_note = ("Verdicts: every attack is judged by the sweep's own memorization rule (the rule and "
                        "thresholds of the outcome column, on the attack's AUC, interval, TPR at the rule's α and "
                        "one-sided p-value); under selection_aware its p-value must stay below family_alpha / "
                        "checkpoints, the family its run headline (the checkpoint with the attack's highest AUC) "
                        "is the maximum of. Its attack null splits are judged the same way: every memorization "
                        "verdict there is a false positive (null FP: at the null runs' headlines, and over all "
                        "checkpoints). ")
        summary = _verdict_summary(results)
        blocks += [paragraph(verdict_note + (summary + "." if summary else "")), html_table(verdicts)]
    return section_html("Reference-model attacks: LiRA and RMIA", blocks, figure_dir, figure, "attack ROC, log-log")
