"""Each model's default weights are resolved on the driver before anything starts.

A real model named with no options loads its package's official checkpoint from the local Hugging Face
cache (here a temporary cache holding a tiny random-init checkpoint written in the upstream file format,
under the upstream repository id and file name, with downloads off); a real model whose weights are not
on the machine is refused by ``iclmem validate`` and ``iclmem run`` with the remedy, before Ray starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_adapter_contract import CLASSIFIERS

from iclmem.errors import CheckpointError
from trainables.models import build_model
from trainables.models.base import extra_status
from trainables.models.checkpoints import locate_weights

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = "0" * 40  # a commit hash as the cache names snapshots


def _require(name: str) -> None:
    if not extra_status(name).startswith("installed"):
        pytest.skip(f"{name}: {extra_status(name)}")


def _cache_file(cache: Path, repo_id: str, filename: str) -> Path:
    """Where huggingface_hub's cache keeps ``filename`` of ``repo_id`` at revision main."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(SNAPSHOT)
    path = repo / "snapshots" / SNAPSHOT / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _tiny_official_checkpoint(name: str, cache: Path):
    """A tiny random model of ``name`` and its weights written where and as the package publishes them."""
    if name == "tabicl":
        from trainables.models.tabicl_adapter import DEFAULT_CHECKPOINTS, HUB_REPO

        model = build_model("tabicl", seed=3, **CLASSIFIERS["tabicl"])
        torch.save({"config": model.options["config"], "state_dict": model.module.state_dict()},
                   _cache_file(cache, HUB_REPO, DEFAULT_CHECKPOINTS["classification"]))
    elif name == "tabpfn-v2":
        from tabpfn.model_loading import ModelSource

        model = build_model("tabpfn-v2", seed=3, **CLASSIFIERS["tabpfn-v2"])
        source = ModelSource.get_classifier_v2()
        torch.save({"config": model.options["config"], "state_dict": model.module.state_dict()},
                   _cache_file(cache, source.repo_id, source.default_filename))
    else:
        from trainables.models.contexttab_adapter import DEFAULT_CHECKPOINT, HUB_REPO

        model = build_model("contexttab", seed=3, **CLASSIFIERS["contexttab"])
        torch.save({("module." + k): v for k, v in model.module.state_dict().items()},
                   _cache_file(cache, HUB_REPO, DEFAULT_CHECKPOINT))
    return model


@pytest.fixture
def empty_caches(tmp_path, monkeypatch):
    """A fresh Hugging Face cache (and TabPFN cache) for this test; downloads would go nowhere."""
    import huggingface_hub.constants

    hf = tmp_path / "hf"
    hf.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hf))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        import tabpfn.model_loading

        monkeypatch.setattr(tabpfn.model_loading, "get_cache_dir", lambda: tmp_path / "tabpfn")
    except ImportError:
        pass
    return hf


@pytest.mark.parametrize("name", ["tabicl", "tabpfn-v2", "contexttab"])
def test_a_real_model_with_no_options_loads_the_official_checkpoint_from_the_local_cache(name, empty_caches):
    _require(name)
    with pytest.raises(CheckpointError, match=f"model {name!r}: .*allow_download: true.*weights: /path"):
        locate_weights(name, {})
    written = _tiny_official_checkpoint(name, empty_caches)
    assert locate_weights(name, {}) is not None
    loaded = build_model(name)  # no options at all: the adapter's default weights
    assert loaded.options["weights"] == "hub"
    for key, value in written.module.state_dict().items():
        assert torch.equal(loaded.module.state_dict()[key], value), key


def test_pfn_mini_defaults_to_its_shipped_weights():
    from trainables.models.embedded import SHIPPED_WEIGHTS

    assert locate_weights("pfn-mini", {}) == SHIPPED_WEIGHTS
    assert locate_weights("pfn-mini", {"weights": "random"}) is None
    with pytest.raises(CheckpointError, match="no-such.safetensors"):
        locate_weights("pfn-mini", {"weights": "/no-such.safetensors"})


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_real_model_whose_weights_are_absent_is_refused_before_ray_starts(command, tmp_path):
    sweep = tmp_path / "tabicl.yaml"
    sweep.write_text(yaml.safe_dump({"name": "absent", "tasks": [{"name": "iris"}], "models": [{"name": "tabicl"}],
                                     "grid": {"q": [20]}, "data": {"context_size": 30}}))
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    env.update({"HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(tmp_path / "xdg"),
                "RAY_TMPDIR": str(ray_tmp), "RAY_USAGE_STATS_ENABLED": "0", "WANDB_MODE": "disabled"})
    args = [str(sweep)] + (["--out", str(tmp_path / "run")] if command == "run" else [])
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli", command, *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    message = out.stderr + out.stdout
    assert "models.0: model 'tabicl'" in message, message
    assert "allow_download: true" in message, message
    assert "Traceback" not in message
    assert list(ray_tmp.iterdir()) == []  # no Ray session was created
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("name", "options"), [
    ("pfn-mini", {"weights": "shipped"}),
    ("tabicl", {"weights": "random", "embed_dim": 16, "col_num_blocks": 2, "col_nhead": 2, "col_num_inds": 8,
                "row_num_blocks": 1, "row_nhead": 2, "row_num_cls": 2, "icl_num_blocks": 2, "icl_nhead": 2}),
    ("tabpfn-v2", {"weights": "random", "emsize": 16, "nlayers": 2, "nhead": 2}),
    ("tabpfn-v2", {"weights": "random", "emsize": 16, "nlayers": 1, "nhead": 2, "task": "regression",
                   "num_buckets": 50}),
])
def test_a_model_rebuilt_from_its_skeleton_and_state_arrays_is_the_same_model(name, options, tmp_path):
    """What a probe actor does with the reference model (#34): build the recorded architecture with random
    weights, then load the shared arrays. Loaded from a file of a non-default size, the rebuilt model must
    have every weight, and a regressor its bucket borders, and answer identically."""
    import torch

    from trainables.models import build_model
    from trainables.models.extras import extra_is_installed

    if not extra_is_installed(name):
        pytest.skip(f"{name}: its optional extra is not installed")
    made = build_model(name, **options)
    if getattr(made, "criterion", None) is not None:  # a regressor's own borders (not the random build's)
        from tabpfn.architectures.shared.bar_distribution import FullSupportBarDistribution

        made.criterion = FullSupportBarDistribution(torch.linspace(-1.0, 3.0, made.criterion.borders.numel()) ** 3)
    if options["weights"] == "random":  # through a file, as a user's weights arrive
        made.save(tmp_path / "w.safetensors")
        made = build_model(name, weights=str(tmp_path / "w.safetensors"))
    rebuilt = build_model(name, **made.skeleton_options())
    rebuilt.load_state_arrays(made.state_arrays(), copy=True)
    original, copy = made.module.state_dict(), rebuilt.module.state_dict()
    assert original.keys() == copy.keys()
    assert all(torch.equal(value, copy[key]) for key, value in original.items())
    if getattr(made, "criterion", None) is not None:
        assert torch.equal(made.criterion.borders, rebuilt.criterion.borders)
        assert not torch.equal(made.criterion.borders, build_model(name, **made.skeleton_options()).criterion.borders)
