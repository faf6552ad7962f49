"""A run whose loss goes NaN / infinite stops by design: the driver records it, and the report calls it
diverged (a result), not incomplete (a gap), beside the runs that finished."""

from __future__ import annotations

import json

import pytest

from orchestrator.runfolder.run_folder import RunFolder
from orchestrator.schema.config import parse_sweep


@pytest.mark.slow  # a real sweep
def test_a_run_whose_loss_goes_nan_is_recorded_and_reported_as_diverged_not_incomplete(tmp_path, ray_session):
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.report import missing_runs, run_completeness

    sweep = parse_sweep({
        "name": "diverge", "tasks": [{"name": "iris"}], "grid": {"lr": [1e30, 1e-3], "q": [20]},
        "data": {"context_size": 30}, "training": {"epochs": 4, "checkpoint_epochs": [1, 2, 4]},
        "probe": {"bootstrap": 20, "suite": ["base", "position_first"], "base_as_checkpoint": False},
        "wandb": {"mode": "disabled"},
    })
    run_dir = tmp_path / "run"
    logs: list[str] = []
    results = run_sweep(None, run_dir, sweep=sweep, log=logs.append)
    huge = {r for r in results["run_id"] if "lr1e+30" in r}  # rows of the lr 1e30 run, if it stored any
    folder = RunFolder(run_dir)
    recorded = json.loads((run_dir / "diverged_runs.json").read_text())["runs"]
    assert recorded == sorted(folder.diverged_runs())
    assert len(recorded) == 1
    assert "lr1e+30" in recorded[0]  # the run with the absurd learning rate, not the other
    assert any(f"run {recorded[0]} diverged at epoch" in line for line in logs)
    # every checkpoint it did store was probed (no NaN scores reached the probe), and the other run is complete
    comp = run_completeness(folder.results(), (1, 2, 4), diverged=folder.diverged_runs()).set_index("run_id")
    assert (comp.drop(index=list(huge))["status"] == "complete").all()
    assert all(comp.loc[r, "status"] == "diverged" for r in huge)
    assert missing_runs(folder.results(), folder.sweep, folder.diverged_runs()) == {}
    assert missing_runs(folder.results(), folder.sweep)["single_fixed"][0] == 1 - len(huge)
    page = (run_dir / "report.html").read_text()
    assert "1 run(s) diverged (NaN loss) and stopped early: a result, not a gap" in page
    assert "have no stored checkpoint" not in page
