"""Checkpoints carry a manifest of file sizes and sha256s: a truncated or altered file is caught on
resume and on probing, named in the warning, and the lost work is recomputed (bit-exactly)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from iclmem.errors import CheckpointError, CorruptCheckpointError
from iclmem.record import VOLATILE_COLUMNS
from trainables.data import TaskSource, prepare_task
from trainables.finetune import (
    META_FILE,
    MODEL_FILE,
    STATE_FILE,
    Finetuner,
    FinetuneSpec,
    load_checkpoint_model,
    verify_checkpoint,
)
from trainables.models import read_weights
from trainables.recompute import recompute_checkpoint_model
from trainables.trainable import resume_or_recompute

SPEC = FinetuneSpec(lr=1e-3, epochs=6, seed=4)


@pytest.fixture(scope="module")
def iris_task():
    return prepare_task(TaskSource("iris", "builtin"), seed=0, q=30, context_size=60)


@pytest.fixture
def checkpoint(iris_task, tmp_path) -> Path:
    """An epoch-3 checkpoint of SPEC."""
    finetuner = Finetuner(SPEC, [iris_task])
    for _ in range(3):
        finetuner.run_epoch()
    return finetuner.save(tmp_path / "ckpt", {"run_id": "r"})


def _flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_an_intact_checkpoint_verifies_and_its_manifest_records_every_file(checkpoint):
    manifest = verify_checkpoint(checkpoint)
    assert set(manifest["files"]) == {MODEL_FILE, STATE_FILE}
    assert manifest["files"][MODEL_FILE]["bytes"] == (checkpoint / MODEL_FILE).stat().st_size
    assert not list(checkpoint.glob("*.tmp"))  # every file was renamed into place


@pytest.mark.parametrize(
    ("damage", "file", "message"),
    [
        ("truncate", MODEL_FILE, "truncated or altered"),
        ("flip", MODEL_FILE, "fails its checksum"),
        ("flip", STATE_FILE, "fails its checksum"),
        ("delete", STATE_FILE, "checkpoint file missing"),
        ("delete", META_FILE, "manifest missing"),
        ("truncate", META_FILE, "unreadable or truncated"),
    ],
)
def test_a_damaged_checkpoint_file_is_named_by_the_error(checkpoint, damage, file, message):
    path = checkpoint / file
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "flip":
        _flip_one_byte(path)
    else:
        path.unlink()
    with pytest.raises(CorruptCheckpointError, match=message) as info:
        verify_checkpoint(checkpoint)
    assert info.value.path == str(path)
    assert str(path) in str(info.value)
    with pytest.raises(CorruptCheckpointError):
        load_checkpoint_model(checkpoint)


def test_the_weights_digest_covers_scalar_and_bfloat16_tensors_and_every_value():
    from trainables.models.base import weights_digest

    state = {"scale": torch.tensor(1.5), "w": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)}
    digest = weights_digest(state)
    assert digest == weights_digest({k: v.clone() for k, v in reversed(state.items())})  # order-free
    assert digest != weights_digest({**state, "scale": torch.tensor(1.25)})
    assert digest != weights_digest({**state, "w": state["w"].reshape(3, 2)})  # same bytes, other shape
    assert digest != weights_digest({**state, "w": state["w"].float()})  # same values, other dtype


def test_a_folder_that_is_no_checkpoint_at_all_gets_a_plain_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        load_checkpoint_model(tmp_path)


def test_restore_refuses_a_corrupt_checkpoint_before_touching_any_state(iris_task, checkpoint):
    _flip_one_byte(checkpoint / MODEL_FILE)
    fresh = Finetuner(SPEC, [iris_task])
    before = {k: v.clone() for k, v in fresh.model.module.state_dict().items()}
    with pytest.raises(CorruptCheckpointError):
        fresh.restore(checkpoint)
    assert fresh.epoch == 0
    for key, value in fresh.model.module.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_a_corrupt_checkpoint_on_resume_warns_with_its_file_and_the_run_is_recomputed_bit_exactly(iris_task, checkpoint):
    straight = Finetuner(SPEC, [iris_task])
    straight.train()
    weights = checkpoint / MODEL_FILE
    weights.write_bytes(weights.read_bytes()[:100])

    resumed = Finetuner(SPEC, [iris_task])
    with pytest.warns(UserWarning, match=str(weights)):
        assert resume_or_recompute(resumed, checkpoint, "r") is False
    assert resumed.epoch == 0
    resumed.train()
    for key, value in straight.model.module.state_dict().items():
        assert torch.equal(value, resumed.model.module.state_dict()[key]), key


def test_recomputing_a_lost_checkpoint_reproduces_the_recorded_weights_digest(iris_task, checkpoint):
    recorded = json.loads((checkpoint / META_FILE).read_text())["weights_sha256"]
    model = recompute_checkpoint_model(SPEC, [iris_task], 3, expected_sha256=recorded)
    for key, value in read_weights(checkpoint / MODEL_FILE).items():
        assert torch.equal(value, model.module.state_dict()[key]), key
    with pytest.raises(CheckpointError, match="not reproducible"):
        recompute_checkpoint_model(SPEC, [iris_task], 2, expected_sha256=recorded)  # epoch 2 != epoch 3


@pytest.mark.slow  # fine-tunes and starts a probe actor (`make test-fast` leaves it out)
def test_a_probe_actor_recomputes_a_corrupt_checkpoint_from_its_recipe_and_scores_it_identically(
        ray_session, iris_task, checkpoint, tmp_path):
    import ray

    from probes.actors import ProbeJob, ProbePool
    from probes.calibration import model_digest
    from probes.probe import ProbeSettings
    from trainables.models import build_model

    damaged = tmp_path / "damaged"
    shutil.copytree(checkpoint, damaged)
    (damaged / MODEL_FILE).write_bytes((damaged / MODEL_FILE).read_bytes()[:64])
    recipe = {"finetune": {"lr": SPEC.lr, "epochs": SPEC.epochs, "seed": SPEC.seed}, "task_keys": [iris_task.fingerprint],
              "torch_threads": torch.get_num_threads()}  # the thread count the fixture trained with
    base = build_model("pfn-mini")
    pool = ProbePool(1, {"num_cpus": 0.5}, base_model_name="pfn-mini", base_options={"weights": "shipped"},
                     base_weights=ray.put(base.state_arrays()), base_digest=model_digest(base),
                     tasks=ray.put({iris_task.fingerprint: iris_task}), suite_spec=["base", "position_first"],
                     settings=ProbeSettings(n_resamples=50), cache_dir=str(tmp_path / "ref"))
    from iclmem.record import RunIdentity

    identity = RunIdentity("r", "iris", "pfn-mini", "single_fixed", 1e-3, 30, "normal", 0).as_dict()
    try:
        pool.submit(ProbeJob(identity, 3, str(checkpoint), iris_task.fingerprint, str(tmp_path / "p"), "intact"))
        pool.submit(ProbeJob(identity, 3, str(damaged), iris_task.fingerprint, str(tmp_path / "p"), "damaged",
                             recipe=recipe))
        pool.submit(ProbeJob(identity, 3, str(damaged), iris_task.fingerprint, str(tmp_path / "p"), "no_recipe"))
        with pytest.warns(UserWarning, match=str(damaged / MODEL_FILE)):
            rows = pool.drain()
    finally:
        pool.shutdown()
    assert len(rows) == 2
    assert len(pool.failed) == 1
    failed_job, error = pool.failed[0]
    assert failed_job.stem == "no_recipe"
    assert str(damaged / MODEL_FILE) in error
    assert len(pool.notes) == 1
    assert "weights match the recorded checksum" in pool.notes[0]
    volatile = set(VOLATILE_COLUMNS)
    intact, recomputed = ({k: v for k, v in r.items() if k not in volatile} for r in rows)
    assert intact == recomputed
    assert intact["auc"] != 0.5


@pytest.mark.slow
def test_a_trial_whose_latest_checkpoint_was_truncated_is_recomputed_by_tune(ray_session, iris_task, tmp_path, fault_ledger):
    from fault_injection import faulty_trainable
    from ray import tune

    storage = tmp_path / "tune"
    markers = tmp_path / "markers"
    markers.mkdir()

    def trial(run_id: str, **extra):
        return {"run_id": run_id, "task_keys": [iris_task.fingerprint], "identity": {"run_id": run_id},
                "finetune": {"model": "pfn-mini", "model_options": {"weights": "shipped"}, "regime": "single_fixed",
                             "lr": 1e-3, "epochs": 6, "checkpoint_epochs": [], "every_epoch": True, "seed": 7},
                **extra}

    configs = [trial("damaged", _fault_once_at_epoch=4, _fault_marker_dir=str(markers),
                     _fault_kind="truncate_latest_checkpoint", _fault_storage=str(storage)),
               trial("clean")]
    grid = tune.Tuner(
        tune.with_parameters(faulty_trainable, prepared={iris_task.fingerprint: iris_task}),
        param_space={"__trial__": tune.grid_search(configs)},
        run_config=tune.RunConfig(name="corrupt", storage_path=str(storage), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=1)),
    ).fit()
    assert not grid.errors, grid.errors
    by_id = {r.config["__trial__"]["run_id"]: r for r in grid}
    assert (markers / "fault_damaged").read_text() == "4"
    reported = [json.loads(line)["epoch"] for line in (Path(by_id["damaged"].path) / "result.json").read_text().splitlines()
                if line.strip()]
    # epochs 1-3, the fault, then the run recomputed from scratch: the truncated epoch-3 checkpoint was not used
    assert reported == [1, 2, 3, 1, 2, 3, 4, 5, 6]
    # the first result after the fault names the damaged file, for the driver to print on the console
    results = [json.loads(line) for line in (Path(by_id["damaged"].path) / "result.json").read_text().splitlines()
               if line.strip()]
    named = [r.get("damaged_checkpoint") for r in results if r.get("damaged_checkpoint")]
    assert len(named) == 1
    assert "model.safetensors" in named[0]
    assert "recomputing the run from epoch 0" in named[0]
    assert results[3].get("damaged_checkpoint") == named[0]

    def final(result):
        with result.checkpoint.as_directory() as directory:
            verify_checkpoint(directory)
            return read_weights(Path(directory) / MODEL_FILE)

    clean, damaged = final(by_id["clean"]), final(by_id["damaged"])
    identical = all(torch.equal(value, damaged[key]) for key, value in clean.items())
    assert identical, [key for key, value in clean.items() if not torch.equal(value, damaged[key])]
    fault_ledger(injected=1, completed=True, identical=identical)
