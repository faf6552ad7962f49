"""Controlled fine-tuning as pure torch: regimes, schedule, divergence, bit-exact resume, planted signal."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from iclmem.errors import ConfigError
from trainables.data import PrepSettings, TaskSource, prepare_task
from trainables.finetune import Finetuner, FinetuneSpec, Regime, fixed_batch, load_checkpoint_model, random_batch


@pytest.fixture(scope="module")
def shuffled_task():
    return prepare_task(TaskSource("breast_cancer", "builtin"), label_mode="shuffled_members", seed=0, q=50, context_size=128)


@pytest.fixture(scope="module")
def iris_task():
    return prepare_task(TaskSource("iris", "builtin"), seed=0, q=30, context_size=60)


def _weights(finetuner: Finetuner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in finetuner.model.module.state_dict().items()}


def test_schedule_is_capped_by_epochs_and_ends_with_the_last_epoch():
    assert FinetuneSpec(epochs=30).schedule() == (1, 2, 5, 10, 25, 30)
    assert FinetuneSpec(epochs=500).schedule() == (1, 2, 5, 10, 25, 50, 100, 250, 500)
    assert FinetuneSpec(epochs=3, every_epoch=True).schedule() == (1, 2, 3)


def test_invalid_learning_rate_is_refused():
    with pytest.raises(ConfigError, match="lr must be a positive"):
        FinetuneSpec(lr=0.0)


def test_single_fixed_steps_on_the_fixed_context_and_member_queries(shuffled_task):
    batch = fixed_batch(shuffled_task)
    assert batch.context_x.shape == (1, 128, shuffled_task.n_features)
    assert batch.query_x.shape == (1, 50, shuffled_task.n_features)
    np.testing.assert_array_equal(batch.query_y[0].numpy(), shuffled_task.labels[shuffled_task.member_idx])
    np.testing.assert_array_equal(batch.context_y[0].numpy(), shuffled_task.labels[shuffled_task.context_idx])


def test_multi_random_draws_a_fresh_uniform_context_and_q_queries_from_the_member_pool_every_epoch():
    # Stage I gives multi_random its Q members together with C' as the pool (here 20 + 60) and as many
    # non-members, C''s label counts included
    pool_task = prepare_task(TaskSource("breast_cancer", "builtin"), PrepSettings(context_size=60, context_in_pool=True),
                             seed=0, q=20)
    assert set(pool_task.context_idx) <= set(pool_task.member_idx)
    assert len(pool_task.member_idx) == 80
    assert np.array_equal(np.bincount(pool_task.labels[pool_task.member_idx]),
                          np.bincount(pool_task.labels[pool_task.nonmember_idx]))
    first, second = random_batch(pool_task, 1, 0, n_queries=20), random_batch(pool_task, 2, 0, n_queries=20)
    assert not torch.equal(first.context_x, second.context_x)
    # C' is uniform (30 + 30) and the proportional members add both classes: the full 60-row uniform context
    # is drawn from the pool every epoch (with the members alone it had held 29 of each, the minority's pool)
    assert first.query_x.shape[1] == 20
    assert first.context_x.shape[1] == 60
    assert np.bincount(first.context_y[0].numpy(), minlength=2).tolist() == [30, 30]
    assert set(first.query_y[0].numpy()) == {0, 1}
    members = {tuple(r) for r in np.asarray(pool_task.features)[pool_task.member_idx]}
    for rows in (first.context_x[0], first.query_x[0]):
        assert all(tuple(r) in members for r in rows.numpy())  # every row drawn is a member
    assert torch.equal(random_batch(pool_task, 1, 0, n_queries=20).context_x, first.context_x)  # seeded


def test_single_fixed_refuses_several_tasks(iris_task):
    with pytest.raises(ConfigError, match="exactly one task"):
        Finetuner(FinetuneSpec(model_options={"weights": "random"}), [iris_task, iris_task])


def test_nan_loss_marks_the_run_diverged_and_leaves_weights_untouched(iris_task):
    finetuner = Finetuner(FinetuneSpec(model_options={"weights": "random"}, epochs=3), [iris_task])
    before = _weights(finetuner)
    bad = finetuner._fixed[0]
    finetuner._fixed = [dataclasses.replace(bad, query_x=torch.full_like(bad.query_x, float("nan")))]
    result = finetuner.run_epoch()
    assert result.diverged
    assert np.isnan(result.train_loss)
    for key, value in _weights(finetuner).items():
        assert torch.equal(value, before[key])


def test_resume_from_a_checkpoint_is_bit_exact(iris_task, tmp_path):
    spec = FinetuneSpec(lr=1e-3, epochs=6, seed=4)
    straight = Finetuner(spec, [iris_task])
    straight.train()

    first = Finetuner(spec, [iris_task])
    for _ in range(3):
        first.run_epoch()
    first.save(tmp_path / "ckpt")
    torch.manual_seed(12345)  # a restarted process has another RNG state; restore must overwrite it
    resumed = Finetuner(spec, [iris_task])
    resumed.restore(tmp_path / "ckpt")
    assert resumed.epoch == 3
    resumed.train()
    for key, value in _weights(straight).items():
        assert torch.equal(value, resumed.model.module.state_dict()[key]), key


def test_checkpoint_folder_loads_back_as_the_fine_tuned_model(iris_task, tmp_path):
    finetuner = Finetuner(FinetuneSpec(lr=1e-3, epochs=2), [iris_task])
    finetuner.train()
    finetuner.save(tmp_path / "c")
    loaded = load_checkpoint_model(tmp_path / "c")
    for key, value in finetuner.model.module.state_dict().items():
        assert torch.equal(value, loaded.module.state_dict()[key])


def test_shuffled_member_labels_are_memorized_while_the_base_model_stays_near_chance(shuffled_task):
    """Planted signal: the model memorizes labels it cannot learn from the features."""
    finetuner = Finetuner(FinetuneSpec(lr=1e-3, epochs=40, seed=0), [shuffled_task])
    base = finetuner.evaluate()
    finetuner.train()
    tuned = finetuner.evaluate()
    labels = shuffled_task.labels[shuffled_task.member_idx]
    chance = float(np.sum((np.bincount(labels) / len(labels)) ** 2))
    assert base["member_icl_accuracy"] < chance + 0.15
    assert tuned["member_icl_accuracy"] >= 0.95
    # ... and it has not learned a rule that transfers: the non-members (scored, like the members, on labels
    # permuted among themselves) stay near chance
    assert tuned["nonmember_icl_accuracy"] < chance + 0.15


def test_regime_values_are_the_spec_vocabulary():
    # the spec's three fine-tuning regimes, and iclmem's deployed-context audit, which fine-tunes nothing
    assert [r.value for r in Regime] == ["single_fixed", "multi_fixed", "multi_random", "context"]
    with pytest.raises(ConfigError, match="regime context fine-tunes nothing"):
        FinetuneSpec(regime=Regime.CONTEXT)
