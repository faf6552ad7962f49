"""What a fine-tuning trial is, typed: :class:`FinetuneSpec`, everything that determines one run's weights apart
from the prepared tasks (the settings every trainer reads, iclmem's loop and the packages' own fine-tuners, and
the one place their defaults are declared: the sweep schema's ``training:`` block reads them from here), and
:class:`TrialConfig`, the whole trial the Tune trainable rebuilds (identity, spec, tasks, threads), with the one
constructor from Tune's config. Pure: no torch, so the schema can read it without loading torch."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

from iclmem.errors import ConfigError
from iclmem.record import RunIdentity
from iclmem.vocab import Regime
from trainables.canaries import CanarySettings
from trainables.dp import DPSettings

__all__ = ["DEFAULT_CHECKPOINT_EPOCHS", "TUNE_AXIS", "FinetuneSpec", "TrialConfig"]

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
            raise ConfigError("regime context fine-tunes nothing: its audits run in orchestrator.audits.context_audit")
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


# The one grid axis the sweep driver gives Tune: its values are whole trial configs (TrialConfig.to_tune), so
# Tune names trials by index and makes no cross product of our settings.
TUNE_AXIS = "__trial__"


@dataclass(frozen=True)
class TrialConfig:
    """One fine-tuning trial, as the Tune trainable rebuilds it: the run's identity (the results row's identity
    columns, in their order, and the further ones every row of the run carries: config hash, git commit, the DP
    statement, a reference trial's target), the fine-tuning spec, the prepared tasks it trains on (their
    fingerprints), its torch threads, and the null splits its ground-truth log lists.

    It crosses Ray as the plain dict :meth:`to_tune` writes (Tune stores and shows trial configs); every reader
    on the other side rebuilds it with :meth:`from_tune`, the one constructor from Tune's config."""

    run_id: str
    task_keys: tuple[str, ...]
    identity: Mapping[str, Any]
    finetune: FinetuneSpec
    torch_threads: int = 1
    null_splits: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "task_keys", tuple(str(k) for k in self.task_keys))
        object.__setattr__(self, "identity", MappingProxyType(dict(self.identity)))
        if self.identity.get("run_id") != self.run_id:
            raise ConfigError(f"trial {self.run_id!r}: its identity names run {self.identity.get('run_id')!r}")
        if not self.task_keys:
            raise ConfigError(f"trial {self.run_id!r} names no prepared task")

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled as the plain dict Tune holds (the read-only identity view itself does not pickle)
        return (TrialConfig.from_tune, (self.to_tune(),))

    @property
    def run_identity(self) -> RunIdentity:
        """The typed identity (``iclmem.record.RunIdentity``) of the run's results rows."""
        return RunIdentity.from_row(self.identity)

    def to_tune(self) -> dict[str, Any]:
        """The trial as Tune's config holds it (plain values only)."""
        return {"run_id": self.run_id, "task_keys": list(self.task_keys), "identity": dict(self.identity),
                "torch_threads": int(self.torch_threads), "null_splits": int(self.null_splits),
                "finetune": self.finetune.to_dict()}

    @classmethod
    def from_tune(cls, config: Mapping[str, Any]) -> TrialConfig:
        """The trial a Tune config (the driver's one grid axis, or its value) describes."""
        config = config.get(TUNE_AXIS, config)
        return cls(run_id=str(config["run_id"]), task_keys=tuple(config["task_keys"]),
                   identity=dict(config["identity"]), finetune=FinetuneSpec(**config["finetune"]),
                   torch_threads=int(config.get("torch_threads", 1)), null_splits=int(config.get("null_splits", 0)))
