"""The work ``configs/paper.yaml`` implies, its unit costs on this machine, and the grid's wall time.

    python3 benchmarks/paper_scale.py [--config configs/paper.yaml] [--task digits] [--workers 1 8 32]
                                      [--epochs 4] [--threads 1] [--no-write]

A thin caller of ``iclmem estimate`` (``orchestrator/estimate/estimate.py``): the grid's work is counted with the
sweep's own expansion, the configured model's unit costs are measured on this device (the CARTE tables of
paper.yaml are not present here, so on a built-in task, ``digits`` by default: 10 classes like the 10
quantile bins of the paper's regression targets, 16 features after PCA like theirs), and the wall time is
predicted for each ``--workers`` count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, md_table, publish  # noqa: E402

SECTION = "Paper scale: the work of configs/paper.yaml and its wall time"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(REPO / "configs" / "paper.yaml"))
    p.add_argument("--task", default="digits", help="built-in task the costs are measured on")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--epochs", type=int, default=4, help="fine-tuning epochs timed per Q")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default=None)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)

    from orchestrator.estimate.estimate import estimate
    from orchestrator.estimate.estimate_render import render
    from orchestrator.runfolder.timing import human

    est = estimate(args.config, args.workers[0], device=args.device, task=args.task, epochs=args.epochs,
                   threads=args.threads, log=lambda line: print(line, flush=True))
    rows = []
    for n in args.workers:
        e = est.on(n)
        rows.append((f"N = {n}", human(e.wall_s), f"{e.device_hours:,.2f}", e.bound))
    needed = [(n, k) for n in args.workers if (k := est.on(n).probe_actors_needed()) is not None]
    w = est.work
    config = Path(args.config)
    shown = config.relative_to(REPO) if config.resolve().is_relative_to(REPO) else config
    text = "\n".join([
        f"**Headline:** `{shown}` = {w.runs} runs, {w.steps:,} fine-tuning steps, "
        f"{w.total('probe_contexts') + w.total('control_contexts'):,} probe contexts and "
        f"{w.total('reference_contexts'):,} reference contexts; with the configured model measured on this "
        f"{est.device} ≈ **{human(est.parallel_s)}** of parallel work → "
        + ", ".join(f"{r[0].replace('N = ', 'N=')}: **{r[1]}** (bound by {r[3]})" for r in rows) + ".",
        "",
        f"Written by `iclmem estimate {shown} --workers N --task {args.task}` (this script is a thin caller of "
        f"`orchestrator/estimate/estimate.py`); unit costs measured on the built-in `{args.task}` task, {args.threads} torch "
        "thread(s). The paper audits ConTextTab, which the *Adapter benchmark* times at ~2,000x pfn-mini's forward "
        "on CPU: the figures are for the configured model.",
        "",
        render(est, markdown=True),
        "",
        md_table(["workers", "wall time", "device-hours held", "bound by"], rows),
        "",
        "Model: every unit of work runs on one worker at the measured cost; within the bounds below N workers "
        "pack it perfectly (fine-tuning and probing overlap, as the pipeline's checkpoint callback makes them); "
        "wall = driver start + Ray start + Stage I + max(parallel work / N, the probe actors' work / "
        f"min(probe actors, N) with `resources.probe_actors` = {est.probe_actors} here, the longest chain: one "
        "run's start, epochs and saves, then the probe of its last checkpoint). Every checkpoint's probe runs on "
        "one of the probe actors, so where they bind their number, not N, sets the wall time"
        + (": " + ", ".join(f"N={n}: with about {k} of them the prediction is "
                             f"{human(est.on(n).with_probe_actors(k).wall_s)}" for n, k in needed)
           if needed else " (they bind at none of these N)")
        + ". Not modelled: transfers between nodes, W&B upload, report rendering.",
    ])
    publish(SECTION, text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
