"""The bytes a sweep writes, predicted before it runs (``orchestrator.estimate.estimate_disk``): by hand for each
``training.keep_checkpoints``, and a sweep without room refused before Ray starts, naming the numbers."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.estimate import estimate_disk
from orchestrator.estimate.estimate_disk import (
    TUNE_REPORT_BYTES,
    TUNE_STATE_BYTES_PER_TRIAL,
    TUNE_TRIAL_BYTES,
    predict_disk,
)
from orchestrator.estimate.estimate_measure import UnitCosts
from orchestrator.estimate.estimate_work import count_work
from orchestrator.schema.sweep_files import load_sweep

SWEEP = {
    "name": "disk",
    "tasks": [{"name": "iris"}],
    "grid": {"lr": [1e-3, 1e-2], "q": [20], "label_mode": ["normal", "shuffled_members"]},
    "data": {"context_size": 40},
    "training": {"epochs": 4, "checkpoint_epochs": [1, 2, 4]},
    "probe": {"bootstrap": 20, "suite": ["base", "position_first"]},
    "wandb": {"mode": "disabled"},
}


def _costs(work) -> dict:
    zero = dict.fromkeys(("prepare_s", "epoch_s", "save_s", "plan_s", "score_per_context_s", "rest_s"), 0.0)
    return {k: UnitCosts(model=k.model, q=k.q, device="cpu", task=k.task, contexts=0, forwards_saved=0.0, **zero,
                         weights_bytes=1_000_000, resume_bytes=2_000_000, checkpoint_meta_bytes=10_000,
                         result_bytes=100_000, prepared_bytes=50_000) for k in work.runs_by}


@pytest.mark.parametrize(("policy", "weights_kept", "resume_kept"), [("all", 12, 12), ("weights", 12, 0),
                                                                      ("last", 4, 0), ("none", 0, 0)])
def test_the_checkpoints_bytes_are_what_the_policy_keeps_of_every_checkpoint(tmp_path, policy, weights_kept,
                                                                               resume_kept):
    config = tmp_path / "s.yaml"
    config.write_text(yaml.safe_dump(SWEEP))
    work = count_work(load_sweep(config))
    assert (work.runs, len(work.schedule)) == (4, 3)
    prediction = predict_disk(work, _costs(work), policy, workers=2, wandb=False)
    tune_files = 4 * (TUNE_TRIAL_BYTES + 4 * TUNE_REPORT_BYTES + TUNE_STATE_BYTES_PER_TRIAL)
    assert prediction.storage_final == weights_kept * 1_000_000 + resume_kept * 2_000_000 + 12 * 10_000 + tune_files
    assert prediction.checkpoints_all == 12 * 3_000_000
    assert prediction.storage_peak >= prediction.storage_final
    assert (prediction.storage_peak > prediction.storage_final) == (policy != "all")
    assert prediction.peak_bytes == prediction.storage_peak + prediction.run_folder


def _exit_code(argv: list[str]) -> int:
    from orchestrator.cli import main

    try:
        return int(main(argv))
    except SystemExit as exited:
        return int(exited.code)


def _no_room(monkeypatch) -> None:
    monkeypatch.setattr(estimate_disk, "free_bytes", lambda _path: 1_000_000)  # 1 MB free wherever it writes


def test_validate_refuses_a_sweep_whose_predicted_bytes_exceed_the_free_space_naming_both(tmp_path, monkeypatch,
                                                                                          capsys):
    from orchestrator.cli import main

    config = tmp_path / "s.yaml"
    config.write_text(yaml.safe_dump(SWEEP))
    assert main(["validate", str(config)]) == 0
    assert "disk: about" in capsys.readouterr().out
    _no_room(monkeypatch)
    assert _exit_code(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert "not enough disk for this sweep" in err
    assert "1.0 MB are free" in err
    assert "training.keep_checkpoints: weights; training.keep_checkpoints: last keeps one" in err


def test_run_refuses_a_sweep_without_room_before_ray_starts_and_keeps_the_folder_for_a_corrected_config(
        tmp_path, monkeypatch, capsys):
    from orchestrator.driver import sweep as sweep_mod

    def no_ray(*_a, **_k):
        raise AssertionError("Ray was started for a sweep without room")

    monkeypatch.setattr(sweep_mod, "ensure_ray", no_ray)
    _no_room(monkeypatch)
    config = tmp_path / "s.yaml"
    config.write_text(yaml.safe_dump(SWEEP))
    assert _exit_code(["run", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "not enough disk for this sweep, refused before Ray started" in err
    assert f"{tmp_path / 'run'}: the sweep is predicted to write" in err
    # a config that fits (weights no one keeps) may take the folder over: nothing of the refused one started
    from iclmem.runfolder import never_started

    assert never_started(tmp_path / "run") is not None
