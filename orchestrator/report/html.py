"""The HTML report: one page per run folder with every paper table, the figures, the verdict rule and its
thresholds as the run's config states them, and a provenance block.

The page is assembled from :mod:`orchestrator.report.tables` (pure tables), :mod:`orchestrator.report.figures`
and the section modules (:mod:`~orchestrator.report.epsilon`, :mod:`~orchestrator.report.attacks`,
:mod:`~orchestrator.report.canaries`); it reads the run folder only through
:class:`orchestrator.run_folder.RunFolder`, and only public columns and provenance fields.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import math
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from iclmem.atomic import write_text_atomic
from iclmem.errors import DataError
from iclmem.provenance import PUBLIC_FIELDS
from iclmem.runfolder import (
    FIGURES_DIR,
    LM_REPORT_FILE,
    MANIPULATION_AUC_FILE,
    REPORT_FILE,
    RUN_STATE_FILE,
    SPLIT_REPORT_FILE,
    SWEEP_FILE,
)
from iclmem.vocab import BASE_MODEL_ROW, VerdictRule
from orchestrator.config import OutcomeConfig, SweepConfig
from orchestrator.report.tables import (
    BASE_MANIPULATION,
    CHECKPOINT_ANY_ATTACK,
    CLAIMS,
    DETECTABLE,
    FACET_AXES,
    MAIN_REGIME,
    RUN_HEADLINE_ANY_ATTACK,
    RUN_KEY,
    TASK_ANY_RUN,
    TASK_PEAK,
    TASK_VERDICT,
    THRESHOLD_MEANINGS,
    blind_baseline_summary,
    calibration_impact,
    checkpoint_schedule,
    claim_error_rates,
    competing_kinds,
    detectable_share_by_epoch,
    filter_regime,
    fine_tuned_rows,
    missing_runs,
    noop_manipulations,
    null_error_rates,
    outcome_counts_per_q,
    outcome_rates_per_q,
    outcome_summary,
    peak_checkpoints,
    peak_vulnerability_per_task,
    perturbation_effectiveness,
    regime_comparison,
    rule_in_force,
    run_completeness,
    sample_sizes,
    split_validation,
    task_characteristics,
    task_lr_q_table,
    thresholds_in_force,
    verdict_rule_summary,
)
from orchestrator.run_folder import RunFolder
from probes.metrics import allowed_false_positives

# --------------------------------------------------------------------------------------------------
# HTML page
# --------------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em;color:#222;max-width:1400px}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table.data{border-collapse:collapse;font-size:13px;margin:.5em 0}
table.data th,table.data td{border:1px solid #ddd;padding:3px 7px;text-align:right}
table.data th{background:#f3f3f3} table.data tr:nth-child(even) td{background:#fafafa}
.note{color:#8a5a00;background:#fff7e0;border-left:4px solid #f0b400;padding:.4em .8em}
.scroll{overflow-x:auto;max-width:100%}
.caption{color:#555;font-size:13px} figure{margin:1em 0} figure img{max-width:100%;border:1px solid #eee}
dl.prov{display:grid;grid-template-columns:max-content auto;gap:2px 12px;font-size:13px}
dl.prov dt{font-weight:600} dl.prov dd{margin:0;font-family:monospace}
#summary{background:#f6f8fb;border:1px solid #d8dee8;padding:.2em 1.2em 1em}
p.verdict{font-size:18px} .warn{color:#9a2a00} table.data td.text{text-align:left;white-space:normal}
dl.defs dt{font-weight:600;margin-top:.5em} dl.defs dd{margin:0 0 0 1.5em;max-width:70em}
"""

# Sets data-img-total / data-img-loaded on <body> once every image has loaded (or failed), and each image's
# decoded size as data-size, so a headless browser can check that the page is complete and what it drew
# (`chromium --dump-dom`).
_IMG_CHECK_JS = """
window.addEventListener('load', function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) {
    imgs[i].setAttribute('data-size', imgs[i].naturalWidth + 'x' + imgs[i].naturalHeight);
    if (imgs[i].complete && imgs[i].naturalWidth > 0) { ok++; imgs[i].setAttribute('data-loaded', '1'); }
    else { imgs[i].setAttribute('data-loaded', '0'); }
  }
  document.body.setAttribute('data-img-total', String(imgs.length));
  document.body.setAttribute('data-img-loaded', String(ok));
});
"""


def _fmt_value(col: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        if col == "lr" or col.endswith(("_pvalue", "p_value", "p_value_threshold")):  # 2e-7 must not read 0.000
            return f"{float(v):.3g}"
        if float(v).is_integer() and col in ("q", "seed", "epoch", "n_rows", "n_classes"):
            return str(int(v))
        return f"{float(v):.3f}"
    return str(v)


def df_to_html(df: pd.DataFrame, *, index: bool = False) -> str:
    """A small, escaped HTML table (floats to 3 decimals, learning rates in %g)."""
    d = df.reset_index() if index else df
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in d.columns)
    body = []
    for row in d.itertuples(index=False, name=None):
        cells = "".join(f"<td>{html.escape(_fmt_value(str(c), v))}</td>" for c, v in zip(d.columns, row))
        body.append(f"<tr>{cells}</tr>")
    return f'<div class="scroll"><table class="data"><thead><tr>{head}</tr></thead>' \
           f'<tbody>{"".join(body)}</tbody></table></div>'


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


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


def _rule_sentence(settings: Mapping[str, str], rule: str, p_threshold: str | None) -> str:
    """The outcome precedence with this sweep's numbers in it (HTML)."""
    g = {k: html.escape(v) for k, v in settings.items()}
    alpha = g.get("memorization_alpha", "0.1")
    try:
        alpha_pct = f"{float(settings.get('memorization_alpha', 0.1)) * 100:g}%"
    except ValueError:
        alpha_pct = alpha
    mem = (f"for some competing score kind ({g.get('score_kinds', 'loss, entropy')}), calibrated AUC &gt; "
           f"{g.get('memorization_auc', '0.5')} and TPR@{alpha_pct} − {alpha} ≥ {g.get('memorization_tpr_margin', '0.1')}")
    if rule.endswith("_strict"):
        mem += f", and the AUC's 95% interval above {g.get('memorization_auc', '0.5')} (strict)"
    if rule.startswith(VerdictRule.SELECTION_AWARE.value):
        mem += (", and a one-sided Mann–Whitney p-value below family_alpha / K = "
                + (html.escape(p_threshold) if p_threshold else f"{g.get('family_alpha', '0.05')} / K"))
    return ("A checkpoint's outcome is the first of these that holds: "
            f"<b>collapse</b> (loss ratio &gt; {g.get('collapse_loss_ratio', '5')} or output std &lt; "
            f"{g.get('collapse_output_std', '0.01')}) → <b>memorization</b> ({mem}) → <b>inversion</b> (mean member "
            "probe loss above the non-members' and the uncalibrated loss AUC's 95% interval below "
            f"{g.get('inversion_auc', '0.5')}) → <b>overfitting</b> (|μ_gap| ≤ {g.get('overfitting_mu', '0.01')} and "
            f"σ_gap ≤ {g.get('overfitting_sigma', '0.01')} nats) → <b>no_signal</b>.")


def _status_cell(row: Mapping[str, Any]) -> str:
    if row["status"] == "unknown":
        return f"{int(row['n_stored'])} stored"
    return f"{int(row['n_stored'])} of {int(row['n_scheduled'])}"


def _completeness_html(comp: pd.DataFrame, schedule: tuple[int, ...] | None, interrupted: bool,
                       missing: Mapping[str, tuple[int, int]], n_diverged: int = 0) -> str:
    """The report-top lines on what is stored of the sweep."""
    lines = []
    if interrupted:
        lines.append("<li class=\"warn\"><b>Interrupted:</b> the sweep was stopped before it finished (as the run "
                     f"folder's {html.escape(RUN_STATE_FILE)} records). Continue it with "
                     "<code>iclmem resume RUN_DIR</code>; the numbers here cover only what was stored.</li>")
    if schedule is None:
        lines.append(f"<li>Completeness not checked: no {SWEEP_FILE} with a training schedule in the run folder.</li>")
        return "".join(lines)
    sched = ", ".join(str(e) for e in schedule)
    gaps = comp[comp["status"].isin(["incomplete", "interrupted"])]
    diverged = comp[comp["status"] == "diverged"]
    n = len(comp)
    n_complete = int((comp["status"] == "complete").sum())
    if n_complete == n:
        lines.append(f"<li>Every one of the {n} fine-tuned runs has all {len(schedule)} scheduled checkpoints "
                     f"(epochs {html.escape(sched)}).</li>")
    elif gaps.empty:
        lines.append(f"<li>{n_complete} of the {n} fine-tuned runs have all {len(schedule)} scheduled checkpoints "
                     f"(epochs {html.escape(sched)}).</li>")
    else:
        word = "interrupted" if interrupted else "incomplete"
        items = "".join(f"<li><code>{html.escape(str(r['run_id']))}</code>"
                        + (f" ({html.escape(str(r['task']))})" if "task" in r else "")
                        + f": {_status_cell(r)} checkpoints, last epoch {int(r['last_epoch'])}</li>"
                        for r in gaps.head(20).to_dict("records"))
        more = f"<li>… and {len(gaps) - 20} more</li>" if len(gaps) > 20 else ""
        lines.append(f"<li class=\"warn\"><b>{len(gaps)} of {n} runs are {word}</b>: fewer stored checkpoints "
                     f"than the {len(schedule)} scheduled (epochs {html.escape(sched)}); their headline is the "
                     f"peak of what is stored.<ul>{items}{more}</ul></li>")
    if n_diverged:  # the runs the driver recorded: those in ``diverged`` and any that diverged before a checkpoint
        lines.append(f"<li>{n_diverged} run(s) diverged (NaN loss) and stopped early: a result, not a gap"
                     + (f" ({n_diverged - len(diverged)} before their first checkpoint, so in no table)"
                        if n_diverged > len(diverged) else "") + ".</li>")
    for regime, (k, total) in sorted(missing.items()):
        lines.append(f"<li class=\"warn\"><b>{k} of the {total} {html.escape(regime)} runs the grid schedules have "
                     "no stored checkpoint</b> and are in no table.</li>")
    return "".join(lines)


def _blind_items(results: pd.DataFrame) -> list[str]:
    b = blind_baseline_summary(results)
    if not b:
        return []
    items = [f"<li><b>Blind baseline:</b> members vs non-members scored by a model fitted on C′ alone (no "
             f"fine-tuned model, labels as probed): AUC median {b['median']:.3f} (range {b['low']:.3f}–"
             f"{b['high']:.3f}) over {b['n_runs']} run{'s' if b['n_runs'] != 1 else ''}; {b['n_separable']} "
             "separable (95% interval excluding 0.5). Column <code>blind_auc</code> beside every verdict.</li>"]
    if b["n_not_exchangeable"]:
        why = (f"{b['n_unmatched']} use the paper's unmatched design (<code>data.label_design: unmatched</code>: "
               "members scored on permuted labels, non-members on true ones)" if b["n_unmatched"] else
               "their blind interval excludes 0.5")
        items.append(f'<li class="warn"><b>Members and non-members are separable without the model in '
                     f"{b['n_not_exchangeable']} of {b['n_runs']} runs</b>: {why}. Their AUCs and verdicts measure "
                     "the difference between the groups' labels as much as membership: read each against its "
                     "blind AUC. No ε lower bound is given for them.</li>")
    return items


def _guarantee(settings: Mapping[str, str]) -> str:
    """The selection-aware rule's bound on a run headline's false-positive rate as a share, e.g. "5%"."""
    try:
        alpha = float(settings.get("family_alpha", OutcomeConfig().family_alpha))
    except ValueError:
        alpha = OutcomeConfig().family_alpha
    return f"{alpha * 100:g}%"


def _rate_text(r: Mapping[str, Any], trials: str) -> str:
    return (f"{int(r['n_memorization'])} of {int(r['n_null'])} {trials} ({r['fpr']:.1%}; 95% Clopper-Pearson "
            f"interval {r['fpr_low']:.1%}–{r['fpr_high']:.1%})")


# How the report's top names each claim beyond one run's headline, and what one null trial of it is.
_CLAIM_WORDS: dict[str, tuple[str, str]] = {
    TASK_PEAK.name: ("the task-level peak (Tab. 8)", "null task peaks"),
    TASK_ANY_RUN.name: ("some run of the task (Tab. 8's n_memorization)", "null tasks"),
    TASK_VERDICT.name: ("Tab. 8's task_verdict (Bonferroni over every run of the task)", "null tasks"),
    CHECKPOINT_ANY_ATTACK.name: ("IclMem or any attack at a checkpoint", "null checkpoints"),
    RUN_HEADLINE_ANY_ATTACK.name: ("IclMem or any attack at the run headline", "null run headlines"),
}


def _claim_phrases(claims: pd.DataFrame, rule: str, covered: bool) -> list[str]:
    """"<claim> said memorization on k of n <trials> (...)" for the rule in force's claims that are (or are
    not) covered by the selection-aware bound, in :data:`CLAIMS` order."""
    mine = claims[(claims["rule"] == rule) & (claims["covered"] == covered)].set_index("claim")
    return [f"{_CLAIM_WORDS[c.name][0]}: {_rate_text(mine.loc[c.name], _CLAIM_WORDS[c.name][1])}"
            for c in CLAIMS if c.name in mine.index]


def _false_positive_item(rates: pd.DataFrame, claims: pd.DataFrame, rule: str, settings: Mapping[str, str]) -> str:
    """The report-top line on the verdicts' measured false positives: the run headline's (what the
    selection-aware bound covers) beside the claims it does not cover, each with its interval."""
    head = rates[(rates["rule"] == rule) & (rates["level"] == "run_headline")] if not rates.empty else rates
    if head.empty:
        return ""
    bound = _guarantee(settings)
    covered = (f"the claim the {bound} guarantee covers" if rule.startswith(VerdictRule.SELECTION_AWARE.value)
               else f"no guarantee under the {html.escape(rule)} rule; selection_aware's {bound} would cover it")
    item = (f"<li><b>Measured false positives</b> (null splits, rule <code>{html.escape(rule)}</code>): run "
            f"headline ({covered}) {_rate_text(head.iloc[0], 'null run headlines')}.")
    uncovered = _claim_phrases(claims, rule, covered=False)
    if uncovered:
        item += (f' <span class="warn"><b>Not covered by the {bound} guarantee:</b> '
                 f"{html.escape('; '.join(uncovered))}.</span>")
    controlled = _claim_phrases(claims, rule, covered=True)
    if controlled:
        item += f" Covered: {html.escape('; '.join(controlled))}."
    return item + ' See <a href="#verdict-rule">the verdict rule</a>.</li>'


LEAKED_COLUMNS: tuple[str, ...] = ("run_id", "task", "model", "q", "lr", "label_mode", "seed", "epoch", "score_kind",
                                   "auc", "auc_low", "auc_high", "tpr_at_1pct", "n_nonmembers")


def leaked_runs(results: pd.DataFrame) -> pd.DataFrame:
    """The fine-tuned runs whose headline checkpoint (the peak, as the summary counts them) has a memorization
    verdict, one row each: run id, the checkpoint's epoch, its AUC (deciding kind) with the 95% interval, TPR at
    1% FPR and the non-members it rests on; highest AUC first. Every regime, as the outcome counts."""
    peaks = peak_checkpoints(fine_tuned_rows(results), regime=None)
    if peaks.empty or "outcome" not in peaks.columns:
        return pd.DataFrame(columns=list(LEAKED_COLUMNS))
    leaked = peaks[peaks["outcome"].astype(str) == DETECTABLE]
    cols = [c for c in LEAKED_COLUMNS if c in leaked.columns]
    order = [c for c in ("auc", "run_id", "task") if c in leaked.columns]
    return (leaked.loc[:, cols].sort_values(order, ascending=[c != "auc" for c in order], kind="mergesort")
            .reset_index(drop=True))


def known_context_only_runs(results: pd.DataFrame, leaked: pd.DataFrame | None = None) -> pd.DataFrame:
    """The fine-tuned runs the zero-information verdict did not call memorization at their headline checkpoint
    but whose known-context channel flagged a checkpoint (``known_context_memorization_flag``: the same rule on
    the base-calibrated loss with C' as context, docs/METHOD.md "Where the zero-information probe is blind"), one
    row each at the flagged checkpoint of highest known-context AUC: run id, task, epoch, that AUC with its
    interval and TPR at 10% FPR; highest AUC first. Empty when the results have no such column. ``leaked``: the
    results' :func:`leaked_runs`, when the caller has them already."""
    columns = ["run_id", "task", "model", "epoch", "known_context_calibrated_auc", "known_context_calibrated_auc_low",
               "known_context_calibrated_auc_high", "known_context_calibrated_tpr_at_10pct"]
    ft = fine_tuned_rows(results)
    if ft.empty or "known_context_memorization_flag" not in ft.columns:
        return pd.DataFrame(columns=columns)
    flagged = ft[ft["known_context_memorization_flag"].fillna(False).astype(bool)]
    leaked = leaked_runs(results) if leaked is None else leaked
    flagged = flagged[~flagged["run_id"].isin(set(leaked["run_id"]))]
    if flagged.empty:
        return pd.DataFrame(columns=columns)
    best = (flagged.sort_values(["known_context_calibrated_auc", "epoch"], ascending=[False, True], kind="mergesort")
            .drop_duplicates("run_id"))
    return best.loc[:, [c for c in columns if c in best.columns]].reset_index(drop=True)


def _where(r: Mapping[str, Any]) -> str:
    """" [task, model]" of a leaked run's line: a run id does not name its model."""
    named = [str(r[k]) for k in ("task", "model") if k in r and pd.notna(r[k])]
    return f" [{', '.join(named)}]" if named else ""


def _known_context_text(r: Mapping[str, Any]) -> str:
    return (f"epoch {int(r['epoch'])}, known-context AUC {_fmt_value('auc', r.get('known_context_calibrated_auc'))} "
            f"[{_fmt_value('auc', r.get('known_context_calibrated_auc_low'))}, "
            f"{_fmt_value('auc', r.get('known_context_calibrated_auc_high'))}]")


def leaked_lines(results: pd.DataFrame, limit: int = 20) -> list[str]:
    """The leaked runs as plain lines, for a terminal summary (what the report's first section shows)."""
    table = leaked_runs(results)
    _, n_runs = outcome_summary(results)
    if table.empty:
        return [f"No run leaked: none of the {n_runs} fine-tuned runs has a memorization verdict at its headline "
                "checkpoint."] + _known_context_lines(results, table, limit)
    lines = [f"{len(table)} of {n_runs} runs leaked (memorization at the headline checkpoint):"]
    for r in table.head(limit).to_dict("records"):
        lines.append(f"  {r['run_id']}{_where(r)}: epoch {int(r['epoch'])}, "
                     f"AUC {_fmt_value('auc', r.get('auc'))} [{_fmt_value('auc', r.get('auc_low'))}, "
                     f"{_fmt_value('auc', r.get('auc_high'))}], TPR@1% {_fmt_value('tpr_at_1pct', r.get('tpr_at_1pct'))}"
                     + (" (0 FP allowed)" if pd.notna(r.get("n_nonmembers"))
                        and allowed_false_positives(0.01, int(r["n_nonmembers"])) == 0 else ""))
    if len(table) > limit:
        lines.append(f"  ... and {len(table) - limit} more (report.html, section 'Runs that leaked')")
    return lines + _known_context_lines(results, table, limit)


def _known_context_lines(results: pd.DataFrame, leaked: pd.DataFrame, limit: int) -> list[str]:
    table = known_context_only_runs(results, leaked)
    if table.empty:
        return []
    more = "more " if not leaked.empty else ""
    lines = [f"{len(table)} {more}run{'s' if len(table) != 1 else ''} leaked through the known context C' only "
             "(known_context_memorization_flag; the zero-information probe did not find it):"]
    for r in table.head(limit).to_dict("records"):
        lines.append(f"  {r['run_id']}{_where(r)}: {_known_context_text(r)}")
    if len(table) > limit:
        lines.append(f"  ... and {len(table) - limit} more (report.html, section 'Runs that leaked')")
    return lines


def _leaked_html(results: pd.DataFrame) -> str:
    """The report's first section: which runs leaked, at which epoch, how strongly (AUC with its interval, TPR at
    1% FPR), before the outcome counts and the rule."""
    table = leaked_runs(results)
    _, n_runs = outcome_summary(results)
    if table.empty:
        body = (f"<p class=\"verdict\"><b>No run leaked:</b> none of the {n_runs} fine-tuned run"
                f"{'s' if n_runs != 1 else ''} has a memorization verdict at its headline checkpoint.</p>")
    else:
        shown = pd.DataFrame({
            "run_id": table["run_id"],
            **({"task": table["task"]} if "task" in table.columns else {}),
            "epoch": table["epoch"].astype(int),
            "AUC [95% interval]": [f"{_fmt_value('auc', a)} [{_fmt_value('auc', lo)}, {_fmt_value('auc', hi)}]"
                                   for a, lo, hi in zip(table["auc"], table.get("auc_low", table["auc"]),
                                                        table.get("auc_high", table["auc"]))],
            "TPR@1%": _tpr_1pct_display(table)["tpr_at_1pct"] if "tpr_at_1pct" in table.columns else "",
            **({"score_kind": table["score_kind"]} if "score_kind" in table.columns else {}),
        })
        body = (f"<p class=\"verdict\"><b>{len(table)} of {n_runs} run{'s' if n_runs != 1 else ''} leaked</b> "
                "(memorization verdict at the headline checkpoint: the highest calibrated AUC over epochs and score "
                "kinds). Highest AUC first; AUC and TPR@1% are the deciding score kind's.</p>" + df_to_html(shown))
    known = known_context_only_runs(results, table)
    if not known.empty:
        shown = pd.DataFrame({
            "run_id": known["run_id"], **({"task": known["task"]} if "task" in known.columns else {}),
            "epoch": known["epoch"].astype(int),
            "known-context AUC [95% interval]": [
                f"{_fmt_value('auc', a)} [{_fmt_value('auc', lo)}, {_fmt_value('auc', hi)}]"
                for a, lo, hi in zip(known["known_context_calibrated_auc"], known["known_context_calibrated_auc_low"],
                                     known["known_context_calibrated_auc_high"])]})
        body += (f"<p class=\"verdict\"><b>{len(known)} more run{'s' if len(known) != 1 else ''} leaked through the "
                 "known context C′ only:</b> the zero-information probe did not call memorization, but the same rule "
                 "on the base-calibrated loss with C′ as the context did (<code>known_context_memorization_flag</code>; "
                 "METHOD.md, \"Where the zero-information probe is blind\"). Whoever holds C′ can tell these "
                 "members.</p>" + df_to_html(shown))
    return f'<section id="leaked"><h2>Runs that leaked</h2>{body}</section>'


def _summary_html(results: pd.DataFrame, sweep: SweepConfig | None, comp: pd.DataFrame,
                  schedule: tuple[int, ...] | None, interrupted: bool, noops: pd.DataFrame,
                  settings: Mapping[str, str], rule: str, source: str = "",
                  diverged: Collection[str] = (), claims: pd.DataFrame | None = None) -> str:
    """The report's top: the verdict in one line, the rule in force, what was run and what is stored."""
    line, n_runs = outcome_summary(results)
    ft = fine_tuned_rows(results)
    n_controls = len(results) - len(ft)
    strict = "on" if rule.endswith("_strict") else "off"
    controls = (f" The {n_controls} base-model checkpoint{'s' if n_controls != 1 else ''} (the untouched base "
                "model probed at epoch 0: a pipeline sanity check whose ΔS is zero by construction, not a "
                f"control) {'are' if n_controls != 1 else 'is'} counted apart and left out of every count above."
                if n_controls else " No base-model sanity check was probed.")
    epochs = sorted({int(e) for e in ft["epoch"]}) if not ft.empty else []
    items = [
        f"<li><b>Rule in force:</b> <code>{html.escape(settings.get('rule', rule.removesuffix('_strict')))}</code>, "
        f"strict mode {strict}; "
        + (f"thresholds read from {html.escape(source)} (<a href=\"#verdict-rule\">listed below</a>).</li>"
           if settings else "thresholds not recorded: no sweep.json and no threshold_* columns in the results.</li>"),
        f"<li><b>What was run:</b> {n_runs} fine-tuned run{'s' if n_runs != 1 else ''} with {len(ft)} "
        f"checkpoint{'s' if len(ft) != 1 else ''} (epochs {html.escape(', '.join(map(str, epochs)) or 'none')})."
        f"{controls}</li>",
        _false_positive_item(null_error_rates(results), claims if claims is not None else claim_error_rates(results),
                             rule, settings),
        _completeness_html(comp, schedule, interrupted, missing_runs(results, sweep, diverged), len(diverged)),
        *_blind_items(results),
    ]
    if not noops.empty:
        for model, d in noops.groupby("model", sort=True):
            names = ", ".join(d["manipulation"])
            items.append(f"<li><b>No-op manipulations for {html.escape(str(model) or 'the audited model')}:</b> "
                         f"{len(d)} ({html.escape(names)}) gave the same per-manipulation AUC as the unmanipulated "
                         "base context at every fine-tuned checkpoint; see "
                         "<a href=\"#perturbations\">perturbations</a>.</li>")
    return (f'<section id="summary"><h2>Summary</h2><p class="verdict"><b>Outcome:</b> {html.escape(line)} '
            "(each fine-tuned run at its headline checkpoint: the highest calibrated AUC over epochs and "
            f"score kinds).</p><ul>{''.join(items)}</ul></section>")


def _definitions_html(results: pd.DataFrame, settings: Mapping[str, str]) -> str:
    """What every number of the report means, with this sweep's sample sizes."""
    sizes = sample_sizes(results)
    kinds = settings.get("score_kinds") or ", ".join(competing_kinds(results))
    compare = "; ".join(f"Q = {r['q']}: {r['n_members']} members vs {r['n_nonmembers']} non-members"
                        for r in sizes.to_dict("records")) or "no fine-tuned checkpoint"
    few = sizes[sizes["fp_allowed_at_1pct"] == 0]  # fewer than 100 non-members
    tpr_note = ""
    if not few.empty:
        ns = ", ".join(str(n) for n in sorted(set(few["n_nonmembers"])))
        tpr_note = (f" <span class=\"warn\">In this sweep {ns} non-members allow ⌊0.01·n⌋ = 0 false positives, so "
                    "TPR@1% is the share of members scoring above <em>every</em> non-member: it rests on the one "
                    "highest non-member score and is no estimate of a 1% false-positive rate.</span> Such cells "
                    "carry the note “0 FP allowed” next to the number.")
    items = [
        ("Q, members, non-members", "Q is the number of member rows a run fine-tunes on (its queries); Stage I "
         "also draws as many non-members, rows of the same task the model never saw, with matching labels."),
        ("Score kinds", "For each query and each manipulated multiple-choice context: loss = −log p(true "
         "label), entropy = H(p) over the candidate labels, confidence = p(true label). A query's score S "
         f"is the mean over the manipulation suite. Competing for the maximum signal here: {html.escape(kinds)}."),
        ("ΔS (calibrated score)", "ΔS = S − S_ref, S_ref being the same probe on the untouched base model with "
         "identical contexts. It removes how hard a row is for any model. Members are the positive class: "
         "the membership score is −ΔS for loss and entropy and +ΔS for confidence."),
        ("AUC", "The probability that a random member has a higher membership score than a random "
         "non-member (ties count half); 0.5 is chance. An AUC compares the n members with the n "
         f"non-members of one checkpoint: {html.escape(compare)}. “raw” AUCs use S alone, “ref” AUCs S_ref alone."),
        ("TPR@1%, TPR@10%", "The share of members flagged at the threshold that flags at most ⌊α·n⌋ of the n "
         "non-members (α = 1% or 10%; ties broken against the attacker)." + tpr_note),
        ("Loss ratio", "L_FT / L_base: mean cross-entropy of ordinary in-context prediction (context C′, members "
         "and non-members as queries) of the fine-tuned model over the base model's. 1 = unchanged; above "
         f"{html.escape(settings.get('collapse_loss_ratio', '5'))} the checkpoint is a collapse. Shown in the "
         "run tables (column loss_ratio)."),
        ("p-value", "One-sided Mann–Whitney p-value of the deciding kind's ΔS (members above non-members)."),
        ("Headline / peak", "A run's headline checkpoint is the one with the highest calibrated AUC over its "
         "epochs and the competing score kinds; run-level tables and the summary use it."),
    ]
    dl = "".join(f"<dt>{html.escape(k)}</dt><dd>{v}</dd>" for k, v in items)
    return f'<section id="definitions"><h2>What the numbers mean</h2><dl class="defs">{dl}</dl></section>'


def _tpr_1pct_display(df: pd.DataFrame) -> pd.DataFrame:
    """``tpr_at_1pct`` as text with "0 FP allowed" beside every value that rests on fewer than 100
    non-members (⌊0.01·n⌋ = 0), so the number is never read without its caveat."""
    if "tpr_at_1pct" not in df.columns:
        return df
    n = df["n_nonmembers"] if "n_nonmembers" in df.columns else df["q"] if "q" in df.columns else None
    if n is None:
        return df
    out = df.copy()
    cells = []
    for v, k in zip(out["tpr_at_1pct"], n):
        text = _fmt_value("tpr_at_1pct", v)
        if text and pd.notna(k) and allowed_false_positives(0.01, int(k)) == 0:  # fewer than 100 non-members
            text += f" (0 FP allowed: {int(k)} non-members)"
        cells.append(text)
    out["tpr_at_1pct"] = cells
    return out


# The run table's first columns: the run, then how strongly it leaked, before the many outcome and setting columns
RUN_TABLE_LEAD: tuple[str, ...] = ("run_id", "auc", "auc_low", "auc_high", "tpr_at_1pct", "tpr_at_10pct", "outcome",
                                   "epoch")


def _run_table_display(table: pd.DataFrame, comp: pd.DataFrame) -> pd.DataFrame:
    """A run table with its completeness (``checkpoints`` stored of scheduled, ``status``) and TPR@1% caveat; the
    run id first, then AUC with its interval and the TPRs (never off screen to the right), then the rest."""
    key = [c for c in RUN_KEY if c in table.columns and c in comp.columns]
    out = table
    if key and not comp.empty:
        c = comp.assign(checkpoints=[_status_cell(r) for r in comp.to_dict("records")])[[*key, "checkpoints", "status"]]
        out = table.merge(c, on=key, how="left")
    lead = [c for c in RUN_TABLE_LEAD if c in out.columns]
    out = out.loc[:, [*lead, *(c for c in out.columns if c not in lead)]]
    return _tpr_1pct_display(out)


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
        return _note(f"Figure '{name}' not drawn: {fig_notes.get(name, 'no data')}.")

    def optional(fn, *args, **kwargs) -> tuple[pd.DataFrame | None, str | None]:
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
    parts.append(_leaked_html(results))  # first: which runs leaked, before the counts and the rule
    parts.append(_summary_html(results, sweep, comp, schedule, interrupted, noops, settings, rule, source, diverged,
                               claims))
    parts.append(_verdict_rule_html(results, settings, source, disagree, rule, claims))
    parts.append(_definitions_html(results, settings))
    facets = _grid_axes_note(filter_regime(results, regime))
    parts.append(f"<p>The sections below cover {html.escape(scope)}. Rows of regime <code>{BASE_MODEL_ROW}</code> "
                 "are the pipeline sanity check (the untouched base model probed as a checkpoint: ΔS is zero by "
                 "construction, so its AUC is 0.5 whatever the data; it checks the pipeline, it is not a control "
                 f"and cannot fail). The controls are the null splits above.{html.escape(facets)}</p>")

    from orchestrator.report.epsilon import epsilon_section_html

    privacy = epsilon_section_html(results, run_dir / FIGURES_DIR)
    if privacy:
        parts.append(f'<section id="privacy">{privacy}</section>')
    from orchestrator.report.attacks import attacks_section_html

    parts.append(attacks_section_html(results, run_dir / FIGURES_DIR))  # empty unless probe.references is on
    from orchestrator.report.canaries import canaries_section_html

    canaries = canaries_section_html(results, run_dir / FIGURES_DIR)  # empty unless the sweep has canaries
    if canaries:
        parts.append(f'<section id="canaries">{canaries}</section>')
    from orchestrator.report.frontier import frontier_section_html

    frontier = frontier_section_html(results, run_dir / FIGURES_DIR)  # empty without true-label utility rows
    if frontier:
        parts.append(f'<section id="frontier">{frontier}</section>')
    from orchestrator.report.context_audits import context_audits_section_html

    context_audits = context_audits_section_html(run_dir)  # empty unless the sweep has regime context
    if context_audits:
        parts.append(f'<section id="context-audits">{context_audits}</section>')
    section("provenance", "Provenance", "Configuration hash, code version and package versions.",
            _provenance_html(prov, results) + ("" if prov else _note("provenance.json not found; values "
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
            f"{_guarantee(settings)} guarantee, which bounds one run's headline (their false-positive rates, "
            "measured on the null splits, are at the top). task_verdict is the task-level verdict that is "
            "covered: selection-aware memorization at some checkpoint with a p-value below "
            "task_p_value_threshold = family_alpha / task_family_size (Bonferroni over every run of the task). "
            "null_peak_auc: the peak AUC the null splits reach with the same selection.",
            df_to_html(_tpr_1pct_display(peak_vulnerability_per_task(results, regime=regime, by=tuple(facet_axes)))))
    section("auc-epochs", "AUC over epochs", "Calibrated AUC (best score kind) per checkpoint, by learning rate; "
            "the dashed line is chance (0.5).",
            figure("auc_over_epochs", "AUC over epochs per learning rate" + facet_caption))
    section("roc", "ROC curves", "Calibrated deciding score at each run's peak checkpoint, log-log axes; the "
            "legend names every grid axis that differs between the curves, the dashed diagonal is chance.",
            figure("roc_curves", "ROC curves at peak checkpoints"))

    if split is None:
        body = _note(f"{SPLIT_REPORT_FILE} not found; section skipped.")
    else:
        t, err = optional(split_validation, split)
        body = _note(err) if err else df_to_html(t)
    section("split-validation", "Split validation (Tab. 6)",
            "Members vs non-members: TVD (classification) or KS with p-value and Wasserstein (regression); the label "
            "design, the blind baseline (AUC of a model fitted on C' alone, with its 95% interval) and the draws "
            "Stage I refused because their groups were separable without the model.", body)

    t, err = optional(calibration_impact, results, regime=regime)
    section("calibration", "Calibration impact (App. 7.4)",
            "Memorization flags from the calibrated score ΔS vs the uncalibrated score S, the same rule on "
            "both, per non-collapsed fine-tuned checkpoint.",
            _note(err) if err else df_to_html(t, index=True))

    if manip is None:
        body = _note(f"{MANIPULATION_AUC_FILE} not found; section skipped.")
    else:
        t, err = optional(perturbation_effectiveness, manip, results)
        t2, err2 = optional(perturbation_effectiveness, manip, results, by="category")
        body = (_noop_html(noops) + (_note(err) if err else df_to_html(t)) + (_note(err2) if err2 else df_to_html(t2))
                + figure("perturbation_ranking", "Mean per-manipulation ΔAUC"))
    section("perturbations", "Perturbation effectiveness (App. 7.3)",
            "Over checkpoints with detectable memorization: each manipulation's AUC (calibrated loss) minus the "
            "AUC of the unmanipulated context (base) at the same checkpoint, ranked by the mean of that "
            "difference; mean_delta_auc_vs_suite is the same against the checkpoint's overall AUC(ΔS).", body)

    if split is None:
        body = _note(f"{SPLIT_REPORT_FILE} not found; section skipped.")
    else:
        t, err = optional(task_characteristics, results, split, regime=regime)
        body = _note(err) if err else df_to_html(t)
    section("task-characteristics", "Task characteristics vs outcome (Fig. 6)",
            "Cardinality, majority-class share, size and numeric share against outcome shares at peak.", body)

    section("regimes", "Realistic regimes (Tab. 12)",
            "single_fixed vs multi_fixed vs multi_random at peak checkpoints, per Q.",
            df_to_html(regime_comparison(results)))

    title = title or f"IclMem report — {run_dir.name}"
    return write_text_atomic(run_dir / REPORT_FILE, _page(f"{title} (forced)" if forced else title, parts))


def _claims_html(claims: pd.DataFrame, rule: str, settings: Mapping[str, str]) -> str:
    """The claims beyond one run's headline: which the selection-aware bound does not cover, their measured
    false-positive rates under every rule, and how one null trial of each is decided."""
    if claims.empty:
        return ""
    bound = _guarantee(settings)
    uncovered, controlled = _claim_phrases(claims, rule, covered=False), _claim_phrases(claims, rule, covered=True)
    out = ('<h3 id="claims-beyond-a-run">Claims beyond one run\'s headline</h3>'
           f"<p>The {bound} guarantee (family_alpha) bounds one run's headline: a Bonferroni over that run's "
           "checkpoints × competing score kinds. A maximum over runs (a task's peak) or an OR over verdicts "
           "(IclMem or any reference-model attack) takes more chances than that family, so it can exceed "
           f"{bound} however each verdict is controlled. This report gives IclMem's and each attack's verdict "
           "apart and never ORs them into one; a reader who calls a checkpoint or run memorized when any of them "
           "says so makes the claim measured here.</p>")
    if uncovered:
        out += (f'<p class="warn"><b>Not covered by the {bound} guarantee</b> (measured under '
                f"<code>{html.escape(rule)}</code>): {html.escape('; '.join(uncovered))}.</p>")
    if controlled:
        out += f"<p><b>Covered</b> (at most family_alpha): {html.escape('; '.join(controlled))}.</p>"
    shown = claims.assign(covered=[f"yes: at most {bound}" if c else f"no: not covered by the {bound} guarantee"
                                   for c in claims["covered"]])
    meanings = "".join(f"<dt><code>{html.escape(c.name)}</code></dt><dd>{html.escape(c.meaning)}</dd>"
                       for c in CLAIMS if c.name in set(claims["claim"]))
    return (out + df_to_html(shown) + '<p class="caption">One trial per task (and grid-axis value Tab. 8 splits '
            "by) and null split index j for the task claims, null split j of every run of the task standing in "
            "for the real split; per checkpoint or run and j for IclMem-or-any-attack, IclMem's null split j "
            "paired with each attack's null split j. The 95% Clopper-Pearson interval is exact for independent "
            f'trials; these share runs and rows.</p><dl class="defs">{meanings}</dl>')


def _verdict_rule_html(results: pd.DataFrame, settings: Mapping[str, str] | None = None, source: str = "",
                       disagree: list[str] | None = None, rule: str | None = None,
                       claims: pd.DataFrame | None = None) -> str:
    """The rule in use, its thresholds (with what each means), its measured false-positive rate, and that of
    the claims beyond one run's headline (``claims``: :func:`claim_error_rates`, computed when not given)."""
    if settings is None:
        settings, source, disagree = thresholds_in_force(results, {})
    rule = rule or rule_in_force(results, settings)
    summary = verdict_rule_summary(results)
    p_thr = None
    if "p_value_threshold" in summary and "family_size" in summary:
        p_thr = f"{settings.get('family_alpha', '0.05')} / {summary['family_size']} = {summary['p_value_threshold']:.3g}"
    rows = "".join(f"<tr><td><code>{html.escape(k)}</code></td><td>{html.escape(v)}</td>"
                   f"<td class=\"text\">{html.escape(THRESHOLD_MEANINGS.get(k, ''))}</td></tr>"
                   for k, v in settings.items())
    if p_thr:
        rows += ("<tr><td><code>p_value_threshold</code></td>"
                 f"<td>{html.escape(p_thr)}</td><td class=\"text\">derived: family_alpha / K, K = checkpoints of a "
                 "run × competing kinds</td></tr>")
    table = ('<div class="scroll"><table class="data"><thead><tr><th>setting</th><th>value</th><th>meaning</th>'
             f"</tr></thead><tbody>{rows}</tbody></table></div>") if rows else _note("No thresholds recorded.")
    head = (f'<section id="verdict-rule"><h2>Verdict rule: {html.escape(rule)}</h2>'
            f"<p>{_rule_sentence(settings, rule, p_thr)}</p>"
            '<p class="caption">The <code>outcome</code> column uses this rule; <code>outcome_&lt;rule&gt;</code> '
            "gives every rule's verdict. selection_aware = the paper's rule AND a one-sided Mann-Whitney p-value "
            "of the deciding (checkpoint, score kind) below family_alpha / K (K = checkpoints x competing kinds), "
            "so the run headline, a maximum over that family, keeps its false-positive rate at most "
            f"family_alpha. Settings read from {html.escape(source)}.</p>" + table)
    if disagree:
        head += _note(f"The results rows record other values than the config for {', '.join(disagree)}: they were "
                      "classified under another configuration.")
    rates = null_error_rates(results)
    if rates.empty:
        return head + _note("No null splits were probed (probe.null_splits: 0): the false-positive rate "
                            "of the verdicts is not measured for this sweep.") + "</section>"
    mine = rates[(rates["rule"] == rule) & (rates["level"] == "run_headline")]
    per_checkpoint = rates[(rates["rule"] == rule) & (rates["level"] == "checkpoint")]
    line = ""
    if not mine.empty:
        r = mine.iloc[0]
        line = (f"<p><b>Measured false-positive rate of this rule at run-headline level: {int(r['n_memorization'])} "
                f"of {int(r['n_null'])} null splits ({r['fpr']:.1%}; 95% Clopper-Pearson interval "
                f"{r['fpr_low']:.1%}–{r['fpr_high']:.1%}).</b>"
                + (f" Per checkpoint: {_rate_text(per_checkpoint.iloc[0], 'null splits')}."
                   if not per_checkpoint.empty else "")
                + (" Few null splits make a wide interval: raise <code>probe.null_splits</code> or add seeds to "
                   "narrow it." if r["fpr_high"] > 0.10 else "") + "</p>")
    if claims is None:
        claims = claim_error_rates(results, rule=rule)
    return (head + line + "<p class=\"caption\">Null splits: two disjoint sets of rows the run never saw, "
            "labelled member and non-member with the members' label counts, probed on every fine-tuned "
            "checkpoint (under shuffled_members with label-matched non-members, both sides carry labels permuted "
            "among the unused rows, as the real split's do). Every memorization verdict on them is a false "
            "positive; the _non_collapsed levels count only the trials a collapse verdict did not pre-empt.</p>"
            + df_to_html(rates) + _claims_html(claims, rule, settings) + "</section>")


def _page(title: str, parts: Iterable[str]) -> str:
    """The report page around its sections: one style for the tabular and the LM report."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f"<script>{_IMG_CHECK_JS}</script></head>"
        f"<body><h1>{html.escape(title)}</h1>{''.join(parts)}</body></html>\n"
    )


def write_lm_html_report(run_dir: str | Path, results: pd.DataFrame, *, title: str | None = None) -> Path:
    """Write ``RUN_DIR/lm_report.html``: the provenance block and the LM probes' Tables 2-6
    (``probes.lm.report``). Numbers, model, dataset and entity-type names only, never a sentence or an entity."""
    from probes.lm.report import lm_report_section

    run_dir = Path(run_dir)
    prov = RunFolder(run_dir).public_provenance()
    provenance = (f'<section id="provenance"><h2>Provenance</h2>{_provenance_html(prov, results)}'
                  + ("" if prov else _note("provenance.json not found.")) + "</section>")
    return write_text_atomic(run_dir / LM_REPORT_FILE,
                             _page(title or f"LM probes — {run_dir.name}", [provenance, lm_report_section(results)]))
