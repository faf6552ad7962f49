"""Ground truth for the per-record ranking (issue #47): do the records the risk report ranks first include the
rows known to be most exposed?

Planted: digits (10 labels), pfn-mini fine-tuned on Q member rows plus outlier canaries (crafted rows far from
the data), 8 per copy count inserted 1, 2, 4 and 8 times into the members, 32 held out; 5 epochs at lr 3e-4
(before every copy count is memorized: tests/test_canaries.py). The checkpoint is probed as a sweep probes it
and its records built as the aggregator builds them (``orchestrator.report.record_risk``: each member row's and each
canary's score and risk). Per attack (the probe's calibrated loss, the known-context loss) and copy count c:

* precision@k: the k = 8 canaries of c copies ranked among the member rows and themselves, by score (the risk
  is a monotone map of it); chance is their share, 8 / (Q + 8);
* the AUC of those canaries against the held-out ones (0.5: no trained canary stands out).

The slices' false-positive rates are measured by benchmarks/claim_ledger.py, through the sweep's own path.

    python3 benchmarks/record_risk.py [--seeds 0,1,2,3,4] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, md_table, publish, set_threads  # noqa: E402

COPIES = (1, 2, 4, 8)


def one_seed(seed: int, epochs: int, lr: float, q: int) -> list[dict]:
    import numpy as np
    import torch

    from iclmem.stats import auc
    from iclmem.vocab import Channel
    from orchestrator.report.canary_and_value_risk import canary_rows
    from orchestrator.report.record_risk import RECORD_ATTACKS, record_rows
    from probes.manipulations import default_suite
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.record_risk import precision_at_k
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.data import PrepSettings, TaskSource, prepare_task
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    torch.manual_seed(seed)
    source = TaskSource("digits", "builtin", None, None, None)
    prep = PrepSettings(context_size=30)
    task = prepare_task(source, prep, "normal", seed, q=q)
    spec = FinetuneSpec(epochs=epochs, lr=lr, checkpoint_epochs=(epochs,), seed=seed,
                        canaries={"kinds": ["outlier"], "per_group": 8, "holdout": 32})
    finetuner = Finetuner(spec, [task])
    for _ in range(epochs):
        finetuner.run_epoch()
    base = build_model("pfn-mini")
    plan = ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed,
                           compress_rows=base.supports_context_weights)
    with tempfile.TemporaryDirectory() as cache:
        result = probe_checkpoint(finetuner.model, task, plan, cache, "base", base,
                                  ProbeSettings(n_resamples=20, null_splits=0),
                                  {"run_id": f"planted-{seed}"}, epochs, canaries=finetuner.canaries)
    table = result.queries
    scores = {name: f(table) for name, f in RECORD_ATTACKS.items()}
    identity = {"run_id": f"planted-{seed}", "task": "digits", "epoch": epochs}
    rows = record_rows(table["query_id"], table["member"], scores, identity, Channel.FINE_TUNED_WEIGHTS)
    canaries = canary_rows(result.row["canary_scores"], scores, table["member"], identity)
    ranking = []
    for attack in RECORD_ATTACKS:
        members = rows[(rows["attack"] == attack) & rows["member"]]
        mine = canaries[canaries["attack"] == attack]
        held = mine[mine["canary_copies"] == 0]["score"].to_numpy(np.float64)
        for c in COPIES:
            planted = mine[mine["canary_copies"] == c]
            ranked = np.r_[members["score"].to_numpy(np.float64), planted["score"].to_numpy(np.float64)]
            positive = np.r_[np.zeros(len(members), bool), np.ones(len(planted), bool)]
            ranking.append({"seed": seed, "attack": attack, "copies": c, "k": len(planted),
                            "precision_at_k": precision_at_k(ranked, positive, len(planted)),
                            "chance": len(planted) / len(ranked),
                            "auc_vs_held_out": auc(planted["score"].to_numpy(np.float64), held)})
    return ranking


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--q", type=int, default=30)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    set_threads(1)  # the machine is shared: one thread, as the planted tests run
    start = time.perf_counter()
    ranking = []
    for seed in seeds:
        ranking += one_seed(seed, args.epochs, args.lr, args.q)
        print(f"seed {seed} done ({time.perf_counter() - start:.0f} s)", flush=True)
    ranking_df = pd.DataFrame(ranking)
    rows = []
    for (attack, copies), g in ranking_df.groupby(["attack", "copies"], sort=True):
        rows.append([attack, copies, int(g["k"].iloc[0]), fmt(g["chance"].mean()),
                     f"{fmt(g['precision_at_k'].mean())} ({fmt(g['precision_at_k'].min())}–{fmt(g['precision_at_k'].max())})",
                     f"{fmt(g['auc_vs_held_out'].mean())} ({fmt(g['auc_vs_held_out'].min())}–{fmt(g['auc_vs_held_out'].max())})"])
    table = md_table(["attack", "copies", "k", "chance", "precision@k, mean (min–max over seeds)",
                      "AUC against held-out canaries, mean (min–max)"], rows)
    text = (f"digits, pfn-mini, Q = {args.q} member rows, {args.epochs} epochs at lr {args.lr:g}, outlier canaries "
            f"(8 per copy count, 32 held out), seeds {', '.join(map(str, seeds))}; "
            f"{time.perf_counter() - start:.0f} s on this machine.\n\n"
            "Precision@k: the k canaries of one copy count ranked among the member rows and themselves by their "
            "membership score (chance: their share). AUC: those canaries against the held-out ones.\n\n"
            f"{table}\n\nThe slices' null rates are measured through the sweep's own path now (null splits at each "
            "run's null headline, the run's whole family corrected): benchmarks/claim_ledger.py.\n")
    print(text)
    publish("Per-record risk: canaries ranked among the rows", text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
