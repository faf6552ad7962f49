"""What is recorded with every result: the config and its hash, package versions, the git commit of the
code that ran, and seeds, as one typed record written to ``RUN_DIR/provenance.json``."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

CORE_PACKAGES = ("iclmem", "torch", "numba", "ray", "numpy", "pandas", "scikit-learn", "wandb", "pyarrow")


def package_versions(packages: Iterable[str] = CORE_PACKAGES) -> dict[str, str]:
    """Installed versions of ``packages`` (absent ones are left out) plus the Python version."""
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for pkg in packages:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# --------------------------------------------------------------------------------------------------
# The provenance record: one writer (``Provenance.write``), one reader (``Provenance.read``)
# --------------------------------------------------------------------------------------------------

PROVENANCE_FILE = "provenance.json"
# The fields any report, page or logger may show: ids, versions and dates. ``config`` (which may hold
# paths and free-form options) stays in the run folder.
PUBLIC_FIELDS: tuple[str, ...] = (
    "kind", "sweep_name", "config_hash", "git_commit", "git_dirty", "iclmem_version", "python", "platform",
    "created_at",
)


def _git_dirty() -> bool:
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                             cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10)
        return out.returncode == 0 and bool(out.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return False


@dataclass(frozen=True)
class Provenance:
    """What produced a run folder's results: the validated config and its hash, the code (git commit,
    uncommitted changes), package versions, seeds and the time. Written once per run folder (a resumed
    run rewrites it with the same config hash and the resuming code's versions)."""

    kind: str  # "tabular" or "lm": which driver wrote the folder
    sweep_name: str
    config_hash: str
    config: Mapping[str, Any]
    seeds: tuple[int, ...]
    git_commit: str
    git_dirty: bool
    packages: Mapping[str, str]
    iclmem_version: str
    python: str
    platform: str
    created_at: str
    embedded_model: Mapping[str, Any] = field(default_factory=dict)  # the shipped model's training recipe

    @classmethod
    def collect(cls, *, kind: str, sweep_name: str, config: Mapping[str, Any], config_hash: str,
                seeds: Iterable[int], extra_packages: Iterable[str] = (),
                embedded_model: Mapping[str, Any] | None = None) -> Provenance:
        import platform as _platform

        packages = package_versions((*CORE_PACKAGES, *extra_packages))
        return cls(kind=kind, sweep_name=sweep_name, config_hash=config_hash, config=dict(config),
                   seeds=tuple(int(s) for s in seeds), git_commit=git_commit(), git_dirty=_git_dirty(),
                   packages={k: v for k, v in packages.items() if k != "python"},
                   iclmem_version=packages.get("iclmem", "unknown"), python=packages["python"],
                   platform=_platform.platform(), created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   embedded_model=dict(embedded_model or {}))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["seeds"] = list(self.seeds)
        return out

    def write(self, run_dir: str | Path) -> Path:
        from iclmem.atomic import write_json_atomic

        return write_json_atomic(Path(run_dir) / PROVENANCE_FILE, self.to_dict(), default=str)

    @classmethod
    def read(cls, run_dir: str | Path) -> Provenance | None:
        """The record in ``run_dir``, or None when there is none; a file that is not this record (another
        tool's, or damaged) raises DataError naming it."""
        import json

        from iclmem.errors import DataError

        path = Path(run_dir) / PROVENANCE_FILE
        if not path.is_file():
            return None
        try:
            raw = json.loads(path.read_text())
            names = {f.name for f in fields(cls)}
            missing = sorted(n for n in names if n not in raw and n != "embedded_model")
            if missing:
                raise ValueError(f"missing field(s) {missing}")
            raw = {k: v for k, v in raw.items() if k in names}
            raw["seeds"] = tuple(raw["seeds"])
            return cls(**raw)
        except (OSError, ValueError, TypeError) as exc:
            raise DataError(f"{path}: not an iclmem provenance record ({exc})") from None

    def public(self) -> dict[str, Any]:
        """The allow-listed fields and ``packages``: what reports and W&B show."""
        out: dict[str, Any] = {name: getattr(self, name) for name in PUBLIC_FIELDS}
        out["packages"] = dict(sorted(self.packages.items()))
        return out
