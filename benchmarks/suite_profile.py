"""Where the test suite's time goes: per module and per test, wall seconds and the CPU of the test's own process.

    python3 benchmarks/suite_profile.py [--top 20] [--no-write]          # runs the suite as `make test` does
    python3 benchmarks/suite_profile.py --from FOLDER [--wall S --busy-cpu S]  # a run made with the variable set

The suite runs as `make test` runs it (two xdist workers, tests/), with ``ICLMEM_SUITE_PROFILE`` naming a folder:
``tests/suite_profile_hook.py`` then writes, for every test, the wall seconds of its setup, call and teardown,
the CPU seconds its own pytest process spent in them (the in-process sweep drivers, the in-process fine-tunes
and audits) and those of its waited-for subprocesses (command-line drivers, simulated cluster nodes). Ray's
worker processes (trial and probe actors) are the raylet's children, so their CPU is in neither column; the
machine-wide busy CPU over the run (/proc/stat) is in the header, so run it on an otherwise idle machine. A
session fixture's build is counted in the first test that uses it. The suite is CPU-bound on 2 cores (busy CPU
about twice the wall time), so what shortens it is less CPU, not more overlap.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, md_table, publish  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SECTION = "Test suite: where its time goes"
PROFILE_FOLDER_VARIABLE = "ICLMEM_SUITE_PROFILE"  # read by tests/suite_profile_hook.py
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark", "-n", "2",
          "--dist", "loadgroup", "--no-loadscope-reorder", "tests"]  # the Makefile's `test` target


def busy_cpu_seconds() -> float:
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_suite(folder: Path) -> tuple[float, float, int]:
    env = {**os.environ, PROFILE_FOLDER_VARIABLE: str(folder), "RAY_USAGE_STATS_ENABLED": "0",
           "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    cpu, wall = busy_cpu_seconds(), time.perf_counter()
    done = subprocess.run(PYTEST, cwd=REPO, env=env, check=False)
    return time.perf_counter() - wall, busy_cpu_seconds() - cpu, done.returncode


def read_lines(folder: Path) -> list[dict]:
    lines = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()
             if line.strip()]
    if not lines:
        raise SystemExit(f"{folder}: no per-test lines (was {PROFILE_FOLDER_VARIABLE} set for the run?)")
    return lines


def summarize(lines: list[dict], wall: float | None, busy: float | None, top: int) -> str:
    modules: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in lines:
        m = modules[line["test"].split("::")[0].removeprefix("tests/")]
        m["tests"] += 1
        for key in ("wall_s", "cpu_s", "children_cpu_s"):
            m[key] += line[key]
    total_wall = sum(line["wall_s"] for line in lines)
    total_cpu = sum(line["cpu_s"] for line in lines)
    total_children = sum(line["children_cpu_s"] for line in lines)
    workers = sorted({line["worker"] for line in lines})
    head = [f"{len(lines)} tests on {len(workers)} pytest process(es)"]
    if wall is not None:
        head.append(f"suite wall {fmt(wall, 0)} s")
    if busy is not None:
        head.append(f"machine busy CPU over the run {fmt(busy, 0)} s ({fmt(busy / wall, 2)} cores)" if wall else
                    f"machine busy CPU {fmt(busy, 0)} s")
    head.append(f"sum of the tests' wall {fmt(total_wall, 0)} s; their own processes' CPU {fmt(total_cpu, 0)} s, "
                f"their subprocesses' {fmt(total_children, 0)} s"
                + (f"; the rest of the busy CPU ({fmt(busy - total_cpu - total_children, 0)} s) is Ray's worker "
                   "processes (trial and probe actors, tasks), Ray's daemons and pytest's collection" if busy is not None else ""))
    by_module = sorted(modules.items(), key=lambda kv: -kv[1]["wall_s"])
    rows = [[name, int(m["tests"]), fmt(m["wall_s"], 1), fmt(100 * m["wall_s"] / total_wall, 1), fmt(m["cpu_s"], 1),
             fmt(m["children_cpu_s"], 1)] for name, m in by_module[:top]]
    rest = by_module[top:]
    if rest:
        rows.append([f"{len(rest)} other modules", int(sum(m["tests"] for _, m in rest)),
                     fmt(sum(m["wall_s"] for _, m in rest), 1),
                     fmt(100 * sum(m["wall_s"] for _, m in rest) / total_wall, 1),
                     fmt(sum(m["cpu_s"] for _, m in rest), 1), fmt(sum(m["children_cpu_s"] for _, m in rest), 1)])
    slowest = sorted(lines, key=lambda line: -line["wall_s"])[:top]
    test_rows = [[line["test"].removeprefix("tests/"), fmt(line["wall_s"], 1), fmt(line["cpu_s"], 1),
                  fmt(line["children_cpu_s"], 1)] for line in slowest]
    return ("; ".join(head) + ".\n\n"
            + md_table(["module", "tests", "wall (s)", "share of the tests' wall (%)", "own CPU (s)",
                        "subprocess CPU (s)"], rows)
            + "\n\nThe slowest tests (a shared session fixture's build counted in its first reader):\n\n"
            + md_table(["test", "wall (s)", "own CPU (s)", "subprocess CPU (s)"], test_rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--from", dest="folder", type=Path, help="summarize the per-test lines of a finished run")
    parser.add_argument("--wall", type=float, help="with --from: the run's wall seconds, for the header")
    parser.add_argument("--busy-cpu", type=float, help="with --from: the machine's busy CPU seconds over the run")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if args.folder is not None:
        lines, wall, busy = read_lines(args.folder), args.wall, args.busy_cpu
    else:
        with tempfile.TemporaryDirectory() as folder:
            wall, busy, code = run_suite(Path(folder))
            if code != 0:
                print(f"the suite failed (exit {code}); its profile is not published", file=sys.stderr)
                return code
            lines = read_lines(Path(folder))
    publish(SECTION, summarize(lines, wall, busy, args.top), args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
