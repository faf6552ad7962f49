"""The paper's figures, drawn with matplotlib's Agg canvas and saved as PNG under ``RUN_DIR/figures/``.

No pyplot: each figure is a standalone :class:`matplotlib.figure.Figure` rendered by the Agg backend, so
drawing never touches global backend state (safe in workers and tests). Every function returns the PNG
path, or ``None`` when its input is empty (e.g. no ROC files), so callers can skip the figure.
Inputs are the public tables of :mod:`orchestrator.report.tables`; only ids and metrics are drawn.

No figure pools grid axes silently: the axes of :data:`FACET_AXES` that vary in a sweep get a panel each
(named in the panel's title), ROC legends name every grid axis that differs between the curves, and a
pooled seed axis is said in the title. Each ``plot_*`` function draws with a ``build_*`` function that
returns the :class:`~matplotlib.figure.Figure`, so tests can read panels, legends and lines back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from iclmem.atomic import atomic_write
from iclmem.record import CHECKPOINT_ID, EPOCH_CURVE_LINE, GRID_AXES, OUTCOME_GRID_CELL
from iclmem.runfolder import FIGURES_DIR, MANIPULATION_AUC_FILE, ROC_DIR
from iclmem.vocab import Outcome
from orchestrator.report import tables as R
from orchestrator.runfolder.run_folder import RunFolder

OUTCOME_COLORS: dict[str, str] = {
    Outcome.COLLAPSE.value: "#7f7f7f",
    Outcome.MEMORIZATION.value: "#d62728",
    Outcome.INVERSION.value: "#1f77b4",
    Outcome.OVERFITTING.value: "#ff7f0e",
    Outcome.NO_SIGNAL.value: "#c7e9c0",
}
_OTHER_COLOR = "#e0e0e0"
_DPI = 100
FACET_AXES: tuple[str, ...] = R.FACET_AXES  # a figure facets by every one of these that varies
# Every axis that can tell two runs apart, in the order a legend names them.
RUN_AXES: tuple[str, ...] = GRID_AXES
CHANCE_LABEL = "chance (AUC 0.5)"
_CHANCE_ZORDER = 10  # above every curve, so no run's line can hide the reference


def varying_axes(df: pd.DataFrame, axes: tuple[str, ...] = FACET_AXES) -> list[str]:
    """The columns of ``axes`` that take more than one value in ``df`` (the ones a figure must show)."""
    return [a for a in axes if a in df.columns and df[a].nunique(dropna=False) > 1]


def _fmt_axis_value(axis: str, value: Any) -> str:
    if axis == "lr":
        return f"lr={float(value):g}"
    if axis == "q":
        return f"Q={value}"
    if axis == "task":
        return str(value)
    if axis == "dp_target_epsilon":
        return f"DP ε={value:g}" if isinstance(value, (int, float)) and value == value else "no DP"
    return f"{axis}={value}"


def _facets(df: pd.DataFrame, axes: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """(title, rows) per combination of ``axes`` present in ``df``; one untitled facet when none vary."""
    if not axes:
        return [("", df)]
    out = []
    for key, g in df.groupby(axes, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        out.append((" · ".join(f"{a} = {v}" for a, v in zip(axes, key)), g))
    return out


def _pooled_seeds_note(df: pd.DataFrame) -> str:
    n = df["seed"].nunique() if "seed" in df.columns else 1
    return f" (mean over {n} seeds)" if n > 1 else ""


def _distinct_colors(n: int) -> list[Any]:
    """``n`` colours no two of which are alike: tab10 up to 10, tab20 up to 20, then an even hue sweep."""
    from matplotlib import colormaps

    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        # tab20 pairs a dark and a light shade of each hue: take the dark ones first, then the light ones
        return [colormaps["tab20"](2 * i if i < 10 else 2 * (i - 10) + 1) for i in range(n)]
    return [colormaps["hsv"](i / n) for i in range(n)]


def _chance_line(ax: Axes, xs: Sequence[float], ys: Sequence[float]) -> None:
    """The chance reference, drawn last and above every curve, and named in the legend."""
    ax.plot(xs, ys, color="black", ls="--", lw=1.2, zorder=_CHANCE_ZORDER, label=CHANCE_LABEL)


def _figures_dir(run_dir: str | Path) -> Path:
    d = Path(run_dir) / FIGURES_DIR
    d.mkdir(parents=True, exist_ok=True)
    return d


def _save(fig: Figure, run_dir: str | Path, name: str) -> Path:
    FigureCanvasAgg(fig)
    path = _figures_dir(run_dir) / f"{name}.png"
    return atomic_write(path, lambda handle: fig.savefig(handle, dpi=_DPI, bbox_inches="tight", format="png"))


def _lr_colors(lrs: Iterable[float]) -> dict[float, Any]:
    from matplotlib import colormaps

    lrs = sorted({float(x) for x in lrs})
    cmap = colormaps["viridis"]
    return {lr: cmap(i / max(len(lrs) - 1, 1) * 0.9) for i, lr in enumerate(lrs)}


_Q_STYLES = ("-", "--", ":", "-.")


def _epoch_axis(ax: Axes, epochs: Iterable[int]) -> None:
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


def _roc_curves(run_dir: str | Path, results: pd.DataFrame | None, max_curves: int,
                run_ids: list[str] | None) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """(run description, ROC table) of the curves to draw; the description holds every run axis known."""
    folder = RunFolder(run_dir)
    files = folder.roc_files()
    if files.empty:
        return []
    curves: list[tuple[dict[str, Any], pd.DataFrame]] = []
    if results is not None:
        # fine-tuned runs only: a base-model sanity check's curve is the chance diagonal by construction
        fine_tuned = R.fine_tuned_rows(results)
        peaks = R.peak_checkpoints(fine_tuned if not fine_tuned.empty else results, regime=None)
        if run_ids is not None:
            peaks = peaks[peaks["run_id"].isin(run_ids)]
        peaks = peaks.sort_values(["peak_auc", "run_id"], ascending=[False, True], na_position="last")
        for row in peaks.to_dict("records"):
            roc = folder.roc(row["run_id"], int(row["epoch"]))
            if roc is None or roc.empty:
                continue
            desc = {a: row[a] for a in RUN_AXES if a in row}
            desc.update(run_id=row["run_id"], epoch=int(row["epoch"]), auc=float(row.get("auc", row["peak_auc"])))
            curves.append((desc, roc))
            if len(curves) >= max_curves:
                break
    else:
        for row in files.itertuples(index=False):
            if run_ids is not None and row.run_id not in run_ids:
                continue
            roc = folder.roc(row.run_id, int(row.epoch))
            if roc is not None:
                curves.append(({"run_id": row.run_id, "epoch": int(row.epoch)}, roc))
            if len(curves) >= max_curves:
                break
    return curves


def roc_legend_labels(descs: list[dict[str, Any]]) -> list[str]:
    """One legend entry per curve naming every run axis whose value differs between the curves (so two
    curves never share a label), then the epoch and AUC; the axes all curves share go to the title."""
    differing = [a for a in RUN_AXES if len({str(d.get(a)) for d in descs}) > 1]
    labels = []
    for d in descs:
        if not any(a in d for a in RUN_AXES):  # curves known only by their file name
            parts = [str(d["run_id"])]
        else:
            parts = [_fmt_axis_value(a, d.get(a)) for a in differing]
        parts.append(f"e{d['epoch']}")
        if "auc" in d:
            parts.append(f"AUC={d['auc']:.2f}")
        labels.append(" ".join(parts))
    if len(set(labels)) < len(labels):  # runs alike on every axis (e.g. other model options): name them
        labels = [f"{d['run_id']} {label}" for d, label in zip(descs, labels)]
    return labels


def _shared_axes_title(descs: list[dict[str, Any]]) -> str:
    shared = [a for a in RUN_AXES if a in descs[0] and len({str(d.get(a)) for d in descs}) == 1]
    return ", ".join(_fmt_axis_value(a, descs[0][a]) for a in shared)


def build_roc_figure(
    run_dir: str | Path, results: pd.DataFrame | None = None, *, max_curves: int = 12,
    run_ids: list[str] | None = None,
) -> Figure | None:
    """ROC curves of the calibrated deciding score, log-log axes, with the chance diagonal on top.

    With ``results``: each run's peak checkpoint that has a ROC file, highest peak AUC first, at most
    ``max_curves``. Without: the first ``max_curves`` ROC files found. Each curve has its own colour and
    a legend entry naming every grid axis that differs between the curves.
    """
    curves = _roc_curves(run_dir, results, max_curves, run_ids)
    if not curves:
        return None
    positives = [v for _, c in curves for v in np.concatenate([c["fpr"].to_numpy(), c["tpr"].to_numpy()]) if v > 0]
    floor = min(1e-3, (min(positives) / 2) if positives else 1e-3)
    fig = Figure(figsize=(7.5, 6.5))
    ax = fig.add_subplot(1, 1, 1)
    for alpha in (0.01, 0.1):
        ax.axvline(alpha, color="grey", lw=0.8, ls=":")
    labels = roc_legend_labels([d for d, _ in curves])
    colors = _distinct_colors(len(curves))
    for i, ((_, c), label) in enumerate(zip(curves, labels)):
        fpr = np.clip(c["fpr"].to_numpy(dtype=float), floor, 1.0)
        tpr = np.clip(c["tpr"].to_numpy(dtype=float), floor, 1.0)
        order = np.argsort(fpr, kind="mergesort")
        ax.plot(fpr[order], tpr[order], lw=1.5, color=colors[i], ls=_Q_STYLES[(i // 10) % len(_Q_STYLES)],
                label=label)
    _chance_line(ax, [floor, 1], [floor, 1])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(floor, 1)
    ax.set_ylim(floor, 1)
    ax.set_xlabel("false positive rate (non-members flagged)")
    ax.set_ylabel("true positive rate (members flagged)")
    shared = _shared_axes_title([d for d, _ in curves])
    ax.set_title("ROC at peak checkpoints (calibrated score)" + (f"\n{shared}" if shared else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def plot_roc_curves(
    run_dir: str | Path, results: pd.DataFrame | None = None, *, max_curves: int = 12,
    run_ids: list[str] | None = None, name: str = "roc_curves",
) -> Path | None:
    """:func:`build_roc_figure` saved as ``figures/<name>.png`` (None when there is no ROC file)."""
    fig = build_roc_figure(run_dir, results, max_curves=max_curves, run_ids=run_ids)
    return None if fig is None else _save(fig, run_dir, name)


def _grid(n: int, width: float, height: float, max_cols: int = 3) -> tuple[Figure, list[Any]]:
    ncols = min(max_cols, n)
    nrows = int(np.ceil(n / ncols))
    fig = Figure(figsize=(width * ncols, height * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    flat = [axes[i // ncols][i % ncols] for i in range(nrows * ncols)]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def build_auc_over_epochs(
    results: pd.DataFrame, *, panel: str = "task", regime: str | None = R.MAIN_REGIME,
) -> Figure | None:
    """Calibrated AUC (best kind) against epoch, one line per learning rate, one panel per task or Q and
    per value of every :data:`FACET_AXES` axis that varies (e.g. one panel per label mode).

    Panels per task draw one line per (lr, Q) (line style = Q); panels per Q one line per lr, averaged
    over tasks. A line averages only over seeds (said in the title) and, for panels per Q, tasks.
    """
    if panel not in ("task", "q"):
        raise ValueError(f"panel must be 'task' or 'q', not {panel!r}")
    df = R.filter_regime(results, regime).copy()
    if df.empty:
        return None
    df["ckpt_auc"] = R.checkpoint_auc(df)
    facet = varying_axes(df)
    cells = []  # one row of panels per facet (e.g. label mode), one panel per task or Q in it
    for title, f in _facets(df, facet):
        for p in sorted(f[panel].unique(), key=lambda v: (str(type(v)), v)):
            cells.append((f"{panel} = {p}" + (f"\n{title}" if title else ""), f[f[panel] == p]))
    colors = _lr_colors(df["lr"].unique())
    qs = sorted(df["q"].unique())
    fig, axes = _grid(len(cells), 5, 3.8)
    for ax, (title, d) in zip(axes, cells):
        line_keys = list(EPOCH_CURVE_LINE) if panel == "task" else ["lr"]
        for key, g in d.groupby(line_keys, sort=True):
            key = key if isinstance(key, tuple) else (key,)
            lr = float(key[0])
            series = g.groupby("epoch")["ckpt_auc"].mean().sort_index()
            style = _Q_STYLES[qs.index(key[1]) % len(_Q_STYLES)] if panel == "task" else "-"
            label = f"lr={lr:g}" + (f" Q={key[1]}" if panel == "task" and len(qs) > 1 else "")
            ax.plot(series.index, series.values, style, marker="o", ms=3, color=colors[lr], label=label)
        ax.axhline(0.5, color="black", ls="--", lw=1.2, zorder=_CHANCE_ZORDER, label=CHANCE_LABEL)
        _epoch_axis(ax, d["epoch"].unique())
        ax.set_ylabel("AUC(ΔS)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Calibrated AUC over epochs" + _pooled_seeds_note(df))
    return fig


def plot_auc_over_epochs(
    run_dir: str | Path, results: pd.DataFrame, *, panel: str = "task", regime: str | None = R.MAIN_REGIME,
    name: str = "auc_over_epochs",
) -> Path | None:
    """:func:`build_auc_over_epochs` saved as ``figures/<name>.png``."""
    fig = build_auc_over_epochs(results, panel=panel, regime=regime)
    return None if fig is None else _save(fig, run_dir, name)


def _cell_outcome(outcomes: pd.Series) -> str:
    counts = outcomes.value_counts()
    top = counts.max()
    tied = set(counts[counts == top].index)
    for o in R.outcome_order(outcomes):
        if o in tied:
            return o
    return str(counts.index[0])


def build_outcome_heatmap(results: pd.DataFrame, *, regime: str | None = R.MAIN_REGIME) -> Figure | None:
    """Task × learning rate grid coloured by outcome at the peak checkpoint, one panel per Q and per value
    of every :data:`FACET_AXES` axis that varies.

    A cell pooling several runs (seeds) shows the most frequent outcome (ties: the order collapse,
    memorization, inversion, overfitting, no_signal), the highest peak AUC and the number of runs.
    """
    peaks = R.peak_checkpoints(results, regime=regime)
    if peaks.empty:
        return None
    tasks = sorted(peaks["task"].unique())
    lrs = sorted(peaks["lr"].unique())
    order = R.outcome_order(peaks["outcome"])
    palette = [OUTCOME_COLORS.get(o, _OTHER_COLOR) for o in order]
    cmap = ListedColormap(palette)
    facet = varying_axes(peaks)
    qs = sorted(peaks["q"].unique())
    cells = []  # one row of panels per facet (e.g. label mode), one column per Q
    for title, f in _facets(peaks, facet):
        for q in qs:
            cells.append((f"Q = {q}" + (f"\n{title}" if title else ""), f[f["q"] == q]))
    fig, axes = _grid(len(cells), 1.4 * len(lrs) + 1.6, 0.45 * len(tasks) + 1.6, max_cols=max(len(qs), 1))
    for ax, (title, d) in zip(axes, cells):
        grid = np.full((len(tasks), len(lrs)), np.nan)
        for (task, lr), g in d.groupby(list(OUTCOME_GRID_CELL)):
            i, j = tasks.index(task), lrs.index(lr)
            grid[i, j] = order.index(_cell_outcome(g["outcome"]))
            txt = f"{g['peak_auc'].max():.2f}" + (f" ({len(g)})" if len(g) > 1 else "")
            ax.text(j, i, txt, ha="center", va="center", fontsize=7)
        ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-0.5, vmax=len(order) - 0.5, aspect="auto")
        ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
        ax.set_yticks(range(len(tasks)), tasks, fontsize=8)
        ax.set_xlabel("learning rate")
        ax.set_title(title, fontsize=9)
    fig.legend(handles=[Patch(color=c, label=o) for o, c in zip(order, palette)], loc="outside lower center",
               ncol=len(order), fontsize=8, frameon=False)
    fig.suptitle("Outcome at peak checkpoint (cell text: peak AUC, and (n) runs when a cell pools seeds)")
    return fig


def plot_outcome_heatmap(
    run_dir: str | Path, results: pd.DataFrame, *, regime: str | None = R.MAIN_REGIME, name: str = "outcome_heatmap",
) -> Path | None:
    """:func:`build_outcome_heatmap` saved as ``figures/<name>.png``."""
    fig = build_outcome_heatmap(results, regime=regime)
    return None if fig is None else _save(fig, run_dir, name)


def build_detectable_share(
    results: pd.DataFrame, *, regime: str | None = R.MAIN_REGIME, cumulative: bool = False,
) -> Figure | None:
    """Share of runs flagged memorization by epoch, one line per Q (Fig. 2), one panel per value of every
    :data:`FACET_AXES` axis that varies."""
    facet = varying_axes(R.filter_regime(results, regime))
    share = R.detectable_share_by_epoch(results, regime=regime, cumulative=cumulative, by=tuple(facet))
    if share.empty:
        return None
    cells = _facets(share, facet)
    fig, axes = _grid(len(cells), 6, 3.8, max_cols=2)
    for ax, (title, d) in zip(axes, cells):
        for i, (q, dq) in enumerate(d.groupby("q", sort=True)):
            ax.plot(dq["epoch"], dq["share"], _Q_STYLES[i % len(_Q_STYLES)], marker="o", label=f"Q={q}")
        _epoch_axis(ax, d["epoch"].unique())
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("share of runs detectable")
        ax.set_title(title, fontsize=9)
        ax.legend()
    fig.suptitle("Runs flagged memorization by epoch" + (" (cumulative)" if cumulative else ""))
    return fig


def plot_detectable_share(
    run_dir: str | Path, results: pd.DataFrame, *, regime: str | None = R.MAIN_REGIME, cumulative: bool = False,
    name: str = "detectable_share",
) -> Path | None:
    """:func:`build_detectable_share` saved as ``figures/<name>.png``."""
    fig = build_detectable_share(results, regime=regime, cumulative=cumulative)
    return None if fig is None else _save(fig, run_dir, name)


def plot_perturbation_ranking(
    run_dir: str | Path, manipulation_auc: pd.DataFrame, results: pd.DataFrame | None = None, *, top: int = 20,
    name: str = "perturbation_ranking",
) -> Path | None:
    """:func:`build_perturbation_ranking` saved as ``figures/<name>.png``."""
    fig = build_perturbation_ranking(manipulation_auc, results, top=top)
    return None if fig is None else _save(fig, run_dir, name)


def build_perturbation_ranking(
    manipulation_auc: pd.DataFrame, results: pd.DataFrame | None = None, *, top: int = 20,
) -> Figure | None:
    """Horizontal bars of the ``top`` manipulations (App. 7.3). With ``results``: the paper's ranking, mean
    ΔAUC to the unmanipulated context's AUC at the same checkpoint, over checkpoints flagged memorization
    (:func:`orchestrator.report.tables.perturbation_effectiveness`), the title naming the grid axes it pools;
    without: mean per-manipulation AUC over every fine-tuned checkpoint."""
    if results is not None:
        rank, value, ref, label = (R.perturbation_effectiveness(manipulation_auc, results), "mean_delta_auc", 0.0,
                                   "mean AUC minus the unmanipulated context's AUC, memorized checkpoints")
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
    ax.set_title("Perturbation effectiveness" + _pooled_axes_note(manipulation_auc, results), fontsize=10)
    return fig


def _pooled_axes_note(manipulation_auc: pd.DataFrame, results: pd.DataFrame | None) -> str:
    """The ranking pools checkpoints across runs; name the grid axes it pools so none is merged silently."""
    if results is None:
        return ""
    used = results.merge(manipulation_auc[list(CHECKPOINT_ID)].drop_duplicates(), on=list(CHECKPOINT_ID))
    if "outcome" in used.columns:
        used = used[(used["outcome"] == R.DETECTABLE) & (used["epoch"] > 0)]
    axes = varying_axes(used)
    if not axes:
        return ""
    parts = [f"{a} {' + '.join(str(v) for v in sorted(used[a].unique()))}" for a in axes]
    return f"\n{len(used)} memorized checkpoints pooled over {'; '.join(parts)}"


def make_all_figures(
    run_dir: str | Path, results: pd.DataFrame | None = None, *, manipulation_auc: pd.DataFrame | None = None,
    regime: str | None = R.MAIN_REGIME,
) -> tuple[dict[str, Path | None], dict[str, str]]:
    """Draw every figure the inputs allow. Returns ({name: path or None}, {name: why it was skipped})."""
    run_dir = Path(run_dir)
    if results is None:
        results = RunFolder(run_dir).results()
    if manipulation_auc is None:
        manipulation_auc = RunFolder(run_dir).manipulation_auc()
    # name -> (the plot, its positional and keyword arguments)
    jobs: Mapping[str, tuple[Callable[..., Path | None], tuple[Any, ...], dict[str, Any]]] = {
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
