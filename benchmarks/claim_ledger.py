"""The claim ledger's rates (issue #56): how often each claim the first screen and the console can state is made
on null data through its own path, and how often it is made, and read as a leak, on planted runs.

One real sweep through the user's path (``run_sweep``: Ray Tune, the probe pool, the aggregator, the ledger):
digits, the shipped pfn-mini, label-shuffled members (Q = 20), two learning rates over N seeds each:

* lr 1e-3: planted memorization (the quickstart's ground truth);
* lr 1e-9: a model that learnt nothing usable (its members' loss moves by about 1e-5 nats).

Every fine-tuned checkpoint is probed on ``--null-splits`` null splits (rows the run never saw). Per claim kind:
its null trials and false positives pooled over the sweep (each claim's own path: a run's null headline, the
union of flags, the slice tests on null rows, ...) with a Clopper-Pearson interval; and per learning rate, the
share of runs for which the claim is made on exact outputs, and the share read as a leak (made, measured rate at
or under 5%, and holding on probabilities rounded to 4 decimals).

    python3 benchmarks/claim_ledger.py [--seeds 10] [--null-splits 2] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, md_table, publish  # noqa: E402

RUN_KINDS = ("run_verdict", "known_context_flag")


def run(seeds: int, null_splits: int, epochs: int, root: Path) -> tuple[object, object, float]:
    """(results, ledger, seconds) of the sweep."""
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.runfolder.run_folder import RunFolder
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({
        "name": "claim-ledger-bench", "tasks": [{"name": "digits"}],
        "models": [{"name": "pfn-mini", "options": {"weights": "shipped"}}],
        "grid": {"q": [20], "lr": [1e-9, 1e-3], "label_mode": ["shuffled_members"], "seed": list(range(seeds))},
        "data": {"context_size": 128},
        "training": {"epochs": epochs, "checkpoint_epochs": [1, epochs]},
        "probe": {"bootstrap": 100, "null_splits": null_splits},
        "resources": {"cpus_per_trial": 0.5, "probe_actors": 1, "cpus_per_probe_actor": 0.5},
        "wandb": {"mode": "disabled"},
    })
    start = time.perf_counter()
    results = run_sweep(None, root / "run", sweep=sweep, log=lambda _m: None)
    return results, RunFolder(root / "run").claim_ledger(), time.perf_counter() - start


def tables(results: object, ledger: object) -> tuple[str, str]:
    import pandas as pd

    from probes.metrics import clopper_pearson

    assert isinstance(results, pd.DataFrame)
    assert isinstance(ledger, pd.DataFrame)
    lr_of = dict(zip(results["run_id"].astype(str), results["lr"], strict=True))
    null_rows = []
    for kind, group in ledger.groupby("kind", sort=True):
        measured = group[group["n_null"] > 0]
        if measured.empty:
            null_rows.append([kind, "not measured", "", ""])
            continue
        # a run-level kind's claims share their task's null trials: count them once per task
        per_task = measured.drop_duplicates("task")
        n, k = int(per_task["n_null"].sum()), int(per_task["null_made"].sum())
        iv = clopper_pearson(k, n)
        null_rows.append([kind, f"{k} of {n}", fmt(k / n if n else float("nan")), f"{fmt(iv.low)}–{fmt(iv.high)}"])
    null_table = md_table(["claim", "made on null trials", "rate", "95% interval"], null_rows)
    power_rows = []
    runs = ledger[ledger["kind"].isin(RUN_KINDS)].assign(lr=lambda d: d["subject"].map(lr_of))
    union = runs.groupby(["lr", "subject"], sort=True).agg(made=("made", "any"),
                                                         leak=("reading", lambda r: bool((r == "leak").any())),
                                                         shift=("relative_shift", "median"))
    for lr, group in union.groupby(level="lr", sort=True):
        per_kind = runs[runs["lr"] == lr]
        kinds = ", ".join(f"{kind} {int(g['made'].sum())} made / {int((g['reading'] == 'leak').sum())} leak"
                          for kind, g in per_kind.groupby("kind", sort=True))
        power_rows.append([f"{lr:g}", len(group), int(group["made"].sum()), int(group["leak"].sum()),
                           f"{group['shift'].abs().median():.2g}", kinds])
    power_table = md_table(["lr", "runs", "a verdict or flag made (exact outputs)", "read as a leak",
                            "median relative shift", "per claim"], power_rows)
    return null_table, power_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10, help="seeds per learning rate (default 10: 20 runs)")
    parser.add_argument("--null-splits", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results, ledger, seconds = run(args.seeds, args.null_splits, args.epochs, Path(tmp))
    null_table, power_table = tables(results, ledger)
    text = (f"digits, pfn-mini (shipped), label-shuffled members, Q = 20, {args.epochs} epochs (checkpoints 1 and "
            f"{args.epochs}), lr 1e-3 (planted) and lr 1e-9 (nothing usable learnt), {args.seeds} seeds each, "
            f"{args.null_splits} null splits per checkpoint; one sweep through `run_sweep`, {seconds:.0f} s on this "
            "machine.\n\n"
            "False positives of each claim through its own path (null trials: a run's null split at its null "
            "headline, pooled over the sweep's runs; `rows_at_risk` and `task_verdict`: one trial per null split "
            "index; slices: a run's null split is a false positive when any slice is flagged):\n\n"
            f"{null_table}\n\n"
            "Per learning rate: the runs whose verdict or known-context flag is made on exact outputs, and those "
            "read as a leak (made, rate at or under 5%, holding on probabilities rounded to 4 decimals); the "
            "median of the members' score shift as a share of the rows' spread:\n\n"
            f"{power_table}\n")
    publish("The claim ledger: null rates and power through each claim's own path", text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
