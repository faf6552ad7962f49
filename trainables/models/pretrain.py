"""Pretrain iclmem's small models on TabICL's synthetic prior, on a CPU, resumably: one loop for all three.

    python -m trainables.models.pretrain --model tabicl-mini --workdir .pretrain/tabicl-mini --seed 0
    python -m trainables.models.pretrain --model tabicl-mini --workdir .pretrain/tabicl-mini --seed 0 --export

The models (``PRETRAINABLE``; ``--model`` names one):

* ``pfn-mini``: iclmem's own architecture (``trainables/models/pfn_mini.py``), the shipped default model.
  ``python -m trainables.models.pretrain_pfn_mini ...`` is this module with ``--model pfn-mini`` (its
  recorded command reproduces through it, bit for bit).
* ``tabicl-mini``: tabicl's own ``TabICL`` class (the v2 layout: target-aware column embedder with feature
  groups and scalable softmax, split-half RoPE rows, standard init), made small.
* ``tabpfn-mini``: tabpfn's own ``TabPFNV2`` class, made small.

Each is built by its adapter's builder with ``weights="random"`` (``build_model``; the seeded init tests use
for tiny random checkpoints), trained through the adapter's own forward (the function iclmem's fine-tuner
and probe run), and exported by the adapter's ``package_checkpoint`` for tabicl-mini and tabpfn-mini: the
package's own checkpoint format, a dict ``{"config", "state_dict"}`` pickled by torch as a ``.ckpt``, the format of the
official TabICL and TabPFN v2 files, which ``TabICLClassifier(model_path=...)``,
``TabPFNClassifier(model_path=...)``, the packages' fine-tuners and ``build_model("tabicl" | "tabpfn-v2",
weights=FILE)`` load. pfn-mini is exported as before (safetensors with its config in the metadata).

Data. A generator (``--role generate``, started by the trainer unless ``--generators 0``) fills a pool of
prior batches (``POOL_TABLES`` tables each) from ``tabicl.prior.PriorDataset`` (mlp_scm and tree_scm,
BSD-3), since generating a table costs more than a training step on it; the pool does not depend on the
model, so one pool (``--pool``) can serve all three. The trainer draws batches from the pool, augments them
(feature and class permutations, fresh context/query splits) so a pool batch can be reused, and mixes in a
cheap Gaussian-cluster prior (``--gmm-share``) that teaches the nearest-class-mean behaviour real tables
reward. Every ``--save-every`` steps it writes a resumable state (model, optimizer, both RNGs, step) and
appends evaluation accuracies to ``curve.jsonl``; ``--stop-at`` ends a run early at a step (the learning-
rate schedule stays the one of ``--steps``; run again to continue). ``--export`` writes the weights and a
JSON record beside them: command, seed, steps, model config, prior and training settings, package
versions, the curve, the final in-context accuracy (raw module, as iclmem drives it; the package's own
classifier on the exported file; logistic regression on the same rows).

Step cost (``--role measure``: one optimizer step on 32 tables of 184 rows (the prior's mean length) and 18
features (the prior's widest, which a 32-table batch nearly always reaches), one torch thread, best of 3;
measured on this project's 2-core x86_64 machine while another job used about one core, so an idle core
is somewhat faster):

=============  ==========  ==============  ===========  =================  ====================
model          parameters  weights (fp32)  tables/step  seconds per step   steps per CPU hour
=============  ==========  ==============  ===========  =================  ====================
pfn-mini          569,738  2.2 MB          32           0.48               ~6000 (recorded run)
tabicl-mini       179,526  0.7 MB          32 (4 x 8)   0.74 - 0.81        ~4400
tabpfn-mini        71,562  0.3 MB          16           0.97 - 1.02        ~3500
=============  ==========  ==============  ===========  =================  ====================

Why these sizes: TabICL's column embedder and row interactor run on every cell (B x rows x (features + CLS
tokens) tokens) before its ICL transformer runs on rows, and TabPFN v2 runs every layer on every cell
(rows x (feature groups + 1)), so at pfn-mini's width they cost far more per table than pfn-mini, which
runs on rows only. Measured alternatives (same conditions): TabICL embed_dim 32 with 4 CLS tokens (ICL
width 128, 647,862 parameters) 1.5 s at 32 tables; embed_dim 16 with 8 CLS tokens (ICL width 128, 627,334)
1.24 s; with 6 CLS tokens (ICL width 96, 368,614) 0.97 s; the chosen one accumulates 4 micro-batches of 8
tables, 0.74 s against 0.95 s for one pass of 32 (cache effects). TabPFN v2 emsize 64 / 4 layers (282,890)
4.3 s at 32 tables and 1.05 s at 8; emsize 48 / 3 layers (122,890) 1.44 s at 16; emsize 32 / 3 layers at
32 tables (micro-batches of 8) 1.37 s. Every one of them is a few MB at most; the CPU step time is what
bounds them. With a pool generated beforehand (``--role generate``) a run can use both cores for the
trainer (``--generators 0 --threads 2``).

Learning rates: pfn-mini and tabicl-mini 1e-3; tabpfn-mini 3e-3. On a two-class Gaussian task (8 tables of
100 rows and 4 features per step, no warmup beyond 10 steps) pfn-mini's loss fell from 0.69 to 0.27 within
30 steps and tabicl-mini's by step 90, while TabPFN v2 at 1e-3 (emsize 32, 48 or 64) sat at 0.69 for 120
steps (its attention outputs start at zero) and at 3e-3 fell to 0.30 by step 160, as nanoTabPFN (emsize 96,
lr 4e-3) trains. On the Gaussian-cluster prior alone (``--gmm-share 1``), tabicl-mini's seed-0 accuracy rose
from chance to 0.65 / 0.64 / 0.59 (breast_cancer / wine / iris) in 120 steps at 1e-3, while tabpfn-mini still
predicted one class after 50 steps (1e-3, 16 tables) and after 80 (3e-3, 8 tables): watch its early curve.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from iclmem.atomic import atomic_write, write_text_atomic
from iclmem.errors import ConfigError, UnknownNameError
from trainables.models.base import ModelAdapter
from trainables.models.checkpoints import WEIGHTS_DIR
from trainables.models.pretrain_eval import evaluate, evaluate_classifier
from trainables.models.pretrain_models import PRETRAINABLE, LogitsOf, Pretrainable, build, logits_of
from trainables.models.pretrain_prior import (
    AUGMENTATION_TEXT,
    DRAW_WIDTH,
    POOL_TABLES,
    PRIOR_SETTINGS,
    PRIOR_TEXT,
    generate_pool,
    gmm_batch,
    pool_batch,
    trim_dead_columns,
)

FINAL_SEEDS = (0, 1, 2, 3, 4)
# What ``--role measure`` times: the prior's mean table length and its widest tables.
MEASURE_ROWS, MEASURE_FEATURES = 184, 18


# ----------------------------------------------------------------------------------------- the step's loss
def split_loss_backward(logits_fn: LogitsOf, x: torch.Tensor, y: torch.Tensor, length: int,
                        gen: torch.Generator, micro_batch: int | None = None) -> float:
    """One context/query split of the batch (x [B, L, F], y [B, L]); backpropagates the queries' mean
    cross-entropy, in micro-batches of ``micro_batch`` tables when that is below B (their gradients summed
    with weight share/B, which is the whole batch's mean), and returns that mean."""
    n_context = int(torch.randint(int(0.3 * length), int(0.85 * length), (1,), generator=gen))
    perm = torch.randperm(length, generator=gen)
    x, y = x[:, perm], y[:, perm]
    batch = x.shape[0]
    if micro_batch is None or micro_batch >= batch:
        loss = _query_loss(logits_fn, x, y, n_context)
        loss.backward()  # type: ignore[no-untyped-call]
        return float(loss.detach())
    total = 0.0
    for start in range(0, batch, micro_batch):
        share = min(micro_batch, batch - start) / batch
        loss = _query_loss(logits_fn, x[start:start + micro_batch], y[start:start + micro_batch], n_context)
        (loss * share).backward()  # type: ignore[no-untyped-call]
        total += float(loss.detach()) * share
    return total


def _query_loss(logits_fn: LogitsOf, x: torch.Tensor, y: torch.Tensor, n_context: int) -> torch.Tensor:
    logits = logits_fn(x[:, :n_context], y[:, :n_context], x[:, n_context:])  # [B, M, C]
    n_cls = (y.max(dim=1).values + 1)  # [B]
    # Logits of classes a table does not have are masked so the model learns "answer among |Y|".
    absent = torch.arange(logits.shape[-1])[None, None, :] >= n_cls[:, None, None]
    logits = logits.masked_fill(absent, float("-inf"))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[:, n_context:].reshape(-1))


# ----------------------------------------------------------------------------------------- training
@dataclass(frozen=True)
class RunSettings:
    """One pretraining run, every default filled in from the model's ``TrainingDefaults``."""

    model: str
    workdir: Path
    pool: Path
    steps: int
    seed: int
    batch_size: int
    micro_batch: int | None  # None: the whole batch in one pass
    lr: float
    warmup: int
    gmm_share: float
    threads: int
    generators: int
    pool_size: int
    save_every: int
    stop_at: int | None
    export: bool
    export_dir: Path
    command: str = field(default="", compare=False)  # the command line as typed, for the record

    def training_record(self) -> dict[str, Any]:
        keys = ("batch_size", "micro_batch", "lr", "warmup", "gmm_share", "threads", "save_every")
        return {**{k: getattr(self, k) for k in keys}, "optimizer": "AdamW, weight decay 0, gradient norm clip 1.0",
                "schedule": "linear warmup over `warmup` steps, then cosine from lr to 0.1 lr over `steps`"}


def package_versions(packages: Sequence[str]) -> dict[str, str]:
    from iclmem.provenance import package_versions as versions

    return versions(tuple(packages))


def _load_state(state_path: Path) -> dict[str, Any]:
    # Early pfn-mini states stored the lr as a numpy scalar; allow exactly that type, nothing else.
    with torch.serialization.safe_globals([np._core.multiarray.scalar,  # type: ignore[attr-defined]
                                           np.dtype, type(np.dtype(np.float64))]):
        state: dict[str, Any] = torch.load(state_path, weights_only=True)
    return state


def _start_generators(settings: RunSettings) -> list[subprocess.Popen[bytes]]:
    existing = len(list(settings.pool.glob("batch_*.pt")))
    return [subprocess.Popen([sys.executable, "-m", "trainables.models.pretrain", "--role", "generate",
                              "--pool", str(settings.pool), "--seed", str(settings.seed * 1000 + i + existing),
                              "--pool-size", str(settings.pool_size)])
            for i in range(settings.generators)]


def train(settings: RunSettings) -> ModelAdapter:
    """Train (or resume) to ``settings.steps`` (or ``stop_at``), export if asked; returns the model."""
    spec = PRETRAINABLE.get(settings.model)
    torch.set_num_threads(settings.threads)
    workdir, pool = settings.workdir, settings.pool
    workdir.mkdir(parents=True, exist_ok=True)
    adapter = build(spec, settings.seed)
    model = adapter.module
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(settings.seed)
    state_path = workdir / "state.pt"
    step = 0
    if state_path.exists():
        state = _load_state(state_path)
        stored = state.get("pretrainable", "pfn-mini")  # states from before this field were pfn-mini's
        if stored != spec.name:
            raise ConfigError(f"{workdir} holds a {stored} pretraining state, not {spec.name}'s; give "
                              f"{spec.name} a --workdir of its own")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])
        step = int(state["step"])
        print(f"resumed {spec.name} at step {step}", flush=True)
    generators = _start_generators(settings) if settings.generators > 0 else []
    stop = min(settings.steps, settings.stop_at) if settings.stop_at is not None else settings.steps
    curve = workdir / "curve.jsonl"
    t0, losses = time.time(), []
    width = spec.fixed_width or DRAW_WIDTH
    max_classes = int(adapter.max_classes)

    def save_state() -> None:
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "generator": gen.get_state(),
                 "torch_rng": torch.get_rng_state(), "step": step, "pretrainable": spec.name}
        atomic_write(state_path, lambda tmp, state=state: torch.save(state, tmp), to_path=True)

    try:
        while step < stop:
            while not (pool_files := sorted(pool.glob("batch_*.pt"))) and settings.gmm_share < 1:
                time.sleep(1)
            warm = min(1.0, (step + 1) / settings.warmup)
            decay = 0.5 * (1 + np.cos(np.pi * min(step / settings.steps, 1.0)))
            for group in opt.param_groups:
                group["lr"] = float(settings.lr * warm * (0.1 + 0.9 * decay))
            if float(torch.rand(1, generator=gen)) < settings.gmm_share or not pool_files:
                x, y, length = gmm_batch(gen, settings.batch_size, width, max_classes)
            else:
                x, y, length = pool_batch(pool_files, gen, width, tables=settings.batch_size)
            if spec.fixed_width is None:
                x = trim_dead_columns(x)
            opt.zero_grad()
            loss = split_loss_backward(logits_of(adapter), x, y, length, gen, settings.micro_batch)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss)
            step += 1
            if step % settings.save_every == 0 or step == settings.steps:
                acc = evaluate(adapter)
                record = {"step": step, "loss": float(np.mean(losses)), "pool_batches": len(pool_files),
                          "seconds": round(time.time() - t0, 1), **{f"acc_{k}": round(v, 4) for k, v in acc.items()}}
                losses = []
                with curve.open("a") as fh:
                    fh.write(json.dumps(record) + "\n")
                print(json.dumps(record), flush=True)
                save_state()
            elif step == stop:
                save_state()  # stopped between evaluation points: the next run resumes here
    finally:
        for proc in generators:
            proc.terminate()
    if settings.export:
        export(spec, adapter, settings, step)
    return adapter


def read_curve(path: Path) -> list[dict[str, Any]]:
    points = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                points.append(json.loads(line))
            except json.JSONDecodeError:  # a torn last line of a killed run
                continue
    return points


def export(spec: Pretrainable, adapter: ModelAdapter, settings: RunSettings, step: int) -> Path:
    """Write the weights (``spec.write_weights``) and their JSON record into ``settings.export_dir``."""
    settings.export_dir.mkdir(parents=True, exist_ok=True)
    target = spec.write_weights(adapter, settings.export_dir / spec.weights_file)
    final = evaluate(adapter, seeds=FINAL_SEEDS)
    meta: dict[str, Any] = {
        "model": spec.name, "config": _model_config(adapter), "steps": step, "planned_steps": settings.steps,
        "seed": settings.seed, "command": settings.command,
        "prior": PRIOR_TEXT.format(gmm_share=settings.gmm_share),
        "prior_settings": {"generator": "tabicl.prior.PriorDataset", "kinds": {"mlp_scm": 2, "tree_scm": 1},
                           "tables_per_pool_batch": POOL_TABLES, **PRIOR_SETTINGS,
                           "pool_batches": len(list(settings.pool.glob("batch_*.pt"))),
                           "gaussian_cluster_share": settings.gmm_share, "augmentation": AUGMENTATION_TEXT},
        "training": settings.training_record(),
        "versions": package_versions(spec.versions),
        "final_accuracy_5_seeds": final,
        "parameters": sum(p.numel() for p in adapter.module.parameters()),
        "format": spec.export_format, "weights_file": target.name,
        "weights_sha256": hashlib.sha256(target.read_bytes()).hexdigest(),
        "curve_points": read_curve(settings.workdir / "curve.jsonl"),
    }
    meta["logistic_regression_5_seeds"] = evaluate_classifier(_logistic_regression, FINAL_SEEDS)
    if spec.package_classifier is not None:
        make = spec.package_classifier
        meta["package_classifier_accuracy_5_seeds"] = evaluate_classifier(lambda: make(target), FINAL_SEEDS)
    write_text_atomic(target.with_suffix(".json"), json.dumps(meta, indent=2, sort_keys=True) + "\n")
    print("exported", target, json.dumps(final), flush=True)
    return target


def _logistic_regression() -> Any:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(max_iter=5000)


def _model_config(adapter: ModelAdapter) -> dict[str, Any]:
    config = getattr(adapter.module, "config", None)
    if config is not None and hasattr(config, "to_dict"):  # pfn-mini
        return dict(config.to_dict())
    return dict(adapter.options["config"])  # the package class's full constructor config


# ----------------------------------------------------------------------------------------- step cost
@dataclass(frozen=True)
class StepCost:
    model: str
    parameters: int
    weights_mb: float  # float32 parameters, MiB
    seconds_per_step: float  # best of the timed steps
    seconds_all: tuple[float, ...]
    tables: int
    micro_batch: int | None
    rows: int
    features: int
    threads: int


def measure(spec: Pretrainable, batch_size: int, micro_batch: int | None, threads: int, steps: int = 3) -> StepCost:
    """Seconds per optimizer step on a fixed synthetic batch of ``batch_size`` tables of MEASURE_ROWS rows and
    MEASURE_FEATURES features (one warm-up step first, then the best of ``steps``)."""
    torch.set_num_threads(threads)
    adapter = build(spec, seed=0)
    opt = torch.optim.AdamW(adapter.module.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size, MEASURE_ROWS, spec.fixed_width or MEASURE_FEATURES, generator=gen)
    x[..., MEASURE_FEATURES:] = 0  # pfn-mini reads zero padding beyond the table's features
    y = torch.randint(0, 10, (batch_size, MEASURE_ROWS), generator=gen)
    seconds = []
    for i in range(steps + 1):
        start = time.perf_counter()
        opt.zero_grad()
        split_loss_backward(logits_of(adapter), x, y, MEASURE_ROWS, gen, micro_batch)
        opt.step()
        if i:  # the first step pays for allocations
            seconds.append(round(time.perf_counter() - start, 3))
    parameters = sum(p.numel() for p in adapter.module.parameters())
    return StepCost(spec.name, parameters, round(parameters * 4 / 2**20, 2), min(seconds), tuple(seconds),
                    batch_size, micro_batch, MEASURE_ROWS, MEASURE_FEATURES, threads)


# ----------------------------------------------------------------------------------------- command line
def parser(program: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=program, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["train", "generate", "measure"], default="train",
                   help="train (default); generate: fill the pool; measure: time a training step")
    p.add_argument("--model", help=f"the model to train: {', '.join(PRETRAINABLE.names())}")
    p.add_argument("--workdir", default=".pretrain", help="state.pt and curve.jsonl (one model per workdir)")
    p.add_argument("--pool", default=None, help="the prior pool folder (default WORKDIR/pool; models can share one)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps of the run (default: the model's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"tables per step (default: the model's); with --role generate tables per pool batch "
                        f"(default {POOL_TABLES})")
    p.add_argument("--micro-batch", type=int, default=None, help="tables per forward/backward pass (default: the model's)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--gmm-share", type=float, default=0.35)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--generators", type=int, default=1, help="pool generator processes to start (0: use the pool as is)")
    p.add_argument("--pool-size", type=int, default=4000, help="pool batches the generators stop at")
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--stop-at", type=int, default=None, help="end this run at this step (resume later to continue)")
    p.add_argument("--export", action="store_true", help="write the weights and their record into --export-dir")
    p.add_argument("--export-dir", default=str(WEIGHTS_DIR))
    p.add_argument("--measure-steps", type=int, default=3)
    return p


def settings_from(args: argparse.Namespace, spec: Pretrainable, command: str) -> RunSettings:
    defaults = spec.defaults
    workdir = Path(args.workdir)
    return RunSettings(
        model=spec.name, workdir=workdir, pool=Path(args.pool) if args.pool else workdir / "pool",
        steps=args.steps if args.steps is not None else defaults.steps, seed=args.seed,
        batch_size=args.batch_size or defaults.batch_size,
        micro_batch=args.micro_batch if args.micro_batch is not None else defaults.micro_batch,
        lr=args.lr if args.lr is not None else defaults.lr, warmup=args.warmup, gmm_share=args.gmm_share,
        threads=args.threads, generators=args.generators, pool_size=args.pool_size, save_every=args.save_every,
        stop_at=args.stop_at, export=args.export, export_dir=Path(args.export_dir), command=command,
    )


def main(argv: Sequence[str] | None = None, *, program: str = "python -m trainables.models.pretrain",
         model: str | None = None) -> None:
    """The command line. ``model`` fixes the model (the pfn-mini alias); ``program`` is what the record's
    command starts with."""
    given = list(sys.argv[1:] if argv is None else argv)
    p = parser(program)
    args = p.parse_args(given)
    if args.role == "generate":
        pool = Path(args.pool) if args.pool else Path(args.workdir) / "pool"
        generate_pool(pool, args.seed, args.batch_size or POOL_TABLES, args.pool_size)
        return
    if model is not None and args.model not in (None, model):
        p.error(f"{program} trains {model} only; run python -m trainables.models.pretrain --model {args.model}")
    name = model or args.model
    if name is None:
        p.error(f"--model is required: one of {', '.join(PRETRAINABLE.names())}")
    try:
        spec = PRETRAINABLE.get(name)
    except UnknownNameError as exc:
        p.error(str(exc.args[0]))
    settings = settings_from(args, spec, " ".join([program, *given]))
    if args.role == "measure":
        cost = measure(spec, settings.batch_size, settings.micro_batch, settings.threads, args.measure_steps)
        print(json.dumps({**asdict(cost), "load_average": [round(v, 2) for v in os.getloadavg()]}), flush=True)
        return
    if settings.batch_size < 1 or (settings.micro_batch is not None and settings.micro_batch < 1):
        p.error("--batch-size and --micro-batch must be at least 1")
    if settings.generators > 1:
        # a generator names its files by how many the pool holds when it starts: two would write the same names
        p.error("--generators: at most 1 per pool (two generators would write the same file names); run more "
                "with --role generate into pools of their own")
    train(settings)


if __name__ == "__main__":
    main()
