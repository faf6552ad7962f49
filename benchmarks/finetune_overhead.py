"""What running a fine-tuning run inside Ray Tune costs over the same loop in plain torch.

    python3 benchmarks/finetune_overhead.py [--quick] [--epochs 100] [--rounds 3] [--task breast_cancer]
                                            [--q 50] [--context 128] [--num-cpus 2] [--no-write]

Both sides run the same ``single_fixed`` fine-tuning of the shipped pfn-mini (one AdamW step plus the
member / non-member in-context evaluation per epoch, as ``Finetuner.run_epoch`` does) for ``--epochs``
epochs with the default checkpoint schedule (1, 2, 5, 10, 25, 50, 100, ... capped by the epochs, plus the
last), one torch thread, one training process each:

* **plain**: ``Finetuner(spec, [task]).train(callback)`` in a fresh process of its own, the callback
  saving a checkpoint (``Finetuner.save``) at each scheduled epoch into a temporary folder. The process
  runs at the niceness Ray gives its workers (``RAY_worker_niceness``, 15 by default; checked at run
  time), so on a shared CPU both sides get the same share;
* **tune**: the real trainable ``trainables.trainable.finetune_trainable`` under a real ``tune.Tuner``
  (one trial, ``tune.with_parameters`` for the prepared task, the pipeline's RunConfig without callbacks)
  on a local Ray started by this script (``--num-cpus``). It reports every epoch and hands Tune a
  checkpoint at each scheduled epoch, which Tune persists to its storage folder.

Tune's cost is given three ways: the trial's own ``time_total_s`` (the time Tune accounts to the trial:
model build, epochs, reports, checkpoint hand-over), the wall time of ``Tuner.fit()`` (adds the trial
actor's start, the controller's polling and the experiment bookkeeping) and, once, the end to end of a
cold start (``ray.init`` + ``fit``). Plain and Tune runs alternate (plain, tune, tune, plain, ...) so load
changes hit both; the ratios use the medians. Target: Tune adds under 15 % (trial time vs plain).

Diagnostics (skipped with ``--no-diagnostic`` / ``--quick``): the plain loop at niceness 0 (what the
priority alone is worth on this machine) and a Tune trial that reports at checkpoint epochs only (the
cost of a report per epoch).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, md_table, median, publish, set_threads, verdict  # noqa: E402

SECTION = "Fine-tuning overhead: Ray Tune vs plain torch"
TARGET = 0.15


def finetune_config(epochs: int, seed: int = 0) -> dict:
    from trainables.spec import DEFAULT_CHECKPOINT_EPOCHS

    return {"model": "pfn-mini", "model_options": {"weights": "shipped"}, "regime": "single_fixed", "lr": 1e-3,
            "epochs": epochs, "checkpoint_epochs": list(DEFAULT_CHECKPOINT_EPOCHS), "every_epoch": False,
            "seed": seed}


def run_plain(task, fin: dict, workdir: Path) -> dict:
    """The trainable's loop without Tune: same Finetuner, same epochs, same checkpoints (to local disk)."""
    from trainables.finetune import Finetuner, FinetuneSpec

    start = time.perf_counter()
    spec = FinetuneSpec(**fin)
    finetuner = Finetuner(spec, [task])
    schedule = set(spec.schedule())
    saved = []
    marks = [start]

    def callback(result, ft):
        if result.epoch in schedule and not result.diverged:
            metrics = {"epoch": result.epoch, "train_loss": result.train_loss, **result.metrics}
            saved.append(ft.save(workdir / f"checkpoint_{result.epoch:06d}", metrics))
        marks.append(time.perf_counter())

    results = finetuner.train(callback)
    iters = np.diff(marks)  # like Tune's time_this_iter_s: the first includes building the Finetuner
    return {"seconds": time.perf_counter() - start, "epochs": results[-1].epoch, "checkpoints": len(saved),
            "final_loss": results[-1].train_loss, "first_iter": float(iters[0]),
            "median_iter": float(np.median(iters[1:]))}


def _plain_child(conn, task, fin: dict, workdir: str, nice: int, threads: int) -> None:
    try:
        os.nice(nice - os.nice(0))  # absolute niceness (raising it needs no privilege)
        import torch

        import trainables.finetune  # noqa: F401  (imports outside the timing, as in a Tune worker)

        torch.set_num_threads(threads)
        conn.send(run_plain(task, fin, Path(workdir)))
    except BaseException as exc:  # report, don't hang the parent
        conn.send({"error": repr(exc)})
    finally:
        conn.close()


def run_plain_process(task, fin: dict, workdir: Path, nice: int, threads: int) -> dict:
    """``run_plain`` in a fresh process at a given niceness, like a Tune trial in its Ray worker."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_plain_child, args=(child, task, fin, str(workdir), nice, threads))
    proc.start()
    child.close()
    out = parent.recv()
    proc.join()
    if "error" in out:
        raise RuntimeError(f"plain run failed: {out['error']}")
    return out


def sparse_report_trainable(config: dict, prepared: dict | None = None) -> None:
    """Diagnostic only, not iclmem's trainable: the same Finetuner loop reporting to Tune at checkpoint
    epochs only (7 reports instead of 100), to separate Tune's per-report cost from its fixed cost."""
    import torch
    from ray import tune

    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.spec import TUNE_AXIS

    config = config.get(TUNE_AXIS, config)
    torch.set_num_threads(int(config.get("torch_threads", 1)))
    spec = FinetuneSpec(**config["finetune"])
    finetuner = Finetuner(spec, [prepared[key] for key in config["task_keys"]])
    schedule = set(spec.schedule())
    while finetuner.epoch < spec.epochs:
        result = finetuner.run_epoch()
        if result.epoch in schedule:
            metrics = {"run_id": config["run_id"], "epoch": result.epoch, "train_loss": result.train_loss,
                       "diverged": result.diverged, **result.metrics}
            with tempfile.TemporaryDirectory() as tmp:
                finetuner.save(tmp, metrics)
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))


def run_tune(task, fin: dict, storage: Path, name: str, threads: int, trainable=None) -> dict:
    from ray import tune

    from trainables.spec import TUNE_AXIS
    from trainables.trainable import finetune_trainable

    trainable = trainable or finetune_trainable
    config = {"run_id": name, "task_keys": [task.fingerprint], "identity": {"run_id": name}, "finetune": fin,
              "torch_threads": threads}
    tuner = tune.Tuner(
        tune.with_parameters(trainable, prepared={task.fingerprint: task}),
        param_space={TUNE_AXIS: config},
        run_config=tune.RunConfig(name=name, storage_path=str(storage), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0),
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=None)),
    )
    start = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - start
    if grid.errors:
        raise RuntimeError(f"the Tune trial failed: {grid.errors}")
    result = grid[0]
    n_ckpt = len(list(Path(result.path).glob("checkpoint_*")))
    reported = [json.loads(line) for line in (Path(result.path) / "result.json").read_text().splitlines() if line.strip()]
    iters = np.array([r["time_this_iter_s"] for r in reported])
    return {"seconds": float(result.metrics["time_total_s"]), "fit_wall": wall, "epochs": result.metrics["epoch"],
            "checkpoints": n_ckpt, "final_loss": result.metrics["train_loss"], "first_iter": float(iters[0]),
            "median_iter": float(np.median(iters[1:])) if len(iters) > 1 else float("nan")}


def diagnosis(args, schedule, plain: list, t_med: float, plain0: list, sparse: list, worker_nice: int) -> list[str]:
    if not (plain0 and sparse):
        return []
    p_med = median([o["seconds"] for o in plain])
    epoch_ms = median([o["median_iter"] for o in plain]) * 1e3
    z_med = median([o["seconds"] for o in plain0])
    s_med = median([o["seconds"] for o in sparse])
    n_extra = max(args.epochs - len(schedule), 1)
    per_report = (t_med - s_med) / n_extra * 1e3
    if per_report > 1.0:
        reports = (f"i.e. about {per_report:.1f} ms per extra report, {per_report / epoch_ms:.0%} of a plain epoch: "
                   "reporting every k epochs (or only at checkpoints) would cut it.")
    else:
        reports = ("so the per-epoch reports carry no measurable cost here: the trial that reported less was not "
                   f"faster (slower in {sum(o['seconds'] > t_med for o in sparse)}/{len(sparse)} rounds than the every-epoch "
                   "median; a thread that blocks briefly every epoch may simply be scheduled more favourably on a "
                   "shared CPU, so this row bounds the report cost, no more).")
    if z_med < 0.95 * p_med:
        priority = (f"here the plain loop at nice 0 took {z_med / p_med:.2f}x the time of the one at nice {worker_nice}, so "
                    "timing a Tune trial against a plain loop run in the driver (nice 0) overstates Tune's cost on a "
                    "busy machine")
    else:
        priority = (f"at this run's load the priority made no measurable difference (nice 0 / nice {worker_nice} = "
                    f"{z_med / p_med:.2f}), but it does when other jobs keep the CPU busy, so a plain loop timed in the "
                    "driver (nice 0) is not a fair reference")
    return [
        "",
        f"Where Tune's time goes. A plain epoch (after the first) costs {epoch_ms:.1f} ms here. (1) Reports: iclmem's "
        f"trainable calls `tune.report` every epoch, and a function trainable's report is synchronous (Ray runs it "
        f"with `synchronous_result_reporting=True`: the training thread waits until Tune has taken the result). The "
        f"diagnostic trial that reports at the {len(schedule)} checkpoint epochs only took {s_med:.2f} s against "
        f"{t_med:.2f} s for the every-epoch trial, " + reports
        + f" (2) Priority: Ray starts its workers at niceness {worker_nice}; {priority}. This script gives the plain "
        "loop a process of its own at the workers' niceness.",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="40 epochs, 1 round after the cold start (< 1 min)")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3, help="plain/tune pairs, alternating order")
    p.add_argument("--task", default="breast_cancer")
    p.add_argument("--q", type=int, default=50)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray this script starts")
    p.add_argument("--threads", type=int, default=1, help="torch threads on both sides")
    p.add_argument("--no-diagnostic", action="store_true",
                   help="skip the diagnostic Tune run that reports at checkpoint epochs only")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.rounds, args.no_diagnostic = 40, 1, True
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    set_threads(args.threads)

    import ray
    import torch

    from trainables.data import TaskSource, prepare_task
    from trainables.finetune import FinetuneSpec

    task = prepare_task(TaskSource(args.task, "builtin"), seed=0, q=args.q, context_size=args.context)
    fin = finetune_config(args.epochs)
    schedule = FinetuneSpec(**fin).schedule()
    print(f"{args.task}: Q={args.q}, context {len(task.context_idx)}, {args.epochs} epochs, checkpoints at {schedule}",
          flush=True)

    # Ray starts its workers at niceness RAY_worker_niceness (15 unless set): the plain loop runs in a child
    # process at the same niceness, so both sides get the same share of a shared CPU. A second plain run
    # at niceness 0 (diagnostic) shows what the priority alone is worth on this machine.
    worker_nice = int(os.environ.get("RAY_worker_niceness", "15"))
    plain, plain0, tuned, sparse = [], [], [], []
    cold = None
    with tempfile.TemporaryDirectory(prefix="iclmem-ft-bench-") as tmp:
        tmp = Path(tmp)
        # Cold start, not in the medians: ray.init + the first fit (Ray's own start-up work, the first
        # worker processes) -- paid once per sweep.
        t0 = time.perf_counter()
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, object_store_memory=256 * 1024 ** 2,
                 log_to_driver=False, configure_logging=False)
        init_s = time.perf_counter() - t0
        measured_nice = ray.get(ray.remote(lambda: os.nice(0)).remote())
        if measured_nice != worker_nice:
            print(f"warning: Ray workers run at niceness {measured_nice}, not {worker_nice}", flush=True)
            worker_nice = measured_nice
        out = run_tune(task, fin, tmp / "tune", "cold", args.threads)
        cold = {"init": init_s, "end_to_end": time.perf_counter() - t0, **out}
        print(f"cold: ray.init {init_s:.2f} s, first trial {out['seconds']:.2f} s, end to end {cold['end_to_end']:.2f} s",
              flush=True)
        for r in range(args.rounds):
            order = ["plain", "tune"] + ([] if args.no_diagnostic else ["plain0", "sparse"])
            if r % 2:
                order.reverse()
            for side in order:
                if side in ("plain", "plain0"):
                    nice = worker_nice if side == "plain" else 0
                    out = run_plain_process(task, fin, tmp / f"{side}{r}", nice, args.threads)
                    (plain if side == "plain" else plain0).append(out)
                    print(f"round {r}: plain (nice {nice}) {out['seconds']:.2f} s", flush=True)
                elif side == "sparse":
                    out = run_tune(task, fin, tmp / "tune", f"sparse{r}", args.threads, sparse_report_trainable)
                    sparse.append(out)
                    print(f"round {r}: tune, reports at checkpoints only: trial {out['seconds']:.2f} s", flush=True)
                else:
                    out = run_tune(task, fin, tmp / "tune", f"bench{r}", args.threads)
                    tuned.append(out)
                    print(f"round {r}: tune trial {out['seconds']:.2f} s, fit() {out['fit_wall']:.2f} s", flush=True)
    ray.shutdown()

    for out in (*plain, *plain0, *tuned, *sparse):
        assert out["epochs"] == args.epochs, out
    assert {o["checkpoints"] for o in (*plain, *plain0)} == {len(schedule)} == {
        o["checkpoints"] for o in (*tuned, *sparse)}, (plain, plain0, tuned, sparse)
    # Same seed, same data, same steps: both sides must have trained the same model.
    assert abs(plain[0]["final_loss"] - tuned[0]["final_loss"]) < 1e-4, (plain[0], tuned[0])

    p_med = median([o["seconds"] for o in plain])
    t_med = median([o["seconds"] for o in tuned])
    f_med = median([o["fit_wall"] for o in tuned])
    ratio = t_med / p_med
    per_epoch_ms = (t_med - p_med) / args.epochs * 1e3
    rows = [
        (f"plain torch (`Finetuner.train` + `save`), own process at nice {worker_nice} like Ray's workers", fmt(p_med, 2),
         "1.000", "–", ", ".join(fmt(o["seconds"], 2) for o in plain)),
        ("Tune: trial `time_total_s`", fmt(t_med, 2), f"**{ratio:.3f}**", f"{per_epoch_ms:+.1f}",
         ", ".join(fmt(o["seconds"], 2) for o in tuned)),
        ("Tune: `Tuner.fit()` wall", fmt(f_med, 2), f"{f_med / p_med:.3f}", "– (mostly fixed)",
         ", ".join(fmt(o["fit_wall"], 2) for o in tuned)),
    ]
    if plain0:
        z_med = median([o["seconds"] for o in plain0])
        rows.append(("diagnostic: plain torch at nice 0", fmt(z_med, 2), f"{z_med / p_med:.3f}",
                     f"{(z_med - p_med) / args.epochs * 1e3:+.1f}", ", ".join(fmt(o["seconds"], 2) for o in plain0)))
    if sparse:
        s_med = median([o["seconds"] for o in sparse])
        rows.append(("diagnostic: Tune, reporting at the checkpoint epochs only (not iclmem's trainable)", fmt(s_med, 2),
                     f"{s_med / p_med:.3f}", f"{(s_med - p_med) / args.epochs * 1e3:+.1f}",
                     ", ".join(fmt(o["seconds"], 2) for o in sparse)))
    if cold is not None:
        rows.append(("Tune: cold start (`ray.init` + first `fit()`, not in the medians)", fmt(cold["end_to_end"], 2),
                     f"{cold['end_to_end'] / p_med:.3f}", "– (fixed)",
                     f"ray.init {cold['init']:.2f} s, trial {cold['seconds']:.2f} s, fit() {cold['fit_wall']:.2f} s"))
    table = md_table(["side", "median s", "ratio to plain", "extra ms / epoch", "runs (s)"], rows, align="lrrrl")
    split_rows = [(f"plain (nice {worker_nice})", f"{median([o['first_iter'] for o in plain]):.3f}",
                   f"{median([o['median_iter'] for o in plain]) * 1e3:.1f}")]
    split_rows.append(("Tune trial (`time_this_iter_s`)", f"{median([o['first_iter'] for o in tuned]):.3f}",
                       f"{median([o['median_iter'] for o in tuned]) * 1e3:.1f}"))
    split = md_table(["side", "first iteration: build + epoch 1 (s)", "median of the other epochs (ms)"], split_rows)
    fixed_extra = median([o["first_iter"] for o in tuned]) - median([o["first_iter"] for o in plain])
    epoch_extra = (median([o["median_iter"] for o in tuned]) - median([o["median_iter"] for o in plain])) * 1e3
    ok = ratio - 1 < TARGET
    text = "\n".join([
        f"**Headline:** Tune / plain = **{ratio:.3f}** (trial time; target: Tune adds under {TARGET:.0%}: "
        f"{verdict(ok)}); `fit()` wall / plain = {f_med / p_med:.3f}"
        + (f"; cold start with `ray.init` / plain = {cold['end_to_end'] / p_med:.3f}" if cold else "") + ".",
        "",
        f"single_fixed fine-tuning of the shipped pfn-mini on `{args.task}` (Q={args.q}, context {len(task.context_idx)} "
        f"rows), {args.epochs} epochs (one AdamW step + member/non-member ICL evaluation each), checkpoints at epochs "
        f"{', '.join(map(str, schedule))} ({len(schedule)} checkpoints), torch {torch.__version__} with {args.threads} "
        f"thread(s) on both sides, each side in a process of its own at niceness {worker_nice}; local Ray with "
        f"num_cpus={args.num_cpus} started by the script, one trial. "
        f"{args.rounds} alternating round(s); medians. Both sides end at the same training loss "
        f"({plain[0]['final_loss']:.6f}), i.e. they did the same work.",
        "",
        table,
        "",
        "Trial time = Tune's `time_total_s` for the trial (model build, epochs, one `tune.report` per epoch, "
        "checkpoint hand-over and persisting into the storage folder). `fit()` adds the trial actor's start "
        "and Tune's controller loop; the cold row adds starting Ray itself, paid once per sweep, not per run.",
        "",
        "Split of the trial time (medians over rounds):",
        "",
        split,
        "",
        f"Tune's extra = {fixed_extra:+.2f} s once per trial (first iteration: the trainable's setup in its Ray worker) "
        f"+ {epoch_extra:+.1f} ms per epoch ({epoch_extra / (median([o['median_iter'] for o in plain]) * 1e3):+.0%} of "
        f"a plain epoch) → over {args.epochs} epochs {fixed_extra + epoch_extra * args.epochs / 1e3:+.2f} s; at the "
        f"paper's 500 epochs the same costs would add "
        f"{(fixed_extra + epoch_extra * 500 / 1e3) / (median([o['median_iter'] for o in plain]) * 500 + median([o['first_iter'] for o in plain])):+.0%}.",
    ] + diagnosis(args, schedule, plain, t_med, plain0, sparse, worker_nice))
    publish(SECTION, text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
