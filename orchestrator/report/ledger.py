"""The claim ledger as the data owner reads it: the report's first screen and the last lines of ``iclmem run`` /
``iclmem report``, both from ``claims.parquet`` (:mod:`orchestrator.report.claim_ledger`). Plain sentences first (what,
how much, how sure, whether it holds on rounded outputs, what to do), the statistical table below them. A claim
whose false-positive rate is not measured is not stated; it is counted and left to the table."""

from __future__ import annotations

import html

import pandas as pd

from iclmem.vocab import ClaimReading
from orchestrator.report.claim_ledger import shown_claims
from orchestrator.report.page import df_to_html

__all__ = ["LEDGER_SECTION_ID", "ledger_html", "ledger_lines"]

LEDGER_SECTION_ID = "claims"
_HEADINGS = {
    ClaimReading.LEAK.value: "Leaks (made, its false-positive rate measured at or under 5%, holds on rounded outputs "
                             "or not re-tested)",
    ClaimReading.EXACT_OUTPUTS_ONLY.value: "Detectable only with exact outputs (gone when probabilities are rounded)",
    ClaimReading.WITHIN_CHANCE.value: "Made, but null data through the same path make it more often than 5%: no "
                                      "more than chance",
    ClaimReading.TOO_FEW_NULL_TRIALS.value: "Made, but on too few null trials to say how often chance makes it "
                                            "(raise probe.null_splits)",
}
_TABLE_COLUMNS = ["kind", "task", "subject", "reading", "auc", "auc_low", "auc_high", "tpr_at_1pct", "epsilon_lb", "shift",
                  "relative_shift", "count", "null_count_mean", "null_made", "n_null", "null_rate", "null_rate_high",
                  "rounding", "family_size", "selection"]


def _groups(ledger: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    shown = shown_claims(ledger)
    return [(heading, shown[shown["reading"] == value]) for value, heading in _HEADINGS.items()
            if (shown["reading"] == value).any()]


def _unmeasured(ledger: pd.DataFrame) -> int:
    return int((ledger["made"].astype(bool) & (ledger["reading"] == ClaimReading.UNMEASURED.value)).sum())


def ledger_lines(ledger: pd.DataFrame | None, limit: int = 12) -> list[str]:
    """The ledger for a terminal: each stated claim's sentence under its reading, then what was left unstated."""
    if ledger is None or ledger.empty:
        return []
    groups = _groups(ledger)
    lines = [f"Claims ({len(ledger)} tested; each with how much, how often null data through the same path make it, "
             "and whether it holds on rounded outputs; all in claims.parquet):"]
    if not groups:
        lines.append("  No leak is claimed: no claim was made with a measured false-positive rate.")
    for heading, group in groups:
        lines.append(f"  {heading}:")
        for sentence in group["statement"].head(limit):
            lines.append(f"    - {sentence}")
        if len(group) > limit:
            lines.append(f"    ... and {len(group) - limit} more (report.html, section 'What this audit claims')")
    unmeasured = _unmeasured(ledger)
    if unmeasured:
        lines.append(f"  {unmeasured} further flag(s) have no measured false-positive rate and are not claimed "
                     "(claims.parquet, reading 'unmeasured').")
    return lines


def ledger_html(ledger: pd.DataFrame | None) -> str:
    """The report's first section; empty for a folder without a ledger (built before it existed)."""
    if ledger is None or ledger.empty:
        return ""
    blocks = [f'<section id="{LEDGER_SECTION_ID}"><h2>What this audit claims</h2>',
              "<p class=\"caption\">Every statement this report makes about leakage, with how much (AUC, TPR at 1% "
              "FPR, and the members' score shift in the score's units and as a share of the rows' spread), how "
              "sure (how often null data, rows no model trained on, make the same claim through the same "
              "selection), and whether it holds when the model's probabilities are rounded as a deployed model "
              "rounds them (docs/METHOD.md, \"The claim ledger\").</p>"]
    groups = _groups(ledger)
    if not groups:
        blocks.append("<p class=\"verdict\"><b>No leak is claimed:</b> of the "
                      f"{len(ledger)} claims tested, none was made with a measured false-positive rate.</p>")
    for heading, group in groups:
        items = "".join(f"<li>{html.escape(s)}<br><em>What to do:</em> {html.escape(n)}</li>"
                        for s, n in zip(group["statement"], group["next_step"], strict=True))
        blocks.append(f"<h3>{html.escape(heading)}</h3><ul>{items}</ul>")
    unmeasured = _unmeasured(ledger)
    if unmeasured:
        blocks.append(f"<p class=\"note\">{unmeasured} further flag(s) fired without a measured false-positive rate "
                      "and are not claimed here; they are in the ledger table below.</p>")
    made = ledger[ledger["made"].astype(bool)]
    if not made.empty:
        blocks.append("<details><summary>The ledger (claims made)</summary>"
                      + df_to_html(made[[c for c in _TABLE_COLUMNS if c in made.columns]]) + "</details>")
    blocks.append("</section>")
    return "\n".join(blocks)
