"""The suite profile (tests/suite_profile_hook.py, benchmarks/suite_profile.py): each test's wall and CPU seconds,
its own process's apart from its subprocesses', and the summary per module."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_TESTS = """
import subprocess, sys, time

def test_busy_here():
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass

def test_busy_in_a_subprocess():
    subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"],
                   check=True)

def test_waiting():
    time.sleep(0.5)
"""


def _benchmark():
    spec = importlib.util.spec_from_file_location("suite_profile", REPO / "benchmarks" / "suite_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_test_gets_its_wall_its_own_cpu_and_its_subprocesses_cpu_and_the_summary_ranks_modules(tmp_path):
    (tmp_path / "test_planted.py").write_text(_TESTS)
    folder = tmp_path / "profile"
    env = {**os.environ, "ICLMEM_SUITE_PROFILE": str(folder), "PYTHONPATH": str(REPO / "tests")}
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suite_profile_hook",
                           str(tmp_path / "test_planted.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line["test"].split("::")[-1]: line for line in map(json.loads, (folder / "main.jsonl").read_text().splitlines())}
    assert set(lines) == {"test_busy_here", "test_busy_in_a_subprocess", "test_waiting"}
    assert lines["test_busy_here"]["cpu_s"] >= 0.55
    assert lines["test_busy_here"]["children_cpu_s"] < 0.1
    assert lines["test_busy_in_a_subprocess"]["children_cpu_s"] >= 0.55
    assert lines["test_busy_in_a_subprocess"]["cpu_s"] < 0.3
    assert lines["test_waiting"]["wall_s"] >= 0.5
    assert lines["test_waiting"]["cpu_s"] < 0.2

    text = _benchmark().summarize(list(lines.values()), wall=3.0, busy=4.0, top=3)
    assert "3 tests on 1 pytest process(es)" in text
    assert "| test_planted.py | 3 |" in text
    slowest = [row.split("|")[1].strip() for row in text.split("The slowest tests")[1].splitlines() if "::" in row]
    by_wall = sorted(lines.values(), key=lambda line: -line["wall_s"])
    assert slowest == [line["test"].removeprefix("tests/") for line in by_wall]
