"""Where the suite's time goes, per test (benchmarks/suite_profile.py reads it): with ``ICLMEM_SUITE_PROFILE`` set
to a folder, every pytest process (each xdist worker) appends one JSON line per test to
``<folder>/<worker>.jsonl``: its node id, the wall seconds of its setup, call and teardown, the CPU seconds the
test's own process spent in them, and those of its waited-for subprocesses (the command-line drivers, the
simulated clusters' nodes). Ray's worker processes are the raylet's children, not the test's: their CPU is in
neither column (the machine-wide total is, in the benchmark's header). Unset, nothing is recorded."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

PROFILE_FOLDER_VARIABLE = "ICLMEM_SUITE_PROFILE"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    folder = os.environ.get(PROFILE_FOLDER_VARIABLE)
    if not folder:
        yield
        return
    wall, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
    yield
    line = {"test": item.nodeid, "wall_s": round(time.perf_counter() - wall, 3),
            "cpu_s": round(time.process_time() - cpu, 3), "children_cpu_s": round(_children_cpu() - children, 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
    path = Path(folder) / f"{line['worker']}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(line) + "\n")
