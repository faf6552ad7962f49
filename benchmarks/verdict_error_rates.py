"""How often each verdict rule calls a null split "memorization": the measured false-positive rate.

    python3 benchmarks/verdict_error_rates.py [--quick] [--seeds 3] [--null-splits 20] [--epochs 30]
                                              [--checkpoints 1,5,10,30] [--q 50] [--bootstrap 200]
                                              [--task digits] [--carte ../shared/data/carte] [--carte-task spotify]
                                              [--carte-null-splits 10] [--family pfn-mini] [--no-write]

For each task (the quickstart's ``digits`` and one CARTE table), label mode (normal and
shuffled_members) and seed, the shipped pfn-mini is fine-tuned as the quickstart does (single_fixed,
lr 1e-3, Q members, C' of ``--context`` rows) on the pure path (``trainables.finetune.Finetuner``, no Ray)
and every checkpoint of the schedule is probed by ``probes.probe.probe_checkpoint`` exactly as a probe
actor does: the real member split plus ``--null-splits`` null splits, each two disjoint sets of rows the
run never saw, labelled member / non-member with the members' label counts. Every memorization verdict on
a null split is a false positive by construction. Under shuffled_members the non-members and the null
splits' rows carry labels permuted among themselves (label-matched, the default design), so the null splits
test the same kind of labels as the real split; each task's blind baseline is printed beside its rates.

Reported per rule (paper, paper strict, selection_aware, selection_aware strict), at checkpoint level (one
trial per checkpoint x null split) and at run-headline level (one trial per run x null split: the
checkpoint with the highest calibrated AUC over epochs and competing kinds, as the report picks a run's
headline), the count, the rate and its 95% Clopper-Pearson interval (exact for independent trials; the
null splits of one checkpoint share its model and may share rows, so read it as approximate). Beside it,
the real split's run headlines: how many runs each rule calls memorization (shuffled member labels are the
planted memorization). Target: the default rule's run-headline false-positive rate at most 5%.

Beside them, the claims that bound does not cover (issue #43; ``orchestrator.report.task_claim_error_rates``),
measured on the same null splits: the task-level peak of Tab. 8 (the verdict at the highest calibrated AUC over
a task's runs, per label mode as the report splits it: one trial per label mode and null split index) and "some
run of the task says memorization", both maxima over the task's runs, and the task verdict that is controlled
(selection-aware memorization with a p-value below family_alpha / F, F = checkpoints x kinds over every run of
the task). "IclMem or any attack" needs reference fine-tunes (``probe.references``), which this benchmark does
not train; the report measures it on a sweep that has them (``orchestrator.report.any_attack_error_rates``).
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import fmt, md_table, publish, set_threads, verdict  # noqa: E402
from minis import FAMILIES  # noqa: E402  (the shipped models: family -> registered adapter, options)

SECTION = "Verdict error rates"

TARGET = 0.05
REPO = Path(__file__).resolve().parents[1]


def probe_runs(source, label_modes, seeds, args, log) -> pd.DataFrame:
    """Fine-tune and probe every (label mode, seed) run of one task; one results row per checkpoint."""
    import torch

    from probes.calibration import model_digest
    from probes.manipulations import default_suite
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.data import PrepSettings, load_or_prepare
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    checkpoints = tuple(int(e) for e in args.checkpoints.split(","))
    model, options = FAMILIES[args.family]
    base = build_model(model, **options)
    digest = model_digest(base)
    settings = ProbeSettings(n_resamples=args.bootstrap, null_splits=args.null_splits, n_checkpoints=len(checkpoints))
    cache = Path(tempfile.mkdtemp(prefix="verdict-error-rates-"))
    rows = []
    for label_mode in label_modes:
        for seed in seeds:
            started = time.perf_counter()
            task = load_or_prepare(source, base.prep_settings(PrepSettings(context_size=args.context)), label_mode,
                                   seed, q=args.q, cache_dir=cache / "prepared")
            torch.manual_seed(seed)
            ft = Finetuner(FinetuneSpec(model=model, model_options=dict(options), lr=args.lr,
                                        epochs=max(checkpoints), seed=seed), [task])
            plan = ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed,
                                   compress_rows=base.supports_context_weights)
            run_id = f"{source.name}-{label_mode}-s{seed}"
            identity = {"run_id": run_id, "task": source.name, "regime": "single_fixed", "lr": args.lr,
                        "q": args.q, "label_mode": label_mode, "seed": seed}
            while ft.epoch < max(checkpoints):
                ft.run_epoch()
                if ft.epoch in checkpoints:
                    rows.append(probe_checkpoint(ft.model, task, plan, cache / "reference", digest, base, settings,
                                                 identity, ft.epoch).row)
            log(f"  {run_id}: {len(checkpoints)} checkpoints x (real + {args.null_splits} null splits) "
                f"in {time.perf_counter() - started:.0f} s")
    return pd.DataFrame(rows)


def real_headlines(results: pd.DataFrame) -> pd.DataFrame:
    """Per label mode and rule: runs whose headline (peak checkpoint) is memorization, on the real split."""
    from iclmem.vocab import VerdictRule
    from orchestrator import report as R

    peaks = R.peak_checkpoints(results)
    out = []
    for mode, d in peaks.groupby("label_mode", sort=True):
        row = {"label_mode": mode, "runs": len(d)}
        for r in VerdictRule:
            row[r.value] = int((d[f"outcome_{r.value}"] == "memorization").sum())
        out.append(row)
    return pd.DataFrame(out)


def known_context_null_lines(results: pd.DataFrame) -> list[str]:
    """The known-context channel's own false-positive rate on the same null splits (``known_context_flag`` of
    each null record): per checkpoint, and per run (a null split index counts once when any checkpoint of the
    run flagged it: the flag's family spans the run's checkpoints)."""
    import json

    from iclmem.stats import clopper_pearson

    ft = results[results["epoch"] > 0]
    if "null_known_context_flags" not in ft.columns:
        return []
    records = [json.loads(v) for v in ft["null_evidence"]]
    checkpoint_trials = sum(len(r) for r in records)
    checkpoint_flags = int(ft["null_known_context_flags"].sum())
    runs = {}
    for run_id, recs in zip(ft["run_id"], records):
        for rec in recs:
            runs.setdefault((run_id, rec["index"]), []).append(bool(rec["known_context_flag"]))
    run_flags = sum(any(v) for v in runs.values())
    real = int(ft.groupby("run_id")["known_context_memorization_flag"].any().sum())
    rows = []
    for level, k, n in (("checkpoint", checkpoint_flags, checkpoint_trials), ("run", run_flags, len(runs))):
        iv = clopper_pearson(k, n)
        rows.append([level, n, k, fmt(k / n if n else float("nan")), f"{fmt(iv.low)}–{fmt(iv.high)}"])
    return ["Known-context flag (`known_context_memorization_flag`, the second channel) on the same null splits: "
            f"the real split flagged {real} of {ft['run_id'].nunique()} runs.", "",
            md_table(["level", "null trials", "flagged", "FPR", "95% interval"], rows), ""]


def markdown(per_task: dict[str, pd.DataFrame], args, seconds: float) -> str:
    from iclmem.vocab import VerdictRule
    from orchestrator import report as R

    checkpoints = args.checkpoints.split(",")
    lines = [
        f"{args.family} ({', '.join(f'{k}: {v}' for k, v in FAMILIES[args.family][1].items())}), single_fixed, lr {args.lr:g}, Q = {args.q}, C' = {args.context} rows, checkpoints at "
        f"epochs {', '.join(checkpoints)}; label modes normal and shuffled_members, seeds "
        f"{', '.join(map(str, range(args.seeds)))}; {args.null_splits} null splits per checkpoint "
        f"({args.carte_null_splits or args.null_splits} on the CARTE table); "
        f"bootstrap {args.bootstrap}. Pure path (Finetuner + probe_checkpoint, as a probe actor runs it). "
        f"{seconds / 60:.1f} min on this machine.",
        "",
        "A null split labels two disjoint sets of never-trained rows member / non-member (the members' label "
        "counts on both sides): every memorization verdict on it is a false positive. Checkpoint level: one "
        "trial per (checkpoint, null split). Run headline: one trial per (run, null split), the verdict at "
        "the checkpoint with the highest calibrated AUC over epochs and the competing kinds (loss, entropy), as "
        "the report picks a run's headline. Interval: 95% Clopper-Pearson (exact for independent trials; a "
        "checkpoint's null splits share its model and may share rows).",
        "",
    ]
    default = VerdictRule.SELECTION_AWARE.value
    for name, results in per_task.items():
        rates = R.null_error_rates(results)
        lines.append(f"**{name}** ({results['run_id'].nunique()} runs, {len(results)} checkpoints)")
        lines.append("")
        lines.append(md_table(
            ["rule", "level", "null splits", "memorization", "FPR", "95% interval"],
            [[r.rule + (" (default)" if r.rule == default else ""), r.level, r.n_null, r.n_memorization,
              fmt(r.fpr), f"{fmt(r.fpr_low)}–{fmt(r.fpr_high)}"] for r in rates.itertuples()]))
        head = rates[(rates["rule"] == default) & (rates["level"] == "run_headline")].iloc[0]
        lines.append("")
        lines.append(f"Default rule at run-headline level: {int(head.n_memorization)} of {int(head.n_null)} "
                     f"({fmt(head.fpr)}; interval {fmt(head.fpr_low)}–{fmt(head.fpr_high)}) — target ≤ "
                     f"{TARGET:.0%}: {verdict(head.fpr <= TARGET)}")
        lines.append("")
        lines += known_context_null_lines(results)
        ft = results[results["epoch"] > 0].drop_duplicates("run_id")
        if "blind_auc" in ft.columns:
            for mode, d in ft.groupby("label_mode", sort=True):
                lines.append(f"Blind baseline ({mode}, members vs non-members scored by a model fitted on C' alone): "
                             f"AUC {fmt(d['blind_auc'].min())}–{fmt(d['blind_auc'].max())} over {len(d)} runs; "
                             f"{int(d['blind_separable'].astype(bool).sum())} separable.")
            lines.append("")
        claims = R.task_claim_error_rates(results, regime=None, by=("label_mode",))
        lines.append("Claims beyond one run's headline (per label mode, one trial per null split index; a task "
                     f"peak is over {results.groupby('label_mode')['run_id'].nunique().max()} runs):")
        lines.append("")
        lines.append(md_table(
            ["rule", "claim", "covered by the 5% bound", "null trials", "memorization", "FPR", "95% interval"],
            [[r.rule + (" (default)" if r.rule == default else ""), r.claim, "yes" if r.covered else "no",
              r.n_null, r.n_memorization, fmt(r.fpr), f"{fmt(r.fpr_low)}–{fmt(r.fpr_high)}"]
             for r in claims.itertuples()]))
        lines.append("")
        # the controlled task verdict's price: does it still find the planted memorization on the real split?
        for r in R.task_verdicts(results, regime=None, by=("label_mode",)).itertuples():
            lines.append(f"Task verdict on the real split ({r.label_mode}; p-value bar {r.task_p_value_threshold:.2g} "
                         f"= family_alpha / {r.task_family_size}): {r.task_verdict}.")
        lines.append("")
        real = real_headlines(results)
        lines.append("Real member split, runs whose headline is memorization (shuffled member labels are planted "
                     "memorization):")
        lines.append("")
        lines.append(md_table(["label mode", "runs", *[r.value for r in VerdictRule]],
                              [[r["label_mode"], r["runs"], *[r[v.value] for v in VerdictRule]]
                               for _, r in real.iterrows()]))
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 seed, 3 null splits, 2 checkpoints: a smoke run")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--null-splits", type=int, default=20)
    ap.add_argument("--checkpoints", default="1,5,10,30")
    ap.add_argument("--q", type=int, default=50)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--bootstrap", type=int, default=200)
    ap.add_argument("--task", default="digits", help="the built-in table (the quickstart's)")
    ap.add_argument("--carte", default=str(REPO.parent / "shared" / "data" / "carte"))
    ap.add_argument("--carte-task", default="spotify")
    ap.add_argument("--carte-null-splits", type=int, default=None,
                    help="null splits per checkpoint on the CARTE table (default: --null-splits)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--family", default="pfn-mini", choices=list(FAMILIES),
                    help="the shipped model to fine-tune (benchmarks/minis.py's families); a section of its own "
                         "for each but pfn-mini")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.null_splits, args.checkpoints = 1, 3, "1,5"
    set_threads(args.threads)
    warnings.filterwarnings("ignore")

    from trainables.data import TaskSource

    tasks = [(f"quickstart: {args.task}", TaskSource(args.task, "builtin"), args.null_splits)]
    if Path(args.carte, f"{args.carte_task}.parquet").is_file():
        tasks.append((f"CARTE: {args.carte_task}", TaskSource(args.carte_task, "carte", args.carte),
                      args.carte_null_splits or args.null_splits))
    else:
        print(f"no CARTE table {args.carte_task} under {args.carte}; quickstart only", file=sys.stderr)
    started = time.perf_counter()
    per_task = {}
    for name, source, n_null in tasks:
        print(f"{name}:", flush=True)
        per_task[name] = probe_runs(source, ("normal", "shuffled_members"), range(args.seeds),
                                    argparse.Namespace(**{**vars(args), "null_splits": n_null}),
                                    lambda m: print(m, flush=True))
    section = SECTION if args.family == "pfn-mini" else f"{SECTION}: {args.family}"
    publish(section, markdown(per_task, args, time.perf_counter() - started), args.no_write, argv)


if __name__ == "__main__":
    main()
