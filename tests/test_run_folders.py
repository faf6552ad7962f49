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
from iclmem.runfolder import FIGURES_DIR, PROBES_DIR, PROVENANCE_FILE, REPORT_FILE, RESULTS_FILE, SWEEP_FILE, TUNE_DIR
from orchestrator.driver.sweep import run_sweep
from orchestrator.report.folder_claims import record_sweep
from orchestrator.schema.config import parse_sweep

REPO = Path(__file__).resolve().parents[1]
SWEEP = {"name": "folders", "tasks": [{"name": "iris"}], "grid": {"q": [20]}, "data": {"context_size": 30},
         "training": {"epochs": 2, "checkpoint_epochs": [1, 2]}, "wandb": {"mode": "disabled"}}


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _users_folder(folder: Path) -> Path:
    (folder / FIGURES_DIR).mkdir(parents=True)
    (folder / REPORT_FILE).write_text("<html>my own report</html>")
    (folder / PROVENANCE_FILE).write_text('{"mine": true}')
    (folder / FIGURES_DIR / "plot.png").write_bytes(b"\x89PNG not really")
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
    assert out.returncode == 2
    assert f"{target} is a file, not a folder" in out.stderr
    assert "Traceback" not in out.stderr
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("kind", ["missing", "foreign"])
def test_report_refuses_a_folder_that_is_not_a_sweep_and_creates_or_overwrites_nothing(tmp_path, kind):
    folder = tmp_path / "somewhere"
    if kind == "foreign":
        folder.mkdir()
        (folder / RESULTS_FILE).write_bytes(b"the user's own table")
        before = _digests(folder)
    out = _cli("report", str(folder))
    assert out.returncode == 2
    assert "not an iclmem sweep folder" in out.stderr
    if kind == "missing":
        assert not folder.exists()
    else:
        assert _digests(folder) == before


@pytest.mark.parametrize("name", ["../../../x", "a/b", ".hidden", ""])
def test_a_task_name_that_would_leave_the_run_folder_is_refused(name):
    with pytest.raises(ConfigError, match=r"tasks\.0\.name"):
        parse_sweep({**SWEEP, "tasks": [{"name": name, "builtin": "iris"}]})


@pytest.mark.parametrize(("setting", "message"), [
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
    assert out.returncode == 2
    assert "duplicate key 'epochs'" in out.stderr


def test_version_names_the_package_and_the_commit():
    out = _cli("--version")
    assert out.returncode == 0
    assert out.stdout.startswith("iclmem 0.")
    assert "git " in out.stdout


# ----------------------------------------------------------------------------------------------------------
# #34: every command that writes claims its folder; a finished run is continued, never re-trained; a stored
# sweep that no longer matches its results, or a probes folder gone missing, is refused with the files intact
# ----------------------------------------------------------------------------------------------------------
def _main(capsys, *args: str) -> tuple[int, str]:
    from orchestrator.cli import main

    code = main(list(args))
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def finished(ray_session, tmp_path_factory) -> Path:
    """A finished sweep of two checkpoints, written by the real driver."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_sweep(None, run_dir, sweep=parse_sweep(SWEEP), progress=False, log=lambda _line: None)
    return run_dir


def _copy(run_dir: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(run_dir, target)
    return target


def _trial_files(run_dir: Path) -> dict[str, str]:
    return {k: v for k, v in _digests(run_dir / TUNE_DIR).items() if "checkpoint_" in k or k.endswith("result.json")}


@pytest.mark.slow  # a real sweep, run twice into one folder
def test_run_given_a_finished_folder_of_the_same_config_continues_it_without_retraining(finished, tmp_path):
    import pandas as pd

    run_dir = _copy(finished, tmp_path / "again")
    before = pd.read_parquet(run_dir / RESULTS_FILE)
    trained = _trial_files(run_dir)
    lines: list[str] = []
    after = run_sweep(None, run_dir, sweep=parse_sweep(SWEEP), progress=False, log=lines.append)
    assert any("holds this sweep already: continuing it" in line for line in lines), lines
    assert _trial_files(run_dir) == trained, "a finished trial was fine-tuned again"
    assert len(after) == len(before) == 3  # the base model's sanity row and two checkpoints
    assert after.sort_values("epoch")["auc"].tolist() == before.sort_values("epoch")["auc"].tolist()


@pytest.mark.slow  # reads the finished sweep
def test_resume_refuses_a_sweep_json_edited_after_the_results_naming_both_hashes(finished, tmp_path, capsys):
    import json

    run_dir = _copy(finished, tmp_path / "edited")
    stored = json.loads((run_dir / SWEEP_FILE).read_text())
    stored["grid"]["lr"] = [2e-3]
    (run_dir / SWEEP_FILE).write_text(json.dumps(stored))
    before = _digests(run_dir)
    code, err = _main(capsys, "resume", str(run_dir))
    assert code == 2, err
    edited_hash = parse_sweep(stored).config_hash()
    assert f"config hash {edited_hash}" in err
    assert f"hash {parse_sweep(SWEEP).config_hash()}" in err
    assert "Traceback" not in err
    assert _digests(run_dir) == before


@pytest.mark.slow  # reads the finished sweep
def test_report_refuses_to_replace_the_results_by_an_emptier_table_unless_forced(finished, tmp_path, capsys):
    import shutil

    import pandas as pd

    run_dir = _copy(finished, tmp_path / "pruned")
    shutil.rmtree(run_dir / PROBES_DIR)
    before = _digests(run_dir)
    code, err = _main(capsys, "report", str(run_dir))
    assert code == 2, err
    assert "holds results for 0 checkpoint(s)" in err
    assert "has 3 row(s)" in err
    assert "--force" in err
    assert _digests(run_dir) == before, "a refused report changed the folder"
    code, err = _main(capsys, "report", str(run_dir), "--force")
    assert code == 0, err
    assert len(pd.read_parquet(run_dir / RESULTS_FILE)) == 0


@pytest.mark.slow  # reads the finished sweep
@pytest.mark.parametrize("command", ["report", "resume"])
def test_a_damaged_sweep_json_is_one_line_naming_it_with_exit_2(finished, tmp_path, capsys, command):
    run_dir = _copy(finished, tmp_path / "damaged")
    (run_dir / SWEEP_FILE).write_text("{garbage")
    before = _digests(run_dir)
    code, err = _main(capsys, command, str(run_dir))
    assert code == 2, err
    assert "sweep.json: damaged, not the JSON iclmem wrote" in err
    assert "Traceback" not in err
    assert _digests(run_dir) == before


def test_an_out_folder_that_cannot_be_written_is_refused_before_stage_one(tmp_path, capsys):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(SWEEP))
    code, err = _main(capsys, "run", str(sweep), "--out", "/proc/iclmem-cannot-write-here")
    assert code == 2, err
    assert "--out /proc/iclmem-cannot-write-here: /proc is not writable" in err
    assert "Traceback" not in err


def test_a_non_utf8_sweep_file_is_one_line_naming_the_byte_and_line(tmp_path, capsys):
    sweep = tmp_path / "latin1.yaml"
    sweep.write_bytes("name: caf\u00e9\ntasks: [{name: iris}]\n".encode("latin-1"))
    code, err = _main(capsys, "validate", str(sweep), "--schema-only")
    assert code == 2, err
    assert f"{sweep}: not UTF-8 text (byte 0xe9 on line 1)" in err


def test_storage_that_cannot_keep_checkpoints_is_named_before_ray_starts(tmp_path):
    from orchestrator.driver.storage import unreachable_storage

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert "is a file" in unreachable_storage(str(a_file / "tune"))
    assert unreachable_storage(str(tmp_path / "new" / "tune")) is None
    assert "not writable" in unreachable_storage("/proc/iclmem-storage")
    # a bucket that cannot be reached (no network here; elsewhere no such bucket) is an answer, not a hang
    why = unreachable_storage("gs://iclmem-no-such-bucket-7f3a9c/x", timeout_s=1)
    assert why, "an unreachable bucket was accepted"


# ----------------------------------------------------------------------------------------------------------
# #45: an empty --out or RUN_DIR (an unset shell variable) is refused, never read as "the default folder"
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["run", "sweep.yaml", "--out", ""], ["run", "sweep.yaml", "--out", "  "], ["lm", "run", "lm.yaml", "--out", ""],
    ["probe", "checkpoint", "--task", "iris", "--out", ""], ["audit-context", "iris", "--model", "pfn-mini", "--out", ""],
    ["resume", ""], ["report", " "], ["lm", "resume", ""],
], ids=lambda argv: " ".join(a if a.strip() else repr(a) for a in argv))
def test_an_empty_out_or_run_dir_is_refused_with_exit_2_and_nothing_written(tmp_path, monkeypatch, capsys, argv):
    from orchestrator.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))
    (tmp_path / "lm.yaml").write_text((REPO / "configs" / "lm_quickstart.yaml").read_text())
    before = _digests(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    what = "--out" if "--out" in argv else "RUN_DIR"
    assert f"{what} is empty" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm.yaml", "sweep.yaml"]  # no runs/<name>-<time>
    assert _digests(tmp_path) == before


# ----------------------------------------------------------------------------------------------------------
# #45: `report` checks sweep.json against the config its results were made with, as `resume` does (one check,
# orchestrator.report.folder_claims.results_config_mismatch); a folder with results but no provenance.json is refused by both
# ----------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """A small finished run folder made by the real writers without Ray (sweep.json, provenance.json, a
    fine-tuned checkpoint, its probe result, the tables and the report: tests/test_atomic_writes.py's)."""
    from test_atomic_writes import _run_folder_writers

    run_dir = tmp_path_factory.mktemp("small") / "run"
    for _name, write in _run_folder_writers(run_dir, 0):
        write()
    return run_dir


def _edit_outcome(run_dir: Path) -> tuple[str, str]:
    """sweep.json's outcome block edited by hand; (the recorded hash, the edited one)."""
    import json

    stored = json.loads((run_dir / SWEEP_FILE).read_text())
    recorded = parse_sweep(stored).config_hash()
    stored["outcome"] = {**stored["outcome"], "rule": "paper", "memorization_auc": 0.6}
    (run_dir / SWEEP_FILE).write_text(json.dumps(stored))
    return recorded, parse_sweep(stored).config_hash()


def test_report_refuses_a_sweep_json_whose_outcome_was_edited_naming_both_hashes(small_run, tmp_path, capsys):
    run_dir = _copy(small_run, tmp_path / "edited")
    recorded, edited = _edit_outcome(run_dir)
    before = _digests(run_dir)
    code, err = _main(capsys, "report", str(run_dir), "--wandb", "disabled")
    assert code == 2, err
    assert f"{run_dir / SWEEP_FILE} (config hash {edited}) no longer matches" in err
    assert f"{run_dir / PROVENANCE_FILE}: hash {recorded}" in err
    assert "iclmem report --force" in err
    assert "Traceback" not in err
    assert _digests(run_dir) == before, "a refused report changed the folder"


def test_report_force_reports_an_edited_sweep_json_anyway_marked_as_forced(small_run, tmp_path, capsys):
    run_dir = _copy(small_run, tmp_path / "forced")
    _recorded, edited = _edit_outcome(run_dir)
    code, err = _main(capsys, "report", str(run_dir), "--wandb", "disabled", "--force")
    assert code == 0, err
    assert "reporting anyway (--force)" in err
    page = (run_dir / REPORT_FILE).read_text()
    assert "(forced)</title>" in page
    assert '<section id="forced">' in page
    assert f"config hash {edited}" in page
    assert page.index('id="forced"') < page.index('id="summary"'), "the mark is not above the rule it qualifies"


def test_report_of_an_unedited_folder_is_not_marked_as_forced(small_run, tmp_path, capsys):
    run_dir = _copy(small_run, tmp_path / "plain")
    code, err = _main(capsys, "report", str(run_dir), "--wandb", "disabled")
    assert code == 0, err
    assert "forced" not in (run_dir / REPORT_FILE).read_text().lower()


@pytest.mark.parametrize("command", ["resume", "report"])
def test_a_folder_with_results_but_no_provenance_is_refused_saying_what_is_missing(small_run, tmp_path, capsys,
                                                                                      command):
    run_dir = _copy(small_run, tmp_path / "no-provenance")
    (run_dir / PROVENANCE_FILE).unlink()
    before = _digests(run_dir)
    code, err = _main(capsys, command, str(run_dir))
    assert code == 2, err
    assert f"{run_dir} holds results (results.parquet and probes/) but no provenance.json" in err
    assert "Traceback" not in err
    assert _digests(run_dir) == before
    assert not (run_dir / PROVENANCE_FILE).exists(), "provenance.json was written again over the old rows"


def test_report_force_reports_a_folder_without_provenance_marked_as_forced(small_run, tmp_path, capsys):
    run_dir = _copy(small_run, tmp_path / "no-provenance-forced")
    (run_dir / PROVENANCE_FILE).unlink()
    code, err = _main(capsys, "report", str(run_dir), "--wandb", "disabled", "--force")
    assert code == 0, err
    assert "but no provenance.json" in (run_dir / REPORT_FILE).read_text()


def _make_folder(path: Path) -> None:
    path.unlink() if path.is_file() else None
    path.mkdir(parents=True)


def _make_file(path: Path) -> None:
    import shutil

    shutil.rmtree(path) if path.is_dir() else None
    path.write_text("not what iclmem keeps here")


@pytest.mark.parametrize(("command", "entry", "damage", "message"), [
    ("resume", "run_state.json", _make_folder, "run_state.json is a folder, not a file"),
    ("resume", "console.log", _make_folder, "console.log is a folder, not a file"),
    ("resume", "prepared", _make_file, "prepared is a file, not a folder"),
    ("report", "wandb", _make_file, "wandb is a file, not a folder"),
    ("report", "wandb/trial_runs.json", _make_folder, "trial_runs.json is a folder, not a file"),
    ("report", "split_report.parquet", _make_file, "split_report.parquet: damaged split report"),
])
def test_a_damaged_run_folder_is_named_and_refused_by_resume_and_report_before_anything_is_rewritten(
        finished, tmp_path, capsys, command, entry, damage, message):
    """A folder where a file belongs, a file where a folder belongs, a damaged table Stage I wrote: exit 2, one
    line naming the entry, and every other file of the folder keeps its bytes (no results, risk table or report
    rewritten first)."""
    from orchestrator.cli import main

    run_dir = _copy(finished, tmp_path / "damaged")
    damage(run_dir / entry)
    before = _digests(run_dir)
    assert main([command, str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("iclmem: error: "), err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert _digests(run_dir) == before


def _fills_the_disk_after(path: Path) -> None:
    import errno

    (path / "context_audit.parquet").write_bytes(b"half an audit")
    raise OSError(errno.ENOSPC, "No space left on device", str(path / "context_scores.parquet"))


@pytest.mark.parametrize("start", ["missing", "empty"])
def test_a_disk_that_runs_full_mid_audit_leaves_no_half_audit_and_says_so(tmp_path, start):
    """undo_if_refused, as every audit command writes its folder: a full disk mid-way removes what the command
    wrote in a folder it found new or empty, and ends as DiskFull (exit 1) naming the folder; an error that is not
    a full disk keeps what was written."""
    from iclmem.errors import DiskFull
    from iclmem.runfolder import undo_if_refused

    out = tmp_path / "audit"
    if start == "empty":
        out.mkdir()
    def audit(folder: Path) -> None:
        with undo_if_refused(folder):
            folder.mkdir(exist_ok=True)
            _fills_the_disk_after(folder)

    with pytest.raises(DiskFull, match=r"audit: the disk ran full .* removed") as caught:
        audit(out)
    assert caught.value.exit_code == 1
    assert not out.exists() if start == "missing" else list(out.iterdir()) == []

    def crashes(folder: Path) -> None:
        with undo_if_refused(folder):
            folder.mkdir()
            (folder / "kept.parquet").write_bytes(b"kept")
            raise RuntimeError("a crash is not a full disk")

    with pytest.raises(RuntimeError):
        crashes(tmp_path / "crash")
    assert (tmp_path / "crash" / "kept.parquet").read_bytes() == b"kept"


def test_a_full_disk_under_any_command_is_one_line_and_exit_1_not_a_traceback(monkeypatch, capsys):
    import errno

    from orchestrator import cli

    def fills(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/results.parquet")

    monkeypatch.setattr(cli, "cmd_report", fills)
    assert cli.main(["report", "somewhere"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("iclmem: error: the disk ran full writing /runs/x/results.parquet"), err
    assert err.endswith("free some space and run the command again"), err
    assert len(err.splitlines()) == 1

    def breaks(args):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(cli, "cmd_report", breaks)
    with pytest.raises(OSError, match="Permission denied"):  # only a full disk is turned into a message here
        cli.main(["report", "somewhere"])
