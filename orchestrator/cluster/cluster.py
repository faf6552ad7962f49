"""Offline checks of a ``ray up`` cluster file (``iclmem cluster-check cluster.yaml [--sweep SWEEP]``).

Ray validates the file itself: ``check_cluster_file`` runs the steps ``ray up`` runs before it contacts
the provider (``ray.autoscaler._private.commands._bootstrap_config``): ``prepare_config`` (provider
defaults, the on-premise node type, per-type worker bounds) and ``validate_config`` (Ray's JSON schema,
``head_node_type``, the sum of the ``min_workers`` within the global ``max_workers``). Ray's messages are passed on, prefixed with
the file. What needs the provider's API is left to ``ray up``: instance types, images, credentials, and
on AWS the CPUs/GPUs of a node type that declares no ``resources`` (Ray reads them from EC2).

On top of that, iclmem checks only what Ray cannot know about (or does not check):

* images: every container image the file names is pinned (an x.y.z tag or a digest, never ``latest``);
* worker bounds: each node type's ``min_workers`` at most its own ``max_workers`` (Ray checks only the sum);

* shared storage: a cluster that can have worker nodes must export ``ICLMEM_STORAGE`` naming storage
  every node reaches (Tune restores trials on other nodes; probe actors read checkpoints written
  elsewhere), never a node-local, ephemeral folder (``/tmp``, ``/dev/shm``, ...), and a sweep's own
  ``storage_path`` must be shared too;
* a Dockerfile given by mistake (``gpu.Dockerfile``) is checked as the image it is, not read as YAML;
* secrets: no credential written into the cluster file or the sweep (docs/CLUSTER.md: the W&B key
  lives in a 0600 file on the head and reaches only the driver);
* resources: each sweep's trial and probe-actor requests fit a node type the cluster can start, all
  probe actors can be placed at once, and they leave room for a trial.

Every problem starts with the file at fault, then the key (Ray's own non-schema messages name the key in
their text).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click
import jsonschema
import yaml
from ray.autoscaler._private import util as ray_util

from orchestrator.cluster.deploy_checks import ClusterCheck, comment_secret_problems, secret_problems
from orchestrator.schema.config import SweepConfig
from orchestrator.schema.sweep_files import load_sweep

STORAGE_ENV = "ICLMEM_STORAGE"
SHARED_ENV = "ICLMEM_SHARED_STORAGE"  # confirms that a local-looking storage_path is a shared mount
# Remote file systems Tune reaches through pyarrow from every node; file:// is node-local.
SHARED_SCHEMES = ("s3", "gs", "gcs", "hdfs", "abfs", "abfss")
# Resources that `ray up` on AWS reads from the EC2 instance type when a node type does not declare them.
_EC2_DETECTED = ("CPU", "GPU", "memory")
_EPS = 1e-6  # fractional requests (4 x 0.25 GPU) add up with float error; Ray itself counts in 1e-4 units

_COMMAND_KEYS = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
                 "head_start_ray_commands", "worker_start_ray_commands")



def check_cluster_file(path: str | Path, sweeps: Sequence[str | Path] = ()) -> ClusterCheck:
    """Ray's validation of ``path`` plus iclmem's storage, secret and (per sweep file) resource checks.
    A sweep file that does not load raises ConfigError (from ``load_sweep``), naming that file."""
    where = str(path)
    if is_dockerfile(path) and Path(path).is_file():
        return _as_dockerfile(Path(path), sweeps)
    loaded = [(str(p), load_sweep(p)) for p in sweeps]
    result = ClusterCheck(where)
    config, problem = _read(Path(path))
    if problem:
        result.problems.append(f"{where}: {problem}")
        return result
    # Secrets first and regardless of Ray's verdict: a key in the file is a leak however else it is wrong.
    result.problems += secret_problems(config, where)
    result.problems += comment_secret_problems(Path(path).read_text(), where)
    for sweep_path, sweep in loaded:
        result.problems += secret_problems(sweep.model_dump(mode="json"), sweep_path)
    result.problems += image_problems(config, where)
    prepared, ray_problems, ray_notes = ray_validate(config, where)
    result.problems += ray_problems
    result.notes += ray_notes
    if prepared is None:
        if loaded:
            result.notes.append(f"{where}: storage and resources not checked until Ray accepts the file")
        return result
    result.problems += worker_bound_problems(config, where)
    result.problems += storage_problems(config, prepared, where, loaded)
    for sweep_path, sweep in loaded:
        problems, notes = resource_problems(prepared, where, sweep, sweep_path)
        result.problems += problems
        result.notes += notes
    return result


def is_dockerfile(path: str | Path) -> bool:
    """A container image definition by its name: ``Dockerfile``, ``Containerfile``, ``Dockerfile.gpu``,
    ``gpu.Dockerfile``, ``gpu.dockerfile`` (the names ``docker build -f`` and editors use)."""
    name = Path(path).name.lower()
    return (name.startswith(("dockerfile", "containerfile"))
            or name.endswith((".dockerfile", ".containerfile")))


def _as_dockerfile(path: Path, sweeps: Sequence[str | Path]) -> ClusterCheck:
    """A Dockerfile given where a cluster file is expected: checked as the image it is, never read as YAML."""
    from iclmem.errors import ConfigError
    from orchestrator.cluster.image import check_dockerfile

    if sweeps:
        raise ConfigError(f"{path}: a Dockerfile: --sweep checks a sweep against a cluster's node types; an image has "
                          "none (give the sweep with cluster.yaml or a k8s manifest)")
    result = check_dockerfile(path)
    result.notes.insert(0, f"{path}: a Dockerfile (by its name): checked as a container image (base image pinned, "
                           "pins equal to pyproject.toml's, no secret, non-root user), not as a Ray cluster file")
    return result


def _read(path: Path) -> tuple[Any, str | None]:
    if not path.is_file():
        return None, "file not found" if not path.exists() else "not a file"
    from orchestrator.schema.config_reading import yaml_expansion_problem

    try:
        text = path.read_text()
        expansion = yaml_expansion_problem(text)
        if expansion:
            return None, expansion
        data = yaml.safe_load(text)  # what `ray up` reads the file with
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read: {exc}"
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return None, f"not valid YAML{at}: {getattr(exc, 'problem', None) or ' '.join(str(exc).split())}"
    if not isinstance(data, dict):  # Ray's helpers call .get on it and would fail with an AttributeError
        return None, f"(top level): a cluster config is a mapping of settings, not {type(data).__name__}"
    return data, None


# ------------------------------------------------------------------------------------------- Ray
@contextlib.contextmanager
def _ray_output(notes: list[str], where: str) -> Iterator[None]:
    """Collect what Ray prints while it prepares the config: its warnings become notes; its info lines
    and the PANIC line of an abort (whose text is the exception we report) are dropped."""
    buffer = io.StringIO()
    ray_logger = logging.getLogger("ray.autoscaler")
    level = ray_logger.level
    ray_logger.setLevel(logging.WARNING)  # "setting max workers for head node type to 0" and the like
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield
    finally:
        ray_logger.setLevel(level)
        for line in re.sub(r"\x1b\[[0-9;]*m", "", buffer.getvalue()).splitlines():
            match = re.search(r"\t(WARN|ERR)\S* \S+ -- (.*)", line)  # cli_logger's record format (WARN, ERR)
            if match:
                notes.append(f"{where}: Ray: {match.group(2).strip()}")


def ray_validate(config: dict[str, Any], where: str) -> tuple[dict[str, Any] | None, list[str], list[str]]:
    """(prepared config or None, problems, notes): what ``ray up`` does before contacting the provider."""
    notes: list[str] = []
    with _ray_output(notes, where):
        try:
            prepared = ray_util.prepare_config(copy.deepcopy(config))
        except click.ClickException as exc:  # cli_logger.abort, e.g. node types on an on-premise cluster
            return None, [f"{where}: {exc.format_message()} (Ray's prepare_config)"], notes
        except NotImplementedError as exc:  # Ray's lookup of the provider's defaults.yaml
            return None, [f"{where}: provider.type: {exc} (Ray's prepare_config)"], notes
        except Exception as exc:  # Ray indexes keys its schema requires (config["provider"]): find which
            return None, [_schema_cause(config, where) or f"{where}: Ray cannot prepare the config: "
                          f"{type(exc).__name__}: {exc} (ray.autoscaler._private.util.prepare_config)"], notes
        if prepared.get("provider", {}).get("type") == "aws":
            # ray up fills a node type's missing `resources` from EC2 before validating; offline we cannot.
            for node in prepared.get("available_node_types", {}).values():
                if isinstance(node, dict):
                    node.setdefault("resources", {})
        try:
            ray_util.validate_config(prepared)
        except jsonschema.ValidationError as exc:
            return None, [_schema_problem(exc, where)], notes
        except (ValueError, RuntimeError, KeyError, TypeError) as exc:
            return None, [f"{where}: {exc} (Ray's validate_config)"], notes
        except ImportError as exc:
            return None, [f"{where}: not checked: Ray's validator needs jsonschema ({exc}); "
                          "pip install 'ray[default]'"], notes
    return prepared, [], notes


def _schema_problem(exc: jsonschema.ValidationError, where: str) -> str:
    key = ".".join(str(p) for p in exc.absolute_path) or "(top level)"
    return f"{where}: {key}: {exc.message} (Ray's cluster-config schema)"


def _schema_cause(config: dict[str, Any], where: str) -> str | None:
    """Ray's schema error for a file too malformed to prepare (e.g. no provider), if the schema sees one."""
    try:
        ray_util.validate_config(copy.deepcopy(config))
    except jsonschema.ValidationError as exc:
        return _schema_problem(exc, where)
    except Exception:  # past the schema, an unprepared file fails for want of defaults: not the cause
        return None
    return None


# ------------------------------------------------------------------------------------------- images, bounds
def image_problems(config: dict[str, Any], where: str) -> list[str]:
    """Every container image the file names (``docker.image``, ``head_image``, ``worker_image`` and each node
    type's ``docker.worker_image``) must be pinned: ``latest`` or a moving tag gives each node whatever the
    registry holds the day it starts, so nodes of one cluster can run different Ray and torch."""
    from orchestrator.cluster.image import base_image_problem

    places: list[tuple[str, Any]] = []
    docker = config.get("docker")
    if isinstance(docker, dict):
        places += [(f"docker.{key}", docker.get(key)) for key in ("image", "head_image", "worker_image")]
    for name, node in (config.get("available_node_types") or {}).items() if isinstance(
            config.get("available_node_types"), dict) else ():
        node_docker = node.get("docker") if isinstance(node, dict) else None
        if isinstance(node_docker, dict):
            places += [(f"available_node_types.{name}.docker.{key}", node_docker.get(key))
                       for key in ("head_image", "worker_image")]
    problems = []
    for key, image in places:
        if not isinstance(image, str) or not image.strip():
            continue
        problem = base_image_problem(image.strip())
        if problem:
            problems.append(f"{where}: {key}: {problem.removeprefix('base image ')}; every node pulls the image when "
                            "it starts, so an unpinned one can give nodes of one cluster different Ray and torch "
                            "(pin the Ray version iclmem pins, e.g. rayproject/ray:2.60.0-py311-gpu)")
    return problems


def worker_bound_problems(config: dict[str, Any], where: str) -> list[str]:
    """Each node type's ``min_workers`` at most its ``max_workers`` (Ray checks only their sums against the global
    ``max_workers``; the autoscaler would otherwise keep trying to start more nodes than it may)."""
    problems = []
    types = config.get("available_node_types")
    for name, node in (types.items() if isinstance(types, dict) else ()):
        if not isinstance(node, dict):
            continue
        low, high = node.get("min_workers"), node.get("max_workers")
        if isinstance(low, int) and isinstance(high, int) and low > high:
            problems.append(f"{where}: available_node_types.{name}.min_workers: {low} is more than its max_workers "
                            f"{high}: the autoscaler can never reach the minimum; lower min_workers or raise "
                            "max_workers")
    return problems


# ------------------------------------------------------------------------------------------- storage
def _commands(config: dict[str, Any]) -> Iterable[tuple[str, str]]:
    """(key path, command) for every shell command the cluster file runs, node-type commands included."""
    places = [("", config)] + [(f"available_node_types.{name}.", node)
                               for name, node in (config.get("available_node_types") or {}).items()
                               if isinstance(node, dict)]
    for prefix, holder in places:
        for key in _COMMAND_KEYS:
            value = holder.get(key)
            for i, command in enumerate(value if isinstance(value, list) else []):
                if isinstance(command, str):
                    yield f"{prefix}{key}.{i}", command


def exported(config: dict[str, Any], name: str) -> tuple[str, str] | None:
    """(key path, value) of the first ``NAME=value`` in the file's commands; None if none sets it."""
    pattern = re.compile(rf"\b{name}=(['\"]?)([^'\"\s;&|]+)\1")
    for key, command in _commands(config):
        match = pattern.search(command)
        if match:
            return key, match.group(2)
    return None


def multi_node(prepared: dict[str, Any]) -> bool:
    """Whether the cluster can start a node besides the head (Ray has filled every max_workers)."""
    nodes = prepared.get("available_node_types", {}).values()
    return prepared.get("max_workers", 0) > 0 and any(n.get("max_workers", 0) > 0 for n in nodes)


# Folders that are node-local or wiped on reboot on every Linux host, whatever else is mounted: storage there is
# never shared (each node has its own /tmp) and does not outlive the node (a preempted node takes it along).
NODE_LOCAL_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/var/run", "/proc", "/sys")


def node_local_reason(value: str) -> str | None:
    """Why the absolute path ``value`` is node-local, ephemeral storage (under /tmp, /dev/shm, ...), or None."""
    path = "/" + value.strip().lstrip("/") if value.strip().startswith("/") else None
    if path is None:
        return None
    top = next((d for d in NODE_LOCAL_DIRS if path == d or path.startswith(d + "/")), None)
    if top is None:
        return None
    return (f"is under {top}, which is node-local and ephemeral: every node has its own {top} (a trial restored "
            "on another node, or a probe actor there, would not find the checkpoints) and it is wiped with the "
            "node; use s3://, gs:// or the absolute path of a shared mount (NFS) every node has")


def _not_shared(value: str) -> str | None:
    """Why ``value`` is not storage every node reaches; None for a remote URI or an absolute path (taken
    as a shared mount: for ICLMEM_STORAGE that is what exporting it declares) that is not node-local
    (/tmp, /dev/shm, ...: :func:`node_local_reason`)."""
    if "://" in value:
        scheme = value.split("://", 1)[0].lower()
        if scheme in SHARED_SCHEMES:
            return None
        return (f"is {scheme}:// storage, which is not shared between nodes: use "
                f"{', '.join(s + '://' for s in SHARED_SCHEMES)} or the absolute path of a mount every node has")
    if "$" in value:
        return ("holds a shell variable, which iclmem passes to Tune unexpanded: write the value out (the "
                "overlay in docs/CLUSTER.md lets the shell expand $ICLMEM_STORAGE)")
    if not value.startswith("/"):
        return ("is a folder on the node the driver runs on (a relative or ~ path); Tune writes checkpoints on "
                "the node of each trial and restores them on others: use s3://, gs:// or an NFS mount")
    return node_local_reason(value)


def storage_problems(config: dict[str, Any], prepared: dict[str, Any], where: str,
                     sweeps: Sequence[tuple[str, SweepConfig]] = ()) -> list[str]:
    """On a cluster that can have workers: ICLMEM_STORAGE and each sweep's storage_path must be shared."""
    if not multi_node(prepared):
        return []
    problems = []
    setting = exported(config, STORAGE_ENV)
    if setting is None:
        problems.append(
            f"{where}: setup_commands: no command exports {STORAGE_ENV}, but the cluster can have worker nodes "
            f"(max_workers {prepared['max_workers']}); name storage every node reaches, e.g. "
            f"echo 'export {STORAGE_ENV}=s3://<bucket>/iclmem' > ~/.iclmem_env (docs/CLUSTER.md)")
    elif (reason := _not_shared(setting[1])) is not None:
        problems.append(f"{where}: {setting[0]}: {STORAGE_ENV}={setting[1]} {reason}")
    root = setting[1].rstrip("/") if setting else None
    confirmed = exported(config, SHARED_ENV) is not None
    for sweep_path, sweep in sweeps:
        path = sweep.storage_path
        if path is None:  # iclmem then uses $ICLMEM_STORAGE/<sweep>-<hash>, checked above
            continue
        reason = _not_shared(path)
        under_root = root is not None and (path + "/").startswith(root + "/")
        if reason is None and "://" not in path and not confirmed and not under_root:
            # The rule the sweep driver applies at start (check_storage): a local path is shared only
            # if it lies under ICLMEM_STORAGE or ICLMEM_SHARED_STORAGE says so.
            reason = (f"is an absolute path that nothing marks as a shared mount: put it under {STORAGE_ENV}"
                      f"{f' ({root})' if root else ''} or export {SHARED_ENV}=1 in the setup_commands of {where}")
        if reason:
            problems.append(f"{sweep_path}: storage_path: {path!r} {reason} ({where} can have worker nodes)")
    return problems


# ------------------------------------------------------------------------------------------- resources
def sweeps_fit(result: ClusterCheck, prepared: dict[str, Any], where: str,
               loaded: Sequence[tuple[str, SweepConfig]]) -> None:
    """Each loaded sweep: no credential in it, and its trials and probe actors fit the node types of
    ``prepared`` (a Ray cluster config's shape: what KubeRay's groups and a Slurm allocation are mapped to)."""
    for sweep_path, sweep in loaded:
        result.problems += secret_problems(sweep.model_dump(mode="json"), sweep_path)
        problems, notes = resource_problems(prepared, where, sweep, sweep_path)
        result.problems += problems
        result.notes += notes


def _bundle(cpus: float, gpus: float, custom: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in {"CPU": cpus, "GPU": gpus, **custom}.items() if v > 0}


def _fmt(bundle: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in bundle.items()) or "none"


def resource_problems(prepared: dict[str, Any], where: str, sweep: SweepConfig,
                      sweep_path: str) -> tuple[list[str], list[str]]:
    """Whether the sweep's trials and probe actors can run on the node types the cluster can start."""
    res = sweep.resources
    trial = _bundle(res.cpus_per_trial, res.gpus_per_trial, res.trial_resources)
    probe = _bundle(res.cpus_per_probe_actor, res.gpus_per_probe_actor, res.probe_resources)
    # One pool of probe_actors per distinct base model (as the sweep driver builds them), all created at the start.
    n_models = len({(m.name, json.dumps(dict(m.options), sort_keys=True)) for m in sweep.models})
    wanted = res.probe_actors * n_models
    provider = prepared["provider"].get("type")
    if provider == "local":
        return [], [f"{where}: provider local: Ray detects each machine's resources when it starts, so the "
                    f"requests of {sweep_path} are not checked offline"]

    head, global_max = prepared["head_node_type"], prepared["max_workers"]
    nodes: dict[str, tuple[int, dict[str, float]]] = {}  # node types the cluster can start: (count, resources)
    notes = []
    for name, node in prepared["available_node_types"].items():
        count = (name == head) + min(node.get("max_workers", 0), global_max)
        if count:
            nodes[name] = (count, dict(node.get("resources", {})))
            undeclared = [r for r in _EC2_DETECTED if r not in node["resources"] and r in {**trial, **probe}]
            if provider == "aws" and undeclared:
                notes.append(f"{where}: available_node_types.{name}: no {'/'.join(undeclared)} in resources; ray up "
                             "reads them from EC2, which this offline check does not, so it counts them as enough")

    def have(declared: dict[str, float], name: str) -> float:
        if name in declared:
            return declared[name]
        return math.inf if provider == "aws" and name in _EC2_DETECTED else 0.0

    def how_many(declared: dict[str, float], bundle: dict[str, float], reserved: dict[str, float]) -> float:
        """How many copies of ``bundle`` fit on one node next to ``reserved`` (-1: not even ``reserved``)."""
        if any(have(declared, r) + _EPS < v for r, v in reserved.items()):
            return -1
        room = [(have(declared, r) - reserved.get(r, 0) + _EPS) / v for r, v in bundle.items()]
        return min((x if x == math.inf else math.floor(x) for x in room), default=math.inf)

    def describe(declared: dict[str, float]) -> str:
        asked = {**trial, **probe}
        from_ec2 = [r for r in _EC2_DETECTED if r not in declared and r in asked] if provider == "aws" else []
        return _fmt(declared) + (f" ({'/'.join(from_ec2)} from EC2)" if from_ec2 else "")

    listing = "; ".join(f"{n} x{c}: {describe(d)}" for n, (c, d) in nodes.items())
    sweep_keys = {"trial": {"CPU": "cpus_per_trial", "GPU": "gpus_per_trial"},
                  "probe actor": {"CPU": "cpus_per_probe_actor", "GPU": "gpus_per_probe_actor"}}
    problems = []
    for what, bundle, custom in (("trial", trial, "trial_resources"), ("probe actor", probe, "probe_resources")):
        if not any(how_many(d, bundle, {}) >= 1 for _, d in nodes.values()):
            # The key at fault: what every node type lacks, else (a combination) what any of them lacks.
            lacking = {r: [have(d, r) + _EPS < v for _, d in nodes.values()] for r, v in bundle.items()}
            short = [r for r, miss in lacking.items() if all(miss)] or [r for r, miss in lacking.items() if any(miss)]
            keys = ", ".join(f"resources.{sweep_keys[what].get(r, f'{custom}.{r}')}" for r in short)
            problems.append(f"{sweep_path}: {keys}: a {what} needs {{{_fmt(bundle)}}}, but no node type of {where} "
                            f"has that ({listing})")
    if problems:
        return problems, notes

    per_node = {n: how_many(d, probe, {}) for n, (_, d) in nodes.items()}
    capacity = sum(per_node[n] * c for n, (c, _) in nodes.items() if per_node[n] > 0)
    if capacity < wanted:
        return [f"{sweep_path}: resources.probe_actors: {res.probe_actors} probe actor(s) x {n_models} model(s) "
                f"= {wanted}, each {{{_fmt(probe)}}}, but at most {capacity} fit on the nodes {where} can start "
                f"({listing}); the driver feeds every actor in turn, so one never placed stalls the sweep"], notes
    # Probe actors hold their resources for the whole sweep: some node must still take one trial.
    for name, (count, declared) in nodes.items():
        beside = how_many(declared, probe, trial)  # probe actors on the node that runs the trial
        if beside < 0:
            continue
        elsewhere = sum(per_node[n] * c for n, (c, _) in nodes.items() if n != name and per_node[n] > 0)
        if count > 1 and per_node[name] > 0:
            elsewhere += per_node[name] * (count - 1)
        if beside + elsewhere >= wanted:
            return [], notes
    return [f"{sweep_path}: resources: the {wanted} probe actor(s) {{{_fmt(probe)}}} hold their resources for the "
            f"whole sweep and leave no node of {where} room for a trial {{{_fmt(trial)}}} ({listing}): lower "
            "probe_actors or their resources, or allow more workers"], notes
