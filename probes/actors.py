"""Probe actors and the pool that feeds them: thin Ray shells around the probe layer's work.

One pool (:class:`ProbePool`: retries, resends to restarted actors, stored results, notes, failures) serves
every probe family; the worker kind is pluggable. A worker class has ``run(job) -> result``, the
``result_type()`` its results are stored as (``save(dir, stem)``, ``load(dir, stem)``, ``row``, ``notes``),
and ``node_id``. Two kinds:

* :class:`ProbeWorker` (tabular): ``probes.probe.probe_checkpoint`` per checkpoint. Each actor builds the
  reference (base) model once from weights fetched from the object store: the driver ``ray.put``s the
  weights as numpy arrays a single time and every actor on a node maps that same shared-memory copy,
  instead of each job shipping its own.
* :class:`LMUnitWorker` (language models): one ``probes.lm.units`` work unit per job, run by name.

Jobs are idempotent: a job whose result files exist (and pass their checksum) returns them without
recomputing, and results are written atomically, so a retried job (actor died) or a resumed sweep never
duplicates or corrupts a result.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import ray

from probes.manipulations import Suite, default_suite, suite_from_spec
from probes.probe import ProbeResult, ProbeSettings, probe_checkpoint
from probes.scoring import ProbePlan, ProbeQueries

if TYPE_CHECKING:
    from probes.lm.units import LMUnit, LMUnitResult


@dataclass(frozen=True)
class ProbeJob:
    """One checkpoint to probe. ``checkpoint`` is a ``tune.Checkpoint`` (any storage), a folder, or
    None for the untouched base model probed as if it were a checkpoint (the control run)."""

    identity: dict[str, Any]  # run_id, task, model, regime, lr, q, label_mode, seed, ...
    epoch: int
    checkpoint: Any
    task_key: str  # fingerprint of the prepared task (the run's first task for multi-task regimes)
    out_dir: str
    stem: str
    # How the run was fine-tuned ({"finetune": FinetuneSpec kwargs, "task_keys": [...], "torch_threads": n}): lets an actor
    # recompute a checkpoint that fails its checksum instead of failing the job.
    recipe: dict[str, Any] | None = None


def suite_for(spec: Any) -> Suite:
    return default_suite() if spec in (None, "default") else suite_from_spec(spec)


class PoolJob(Protocol):
    """What the pool needs of a job: where its result is stored."""

    out_dir: str
    stem: str


def _node_id() -> str:
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


class _PoolWorker:
    """What every worker kind answers besides ``run``: the node it runs on, and how long it took to start."""

    def node_id(self) -> str:
        return _node_id()

    def _mark_started(self) -> None:
        """Called at the end of a constructor: the actor's start is its process's start to here (imports,
        the reference model's load, the tasks from the object store)."""
        import psutil

        self._start_seconds = max(time.time() - psutil.Process().create_time(), 0.0)

    def start_seconds(self) -> float:
        return float(getattr(self, "_start_seconds", 0.0))


class ProbeWorker(_PoolWorker):
    """Holds the reference model and per-task probe plans; scores checkpoints on request."""

    @staticmethod
    def result_type() -> type[ProbeResult]:
        return ProbeResult

    def __init__(self, base_model_name: str, base_options: dict[str, Any], base_weights: Any,
                 base_digest: str, tasks: dict[str, Any], suite_spec: Any, settings: ProbeSettings,
                 cache_dir: str, torch_threads: int = 1, device: str | None = None,
                 reference_tasks: dict[str, str] | None = None, base_skeleton: dict[str, Any] | None = None) -> None:
        import torch

        from trainables.models import build_model
        from trainables.models.base import resolve_device

        torch.set_num_threads(torch_threads)
        # None = auto: CUDA exactly when Ray gave this actor GPUs (actor_options num_gpus)
        self.device = resolve_device(device)
        # the base's own architecture (``ModelAdapter.skeleton_options``, recorded when the driver loaded it),
        # then its weights from the object store
        self.base = build_model(base_model_name, **(base_skeleton or {**base_options, "weights": "random"}))
        if self.device.type == "cpu":
            # base_weights: numpy arrays from the object store (an ObjectRef argument is resolved by Ray);
            # used in place, so the actors of a node share one copy of the reference model.
            self.base.load_state_arrays(base_weights, copy=False)
        else:  # on a GPU each actor holds its own device copy
            self.base.load_state_arrays(base_weights, copy=True)
            self.base.to(self.device)
            self.base.module.eval()
        self.base_digest = base_digest
        self.base_options = base_options
        self.tasks = tasks
        self.suite = suite_for(suite_spec)
        self.settings = settings
        self.cache_dir = cache_dir
        self._plans: dict[str, ProbePlan] = {}
        self._canaries: dict[tuple[str, str], Any] = {}
        # a reference trial's task fingerprint -> its target's (probe.references): see ``run``
        self.reference_tasks = dict(reference_tasks or {})
        self._mark_started()

    def plan(self, task_key: str) -> ProbePlan:
        if task_key not in self._plans:
            from probes.stopwatch import phase

            task = self.tasks[task_key]
            with phase("plan"):
                self._plans[task_key] = ProbePlan.build(ProbeQueries.from_task(task), self.suite, task.seed,
                                                        compress_rows=self.base.supports_context_weights)
        return self._plans[task_key]

    def canaries(self, job: ProbeJob) -> Any:
        """The run's canaries (``trainables.canaries``), rebuilt from its recipe; None for a run without
        them and for the base model (its exposure is 0 by construction)."""
        settings = (job.recipe or {}).get("finetune", {}).get("canaries")
        if settings is None or job.checkpoint is None:
            return None
        from trainables.canaries import CanarySettings, make_canaries

        key = (job.task_key, json.dumps(CanarySettings.from_value(settings).as_dict(), sort_keys=True))
        if key not in self._canaries:
            self._canaries[key] = make_canaries(self.tasks[job.task_key], settings)
        return self._canaries[key]

    def _model_for(self, job: ProbeJob, notes: list[str]) -> Any:
        if job.checkpoint is None:
            return self.base
        if isinstance(job.checkpoint, (str, Path)):
            return self._load_or_recompute(job, job.checkpoint, notes).to(self.device)
        with job.checkpoint.as_directory() as directory:  # downloads from remote storage if needed
            return self._load_or_recompute(job, directory, notes).to(self.device)

    def _load_or_recompute(self, job: ProbeJob, directory: Any, notes: list[str]) -> Any:
        """The checkpoint's model; one that fails its checksum is recomputed from the run's recipe (and
        must then hash as the manifest recorded, when the manifest survived)."""
        from iclmem.errors import CorruptCheckpointError
        from trainables.finetune import checkpoint_manifest, load_checkpoint_model
        from trainables.recompute import recompute_checkpoint_model
        from trainables.spec import FinetuneSpec

        try:
            return load_checkpoint_model(directory)
        except CorruptCheckpointError as exc:
            if job.recipe is None:
                raise
            expected = None
            try:
                expected = checkpoint_manifest(directory)["weights_sha256"]
            except (CorruptCheckpointError, KeyError, TypeError):
                pass
            model = recompute_checkpoint_model(FinetuneSpec(**job.recipe["finetune"]),
                                               [self.tasks[k] for k in job.recipe["task_keys"]], job.epoch, expected,
                                               torch_threads=job.recipe.get("torch_threads"))
            check = "weights match the recorded checksum" if expected else "no intact manifest to check against"
            notes.append(f"run {job.identity.get('run_id')} epoch {job.epoch}: {exc}; recomputed the checkpoint "
                         f"from the run's config ({check})")
            return model

    def run(self, job: ProbeJob) -> ProbeResult:
        """Probe one checkpoint and return the whole result; the driver stores it on its own disk, so
        results never depend on which node an actor ran on."""
        from iclmem.clock import device_clock
        from probes import stopwatch

        stopwatch.reset()
        clock = device_clock(self.device)
        stopwatch.use_clock(clock)
        started, wall = clock(), time.perf_counter()
        task = self.tasks[job.task_key]
        notes: list[str] = []
        settings, base_plan = self.settings, None
        target_key = self.reference_tasks.get(job.task_key)
        if target_key is not None:
            # A reference trial probes its target's 2Q queries with other member flags: the base model's scores
            # are the target's own table (one computation for the run and its K references), and its null
            # splits are skipped (the attacks' null splits come from the target's query table instead).
            base_plan = (self.tasks[target_key].fingerprint, self.plan(target_key))
            settings = replace(settings, null_splits=0)
        # a reference trains with the target's canaries (the recipe's "in" distribution) but is no audit
        # target: its canaries are not scored
        canaries = None if target_key is not None else self.canaries(job)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # every job's: an actor probes many checkpoints
            result = probe_checkpoint(
                self._model_for(job, notes), task, self.plan(job.task_key), self.cache_dir, self.base_digest,
                self.base, settings, job.identity, job.epoch, canaries=canaries, base_plan=base_plan,
            )
        notes.extend(_recomputed_notes(caught, job, notes))
        result.row["probe_seconds"] = round(time.perf_counter() - wall, 3)
        result.row["probe_device_seconds"] = round(clock() - started, 3)
        spent = stopwatch.tally()  # the phases of this job (orchestrator.runfolder.timing reads them off the results)
        for name in ("score", "reference", "plan"):
            result.row[f"probe_{name}_seconds"] = round(spent.get(name, 0.0), 3)
        result.row["probe_node"] = _node_id()
        return replace(result, notes=tuple(notes)) if notes else result


# what ``iclmem.atomic.read_parquet_checked`` (reference scores, the base model's in-context loss) and
# ``trainables.data.load_prepared`` warn when a stored table is damaged and recomputed
_RECOMPUTED = ("ignoring unreadable file ", "ignoring damaged ")


def _recomputed_notes(caught: list[warnings.WarningMessage], job: ProbeJob, notes: list[str]) -> list[str]:
    """The warnings of one probe job that name a damaged stored file it recomputed (a ``reference/*.parquet``
    first of all), as notes: the driver shows an actor's notes on its own console (the README's promise: "a
    damaged one is recomputed with a warning that names it"), where the actor's stderr, on whatever node it
    runs, would only reach the console log. Any other warning is shown as it would have been."""
    found: list[str] = []
    for w in caught:
        text = str(w.message)
        if issubclass(w.category, UserWarning) and text.startswith(_RECOMPUTED):
            line = f"run {job.identity.get('run_id')} epoch {job.epoch}: {' '.join(text.split())[:600]}"
            if line not in notes and line not in found:
                found.append(line)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return found


class LMUnitWorker(_PoolWorker):
    """Runs LM probe units (``probes.lm.units.LM_UNITS``) by name. The datasets arrive once from the object
    store; each model is loaded once per actor process (``load_lm`` caches it)."""

    @staticmethod
    def result_type() -> type[LMUnitResult]:
        # imported on use, as in run(): a tabular probe actor imports this module and must not pay for the LM
        # probe modules (about 0.4 s an actor start)
        from probes.lm.units import LMUnitResult

        return LMUnitResult

    def __init__(self, models: dict[str, str], datasets: dict[str, Any], device: str = "cpu",
                 torch_threads: int = 1) -> None:
        import torch

        torch.set_num_threads(torch_threads)
        self.models = models  # label -> local model directory
        self.datasets = datasets  # name -> LMDataset
        self.device = device

    def run(self, unit: LMUnit) -> LMUnitResult:
        from probes.lm.model import load_lm
        from probes.lm.units import LMUnitResult

        started = time.perf_counter()
        table = unit.run(load_lm(self.models[unit.model], self.device), self.datasets[unit.dataset])
        row = {**unit.identity, "unit_seconds": round(time.perf_counter() - started, 3), "unit_node": _node_id()}
        return LMUnitResult(row, table)


@cache
def remote_worker(worker_class: type) -> Any:
    """The Ray actor class of a worker kind: restarted without limit when its process dies, and an
    interrupted call is retried on the restarted actor."""
    return ray.remote(max_restarts=-1, max_task_retries=3)(worker_class)


class ProbePool:
    """A fixed pool of worker actors of one kind (``worker_class``, :class:`ProbeWorker` unless given)
    fed round-robin; failed jobs are resubmitted to a live actor.

    Two kinds of failure are told apart. A job that raised, or whose actor died, is retried up to
    ``max_attempts`` times. A job whose actor is *unavailable* (its node stopped answering and Ray has
    not yet declared it dead, which takes tens of seconds; then Ray restarts the actor elsewhere) is
    resent without spending an attempt, for up to ``unavailable_timeout`` seconds from its first
    submission. A job is never in flight twice, and a success clears its earlier failures."""

    def __init__(self, n_actors: int, actor_options: dict[str, Any], unavailable_timeout: float = 600.0,
                 worker_class: Any = ProbeWorker, **worker_kwargs: Any) -> None:
        self.actor_options = actor_options
        self.worker_kwargs = worker_kwargs
        self.unavailable_timeout = unavailable_timeout
        self.result_type = worker_class.result_type()
        actor_class = remote_worker(worker_class)
        self.actors = [actor_class.options(**actor_options).remote(**worker_kwargs) for _ in range(n_actors)]
        self._next = 0
        self.pending: dict[Any, tuple[PoolJob, int, float]] = {}  # ref -> (job, attempt, first submitted)
        self.done: list[dict[str, Any]] = []
        self.failed: list[tuple[PoolJob, str]] = []
        self.notes: list[str] = []  # warnings from the actors (e.g. a corrupt checkpoint recomputed)
        self._ready: list[dict[str, Any]] = []  # stored results found at submit time, reported by the next poll

    @staticmethod
    def _key(job: PoolJob) -> tuple[str, str]:
        return (job.out_dir, job.stem)

    def submit(self, job: PoolJob, attempt: int = 0, since: float | None = None) -> None:
        """Queue a job unless its result is already stored or it is already in flight (idempotent
        across retries, resumes and the sweep's catch-up pass)."""
        if attempt == 0 and since is None:
            if any(self._key(pending) == self._key(job) for pending, _, _ in self.pending.values()):
                return
            existing = self.result_type.load(job.out_dir, job.stem)
            if existing is not None:
                self.done.append(existing.row)
                self._ready.append(existing.row)
                return
        actor = self.actors[self._next % len(self.actors)]
        self._next += 1
        self.pending[actor.run.remote(job)] = (job, attempt, time.monotonic() if since is None else since)

    def poll(self, timeout: float = 0.0, max_attempts: int = 3) -> list[dict[str, Any]]:
        """Collect finished jobs; retry failures (a dead actor is restarted by Ray) up to max_attempts."""
        rows, self._ready = self._ready, []
        if not self.pending:
            return rows
        ready, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=timeout)
        for ref in ready:
            job, attempt, since = self.pending.pop(ref)
            try:
                result = ray.get(ref)
                for note in result.notes:  # shown by the driver: the actor's own log may be on another node
                    warnings.warn(note, stacklevel=2)
                    self.notes.append(note)
                result.save(job.out_dir, job.stem)  # atomic, on the driver's storage
                self.failed = [(j, e) for j, e in self.failed if self._key(j) != self._key(job)]
                self.done.append(result.row)
                rows.append(result.row)
            except ray.exceptions.ActorUnavailableError as exc:
                # the node is unreachable, not known dead: Ray restarts the actor once it is declared dead
                if time.monotonic() - since < self.unavailable_timeout:
                    self.submit(job, attempt, since)
                else:
                    self.failed.append((job, f"actor unavailable for {self.unavailable_timeout:.0f} s: {exc!r}"))
            except ray.exceptions.RayError as exc:  # actor died, job raised, object lost, ...
                if attempt + 1 < max_attempts:
                    self.submit(job, attempt + 1, since)
                else:
                    self.failed.append((job, repr(exc)))
        return rows

    def drain(self, poll_every: float = 0.5) -> list[dict[str, Any]]:
        rows = self.poll()
        while self.pending:
            rows.extend(self.poll(timeout=poll_every))
        return rows

    def nodes(self) -> list[str]:
        return ray.get([a.node_id.remote() for a in self.actors])

    def start_seconds(self) -> float:
        """Device-seconds the actors took to start (summed over them), for the run's timings (an actor
        restarted on another node reports its own, second start)."""
        return float(sum(ray.get([a.start_seconds.remote() for a in self.actors])))

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
