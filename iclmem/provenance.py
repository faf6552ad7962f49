"""What is recorded with every result: package versions and the git commit of the code that ran."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterable

CORE_PACKAGES = ("iclmem", "torch", "ray", "numpy", "pandas", "scikit-learn", "wandb", "pyarrow")


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
