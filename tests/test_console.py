"""What the command prints and how it ends: a quiet console (Ray's, Tune's, W&B's and Python's warnings
in RUN_DIR/console.log unless --verbose), help that states every option's default and choices, and one
exit-status convention for every command (bad input 2, runtime failure 1, interrupted 130)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from iclmem.errors import DataError, ProbeError, SweepInterrupted
from iclmem.runfolder import CONSOLE_LOG_FILE, RESULTS_FILE
from iclmem.vocab import LabelMode, WandbMode, values
from orchestrator import cli

REPO = Path(__file__).resolve().parents[1]

# Python warnings raised in the driver during the sweep reach the console with their source path
# unless redirected; this one is raised where every sweep passes (aggregation), from this wrapper.
_WARNING_DRIVER = textwrap.dedent("""
    import sys
    import warnings

    import orchestrator.report.aggregate as A

    real = A.aggregate

    def aggregate(*args, **kwargs):
        warnings.warn("iclmem-test-warning raised in the driver", UserWarning)
        return real(*args, **kwargs)

    A.aggregate = aggregate

    # Tune warns that an operation "may be a performance bottleneck" only 60 s after it was imported;
    # with TUNE_WARN_THRESHOLD_S=0 and this clock moved back it warns at every step of this short sweep.
    import ray.tune.utils.util as tune_util

    tune_util.START_OF_TIME -= 120
    from orchestrator.cli import main

    sys.exit(main(sys.argv[1:]))
""")
NOISE = ("Token authentication", "performance bottleneck", "TensorBoard", "UserWarning", "iclmem-test-warning")


@pytest.mark.slow  # a real sweep and its resume, each with its own embedded Ray
def test_run_keeps_ray_tune_and_python_warnings_in_the_console_log_and_verbose_shows_them(tmp_path):
    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump({
        "name": "quiet", "tasks": [{"name": "iris"}], "grid": {"q": [20]}, "data": {"context_size": 30},
        "training": {"epochs": 2, "checkpoint_epochs": [1, 2]},
        "probe": {"bootstrap": 20, "suite": ["base", "position_first"], "base_as_checkpoint": False},
        "wandb": {"mode": "offline", "project": "iclmem-test"},
    }))
    driver = tmp_path / "driver.py"
    driver.write_text(_WARNING_DRIVER)
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}  # Ray's default: token auth, with its notice
    env.update({"PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "WANDB_SILENT": "true",
                "TUNE_WARN_THRESHOLD_S": "0"})  # every Tune step "may be a performance bottleneck" (see above)
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(driver), "run", str(config), "--out", str(run_dir)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console
    assert "[iclmem] done: 2 checkpoint results" in proc.stdout
    assert "[iclmem] trials" in proc.stdout
    for noise in NOISE:
        assert noise not in console, noise
    assert str(driver) not in console  # no warning's source path
    log = (run_dir / CONSOLE_LOG_FILE).read_text()
    for noise in NOISE:
        assert noise in log, noise
    assert f"{driver}:" in log  # the warning, with its source path, went to the log

    proc = subprocess.run([sys.executable, str(driver), "resume", str(run_dir), "--verbose"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console
    for noise in ("Token authentication", "TensorBoard", "iclmem-test-warning"):
        assert noise in console, noise


# ------------------------------------------------------------------------------------------ help
def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


COMMANDS = [path for path, _ in _parsers(cli.build_parser())]


def test_every_command_is_covered():
    assert {("probe",), ("lm", "run"), ("lm", "validate"), ("run",), ("resume",), ("report",)} <= set(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "iclmem")
def test_help_succeeds_and_states_every_options_default_and_choices(path, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([*path, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    parser = dict(_parsers(cli.build_parser()))[path]
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        line = formatter._expand_help(action)
        assert "default" in line, (path, action.option_strings, line)
        for choice in action.choices or ():
            assert str(choice) in line, (path, action.option_strings, choice)
        assert " ".join(line.split()[:3]) in " ".join(text.split())  # and that is what --help printed


def test_choices_come_from_the_vocabularies():
    parsers = dict(_parsers(cli.build_parser()))
    choices = {(path, a.dest): tuple(a.choices) for path, p in parsers.items() for a in p._actions if a.choices
               and not isinstance(a, argparse._SubParsersAction)}
    assert choices[(("probe",), "label_mode")] == values(LabelMode)
    for path in (("run",), ("report",), ("lm", "run")):
        assert choices[(path, "wandb")] == values(WandbMode)


def test_the_exit_statuses_are_documented_in_the_epilog(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert "exit status" in text
    assert "130" in text
    assert "bad input" in text
    assert "run time" in text


# ------------------------------------------------------------------------------------------ exit statuses
def _status(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:  # argparse's refusal of a flag
        return int(exc.code or 0)


@pytest.fixture
def bad_inputs(tmp_path):
    bad_sweep = tmp_path / "bad.yaml"
    bad_sweep.write_text(yaml.safe_dump({"name": "bad", "tasks": [{"name": "iris"}], "grid": {"q": [20]},
                                         "trainig": {"epochs": 2}}))  # misspelled key
    bad_lm = tmp_path / "bad_lm.yaml"
    bad_lm.write_text(yaml.safe_dump({"name": "bad", "probes": ["nonsense"], "nonsense_key": 1}))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / RESULTS_FILE).write_bytes(b"someone's table")
    return {"run": [["run", str(bad_sweep), "--out", str(tmp_path / "r")], ["run", str(bad_sweep), "--bogus"]],
            "probe": [["probe", str(tmp_path / "missing-ckpt"), "--task", "iris"],
                      ["probe", str(tmp_path / "missing-ckpt"), "--q", "many"]],
            "lm run": [["lm", "run", str(bad_lm), "--out", str(tmp_path / "l")], ["lm", "run", str(bad_lm), "--bogus"]],
            "report": [["report", str(foreign)], ["report", str(foreign), "--wandb", "sometimes"]]}


@pytest.mark.parametrize("command", ["run", "probe", "lm run", "report"])
def test_a_config_error_and_a_bad_flag_both_exit_2(bad_inputs, command, capsys):
    config_error, bad_flag = bad_inputs[command]
    assert _status(config_error) == 2
    assert "iclmem: error:" in capsys.readouterr().err
    assert _status(bad_flag) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize(("raised", "status", "message"), [
    (DataError("t.csv: no target column 'y'"), 2, "iclmem: error: t.csv: no target column 'y'"),
    (ProbeError("3 checkpoint(s) could not be probed"), 1, "iclmem: error: 3 checkpoint(s) could not be probed"),
    (SweepInterrupted("/runs/x"), 130, "interrupted \u2014 continue with `iclmem resume /runs/x`"),
    (KeyboardInterrupt(), 130, "iclmem: interrupted"),
])
def test_main_applies_one_status_per_kind_of_end(monkeypatch, capsys, raised, status, message):
    def fails(args):
        raise raised

    monkeypatch.setattr(cli, "cmd_report", fails)
    assert cli.main(["report", "somewhere"]) == status
    assert capsys.readouterr().err.strip() == message


def test_commands_other_than_run_print_python_warnings_in_one_line_without_their_source_path(monkeypatch, capsys):
    import warnings

    def warns(args):
        warnings.warn("TPR@0.01 rests on 0.5 expected false positives", UserWarning, stacklevel=1)
        warnings.warn("TPR@0.01 rests on 0.5 expected false positives", UserWarning, stacklevel=1)  # shown once
        return 0

    monkeypatch.setattr(cli, "cmd_report", warns)
    before = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert cli.main(["report", "somewhere"]) == 0
    err = capsys.readouterr().err
    assert err == "iclmem: warning: UserWarning: TPR@0.01 rests on 0.5 expected false positives\n"
    assert warnings.showwarning is before  # the process's own handling is back


def test_under_the_quiet_console_iclmems_own_warnings_still_reach_the_terminal_in_one_line(tmp_path):
    import io
    import warnings

    from iclmem.raysession import Console
    from orchestrator.driver.console import console_warnings

    terminal, log = io.StringIO(), io.StringIO()
    own = str(REPO / "trainables" / "data.py")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        previous = warnings.showwarning
        warnings.showwarning = lambda m, c, f, n, file=None, line=None: log.write(warnings.formatwarning(m, c, f, n))
        try:
            with console_warnings(Console(terminal, terminal)):
                for _ in range(2):
                    warnings.warn_explicit("task 't': column 'x' has only missing values and is dropped",
                                           UserWarning, own, 848)
                warnings.warn_explicit("a library's deprecation", DeprecationWarning, "/site-packages/lib.py", 3)
        finally:
            warnings.showwarning = previous
    assert terminal.getvalue() == "[iclmem] warning: task 't': column 'x' has only missing values and is dropped\n"
    assert f"{own}:848: UserWarning" in log.getvalue()
    assert "/site-packages/lib.py:3: DeprecationWarning" in log.getvalue()


@pytest.mark.parametrize("kind", ["tabular", "lm"])
def test_the_wandb_flag_overrides_the_mode_as_the_schemas_enum_without_a_serializer_warning(kind):
    import warnings

    if kind == "tabular":
        from orchestrator.schema.sweep_files import load_sweep
        config = load_sweep(Path(cli.__file__).resolve().parents[1] / "configs" / "quickstart.yaml")
    else:
        from orchestrator.schema.sweep_files import load_lm_sweep
        config = load_lm_sweep(Path(cli.__file__).resolve().parents[1] / "configs" / "lm_quickstart.yaml")
    from orchestrator.commands.cli_sweeps import with_wandb_mode

    changed = with_wandb_mode(config, "disabled")
    assert changed.wandb.mode is WandbMode.DISABLED
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pydantic's "Expected `enum`" serializer warning would raise
        assert changed.model_dump(mode="json")["wandb"]["mode"] == "disabled"
    assert config.wandb.mode is not WandbMode.DISABLED  # the loaded config is left as it was
