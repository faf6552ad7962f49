"""Offline checks of KubeRay manifests (``iclmem cluster-check k8s/rayjob.yaml [--sweep SWEEP]``).

The structure is checked against :data:`SCHEMAS`: the fields of KubeRay's ``ray.io/v1`` ``RayJob`` and
``RayCluster`` custom resources that a sweep's manifest uses, with their types, written here from KubeRay's
v1 CRDs (``ray-operator/config/crd/bases/ray.io_rayjobs.yaml`` and ``ray.io_rayclusters.yaml`` of the
ray-project/kuberay repository, the v1 API of KubeRay 1.x): unknown keys at the job, cluster and group levels
are refused (a misspelt ``shutdownAfterJobFinished`` would be dropped by the API server without a word); the
pod templates are Kubernetes' own and left to ``kubectl apply --dry-run=server``.

On top of the structure, what iclmem needs of a cluster (as ``orchestrator.cluster.cluster`` checks cluster.yaml):

* a RayJob runs ``iclmem run`` or ``iclmem resume`` as its entrypoint, deletes its cluster when it ends
  (``shutdownAfterJobFinishes``) after a TTL;
* images: pinned (an x.y.z tag or a digest, never ``latest``), one image for every Ray container;
* secrets: no literal credential anywhere; ``WANDB_API_KEY`` only in the head container (where the driver
  runs), from a Secret, never in a worker group or the job's runtime env;
* shared storage: ``ICLMEM_STORAGE`` and the entrypoint's ``--out`` must be a bucket (s3://, gs://) or a path on
  a volume every pod mounts from a PersistentVolumeClaim or NFS, not on a pod's own disk;
* with ``--sweep``: the sweep's trial and probe-actor requests fit the groups' Ray resources
  (``rayStartParams`` num-cpus / num-gpus, else the container's limits), as for cluster.yaml.

Every problem starts with the file, then the field.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from orchestrator.cluster.cluster import SHARED_SCHEMES, sweeps_fit
from orchestrator.cluster.deploy_checks import ClusterCheck, comment_secret_problems, secret_problems
from orchestrator.cluster.image import base_image_problem
from orchestrator.schema.sweep_files import load_sweep

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_POD_TEMPLATE = {"type": "object", "required": ["spec"], "properties": {"metadata": {"type": "object"},
                                                                        "spec": {"type": "object"}}}
_GROUP_COMMON = {
    "rayStartParams": _STR_MAP,
    "template": _POD_TEMPLATE,
    "serviceType": {"type": "string"},
    "enableIngress": {"type": "boolean"},
    "headService": {"type": "object"},
    "suspend": {"type": "boolean"},
}
_HEAD_GROUP = {"type": "object", "required": ["template"], "additionalProperties": False,
               "properties": {**_GROUP_COMMON}}
_WORKER_GROUP = {"type": "object", "required": ["groupName", "template"], "additionalProperties": False,
                 "properties": {**_GROUP_COMMON, "groupName": {"type": "string"},
                                "replicas": {"type": "integer", "minimum": 0},
                                "minReplicas": {"type": "integer", "minimum": 0},
                                "maxReplicas": {"type": "integer", "minimum": 0},
                                "numOfHosts": {"type": "integer", "minimum": 1},
                                "idleTimeoutSeconds": {"type": "integer"},
                                "scaleStrategy": {"type": "object"}}}
_CLUSTER_SPEC = {"type": "object", "required": ["headGroupSpec"], "additionalProperties": False, "properties": {
    "rayVersion": {"type": "string"}, "enableInTreeAutoscaling": {"type": "boolean"},
    "autoscalerOptions": {"type": "object"}, "headServiceAnnotations": _STR_MAP, "suspend": {"type": "boolean"},
    "managedBy": {"type": "string"}, "gcsFaultToleranceOptions": {"type": "object"},
    "headGroupSpec": _HEAD_GROUP, "workerGroupSpecs": {"type": "array", "items": _WORKER_GROUP}}}
_METADATA = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
SCHEMAS: dict[str, dict[str, Any]] = {
    "RayJob": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": "ray.io/v1"}, "kind": {"const": "RayJob"}, "metadata": _METADATA,
        "spec": {"type": "object", "required": ["entrypoint", "rayClusterSpec"], "additionalProperties": False,
                 "properties": {
                     "entrypoint": {"type": "string"}, "rayClusterSpec": _CLUSTER_SPEC,
                     "shutdownAfterJobFinishes": {"type": "boolean"},
                     "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
                     "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
                     "backoffLimit": {"type": "integer", "minimum": 0},
                     "runtimeEnvYAML": {"type": "string"}, "jobId": {"type": "string"},
                     "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]},
                     "submitterPodTemplate": _POD_TEMPLATE, "submitterConfig": {"type": "object"},
                     "clusterSelector": _STR_MAP, "metadata": _STR_MAP, "suspend": {"type": "boolean"},
                     "entrypointNumCpus": {"type": "number"}, "entrypointNumGpus": {"type": "number"},
                     "entrypointResources": {"type": "string"}, "managedBy": {"type": "string"},
                     "deletionStrategy": {"type": "object"}}}}},
    "RayCluster": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": "ray.io/v1"}, "kind": {"const": "RayCluster"}, "metadata": _METADATA,
        "spec": _CLUSTER_SPEC}},
}
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")


def _path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _cpu(value: Any) -> float:
    match = _QUANTITY.match(str(value).strip())
    if not match:
        return 0.0
    number = float(match.group(1))
    return number / 1000 if match.group(2) == "m" else number


def _groups(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(field path, group name, group) of the head and every worker group of a cluster spec."""
    out = [("headGroupSpec", "head", spec.get("headGroupSpec") or {})]
    for i, group in enumerate(spec.get("workerGroupSpecs") or []):
        out.append((f"workerGroupSpecs[{i}]", str(group.get("groupName", f"group{i}")), group))
    return out


def _containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    return list(((group.get("template") or {}).get("spec") or {}).get("containers") or [])


def _runs_as_root(group: dict[str, Any], container: dict[str, Any]) -> str | None:
    """Why a container runs as root or with root's powers (its own securityContext over the pod's), or None:
    the Dockerfile check insists on a non-root user, and a manifest must not undo it."""
    pod = ((group.get("template") or {}).get("spec") or {}).get("securityContext") or {}
    own = container.get("securityContext") or {}
    for where, context in (("securityContext", own), ("template.spec.securityContext", pod)):
        if not isinstance(context, dict):
            continue
        if str(context.get("runAsUser", "")).strip() == "0":
            return f"{where}.runAsUser: 0 runs the container as root"
        if context.get("runAsNonRoot") is False:
            return f"{where}.runAsNonRoot: false lets the container run as root"
        if where == "securityContext" and context.get("privileged") is True:
            return "securityContext.privileged: true gives the container root's powers on the node"
        if where == "securityContext" and context.get("allowPrivilegeEscalation") is True:
            return "securityContext.allowPrivilegeEscalation: true lets a process gain root"
    return None


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(e.get("name")): e for e in container.get("env") or [] if isinstance(e, dict)}


def _shared_mounts(group: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """Mount paths of the container's volumes that every pod can share (a PVC or NFS)."""
    volumes = {v.get("name"): v for v in ((group.get("template") or {}).get("spec") or {}).get("volumes") or []}
    shared = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount.get("name")) or {}
        if "persistentVolumeClaim" in volume or "nfs" in volume:
            shared.append(str(mount.get("mountPath", "")).rstrip("/"))
    return shared


def _storage_problem(value: str, shared: list[str]) -> str | None:
    scheme = value.split("://", 1)[0] if "://" in value else ""
    if scheme in SHARED_SCHEMES:
        return None
    if scheme:
        return f"{value!r} is {scheme}:// storage, which other pods do not reach (use s3://, gs:// or a shared volume)"
    if any(value == m or value.startswith(m + "/") for m in shared if m):
        return None
    return (f"{value!r} is on the pod's own disk (no PersistentVolumeClaim or NFS volume is mounted there): Tune "
            "restores trials on other pods and probe actors read checkpoints written elsewhere")


def _resources(group: dict[str, Any]) -> dict[str, float]:
    params = group.get("rayStartParams") or {}
    out = {}
    containers = _containers(group)
    limits = (containers[0].get("resources") or {}).get("limits") or {} if containers else {}
    requests = (containers[0].get("resources") or {}).get("requests") or {} if containers else {}
    cpu = params.get("num-cpus", limits.get("cpu", requests.get("cpu")))
    gpu = params.get("num-gpus", limits.get("nvidia.com/gpu", requests.get("nvidia.com/gpu", 0)))
    if cpu is not None:
        out["CPU"] = _cpu(cpu)
    if _cpu(gpu):
        out["GPU"] = _cpu(gpu)
    return out


def check_manifest(path: str | Path, sweeps: Sequence[str | Path] = ()) -> ClusterCheck:
    """The checks above on every RayJob / RayCluster document of ``path``."""
    where = str(path)
    result = ClusterCheck(where)
    loaded = [(str(p), load_sweep(p)) for p in sweeps]
    from orchestrator.schema.config_reading import yaml_expansion_problem

    try:
        text = Path(path).read_text()
        expansion = yaml_expansion_problem(text)
        if expansion:
            result.problems.append(f"{where}: {expansion}")
            return result
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        result.problems.append(f"{where}: cannot read as YAML: {' '.join(str(exc).split())}")
        return result
    result.problems += comment_secret_problems(text, where)
    for index, doc in enumerate(docs):
        at = where if len(docs) == 1 else f"{where} (document {index + 1})"
        kind = doc.get("kind") if isinstance(doc, dict) else None
        if kind not in SCHEMAS:
            result.problems.append(f"{at}: kind {kind!r}: iclmem checks KubeRay's RayJob and RayCluster")
            continue
        result.problems += secret_problems(doc, at)
        errors = sorted(jsonschema.Draft202012Validator(SCHEMAS[kind]).iter_errors(doc), key=lambda e: list(e.path))
        for error in errors:
            field = _path(error.path) or "(top level)"
            message = error.message
            if error.validator == "additionalProperties":
                message = f"{message} (not a field of KubeRay's ray.io/v1 {kind} there)"
            result.problems.append(f"{at}: {field}: {message}")
        if errors:
            continue
        spec = doc["spec"]
        cluster = spec["rayClusterSpec"] if kind == "RayJob" else spec
        prefix = "spec.rayClusterSpec" if kind == "RayJob" else "spec"
        out_dir = None
        if kind == "RayJob":
            words = shlex.split(spec["entrypoint"])
            if words[:2] not in (["iclmem", "run"], ["iclmem", "resume"]):
                result.problems.append(f"{at}: spec.entrypoint: {spec['entrypoint']!r} is not `iclmem run ...` or "
                                       "`iclmem resume ...`")
            if "--out" in words[:-1]:
                out_dir = words[words.index("--out") + 1]
            if spec.get("shutdownAfterJobFinishes") is not True:
                result.problems.append(f"{at}: spec.shutdownAfterJobFinishes: not true, so the cluster (and its GPUs) "
                                       "outlives the job")
            elif "ttlSecondsAfterFinished" not in spec:
                result.notes.append(f"{at}: spec.ttlSecondsAfterFinished: unset, so the cluster is deleted the moment "
                                    "the job ends (no time to read its logs)")
            if "WANDB_API_KEY" in str(spec.get("runtimeEnvYAML", "")):
                result.problems.append(f"{at}: spec.runtimeEnvYAML: passes WANDB_API_KEY through Ray's runtime env, "
                                       "which every node's runtime-env agent logs in plain text; give it to the "
                                       "head container from a Secret")
        images = set()
        for field, name, group in _groups(cluster):
            for c, container in enumerate(_containers(group)):
                here = f"{prefix}.{field}.template.spec.containers[{c}]"
                image = str(container.get("image", ""))
                images.add(image)
                if base_image_problem(image) is not None:
                    result.problems.append(f"{at}: {here}.image: {image!r} is not pinned: use an x.y.z tag or a "
                                           "digest (`make image`), the same on every group")
                root = _runs_as_root(group, container)
                if root:
                    result.problems.append(f"{at}: {here}: {root}; the image runs as a non-root user (its `USER`): "
                                           "drop the override, or set runAsNonRoot: true")
                env = _env(container)
                key = env.get("WANDB_API_KEY")
                if key is not None and name != "head":
                    result.problems.append(f"{at}: {here}.env.WANDB_API_KEY: the W&B key reaches the worker group "
                                           f"{name!r}; only the driver (on the head) needs it")
                elif key is not None and "secretKeyRef" not in (key.get("valueFrom") or {}):
                    result.problems.append(f"{at}: {here}.env.WANDB_API_KEY: not from a Secret (valueFrom."
                                           "secretKeyRef); `kubectl create secret generic iclmem-wandb ...`")
                shared = _shared_mounts(group, container)
                storage = env.get("ICLMEM_STORAGE")
                if storage is None and len(_groups(cluster)) > 1:
                    result.problems.append(f"{at}: {here}.env: no ICLMEM_STORAGE, but the cluster has worker pods: "
                                           "Tune needs storage every pod reaches (a bucket or a shared volume)")
                elif storage is not None:
                    problem = _storage_problem(str(storage.get("value", "")), shared)
                    if problem:
                        result.problems.append(f"{at}: {here}.env.ICLMEM_STORAGE: {problem}")
                if out_dir is not None and name == "head":
                    problem = _storage_problem(out_dir, shared)
                    if problem:
                        result.problems.append(f"{at}: spec.entrypoint: --out {problem}")
        if len(images) > 1:
            result.problems.append(f"{at}: {prefix}: the groups run different images {sorted(images)}: one image, "
                                   "so every node has the same iclmem, torch and Ray")
        nodes: dict[str, dict[str, Any]] = {"head": {"resources": _resources(cluster["headGroupSpec"]), "max_workers": 0}}
        for _field, name, group in _groups(cluster)[1:]:
            most = int(group.get("maxReplicas", group.get("replicas", 0)) or 0)
            nodes[name] = {"resources": _resources(group), "max_workers": most}
        prepared = {"provider": {"type": "kubernetes"}, "head_node_type": "head", "available_node_types": nodes,
                    "max_workers": sum(n["max_workers"] for n in nodes.values())}
        sweeps_fit(result, prepared, at, loaded)
    return result
