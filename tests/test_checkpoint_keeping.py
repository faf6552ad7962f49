"""training.keep_checkpoints: what stays of each checkpoint once probed. A running trial's latest checkpoint keeps
everything; the resume state goes once a checkpoint is superseded (every policy but ``all``); weights go only
after every probe of the checkpoint is stored (``last``, ``none``); manifests always stay, and a removed file a
reader needs after all is recomputed from the run's config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import yaml

from iclmem.errors import CorruptCheckpointError
from iclmem.runfolder import GROUND_TRUTH_FILE, RESULTS_FILE, ROW_SUFFIX
from iclmem.vocab import KeepCheckpoints
from orchestrator.driver.checkpoint_keeping import CheckpointKeeper
from trainables.data import TaskSource, prepare_task
from trainables.finetune import (
    META_FILE,
    MODEL_FILE,
    STATE_FILE,
    Finetuner,
    FinetuneSpec,
    load_checkpoint_model,
    remove_checkpoint_files,
)
from trainables.recompute import recompute_checkpoint_model

SPEC = FinetuneSpec(lr=1e-3, epochs=3, seed=4)


@pytest.fixture(scope="module")
def run_checkpoints(tmp_path_factory) -> tuple[object, dict[int, Path]]:
    """Epochs 1, 2, 3 of one run, each saved by the real writer (``Finetuner.save``), and its task."""
    task = prepare_task(TaskSource("iris", "builtin"), seed=0, q=30, context_size=60)
    root = tmp_path_factory.mktemp("ckpts")
    finetuner, folders = Finetuner(SPEC, [task]), {}
    for epoch in (1, 2, 3):
        finetuner.run_epoch()
        folders[epoch] = finetuner.save(root / f"e{epoch}", {"run_id": "r"})
    return task, folders


def _copy(folders: dict[int, Path], into: Path) -> dict[int, Path]:
    out = {}
    for epoch, folder in folders.items():
        out[epoch] = into / folder.name
        shutil.copytree(folder, out[epoch])
    return out


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def _keeper_with(policy: KeepCheckpoints, folders: dict[int, Path], probes: Path) -> CheckpointKeeper:
    keeper = CheckpointKeeper(policy, log=lambda _line: None)
    for epoch, folder in folders.items():
        keeper.add("r", epoch, pafs.LocalFileSystem(), str(folder), [(str(probes), f"e{epoch:04d}")])
    return keeper


def _store_result(probes: Path, epoch: int) -> None:
    # the keeper reads only whether the row file (written last by ProbeResult.save) exists
    probes.mkdir(parents=True, exist_ok=True)
    (probes / f"e{epoch:04d}{ROW_SUFFIX}").write_text("{}")


def _every_checkpoint_probed(run_checkpoints, tmp_path: Path, policy: KeepCheckpoints):
    """A copy of the run's checkpoints, each with its probe result stored, and a keeper told of them all."""
    _task, folders = run_checkpoints
    folders = _copy(folders, tmp_path)
    probes = tmp_path / "probes"
    for epoch in folders:
        _store_result(probes, epoch)
    return folders, _keeper_with(policy, folders, probes)


@pytest.mark.parametrize("policy", list(KeepCheckpoints))
def test_a_running_trials_latest_checkpoint_keeps_everything_whatever_the_policy(run_checkpoints, tmp_path, policy):
    folders, keeper = _every_checkpoint_probed(run_checkpoints, tmp_path, policy)
    keeper.settle()
    assert {MODEL_FILE, STATE_FILE, META_FILE} <= _files(folders[3])
    older = {e: _files(f) for e, f in folders.items() if e < 3}
    if policy == KeepCheckpoints.ALL:
        assert all(STATE_FILE in files and MODEL_FILE in files for files in older.values())
    else:
        assert all(STATE_FILE not in files for files in older.values())
        assert all((MODEL_FILE in files) == (policy == KeepCheckpoints.WEIGHTS) for files in older.values())


@pytest.mark.parametrize(("policy", "weights_kept"), [(KeepCheckpoints.ALL, {1, 2, 3}), (KeepCheckpoints.WEIGHTS, {1, 2, 3}),
                                                       (KeepCheckpoints.LAST, {3}), (KeepCheckpoints.NONE, set())])
def test_a_finished_run_keeps_the_files_its_policy_promises_and_every_manifest(run_checkpoints, tmp_path, policy,
                                                                                weights_kept):
    folders, keeper = _every_checkpoint_probed(run_checkpoints, tmp_path, policy)
    keeper.finish("r")
    for epoch, folder in folders.items():
        files = _files(folder)
        assert META_FILE in files
        assert (MODEL_FILE in files) == (epoch in weights_kept), (epoch, files)
        assert (STATE_FILE in files) == (policy == KeepCheckpoints.ALL), (epoch, files)
    assert not keeper.unsettled
    freed = keeper.freed_bytes
    assert (freed["resume"] > 0) == (policy != KeepCheckpoints.ALL)
    assert (freed["weights"] > 0) == (len(weights_kept) < 3)


def test_weights_wait_for_every_probe_of_their_checkpoint(run_checkpoints, tmp_path):
    _task, folders = run_checkpoints
    folders = _copy(folders, tmp_path)
    probes = tmp_path / "probes"
    keeper = _keeper_with(KeepCheckpoints.NONE, folders, probes)
    keeper.finish("r")
    assert all(MODEL_FILE in _files(f) for f in folders.values())  # nothing probed yet: every weight stays
    assert all(STATE_FILE not in _files(f) for f in folders.values())  # no resume point left: state goes at once
    _store_result(probes, 2)
    keeper.settle()
    assert [e for e, f in folders.items() if MODEL_FILE not in _files(f)] == [2]
    assert keeper.unsettled == {"r"}
    _store_result(probes, 1)
    _store_result(probes, 3)
    keeper.settle()
    assert all(MODEL_FILE not in _files(f) for f in folders.values())
    assert not keeper.unsettled


def test_removed_weights_are_named_by_the_error_and_recomputed_to_the_recorded_digest(run_checkpoints, tmp_path):
    task, folders = run_checkpoints
    folder = _copy({2: folders[2]}, tmp_path)[2]
    freed = remove_checkpoint_files(pafs.LocalFileSystem(), str(folder), [MODEL_FILE, STATE_FILE],
                                    "training.keep_checkpoints: none")
    assert freed == (folders[2] / MODEL_FILE).stat().st_size + (folders[2] / STATE_FILE).stat().st_size
    manifest = json.loads((folder / META_FILE).read_text())
    assert set(manifest["removed"]) == {MODEL_FILE, STATE_FILE}
    assert MODEL_FILE not in manifest["files"]
    with pytest.raises(CorruptCheckpointError, match=r"removed after probing \(training.keep_checkpoints: none\)"):
        load_checkpoint_model(folder)
    with pytest.raises(CorruptCheckpointError, match="removed after probing"):
        Finetuner(SPEC, [task]).restore(folder)
    model = recompute_checkpoint_model(SPEC, [task], 2, expected_sha256=manifest["weights_sha256"])
    assert model is not None
    assert remove_checkpoint_files(pafs.LocalFileSystem(), str(folder), [MODEL_FILE], "again") == 0  # idempotent


def test_a_keep_checkpoints_value_outside_the_vocabulary_is_refused_naming_the_setting():
    from iclmem.errors import IclmemError
    from orchestrator.schema.config import parse_sweep

    with pytest.raises(IclmemError, match=r"training\.keep_checkpoints") as raised:
        parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "training": {"keep_checkpoints": "some"}}, "s.yaml")
    for value in KeepCheckpoints:
        assert str(value) in str(raised.value)


def test_the_setting_leaves_the_config_hash_of_sweeps_that_do_not_use_it_unchanged():
    from orchestrator.schema.config import parse_sweep

    plain = parse_sweep({"name": "s", "tasks": [{"name": "iris"}]}, "s.yaml")
    weights = parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "training": {"keep_checkpoints": "weights"}},
                          "s.yaml")
    last = parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "training": {"keep_checkpoints": "last"}}, "s.yaml")
    assert plain.config_hash() == weights.config_hash() != last.config_hash()


# ------------------------------------------------------------------------------------------- real Tune sweeps
def _sweep_file(tmp_path: Path, policy: str) -> Path:
    config = tmp_path / f"{policy}.yaml"
    config.write_text(yaml.safe_dump({
        "name": f"keep-{policy}",
        "tasks": [{"name": "iris"}],
        "grid": {"lr": [1e-3, 3e-3], "q": [30]},
        "data": {"context_size": 60},
        "training": {"epochs": 3, "checkpoint_epochs": [1, 2, 3], "keep_checkpoints": policy},
        "probe": {"bootstrap": 30, "suite": ["base", "position_first"], "base_as_checkpoint": False},
        "resources": {"cpus_per_probe_actor": 0.5},
        "wandb": {"mode": "disabled"},
    }))
    return config


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "weights_kept"), [("last", {3}), ("none", set())])
def test_a_sweep_leaves_exactly_the_checkpoint_files_its_policy_promises_and_probes_every_checkpoint(
        ray_session, tmp_path, policy, weights_kept):
    import pandas as pd

    from orchestrator.driver.sweep import run_sweep

    run_dir = tmp_path / "run"
    results = run_sweep(_sweep_file(tmp_path, policy), run_dir, progress=False)
    assert sorted(results.groupby("run_id")["epoch"].apply(sorted).map(tuple).unique()) == [(1, 2, 3)]
    manifests = sorted((run_dir / "tune").rglob(META_FILE))
    assert len(manifests) == 6  # every folder stays: 2 runs x 3 checkpoints
    for meta in manifests:
        epoch = json.loads(meta.read_text())["epoch"]
        files = _files(meta.parent)
        assert {META_FILE, GROUND_TRUTH_FILE} <= files
        assert (MODEL_FILE in files) == (epoch in weights_kept), (policy, epoch, files)
        assert (STATE_FILE in files) == (policy == "all"), (policy, epoch, files)
    assert pd.read_parquet(run_dir / RESULTS_FILE)["auc"].notna().all()
    # what `iclmem run` and `iclmem validate` predicted for this folder, before any of it was written
    written = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
    predicted = _size_only_prediction(_sweep_file(tmp_path, policy)).final_bytes
    assert 0.7 <= predicted / written <= 1.3, (policy, predicted, written)


def _size_only_prediction(config: Path):
    from orchestrator.estimate.estimate_disk import predict_disk, size_only_costs
    from orchestrator.estimate.estimate_work import count_work
    from orchestrator.runfolder.prepare import prepare_sweep
    from orchestrator.schema.sweep_files import load_sweep

    sweep = load_sweep(config)
    prepared = prepare_sweep(sweep, config.parent / "scratch", log=lambda _m: None)
    return predict_disk(count_work(sweep), size_only_costs(prepared), sweep.training.keep_checkpoints, 2, wandb=False)
