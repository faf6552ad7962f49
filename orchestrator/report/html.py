"""``report.html``: one page per run folder, assembled from the report's parts in reading order: which runs
leaked (:mod:`~orchestrator.report.leaked`), the summary and definitions (:mod:`~orchestrator.report.summary`),
the verdict rule (:mod:`~orchestrator.report.verdict_rule`), the feature sections (:mod:`~orchestrator.report.epsilon`,
:mod:`~orchestrator.report.attacks`, :mod:`~orchestrator.report.canaries`, :mod:`~orchestrator.report.frontier`,
:mod:`~orchestrator.report.context_audits`), the provenance block, then every paper table
(:mod:`~orchestrator.report.tables`) with its figure (:mod:`~orchestrator.report.figures`), linked or embedded;
and ``lm_report.html``, the LM probes' page. Both in the shell of :mod:`~orchestrator.report.page`. The run
folder is read only through :class:`orchestrator.runfolder.run_folder.RunFolder`, and only public columns and provenance
fields.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from iclmem.atomic import write_text_atomic
from iclmem.errors import DataError
from iclmem.provenance import PUBLIC_FIELDS
from iclmem.runfolder import (
    FIGURES_DIR,
    LM_REPORT_FILE,
    MANIPULATION_AUC_FILE,
    REPORT_FILE,
    SPLIT_REPORT_FILE,
    SWEEP_FILE,
)
from iclmem.vocab import BASE_MODEL_ROW
from orchestrator.report.attacks import attacks_section_html
from orchestrator.report.canaries import canaries_section_html
from orchestrator.report.claims import claim_error_rates
from orchestrator.report.context_audits import context_audits_section_html
from orchestrator.report.epsilon import epsilon_section_html
from orchestrator.report.frontier import frontier_section_html
from orchestrator.report.leaked import leaked_html, leaked_lines
from orchestrator.report.ledger import ledger_html, ledger_lines
from orchestrator.report.overview import checkpoint_schedule, noop_manipulations, run_completeness
from orchestrator.report.page import df_to_html, note_html, page, tpr_1pct_display
from orchestrator.report.paper_tables import (
    calibration_impact,
    detectable_share_by_epoch,
    outcome_counts_per_q,
    outcome_rates_per_q,
    peak_vulnerability_per_task,
    perturbation_effectiveness,
    regime_comparison,
    split_validation,
    task_characteristics,
    task_lr_q_table,
)
from orchestrator.report.risk import risk_section_html
from orchestrator.report.selection import BASE_MANIPULATION, FACET_AXES, MAIN_REGIME, RUN_KEY, filter_regime
from orchestrator.report.summary import definitions_html, status_cell, summary_html
from orchestrator.report.thresholds import rule_in_force, thresholds_in_force
from orchestrator.report.verdict_rule import guarantee_text, verdict_rule_html
from orchestrator.runfolder.run_folder import RunFolder

# leaked_lines, ledger_lines: where `iclmem run` and `iclmem report` (orchestrator/cli.py) import them from
__all__ = ["write_html_report", "write_lm_html_report", "leaked_lines", "ledger_lines"]


def _img(run_dir: Path, path: Path, alt: str, embed: bool) -> str:
    if embed:
        src = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
    else:
        src = path.relative_to(run_dir).as_posix()
    return f'<figure><img src="{html.escape(src)}" alt="{html.escape(alt)}"><figcaption class="caption">' \
           f"{html.escape(alt)}</figcaption></figure>"


def _provenance_html(prov: Mapping[str, Any], results: pd.DataFrame) -> str:
    items: list[tuple[str, str]] = []
    for k in PUBLIC_FIELDS:
        if k in prov:
            items.append((k, str(prov[k])))
    for col in ("config_hash", "git_commit"):
        if col in results.columns and col not in prov:
            vals = sorted({str(v) for v in results[col].dropna().unique()})
            if vals:
                shown = ", ".join(vals[:5]) + (f" (+{len(vals) - 5} more)" if len(vals) > 5 else "")
                items.append((f"{col} (results)", shown))
    for name, version in prov.get("packages", {}).items():
        items.append((f"package {name}", version))
    items.append(("report generated", _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")))
    dl = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items)
    return f'<dl class="prov">{dl}</dl>'


# The run table's first columns: the run, then how strongly it leaked, before the many outcome and setting columns
RUN_TABLE_LEAD: tuple[str, ...] = ("run_id", "auc", "auc_low", "auc_high", "tpr_at_1pct", "tpr_at_10pct", "outcome",
                                   "epoch")


def _run_table_display(table: pd.DataFrame, comp: pd.DataFrame) -> pd.DataFrame:
    """A run table with its completeness (``checkpoints`` stored of scheduled, ``status``) and TPR@1% caveat; the
    run id first, then AUC with its interval and the TPRs (never off screen to the right), then the rest."""
    key = [c for c in RUN_KEY if c in table.columns and c in comp.columns]
    out = table
    if key and not comp.empty:
        c = comp.assign(checkpoints=[status_cell(r) for r in comp.to_dict("records")])[[*key, "checkpoints", "status"]]
        out = table.merge(c, on=key, how="left")
    lead = [c for c in RUN_TABLE_LEAD if c in out.columns]
    out = out.loc[:, [*lead, *(c for c in out.columns if c not in lead)]]
    return tpr_1pct_display(out)


def _noop_html(noops: pd.DataFrame) -> str:
    """The perturbation section's word on manipulations that changed nothing for the audited model."""
    if noops.empty:
        return ""
    out = []
    for model, d in noops.groupby("model", sort=True):
        out.append(f"<p class=\"note\"><b>{len(d)} manipulation(s) are no-ops for "
                   f"{html.escape(str(model) or 'the audited model')}:</b> their per-manipulation AUC equals the "
                   f"<code>{BASE_MANIPULATION}</code> context's at every one of its fine-tuned checkpoints "
                   f"({int(d['n_checkpoints'].min())} or more). The model is invariant to what they change (e.g. "
                   "row order for position moves, uniform repetition for a model that weights rows by "
                   "multiplicity), so they add no evidence and their ranking below only repeats the base's: "
                   f"{html.escape(', '.join(d['manipulation']))}.</p>")
    return "".join(out)


def _grid_axes_note(results: pd.DataFrame) -> str:
    """Which grid axes vary in the sweep and how the figures treat them (faceted, or seeds averaged)."""
    varying = [a for a in FACET_AXES if a in results.columns and results[a].nunique(dropna=False) > 1]
    seeds = results["seed"].nunique() if "seed" in results.columns else 1
    parts = []
    if varying:
        parts.append(f" Figures draw one panel per value of {', '.join(varying)}, never pooling them")
    if seeds > 1:
        parts.append(f"{'; lines' if varying else ' Lines'} average over {seeds} seeds")
    return ("".join(parts) + ".") if parts else ""


def write_html_report(
    run_dir: str | Path, *, title: str | None = None, make_figures: bool = True, embed_images: bool = False,
    regime: str | None = "auto", forced: str | None = None,
) -> Path:
    """Write ``RUN_DIR/report.html``: every paper table, the figures and a provenance block.

    Figures are written to ``RUN_DIR/figures/`` and referenced by relative path (they load from
    ``file://``), or embedded as base64 with ``embed_images``. ``regime="auto"`` uses single_fixed for
    the main-regime sections when the sweep has it, else pools every regime. Missing optional inputs skip
    their section with a note. Only allow-listed columns are read, so no raw value can reach the page.
    ``forced``: why ``iclmem report`` refused the folder before ``--force`` (its ``sweep.json`` is not the
    config its results were made with); the page's top says so, above everything read from that file.
    """
    folder = RunFolder(run_dir)
    run_dir = folder.path
    results = folder.results()
    split = folder.split_report()
    manip = folder.manipulation_auc()
    prov = folder.public_provenance()
    if regime == "auto":
        regime = MAIN_REGIME if "regime" in results.columns and (results["regime"] == MAIN_REGIME).any() else None

    figs: dict[str, Path | None] = {}
    fig_notes: dict[str, str] = {}
    if make_figures:
        from orchestrator.report import figures as _figures  # matplotlib only when figures are wanted

        figs, fig_notes = _figures.make_all_figures(run_dir, results, manipulation_auc=manip, regime=regime)

    parts: list[str] = []

    def section(hid: str, heading: str, caption: str, body: str) -> None:
        parts.append(f'<section id="{hid}"><h2>{html.escape(heading)}</h2>'
                     f'<p class="caption">{html.escape(caption)}</p>{body}</section>')

    def figure(name: str, alt: str) -> str:
        p = figs.get(name)
        if p is not None and Path(p).is_file():
            return _img(run_dir, Path(p), alt, embed_images)
        if not make_figures:
            return ""
        return note_html(f"Figure '{name}' not drawn: {fig_notes.get(name, 'no data')}.")

    def optional(fn: Callable[..., pd.DataFrame], *args: Any, **kwargs: Any) -> tuple[pd.DataFrame | None, str | None]:
        try:
            return fn(*args, **kwargs), None
        except (KeyError, ValueError, TypeError, DataError) as exc:  # malformed optional input
            return None, f"section could not be built ({type(exc).__name__})"

    scope = f"regime {regime}" if regime else "all regimes"
    sweep = folder.sweep_or_none
    interrupted = folder.interrupted
    schedule = checkpoint_schedule(sweep)
    diverged = folder.diverged_runs()
    comp = run_completeness(results, schedule, interrupted=interrupted, diverged=diverged)
    settings, source, disagree = thresholds_in_force(results, sweep)
    rule = rule_in_force(results, settings)
    noops = noop_manipulations(manip, results) if manip is not None else pd.DataFrame()
    facet_axes = [a for a in FACET_AXES if a in results.columns and filter_regime(results, regime)[a].nunique(dropna=False) > 1]
    # the task-level claims are measured over what Tab. 8 takes its maximum over: this scope, these facets
    claims = claim_error_rates(results, regime=regime, by=tuple(facet_axes), rule=rule)
    if forced:
        parts.append('<section id="forced"><h2 class="warn">Forced report</h2><p class="warn"><b>Made with '
                     "<code>iclmem report --force</code> despite a refusal:</b> "
                     f"{html.escape(forced)} The rule, thresholds and schedule below are read from "
                     f"{html.escape(SWEEP_FILE)}; the stored verdicts were made with the config the results were "
                     "run with, which may differ.</p></section>")
    claims_first = ledger_html(folder.claim_ledger())
    if claims_first:  # first: what the audit claims, how much, how sure, for the data owner
        parts.append(claims_first)
    owner = risk_section_html(folder.risk_tables(), run_dir / FIGURES_DIR, draw=make_figures)
    if owner:  # then whose rows and which groups, the tables the claims come from
        parts.append(f'<section id="risk">{owner}</section>')
    parts.append(leaked_html(results))  # then which runs leaked, before the counts and the rule
    parts.append(summary_html(results, sweep, comp, schedule, interrupted, noops, settings, rule, source, diverged,
                              claims))
    parts.append(verdict_rule_html(results, settings, source, disagree, rule, claims))
    parts.append(definitions_html(results, settings))
    facets = _grid_axes_note(filter_regime(results, regime))
    parts.append(f"<p>The sections below cover {html.escape(scope)}. Rows of regime <code>{BASE_MODEL_ROW}</code> "
                 "are the pipeline sanity check (the untouched base model probed as a checkpoint: ΔS is zero by "
                 "construction, so its AUC is 0.5 whatever the data; it checks the pipeline, it is not a control "
                 f"and cannot fail). The controls are the null splits above.{html.escape(facets)}</p>")

    privacy = epsilon_section_html(results, run_dir / FIGURES_DIR)
    if privacy:
        parts.append(f'<section id="privacy">{privacy}</section>')
    parts.append(attacks_section_html(results, run_dir / FIGURES_DIR))  # empty unless probe.references is on
    canaries = canaries_section_html(results, run_dir / FIGURES_DIR)  # empty unless the sweep has canaries
    if canaries:
        parts.append(f'<section id="canaries">{canaries}</section>')
    frontier = frontier_section_html(results, run_dir / FIGURES_DIR)  # empty without true-label utility rows
    if frontier:
        parts.append(f'<section id="frontier">{frontier}</section>')
    context_audits = context_audits_section_html(run_dir)  # empty unless the sweep has regime context
    if context_audits:
        parts.append(f'<section id="context-audits">{context_audits}</section>')
    section("provenance", "Provenance", "Configuration hash, code version and package versions.",
            _provenance_html(prov, results) + ("" if prov else note_html("provenance.json not found; values "
                                                                         "shown come from the results table.")))
    facet_caption = f" (one panel per {' × '.join(facet_axes)})" if facet_axes else ""
    counts = outcome_counts_per_q(results, regime=regime, by=tuple(facet_axes))
    rates = outcome_rates_per_q(results, regime=regime, by=tuple(facet_axes))
    apart = f"; {', '.join(facet_axes)} counted apart" if facet_axes else ""
    section("outcome-rates", "Outcome rates per Q", f"Runs at their peak checkpoint ({scope}{apart}): counts, then "
            "shares.",
            df_to_html(counts, index=True) + df_to_html(rates, index=True))
    section("task-table", "Task × learning rate × Q (Tabs. 10–11)",
            "Outcome under the sweep's rule and under each rule, AUC (deciding kind, with 95% interval and "
            "p-value), TPR@1%, TPR@10% (same kind), members and non-members the AUC compares, loss ratio, the "
            "known-context baseline's AUC and epoch at each run's peak; checkpoints stored of those scheduled.",
            df_to_html(_run_table_display(task_lr_q_table(results, regime=regime), comp))
            + figure("outcome_heatmap", "Outcome at peak" + facet_caption))
    section("detectable-by-epoch", "Detectable runs by epoch (Fig. 2)",
            "Share of runs flagged memorization at each checkpoint epoch, per Q.",
            df_to_html(detectable_share_by_epoch(results, regime=regime, by=tuple(facet_axes)))
            + figure("detectable_share", "Share of detectable runs by epoch" + facet_caption))
    section("peak-vulnerability", "Peak vulnerability per task (Tab. 8)",
            "Highest calibrated AUC of each task over its runs, and the share of runs flagged memorization. The "
            "peak's outcome and an n_memorization above 0 are maxima over the task's runs: not covered by the "
            f"{guarantee_text(settings)} guarantee, which bounds one run's headline (their false-positive rates, "
            "measured on the null splits, are at the top). task_verdict is the task-level verdict that is "
            "covered: selection-aware memorization at some checkpoint with a p-value below "
            "task_p_value_threshold = family_alpha / task_family_size (Bonferroni over every run of the task). "
            "null_peak_auc: the peak AUC the null splits reach with the same selection.",
            df_to_html(tpr_1pct_display(peak_vulnerability_per_task(results, regime=regime, by=tuple(facet_axes)))))
    section("auc-epochs", "AUC over epochs", "Calibrated AUC (best score kind) per checkpoint, by learning rate; "
            "the dashed line is chance (0.5).",
            figure("auc_over_epochs", "AUC over epochs per learning rate" + facet_caption))
    section("roc", "ROC curves", "Calibrated deciding score at each run's peak checkpoint, log-log axes; the "
            "legend names every grid axis that differs between the curves, the dashed diagonal is chance.",
            figure("roc_curves", "ROC curves at peak checkpoints"))

    if split is None:
        body = note_html(f"{SPLIT_REPORT_FILE} not found; section skipped.")
    else:
        t, err = optional(split_validation, split)
        body = note_html(err) if err else df_to_html(t)
    section("split-validation", "Split validation (Tab. 6)",
            "Members vs non-members: TVD (classification) or KS with p-value and Wasserstein (regression); the label "
            "design, the blind baseline (AUC of a model fitted on C' alone, with its 95% interval) and the draws "
            "Stage I refused because their groups were separable without the model.", body)

    t, err = optional(calibration_impact, results, regime=regime)
    section("calibration", "Calibration impact (App. 7.4)",
            "Memorization flags from the calibrated score ΔS vs the uncalibrated score S, the same rule on "
            "both, per non-collapsed fine-tuned checkpoint.",
            note_html(err) if err else df_to_html(t, index=True))

    if manip is None:
        body = note_html(f"{MANIPULATION_AUC_FILE} not found; section skipped.")
    else:
        t, err = optional(perturbation_effectiveness, manip, results)
        t2, err2 = optional(perturbation_effectiveness, manip, results, by="category")
        body = (_noop_html(noops) + (note_html(err) if err else df_to_html(t))
                + (note_html(err2) if err2 else df_to_html(t2))
                + figure("perturbation_ranking", "Mean per-manipulation ΔAUC"))
    section("perturbations", "Perturbation effectiveness (App. 7.3)",
            "Over checkpoints with detectable memorization: each manipulation's AUC (calibrated loss) minus the "
            "AUC of the unmanipulated context (base) at the same checkpoint, ranked by the mean of that "
            "difference; mean_delta_auc_vs_suite is the same against the checkpoint's overall AUC(ΔS).", body)

    if split is None:
        body = note_html(f"{SPLIT_REPORT_FILE} not found; section skipped.")
    else:
        t, err = optional(task_characteristics, results, split, regime=regime)
        body = note_html(err) if err else df_to_html(t)
    section("task-characteristics", "Task characteristics vs outcome (Fig. 6)",
            "Cardinality, majority-class share, size and numeric share against outcome shares at peak.", body)

    section("regimes", "Realistic regimes (Tab. 12)",
            "single_fixed vs multi_fixed vs multi_random at peak checkpoints, per Q.",
            df_to_html(regime_comparison(results)))

    title = title or f"IclMem report — {run_dir.name}"
    return write_text_atomic(run_dir / REPORT_FILE, page(f"{title} (forced)" if forced else title, parts))


def write_lm_html_report(run_dir: str | Path, results: pd.DataFrame, *, title: str | None = None) -> Path:
    """Write ``RUN_DIR/lm_report.html``: the provenance block and the LM probes' Tables 2-6
    (``probes.lm.report``). Numbers, model, dataset and entity-type names only, never a sentence or an entity."""
    from probes.lm.report import lm_report_section

    run_dir = Path(run_dir)
    prov = RunFolder(run_dir).public_provenance()
    provenance = (f'<section id="provenance"><h2>Provenance</h2>{_provenance_html(prov, results)}'
                  + ("" if prov else note_html("provenance.json not found.")) + "</section>")
    return write_text_atomic(run_dir / LM_REPORT_FILE,
                             page(title or f"LM probes — {run_dir.name}", [provenance, lm_report_section(results)]))
