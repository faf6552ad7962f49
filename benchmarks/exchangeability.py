"""Exchangeable members and non-members (#29): the blind baseline, the no-membership control and the planted
power, under the label-matched design (the default) and the paper's unmatched one.

    python3 benchmarks/exchangeability.py [--seeds 0,1,2] [--no-write]

Three tables, all through the real Stage I, fine-tuning and probe code, pfn-mini (shipped weights), one
torch thread:

* **Blind baseline.** Per built-in task and design, the members-vs-non-members AUC of a logistic regression
  fitted on C' alone (``trainables/data/blind.py``), ``shuffled_members``, over the seeds.
* **No-membership control.** Models that never saw the audited rows (``no_membership_check``: fine-tuned
  on 100 other rows with true or flipped labels, or the shipped weights plus noise), breast_cancer Q = 50,
  |C'| = 64, audited in every label mode: the calibrated AUC range, the verdicts and the largest ε lower
  bound. Matched must read no membership; unmatched is the witness that the control can fail.
* **Planted power.** Label-shuffled members fine-tuned to zero training loss (lr 3e-3), the planted
  check's four-manipulation suite, 200 bootstrap resamples, no null splits: runs called memorization of
  N, and the AUC range, under both designs, on iris (Q 30, |C'| 60, 200 epochs), breast_cancer (Q 50, |C'|
  128, 30 epochs at lr 1e-3, the quickstart's recipe) and digits (Q 100, |C'| 100, 60 epochs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, md_table, publish, set_threads  # noqa: E402

SECTION = "Exchangeability: blind baseline, no-membership control and planted power"
DESIGNS = ("matched", "unmatched")
PLANTED = (("iris", 30, 60, 3e-3, 200), ("breast_cancer", 50, 128, 1e-3, 30), ("digits", 100, 100, 3e-3, 60))
BLIND_TASKS = (("iris", 30), ("wine", 30), ("breast_cancer", 50), ("digits", 100))


def blind_table(seeds: list[int]) -> str:
    from trainables.data import PrepSettings, TaskSource, prepare_task

    rows = []
    for name, q in BLIND_TASKS:
        for design in DESIGNS:
            reports = [prepare_task(TaskSource(name, "builtin"), PrepSettings(context_size=60, label_design=design),
                                    "shuffled_members", seed=s, q=q).split_report for s in seeds]
            aucs = [r.blind_auc for r in reports]
            separable = sum(not (r.blind_auc_low <= 0.5 <= r.blind_auc_high) for r in reports)
            rows.append([name, q, design, f"{fmt(min(aucs))}–{fmt(max(aucs))}", f"{separable} of {len(reports)}",
                         sum(r.blind_redraws for r in reports)])
    return md_table(["task", "Q", "design", "blind AUC", "separable", "draws refused"], rows)


def control_table(seeds: list[int]) -> str:
    from orchestrator.audits.selfcheck import NoMembershipControl, no_membership_check

    rows = []
    for design, modes in (("matched", ("normal", "shuffled_members", "shuffled_all")), ("unmatched", ("shuffled_members",))):
        for control in NoMembershipControl:
            for mode in modes:
                out = [no_membership_check(control, mode, label_design=design, seed=s) for s in seeds]
                aucs = [min(r["auc_loss"], r["auc_entropy"]) for r in out] + [max(r["auc_loss"], r["auc_entropy"]) for r in out]
                eps = max(max(r[f"calibrated_{k}_epsilon_lb"] for k in ("loss", "entropy", "confidence")) for r in out)
                verdicts = ", ".join(sorted({r["outcome"] for r in out}))
                rows.append([design, control.value, mode, f"{fmt(min(aucs))}–{fmt(max(aucs))}", verdicts, fmt(eps, 2)])
    return md_table(["design", "model (never saw the audited rows)", "label mode", "calibrated AUC (loss, entropy)",
                     "verdicts", "max ε_lb"], rows)


def planted_table(seeds: list[int]) -> str:
    import torch

    from orchestrator.audits.selfcheck import PLANTED_SUITE
    from probes.calibration import model_digest
    from probes.manipulations import suite_from_spec
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.data import PrepSettings, TaskSource, prepare_task
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    base = build_model("pfn-mini", weights="shipped")
    rows = []
    for name, q, context, lr, epochs in PLANTED:
        for design in DESIGNS:
            found, aucs, blind = 0, [], []
            for seed in seeds:
                torch.manual_seed(seed)
                task = prepare_task(TaskSource(name, "builtin"), PrepSettings(context_size=context, label_design=design),
                                    "shuffled_members", seed=seed, q=q)
                ft = Finetuner(FinetuneSpec(model="pfn-mini", model_options={"weights": "shipped"}, lr=lr,
                                            epochs=epochs, seed=seed), [task])
                ft.train()
                plan = ProbePlan.build(ProbeQueries.from_task(task), suite_from_spec(list(PLANTED_SUITE)), task.seed,
                                       compress_rows=base.supports_context_weights)
                with tempfile.TemporaryDirectory() as cache:
                    row = probe_checkpoint(ft.model, task, plan, cache, model_digest(base), base,
                                           ProbeSettings(n_resamples=200, null_splits=0), {"run_id": "planted"},
                                           epoch=epochs).row
                found += row["outcome"] == "memorization"
                aucs.append(row["auc"])
                blind.append(row["blind_auc"])
            rows.append([name, q, f"{lr:g} × {epochs}", design, f"{found} of {len(seeds)}",
                         f"{fmt(min(aucs))}–{fmt(max(aucs))}", f"{fmt(min(blind))}–{fmt(max(blind))}"])
    return md_table(["task", "Q", "lr × epochs", "design", "memorization", "calibrated AUC", "blind AUC"], rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    set_threads(1)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    blind = blind_table(seeds)
    control = control_table(seeds)
    planted = planted_table(seeds)
    text = (f"Seeds {', '.join(map(str, seeds))}; one torch thread; {time.perf_counter() - start:.0f} s in all.\n\n"
            "**Blind baseline** (`shuffled_members`, |C'| = 60): members vs non-members scored by a logistic "
            "regression fitted on C' alone. The unmatched design is separable before any training; the matched "
            "one sits at chance (a draw whose interval excludes 0.5 is redrawn: `draws refused`).\n\n"
            f"{blind}\n\n"
            "**No-membership control** (breast_cancer, Q = 50, |C'| = 64): models that never saw the audited "
            "rows, audited as if fine-tuned on the members. Matched: no membership verdict in any label mode "
            "(collapse is the flipped-label model's loss exploding on the true task). Unmatched: the same "
            "models read as inversion or as a strong membership signal with a positive ε bound.\n\n"
            f"{control}\n\n"
            "**Planted power** (label-shuffled members, the planted check's suite, 200 resamples): runs called "
            "memorization under each design. The matched design's cost is in the tail: on a binary task "
            "about half the permuted labels stay right, a model that unlearned the task gives the non-members "
            "whose permuted label is wrong a member-like ΔS, so TPR@10% (which the rule reads) drops while the "
            "AUC stays above 0.5; on 3+ classes the power is kept.\n\n"
            f"{planted}\n")
    publish(SECTION, text, args.no_write, argv)


if __name__ == "__main__":
    main()
