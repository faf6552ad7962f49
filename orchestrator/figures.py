"""The paper's figures, drawn with matplotlib's Agg canvas and saved as PNG under ``RUN_DIR/figures/``.

No pyplot: each figure is a standalone :class:`matplotlib.figure.Figure` rendered by the Agg backend, so
drawing never touches global backend state (safe in workers and tests). Every function returns the PNG
path, or ``None`` when its input is empty (e.g. no ROC files), so callers can skip the figure.
Inputs are the public tables of :mod:`orchestrator.reports`; only ids and metrics are drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from iclmem.atomic import atomic_write
from iclmem.runfolder import FIGURES_DIR, MANIPULATION_AUC_FILE, ROC_DIR
from iclmem.vocab import Outcome
from orchestrator import reports as R

OUTCOME_COLORS: dict[str, str] = {
    Outcome.COLLAPSE.value: "#7f7f7f",
    Outcome.MEMORIZATION.value: "#d62728",
    Outcome.INVERSION.value: "#1f77b4",
    Outcome.OVERFITTING.value: "#ff7f0e",
    Outcome.NO_SIGNAL.value: "#c7e9c0",
}
_OTHER_COLOR = "#e0e0e0"
_DPI = 100


def _figures_dir(run_dir: str | Path) -> Path:
    d = Path(run_dir) / FIGURES_DIR
    d.mkdir(parents=True, exist_ok=True)
    return d


def _save(fig: Figure, run_dir: str | Path, name: str) -> Path:
    FigureCanvasAgg(fig)
    path = _figures_dir(run_dir) / f"{name}.png"
    return atomic_write(path, lambda handle: fig.savefig(handle, dpi=_DPI, bbox_inches="tight", format="png"))


def _lr_colors(lrs) -> dict[float, Any]:
    from matplotlib import colormaps

    lrs = sorted({float(x) for x in lrs})
    cmap = colormaps["viridis"]
    return {lr: cmap(i / max(len(lrs) - 1, 1) * 0.9) for i, lr in enumerate(lrs)}


_Q_STYLES = ("-", "--", ":", "-.")


def _epoch_axis(ax, epochs) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("symlog", linthresh=1.0)  # epoch 0 (base model) stays on the axis
    ticks = sorted({int(e) for e in epochs})
    if len(ticks) > 12:  # keep the labels legible: a roughly log-spaced subset
        idx = np.unique(np.round(np.geomspace(1, len(ticks), 12)).astype(int) - 1)
        ticks = [ticks[i] for i in idx]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(t) for t in ticks])
    ax.set_xlabel("epoch")
    ax.grid(True, alpha=0.3)


# --------------------------------------------------------------------------------------------------


def plot_roc_curves(
    run_dir: str | Path, results: pd.DataFrame | None = None, *, max_curves: int = 12,
    run_ids: list[str] | None = None, name: str = "roc_curves",
) -> Path | None:
    """ROC curves of the calibrated deciding score, log-log axes with the chance diagonal.

    With ``results``: each run's peak checkpoint that has a ROC file, highest peak AUC first, at most
    ``max_curves``. Without: the first ``max_curves`` ROC files found.
    """
    files = R.list_roc_files(run_dir)
    if files.empty:
        return None
    curves: list[tuple[str, pd.DataFrame]] = []
    if results is not None:
        peaks = R.peak_checkpoints(results, regime=None)
        if run_ids is not None:
            peaks = peaks[peaks["run_id"].isin(run_ids)]
        peaks = peaks.sort_values(["peak_auc", "run_id"], ascending=[False, True], na_position="last")
        for row in peaks.itertuples(index=False):
            roc = R.load_roc(run_dir, row.run_id, int(row.epoch))
            if roc is None or roc.empty:
                continue
            label = f"{row.task} lr={float(getattr(row, 'lr', np.nan)):g} Q={getattr(row, 'q', '?')} " \
                    f"e{int(row.epoch)} AUC={float(getattr(row, 'auc', row.peak_auc)):.2f}"
            curves.append((label, roc))
            if len(curves) >= max_curves:
                break
    else:
        for row in files.itertuples(index=False):
            if run_ids is not None and row.run_id not in run_ids:
                continue
            curves.append((f"{row.run_id} e{row.epoch}", pd.read_parquet(row.path, columns=list(R.ROC_COLUMNS))))
            if len(curves) >= max_curves:
                break
    if not curves:
        return None

    positives = [v for _, c in curves for v in np.concatenate([c["fpr"].to_numpy(), c["tpr"].to_numpy()]) if v > 0]
    floor = min(1e-3, (min(positives) / 2) if positives else 1e-3)
    fig = Figure(figsize=(7, 6))
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([floor, 1], [floor, 1], "k--", lw=1, label="chance")
    for alpha in (0.01, 0.1):
        ax.axvline(alpha, color="grey", lw=0.8, ls=":")
    for label, c in curves:
        fpr = np.clip(c["fpr"].to_numpy(dtype=float), floor, 1.0)
        tpr = np.clip(c["tpr"].to_numpy(dtype=float), floor, 1.0)
        order = np.argsort(fpr, kind="mergesort")
        ax.plot(fpr[order], tpr[order], lw=1.5, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(floor, 1)
    ax.set_ylim(floor, 1)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title("ROC at peak checkpoints (calibrated score)")
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, run_dir, name)


def plot_auc_over_epochs(
    run_dir: str | Path, results: pd.DataFrame, *, panel: str = "task", regime: str | None = R.MAIN_REGIME,
    name: str = "auc_over_epochs",
) -> Path | None:
    """Calibrated AUC (best kind) against epoch, one line per learning rate, one panel per task or Q.

    Panels per task draw one line per (lr, Q) (line style = Q); panels per Q one line per lr, averaged
    over tasks. Every line is the mean over the runs it pools (seeds, models, label modes).
    """
    if panel not in ("task", "q"):
        raise ValueError(f"panel must be 'task' or 'q', not {panel!r}")
    df = R._filter_regime(results, regime).copy()
    if df.empty:
        return None
    df["ckpt_auc"] = R.checkpoint_auc(df)
    panels = sorted(df[panel].unique(), key=lambda v: (str(type(v)), v))
    colors = _lr_colors(df["lr"].unique())
    qs = sorted(df["q"].unique())
    ncols = min(3, len(panels))
    nrows = int(np.ceil(len(panels) / ncols))
    fig = Figure(figsize=(5 * ncols, 3.6 * nrows + 0.4), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, p in enumerate(panels):
        ax = axes[i // ncols][i % ncols]
        d = df[df[panel] == p]
        line_keys = ["lr", "q"] if panel == "task" else ["lr"]
        for key, g in d.groupby(line_keys, sort=True):
            key = key if isinstance(key, tuple) else (key,)
            lr = float(key[0])
            series = g.groupby("epoch")["ckpt_auc"].mean().sort_index()
            style = _Q_STYLES[qs.index(key[1]) % len(_Q_STYLES)] if panel == "task" else "-"
            label = f"lr={lr:g}" + (f" Q={key[1]}" if panel == "task" and len(qs) > 1 else "")
            ax.plot(series.index, series.values, style, marker="o", ms=3, color=colors[lr], label=label)
        ax.axhline(0.5, color="k", lw=0.8, ls="--")
        _epoch_axis(ax, d["epoch"].unique())
        ax.set_ylabel("AUC(ΔS)")
        ax.set_title(f"{panel} = {p}")
        ax.legend(fontsize=7)
    for j in range(len(panels), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    fig.suptitle("Calibrated AUC over epochs")
    return _save(fig, run_dir, name)


def _cell_outcome(outcomes: pd.Series) -> str:
    counts = outcomes.value_counts()
    top = counts.max()
    tied = set(counts[counts == top].index)
    for o in R._outcome_order(outcomes):
        if o in tied:
            return o
    return str(counts.index[0])


def plot_outcome_heatmap(
    run_dir: str | Path, results: pd.DataFrame, *, regime: str | None = R.MAIN_REGIME, name: str = "outcome_heatmap",
) -> Path | None:
    """Task × learning rate grid coloured by outcome at the peak checkpoint, one panel per Q.

    A cell pooling several runs (seeds, label modes) shows the most frequent outcome (ties: the order
    collapse, memorization, inversion, overfitting, no_signal) and the highest peak AUC.
    """
    peaks = R.peak_checkpoints(results, regime=regime)
    if peaks.empty:
        return None
    tasks = sorted(peaks["task"].unique())
    lrs = sorted(peaks["lr"].unique())
    qs = sorted(peaks["q"].unique())
    order = R._outcome_order(peaks["outcome"])
    palette = [OUTCOME_COLORS.get(o, _OTHER_COLOR) for o in order]
    cmap = ListedColormap(palette)
    fig = Figure(figsize=(1.4 * len(lrs) * len(qs) + 2.5, 0.45 * len(tasks) + 2.2), layout="constrained")
    axes = fig.subplots(1, len(qs), squeeze=False)[0]
    for ax, q in zip(axes, qs):
        grid = np.full((len(tasks), len(lrs)), np.nan)
        d = peaks[peaks["q"] == q]
        for (task, lr), g in d.groupby(["task", "lr"]):
            i, j = tasks.index(task), lrs.index(lr)
            grid[i, j] = order.index(_cell_outcome(g["outcome"]))
            txt = f"{g['peak_auc'].max():.2f}" + (f" ({len(g)})" if len(g) > 1 else "")
            ax.text(j, i, txt, ha="center", va="center", fontsize=7)
        ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-0.5, vmax=len(order) - 0.5, aspect="auto")
        ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
        ax.set_yticks(range(len(tasks)), tasks, fontsize=8)
        ax.set_xlabel("learning rate")
        ax.set_title(f"Q = {q}")
    fig.legend(handles=[Patch(color=c, label=o) for o, c in zip(order, palette)], loc="outside lower center",
               ncol=len(order), fontsize=8, frameon=False)
    fig.suptitle("Outcome at peak checkpoint (cell text: peak AUC)")
    return _save(fig, run_dir, name)


def plot_detectable_share(
    run_dir: str | Path, results: pd.DataFrame, *, regime: str | None = R.MAIN_REGIME, cumulative: bool = False,
    name: str = "detectable_share",
) -> Path | None:
    """Share of runs flagged memorization by epoch, one line per Q (Fig. 2)."""
    share = R.detectable_share_by_epoch(results, regime=regime, cumulative=cumulative)
    if share.empty:
        return None
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot(1, 1, 1)
    for i, (q, d) in enumerate(share.groupby("q", sort=True)):
        ax.plot(d["epoch"], d["share"], _Q_STYLES[i % len(_Q_STYLES)], marker="o", label=f"Q={q}")
    _epoch_axis(ax, share["epoch"].unique())
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("share of runs detectable")
    ax.set_title("Runs flagged memorization by epoch" + (" (cumulative)" if cumulative else ""))
    ax.legend()
    return _save(fig, run_dir, name)


def plot_perturbation_ranking(
    run_dir: str | Path, manipulation_auc: pd.DataFrame, results: pd.DataFrame | None = None, *, top: int = 20,
    name: str = "perturbation_ranking",
) -> Path | None:
    """Horizontal bars of the ``top`` manipulations (App. 7.3). With ``results``: the paper's ranking, mean
    ΔAUC to the checkpoint's overall AUC(ΔS) over checkpoints flagged memorization
    (:func:`orchestrator.reports.perturbation_effectiveness`); without: mean per-manipulation AUC over
    every fine-tuned checkpoint."""
    if results is not None:
        rank, value, ref, label = (R.perturbation_effectiveness(manipulation_auc, results), "mean_delta_auc", 0.0,
                                   "mean AUC minus overall AUC(ΔS), memorized checkpoints")
    else:
        rank, value, ref, label = R.perturbation_ranking(manipulation_auc), "mean_auc", 0.5, "mean AUC over checkpoints"
    if rank.empty:
        return None
    rank = rank.head(top).iloc[::-1]
    cats = sorted(rank["category"].unique()) if "category" in rank.columns else []
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    fig = Figure(figsize=(7, 0.3 * len(rank) + 1.5))
    ax = fig.add_subplot(1, 1, 1)
    colors = [cmap(cats.index(c) % 20) for c in rank["category"]] if cats else None
    ax.barh(rank["manipulation"], rank[value], color=colors)
    ax.axvline(ref, color="k", lw=0.8, ls="--")
    lo = min(ref - 0.05, float(rank[value].min()) - 0.02)
    ax.set_xlim(lo, max(ref + 0.05, float(rank[value].max()) + 0.02))
    ax.set_xlabel(label)
    ax.tick_params(axis="y", labelsize=7)
    if cats:
        ax.legend(handles=[Patch(color=cmap(i % 20), label=c) for i, c in enumerate(cats)], fontsize=7,
                  loc="lower right")
    ax.set_title("Perturbation effectiveness")
    return _save(fig, run_dir, name)


def make_all_figures(
    run_dir: str | Path, results: pd.DataFrame | None = None, *, manipulation_auc: pd.DataFrame | None = None,
    regime: str | None = R.MAIN_REGIME,
) -> tuple[dict[str, Path | None], dict[str, str]]:
    """Draw every figure the inputs allow. Returns ({name: path or None}, {name: why it was skipped})."""
    run_dir = Path(run_dir)
    if results is None:
        results = R.load_results(run_dir)
    if manipulation_auc is None:
        manipulation_auc = R.load_manipulation_auc(run_dir)
    jobs: Mapping[str, tuple] = {
        "roc_curves": (plot_roc_curves, (run_dir, results), {}),
        "auc_over_epochs": (plot_auc_over_epochs, (run_dir, results), {"regime": regime}),
        "outcome_heatmap": (plot_outcome_heatmap, (run_dir, results), {"regime": regime}),
        "detectable_share": (plot_detectable_share, (run_dir, results), {"regime": regime}),
    }
    if manipulation_auc is not None:
        jobs = {**jobs, "perturbation_ranking": (plot_perturbation_ranking, (run_dir, manipulation_auc, results), {})}
    paths: dict[str, Path | None] = {}
    notes: dict[str, str] = {}
    for name, (fn, args, kw) in jobs.items():
        try:
            paths[name] = fn(*args, **kw)
        except (KeyError, ValueError, TypeError) as exc:  # malformed input: skip the figure, keep the rest
            paths[name] = None
            notes[name] = f"could not be drawn ({type(exc).__name__})"
            continue
        if paths[name] is None:
            notes[name] = "no input data" if name != "roc_curves" else f"no files under {ROC_DIR}/"
    if manipulation_auc is None:
        paths["perturbation_ranking"] = None
        notes["perturbation_ranking"] = f"{MANIPULATION_AUC_FILE} not found"
    return paths, notes
