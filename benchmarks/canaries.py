"""Canaries: exposure against copy count and epochs, and what canaries cost.

    python3 benchmarks/canaries.py [--task digits] [--epochs 25] [--no-write]

Without Ray, the fine-tuning and probe code a sweep's trials and probe actors run: the shipped pfn-mini on
``--task`` (Q = 30 members, |C'| = 30), canaries of both kinds (8 per copy count 1 / 2 / 4 / 8, 32 held
out per kind), one torch thread, at two learning rates; every checkpoint probed with the default suite
of 48 manipulations. Cost: the same checkpoint probed with and without its canaries, and a fine-tuning
step with and without the canaries' query rows, interleaved in this one run.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, interleave, md_table, median, publish, set_threads  # noqa: E402

SECTION = "Canaries: exposure by copy count and epoch, and their cost"
COPIES = (1, 2, 4, 8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="digits")
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--lrs", default="3e-4,1e-3")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    set_threads(1)
    import tempfile

    from orchestrator.report.canaries import chance_exposure
    from probes.manipulations import default_suite
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.data import PrepSettings, TaskSource, prepare_task
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    started = time.perf_counter()
    task = prepare_task(TaskSource(args.task, "builtin", None, None, None), PrepSettings(context_size=30), "normal",
                        0, q=30)
    settings = {"kinds": ["outlier", "rare_label"], "copies": list(COPIES), "per_group": 8, "holdout": 32}
    base = build_model("pfn-mini")
    plan = ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed,
                           compress_rows=base.supports_context_weights)
    probe_settings = ProbeSettings(n_resamples=100, null_splits=0)
    schedule = sorted({e for e in (1, 5, 10, 25, 50, 100) if e <= args.epochs} | {args.epochs})
    rows, cost = [], {}
    probe_exposure: dict[tuple[float, int, str], list[float]] = {}
    outcomes: list[str] = []
    with tempfile.TemporaryDirectory() as cache:
        lrs = [float(v) for v in args.lrs.split(",")]
        for lr in lrs:
            spec = FinetuneSpec(epochs=args.epochs, lr=lr, checkpoint_epochs=tuple(schedule), canaries=settings)
            finetuner = Finetuner(spec, [task])
            for epoch in range(1, args.epochs + 1):
                finetuner.run_epoch()
                if epoch not in schedule:
                    continue
                row = probe_checkpoint(finetuner.model, task, plan, cache, "base", base, probe_settings,
                                       {"run_id": "bench"}, epoch, canaries=finetuner.canaries).row
                outcomes.append(str(row["outcome"]))
                for kind in ("outlier", "rare_label"):
                    probe_exposure[(lr, epoch, kind)] = [row[f"canary_{kind}_exposure_c{k}"] for k in COPIES]
                    rows.append([f"{lr:g}", epoch, f"{row['outcome']} ({fmt(row['auc'], 2)})", kind,
                                 " / ".join(fmt(row[f"canary_{kind}_exposure_c{k}"], 2) for k in COPIES),
                                 " / ".join(fmt(_mean_of(row, kind, k, "known_context_exposure"), 2) for k in COPIES),
                                 " / ".join(fmt(_mean_of(row, kind, k, "label_rank"), 1) for k in COPIES)])
            if not cost:  # cost, on the first learning rate's last checkpoint
                model, canaries = finetuner.model, finetuner.canaries
                plain = Finetuner(FinetuneSpec(epochs=args.epochs, lr=lr), [task])
                with_canaries = Finetuner(FinetuneSpec(epochs=args.epochs, lr=lr, canaries=settings), [task])
                times = interleave({
                    # defaults bind this iteration's objects (the lambdas run within it, in interleave)
                    "probe": lambda model=model: probe_checkpoint(model, task, plan, cache, "base", base,
                                                                  probe_settings, {"run_id": "bench"}, 1),
                    "probe + canaries": lambda model=model, canaries=canaries: probe_checkpoint(
                        model, task, plan, cache, "base", base, probe_settings, {"run_id": "bench"}, 1,
                        canaries=canaries),
                    "step": lambda plain=plain: plain.run_epoch(),
                    "step + canaries": lambda with_canaries=with_canaries: with_canaries.run_epoch(),
                }, rounds=5)
                cost = {k: median(v) for k, v in times.items()}
    total = time.perf_counter() - started
    probe_ratio = cost["probe + canaries"] / cost["probe"]
    step_ratio = cost["step + canaries"] / cost["step"]
    n_queries, n_canaries = 2 * len(task.member_idx), 2 * (8 * len(COPIES) + 32)
    text = "\n".join([
        f"pfn-mini (shipped weights) on `{args.task}` ({task.n_classes} labels), Q = 30 members, |C'| = 30, "
        f"canaries of both kinds: 8 per copy count ({', '.join(map(str, COPIES))}), 32 held out per kind "
        f"({n_canaries} canaries, {2 * 8 * sum(COPIES)} extra query rows per step next to 30 members); default "
        f"suite; one torch thread. Exposure in bits against the 32 held-out canaries of the same kind: chance "
        f"{chance_exposure(32):.2f}, ceiling 5.04; means over the 8 canaries of each copy count. Whole "
        f"benchmark {total:.0f} s.",
        "",
        f"**Cost** (medians of 5 interleaved rounds): probing a checkpoint with its canaries / without = "
        f"**{probe_ratio:.2f}x** ({fmt(cost['probe + canaries'], 2)} s vs {fmt(cost['probe'], 2)} s; the canaries add "
        f"{n_canaries} queries to the {n_queries} audited ones, each under the whole suite); a fine-tuning epoch "
        f"with / without the canaries' rows = **{step_ratio:.2f}x** ({fmt(cost['step + canaries'] * 1000, 1)} ms vs "
        f"{fmt(cost['step'] * 1000, 1)} ms).",
        "",
        md_table(["lr", "epoch", "audit (AUC)", "kind", "probe exposure, copies 1/2/4/8",
                  "known-context exposure", "label rank"], rows, align="rrllccc"),
        "",
        f"Reading: exposure grows with the copies from the first checkpoint (outliers, probe statistic, lr "
        f"{lrs[0]:g} epoch {schedule[0]}: {_bits(probe_exposure[(lrs[0], schedule[0], 'outlier')])} bits for "
        f"1 / 2 / 4 / 8 copies), and the fewer copies catch up as training goes on (lr {lrs[-1]:g} epoch "
        f"{schedule[-1]}: {_bits(probe_exposure[(lrs[-1], schedule[-1], 'outlier')])}): fine-tuning repeats "
        "every member at every step, so copies act as weights in the loss and every inserted row is eventually "
        "learnt. Rare-label canaries are less exposed than outliers (lr "
        f"{lrs[-1]:g} epoch {schedule[-1]}: {_bits(probe_exposure[(lrs[-1], schedule[-1], 'rare_label')])}) even "
        "once their labels are predicted (label rank 1): they all carry the same label, so the model's shift "
        "toward it for rows like them lifts the held-out canaries too, and exposure against held-out canaries "
        "counts only what singles out the inserted ones. The audit of the real members (normal labels): "
        f"{', '.join(sorted(set(outcomes)))} at every checkpoint.",
    ])
    publish(SECTION, text, args.no_write, argv)
    return 0


def _bits(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def _mean_of(row: dict, kind: str, copies: int, field: str) -> float:
    import json

    import numpy as np

    records = [r for r in json.loads(row["canary_records"]) if r["kind"] == kind and r["copies"] == copies]
    return float(np.mean([r[field] for r in records]))


if __name__ == "__main__":
    raise SystemExit(main())
