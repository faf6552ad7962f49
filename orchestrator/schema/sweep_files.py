"""Loading a sweep file of either kind: the tabular sweep (``iclmem run``) and the LM sweep (``iclmem lm run``).
Each loader knows the other kind's schema, so a file of the other kind is named as such in one line instead
of as every setting it lacks and has; both schemas sit below this module."""

from __future__ import annotations

from pathlib import Path

from orchestrator.schema.config import SweepConfig, resolve_paths
from orchestrator.schema.config_reading import read_config, resolve_path
from orchestrator.schema.lm_config import LMSweepConfig

__all__ = ["load_lm_sweep", "load_sweep"]


def load_sweep(path: str | Path) -> SweepConfig:
    """Read and validate a tabular sweep YAML; relative data paths are relative to the file."""
    lm = (LMSweepConfig, "an LM sweep file (it has {keys}), not a tabular one: check it with `iclmem lm validate "
                         "{path}` and run it with `iclmem lm run`")
    return resolve_paths(read_config(SweepConfig, path, other=lm), Path(path).parent)


def load_lm_sweep(path: str | Path) -> LMSweepConfig:
    """Read and validate an LM sweep YAML; relative paths are relative to the file."""
    path = Path(path)
    tabular = (SweepConfig, "a tabular sweep file (it has {keys}), not an LM one: check it with `iclmem validate "
                            "{path}` and run it with `iclmem run`")
    cfg = read_config(LMSweepConfig, path, other=tabular)
    return cfg.model_copy(update={
        "models": [m.model_copy(update={"path": resolve_path(m.path, path.parent)}) for m in cfg.models],
        "datasets": [d.model_copy(update={"path": resolve_path(d.path, path.parent)}) for d in cfg.datasets],
    })
