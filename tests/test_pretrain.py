"""The one pretraining loop (``trainables.models.pretrain``) for the small models of the packages' own classes.

tabicl-mini and tabpfn-mini train a few steps through the module's command line on a pool written here in the
prior generator's file format (generating real prior tables takes seconds each); a run stopped half way and
resumed ends on the weights of an uninterrupted one; the export is the package's own checkpoint, loaded by
``TabICLClassifier(model_path=...)`` / ``TabPFNClassifier(model_path=...)`` and by the adapters' loaders, with
a record naming command, seed and versions. ``python -m trainables.models.pretrain_pfn_mini`` stays pfn-mini's
command. No test here writes into ``trainables/models/weights``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from iclmem.errors import ConfigError
from trainables.models.extras import extra_is_installed
from trainables.models.pretrain import PRETRAINABLE, WEIGHTS_DIR, build, logits_of, main, measure, split_loss_backward
from trainables.models.pretrain_prior import standardize

EXTRA = {"tabicl-mini": "tabicl", "tabpfn-mini": "tabpfn-v2"}
MINIS = [pytest.param(name, marks=pytest.mark.skipif(not extra_is_installed(extra), reason=f"{extra} is not installed"))
         for name, extra in EXTRA.items()]
# A run of 4 steps of 4 tables, the ICL forward in micro-batches of 2, evaluated and saved every 2 steps; both
# the pool and the Gaussian-cluster prior are drawn from.
RUN = ["--steps", "4", "--seed", "0", "--save-every", "2", "--generators", "0", "--batch-size", "4",
       "--micro-batch", "2", "--gmm-share", "0.5"]


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """The loop sets torch's thread count (``--threads``); the test process gets its own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    """Two pool batches of 8 tables in ``generate_pool``'s format: features x [T, L, 18] zero past each table's
    d [T] live columns, labels y [T, L], seq_len [T]; the classes shift the features' means."""
    folder = tmp_path / "pool"
    folder.mkdir()
    gen = torch.Generator().manual_seed(7)
    for index in range(2):
        tables, length = 8, 60 + 20 * index
        d = torch.randint(2, 19, (tables,), generator=gen)
        y = torch.randint(0, 3, (tables, length), generator=gen)
        x = torch.randn(tables, length, 18, generator=gen) + y[..., None].float()
        x = torch.where(torch.arange(18)[None, None, :] < d[:, None, None], x, torch.zeros_like(x))
        torch.save({"x": x, "y": y, "d": d, "seq_len": torch.full((tables,), length)}, folder / f"batch_{index:06d}.pt")
    return folder


def _state(workdir: Path) -> dict:
    return torch.load(workdir / "state.pt", weights_only=True)


def _curve(workdir: Path) -> list[dict]:
    # "seconds" is wall time, the one field a resumed run may not reproduce
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (workdir / "curve.jsonl").read_text().splitlines()]


def _table(seed: int, rows: int = 60, features: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, rows)
    return (rng.normal(size=(rows, features)) + y[:, None]).astype(np.float32), y


@pytest.mark.parametrize("model", MINIS)
def test_a_run_stopped_half_way_and_resumed_ends_on_the_weights_of_an_uninterrupted_one(model, pool, tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    main(["--model", model, "--workdir", str(whole), "--pool", str(pool), *RUN])
    main(["--model", model, "--workdir", str(halves), "--pool", str(pool), *RUN, "--stop-at", "2"])
    assert _state(halves)["step"] == 2
    assert len(_curve(halves)) == 1
    main(["--model", model, "--workdir", str(halves), "--pool", str(pool), *RUN])

    a, b = _state(whole), _state(halves)
    assert a["step"] == b["step"] == 4
    assert a["pretrainable"] == model
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert torch.equal(a["generator"], b["generator"])
    assert torch.equal(a["torch_rng"], b["torch_rng"])
    assert all(torch.equal(a["optimizer"]["state"][i]["exp_avg"], b["optimizer"]["state"][i]["exp_avg"])
               for i in a["optimizer"]["state"])
    curve = _curve(whole)
    assert curve == _curve(halves)  # the losses and accuracies at steps 2 and 4, identical
    assert [p["step"] for p in curve] == [2, 4]
    assert all(np.isfinite(p["loss"]) for p in curve)
    # not vacuous: four steps moved the weights away from the seeded init
    init = build(PRETRAINABLE.get(model), seed=0).module.state_dict()
    assert any(not torch.equal(init[k], a["model"][k]) for k in init)


@pytest.mark.parametrize("model", MINIS)
def test_micro_batches_accumulate_the_gradient_of_the_whole_batch(model):
    """Four tables in micro-batches of one give the loss and the gradients of one pass over all four."""
    adapter = build(PRETRAINABLE.get(model), seed=1)
    gen = torch.Generator().manual_seed(3)
    y = torch.randint(0, 3, (4, 50), generator=gen)
    x = standardize(torch.randn(4, 50, 6, generator=gen) + y[..., None].float(), torch.full((4,), 6))

    def gradients(micro_batch: int | None) -> tuple[float, dict[str, torch.Tensor]]:
        adapter.module.zero_grad(set_to_none=True)
        loss = split_loss_backward(logits_of(adapter), x, y, 50, torch.Generator().manual_seed(5), micro_batch)
        return loss, {n: p.grad.clone() for n, p in adapter.module.named_parameters() if p.grad is not None}

    loss_whole, whole = gradients(None)
    loss_micro, micro = gradients(1)
    assert loss_micro == pytest.approx(loss_whole, rel=1e-5)
    assert whole.keys() == micro.keys()
    assert any(g.abs().sum() > 0 for g in whole.values())
    for name in whole:
        torch.testing.assert_close(micro[name], whole[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("model", MINIS)
def test_the_export_is_the_packages_own_checkpoint_and_loads_where_the_official_one_does(
        model, pool, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing below may reach a model hub
    from trainables.models import build_model

    spec = PRETRAINABLE.get(model)
    workdir, out = tmp_path / "work", tmp_path / "export"
    main(["--model", model, "--workdir", str(workdir), "--pool", str(pool), *RUN, "--export", "--export-dir", str(out)])
    path = out / spec.weights_file
    record = json.loads(path.with_suffix(".json").read_text())
    trained = _state(workdir)["model"]

    # the package's own file: {"config", "state_dict"}, readable without unpickling code
    raw = torch.load(path, map_location="cpu", weights_only=True)
    assert set(raw) == {"config", "state_dict"}
    assert raw["config"] == record["config"]

    # the package's own classifier, as a user with the official checkpoint runs it (no download)
    x, y = _table(0)
    xq, _ = _table(1, rows=20)
    if model == "tabicl-mini":
        from tabicl import TabICLClassifier

        classifier = TabICLClassifier(model_path=str(path), allow_auto_download=False, device="cpu", n_estimators=2)
    else:
        from tabpfn import TabPFNClassifier

        classifier = TabPFNClassifier(model_path=str(path), device="cpu", n_estimators=2)
    proba = classifier.fit(x, y).predict_proba(xq)
    assert proba.shape == (20, 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)

    # the adapters' loaders, iclmem's loop and the package fine-tuner's recipe alike: the trained weights
    adapter = build_model(spec.adapter, weights=str(path))
    assert adapter.options["config"] == record["config"]
    for key, value in adapter.module.state_dict().items():
        assert torch.equal(value, trained[key]), key
    log_probs = adapter.log_probs(torch.from_numpy(x)[None], torch.from_numpy(y)[None], torch.from_numpy(xq)[None], 3)
    assert log_probs.shape == (1, 20, 3)
    assert torch.isfinite(log_probs).all()
    assert build_model(spec.adapter, weights=str(path), recipe="upstream").options["recipe"] == "upstream"

    # the record: how to make these weights again, and what they score
    assert record["command"].startswith(f"python -m trainables.models.pretrain --model {model} ")
    assert "--seed 0" in record["command"]
    assert record["seed"] == 0
    assert record["steps"] == record["planned_steps"] == 4
    assert record["model"] == model
    assert {"torch", "numpy", "tabicl", "scikit-learn", "python"} <= set(record["versions"])
    if model == "tabpfn-mini":
        assert "tabpfn" in record["versions"]
    assert record["training"]["micro_batch"] == 2
    assert record["prior_settings"]["generator"] == "tabicl.prior.PriorDataset"
    assert record["prior_settings"]["pool_batches"] == 2
    assert record["weights_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["parameters"] == sum(v.numel() for v in adapter.module.parameters())
    assert [p["step"] for p in record["curve_points"]] == [2, 4]
    for key in ("final_accuracy_5_seeds", "package_classifier_accuracy_5_seeds", "logistic_regression_5_seeds"):
        assert set(record[key]) == {"breast_cancer", "wine", "iris"}, key
        assert all(0 <= v <= 1 for v in record[key].values()), key


def test_pfn_mini_keeps_its_recorded_command_and_trains_as_the_module_does(tmp_path):
    from trainables.models import build_model
    from trainables.models.pretrain_pfn_mini import main as pfn_mini_main

    shipped = {f.name: f.read_bytes() for f in WEIGHTS_DIR.iterdir()}
    run = ["--steps", "2", "--seed", "0", "--save-every", "2", "--generators", "0", "--gmm-share", "1",
           "--batch-size", "4"]
    pfn_mini_main(["--workdir", str(tmp_path / "alias"), *run, "--export", "--export-dir", str(tmp_path / "out")])
    main(["--model", "pfn-mini", "--workdir", str(tmp_path / "module"), *run])

    path = tmp_path / "out" / "pfn_mini.safetensors"
    record = json.loads(path.with_suffix(".json").read_text())
    assert record["command"] == ("python -m trainables.models.pretrain_pfn_mini --workdir "
                                 f"{tmp_path / 'alias'} {' '.join(run)} --export --export-dir {tmp_path / 'out'}")
    assert record["config"] == {"d_ff": 256, "d_model": 128, "max_classes": 10, "max_features": 20, "n_heads": 4,
                                "n_layers": 4}
    loaded = build_model("pfn-mini", weights=str(path)).module.state_dict()
    through_module = _state(tmp_path / "module")["model"]
    for key, value in loaded.items():
        assert torch.equal(value, through_module[key]), key
    assert {f.name: f.read_bytes() for f in WEIGHTS_DIR.iterdir()} == shipped  # the shipped weights untouched


def test_the_alias_trains_pfn_mini_only(capsys):
    from trainables.models.pretrain_pfn_mini import main as pfn_mini_main

    with pytest.raises(SystemExit):
        pfn_mini_main(["--model", "tabicl-mini", "--steps", "1"])
    assert "trains pfn-mini only" in capsys.readouterr().err


def test_an_unknown_model_is_answered_with_the_known_ones(capsys):
    with pytest.raises(SystemExit):
        main(["--model", "tabpfn-tiny", "--steps", "1"])
    assert "known: pfn-mini, tabicl-mini, tabpfn-mini" in capsys.readouterr().err


def test_a_workdir_holding_another_models_state_is_refused_naming_both(tmp_path):
    workdir = tmp_path / "work"
    main(["--model", "pfn-mini", "--workdir", str(workdir), "--steps", "4", "--stop-at", "1", "--generators", "0",
          "--gmm-share", "1", "--batch-size", "2"])
    with pytest.raises(ConfigError, match="holds a pfn-mini pretraining state, not tabicl-mini's"):
        main(["--model", "tabicl-mini", "--workdir", str(workdir), "--steps", "4", "--generators", "0"])
    # a state from before states named their model is pfn-mini's
    state = _state(workdir)
    del state["pretrainable"], state["torch_rng"]
    torch.save(state, workdir / "state.pt")
    with pytest.raises(ConfigError, match="holds a pfn-mini pretraining state"):
        main(["--model", "tabpfn-mini", "--workdir", str(workdir), "--steps", "4", "--generators", "0"])
    main(["--model", "pfn-mini", "--workdir", str(workdir), "--steps", "4", "--stop-at", "2", "--generators", "0",
          "--gmm-share", "1", "--batch-size", "2"])
    assert _state(workdir)["step"] == 2


@pytest.mark.parametrize(("model", "parameters"), [("tabicl-mini", 179_526), ("tabpfn-mini", 71_562)])
def test_the_minis_are_small_and_a_step_is_timed(model, parameters):
    """The configurations the module documents: their parameter counts, a few MB at most, and what
    ``--role measure`` reports (here on two tables, one micro-batch each)."""
    if not extra_is_installed(EXTRA[model]):
        pytest.skip(f"{EXTRA[model]} is not installed")
    cost = measure(PRETRAINABLE.get(model), batch_size=2, micro_batch=1, threads=1, steps=1)
    assert cost.parameters == parameters
    assert cost.weights_mb < 4
    assert cost.seconds_per_step > 0
    assert (cost.tables, cost.micro_batch, cost.rows, cost.features) == (2, 1, 184, 18)


def test_a_second_generator_on_one_pool_is_refused(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["--model", "pfn-mini", "--workdir", str(tmp_path), "--generators", "2", "--steps", "1"])
    assert "--generators: at most 1 per pool" in capsys.readouterr().err
    assert not (tmp_path / "state.pt").exists()
