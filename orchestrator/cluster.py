"""Offline checks of a ``ray up`` cluster file (``iclmem cluster-check cluster.yaml``).

``check_cluster_file(path)`` returns a list of problems (empty: the file is fine). It never starts Ray,
never calls a cloud API and never imports ``ray`` (the schema is read from the installed package's files):

1. The file must exist and be a YAML mapping (duplicate keys are reported: YAML silently keeps the last).
2. The file is filled out the way ``ray up`` does before it validates (the provider's shipped
   ``defaults.yaml`` supplies top-level keys the file leaves out; an on-prem ``provider: type: local``
   file gets Ray's single internal node type), then validated against Ray's own cluster-config JSON
   schema (``ray/autoscaler/ray-schema.json``) with ``jsonschema``. Every error is reported with its
   path, e.g. ``available_node_types.ray.worker.gpu: Additional properties are not allowed ('bogus'
   was unexpected)``.
3. Semantic checks the schema cannot express, mirroring ``ray up``: ``head_node_type`` names a key of
   ``available_node_types``; per node type ``min_workers <= max_workers``; the ``min_workers`` of all
   node types fit in the global ``max_workers``; an on-prem cluster names ``head_ip`` and
   ``worker_ips`` (or a ``coordinator_address``) and no node types.
4. iclmem's own needs: a cluster that can have worker nodes must give Ray Tune shared storage
   (``ICLMEM_STORAGE`` exported in the setup or start commands, see docs/CLUSTER.md), and the file must
   not hold credentials (cloud keys, ``WANDB_API_KEY=...``, ``RAY_AUTH_TOKEN=...``, private keys).

``cluster_notes(path)`` gives advice that does not make a file invalid (placeholder bucket, token
authentication not switched on, no GPU node type, iclmem not installed by the setup commands).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import yaml

STORAGE_ENV = "ICLMEM_STORAGE"
PLACEHOLDER_BUCKETS = ("your-bucket", "my-bucket", "example-bucket")
LOCAL_NODE_TYPE = "local.cluster.node"  # the node type Ray gives every on-prem (provider: local) cluster
# Providers whose node resources `ray up` detects itself, so a node type may omit `resources`.
AUTODETECTS_RESOURCES = ("aws", "kuberay")
# Providers that ship a defaults.yaml inside the ray package (ray/autoscaler/<dir>/defaults.yaml).
PROVIDER_DEFAULTS = {"aws": "aws", "gcp": "gcp", "azure": "azure", "local": "local", "vsphere": "vsphere",
                     "spark": "spark"}

_COMMAND_KEYS = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
                 "head_start_ray_commands", "worker_start_ray_commands")

# What a credential looks like when someone pastes one into a cluster file.
_SECRET_PATTERNS = (
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "an AWS access key id"),
    (re.compile(r"aws_secret_access_key\s*[=:]\s*\S", re.I), "an AWS secret access key"),
    (re.compile(r"AWS_SECRET_ACCESS_KEY\s*=\s*[^\s$'\"]"), "an AWS secret access key"),
    (re.compile(r"AWS_SESSION_TOKEN\s*=\s*[^\s$'\"]"), "an AWS session token"),
    (re.compile(r"WANDB_API_KEY\s*=\s*['\"]?[^\s$'\"]"), "a W&B API key (export WANDB_API_KEY locally instead)"),
    (re.compile(r"RAY_AUTH_TOKEN\s*=\s*['\"]?[^\s$'\"]"), "a Ray auth token (use ~/.ray/auth_token instead)"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
    (re.compile(r"\"private_key\"\s*:"), "a service-account private key"),
)
_SECRET_KEYS = re.compile(r"^(aws_secret_access_key|aws_session_token|secret_access_key|wandb_api_key|"
                          r"ray_auth_token|password|private_key)$", re.I)


# ------------------------------------------------------------------------------------------- ray files
def ray_package_dir() -> Path | None:
    """The installed ray package folder, found without importing ray (importing it takes seconds)."""
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def ray_schema_path() -> Path | None:
    root = ray_package_dir()
    if root is None:
        return None
    path = root / "autoscaler" / "ray-schema.json"
    return path if path.is_file() else None


@lru_cache(maxsize=1)
def load_ray_schema() -> dict[str, Any]:
    path = ray_schema_path()
    if path is None:
        raise FileNotFoundError("Ray's cluster-config schema (ray/autoscaler/ray-schema.json) was not found: "
                                "install ray[default]")
    return json.loads(path.read_text())


def _provider_defaults(provider_type: str) -> dict[str, Any]:
    folder = PROVIDER_DEFAULTS.get(provider_type)
    root = ray_package_dir()
    if folder is None or root is None:
        return {}
    path = root / "autoscaler" / folder / "defaults.yaml"
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


# ------------------------------------------------------------------------------------------- reading
class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that records duplicate mapping keys instead of silently keeping the last one."""

    duplicates: list[str]


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _value in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            if key in seen:
                loader.duplicates.append(f"line {key_node.start_mark.line + 1}: duplicate key {key!r} "
                                         "(YAML keeps only the last value)")
            seen.add(key)
        except TypeError:  # an unhashable key; the schema check reports it
            pass
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_cluster_yaml(path: str | Path) -> tuple[Any, list[str]]:
    """(parsed document, problems). Problems: missing file, unreadable file, invalid YAML, duplicate keys."""
    path = Path(path)
    if not path.exists():
        return None, [f"file not found: {path}"]
    if not path.is_file():
        return None, [f"not a file: {path}"]
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"cannot read {path}: {exc}"]
    loader = _UniqueKeyLoader(text)
    loader.duplicates = []
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        what = getattr(exc, "problem", None) or " ".join(str(exc).split())
        context = getattr(exc, "context", None)
        return None, [f"not valid YAML{where}: {f'{context}: ' if context else ''}{what}"]
    finally:
        loader.dispose()
    return data, list(loader.duplicates)


# ------------------------------------------------------------------------------------------- checks
def check_cluster_file(path: str | Path) -> list[str]:
    """Every problem with a ``ray up`` cluster file, each with its path in the file; empty: valid."""
    data, problems = read_cluster_yaml(path)
    if data is None and problems:
        return problems
    return problems + check_cluster_config(data)


def check_cluster_config(config: Any) -> list[str]:
    """Problems with an already-parsed cluster config (see the module docstring)."""
    if config is None:
        return ["the file is empty: a cluster config needs at least cluster_name and provider"]
    if not isinstance(config, dict):
        return [f"the top level must be a mapping of settings, not {type(config).__name__}"]
    problems: list[str] = []
    filled, fill_problems = _fill_like_ray_up(config)
    problems += fill_problems
    problems += schema_problems(filled)
    problems += semantic_problems(filled, None if _provider_type(config) == "local" else config)
    problems += storage_problems(filled)
    problems += secret_problems(config)
    return problems


def _provider_type(config: dict[str, Any]) -> str | None:
    provider = config.get("provider")
    if isinstance(provider, dict) and isinstance(provider.get("type"), str):
        return provider["type"]
    return None


def _fill_like_ray_up(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """What ``ray up`` validates: the file over the provider's defaults (top-level keys only)."""
    problems: list[str] = []
    ptype = _provider_type(config)
    filled = copy.deepcopy(config)
    if ptype == "local":
        # ray up gives an on-prem cluster one internal node type and refuses user-defined ones.
        for key in ("head_node", "worker_nodes", "available_node_types"):
            value = filled.get(key)
            if value and not (key == "available_node_types" and isinstance(value, dict) and LOCAL_NODE_TYPE in value):
                problems.append(f"{key}: not supported for on-premise clusters (provider type local); "
                                "list the machines under provider.head_ip and provider.worker_ips instead")
        provider = filled["provider"]
        if "coordinator_address" not in provider and ("head_ip" not in provider or "worker_ips" not in provider):
            problems.append("provider: an on-premise cluster needs head_ip and a list of worker_ips "
                            "(or a coordinator_address)")
        if "coordinator_address" in provider and "max_workers" not in filled:
            problems.append("max_workers: required when an on-premise cluster uses a coordinator_address")
        min_workers = filled.pop("min_workers", None)  # ray up moves it onto the internal node type
        if not (isinstance(filled.get("available_node_types"), dict) and LOCAL_NODE_TYPE in filled["available_node_types"]):
            node = {"node_config": {}, "resources": {}}
            if isinstance(min_workers, int):
                node["min_workers"] = min_workers
            filled["available_node_types"] = {LOCAL_NODE_TYPE: node}
            filled["head_node_type"] = LOCAL_NODE_TYPE
    defaults = _provider_defaults(ptype) if ptype else {}
    if defaults:
        merged = copy.deepcopy(defaults)
        merged.update(filled)
        filled = merged
    if ptype in AUTODETECTS_RESOURCES and isinstance(filled.get("available_node_types"), dict):
        for node in filled["available_node_types"].values():
            if isinstance(node, dict):
                node.setdefault("resources", {})  # ray up detects CPUs and GPUs from the instance type
    return filled, problems


def _where(parts: Iterable[Any]) -> str:
    return ".".join(str(p) for p in parts) or "(top level)"


def schema_problems(config: dict[str, Any]) -> list[str]:
    """Ray's cluster-config JSON schema, every error with its path in the file."""
    try:
        import jsonschema
    except ImportError:
        return ["jsonschema is not installed, so the file cannot be checked against Ray's schema "
                "(pip install jsonschema; `ray up` needs it too)"]
    try:
        schema = load_ray_schema()
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        return [str(exc)]
    validator_cls = jsonschema.validators.validator_for(schema)
    validator = validator_cls(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: ([str(p) for p in e.absolute_path], e.message))
    return [f"{_where(err.absolute_path)}: {err.message}" for err in errors]


def _node_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    types = config.get("available_node_types")
    if not isinstance(types, dict):
        return {}
    return {str(k): v for k, v in types.items() if isinstance(v, dict)}


def semantic_problems(config: dict[str, Any], original: dict[str, Any] | None = None) -> list[str]:
    """What ``ray up`` refuses beyond the schema (ray.autoscaler._private.util.validate_config).

    ``config`` is the filled-out config; ``original`` (the file as written) tells a head_node_type the
    file left out from one the provider defaults supplied.
    """
    problems: list[str] = []
    types = _node_types(config)
    raw_types = config.get("available_node_types")
    head = config.get("head_node_type")
    if original is not None and "available_node_types" in original and "head_node_type" not in original:
        head = None
    if isinstance(raw_types, dict):
        if head is None:
            problems.append("head_node_type: required when available_node_types is set")
        elif isinstance(head, str) and head not in raw_types:
            known = ", ".join(sorted(map(str, raw_types))) or "none"
            problems.append(f"head_node_type: {head!r} is not a key of available_node_types (known: {known})")
    for name, node in types.items():
        lo, hi = node.get("min_workers"), node.get("max_workers")
        if _is_int(lo) and _is_int(hi) and lo > hi:
            problems.append(f"available_node_types.{name}: min_workers ({lo}) > max_workers ({hi})")
        if _is_int(lo) and lo < 0:
            problems.append(f"available_node_types.{name}.min_workers: must be >= 0, got {lo}")
        if _is_int(hi) and hi < 0:
            problems.append(f"available_node_types.{name}.max_workers: must be >= 0, got {hi}")
    global_max = config.get("max_workers")
    if _is_int(global_max) and types:
        total_min = sum(n.get("min_workers", 0) for n in types.values() if _is_int(n.get("min_workers", 0)))
        if total_min > global_max:
            problems.append(f"max_workers: the global max_workers ({global_max}) is smaller than the sum of "
                            f"min_workers of all node types ({total_min})")
    return problems


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _commands(config: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key in _COMMAND_KEYS:
        value = config.get(key)
        if isinstance(value, list):
            out += [c for c in value if isinstance(c, str)]
    for node in _node_types(config).values():
        for key in ("initialization_commands", "worker_setup_commands"):
            value = node.get(key)
            if isinstance(value, list):
                out += [c for c in value if isinstance(c, str)]
    return out


def storage_value(config: dict[str, Any]) -> str | None:
    """The value given to ``ICLMEM_STORAGE`` in the setup or start commands, if any."""
    pattern = re.compile(rf"\b{STORAGE_ENV}=(['\"]?)([^'\"\s;&|]+)\1")
    for command in _commands(config):
        match = pattern.search(command)
        if match:
            return match.group(2)
    return None


def can_have_workers(config: dict[str, Any]) -> bool:
    head = config.get("head_node_type")
    global_max = config.get("max_workers")
    if _is_int(global_max) and global_max == 0:
        return False
    provider = config.get("provider") if isinstance(config.get("provider"), dict) else {}
    if _provider_type(config) == "local":
        return bool(provider.get("worker_ips")) or "coordinator_address" in provider
    for name, node in _node_types(config).items():
        if name == head:
            continue
        hi = node.get("max_workers", global_max if _is_int(global_max) else 1)
        if not _is_int(hi) or hi > 0:
            return True
    return False


def storage_problems(config: dict[str, Any]) -> list[str]:
    """iclmem on several nodes needs storage every node reaches (Tune checkpoints move between nodes)."""
    if not can_have_workers(config):
        return []
    value = storage_value(config)
    if value is None:
        return [f"no shared storage for Ray Tune: this cluster can have worker nodes, so export "
                f"{STORAGE_ENV}=s3://<bucket>/<prefix> (or gs://..., or an NFS path mounted on every node) in "
                "setup_commands; see docs/CLUSTER.md"]
    if "://" not in value and not value.startswith("/"):
        return [f"{STORAGE_ENV}={value}: give an s3:// or gs:// URI, or an absolute path of a mount "
                "shared by every node"]
    return []


def _walk_strings(value: Any, path: tuple[Any, ...] = ()) -> Iterable[tuple[tuple[Any, ...], Any, str]]:
    """(path, key, string) for every string in the document; key is the mapping key holding it."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, str):
                yield path + (k,), k, v
            else:
                yield from _walk_strings(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, str):
                yield path + (i,), None, v
            else:
                yield from _walk_strings(v, path + (i,))


def secret_problems(config: dict[str, Any]) -> list[str]:
    """A cluster file is shared and committed: it must not hold credentials."""
    problems = []
    for path, key, text in _walk_strings(config):
        if isinstance(key, str) and _SECRET_KEYS.match(key) and text.strip() and not text.strip().startswith("$"):
            problems.append(f"{_where(path)}: looks like a credential; keep secrets out of the cluster file "
                            "(use the cloud's credential chain, ~/.ray/auth_token, or a local environment variable)")
            continue
        for pattern, what in _SECRET_PATTERNS:
            if pattern.search(text):
                problems.append(f"{_where(path)}: looks like it holds {what}; keep secrets out of the cluster file")
                break
    return problems


# ------------------------------------------------------------------------------------------- advice
def cluster_notes(path: str | Path) -> list[str]:
    """Advice that does not make the file invalid. Empty for an unreadable file (see check_cluster_file)."""
    data, _problems = read_cluster_yaml(path)
    if not isinstance(data, dict):
        return []
    notes: list[str] = []
    value = storage_value(data)
    if value and any(p in value for p in PLACEHOLDER_BUCKETS):
        notes.append(f"{STORAGE_ENV}={value} is the shipped placeholder: set your own bucket or shared mount")
    commands = " ".join(_commands(data))
    if "RAY_AUTH_MODE=token" not in commands:
        notes.append("token authentication is not switched on for the cluster (RAY_AUTH_MODE=token in the start "
                     "commands, the token file in file_mounts): anyone who reaches the dashboard port can run code")
    if "pip install" not in commands or "iclmem" not in commands:
        notes.append("the setup commands do not seem to install iclmem (pip install -e ~/iclmem)")
    types = _node_types(data)
    if types and not any((n.get("resources") or {}).get("GPU", 0) for n in types.values()
                         if isinstance(n.get("resources"), dict)):
        if _provider_type(data) not in AUTODETECTS_RESOURCES:
            notes.append("no node type advertises a GPU (resources: {GPU: n}); trials with gpus_per_trial > 0 "
                         "would never be scheduled")
    if _provider_type(data) == "aws":
        missing = [name for name, n in types.items() if not (n.get("node_config") or {}).get("ImageId")]
        if missing:
            notes.append(f"no ImageId for {', '.join(missing)}: ray up then falls back to an old Deep Learning "
                         "AMI whose NVIDIA driver may be too old for current CUDA builds of torch; set a current "
                         "'Deep Learning Base OSS Nvidia Driver GPU AMI' for your region")
    return notes
