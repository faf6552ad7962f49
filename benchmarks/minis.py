"""Every validity figure per model family: pfn-mini (iclmem's own architecture), tabicl-mini (TabICL's) and
tabpfn-mini (TabPFN v2's), each pretrained here on the same synthetic prior (trainables/models/pretrain.py).

    python3 benchmarks/minis.py [--families pfn-mini tabicl-mini tabpfn-mini] [--seeds 0,1,2,3,4]
                                [--parts accuracy planted control upstream] [--carte-dir ../shared/data/carte] [--no-write]

One section per family in RESULTS.md, all through the code a sweep runs (the adapters' loaders on the shipped
files, Stage I under each model's own input contract, iclmem's fine-tuner and probe), one torch thread:

* **In-context accuracy.** scikit-learn tables (breast_cancer, wine, iris) exactly as the pretraining record
  evaluates them (``trainables.models.pretrain_eval.evaluate``: standardised, 16 PCA components at most, 50/50
  stratified splits over the seeds): the raw network as iclmem drives it, the package's own classifier on the
  shipped file (its preprocessing and ensemble), and logistic regression on the same rows. CARTE tables (when
  ``--carte-dir`` holds them), prepared as a sweep prepares them for the model: the uniform-label context C'
  (256 rows) predicting the 2Q member and non-member rows.
* **Planted power.** Label-shuffled members on iris (Q 30, |C'| 60) fine-tuned at pfn-mini's recipe (lr 3e-3,
  200 epochs), probed with the planted check's four manipulations (``orchestrator.audits.selfcheck.planted_check``):
  the verdict and the calibrated AUC with its interval per seed, and beside them the known-context channel
  (``known_context_memorization_flag``: the same rule on the base-calibrated loss with C' as context).
* **Planted runs through the packages' own fine-tuners** (``--parts upstream``, a section of its own): the same
  planted members fine-tuned by ``FinetunedTabICLClassifier`` / ``FinetunedTabPFNClassifier`` (``recipe:
  upstream``) at the package's defaults, with early stopping off, and with the fine-tuner's ensemble
  augmentation off (TabPFN's through its ``extra_classifier_kwargs``).
* **No-membership control.** Models that never saw the audited rows (``no_membership_check``: fine-tuned on
  100 other rows with true or flipped labels, or the shipped weights plus noise), breast_cancer Q 50, |C'| 64,
  in every label mode: the verdicts (none may read memorization), the known-context flags (none may be set)
  and the calibrated AUCs.
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


def accuracy_table(family: str, seeds: list[int]) -> tuple[str, list[dict]]:
    from sklearn.linear_model import LogisticRegression

    from trainables.models import build_model
    from trainables.models.checkpoints import locate_weights
    from trainables.models.deployed import package_classifier
    from trainables.models.pretrain_eval import evaluate, evaluate_classifier

    model, options = FAMILIES[family]
    adapter = build_model(model, **options)
    raw = evaluate(adapter, seeds)
    lr = evaluate_classifier(lambda: LogisticRegression(max_iter=5000), seeds)
    package = None
    if model != "pfn-mini":
        path = locate_weights(model, options)
        assert path is not None
        package = evaluate_classifier(lambda: package_classifier(model), seeds)
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
    from trainables.models.pretrain_eval import icl_predict
    from trainables.models.pretrain_models import logits_of

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
    from orchestrator.audits.selfcheck import planted_check

    model, options = FAMILIES[family]
    rows = []
    for seed in seeds:
        start = time.perf_counter()
        row = planted_check(model, options, seed=seed, **PLANTED)
        rows.append([seed, row["outcome"], fmt(row["auc"]), f"[{fmt(row['auc_low'])}, {fmt(row['auc_high'])}]",
                     "yes" if row["known_context_memorization_flag"] else "no",
                     fmt(row["known_context_calibrated_auc"]), fmt(row["known_context_calibrated_auc_low"]),
                     fmt(row["known_context_calibrated_tpr_at_10pct"]), f"{time.perf_counter() - start:.0f}"])
        print(f"{family} planted seed {seed}: {rows[-1]}", flush=True)
    found = sum(r[1] == "memorization" for r in rows)
    flagged = sum(r[4] == "yes" for r in rows)
    either = sum(r[1] == "memorization" or r[4] == "yes" for r in rows)
    return (f"Found by the zero-information probe's verdict in {found} of {len(rows)}; known-context flag set in "
            f"{flagged} of {len(rows)}; either in {either} of {len(rows)}.\n\n"
            + md_table(["seed", "outcome", "calibrated AUC", "95% interval", "known-context flag",
                        "known-context calibrated AUC", "its interval low", "its TPR@10%", "seconds"], rows))


def control_table(family: str, seeds: list[int]) -> str:
    from orchestrator.audits.selfcheck import NoMembershipControl, no_membership_check

    model, options = FAMILIES[family]
    rows, false, flagged = [], 0, 0
    for control in NoMembershipControl:
        for mode in LABEL_MODES:
            outs = [no_membership_check(control, mode, seed=s, model=model, options=options) for s in seeds]
            verdicts = sorted({o["outcome"] for o in outs})
            false += sum(o["outcome"] == "memorization" for o in outs)
            flagged += sum(bool(o["known_context_memorization_flag"]) for o in outs)
            aucs = [o["auc"] for o in outs]
            kc = [o["known_context_calibrated_auc"] for o in outs]
            rows.append([control.value, mode, ", ".join(verdicts), f"{fmt(min(aucs))}–{fmt(max(aucs))}",
                         f"{fmt(min(o['auc_low'] for o in outs))}",
                         sum(bool(o["known_context_memorization_flag"]) for o in outs),
                         f"{fmt(min(kc))}–{fmt(max(kc))}"])
            print(f"{family} control {control.value} {mode}: {rows[-1]}", flush=True)
    return (f"Memorization verdicts: {false} of {len(rows) * len(seeds)}; known-context flags: {flagged} of "
            f"{len(rows) * len(seeds)}.\n\n"
            + md_table(["control", "label mode", "verdicts", "calibrated AUC", "lowest interval low",
                        "known-context flags", "known-context calibrated AUC"], rows))


UPSTREAM_SECTION = "Planted runs through the packages' own fine-tuners on the minis"
# (label, the fine-tuner's keywords beside iclmem's, lr): the package's defaults (early stopping on C', patience
# 8), then every epoch trained at two learning rates
UPSTREAM_RECIPES = (("package defaults (early stopping)", {}, 1e-4, 200),
                    ("early stopping off", {"early_stopping": False}, 1e-3, 200),
                    ("early stopping off", {"early_stopping": False}, 3e-3, 200),
                    # the package's most aggressive setting short of divergence (lr 1e-2 collapses tabpfn-mini):
                    # constant lr, half of the rows as queries each epoch, 300 epochs
                    ("no schedule, query ratio 0.5", {"early_stopping": False, "use_lr_scheduler": False,
                                                      "QUERY_RATIO": 0.5}, 3e-3, 300),
                    # the fine-tuner's ensemble augmentation off (no class shift, no feature shuffle, one
                    # normalisation, one estimator), so what it fits is the rows as iclmem's raw network sees them,
                    # and 80% of the rows as queries each epoch (a short member context, closer to C' at audit)
                    ("augmentation off, query ratio 0.8", {"early_stopping": False, "NO_AUGMENTATION": True,
                                                           "QUERY_RATIO": 0.8}, 3e-3, 200))
# each package's name for the share of the training rows it holds out as queries each epoch
QUERY_RATIO = {"tabicl-mini": "finetune_ctx_query_ratio", "tabpfn-mini": "finetune_ctx_query_split_ratio"}
# each package's fine-tuner keywords that switch its ensemble augmentation off (None: the row is skipped): TabICL's
# are its own keywords; TabPFN's fine-tuner takes them inside extra_classifier_kwargs, its classifier's
# inference_config (no class or feature shift, no fingerprint feature, one preprocessing that keeps the numbers)
NO_AUGMENTATION: dict[str, dict[str, Any] | None] = {
    "tabicl-mini": {"class_shuffle_method": "none", "feat_shuffle_method": "none", "norm_methods": "none",
                    "n_estimators_finetune": 1},
    "tabpfn-mini": {"n_estimators_finetune": 1, "extra_classifier_kwargs": {"inference_config": {
        "CLASS_SHIFT_METHOD": None, "FEATURE_SHIFT_METHOD": None, "FINGERPRINT_FEATURE": False,
        "PREPROCESS_TRANSFORMS": [{"name": "none", "categorical_name": "numeric"}]}}},
}


def upstream_finetuner(family: str, settings: dict[str, Any]) -> dict[str, Any] | None:
    """A recipe row's settings as ``family``'s fine-tuner keywords (None: the row cannot be set for it)."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if key == "QUERY_RATIO":
            out[QUERY_RATIO[family]] = value
        elif key == "NO_AUGMENTATION":
            keywords = NO_AUGMENTATION[family]
            if keywords is None:
                return None
            out.update(keywords)
        else:
            out[key] = value
    return out


def upstream_table(families: list[str], seeds: list[int]) -> str:
    """Label-shuffled members (iris, Q 30, |C'| 60) fine-tuned by each package's own fine-tuner (``recipe:
    upstream``) from the shipped mini, probed at the last epoch it trained: the zero-information verdict, the
    known-context channel, and the utility as the package deploys the weights (C' as its context)."""
    from orchestrator.audits.selfcheck import planted_check

    rows = []
    for family in families:
        model, options = FAMILIES[family]
        if model == "pfn-mini":
            continue
        for label, settings, lr, recipe_epochs in UPSTREAM_RECIPES:
            finetuner = upstream_finetuner(family, settings)
            if finetuner is None:
                continue
            for seed in seeds:
                start = time.perf_counter()
                row = planted_check(model, {**options, "recipe": "upstream", "finetuner": finetuner}, seed=seed,
                                    task=PLANTED["task"], q=PLANTED["q"], context_size=PLANTED["context_size"],
                                    lr=lr, epochs=recipe_epochs)
                rows.append([family, label, f"{lr:g}", seed, row["epoch"], row["outcome"], fmt(row["auc"]),
                             "yes" if row["known_context_memorization_flag"] else "no",
                             fmt(row["known_context_calibrated_auc"]),
                             "yes" if row.get("deployed_known_context_memorization_flag") else "no",
                             fmt(row.get("deployed_known_context_calibrated_auc", float("nan"))),
                             fmt(row.get("deployed_known_context_calibrated_auc_low", float("nan"))),
                             fmt(row["deployed_member_icl_accuracy"]), fmt(row["deployed_nonmember_icl_accuracy"]),
                             f"{time.perf_counter() - start:.0f}"])
                print(f"upstream {rows[-1]}", flush=True)
    return (f"Label-shuffled members, iris, Q {PLANTED['q']}, |C'| {PLANTED['context_size']}, up to 200 epochs (300 in the \"no schedule\" recipe) "
            "through `FinetunedTabICLClassifier` / `FinetunedTabPFNClassifier` from the shipped mini (`recipe: "
            "upstream`), probed at the last epoch trained with the planted check's four manipulations. "
            "\"deployed known-context\": the known-context channel scored as the package deploys the weights "
            "(its preprocessing and ensemble, C' as the context), calibrated by the base weights deployed alike. "
            "\"deployed member / non-member accuracy\": the package's classifier on the fine-tuned weights with "
            "C' as its context (a member's trained label is a shuffled one: 1/3 is chance); that classifier is "
            "the one the fine-tuner deploys after fitting (its ensemble size, class and feature shifts, "
            "preprocessing, the run's seed as `random_state`). \"augmentation off\": tabicl-mini "
            "`class_shuffle_method`, `feat_shuffle_method`, `norm_methods` `none`; tabpfn-mini "
            "`extra_classifier_kwargs.inference_config` `CLASS_SHIFT_METHOD`, `FEATURE_SHIFT_METHOD` null, "
            "`FINGERPRINT_FEATURE` false, `PREPROCESS_TRANSFORMS` `[{name: none, categorical_name: numeric}]`; "
            "both `n_estimators_finetune` 1.\n\n"
            + md_table(["family", "fine-tuner", "lr", "seed", "last epoch", "outcome", "calibrated AUC",
                        "known-context flag", "known-context calibrated AUC", "deployed known-context flag",
                        "deployed known-context calibrated AUC", "its interval low",
                        "deployed member accuracy", "deployed non-member accuracy", "seconds"], rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--parts", nargs="+", default=["accuracy", "planted", "control"],
                        choices=["accuracy", "planted", "control", "upstream"])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--control-seeds", default="0")
    parser.add_argument("--carte-dir", default=str(REPO.parent / "shared" / "data" / "carte"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    set_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    control_seeds = [int(s) for s in args.control_seeds.split(",")]
    if "upstream" in args.parts:
        text = upstream_table(args.families, seeds)
        print(text, flush=True)
        publish(UPSTREAM_SECTION, text, args.no_write, argv)
    for family in args.families:
        if not {"accuracy", "planted", "control"} & set(args.parts):
            break
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
