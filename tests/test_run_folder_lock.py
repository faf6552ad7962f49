"""One command at a time per run folder (issue #45): while a driver holds a folder (``iclmem.runlock``), ``run``,
``resume`` and ``report`` on it are refused with exit 2, naming the folder and the holder, before any cluster
work and without changing a byte; once the holder is killed, the next command takes the folder over and says so.

The holder is a real second process that takes the lock through the real code; no test here starts Ray."""

from __future__ import annotations

import hashlib
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from iclmem.errors import RunFolderInUse
from iclmem.runfolder import DRIVER_FILE, LOCK_FILE, SWEEP_FILE
from iclmem.runlock import hold_run_folder, read_holder

REPO = Path(__file__).resolve().parents[1]
# a driver as far as the lock goes: takes it through the real code, says so, and works (sleeps) until killed
HOLDER = ("import sys, time\n"
          "from iclmem.runlock import hold_run_folder\n"
          "with hold_run_folder(sys.argv[1], 'iclmem run'):\n"
          "    print('held', flush=True)\n"
          "    time.sleep(600)\n")


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _main(capsys, *args: str) -> tuple[int, str]:
    from orchestrator.cli import main

    code = main(list(args))
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """A small finished run folder made by the real writers without Ray (tests/test_atomic_writes.py's)."""
    from test_atomic_writes import _run_folder_writers

    run_dir = tmp_path_factory.mktemp("small") / "run"
    for _name, write in _run_folder_writers(run_dir, 0):
        write()
    return run_dir


@pytest.fixture
def held(small_run, tmp_path):
    """(a copy of the run folder, the process holding it): killed with SIGKILL at the end if still alive."""
    import shutil

    run_dir = shutil.copytree(small_run, tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield run_dir, proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _sweep_file(run_dir: Path, tmp_path: Path) -> Path:
    """The folder's own sweep as a sweep file: `iclmem run` of it would continue the folder."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(json.loads((run_dir / SWEEP_FILE).read_text())))
    return path


def _commands(run_dir: Path, tmp_path: Path) -> dict[str, list[str]]:
    return {"run": ["run", str(_sweep_file(run_dir, tmp_path)), "--out", str(run_dir), "--wandb", "disabled"],
            "resume": ["resume", str(run_dir)], "report": ["report", str(run_dir), "--wandb", "disabled"],
            "lm resume": ["lm", "resume", str(run_dir)]}


@pytest.mark.parametrize("command", ["run", "resume", "report", "lm resume"])
def test_a_folder_held_by_a_live_driver_is_refused_naming_it_and_left_byte_identical(held, tmp_path, capsys,
                                                                                       monkeypatch, command):
    import ray

    run_dir, proc = held
    started = ray.is_initialized()
    for module in ("orchestrator.driver.sweep", "orchestrator.driver.lm_sweep"):  # refused before any cluster work
        monkeypatch.setattr(f"{module}.ensure_ray", lambda *_a, **_k: pytest.fail("a refused command started Ray"))
    before = _digests(run_dir)
    code, err = _main(capsys, *_commands(run_dir, tmp_path)[command])
    assert code == 2, err
    assert f"{run_dir} is in use by another iclmem driver: pid {proc.pid} on host {socket.gethostname()}, started " in err
    assert "(`iclmem run`)" in err
    assert "Traceback" not in err
    assert _digests(run_dir) == before, "a refused command changed the folder"
    assert ray.is_initialized() == started


def test_the_folder_of_a_killed_driver_is_taken_over_by_the_next_command_saying_so(held, capsys):
    run_dir, proc = held
    proc.send_signal(signal.SIGKILL)  # no clean-up: its record stays, its lock goes with it
    proc.wait(timeout=30)
    assert read_holder(run_dir).pid == proc.pid
    code, err = _main(capsys, "report", str(run_dir), "--wandb", "disabled")
    assert code == 0, err
    assert f"{run_dir}: taking over from the iclmem driver pid {proc.pid} on host {socket.gethostname()}" in err
    assert not (run_dir / LOCK_FILE).exists(), "the lock outlived its command"
    assert not (run_dir / DRIVER_FILE).exists(), "the holder record outlived its command"


def test_the_lock_records_its_holder_and_refuses_a_second_holder_in_another_process(tmp_path):
    run_dir = tmp_path / "new"
    notes: list[str] = []
    with hold_run_folder(run_dir, "iclmem run", note=notes.append) as me:
        assert read_holder(run_dir) == me
        second = subprocess.run([sys.executable, "-c", HOLDER, str(run_dir)], cwd=REPO, capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 1
        assert RunFolderInUse.__name__ in second.stderr
        assert f"pid {me.pid}" in second.stderr
    assert notes == []
    assert not run_dir.exists(), "a folder made only to hold the lock was left behind"
