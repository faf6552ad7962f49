"""Recipe upstream: a tiny TabPFN v2 fine-tuned by tabpfn's own ``FinetunedTabPFNClassifier`` (its chunking,
schedule, validation and checkpoints), checkpointed by epoch through its logger hook, resumed from its own
saved state, and run end to end as a sweep model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from iclmem.errors import ConfigError
from orchestrator.schema.config import parse_sweep
from trainables.data import TaskSource, prepare_task
from trainables.finetune import Finetuner, FinetuneSpec, load_checkpoint_model, verify_checkpoint
from trainables.models.extras import extra_is_installed

pytestmark = pytest.mark.skipif(not extra_is_installed("tabpfn-v2"), reason="tabpfn (the tabpfn-v2 extra) is not installed")

TINY = dict(weights="random", emsize=16, nlayers=1, nhead=2)
UPSTREAM = {**TINY, "recipe": "upstream"}
TABICL_TINY = dict(weights="random", embed_dim=16, col_num_blocks=1, col_nhead=2, col_num_inds=8, row_num_blocks=1,
                   row_nhead=2, row_num_cls=2, icl_num_blocks=1, icl_nhead=2, zero_init=False)
# the two packages with a fine-tuner: tiny random models, and the package's estimator on one of its files
RECIPES = {
    "tabpfn-v2": UPSTREAM,
    "tabicl": {**TABICL_TINY, "recipe": "upstream", "n_estimators": 2},
}


def _package_estimator(model: str, path: Path):
    if model == "tabpfn-v2":
        from tabpfn import TabPFNClassifier

        return TabPFNClassifier(model_path=str(path), n_estimators=2, device="cpu", random_state=0,
                                ignore_pretraining_limits=True)
    from tabicl import TabICLClassifier

    return TabICLClassifier(model_path=str(path), n_estimators=2, allow_auto_download=False, device="cpu",
                            random_state=0)


def _require(model: str) -> None:
    if not extra_is_installed(model):
        pytest.skip(f"{model}: its optional extra is not installed")


@pytest.fixture(scope="module")
def task():
    return prepare_task(TaskSource("breast_cancer", "builtin"), label_mode="shuffled_members", seed=0, q=32,
                        context_size=64)


def _spec(model: str = "tabpfn-v2", **kw) -> FinetuneSpec:
    base = dict(model=model, model_options=RECIPES[model], lr=3e-3, epochs=4, checkpoint_epochs=(1, 2, 4), seed=0)
    return FinetuneSpec(**{**base, **kw})


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.module.state_dict().items()}


def _run(finetuner, tmp_path: Path, saved: dict[int, dict[str, torch.Tensor]] | None = None) -> list:
    """Run to the end, saving an iclmem checkpoint folder per epoch; the results in order."""
    results = []

    def on_epoch(result, package_file, end):
        results.append((result, end))
        finetuner.save(tmp_path / f"e{result.epoch}", package_file, {"epoch": result.epoch})
        if saved is not None:
            saved[result.epoch] = _state(finetuner.model)

    finetuner.run(on_epoch)
    return results


@pytest.mark.parametrize("model", sorted(RECIPES))
def test_the_package_fine_tuner_trains_the_members_and_hands_over_a_checkpoint_every_epoch(model, task, tmp_path):
    from trainables.upstream import UPSTREAM_STATE_FILE, UpstreamFinetuner
    from trainables.upstream_recipes import UPSTREAM_RECIPES

    _require(model)
    finetuner = UpstreamFinetuner(_spec(model), [task])
    base = _state(finetuner.model)
    x, y, x_val, y_val = finetuner.training_rows()
    assert len(y) == len(task.member_idx)
    assert len(y_val) == len(task.context_idx)
    assert np.array_equal(y, np.asarray(task.labels)[task.member_idx])  # the labels the run trains (shuffled)
    saved: dict[int, dict[str, torch.Tensor]] = {}
    results = _run(finetuner, tmp_path, saved)
    assert [r.epoch for r, _ in results] == [1, 2, 3, 4]
    assert [end for _, end in results[:-1]] == [None, None, None]
    end = results[-1][1]
    assert end.last_epoch == 4
    assert not end.stopped_early
    assert (end.best_epoch is not None) == (model == "tabpfn-v2")  # TabICL's files do not say which it deploys
    for result, _ in results:
        assert not result.diverged
        assert np.isfinite(result.train_loss)
        # the package's own validation metrics on C' every epoch; the utility as deployed where a checkpoint is
        assert {"upstream_val_log_loss", "upstream_train_mean_loss"} <= set(result.metrics)
        assert ("member_icl_accuracy" in result.metrics) == (result.epoch in (1, 2, 4))
    assert any(not torch.equal(saved[2][k], base[k]) for k in base)  # the package's steps moved the weights
    assert any(not torch.equal(saved[4][k], saved[1][k]) for k in base)
    manifest = verify_checkpoint(tmp_path / "e4")
    assert manifest["recipe"]["finetuner"] == UPSTREAM_RECIPES.get(model).finetuner_class
    assert manifest["finetuner_settings"]["learning_rate"] == 3e-3
    assert manifest["finetuner_settings"]["epochs"] == 4
    package = torch.load(tmp_path / "e4" / UPSTREAM_STATE_FILE, map_location="cpu", weights_only=False)
    assert package["epoch"] == 4
    assert {"optimizer", "optimizer_state"} & set(package)  # the package's own state, optimizer included
    # the utility is the package's estimator's, as deployed: its classifier on the package's own file of
    # epoch 4, fitted on C' (the raw network gives other numbers)
    deployed = _package_estimator(model, tmp_path / "e4" / UPSTREAM_STATE_FILE).fit(x_val, y_val)
    x_non = np.asarray(task.features, dtype=np.float32)[task.nonmember_idx]
    y_non = np.asarray(task.labels)[task.nonmember_idx]
    expected = float(np.mean(deployed.classes_[deployed.predict_proba(x_non).argmax(1)] == y_non))
    assert results[-1][0].metrics["nonmember_icl_accuracy"] == pytest.approx(expected)
    proba = deployed.predict_proba(x_non)[np.arange(len(y_non)), np.searchsorted(deployed.classes_, y_non)]
    assert results[-1][0].metrics["nonmember_icl_loss"] == pytest.approx(float(-np.log(proba).mean()), rel=1e-4)
    # the known-context channel as deployed reads the same classifier row by row, members first
    from trainables.upstream import deployed_losses

    losses = deployed_losses(finetuner.model, task)
    n_members = len(task.member_idx)
    assert losses[n_members:] == pytest.approx(-np.log(proba), rel=1e-4)
    assert losses[:n_members].mean() == pytest.approx(results[-1][0].metrics["member_icl_loss"], rel=1e-4)
    loaded = load_checkpoint_model(tmp_path / "e2")  # what the probe loads: epoch 2's weights, recipe kept
    assert loaded.options["recipe"] == "upstream"
    for key, value in saved[2].items():
        assert torch.equal(loaded.module.state_dict()[key], value), key


@pytest.mark.parametrize("model", sorted(RECIPES))
def test_a_run_resumed_from_its_checkpoint_continues_to_the_same_weights(model, task, tmp_path):
    """TabPFN's fine-tuner continues from its own saved state; TabICL's has no resume, so the run is
    recomputed up to the checkpoint (its weights checked against the checkpoint's hash) and goes on."""
    from trainables.upstream import UpstreamFinetuner

    _require(model)
    saved: dict[int, dict[str, torch.Tensor]] = {}
    _run(UpstreamFinetuner(_spec(model), [task]), tmp_path / "straight", saved)
    resumed = UpstreamFinetuner(_spec(model), [task])
    resumed.restore(tmp_path / "straight" / "e2")
    assert resumed.epoch == 2
    results = _run(resumed, tmp_path / "resumed")
    assert [r.epoch for r, _ in results] == [3, 4]  # epochs 1-2 are not reported again
    # TabPFN's package continued from its saved state (2 epochs trained); TabICL's ran all 4 again
    assert resumed.epochs_run == (2 if model == "tabpfn-v2" else 4)
    for key, value in saved[4].items():
        assert torch.equal(resumed.model.module.state_dict()[key], value), key
    # and a plain iclmem checkpoint is no state the package can continue from
    plain = Finetuner(FinetuneSpec(model="tabpfn-v2", model_options=TINY, epochs=1, seed=0), [task])
    plain.run_epoch()
    plain.save(tmp_path / "plain")
    with pytest.raises(Exception, match="upstream_state.pth"):
        UpstreamFinetuner(_spec(), [task]).restore(tmp_path / "plain")


def test_a_lost_checkpoint_is_recomputed_by_running_the_package_again(task, tmp_path):
    from trainables.recompute import recompute_checkpoint_model
    from trainables.upstream import UpstreamFinetuner

    saved: dict[int, dict[str, torch.Tensor]] = {}
    _run(UpstreamFinetuner(_spec(), [task]), tmp_path, saved)
    manifest = json.loads((tmp_path / "e2" / "checkpoint.json").read_text())
    model = recompute_checkpoint_model(_spec(), [task], 2, expected_sha256=manifest["weights_sha256"])
    assert model.options["recipe"] == "upstream"
    for key, value in saved[2].items():
        assert torch.equal(model.module.state_dict()[key], value), key


def test_the_package_early_stopping_ends_the_run_and_names_the_epoch_it_deploys(task, tmp_path):
    from trainables.upstream import UpstreamFinetuner

    spec = _spec(epochs=12, checkpoint_epochs=(12,), lr=0.05,
                 model_options={**UPSTREAM, "finetuner": {"early_stopping_patience": 1}})
    results = _run(UpstreamFinetuner(spec, [task]), tmp_path)
    end = results[-1][1]
    assert end.stopped_early
    assert end.last_epoch < 12
    assert results[-1][0].epoch == end.last_epoch
    assert end.best_epoch is not None
    assert end.best_epoch < end.last_epoch


def test_own_loop_and_package_recipe_refuse_each_others_settings(task):
    from trainables.models import build_model

    with pytest.raises(ConfigError, match="UpstreamFinetuner"):
        Finetuner(_spec(), [task])
    with pytest.raises(Exception, match="n_estimators .* recipe 'upstream' only"):
        build_model("tabpfn-v2", **TINY, n_estimators=4)
    with pytest.raises(Exception, match="finetuner .* recipe 'upstream' only"):
        build_model("tabpfn-v2", **TINY, finetuner={"early_stopping": False})


def _sweep(**over) -> dict:
    sweep = {"name": "up", "tasks": [{"name": "iris"}],
             "models": [{"name": "tabpfn-v2", "recipe": "upstream", "options": TINY}],
             "wandb": {"mode": "disabled"}}
    return {**sweep, **over}


@pytest.mark.parametrize(("over", "message"), [
    ({"grid": {"regime": ["multi_fixed"]}}, r"grid.regime \['multi_fixed'\].*single_fixed only"),
    ({"grid": {"dp": [4.0]}}, "grid.dp.*no DP-SGD"),
    ({"canaries": {"kinds": ["outlier"]}}, "canaries.*cannot insert canary rows"),
    ({"models": [{"name": "pfn-mini", "recipe": "upstream"}]}, "models with one: tabicl, tabpfn-v2"),
    ({"models": [{"name": "tabpfn-v2", "recipe": "upstream", "options": {**TINY, "finetuner": {"learning_rate": 1}}}]},
     r"finetuner.learning_rate is set by iclmem from grid.lr"),
    ({"models": [{"name": "tabpfn-v2", "recipe": "upstream", "options": {**TINY, "finetuner": {"patience": 1}}}]},
     r"finetuner.patience is not a keyword of tabpfn.finetuning.FinetunedTabPFNClassifier; it takes: .*"
     r"early_stopping_patience"),
    ({"models": [{"name": "tabpfn-v2", "recipe": "iclmem", "options": {**TINY, "recipe": "upstream"}}]}, "disagree"),
    # inside TabPFN's extra_classifier_kwargs: iclmem's base weights, and its inference_config's fields and values
    ({"models": [{"name": "tabpfn-v2", "recipe": "upstream", "options": {
        **TINY, "finetuner": {"extra_classifier_kwargs": {"model_path": "/elsewhere.ckpt"}}}}]},
     r"options.finetuner.extra_classifier_kwargs.model_path is set by iclmem"),
    ({"models": [{"name": "tabpfn-v2", "recipe": "upstream", "options": {
        **TINY, "finetuner": {"extra_classifier_kwargs": {"inference_config": {"CLASS_SHIFT": None}}}}}]},
     r"options.finetuner.extra_classifier_kwargs.inference_config.CLASS_SHIFT is not a field of tabpfn's "
     r"InferenceConfig .*it has: .*CLASS_SHIFT_METHOD"),
    ({"models": [{"name": "tabpfn-v2", "recipe": "upstream", "options": {
        **TINY, "finetuner": {"extra_classifier_kwargs": {"inference_config": {"CLASS_SHIFT_METHOD": "sideways"}}}}}]},
     r"options.finetuner.extra_classifier_kwargs.inference_config.CLASS_SHIFT_METHOD: Input should be 'shuffle' "
     r"or 'rotate'"),
    ({"models": [{"name": "tabpfn-v2", "recipe": "upstream", "options": {
        **TINY, "finetuner": {"extra_classifier_kwargs": {"inference_config": {
            "PREPROCESS_TRANSFORMS": [{"name": "none", "categorical": "numeric"}]}}}}}]},
     r"inference_config.PREPROCESS_TRANSFORMS\[0\].categorical is not a field of tabpfn's PreprocessorConfig"),
])
def test_a_sweep_setting_the_package_fine_tuner_cannot_honour_is_refused_naming_it(over, message):
    with pytest.raises(ConfigError, match=message):
        parse_sweep(_sweep(**over))


# TabPFN's fine-tuner with its ensemble augmentation off: no class shift, no feature shift, no fingerprint feature,
# one preprocessing that leaves the numbers as they are, as a sweep file spells them
NO_AUGMENTATION = {"CLASS_SHIFT_METHOD": None, "FEATURE_SHIFT_METHOD": None, "FINGERPRINT_FEATURE": False,
                   "PREPROCESS_TRANSFORMS": [{"name": "none", "categorical_name": "numeric"}]}


def test_extra_classifier_kwargs_reach_the_tabpfn_fine_tuner_beside_the_base_weights(task, tmp_path):
    """A user's ``extra_classifier_kwargs`` are merged with the base weights iclmem sets there; a YAML mapping in
    ``PREPROCESS_TRANSFORMS`` reaches tabpfn as its ``PreprocessorConfig``; the model's options keep the mapping
    (the checkpoint's manifest records them as the sweep file wrote them)."""
    from tabpfn.preprocessing import PreprocessorConfig

    from trainables.upstream import UpstreamFinetuner

    finetuner = {"n_estimators_finetune": 1, "early_stopping": False,
                 "extra_classifier_kwargs": {"inference_config": NO_AUGMENTATION, "softmax_temperature": 0.5}}
    upstream = UpstreamFinetuner(_spec(model_options={**UPSTREAM, "finetuner": finetuner}), [task])
    base = upstream._base_file(tmp_path)
    built = upstream.recipe.build(upstream.finetuner_settings(), base, None)
    assert built.n_estimators_finetune == 1
    assert built.early_stopping is False
    assert built.random_state == 0  # the sweep's settings beside them
    extra = built.extra_classifier_kwargs
    assert extra["model_path"] == str(base)
    assert extra["softmax_temperature"] == 0.5
    config = extra["inference_config"]
    assert config["CLASS_SHIFT_METHOD"] is None
    assert config["FEATURE_SHIFT_METHOD"] is None
    assert config["FINGERPRINT_FEATURE"] is False
    assert config["PREPROCESS_TRANSFORMS"] == [PreprocessorConfig("none", categorical_name="numeric")]
    # the option itself is not converted in place
    assert upstream.model.options["finetuner"]["extra_classifier_kwargs"]["inference_config"] == NO_AUGMENTATION
    # a caller that builds the fine-tuner without a sweep file is checked as the sweep is
    with pytest.raises(ConfigError, match=r"extra_classifier_kwargs.inference_config.FINGERPRINT is not a field"):
        UpstreamFinetuner(_spec(model_options={**UPSTREAM, "finetuner": {
            "extra_classifier_kwargs": {"inference_config": {"FINGERPRINT": False}}}}), [task])


# each package's fine-tuner with its augmentation off, and the classifier it deploys after fitting
DEPLOYED = {
    "tabpfn-v2": {**UPSTREAM, "n_estimators": 3, "finetuner": {
        "early_stopping": False, "n_estimators_finetune": 1, "n_inference_subsample_samples": 40,
        "extra_classifier_kwargs": {"inference_config": NO_AUGMENTATION}}},
    "tabicl": {**RECIPES["tabicl"], "n_estimators": 3, "finetuner": {
        "early_stopping": False, "class_shuffle_method": "none", "feat_shuffle_method": "none", "norm_methods": "none",
        "n_estimators_finetune": 1, "softmax_temperature": 0.7}},
}


class _NoLogger:
    """The packages' experiment-logger hooks, doing nothing."""

    def setup(self, config: dict) -> None: ...

    def log_step(self, metrics: dict, step: int) -> None: ...

    def log_epoch(self, metrics: dict, step: int) -> None: ...

    def finish(self) -> None: ...


@pytest.mark.parametrize("model", sorted(DEPLOYED))
def test_the_deployed_classifier_is_the_one_the_package_fine_tuner_deploys(model, tmp_path):
    """The adapter's deployed classifier of an upstream run is the package fine-tuner's own after ``fit``
    (``finetuned_inference_classifier_`` / ``_final_estimator_``): the same keywords (but the file it loads and
    the device's spelling) and, on the fine-tuned weights and the same rows, the same probabilities; its
    ``random_state`` the run's seed (3 here), not the ``seed`` option's 0."""
    from trainables.upstream import UpstreamFinetuner, deployed_utility

    _require(model)
    task = prepare_task(TaskSource("breast_cancer", "builtin"), label_mode="shuffled_members", seed=3, q=32,
                        context_size=64)
    upstream = UpstreamFinetuner(_spec(model, model_options=DEPLOYED[model], epochs=1, seed=3), [task])
    x, y, x_val, y_val = upstream.training_rows()
    base = upstream._base_file(tmp_path)
    (tmp_path / "out").mkdir()
    package = upstream.recipe.build(upstream.finetuner_settings(), base, _NoLogger())
    package.fit(x, y, X_val=x_val, y_val=y_val, output_dir=tmp_path / "out")
    if model == "tabpfn-v2":
        theirs, weights = package.finetuned_inference_classifier_, package.finetuned_estimator_.models_[0]
    else:
        theirs, weights = package._final_estimator_, package.model_
    upstream.model.module.load_state_dict(weights.state_dict())  # the fine-tuned weights, as a checkpoint holds them
    upstream.model.deployed_random_state = 3
    ours = upstream.model.deployed_estimator()
    assert ours.random_state == 3
    expected, actual = theirs.get_params(), ours.get_params()
    differ = {k for k in set(expected) | set(actual) if expected.get(k) != actual.get(k)}
    assert differ <= {"model_path", "device"}, {k: (expected.get(k), actual.get(k)) for k in differ}
    assert str(actual["device"]) == "cpu"
    x_non = np.asarray(task.features, dtype=np.float32)[task.nonmember_idx]
    np.testing.assert_allclose(ours.fit(x, y).predict_proba(x_non), package.predict_proba(x_non), rtol=1e-4, atol=1e-6)
    # the run's utility as deployed reads the same classifier (the run's seed from the spec, the task's by default)
    upstream.model.deployed_random_state = None
    assert upstream.model.deployed_estimator().random_state == 0  # outside a scoring call: the seed option
    utility = deployed_utility(upstream.model, task)
    assert upstream.model.deployed_random_state is None  # put back
    assert utility == upstream.evaluate()


def test_the_recipe_is_part_of_the_model_identity():
    from orchestrator.schema.trials import expand_grid

    upstream = parse_sweep(_sweep())
    own = parse_sweep(_sweep(models=[{"name": "tabpfn-v2", "options": TINY}]))
    assert upstream.models[0].options["recipe"] == "upstream"
    assert "recipe" not in own.models[0].options
    assert upstream.config_hash() != own.config_hash()
    assert {t.run_id for t in expand_grid(upstream)}.isdisjoint({t.run_id for t in expand_grid(own)})
    # the spelling inside options is the same model
    inside = parse_sweep(_sweep(models=[{"name": "tabpfn-v2", "options": {**TINY, "recipe": "upstream"}}]))
    assert inside.models[0].recipe.value == "upstream"
    assert inside.models[0].options == upstream.models[0].options


@pytest.mark.slow
def test_a_sweep_of_the_upstream_recipes_runs_end_to_end_with_tune_checkpoints(ray_session, tmp_path):
    from orchestrator.driver.sweep import run_sweep

    models = [m for m in sorted(RECIPES) if extra_is_installed(m)]
    sweep = parse_sweep(_sweep(
        tasks=[{"name": "breast_cancer"}], grid={"lr": [1e-2], "q": [32], "label_mode": ["shuffled_members"]},
        models=[{"name": m, "recipe": "upstream", "options": {k: v for k, v in RECIPES[m].items() if k != "recipe"}}
                for m in models],
        data={"context_size": 64}, training={"epochs": 3, "checkpoint_epochs": [1, 3]},
        probe={"suite": ["base", "skew_true_x2", "distractors_1"], "bootstrap": 20},
        resources={"cpus_per_probe_actor": 0.5, "cpus_per_trial": 0.5}))
    results = run_sweep(None, tmp_path / "run", sweep=sweep, progress=False)
    assert sorted(results.groupby("model")["epoch"].apply(sorted).map(tuple).items()) == [(m, (0, 1, 3)) for m in models]
    assert all(json.loads(o)["recipe"] == "upstream" for o in results["model_options"])
    for column in ("deployed_member_icl_accuracy", "deployed_nonmember_icl_accuracy"):
        assert results[column].between(0, 1).all(), column
    controls = results[results["epoch"] == 0]
    assert (controls["auc"] == 0.5).all()  # the sanity check: the base model against itself, ΔS = 0
    assert (controls["outcome"] == "no_signal").all()
    tuned = results[results["epoch"] == 3]
    assert (tuned["loss_ratio"] != 1.0).all()  # the package's fine-tuning changed the models the probe scored
    # the known-context channel also as the package deploys the weights, on fine-tuned checkpoints only
    assert tuned["deployed_known_context_calibrated_auc"].between(0, 1).all()
    assert tuned["deployed_known_context_memorization_flag"].isin([True, False]).all()
    assert controls["deployed_known_context_calibrated_auc"].isna().all()
    assert (tuned["null_known_context_flags"] <= tuned["null_splits"]).all()
    # ... and its flag on every null split too (rows the run never saw): the deployed flag's false-positive rate is
    # measured through the same path, so the claim ledger states it with a rate (#56)
    records = [rec for raw in tuned["null_evidence"] for rec in json.loads(raw)]
    assert records
    assert all(isinstance(rec["deployed_known_context_flag"], bool) for rec in records)
    from orchestrator.runfolder.run_folder import RunFolder

    ledger = RunFolder(tmp_path / "run").claim_ledger()
    deployed = ledger[ledger["kind"] == "deployed_known_context_flag"]
    assert len(deployed) == len(models)
    assert (deployed["n_null"] > 0).all()
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "run" / "tune").rglob("checkpoint.json")]
    assert sorted((m["model"], m["epoch"]) for m in manifests) == sorted((m, e) for m in models for e in (1, 3))
    # the package's own checkpoint (what a resumed trial continues from) is recorded in every manifest; under the
    # default training.keep_checkpoints it was removed once its run finished, its record kept beside why
    assert all("upstream_state.pth" in {**m["files"], **m.get("removed", {})} for m in manifests)
    assert all(m["removed"]["upstream_state.pth"]["why"] == "training.keep_checkpoints: weights" for m in manifests)
    assert all(m["metrics"]["upstream_val_log_loss"] > 0 for m in manifests)
    for m in manifests:  # said once, with the package's last epoch
        assert ("stopped_early" in m["metrics"]) == (m["epoch"] == 3)
    assert all(m["metrics"]["stopped_early"] == 0 for m in manifests if m["epoch"] == 3)


@pytest.mark.slow
def test_a_crashed_upstream_trial_resumes_from_its_checkpoint_to_the_weights_of_an_uncrashed_one(
        ray_session, tmp_path, task):
    from fault_injection import faulty_upstream_trainable
    from ray import tune

    from trainables.models import read_weights

    def trial(run_id: str, **extra) -> dict:
        return {"run_id": run_id, "task_keys": [task.fingerprint], "identity": {"run_id": run_id},
                "finetune": {"model": "tabpfn-v2", "model_options": UPSTREAM, "regime": "single_fixed", "lr": 3e-3,
                             "epochs": 4, "checkpoint_epochs": [], "every_epoch": True, "seed": 0}, **extra}

    markers = tmp_path / "markers"
    markers.mkdir()
    configs = [trial("faulty", _fault_once_at_epoch=3, _fault_marker_dir=str(markers)), trial("clean")]
    grid = tune.Tuner(
        tune.with_parameters(faulty_upstream_trainable, prepared={task.fingerprint: task}),
        param_space={"__trial__": tune.grid_search(configs)},
        run_config=tune.RunConfig(name="upstream-faults", storage_path=str(tmp_path / "tune"), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=1)),
    ).fit()
    assert not grid.errors
    assert (markers / "fault_faulty").read_text() == "3"  # the fault fired
    by_id = {r.config["__trial__"]["run_id"]: r for r in grid}
    epochs = [json.loads(line)["epoch"] for line in (Path(by_id["faulty"].path) / "result.json").read_text().splitlines()
              if line.strip()]
    assert epochs == sorted(set(epochs)), epochs  # no epoch reported twice:
    assert epochs[-2:] == [3, 4], epochs  # resumed after epoch 2, not from 0
    weights = {}
    for run_id, result in by_id.items():
        with result.checkpoint.as_directory() as directory:
            weights[run_id] = read_weights(Path(directory) / "model.safetensors")
    for key, value in weights["clean"].items():
        assert torch.equal(value, weights["faulty"][key]), key


def test_the_estimate_times_the_package_fine_tuner_epoch_for_an_upstream_model():
    """``iclmem estimate`` on a recipe-upstream sweep times the package's epochs (its own loop would refuse)."""
    from orchestrator.estimate.estimate_measure import measure_unit_costs

    sweep = parse_sweep(_sweep(tasks=[{"name": "breast_cancer"}], grid={"q": [32]}, data={"context_size": 64},
                               probe={"suite": ["base", "distractors_1"], "bootstrap": 10}))
    model = sweep.models[0]
    costs = measure_unit_costs(sweep, model.name, dict(model.options), 32, sweep.tasks[0], "cpu", epochs=3)
    assert costs.epoch_s > 0
    assert costs.save_s > 0
    assert costs.model == "tabpfn-v2"
