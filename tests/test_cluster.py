"""cluster.yaml and `iclmem cluster-check`: Ray's own schema, offline, plus the checks the schema misses.

No Ray cluster is started here; the only Ray code imported is the autoscaler's config helpers, to confirm
that Ray itself agrees with the offline check.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cluster import (
    check_cluster_config,
    check_cluster_file,
    cluster_notes,
    load_ray_schema,
    storage_value,
)

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster.yaml"
DOCS = ROOT / "docs" / "CLUSTER.md"


def _shipped() -> dict:
    return yaml.safe_load(CLUSTER.read_text())


def _write(tmp_path: Path, config: dict, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------------------------------------- shipped file
def test_shipped_cluster_yaml_is_valid():
    assert check_cluster_file(CLUSTER) == []


def test_cli_cluster_check_accepts_shipped_file():
    proc = _cli("cluster-check", "cluster.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "valid" in proc.stdout


def test_shipped_file_shape():
    config = _shipped()
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert head["resources"]["iclmem_head"] >= 1   # docs/CLUSTER.md pins probe actors with it
    workers = {k: v for k, v in types.items() if k != config["head_node_type"]}
    assert workers and all(v["resources"]["GPU"] >= 1 for v in workers.values())
    assert {v["node_config"]["InstanceType"] for v in workers.values()} == {"g5.xlarge", "g5.12xlarge"}
    # shared storage named exactly once, and token authentication on every node
    text = CLUSTER.read_text()
    assert len(re.findall(r"ICLMEM_STORAGE=", text)) == 1
    assert storage_value(config).startswith("s3://")
    assert any("RAY_AUTH_MODE=token" in c for c in config["setup_commands"])
    assert "~/.ray/auth_token" in config["file_mounts"]
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        assert any(".iclmem_env" in c and "ray start" in c for c in config[key])
    assert any("torch==2.13.0" in c and "pip install" in c and "-e ~/iclmem" in c for c in config["setup_commands"])


def test_ray_itself_accepts_shipped_file():
    """The offline check and Ray's own prepare/validate (what `ray up` runs first) agree."""
    util = pytest.importorskip("ray.autoscaler._private.util")
    util.validate_config(util.prepare_config(_shipped()))


def test_schema_comes_from_the_ray_package():
    schema = load_ray_schema()
    assert "available_node_types" in schema["properties"]
    assert schema["additionalProperties"] is False


# ------------------------------------------------------------------------------------------- broken copies
def test_unknown_key_reported_with_path_and_name(tmp_path):
    config = _shipped()
    config["available_node_types"]["gpu.1x"]["bogus"] = 1
    problems = check_cluster_file(_write(tmp_path, config))
    assert problems == ["available_node_types.gpu.1x: Additional properties are not allowed ('bogus' was unexpected)"]
    proc = _cli("cluster-check", str(tmp_path / "cluster.yaml"))
    assert proc.returncode == 1
    assert "'bogus' was unexpected" in proc.stderr and "available_node_types.gpu.1x" in proc.stderr


def test_missing_head_node_type_is_named(tmp_path):
    config = _shipped()
    config["head_node_type"] = "ray.head.missing"
    problems = check_cluster_file(_write(tmp_path, config))
    assert len(problems) == 1
    assert "head_node_type" in problems[0] and "'ray.head.missing'" in problems[0]
    proc = _cli("cluster-check", str(tmp_path / "cluster.yaml"))
    assert proc.returncode == 1 and "ray.head.missing" in proc.stderr


def test_every_error_reported_at_once():
    config = _shipped()
    config["bogus_top"] = True
    config["available_node_types"]["gpu.1x"]["resources"]["GPU"] = 0.5   # Ray wants integers here
    config["available_node_types"]["gpu.4x"]["min_workers"] = 5           # > its max_workers (2)
    config["max_workers"] = "ten"
    problems = check_cluster_config(config)
    joined = "\n".join(problems)
    assert "(top level): Additional properties are not allowed ('bogus_top' was unexpected)" in joined
    assert "available_node_types.gpu.1x.resources.GPU: 0.5 is not of type 'integer'" in joined
    assert "available_node_types.gpu.4x: min_workers (5) > max_workers (2)" in joined
    assert "max_workers: 'ten' is not of type 'integer'" in joined


def test_min_workers_must_fit_global_max():
    config = _shipped()
    config["max_workers"] = 1
    config["available_node_types"]["gpu.1x"]["min_workers"] = 2
    assert any("sum of min_workers" in p for p in check_cluster_config(config))


def test_head_node_type_required_with_node_types():
    config = _shipped()
    del config["head_node_type"]
    assert check_cluster_config(config) == ["head_node_type: required when available_node_types is set"]


def test_defaults_filled_like_ray_up():
    """cluster_name may be left out (ray up fills 'default'); AWS detects node resources itself."""
    config = _shipped()
    del config["cluster_name"]
    del config["available_node_types"]["gpu.4x"]["resources"]
    assert check_cluster_config(config) == []


def test_missing_file_and_bad_yaml(tmp_path):
    assert check_cluster_file(tmp_path / "nope.yaml") == [f"file not found: {tmp_path / 'nope.yaml'}"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster_name: x\nprovider: [type: aws\n")
    (problem,) = check_cluster_file(bad)
    assert problem.startswith("not valid YAML (line ")
    listed = tmp_path / "list.yaml"
    listed.write_text("- cluster_name\n")
    assert check_cluster_file(listed) == ["the top level must be a mapping of settings, not list"]
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert "empty" in check_cluster_file(empty)[0]
    proc = _cli("cluster-check", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 1 and "file not found" in proc.stderr


def test_duplicate_keys_reported(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(CLUSTER.read_text() + "\ncluster_name: again\n")
    problems = check_cluster_file(path)
    assert len(problems) == 1 and "duplicate key 'cluster_name'" in problems[0]


# ------------------------------------------------------------------------------------------- iclmem checks
def test_multi_node_needs_shared_storage():
    config = _shipped()
    config["setup_commands"] = [c for c in config["setup_commands"] if "ICLMEM_STORAGE" not in c]
    problems = check_cluster_config(config)
    assert len(problems) == 1 and "shared storage" in problems[0]
    # a head-only cluster does not
    config["max_workers"] = 0
    for name, node in config["available_node_types"].items():
        if name != config["head_node_type"]:
            node["max_workers"] = 0
    assert check_cluster_config(config) == []


def test_relative_storage_path_refused():
    config = _shipped()
    config["setup_commands"][0] = "echo 'export ICLMEM_STORAGE=runs/tune' > ~/.iclmem_env"
    (problem,) = check_cluster_config(config)
    assert "ICLMEM_STORAGE=runs/tune" in problem


@pytest.mark.parametrize("command", [
    "export WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567",
    "export AWS_ACCESS_KEY_ID=AKIAABCDEFGHIJKLMNOP",
    "echo 'export RAY_AUTH_TOKEN=abcdef' >> ~/.bashrc",
])
def test_credentials_refused(command):
    config = _shipped()
    config["setup_commands"].append(command)
    problems = check_cluster_config(config)
    assert len(problems) == 1 and problems[0].startswith(f"setup_commands.{len(config['setup_commands']) - 1}:")


def test_environment_references_are_not_credentials():
    config = _shipped()
    config["head_setup_commands"].append('echo "WANDB_API_KEY=$WANDB_API_KEY" > /dev/null')
    assert check_cluster_config(config) == []


def test_notes_flag_the_placeholder_bucket(tmp_path):
    notes = cluster_notes(CLUSTER)
    assert any("your-bucket" in n for n in notes)
    config = _shipped()
    config["setup_commands"] = [c.replace("RAY_AUTH_MODE=token", "RAY_AUTH_MODE_UNSET=1") for c in config["setup_commands"]]
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        config[key] = [c.replace(". ~/.iclmem_env && ", "") for c in config[key]]
    assert any("token authentication" in n for n in cluster_notes(_write(tmp_path, config)))


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
def test_documented_variants_are_valid(provider):
    config = _doc_cluster_configs()[provider]
    assert check_cluster_config(config) == []
    util = pytest.importorskip("ray.autoscaler._private.util")
    util.validate_config(util.prepare_config(copy.deepcopy(config)))


def test_local_provider_refuses_node_types():
    config = copy.deepcopy(_doc_cluster_configs()["local"])
    config["available_node_types"] = {"gpu": {"resources": {"GPU": 1}, "node_config": {}}}
    del config["provider"]["head_ip"]
    problems = check_cluster_config(config)
    assert any(p.startswith("available_node_types: not supported for on-premise") for p in problems)
    assert any("head_ip" in p for p in problems)


def test_docs_describe_jobs_and_token_auth():
    text = DOCS.read_text()
    for needle in ("ray job submit --working-dir . -- iclmem run configs/paper.yaml --address auto",
                   "ray job logs -f", "ray job status", "RAY_AUTH_MODE=token", "~/.ray/auth_token",
                   "RAY_AUTH_TOKEN", "ray get-auth-token --generate", "WANDB_API_KEY", "s3://", "gs://", "NFS"):
        assert needle in text, needle
    assert "RAY_AUTH_MODE=disabled" not in text
