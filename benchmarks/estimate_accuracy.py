"""`iclmem estimate` against a measured sweep: predicted vs actual wall time.

    python3 benchmarks/estimate_accuracy.py [--config configs/quickstart.yaml configs/canaries.yaml] [--workers 2]
                                            [--rounds 1] [--no-write]

For each config, each round runs ``iclmem estimate CONFIG --workers N`` (unit costs measured now, on this machine), then
the sweep itself, ``iclmem run CONFIG --wandb disabled``, in a fresh process, and times its wall clock
from launch to exit. The sweep's processes (driver, Ray's workers and actors) are polled for their CPU
time, so the CPU-seconds the sweep used can be set against the estimate's device-seconds. N should be the
cores the sweep can use (the embedded local Ray takes every core of the machine). Target: predicted wall
time within 30 % of the measured one.

The machine is shared: the load average before and after each run is reported, and a load from others
slows the sweep and the measured unit costs alike only if it stays the same throughout.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, md_table, publish  # noqa: E402

SECTION = "Estimate vs a measured sweep"
TARGET = 0.30


def run_sweep(config: str, out: Path) -> dict:
    """Wall seconds and CPU-seconds (all of the sweep's processes) of ``iclmem run``."""
    import psutil

    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    start = time.perf_counter()
    log = open(out.with_suffix(".log"), "w")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", config, "--out", str(out),
                             "--wandb", "disabled", "--quiet"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    root = psutil.Process(proc.pid)
    cpu: dict[int, float] = {}
    while proc.poll() is None:
        try:
            for p in [root, *root.children(recursive=True)]:
                try:
                    t = p.cpu_times()
                    cpu[p.pid] = t.user + t.system
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        time.sleep(0.25)
    wall = time.perf_counter() - start
    log.close()
    if proc.returncode != 0:
        raise SystemExit(f"the sweep failed (exit {proc.returncode}); see {out.with_suffix('.log')}")
    return {"wall_s": wall, "cpu_s": sum(cpu.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", nargs="+", default=["configs/quickstart.yaml", "configs/canaries.yaml"])
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)

    from orchestrator.estimate.estimate import estimate
    from orchestrator.runfolder.timing import human

    rows, pairs = [], []
    scratch = Path(tempfile.mkdtemp(prefix="iclmem-estimate-accuracy-"))
    try:
        for config in args.config:
            for r in range(args.rounds):
                load_before = os.getloadavg()[0]
                est = estimate(config, args.workers, log=lambda line: print(line, flush=True))
                measured = run_sweep(config, scratch / f"run{len(pairs)}")
                load_after = os.getloadavg()[0]
                ratio = est.wall_s / measured["wall_s"]
                # Diagnostic, after the fact: the cores the sweep actually got (its CPU-seconds / wall) in
                # place of N, i.e. what the prediction would have been had it known the machine's load.
                got = measured["cpu_s"] / measured["wall_s"]
                adjusted = dataclasses.replace(est, workers=max(got, 1e-6)).wall_s  # the estimate's own bounds
                pairs.append((config, est, measured, ratio))
                print(f"{config} round {r}: predicted {est.wall_s:.1f} s, measured {measured['wall_s']:.1f} s "
                      f"(ratio {ratio:.2f}); busy device-seconds predicted "
                      f"{est.parallel_s + sum(est.serial_s.values()):.0f}, sweep CPU {measured['cpu_s']:.0f} s",
                      flush=True)
                rows.append((f"`{config}`", r + 1, f"{est.wall_s:.1f}", est.bound, f"{measured['wall_s']:.1f}",
                             f"**{ratio:.2f}**", f"{abs(ratio - 1):.0%}",
                             f"{est.parallel_s + sum(est.serial_s.values()):.0f}", f"{measured['cpu_s']:.0f}",
                             f"{got:.2f}", f"{adjusted / measured['wall_s']:.2f}",
                             f"{load_before:.1f} / {load_after:.1f}"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    worst = max(abs(ratio - 1) for *_, ratio in pairs)
    from orchestrator.estimate.estimate_render import render

    text = [
        "**Headline:** predicted / measured wall time, "
        + "; ".join(f"`iclmem estimate {config} --workers {args.workers}` "
                    + ", ".join(f"**{ratio:.2f}**" for c, _, _, ratio in pairs if c == config)
                    for config in args.config)
        + f" (target: within {TARGET:.0%}: {'met' if worst <= TARGET else '**NOT met**'}; worst {worst:.0%} off).",
        "",
        "Each round: the estimate (unit costs measured at that moment), then the sweep run by `iclmem run "
        f"CONFIG --wandb disabled` in a fresh process on the embedded local Ray (all {os.cpu_count()} cores), "
        "timed from launch to exit; its processes' CPU time polled every 0.25 s (processes that end between "
        "polls lose their last quarter-second).",
        "",
        md_table(["config", "round", "predicted wall (s)", "predicted bound", "measured wall (s)",
                  "predicted / measured", "off by", "predicted device-seconds", "sweep CPU-seconds",
                  "cores the sweep got", "diagnostic: predicted with those cores / measured", "load before / after"],
                 rows),
        "",
        f"Cores the sweep got = its CPU-seconds / its wall time; the prediction assumes {args.workers} free "
        "cores. Where other work holds the machine's cores (load average above the core count), the sweep gets "
        "fewer and runs longer than predicted; the diagnostic column re-evaluates the prediction with the cores "
        "the sweep actually got (known only afterwards), separating the estimate's error in work from the "
        "machine's load. Predicted device-seconds = the estimate's parallel work plus its serial part, to set "
        "against the sweep's CPU-seconds. The predicted bound names what sets the parallel phase: total work / "
        "N, the probe actors' work over `resources.probe_actors` of them (every checkpoint's probe runs on one; "
        "the canaries config has 1, and its canaries triple the contexts each checkpoint's probe scores), or "
        "the longest run.",
    ]
    for config in args.config:
        est = [e for c, e, _, _ in pairs if c == config][-1]
        text += ["", f"The last round's estimate for `{config}` ({human(est.wall_s)} on {args.workers} workers):", "",
                 render(est, markdown=True)]
    text = "\n".join(text)
    publish(SECTION, text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
