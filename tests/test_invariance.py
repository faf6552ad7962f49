"""Declared model invariances and the probe shortcut that scores contexts identical under them once."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch

import probes.calibration
import probes.probe
from probes.calibration import model_digest
from probes.manipulations import MANIPULATIONS, apply, default_suite, rng_for
from probes.probe import ProbeSettings, probe_checkpoint
from probes.scoring import ProbePlan, ProbeQueries, canonical_context, score
from trainables.data import TaskSource, prepare_task
from trainables.finetune import Finetuner, FinetuneSpec
from trainables.models import build_model
from trainables.models.base import Invariance

TABICL_TINY = dict(embed_dim=16, col_num_blocks=1, col_nhead=2, col_num_inds=8, row_num_blocks=1, row_nhead=2,
                   row_num_cls=2, icl_num_blocks=1, icl_nhead=2, zero_init=False)
TABPFN_TINY = dict(emsize=16, nlayers=1, nhead=2)
ADAPTERS = {
    "pfn-mini": ("pfn-mini", dict(weights="shipped"), None),
    "tabicl": ("tabicl", dict(weights="random", **TABICL_TINY), "tabicl"),
    "tabpfn-v2": ("tabpfn-v2", dict(weights="random", **TABPFN_TINY), "tabpfn"),
}


def _adapter(key: str):
    name, options, package = ADAPTERS[key]
    if package:
        pytest.importorskip(package)
    model = build_model(name, **options)
    if name != "pfn-mini":
        # Random init zero-initialises output layers (TabPFN v2 then predicts one constant for every
        # input); give every weight a value so the function depends on its inputs.
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in model.module.parameters():
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    model.module.eval()
    return model


def _inputs(n_rows: int = 9, n_classes: int = 3):
    generator = torch.Generator().manual_seed(1)
    context_x = torch.randn(2, n_rows, 5, generator=generator)
    context_y = torch.stack([torch.randperm(n_rows, generator=generator) % n_classes for _ in range(2)])
    query_x = torch.randn(2, 4, 5, generator=generator)
    return context_x, context_y, query_x, n_classes


@pytest.mark.parametrize("key", sorted(ADAPTERS))
@torch.no_grad()
def test_each_declared_invariance_holds_on_the_adapters_architecture(key):
    model = _adapter(key)
    context_x, context_y, query_x, n_classes = _inputs()
    reference = model.log_probs(context_x, context_y, query_x, n_classes)
    assert reference.std(dim=1).max() > 1e-3, "the model ignores its input: the check would prove nothing"
    declared = model.invariances
    assert declared, f"{key} declares no invariance"
    if Invariance.UNIFORM_MULTIPLICITY in declared:
        assert Invariance.ROW_ORDER in declared
    if Invariance.ROW_ORDER in declared:
        order = torch.randperm(context_x.shape[1], generator=torch.Generator().manual_seed(2))
        permuted = model.log_probs(context_x[:, order], context_y[:, order], query_x, n_classes)
        torch.testing.assert_close(permuted, reference, atol=1e-5, rtol=1e-5)
    if Invariance.UNIFORM_MULTIPLICITY in declared:
        tripled = model.log_probs(context_x.repeat(1, 3, 1), context_y.repeat(1, 3), query_x, n_classes)
        torch.testing.assert_close(tripled, reference, atol=1e-5, rtol=1e-5)
        if model.supports_context_weights:
            weights = torch.full(context_y.shape, 4.0)
            weighted = model.log_probs(context_x, context_y, query_x, n_classes, context_weight=weights)
            torch.testing.assert_close(weighted, reference, atol=1e-5, rtol=1e-5)


def test_tabicl_is_not_declared_uniform_multiplicity_invariant_because_repeating_rows_moves_it():
    model = _adapter("tabicl")
    context_x, context_y, query_x, n_classes = _inputs()
    with torch.no_grad():
        once = model.log_probs(context_x, context_y, query_x, n_classes)
        tripled = model.log_probs(context_x.repeat(1, 3, 1), context_y.repeat(1, 3), query_x, n_classes)
    assert (once - tripled).abs().max() > 1e-4
    assert Invariance.UNIFORM_MULTIPLICITY not in model.invariances


def _plan(name: str, true_label: int = 1, n_classes: int = 3, query_id: int = 7):
    return apply(MANIPULATIONS.get(name), true_label, n_classes, 6, rng_for(0, query_id, name))


def test_position_moves_are_the_base_context_only_under_row_order():
    base, first = _plan("base"), _plan("position_first")
    assert not np.array_equal(base.labels, first.labels)
    assert canonical_context(base, None) != canonical_context(first, None)
    assert canonical_context(base, None, {"row_order"}) == canonical_context(first, None, {"row_order"})


def test_uniform_scaling_is_the_base_context_only_under_uniform_multiplicity():
    base, scaled = _plan("base"), _plan("scale_uniform_x5")
    row_order = {"row_order"}
    both = {"row_order", "uniform_multiplicity"}
    assert canonical_context(base, None, row_order) != canonical_context(scaled, None, row_order)
    assert canonical_context(base, None, both) == canonical_context(scaled, None, both)
    # as compressed rows with multiplicities, the same
    assert canonical_context(base.__class__(np.arange(3), base.keep_columns, np.zeros((4, 0), np.float32)),
                             np.full(3, 5.0, np.float32), both) == canonical_context(base, None, both)
    # a skewed context is not a uniform scaling of the base
    assert canonical_context(_plan("skew_true_x2"), None, both) != canonical_context(base, None, both)


def test_contexts_with_other_distractor_values_or_columns_never_merge():
    both = {"row_order", "uniform_multiplicity"}
    keys = {canonical_context(_plan(n), None, both) for n in
            ("base", "distractors_1", "combo2_random_distractors_1", "distractors_2", "drop_features_a")}
    assert len(keys) == 5


@pytest.fixture(scope="module")
def task():
    return prepare_task(TaskSource("breast_cancer", "builtin"), seed=0, q=30, context_size=64)


def test_shortcut_forwards_each_representative_once_and_copies_its_scores(task):
    model = build_model("pfn-mini")
    plan = ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed, compress_rows=True)
    forwarded = []
    original, original_many = model.log_probs, model.log_probs_many

    def counting(context_x, *args, **kwargs):
        forwarded.append(context_x.shape[0])
        return original(context_x, *args, **kwargs)

    def counting_many(batches, n_classes):  # score's packed CPU calls
        forwarded.extend(b.context_x.shape[0] for b in batches)
        return original_many(batches, n_classes)

    model.log_probs, model.log_probs_many = counting, counting_many
    fast = score(model, plan)
    n_fast = sum(forwarded)
    forwarded.clear()
    full = score(model, plan, shortcut=False)
    rep = plan.representatives(model.invariances)
    assert sum(forwarded) == len(plan.planned) == len(full)
    assert n_fast == int((rep == np.arange(rep.size)).sum()) < len(plan.planned)
    # every position move and uniform scaling of a query is scored as that query's base context
    base = fast[fast.manipulation == "base"].set_index("query_id")["loss"]
    for name in ("position_first", "position_last", "position_random", "scale_uniform_x10"):
        moved = fast[fast.manipulation == name].set_index("query_id")["loss"]
        np.testing.assert_array_equal(moved.loc[base.index].to_numpy(), base.to_numpy())
    for column in ("loss", "entropy", "confidence"):
        np.testing.assert_allclose(fast[column], full[column], atol=2e-5, rtol=1e-5)


def test_shortcut_gives_the_same_scores_and_verdicts_as_the_full_computation(task, tmp_path, monkeypatch):
    base = build_model("pfn-mini")
    finetuner = Finetuner(FinetuneSpec(epochs=25, lr=3e-3), [task])
    finetuner.train()
    model = finetuner.model
    plan = ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed,
                           compress_rows=base.supports_context_weights)
    assert plan.forwards_saved(model.invariances) > 0.2
    digest = model_digest(base)
    settings = ProbeSettings(n_resamples=200)
    results = {}
    for shortcut in (True, False):
        scorer = functools.partial(score, shortcut=shortcut)
        monkeypatch.setattr(probes.probe, "score", scorer)  # the fine-tuned model's scores
        monkeypatch.setattr(probes.calibration, "score", scorer)  # the reference model's scores
        results[shortcut] = probe_checkpoint(model, task, plan, tmp_path / f"ref_{shortcut}", digest, base, settings,
                                             {"run_id": "r"}, 25)
    fast, full = results[True].row, results[False].row
    assert fast["outcome"] == full["outcome"]
    for key in ("score_kind", "raw_outcome", "raw_memorization_flag", "calibrated_memorization_flag"):
        assert fast[key] == full[key], key
    fast_reasons, full_reasons = json.loads(fast["reasons"]), json.loads(full["reasons"])
    assert fast_reasons.keys() == full_reasons.keys()
    for key, value in full_reasons.items():  # the checks and the figures behind them
        if isinstance(value, float):
            assert fast_reasons[key] == pytest.approx(value, abs=1e-4), key
        else:
            assert fast_reasons[key] == value, key
    for key in ("auc", "raw_auc", "ref_auc", "mu_gap", "sigma_gap", "tpr_at_1pct", "tpr_at_10pct"):
        assert fast[key] == pytest.approx(full[key], abs=1e-4), key
    np.testing.assert_allclose(results[True].manipulation_auc["auc"], results[False].manipulation_auc["auc"], atol=1e-4)
