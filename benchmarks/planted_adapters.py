"""Planted ground truth through each real adapter: is label-shuffled memorization found?

    python3 benchmarks/planted_adapters.py [--models tabpfn-v2 contexttab tabicl] [--no-write]

Each model is built tiny and randomly initialised from its own architecture (the sizes of
``tests/test_adapter_contract.py``), fine-tuned on iris with shuffled member labels at the learning rate and
epochs ``tests/test_planted_adapters.py`` asserts with (lr 1e-3; 3e-3 for TabICL's tiny instance), and its
last checkpoint probed against the untouched model (``orchestrator.audits.selfcheck.planted_check``, the pure path
the sweep's actors run). For a model that normalises over its context (TabPFN v2) the same checkpoint is
also probed without the fine-tuning context's feature statistics: the query's features then vanish from
every zero-information context, and nothing can be found.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _common import fmt, md_table, publish, set_threads  # noqa: E402
from test_planted_adapters import EPOCHS, LEARNING_RATES  # noqa: E402  (the settings the test asserts on)

SECTION = "Planted ground truth through each real adapter"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(EPOCHS))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    set_threads(1)
    from test_adapter_contract import CLASSIFIERS

    from orchestrator.audits.selfcheck import planted_check
    from trainables.models.extras import extra_is_installed

    rows = []
    for name in args.models:
        if not extra_is_installed(name):
            rows.append([name, "-", "-", "not installed", "", "", "", ""])
            continue
        variants = [("with C' statistics", True), ("without", False)] if name == "tabpfn-v2" else [("", True)]
        for label, reference in variants:
            start = time.perf_counter()
            row = planted_check(name, CLASSIFIERS[name], lr=LEARNING_RATES[name], epochs=EPOCHS[name],
                                reference_statistics=reference)
            rows.append([name + (f" ({label})" if label else ""), f"{LEARNING_RATES[name]:g}", EPOCHS[name],
                         row["outcome"], row["score_kind"],
                         f"{fmt(row['auc'])} [{fmt(row['auc_low'])}, {fmt(row['auc_high'])}]",
                         "yes" if row["auc_low"] > 0.5 else "no", f"{time.perf_counter() - start:.0f} s"])
    text = "\n".join([
        "Tiny random-init models, iris, Q=30 label-shuffled members, C' of 60 rows, suite base / "
        "skew_true_x2 / position_first / combo2_random_distractors_1, 200 bootstrap resamples, 1 thread.",
        "",
        md_table(["model", "lr", "epochs", "outcome", "kind", "calibrated AUC [95%]", "interval above 0.5", "time"],
                 rows, align="lrrllrll"),
    ])
    publish(SECTION, text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
