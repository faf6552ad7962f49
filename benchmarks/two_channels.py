"""Two channels, same rows (``probe.two_channels``, issue #47): a fine-tuned checkpoint deployed with half of its
member rows and half of its non-member rows, each channel measured within the strata of the other.

digits (10 labels), pfn-mini fine-tuned on Q member rows (true labels, and label-shuffled members: planted
memorization) at lr 1e-3, probed at the last epoch as a sweep probes it (the probe's query table with the context
channel's columns), and crossed as the aggregator crosses it (``probes.two_channel.channel_crossing``). Per label
mode, attack and stratum: the AUC over seeds (mean, min-max) and how many seeds' 95% intervals clear 0.5.

    python3 benchmarks/two_channels.py [--seeds 0,1,2,3,4] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import md_table, publish, set_threads  # noqa: E402

# the attacks shown: the weights' probe and known context, the context's calibrated loss, LiRA online, plain loss
SHOWN = ("probe", "known_context", "calibrated_loss", "lira_online", "loss")


def one_run(seed: int, label_mode: str, epochs: int, lr: float, q: int, references: int) -> list[dict]:
    import numpy as np
    import torch

    from orchestrator.report.record_risk import RECORD_ATTACKS
    from probes.manipulations import default_suite
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from probes.two_channel import CONTEXT_CHANNEL_PREFIX, IN_CONTEXT_COLUMN, channel_crossing
    from trainables.data import PrepSettings, TaskSource, prepare_task
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    torch.manual_seed(seed)
    task = prepare_task(TaskSource("digits", "builtin", None, None, None), PrepSettings(context_size=64), label_mode,
                        seed, q=q)
    spec = FinetuneSpec(epochs=epochs, lr=lr, checkpoint_epochs=(epochs,), seed=seed)
    finetuner = Finetuner(spec, [task])
    for _ in range(epochs):
        finetuner.run_epoch()
    base = build_model("pfn-mini")
    plan = ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed,
                           compress_rows=base.supports_context_weights)
    with tempfile.TemporaryDirectory() as cache:
        result = probe_checkpoint(finetuner.model, task, plan, cache, "base", base,
                                  ProbeSettings(n_resamples=20, null_splits=0, context_channel_references=references),
                                  {"run_id": f"two-{seed}", "seed": seed}, epochs)
    table = result.queries
    weights = {name: f(table).to_numpy(np.float64) for name, f in RECORD_ATTACKS.items()}
    context = {c[len(CONTEXT_CHANNEL_PREFIX):]: table[c].to_numpy(np.float64) for c in table.columns
               if c.startswith(CONTEXT_CHANNEL_PREFIX)}
    cells = channel_crossing(table["member"].to_numpy(bool), table[IN_CONTEXT_COLUMN].to_numpy(bool), weights,
                             context, n_resamples=200, seed=seed)
    return [{"seed": seed, "label_mode": label_mode, **c.as_dict()} for c in cells]


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--q", type=int, default=50)
    parser.add_argument("--references", type=int, default=16)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    set_threads(1)
    warnings.filterwarnings("ignore")  # the coarse-TPR notes of every probe: the table below reads AUCs only
    start = time.perf_counter()
    cells = []
    for label_mode in ("normal", "shuffled_members"):
        for seed in seeds:
            cells += one_run(seed, label_mode, args.epochs, args.lr, args.q, args.references)
            print(f"{label_mode} seed {seed} done", flush=True)
    frame = pd.DataFrame(cells)
    frame = frame[frame["attack"].isin(SHOWN)]
    rows = []
    for (mode, channel, attack, stratum), g in frame.groupby(["label_mode", "channel", "attack", "stratum"], sort=True):
        rows.append([mode, channel, attack, stratum, f"{g['auc'].mean():.3f}",
                     f"{g['auc'].min():.3f}-{g['auc'].max():.3f}", f"{int((g['auc_low'] > 0.5).sum())}/{len(g)}"])
    text = (f"digits, pfn-mini, Q = {args.q} member rows, {args.epochs} epochs at lr {args.lr:g}, seeds "
            f"{', '.join(map(str, seeds))}; the deployed context holds half of each (fine-tuned, label) cell, "
            f"K = {args.references} reference contexts on the same weights; {time.perf_counter() - start:.0f} s. "
            "Weights channel: fine-tuned rows against the rest, within the rows in the context and within the "
            "rows not. Context channel: rows in the context against the rest, within the rows fine-tuned on and "
            "within the rows not. \"intervals above 0.5\": seeds whose 95% bootstrap interval lies above 0.5.\n\n"
            + md_table(["label mode", "channel", "attack", "stratum", "AUC mean", "min-max", "intervals above 0.5"],
                       rows))
    publish("Two channels, same rows: each channel within the strata of the other", text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
