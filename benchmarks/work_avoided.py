"""Work avoided: forwards the invariance shortcut saves on the default suite, per adapter.

    python3 benchmarks/work_avoided.py [--tasks breast_cancer digits iris wine] [--q 50] [--rounds 3] [--no-write]

Each adapter declares its exact invariances (``ModelAdapter.invariances``: row order, and uniform row
multiplicity where the model's log-count bias makes it exact). ``probes.scoring.score`` scores contexts of
one query that are identical under them once and copies the scores, for the fine-tuned model and for the
reference model alike. Per adapter and task (prepared by Stage I, Q members + Q non-members, default
48-manipulation suite), the share of contexts not forwarded is counted from the plan the adapter's probe
actor builds (rows compressed for models that take multiplicities). Counting needs no model, so every
registered adapter is listed whether or not its package is installed.

For pfn-mini the time of ``score`` with and without the shortcut is measured as well (interleaved rounds,
medians, one thread) and the two tables are checked to agree.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleave, md_table, median, publish, set_threads  # noqa: E402

SECTION = "Work avoided: forwards saved by model invariances"


def adapters() -> list[tuple[str, type]]:
    from trainables.models.contexttab_adapter import ConTextTabAdapter
    from trainables.models.embedded import PfnMiniAdapter
    from trainables.models.tabicl_adapter import TabICLAdapter
    from trainables.models.tabpfn_adapter import TabPFNV2Adapter

    return [("pfn-mini", PfnMiniAdapter), ("tabicl", TabICLAdapter), ("tabpfn-v2", TabPFNV2Adapter),
            ("contexttab", ConTextTabAdapter)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["breast_cancer", "digits", "iris", "wine"])
    p.add_argument("--q", type=int, default=50)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    set_threads(1)

    from probes.manipulations import default_suite
    from probes.scoring import ProbePlan, ProbeQueries, score
    from trainables.data import TaskSource, prepare_task
    from trainables.models import build_model

    suite = default_suite()
    from iclmem.errors import DataError

    tasks = {}
    for t in args.tasks:
        try:
            tasks[t] = prepare_task(TaskSource(t, "builtin"), seed=0, q=args.q, context_size=args.context)
        except DataError:  # a small table (iris: 150 rows): the size the tests use
            tasks[t] = prepare_task(TaskSource(t, "builtin"), seed=0, q=30, context_size=60)
    rows, saved = [], {}
    for name, cls in adapters():
        declared = ", ".join(sorted(i.value for i in cls.invariances)) or "none"
        shares = []
        for task_name, task in tasks.items():
            plan = ProbePlan.build(ProbeQueries.from_task(task), suite, task.seed,
                                   compress_rows=cls.supports_context_weights)
            share = plan.forwards_saved(cls.invariances)
            exact = plan.forwards_saved(())  # byte-identical contexts alone (e.g. binary skew_incorrect k2 = k1)
            shares.append(share)
            saved[(name, task_name)] = share
            rows.append((name, declared, task_name, task.n_classes, f"{len(plan.planned)} ({len(plan.queries.query_ids)} queries)",
                         int(round(len(plan.planned) * (1 - share))), f"**{share:.1%}**", f"{exact:.1%}"))
        rows.append((name, declared, "mean", "", "", "", f"**{np.mean(shares):.1%}**", ""))
    table = md_table(["adapter", "declared invariances", "task", "classes", "contexts", "forwarded",
                      "forwards saved", "of which byte-identical"], rows, align="lllrrrrr")

    # Time: pfn-mini, score with and without the shortcut on the first task.
    first = args.tasks[0]
    model = build_model("pfn-mini")
    plan = ProbePlan.build(ProbeQueries.from_task(tasks[first]), suite, 0, compress_rows=True)
    plan.representatives(model.invariances)  # built once per plan, as a probe actor does
    fast, full = score(model, plan), score(model, plan, shortcut=False)
    max_diff = float(np.max(np.abs(fast[["loss", "entropy", "confidence"]].to_numpy()
                                   - full[["loss", "entropy", "confidence"]].to_numpy())))
    times = interleave({"shortcut": lambda: score(model, plan), "full": lambda: score(model, plan, shortcut=False)},
                       args.rounds)
    t_fast, t_full = median(times["shortcut"]), median(times["full"])
    start = time.perf_counter()
    plan2 = ProbePlan.build(ProbeQueries.from_task(tasks[first]), suite, 0, compress_rows=True)
    t_plan = time.perf_counter() - start
    start = time.perf_counter()
    plan2.representatives(model.invariances)
    t_rep = time.perf_counter() - start

    means = {name: np.mean([saved[(name, t)] for t in args.tasks]) for name, _ in adapters()}
    text = "\n".join([
        "**Headline:** share of probe forwards saved on the default suite, mean over "
        + ", ".join(f"`{t}`" for t in args.tasks) + ": "
        + ", ".join(f"{name} **{share:.1%}**" for name, share in means.items()) + ".",
        "",
        f"Tasks prepared by Stage I with Q={args.q} (2Q queries) and context {args.context} (Q=30, context 60 for "
        f"tables too small for that); default suite of "
        f"{len(suite)} manipulations; plans as each adapter's probe actor builds them (rows compressed for "
        "models that take multiplicities: pfn-mini). A context is scored once per query under the declared "
        "invariances and its scores copied to the contexts identical to it (position moves are the base "
        "context under row order, `combo2_random_skew_true_x*` the plain skews, uniform scalings the base "
        "context under uniform multiplicity); byte-identical contexts (binary tasks' `skew_incorrect` with "
        "k = 2, 3 equals k = 1; a random position that lands where the block was) are shared by every model. "
        "ConTextTab declares nothing yet: its invariances are unchecked (its package is not installed here), "
        "so only byte-identical contexts are shared for it. For pfn-mini the byte-identical column is counted "
        "on the compressed plan, whose distinct-rows-with-counts form already merges row orders. Declarations are checked on each architecture by "
        "`tests/test_invariance.py`, which also shows scores and verdicts equal with and without the shortcut.",
        "",
        table,
        "",
        f"Time (pfn-mini, `{first}`, 1 thread, median of {args.rounds} interleaved rounds): `score` with the "
        f"shortcut {t_fast:.3f} s vs {t_full:.3f} s without = **{t_full / t_fast:.2f}x** faster; the shortcut's "
        f"table costs {t_rep:.3f} s once per plan (plan build {t_plan:.3f} s), reused for every checkpoint and the "
        f"reference. Max |difference| of the scores with vs without: {max_diff:.1e} (float rounding: the copied "
        "context's forward ran in another batch and row order).",
    ])
    publish(SECTION, text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
