"""The report's reference-model attacks section: IclMem's calibrated score beside LiRA and RMIA.

Reads only the columns in :data:`ATTACK_REPORT_COLUMNS` (ids, config, metrics and the ROC curves'
fpr / tpr, which ``orchestrator.aggregate.attack_columns`` writes), so no raw value reaches the page.

* :func:`attack_table` -- one row per audited run, at its checkpoint with the highest LiRA-online AUC
  (ties: the earliest): AUC [95% interval] and TPR@1% of IclMem's calibrated score and of each attack,
  and each attack's null-split AUC;
* :func:`attack_roc_figure` -- log-log ROC of those checkpoints, down to the smallest FPR the counts allow
  (1 / number of non-members);
* :func:`attacks_section_html` -- both as an HTML fragment (empty without attack columns).
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import pandas as pd

from iclmem.vocab import Attack

__all__ = ["ATTACK_REPORT_COLUMNS", "ATTACKS_FIGURE", "attack_table", "attack_roc_figure", "attacks_section_html"]

ATTACKS_FIGURE = "attacks_roc.png"
_ATTACKS = [a.value for a in Attack]
ATTACK_REPORT_COLUMNS: tuple[str, ...] = (
    "run_id", "task", "model", "lr", "q", "label_mode", "seed", "epoch", "sanity_check", "outcome",
    "auc", "auc_low", "auc_high", "tpr_at_1pct", "calibrated_loss_auc", "calibrated_loss_auc_low",
    "calibrated_loss_auc_high", "calibrated_loss_tpr_at_1pct", "attack_references", "attack_roc",
    *(f"{a}_{stat}" for a in _ATTACKS for stat in ("auc", "auc_low", "auc_high", "tpr_at_1pct", "tpr_at_1pct_low",
                                                   "tpr_at_1pct_high", "tpr_at_0_1pct", "null_auc",
                                                   "null_detections", "n_nonmembers")),
)


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
    for _, group in df.groupby(["run_id", "task"], sort=True):
        group = group.sort_values("epoch")
        rows.append(group.loc[group[key].astype(float).idxmax()])
    return pd.DataFrame(rows).reset_index(drop=True)


def _interval(row: pd.Series, prefix: str) -> str:
    auc, low, high = (row.get(f"{prefix}auc"), row.get(f"{prefix}auc_low"), row.get(f"{prefix}auc_high"))
    if auc is None or pd.isna(auc):
        return "–"
    return f"{float(auc):.3f} [{float(low):.2f}, {float(high):.2f}]"


def _num(value: object) -> str:
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


def attack_roc_figure(results: pd.DataFrame, path: str | Path) -> Path | None:
    """Log-log ROC curves (one panel per run at its peak checkpoint): IclMem calibrated loss, LiRA online /
    offline, RMIA, and the chance diagonal; the FPR axis starts at 1 / n_nonmembers, the smallest non-zero
    FPR those counts can show. None (nothing written) without ROC data."""
    peaks = _peaks(results)
    if peaks.empty or "attack_roc" not in peaks.columns:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from iclmem.atomic import atomic_write

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
    FigureCanvasAgg(fig)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda handle: fig.savefig(handle, dpi=110, format="png"))


def attacks_section_html(results: pd.DataFrame, figure_dir: str | Path) -> str:
    """The section (heading, what the attacks are, the table, the figure); empty without attack columns."""
    table = attack_table(results)
    if table.empty:
        return ""
    figure = attack_roc_figure(results, Path(figure_dir) / ATTACKS_FIGURE)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                   for row in table.itertuples(index=False))
    note = ("Reference-model attacks on the same checkpoints (probe.references = K reference fine-tunes per run, "
            "each on a random half of the run's members and non-members). LiRA online: per-query Gaussians of the "
            "statistic (calibrated probe loss, −ΔS) under references that trained on the query and those that did "
            "not; LiRA offline: the out-references only; RMIA: the query's likelihood ratio against the references, "
            "ranked among the other queries. Each run at its checkpoint with the highest LiRA-online AUC; AUC with "
            "its bootstrap 95% interval; null AUC: the attack on a random half of the non-members labelled "
            "member (rows the run never trained on), which must stay near 0.5. Reference trials are not audited "
            "runs: their rows are in reference_results.parquet, not in the tables above.")
    parts = ["<h2>Reference-model attacks: LiRA and RMIA</h2>", f"<p>{html.escape(note)}</p>",
             f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"]
    if figure is not None:
        parts.append(f'<img src="{html.escape(f"{Path(figure_dir).name}/{figure.name}")}" alt="attack ROC, log-log">')
    return "\n".join(parts)
