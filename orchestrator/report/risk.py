"""The report's first screen for the data owner: which rows are most at risk, which groups leak more than the
rest, and through which channel (the tables of :mod:`orchestrator.report.record_risk`). Row ids and group names only,
never a row's values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from iclmem.record import CHECKPOINT_ID, SLICE_AUDIT_KEY
from iclmem.vocab import Channel
from orchestrator.report.page import df_to_html, note_html
from orchestrator.report.parts import img_tag, save_png
from orchestrator.report.record_risk import HIGH_RISK, audited_rows

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
        target = str(r.get("target", "deployed"))
        key = (r["task"], r["run_id"], r["epoch"], r["channel"], r["attack"], target)
        line = rows.setdefault(key, {"task": r["task"], "run_id": r["run_id"], "epoch": r["epoch"],
                                     "channel": _CHANNEL_WORDS.get(str(r["channel"]), r["channel"]),
                                     "context": ("the deployed context" if target == "deployed"
                                                 else "control: a context of rows never audited"),
                                     "attack": r["attack"]})
        held = _HELD_BY_OTHER[str(r["stratum"])]
        line["AUC among rows the other channel holds" if held else "AUC among rows it does not"] = fmt(r)
    return pd.DataFrame(list(rows.values()))


def auc_with_interval(auc: Any, low: Any, high: Any) -> str:
    """"0.812 [0.700, 0.900]"; the AUC alone when the interval did not vary (a bootstrap of too few rows gives
    [1.000, 1.000]: that is not an interval) or is missing."""
    a, lo, hi = (float(v) if v is not None and pd.notna(v) else float("nan") for v in (auc, low, high))
    if not np.isfinite(a):
        return "n/a"
    if np.isfinite(lo) and np.isfinite(hi) and hi > lo:
        return f"{a:.3f} [{lo:.3f}, {hi:.3f}]"
    return f"{a:.3f} (too few rows for an interval)"


def slice_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Flagged slice results in words: which slice of which run, its rows, AUC with its interval, the two tests
    and what null rows gave for the same slice."""
    def null_text(r: Any) -> str:
        if int(r.get("null_splits", 0) or 0) == 0 or pd.isna(r.get("null_fpr")):
            return "not measured"
        return f"{float(r['null_fpr']):.2f} of {int(r['null_splits'])}"

    return pd.DataFrame({
        "task": rows["task"], "slice": rows["slice"], "attack": rows["attack"],
        "channel": [_CHANNEL_WORDS.get(str(c), str(c)) for c in rows["channel"]],
        "members / non-members": [f"{int(m)} / {int(n)}" for m, n in zip(rows["n_members"], rows["n_nonmembers"],
                                                                          strict=True)],
        "AUC [95% interval]": [auc_with_interval(a, lo, hi) for a, lo, hi in
                               zip(rows["auc"], rows["auc_low"], rows["auc_high"], strict=True)],
        "rest of the run's rows": [f"{float(a):.3f}" if pd.notna(a) else "n/a" for a in rows["auc_rest"]],
        "exposed": rows["exposed"].astype(bool), "leaks more": rows["leaks_more"].astype(bool),
        "null rows flagged": [null_text(r) for _, r in rows.iterrows()],
        "run": rows["run_id"]})


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
    # the headline counts (rows at risk, runs and slices flagged) are claims: the ledger above states them with
    # their null rates; this section holds the tables they come from
    crossing = tables.get("crossing")
    if crossing is not None and not crossing.empty:
        blocks.append("<p>Two channels, same rows (<code>probe.two_channels</code>): each fine-tuned run was also "
                      "deployed with a context of half its member and half its non-member rows. The deployed "
                      "context's attacks are measured among the rows the run was fine-tuned on and among those it "
                      "was not (95% intervals), beside the same attacks with the control in the context's place (a "
                      "context of rows the run never saw, the deployed context's label counts): none of the audited "
                      "rows is in the control, so its AUCs are what the channel reads by chance. The weights' "
                      "attacks never read the context, so their cells within its strata would be equal by "
                      "construction and are not shown.</p>")
        blocks.append(df_to_html(crossing_table(crossing)))
    values = tables.get("value_slices")
    if values is not None and not values.empty:
        exposed = values[values["exposed"].astype(bool)]
        blocks.append("<p>Values given away, by slice (<code>probe.value_inference</code>): for each deployed-context "
                      "audit and value attack, the members' gain (label: accuracy over the same model without the "
                      "row; attribute: over imputation) and its difference to the non-members', on each slice's rows, "
                      "each tested exactly or by permutation at the Bonferroni level over the audit's testable slices; "
                      "a slice with too few rows a side is not tested. "
                      + (f"{len(exposed)} slice result(s) exposed (both tests clear the level)." if not exposed.empty
                         else "No slice is exposed in any audit.") + "</p>")
        cols = ["task", "run_id", "attack", "family", "slice", "n_members", "n_nonmembers", "members_gain",
                "gain_difference", "p_members", "p_difference", "level", "too_small", "exposed"]
        shown = values.sort_values(["exposed", "gain_difference"], ascending=False, kind="mergesort").head(20)
        blocks.append(df_to_html(shown[[c for c in cols if c in shown.columns]]))
    slice_risk = tables.get("slice_risk")
    if slice_risk is not None and not slice_risk.empty:
        figure = risk_by_slice_figure(slice_risk, figure_dir / RISK_FIGURE) if draw else None
        if figure is not None:
            blocks.append(img_tag(figure_dir, figure, "Membership AUC by slice with the null band"))
        flagged = slice_risk[slice_risk["leaks_more"].astype(bool) | slice_risk["exposed"].astype(bool)]
        if flagged.empty:
            blocks.append(note_html("No slice of any run leaks more than the rest of its rows, and none is exposed "
                                    "on its own, after the correction over each run's whole family of slice tests "
                                    "(every attack, channel and slice, and the headline's selection)."))
        else:
            shown = flagged.sort_values(["leaks_more", "auc"], ascending=False, kind="mergesort").head(30)
            blocks.append("<p>Slices flagged (exposed on its own, or leaking more than the rest of the run's rows), "
                          "corrected over the run's whole family; <em>null rows flagged</em>: how often the same "
                          "slice was flagged on null splits (rows no model trained on) through the same tests.</p>")
            blocks.append(df_to_html(slice_table(shown)))
    riskiest = tables.get("riskiest")
    if riskiest is not None and not riskiest.empty:
        shown = riskiest.copy()
        if "slices" in shown.columns:
            shown["slices"] = shown["slices"].map(_fmt_slices)
        if "score" in shown.columns:  # a shift of 1e-5 nats prints as 0.000 at three decimals: significant digits
            shown["score"] = shown["score"].map(lambda v: f"{float(v):.3g}" if pd.notna(v) else "n/a")
        blocks.append("<p>The riskiest member rows of each task: their highest risk over every audit and attack "
                      "(at each run's headline checkpoint), the score that put them there (in its own units: a "
                      "score of 1e-5 nats is a model that barely moved, whatever the risk), and the slices they "
                      "belong to. A risk is a rank among the audit's rows; how many rows reach a high risk by chance "
                      "is the claim ledger's <code>rows_at_risk</code> above.</p>")
        blocks.append(df_to_html(shown))
    canaries = tables.get("canaries")
    if canaries is not None and not canaries.empty:
        blocks.append("<p>Ground truth for the ranking, per copy count: the inserted canaries of that count ranked "
                      "among the member rows and themselves by their membership score (precision@k, k = those "
                      "canaries; chance is their share of the ranked rows), and their AUC against the held-out "
                      "canaries, at each run's headline checkpoint. A canary trained on more often should rank "
                      "higher.</p>")
        blocks.append(df_to_html(canaries))
    stability = tables.get("stability")
    if stability is not None and not stability.empty:
        keys = [c for c in ("between", "attack") if c in stability.columns]
        st = (stability.groupby(keys, sort=True)
              .agg(pairs=("run_a", "size"), median_spearman=("spearman", "median"),
                   median_top_k_overlap=("top_k_overlap", "median"), median_common_rows=("n_common", "median"))
              .reset_index())
        blocks.append("<p>Stability of the ranking (Spearman correlation of the membership scores; share of one "
                      "ranking's top k scores in the other's): between <em>seeds</em>, runs of one configuration "
                      "drawn with other seeds, compared on the rows both trained on; between <em>reference "
                      "sets</em>, a context audit's members scored against two disjoint halves of its reference "
                      "contexts (attacks that read no reference, such as the plain loss, are left out: their halves "
                      "are equal by construction). A ranking that does not recur is a property of the draw, not of "
                      "the row.</p>")
        blocks.append(df_to_html(st))
    return "\n".join(blocks)
