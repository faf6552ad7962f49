"""Reading a sweep file, for both kinds (tabular and LM): YAML with ``include:`` of a shared base file, a key given
twice in one mapping refused, YAML and encoding problems named with their line, the validation errors of a
schema listed each with its path in the file, and relative paths resolved against the file's folder.
Knows no schema: :func:`read_config` validates into the model it is given."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from iclmem.errors import ConfigError

__all__ = ["MAX_YAML_NODES", "ConfigT", "UniqueKeyLoader", "yaml_expansion_problem", "format_validation_error", "read_config", "resolve_path", "validate_config"]

ConfigT = TypeVar("ConfigT", bound=BaseModel)


_YAML_MERGE_TAG = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no type hints here (no types-PyYAML)
    """yaml.safe_load that refuses a key given twice in one mapping (YAML would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            if key_node.tag == _YAML_MERGE_TAG:
                # ``<<: *anchor`` merges as PyYAML's safe_load does (SafeLoader's construct_mapping flattens
                # it); a key this mapping gives itself overrides the merged one, which is no duplicate
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


# Nodes a YAML document may hold once its aliases are expanded: a sweep or cluster file has hundreds; an alias
# "bomb" (each level naming the one below ten times) has billions, which every reader walking it expands
MAX_YAML_NODES = 100_000


def yaml_expansion_problem(text: str) -> str | None:
    """Why ``text`` cannot be read safely as YAML -- its aliases expand past :data:`MAX_YAML_NODES` nodes, or an
    alias contains itself -- or None (also for text that is not valid YAML: the reader names that itself).
    Counted on the composed node graph, where an alias is its anchor's node, so a bomb is sized without being
    expanded."""
    try:
        documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except (yaml.YAMLError, RecursionError):
        return None
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: Any) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise ValueError("recursive")
        open_nodes.add(key)
        children: list[Any] = []
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_YAML_NODES:
                break
        open_nodes.discard(key)
        sizes[key] = total
        return total

    try:
        total = sum(size(d) for d in documents if d is not None)
    except ValueError:
        return "an alias (*name) refers to a node that contains it: a recursive document no setting needs"
    except RecursionError:
        return None
    if total > MAX_YAML_NODES:
        return (f"its aliases (*name) expand to more than {MAX_YAML_NODES:,} nodes (an alias bomb?); write the "
                "settings out, or use fewer nested aliases")
    return None


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    try:
        is_file, is_dir = path.is_file(), path.is_dir()
    except (OSError, ValueError) as exc:  # a name too long for the file system, a NUL byte ...
        raise ConfigError(f"{_shown(path)}: cannot be a sweep file ({getattr(exc, 'strerror', None) or exc})") from None
    if is_dir:
        raise ConfigError(f"{path} is a folder, not a sweep file: give the sweep's YAML file itself")
    if not is_file:
        raise ConfigError(f"sweep file not found: {path}")
    if path.resolve() in seen:
        raise ConfigError(f"{path}: include cycle through {[str(p) for p in seen]}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on line {line}); save the "
                          "sweep file as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    expansion = yaml_expansion_problem(text)
    if expansion:
        raise ConfigError(f"{path}: {expansion}")
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:  # PyYAML composes nested lists and mappings recursively
        raise ConfigError(f"{path}: lists or mappings nested too deeply to read (hundreds of levels); no sweep "
                          "setting nests more than a few") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of settings")
    include = data.pop("include", None)
    if include is None:
        return data
    base = _read_yaml((path.parent / include).resolve(), seen + (path.resolve(),))
    return _merge(base, data)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error in one line: what is wrong and where (its message quotes the line under a caret)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        context = f"{exc.context}: " if exc.context else ""
        return f"{context}{exc.problem}{where}"
    return " ".join(str(exc).split())


def _shown(path: Path) -> str:
    """``path`` for a one-line message: bytes that are not UTF-8 as escapes, a very long name cut short."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]} ({len(text)} characters)"


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def format_validation_error(source: str, exc: ValidationError) -> str:
    """Every problem with its path in the file: one line for one problem, else a line per problem."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting"
        problems.append(f"{where}: {msg}")
    if len(problems) == 1:
        return f"{source}: {problems[0]}"
    return "\n".join([f"{source}: {len(problems)} problem(s):", *(f"  - {p}" for p in problems)])


def validate_config(model: type[ConfigT], data: dict[str, Any], source: str) -> ConfigT:
    """``data`` validated into ``model`` (a tabular or an LM sweep); every mistake at once, as a ConfigError."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None


def read_config(model: type[ConfigT], path: str | Path,
                other: tuple[type[BaseModel], str] | None = None) -> ConfigT:
    """A sweep file (following ``include:``) validated into ``model``; paths in it are left as written.
    ``other``: the other kind of sweep file (tabular or LM) and what to say of a file of that kind, which is
    named as such in one line instead of as every setting it lacks and has."""
    data = _read_yaml(Path(path))
    if other is not None:
        theirs = sorted(k for k in data if k in other[0].model_fields and k not in model.model_fields)
        ours = [k for k in data if k in model.model_fields and k not in other[0].model_fields]
        if theirs and not ours:
            raise ConfigError(f"{path}: {other[1].format(path=path, keys=', '.join(theirs))}")
    return validate_config(model, data, str(path))


def resolve_path(p: str | None, base_dir: Path) -> str | None:
    """A path from a sweep file made absolute against the file's folder (URLs and None stay as they are)."""
    if p is None or "://" in p or Path(p).is_absolute():
        return p
    return str((base_dir / p).resolve())
