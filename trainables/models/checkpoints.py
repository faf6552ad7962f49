"""Where each model's weights come from, resolved on the driver before any cluster work.

Every adapter declares a :class:`DefaultWeights`: what ``models: [{name: X}]`` with no options loads, how
to tell whether it is on this machine, and the licence note a user must read before auditing with it.
``locate_weights(name, options)`` is the one resolution path: the sweep driver and ``iclmem validate``
call it for every model before Stage I ends (so a missing checkpoint is refused with its remedy, nothing
started), and the adapters' builders call the same function to find the file they load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iclmem.errors import CheckpointError
from iclmem.registry import Registry

RANDOM = "random"  # seeded initialisation: no file
HUB = "hub"  # the package's official checkpoint, from the local Hugging Face cache
# A small model of the package's own architecture, pretrained here on a synthetic prior and shipped with iclmem
# in the package's own checkpoint format (trainables/models/pretrain.py): loaded exactly as a user's official
# file is, by the adapter's loader, the package's classifier and its fine-tuner.
MINI = "mini"
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
MINI_CHECKPOINTS: Mapping[str, str] = {"tabicl": "tabicl_mini.ckpt", "tabpfn-v2": "tabpfn_mini.ckpt"}


@dataclass(frozen=True)
class DefaultWeights:
    """What ``weights`` is when a sweep gives none, and how to find it."""

    weights: str  # the default value of the ``weights`` option ("shipped", "hub")
    source: str  # what it is, for people: "jingang/TabICL: tabicl-classifier-....ckpt"
    licence: str  # the terms a user accepts by loading it
    locate: Callable[..., Path]  # (allow_download=..., **options) -> the checkpoint file, or CheckpointError


DEFAULT_WEIGHTS: Registry[DefaultWeights] = Registry("model weights")


def locate_weights(model: str, options: Mapping[str, Any]) -> Path | None:
    """The checkpoint file ``build_model(model, **options)`` will load (None for ``weights: random``);
    a local path must exist, official weights must be in the local cache or downloads allowed. Errors
    name the model and the remedy."""
    default = DEFAULT_WEIGHTS.get(model)
    weights = options.get("weights", default.weights)
    if weights is None or weights == RANDOM:
        return None
    if weights == default.weights or weights == HUB:
        try:
            return default.locate(**{k: v for k, v in options.items() if k != "weights"})
        except CheckpointError as exc:
            raise CheckpointError(f"model {model!r}: {exc}") from None
    return checkpoint_file(model, weights)


def mini_checkpoint(model: str) -> Path:
    """The shipped small pretrained checkpoint of ``model``'s own architecture (``weights: mini``)."""
    if model not in MINI_CHECKPOINTS:
        raise CheckpointError(f"model {model!r} has no shipped mini checkpoint (weights: mini); models with one: "
                              f"{', '.join(sorted(MINI_CHECKPOINTS))}")
    path = WEIGHTS_DIR / MINI_CHECKPOINTS[model]
    if not path.is_file():
        raise CheckpointError(f"the shipped {model} mini checkpoint is missing at {path}; reinstall iclmem or run "
                              f"`python -m trainables.models.pretrain --model {path.stem.replace('_', '-')} --export`")
    return path


def checkpoint_file(model: str, weights: str) -> Path:
    """A named file the user gave (``weights: /path``) or the shipped mini (``weights: mini``): it must exist."""
    return mini_checkpoint(model) if weights == MINI else local_checkpoint(weights)


def local_checkpoint(weights: str | Path) -> Path:
    """A checkpoint file named by the user: it must exist, or fail at once naming the path."""
    path = Path(weights).expanduser()
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint file not found: {path} (nothing is downloaded for a local path; use weights='hub' "
            "with allow_download: true to fetch the official checkpoint)"
        )
    return path


def not_cached(what: str, remedy_key: str = "allow_download") -> CheckpointError:
    return CheckpointError(
        f"{what} is not in the local Hugging Face cache and downloads are off: set `{remedy_key}: true` in the "
        "model's options, or `weights: /path/to/the/checkpoint`"
    )


def hub_checkpoint(repo_id: str, filename: str, *, allow_download: bool) -> Path:
    """The official checkpoint from the local Hugging Face cache; downloaded only if ``allow_download``."""
    from iclmem.errors import ModelError

    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:  # huggingface_hub comes with every extra, but say so if it does not
        raise ModelError(f"weights='hub' needs huggingface_hub ({exc})") from exc
    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=filename, local_files_only=True))
    except Exception as cached_exc:  # LocalEntryNotFoundError and friends
        if not allow_download:
            raise not_cached(f"checkpoint {filename!r} of {repo_id!r}") from cached_exc
    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=filename))
    except Exception as exc:
        raise CheckpointError(f"could not download {filename!r} from {repo_id!r}: {exc}") from exc


def is_available(model: str) -> bool:
    """Whether the model's default weights are on this machine (nothing is downloaded to find out)."""
    try:
        return locate_weights(model, {"allow_download": False}) is not None
    except Exception:  # a missing extra or a missing file alike: not available here
        return False
