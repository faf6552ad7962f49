"""The report's leakage-utility frontier: for each task, model, recipe and regime, every fine-tuned setting
(learning rate, Q, epoch, and ε under DP-SGD) placed by its held-out accuracy against the strongest attack's
TPR at 1% FPR, and the settings no other beats on both (the frontier), so a model owner can pick one.

* Utility: ``nonmember_icl_accuracy``, the checkpoint's in-context accuracy on the non-members with C' as
  context: rows it never trained on, so held-out accuracy; for a model fine-tuned by its package's own
  fine-tuner (recipe upstream) the same as the package deploys it (``deployed_nonmember_icl_accuracy``).
* Leakage: the highest TPR at 1% FPR over the attacks the sweep ran on that checkpoint: IclMem's own
  (``tpr_at_1pct``, the deciding score's), the known-context loss attack calibrated by the base model
  (``known_context_calibrated_tpr_at_1pct``, every checkpoint: the second channel, which on the minis finds
  what the zero-information probe does not; for recipe upstream also as the package deploys the weights,
  ``deployed_known_context_calibrated_tpr_at_1pct``) and each reference-model attack (``<attack>_tpr_at_1pct``
  and ``known_context_<attack>_tpr_at_1pct``, with ``probe.references``).
* Only runs with true labels (label mode ``normal``): under shuffled labels the non-members' accuracy is not
  held-out accuracy on the task. The base model's sanity-check rows are left out, and so are collapsed
  checkpoints (outcome ``collapse``: the model's predictions broke down, so it is no setting to pick, however
  little an attack finds in it).

Reads only :data:`FRONTIER_REPORT_COLUMNS` and the attack TPR columns (public: ids, config, metrics).

* :func:`frontier_table` -- one row per checkpoint with its utility, leakage, strongest attack and whether
  it is on the frontier (pure);
* :func:`frontier_figure` -- leakage against utility, one panel per task, the frontier drawn per model;
* :func:`frontier_section_html` -- the frontier's rows and the figure as an HTML fragment (empty when no
  checkpoint has both numbers).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from iclmem.record import CHECKPOINT_KEY, FRONTIER_GROUP, FRONTIER_LINE, FRONTIER_SETTING
from iclmem.vocab import Attack, LabelMode, Outcome, Recipe, values
from orchestrator.report.parts import html_table, paragraph, save_png, section_html

__all__ = ["FRONTIER_FIGURE", "FRONTIER_REPORT_COLUMNS", "frontier_figure", "frontier_section_html", "frontier_table",
           "leakage_columns"]

FRONTIER_FIGURE = "leakage_utility_frontier.png"
FRONTIER_REPORT_COLUMNS: tuple[str, ...] = (*CHECKPOINT_KEY, "sanity_check", "outcome", "nonmember_icl_accuracy",
                                            "tpr_at_1pct",
                                            "dp_target_epsilon", "model_options", "deployed_nonmember_icl_accuracy")
UTILITY = "nonmember_icl_accuracy"
DEPLOYED_UTILITY = "deployed_nonmember_icl_accuracy"  # recipe upstream: held-out accuracy as the package deploys
ICLMEM_ATTACK = "iclmem"  # the strongest attack's name when IclMem's own score is it
# the known-context loss attack, base-calibrated: on the network, and as the package deploys it (recipe upstream)
KNOWN_CONTEXT_ATTACKS = {"known_context_calibrated_tpr_at_1pct": "known_context",
                         "deployed_known_context_calibrated_tpr_at_1pct": "known_context_deployed"}
_ATTACK_TPR = re.compile(rf"^((?:known_context_)?(?:{'|'.join(values(Attack))}))_tpr_at_1pct$")
# how the table is grouped, and the settings a frontier point stands for (iclmem.record)
GROUP = FRONTIER_GROUP
SETTING = FRONTIER_SETTING


def _recipe(options: object) -> str:
    """The ``recipe`` in a row's ``model_options`` JSON (iclmem's own loop when absent)."""
    import json

    try:
        parsed = json.loads(options) if isinstance(options, str) else {}
    except ValueError:
        parsed = {}
    return str(parsed.get("recipe", Recipe.ICLMEM.value)) if isinstance(parsed, dict) else Recipe.ICLMEM.value


def leakage_columns(results: pd.DataFrame) -> dict[str, str]:
    """{column: attack name} of every TPR-at-1%-FPR column ``results`` holds: IclMem's ``tpr_at_1pct``, the
    known-context attack's (on the network and as deployed) and each reference-model attack's."""
    out = {"tpr_at_1pct": ICLMEM_ATTACK} if "tpr_at_1pct" in results.columns else {}
    out.update({c: name for c, name in KNOWN_CONTEXT_ATTACKS.items() if c in results.columns})
    for column in results.columns:
        match = _ATTACK_TPR.match(str(column))
        if match:
            out[str(column)] = match.group(1)
    return out


def _dominated(utility: np.ndarray, leakage: np.ndarray) -> np.ndarray:
    """bool [n]: point i is beaten by another on both axes (utility at least as high and leakage at most as
    high, one of them strictly)."""
    u, lk = utility[:, None], leakage[:, None]
    better = (utility[None, :] >= u) & (leakage[None, :] <= lk) & ((utility[None, :] > u) | (leakage[None, :] < lk))
    return np.asarray(better.any(axis=1), dtype=bool)


def frontier_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per checkpoint of a true-label fine-tuned run with both numbers: the group (task, model,
    regime; collapsed checkpoints left out), the setting (lr, Q, epoch, target ε or inf without DP), ``heldout_accuracy``,
    ``leakage_tpr_at_1pct`` and ``strongest_attack``, and ``on_frontier`` (no checkpoint of the same group
    has at least its accuracy and at most its leakage, one of them strictly). Ordered by group, then
    leakage. Empty when the results hold no utility or leakage column."""
    tpr = leakage_columns(results)
    if UTILITY not in results.columns or not tpr:
        return pd.DataFrame()
    keep = [c for c in (*FRONTIER_REPORT_COLUMNS, *tpr) if c in results.columns]
    df = results.loc[:, keep].copy()
    if "sanity_check" in df.columns:
        df = df[~df["sanity_check"].fillna(False).astype(bool)]
    if "label_mode" in df.columns:
        df = df[df["label_mode"].astype(str) == LabelMode.NORMAL.value]
    if "outcome" in df.columns:  # a collapsed checkpoint is no setting to pick
        df = df[df["outcome"].astype(str) != Outcome.COLLAPSE.value]
    leak = df[list(tpr)].astype(float)
    utility = df[UTILITY].astype(float)
    if DEPLOYED_UTILITY in df.columns:  # recipe upstream: as the package deploys the weights
        utility = df[DEPLOYED_UTILITY].astype(float).where(df[DEPLOYED_UTILITY].notna(), utility)
    usable = utility.notna() & leak.notna().any(axis=1)
    df, leak, utility = df[usable], leak[usable], utility[usable]
    if df.empty:
        return pd.DataFrame()
    df = df.assign(recipe=df["model_options"].map(_recipe) if "model_options" in df.columns else Recipe.ICLMEM.value)
    df = df.assign(heldout_accuracy=utility, leakage_tpr_at_1pct=leak.max(axis=1),
                   strongest_attack=leak.idxmax(axis=1).map(tpr))
    if "dp_target_epsilon" not in df.columns:
        df["dp_target_epsilon"] = math.inf
    df["dp_target_epsilon"] = df["dp_target_epsilon"].astype(float).fillna(math.inf)
    for col in (*GROUP, *SETTING):  # a results table without an axis (a hand-built one) has one value of it
        if col not in df.columns:
            df[col] = "" if col in GROUP else math.nan
    df["on_frontier"] = False
    for _, idx in df.groupby(list(GROUP), sort=False).groups.items():
        part = df.loc[idx]
        df.loc[idx, "on_frontier"] = ~_dominated(part["heldout_accuracy"].to_numpy(float),
                                                 part["leakage_tpr_at_1pct"].to_numpy(float))
    columns = [*GROUP, "run_id", *SETTING, "heldout_accuracy", "leakage_tpr_at_1pct", "strongest_attack", "on_frontier"]
    table = df.loc[:, [c for c in columns if c in df.columns]]
    table = table.sort_values([*GROUP, "leakage_tpr_at_1pct", "heldout_accuracy"],
                              ascending=[True] * (len(GROUP) + 1) + [False])
    return table.reset_index(drop=True)


def frontier_figure(table: pd.DataFrame, path: str | Path) -> Path | None:
    """Held-out accuracy against leakage for every checkpoint of :func:`frontier_table` (one panel per task,
    one colour per model and recipe), the frontier joined by a line. None (nothing written) when empty."""
    if table.empty:
        return None
    from matplotlib.figure import Figure

    tasks = sorted(table["task"].astype(str).unique())
    fig = Figure(figsize=(4.2 * len(tasks) + 1.0, 4.0), layout="constrained")
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks, strict=True):
        part = table[table["task"].astype(str) == task]
        for i, ((model, recipe, regime), group) in enumerate(part.groupby(list(FRONTIER_LINE), sort=True)):
            colour = f"C{i % 10}"
            # clip_on False: a setting no attack finds anything in sits at leakage 0, on the axis itself
            ax.scatter(group["leakage_tpr_at_1pct"], group["heldout_accuracy"], s=18, alpha=0.5, color=colour,
                       clip_on=False, zorder=3)
            front = group[group["on_frontier"]].sort_values("leakage_tpr_at_1pct")
            ax.plot(front["leakage_tpr_at_1pct"], front["heldout_accuracy"], marker="o", color=colour, clip_on=False,
                    zorder=4,
                    label=f"{model} {regime}" + (f" ({recipe} recipe)" if recipe != Recipe.ICLMEM.value else ""))
        ax.axvline(0.01, color="grey", linewidth=0.8, linestyle=":")  # TPR = FPR: an attack that sees nothing
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_xlim(left=0, right=1.05)
        ax.set_xlabel("strongest attack: TPR at 1% FPR")
        ax.set_ylabel("held-out accuracy")
        ax.set_title(task)
        ax.legend(fontsize=7, loc="lower right")
    return save_png(fig, path)


def _collapsed_checkpoints(results: pd.DataFrame) -> int:
    """True-label fine-tuned checkpoints with outcome collapse (what the frontier leaves out)."""
    if "outcome" not in results.columns:
        return 0
    df = results[results["outcome"].astype(str) == Outcome.COLLAPSE.value]
    if "sanity_check" in df.columns:
        df = df[~df["sanity_check"].fillna(False).astype(bool)]
    if "label_mode" in df.columns:
        df = df[df["label_mode"].astype(str) == LabelMode.NORMAL.value]
    return len(df)


def frontier_section_html(results: pd.DataFrame, figure_dir: str | Path) -> str:
    """The report's frontier section: what the axes are, the frontier's settings per group, the figure
    (written to ``figure_dir / FRONTIER_FIGURE``). Empty string when no checkpoint has both numbers."""
    table = frontier_table(results)
    if table.empty:
        return ""
    figure = frontier_figure(table, Path(figure_dir) / FRONTIER_FIGURE)
    front = table[table["on_frontier"]].drop(columns=["on_frontier"]).copy()
    front["dp_target_epsilon"] = front["dp_target_epsilon"].map(lambda v: "no DP" if math.isinf(v) else f"{v:g}")
    for col in ("heldout_accuracy", "leakage_tpr_at_1pct"):
        front[col] = front[col].map(lambda v: f"{v:.3f}")
    attacks = ", ".join(sorted(set(table["strongest_attack"].astype(str))))
    collapsed = _collapsed_checkpoints(results)
    note = (f"Every checkpoint of a fine-tuned run on true labels ({len(table)}"
            + (f"; {collapsed} collapsed checkpoint(s) left out: no setting to pick" if collapsed else "")
            + "), by held-out accuracy (in-context "
            "accuracy on the non-members, rows it never trained on; as the package deploys the weights for recipe "
            "upstream) against the strongest attack's TPR at 1% FPR "
            f"(here among: {attacks}). The rows below are the frontier: no other setting of the same task, model "
            "recipe and regime has at least their accuracy and at most their leakage. A TPR near 0.01 is what an attack "
            "blind to membership gets at 1% FPR.")
    return section_html("Leakage–utility frontier", [paragraph(note), html_table(front)], figure_dir, figure,
                        "held-out accuracy against TPR at 1% FPR")
