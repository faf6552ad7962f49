"""The deployed-context audit on pfn-mini across K reference contexts: TPR at 1% and 0.1% FPR of each attack,
the never-in-context control, and the wall time of one reference context.

    python3 benchmarks/context_audit.py [--task digits] [--context-size 256] [--max-references 256]
                                        [--forest] [--family pfn-mini] [--no-write]

The audit of ``iclmem audit-context TASK --model pfn-mini`` (orchestrator.audits.context_audit.prepare_context_audit:
N label-matched members and non-members, the control from the rows left). P is scored once under
``--max-references`` reference contexts; the audit with K references is the first K of them, exactly the
set ``--references K`` draws (reference k's context does not depend on K). For each K the attacks' TPR at 1%
and 0.1% FPR (with Clopper-Pearson lower bounds) on the deployed context and the highest TPR at 1% any attack
reaches on the control. The wall time per reference is the mean over all of them (one forward pass of the 2N
rows against an N-row context). ``--forest`` adds the same audit of a scikit-learn random forest (the
``--estimator`` path: one fit and one predict_proba per context) for its cost per reference.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, md_table, publish  # noqa: E402
from minis import FAMILIES  # noqa: E402  (the shipped models: family -> registered adapter, options)

SECTION = "Deployed-context audit: TPR against K reference contexts, and the cost of one"
KS = (2, 4, 8, 16, 32, 64, 128, 256)


def forest():
    from sklearn.ensemble import RandomForestClassifier

    return RandomForestClassifier(n_estimators=100, random_state=0, n_jobs=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="digits")
    parser.add_argument("--context-size", type=int, default=256)
    parser.add_argument("--max-references", type=int, default=256)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--forest", action="store_true")
    parser.add_argument("--family", default="pfn-mini", choices=list(FAMILIES),
                        help="the shipped model audited (benchmarks/minis.py's families); a section of its own for "
                             "each but pfn-mini")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    model, options = FAMILIES[args.family]

    from iclmem.vocab import ContextAttack, ContextTarget
    from orchestrator.audits.audit import parse_task
    from orchestrator.audits.context_audit import prepare_context_audit
    from probes.attacks.context import evaluate_context_audit, score_references
    from trainables.models import build_model

    warnings.simplefilter("ignore")
    source = parse_task(args.task)
    audit = prepare_context_audit(source, args.task, args.context_size, 0, adapter=build_model(model, **options),
                                  note=lambda _m: None)
    refs = score_references(audit.scorer, audit.inputs, args.max_references, 0)
    rows = []
    attacks = list(ContextAttack)
    for k in (k for k in KS if k <= args.max_references):
        result = evaluate_context_audit(audit.scorer, audit.inputs, n_references=k, seed=0,
                                        n_resamples=args.bootstrap, null_splits=0, references=refs.first(k))
        cells = []
        for attack in attacks:
            r = result.row(ContextTarget.DEPLOYED, attack)
            cells.append(f"{fmt(r['tpr_at_1pct'], 3)} (≥{fmt(r['tpr_at_1pct_low'], 3)}) / {fmt(r['tpr_at_0_1pct'], 3)}")
        control = max(r["tpr_at_1pct"] for r in result.rows_of(ContextTarget.CONTROL))
        rows.append([str(k), *cells, fmt(control, 3), result.verdict.outcome.value,
                     "yes" if result.verdict.trusted else "no"])
    n = args.context_size
    text = (f"`{args.task}`, {args.family} (shipped weights), deployed context N = {n} rows, {n} label-matched "
            f"non-members, control context of {n} rows outside both; bootstrap {args.bootstrap}. Each cell: TPR at 1% "
            "FPR (Clopper-Pearson 95% lower bound) / TPR at 0.1% FPR on the deployed context. With "
            f"{n} non-members, 0.1% FPR allows no false positive: that column is a zero-false-positive TPR.\n\n"
            + md_table(["K", *[a.value for a in attacks], "control: max TPR@1%", "verdict", "trusted"], rows)
            + f"\n\nOne reference context costs {fmt(refs.seconds_per_reference * 1000, 1)} ms here ({args.family}, one "
              f"forward pass of {2 * n} rows against {n}; {args.max_references} references in "
              f"{fmt(refs.seconds, 1)} s in all).\n")
    if args.forest:
        from probes.attacks.scorers import EstimatorScorer

        fa = prepare_context_audit(source, args.task, n, 0, factory=forest, estimator="forest", note=lambda _m: None)
        fr = score_references(EstimatorScorer(forest, fa.prepared.n_classes), fa.inputs, 16, 0)
        result = evaluate_context_audit(fa.scorer, fa.inputs, n_references=16, seed=0, n_resamples=args.bootstrap,
                                        null_splits=0, references=fr)
        best = result.row(ContextTarget.DEPLOYED, result.verdict.strongest)
        text += (f"\nThe `--estimator` path on a scikit-learn random forest (100 trees, same split, K = 16): "
                 f"{fmt(fr.seconds_per_reference * 1000, 1)} ms per reference context (a fit and a predict_proba), "
                 f"ratio to pfn-mini's forward pass {fmt(fr.seconds_per_reference / refs.seconds_per_reference, 1)}; "
                 f"strongest attack {result.verdict.strongest.value}: TPR at 1% FPR {fmt(best['tpr_at_1pct'], 3)}, "
                 f"verdict {result.verdict.outcome.value}.\n")
    publish(SECTION if args.family == "pfn-mini" else f"{SECTION}: {args.family}", text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
