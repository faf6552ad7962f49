"""DP-SGD fine-tuning: step time against plain fine-tuning, and utility and verdict against ε.

    python3 benchmarks/dp.py [--carte ../shared/data/carte] [--task wine_vivino_price] [--q 30]
                             [--context 30] [--epochs 100] [--epsilons 1,4,16] [--rounds 15] [--no-write]

One CARTE table (skipped, with a message and nothing written, when ``--carte`` does not hold it), pfn-mini
(shipped weights), ``single_fixed``, lr 1e-3, one torch thread, two label modes: label-shuffled members
(the planted ground truth: only memorization can teach the model those labels, so the verdict column is
the one to read) and normal labels (what fine-tuning is for: the utility columns are the ones to read).

* **Step time.** The same batch (C' and the Q member rows) stepped by ``Finetuner.step`` without DP and by
  ``Finetuner.dp_step`` (per-query-row gradients by ``torch.func.vmap``, clipping, noise), alternating
  (plain, DP, DP, plain, ...) for ``--rounds`` rounds in this one process after a warm-up; the ratio of the
  medians is the figure (the machine is shared, absolute times are not).
* **Utility and verdict against ε.** One run per target ε (and one without DP) for ``--epochs`` epochs, the
  noise calibrated by Opacus's RDP accountant for those epochs (δ = 1e-5, clipping norm 1). The last
  checkpoint is probed as a probe actor would (``probes.probe.probe_checkpoint``, the planted check's
  four-manipulation suite, 200 bootstrap resamples, no null splits): verdict, calibrated AUC, ε lower bound
  (maximum over the three calibrated score kinds, δ = 1e-5) against the accountant's ε; utility is the
  in-context accuracy with C' on members (their shuffled training labels) and non-members.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, fmt, md_table, median, publish, set_threads  # noqa: E402

SECTION = "DP-SGD fine-tuning: step time, utility and verdict against ε"
KINDS = ("loss", "entropy", "confidence")


def prepare(args: argparse.Namespace, label_mode: str):
    from trainables.data import PrepSettings, TaskSource, load_or_prepare

    source = TaskSource(args.task, "carte", args.carte)
    cache = Path(tempfile.gettempdir()) / "iclmem-bench-dp-cache"
    return load_or_prepare(source, PrepSettings(context_size=args.context), label_mode, seed=0, q=args.q,
                           cache_dir=cache)


def step_times(task, args: argparse.Namespace) -> dict[str, float]:
    from _common import interleave

    from trainables.dp import DPSettings
    from trainables.finetune import Finetuner, FinetuneSpec

    plain = Finetuner(FinetuneSpec(model="pfn-mini", lr=1e-3, epochs=args.epochs), [task])
    dp = Finetuner(FinetuneSpec(model="pfn-mini", lr=1e-3, epochs=args.epochs,
                                dp=DPSettings.calibrate(1.0, 1e-5, 1.0, args.epochs)), [task])
    batch_plain, batch_dp = plain.batches(1)[0], dp.batches(1)[0]
    for _ in range(2):  # warm-up: vmap's first call traces the model
        plain.step(batch_plain)
        dp.step(batch_dp)
    times = interleave({"plain": lambda: plain.step(batch_plain), "dp": lambda: dp.step(batch_dp)}, args.rounds)
    return {"plain": median(times["plain"]), "dp": median(times["dp"])}


def run(task, eps: float | None, args: argparse.Namespace) -> dict:
    from orchestrator.audits.selfcheck import PLANTED_SUITE
    from probes.calibration import model_digest
    from probes.manipulations import suite_from_spec
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.dp import DPSettings
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    dp = None if eps is None else DPSettings.calibrate(eps, 1e-5, 1.0, args.epochs)
    start = time.perf_counter()
    ft = Finetuner(FinetuneSpec(model="pfn-mini", lr=1e-3, epochs=args.epochs, seed=0, dp=dp), [task])
    ft.train()
    train_s = time.perf_counter() - start
    utility = ft.evaluate()
    base = build_model("pfn-mini")
    plan = ProbePlan.build(ProbeQueries.from_task(task), suite_from_spec(list(PLANTED_SUITE)), task.seed,
                           compress_rows=base.supports_context_weights)
    with tempfile.TemporaryDirectory() as cache:
        row = probe_checkpoint(ft.model, task, plan, cache, model_digest(base), base,
                               ProbeSettings(n_resamples=200, null_splits=0), {"run_id": f"dp-{eps}"},
                               epoch=args.epochs).row
    record = ft.dp_record()
    lb = max(row[f"calibrated_{k}_epsilon_lb"] for k in KINDS)
    replace_one = None if dp is None else dp.epsilon_replace_one_at(args.epochs)
    return {"label_mode": task.label_mode.value, "eps": eps, "accountant": None if record is None else record["epsilon"],
            "replace_one": replace_one, "blind": row["blind_auc"],
            "sigma": None if record is None else record["noise_multiplier"], "outcome": row["outcome"],
            "auc": row["auc"], "auc_low": row["auc_low"], "auc_high": row["auc_high"], "lb": lb, "train_s": train_s,
            **utility}


def main(argv: list[str] | None = None) -> int:
    import warnings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--carte", default=str(REPO.parent / "shared" / "data" / "carte"))
    ap.add_argument("--task", default="wine_vivino_price")
    ap.add_argument("--q", type=int, default=30)
    ap.add_argument("--context", type=int, default=30)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--epsilons", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if not Path(args.carte, f"{args.task}.parquet").is_file():
        print(f"skipped: no CARTE table {args.task!r} under {args.carte} (the shared data folder is absent); "
              "nothing written", file=sys.stderr)
        return 0
    warnings.filterwarnings("ignore", category=UserWarning)  # coarse TPR@1% at this Q: not what is measured
    set_threads(1)
    tasks = [prepare(args, mode) for mode in ("shuffled_members", "normal")]
    task = tasks[0]
    times = step_times(task, args)
    runs = [run(t, eps, args) for t in tasks for eps in [*(float(e) for e in args.epsilons.split(",")), None]]

    ratio = times["dp"] / times["plain"]
    lines = [
        f"CARTE `{args.task}` ({task.n_classes} classes, {task.n_features} features after preparation), "
        f"pfn-mini (shipped weights), single_fixed, Q = {args.q}, |C'| = {args.context}, "
        f"lr 1e-3, {args.epochs} epochs, one torch thread; DP-SGD: per-query-row clipping norm 1, δ = 1e-5, "
        "Opacus RDP accountant, sample rate 1 (every member row is a query at every step).",
        "",
        f"**Step time** (same batch, plain and DP steps alternating, {args.rounds} rounds, medians): plain "
        f"{fmt(times['plain'] * 1e3, 1)} ms, DP-SGD {fmt(times['dp'] * 1e3, 1)} ms: **DP-SGD costs {ratio:.1f}x** "
        f"a plain step. Each query row is run alone with C' (so its gradient is its whole contribution), which "
        f"is Q forwards of |C'| + 1 tokens instead of one of |C'| + Q.",
        "",
        "**Utility and verdict against ε** (last checkpoint; ε_lb = maximum over the calibrated loss, entropy and "
        "confidence attacks, Clopper-Pearson 95%, δ = 1e-5). Label-matched non-members (the default design); the "
        "audit's game is replace-one, so ε_lb is held against the accountant's replace-one ε (the same noise at "
        "twice the sensitivity); the last rows are the no-membership control (the shipped weights plus noise, "
        "never trained on the split) audited the same way:",
        "",
    ]
    rows = []
    for r in runs:
        target = "∞ (no DP)" if r["eps"] is None else f"{r['eps']:g}"
        acc = "–" if r["accountant"] is None else fmt(r["accountant"], 3)
        sigma = "–" if r["sigma"] is None else fmt(r["sigma"], 2)
        replace = "–" if r["replace_one"] is None else fmt(r["replace_one"], 3)
        consistent = "–" if r["replace_one"] is None else ("yes" if r["lb"] <= r["replace_one"] + 1e-9 else "**NO**")
        rows.append([r["label_mode"], target, sigma, acc, replace, r["outcome"],
                     f"{r['auc']:.3f} [{r['auc_low']:.2f}, {r['auc_high']:.2f}]", fmt(r["lb"], 3), consistent,
                     fmt(r["blind"], 3), fmt(r["member_icl_accuracy"], 3), fmt(r["nonmember_icl_accuracy"], 3),
                     fmt(r["train_s"], 0)])
    from orchestrator.audits.selfcheck import NoMembershipControl, no_membership_check

    for t in tasks:  # the no-membership control on the same split: the shipped weights plus noise
        c = no_membership_check(NoMembershipControl.NOISED, t.label_mode, prepared=t)
        c_lb = max(c[f"calibrated_{k}_epsilon_lb"] for k in KINDS)
        rows.append([t.label_mode.value, "control: never saw the rows", "–", "–", "–", c["outcome"],
                     f"{c['auc']:.3f} [{c['auc_low']:.2f}, {c['auc_high']:.2f}]", fmt(c_lb, 3), "–",
                     fmt(c["blind_auc"], 3), fmt(c["member_icl_accuracy"], 3), fmt(c["nonmember_icl_accuracy"], 3), "–"])
    lines.append(md_table(["member labels", "target ε", "noise σ", "accountant ε (add/remove)", "replace-one ε",
                           "verdict", "calibrated AUC [95%]", "ε_lb", "ε_lb ≤ replace-one ε", "blind AUC",
                           "member acc.", "non-member acc.", "train s"], rows))
    no_dp = next(r for r in runs if r["eps"] is None and r["label_mode"] == "shuffled_members")
    cap = math.log(0.025 ** (1 / args.q) / (1 - 0.025 ** (1 / args.q)))
    lines += ["", f"Shuffled member labels without DP: member accuracy {no_dp['member_icl_accuracy']:.2f} on labels the "
              f"model could only memorize, verdict {no_dp['outcome']}, ε_lb {no_dp['lb']:.2f} (what this probe proves "
              f"at Q = {args.q}; even a perfect attack is capped near {cap:.2f} by the row count). Member accuracy is "
              "on the labels each run trained on (shuffled ones in the first block), non-member accuracy on the labels "
              "they are probed with (permuted among themselves in the first block); 'train s' includes the per-epoch "
              "evaluation."]
    publish(SECTION, "\n".join(lines), args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
