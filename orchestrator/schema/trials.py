"""The sweep's grid expanded into the runs it names: a :class:`TrialSpec` per fine-tuning run (and per reference
trial of it), a :class:`ContextAuditSpec` per deployed-context audit. A run id is a pure function of the
settings that change the run's weights, so the same sweep names the same runs on every machine and resume."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, fields, replace
from typing import Any

from iclmem.errors import ConfigError
from iclmem.record import RunIdentity
from iclmem.vocab import LabelMode, Regime, TrialRole
from orchestrator.schema.config import SweepConfig
from orchestrator.schema.outputs import WANDB_ARTIFACT_KEY_MAX, WANDB_CHECKPOINT_ARTIFACT_PREFIX, WANDB_NAME_MAX

__all__ = ["ContextAuditSpec", "TrialSpec", "context_audit_specs", "expand_grid"]


@dataclass(frozen=True)
class TrialSpec:
    """One fine-tuning run of the grid: its identity (``iclmem.record.RunIdentity``, the identity columns of
    every results row it writes) and what else it is run with. The identity's fields read as the spec's own
    (``trial.run_id``, ``trial.q``, ...)."""

    identity: RunIdentity
    model_options: tuple[tuple[str, Any], ...]
    dp: float = math.inf  # DP-SGD target epsilon; inf = plain fine-tuning
    role: TrialRole = TrialRole.TARGET
    reference_of: str | None = None  # a reference trial: the run id of the run it is a reference model of
    reference_index: int | None = None  # ... and its index k (0..K-1), which picks its half of the population

    @property
    def run_id(self) -> str:
        return self.identity.run_id

    @property
    def task(self) -> str:
        return self.identity.task

    @property
    def model(self) -> str:
        return self.identity.model

    @property
    def regime(self) -> str:
        return self.identity.regime

    @property
    def lr(self) -> float:
        return self.identity.lr

    @property
    def q(self) -> int:
        return self.identity.q

    @property
    def label_mode(self) -> str:
        return self.identity.label_mode

    @property
    def seed(self) -> int:
        return self.identity.seed

    def as_dict(self) -> dict[str, Any]:
        """The spec as one flat dict: the identity's fields, the model's options beside the model, the rest."""
        out: dict[str, Any] = {}
        for name, value in self.identity.as_dict().items():
            out[name] = value
            if name == "model":
                out["model_options"] = dict(self.model_options)
        rest = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "identity" and f.name not in out}
        return {**out, **rest}


@dataclass(frozen=True)
class ContextAuditSpec:
    """One deployed-context audit of regime ``context``: ``model`` with ``q`` rows of ``task`` as its context.
    It holds no ``RunIdentity``: an audit has no learning rate, label mode or fine-tuning regime, and its rows
    (``context_audits.parquet``) are not results rows."""

    run_id: str
    task: str
    model: str
    model_options: tuple[tuple[str, Any], ...]
    q: int
    seed: int


def context_audit_specs(sweep: SweepConfig) -> list[ContextAuditSpec]:
    """Regime ``context``: one audit per task × model × Q (the deployed context's rows) × seed; the grid's
    lr, label modes and ε are fine-tuning axes, which this regime has none of."""
    if Regime.CONTEXT not in sweep.grid.regime:
        return []
    out = []
    for task, model, q, seed in itertools.product(sweep.tasks, sweep.models, sweep.grid.q, sweep.grid.seed):
        key = json.dumps([task.name, model.name, model.options, Regime.CONTEXT.value, q, seed,
                          sweep.probe.context_references], sort_keys=True, default=str)
        run_id = f"{task.name[:24]}-context-n{q}-s{seed}-{model.name}-{hashlib.sha1(key.encode()).hexdigest()[:6]}"
        out.append(ContextAuditSpec(run_id, task.name, model.name, tuple(sorted(model.options.items())), q, seed))
    return out


def expand_grid(sweep: SweepConfig) -> list[TrialSpec]:
    """tasks × models × regimes × lrs × Q × label modes × seeds; multi_fixed and multi_random runs take all
    tasks at once (one model fine-tuned jointly on every task, paper App. 10). With ``probe.references``
    = K, each run is followed by its K reference trials (``<run id>-ref<k>``, same recipe; Stage I gives
    each its half of the run's population); the runs' own ids do not change."""
    trials = []
    g = sweep.grid
    for model, regime, lr, q, mode, seed, dp in itertools.product(sweep.models, g.regime, g.lr, g.q, g.label_mode,
                                                                  g.seed, g.dp):
        if regime == Regime.CONTEXT:  # no fine-tuning: audits of their own (context_audit_specs)
            continue
        joint = regime in (Regime.MULTI_FIXED, Regime.MULTI_RANDOM)
        task_groups = ["+".join(t.name for t in sweep.tasks)] if joint else [t.name for t in sweep.tasks]
        for task in task_groups:
            # a run without DP keeps the id it had before the dp axis existed; a DP run's names its epsilon
            # (and, in the hashed key, the settings that change its noise)
            parts: list[Any] = [task, model.name, model.options, regime, lr, q, mode, seed]
            tag = ""
            if math.isfinite(dp):
                t = sweep.training
                parts.append({"dp": dp, "delta": t.dp_delta, "max_grad_norm": t.dp_max_grad_norm,
                              "accountant": str(t.dp_accountant)})
                tag = f"-dp{dp:g}"
            if mode == LabelMode.SHUFFLED_MEMBERS:
                # the label design changes what the non-members are scored on: another design, another run
                # (ids of shuffled_members runs from before label-matched non-members existed do not recur)
                parts.append({"label_design": str(sweep.data.label_design)})
            if sweep.canaries.enabled:  # canaries change the weights: a run with them is another run
                parts.append({"canaries": sweep.canaries.settings()})
            key = json.dumps(parts, sort_keys=True, default=str)
            run_id = (f"{task[:24]}-{regime}-lr{lr:g}-q{q}-{mode}-s{seed}{tag}-"
                      f"{hashlib.sha1(key.encode()).hexdigest()[:6]}")
            target = TrialSpec(RunIdentity(run_id, task, model.name, regime, lr, q, mode, seed),
                               tuple(sorted(model.options.items())), dp)
            trials.append(target)
            trials.extend(replace(target, identity=replace(target.identity, run_id=f"{run_id}-ref{k}"),
                                  role=TrialRole.REFERENCE, reference_of=run_id, reference_index=k)
                          for k in range(sweep.probe.references))
    # each trial logs a W&B checkpoint artifact named after its run id: refused here, where the ids are made,
    # not when the finished run logs it
    longest = max((t.run_id for t in trials), key=len, default="")
    checkpoint = f"{WANDB_CHECKPOINT_ARTIFACT_PREFIX}{longest[:WANDB_ARTIFACT_KEY_MAX]}"
    if len(checkpoint) > WANDB_NAME_MAX:
        raise ConfigError(f"the run id {longest!r} makes a W&B checkpoint artifact name of {len(checkpoint)} "
                          f"characters, past W&B's limit of {WANDB_NAME_MAX}: shorten the values it is made of "
                          "(task name, grid.q, grid.seed, grid.lr, grid.dp)")
    return trials
