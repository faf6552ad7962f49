"""The shipped sweep files validate, expand to the paper's grids, and `iclmem validate` reports every mistake."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.schema.sweep_files import load_sweep
from orchestrator.schema.trials import expand_grid

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
# lm_*.yaml belong to the language-model probe module and have their own schema.
SWEEP_FILES = sorted(p for p in CONFIGS.glob("*.yaml") if not p.name.startswith("lm_"))

PAPER_TASKS = ["beer_ratings", "buy_buy_baby", "babies_r_us", "bikedekho", "bikewale", "chocolate_bar_ratings",
               "clear_corpus", "anime_planet", "cardekho", "coffee_ratings"]
PAPER_LRS = [1e-1, 1e-2, 1e-3, 1e-4]
PAPER_QS = [50, 512]
LABEL_MODES = ["normal", "shuffled_members", "shuffled_all"]
CHECKPOINTS = [1, 2, 5, 10, 25, 50, 100, 250, 500]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_expected_files_exist():
    names = {p.name for p in SWEEP_FILES}
    assert {"base.yaml", "paper.yaml", "realistic.yaml", "quickstart.yaml"} <= names


@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: p.name)
def test_every_sweep_file_validates(path):
    sweep = load_sweep(path)
    assert expand_grid(sweep)


def test_paper_grid():
    sweep = load_sweep(CONFIGS / "paper.yaml")
    assert [t.name for t in sweep.tasks] == PAPER_TASKS
    g = sweep.grid
    assert g.regime == ["single_fixed"]
    assert g.lr == PAPER_LRS
    assert g.q == PAPER_QS
    assert g.label_mode == LABEL_MODES
    assert sweep.training.epochs == 500
    assert sweep.training.checkpoint_epochs == CHECKPOINTS
    assert sweep.probe.suite == "default"
    # fractional GPUs: several trials and probe actors share one GPU
    assert 0 < sweep.resources.gpus_per_trial < 1
    assert 0 < sweep.resources.gpus_per_probe_actor < 1
    expected = len(PAPER_TASKS) * len(PAPER_LRS) * len(PAPER_QS) * len(LABEL_MODES) * len(g.seed)
    assert expected == 240
    trials = expand_grid(sweep)
    assert len(trials) == expected
    assert len({t.run_id for t in trials}) == expected


def test_paper_tasks_read_carte_relative_to_the_sweep_file():
    sweep = load_sweep(CONFIGS / "paper.yaml")
    assert {t.carte for t in sweep.tasks} == {str((CONFIGS / "../data/carte").resolve())}
    raw = yaml.safe_load((CONFIGS / "base.yaml").read_text())
    assert all(not Path(t["carte"]).is_absolute() and "shared" not in t["carte"] for t in raw["tasks"])


def test_realistic_regimes():
    sweep = load_sweep(CONFIGS / "realistic.yaml")
    assert sweep.grid.regime == ["single_fixed", "multi_fixed", "multi_random"]
    assert sweep.grid.q == [512]
    trials = expand_grid(sweep)
    per_regime = {r: sum(t.regime == r for t in trials) for r in sweep.grid.regime}
    combos = len(sweep.grid.lr) * len(sweep.grid.label_mode) * len(sweep.grid.seed)
    # multi_fixed and multi_random each train one model jointly on all 10 tasks (paper App. 10)
    assert per_regime == {"single_fixed": 10 * combos, "multi_fixed": combos, "multi_random": combos}
    assert all("+" in t.task for t in trials if t.regime in ("multi_fixed", "multi_random"))


def test_paper_and_realistic_share_the_base():
    paper, realistic = load_sweep(CONFIGS / "paper.yaml"), load_sweep(CONFIGS / "realistic.yaml")
    for part in ("tasks", "models", "training", "data", "probe", "resources", "wandb"):
        assert getattr(paper, part) == getattr(realistic, part), part
    assert paper.name != realistic.name


def test_no_secrets_or_storage_in_sweep_files():
    for path in SWEEP_FILES:
        text = path.read_text()
        assert "WANDB_API_KEY=" not in text
        assert "RAY_AUTH_TOKEN=" not in text
        assert yaml.safe_load(text).get("storage_path") is None, path.name


def test_validate_cli_accepts_paper(capsys):
    """The paper's CARTE tables are not shipped, so only the file itself is checked here."""
    from orchestrator.cli import main

    assert main(["validate", "--schema-only", str(CONFIGS / "paper.yaml")]) == 0
    assert "240 fine-tuning runs" in capsys.readouterr().out


def test_validate_runs_stage_one_and_names_the_missing_carte_folder(capsys):
    from orchestrator.cli import main

    assert main(["validate", str(CONFIGS / "paper.yaml")]) == 2
    err = capsys.readouterr().err
    assert "paper.yaml: Stage I failed before any cluster work" in err
    assert "CARTE directory not found" in err


def test_validate_reports_three_mistakes_at_once(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "include: " + str(CONFIGS / "paper.yaml") + "\n"
        "name: broken\n"
        "grid:\n"
        "  lr: [fast, 1.0e-3]\n"      # not a number
        "training:\n"
        "  epochs: 0\n"               # must be >= 1
        "probes:\n"                   # unknown key (the setting is `probe`)
        "  suite: default\n"
    )
    proc = _cli("validate", str(broken))
    assert proc.returncode != 0
    err = proc.stderr
    assert "3 problem(s)" in err
    assert "grid.lr.0:" in err
    assert "training.epochs:" in err
    assert "probes: unknown setting" in err


def test_documented_cluster_overlays_validate(tmp_path):
    """docs/CLUSTER.md writes an overlay from $ICLMEM_STORAGE on the head; it must be a valid sweep."""
    import re
    import shutil

    text = (ROOT / "docs" / "CLUSTER.md").read_text()
    overlays = re.findall(r"cat > configs/_cluster\.yaml <<EOF\n(.*?)\nEOF", text, re.S)
    assert len(overlays) >= 2
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    for i, body in enumerate(overlays):
        path = configs / f"_cluster{i}.yaml"
        path.write_text(body.replace("$ICLMEM_STORAGE", "s3://bucket/iclmem") + "\n")
        sweep = load_sweep(path)
        assert sweep.name == "paper"
        assert sweep.storage_path == "s3://bucket/iclmem/paper"
        assert len(expand_grid(sweep)) == 240
        if sweep.resources.probe_resources:
            assert sweep.resources.probe_resources == {"iclmem_head": 1}
            assert sweep.resources.gpus_per_probe_actor == 0
            assert sweep.resources.gpus_per_trial == 0.25  # merged, not replaced


# --------------------------------------------------------------------------- every accepted key is read
@pytest.mark.parametrize("setting", [{"log_records": True}, {"allow_download": True},
                                     {"probe": {"candidates": "native"}}])
def test_a_setting_no_code_reads_is_refused_as_unknown(setting):
    from iclmem.errors import ConfigError
    from orchestrator.schema.config import parse_sweep

    with pytest.raises(ConfigError, match="unknown setting"):
        parse_sweep({"name": "s", "tasks": [{"name": "iris"}], **setting})


def test_data_cache_dir_holds_the_prepared_tasks_instead_of_the_run_folder(tmp_path):
    from orchestrator.report.folder_claims import prepare_in_place_or_staged
    from orchestrator.schema.config import parse_sweep

    cache = tmp_path / "shared-cache"
    sweep = parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "grid": {"q": [20]},
                         "data": {"context_size": 30, "cache_dir": str(cache)}})
    prepared = prepare_in_place_or_staged(sweep, tmp_path / "run", log=lambda _m: None)
    (fingerprint,) = prepared.tasks
    assert (cache / f"{fingerprint}.npz").is_file()
    assert (cache / f"{fingerprint}.json").is_file()
    assert (tmp_path / "run").is_dir()
    assert not (tmp_path / "run" / "prepared").exists()


def test_torch_threads_per_trial_reaches_the_trainable_and_the_recompute_recipe(tmp_path):
    from orchestrator.driver.probe_pools import jobs_for
    from orchestrator.runfolder.prepare import prepare_sweep, trial_config
    from orchestrator.schema.config import parse_sweep
    from trainables.spec import TrialConfig

    sweep = parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "grid": {"q": [20]},
                         "data": {"context_size": 30}, "resources": {"torch_threads_per_trial": 2}})
    prepared = prepare_sweep(sweep, tmp_path / "prepared", log=lambda _m: None)
    config = trial_config(prepared.trials[0], prepared)
    assert config["torch_threads"] == 2
    assert jobs_for(TrialConfig.from_tune(config), 1, None, tmp_path / "probes")[0].recipe["torch_threads"] == 2


def test_a_multi_random_run_is_prepared_with_c_prime_in_its_member_pool_and_matched_non_members(tmp_path):
    """Spec: multi_random's training pool is its members together with C'; every pool row is a member and
    as many non-members are drawn. On a minority-class table the pool then holds C''s uniform rows, not
    Q + |C'| rows in class proportion (which left the minority class a handful of context rows)."""
    from orchestrator.runfolder.prepare import prepare_sweep
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({"name": "s", "tasks": [{"name": "breast_cancer"}], "grid": {"q": [20],
                         "regime": ["single_fixed", "multi_random"]}, "data": {"context_size": 60}})
    prepared = prepare_sweep(sweep, tmp_path / "prepared", log=lambda _m: None)
    by_run = {t.regime: prepared.tasks[prepared.trial_tasks[t.run_id][0]] for t in prepared.trials}
    single, pooled = by_run["single_fixed"], by_run["multi_random"]
    assert len(single.member_idx) == 20
    assert not set(single.context_idx) & set(single.member_idx)
    assert len(pooled.member_idx) == len(pooled.nonmember_idx) == 20 + 60
    assert set(pooled.context_idx) <= set(pooled.member_idx)
    assert np.bincount(pooled.labels[pooled.context_idx]).tolist() == [30, 30]
    assert (np.bincount(pooled.labels[pooled.member_idx]) == np.bincount(pooled.labels[pooled.nonmember_idx])).all()
    # the blind scorer never sees a member: fitted on the rows outside the split, it sits at chance
    assert pooled.split_report.blind_auc_low <= 0.5 <= pooled.split_report.blind_auc_high


# --------------------------------------------------------------------------- the DP-SGD axis (issue #15)
# Run ids and config hashes of sweeps without DP, as they were before grid.dp, training.dp_* and
# outcome.epsilon_delta existed: run folders, Tune storage and W&B runs are named by them. data.label_design
# (#29) moved the hash and the shuffled_members runs' ids on purpose: their non-members are now scored on
# permuted labels, so a folder of the earlier (unmatched) results must not be resumed as if they were new.
PINNED_SWEEP = {"name": "pin", "tasks": [{"name": "iris"}],
                "grid": {"lr": [1e-3, 1e-2], "label_mode": ["normal", "shuffled_members"]}}
PINNED_HASH = "158b7591f96136cb"
PINNED_RUN_IDS = ["iris-single_fixed-lr0.001-q50-normal-s0-04adf4", "iris-single_fixed-lr0.001-q50-shuffled_members-s0-6ec2d4",
                  "iris-single_fixed-lr0.01-q50-normal-s0-d97e3d", "iris-single_fixed-lr0.01-q50-shuffled_members-s0-bc8552"]


def test_sweeps_without_dp_keep_their_run_ids_and_config_hash():
    from orchestrator.schema.config import parse_sweep

    for extra in ({}, {"grid": {**PINNED_SWEEP["grid"], "dp": ["inf"]}},
                  {"training": {"dp_delta": 1e-5, "dp_max_grad_norm": 1.0, "dp_accountant": "rdp"}},
                  {"outcome": {"epsilon_delta": 1e-5}}):
        sweep = parse_sweep({**PINNED_SWEEP, **extra})
        assert sweep.config_hash() == PINNED_HASH, extra
        assert [t.run_id for t in expand_grid(sweep)] == PINNED_RUN_IDS, extra
    # the quickstart probes 2 null splits per checkpoint since #56 (its run claims need 16 null trials): a new hash
    assert load_sweep(CONFIGS / "quickstart.yaml").config_hash() == "ffa03245cd56e595"


def test_the_dp_axis_adds_runs_named_by_their_epsilon_and_settings():
    from orchestrator.schema.config import parse_sweep

    base = {"name": "s", "tasks": [{"name": "iris"}], "grid": yaml.safe_load("dp: [.inf, 1, 8]")}
    trials = expand_grid(parse_sweep(base))
    assert [t.dp for t in trials] == [float("inf"), 1.0, 8.0]
    assert trials[0].run_id == "iris-single_fixed-lr0.001-q50-normal-s0-04adf4"
    assert "-dp1-" in trials[1].run_id
    assert "-dp8-" in trials[2].run_id
    # another delta or clipping norm changes the noise, so it names another run
    other = expand_grid(parse_sweep({**base, "training": {"dp_delta": 1e-6}}))
    assert other[0].run_id == trials[0].run_id
    assert other[1].run_id != trials[1].run_id
    assert parse_sweep(base).config_hash() != PINNED_HASH


def test_sweep_json_round_trips_an_infinite_epsilon(tmp_path):
    """sweep.json is written without NaN/inf (allow_nan=False): inf is stored as "inf" and reads back."""
    import json

    from iclmem.atomic import write_json_atomic
    from orchestrator.schema.config import config_hash_of, parse_sweep

    sweep = parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "grid": {"dp": ["inf", 2]},
                         "training": {"epochs": 10, "checkpoint_epochs": [5, 10]}})
    write_json_atomic(tmp_path / "sweep.json", sweep.model_dump(mode="json"))
    stored = json.loads((tmp_path / "sweep.json").read_text())
    assert stored["grid"]["dp"] == ["inf", 2.0]
    assert parse_sweep(stored) == sweep
    assert config_hash_of(stored) == sweep.config_hash()


@pytest.mark.parametrize(("setting", "message"), [
    ({"grid": {"dp": [0]}}, "grid.dp"), ({"grid": {"dp": [-1]}}, "grid.dp"), ({"grid": {"dp": [1, 1]}}, "duplicate"),
    ({"grid": {"dp": []}}, "grid.dp"),
    ({"training": {"dp_delta": 0}}, "training.dp_delta"), ({"training": {"dp_delta": 1}}, "training.dp_delta"),
    ({"training": {"dp_max_grad_norm": 0}}, "training.dp_max_grad_norm"),
    ({"training": {"dp_accountant": "gdp"}}, "training.dp_accountant"),
    ({"grid": {"dp": [1], "regime": ["multi_random"]}}, "multi_random"),
])
def test_bad_dp_settings_are_refused_naming_the_setting(setting, message):
    from iclmem.errors import ConfigError
    from orchestrator.schema.config import parse_sweep

    with pytest.raises(ConfigError, match=message):
        parse_sweep({"name": "s", "tasks": [{"name": "iris"}, {"name": "wine"}], **setting})


# ------------------------------------------------------------------ numbers are numbers (issue #45, cases 2 and 3)
# YAML reads true/yes/on as booleans, which pydantic would take as 1: a learning rate of 1.0, one epoch
@pytest.mark.parametrize(("yaml_text", "where"), [
    ("grid: {lr: [true]}", "grid.lr: a number is meant at [0], got the boolean true"),
    ("grid: {lr: [0.001, yes]}", "grid.lr: a number is meant at [1], got the boolean true"),
    ("grid: {dp: [false]}", "grid.dp: a number is meant at [0], got the boolean false"),
    ("training: {weight_decay: true}", "training.weight_decay: a number is meant, got the boolean true"),
    ("training: {epochs: true}", "training.epochs: a number is meant, got the boolean true"),
    ("training: {epochs: 5, checkpoint_epochs: [1, on]}", "training.checkpoint_epochs: a number is meant at [1]"),
    ("probe: {null_splits: true}", "probe.null_splits: a number is meant, got the boolean true"),
    ("probe: {bootstrap: true}", "probe.bootstrap: a number is meant"),
    ("outcome: {memorization_auc: true}", "outcome.memorization_auc: a number is meant"),
    ("resources: {cpus_per_trial: true}", "resources.cpus_per_trial: a number is meant"),
    ("resources: {trial_resources: {worker: true}}", "resources.trial_resources: a number is meant at worker"),
    ("resources: {max_concurrent_trials: true}", "resources.max_concurrent_trials: a number is meant"),
    ("canaries: {kinds: [random_label], copies: [1, true]}", "canaries.copies: a number is meant at [1]"),
])
def test_a_yaml_boolean_where_a_number_is_meant_is_refused_naming_the_setting(tmp_path, yaml_text, where):
    path, message = _refusal_of(tmp_path, yaml_text)
    assert where in message
    assert str(path) in message


def _refusal_of(tmp_path, yaml_text: str) -> tuple[Path, str]:
    """The ConfigError message load_sweep gives for an iris sweep with ``yaml_text`` added, and the file's path."""
    from iclmem.errors import ConfigError

    path = tmp_path / "sweep.yaml"
    path.write_text(f"name: s\ntasks: [{{name: iris}}]\n{yaml_text}\n")
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    return path, str(info.value)


def test_booleans_stay_booleans_and_integers_stay_numbers():
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "grid": {"lr": [1]},
                         "training": {"every_epoch": True, "weight_decay": 0}, "outcome": {"strict": True}})
    assert sweep.grid.lr == [1.0]
    assert sweep.training.weight_decay == 0.0
    assert sweep.training.every_epoch is True
    assert sweep.outcome.strict is True


def test_a_yaml_boolean_in_an_lm_sweep_is_refused_naming_the_setting(tmp_path):
    from iclmem.errors import ConfigError
    from orchestrator.schema.sweep_files import load_lm_sweep

    path = tmp_path / "lm.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load((CONFIGS / "lm_quickstart.yaml").read_text()),
                                    "batch_size": True}))
    with pytest.raises(ConfigError, match=r"batch_size: a number is meant, got the boolean true"):
        load_lm_sweep(path)


@pytest.mark.parametrize(("yaml_text", "where"), [
    ("training: {weight_decay: .inf}", "training.weight_decay: Input should be a finite number"),
    ("training: {grad_clip: .nan}", "training.grad_clip: Input should be a finite number"),
    ("grid: {lr: [.inf]}", "grid.lr.0: Input should be a finite number"),
    ("resources: {stall_timeout_min: .inf}", "resources.stall_timeout_min: Input should be a finite number"),
    ("outcome: {collapse_loss_ratio: .inf}", "outcome.collapse_loss_ratio: Input should be a finite number"),
    ("resources: {probe_resources: {worker: .inf}}", "resources.probe_resources.worker: Input should be a finite number"),
    ("grid: {dp: [.nan]}", "grid.dp"),
])
def test_a_non_finite_number_where_a_finite_one_is_meant_is_refused_naming_the_setting(tmp_path, yaml_text, where):
    assert where in _refusal_of(tmp_path, yaml_text)[1]


@pytest.mark.parametrize(("setting", "where"), [
    ({"trial_resources": {"worker": -1}}, "resources.trial_resources.worker: Input should be greater than or equal to 0"),
    ({"probe_resources": {"worker": -0.5}}, "resources.probe_resources.worker: Input should be greater than or equal"),
])
def test_a_negative_custom_resource_is_refused_naming_the_setting(setting, where):
    from iclmem.errors import ConfigError
    from orchestrator.schema.config import parse_sweep

    with pytest.raises(ConfigError) as info:
        parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "resources": setting})
    assert where in str(info.value)
    assert parse_sweep({"name": "s", "tasks": [{"name": "iris"}],
                        "resources": {"trial_resources": {"worker": 0.5}}}).resources.trial_resources == {"worker": 0.5}


def test_a_bootstrap_that_no_probe_could_hold_is_refused_at_validation():
    from iclmem.errors import ConfigError
    from orchestrator.schema.config import parse_sweep
    from orchestrator.schema.config_base import MAX_BOOTSTRAP

    base = {"name": "s", "tasks": [{"name": "iris"}]}
    assert parse_sweep({**base, "probe": {"bootstrap": MAX_BOOTSTRAP}}).probe.bootstrap == MAX_BOOTSTRAP
    with pytest.raises(ConfigError, match=rf"probe.bootstrap: Input should be less than or equal to {MAX_BOOTSTRAP}"):
        parse_sweep({**base, "probe": {"bootstrap": 10**12}})


def test_a_trial_crosses_ray_as_a_plain_dict_and_comes_back_as_the_same_typed_trial(tmp_path):
    """trainables.spec.TrialConfig: the driver hands Tune a plain dict (one grid axis); the trainable and the
    driver's callbacks rebuild the same frozen, typed trial from it, wrapped in the axis or not."""
    import pickle

    from iclmem.errors import ConfigError
    from orchestrator.runfolder.prepare import prepare_sweep, trial_config
    from orchestrator.schema.config import parse_sweep
    from trainables.spec import TUNE_AXIS, TrialConfig

    sweep = parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "grid": {"q": [20], "dp": [1.0]},
                         "data": {"context_size": 30}, "training": {"epochs": 3}})
    prepared = prepare_sweep(sweep, tmp_path / "prepared", log=lambda _m: None)
    config = trial_config(prepared.trials[0], prepared)
    assert all(isinstance(v, (str, int, float, bool, list, dict, type(None))) for v in config.values())
    trial = TrialConfig.from_tune({TUNE_AXIS: config})
    assert trial == TrialConfig.from_tune(config) == pickle.loads(pickle.dumps(trial))
    assert trial.to_tune() == config
    assert trial.run_identity.run_id == trial.run_id == prepared.trials[0].run_id
    assert trial.run_identity == prepared.trials[0].identity  # the spec's RunIdentity is the rows' identity
    assert trial.run_identity.q == 20
    assert trial.finetune.dp is not None
    assert trial.finetune.dp.target_epsilon == 1.0
    assert trial.finetune.epochs == 3
    with pytest.raises(TypeError):
        trial.identity["run_id"] = "other"  # frozen all the way down
    with pytest.raises(ConfigError, match="identity names run"):
        TrialConfig.from_tune({**config, "run_id": "another-run"})
