"""Power on the recipes users run: planted runs through the packages' own fine-tuners, their ground truth, every
channel's reference attacks against K, the no-membership control, and what a reference costs.

    python3 benchmarks/upstream_power.py --families tabicl-mini --seeds 0,1,2,3,4 --jsonl /tmp/icl.jsonl
    python3 benchmarks/upstream_power.py --render /tmp/icl.jsonl /tmp/pfn.jsonl   # the RESULTS.md section

Each (mini, recipe, seed): ``orchestrator.audits.upstream_power.planted_upstream_power`` -- the planted target (iris,
Q 30 label-shuffled members, label-matched non-members, |C'| 60) fine-tuned by ``FinetunedTabICLClassifier`` /
``FinetunedTabPFNClassifier`` from the shipped mini, a no-membership control through the same fine-tuner and
recipe, and ``--max-k`` reference fine-tunes through it, each under its own seed; every target probed at the
last epoch it trained. Attacks at K < max use the first K references of the same run (a reference's half does
not depend on K). One torch thread. Run one process per family to use two cores, then ``--render`` their
files together.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, md_table, publish, set_threads  # noqa: E402

SECTION = "Power on the recipes users run: the packages' fine-tuners with reference fine-tunes"
# (label, the fine-tuner's keywords beside iclmem's, lr, epochs): the package's default recipe (early stopping on
# C', the package's patience) at two learning rates, and every epoch trained
RECIPES = (("package defaults (early stopping)", {}, 1e-4, 200),
           ("package defaults (early stopping)", {}, 1e-3, 200),
           ("early stopping off", {"early_stopping": False}, 3e-3, 200))
ATTACKS = ("lira_online", "lira_offline", "rmia")
KS = (2, 4, 8)
READING = (
    "Reading (2026-12-06, the tables below): the issue's target -- every planted run whose ground truth says "
    "memorized found by some channel on at least 4 of 5 seeds, each channel's false-positive rate at or under 5% "
    "-- is **not met**. Through the packages' default recipe (early stopping on C') the fine-tuned weights often "
    "did memorize (the ground truth says so for 10 of 20 runs, its own null rate measured on 300 null splits) and "
    "no channel found any of them at K = 8. With early stopping off, the deployed ensemble's channel found 4 of "
    "5 memorized tabpfn-mini runs and 1 of 3 tabicl-mini runs, but it also found 2 of 5 controls trained on other "
    "rows in that recipe, so its rate there is not 5%. Why they are missed, measured: the memorized runs' "
    "signal sits in the package's own frame (the ground truth's AUC, the training rows as the context, 0.68-0.87 "
    "on average) and mostly not in the frame an auditor who holds C' can build (the best attack of any channel "
    "0.51-0.67 on the same runs): the packages train each member as a query against chunks of the other members, "
    "and what they fit shows when the members are the context, which is how the fine-tuned classifier is deployed "
    "after `fit`. Each attack's verdict is paid for one test; a channel's 'any of three' is not, and the claim "
    "ledger (`reference_attack`) therefore states each channel with the null rate its union measured in the "
    "sweep. The controls' false detections (3-5 of 30 per channel) are above 5%, with intervals that reach it: "
    "more controls are needed before calling the attack rule miscalibrated here. K: TPR at 1% FPR with 30 "
    "non-members allows no false positive, so it moves in steps of 1/30 and does not separate K = 2, 4, 8.")


def _attack_record(columns: dict[str, Any], prefix: str) -> dict[str, Any]:
    out = {}
    for attack in ATTACKS:
        a = f"{prefix}{attack}_"
        if f"{a}auc" not in columns:
            continue
        out[attack] = {"auc": columns[f"{a}auc"], "auc_low": columns[f"{a}auc_low"],
                       "tpr_at_1pct": columns.get(f"{a}tpr_at_1pct"), "outcome": columns.get(f"{a}outcome"),
                       "null_splits": columns.get(f"{a}null_splits"),
                       "null_memorization": columns.get(f"{a}null_memorization"),
                       # per null split, what the render counts (the full evidence stays in a sweep's results)
                       "null_evidence": [{"index": e["index"], "auc": round(float(e["auc"]), 4),
                                          "outcome": e["outcome"]}
                                         for e in json.loads(columns.get(f"{a}null_evidence") or "[]")]}
    return out


def run_one(family: str, label: str, finetuner: dict[str, Any], lr: float, epochs: int, seed: int, max_k: int,
            null_splits: int, bootstrap: int) -> dict[str, Any]:
    from minis import FAMILIES

    from orchestrator.audits.upstream_power import CHANNELS, planted_upstream_power
    from orchestrator.report.aggregate import attacks_for_checkpoint

    model, options = FAMILIES[family]
    started = time.perf_counter()
    out = planted_upstream_power(model, {**options, "recipe": "upstream", "finetuner": finetuner}, lr=lr,
                                 epochs=epochs, seed=seed, n_references=max_k, null_splits=null_splits,
                                 bootstrap=bootstrap)
    tables = out["tables"]
    record: dict[str, Any] = {"family": family, "recipe": label, "lr": lr, "seed": seed, "max_k": max_k,
                              "reference_seconds": out["reference_seconds"],
                              "reference_epochs": out["reference_epochs"], "seconds": time.perf_counter() - started}
    for name in ("target", "control"):
        row = out[name]
        by_k = {}
        for k in KS:
            if k > max_k:
                continue
            computed = attacks_for_checkpoint(tables[name], tables["references"][:k], n_resamples=bootstrap,
                                              null_splits=null_splits, seed=seed)
            columns = computed[0] if computed is not None else {}
            by_k[str(k)] = {prefix: _attack_record(columns, prefix) for prefix in CHANNELS}
        record[name] = {
            "epoch": row["epoch"], "seconds": row["seconds"], "outcome": row["outcome"], "auc": row["auc"],
            "known_context_flag": bool(row["known_context_memorization_flag"]),
            "deployed_known_context_flag": bool(row.get("deployed_known_context_memorization_flag", False)),
            "deployed_member_accuracy": row.get("deployed_member_icl_accuracy"),
            "deployed_nonmember_accuracy": row.get("deployed_nonmember_icl_accuracy"),
            "deployed_known_context_calibrated_auc": row.get("deployed_known_context_calibrated_auc"),
            "known_context_calibrated_auc": row.get("known_context_calibrated_auc"),
            **{k: v for k, v in row.items() if k.startswith(("ground_truth_", "null_ground_truth_"))},
            "attacks": by_k}
    return record


def _found(channel: dict[str, Any]) -> bool:
    return any(a.get("outcome") == "memorization" for a in channel.values())


def _null_any(channel: dict[str, Any]) -> tuple[int, int]:
    """(null splits on which any of the channel's attacks called memorization, null splits)."""
    per_split: dict[int, bool] = {}
    for attack in channel.values():
        for i, rec in enumerate(attack.get("null_evidence") or []):
            per_split[i] = per_split.get(i, False) or rec.get("outcome") == "memorization"
    return sum(per_split.values()), len(per_split)


def render(records: list[dict[str, Any]]) -> str:
    from iclmem.stats import clopper_pearson
    from orchestrator.audits.upstream_power import CHANNELS

    records = sorted(records, key=lambda r: (r["family"], r["recipe"], r["lr"], r["seed"]))
    max_k = max(r["max_k"] for r in records)
    k = str(max_k)
    per_run = []
    for r in records:
        t, c = r["target"], r["control"]
        cells = [r["family"], r["recipe"], f"{r['lr']:g}", r["seed"], t["epoch"],
                 f"{fmt(t['ground_truth_auc'])} [{fmt(t['ground_truth_auc_low'])}]",
                 "yes" if t["ground_truth_memorized"] else "no", t["outcome"],
                 "yes" if t["known_context_flag"] else "no", "yes" if t["deployed_known_context_flag"] else "no"]
        for prefix in CHANNELS:
            ch = t["attacks"][k][prefix]
            best = max(ch.values(), key=lambda a: a["auc"]) if ch else None
            cells.append("–" if best is None else
                         f"{'**' if _found(ch) else ''}{fmt(best['auc'])} [{fmt(best['auc_low'])}]"
                         f"{'**' if _found(ch) else ''}")
        cells.append(", ".join(name for p, name in CHANNELS.items() if _found(c["attacks"][k][p])) or "none")
        cells.append(f"{t['seconds']:.0f} / {sum(r['reference_seconds']) / len(r['reference_seconds']):.0f}")
        per_run.append(cells)

    summary = []
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["family"], r["recipe"], r["lr"]), []).append(r)
    for (family, recipe, lr), rs in groups.items():
        memorized = [r for r in rs if r["target"]["ground_truth_memorized"]]
        gt_null = sum(r["target"]["null_ground_truth_memorized"] for r in rs)
        gt_trials = sum(r["target"]["null_ground_truth_trials"] for r in rs)
        for prefix, name in CHANNELS.items():
            cells = []
            for attack in (*ATTACKS, None):
                def pick(channel: dict[str, Any], attack: str | None = attack) -> dict[str, Any]:
                    return channel if attack is None else {a: v for a, v in channel.items() if a == attack}
                found = sum(_found(pick(r["target"]["attacks"][k][prefix])) for r in memorized)
                control = sum(_found(pick(r["control"]["attacks"][k][prefix])) for r in rs)
                nulls = [_null_any(pick(r["target"]["attacks"][k][prefix])) for r in rs]
                hits, trials = sum(h for h, _ in nulls), sum(n for _, n in nulls)
                cells.append(f"{found}/{len(memorized)} · {control}/{len(rs)} · {hits}/{trials}")
            tpr = {kk: [max((a["tpr_at_1pct"] or 0.0) for a in r["target"]["attacks"][kk][prefix].values())
                        for r in memorized if r["target"]["attacks"].get(kk, {}).get(prefix)]
                   for kk in (str(x) for x in KS if x <= max_k)}
            summary.append([family, recipe, f"{lr:g}", f"{len(memorized)} of {len(rs)} (null {gt_null}/{gt_trials})",
                            name, *cells, *[fmt(sum(v) / len(v)) if v else "–" for v in tpr.values()]])
    # where the memorized runs' signal is: the ground truth's AUC (training rows as the context) against each
    # channel's best attack AUC (C' as the context), mean over the memorized runs, per mini and recipe
    frames = []
    for family in sorted({r["family"] for r in records}):
        for recipe in sorted({r["recipe"] for r in records}):
            mem = [r for r in records if r["family"] == family and r["recipe"] == recipe
                   and r["target"]["ground_truth_memorized"]]
            if not mem:
                continue
            best = {p: sum(max(a["auc"] for a in r["target"]["attacks"][k][p].values()) for r in mem) / len(mem)
                    for p in CHANNELS}
            frames.append([family, recipe, len(mem), fmt(sum(r["target"]["ground_truth_auc"] for r in mem) / len(mem)),
                           *[fmt(best[p]) for p in CHANNELS]])
    control_rows = []
    for prefix, name in CHANNELS.items():
        counts = [sum(_found({a: v for a, v in r["control"]["attacks"][k][prefix].items() if a == attack})
                      for r in records) for attack in ATTACKS]
        anyone = sum(_found(r["control"]["attacks"][k][prefix]) for r in records)
        ci = clopper_pearson(anyone, len(records))
        control_rows.append([name, *[f"{c}/{len(records)}" for c in counts],
                             f"{anyone}/{len(records)} ({fmt(ci.low)}–{fmt(ci.high)})"])
    nulls_all = sum(r["target"]["null_ground_truth_memorized"] for r in records)
    trials_all = sum(r["target"]["null_ground_truth_trials"] for r in records)
    gt_ci = clopper_pearson(nulls_all, trials_all)
    cost = []
    for family in sorted({r["family"] for r in records}):
        for recipe_lr in sorted({(r["recipe"], r["lr"]) for r in records if r["family"] == family}):
            rs = [r for r in records if r["family"] == family and (r["recipe"], r["lr"]) == recipe_lr]
            target = sum(r["target"]["seconds"] for r in rs) / len(rs)
            ref = sum(s for r in rs for s in r["reference_seconds"]) / sum(len(r["reference_seconds"]) for r in rs)
            epochs = [e for r in rs for e in r["reference_epochs"]]
            cost.append([family, recipe_lr[0], f"{recipe_lr[1]:g}", f"{target:.1f}", f"{ref:.1f}",
                         f"{ref / target:.2f}", f"{min(epochs)}–{max(epochs)}"])
    return (
        READING + "\n\n"
        f"K = {max_k} reference fine-tunes per run unless a column says otherwise; attack null splits and ground-"
        f"truth null splits {records[0]['target'].get('null_ground_truth_trials', 0)} per run; bootstrap 200.\n\n"
        "**Ground truth** (`probes.ground_truth`): the deployed classifier of the fine-tuned weights and of the "
        "base weights (the package's ensemble and preprocessing, the run's seed) predicts every audited row's "
        "trained label with the training rows outside its fold as the context (5 folds: the package's own "
        "frame); the score is the loss drop, members against label-matched non-members; memorized when the AUC's "
        "95% interval lies above 0.5. Its own false-positive rate: the same test on null splits of rows the run "
        "never saw.\n\n"
        f"The ground truth's own false-positive rate over every run's null splits: {nulls_all}/{trials_all} "
        f"({fmt(gt_ci.low)}–{fmt(gt_ci.high)}).\n\n"
        "**An attack finds a run** when it reads memorization under the sweep's default rule at the run's last "
        "checkpoint; a channel (\"any\") when one of its three attacks does. Each cell: memorized runs found / "
        "controls found / attack null splits (halves of the non-members labelled as members) detected. The "
        "control is a model fine-tuned through the same recipe on other rows, audited against the same K "
        "references: every detection of it is false.\n\n"
        + md_table(["mini", "recipe", "lr", "ground truth memorized (null)", "channel", "LiRA online", "LiRA offline",
                    "RMIA", "any", *[f"TPR@1% at K={x} (memorized runs)" for x in KS if x <= max_k]], summary)
        + "\n\n**Where the signal is**: mean AUC over the memorized runs, the ground truth (the training rows as "
        "the context) against each channel's best attack (C' as the context, or the probe's contexts):\n\n"
        + md_table(["mini", "recipe", "memorized runs", "ground truth AUC", *CHANNELS.values()], frames)
        + "\n\n**Controls found** (a model that never saw the audited rows, every recipe and seed pooled; "
        "95% Clopper-Pearson interval on the channel's rate):\n\n"
        + md_table(["channel", "LiRA online", "LiRA offline", "RMIA", "any (95% CI)"], control_rows)
        + "\n\n**Per run** (best attack of each channel at K = " + k + ": AUC [interval low], bold when the "
        "channel finds the run):\n\n"
        + md_table(["mini", "recipe", "lr", "seed", "last epoch", "ground truth AUC [low]", "memorized",
                    "probe verdict", "known-context flag", "deployed known-context flag",
                    *[f"{name}" for name in CHANNELS.values()], "control: channels finding it",
                    "s target / s per reference"], per_run)
        + "\n\n**Cost** (wall seconds on one torch thread: fine-tune and probe; a reference's against the target's "
        "measured in the same run):\n\n"
        + md_table(["mini", "recipe", "lr", "target s", "reference s", "reference / target", "reference epochs"],
                   cost))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=["tabicl-mini", "tabpfn-mini"])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--null-splits", type=int, default=10)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--recipes", default=",".join(str(i) for i in range(len(RECIPES))),
                        help="which RECIPES rows to run, by index")
    parser.add_argument("--jsonl", help="append each run's record to this file")
    parser.add_argument("--render", nargs="+", help="publish the section from these record files")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.render:
        records = [json.loads(line) for path in args.render for line in Path(path).read_text().splitlines() if line]
        text = render(records)
        print(text, flush=True)
        publish(SECTION, text, args.no_write, argv)
        return 0
    set_threads(1)
    from minis import upstream_finetuner

    for family in args.families:
        for label, settings, lr, epochs in (RECIPES[int(i)] for i in args.recipes.split(",")):
            finetuner = upstream_finetuner(family, settings)
            for seed in (int(s) for s in args.seeds.split(",")):
                record = run_one(family, label, finetuner or {}, lr, epochs, seed, args.max_k, args.null_splits,
                                 args.bootstrap)
                print(json.dumps({k: record[k] for k in ("family", "recipe", "lr", "seed", "seconds")}), flush=True)
                if args.jsonl:
                    with open(args.jsonl, "a") as handle:
                        handle.write(json.dumps(record, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
