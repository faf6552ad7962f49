"""`iclmem estimate` on sweeps it was not built against: predicted and measured wall time, phase by phase.

    python3 benchmarks/estimate_validation.py [--configs benchmarks/estimate_sweeps/*.yaml configs/dp_audit.yaml]
                                              [--workers 2] [--no-write]

For each sweep, in fresh processes one after the other: ``iclmem estimate CONFIG --workers N`` (unit costs
measured now, on this machine, each (model, Q, task) on its own task; the prediction kept in a private
cache), then ``iclmem run CONFIG`` (W&B disabled), which records its own per-phase times in
``RUN_DIR/timings.json`` and prints them beside the kept prediction. The table gives the predicted and the
measured wall time, their ratio, and the phase whose error weighs most in the wall time
(``orchestrator.runfolder.timing.compare``), with its predicted and measured seconds. Target: every ratio within
0.7–1.3. Nothing else should run on the machine meanwhile: the load average is reported.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, md_table, publish  # noqa: E402

from iclmem.runfolder import TIMINGS_FILE  # noqa: E402

SECTION = "Estimate validation: sweeps the estimate was not built against"
DEFAULT_CONFIGS = [*sorted(str(p.relative_to(REPO)) for p in (REPO / "benchmarks" / "estimate_sweeps").glob("*.yaml")),
                   "configs/dp_audit.yaml"]
LOW, HIGH = 0.7, 1.3


def _first_line(path: Path) -> str:
    """What the sweep exercises: its first comment line after "Estimate validation:", or its name."""
    text = path.read_text().splitlines()
    first = text[0].lstrip("# ") if text and text[0].startswith("#") else path.stem
    if "Estimate validation" in first:
        return first.split("Estimate validation", 1)[1].split(":", 1)[1].strip()
    return first.split(":", 1)[0].strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep", default=None, help="keep the run folders (and the kept predictions) here")
    parser.add_argument("--reuse-runs", action="store_true",
                        help="with --keep: estimate again, but set it beside the runs already there (no sweep rerun)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    from orchestrator.runfolder.timing import compare, load_prediction, read_timings
    from orchestrator.schema.sweep_files import load_sweep

    rows, ratios = [], []
    with tempfile.TemporaryDirectory(prefix="iclmem-estimate-validation-") as scratch:
        tmp = args.keep or scratch
        env = {**os.environ, "ICLMEM_CACHE": str(Path(tmp) / "cache"), "RAY_USAGE_STATS_ENABLED": "0"}
        for config in args.configs:
            path = REPO / config
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "orchestrator.cli", "estimate", str(path), "--workers",
                            str(args.workers)], cwd=REPO, env=env, check=True, capture_output=True, text=True)
            estimate_s = time.perf_counter() - started
            out = Path(tmp) / path.stem
            load_before = os.getloadavg()[0]
            if not (args.reuse_runs and (out / TIMINGS_FILE).is_file()):
                if out.exists():
                    import shutil

                    shutil.rmtree(out)
                subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(path), "--out", str(out),
                                "--wandb", "disabled", "--quiet"], cwd=REPO, env=env, check=True, capture_output=True,
                               text=True)
            load_after = os.getloadavg()[0]
            timings = read_timings(out)
            os.environ["ICLMEM_CACHE"] = env["ICLMEM_CACHE"]
            prediction = load_prediction(load_sweep(path).config_hash())
            assert prediction is not None, f"{config}: the estimate kept no prediction"
            predicted = prediction.wall_s(timings.workers)
            ratio = predicted / timings.wall_s
            ratios.append(ratio)
            worst = compare(prediction.serial, prediction.work, timings.workers, prediction.probe_actors, timings)[0]
            written = sum(p.lstat().st_size for p in out.rglob("*") if p.is_file() and not p.is_symlink())
            disk = f"{prediction.disk_bytes / written:.2f}" if prediction.disk_bytes else "-"
            tail = timings.serial.get("aggregation and report", 0.0)
            rows.append([f"`{config}`", _first_line(path), f"{timings.trials} / {timings.checkpoints}",
                         f"{predicted:.0f}", f"{timings.wall_s:.0f}",
                         f"**{ratio:.2f}**" + ("" if LOW <= ratio <= HIGH else " (outside)"),
                         f"{worst.phase}: {worst.predicted_s:.0f} s predicted, {worst.actual_s:.0f} s measured "
                         f"({worst.wall_share_s:+.0f} s of wall)",
                         f"{prediction.serial.get('aggregation and report', 0.0):.0f} / {tail:.0f} "
                         f"({tail / timings.wall_s:.0%} of wall)", disk, f"{estimate_s:.0f}",
                         f"{load_before:.1f} / {load_after:.1f}"])
            print(f"{config}: predicted {predicted:.0f} s, measured {timings.wall_s:.0f} s, ratio {ratio:.2f}; "
                  f"largest error {worst.phase} ({worst.wall_share_s:+.1f} s)", flush=True)
    inside = sum(LOW <= r <= HIGH for r in ratios)
    text = "\n".join([
        f"Each sweep estimated (`iclmem estimate CONFIG --workers {args.workers}`) and then run (`iclmem run CONFIG "
        "--wandb disabled`) in fresh processes, one after the other; measured = the run's own record "
        "(`RUN_DIR/timings.json`, from the driver's start to the end of its report). None of these sweeps was used "
        "to build or tune the estimate. Largest error = the phase whose predicted − measured seconds weigh most in "
        "the wall time (a parallel phase's divided by the workers that share it).",
        "",
        md_table(["sweep", "what it exercises", "trials / checkpoints", "predicted s", "measured s",
                  "predicted / measured", "largest error", "aggregation and report s, predicted / measured",
                  "disk predicted / written", "estimate took s", "load before / after"], rows,
                 align="llrrrrlrrrr"),
        "",
        f"**{inside} of {len(ratios)}** ratios within {LOW}–{HIGH} (range {min(ratios):.2f}–{max(ratios):.2f}).",
    ])
    publish(SECTION, text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
