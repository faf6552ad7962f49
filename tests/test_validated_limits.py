"""Settings that used to validate and then crash the run (issue #62): each refused when the sweep is read, naming
the setting and the file, before any folder or cluster work. No Ray, no training."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from iclmem.errors import ConfigError
from orchestrator.schema.config import parse_sweep
from orchestrator.schema.outputs import (
    WANDB_ARTIFACT_KEY_MAX,
    WANDB_CHECKPOINT_ARTIFACT_PREFIX,
    WANDB_NAME_MAX,
    WANDB_RESULTS_ARTIFACT_PREFIX,
)
from orchestrator.schema.resources import MAX_TORCH_THREADS, MIN_RAY_SHARE
from orchestrator.schema.sweep_files import load_sweep

BASE = {"name": "s", "tasks": [{"name": "iris"}]}


def _refusal(tmp_path: Path, **settings) -> tuple[Path, str]:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**BASE, **settings}))
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    return path, str(info.value)


def test_a_cpu_share_below_what_ray_can_reserve_is_refused_naming_the_setting_and_the_floor(tmp_path):
    import ray._private.ray_constants as ray_constants

    assert MIN_RAY_SHARE == ray_constants.MIN_RESOURCE_GRANULARITY  # the floor is Ray's own resource unit
    path, message = _refusal(tmp_path, resources={"cpus_per_trial": 1e-9})
    assert str(path) in message
    assert "resources.cpus_per_trial: 1e-09 is below" in message
    assert "0.0001" in message
    assert "resources.cpus_per_probe_actor" in _refusal(tmp_path, resources={"cpus_per_probe_actor": 1e-5})[1]
    assert "resources.gpus_per_trial" in _refusal(tmp_path, resources={"gpus_per_trial": 1e-5})[1]
    ok = parse_sweep({**BASE, "resources": {"cpus_per_trial": MIN_RAY_SHARE, "gpus_per_trial": 0}}).resources
    assert ok.cpus_per_trial == MIN_RAY_SHARE


@pytest.mark.parametrize("uri", ["s3://", "gs://", "s3:///folder", "file://", "file://relative/tune"])
def test_a_storage_uri_without_a_bucket_or_absolute_folder_is_refused(tmp_path, uri):
    path, message = _refusal(tmp_path, storage_path=uri)
    assert str(path) in message
    assert f"storage_path: {uri!r} names no" in message
    assert parse_sweep({**BASE, "storage_path": "s3://bucket/iclmem"}).storage_path == "s3://bucket/iclmem"


@pytest.mark.parametrize("relative", ["tune", "runs/tune", "~/tune", "./tune"])
def test_a_relative_storage_path_is_refused_asking_for_an_absolute_path_or_uri(tmp_path, relative):
    path, message = _refusal(tmp_path, storage_path=relative)
    assert str(path) in message
    assert f"storage_path: {relative!r} is not an absolute path" in message
    assert str(tmp_path / "tune") == parse_sweep({**BASE, "storage_path": str(tmp_path / "tune")}).storage_path


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_storage_path_is_refused_not_read_as_the_default(tmp_path, empty):
    path, message = _refusal(tmp_path, storage_path=empty)
    assert str(path) in message
    assert "storage_path: empty" in message
    assert "leave storage_path out" in message


def test_torch_threads_per_trial_above_the_fixed_cap_is_refused_naming_the_setting(tmp_path):
    path, message = _refusal(tmp_path, resources={"torch_threads_per_trial": 100000})
    assert str(path) in message
    assert f"resources.torch_threads_per_trial: Input should be less than or equal to " \
        f"{MAX_TORCH_THREADS}" in message
    ok = parse_sweep({**BASE, "resources": {"torch_threads_per_trial": MAX_TORCH_THREADS}})
    assert ok.resources.torch_threads_per_trial == MAX_TORCH_THREADS


def test_a_sweep_name_whose_wandb_results_artifact_passes_128_characters_is_refused_at_validation(tmp_path):
    longest = WANDB_NAME_MAX - len(WANDB_RESULTS_ARTIFACT_PREFIX)
    assert parse_sweep({**BASE, "name": "n" * longest}).name == "n" * longest
    path, message = _refusal(tmp_path, name="n" * (longest + 1))
    assert str(path) in message
    assert f"name is {longest + 1} characters" in message
    assert f"limit of {WANDB_NAME_MAX}" in message
    assert f"at most {longest} characters" in message


def test_the_artifact_names_validation_checks_are_the_ones_the_wandb_logger_builds(tmp_path, monkeypatch):
    import pandas as pd
    import wandb
    from wandb.sdk.artifacts._validators import NAME_MAXLEN

    from orchestrator.report.wandb_logger import WandbResultsLogger
    from orchestrator.report.wandb_summary import artifact_name

    assert WANDB_NAME_MAX == NAME_MAXLEN
    key = "k" * 500
    assert artifact_name("checkpoint", key) == WANDB_CHECKPOINT_ARTIFACT_PREFIX + key[:WANDB_ARTIFACT_KEY_MAX]
    names = []

    class Named:
        def __init__(self, name: str, **_: object) -> None:
            names.append(name)

        def add_file(self, *_: object, **__: object) -> None:
            pass

    monkeypatch.setattr(wandb, "Artifact", Named)
    WandbResultsLogger("p", group="my-sweep", mode="disabled")._artifact(tmp_path, pd.DataFrame(), {})
    assert names == [f"{WANDB_RESULTS_ARTIFACT_PREFIX}my-sweep"]


def test_the_cli_refuses_each_with_exit_2_and_no_traceback_leaving_the_file_alone(tmp_path, capsys):
    from orchestrator.cli import main

    path = tmp_path / "sweep.yaml"
    text = yaml.safe_dump({**BASE, "storage_path": "s3://"})
    path.write_text(text)
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "storage_path" in err
    assert str(path) in err
    assert "Traceback" not in err
    assert path.read_text() == text
    assert not out.exists()


def test_a_run_id_whose_wandb_checkpoint_artifact_would_pass_the_limit_is_refused_where_the_ids_are_made(monkeypatch):
    """The schema's limits keep run ids under W&B's 128 characters today (the longest found: 112); the check in
    expand_grid refuses the day they do not, naming the run id (W&B's limit lowered here to make one pass it)."""
    import orchestrator.schema.trials as trials
    from iclmem.errors import ConfigError
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({"name": "x", "tasks": [{"name": "iris"}], "grid": {"q": [20]}})
    assert trials.expand_grid(sweep)
    monkeypatch.setattr(trials, "WANDB_NAME_MAX", 40)
    with pytest.raises(ConfigError, match=r"the run id 'iris-single_fixed-.*W&B checkpoint artifact name of \d+ "
                                          r"characters, past W&B's limit of 40"):
        trials.expand_grid(sweep)
