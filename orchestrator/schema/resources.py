"""What a sweep asks Ray for: the probe actors (tabular and LM sweeps alike) and each trial's CPUs, GPUs, threads,
custom resources and stall timeout, each share refused where Ray could not reserve it."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator

from orchestrator.schema.config_base import StrictConfig

# A custom resource amount a trial or a probe actor asks Ray for (finite: StrictConfig refuses inf and NaN)
ResourceAmount = Annotated[float, Field(ge=0)]


# The smallest CPU or GPU share Ray reserves: it counts resources in units of 1/10,000
# (ray_constants.MIN_RESOURCE_GRANULARITY) and refuses a smaller non-zero amount, which Tune reports as a crash
# deep inside its event manager ("Tracked actor is not managed by this event manager"), not as a bad setting
MIN_RAY_SHARE = 0.0001


# The most torch threads a trial may ask for. The worker that runs it is not knowable at validation (a laptop
# validates what a cluster runs), so the cap is fixed: above the logical CPU count of any one machine (two
# 192-core sockets with SMT are 768), below the point where starting the threads exhausts a process's limits
MAX_TORCH_THREADS = 1024


def _ray_share(value: float, zero_allowed: bool) -> float:
    """``value`` of a CPU/GPU share, refused (pydantic names the setting) when it is non-zero and below what Ray can reserve."""
    if (value != 0 or not zero_allowed) and value < MIN_RAY_SHARE:
        allowed = f"0 (none) or at least {MIN_RAY_SHARE}" if zero_allowed else f"at least {MIN_RAY_SHARE}"
        raise ValueError(f"{value:g} is below the smallest share Ray reserves ({MIN_RAY_SHARE}, its "
                         f"resource unit; Ray refuses a smaller amount and the run would crash): give {allowed}")
    return value


class ProbeActorsConfig(StrictConfig):
    """The probe pool's actors: how many, and what each asks Ray for (tabular and LM sweeps alike)."""

    probe_actors: int = Field(1, ge=1)
    cpus_per_probe_actor: float = Field(1.0, gt=0)
    gpus_per_probe_actor: float = Field(0.0, ge=0)
    # custom Ray resources of each probe actor, e.g. {worker: 1}: amounts >= 0 (Ray would wait forever for a
    # negative one, as for any amount no node has)
    probe_resources: dict[str, ResourceAmount] = Field(default_factory=dict)

    def actor_options(self) -> dict[str, Any]:
        """Ray actor options of one probe actor."""
        options: dict[str, Any] = {"num_cpus": self.cpus_per_probe_actor, "num_gpus": self.gpus_per_probe_actor}
        if self.probe_resources:
            options["resources"] = dict(self.probe_resources)
        return options

    @field_validator("cpus_per_probe_actor", "gpus_per_probe_actor")
    @classmethod
    def _probe_share_ray_can_reserve(cls, value: float, info: ValidationInfo) -> float:
        return _ray_share(value, zero_allowed=info.field_name == "gpus_per_probe_actor")


class ResourcesConfig(ProbeActorsConfig):
    cpus_per_trial: float = Field(1.0, gt=0)
    # torch threads of each fine-tuning trial (and of a probe actor recomputing a damaged checkpoint, which
    # must repeat the run's arithmetic exactly); keep it <= cpus_per_trial
    torch_threads_per_trial: int = Field(1, ge=1, le=MAX_TORCH_THREADS)
    gpus_per_trial: float = Field(0.0, ge=0)
    max_concurrent_trials: int | None = Field(None, ge=1)
    trial_resources: dict[str, ResourceAmount] = Field(default_factory=dict)  # custom resources, e.g. {worker: 1}
    # minutes without progress (no trial running, none started or finished, no epoch or probe result) after
    # which the driver stops the sweep, saying what Ray waits for, and exits 1 (resumable); 0 = wait forever
    stall_timeout_min: float = Field(30.0, ge=0)

    @field_validator("cpus_per_trial", "gpus_per_trial")
    @classmethod
    def _trial_share_ray_can_reserve(cls, value: float, info: ValidationInfo) -> float:
        return _ray_share(value, zero_allowed=info.field_name == "gpus_per_trial")
