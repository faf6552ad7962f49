"""What determines one run's weights, apart from the prepared tasks: :class:`FinetuneSpec`, the fine-tuning
settings every trainer reads (iclmem's loop and the packages' own fine-tuners) and the one place their defaults
are declared (the sweep schema's ``training:`` block reads them from here). Pure: no torch, so the schema can
read it without loading torch."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from iclmem.errors import ConfigError
from iclmem.vocab import Regime
from trainables.canaries import CanarySettings
from trainables.dp import DPSettings

__all__ = ["DEFAULT_CHECKPOINT_EPOCHS", "FinetuneSpec"]

# the paper's checkpoint schedule, capped by a run's epochs
DEFAULT_CHECKPOINT_EPOCHS = (1, 2, 5, 10, 25, 50, 100, 250, 500)


@dataclass(frozen=True)
class FinetuneSpec:
    """Everything that determines one run's weights, apart from the prepared tasks."""

    model: str = "pfn-mini"
    model_options: dict[str, Any] = field(default_factory=dict)
    regime: Regime = Regime.SINGLE_FIXED
    lr: float = 1e-3
    epochs: int = 50
    checkpoint_epochs: tuple[int, ...] = DEFAULT_CHECKPOINT_EPOCHS
    every_epoch: bool = False
    grad_clip: float = 1.0
    weight_decay: float = 0.01
    seed: int = 0
    queries_per_step: int | None = None  # multi_random: Q query rows drawn per epoch (default: all but the context)
    # DP-SGD (trainables.dp): per-query-row clipping and Gaussian noise instead of plain steps; None = off
    dp: DPSettings | None = None
    # canary rows added to the members as extra query rows (trainables.canaries); None = off
    canaries: CanarySettings | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "regime", Regime(self.regime))
        if self.regime == Regime.CONTEXT:
            raise ConfigError("regime context fine-tunes nothing: its audits run in orchestrator.context_audit")
        if self.canaries is not None:
            object.__setattr__(self, "canaries", CanarySettings.from_value(self.canaries))
            if self.regime != Regime.SINGLE_FIXED:
                raise ConfigError(f"canaries are inserted into one task's members: regime single_fixed only, "
                                  f"not {self.regime.value}")
        if self.dp is not None:
            object.__setattr__(self, "dp", DPSettings.from_value(self.dp))
            if self.regime == Regime.MULTI_RANDOM:
                raise ConfigError("DP-SGD is not offered for regime multi_random: its contexts are drawn from the "
                                  "member rows, whose influence as context rows per-row clipping does not bound")
            if self.dp.epochs != self.epochs:
                raise ConfigError(f"DP noise was calibrated for {self.dp.epochs} epochs, the run trains {self.epochs}")
        object.__setattr__(self, "checkpoint_epochs", tuple(int(e) for e in self.checkpoint_epochs))
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise ConfigError(f"lr must be a positive number, got {self.lr}")
        if self.epochs < 1:
            raise ConfigError(f"epochs must be at least 1, got {self.epochs}")

    def schedule(self) -> tuple[int, ...]:
        """Epochs at which a checkpoint is written: the schedule capped by the run's epochs, plus the last."""
        if self.every_epoch:
            return tuple(range(1, self.epochs + 1))
        kept = sorted({e for e in self.checkpoint_epochs if 1 <= e <= self.epochs} | {self.epochs})
        return tuple(kept)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["regime"] = self.regime.value
        out["checkpoint_epochs"] = list(self.checkpoint_epochs)
        if self.dp is None:
            del out["dp"]  # a run without DP records the spec it always did
        else:
            out["dp"] = self.dp.as_dict()
        if self.canaries is None:
            del out["canaries"]  # likewise a run without canaries
        else:
            out["canaries"] = self.canaries.as_dict()
        return out
