"""What a new user reads first (issue #62, "first impressions"): ``iclmem models`` names every set of weights
usable here, the shipped minis included, and a context-only sweep's summary lines say what it did (its audits),
not "0 checkpoint results" / "0 prepared task(s)". No Ray, no training."""

from __future__ import annotations

import argparse
import re

import pandas as pd
import yaml

from orchestrator.commands import cli_sweeps
from orchestrator.commands.cli_audits import cmd_models, weights_lines
from orchestrator.commands.cli_sweeps import finished_line, split_checks_line


def _section(text: str, model: str) -> str:
    """One model's block of the ``iclmem models`` listing."""
    match = re.search(rf"^{re.escape(model)}\n((?:  .*\n)+)", text, flags=re.MULTILINE)
    assert match, text
    return match.group(1)


def test_models_lists_the_shipped_minis_as_ready_to_run_when_the_hub_checkpoint_is_absent(monkeypatch, capsys):
    from trainables.models import checkpoints, extras

    monkeypatch.setattr(checkpoints, "is_available", lambda _name: False)  # no hub checkpoint in the cache
    monkeypatch.setattr(extras, "extra_is_installed", lambda _name: True)
    assert cmd_models(argparse.Namespace()) == 0
    out = capsys.readouterr().out
    for model in ("tabicl", "tabpfn-v2"):
        block = _section(out, model)
        assert "weights:  hub (the default): NOT on this machine" in block
        assert re.search(rf"mini \(shipped with iclmem, {re.escape(model)}'s own architecture made small\): "
                         rf"on this machine; run it with models: \[\{{name: {re.escape(model)}, "
                         r"options: \{weights: mini\}\}\]", block), block
    assert "mini (shipped" not in _section(out, "contexttab")  # no mini of its own: only the hub line


def test_models_says_pfn_minis_default_weights_are_here_on_one_line():
    assert weights_lines("pfn-mini") == ["shipped (the default): on this machine"]


def test_models_says_a_shipped_mini_missing_from_a_partial_install_is_not_here(monkeypatch, tmp_path):
    from trainables.models import checkpoints

    monkeypatch.setattr(checkpoints, "WEIGHTS_DIR", tmp_path)  # an install without the weights folder's files
    monkeypatch.setattr(checkpoints, "is_available", lambda _name: False)
    (mini,) = weights_lines("tabicl")[1:]
    assert mini.startswith("mini (shipped with iclmem")
    assert "NOT on this machine" in mini
    assert "reinstall" in mini


def test_models_says_a_mini_whose_package_is_missing_cannot_run_yet(monkeypatch):
    from trainables.models import checkpoints, extras

    monkeypatch.setattr(extras, "extra_is_installed", lambda _name: False)
    monkeypatch.setattr(checkpoints, "is_available", lambda _name: False)
    (mini,) = weights_lines("tabpfn-v2")[1:]
    assert "on this machine; its package is missing" in mini
    assert "run it with" not in mini


def test_a_context_only_sweep_ends_with_its_audit_count_not_zero_checkpoint_results(tmp_path):
    line = finished_line("done", pd.DataFrame(), 3, tmp_path)
    assert line == f"done: 3 deployed-context audits; report at {tmp_path / 'report.html'}"
    assert "checkpoint" not in finished_line("resumed", None, 1, tmp_path)
    assert finished_line("resumed", None, 1, tmp_path).startswith("resumed: 1 deployed-context audit;")


def test_a_sweep_with_trials_still_counts_its_checkpoint_results_and_adds_its_audits(tmp_path):
    two = pd.DataFrame({"run_id": ["a", "b"]})
    assert finished_line("done", two, 0, tmp_path).startswith("done: 2 checkpoint results; report at ")
    assert finished_line("done", two, 4, tmp_path).startswith(
        "done: 2 checkpoint results and 4 deployed-context audits; report at ")


def test_validate_counts_a_context_only_sweeps_audits_as_passing_the_split_checks():
    line = split_checks_line("ctx.yaml", 0, 2)
    assert line.startswith("ctx.yaml: 2 deployed-context audit(s) (regime context, prepared in memory")
    assert line.endswith("pass the split checks")
    assert "0 prepared" not in line
    assert split_checks_line("ft.yaml", 3, 0) == "ft.yaml: 3 prepared task(s) pass the split checks"
    assert split_checks_line("both.yaml", 3, 2).startswith("both.yaml: 3 prepared task(s) and 2 deployed-context")


def _context_only_config(tmp_path) -> str:
    path = tmp_path / "ctx.yaml"
    path.write_text(yaml.safe_dump({
        "name": "ctx", "tasks": [{"name": "iris"}], "models": [{"name": "pfn-mini"}],
        "grid": {"regime": ["context"], "q": [16], "seed": [0, 1]},
        "probe": {"context_references": 4, "bootstrap": 10, "null_splits": 1},
        "resources": {"cpus_per_probe_actor": 0.5, "cpus_per_trial": 0.5}, "wandb": {"mode": "disabled"}}))
    return str(path)


def test_iclmem_run_of_a_context_only_sweep_prints_done_with_its_audits(monkeypatch, tmp_path, capsys):
    import orchestrator.driver.sweep
    import orchestrator.runfolder.prepare

    monkeypatch.setattr(orchestrator.driver.sweep, "run_sweep", lambda *_a, **_k: pd.DataFrame())  # no Ray
    monkeypatch.setattr(orchestrator.runfolder.prepare, "check_models", lambda *_a: None)
    args = argparse.Namespace(config=_context_only_config(tmp_path), wandb=None, address=None,
                              out=str(tmp_path / "run"), quiet=True, num_cpus=None, verbose=False)
    assert cli_sweeps.cmd_run(args) == 0
    out = capsys.readouterr().out
    assert f"[iclmem] done: 2 deployed-context audits; report at {tmp_path / 'run' / 'report.html'}" in out
    assert "0 checkpoint results" not in out


def test_iclmem_validate_of_a_context_only_sweep_reports_its_audits_splits_not_zero_tasks(tmp_path, capsys):
    config = _context_only_config(tmp_path)
    assert cli_sweeps.cmd_validate(argparse.Namespace(config=config, schema_only=False)) == 0
    out = capsys.readouterr().out
    assert f"{config}: 2 deployed-context audit(s) (regime context" in out
    assert "0 prepared task(s)" not in out
