"""The leakage-utility frontier per model family: what a model owner trades when picking a fine-tuning setting.

    python3 benchmarks/frontier.py [--families pfn-mini tabicl-mini tabpfn-mini] [--task breast_cancer]
                                   [--lrs 1e-4,3e-4,1e-3,3e-3] [--checkpoints 1,5,10,25,50] [--seeds 0,1]
                                   [--q 50] [--context 64] [--no-write]

For each family (the shipped minis, ``benchmarks/minis.py``), true labels (label mode ``normal``: the fine-tuning
an owner actually does), every learning rate and seed is fine-tuned on the pure path a trial runs
(``trainables.finetune.Finetuner``) and each checkpoint of the schedule probed as a probe actor probes it
(``probes.probe.probe_checkpoint``). The report's own frontier (``orchestrator.report.frontier.frontier_table``)
then places every checkpoint by held-out accuracy (the non-members' in-context accuracy with C') against the
zero-information probe's TPR at 1% FPR, and marks the settings no other beats on both. Beside it, the
known-context channel's calibrated TPR at 1% FPR and AUC at each frontier point (the second channel a verdict is
read with; ``known_context_memorization_flag``), and the base model's accuracy, the zero point of utility.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, md_table, publish, set_threads  # noqa: E402
from minis import FAMILIES  # noqa: E402

SECTION = "Leakage-utility frontier per model family"


def probe_family(family: str, args: argparse.Namespace) -> pd.DataFrame:
    """One results row per checkpoint of every (lr, seed) run of ``family``, and the base model's row."""
    import torch

    from probes.calibration import model_digest
    from probes.manipulations import default_suite
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.data import PrepSettings, TaskSource, load_or_prepare
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    model, options = FAMILIES[family]
    base = build_model(model, **options)
    digest = model_digest(base)
    checkpoints = tuple(int(e) for e in args.checkpoints.split(","))
    settings = ProbeSettings(n_resamples=args.bootstrap, null_splits=0, n_checkpoints=len(checkpoints))
    cache = Path(tempfile.mkdtemp(prefix="frontier-"))
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        task = load_or_prepare(TaskSource(args.task, "builtin"), base.prep_settings(PrepSettings(context_size=args.context)),
                               "normal", seed, q=args.q, cache_dir=cache / "prepared")
        plan = ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed,
                               compress_rows=base.supports_context_weights)
        for lr in (float(v) for v in args.lrs.split(",")):
            started = time.perf_counter()
            torch.manual_seed(seed)
            ft = Finetuner(FinetuneSpec(model=model, model_options=dict(options), lr=lr, epochs=max(checkpoints),
                                        seed=seed), [task])
            identity = {"run_id": f"{family}-lr{lr:g}-s{seed}", "task": args.task, "model": family,
                        "regime": "single_fixed", "lr": lr, "q": args.q, "label_mode": "normal", "seed": seed}
            if not rows:
                rows.append({**probe_checkpoint(base, task, plan, cache / "reference", digest, base, settings,
                                                {**identity, "run_id": f"{family}-base"}, 0).row})
            while ft.epoch < max(checkpoints):
                ft.run_epoch()
                if ft.epoch in checkpoints:
                    rows.append(probe_checkpoint(ft.model, task, plan, cache / "reference", digest, base, settings,
                                                 identity, ft.epoch).row)
            print(f"  {identity['run_id']}: {len(checkpoints)} checkpoints in {time.perf_counter() - started:.0f} s",
                  flush=True)
    return pd.DataFrame(rows)


def family_text(family: str, results: pd.DataFrame) -> str:
    from orchestrator.report.frontier import frontier_table

    table = frontier_table(results)
    known = results.set_index(["run_id", "epoch"])
    base = results[results["sanity_check"].astype(bool)]
    base_accuracy = float(base["nonmember_icl_accuracy"].iloc[0]) if len(base) else float("nan")
    fine = results[~results["sanity_check"].astype(bool)]
    collapsed = int((fine["outcome"] == "collapse").sum())
    rows = []
    for r in table[table["on_frontier"]].itertuples():
        k = known.loc[(r.run_id, r.epoch)]
        rows.append([f"{r.lr:g}", int(r.epoch), fmt(r.heldout_accuracy), fmt(r.leakage_tpr_at_1pct),
                     r.strongest_attack, fmt(k["tpr_at_1pct"]),
                     k["outcome"], fmt(k["auc"]), fmt(k["known_context_calibrated_tpr_at_1pct"]),
                     fmt(k["known_context_calibrated_auc"]),
                     "yes" if k["known_context_memorization_flag"] else "no", int(k["seed"])])
    best = table.sort_values("heldout_accuracy", ascending=False).iloc[0] if len(table) else None
    lines = [f"**{family}**: {len(fine)} fine-tuned checkpoints ({collapsed} collapsed, left out), "
             f"{int(table['on_frontier'].sum()) if len(table) else 0} on the frontier; the base model's held-out "
             f"accuracy {fmt(base_accuracy)}"
             + (f", the best checkpoint's {fmt(best['heldout_accuracy'])} (lr {best['lr']:g}, epoch "
                f"{int(best['epoch'])}, leakage TPR@1% {fmt(best['leakage_tpr_at_1pct'])}, "
                f"{best['strongest_attack']})" if best is not None else "")
             + ".", "",
             md_table(["lr", "epoch", "held-out accuracy", "leakage TPR@1%", "strongest attack", "probe TPR@1%",
                       "outcome", "calibrated AUC",
                       "known-context calibrated TPR@1%", "known-context calibrated AUC", "known-context flag",
                       "seed"], rows)]
    probe_only = frontier_table(results.drop(columns=[c for c in results.columns
                                                      if c.startswith(("known_context_", "deployed_known_context_"))
                                                      and c.endswith("tpr_at_1pct")]))
    lines += ["", f"By the probe's TPR alone the frontier would hold {int(probe_only['on_frontier'].sum())} "
              f"checkpoints, their highest leakage read as {fmt(probe_only.loc[probe_only['on_frontier'], 'leakage_tpr_at_1pct'].max())}"
              f" where the known-context attack reads up to {fmt(fine['known_context_calibrated_tpr_at_1pct'].max())}."]
    flagged = fine[fine["known_context_memorization_flag"].astype(bool)]
    verdicts = fine[fine["outcome"] == "memorization"]
    lines += ["", f"Memorization verdicts on true labels: {len(verdicts)} of {len(fine)} checkpoints; known-context "
              f"flags: {len(flagged)} of {len(fine)}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--task", default="breast_cancer")
    parser.add_argument("--lrs", default="1e-4,3e-4,1e-3,3e-3")
    parser.add_argument("--checkpoints", default="1,5,10,25,50")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--q", type=int, default=50)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    set_threads(1)
    started = time.perf_counter()
    parts = [f"Task {args.task}, true labels, Q {args.q}, |C'| {args.context}, single_fixed, iclmem's loop; "
             f"lr {args.lrs}; checkpoints {args.checkpoints}; seeds {args.seeds}; bootstrap {args.bootstrap}. "
             "Frontier: the report's (`frontier_table`): held-out accuracy (non-members, C' as context) against "
             "leakage, the highest TPR at 1% FPR over the zero-information probe and the known-context attack "
             "(base-calibrated), collapsed checkpoints left out; one table row per frontier point, with each "
             "channel beside it. Beside each table: the frontier by the probe's TPR alone."]
    for family in args.families:
        print(f"{family}:", flush=True)
        parts.append(family_text(family, probe_family(family, args)))
    parts.append(f"{(time.perf_counter() - started) / 60:.1f} min on this machine, one torch thread.")
    text = "\n\n".join(parts)
    print(text, flush=True)
    publish(SECTION, text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
