"""What reusing Tune's trial actors saves on a sweep of many short trials, and that it changes no result.

    python3 benchmarks/trial_actor_reuse.py [--trials 6] [--epochs 8] [--rounds 2] [--num-cpus 2] [--no-write]

The same sweep (iris, pfn-mini, ``--trials`` learning rates at Q = 30, checkpoints at 2 and ``--epochs``, one
probe actor, canaries off) runs through ``orchestrator.driver.sweep.run_sweep`` on one local Ray started by this
script, alternately as shipped (``TuneConfig(reuse_actors=True)``: a trial starts in a process that already
imported torch, Tune and iclmem) and with reuse turned off (each trial in a fresh actor process, as before
the change; the only difference is that one argument). The wall time of each ``run_sweep`` is taken; the
ratio uses the medians over ``--rounds``. The results tables of both are compared column by column (the
probe's timing and node columns aside): they must be equal.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, md_table, median, publish  # noqa: E402

SECTION = "Trial actor reuse: a sweep of short trials with and without it"
VOLATILE = ["probe_seconds", "probe_node"]


def sweep_config(trials: int, epochs: int) -> dict:
    lrs = [1e-4 * 2 ** i for i in range(trials)]
    return {"name": "reuse", "tasks": [{"name": "iris"}], "grid": {"lr": lrs, "q": [30]},
            "data": {"context_size": 60}, "training": {"epochs": epochs, "checkpoint_epochs": [2, epochs]},
            "probe": {"bootstrap": 50, "suite": ["base", "position_first", "skew_true_x2"],
                      "base_as_checkpoint": False},
            "resources": {"max_concurrent_trials": 1, "cpus_per_probe_actor": 0.5}, "wandb": {"mode": "disabled"}}


def run_once(sweep, reuse: bool):
    import ray.tune

    from orchestrator.driver.sweep import run_sweep

    shipped = ray.tune.TuneConfig

    def tune_config(**kwargs):
        return shipped(**{**kwargs, "reuse_actors": reuse})

    ray.tune.TuneConfig = tune_config  # the one argument this benchmark varies (the driver reads it at call time)
    try:
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            results = run_sweep(None, Path(folder) / "run", sweep=sweep, log=lambda _m: None, progress=False)
            return time.perf_counter() - start, results.drop(columns=VOLATILE)
    finally:
        ray.tune.TuneConfig = shipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import pandas as pd
    import ray

    from orchestrator.schema.config import parse_sweep

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, object_store_memory=300 * 1024 * 1024,
             log_to_driver=False, configure_logging=False)
    sweep = parse_sweep(sweep_config(args.trials, args.epochs), "benchmark")
    run_once(sweep, True)  # warm-up: Stage I cache, the first worker processes
    times: dict[bool, list[float]] = {True: [], False: []}
    tables: dict[bool, pd.DataFrame] = {}
    for _ in range(args.rounds):
        for reuse in (False, True):
            seconds, table = run_once(sweep, reuse)
            times[reuse].append(seconds)
            tables[reuse] = table.sort_values(["run_id", "epoch"]).reset_index(drop=True)
    ray.shutdown()
    pd.testing.assert_frame_equal(tables[True], tables[False])
    fresh, reused = median(times[False]), median(times[True])
    rows = [["fresh actor per trial", fmt(fresh, 1), " / ".join(fmt(t, 1) for t in times[False]), "1.00"],
            ["reused actors (shipped)", fmt(reused, 1), " / ".join(fmt(t, 1) for t in times[True]),
             fmt(reused / fresh, 2)]]
    text = (f"{args.trials} trials of {args.epochs} epochs (iris, pfn-mini, Q = 30, one trial at a time, one probe "
            f"actor) on a local Ray with {args.num_cpus} CPUs; {args.rounds} rounds, alternating.\n\n"
            + md_table(["trial actors", "median sweep wall (s)", "each round (s)", "ratio to fresh"], rows)
            + f"\n\nThe results tables of both are equal ({tables[True].shape[0]} rows x {tables[True].shape[1]} "
              "columns, the probe's timing and node columns aside).\n")
    publish(SECTION, text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
