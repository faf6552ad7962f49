"""The deployed-context audit of each shipped mini through three paths, on the same split and seeds:

* the raw network (``--model``, and a sweep's ``regime: context`` with recipe iclmem): iclmem drives the
  architecture below the package's classifier, on the rows Stage I prepares under the model's input contract;
* the package's classifier on the same rows (a sweep's ``regime: context`` with ``recipe: upstream``): one fit of
  ``TabICLClassifier`` / ``TabPFNClassifier`` per context on the adapter's weights, with the recipe's ensemble
  (``n_estimators``: 8 for TabICL, 2 for TabPFN, the packages' fine-tuners' defaults) and the package's
  preprocessing;
* the package's classifier at its own defaults through ``--estimator`` (``trainables.models.deployed``), on the
  rows Stage I prepares for any estimator (whitened PCA to 16 components when the table is wider).

    python3 benchmarks/deployed_minis.py [--task breast_cancer] [--context-size 128] [--references 16]
                                         [--bootstrap 200] [--no-write]

Per family and path: each attack's AUC and TPR at 1% FPR (Clopper-Pearson lower bound) on the deployed
context, the highest TPR at 1% any attack reaches on the never-in-context control, the verdict, whether it is
trusted, and the cost of one reference context. One torch thread.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, md_table, publish, set_threads  # noqa: E402

SECTION = "Deployed-context audit of the minis: raw network against the package's classifier"
FAMILIES = {"tabicl-mini": ("tabicl", "trainables.models.deployed:tabicl_mini_classifier"),
            "tabpfn-mini": ("tabpfn-v2", "trainables.models.deployed:tabpfn_mini_classifier")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="breast_cancer")
    parser.add_argument("--context-size", type=int, default=128)
    parser.add_argument("--references", type=int, default=16)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    from iclmem.vocab import ContextAttack, ContextTarget
    from orchestrator.audits.audit import parse_task
    from orchestrator.audits.context_audit import prepare_context_audit
    from probes.attacks.context import evaluate_context_audit, score_references
    from trainables.models import build_model
    from trainables.models.estimator import load_estimator_factory

    warnings.simplefilter("ignore")
    set_threads(1)
    source = parse_task(args.task)
    attacks = list(ContextAttack)
    rows = []
    for family in args.families:
        model, spec = FAMILIES[family]
        for path, kwargs in (("raw network (--model; regime context)", {"adapter": build_model(model, weights="mini")}),
                             ("package classifier, same rows (regime context, recipe upstream)",
                              {"adapter": build_model(model, weights="mini", recipe="upstream"), "deployed": True}),
                             ("package classifier, its defaults (--estimator)",
                              {"factory": load_estimator_factory(spec), "estimator": spec})):
            audit = prepare_context_audit(source, args.task, args.context_size, 0, note=lambda _m: None, **kwargs)
            refs = score_references(audit.scorer, audit.inputs, args.references, 0)
            result = evaluate_context_audit(audit.scorer, audit.inputs, n_references=args.references, seed=0,
                                            n_resamples=args.bootstrap, null_splits=0, references=refs)
            cells = []
            for attack in attacks:
                r = result.row(ContextTarget.DEPLOYED, attack)
                cells.append(f"{fmt(r['auc'])} / {fmt(r['tpr_at_1pct'], 3)} (≥{fmt(r['tpr_at_1pct_low'], 3)})")
            control = max(r["tpr_at_1pct"] for r in result.rows_of(ContextTarget.CONTROL))
            rows.append([family, path, *cells, fmt(control, 3), result.verdict.outcome.value,
                         "yes" if result.verdict.trusted else "no", result.verdict.strongest.value,
                         f"{refs.seconds_per_reference:.2f}"])
            print(rows[-1], flush=True)
    n = args.context_size
    text = (f"`{args.task}`, deployed context N = {n} rows, {n} label-matched non-members, a control context of "
            f"{n} rows outside both; K = {args.references} reference contexts; bootstrap {args.bootstrap}; seed 0. "
            "Each attack cell: AUC / TPR at 1% FPR (Clopper-Pearson 95% lower bound) on the deployed context. "
            "Every path loads the same shipped file; the package classifier adds its preprocessing and its "
            "ensemble of feature and class permutations; the first two paths score the same prepared rows.\n\n"
            + md_table(["family", "path", *[a.value for a in attacks], "control: max TPR@1%", "verdict", "trusted",
                        "strongest", "s / reference context"], rows) + "\n")
    publish(SECTION, text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
