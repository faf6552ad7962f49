"""The words of a ledger claim: the plain sentence the first screen and the console print for it (:func:`statement`:
what is claimed, how much, how often null data make it through the same path, and whether it holds on rounded
outputs) and what to do next (:func:`next_step`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from iclmem.record import ATTACK_CHANNELS
from iclmem.vocab import ClaimKind, ClaimReading, RoundingCheck
from orchestrator.report.claim_records import MIN_NULL_TRIALS, LedgerClaim

__all__ = ["ATTACK_CHANNEL_WORDS", "next_step", "statement"]

# the reference attacks' channels (iclmem.record.ATTACK_CHANNELS): column prefix -> words
ATTACK_CHANNEL_WORDS = {prefix: f"the {name}" for prefix, name in ATTACK_CHANNELS.items()}
# ... as a reference-attack claim's family names its channel ("channel deployed_known_context_: ...")
_CHANNEL_WORDS = {f"channel {prefix or 'probe_'}": words for prefix, words in ATTACK_CHANNEL_WORDS.items()}


_KIND_WORDS = {
    ClaimKind.RUN_VERDICT.value: "the zero-information probe calls run {subject} memorization",
    ClaimKind.KNOWN_CONTEXT_FLAG.value: "whoever holds the context C' tells the members of run {subject}",
    ClaimKind.DEPLOYED_KNOWN_CONTEXT_FLAG.value: "the package's deployed classifier gives away the members of run "
                                                 "{subject} through C'",
    ClaimKind.REFERENCE_ATTACK.value: "reference attacks on {channel} call run {subject} memorization",
    ClaimKind.RUNS_LEAKED.value: "{count:.0f} run(s) of task {task} leaked (a verdict, a known-context flag or a "
                                 "reference attack)",
    ClaimKind.ROWS_AT_RISK.value: "{count:.0f} member rows of task {task} reach a membership risk of 0.9",
    ClaimKind.SLICE_EXPOSED.value: "slice {subject}: its members are told from its non-members",
    ClaimKind.SLICE_LEAKS_MORE.value: "slice {subject} leaks more than the rest of its run's rows",
    ClaimKind.VALUE_SLICE_EXPOSED.value: "slice {subject}: its rows' values are given away",
    ClaimKind.TASK_VERDICT.value: "task {task} leaks (the controlled task verdict)",
}


def _fmt(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None or not np.isfinite(float(x)) else f"{float(x):.{digits}f}"


def _how_much(c: LedgerClaim) -> str:
    parts = []
    if np.isfinite(c.auc):
        interval = (f" [{_fmt(c.auc_low)}, {_fmt(c.auc_high)}]"
                    if np.isfinite(c.auc_low) and np.isfinite(c.auc_high) and c.auc_high > c.auc_low else "")
        parts.append(f"AUC {_fmt(c.auc)}{interval}")
    if np.isfinite(c.tpr_at_1pct):
        parts.append(f"TPR@1% {_fmt(c.tpr_at_1pct, 2)}")
    if np.isfinite(c.epsilon_lb):
        parts.append(f"ε ≥ {c.epsilon_lb:.2f}")
    if np.isfinite(c.shift):
        parts.append(f"members' score shift {c.shift:.2g}"
                     + (f" = {c.relative_shift:.2g} of the rows' spread" if np.isfinite(c.relative_shift) else ""))
    if c.kind in (ClaimKind.ROWS_AT_RISK.value, ClaimKind.RUNS_LEAKED.value) and np.isfinite(c.null_count_mean):
        what = "rows" if c.kind == ClaimKind.ROWS_AT_RISK.value else "runs"
        parts.append(f"the same count on the null splits: {c.null_count_mean:.1f} {what} on average, at most "
                     f"{c.null_count_max:.0f}")
    return "; ".join(parts)


def _how_sure(c: LedgerClaim) -> str:
    if c.n_null == 0:
        return "no false-positive rate measured"
    return (f"the same path made it on {c.null_made} of {c.n_null} null trials ({_fmt(c.null_rate, 3)}, 95% "
            f"interval {_fmt(c.null_rate_low, 3)}-{_fmt(c.null_rate_high, 3)})")


def _rounding_words(c: LedgerClaim) -> str:
    decimals = f"{int(c.output_decimals)} decimals" if np.isfinite(c.output_decimals) else "rounded outputs"
    return {RoundingCheck.SURVIVES.value: f"it holds on probabilities rounded to {decimals}",
            RoundingCheck.LOST.value: f"it is gone on probabilities rounded to {decimals}: detectable only with "
                                      "exact outputs",
            RoundingCheck.NOT_TESTED.value: "not re-tested on rounded outputs"}[c.rounding]


def statement(c: LedgerClaim) -> str:
    """The claim as one plain sentence: what, how much, how sure, and whether it survives rounding."""
    what = _KIND_WORDS[c.kind].format(subject=c.subject, task=c.task, count=c.count if np.isfinite(c.count) else 0,
                                      channel=_CHANNEL_WORDS.get(c.family.split(":")[0], c.family))
    how_much = _how_much(c)
    return f"{what[0].upper()}{what[1:]}" + (f" ({how_much})" if how_much else "") + f"; {_how_sure(c)}; " \
        f"{_rounding_words(c)}."


def next_step(c: LedgerClaim) -> str:
    """What a data owner should do about the claim, by its reading."""
    return {
        ClaimReading.LEAK.value: "treat these rows as exposed: audit the recipe with a defence (DP fine-tuning, fewer "
                                 "epochs) and re-run; do not release the weights or context as they are",
        ClaimReading.EXACT_OUTPUTS_ONLY.value: "exposed only to whoever reads exact probabilities: serve rounded "
                                               "outputs (or labels) and keep the exact scores internal",
        ClaimReading.WITHIN_CHANCE.value: "no more than null data give: raise probe.null_splits or the rows audited "
                                          "before believing it",
        ClaimReading.TOO_FEW_NULL_TRIALS.value: f"too few null trials to say how often chance makes it: raise "
                                                f"probe.null_splits until the claim has {MIN_NULL_TRIALS} or more",
        ClaimReading.UNMEASURED.value: "not a claim yet: its false-positive rate is not measured",
        ClaimReading.NOT_MADE.value: "",
    }[c.reading]
