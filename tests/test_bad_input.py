"""Bad input is refused early: each malformed sweep file or table fails before any Ray work, with a
message naming the file and the field at fault, and leaves no partial output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from iclmem.errors import IclmemError
from orchestrator.driver.sweep import run_sweep

BASE = {
    "name": "bad",
    "tasks": [{"name": "iris"}],
    "grid": {"q": [30]},
    "data": {"context_size": 60},
    "training": {"epochs": 2, "checkpoint_epochs": [1, 2]},
    "wandb": {"mode": "disabled"},
}


def _merge(base: dict, patch: dict) -> dict:
    out = dict(base)
    for key, value in patch.items():
        if value is _DROP:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


_DROP = object()


def _tables(root: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    n = 240
    good = pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n), "label": rng.integers(0, 2, n)})
    paths = {}
    for name, frame in {
        "good": good,
        "one_class": good.assign(label=1),
        "text_target": good.assign(label=[f"v{i % 7}x" for i in range(n)]),
        "leak": good.assign(label_copy=good["label"]),
        "all_nan": good.assign(empty=np.nan),
        "nan_target": good.assign(label=np.nan),
    }.items():
        paths[name] = root / f"{name}.csv"
        frame.to_csv(paths[name], index=False)
    paths["garbage"] = root / "garbage.parquet"
    paths["garbage"].write_bytes(b"PAR1 this is not a parquet file")
    return paths


def _table_task(path_key: str, target: str = "label", task: str | None = None) -> dict:
    spec = {"name": "t", "path": f"@{path_key}", "target": target}
    if task:
        spec["task"] = task
    return {"tasks": [spec], "grid": {"q": [40]}}


# (id, patch to the base sweep, substrings the message must contain)
CASES = [
    ("lr-zero", {"grid": {"lr": [0.0]}}, ["grid.lr", "> 0"]),
    ("lr-negative", {"grid": {"lr": [-1e-3]}}, ["grid.lr", "> 0"]),
    ("lr-wrong-type", {"grid": {"lr": ["fast"]}}, ["grid.lr.0"]),
    ("lr-overflowing-float32", {"grid": {"lr": [1.0e300]}}, ["grid.lr", "float32", "every trial would fail"]),
    ("q-zero", {"grid": {"q": [0]}}, ["grid.q", ">= 2"]),
    ("q-one", {"grid": {"q": [1]}}, ["grid.q", ">= 2", "two members"]),
    ("q-negative", {"grid": {"q": [-5]}}, ["grid.q", ">= 2"]),
    ("q-wrong-type", {"grid": {"q": ["fifty"]}}, ["grid.q.0"]),
    ("q-boolean", {"grid": {"q": [True]}}, ["grid.q.0", "valid integer"]),
    ("seed-as-text", {"grid": {"seed": ["7"]}}, ["grid.seed.0", "valid integer"]),
    ("epochs-zero", {"training": {"epochs": 0}}, ["training.epochs"]),
    ("epochs-below-checkpoints", {"training": {"epochs": 3, "checkpoint_epochs": [5, 10]}}, ["training", "epochs (3)"]),
    ("unknown-top-level-key", {"probes": {"suite": "default"}}, ["probes", "unknown setting"]),
    ("unknown-nested-key", {"grid": {"learning_rate": [1e-3]}}, ["grid.learning_rate", "unknown setting"]),
    ("duplicate-task-names", {"tasks": [{"name": "iris"}, {"name": "iris"}]}, ["tasks", "duplicate task names"]),
    ("no-tasks", {"tasks": []}, ["tasks", "at least one task"]),
    ("empty-suite", {"probe": {"suite": []}}, ["probe.suite", "empty"]),
    ("unknown-manipulation", {"probe": {"suite": ["base", "skew_tru_x2"]}}, ["probe.suite", "skew_tru_x2"]),
    ("unknown-model", {"models": [{"name": "tabpfn-v9"}]}, ["models", "tabpfn-v9", "pfn-mini"]),
    ("unknown-label-mode", {"grid": {"label_mode": ["shuffled"]}}, ["grid.label_mode.0"]),
    ("unknown-regime", {"grid": {"regime": ["single"]}}, ["grid.regime.0"]),
    ("negative-bootstrap", {"probe": {"bootstrap": -1}}, ["probe.bootstrap"]),
    ("bad-sweep-name", {"name": "has spaces"}, ["name"]),
    ("duplicate-grid-value", {"grid": {"lr": [1e-3, 1e-3]}}, ["grid.lr", "duplicate"]),
    ("unknown-builtin-table", {"tasks": [{"name": "irises"}]}, ["tasks.0", "irises", "breast_cancer"]),
    ("missing-table-file", {"tasks": [{"name": "t", "path": "nowhere.csv", "target": "label"}]}, ["tasks.0", "nowhere.csv"]),
    ("unreadable-parquet", _table_task("garbage"), ["tasks.0", "garbage.parquet"]),
    ("misspelled-target", _table_task("good", target="lable"), ["tasks.0", "lable", "label"]),
    ("one-class-target", _table_task("one_class"), ["tasks.0", "single class"]),
    ("too-few-rows", {"grid": {"q": [500]}}, ["tasks.0", "1060"]),
    ("non-numeric-regression-target", _table_task("text_target", task="regression"), ["tasks.0", "label", "numeric"]),
    ("target-leakage", _table_task("leak"), ["tasks.0", "leakage", "label_copy"]),
    ("too-many-candidate-labels", {"data": {"regression_bins": 12}, "tasks": [{"name": "diabetes"}], "grid": {"q": [50]}},
     ["diabetes", "12 candidate labels", "at most 10"]),
    ("table-without-target", {"tasks": [{"name": "t", "path": "x.csv"}]}, ["tasks.0", "target"]),
    ("all-missing-target", _table_task("nan_target"), ["tasks.0", "target column 'label' has no values"]),
    ("seed-beyond-numpy", {"grid": {"seed": [123456789012345678901234]}}, ["grid.seed", "[0, 4294967295]"]),
    ("storage-path-is-a-file", {"storage_path": "@good"}, ["storage_path", "is a file, not a folder"]),
]


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    return _tables(tmp_path_factory.mktemp("tables"))


def _resolve(obj, tables):
    if isinstance(obj, dict):
        return {k: _resolve(v, tables) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_resolve(v, tables) for v in obj]
    if isinstance(obj, str) and obj.startswith("@"):
        return str(tables[obj[1:]])
    return obj


def test_the_table_holds_at_least_25_distinct_mistakes():
    assert len({case[0] for case in CASES}) == len(CASES) >= 25


@pytest.mark.parametrize(("case_id", "patch", "expected"), CASES, ids=[c[0] for c in CASES])
def test_malformed_input_is_refused_before_any_ray_work_naming_file_and_field(case_id, patch, expected, tables, tmp_path):
    sweep_file = tmp_path / f"{case_id}.yaml"
    sweep_file.write_text(yaml.safe_dump(_resolve(_merge(BASE, patch), tables), sort_keys=False))
    run_dir = tmp_path / "run"
    with pytest.raises(IclmemError) as info:
        run_sweep(sweep_file, run_dir, progress=False, address="ray://must-not-be-contacted:1")
    message = str(info.value)
    assert str(sweep_file) in message, message
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert not run_dir.exists(), "a refused sweep left partial output"
    assert not list(tmp_path.glob(".run*")), "staging folder left behind"


def test_all_nan_columns_are_dropped_with_a_warning_naming_them(tables, tmp_path):
    from trainables.data import TaskSource, prepare_task

    with pytest.warns(UserWarning, match="empty"):
        task = prepare_task(TaskSource("t", "table", str(tables["all_nan"]), "label"), q=40, context_size=60)
    assert task.n_features == 2


def test_a_folder_given_as_a_table_path_is_named_as_a_folder_and_points_at_carte(tmp_path):
    from trainables.data import PrepSettings, TaskSource, prepare_task

    folder = tmp_path / "tables"
    folder.mkdir()
    with pytest.raises(IclmemError, match=r"is a folder, not a table file.*`carte:`"):
        prepare_task(TaskSource("t", "table", str(folder), "y"), PrepSettings(context_size=20, q=10), "normal", 0)


def test_many_integer_classes_inferred_as_regression_point_at_task_classification(tmp_path):
    from trainables.data import PrepSettings, TaskSource, prepare_task

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.normal(size=1500), "label": np.arange(1500) % 500})
    path = tmp_path / "codes.csv"
    frame.to_csv(path, index=False)
    with pytest.warns(UserWarning, match=r"500 distinct integers and is taken as regression.*task: classification"):
        task = prepare_task(TaskSource("codes", "table", str(path), "label"), PrepSettings(context_size=20, q=40),
                            "normal", 0)
    assert task.task_kind == "regression"
    # A real-valued target is regression without the warning: it is not a guess about class ids.
    frame["label"] = frame["label"] + rng.uniform(0.01, 0.99, size=len(frame))
    frame.to_csv(path, index=False)
    import warnings as _warnings

    with _warnings.catch_warnings():
        _warnings.filterwarnings("error", message=".*taken as regression.*")
        prepare_task(TaskSource("codes", "table", str(path), "label"), PrepSettings(context_size=20, q=40), "normal", 0)


def test_a_table_that_cannot_be_read_is_one_error_line_per_task_not_one_per_grid_combination(tmp_path):
    from orchestrator.runfolder.prepare import prepare_sweep
    from orchestrator.schema.config import SweepConfig

    sweep = SweepConfig.model_validate(_merge(BASE, {
        "tasks": [{"name": "gone", "carte": str(tmp_path / "no_such_dir")}, {"name": "iris"}],
        "grid": {"q": [20, 30], "label_mode": ["normal", "shuffled_members"]},
    }))
    with pytest.raises(IclmemError) as err:
        prepare_sweep(sweep, tmp_path / "cache", log=lambda _m: None, source="s.yaml")
    lines = [line for line in str(err.value).splitlines() if line.startswith("  - ")]
    assert len(lines) == 1, lines
    assert "tasks.0 ('gone'" in lines[0]
    assert "and 3 more combination(s)" in lines[0]
    assert "CARTE directory not found" in lines[0]


def test_a_stored_sweep_with_the_default_schedule_and_few_epochs_validates_again_for_resume(tmp_path):
    """sweep.json holds every field, the default checkpoint schedule included; resume re-validates it, so
    the refusal of checkpoint epochs past the end must not fire on the (trimmed) default."""
    import json

    from orchestrator.schema.config import SweepConfig, parse_sweep
    from orchestrator.schema.sweep_files import load_sweep

    sweep = SweepConfig.model_validate(_merge(BASE, {"training": {"epochs": 5, "checkpoint_epochs": _DROP}}))
    stored = tmp_path / "sweep.json"
    stored.write_text(json.dumps(sweep.model_dump(mode="json")))
    again = load_sweep(stored)
    assert again.config_hash() == sweep.config_hash()
    # An explicit schedule past the end is still refused.
    with pytest.raises(IclmemError, match=r"checkpoint_epochs \[10\] exceed epochs \(5\)"):
        parse_sweep(_merge(BASE, {"training": {"epochs": 5, "checkpoint_epochs": [1, 10]}}), "s.yaml")


def _closed_local_port() -> int:
    import socket

    with socket.socket() as s:  # a port the OS just handed out and nobody listens on once it is closed
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_address_where_no_ray_head_answers_is_refused_in_seconds_before_any_ray_work(tmp_path):
    """ray.init retries an unreachable head for minutes, saying so only in console.log (#34): once the config
    and the tables are checked, the driver checks the port and refuses with exit 2, naming the address,
    before any Ray work; the run folder says failed, with no trial in it."""
    import os
    import subprocess
    import sys

    port = _closed_local_port()
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(Path(__file__).parents[1] / "configs" /
                           "quickstart.yaml"), "--out", str(out), "--address", f"127.0.0.1:{port}"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "WANDB_MODE": "disabled"})
    assert proc.returncode == 2, proc.stderr
    assert f"--address 127.0.0.1:{port}: no Ray head there, nothing answers on 127.0.0.1:{port}" in proc.stderr
    import json

    assert json.loads((out / "run_state.json").read_text())["status"] == "failed"
    assert not (out / "tune").exists()


def test_the_address_check_accepts_a_listening_port_and_leaves_other_forms_to_ray():
    import socket

    from iclmem.raysession import unreachable_address

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert unreachable_address(f"127.0.0.1:{port}") is None
        assert unreachable_address(f"ray://127.0.0.1:{port}") is None
    assert unreachable_address("auto") is None
    assert unreachable_address(None) is None
    assert "nothing answers on 127.0.0.1" in unreachable_address(f"127.0.0.1:{_closed_local_port()}", timeout=2)


def test_probe_actors_of_every_model_are_counted_before_a_trial_is_left_no_cpu():
    """Each distinct model gets a probe pool of its own (``start_probe_pools``), and its actors hold their CPU for
    the whole sweep: five models of one CPU-actor each on a 2-CPU Ray leave no trial a CPU, which was a sweep
    waiting at "0 running" forever. One model, the same settings: a trial fits beside its actor."""
    from orchestrator.driver.probe_pools import probe_pool_count, unsatisfiable_resources
    from orchestrator.schema.sweep_files import load_sweep

    sweep = load_sweep(Path(__file__).resolve().parents[1] / "configs" / "real_formats.yaml")
    assert probe_pool_count(sweep) == 5
    crowded = sweep.resources.model_copy(update={"cpus_per_trial": 1, "cpus_per_probe_actor": 1, "probe_actors": 1})
    (problem,) = unsatisfiable_resources(crowded, {"CPU": 2.0}, pools=probe_pool_count(sweep))
    assert "5 probe actors (1 for each of the sweep's 5 models) hold 5 of the local Ray's 2 CPU" in problem
    assert problem.startswith("resources.cpus_per_trial: 1 CPU asked")
    assert unsatisfiable_resources(crowded, {"CPU": 2.0}, pools=1) == []
    assert unsatisfiable_resources(crowded, {"CPU": 2.0}, pools=0) == []  # regime context alone: no probe pool
