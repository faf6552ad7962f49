"""Every validity figure per model family: pfn-mini (iclmem's own architecture), tabicl-mini (TabICL's) and
tabpfn-mini (TabPFN v2's), each pretrained here on the same synthetic prior (trainables/models/pretrain.py).

    python3 benchmarks/minis.py [--families pfn-mini tabicl-mini tabpfn-mini] [--seeds 0,1,2,3,4]
                                [--parts accuracy planted control] [--carte-dir ../shared/data/carte] [--no-write]

One section per family in RESULTS.md, all through the code a sweep runs (the adapters' loaders on the shipped
files, Stage I under each model's own input contract, iclmem's fine-tuner and probe), one torch thread:

* **In-context accuracy.** scikit-learn tables (breast_cancer, wine, iris) exactly as the pretraining record
  evaluates them (``trainables.models.pretrain.evaluate``: standardised, 16 PCA components at most, 50/50
  stratified splits over the seeds): the raw network as iclmem drives it, the package's own classifier on the
  shipped file (its preprocessing and ensemble), and logistic regression on the same rows. CARTE tables (when
  ``--carte-dir`` holds them), prepared as a sweep prepares them for the model: the uniform-label context C'
  (256 rows) predicting the 2Q member and non-member rows.
* **Planted power.** Label-shuffled members on iris (Q 30, |C'| 60) fine-tuned at pfn-mini's recipe (lr 3e-3,
  200 epochs), probed with the planted check's four manipulations (``orchestrator.selfcheck.planted_check``):
  the verdict and the calibrated AUC with its interval per seed.
* **No-membership control.** Models that never saw the audited rows (``no_membership_check``: fine-tuned on
  100 other rows with true or flipped labels, or the shipped weights plus noise), breast_cancer Q 50, |C'| 64,
  in every label mode: the verdicts (none may read memorization) and the calibrated AUC.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, fmt, md_table, publish, set_threads  # noqa: E402

# family -> (registered adapter, options that load the shipped weights)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "pfn-mini": ("pfn-mini", {"weights": "shipped"}),
    "tabicl-mini": ("tabicl", {"weights": "mini"}),
    "tabpfn-mini": ("tabpfn-v2", {"weights": "mini"}),
}
PLANTED = {"task": "iris", "q": 30, "context_size": 60, "lr": 3e-3, "epochs": 200}
LABEL_MODES = ("normal", "shuffled_members", "shuffled_all")
CARTE_TABLES = ("spotify", "wine_dot_com_prices", "wine_vivino_price")
BAR = 0.9


def section(family: str) -> str:
    return f"Model family {family}: accuracy, planted power, no-membership control"


def _package_classifier(model: str, path: Path) -> Any:
    if model == "tabicl":
        from tabicl import TabICLClassifier

        return TabICLClassifier(model_path=str(path), allow_auto_download=False, device="cpu")
    from tabpfn import TabPFNClassifier

    return TabPFNClassifier(model_path=str(path), device="cpu")


def accuracy_table(family: str, seeds: list[int]) -> tuple[str, list[dict]]:
    from sklearn.linear_model import LogisticRegression

    from trainables.models import build_model
    from trainables.models.checkpoints import locate_weights
    from trainables.models.pretrain import evaluate, evaluate_classifier

    model, options = FAMILIES[family]
    adapter = build_model(model, **options)
    raw = evaluate(adapter, seeds)
    lr = evaluate_classifier(lambda: LogisticRegression(max_iter=5000), seeds)
    package = None
    if model != "pfn-mini":
        path = locate_weights(model, options)
        assert path is not None
        package = evaluate_classifier(lambda: _package_classifier(model, path), seeds)
    rows, out = [], []
    for table in raw:
        ratio = raw[table] / lr[table]
        out.append({"table": table, "raw": raw[table], "package": None if package is None else package[table],
                    "lr": lr[table], "ratio": ratio})
        rows.append([table, fmt(raw[table]), "–" if package is None else fmt(package[table]), fmt(lr[table]),
                     fmt(ratio), "yes" if ratio >= BAR else "no"])
    text = md_table(["table", "raw network", "package classifier", "logistic regression", "raw / LR",
                     f">= {BAR} x LR"], rows)
    return text, out


def carte_table(family: str, carte_dir: Path, seeds: list[int], q: int = 500, context: int = 256) -> str:
    import torch

    from trainables.data import PrepSettings, TaskSource, prepare_task
    from trainables.models import build_model
    from trainables.models.pretrain import icl_predict, logits_of

    model, options = FAMILIES[family]
    adapter = build_model(model, **options)
    rows = []
    for name in CARTE_TABLES:
        if not (carte_dir / f"{name}.parquet").is_file() and not (carte_dir / name).is_dir():
            continue
        acc, acc_lr, major, task = [], [], [], None
        for seed in seeds:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                task = prepare_task(TaskSource(name, "carte", str(carte_dir)),
                                    adapter.prep_settings(PrepSettings(context_size=context)), "normal",
                                    seed=seed, q=q)
            x, y = np.asarray(task.features, dtype=np.float32), np.asarray(task.labels)
            ctx, qry = np.asarray(task.context_idx), np.concatenate([task.member_idx, task.nonmember_idx])
            with torch.no_grad():
                pred = icl_predict(logits_of(adapter), x[ctx], y[ctx], x[qry], task.n_classes)
            from sklearn.linear_model import LogisticRegression

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pred_lr = LogisticRegression(max_iter=5000).fit(x[ctx], y[ctx]).predict(x[qry])
            acc.append(float((pred == y[qry]).mean()))
            acc_lr.append(float((pred_lr == y[qry]).mean()))
            major.append(float(np.bincount(y[qry], minlength=task.n_classes).max() / len(qry)))
        assert task is not None
        rows.append([name, task.n_features, task.n_classes, fmt(float(np.mean(acc))), fmt(float(np.mean(acc_lr))),
                     fmt(float(np.mean(acc)) / float(np.mean(acc_lr))), fmt(float(np.mean(major)))])
        print(f"{family} {name}: {rows[-1]}", flush=True)
    if not rows:
        return f"CARTE tables: none under {carte_dir}."
    return md_table(["CARTE table", "features", "classes", "raw network", "logistic regression", "ratio",
                     "majority"], rows)


def planted_table(family: str, seeds: list[int]) -> str:
    from orchestrator.selfcheck import planted_check

    model, options = FAMILIES[family]
    rows = []
    for seed in seeds:
        start = time.perf_counter()
        row = planted_check(model, options, seed=seed, **PLANTED)
        rows.append([seed, row["outcome"], fmt(row["auc"]), f"[{fmt(row['auc_low'])}, {fmt(row['auc_high'])}]",
                     f"{time.perf_counter() - start:.0f}"])
        print(f"{family} planted seed {seed}: {rows[-1]}", flush=True)
    found = sum(r[1] == "memorization" for r in rows)
    return (f"Found {found} of {len(rows)}.\n\n"
            + md_table(["seed", "outcome", "calibrated AUC", "95% interval", "seconds"], rows))


def control_table(family: str, seeds: list[int]) -> str:
    from orchestrator.selfcheck import NoMembershipControl, no_membership_check

    model, options = FAMILIES[family]
    rows, false = [], 0
    for control in NoMembershipControl:
        for mode in LABEL_MODES:
            outs = [no_membership_check(control, mode, seed=s, model=model, options=options) for s in seeds]
            verdicts = sorted({o["outcome"] for o in outs})
            false += sum(o["outcome"] == "memorization" for o in outs)
            aucs = [o["auc"] for o in outs]
            rows.append([control.value, mode, ", ".join(verdicts), f"{fmt(min(aucs))}–{fmt(max(aucs))}",
                         f"{fmt(min(o['auc_low'] for o in outs))}"])
            print(f"{family} control {control.value} {mode}: {rows[-1]}", flush=True)
    return (f"Memorization verdicts: {false} of {len(rows) * len(seeds)}.\n\n"
            + md_table(["control", "label mode", "verdicts", "calibrated AUC", "lowest interval low"], rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--parts", nargs="+", default=["accuracy", "planted", "control"],
                        choices=["accuracy", "planted", "control"])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--control-seeds", default="0")
    parser.add_argument("--carte-dir", default=str(REPO.parent / "shared" / "data" / "carte"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    set_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    control_seeds = [int(s) for s in args.control_seeds.split(",")]
    for family in args.families:
        parts = [f"Weights: `{FAMILIES[family][0]}` with `{FAMILIES[family][1]}`, one torch thread."]
        if "accuracy" in args.parts:
            text, _ = accuracy_table(family, seeds)
            parts += [f"**In-context accuracy** (seeds {args.seeds}):", text,
                      carte_table(family, Path(args.carte_dir), seeds[:3])]
        if "planted" in args.parts:
            parts += [f"**Planted power**: label-shuffled members, {PLANTED}:", planted_table(family, seeds)]
        if "control" in args.parts:
            parts += [f"**No-membership control** (seeds {args.control_seeds}):", control_table(family, control_seeds)]
        text = "\n\n".join(parts)
        print(text, flush=True)
        publish(section(family), text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
