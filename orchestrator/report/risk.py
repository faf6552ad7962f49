"""The report's first screen for the data owner: which rows are most at risk, which groups leak more than the
rest, and through which channel (the tables of :mod:`orchestrator.record_risk`). Row ids and group names only,
never a row's values."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from iclmem.record import CHECKPOINT_ID, SLICE_AUDIT_KEY
from iclmem.vocab import Channel
from orchestrator.record_risk import HIGH_RISK, audited_rows
from orchestrator.report.page import df_to_html, note_html
from orchestrator.report.parts import img_tag, save_png

__all__ = ["RISK_FIGURE", "channel_summary", "crossing_table", "risk_by_slice_figure", "risk_section_html", "worst_runs"]

RISK_FIGURE = "risk_by_slice.png"
_CHANNEL_WORDS = {Channel.FINE_TUNED_WEIGHTS.value: "the fine-tuned weights",
                  Channel.DEPLOYED_CONTEXT.value: "the deployed context"}


def worst_runs(slice_risk: pd.DataFrame) -> pd.DataFrame:
    """Per task and channel, the (run, attack) whose overall AUC is highest: the slices the figure shows. Its
    overall AUC is estimated from the slice table alone: per slice family, the mean of the slice AUCs weighted by
    their member x non-member pairs, and the largest of those over the families."""
    if slice_risk.empty:
        return slice_risk
    scored = slice_risk.dropna(subset=["auc"])
    if scored.empty:
        return scored
    # each family splits the audit's rows: the size-weighted mean of a family's slice AUCs tracks the audit's
    family = scored.groupby([*SLICE_AUDIT_KEY, "family"], sort=False).apply(
        lambda g: float(np.average(g["auc"], weights=g["n_members"] * g["n_nonmembers"])), include_groups=False)
    overall = family.groupby(level=list(range(len(SLICE_AUDIT_KEY)))).max().rename("overall_auc").reset_index()
    best = overall.sort_values("overall_auc", ascending=False, kind="mergesort").drop_duplicates(["task", "channel"])
    return best.reset_index(drop=True)


def channel_summary(records: pd.DataFrame) -> pd.DataFrame:
    """Per task and channel: audits, the highest member-vs-non-member AUC of any attack at any audit, and the
    members whose risk reaches :data:`HIGH_RISK` somewhere (P(member | score) at the audit's share of members)."""
    from iclmem.stats import auc

    records = audited_rows(records)
    if records.empty:
        return pd.DataFrame()
    rows = []
    for (task, channel), group in records.groupby(["task", "channel"], sort=True):
        aucs = []
        for _, audit in group.groupby([*CHECKPOINT_ID, "attack"], sort=False):
            finite = audit[np.isfinite(audit["score"].to_numpy(np.float64))]
            m = finite["member"].to_numpy(bool)
            if m.any() and (~m).any():
                aucs.append(auc(finite["score"].to_numpy(np.float64)[m], finite["score"].to_numpy(np.float64)[~m]))
        high = group[group["member"] & (group["risk"] >= HIGH_RISK)]
        rows.append({"task": task, "channel": channel, "audits": int(group["run_id"].nunique()),
                     "highest_auc": max(aucs) if aucs else float("nan"),
                     "members_at_high_risk": int(high["row_id"].nunique()),
                     "members_audited": int(group.loc[group["member"], "row_id"].nunique())})
    return pd.DataFrame(rows)


def risk_by_slice_figure(slice_risk: pd.DataFrame, path: Path) -> Path | None:
    """Per task and channel, the worst run's slice AUCs with their 95% intervals, the null splits' band of the
    same slice (grey) and chance (dashed); a star marks a slice that leaks more than the rest (Holm)."""
    from matplotlib.figure import Figure

    worst = worst_runs(slice_risk)
    if worst.empty:
        return None
    panels = []
    for _, w in worst.iterrows():
        rows = slice_risk[(slice_risk["task"] == w["task"]) & (slice_risk["channel"] == w["channel"])
                          & (slice_risk["run_id"] == w["run_id"]) & (slice_risk["attack"] == w["attack"])]
        rows = rows.dropna(subset=["auc"])
        if not rows.empty:
            panels.append((w, rows))
    if not panels:
        return None
    heights = [max(1.5, 0.32 * len(rows) + 0.8) for _, rows in panels]
    fig = Figure(figsize=(8.5, sum(heights) + 0.6))
    axes = fig.subplots(len(panels), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for ax, (w, rows) in zip(axes, panels, strict=True):
        y = np.arange(len(rows))[::-1]
        low = rows["null_auc_low"].to_numpy(np.float64)
        high = rows["null_auc_high"].to_numpy(np.float64)
        for yi, lo, hi in zip(y, low, high, strict=True):
            if np.isfinite(lo) and np.isfinite(hi):
                ax.fill_betweenx([yi - 0.35, yi + 0.35], lo, hi, color="0.85", linewidth=0)
        auc_values = rows["auc"].to_numpy(np.float64)
        err = np.vstack([auc_values - rows["auc_low"].to_numpy(np.float64),
                         rows["auc_high"].to_numpy(np.float64) - auc_values])
        ax.errorbar(auc_values, y, xerr=np.where(np.isfinite(err), err, 0.0), fmt="o", color="C3", capsize=3)
        for yi, more, a in zip(y, rows["leaks_more"].astype(bool), auc_values, strict=True):
            if more:
                ax.annotate("*", (a, yi), textcoords="offset points", xytext=(6, 2), fontsize=13, color="C3")
        ax.axvline(0.5, color="k", linestyle="--", linewidth=0.8)
        labels = [f"{s} ({m}/{n})" for s, m, n in zip(rows["slice"], rows["n_members"], rows["n_nonmembers"],
                                                      strict=True)]
        ax.set_yticks(y, labels, fontsize=7)
        ax.set_xlim(0.0, 1.0)
        ax.set_title(f"{w['task']}, through {_CHANNEL_WORDS.get(str(w['channel']), w['channel'])} "
                     f"(attack {w['attack']})\nrun {w['run_id']}", fontsize=8)
    axes[-1].set_xlabel("membership AUC in the slice (members/non-members)\n"
                        "grey: null splits' 95% band; *: leaks more than the rest", fontsize=8)
    fig.tight_layout()
    return save_png(fig, path)


# the stratum of the other channel's membership a crossing cell is measured in: held by the other channel or not
_HELD_BY_OTHER = {"in_context": True, "fine_tuned": True, "not_in_context": False, "not_fine_tuned": False}


def crossing_table(crossing: pd.DataFrame) -> pd.DataFrame:
    """The channel crossing as one line per (run, channel, attack): its AUC among the rows the other channel holds
    and among the rows it does not, each with its interval."""
    def fmt(r: Any) -> str:
        return f"{r['auc']:.3f} [{r['auc_low']:.3f}, {r['auc_high']:.3f}]" if np.isfinite(r["auc"]) else "n/a"

    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for _, r in crossing.iterrows():
        key = (r["task"], r["run_id"], r["epoch"], r["channel"], r["attack"])
        line = rows.setdefault(key, {"task": r["task"], "run_id": r["run_id"], "epoch": r["epoch"],
                                     "channel": _CHANNEL_WORDS.get(str(r["channel"]), r["channel"]),
                                     "attack": r["attack"]})
        held = _HELD_BY_OTHER[str(r["stratum"])]
        line["AUC among rows the other channel holds" if held else "AUC among rows it does not"] = fmt(r)
    return pd.DataFrame(list(rows.values()))


def _fmt_slices(text: Any, limit: int = 120) -> str:
    s = "" if text is None or (isinstance(text, float) and np.isnan(text)) else str(text)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def risk_section_html(tables: dict[str, pd.DataFrame | None], figure_dir: Path, *, draw: bool = True) -> str:
    """The section: which channel dominates, the figure, the riskiest rows and the slices that leak more;
    empty when the sweep wrote no per-record table. ``tables``: ``records``, ``slice_risk``, ``riskiest``,
    ``stability``, ``canaries`` (None for a file not written); ``draw``: write the figure."""
    records = tables.get("records")
    if records is None or records.empty:
        return ""
    blocks = ["<h2>Whose rows leak (for the data owner)</h2>",
              "<p class=\"caption\">Each audited row's risk is the probability that it was a member given its "
              "membership score, learnt from the audit's other rows (docs/METHOD.md, \"Per-record risk\"); 0.5 is "
              "a coin flip at the audit's even prior. Row ids name rows of the source table; no row's values are "
              "in this report.</p>"]
    summary = channel_summary(records)
    if not summary.empty:
        lead = summary.sort_values("highest_auc", ascending=False, kind="mergesort").drop_duplicates("task")
        lines = []
        for _, r in lead.iterrows():
            others = summary[(summary["task"] == r["task"]) & (summary["channel"] != r["channel"])]
            versus = "" if others.empty else (
                f" against {float(others['highest_auc'].max()):.3f} through "
                f"{_CHANNEL_WORDS.get(str(others['channel'].iloc[0]), others['channel'].iloc[0])}")
            lines.append(f"<li>{html.escape(str(r['task']))}: membership leaks most through "
                         f"{html.escape(_CHANNEL_WORDS.get(str(r['channel']), str(r['channel'])))} (highest AUC "
                         f"{float(r['highest_auc']):.3f}{html.escape(versus)}); {int(r['members_at_high_risk'])} of "
                         f"{int(r['members_audited'])} member rows reach a risk of {HIGH_RISK:g} in some audit.</li>")
        blocks.append("<ul>" + "".join(lines) + "</ul>")
    crossing = tables.get("crossing")
    if crossing is not None and not crossing.empty:
        blocks.append("<p>Two channels, same rows (<code>probe.two_channels</code>): each fine-tuned run was also "
                      "deployed with a context of half its member and half its non-member rows. Each channel's AUC "
                      "is measured among the rows the other channel holds and among those it does not (95% "
                      "intervals): a context channel stronger on rows fine-tuned on means fine-tuning on a row also "
                      "raised its exposure through the deployed context.</p>")
        blocks.append(df_to_html(crossing_table(crossing)))
    values = tables.get("value_slices")
    if values is not None and not values.empty:
        exposed = values[values["exposed"].astype(bool)]
        blocks.append("<p>Values given away, by slice (<code>probe.value_inference</code>): for each deployed-context "
                      "audit and value attack, the members' gain (label: accuracy over the same model without the "
                      "row; attribute: over imputation) and its difference to the non-members', on each slice's rows, "
                      "intervals at the Bonferroni level over the audit's slices. "
                      + (f"{len(exposed)} slice result(s) exposed (both lower bounds above 0)." if not exposed.empty
                         else "No slice is exposed (both lower bounds above 0) in any audit.") + "</p>")
        cols = ["task", "run_id", "attack", "family", "slice", "n_members", "n_nonmembers", "members_gain",
                "members_gain_low", "gain_difference", "gain_difference_low", "exposed"]
        shown = values.sort_values(["exposed", "gain_difference"], ascending=False, kind="mergesort").head(20)
        blocks.append(df_to_html(shown[cols]))
    slice_risk = tables.get("slice_risk")
    if slice_risk is not None and not slice_risk.empty:
        figure = risk_by_slice_figure(slice_risk, figure_dir / RISK_FIGURE) if draw else None
        if figure is not None:
            blocks.append(img_tag(figure_dir, figure, "Membership AUC by slice with the null band"))
        flagged = slice_risk[slice_risk["leaks_more"].astype(bool) | slice_risk["exposed"].astype(bool)]
        if flagged.empty:
            blocks.append(note_html("No slice of any run leaks more than the rest of its rows, and none is exposed "
                                    "on its own, after Holm's correction over the run's slices."))
        else:
            cols = ["task", "run_id", "attack", "family", "slice", "n_members", "n_nonmembers", "auc", "auc_low",
                    "auc_high", "auc_rest", "p_more_holm", "leaks_more", "p_holm", "null_fpr", "tpr_at_1pct",
                    "epsilon_lb"]
            shown = flagged.sort_values(["leaks_more", "auc"], ascending=False, kind="mergesort").head(30)
            blocks.append("<p>Slices exposed on their own (p_holm) or leaking more than the rest of the run's rows "
                          "(p_more_holm), Holm-corrected over the run's slices; null_fpr: how often the same test "
                          "fired on null splits of the slice's non-members (rows no model trained on).</p>")
            blocks.append(df_to_html(shown[[c for c in cols if c in shown.columns]]))
    riskiest = tables.get("riskiest")
    if riskiest is not None and not riskiest.empty:
        shown = riskiest.copy()
        if "slices" in shown.columns:
            shown["slices"] = shown["slices"].map(_fmt_slices)
        blocks.append("<p>The riskiest member rows of each task: their highest risk over every audit and attack "
                      "(at each run's headline checkpoint), and the slices they belong to.</p>")
        blocks.append(df_to_html(shown))
    canaries = tables.get("canaries")
    if canaries is not None and not canaries.empty:
        blocks.append("<p>Ground truth for the ranking: the inserted canaries ranked among the member rows by their "
                      "membership score (precision@k, k = the inserted canaries; chance is their share), and their "
                      "AUC against the held-out canaries, at each run's headline checkpoint.</p>")
        blocks.append(df_to_html(canaries))
    stability = tables.get("stability")
    if stability is not None and not stability.empty:
        keys = [c for c in ("between", "attack") if c in stability.columns]
        st = (stability.groupby(keys, sort=True)
              .agg(pairs=("run_a", "size"), median_spearman=("spearman", "median"),
                   median_top_k_overlap=("top_k_overlap", "median"), median_common_rows=("n_common", "median"))
              .reset_index())
        blocks.append("<p>Stability of the ranking (Spearman correlation of the risks; share of one ranking's top k "
                      "in the other's): between <em>seeds</em>, runs of one configuration drawn with other seeds, "
                      "compared on the rows both trained on; between <em>reference sets</em>, a context audit's "
                      "members scored against two disjoint halves of its reference contexts. A ranking that does not "
                      "recur is a property of the draw, not of the row.</p>")
        blocks.append(df_to_html(st))
    return "\n".join(blocks)
