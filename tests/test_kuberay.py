"""KubeRay manifests, checked offline (`iclmem cluster-check k8s/rayjob.yaml --sweep SWEEP`): the shipped RayJob
and RayCluster pass with the shipped sweeps, and a copy broken in each way a Kubernetes launch goes wrong is
refused naming the file and the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.cluster.kuberay import check_manifest

REPO = Path(__file__).resolve().parents[1]
RAYJOB = REPO / "k8s" / "rayjob.yaml"


@pytest.mark.parametrize(("manifest", "sweep"), [("rayjob.yaml", "realistic.yaml"), ("rayjob.yaml", "quickstart.yaml"),
                                                  ("raycluster.yaml", "quickstart.yaml")])
def test_the_shipped_manifests_pass_with_the_shipped_sweeps(manifest, sweep):
    result = check_manifest(REPO / "k8s" / manifest, [REPO / "configs" / sweep])
    assert result.problems == []


def _broken(tmp_path: Path, edit) -> Path:
    doc = yaml.safe_load(RAYJOB.read_text())
    edit(doc)
    path = tmp_path / "rayjob.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _head(doc):
    return doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]


def _worker(doc):
    return doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]


def _set_env(container, name, entry):
    container["env"] = [e for e in container["env"] if e["name"] != name] + [{"name": name, **entry}]


BROKEN = {
    "literal W&B key": (lambda d: _set_env(_head(d), "WANDB_API_KEY", {"value": "0123456789abcdef0123"}),
                        r"headGroupSpec.template.spec.containers.0.env.*holds a literal WANDB_API_KEY|"
                        r"env.WANDB_API_KEY: not from a Secret"),
    "W&B key in a worker": (lambda d: _set_env(_worker(d), "WANDB_API_KEY",
                                               {"valueFrom": {"secretKeyRef": {"name": "iclmem-wandb",
                                                                               "key": "WANDB_API_KEY"}}}),
                            r"workerGroupSpecs\[0\].*env.WANDB_API_KEY: the W&B key reaches the worker group 'gpu'"),
    "unpinned image": (lambda d: _worker(d).update(image="registry.example.org/iclmem:latest"),
                       r"workerGroupSpecs\[0\].template.spec.containers\[0\].image: .*is not pinned"),
    "two images": (lambda d: _worker(d).update(image="registry.example.org/iclmem:0.0.9-cu126"),
                   r"the groups run different images"),
    "storage on the pod's disk": (lambda d: _set_env(_worker(d), "ICLMEM_STORAGE", {"value": "/tmp/tune"}),
                                  r"env.ICLMEM_STORAGE: '/tmp/tune' is on the pod's own disk"),
    "shared volume on the node's disk": (
        lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"].update(
            volumes=[{"name": "shared", "emptyDir": {}},
                     {"name": "ray-token", "secret": {"secretName": "iclmem-ray-token"}}]),
        r"workerGroupSpecs\[0\].*env.ICLMEM_STORAGE: '/shared/tune' is on the pod's own disk"),
    "run folder on the pod's disk": (lambda d: d["spec"].update(entrypoint="iclmem run x.yaml --out /home/iclmem/runs"),
                                     r"spec.entrypoint: --out '/home/iclmem/runs' is on the pod's own disk"),
    "misspelt field": (lambda d: d["spec"].update(shutdownAfterJobFinished=True),
                       r"spec: Additional properties are not allowed \('shutdownAfterJobFinished' was unexpected\) "
                       r"\(not a field of KubeRay's ray.io/v1 RayJob there\)"),
    "cluster kept": (lambda d: d["spec"].update(shutdownAfterJobFinishes=False),
                     r"spec.shutdownAfterJobFinishes: not true"),
    "not iclmem": (lambda d: d["spec"].update(entrypoint="python train.py"),
                   r"spec.entrypoint: 'python train.py' is not `iclmem run"),
    "replicas as text": (lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(replicas="2"),
                         r"spec.rayClusterSpec.workerGroupSpecs\[0\].replicas: '2' is not of type 'integer'"),
    "literal Ray token in the job's env": (
        lambda d: _set_env(_head(d), "RAY_AUTH_TOKEN", {"value": "a-literal-ray-token"}),
        r"headGroupSpec.template.spec.containers.0.env.\d+: sets RAY_AUTH_TOKEN to a literal value; take it from a "
        r"Secret"),
    "key in the runtime env": (lambda d: d["spec"].update(runtimeEnvYAML="env_vars:\n  WANDB_API_KEY: $KEY\n"),
                               r"spec.runtimeEnvYAML: passes WANDB_API_KEY through Ray's runtime env"),
    # #62: a root container, where the Dockerfile check insists on a non-root user
    "root container": (lambda d: _head(d).update(securityContext={"runAsUser": 0}),
                       r"headGroupSpec.template.spec.containers\[0\]: securityContext.runAsUser: 0 runs the "
                       r"container as root"),
    "root pod": (lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"].update(
        securityContext={"runAsNonRoot": False}), r"template.spec.securityContext.runAsNonRoot: false"),
    "privileged container": (lambda d: _worker(d).update(securityContext={"privileged": True}),
                             r"securityContext.privileged: true gives the container root's powers"),
}


@pytest.mark.parametrize("fault", sorted(BROKEN))
def test_a_broken_manifest_is_refused_naming_the_field(tmp_path, fault):
    edit, message = BROKEN[fault]
    result = check_manifest(_broken(tmp_path, edit))
    assert any(re.search(message, p) for p in result.problems), result.problems


def test_an_aws_key_in_a_comment_of_the_manifest_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "rayjob.yaml"
    path.write_text(RAYJOB.read_text().replace("# Storage:", "# AKIAABCDEFGHIJKLMNOP\n# Storage:", 1))
    line = path.read_text().splitlines().index("# AKIAABCDEFGHIJKLMNOP") + 1
    assert check_manifest(path).problems == [f"{path}:{line}: a comment holds an AWS access key id; remove it and "
                                             "revoke the credential (the file's history keeps it)"]


def test_a_sweep_asking_more_gpus_than_any_group_has_is_refused_naming_the_setting(tmp_path):
    sweep = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    sweep.setdefault("resources", {})["gpus_per_trial"] = 2
    path = tmp_path / "gpu2.yaml"
    path.write_text(yaml.safe_dump(sweep))
    result = check_manifest(RAYJOB, [path])
    assert any(re.search(r"gpu2.yaml: resources.gpus_per_trial: a trial needs \{.*GPU 2\}, but no node type", p)
               for p in result.problems), result.problems


def test_cluster_check_tells_a_kuberay_manifest_from_a_ray_up_file_and_exits_2_on_a_fault(tmp_path, capsys):
    assert main(["cluster-check", str(RAYJOB), "--sweep", str(REPO / "configs" / "quickstart.yaml")]) == 0
    assert "valid (KubeRay schema" in capsys.readouterr().out
    broken = _broken(tmp_path, lambda d: d["spec"].update(shutdownAfterJobFinishes=False))
    assert main(["cluster-check", str(broken)]) == 2
    assert "shutdownAfterJobFinishes: not true" in capsys.readouterr().err
