"""The report's canary section: exposure of the inserted canaries by copy count, checkpoint by checkpoint.

Reads only the columns :data:`CANARY_REPORT_COLUMNS` names and the ``canary_*_c<k>`` summaries
(``probes.canaries.summary_columns``): ids, config and exposures, never a canary's features.

* :func:`canary_table` -- one row per (run, checkpoint): mean exposure of the probe's calibrated loss per
  copy count, the same for the known-context statistic, and the mean rank of the trained label;
* :func:`canary_figure` -- mean exposure against copy count (log2 axis), one line per checkpoint epoch,
  one row of panels per run (the first 12) and one panel per statistic, with the chance level and the
  ceiling log2(H + 1);
* :func:`canaries_section_html` -- both as an HTML fragment (empty without canary columns).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from iclmem.record import CANARY_TABLE_ORDER, CHECKPOINT_KEY, NEIGHBOURS, RUN_KEY
from orchestrator.report.parts import html_table, paragraph, save_png, section_html

__all__ = ["CANARY_REPORT_COLUMNS", "CANARIES_FIGURE", "canary_copies", "canary_table", "canary_figure",
           "canaries_section_html", "chance_exposure"]

CANARIES_FIGURE = "canary_exposure.png"
MAX_FIGURE_RUNS = 12  # panels beyond this many runs would be unreadable; the table lists every run
CANARY_REPORT_COLUMNS: tuple[str, ...] = (*CHECKPOINT_KEY, "sanity_check", "canary_holdout", "canary_exposure_max",
                                          "canary_p_value", "canary_known_context_p_value", "canary_beta",
                                          "canary_detected", "one_run_epsilon_lb", "one_run_m", "one_run_n_in",
                                          "one_run_guesses", "one_run_correct", "one_run_delta", "one_run_beta")
_COPIES = re.compile(r"^canary_exposure_c(\d+)$")


def chance_exposure(holdout: int) -> float:
    """Expected exposure of a canary whose statistic is exchangeable with the H held-out ones (its rank
    uniform over 1..H+1, no ties): the mean of log2((H + 1) / r)."""
    ranks = np.arange(1, holdout + 2, dtype=np.float64)
    return float(np.mean(np.log2((holdout + 1) / ranks)))


def canary_copies(results: pd.DataFrame) -> list[int]:
    """The copy counts the results have exposure columns for, ascending."""
    return sorted(int(m.group(1)) for c in results.columns if (m := _COPIES.match(str(c))))


def _public(results: pd.DataFrame) -> pd.DataFrame:
    copies = canary_copies(results)
    wanted = list(CANARY_REPORT_COLUMNS) + [f"canary_{stat}_c{k}" for k in copies
                                            for stat in ("exposure", "known_context_exposure", "label_rank")]
    df = results.loc[:, [c for c in wanted if c in results.columns]].copy()
    if "sanity_check" in df.columns:
        df = df[~df["sanity_check"].fillna(False).astype(bool)]
    key = f"canary_exposure_c{copies[0]}" if copies else None
    return df[df[key].notna()] if key else pd.DataFrame()


def canary_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per audited run and checkpoint with canaries (module docstring); empty without them."""
    df = _public(results)
    if df.empty:
        return pd.DataFrame()
    copies = canary_copies(results)
    rows = []
    for _, row in df.sort_values(list(CANARY_TABLE_ORDER)).iterrows():
        out = {"task": row["task"], "run_id": row["run_id"], "lr": row.get("lr"), "label_mode": row.get("label_mode"),
               "epoch": int(row["epoch"])}
        for stat, name in (("exposure", "probe exposure"), ("known_context_exposure", "known-context exposure")):
            out[f"{name} (bits), copies " + " / ".join(str(k) for k in copies)] = " / ".join(
                f"{float(row[f'canary_{stat}_c{k}']):.2f}" for k in copies)
        out["label rank, copies " + " / ".join(str(k) for k in copies)] = " / ".join(
            f"{float(row[f'canary_label_rank_c{k}']):.2f}" for k in copies)
        out["max (bits)"] = f"{float(row['canary_exposure_max']):.2f}"
        if pd.notna(row.get("canary_p_value", np.nan)):
            out["rank-test p (probe / known context)"] = (f"{float(row['canary_p_value']):.2g} / "
                                                          f"{float(row['canary_known_context_p_value']):.2g}")
            out["detected"] = "yes" if bool(row.get("canary_detected")) else "no"
        if pd.notna(row.get("one_run_epsilon_lb", np.nan)):
            out[f"one-run ε_lb ({NEIGHBOURS['one_run_epsilon_lb']})"] = (
                f"{float(row['one_run_epsilon_lb']):.3f} ({int(row['one_run_correct'])}/{int(row['one_run_guesses'])} "
                f"right; {int(row['one_run_n_in'])} of {int(row['one_run_m'])} in)")
        rows.append(out)
    return pd.DataFrame(rows)


def canary_figure(results: pd.DataFrame, path: str | Path) -> Path | None:
    """Mean exposure vs copy count per checkpoint epoch (module docstring); None without canary columns."""
    df = _public(results)
    if df.empty:
        return None
    from matplotlib.figure import Figure

    copies = canary_copies(results)
    holdout = int(df["canary_holdout"].min())
    runs = list(df.groupby(list(RUN_KEY), sort=True))[:MAX_FIGURE_RUNS]  # one row of panels per run
    fig = Figure(figsize=(9, 3.2 * len(runs)), layout="constrained")
    for r, ((run_id, task), run) in enumerate(runs):
        first = run.iloc[0]
        name = (f"{task} lr={float(first['lr']):g} {first.get('label_mode', '')} ({str(run_id)[-6:]})"
                if "lr" in run.columns else f"{task} ({str(run_id)[-6:]})")
        for i, (stat, title) in enumerate((("exposure", "probe (calibrated loss)"),
                                           ("known_context_exposure", "known context C′"))):
            ax = fig.add_subplot(len(runs), 2, 2 * r + i + 1)
            epochs = sorted(run["epoch"].unique())
            for j, epoch in enumerate(epochs):
                at = run[run["epoch"] == epoch].iloc[0]
                ax.plot(copies, [float(at[f"canary_{stat}_c{k}"]) for k in copies], marker="o", color=f"C{j % 10}",
                        label=f"epoch {int(epoch)}")
            ax.axhline(chance_exposure(holdout), color="grey", linestyle=":", label="chance")
            ax.axhline(math.log2(holdout + 1), color="black", linestyle="--", linewidth=0.8, label="ceiling")
            ax.set_xscale("log", base=2)
            ax.set_xticks(copies, [str(k) for k in copies])
            ax.set_xlabel("copies of the canary in the fine-tuning members")
            ax.set_ylabel(f"mean exposure (bits, vs {holdout} held out)")
            ax.set_title(f"{name}: {title}", fontsize=8)
            ax.legend(fontsize=6, loc="upper left")
    return save_png(fig, path)


def canaries_section_html(results: pd.DataFrame, figure_dir: str | Path) -> str:
    """The section (heading, what exposure is, the table, the figure); empty without canary columns."""
    table = canary_table(results)
    if table.empty:
        return ""
    holdout = int(_public(results)["canary_holdout"].min())
    figure = canary_figure(results, Path(figure_dir) / CANARIES_FIGURE)
    note = (f"Canaries (sweep setting canaries): crafted rows inserted into each run's fine-tuning members 1, 2, 4 "
            f"or 8 times, and {holdout} more per kind drawn the same way but never trained on. A canary's exposure "
            f"is log2({holdout} + 1) − log2(1 + the number of held-out canaries scoring at least as high): "
            f"{chance_exposure(holdout):.2f} bits on average for a canary the checkpoint treats like an unseen "
            f"one, {math.log2(holdout + 1):.2f} bits (the ceiling) for one above every held-out canary. Probe "
            "exposure reads the zero-information probe's calibrated loss (−ΔS), known-context exposure the "
            "calibrated loss of the trained label with C′; label rank is the trained label's rank among the "
            "candidates with C′ (1 = predicted). Means over the canaries of each copy count; exposure that grows "
            "with the copies is memorization of those rows. Rank-test p: one-sided Mann–Whitney test of the "
            "inserted canaries' statistic against the held-out ones' (valid because both are draws of one "
            "generator before training); detected = p below the sweep's canaries.beta.")
    one_run = _public(results)
    if "one_run_epsilon_lb" in one_run.columns and one_run["one_run_epsilon_lb"].notna().any():
        first = one_run[one_run["one_run_epsilon_lb"].notna()].iloc[0]
        note += (f" Design one_run: {int(first['one_run_m'])} canaries, each inserted once by a fair coin of its own; "
                 "the one-run ε_lb guesses the coins from the checkpoint (the highest and lowest scores, on a grid "
                 f"fixed in advance) and holds with probability {1 - float(first['one_run_beta']):.2f} at δ = "
                 f"{float(first['one_run_delta']):g}, from this single run (docs/METHOD.md).")
    return section_html("Canaries: exposure by number of copies", [paragraph(note), html_table(table)], figure_dir,
                        figure, "canary exposure by copies")
