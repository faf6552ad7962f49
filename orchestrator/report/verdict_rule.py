"""The report's verdict-rule section: the rule in force and its thresholds (with what each means), the rule in
one sentence with this sweep's numbers, its false-positive rate measured on the null splits, and the claims beyond
one run's headline with theirs; and the report-top line on those measured false positives."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import pandas as pd

from iclmem.vocab import VerdictRule
from orchestrator.report.claims import (
    CHECKPOINT_ANY_ATTACK,
    CLAIMS,
    RUN_HEADLINE_ANY_ATTACK,
    TASK_ANY_RUN,
    TASK_PEAK,
    TASK_VERDICT,
    claim_error_rates,
)
from orchestrator.report.null_rates import null_error_rates
from orchestrator.report.page import df_to_html, note_html
from orchestrator.report.thresholds import THRESHOLD_MEANINGS, rule_in_force, thresholds_in_force, verdict_rule_summary
from orchestrator.schema.config import OutcomeConfig

__all__ = ["verdict_rule_html", "false_positive_item", "guarantee_text"]


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


def guarantee_text(settings: Mapping[str, str]) -> str:
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


def false_positive_item(rates: pd.DataFrame, claims: pd.DataFrame, rule: str, settings: Mapping[str, str]) -> str:
    """The report-top line on the verdicts' measured false positives: the run headline's (what the
    selection-aware bound covers) beside the claims it does not cover, each with its interval."""
    head = rates[(rates["rule"] == rule) & (rates["level"] == "run_headline")] if not rates.empty else rates
    if head.empty:
        return ""
    bound = guarantee_text(settings)
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


def _claims_html(claims: pd.DataFrame, rule: str, settings: Mapping[str, str]) -> str:
    """The claims beyond one run's headline: which the selection-aware bound does not cover, their measured
    false-positive rates under every rule, and how one null trial of each is decided."""
    if claims.empty:
        return ""
    bound = guarantee_text(settings)
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


def verdict_rule_html(results: pd.DataFrame, settings: Mapping[str, str] | None = None, source: str = "",
                      disagree: list[str] | None = None, rule: str | None = None,
                      claims: pd.DataFrame | None = None) -> str:
    """The rule in use, its thresholds (with what each means), its measured false-positive rate, and that of
    the claims beyond one run's headline (``claims``: :func:`claim_error_rates`, computed when not given)."""
    if settings is None:
        settings, source, disagree = thresholds_in_force(results, None)
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
             f"</tr></thead><tbody>{rows}</tbody></table></div>") if rows else note_html("No thresholds recorded.")
    head = (f'<section id="verdict-rule"><h2>Verdict rule: {html.escape(rule)}</h2>'
            f"<p>{_rule_sentence(settings, rule, p_thr)}</p>"
            '<p class="caption">The <code>outcome</code> column uses this rule; <code>outcome_&lt;rule&gt;</code> '
            "gives every rule's verdict. selection_aware = the paper's rule AND a one-sided Mann-Whitney p-value "
            "of the deciding (checkpoint, score kind) below family_alpha / K (K = checkpoints x competing kinds), "
            "so the run headline, a maximum over that family, keeps its false-positive rate at most "
            f"family_alpha. Settings read from {html.escape(source)}.</p>" + table)
    if disagree:
        head += note_html(f"The results rows record other values than the config for {', '.join(disagree)}: they "
                          "were classified under another configuration.")
    rates = null_error_rates(results)
    if rates.empty:
        return head + note_html("No null splits were probed (probe.null_splits: 0): the false-positive rate "
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
