"""Measuring, step 2 of ``iclmem estimate`` (``orchestrator/estimate/estimate.py``): what one unit of the sweep's
work costs on this machine, and what the machinery around the work costs.

**Measure** unit costs of each configured model at each Q **on each task of the grid** (tables differ
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

Costs are measured at the torch thread count a trial uses (``torch_threads``, default 1).
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.estimate.estimate_work import canary_settings

REPO = Path(__file__).resolve().parents[2]


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
    # bytes, of the files the sweep writes (orchestrator.estimate.estimate_disk): a checkpoint's weights, its resume state
    # (optimizer and RNG, or the package's own checkpoint), its manifest and ground-truth log; one probe job's
    # stored result; one Stage I preparation
    weights_bytes: int = 0
    resume_bytes: int = 0
    checkpoint_meta_bytes: int = 0
    result_bytes: int = 0
    prepared_bytes: int = 0


def median_time(fn: Any, repeats: int, budget: Budget | None = None) -> float:
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
        return median_time(fn, repeats, self)


def _stub_table(plan: Any, rng: np.random.Generator) -> Any:
    """A score table of the plan's shape with random scores, and their counterparts on outputs rounded to 4
    decimals (what a probe with ``probe.output_decimals`` reads; the rounded re-test's cost is in rest_s)."""
    import pandas as pd

    from probes.scoring import rounded_loss

    q = plan.queries
    qi = np.fromiter((p.query_index for p in plan.planned), dtype=np.int64, count=len(plan.planned))
    mi = np.fromiter((p.manipulation_index for p in plan.planned), dtype=np.int64, count=len(plan.planned))
    loss = rng.gamma(2.0, 0.5, size=len(qi)).astype(np.float32)
    entropy = rng.uniform(0, np.log(q.n_classes), size=len(qi)).astype(np.float32)
    return pd.DataFrame({
        "query_id": q.query_ids[qi], "member": q.member[qi],
        "manipulation": np.array([m.name for m in plan.suite], dtype=object)[mi],
        "category": np.array([m.category for m in plan.suite], dtype=object)[mi],
        "loss": loss, "entropy": entropy, "confidence": np.exp(-loss).astype(np.float32),
        "rounded_loss": rounded_loss(loss, 4).astype(np.float32), "rounded_entropy": entropy,
        "rounded_confidence": np.round(np.exp(-loss.astype(np.float64)), 4).astype(np.float32),
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
    from orchestrator.runfolder.prepare import task_source
    from probes.actors import suite_for
    from probes.calibration import model_digest
    from probes.scoring import ProbePlan, ProbeQueries, score
    from trainables.data import prepare_task
    from trainables.finetune import Finetuner, load_checkpoint_model
    from trainables.models import build_model
    from trainables.spec import FinetuneSpec

    settings = build_model(model_name, **{**model_options, "weights": "random"}).prep_settings(
        sweep.data.prep_settings())  # the model's own input width, as the sweep prepares it
    start = time.perf_counter()
    task = prepare_task(task_source(task_config), settings, seed=0, q=q)
    prepare_s = time.perf_counter() - start

    # with canaries every step carries their copies as extra query rows (their probe contexts are counted
    # by count_work, not here)
    spec = FinetuneSpec(model=model_name, model_options=model_options, lr=1e-4, epochs=epochs + 1,
                        grad_clip=sweep.training.grad_clip, weight_decay=sweep.training.weight_decay,
                        canaries=canary_settings(sweep))
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
            load_s = median_time(lambda: load_checkpoint_model(Path(tmp) / "c0").to(upstream.device), 2, budget)
            sizes = checkpoint_sizes(Path(tmp) / "c0", task, sweep.probe.null_splits)
        finetuner_device, tuned_model, canaries = upstream.device, upstream.model, None
    else:
        finetuner = Finetuner(spec, [task], device=device)
        first_s = median_time(finetuner.run_epoch, 1)  # warm-up: kernels, allocator (every run pays it once)
        epoch_s = median_time(finetuner.run_epoch, epochs, budget)
        first_extra_s, dp_first_extra_s = max(first_s - epoch_s, 0.0), 0.0
        if dp_epsilon is not None:
            from trainables.dp import DPSettings

            t = sweep.training
            dp = DPSettings.calibrate(dp_epsilon, t.dp_delta, t.dp_max_grad_norm, epochs + 1, t.dp_accountant)
            private = Finetuner(replace(spec, dp=dp), [task], device=device)
            dp_first_s = median_time(private.run_epoch, 1)  # warm-up: vmap traces the model on its first call
            dp_epoch_s = median_time(private.run_epoch, max(2, epochs // 2), budget)
            dp_first_extra_s = max(dp_first_s - dp_epoch_s, 0.0)
        with tempfile.TemporaryDirectory(prefix="iclmem-estimate-") as tmp:
            saves = iter(range(10))
            save_s = median_time(lambda: finetuner.save(Path(tmp) / f"c{next(saves)}", {"epoch": finetuner.epoch}), 3, budget)
            # a probe job loads its checkpoint (manifest checksums verified) before scoring
            load_s = median_time(lambda: load_checkpoint_model(Path(tmp) / "c0").to(finetuner.device), 2, budget)
            sizes = checkpoint_sizes(Path(tmp) / "c0", task, sweep.probe.null_splits)
        finetuner_device, tuned_model, canaries = finetuner.device, finetuner.model, finetuner.canaries

    if is_upstream(spec):
        first_extra_s = 0.0  # the package's first epoch is left out of epoch_s and not modelled apart
    if is_upstream(spec) or dp_epsilon is None:
        dp_epoch_s, dp_first_extra_s = math.nan, 0.0
    base = build_model(model_name, **model_options).to(finetuner_device)
    suite = suite_for(sweep.probe.suite)
    holder: dict[str, Any] = {}

    def build_plan() -> None:
        holder["plan"] = ProbePlan.build(ProbeQueries.from_task(task), suite, task.seed,
                                         compress_rows=base.supports_context_weights)
        holder["plan"].representatives(base.invariances)

    plan_s = median_time(build_plan, 1)
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

    probe_settings = sweep.probe_settings(n_checkpoints=len(spec.schedule()))
    # probe_checkpoint calls the scorers by its module's names (probes.scoring's, imported there): stubbed there,
    # by name, for the measurement
    fakes = {"score": fake_score, "reference_scores": fake_reference}
    saved = {name: getattr(probe_mod, name) for name in fakes}
    for name, fake in fakes.items():
        setattr(probe_mod, name, fake)
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
            rest_s = median_time(probe_rest, 2, budget)
            writes = iter(range(10))
            rest_s += load_s + median_time(lambda: result["r"].save(cache, f"job{next(writes)}"), 2, budget)
            sizes["result_bytes"] = sum(p.stat().st_size for p in Path(cache).glob("job0.*"))
    finally:
        for name, original in saved.items():
            setattr(probe_mod, name, original)
    return UnitCosts(model=model_name, q=q, device=str(finetuner_device), task=task_config.name, prepare_s=prepare_s,
                     epoch_s=epoch_s, save_s=save_s, plan_s=plan_s, contexts=len(plan.planned),
                     forwards_saved=plan.forwards_saved(base.invariances),
                     score_per_context_s=score_s / len(plan.planned), rest_s=rest_s,
                     extra_contexts=asked["score"] // max(asked["calls"], 1),
                     extra_reference_contexts=asked["reference"] // max(asked["calls"], 1), dp_epoch_s=dp_epoch_s,
                     first_epoch_extra_s=first_extra_s, dp_first_epoch_extra_s=dp_first_extra_s,
                     measured_s=time.perf_counter() - budget.start, cut_short=budget.cut_short, **sizes)


def checkpoint_sizes(folder: Path, task: Any, null_splits: int) -> dict[str, int]:
    """Bytes of a checkpoint folder's parts as a trial writes them (the weights, the resume state, the manifest with
    the ground-truth log the trainable adds) and of the task's Stage I preparation."""
    import json

    from trainables.data import ground_truth_log
    from trainables.data.cache import save_prepared
    from trainables.finetune import META_FILE, MODEL_FILE, STATE_FILE
    from trainables.upstream import UPSTREAM_STATE_FILE

    def size(name: str) -> int:
        return (folder / name).stat().st_size if (folder / name).is_file() else 0

    truth = len(json.dumps({"run_id": "r" * 40, "regime": "single_fixed",
                            "tasks": [ground_truth_log(task, null_splits)]}, default=str).encode())
    with tempfile.TemporaryDirectory(prefix="iclmem-estimate-") as tmp:
        save_prepared(task, tmp)
        prepared = sum(p.stat().st_size for p in Path(tmp).iterdir())
    return {"weights_bytes": size(MODEL_FILE), "resume_bytes": size(STATE_FILE) + size(UPSTREAM_STATE_FILE),
            "checkpoint_meta_bytes": size(META_FILE) + truth, "prepared_bytes": prepared}


WORKER_IMPORTS = "import ray.tune, torch, trainables.finetune, probes.probe, probes.scoring"
# The driver's own start (imports of the sweep machinery) and its end (aggregation, figures, report).
DRIVER_IMPORTS = ("import ray, ray.tune, torch, pandas, pyarrow, matplotlib.pyplot; import orchestrator.schema.config, "
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
    return median_time(lambda: run_python(code), repeats)


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

    code = _RAY_START.replace("REPORTS", str(max(1, int(reports)))).replace("DRIVER_IMPORTS", DRIVER_IMPORTS)
    return {k: float(v) for k, v in json.loads(run_python(code).strip().splitlines()[-1]).items()}


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
    overheads_cached_from: str | None = None  # when the machinery's costs were measured, if reused (estimate.py)

    @property
    def total_s(self) -> float:
        return self.units_s + self.overheads_s
