"""What a saved, fitted TabICL or TabPFN classifier file gives back of its context (``iclmem audit-context
--attack file``): each package's classifier on the shipped mini of its architecture, fitted on N rows, saved the
package's way (TabICL: KV cache, ``save_training_data=False``, as its docs recommend for privacy; TabPFN:
``save_fit_state`` after each ``fit_mode``), loaded back and audited, beside a file fitted on the never-in-context
control. The classifier reads the table's own columns (no PCA; ``--pca``: Stage I's 16 whitened PCA components);
the reconstruction's headline is, per seed and as min-max over the seeds, the rows rebuilt with every cell within
0.1 column std and the median cell error, beside the best guess without the file.

    python3 benchmarks/saved_files.py --tables breast_cancer --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

from _common import md_table, publish, set_threads

SECTION = "Saved files: what a fitted classifier's file gives back of its context"
CASES = (("tabicl", "kv"), ("tabicl", "repr"), ("tabpfn-v2", "fit_preprocessors"), ("tabpfn-v2", "fit_with_cache"))
# the default run leaves out TabICL's repr cache (matched and rebuilt as its kv cache is, in the run of
# 2026-12-04) to keep three seeds within ten minutes on two cores; --cases all runs it
DEFAULT_CASES = ("tabicl:kv", "tabpfn-v2:fit_preprocessors", "tabpfn-v2:fit_with_cache")


def pct(value: object) -> str:
    return "n/a" if value is None else f"{100 * float(value):.0f}%"  # type: ignore[arg-type]


def of(value: object, total: object) -> str:
    return "n/a" if value is None else f"{value} of {total}"


def std(value: object) -> str:
    return "n/a" if value is None else f"{float(value):.2g}"  # type: ignore[arg-type]


def span(values: list[float], digits: str = ".2g") -> str:
    lo, hi = min(values), max(values)
    return f"{lo:{digits}}" if lo == hi else f"{lo:{digits}}-{hi:{digits}}"


def main(argv: list[str] | None = None) -> int:
    from orchestrator.audits.inference_audit import audit_file

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", nargs="+", default=["breast_cancer"])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--context-size", type=int, default=40)
    ap.add_argument("--references", type=int, default=8)
    ap.add_argument("--pca", action="store_true", help="Stage I's whitened PCA components instead of the columns")
    ap.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES),
                    help="package:mode pairs, or all (" + ", ".join(f"{m}:{md}" for m, md in CASES) + ")")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    set_threads(1)
    warnings.filterwarnings("ignore")
    rows, verdicts = [], []
    started = time.perf_counter()
    seeds = [int(s) for s in args.seeds.split(",")]
    cases = CASES if args.cases == ["all"] else tuple(tuple(c.split(":", 1)) for c in args.cases)
    if any(c not in CASES for c in cases):
        ap.error(f"--cases: each one of {', '.join(f'{m}:{md}' for m, md in CASES)}, or all")
    with tempfile.TemporaryDirectory() as tmp:
        for table in args.tables:
            for seed in seeds:
                for model, mode in cases:
                    t0 = time.perf_counter()
                    v = audit_file(table, out=str(Path(tmp) / f"{table}-{seed}-{model}-{mode}"), model=model,
                                   mode=mode, context_size=args.context_size, references=args.references, seed=seed,
                                   bootstrap=200, pca=args.pca, log=lambda _line: None)
                    verdicts.append((table, seed, model, mode, v))
                    unit = "PCA components" if v["features_read"] == "pca_components" else "columns"
                    rows.append([table, seed, model, mode, f"{v['n_features']} {unit}",
                                 "yes" if v["predicts_as_fitted"] else "no",
                                 v["raw_rows_in_bytes"], pct(v["raw_cells_in_bytes"]),
                                 "yes" if v["labels_in_bytes"] else "no",
                                 pct(v["rows_identified"]), pct(v["labels_recovered"]), pct(v["nonmembers_matched"]),
                                 of(v["rows_rebuilt"], v["rows_scored"]), std(v["median_cell_error_std"]),
                                 of(v["imputation_rows_rebuilt"], v["rows_scored"]),
                                 std(v["imputation_median_cell_error_std"]),
                                 f"{v['membership_through_file']} ({'trusted' if v['membership_trusted'] else 'not trusted'})",
                                 "yes" if v["file_gives_back_its_rows"] else "no",
                                 f"{time.perf_counter() - t0:.0f}"])
                    print(rows[-1], flush=True)
    headline = []
    for table in args.tables:
        for model, mode in cases:
            got = [v for t, _, m, md, v in verdicts if (t, m, md) == (table, model, mode) and v["rows_rebuilt"] is not None]
            if not got:
                continue
            per_seed = "; ".join(f"seed {s}: {v['rows_rebuilt']} of {v['rows_scored']}, {std(v['median_cell_error_std'])}"
                                 for t, s, m, md, v in verdicts
                                 if (t, m, md) == (table, model, mode) and v["rows_rebuilt"] is not None)
            headline.append([table, model, mode, got[0]["n_columns"], len(got),
                             f"{span([v['rows_rebuilt'] for v in got], 'd')} of {got[0]['rows_scored']}",
                             span([v["median_cell_error_std"] for v in got]),
                             f"{span([v['imputation_rows_rebuilt'] for v in got], 'd')} of {got[0]['rows_scored']}",
                             span([v["imputation_median_cell_error_std"] for v in got]), per_seed])
    unit = "whitened PCA components (--pca)" if args.pca else "the table's own columns (no PCA)"
    text = (f"N = {args.context_size} context rows of each table (Stage I's split, label-matched non-members beside "
            f"them, a never-in-context control of N other rows), seeds {args.seeds}, the classifier fitted on "
            f"{unit}; K = {args.references} reference contexts refitted for the membership audit; "
            f"{time.perf_counter() - started:.0f} s in all.\n\n"
            "Headline: the reconstruction from the file, per seed and as min-max over the seeds. \"Rebuilt\": "
            "context rows whose every cell the file gives back within 0.1 of its column's standard deviation (over "
            "the prepared table); \"median cell error\": the median over every context cell, in column standard "
            "deviations. \"Best guess without the file\": the best of three guesses from the attacker's sample of "
            "the table (the audit's non-members, none of them a target): its mean, its class mean given the label, "
            "its row nearest the truth.\n\n"
            + md_table(["table", "package", "saved as", "columns", "seeds", "rebuilt", "median cell error (std)",
                        "best guess without the file", "its median cell error (std)", "per seed (rebuilt, median)"],
                       headline)
            + "\n\nEvery audit. \"Raw rows in bytes\": context rows found whole (float32 or float64) in the file's "
            "bytes; \"labels in bytes\": the context's label vector in order. \"Rows identified\": context rows the "
            "white-box attack (each candidate row and label's recomputed first-layer cache entry against the stored "
            "ones) finds at their own place; \"other rows\": non-members it matches. \"Gives back its rows\": rows "
            "identified > 50% and the control's file matched none.\n\n"
            + md_table(["table", "seed", "package", "saved as", "features read", "predicts as fitted",
                        "raw rows in bytes", "raw cells in bytes", "labels in bytes", "rows identified",
                        "labels recovered", "other rows matched", "rebuilt", "median cell error (std)",
                        "best guess without the file", "its median (std)", "membership through the file",
                        "gives back its rows", "seconds"], rows))
    publish(SECTION, text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
