"""What a sweep will cost, before anything is launched: ``iclmem estimate CONFIG --workers N``.

1. **Count** the grid's work with the sweep's own expansion (``expand_grid``), per (model, Q, task)
   (:class:`CostKey`; a multi-task run counts once on each of its tasks): runs and what they fine-tune on
   (their tasks, DP-SGD or not), fine-tuning steps, checkpoints probed, probe contexts (checkpoints x 2Q x
   |suite| per run, plus the base-model control per reference when ``probe.base_as_checkpoint``),
   references (one per task x model x Q x label mode x seed, computed once and shared) and the contexts
   sharing saves; reference trials (``probe.references``) are runs of the grid like any other.
2. **Measure** unit costs of each configured model at each Q **on each task of the grid** (tables differ
   in features, classes, rows and context statistics; ``--task`` measures every key on one task instead,
   and the output says which) on the local device (CPU, or CUDA when present or asked for): Stage I
   preparation, a few fine-tuning epochs as the trainable runs them (AdamW step + member/non-member
   evaluation), DP-SGD epochs where the grid has DP runs (per-row gradients, clipping, noise), a
   checkpoint save, the probe plan with its invariance-shortcut table, one probe batch (``score`` of every
   context of the plan, per context scored), and the rest of a checkpoint's probe (ICL predictions,
   bootstrap intervals, AUCs, ROC; every score table stubbed, the contexts of plans besides the task's --
   the null splits' pools -- counted and costed as scoring; the checkpoint's load and the result's save).
   The machinery around the work is measured on a local Ray too: the driver's start (imports), Ray's start
   and stop, a worker actor's start (a process importing torch, Tune and iclmem, as every probe actor and
   trial actor does), a Tune trial on a reused actor that reports once per epoch, and a Tune experiment's
   fixed cost.
3. **Predict** device-seconds per phase (``orchestrator.timing.Phase``, the same phases a run records in
   ``RUN_DIR/timings.json``) and the wall time on N workers (N parallel slots: cores for a CPU sweep, GPUs
   for a CUDA one): driver start + Ray start + Stage I + the Tune experiment's fixed cost + max(parallel
   work / N, the probe actors' work / min(probe actors, N), the longest chain: one run's trial overhead,
   epochs and saves, then the probes of its last checkpoint). Trial overhead: each trial slot (what the
   probe actors leave of N, over a trial's share) starts its actor once, and every trial adds its own
   scheduling and reports. Within those bounds the parallel work packs perfectly (fine-tuning and probing
   overlap, as the pipeline's checkpoint callback makes them). Not modelled: data transfer between nodes,
   W&B upload, aggregation and report rendering (a run's record shows them: ``iclmem estimate --compare``).

Costs are measured at the torch thread count a trial uses (``torch_threads``, default 1).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from orchestrator.timing import PROBE_ACTOR_PHASES, Phase, Prediction, human

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ counting
class CostKey(NamedTuple):
    """What unit costs are measured for: a model at a Q on a task (tasks differ in features, classes, rows and
    context statistics, so each is measured on its own)."""

    model: str
    q: int
    task: str


@dataclass(frozen=True)
class Work:
    """The work a grid implies; per-(model, Q, task) counts are keyed by :class:`CostKey` (a multi-task run
    counts once for each of its tasks: it steps on each every epoch and each checkpoint is probed on each)."""

    runs: int
    epochs: int
    schedule: tuple[int, ...]
    suite: int
    tasks: tuple[str, ...]
    runs_by: dict[CostKey, int]
    steps: int
    eval_forwards: int
    checkpoint_jobs: dict[CostKey, int]
    probe_contexts: dict[CostKey, int]
    controls: dict[CostKey, int]
    control_contexts: dict[CostKey, int]
    references: dict[CostKey, int]
    reference_contexts: dict[CostKey, int]
    reference_contexts_saved: int
    prepared_tasks: int
    model_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the runs by what they fine-tune on: (the keys of their tasks, DP-SGD or not) -> runs
    compositions: dict[tuple[tuple[CostKey, ...], bool], int] = field(default_factory=dict)
    prepared_by_task: dict[str, int] = field(default_factory=dict)  # Stage I preparations per task
    dp_epsilon: float | None = None  # a target ε of the grid's DP-SGD runs (their step cost does not depend on it)
    # what decides how many trials run at once on N workers (Tune reuses a trial's actor for the next trial)
    trial_share: float = 1.0  # CPUs (GPUs for a GPU sweep) per trial
    probe_share: float = 0.0  # CPUs (GPUs) the probe actors hold together
    max_concurrent_trials: int | None = None

    def trial_slots(self, workers: int) -> int:
        """Trials running at once on ``workers``: what the probe actors leave, over a trial's share."""
        free = max(workers - self.probe_share, self.trial_share)
        slots = max(int(math.floor(free / self.trial_share + 1e-9)), 1)
        if self.max_concurrent_trials:
            slots = min(slots, self.max_concurrent_trials)
        return min(slots, max(self.runs, 1))

    @property
    def checkpoints(self) -> int:
        return len(self.schedule)

    def total(self, name: str) -> int:
        return sum(getattr(self, name).values())

    @property
    def dp_runs(self) -> int:
        return sum(n for (_, dp), n in self.compositions.items() if dp)


def _canary_settings(sweep: Any) -> Any:
    """The sweep's ``trainables.canaries.CanarySettings``, or None without canaries."""
    from trainables.canaries import CanarySettings

    canaries = getattr(sweep, "canaries", None)
    settings = canaries.settings() if canaries is not None else None
    return None if settings is None else CanarySettings.from_value(settings)


def count_work(sweep: Any) -> Work:
    """Count the work of a loaded sweep (``orchestrator.config.load_sweep``)."""
    from orchestrator.config import expand_grid
    from trainables.finetune import FinetuneSpec

    trials = expand_grid(sweep)
    t = sweep.training
    suite = len(_suite(sweep.probe.suite))
    schedule = FinetuneSpec(epochs=t.epochs, checkpoint_epochs=tuple(t.checkpoint_epochs),
                            every_epoch=t.every_epoch).schedule()
    keys_of = {tr.run_id: tuple(CostKey(tr.model, tr.q, task) for task in tr.task.split("+")) for tr in trials}
    runs_by = Counter(k for tr in trials for k in keys_of[tr.run_id])
    compositions = Counter((keys_of[tr.run_id], math.isfinite(tr.dp)) for tr in trials)
    refs = Counter((task, tr.model, tr.q, tr.label_mode, tr.seed) for tr in trials for task in tr.task.split("+"))
    references = Counter(CostKey(key[1], key[2], key[0]) for key in refs)
    controls = references if sweep.probe.base_as_checkpoint else Counter()
    steps = sum(t.epochs * len(keys_of[tr.run_id]) for tr in trials)
    contexts = lambda counter, per: {k: n * per * 2 * k.q * suite for k, n in counter.items()}  # noqa: E731
    prepared = {(task, tr.q, tr.label_mode, tr.seed) for tr in trials for task in tr.task.split("+")}
    probe_contexts = contexts(runs_by, len(schedule))
    canaries = _canary_settings(sweep)
    if canaries is not None:
        # every fine-tuned checkpoint also scores each canary, inserted or held out, under the whole suite
        probe_contexts = {k: v + runs_by[k] * len(schedule) * canaries.n_canaries * suite
                          for k, v in probe_contexts.items()}
    reference_contexts = contexts(references, 1)
    if canaries is not None:  # and the base model scores them once per reference (cached beside its scores)
        reference_contexts = {k: v + references[k] * canaries.n_canaries * suite
                              for k, v in reference_contexts.items()}
    finite = [tr.dp for tr in trials if math.isfinite(tr.dp)]
    return Work(
        runs=len(trials), epochs=t.epochs, schedule=tuple(schedule), suite=suite,
        tasks=tuple(tk.name for tk in sweep.tasks), runs_by=dict(runs_by), steps=steps,
        eval_forwards=2 * t.epochs * len(trials),
        checkpoint_jobs={k: n * len(schedule) for k, n in runs_by.items()},
        probe_contexts=probe_contexts, controls=dict(controls),
        control_contexts=contexts(controls, 1), references=dict(references),
        reference_contexts=reference_contexts,
        reference_contexts_saved=sum((runs - 1) * 2 * key[2] * suite for key, runs in refs.items()),
        prepared_tasks=len(prepared),
        model_options={m.name: dict(m.options) for m in sweep.models},
        compositions=dict(compositions),
        prepared_by_task=dict(Counter(p[0] for p in prepared)),
        dp_epsilon=min(finite) if finite else None,
        **_shares(sweep.resources),
    )


def _shares(res: Any) -> dict[str, Any]:
    gpu = res.gpus_per_trial > 0
    return {"trial_share": float(res.gpus_per_trial if gpu else res.cpus_per_trial),
            "probe_share": float(res.probe_actors * (res.gpus_per_probe_actor if gpu else res.cpus_per_probe_actor)),
            "max_concurrent_trials": res.max_concurrent_trials}


# ------------------------------------------------------------------------------------------------ measuring
@dataclass(frozen=True)
class UnitCosts:
    """Measured costs of one model at one Q on one device, in seconds."""

    model: str
    q: int
    device: str
    task: str
    prepare_s: float  # Stage I for one (task, Q, label mode, seed)
    epoch_s: float  # one fine-tuning epoch: AdamW step + member/non-member ICL evaluation
    save_s: float  # one checkpoint save (weights, optimizer state, manifest)
    plan_s: float  # ProbePlan.build + the invariance-shortcut table, once per task per probe actor
    contexts: int  # contexts in one probe (2Q x suite)
    forwards_saved: float  # share of them the invariance shortcut does not forward
    score_per_context_s: float  # probe batch: score time / contexts scored
    rest_s: float  # the rest of one checkpoint's probe (score tables stubbed), its checkpoint's load and result save
    extra_contexts: int = 0  # contexts a fine-tuned checkpoint's probe scores besides the task's plan (null splits)
    extra_reference_contexts: int = 0  # and the reference scores for them (once per reference)
    dp_epoch_s: float = math.nan  # one DP-SGD epoch (per-row gradients, clipping, noise); measured when the grid has DP
    # what a run's first epoch costs beyond a steady one (kernels, allocator; for DP-SGD vmap's first trace,
    # seconds per run): every trial pays it once
    first_epoch_extra_s: float = 0.0
    dp_first_epoch_extra_s: float = 0.0
    measured_s: float = 0.0  # how long measuring this unit took
    cut_short: int = 0  # repeats the unit's time budget left out (its steps extrapolated from fewer samples)


def _suite(spec: Any) -> tuple:
    """The sweep's manipulation suite, as the probe actors build it."""
    from probes.actors import suite_for

    return suite_for(spec)


def _task_source(task: Any) -> Any:
    from orchestrator.prepare import task_source

    return task_source(task)


def _median_time(fn: Any, repeats: int, budget: Budget | None = None) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn``; with ``budget``, repeats stop once it is spent (the
    first call always runs)."""
    times: list[float] = []
    for _ in range(max(1, repeats)):
        if times and budget is not None and budget.spent():
            budget.cut_short += 1
            break
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(statistics.median(times))


class Budget:
    """The time one unit's measurement may take (seconds; None: unbounded): every step runs at least once, and
    its repeats (and separate warm-up calls) stop once the budget is spent, the unit then extrapolated from
    fewer samples (a warm-up call that exhausts it is the sample: an over-estimate, never an under-one)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.start = time.perf_counter()
        self.cut_short = 0  # repeats or warm-ups skipped because the budget was spent

    def spent(self) -> bool:
        return self.seconds is not None and time.perf_counter() - self.start >= self.seconds

    def warm_then_time(self, fn: Any, repeats: int) -> float:
        """A warm-up call, then the median of ``repeats`` more; when the warm-up alone spends the budget, its
        own time."""
        start = time.perf_counter()
        fn()
        first = time.perf_counter() - start
        if self.spent():
            self.cut_short += 1
            return first
        return _median_time(fn, repeats, self)


def _stub_table(plan: Any, rng: np.random.Generator) -> Any:
    """A score table of the plan's shape with random scores."""
    import pandas as pd

    q = plan.queries
    qi = np.fromiter((p.query_index for p in plan.planned), dtype=np.int64, count=len(plan.planned))
    mi = np.fromiter((p.manipulation_index for p in plan.planned), dtype=np.int64, count=len(plan.planned))
    loss = rng.gamma(2.0, 0.5, size=len(qi)).astype(np.float32)
    return pd.DataFrame({
        "query_id": q.query_ids[qi], "member": q.member[qi],
        "manipulation": np.array([m.name for m in plan.suite], dtype=object)[mi],
        "category": np.array([m.category for m in plan.suite], dtype=object)[mi],
        "loss": loss, "entropy": rng.uniform(0, np.log(q.n_classes), size=len(qi)).astype(np.float32),
        "confidence": np.exp(-loss).astype(np.float32),
    })


def measure_unit_costs(sweep: Any, model_name: str, model_options: dict[str, Any], q: int, task_config: Any,
                       device: Any, epochs: int = 4, score_rounds: int = 1, dp_epsilon: float | None = None,
                       budget_s: float | None = None) -> UnitCosts:
    """Unit costs of one model at one Q on ``device`` (see the module docstring); with ``dp_epsilon`` also a
    DP-SGD epoch at that target ε (the sweep's δ, clipping norm and accountant). ``budget_s``: the time the
    measurement may take (:class:`Budget`): each step runs once, its repeats only while the budget lasts."""
    budget = Budget(budget_s)
    import warnings

    import probes.probe as probe_mod
    from iclmem.record import RunIdentity
    from iclmem.vocab import Regime
    from probes.calibration import model_digest
    from probes.outcomes import OutcomeThresholds
    from probes.probe import ProbeSettings
    from probes.scoring import ProbePlan, ProbeQueries, score
    from trainables.data import PrepSettings, prepare_task
    from trainables.finetune import Finetuner, FinetuneSpec, load_checkpoint_model
    from trainables.models import build_model

    settings = build_model(model_name, **{**model_options, "weights": "random"}).prep_settings(
        PrepSettings(context_size=sweep.data.context_size, regression_bins=sweep.data.regression_bins,
                     max_features=sweep.data.max_features, label_design=sweep.data.label_design))  # the model's own input width, as the sweep prepares it
    start = time.perf_counter()
    task = prepare_task(_task_source(task_config), settings, seed=0, q=q)
    prepare_s = time.perf_counter() - start

    # with canaries every step carries their copies as extra query rows (their probe contexts are counted
    # by count_work, not here)
    spec = FinetuneSpec(model=model_name, model_options=model_options, lr=1e-4, epochs=epochs + 1,
                        grad_clip=sweep.training.grad_clip, weight_decay=sweep.training.weight_decay,
                        canaries=_canary_settings(sweep))
    from trainables.upstream import UpstreamFinetuner, is_upstream

    if is_upstream(spec):  # the package's fine-tuner runs its epochs in one fit: timed from its epoch hook
        upstream = UpstreamFinetuner(spec, [task], device=device)
        stamps: list[float] = []
        saves_s: list[float] = []
        with tempfile.TemporaryDirectory(prefix="iclmem-estimate-") as tmp:
            def on_epoch(result: Any, package_file: Path, _end: Any) -> None:
                stamps.append(time.perf_counter())
                if len(saves_s) < 3:
                    t = time.perf_counter()
                    upstream.save(Path(tmp) / f"c{len(saves_s)}", package_file, {"epoch": result.epoch})
                    saves_s.append(time.perf_counter() - t)
                    stamps[-1] = time.perf_counter()  # the save is counted apart

            upstream.run(on_epoch)
            gaps = sorted(b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)) or [0.0]
            epoch_s = gaps[len(gaps) // 2]  # the first epoch (the package's set-up and first validation) left out
            save_s = sorted(saves_s)[len(saves_s) // 2]
            load_s = _median_time(lambda: load_checkpoint_model(Path(tmp) / "c0").to(upstream.device), 2, budget)
        finetuner_device, tuned_model, canaries = upstream.device, upstream.model, None
    else:
        finetuner = Finetuner(spec, [task], device=device)
        first_s = _median_time(finetuner.run_epoch, 1)  # warm-up: kernels, allocator (every run pays it once)
        epoch_s = _median_time(finetuner.run_epoch, epochs, budget)
        first_extra_s, dp_first_extra_s = max(first_s - epoch_s, 0.0), 0.0
        if dp_epsilon is not None:
            from trainables.dp import DPSettings

            t = sweep.training
            dp = DPSettings.calibrate(dp_epsilon, t.dp_delta, t.dp_max_grad_norm, epochs + 1, t.dp_accountant)
            private = Finetuner(replace(spec, dp=dp), [task], device=device)
            dp_first_s = _median_time(private.run_epoch, 1)  # warm-up: vmap traces the model on its first call
            dp_epoch_s = _median_time(private.run_epoch, max(2, epochs // 2), budget)
            dp_first_extra_s = max(dp_first_s - dp_epoch_s, 0.0)
        with tempfile.TemporaryDirectory(prefix="iclmem-estimate-") as tmp:
            saves = iter(range(10))
            save_s = _median_time(lambda: finetuner.save(Path(tmp) / f"c{next(saves)}", {"epoch": finetuner.epoch}), 3, budget)
            # a probe job loads its checkpoint (manifest checksums verified) before scoring
            load_s = _median_time(lambda: load_checkpoint_model(Path(tmp) / "c0").to(finetuner.device), 2, budget)
        finetuner_device, tuned_model, canaries = finetuner.device, finetuner.model, finetuner.canaries

    if is_upstream(spec):
        first_extra_s = 0.0  # the package's first epoch is left out of epoch_s and not modelled apart
    if is_upstream(spec) or dp_epsilon is None:
        dp_epoch_s, dp_first_extra_s = math.nan, 0.0
    base = build_model(model_name, **model_options).to(finetuner_device)
    suite = _suite(sweep.probe.suite)
    holder: dict[str, Any] = {}

    def build_plan() -> None:
        holder["plan"] = ProbePlan.build(ProbeQueries.from_task(task), suite, task.seed,
                                         compress_rows=base.supports_context_weights)
        holder["plan"].representatives(base.invariances)

    plan_s = _median_time(build_plan, 1)
    plan = holder["plan"]
    score_s = budget.warm_then_time(lambda: score(base, plan), max(1, score_rounds))  # warm-up first

    # The rest of a probe, with every score table stubbed (random scores of the plan's shape); the contexts
    # of plans other than the task's (e.g. null splits' pools) are counted, to be costed as scoring. With
    # canaries the rest includes their known-context forwards on the checkpoint; their probe contexts are
    # counted by count_work (the canary plan is one object per process: probe.canary_plan caches it).
    counted_elsewhere = {id(plan)}
    if canaries is not None:
        counted_elsewhere.add(id(probe_mod.canary_plan(task, canaries, plan)))
    rng = np.random.default_rng(0)
    stubs: dict[int, Any] = {}
    asked = {"score": 0, "reference": 0, "calls": 0}

    def stub(p: Any, kind: str) -> Any:
        if id(p) not in counted_elsewhere:
            asked[kind] += len(p.planned)
        return stubs.setdefault(id(p), _stub_table(p, rng))

    def fake_score(_model: Any, p: Any, *_a: Any, **_k: Any) -> Any:
        return stub(p, "score")

    def fake_reference(_cache: Any, _fingerprint: Any, p: Any, *_a: Any, **_k: Any) -> Any:
        return stub(p, "reference")

    settings_fields = {f.name for f in dataclasses.fields(ProbeSettings)}
    extra = {k: v for k, v in (("null_splits", getattr(sweep.probe, "null_splits", None)),
                               ("n_checkpoints", len(spec.schedule())))
             if k in settings_fields and v is not None}
    probe_settings = ProbeSettings(n_resamples=sweep.probe.bootstrap,
                                   thresholds=OutcomeThresholds.from_dict(sweep.outcome.model_dump()), **extra)
    saved = probe_mod.score, probe_mod.reference_scores
    probe_mod.score, probe_mod.reference_scores = fake_score, fake_reference
    try:
        with tempfile.TemporaryDirectory(prefix="iclmem-estimate-") as cache, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # coarse-TPR notes on small Q are expected here
            digest = model_digest(base)
            probe_mod.base_icl(cache, task, digest, base)  # cached once per task in a sweep
            result: dict[str, Any] = {}
            identity = RunIdentity("estimate", task.name, model_name, Regime.SINGLE_FIXED.value, 1e-4, q,
                                   str(task.label_mode), 0).as_dict()

            def probe_rest() -> None:
                asked["calls"] += 1
                result["r"] = probe_mod.probe_checkpoint(tuned_model, task, plan, cache, digest, base,
                                                         probe_settings, identity, 1,
                                                         canaries=canaries)

            if canaries is not None:  # the base model's canary losses: cached once per task in a sweep
                probe_mod.canary_columns(tuned_model, task, plan, canaries, cache, digest, base)
            rest_s = _median_time(probe_rest, 2, budget)
            writes = iter(range(10))
            rest_s += load_s + _median_time(lambda: result["r"].save(cache, f"job{next(writes)}"), 2, budget)
    finally:
        probe_mod.score, probe_mod.reference_scores = saved
    return UnitCosts(model=model_name, q=q, device=str(finetuner_device), task=task_config.name, prepare_s=prepare_s,
                     epoch_s=epoch_s, save_s=save_s, plan_s=plan_s, contexts=len(plan.planned),
                     forwards_saved=plan.forwards_saved(base.invariances),
                     score_per_context_s=score_s / len(plan.planned), rest_s=rest_s,
                     extra_contexts=asked["score"] // max(asked["calls"], 1),
                     extra_reference_contexts=asked["reference"] // max(asked["calls"], 1), dp_epoch_s=dp_epoch_s,
                     first_epoch_extra_s=first_extra_s, dp_first_epoch_extra_s=dp_first_extra_s,
                     measured_s=time.perf_counter() - budget.start, cut_short=budget.cut_short)


_WORKER_IMPORTS = "import ray.tune, torch, trainables.finetune, probes.probe, probes.scoring"
# The driver's own start (imports of the sweep machinery) and its end (aggregation, figures, report).
_DRIVER_IMPORTS = ("import ray, ray.tune, torch, pandas, pyarrow, matplotlib.pyplot; import orchestrator.config, "
                   "orchestrator.report.html, orchestrator.report.figures, probes.probe, trainables.trainable")
# Ray's start and stop, and the start of actors like a Tune trial's and a probe actor's (a worker process
# that imports torch, Tune and iclmem), timed one after the other on an otherwise idle local Ray.
_RAY_START = """
import json, time
start = time.perf_counter()
DRIVER_IMPORTS
driver = time.perf_counter() - start  # the driver's start, in the same process (one interpreter start less)
start = time.perf_counter()
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
init = time.perf_counter() - start

@ray.remote(num_cpus=1)
class Worker:
    def __init__(self):
        import ray.tune, torch, trainables.finetune, probes.probe, probes.scoring  # noqa: F401
    def ready(self):
        return True

actors = []
for _ in range(2):
    t = time.perf_counter()
    actor = Worker.remote()
    ray.get(actor.ready.remote())
    actors.append(time.perf_counter() - t)
    ray.kill(actor)


# Tune's own cost per trial: a trial that imports what iclmem's trainable imports and reports REPORTS
# times (one per epoch, as the trainable does), in an experiment of 1 trial and of 3 trials run one
# after the other on one reused actor (as iclmem's tuner runs them); the difference over the 2 extra trials
# is the cost of one trial on a reused actor, the rest the experiment's fixed cost (setup, state files,
# teardown) and the actor's start.
import tempfile

from ray import tune

def trainable(config):
    import torch, trainables.finetune, probes.probe  # noqa: F401
    for epoch in range(config["reports"]):
        tune.report({"epoch": epoch})

def fit(samples):
    # as iclmem's tuner: one actor per trial slot, reused by the next trial
    with tempfile.TemporaryDirectory() as storage:
        t = time.perf_counter()
        tune.Tuner(trainable, param_space={"reports": REPORTS},
                   tune_config=tune.TuneConfig(num_samples=samples, max_concurrent_trials=1, reuse_actors=True),
                   run_config=tune.RunConfig(storage_path=storage, verbose=0)).fit()
        return time.perf_counter() - t

one = fit(1)
three = fit(3)
trial_wall = max((three - one) / 2, 0.0)  # a trial on a reused actor: scheduling, its reports
t = time.perf_counter()
ray.shutdown()
print(json.dumps({"driver_start_s": driver, "ray_start_s": init + time.perf_counter() - t, "actor_start_s": min(actors),
                  "tune_trial_s": trial_wall, "tune_fixed_s": max(one - trial_wall - min(actors), 0.0)}))
"""


def measure_process(code: str, repeats: int = 1) -> float:
    """Wall seconds of a fresh Python process running ``code`` from the repository root."""
    return _median_time(lambda: run_python(code), repeats)


def run_python(code: str) -> str:
    """stdout of a fresh Python process running ``code`` from the repository root (on its path)."""
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True,
                          env=env).stdout


def measure_ray(reports: int = 1) -> dict[str, float]:
    """Seconds, measured in one fresh process: ``driver_start_s`` (the driver's imports), then on a local Ray:
    ``ray_start_s`` (start + stop), ``actor_start_s`` (one worker
    actor), ``tune_trial_s`` (one Tune trial reporting ``reports`` times, its actor's start included) and
    ``tune_fixed_s`` (a Tune experiment's own cost)."""
    import json

    code = _RAY_START.replace("REPORTS", str(max(1, int(reports)))).replace("DRIVER_IMPORTS", _DRIVER_IMPORTS)
    return {k: float(v) for k, v in json.loads(run_python(code).strip().splitlines()[-1]).items()}


# ------------------------------------------------------------------------------------------------ estimate
@dataclass(frozen=True)
class Overheads:
    """Measured costs of the machinery around the work, in seconds."""

    driver_start_s: float = 0.0  # the driver's imports
    ray_start_s: float = 0.0  # a local Ray's start and stop
    actor_start_s: float = 0.0  # a worker actor importing torch, Tune and iclmem (each probe actor)
    tune_trial_s: float = 0.0  # a Tune trial around the work: its actor's start, its reports, Ray's daemons
    #                            meanwhile (CPU-seconds of every process, or its wall time if larger; each run)
    tune_fixed_s: float = 0.0  # a Tune experiment's own cost (setup, state, teardown), once

    @property
    def trial_s(self) -> float:
        return self.tune_trial_s or self.actor_start_s


@dataclass(frozen=True)
class Measuring:
    """What measuring an estimate's costs took: each distinct unit (model, Q, task measured on) once, within its
    time budget, then the machinery around the work."""

    units_s: float  # measuring the distinct units, together
    overheads_s: float  # the driver's start, Ray's start, actors and Tune (subprocesses)
    units: int  # distinct units measured
    keys: int  # (model, Q, task) keys they stand for
    unit_budget_s: float | None  # each unit's time budget (None: unbounded)
    cut_short: int = 0  # repeats the budgets left out, over every unit

    @property
    def total_s(self) -> float:
        return self.units_s + self.overheads_s


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
                       measuring=self.measuring)

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
        """The per-phase prediction a run is compared with (``orchestrator.timing``)."""
        return Prediction(serial=dict(self.serial_s), work=dict(self.compute_s), longest_s=self.longest_s,
                          probe_actors=self.probe_actors, workers=self.workers, config_hash=config_hash,
                          device=self.device, created=time.strftime("%Y-%m-%d %H:%M:%S"))

    def on(self, workers: int) -> Estimate:
        """The same measured grid on another number of workers."""
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        return replace(predict(self.work, self.costs, workers, self.overheads, self.probe_actors),  # trial slots too
                       measuring=self.measuring)


def _epoch_s(cost: UnitCosts, dp: bool) -> float:
    return cost.dp_epoch_s if dp and not math.isnan(cost.dp_epoch_s) else cost.epoch_s


def _first_extra_s(cost: UnitCosts, dp: bool) -> float:
    return cost.dp_first_epoch_extra_s if dp and not math.isnan(cost.dp_epoch_s) else cost.first_epoch_extra_s


def predict(work: Work, costs: dict[CostKey, UnitCosts], workers: int, overheads: Overheads,
            probe_actors: int = 1) -> Estimate:
    """Device-seconds and wall time from counted work and measured unit costs (module docstring, step 3)."""
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
              Phase.STAGE_I.value: stage_i, Phase.TUNE_FIXED.value: o.tune_fixed_s}
    longest = max(o.actor_start_s + o.tune_trial_s + tuning_s(tk, dp) + sum(probe_s[k] for k in tk)
                  for tk, dp in compositions)
    probe_work = sum(v for k, v in compute.items() if Phase(k) in PROBE_ACTOR_PHASES)
    return Estimate(work, costs, o, workers, compute, serial, longest, plan_builds, probe_work, probe_actors)


# Each unit's measurement stops repeating its steps after this long (one pass of every step always runs): with
# one unit per (model, Q, task measured on), measuring stays a small share of any sweep it is worth estimating.
UNIT_BUDGET_S = 8.0


def unit_of(key: CostKey, forced_task: str | None) -> CostKey:
    """The unit a key's costs are measured as: its own (model, Q, task), or on ``forced_task`` (``--task``), where
    every task of a (model, Q) is the same unit, measured once."""
    return CostKey(key.model, key.q, forced_task or key.task)


def estimate(config: str | Path, workers: int, device: str | None = None, task: str | None = None,
             epochs: int = 4, score_rounds: int = 1, threads: int | None = None,
             with_ray: bool = True, log: Any = None, unit_budget_s: float | None = UNIT_BUDGET_S) -> Estimate:
    """Count, measure and predict for a sweep file (see the module docstring). Each distinct unit is measured
    once (``--task``: one per model and Q, whatever the tasks), within ``unit_budget_s``."""
    import torch

    from orchestrator.config import TaskConfig, context_audit_specs, load_sweep
    from trainables.models.base import resolve_device

    sweep = load_sweep(config)
    work = count_work(sweep)
    audits = len(context_audit_specs(sweep))
    if not work.runs:
        from iclmem.errors import ConfigError

        raise ConfigError(f"{config}: no fine-tuning run to estimate"
                          + (f" (its only regime is context: {audits} deployed-context audit(s), which `iclmem "
                             "estimate` does not cost; one audit's time is that of `iclmem audit-context` on one "
                             "task, README 'Auditing a deployed estimator's context')" if audits else ""))
    if audits and log:
        log(f"note: the {audits} deployed-context audit(s) of regime context are not in this estimate")
    dev = resolve_device(device)
    previous = torch.get_num_threads()
    torch.set_num_threads(int(threads or 1))
    configs = {t.name: t for t in sweep.tasks}
    # --task: every key measured on that one task (quicker, blind to how the tasks differ); else each on its own
    forced = (configs.get(task) or TaskConfig(name=task)) if task else None
    dp_keys = {k for (tk, dp) in work.compositions for k in tk if dp}
    # the distinct units: each measured once (a DP-SGD epoch too where any of its keys has DP runs)
    units: dict[CostKey, list[CostKey]] = {}
    for key in sorted(work.runs_by):
        units.setdefault(unit_of(key, forced.name if forced else None), []).append(key)
    measured: dict[CostKey, UnitCosts] = {}
    started = time.perf_counter()
    try:
        for n, (unit, keys) in enumerate(units.items(), 1):
            task_config = forced or configs[unit.task]
            dp = any(k in dp_keys for k in keys)
            if log:
                log(f"measuring {unit.model} at Q={unit.q} on {dev}, task {task_config.name}"
                    f"{' (plain and DP-SGD epochs)' if dp else ''} (unit {n} of {len(units)}"
                    + (f", for {len(keys)} (model, Q, task) keys" if len(keys) > 1 else "")
                    + (f"; repeats within {unit_budget_s:g} s" if unit_budget_s is not None else "") + ") ...")
            measured[unit] = measure_unit_costs(sweep, unit.model, work.model_options.get(unit.model, {}), unit.q,
                                                task_config, dev, epochs=epochs, score_rounds=score_rounds,
                                                dp_epsilon=work.dp_epsilon if dp else None, budget_s=unit_budget_s)
    finally:
        torch.set_num_threads(previous)
    costs = {key: measured[unit] for unit, keys in units.items() for key in keys}
    units_s = time.perf_counter() - started
    if log:
        log("measuring the driver's start, Ray's start and a worker actor's start ...")
    started = time.perf_counter()
    if with_ray:
        timed = measure_ray(reports=min(work.epochs, 100))
        timed.setdefault("driver_start_s", measure_process(_DRIVER_IMPORTS))  # measured in Ray's process, else here
        overheads = Overheads(**timed)
    else:
        overheads = Overheads(driver_start_s=measure_process(_DRIVER_IMPORTS),
                              actor_start_s=measure_process(_WORKER_IMPORTS))
    measuring = Measuring(units_s=units_s, overheads_s=time.perf_counter() - started, units=len(units),
                          keys=len(costs), unit_budget_s=unit_budget_s,
                          cut_short=sum(c.cut_short for c in measured.values()))
    return replace(predict(work, costs, workers, overheads, sweep.resources.probe_actors), measuring=measuring)


# ------------------------------------------------------------------------------------------------ output
MEASURING_SHARE = 0.25  # above this share of the predicted wall time, the output says why measuring took so long


def measuring_line(est: Estimate) -> str:
    """How long measuring took, what bounded it, and its share of the predicted wall time."""
    m = est.measuring
    assert m is not None
    bound = (f"each unit's repeats bounded to {m.unit_budget_s:g} s after one pass of every step"
             + (f", {m.cut_short} repeat(s) left out and extrapolated" if m.cut_short else "")
             if m.unit_budget_s is not None else "no time bound")
    share = m.total_s / max(est.wall_s, 1e-9)
    line = (f"Measuring took {m.total_s:.0f} s: {m.units} distinct unit(s) measured once each for {m.keys} "
            f"(model, Q, task) key(s) in {m.units_s:.0f} s ({bound}); the driver's start, Ray and Tune in "
            f"{m.overheads_s:.0f} s. That is {share:.0%} of the predicted wall time.")
    if share > MEASURING_SHARE:
        line += (" The sweep is short: measuring its fixed costs (the driver's start, Ray's start, a Tune "
                 "experiment), which it pays once too, weighs as much as its work; a longer grid costs the same "
                 "to measure.")
    return line


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], markdown: bool) -> str:
    rows = [[str(c) for c in r] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)])


def render(est: Estimate, markdown: bool = False) -> str:
    """The estimate as text (or markdown tables): work, unit costs, compute and wall time."""
    w = est.work
    work_rows = [
        ("fine-tuning runs", f"{w.runs:,}"),
        ("fine-tuning steps", f"{w.steps:,}"),
        ("ICL evaluation forwards", f"{w.eval_forwards:,}"),
        ("checkpoints probed", f"{w.total('checkpoint_jobs'):,} (epochs {', '.join(map(str, w.schedule))})"),
        ("probe contexts (checkpoints)", f"{w.total('probe_contexts'):,}"),
        ("probe contexts (base-model controls)", f"{w.total('control_contexts'):,}"),
        ("references (computed once, shared)", f"{w.total('references'):,}"),
        ("reference contexts", f"{w.total('reference_contexts'):,} (sharing saves {w.reference_contexts_saved:,})"),
    ]
    cost_rows = [(f"{k.model} Q={k.q} {k.task}" + (f" (measured on {c.task})" if c.task != k.task else ""),
                  f"{c.epoch_s * 1e3:.1f}" + ("" if math.isnan(c.dp_epoch_s) else f" / DP {c.dp_epoch_s * 1e3:.1f}")
                  + f" (first +{(c.first_epoch_extra_s + c.dp_first_epoch_extra_s) * 1e3:.0f})",
                  f"{c.save_s * 1e3:.1f}", f"{c.plan_s:.2f}",
                  f"{c.contexts:,} ({c.forwards_saved:.0%} not forwarded)"
                  + (f" + {c.extra_contexts:,} null-split" if c.extra_contexts else ""),
                  f"{c.score_per_context_s * 1e3:.4f}",
                  f"{c.rest_s:.2f}", f"{c.prepare_s:.2f}") for k, c in est.costs.items()]
    measured_on = {c.task for c in est.costs.values()}
    where = (f"each (model, Q, task) on its own task ({len(est.costs)} measurements)" if all(
        k.task == c.task for k, c in est.costs.items()) else f"task {', '.join(sorted(measured_on))} only (--task)")
    compute_rows = [(k, human(v), f"{v / 3600:.3f}") for k, v in est.compute_s.items()]
    compute_rows += [(f"{k} (serial)", human(v), "") for k, v in est.serial_s.items()]
    text = [
        f"Grid: {w.runs} runs x {w.epochs} epochs on {', '.join(w.tasks)}; suite of {w.suite} manipulations.",
        "",
        _table(["work", "count"], work_rows, markdown),
        "",
        f"Unit costs measured on {est.device}, {where}; driver start "
        f"{est.overheads.driver_start_s:.1f} s, Ray start and stop {est.overheads.ray_start_s:.1f} s, worker actor "
        f"start {est.overheads.actor_start_s:.1f} s, Tune trial around the work {est.overheads.tune_trial_s:.1f} s, "
        f"Tune experiment {est.overheads.tune_fixed_s:.1f} s:",
        "",
        _table(["model, Q, task", "epoch ms (step+eval)", "save ms", "plan s", "contexts per probe", "score ms/context",
                "rest of probe s", "Stage I s"], cost_rows, markdown),
        "",
        _table(["compute", "device time", "device-hours"], compute_rows, markdown),
        "",
        f"Predicted on {est.workers} worker(s): wall time {human(est.wall_s)} ({est.wall_s:.0f} s; "
        + f"bound by {est.bound}"
        + f"), {est.device_hours:.3f} device-hours held, {est.parallel_s / 3600:.3f} busy.",
    ]
    if est.measuring is not None:
        text.append(measuring_line(est))
    needed = est.probe_actors_needed()
    if needed is not None:  # every checkpoint's probe waits for one of too few actors
        lifted = est.with_probe_actors(needed)
        text.append(f"The probes are the bottleneck: with resources.probe_actors = {needed} (each takes a worker's "
                    f"share of the devices) the prediction is {human(lifted.wall_s)}, bound by {lifted.bound}.")
    return "\n".join(text)
