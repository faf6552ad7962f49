"""`iclmem cluster-check`: Ray's own validation of the cluster file, then iclmem's storage, secret and
resource checks. Every test writes a real file and runs the real check (some through the CLI).

No Ray cluster is started and nothing reaches a cloud provider: Ray's validation runs offline.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private import util as ray_util

from iclmem.errors import ConfigError
from orchestrator.cluster.cluster import STORAGE_ENV, check_cluster_file, exported

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster.yaml"
DOCS = ROOT / "docs" / "CLUSTER.md"


def _shipped() -> dict:
    return yaml.safe_load(CLUSTER.read_text())


def _write(tmp_path: Path, config: dict, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _sweep(tmp_path: Path, name: str = "sweep.yaml", **settings) -> Path:
    """A minimal valid sweep file (one built-in task) with the given top-level settings."""
    return _write(tmp_path, {"name": "t", "tasks": [{"name": "breast_cancer"}], **settings}, name)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _ray_message(config: dict) -> str:
    """What Ray itself says about a config (the steps `ray up` runs before contacting the provider)."""
    with pytest.raises(Exception) as info:  # noqa: PT011 - whatever Ray raises: its message is the result
        ray_util.validate_config(ray_util.prepare_config(copy.deepcopy(config)))
    return getattr(info.value, "message", None) or str(info.value)


def _cpu_only(config: dict) -> dict:
    """The shipped cluster with its GPU worker types replaced by one CPU-only type."""
    config["available_node_types"] = {
        "head": config["available_node_types"]["head"],
        "cpu.8x": {"min_workers": 0, "max_workers": 4, "resources": {"CPU": 8, "GPU": 0},
                   "node_config": {"InstanceType": "m5.2xlarge"}},
    }
    return config


def _head_only(config: dict) -> dict:
    config["max_workers"] = 0
    for node in config["available_node_types"].values():
        node["max_workers"] = 0
    return config


# ------------------------------------------------------------------------------------------- shipped files
def test_shipped_cluster_yaml_passes_with_the_shipped_sweeps():
    sweeps = [ROOT / "configs" / f"{n}.yaml" for n in ("paper", "realistic", "quickstart")]
    result = check_cluster_file(CLUSTER, sweeps)
    assert result.problems == []
    assert result.ok


def test_cli_accepts_shipped_file():
    proc = _cli("cluster-check", "cluster.yaml", "--sweep", "configs/paper.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "cluster.yaml: valid" in proc.stdout
    assert "configs/paper.yaml" in proc.stdout


def test_shipped_file_shape():
    config = _shipped()
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert head["resources"]["iclmem_head"] >= 1   # docs/CLUSTER.md pins probe actors with it
    workers = {k: v for k, v in types.items() if k != config["head_node_type"]}
    assert workers
    assert all(v["resources"]["GPU"] >= 1 for v in workers.values())
    assert {v["node_config"]["InstanceType"] for v in workers.values()} == {"g5.xlarge", "g5.12xlarge"}
    # shared storage named exactly once, and token authentication on every node
    text = CLUSTER.read_text()
    assert len(re.findall(r"ICLMEM_STORAGE=", text)) == 1
    assert exported(config, STORAGE_ENV) == ("setup_commands.0", "s3://your-bucket/iclmem")
    assert any("RAY_AUTH_MODE=token" in c for c in config["setup_commands"])
    assert "~/.ray/auth_token" in config["file_mounts"]
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        assert any(".iclmem_env" in c and "ray start" in c for c in config[key])
    assert any("torch==2.13.0" in c and "pip install" in c and "-e ~/iclmem" in c for c in config["setup_commands"])


# ------------------------------------------------------------------------------------------- Ray's validation
def test_misspelled_top_level_key_refused_with_rays_message(tmp_path):
    config = _shipped()
    config["max_worker"] = config.pop("max_workers")
    path = _write(tmp_path, config)
    message = _ray_message(config)
    assert "'max_worker' was unexpected" in message
    assert check_cluster_file(path).problems == [f"{path}: (top level): {message} (Ray's cluster-config schema)"]
    proc = _cli("cluster-check", str(path))
    assert proc.returncode == 2
    assert f"{path}: (top level): {message}" in proc.stderr


def test_schema_error_names_the_nested_key(tmp_path):
    config = _shipped()
    config["available_node_types"]["gpu.1x"]["resources"]["GPU"] = 0.5   # Ray wants whole GPUs per node
    path = _write(tmp_path, config)
    assert check_cluster_file(path).problems == [
        f"{path}: available_node_types.gpu.1x.resources.GPU: 0.5 is not of type 'integer' "
        "(Ray's cluster-config schema)"]


@pytest.mark.parametrize("break_it", [
    lambda c: c.update(head_node_type="ray.head.missing"),
    lambda c: (c["available_node_types"]["gpu.1x"].update(min_workers=9),
               c["available_node_types"]["gpu.4x"].update(min_workers=2)),   # 11 > max_workers 10
], ids=["head_node_type", "sum_of_min_workers"])
def test_rays_own_checks_beyond_the_schema(tmp_path, break_it):
    config = _shipped()
    break_it(config)
    path = _write(tmp_path, config)
    assert check_cluster_file(path).problems == [f"{path}: {_ray_message(config)} (Ray's validate_config)"]


def test_malformed_file_is_explained_by_rays_schema(tmp_path):
    """Ray's prepare_config indexes config["provider"]; the error names the missing key, not a KeyError."""
    config = _shipped()
    del config["provider"]
    path = _write(tmp_path, config)
    assert check_cluster_file(path).problems == [
        f"{path}: (top level): 'provider' is a required property (Ray's cluster-config schema)"]
    config = _shipped()
    config["provider"]["type"] = "awz"
    path = _write(tmp_path, config)
    assert check_cluster_file(path).problems == [
        f"{path}: provider.type: Unsupported node provider: awz (Ray's prepare_config)"]


def test_node_resources_left_to_ec2_on_aws_but_required_elsewhere(tmp_path):
    config = _shipped()
    del config["available_node_types"]["gpu.4x"]["resources"]   # ray up reads them from EC2
    assert check_cluster_file(_write(tmp_path, config)).ok
    gcp = copy.deepcopy(_doc_cluster_configs()["gcp"])
    del gcp["available_node_types"]["gpu.1x"]["resources"]
    path = _write(tmp_path, gcp, "gcp.yaml")
    assert check_cluster_file(path).problems == [
        f"{path}: available_node_types.gpu.1x: 'resources' is a required property (Ray's cluster-config schema)"]


def test_on_premise_node_types_refused_by_ray(tmp_path):
    config = copy.deepcopy(_doc_cluster_configs()["local"])
    config["available_node_types"] = {"gpu": {"resources": {"GPU": 1}, "node_config": {}}}
    path = _write(tmp_path, config)
    assert check_cluster_file(path).problems == [
        f"{path}: The field available_node_types is not supported for on-premise clusters. (Ray's prepare_config)"]


def test_rays_warnings_become_notes(tmp_path):
    config = copy.deepcopy(_doc_cluster_configs()["local"])
    config["min_workers"] = config["max_workers"] = 5   # three worker_ips listed
    path = _write(tmp_path, config)
    result = check_cluster_file(path)
    assert result.ok
    assert (f"{path}: Ray: The value of `max_workers` supplied (5) is greater than the number of available "
            "worker ips (3). Setting `max_workers=3`.") in result.notes


def test_unreadable_files(tmp_path):
    missing = tmp_path / "nope.yaml"
    assert check_cluster_file(missing).problems == [f"{missing}: file not found"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster_name: x\nprovider: [type: aws\n")
    (problem,) = check_cluster_file(bad).problems
    assert problem.startswith(f"{bad}: not valid YAML (line ")
    listed = tmp_path / "list.yaml"
    listed.write_text("- cluster_name\n")
    assert check_cluster_file(listed).problems == [
        f"{listed}: (top level): a cluster config is a mapping of settings, not list"]
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert check_cluster_file(empty).problems == [
        f"{empty}: (top level): a cluster config is a mapping of settings, not NoneType"]
    proc = _cli("cluster-check", str(missing))
    assert proc.returncode == 2
    assert f"{missing}: file not found" in proc.stderr


# ------------------------------------------------------------------------------------------- shared storage
def test_multi_node_needs_shared_storage(tmp_path):
    config = _shipped()
    config["setup_commands"] = [c for c in config["setup_commands"] if STORAGE_ENV not in c]
    path = _write(tmp_path, config)
    (problem,) = check_cluster_file(path).problems
    assert problem.startswith(f"{path}: setup_commands: no command exports ICLMEM_STORAGE")
    # a head-only cluster has nowhere else to restore a trial
    assert check_cluster_file(_write(tmp_path, _head_only(config))).ok


@pytest.mark.parametrize(("value", "shared"), [
    ("s3://bucket/iclmem", True), ("gs://bucket/iclmem", True), ("/mnt/nfs/iclmem", True),
    ("runs/tune", False), ("~/tune", False), ("file:///mnt/nfs/iclmem", False),
    ("/tmp/iclmem", False), ("/dev/shm/iclmem", False), ("/var/tmp/iclmem", False),  # node-local, ephemeral
])
def test_cluster_storage_must_be_shared(tmp_path, value, shared):
    config = _shipped()
    config["setup_commands"][0] = f"echo 'export ICLMEM_STORAGE={value}' > ~/.iclmem_env"
    path = _write(tmp_path, config)
    problems = check_cluster_file(path).problems
    if shared:
        assert problems == []
    else:
        (problem,) = problems
        assert problem.startswith(f"{path}: setup_commands.0: ICLMEM_STORAGE={value} is ")


@pytest.mark.parametrize(("storage_path", "extra_export", "hint"), [
    ("s3://bucket/paper", None, None),
    ("/mnt/nfs/iclmem/paper", None, None),                         # under ICLMEM_STORAGE
    ("/home/ray/tune", "ICLMEM_SHARED_STORAGE=1", None),            # declared a shared mount
    ("/home/ray/tune", None, "nothing marks as a shared mount"),
    ("file:///mnt/nfs/iclmem/paper", None, "not shared between nodes"),
])
def test_sweep_storage_path_must_be_shared(tmp_path, storage_path, extra_export, hint):
    config = _shipped()
    config["setup_commands"][0] = "echo 'export ICLMEM_STORAGE=/mnt/nfs/iclmem' > ~/.iclmem_env"
    if extra_export:
        config["setup_commands"].insert(1, f"echo 'export {extra_export}' >> ~/.iclmem_env")
    path = _write(tmp_path, config)
    sweep = _sweep(tmp_path, storage_path=storage_path)
    problems = check_cluster_file(path, [sweep]).problems
    if hint is None:
        assert problems == []
    else:
        (problem,) = problems
        assert problem.startswith(f"{sweep}: storage_path: {storage_path!r} ")
        assert hint in problem


@pytest.mark.parametrize(("storage_path", "hint"), [("runs/tune", "not an absolute path"),
                                                   ("$ICLMEM_STORAGE/paper", "shell variable")])
def test_a_relative_or_unexpanded_sweep_storage_path_is_refused_with_the_sweep(tmp_path, storage_path, hint):
    from iclmem.errors import ConfigError

    path = _write(tmp_path, _shipped())
    sweep = _sweep(tmp_path, storage_path=storage_path)
    with pytest.raises(ConfigError, match=r"storage_path: .*" + hint) as info:
        check_cluster_file(path, [sweep])
    assert str(sweep) in str(info.value)


def test_local_storage_path_is_fine_on_one_node(tmp_path):
    path = _write(tmp_path, _head_only(_shipped()))
    assert check_cluster_file(path, [_sweep(tmp_path, storage_path=str(tmp_path / "runs" / "tune"))]).ok


# ------------------------------------------------------------------------------------------- secrets
@pytest.mark.parametrize(("command", "name"), [
    ("export WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567", "WANDB_API_KEY"),
    ("echo 'export RAY_AUTH_TOKEN=abcdef' >> ~/.bashrc", "RAY_AUTH_TOKEN"),
    ("export HF_TOKEN=hf_abcdef", "HF_TOKEN"),
    # the runtime-env route that docs/CLUSTER.md warns about: Ray logs runtime envs in plain text
    ("""ray job submit --runtime-env-json '{"env_vars": {"WANDB_API_KEY": "0123456789abcdef"}}' -- iclmem run x""",
     "WANDB_API_KEY"),
])
def test_literal_secrets_refused(tmp_path, command, name):
    config = _shipped()
    config["setup_commands"].append(command)
    path = _write(tmp_path, config)
    (problem,) = check_cluster_file(path).problems
    assert problem.startswith(f"{path}: setup_commands.{len(config['setup_commands']) - 1}: holds a literal {name};")


W_AND_B_KEY = "0123456789abcdef0123456789abcdef01234567"  # shaped like a W&B key; never sent


# #62: the literal secrets a hostile tester added, one line each, that cluster-check used to call valid (every value
# is made up, shaped like the real thing)
HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
GH = "ghp_" + "0123456789abcdefghijABCDEFGHIJ012345"


@pytest.mark.parametrize(("command", "what"), [
    (f"huggingface-cli login --token {HF}", "a Hugging Face token"),
    ("huggingface-cli login --token=abcdefgh12345678", "a token given to `huggingface-cli login`"),
    (f"pip install git+https://{GH}@github.com/org/private.git", "a GitHub token"),
    ("pip install iclmem --index-url https://alice:s3cretpassw0rd@pypi.example.org/simple",
     "a password in a URL"),
    (f"printf 'machine api.wandb.ai login user password {W_AND_B_KEY}' > ~/.netrc", "a .netrc password"),
    ("export AZURE_STORAGE_CONNECTION_STRING='DefaultEndpointsProtocol=https;AccountName=acct;"
     "AccountKey=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZg==;EndpointSuffix=core.windows.net'",
     "an Azure storage account key"),
])
def test_tokens_passwords_and_keys_in_setup_commands_are_refused(tmp_path, command, what):
    config = _shipped()
    config["setup_commands"].append(command)
    path = _write(tmp_path, config)
    problems = check_cluster_file(path).problems
    assert problems, command
    assert problems[0].startswith(f"{path}: setup_commands.{len(config['setup_commands']) - 1}: holds {what};")


@pytest.mark.parametrize("command", [
    "huggingface-cli login --token $HF_TOKEN", "pip install --index-url https://$PIP_USER:$PIP_PASSWORD@pypi.example.org/simple",
    "pip install git+https://github.com/org/public.git@0123456789abcdef0123456789abcdef01234567",  # a commit hash
    "git checkout 0123456789abcdef0123456789abcdef01234567 && pip install wandb==0.22.0",
])
def test_references_to_secrets_and_commit_hashes_are_not_secrets(tmp_path, command):
    config = _shipped()
    config["setup_commands"].append(command)
    assert check_cluster_file(_write(tmp_path, config)).ok


def test_a_wandb_key_in_a_yaml_comment_is_refused_naming_the_line(tmp_path):
    lines = CLUSTER.read_text().splitlines()
    lines.insert(3, f"# wandb key for the team: {W_AND_B_KEY}")
    path = tmp_path / "cluster.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert check_cluster_file(path).problems == [
        f"{path}:4: a comment holds a W&B API key; remove it and revoke the credential (the file's history keeps it)"]


def test_a_yaml_alias_bomb_is_refused_at_once_not_expanded(tmp_path):
    import time

    levels = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        levels.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 10) + "]")
    path = tmp_path / "cluster.yaml"
    path.write_text("\n".join(levels) + "\ncluster_name: x\n")
    started = time.perf_counter()
    (problem,) = check_cluster_file(path).problems
    assert "expand to more than 100,000 nodes (an alias bomb?)" in problem
    assert time.perf_counter() - started < 30  # a sanity bound: expanding it would take hours


@pytest.mark.parametrize("command", [f"wandb login {W_AND_B_KEY}", f"pip install wandb && wandb login --relogin '{W_AND_B_KEY}'",
                                     f"wandb login --host https://wandb.example.org {W_AND_B_KEY}"])
def test_a_key_given_to_wandb_login_in_setup_commands_is_refused(tmp_path, command):
    config = _shipped()
    config["setup_commands"].append(command)
    path = _write(tmp_path, config)
    (problem,) = check_cluster_file(path).problems
    assert problem.startswith(f"{path}: setup_commands.{len(config['setup_commands']) - 1}: holds a W&B key given to "
                              "`wandb login`;")


@pytest.mark.parametrize("command", ["wandb login $WANDB_API_KEY", "wandb login --relogin",
                                     "wandb login --host https://wandb.example.org", 'wandb login "$(cat ~/.wandb_key)"'])
def test_wandb_login_without_a_literal_key_passes(tmp_path, command):
    config = _shipped()
    config["setup_commands"].append(command)
    assert check_cluster_file(_write(tmp_path, config)).ok


def test_an_aws_key_in_a_yaml_comment_is_refused_naming_the_line(tmp_path):
    lines = CLUSTER.read_text().splitlines()
    lines.insert(3, "# old credentials: AKIAABCDEFGHIJKLMNOP (rotated?)")
    lines.append("  - echo done  # key AKIAQRSTUVWXYZ234567")
    path = tmp_path / "cluster.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert check_cluster_file(path).problems == [
        f"{path}:4: a comment holds an AWS access key id; remove it and revoke the credential (the file's history "
        "keeps it)",
        f"{path}:{len(lines)}: a comment holds an AWS access key id; remove it and revoke the credential (the "
        "file's history keeps it)"]


def test_other_credentials_refused(tmp_path):
    config = _shipped()
    config["head_setup_commands"].append("export AWS_ACCESS_KEY_ID=AKIAABCDEFGHIJKLMNOP")
    config["docker"]["run_options"].append("-e WANDB_API_KEY=0123456789abcdef")
    config["provider"]["aws_secret_access_key"] = "abc/def"
    config["file_mounts"]["~/.wandb_key"] = "~/.wandb_key"   # copies the key to every node
    path = _write(tmp_path, config)
    problems = check_cluster_file(path).problems
    assert [p.split(": ")[1] for p in problems] == [
        "provider.aws_secret_access_key", "docker.run_options.1", "head_setup_commands.1", "file_mounts.~/.wandb_key"]
    assert all(p.startswith(f"{path}: ") for p in problems)


def test_environment_references_are_not_secrets(tmp_path):
    config = _shipped()
    config["head_setup_commands"].append("""WANDB_API_KEY="$(cat ~/.wandb_key)" iclmem run x --wandb online""")
    config["head_setup_commands"].append('echo "WANDB_API_KEY=$WANDB_API_KEY" > /dev/null')
    config["docker"]["run_options"].append("-e WANDB_API_KEY")   # passes the caller's value through
    assert check_cluster_file(_write(tmp_path, config)).ok


def test_secret_reported_even_when_ray_refuses_the_file(tmp_path):
    config = _shipped()
    config["bogus"] = 1
    config["setup_commands"].append("export WANDB_API_KEY=0123456789abcdef")
    path = _write(tmp_path, config)
    problems = check_cluster_file(path).problems
    assert len(problems) == 2
    assert "holds a literal WANDB_API_KEY" in problems[0]
    assert "'bogus' was unexpected" in problems[1]


def test_secret_in_the_sweep_refused(tmp_path):
    sweep = _sweep(tmp_path, models=[{"name": "pfn-mini", "options": {"weights": "shipped", "token": "hf_abcdef"}}])
    (problem,) = check_cluster_file(CLUSTER, [sweep]).problems
    assert problem.startswith(f"{sweep}: models.0.options.token: holds a credential")


# ------------------------------------------------------------------------------------------- resources
def test_gpu_trials_on_a_cpu_only_cluster_refused(tmp_path):
    path = _write(tmp_path, _cpu_only(_shipped()))
    sweep = _sweep(tmp_path, resources={"cpus_per_trial": 1, "gpus_per_trial": 1})
    (problem,) = check_cluster_file(path, [sweep]).problems
    assert problem.startswith(f"{sweep}: resources.gpus_per_trial: a trial needs {{CPU 1, GPU 1}}, "
                              f"but no node type of {path} has that")
    proc = _cli("cluster-check", str(path), "--sweep", str(sweep))
    assert proc.returncode == 2
    assert f"{sweep}: resources.gpus_per_trial" in proc.stderr
    # the shipped GPU cluster runs it
    assert check_cluster_file(CLUSTER, [sweep]).ok


def test_custom_trial_resource_must_be_declared(tmp_path):
    sweep = _sweep(tmp_path, resources={"gpus_per_trial": 0.25, "trial_resources": {"worker": 1}})
    (problem,) = check_cluster_file(CLUSTER, [sweep]).problems
    assert problem.startswith(f"{sweep}: resources.trial_resources.worker: a trial needs {{CPU 1, GPU 0.25, worker 1}}")
    config = _shipped()
    config["available_node_types"]["gpu.1x"]["resources"]["worker"] = 1
    assert check_cluster_file(_write(tmp_path, config), [sweep]).ok


@pytest.mark.parametrize(("actors", "n_models", "fits"), [(8, 1, True), (9, 1, False), (4, 2, True), (5, 2, False)])
def test_every_probe_actor_must_be_placed(tmp_path, actors, n_models, fits):
    """The head offers iclmem_head 8; each distinct base model gets its own pool of probe_actors."""
    models = [{"name": "pfn-mini", "options": {"weights": "shipped", "seed": i}} for i in range(n_models)]
    sweep = _sweep(tmp_path, models=models, resources={"probe_actors": actors, "gpus_per_probe_actor": 0,
                                                       "probe_resources": {"iclmem_head": 1}})
    problems = check_cluster_file(CLUSTER, [sweep]).problems
    if fits:
        assert problems == []
    else:
        (problem,) = problems
        assert problem.startswith(f"{sweep}: resources.probe_actors: {actors} probe actor(s) x {n_models} model(s) "
                                  f"= {actors * n_models}, each {{CPU 1, iclmem_head 1}}, but at most 8 fit")


def test_probe_actors_must_leave_room_for_a_trial(tmp_path):
    config = _shipped()
    del config["available_node_types"]["gpu.4x"]
    config["max_workers"] = config["available_node_types"]["gpu.1x"]["max_workers"] = 1   # one GPU in all
    sweep = _sweep(tmp_path, resources={"gpus_per_trial": 0.25, "probe_actors": 4, "gpus_per_probe_actor": 0.25})
    path = _write(tmp_path, config)
    (problem,) = check_cluster_file(path, [sweep]).problems
    assert problem.startswith(f"{sweep}: resources: the 4 probe actor(s) {{CPU 1, GPU 0.25}} hold their resources")
    config["max_workers"] = config["available_node_types"]["gpu.1x"]["max_workers"] = 2
    assert check_cluster_file(_write(tmp_path, config), [sweep]).ok


def test_undeclared_aws_resources_are_noted_not_refused(tmp_path):
    config = _shipped()
    for name in ("gpu.1x", "gpu.4x"):
        del config["available_node_types"][name]["resources"]
    sweep = _sweep(tmp_path, resources={"gpus_per_trial": 1})
    result = check_cluster_file(_write(tmp_path, config), [sweep])
    assert result.problems == []
    assert any("available_node_types.gpu.1x: no CPU/GPU in resources" in n for n in result.notes)


def test_sweep_that_does_not_load_is_a_config_error(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="sweep file not found"):
        check_cluster_file(CLUSTER, [missing])
    proc = _cli("cluster-check", "cluster.yaml", "--sweep", str(missing))
    assert proc.returncode == 2
    assert f"sweep file not found: {missing}" in proc.stderr


# ------------------------------------------------------------------------------------------- documented variants
def _doc_cluster_configs() -> dict[str, dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S)
    configs = {}
    for block in blocks:
        data = yaml.safe_load(block)
        if isinstance(data, dict) and "provider" in data and "cluster_name" in data:
            configs[data["provider"]["type"]] = data
    return configs


def test_docs_hold_gcp_and_local_variants():
    assert {"gcp", "local"} <= set(_doc_cluster_configs())


@pytest.mark.parametrize("provider", ["gcp", "local"])
def test_documented_variants_pass(tmp_path, provider):
    path = _write(tmp_path, _doc_cluster_configs()[provider])
    result = check_cluster_file(path, [ROOT / "configs" / "paper.yaml"])
    assert result.problems == []
    if provider == "local":   # Ray detects each machine's resources when it starts
        assert any("not checked offline" in n for n in result.notes)


def test_documented_overlays_pass_against_the_shipped_cluster(tmp_path):
    """The sweeps docs/CLUSTER.md submits (storage from $ICLMEM_STORAGE, probe actors pinned to the head)."""
    overlays = re.findall(r"cat > configs/_cluster\.yaml <<EOF\n(.*?)\nEOF", DOCS.read_text(), re.S)
    assert len(overlays) >= 2
    configs = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", configs)
    paths = []
    for i, body in enumerate(overlays):   # the shell on the head expands $ICLMEM_STORAGE before iclmem reads it
        paths.append(configs / f"_cluster{i}.yaml")
        paths[-1].write_text(body.replace("$ICLMEM_STORAGE", "s3://your-bucket/iclmem") + "\n")
    assert check_cluster_file(CLUSTER, paths).problems == []


def test_docs_describe_jobs_and_token_auth():
    text = DOCS.read_text()
    for needle in ("ray job submit --working-dir . -- iclmem run configs/paper.yaml --address auto",
                   "ray job logs -f", "ray job status", "RAY_AUTH_MODE=token", "~/.ray/auth_token",
                   "RAY_AUTH_TOKEN", "ray get-auth-token --generate", "WANDB_API_KEY", "s3://", "gs://", "NFS",
                   "iclmem cluster-check cluster.yaml --sweep configs/paper.yaml"):
        assert needle in text, needle
    assert "RAY_AUTH_MODE=disabled" not in text


# ------------------------------------------------------------------------------------------- what Ray does not check
def _refused_by_the_cli(path: Path, key: str) -> str:
    """`iclmem cluster-check` refuses the file: exit 2, one problem line naming the file and the key."""
    proc = _cli("cluster-check", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("  - ")]
    assert line.startswith(f"  - {path}: {key}: "), line
    return line


def test_node_local_storage_is_refused_saying_why(tmp_path):
    config = _shipped()
    config["setup_commands"][0] = "echo 'export ICLMEM_STORAGE=/tmp/iclmem' > ~/.iclmem_env"
    line = _refused_by_the_cli(_write(tmp_path, config), "setup_commands.0")
    assert "ICLMEM_STORAGE=/tmp/iclmem is under /tmp, which is node-local and ephemeral" in line
    sweep = _sweep(tmp_path, storage_path="/tmp/tune")  # a sweep's own storage_path too, even under the root
    config["setup_commands"][0] = "echo 'export ICLMEM_STORAGE=/mnt/nfs/iclmem' > ~/.iclmem_env"
    config["setup_commands"].insert(1, "echo 'export ICLMEM_SHARED_STORAGE=1' >> ~/.iclmem_env")
    (problem,) = check_cluster_file(_write(tmp_path, config), [sweep]).problems
    assert problem.startswith(f"{sweep}: storage_path: '/tmp/tune' is under /tmp, which is node-local")


@pytest.mark.parametrize(("where", "image", "key"), [
    ("docker", "rayproject/ray:latest", "docker.image"),
    ("docker", "rayproject/ray", "docker.image"),                          # no tag: Docker takes latest
    ("docker", "rayproject/ray:nightly-gpu", "docker.image"),              # a moving tag
    ("worker_image", "rayproject/ray:latest-gpu", "docker.worker_image"),
    ("node_type", "rayproject/ray:latest", "available_node_types.gpu.1x.docker.worker_image"),
])
def test_an_unpinned_image_is_refused(tmp_path, where, image, key):
    config = _shipped()
    if where == "docker":
        config["docker"]["image"] = image
    elif where == "worker_image":
        config["docker"]["worker_image"] = image
    else:
        config["available_node_types"]["gpu.1x"]["docker"] = {"worker_image": image}
    path = _write(tmp_path, config)
    (problem,) = check_cluster_file(path).problems
    assert problem.startswith(f"{path}: {key}: {image!r}")
    assert "pin" in problem
    if image == "rayproject/ray:latest" and where == "docker":
        _refused_by_the_cli(path, key)
    config["docker"]["image"] = "rayproject/ray@sha256:" + "0" * 64  # a digest is pinned
    config["docker"].pop("worker_image", None)
    config["available_node_types"]["gpu.1x"].pop("docker", None)
    assert check_cluster_file(_write(tmp_path, config)).ok


def test_min_workers_above_the_node_types_max_workers_is_refused(tmp_path):
    """Ray checks only the sum of min_workers against the global max_workers, not each type's own bound."""
    config = _shipped()
    config["available_node_types"]["gpu.4x"].update(min_workers=3, max_workers=2)
    path = _write(tmp_path, config)
    assert check_cluster_file(path).problems == [
        f"{path}: available_node_types.gpu.4x.min_workers: 3 is more than its max_workers 2: the autoscaler can "
        "never reach the minimum; lower min_workers or raise max_workers"]
    _refused_by_the_cli(path, "available_node_types.gpu.4x.min_workers")
    config["available_node_types"]["gpu.4x"].update(min_workers=2)
    assert check_cluster_file(_write(tmp_path, config)).ok


def test_a_dockerfile_by_another_name_is_checked_as_an_image_not_read_as_yaml(tmp_path):
    folder = tmp_path / "ctx"
    folder.mkdir()
    shutil.copy(ROOT / "pyproject.toml", folder / "pyproject.toml")
    shutil.copy(ROOT / "Dockerfile", folder / "gpu.Dockerfile")
    result = check_cluster_file(folder / "gpu.Dockerfile")
    assert result.problems == []
    assert any("checked as a container image" in n for n in result.notes)
    (folder / "gpu.Dockerfile").write_text((ROOT / "Dockerfile").read_text().replace("USER iclmem", "USER root"))
    proc = _cli("cluster-check", str(folder / "gpu.Dockerfile"))
    assert proc.returncode == 2
    assert "not valid YAML" not in proc.stderr
    assert "runs as root (USER root)" in proc.stderr
