"""Predicting, step 3 of ``iclmem estimate`` (``orchestrator/estimate/estimate.py``): a sweep's device time and wall
time on N workers, from its counted work (``orchestrator.estimate.estimate_work``) and measured unit costs
(``orchestrator.estimate.estimate_measure``).

**Predict** device-seconds per phase (``orchestrator.runfolder.timing.Phase``, the same phases a run records in
``RUN_DIR/timings.json``) and the wall time on N workers (N parallel slots: cores for a CPU sweep, GPUs
for a CUDA one): driver start + Ray start + Stage I + the Tune experiment's fixed cost + max(parallel
work / N, the probe actors' work / min(probe actors, N), the longest chain: one run's trial overhead,
epochs and saves, then the probes of its last checkpoint). Trial overhead: each trial slot (what the
probe actors leave of N, over a trial's share) starts its actor once, and every trial adds its own
scheduling and reports. Within those bounds the parallel work packs perfectly (fine-tuning and probing
overlap, as the pipeline's checkpoint callback makes them). Then the aggregation and report, serial, from the
checkpoint rows (:func:`report_s`). Not modelled: data transfer between nodes, W&B upload (a run's record shows
them: ``iclmem estimate --compare``).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, replace

from orchestrator.estimate.estimate_disk import DiskPrediction, predict_disk
from orchestrator.estimate.estimate_measure import Measuring, Overheads, UnitCosts
from orchestrator.estimate.estimate_work import CostKey, Work
from orchestrator.runfolder.timing import PROBE_ACTOR_PHASES, Phase, Prediction


@dataclass(frozen=True)
class Estimate:
    work: Work
    costs: dict[CostKey, UnitCosts]
    overheads: Overheads
    workers: int
    compute_s: dict[str, float]  # device-seconds per kind of work, run in parallel on the workers
    serial_s: dict[str, float]  # on the driver, before the parallel work
    longest_s: float
    plan_builds: int
    probe_s: float = 0.0  # the part of compute_s that only the probe actors do
    probe_actors: int = 1  # resources.probe_actors
    measuring: Measuring | None = None  # what measuring the costs took (None: costs given, not measured)
    disk: DiskPrediction | None = None  # the bytes the sweep writes (orchestrator.estimate.estimate_disk), when predicted

    @property
    def parallel_s(self) -> float:
        return sum(self.compute_s.values())

    def _bounds(self) -> dict[str, float]:
        """Lower bounds of the parallel phase: all work over N workers; the probe actors' work over those
        of them that fit on the N workers (every checkpoint's probe runs on one of them); the longest chain."""
        return {"total work / N": self.parallel_s / self.workers,
                f"the {self.probe_actors} probe actor(s)": self.probe_s / min(self.probe_actors, self.workers),
                "the longest run": self.longest_s}

    @property
    def phase_s(self) -> float:
        """Wall time of the parallel phase: its largest lower bound (the work packs perfectly otherwise)."""
        return max(self._bounds().values())

    @property
    def bound(self) -> str:
        """Which bound sets the parallel phase (the first of equal ones)."""
        bounds = self._bounds()
        return max(bounds, key=lambda k: bounds[k])

    @property
    def wall_s(self) -> float:
        return sum(self.serial_s.values()) + self.phase_s

    def with_probe_actors(self, probe_actors: int) -> Estimate:
        """The same measured grid with another number of probe actors (their plans and starts recounted)."""
        return replace(predict(self.work, self.costs, self.workers, self.overheads, probe_actors),
                       measuring=self.measuring, disk=self.disk)

    def probe_actors_needed(self) -> int | None:
        """About how many probe actors would bring their bound down to total work / N (at most N), or None
        where the configured ones do not bind."""
        if not self.bound.endswith("probe actor(s)"):
            return None
        return min(self.workers, math.ceil(self.probe_s / max(self.parallel_s / self.workers, 1e-9)))

    @property
    def device_hours(self) -> float:
        """Device-hours held: N workers for the parallel phase (the busy share is parallel / (N x wall))."""
        return self.workers * self.phase_s / 3600

    @property
    def device(self) -> str:
        return next(iter(self.costs.values())).device

    def prediction(self, config_hash: str = "") -> Prediction:
        """The per-phase prediction a run is compared with (``orchestrator.runfolder.timing``)."""
        return Prediction(serial=dict(self.serial_s), work=dict(self.compute_s), longest_s=self.longest_s,
                          probe_actors=self.probe_actors, workers=self.workers, config_hash=config_hash,
                          device=self.device, created=time.strftime("%Y-%m-%d %H:%M:%S"),
                          disk_bytes=self.disk.final_bytes if self.disk is not None else 0)

    def on(self, workers: int) -> Estimate:
        """The same measured grid on another number of workers."""
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        disk = None if self.disk is None else predict_disk(self.work, self.costs, self.disk.policy, workers,
                                                           self.disk.wandb, self.disk.storage_path)
        return replace(predict(self.work, self.costs, workers, self.overheads, self.probe_actors),  # trial slots too
                       measuring=self.measuring, disk=disk)


def _epoch_s(cost: UnitCosts, dp: bool) -> float:
    return cost.dp_epoch_s if dp and not math.isnan(cost.dp_epoch_s) else cost.epoch_s


def _first_extra_s(cost: UnitCosts, dp: bool) -> float:
    return cost.dp_first_epoch_extra_s if dp and not math.isnan(cost.dp_epoch_s) else cost.first_epoch_extra_s


# Aggregation and report (the serial tail after the last probe: results, reference attacks, risk tables, claim
# ledger, figures, HTML page, W&B summary) grow with the checkpoint rows, and each row's risk and ledger work with
# its query rows and null splits. Fitted on this project's 2-core machine (benchmarks/scale.py's folders of 72, 288
# and 1,152 rows, 2Q = 30, 1 null split: 8.4, 24.0 and 91.8 s; the quickstart's 36 rows, 2Q = 70, 2 null splits:
# 9.5 s), W&B offline; without W&B the summary run's share (about a fifth, profiled) is left out. Not measured per
# machine: a faster driver shortens it.
REPORT_FIXED_S = 3.0
REPORT_ROW_S = 0.036
REPORT_QUERY_ROW_S = 0.00069  # per query row x (1 + null splits), per checkpoint row
REPORT_WANDB_SHARE = 0.2


# The driver's resident memory: its imports (torch, Ray, Tune, pandas, matplotlib, wandb) and Stage I, then about
# 0.75 MB per trial (Tune's trial records, results and probe rows held until the end); fitted on the scale
# rehearsal's peaks: 673 MB at 32 trials, 760 MB at 128, 1,034 MB at 512 (benchmarks/scale.py)
DRIVER_BASE_BYTES = 650_000_000
DRIVER_TRIAL_BYTES = 750_000


def driver_memory_bytes(work: Work) -> int:
    """The driver's predicted peak resident memory (see :data:`DRIVER_BASE_BYTES`)."""
    return DRIVER_BASE_BYTES + work.runs * DRIVER_TRIAL_BYTES


def report_s(work: Work) -> float:
    """Seconds of the aggregation and report after the last probe (see :data:`REPORT_FIXED_S`)."""
    rows = {k: n + work.controls.get(k, 0) for k, n in work.checkpoint_jobs.items()}
    total = sum(rows.values())
    if not total:
        return 0.0
    query_rows = sum(n * 2 * k.q for k, n in rows.items()) / total
    seconds = REPORT_FIXED_S + total * (REPORT_ROW_S + REPORT_QUERY_ROW_S * query_rows * (1 + work.null_splits))
    return seconds if work.wandb else seconds * (1 - REPORT_WANDB_SHARE)


def predict(work: Work, costs: dict[CostKey, UnitCosts], workers: int, overheads: Overheads,
            probe_actors: int = 1) -> Estimate:
    """Device-seconds and wall time from counted work and measured unit costs (see the module docstring)."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    costs = {CostKey(*k): v for k, v in costs.items()}
    keys = sorted(CostKey(*k) for k in work.runs_by)
    epochs, ck = work.epochs, work.checkpoints
    o = overheads
    compositions = work.compositions or {((k,), False): n for k, n in work.runs_by.items()}

    def tuning_s(task_keys: tuple[CostKey, ...], dp: bool) -> float:
        """One run's epochs (a step on each of its tasks per epoch; its first epoch's warm-up once) and its
        checkpoints' saves (one model)."""
        return (epochs * sum(_epoch_s(costs[k], dp) for k in task_keys)
                + sum(_first_extra_s(costs[k], dp) for k in task_keys)
                + ck * statistics.mean(costs[k].save_s for k in task_keys))

    probe_s = {k: (costs[k].contexts + costs[k].extra_contexts) * costs[k].score_per_context_s + costs[k].rest_s
               for k in keys}
    plan_builds = sum(work.references.get(k, 0) * min(probe_actors, work.checkpoint_jobs[k]) for k in keys)
    compute = {
        # each trial slot starts its actor once (Tune reuses it for the next trial); every trial adds its own
        # scheduling and reports
        Phase.TRIALS.value: (work.trial_slots(workers) * o.actor_start_s
                             + sum(compositions.values()) * o.tune_trial_s if o.tune_trial_s
                             else sum(compositions.values()) * o.actor_start_s),
        Phase.FINETUNE.value: sum(n * tuning_s(tk, dp) for (tk, dp), n in compositions.items()),
        Phase.SCORING.value: sum((work.probe_contexts[k] + work.control_contexts.get(k, 0)
                                  + work.checkpoint_jobs[k] * costs[k].extra_contexts)
                                 * costs[k].score_per_context_s for k in keys),
        Phase.PROBE_REST.value: sum((work.checkpoint_jobs[k] + work.controls.get(k, 0)) * costs[k].rest_s for k in keys),
        Phase.REFERENCE.value: sum((work.reference_contexts[k] + work.references.get(k, 0)
                                    * costs[k].extra_reference_contexts)
                                   * costs[k].score_per_context_s for k in keys),
        Phase.PLANS.value: sum(work.references.get(k, 0) * min(probe_actors, work.checkpoint_jobs[k]) * costs[k].plan_s
                               for k in keys),
        Phase.ACTOR_START.value: probe_actors * len({k.model for k in keys}) * o.actor_start_s,
    }
    prepare = {k.task: c.prepare_s for k, c in costs.items()}
    mean_prepare = statistics.mean(prepare.values())
    stage_i = (sum(n * prepare.get(task, mean_prepare) for task, n in work.prepared_by_task.items())
               if work.prepared_by_task else work.prepared_tasks * mean_prepare)
    serial = {Phase.DRIVER_START.value: o.driver_start_s, Phase.RAY.value: o.ray_start_s,
              Phase.STAGE_I.value: stage_i, Phase.TUNE_FIXED.value: o.tune_fixed_s, Phase.REPORT.value: report_s(work)}
    longest = max(o.actor_start_s + o.tune_trial_s + tuning_s(tk, dp) + sum(probe_s[k] for k in tk)
                  for tk, dp in compositions)
    probe_work = sum(v for k, v in compute.items() if Phase(k) in PROBE_ACTOR_PHASES)
    return Estimate(work, costs, o, workers, compute, serial, longest, plan_builds, probe_work, probe_actors)
