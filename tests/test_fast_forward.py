"""pfn-mini's CPU inference forward (``ContextAttentionBlock.forward_inference``) against the reference
``forward``: same log-probs to rounding, same score tables, and training still on the autograd path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import trainables.models.pfn_mini as pfn_mini
from probes.manipulations import default_suite
from probes.scoring import ProbePlan, ProbeQueries, score
from trainables.data import TaskSource, prepare_task
from trainables.models import build_model

TOLERANCE = 1e-5  # max |difference| of log-probs allowed between the two forwards


@pytest.fixture(scope="module")
def shipped():
    return build_model("pfn-mini")


def _inputs(batch: int, n_context: int, n_query: int, n_features: int, seed: int, weighted: bool):
    g = torch.Generator().manual_seed(seed)
    context_x = torch.randn(batch, n_context, n_features, generator=g)
    context_y = torch.randint(0, 3, (batch, n_context), generator=g)
    query_x = torch.randn(batch, n_query, n_features, generator=g)
    weight = torch.randint(1, 5, (batch, n_context), generator=g).float() if weighted else None
    return context_x, context_y, query_x, weight


def _log_probs(model, fast: bool, context_x, context_y, query_x, weight):
    model.module.fast_inference = fast
    try:
        with torch.no_grad():
            return model.log_probs(context_x, context_y, query_x, 3, context_weight=weight)
    finally:
        model.module.fast_inference = True


class _SdpaCounter:
    """Counts calls of F.scaled_dot_product_attention (the inference forward's fallback)."""

    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        original = F.scaled_dot_product_attention

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(pfn_mini.F, "scaled_dot_product_attention", counted)


# (tables, context rows, query rows, features): both attention layouts (cross-head below 6 keys, per head
# from 6), 1 and several query rows, the oneDNN GELU product (>= 256 tokens) and a small forward (SDPA).
SHAPES = [(150, 2, 1, 16), (100, 3, 2, 7), (60, 5, 1, 20), (40, 6, 1, 16), (30, 11, 1, 16), (24, 8, 3, 5), (4, 4, 1, 9)]


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "row_weights"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_inference_forward_gives_the_reference_log_probs(shipped, shape, weighted, monkeypatch):
    batch, n_context, n_query, n_features = shape
    inputs = _inputs(batch, n_context, n_query, n_features, seed=sum(shape), weighted=weighted)
    reference = _log_probs(shipped, False, *inputs)
    counter = _SdpaCounter(monkeypatch)
    fast = _log_probs(shipped, True, *inputs)
    assert fast.shape == reference.shape == (batch, n_query, 3)
    assert float((fast - reference).abs().max()) <= TOLERANCE
    assert torch.equal(fast.argmax(-1), reference.argmax(-1))
    # the shortcut really ran (no silent SDPA fallback) wherever it is meant to
    large = batch * (n_context + n_query) >= pfn_mini._SHORTCUT_MIN_ROWS
    assert counter.calls == (0 if large else shipped.module.config.n_layers)


def test_weights_equal_to_copies_of_rows(shipped):
    """A row of multiplicity 3 is 3 copies of it (the invariance the shortcut's [v | w] column keeps)."""
    context_x, context_y, query_x, _ = _inputs(120, 3, 1, 10, seed=5, weighted=False)
    weight = torch.tensor([3.0, 1.0, 2.0]).expand(120, 3)
    repeated = [0, 0, 0, 1, 2, 2]
    with torch.no_grad():
        weighted = shipped.log_probs(context_x, context_y, query_x, 3, context_weight=weight)
        copies = shipped.log_probs(context_x[:, repeated], context_y[:, repeated], query_x, 3)
    assert float((weighted - copies).abs().max()) <= TOLERANCE


def test_large_logits_fall_back_to_sdpa_and_still_match(monkeypatch):
    model = build_model("pfn-mini", weights="random", seed=4)
    with torch.no_grad():
        for block in model.module.blocks:
            block.qkv.weight.mul_(40.0)  # logits far beyond _MAX_LOGIT
    inputs = _inputs(100, 3, 1, 12, seed=1, weighted=True)
    reference = _log_probs(model, False, *inputs)
    counter = _SdpaCounter(monkeypatch)
    fast = _log_probs(model, True, *inputs)
    assert counter.calls > 0
    assert float((fast - reference).abs().max()) <= TOLERANCE


def test_score_table_is_the_reference_table(shipped):
    task = prepare_task(TaskSource("iris", "builtin"), seed=0, q=12, context_size=40)
    plan = ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed,
                           compress_rows=shipped.supports_context_weights)
    fast = score(shipped, plan)
    shipped.module.fast_inference = False
    try:
        reference = score(shipped, plan)
    finally:
        shipped.module.fast_inference = True
    keys = ["query_id", "member", "manipulation", "category"]
    assert fast[keys].equals(reference[keys])
    for column in ("loss", "entropy", "confidence"):
        assert np.max(np.abs(fast[column].to_numpy() - reference[column].to_numpy())) <= TOLERANCE


def test_training_keeps_the_autograd_forward_and_its_gradients():
    model = build_model("pfn-mini", weights="random", seed=2)
    module = model.module.train()
    context_x, context_y, query_x, weight = _inputs(100, 4, 1, 8, seed=3, weighted=True)
    with torch.no_grad():
        assert module.uses_fast_inference(torch.zeros(1, 1, 1))
        no_grad_out = module(context_x, context_y, query_x, weight)
    assert not no_grad_out.requires_grad
    assert not module.uses_fast_inference(torch.zeros(1, 1, 1))  # grad enabled: the reference forward
    out = module(context_x, context_y, query_x, weight)
    loss = F.cross_entropy(out[:, 0, :3], torch.randint(0, 3, (100,), generator=torch.Generator().manual_seed(0)))
    loss.backward()
    grads = {name: p.grad for name, p in module.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert all(float(g.abs().sum()) > 0 for g in grads.values())
    assert float((out.detach() - no_grad_out).abs().max()) <= TOLERANCE  # same function either way
