"""One claim of the claim ledger as a typed record (:class:`LedgerClaim`, a row of ``claims.parquet``), how often
its path fired on null data (:class:`NullTrials`), how the first screen reads it (:func:`reading`: a leak only
at a null rate at or under :data:`CLAIM_LEVEL` on at least :data:`MIN_NULL_TRIALS` trials, and held on rounded
outputs) and its effect size in the score's units (:func:`effect_of_scores`). Written by
:mod:`orchestrator.report.claim_ledger`; read by the report and the console."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from iclmem.vocab import ClaimReading, RoundingCheck

__all__ = ["CLAIM_LEVEL", "LEDGER_COLUMNS", "LedgerClaim", "MIN_NULL_TRIALS", "NullTrials", "effect_of_scores", "reading"]

_NAN = float("nan")


CLAIM_LEVEL = 0.05  # a claim is read as a leak only when its null rate is at or under this


# ... measured on at least this many null trials: with fewer, one false positive moves the rate by more than twice
# the level and none cannot tell 0 from 10%; `probe.null_splits` raises the count (runs x null splits per run claim)
MIN_NULL_TRIALS = 10


@dataclass(frozen=True)
class LedgerClaim:
    """One claim of the ledger (one row of ``claims.parquet``). NaN where a field does not apply."""

    kind: str  # ClaimKind
    task: str
    subject: str  # the run id, "run id / slice", or "" for a task-level claim
    made: bool  # the claim's rule fired on the real split
    family: str  # what it is corrected over
    family_size: int
    selection: str  # what it maximises over before deciding
    correction: str
    # how much
    auc: float
    auc_low: float
    auc_high: float
    tpr_at_1pct: float
    shift: float  # members' mean membership score minus the non-members', in the score's units (nats for a loss)
    relative_shift: float  # shift / the rows' spread of the raw score under the reference (its std over rows)
    epsilon_lb: float  # the ε lower bound of the claim's checkpoint where one is valid (an exchangeable split), else NaN
    count: float  # count claims: what is counted on the real split (runs, rows)
    null_count_mean: float  # ... and its mean over the null trials
    null_count_max: float
    # how often the same path makes it on null data
    n_null: int
    null_made: int
    null_rate: float
    null_rate_low: float
    null_rate_high: float
    null_path: str
    # rounded outputs
    rounding: str  # RoundingCheck
    output_decimals: float
    reading: str  # ClaimReading
    statement: str  # the plain sentence the first screen and the console print
    next_step: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


LEDGER_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(LedgerClaim))


@dataclass(frozen=True)
class NullTrials:
    """How often the claim's path fired on null data: ``made`` of ``n`` trials (Clopper-Pearson interval)."""

    n: int
    made: int

    @property
    def rate(self) -> float:
        return self.made / self.n if self.n else _NAN

    def interval(self) -> tuple[float, float]:
        from probes.metrics import clopper_pearson

        iv = clopper_pearson(int(self.made), int(self.n))
        return float(iv.low), float(iv.high)


def reading(made: bool, trials: NullTrials, rounding: RoundingCheck, level: float = CLAIM_LEVEL) -> ClaimReading:
    """How the first screen reads a claim (see :class:`iclmem.vocab.ClaimReading`)."""
    if not made:
        return ClaimReading.NOT_MADE
    if trials.n == 0:
        return ClaimReading.UNMEASURED
    if trials.n < MIN_NULL_TRIALS:
        return ClaimReading.TOO_FEW_NULL_TRIALS
    if trials.rate > level:
        return ClaimReading.WITHIN_CHANCE
    if rounding is RoundingCheck.LOST:
        return ClaimReading.EXACT_OUTPUTS_ONLY
    return ClaimReading.LEAK


def effect_of_scores(member_scores: Any, nonmember_scores: Any, raw_spread_scores: Any) -> tuple[float, float]:
    """(shift, relative shift): the members' mean membership score minus the non-members', and that shift over
    the rows' spread of the raw score (``raw_spread_scores``: the reference model's score of every audited row).
    A rank test sees a shift of 1e-5 nats as well as one of 1 nat; the relative shift says which it is."""
    m = np.asarray(member_scores, np.float64)
    n = np.asarray(nonmember_scores, np.float64)
    m, n = m[np.isfinite(m)], n[np.isfinite(n)]
    if m.size == 0 or n.size == 0:
        return _NAN, _NAN
    shift = float(m.mean() - n.mean())
    raw = np.asarray(raw_spread_scores, np.float64)
    raw = raw[np.isfinite(raw)]
    spread = float(raw.std()) if raw.size > 1 else _NAN
    return shift, (shift / spread if spread and np.isfinite(spread) else _NAN)
