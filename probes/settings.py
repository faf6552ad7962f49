"""How a checkpoint is probed, as the probe reads it: :class:`ProbeSettings` (bootstrap resamples, the verdict's
thresholds, null splits, the selection-aware family's size, the canaries' audit level), and the one place
their defaults are declared (the sweep schema's ``probe:`` block reads them from here). Pure: no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from iclmem.errors import ConfigError
from iclmem.stats import DEFAULT_RESAMPLES
from probes.outcomes import OutcomeThresholds

__all__ = ["OUTPUT_DECIMALS_MAX", "OUTPUT_DECIMALS_MIN", "ProbeSettings"]

# the decimals a rounded re-test may round the outputs to: below 1 every probability reads 0 or 1; past 8 float32
# outputs (about 7 significant digits) are not rounded at all
OUTPUT_DECIMALS_MIN, OUTPUT_DECIMALS_MAX = 1, 8


@dataclass(frozen=True)
class ProbeSettings:
    n_resamples: int = DEFAULT_RESAMPLES
    thresholds: OutcomeThresholds = field(default_factory=OutcomeThresholds)
    bootstrap_seed: int = 0
    # null splits probed on every fine-tuned checkpoint (their memorization verdicts are false positives)
    null_splits: int = 1
    # checkpoints a run's headline selects from (the selection-aware rule's family is this x score kinds)
    n_checkpoints: int = 1
    # the canaries' audit (sweep block canaries): the error probability of the one-run bound and the rank
    # tests' level, and the one-run claim's δ (None: thresholds.epsilon_delta)
    canary_beta: float = 0.05
    canary_delta: float | None = None
    # two channels, same rows (probes.two_channel): K reference contexts of the context channel audited on every
    # fine-tuned checkpoint (even); 0 = off
    context_channel_references: int = 0
    # the rounded re-test: every verdict and claim is also computed on the outputs rounded to this many decimals,
    # as a deployed model returns them (probes.scoring.rounded_distribution_scores); None = no rounded re-test
    output_decimals: int | None = 4

    def __post_init__(self) -> None:
        for name in ("null_splits", "n_checkpoints", "n_resamples", "context_channel_references"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < (1 if name == "n_checkpoints" else 0):
                raise ConfigError(f"probe setting {name!r} must be an integer >= "
                                  f"{1 if name == 'n_checkpoints' else 0}, got {v!r}")
        d = self.output_decimals
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, np.integer))
                              or not OUTPUT_DECIMALS_MIN <= d <= OUTPUT_DECIMALS_MAX):
            raise ConfigError(f"probe setting 'output_decimals' must be an integer from {OUTPUT_DECIMALS_MIN} to "
                              f"{OUTPUT_DECIMALS_MAX} or None (no rounded re-test), got {d!r}")
        if self.context_channel_references % 2:
            raise ConfigError(f"probe setting 'context_channel_references' must be even (every row is then in half of "
                              f"the reference contexts), got {self.context_channel_references}")
