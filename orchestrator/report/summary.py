"""The report's top after the leaked runs: the summary (the verdict in one line, the rule in force, what was
run and what is stored of it, the measured false positives, the blind baseline, no-op manipulations) and what
every number of the report means, with this sweep's sample sizes."""

from __future__ import annotations

import html
from collections.abc import Collection, Mapping
from typing import Any

import pandas as pd

from iclmem.runfolder import RUN_STATE_FILE, SWEEP_FILE
from orchestrator.report.claims import claim_error_rates
from orchestrator.report.null_rates import null_error_rates
from orchestrator.report.overview import blind_baseline_summary, missing_runs, outcome_summary, sample_sizes
from orchestrator.report.selection import competing_kinds, fine_tuned_rows
from orchestrator.report.verdict_rule import false_positive_item
from orchestrator.schema.config import SweepConfig

__all__ = ["status_cell", "summary_html", "definitions_html"]


def status_cell(row: Mapping[str, Any]) -> str:
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
                        + f": {status_cell(r)} checkpoints, last epoch {int(r['last_epoch'])}</li>"
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


def summary_html(results: pd.DataFrame, sweep: SweepConfig | None, comp: pd.DataFrame,
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
        false_positive_item(null_error_rates(results), claims if claims is not None else claim_error_rates(results),
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


def definitions_html(results: pd.DataFrame, settings: Mapping[str, str]) -> str:
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
