"""A run never writes over a user's files: run and report refuse folders that are not theirs, names that
would leave the run folder are refused at validation, and the sweep file's silent traps are errors."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from iclmem.errors import ConfigError
from orchestrator.config import parse_sweep
from orchestrator.sweep import record_sweep, run_sweep

REPO = Path(__file__).resolve().parents[1]
SWEEP = {"name": "folders", "tasks": [{"name": "iris"}], "grid": {"q": [20]}, "data": {"context_size": 30},
         "training": {"epochs": 2, "checkpoint_epochs": [1, 2]}, "wandb": {"mode": "disabled"}}


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _users_folder(folder: Path) -> Path:
    (folder / "figures").mkdir(parents=True)
    (folder / "report.html").write_text("<html>my own report</html>")
    (folder / "provenance.json").write_text('{"mine": true}')
    (folder / "figures" / "plot.png").write_bytes(b"\x89PNG not really")
    return folder


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", WANDB_MODE="disabled")
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_run_refuses_a_folder_of_someone_elses_files_and_leaves_them_byte_identical(tmp_path):
    folder = _users_folder(tmp_path / "mine")
    before = _digests(folder)
    with pytest.raises(ConfigError, match="not an iclmem run folder"):
        run_sweep(None, folder, sweep=parse_sweep(SWEEP), progress=False)
    assert _digests(folder) == before


def test_run_refuses_a_run_folder_of_another_config_and_points_to_resume(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    record_sweep(folder, parse_sweep({**SWEEP, "grid": {"q": [25]}}))
    before = _digests(folder)
    with pytest.raises(ConfigError, match=r"another config .*iclmem resume"):
        run_sweep(None, folder, sweep=parse_sweep(SWEEP), progress=False)
    assert _digests(folder) == before


def test_an_existing_file_as_run_folder_is_refused_by_the_cli_without_a_traceback(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(SWEEP))
    target = tmp_path / "a-file"
    target.write_text("keep me")
    out = _cli("run", str(sweep), "--out", str(target))
    assert out.returncode == 2 and "not an iclmem run folder" in out.stderr and "Traceback" not in out.stderr
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("kind", ["missing", "foreign"])
def test_report_refuses_a_folder_that_is_not_a_sweep_and_creates_or_overwrites_nothing(tmp_path, kind):
    folder = tmp_path / "somewhere"
    if kind == "foreign":
        folder.mkdir()
        (folder / "results.parquet").write_bytes(b"the user's own table")
        before = _digests(folder)
    out = _cli("report", str(folder))
    assert out.returncode == 2 and "not an iclmem sweep folder" in out.stderr
    if kind == "missing":
        assert not folder.exists()
    else:
        assert _digests(folder) == before


@pytest.mark.parametrize("name", ["../../../x", "a/b", ".hidden", ""])
def test_a_task_name_that_would_leave_the_run_folder_is_refused(name):
    with pytest.raises(ConfigError, match=r"tasks\.0\.name"):
        parse_sweep({**SWEEP, "tasks": [{"name": name, "builtin": "iris"}]})


@pytest.mark.parametrize("setting, message", [
    ({"training": {"epochs": 5, "checkpoint_epochs": [1, 5, 10]}}, r"checkpoint_epochs \[10\] exceed epochs \(5\)"),
    ({"probe": {"bootstrap": 0}}, "probe.bootstrap"),
])
def test_settings_that_would_silently_do_less_are_refused(setting, message):
    with pytest.raises(ConfigError, match=message):
        parse_sweep({**SWEEP, **setting})


def test_the_default_checkpoint_schedule_stops_at_the_last_epoch():
    sweep = parse_sweep({**SWEEP, "training": {"epochs": 7}})
    assert max(e for e in sweep.training.checkpoint_epochs if e <= 7) == 5  # the paper's schedule, cut at 7


def test_a_key_given_twice_in_a_sweep_file_is_an_error_naming_it(tmp_path):
    sweep = tmp_path / "twice.yaml"
    sweep.write_text("name: twice\ntasks: [{name: iris}]\ntraining:\n  epochs: 5\n  epochs: 6\n")
    out = _cli("validate", str(sweep), "--schema-only")
    assert out.returncode == 2 and "duplicate key 'epochs'" in out.stderr


def test_version_names_the_package_and_the_commit():
    out = _cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("iclmem 0.") and "git " in out.stdout
