"""Offline checks of iclmem's container image definition (``iclmem cluster-check Dockerfile``).

What a cluster gets wrong in an image is what this checks, from the file alone (no Docker needed):

* the base image is pinned: an exact version tag (``python:3.11.7-slim-bookworm``) or a digest, never
  ``latest`` or a moving tag (``python:3.11``), also through ``ARG`` defaults;
* every ``pip install`` pin (``name==version``) equals pyproject.toml's pin of that package (pyproject.toml beside
  the file or above it; without one the pins cannot be compared, and the file is refused, not called valid), and every package
  pyproject.toml pins exactly in its dependencies and in the extras the file installs (``.[tabicl,tabpfn]``:
  torch, ray, opacus, tabicl, tabpfn) is pinned in the file: an image with another torch or Ray than the
  driver's fails in ways no error message names;
* no secret: no ``ARG`` with a credential's name (its value stays in the image's history, default or not), no
  ``ENV`` with one and a literal value, no key material (``wandb login KEY`` included, in comments too), no copy
  of a ``.netrc`` or W&B key file (an image's layers keep what any step wrote);
* the container runs as a non-root user (the last ``USER`` is neither ``root`` nor ``0``).

Every problem names the file and the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.cluster.deploy_checks import (
    KEY_FILE,
    SECRET_NAME,
    WANDB_KEY_FILE,
    ClusterCheck,
    comment_secret_problems,
    literal_secret,
)

_PIN = re.compile(r"(?<![\w.-])([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([A-Za-z0-9.+!_-]+)")
_EXACT_TAG = re.compile(r"\d+\.\d+\.\d+")  # a full version somewhere in the tag: 3.11.7-slim, 12.6.3-runtime


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_pins(pyproject: Path, extras: set[str] | None = None) -> dict[str, str]:
    """Every ``name==version`` in pyproject.toml's dependencies and in ``extras`` (all extras: None), by
    normalised name."""
    import tomllib

    data = tomllib.loads(pyproject.read_text())
    project = data.get("project", {})
    specs = list(project.get("dependencies", []))
    for name, extra in project.get("optional-dependencies", {}).items():
        if extras is None or name in extras:
            specs += list(extra)
    pins = {}
    for spec in specs:
        match = _PIN.search(spec)
        if match:
            pins[_norm(match.group(1))] = match.group(3)
    return pins


@dataclass
class _Instruction:
    line: int  # 1-based line of the instruction's first line
    keyword: str
    text: str  # the arguments, continuation lines joined


@dataclass
class _Parsed:
    instructions: list[_Instruction] = field(default_factory=list)


def _parse(text: str) -> _Parsed:
    """Dockerfile instructions with their line numbers (comments dropped, ``\\`` continuations joined)."""
    out = _Parsed()
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = number
        pending.append(line[:-1] if line.endswith("\\") else line)
        if line.endswith("\\"):
            continue
        joined = " ".join(p.strip() for p in pending)
        pending = []
        keyword, _, rest = joined.partition(" ")
        out.instructions.append(_Instruction(start, keyword.upper(), rest.strip()))
    return out


def _resolve(ref: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: args.get(m.group(1), m.group(0)), ref)


def base_image_problem(ref: str) -> str | None:
    """Why the image reference ``ref`` is not pinned (None when it is: a digest, or a tag with a full x.y.z
    version); Dockerfiles' base images and KubeRay's container images alike."""
    if "$" in ref:
        return f"base image {ref!r} names an ARG without a default: pin it in the file"
    if "@sha256:" in ref:
        return None
    name, _, tag = ref.rpartition(":") if ":" in ref.split("/")[-1] else (ref, "", "")
    if not tag:
        return f"base image {ref!r} has no tag (Docker takes 'latest'): pin an exact version or a digest"
    if tag == "latest":
        return f"base image {ref!r} is 'latest': pin an exact version or a digest"
    if not _EXACT_TAG.search(tag):
        return f"base image {ref!r}: tag {tag!r} moves with every release; pin a full version (x.y.z) or a digest"
    return None


def _nearest_pyproject(path: Path) -> Path | None:
    """pyproject.toml beside the Dockerfile or in the nearest folder above it (``docker/gpu.Dockerfile`` of a
    checkout is built with the checkout as its context); None when there is none."""
    for folder in (path.resolve().parent, *path.resolve().parent.parents):
        if (folder / "pyproject.toml").is_file():
            return folder / "pyproject.toml"
    return None


def check_dockerfile(path: str | Path, pyproject: str | Path | None = None) -> ClusterCheck:
    """The checks above on ``path``, pins compared with ``pyproject`` (default: pyproject.toml beside it or in the
    nearest folder above it). Without one the pins are not compared, and that is a problem: the check cannot
    say the image is valid."""
    path = Path(path)
    where = str(path)
    result = ClusterCheck(where)
    if not path.is_file():
        result.problems.append(f"{where}: {'file not found' if not path.exists() else 'not a file'}")
        return result
    text = path.read_text()
    parsed = _parse(text)
    result.problems += comment_secret_problems(text, where, whole_line_only=True)
    given = pyproject is not None
    pyproject = Path(pyproject) if pyproject is not None else _nearest_pyproject(path)
    extras = {e.strip() for ins in parsed.instructions if ins.keyword == "RUN" and "pip install" in ins.text
              for group in re.findall(r"\.\[([^\]]+)\]", ins.text) for e in group.split(",")}
    every = pyproject_pins(pyproject) if pyproject is not None and pyproject.is_file() else {}
    wanted = pyproject_pins(pyproject, extras) if pyproject is not None and pyproject.is_file() else {}
    if pyproject is None or not pyproject.is_file():
        # Without the driver's pins nothing says the image runs the driver's torch and Ray: not "valid".
        own = sorted({f"{m.group(1)}=={m.group(3)}" for ins in parsed.instructions
                      if ins.keyword == "RUN" and "pip install" in ins.text for m in _PIN.finditer(_resolve(ins.text, {}))})
        looked = str(pyproject) if given else f"beside it or in a folder above it ({path.resolve().parent})"
        result.problems.append(f"{where}: pip install pins: not compared: no pyproject.toml {looked}, so nothing says "
                               f"the image's pins ({', '.join(own) or 'none'}) are the driver's; check the "
                               "Dockerfile inside the checkout it is built from")
    elif pyproject.resolve().parent != path.resolve().parent:
        result.notes.append(f"{where}: pins compared with {pyproject} (the nearest pyproject.toml above it)")
    elif not every:
        result.notes.append(f"{where}: {pyproject} pins no package exactly: pins not compared")
    args: dict[str, str] = {}
    froms = 0
    pinned: dict[str, tuple[str, int]] = {}
    user = None
    for ins in parsed.instructions:
        at = f"{where}:{ins.line}"
        if ins.keyword == "ARG":
            name, _, default = ins.text.partition("=")
            if default:
                args[name.strip()] = default.strip().strip("\"'")
        if ins.keyword == "ARG" and SECRET_NAME.match(ins.text.partition("=")[0].strip()):
            # with a default or without: a build argument's value stays in the image's history (docker history)
            result.problems.append(f"{at}: ARG {ins.text.partition('=')[0].strip()} passes a credential into the "
                                   "build, and the image's history keeps it; use a BuildKit secret (RUN "
                                   "--mount=type=secret,...) or pass it at run time (a Kubernetes Secret, a 0600 "
                                   "file on the head)")
        elif ins.keyword in ("ARG", "ENV"):
            pairs = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|'[^']*'|\S+)", ins.text)
            if ins.keyword == "ENV" and not pairs and " " in ins.text:  # the old `ENV NAME value` form
                name, _, value = ins.text.partition(" ")
                pairs = [(name, value)]
            for name, value in pairs:
                literal = value.strip("\"'")
                if SECRET_NAME.match(name) and literal and not literal.startswith("$"):
                    result.problems.append(f"{at}: {ins.keyword} {name} bakes a credential into the image; pass it "
                                           "at run time (a Kubernetes Secret, a 0600 file on the head)")
        found = literal_secret(ins.text) if ins.keyword not in ("ARG", "ENV") else None  # those: by name, above
        if found:
            result.problems.append(f"{at}: {ins.keyword} holds {found}")
        if ins.keyword in ("COPY", "ADD") and any(WANDB_KEY_FILE.search(p) or KEY_FILE.search(p)
                                                  for p in ins.text.split()):
            result.problems.append(f"{at}: {ins.keyword} copies a credential file into the image (an image's layers "
                                   "keep it): mount it at run time, or use a build secret (`RUN --mount=type=secret`)")
        if ins.keyword == "FROM":
            froms += 1
            ref = _resolve(ins.text.split()[0], args) if ins.text else ""
            problem = base_image_problem(ref)
            if problem:
                result.problems.append(f"{at}: {problem}")
        if ins.keyword == "RUN" and "pip install" in ins.text:
            for match in _PIN.finditer(_resolve(ins.text, args)):
                name, version = _norm(match.group(1)), match.group(3)
                pinned[name] = (version, ins.line)
                if name in every and every[name] != version:
                    result.problems.append(f"{at}: pins {match.group(1)}=={version}, pyproject.toml pins "
                                           f"{every[name]}: the image would run another {match.group(1)} than the "
                                           "driver")
        if ins.keyword == "USER":
            user = ins.text.split(":")[0].strip()
    if not froms:
        result.problems.append(f"{where}: no FROM: not a Dockerfile")
    for name, version in sorted(wanted.items()):
        if name not in pinned:
            result.problems.append(f"{where}: pyproject.toml pins {name}=={version}; the file installs it unpinned "
                                   "or not at all: pin it in a `pip install`")
    if user is None or user in ("root", "0"):
        result.problems.append(f"{where}: the container runs as root ({'no USER' if user is None else 'USER ' + user})"
                               "; add a non-root user and `USER` it")
    return result
