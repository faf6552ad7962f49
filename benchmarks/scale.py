"""A sweep at the scale the project is for, rehearsed: hundreds of short trials on a simulated multi-node Ray cluster.

    python3 benchmarks/scale.py --seeds 2 --jsonl benchmarks/scale_records/scale.jsonl     # 32 trials (1x)
    python3 benchmarks/scale.py --seeds 8 --jsonl benchmarks/scale_records/scale.jsonl     # 128 trials (4x)
    python3 benchmarks/scale.py --seeds 32 --jsonl benchmarks/scale_records/scale.jsonl    # 512 trials (16x)
    python3 benchmarks/scale.py --render benchmarks/scale_records/scale.jsonl               # the RESULTS.md section

Each size is one real sweep (``orchestrator.driver.sweep.run_sweep``, the code ``iclmem run`` runs) on a
``ray.cluster_utils.Cluster`` of ``--nodes`` simulated nodes (2 CPUs each, all on this machine): pfn-mini on iris,
16 trials per seed (4 learning rates x Q 10, 20 x normal and label-shuffled members), 2 epochs, checkpoints at
epochs 1 and 2, a 3-manipulation suite, 20 bootstrap resamples, 1 null split, the default risk report (slices),
W&B offline. Recorded per size: the sweep's wall time and its phases (``timings.json``), Tune's cost per trial,
the driver's peak memory (this process's resident set, sampled every 0.2 s, and its high-water mark), the bytes of
Tune's experiment state, of the run folder and of the checkpoints, the report's time by section (a second
``aggregate`` of the finished folder under cProfile), the HTML report's size and the number of rows its runs table
holds, the W&B offline summary's size, and what ``iclmem estimate`` predicted for disk. Growth is read across the
sizes: a figure that grows faster than the trial count is named and explained in the rendered section.

Nothing else should run meanwhile: 2 physical cores carry every simulated node (their CPUs are logical).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, fmt, md_table, publish  # noqa: E402

SECTION = "A 500-trial rehearsal: sweeps at scale on a simulated cluster"
TRIALS_PER_SEED = 16
# the report's sections timed on the second aggregation (function names as cProfile reports them)
REPORT_PARTS = {
    "read probe results": "collect",
    "reference attacks": "attack_columns",
    "risk tables (rows, slices, null splits)": "write_risk_report_or_say_why",
    "claim ledger": "write_claim_ledger_or_say_why",
    "figures": "make_all_figures",
    "HTML report": "write_html_report",
    "W&B summary": "log_summary",
}


def sweep_config(seeds: int, nodes: int) -> dict[str, Any]:
    return {
        "name": f"scale-{seeds * TRIALS_PER_SEED}",
        "tasks": [{"name": "iris"}],
        "models": [{"name": "pfn-mini", "options": {"weights": "shipped"}}],
        "grid": {"regime": ["single_fixed"], "lr": [1e-3, 3e-3, 1e-2, 3e-2], "q": [10, 20],
                 "label_mode": ["normal", "shuffled_members"], "seed": list(range(seeds))},
        "training": {"epochs": 2, "checkpoint_epochs": [1, 2]},
        "data": {"context_size": 40},
        "probe": {"suite": ["base", "position_first", "skew_true_x2"], "bootstrap": 20, "null_splits": 1},
        "resources": {"cpus_per_trial": 1, "probe_actors": nodes, "cpus_per_probe_actor": 0.5},
        "wandb": {"mode": "offline", "project": "iclmem-scale"},
    }


class PeakMemory:
    """This process's resident set, sampled every ``every`` seconds on a thread: the driver's peak."""

    def __init__(self, every: float = 0.2) -> None:
        import psutil

        self.process, self.every, self.peak, self._stop = psutil.Process(), every, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._stop.wait(self.every)

    def __enter__(self) -> PeakMemory:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self.thread.join()


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path``, as ``du --apparent-size`` counts them: a symbolic link is not its target
    (W&B links every offline run's ``debug-core.log`` to one shared file)."""
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def report_parts(run_dir: Path) -> dict[str, float]:
    """Seconds of each report section (``REPORT_PARTS``) in a second aggregation of the finished folder, and the
    whole of it, under cProfile (cumulative times; the profiler's own cost is in every figure alike)."""
    import cProfile
    import pstats

    from orchestrator.report.aggregate import aggregate

    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    aggregate(run_dir, log=lambda _line: None)
    profile.disable()
    total = time.perf_counter() - started
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    out = {"total": total}
    for label, name in REPORT_PARTS.items():
        out[label] = max((v[3] for (_f, _l, fn), v in stats.items() if fn == name), default=0.0)
    return out


def html_runs_rows(report: Path) -> int:
    """Rows of the report's tables that name a run: what a reader must search, filter and sort."""
    text = report.read_text()
    return text.count("<tr") - text.count("<thead")


def rehearse(seeds: int, nodes: int, keep: Path | None) -> dict[str, Any]:
    import yaml
    from ray.cluster_utils import Cluster

    from iclmem.runfolder import TIMINGS_FILE, TUNE_DIR
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.estimate.estimate_disk import predict_disk_from_folder

    root = keep or Path(tempfile.mkdtemp(prefix="iclmem-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    config = root / f"scale-{seeds}.yaml"
    config.write_text(yaml.safe_dump(sweep_config(seeds, nodes)))
    run_dir = root / f"run-{seeds}"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    try:
        with PeakMemory() as memory:
            started = time.perf_counter()
            results = run_sweep(config, run_dir, address=cluster.address, progress=False)
            wall = time.perf_counter() - started
        timings = json.loads((run_dir / TIMINGS_FILE).read_text())
        parts = report_parts(run_dir)
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()
    tune = run_dir / TUNE_DIR
    states = sorted(tune.rglob("experiment_state-*.json"))
    checkpoints = [p for p in tune.rglob("checkpoint_*") if p.is_dir()]
    summary_runs = sorted((run_dir / "wandb" / "wandb").glob("offline-run-*")) if (run_dir / "wandb" / "wandb").is_dir() \
        else sorted((run_dir / "wandb").glob("offline-run-*"))
    trials = int(timings["trials"])
    record = {
        "seeds": seeds, "nodes": nodes, "trials": trials, "checkpoints": int(timings["checkpoints"]),
        "rows": int(len(results)), "wall_s": wall, "timings": timings,
        "per_trial_tune_s": timings["work"].get("Tune trials (actor start, imports, reports)", 0.0) / max(trials, 1),
        "driver_peak_rss": memory.peak, "driver_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "experiment_state_bytes": states[-1].stat().st_size if states else 0,
        "run_folder_bytes": folder_bytes(run_dir), "checkpoint_bytes": sum(folder_bytes(p) for p in checkpoints),
        "report_html_bytes": (run_dir / "report.html").stat().st_size,
        "report_table_rows": html_runs_rows(run_dir / "report.html"),
        "wandb_runs": len(summary_runs), "wandb_bytes": folder_bytes(run_dir / "wandb"),
        "report_parts_s": parts,
        "disk_predicted": predict_disk_from_folder(run_dir).as_dict(),
        "recorded": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return record


def _growth(records: list[dict[str, Any]], key: Any) -> str:
    """How a figure grows from the smallest size to the largest, against the trial count: the exponent b of
    figure ~ trials^b between the two (1: linear)."""
    import math

    small, large = records[0], records[-1]
    a, b = key(small), key(large)
    if a <= 0 or b <= 0 or large["trials"] == small["trials"]:
        return "-"
    return f"{math.log(b / a) / math.log(large['trials'] / small['trials']):.2f}"


def render(paths: list[Path]) -> str:
    records = sorted((json.loads(line) for p in paths for line in p.read_text().splitlines() if line.strip()),
                     key=lambda r: r["trials"])
    if not records:
        raise SystemExit("no records")
    mb = 1e6
    figures: list[tuple[str, Any, Any]] = [
        ("sweep wall time (s)", lambda r: r["wall_s"], lambda v: f"{v:.0f}"),
        ("Tune's cost per trial (s)", lambda r: r["per_trial_tune_s"], lambda v: fmt(v, 3)),
        ("aggregation and report (s)", lambda r: r["timings"]["serial"].get("aggregation and report", 0.0),
         lambda v: fmt(v, 3)),
        ("its share of the wall time", lambda r: r["timings"]["serial"].get("aggregation and report", 0.0) / r["wall_s"],
         lambda v: f"{100 * v:.1f}%"),
        ("aggregation and report, re-timed after the stability fix (s)",
         lambda r: r.get("aggregation_retimed_s", float("nan")), lambda v: fmt(v, 3)),
        *[(f"report: {label} (s)", (lambda lab: lambda r: r["report_parts_s"].get(lab, 0.0))(label),
           lambda v: fmt(v, 3)) for label in REPORT_PARTS],
        ("driver peak memory (MB)", lambda r: r["driver_peak_rss"] / mb, lambda v: f"{v:.0f}"),
        ("Tune experiment state (MB)", lambda r: r["experiment_state_bytes"] / mb, lambda v: f"{v:.2f}"),
        ("run folder (MB)", lambda r: r["run_folder_bytes"] / mb, lambda v: f"{v:.1f}"),
        ("of it checkpoints (MB)", lambda r: r["checkpoint_bytes"] / mb, lambda v: f"{v:.1f}"),
        ("disk predicted / written", lambda r: r["disk_predicted"]["final_bytes"] / r["run_folder_bytes"],
         lambda v: fmt(v, 3)),
        ("HTML report (MB)", lambda r: r["report_html_bytes"] / mb, lambda v: f"{v:.2f}"),
        ("HTML table rows", lambda r: r["report_table_rows"], lambda v: f"{int(v)}"),
        ("W&B offline folder (MB)", lambda r: r["wandb_bytes"] / mb, lambda v: f"{v:.1f}"),
    ]
    header = ["figure", *[f"{r['trials']} trials ({r['checkpoints']} checkpoints)" for r in records],
              f"growth exponent ({records[0]['trials']} -> {records[-1]['trials']} trials)"]
    rows = [[name, *[show(key(r)) for r in records], _growth(records, key)] for name, key, show in figures]
    machine = (f"{records[-1]['nodes']} simulated nodes of 2 logical CPUs on this 2-core machine; recorded "
               + ", ".join(sorted({r['recorded'] for r in records})))
    return "\n".join([
        f"One real sweep per size ({machine}). Growth exponent b: figure ~ trials^b between the smallest and the "
        "largest size (1 is linear; a fixed cost shows as b < 1).", "",
        md_table(header, rows), "", READING])


READING = (
    "Reading (2026-12-06). **What grows linearly**: the run folder, the checkpoints, Tune's experiment state (31 KB per "
    "trial), the W&B offline folder and the disk prediction's error (the prediction reads the sizes of the first "
    "checkpoint, probe result and preparation; its W&B per-run sizes were fitted on the 512-trial record and the "
    "quickstart, the rest on the quickstart). **What grows slower**: Tune's cost per trial falls from 2.7 to 1.6 s "
    "as the experiment's fixed cost spreads; the driver's memory grows by about 0.75 MB per trial over a 650 MB "
    "base (its imports); the HTML page grows with its tables' rows (1,307 at 512 trials, each long table with a "
    "filter box and sortable headers, checked in headless Chromium). **What grew faster, and why**: the risk "
    "tables (exponent 1.31) and with them the aggregation's share of the wall time (12.7% at 32 trials, 23.5% at "
    "512). Profiled, the cause was the seed-stability table: every pair of a configuration's seeds, 496 pairs at 32 "
    "seeds, each a scan of every record. It now compares every pair up to 6 seeds and each seed with the next "
    "beyond, from records grouped once; re-timed on the same folders the aggregation is 8.4, 24.0 and 91.8 s "
    "(exponent 0.86: a fixed cost and linear work; 3.8x from 128 to 512 trials). Still linear but large: the "
    "per-checkpoint record rows (9 ms each, 32 s of the profiled 512-trial aggregation) and the query tables read "
    "once by the risk tables and again by the claim ledger (8,712 reads). Its share at 512 trials stays about 20% "
    "of this rehearsal's wall time because these trials are 2 epochs on a 3-manipulation suite: the tail is a "
    "fixed amount per checkpoint, and real trials are longer. The sweep's in-run figures (rows 3-12) were taken "
    "before the fix; the re-timed row is after it. At the size of a typical audit sweep the tail is small: "
    "`python3 benchmarks/estimate_validation.py --configs benchmarks/estimate_sweeps/risk_report_24.yaml "
    "benchmarks/estimate_sweeps/references.yaml --no-write` (2026-12-07, after the fix): 24 trials and 56 "
    "checkpoints with the risk report, wall 130 s measured (135 s predicted, 1.04), aggregation and report 9 s "
    "(7% of the wall time; 11 s predicted), disk predicted / written 1.00; the references sweep 32 s (27 s "
    "predicted, 0.85), aggregation 3 s (3 s predicted), disk 0.99. Measuring took 40 and 33 s, 31% and over 100% "
    "of these short sweeps' predicted time: its fixed part (the driver's, Ray's and Tune's starts) does not shrink "
    "with the sweep.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=32, help=f"seeds of the grid: {TRIALS_PER_SEED} trials each")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--jsonl", type=Path, default=REPO / "benchmarks" / "scale_records" / "scale.jsonl")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folder here")
    parser.add_argument("--render", nargs="+", type=Path, default=None)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if args.render:
        publish(SECTION, render(args.render), args.no_write, argv)
        return 0
    record = rehearse(args.seeds, args.nodes, args.keep)
    args.jsonl.parent.mkdir(parents=True, exist_ok=True)
    with open(args.jsonl, "a") as handle:
        handle.write(json.dumps(record, default=str) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "timings"}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
