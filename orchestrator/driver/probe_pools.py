"""The probe pools of a tabular sweep: one pool of probe actors per distinct model (each holding that model's
base as the reference), what they hold beside the trials on a local Ray, and the probe jobs a checkpoint
becomes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iclmem.errors import SweepStalled
from iclmem.runfolder import REFERENCE_DIR, probe_stem
from orchestrator.driver.progress import Watchdog
from orchestrator.schema.config import SweepConfig

if TYPE_CHECKING:
    from orchestrator.runfolder.prepare import PreparedSweep
    from probes.actors import PoolJob, ProbeJob, ProbePool
    from trainables.spec import TrialConfig


def probe_pool_key(model_cfg: Any) -> tuple[str, str]:
    """Which probe pool a model's runs are probed by: one pool per distinct model (name and options)."""
    return model_cfg.name, json.dumps(dict(model_cfg.options), sort_keys=True, default=str)


def probe_pool_count(sweep: Any) -> int:
    """How many probe pools a sweep with trials starts (``start_probe_pools``), each of
    ``resources.probe_actors`` actors."""
    return len({probe_pool_key(m) for m in sweep.models})


def unsatisfiable_resources(resources: Any, available: dict[str, float], pools: int = 1) -> list[str]:
    """What a single Ray node holding ``available`` (``ray.cluster_resources()``) can never give one trial or
    one probe actor of ``resources`` (the sweep's ``resources`` block), one line each naming the setting.
    ``pools``: the probe pools the sweep starts (:func:`probe_pool_count`; 0 without trials), whose actors
    all hold their share for the whole sweep."""
    asks = [("resources.cpus_per_trial", "CPU", resources.cpus_per_trial),
            ("resources.gpus_per_trial", "GPU", resources.gpus_per_trial),
            ("resources.cpus_per_probe_actor", "CPU", resources.cpus_per_probe_actor),
            ("resources.gpus_per_probe_actor", "GPU", resources.gpus_per_probe_actor)]
    asks += [(f"resources.trial_resources.{k}", k, v) for k, v in resources.trial_resources.items()]
    asks += [(f"resources.probe_resources.{k}", k, v) for k, v in resources.probe_resources.items()]
    problems = []
    for setting, kind, amount in asks:
        have = float(available.get(kind, 0.0))
        if amount and amount > have:
            problems.append(f"{setting}: {amount:g} {kind} asked, the local Ray has {have:g}"
                            + (" (no GPU found)" if kind == "GPU" and not have else ""))
    if problems:
        return problems
    # the probe actors start first and hold their share for the whole sweep: a trial must fit beside them
    for kind, per_trial, per_actor in (("CPU", resources.cpus_per_trial, resources.cpus_per_probe_actor),
                                       ("GPU", resources.gpus_per_trial, resources.gpus_per_probe_actor)):
        actors = resources.probe_actors * pools
        held = actors * per_actor
        have = float(available.get(kind, 0.0))
        if per_trial and held and per_trial + held > have:
            who = (f"{actors} probe actor(s)" if pools == 1 else
                   f"{actors} probe actors ({resources.probe_actors} for each of the sweep's {pools} models)")
            problems.append(f"resources.{kind.lower()}s_per_trial: {per_trial:g} {kind} asked, but the "
                            f"{who} hold {held:g} of the local Ray's {have:g} "
                            f"{kind} for the whole sweep: no trial could start (lower it, or "
                            f"resources.probe_actors / {kind.lower()}s_per_probe_actor)")
    return problems


class ProbePools:
    """One probe pool per model of the sweep, each holding that model's own base as the reference;
    jobs are routed by the (model, options) of the run they come from."""

    def __init__(self, pools: dict[tuple[str, str], ProbePool]) -> None:
        self.pools = pools

    def submit(self, job: Any) -> None:
        self.pools[(job.identity["model"], job.identity["model_options"])].submit(job)

    def poll(self, timeout: float = 0.0) -> list[dict[str, Any]]:
        return [row for pool in self.pools.values() for row in pool.poll(timeout=timeout / len(self.pools))]

    def drain(self, watchdog: Watchdog | None = None, poll_every: float = 0.5) -> list[dict[str, Any]]:
        """Every pending job's row. With ``watchdog``: :class:`SweepStalled` once no job has finished for its
        timeout (probe actors waiting for resources no node gives)."""
        rows = self.poll()
        while self.pending:
            got = self.poll(timeout=poll_every)
            rows.extend(got)
            if watchdog is not None and watchdog.observe(len(rows)) and self.pending:
                raise SweepStalled(f"no progress for {watchdog.idle_s / 60:.1f} min: {self.pending} probe job(s) "
                                   "waiting, none finished (probe actors waiting for resources? see "
                                   "resources.cpus_per_probe_actor, gpus_per_probe_actor, probe_resources)")
        return rows

    @property
    def pending(self) -> int:
        return sum(len(pool.pending) for pool in self.pools.values())

    @property
    def failed(self) -> list[tuple[PoolJob, str]]:
        return [f for pool in self.pools.values() for f in pool.failed]

    @property
    def notes(self) -> list[str]:
        return [n for pool in self.pools.values() for n in pool.notes]

    def start_seconds(self) -> float:
        return sum(pool.start_seconds() for pool in self.pools.values())

    def shutdown(self) -> None:
        for pool in self.pools.values():
            pool.shutdown()


def checkpoints_per_run(sweep: SweepConfig) -> int:
    """How many checkpoints a run's headline selects from: the selection-aware rule's family size is this
    times the competing score kinds."""
    return len(sweep.training.schedule())


def start_probe_pools(prepared: PreparedSweep, run_dir: Path) -> ProbePools:
    """The probe pools of a sweep with trials, on the Ray the driver started: one per distinct model
    (:func:`probe_pool_key`), each of ``resources.probe_actors`` actors sharing one copy of the prepared tasks."""
    import ray

    from probes.actors import ProbePool
    from probes.calibration import model_digest
    from trainables.models import build_model

    sweep = prepared.sweep
    settings = sweep.probe_settings(n_checkpoints=checkpoints_per_run(sweep))
    res = sweep.resources
    options = res.actor_options()
    cache = run_dir / REFERENCE_DIR
    cache.mkdir(parents=True, exist_ok=True)
    tasks = ray.put(prepared.tasks)  # one copy in the object store for every pool
    pools = {}
    for model_cfg in sweep.models:
        key = probe_pool_key(model_cfg)
        if key in pools:
            continue
        base = build_model(model_cfg.name, **model_cfg.options)
        pools[key] = ProbePool(
            res.probe_actors, options,
            base_model_name=model_cfg.name, base_options=dict(model_cfg.options), base_skeleton=base.skeleton_options(),
            base_weights=ray.put(base.state_arrays()), base_digest=model_digest(base),
            tasks=tasks, suite_spec=sweep.probe.suite, settings=settings, cache_dir=str(cache),
            reference_tasks=dict(prepared.reference_tasks),
        )
    return ProbePools(pools)


def portable_checkpoint(checkpoint: Any) -> Any:
    """What a probe job carries of a Tune checkpoint: the folder's path when it lies on a local (or shared,
    mounted) disk, the ``tune.Checkpoint`` itself on remote storage. A path is what ``as_directory`` gives for a
    local checkpoint anyway, and unpickling a ``tune.Checkpoint`` makes a fresh probe actor import Ray Tune, Train
    and Data first (0.4 CPU-s an actor measured here)."""
    import pyarrow.fs as pafs

    filesystem = getattr(checkpoint, "filesystem", None)
    if filesystem is not None and isinstance(filesystem, pafs.LocalFileSystem):
        return str(checkpoint.path)
    return checkpoint


def jobs_for(trial: TrialConfig, epoch: int, checkpoint: Any, probes_dir: Path) -> list[ProbeJob]:
    """One probe job per task of the run (``trial``: the typed trial): a multi-task run
    (multi_fixed, multi_random) is probed on every one of its tasks, one results row per task (``task`` = that
    task's name; stems ``eNNNN-tI``)."""
    from probes.actors import ProbeJob

    keys = list(trial.task_keys)
    names = str(trial.identity["task"]).split("+")
    recipe = {"finetune": trial.finetune.to_dict(), "task_keys": keys, "torch_threads": trial.torch_threads}
    jobs = []
    for i, key in enumerate(keys):
        identity = dict(trial.identity)
        stem = probe_stem(epoch)
        if len(keys) > 1:
            identity["task"] = names[i] if len(names) == len(keys) else f"{identity['task']}[{i}]"
            stem = f"{stem}-t{i}"
        jobs.append(ProbeJob(identity=identity, epoch=epoch, checkpoint=portable_checkpoint(checkpoint), task_key=key,
                             out_dir=str(probes_dir / trial.run_id), stem=stem, recipe=recipe))
    return jobs
