"""Ctrl-C: the first stops a sweep within seconds with a bounded clean-up, keeps every finished result,
records the interruption in the run folder, says how to continue, and exits 130; `iclmem resume` then
yields the table of an uninterrupted run. A second Ctrl-C exits at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from iclmem.record import VOLATILE_COLUMNS
from iclmem.runfolder import RESULTS_FILE, RUN_STATE_FILE, RunStatus, read_run_state

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0", "WANDB_MODE": "offline",
       "WANDB_SILENT": "true"}
SWEEP = {
    "name": "ctrl-c",
    "tasks": [{"name": "iris"}],
    "grid": {"lr": [1e-3, 3e-3, 1e-2], "q": [20]},
    "data": {"context_size": 30},
    "training": {"epochs": 40, "checkpoint_epochs": [1, 20, 40]},
    "probe": {"bootstrap": 20, "suite": ["base", "position_first"], "base_as_checkpoint": False},
    "resources": {"max_concurrent_trials": 1, "cpus_per_probe_actor": 0.5},
    "wandb": {"mode": "offline", "project": "iclmem-test"},  # trial runs open when Ctrl-C comes
}


def _cli(*args: str) -> subprocess.Popen:
    # A session of its own, so the test can signal the whole process group as a terminal's Ctrl-C does
    # (the driver, the embedded Ray's processes and the wandb service all get it).
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _table(run_dir: Path) -> pd.DataFrame:
    volatile = list(VOLATILE_COLUMNS)
    results = pd.read_parquet(run_dir / RESULTS_FILE).drop(columns=volatile)
    return results.sort_values(["run_id", "epoch"]).reset_index(drop=True)


@pytest.mark.slow  # three real sweeps (interrupted, resumed, uninterrupted), each with its own Ray
def test_ctrl_c_stops_a_real_sweep_within_seconds_and_resume_gives_the_uninterrupted_table(tmp_path, ray_session):
    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump(SWEEP))
    run_dir = tmp_path / "run"
    driver = _cli("run", str(config), "--out", str(run_dir))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list((run_dir / "probes").glob("*/e0001.json")):
        assert driver.poll() is None, driver.communicate()[0]
        time.sleep(0.2)
    assert list((run_dir / "probes").glob("*/e0001.json")), "no checkpoint result within 300 s"

    sent = time.monotonic()
    os.killpg(driver.pid, signal.SIGINT)
    try:
        out, _ = driver.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        pytest.fail(f"still running 30 s after Ctrl-C: {driver.communicate()[0][-3000:]}")
    seconds = time.monotonic() - sent
    print(f"SIGINT to exit: {seconds:.1f} s")
    assert driver.returncode == 130, out
    assert out.strip().splitlines()[-1] == f"interrupted \u2014 continue with `iclmem resume {run_dir.resolve()}`"
    assert "[iclmem] done" not in out
    assert "Tuner.restore" not in out
    state = read_run_state(run_dir)
    assert state is not None
    assert state["status"] == RunStatus.INTERRUPTED
    assert len(state["incomplete_runs"]) >= 1  # the sweep of three 40-epoch runs stopped at the first result
    kept = sorted(p.relative_to(run_dir) for p in (run_dir / "probes").rglob("*.json"))
    assert kept  # the finished probe results survive the interruption

    resumed = _cli("resume", str(run_dir))
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    assert json.loads((run_dir / RUN_STATE_FILE).read_text())["status"] == "complete"
    assert all((run_dir / p).is_file() for p in kept)

    # the uninterrupted reference run, in this process on the session's Ray (the drivers above had their own)
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.schema.config import parse_sweep

    clean_dir = tmp_path / "clean"
    run_sweep(None, clean_dir, sweep=parse_sweep(SWEEP), progress=False, log=lambda _line: None)
    pd.testing.assert_frame_equal(_table(run_dir), _table(clean_dir))


_HANGING_CLEANUP = textwrap.dedent("""
    import time
    from orchestrator.driver.console import catch_interrupts

    with catch_interrupts() as interrupts:
        interrupts.run_dir = "/runs/somewhere"
        {set_command}
        try:
            print("running", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print("cleaning up", flush=True)
            time.sleep(60)  # a clean-up that never ends, as W&B's did
    print("clean-up finished", flush=True)
""")


def _hanging_driver(set_command: str = "pass") -> subprocess.Popen:
    """A process inside catch_interrupts whose clean-up never ends, started and running."""
    script = _HANGING_CLEANUP.replace("{set_command}", set_command)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "running"
    return proc


@pytest.mark.parametrize(("set_command", "command"), [("pass", "iclmem resume"),
                                                  ("interrupts.resume_command = 'iclmem lm resume'", "iclmem lm resume")])
def test_a_second_ctrl_c_exits_at_once_even_while_the_clean_up_hangs(set_command, command):
    proc = _hanging_driver(set_command)
    try:
        assert proc.stdout is not None
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == "cleaning up"  # the first Ctrl-C starts the clean-up
        time.sleep(0.5)
        assert proc.poll() is None  # ... and the process waits for it
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=5)
        assert time.monotonic() - sent < 2
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = proc.communicate()
    assert proc.returncode == 130
    assert "clean-up finished" not in out
    assert f"interrupted again, exiting at once; `{command} /runs/somewhere` continues it" in err


def test_sigterm_from_a_scheduler_starts_the_same_clean_stop_as_ctrl_c():
    """scancel, a Slurm time limit and Kubernetes deleting a pod send SIGTERM: the driver cleans up as after a
    first Ctrl-C (the run recorded as interrupted) instead of dying on the spot."""
    proc = _hanging_driver()
    try:
        assert proc.stdout is not None
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline().strip() == "cleaning up"
        proc.send_signal(signal.SIGTERM)  # a second one exits at once, as a second Ctrl-C does
        proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130


def test_the_handler_is_removed_after_the_sweep():
    from orchestrator.driver.console import catch_interrupts

    before, before_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with catch_interrupts() as interrupts:
        assert signal.getsignal(signal.SIGINT) == interrupts.handler
        assert signal.getsignal(signal.SIGTERM) == interrupts.handler
        assert os.environ["TUNE_DISABLE_SIGINT_HANDLER"] == "1"  # Tune's own handler would hide the Ctrl-C
    assert signal.getsignal(signal.SIGINT) is before
    assert signal.getsignal(signal.SIGTERM) is before_term


SMALL = {"name": "small", "tasks": [{"name": "iris"}], "grid": {"q": [20], "lr": [1e-3, 3e-3]},
         "data": {"context_size": 30}, "training": {"epochs": 2, "checkpoint_epochs": [1, 2]},
         "wandb": {"mode": "disabled"}}


def test_ctrl_c_during_stage_one_of_a_new_run_leaves_no_folder_and_says_to_start_again(tmp_path, monkeypatch):
    from iclmem.errors import SweepInterrupted
    from orchestrator.driver import sweep as S
    from orchestrator.report import folder_claims
    from orchestrator.schema.config import parse_sweep

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(folder_claims, "prepare_sweep", interrupted)  # Stage I (prepare_in_place_or_staged's)
    run_dir = tmp_path / "run"
    with pytest.raises(SweepInterrupted) as caught:
        S.run_sweep(None, run_dir, sweep=parse_sweep(SMALL), progress=False)
    assert not run_dir.exists()
    assert not list(tmp_path.iterdir())
    assert str(caught.value) == (f"interrupted before the run folder was written \u2014 start again with "
                                 f"`iclmem run CONFIG --out {run_dir.resolve()}`")
    assert caught.value.exit_code == 130


def test_ctrl_c_after_the_folder_exists_records_the_interruption_and_every_unfinished_run(tmp_path, monkeypatch):
    from iclmem.errors import SweepInterrupted
    from orchestrator.driver import sweep as S
    from orchestrator.schema.config import parse_sweep

    def interrupted(*args, **kwargs):  # Ctrl-C while Ray starts, before any trial ran
        raise KeyboardInterrupt

    monkeypatch.setattr(S, "ensure_ray", interrupted)
    run_dir = tmp_path / "run"
    with pytest.raises(SweepInterrupted, match=f"continue with `iclmem resume {run_dir.resolve()}`"):
        S.run_sweep(None, run_dir, sweep=parse_sweep(SMALL), progress=False)
    state = read_run_state(run_dir)
    assert state is not None
    assert state["status"] == RunStatus.INTERRUPTED
    assert len(state["incomplete_runs"]) == 2  # neither run had started


_RAY_AND_A_HANGING_CLEANUP = textwrap.dedent("""
    import time
    from iclmem.raysession import ensure_ray
    from orchestrator.driver.console import catch_interrupts

    with catch_interrupts() as interrupts:
        interrupts.run_dir = "/runs/somewhere"
        ensure_ray(None, num_cpus=1)  # the embedded Ray a sweep starts: raylet, GCS, dashboard and runtime-env agents
        try:
            print("running", flush=True)
            time.sleep(120)
        except KeyboardInterrupt:
            print("cleaning up", flush=True)
            time.sleep(120)
""")


@pytest.mark.slow  # starts an embedded Ray of its own
def test_a_second_ctrl_c_leaves_no_process_of_the_embedded_ray_behind(isolated_ray_env):
    """#34 saw Ray's dashboard and runtime-env agents outlive a second Ctrl-C. A terminal's Ctrl-C, twice,
    to the process group of a driver whose clean-up hangs: every process of its embedded Ray (found by the
    environment marker they inherit) is gone within 20 s of the driver's exit, without anyone killing them."""
    from conftest import MARKER, _marked

    env, _root, _token = isolated_ray_env
    proc = subprocess.Popen([sys.executable, "-c", _RAY_AND_A_HANGING_CLEANUP], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None, proc.stderr
        assert proc.stdout.readline().strip() == "running", proc.stderr
        assert len(_marked(env[MARKER])) > 3, "the embedded Ray is not running"
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.stdout.readline().strip() == "cleaning up"
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _marked(env[MARKER]):
        time.sleep(0.5)
    left = [" ".join(p.cmdline())[:120] for p in _marked(env[MARKER])]
    assert not left, f"processes outlived the second Ctrl-C: {left}"
