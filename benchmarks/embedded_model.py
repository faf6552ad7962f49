"""In-context accuracy of the shipped pfn-mini against logistic regression, and its pretraining record.

    python3 benchmarks/embedded_model.py [--quick] [--seeds 5] [--carte-dir ../shared/data/carte]
                                         [--carte-q 500] [--carte-context 256] [--carte-seeds 3] [--no-write]

1. scikit-learn tables (breast_cancer, wine, iris), exactly as the pretraining script evaluates them
   (``trainables.models.pretrain_eval.evaluate``): features standardised over the whole table and,
   past 16 columns, reduced to 16 leading PCA components (``prepare_eval_features``); 50/50 stratified
   splits for ``--seeds`` seeds; the first half is the context, the second the queries. Logistic
   regression (scikit-learn, default L2, lbfgs) is fitted on the same context rows and scored on the
   same queries with the same features. Bar: pfn-mini >= 0.9 x LR on every table.
2. CARTE tables (if ``--carte-dir`` holds them): spotify (classification) and the two wine price tables
   (regression, cut into 10 quantile bins by Stage I), prepared by ``trainables.data.prepare_task``
   exactly as a sweep prepares them (16 features at most, PCA past that). The context is the task's
   uniform-label context C' (``--carte-context`` rows), the queries its 2Q member and non-member rows
   (never in the context). Reported: accuracy, the same-context logistic regression, the majority
   class of the queries (what always answering the most frequent label scores) and chance 1/|Y|; for
   binned regression also accuracy within one bin.
3. The pretraining record: the command, seed, steps and versions stored with the shipped weights
   (``trainables/models/weights/pfn_mini.json``) and the evaluation curve of the pretraining job
   (``.pretrain/curve.jsonl``) when it is there.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, fmt, md_table, publish, set_threads, verdict  # noqa: E402

SECTION = "Embedded model: pfn-mini in-context accuracy"
BAR = 0.9
CARTE_TABLES = ("spotify", "wine_dot_com_prices", "wine_vivino_price")


def logistic_regression(x_ctx: np.ndarray, y_ctx: np.ndarray, x_q: np.ndarray) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings on the larger tables: max_iter is generous
        return LogisticRegression(max_iter=5000).fit(x_ctx, y_ctx).predict(x_q)


def sklearn_tables(model, seeds: list[int]) -> list[dict]:
    from sklearn.model_selection import train_test_split

    from trainables.models.pretrain_pfn_mini import eval_tables, icl_predict, prepare_eval_features

    rows = []
    for name, (x, y) in eval_tables().items():
        x = prepare_eval_features(x)
        n_classes = int(y.max()) + 1
        acc_m, acc_lr = [], []
        for seed in seeds:
            xa, xb, ya, yb = train_test_split(x, y, test_size=0.5, stratify=y, random_state=seed)
            acc_m.append(float((icl_predict(model, xa, ya, xb, n_classes) == yb).mean()))
            acc_lr.append(float((logistic_regression(xa, ya, xb) == yb).mean()))
        m, lr = float(np.mean(acc_m)), float(np.mean(acc_lr))
        rows.append({"table": name, "rows": len(y), "features": x.shape[1], "classes": n_classes,
                     "model": m, "model_sd": float(np.std(acc_m)), "lr": lr, "lr_sd": float(np.std(acc_lr)),
                     "ratio": m / lr, "ok": m >= BAR * lr})
        print(f"{name}: pfn-mini {m:.4f}  LR {lr:.4f}  ratio {m / lr:.3f}", flush=True)
    return rows


def carte_tables(model, carte_dir: Path, q: int, context: int, seeds: list[int]) -> list[dict]:
    import torch

    from trainables.data import TaskSource, prepare_task
    from trainables.models.pretrain_pfn_mini import icl_predict

    rows = []
    for name in CARTE_TABLES:
        if not (carte_dir / f"{name}.parquet").is_file() and not (carte_dir / name).is_dir():
            print(f"{name}: not found under {carte_dir}, skipped", flush=True)
            continue
        acc_m, acc_lr, near_m, near_lr, major = [], [], [], [], []
        task = None
        for seed in seeds:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # scipy's KS note on large samples
                task = prepare_task(TaskSource(name, "carte", str(carte_dir)), seed=seed, q=q, context_size=context)
            x = np.asarray(task.features, dtype=np.float32)
            y = np.asarray(task.labels)
            ctx = np.asarray(task.context_idx)
            qry = np.concatenate([task.member_idx, task.nonmember_idx])
            with torch.no_grad():
                pred = icl_predict(model, x[ctx], y[ctx], x[qry], task.n_classes)
            pred_lr = logistic_regression(x[ctx], y[ctx], x[qry])
            acc_m.append(float((pred == y[qry]).mean()))
            acc_lr.append(float((pred_lr == y[qry]).mean()))
            near_m.append(float((np.abs(pred - y[qry]) <= 1).mean()))
            near_lr.append(float((np.abs(pred_lr - y[qry]) <= 1).mean()))
            major.append(float(np.bincount(y[qry], minlength=task.n_classes).max() / len(qry)))
        assert task is not None
        regression = task.task_kind.value == "regression"
        rows.append({
            "table": name, "kind": "regression, 10 quantile bins" if regression else "classification",
            "rows": task.features.shape[0], "features": task.n_features, "classes": task.n_classes,
            "context": len(task.context_idx), "queries": 2 * q, "model": float(np.mean(acc_m)),
            "model_sd": float(np.std(acc_m)), "lr": float(np.mean(acc_lr)), "majority": float(np.mean(major)),
            "chance": 1.0 / task.n_classes, "near_model": float(np.mean(near_m)) if regression else None,
            "near_lr": float(np.mean(near_lr)) if regression else None,
        })
        r = rows[-1]
        print(f"{name}: pfn-mini {r['model']:.4f}  LR {r['lr']:.4f}  majority {r['majority']:.4f}  "
              f"chance {r['chance']:.4f}", flush=True)
    return rows


def pretraining_record(curve_points: int) -> tuple[dict, list[dict]]:
    from trainables.models.embedded import shipped_provenance

    meta = shipped_provenance()
    # The curve recorded with the weights (a path relative to the repository), else the pretraining workdir's.
    recorded = REPO / meta["curve"] if meta.get("curve") else None
    curve_path = recorded if recorded is not None and recorded.is_file() else REPO / ".pretrain" / "curve.jsonl"
    curve = []
    if curve_path.is_file():
        for line in curve_path.read_text().splitlines():
            try:
                curve.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    if len(curve) > curve_points:  # evenly spaced points, first and last kept
        keep = sorted({round(i * (len(curve) - 1) / (curve_points - 1)) for i in range(curve_points)})
        curve = [curve[i] for i in keep]
    return meta, curve, curve_path


def render(sk: list[dict], carte: list[dict], meta: dict, curve: list[dict], curve_path: Path, args) -> str:
    steps = meta.get("steps")
    parts = [
        f"Model: the shipped `pfn-mini` (`build_model(\"pfn-mini\")`, {meta.get('parameters', '?'):,} parameters, "
        f"weights exported after **{steps} pretraining steps**"
        + (" — fewer than the 6000 of the full pretraining run; rerun this script once the re-export lands"
           if isinstance(steps, int) and steps < 6000 else "") + ").",
        "",
        "**Headline:** pfn-mini / LR = " + ", ".join(f"{r['table']} {r['ratio']:.3f}" for r in sk)
        + f"; bar >= {BAR} x LR met on {sum(r['ok'] for r in sk)}/{len(sk)} tables"
        + ("" if not carte else "; CARTE (accuracy vs chance / majority): " + ", ".join(
            f"{r['table']} {r['model']:.3f} vs chance {r['chance']:.2f} / majority {r['majority']:.3f}" for r in carte))
        + ".",
        "",
        f"### scikit-learn tables: pfn-mini vs logistic regression (bar: pfn-mini >= {BAR} x LR)",
        "",
        f"50/50 stratified splits, seeds {args.seeds_list}; features standardised over the whole table and cut to 16 "
        "PCA components where there are more (`prepare_eval_features`, as the pretraining evaluation does); LR = "
        "scikit-learn `LogisticRegression` on the same context rows and features. Mean ± sd over seeds.",
        "",
        md_table(
            ["table", "rows", "features", "classes", "pfn-mini", "logistic regression", "ratio pfn-mini / LR", "bar"],
            [(r["table"], r["rows"], r["features"], r["classes"], f"{r['model']:.4f} ± {r['model_sd']:.4f}",
              f"{r['lr']:.4f} ± {r['lr_sd']:.4f}", f"**{r['ratio']:.3f}**", verdict(r["ok"])) for r in sk],
        ),
        "",
    ]
    if carte:
        parts += [
            "### CARTE tables (far above chance?)",
            "",
            f"Prepared by `trainables.data.prepare_task` as a sweep prepares them (Stage I: dedup, encoding, "
            f"standardisation, PCA to 16 features at most; regression targets cut into 10 quantile bins). Context = "
            f"the task's uniform-label context C' ({args.carte_context} rows requested; floor per class), queries = "
            f"its {2 * args.carte_q} member + non-member rows; seeds {args.carte_seeds_list} (one split each), mean. "
            "Majority = share of the most frequent label among the queries; chance = 1/|Y|. "
            "\"±1 bin\" counts a prediction within one quantile bin of the truth.",
            "",
            md_table(
                ["table", "kind", "rows", "features", "classes", "context", "queries", "pfn-mini", "LR (same context)",
                 "majority", "chance", "pfn-mini / chance", "pfn-mini ±1 bin", "LR ±1 bin"],
                [(r["table"], r["kind"], f"{r['rows']:,}", r["features"], r["classes"], r["context"], r["queries"],
                  f"**{r['model']:.4f}** ± {r['model_sd']:.4f}", f"{r['lr']:.4f}", f"{r['majority']:.4f}",
                  f"{r['chance']:.4f}", f"{r['model'] / r['chance']:.2f}x",
                  fmt(r["near_model"], 4) if r["near_model"] is not None else "–",
                  fmt(r["near_lr"], 4) if r["near_lr"] is not None else "–") for r in carte],
                align="llrrrrrrrrrrrr",
            ),
            "",
        ]
    parts += ["### Pretraining record", ""]
    if meta:
        versions = ", ".join(f"{k} {v}" for k, v in sorted(meta.get("versions", {}).items()))
        final = ", ".join(f"{k} {v:.4f}" for k, v in sorted(meta.get("final_accuracy_5_seeds", {}).items()))
        parts += [
            f"From `trainables/models/weights/pfn_mini.json`: command `{meta.get('command')}`, seed {meta.get('seed')}, "
            f"steps {steps}, config {json.dumps(meta.get('config'), sort_keys=True)}; prior: {meta.get('prior')}; "
            f"versions: {versions}. Recorded final accuracy (5 seeds): {final}."
            + (f" Pool note: {meta['pool']}" if meta.get("pool") else ""),
            "",
        ]
    else:
        parts += ["No provenance file next to the shipped weights.", ""]
    if curve:
        keys = [k for k in curve[-1] if k.startswith("acc_")]
        rel = curve_path.relative_to(REPO) if curve_path.is_relative_to(REPO) else curve_path
        recorded = bool(meta.get("curve")) and (REPO / meta["curve"]) == curve_path
        parts += [
            f"Pretraining curve (`{rel}`"
            + (", the one recorded with the shipped weights" if recorded else
               ", the pretraining workdir's: it belongs to the shipped weights only if the command above names "
               "that workdir")
            + "; accuracy on the seed-0 split of each table, train loss averaged since the previous point; evenly "
            "spaced points):",
            "",
            md_table(["step", "train loss", *[k.removeprefix("acc_") for k in keys], "pool batches", "seconds"],
                     [(c.get("step"), fmt(c.get("loss", float("nan")), 4), *[fmt(c.get(k, float("nan")), 4) for k in keys],
                       c.get("pool_batches", ""), c.get("seconds", "")) for c in curve]),
            "",
        ]
    else:
        parts += ["No pretraining curve (`.pretrain/curve.jsonl`) on this machine.", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 seeds, one CARTE split of Q=200 (< 1 min)")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--carte-dir", default=str(REPO.parent / "shared" / "data" / "carte"))
    p.add_argument("--carte-q", type=int, default=500)
    p.add_argument("--carte-context", type=int, default=256)
    p.add_argument("--carte-seeds", type=int, default=3)
    p.add_argument("--curve-points", type=int, default=13)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.carte_seeds, args.carte_q = 2, 1, 200
    args.seeds_list = list(range(args.seeds))
    args.carte_seeds_list = list(range(args.carte_seeds))
    set_threads(args.threads)

    from trainables.models import build_model

    model = build_model("pfn-mini").module
    model.eval()
    meta, curve, curve_path = pretraining_record(args.curve_points)
    print(f"shipped weights: {meta.get('steps')} steps", flush=True)
    sk = sklearn_tables(model, args.seeds_list)
    carte = carte_tables(model, Path(args.carte_dir), args.carte_q, args.carte_context, args.carte_seeds_list)
    text = render(sk, carte, meta, curve, curve_path, args)
    publish(SECTION, text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
