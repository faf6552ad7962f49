"""The report's privacy section: ε and μ lower bounds (every run) and DP-SGD utility and verdict against ε.

Reads only the columns listed in :data:`EPSILON_REPORT_COLUMNS` (ids, config, metrics, verdicts: the same
rule as ``iclmem.record``'s public columns), so no raw value can reach the page. The columns come from
``orchestrator.report.epsilon_columns.epsilon_columns`` (classic ε_lb, run headline ε_lb, GDP μ_lb and its ε where the
training is Gaussian, the accountant's figures, the consistency flags and their level), the run identity
(``dp_*`` of DP-SGD runs), the canaries' one-run bound (``one_run_*``) and, when the probe adds them, the
utility columns (``member_icl_accuracy``, ``nonmember_icl_accuracy``; ``trainables.finetune.icl_utility``).

Each bound is stated at its own δ: the classic and GDP ε at ``epsilon_lb_delta`` (``outcome.epsilon_delta``),
the one-run ε at ``one_run_delta`` (``canaries.delta``); μ has no δ.

* :func:`epsilon_table` -- one row per run: target ε, accountant ε, run-headline ε_lb, the last checkpoint's
  GDP and one-run bounds, verdict at the last checkpoint, utility, consistency;
* :func:`epsilon_figure` -- ε_lb over epochs, one line per run, the accountant's ε dashed beside DP runs;
* :func:`epsilon_section_html` -- both as an HTML fragment for the report page (empty when the results
  hold no ε column).
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import pandas as pd

from iclmem.record import CHECKPOINT_KEY, EPSILON_TABLE_ORDER, NEIGHBOURS, RUN_KEY
from iclmem.vocab import SCORE_KINDS
from orchestrator.report.epsilon_columns import BEYOND_CHANCE_LEVEL, CONSISTENCY_LEVEL
from orchestrator.report.parts import paragraph, save_png, section_html

__all__ = ["EPSILON_REPORT_COLUMNS", "epsilon_public", "epsilon_table", "epsilon_figure", "epsilon_section_html",
           "EPSILON_FIGURE"]

EPSILON_FIGURE = "epsilon_over_epochs.png"

EPSILON_REPORT_COLUMNS: tuple[str, ...] = (
    *CHECKPOINT_KEY, "outcome", "sanity_check",
    "epsilon_lb", "epsilon_lb_kind", "epsilon_lb_delta", "run_epsilon_lb", "run_epsilon_lb_epoch",
    "run_epsilon_lb_kind", "dp_target_epsilon", "dp_delta", "dp_max_grad_norm", "dp_noise_multiplier",
    "dp_accountant", "dp_epsilon", "dp_steps", "epsilon_consistent", "member_icl_accuracy", "nonmember_icl_accuracy",
    *(f"calibrated_{k.value}_epsilon_lb" for k in SCORE_KINDS),
    "dp_epsilon_replace_one", "dp_mu", "dp_mu_replace_one", "gdp_mu_lb", "gdp_mu_lb_kind", "gdp_epsilon_lb",
    "gdp_consistent", "one_run_epsilon_lb", "one_run_delta", "one_run_beta", "one_run_m", "one_run_consistent",
    "canary_p_value", "canary_detected", "gdp_epsilon_lb_withheld", "consistency_level",
)


def _float(row: pd.Series, column: str) -> float:
    value = row.get(column, math.nan)
    return float(value) if pd.notna(value) else math.nan


def epsilon_public(results: pd.DataFrame) -> pd.DataFrame:
    """``results`` reduced to the columns this section reads."""
    return results.loc[:, [c for c in EPSILON_REPORT_COLUMNS if c in results.columns]].copy()


def _fine_tuned(df: pd.DataFrame) -> pd.DataFrame:
    if "sanity_check" in df.columns:
        df = df[~df["sanity_check"].fillna(False).astype(bool)]
    return df


def epsilon_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per fine-tuned run (``run_id``, ``task``), ordered by task, label mode and target ε (no DP
    last): its last checkpoint's verdict, accountant ε and utility, and its headline ε_lb (the maximum over
    checkpoints and competing kinds, with the epoch). ``consistent``: False if any consistency check of the
    run (every checkpoint's classic, GDP and one-run checks, sharing the level
    ``orchestrator.report.epsilon_columns.CONSISTENCY_LEVEL``) found a bound above the accountant's figure."""
    df = _fine_tuned(epsilon_public(results))
    if df.empty or "epsilon_lb" not in df.columns:
        return pd.DataFrame()
    rows = []
    for (run_id, task), group in df.groupby(list(RUN_KEY), sort=False):
        last = group.loc[group["epoch"].astype(int).idxmax()]
        target = last.get("dp_target_epsilon", math.nan)
        flags = pd.concat([group[c].dropna() for c in ("epsilon_consistent", "gdp_consistent", "one_run_consistent")
                           if c in group.columns] or [pd.Series([], dtype=object)])
        rows.append({
            "task": task, "run_id": run_id, "label_mode": last.get("label_mode"), "lr": last.get("lr"),
            "dp_target_epsilon": float(target) if pd.notna(target) else math.inf,
            "dp_epsilon": float(last["dp_epsilon"]) if pd.notna(last.get("dp_epsilon", math.nan)) else math.nan,
            "epoch": int(last["epoch"]), "outcome": last["outcome"],
            "run_epsilon_lb": float(last["run_epsilon_lb"]) if pd.notna(last.get("run_epsilon_lb")) else math.nan,
            "run_epsilon_lb_epoch": (int(last["run_epsilon_lb_epoch"]) if pd.notna(last.get("run_epsilon_lb_epoch"))
                                     else None),  # stored as a float so the column keeps one dtype
            "epsilon_lb_delta": last.get("epsilon_lb_delta"),
            "member_icl_accuracy": last.get("member_icl_accuracy", math.nan),
            "nonmember_icl_accuracy": last.get("nonmember_icl_accuracy", math.nan),
            "consistent": None if flags.empty else bool(flags.astype(bool).all()),
            # the last checkpoint's Gaussian-DP and one-run bounds (the released model: no selection over
            # checkpoints), beside the accountant's figures for the same neighbour relation
            "dp_epsilon_replace_one": _float(last, "dp_epsilon_replace_one"),
            "gdp_mu_lb": _float(last, "gdp_mu_lb"), "dp_mu_replace_one": _float(last, "dp_mu_replace_one"),
            "gdp_epsilon_lb": _float(last, "gdp_epsilon_lb"),
            "one_run_epsilon_lb": _float(last, "one_run_epsilon_lb"),
            "one_run_delta": _float(last, "one_run_delta"),
            "canary_p_value": _float(last, "canary_p_value"),
        })
    table = pd.DataFrame(rows)
    return table.sort_values(list(EPSILON_TABLE_ORDER)).reset_index(drop=True)


def epsilon_figure(results: pd.DataFrame, path: str | Path) -> Path | None:
    """ε_lb of each fine-tuned run over its checkpoints' epochs (solid), and for DP runs the accountant's ε
    at each checkpoint (dashed, same colour). None (nothing written) without an ε column."""
    df = _fine_tuned(epsilon_public(results))
    if df.empty or "epsilon_lb" not in df.columns or df["epsilon_lb"].isna().all():
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for i, ((run_id, task), group) in enumerate(df.groupby(list(RUN_KEY), sort=True)):
        group = group.sort_values("epoch")
        colour = f"C{i % 10}"
        target = group["dp_target_epsilon"].iloc[0] if "dp_target_epsilon" in group.columns else math.nan
        # the run id's hash tail tells apart runs that differ only in axes not named here
        label = (f"{task} {group['label_mode'].iloc[0]} lr={float(group['lr'].iloc[0]):g} "
                 + (f"DP ε={float(target):g}" if pd.notna(target) else "no DP") + f" ({str(run_id)[-6:]})")
        # clip_on False: ε_lb is 0 wherever the audit finds nothing, and a line on the axis must still show
        ax.plot(group["epoch"], group["epsilon_lb"], marker="o", color=colour, label=label, clip_on=False, zorder=3)
        if "dp_epsilon" in group.columns and group["dp_epsilon"].notna().any():
            ax.plot(group["epoch"], group["dp_epsilon"], linestyle="--", marker="_", markersize=12, color=colour,
                    alpha=0.7)
        if "epsilon_consistent" in group.columns:
            bad = group[group["epsilon_consistent"].map(lambda v: v is False)]
            ax.scatter(bad["epoch"], bad["epsilon_lb"], marker="x", s=90, color="#b00", zorder=5)
    delta = df["epsilon_lb_delta"].dropna()
    ax.set_xlabel("epoch")
    ax.set_ylabel("ε lower bound" + (f" (δ = {float(delta.iloc[0]):g})" if not delta.empty else ""))
    ax.set_title("Audited ε lower bound over epochs (dashed: DP accountant's ε; red x: the classic check "
                 "exceeds it at the run's level)", fontsize=9)
    if df["epoch"].max() > 20:
        ax.set_xscale("symlog", linthresh=1)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="best")
    return save_png(fig, path)


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return "∞" if math.isinf(value) else f"{value:.3g}"
    return html.escape(str(value))


def _deltas(values: pd.Series) -> str:
    """The distinct δ of a column, as printed in the note ("1e-05", or "1e-05 / 1e-06" when runs differ)."""
    return " / ".join(f"{d:g}" for d in sorted({float(v) for v in values.dropna()})) or "–"


def _note(table: pd.DataFrame) -> str:
    """What each bound in the table is, at which δ and which confidence, and what the consistency column tests."""
    one_run = table["one_run_epsilon_lb"].notna().any()
    return (
        "Every bound names the neighbour relation it is stated for. "
        f"Classic ε_lb (δ = {_deltas(table['epsilon_lb_delta'])}): the member / non-member attack's TPR and FPR at "
        "their two-sided 95% Clopper–Pearson bounds, both DP inequalities at every distinct score, maximised over "
        "thresholds, competing score kinds and checkpoints without correction for that choice: the literature's "
        "figure, with no stated confidence. GDP μ_lb: the same attack at the thresholds of a fixed grid of "
        "non-member quantiles, at 95% per checkpoint (Bonferroni over the grid's thresholds and the competing "
        "kinds), shown at the last checkpoint. GDP ε_lb (same δ as the classic): the ε of a mechanism exactly "
        "μ_lb-Gaussian; a lower bound only where the training is Gaussian (full-batch DP-SGD), so shown for DP "
        "runs alone. "
        + (f"One-run ε_lb (δ = {_deltas(table['one_run_delta'])}, canaries.delta): the canaries, each in by a "
           "fair coin, guessed from the last checkpoint; valid from this one run at 1 − β without further "
           "assumptions. " if one_run else "")
        + "0 = no evidence. Under DP-SGD each bound's accountant figure (same relation) is an upper bound when the "
        f"guarantee holds; the consistency column tests that for every checkpoint of the run at level "
        f"{CONSISTENCY_LEVEL:g} in all (the run's checks share it; the classic and GDP checks also assume "
        "independent rows). A failure is evidence against the accountant's figure at that level; only one that "
        f"persists at level {BEYOND_CHANCE_LEVEL:g} points to a bug in the audit or the accounting.")


def epsilon_section_html(results: pd.DataFrame, figure_dir: str | Path) -> str:
    """The report's ε section: a heading, what ε_lb means, the per-run table, the figure (written to
    ``figure_dir / EPSILON_FIGURE`` and referenced by a path relative to the page's folder, which is taken
    to be ``figure_dir``'s parent). Empty string when the results hold no ε column."""
    table = epsilon_table(results)
    if table.empty:
        return ""
    figure = epsilon_figure(results, Path(figure_dir) / EPSILON_FIGURE)
    def rel(column: str) -> str:  # every ε and μ names its neighbour relation (iclmem.record.NEIGHBOURS)
        return f" ({NEIGHBOURS[column]})"

    columns = [("task", "task"), ("label_mode", "labels"), ("lr", "lr"), ("dp_target_epsilon", "target ε"),
               ("dp_epsilon", "accountant ε" + rel("dp_epsilon")),
               ("dp_epsilon_replace_one", "accountant ε" + rel("dp_epsilon_replace_one")),
               ("run_epsilon_lb", "classic ε_lb" + rel("run_epsilon_lb")), ("run_epsilon_lb_epoch", "at epoch"),
               ("gdp_mu_lb", "GDP μ_lb" + rel("gdp_mu_lb")), ("dp_mu_replace_one", "DP-SGD μ" + rel("dp_mu_replace_one")),
               ("gdp_epsilon_lb", "GDP ε_lb" + rel("gdp_epsilon_lb")),
               ("one_run_epsilon_lb", "one-run ε_lb" + rel("one_run_epsilon_lb")),
               ("canary_p_value", "canary p"), ("outcome", "verdict (last epoch)"),
               ("member_icl_accuracy", "member acc."), ("nonmember_icl_accuracy", "non-member acc."),
               ("consistent", f"bounds ≤ accountant (level {CONSISTENCY_LEVEL:g})")]
    present = [c for c in columns if c[0] in ("task", "label_mode", "lr", "dp_target_epsilon", "outcome", "consistent")
               or table[c[0]].notna().any()]  # a bound no run has (no canaries, no DP) is left out
    columns = present
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title in columns)
    body = []
    for _, row in table.iterrows():
        cells = []
        for key, _ in columns:
            value = row[key]
            style = ' style="color:#b00;font-weight:bold"' if key == "consistent" and value is False else ""
            cells.append(f"<td{style}>{_cell(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    note = _note(table) if table["epsilon_lb_delta"].notna().any() else ""
    table_html = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    return section_html("Privacy: ε lower bounds and DP-SGD", [paragraph(note), table_html], figure_dir, figure,
                        "ε over epochs")
