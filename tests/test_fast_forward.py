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
    """Counts calls of F.scaled_dot_product_attention (the reference forward's attention; the inference
    forward never calls it)."""

    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        original = F.scaled_dot_product_attention

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(pfn_mini.F, "scaled_dot_product_attention", counted)


# (tables, context rows, query rows, features): 2-11 keys, 1 and several query rows, the oneDNN GELU product
# (>= 256 tokens) and a small forward (addmm + GELU).
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
    assert counter.calls == 0  # the compiled attention served every block, at every size


@pytest.mark.parametrize("n_features", [1, 7, 16])
@pytest.mark.parametrize("fast", [True, False], ids=["inference", "reference"])
def test_features_are_encoded_as_if_zero_padded_and_rescaled_to_max_features(shipped, n_features, fast):
    """pfn-mini reads F features as max_features (20) with the missing ones zero and all of them scaled by
    sqrt(20 / F): the inference forward reads only the F real features' weight columns, rescaled, the
    reference forward pads; both must give what the padded, rescaled input itself gives (where F = 20, no
    slice and a scale of 1)."""
    context_x, context_y, query_x, weight = _inputs(40, 5, 2, n_features, seed=n_features, weighted=True)
    max_features = shipped.module.config.max_features
    scale = (max_features / n_features) ** 0.5

    def padded(x):
        return F.pad(x, (0, max_features - n_features)) * scale

    as_given = _log_probs(shipped, fast, context_x, context_y, query_x, weight)
    as_padded = _log_probs(shipped, fast, padded(context_x), context_y, padded(query_x), weight)
    assert float((as_given - as_padded).abs().max()) <= TOLERANCE


@pytest.mark.parametrize("n_features", [0, 1, 2, 7, 16, 20])
def test_training_encoder_is_bit_identical_to_the_padded_product(n_features):
    """Fine-tuning on shuffled labels for hundreds of epochs diverges from a changed rounding within a few
    epochs, and the planted tests' verdicts with it: the encoder that training runs must give the padded
    product's logits and gradients bit for bit, not just to rounding, on every CPU. (A product over the real
    features' weight columns only, as the inference forward runs, gave other gradients for F = 1 and 2 on an
    AVX2-only machine, and the same on another.)"""
    module = build_model("pfn-mini", weights="random", seed=n_features).module
    x = torch.randn(64, 9, n_features, generator=torch.Generator().manual_seed(n_features))
    padded = F.pad(x, (0, 20 - n_features)) * (20 / max(n_features, 1)) ** 0.5
    encoded, reference = module._encode_features(x), module.x_encoder(padded)
    assert torch.equal(encoded, reference)
    (grad,) = torch.autograd.grad(encoded.square().sum(), module.x_encoder.weight)
    (reference_grad,) = torch.autograd.grad(reference.square().sum(), module.x_encoder.weight)
    assert torch.equal(grad, reference_grad)


def test_weights_equal_to_copies_of_rows(shipped):
    """A row of multiplicity 3 is 3 copies of it (the invariance the shortcut's [v | w] column keeps)."""
    context_x, context_y, query_x, _ = _inputs(120, 3, 1, 10, seed=5, weighted=False)
    weight = torch.tensor([3.0, 1.0, 2.0]).expand(120, 3)
    repeated = [0, 0, 0, 1, 2, 2]
    with torch.no_grad():
        weighted = shipped.log_probs(context_x, context_y, query_x, 3, context_weight=weight)
        copies = shipped.log_probs(context_x[:, repeated], context_y[:, repeated], query_x, 3)
    assert float((weighted - copies).abs().max()) <= TOLERANCE


def test_large_logits_keep_a_stable_softmax():
    """Attention logits in the hundreds (exp() would overflow float32 without the maximum subtracted)."""
    model = build_model("pfn-mini", weights="random", seed=4)
    with torch.no_grad():
        for block in model.module.blocks:
            block.qkv.weight.mul_(40.0)
    inputs = _inputs(100, 3, 1, 12, seed=1, weighted=True)
    reference = _log_probs(model, False, *inputs)
    fast = _log_probs(model, True, *inputs)
    assert torch.isfinite(reference).all()
    assert torch.isfinite(fast).all()
    assert float((fast - reference).abs().max()) <= TOLERANCE  # without the maximum subtracted: inf / inf = NaN


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


@pytest.mark.parametrize("n_context", [3, 8])
def test_zero_weight_padding_rows_change_nothing(shipped, n_context):
    """Rows of weight 0 appended to every context (what score's merged shape groups add) are no rows, in
    both forwards: the compiled attention's weight 0 on a key's term and the reference's log(0) = -inf bias."""
    context_x, context_y, query_x, weight = _inputs(100, n_context, 1, 18, seed=n_context, weighted=True)
    pad = 4
    padded_x = torch.cat([context_x, torch.zeros(100, pad, 18)], dim=1)
    padded_y = torch.cat([context_y, torch.zeros(100, pad, dtype=torch.int64)], dim=1)
    padded_w = torch.cat([weight, torch.zeros(100, pad)], dim=1)
    reference = _log_probs(shipped, False, context_x, context_y, query_x, weight)
    for fast in (True, False):
        out = _log_probs(shipped, fast, padded_x, padded_y, query_x, padded_w)
        assert float((out - reference).abs().max()) <= TOLERANCE


def test_merge_small_groups_keeps_every_context_once_within_one_feature_count():
    from probes.manipulations import PlanShape
    from probes.scoring import MERGE_BELOW, MERGE_MAX_PADDING, merge_small_groups

    assert 1000 * 3 >= MERGE_BELOW > 6 * 4

    groups = ((PlanShape(2, 16, 0), tuple(range(0, 1000))),  # large: untouched
              (PlanShape(3, 16, 2), tuple(range(1000, 1006))), (PlanShape(4, 16, 2), tuple(range(1006, 1021))),
              (PlanShape(5, 16, 2), tuple(range(1021, 1039))), (PlanShape(10, 16, 2), tuple(range(1039, 1042))),
              (PlanShape(4, 14, 0), tuple(range(1042, 1050))),  # another feature count: never with the others
              (PlanShape(30, 16, 2), tuple(range(1050, 1053))))  # far more rows: padding bound keeps it apart
    merged = merge_small_groups(groups)
    flat = sorted(i for _, idx in merged for i in idx)
    assert flat == list(range(1053))
    assert (PlanShape(2, 16, 0), tuple(range(1000))) in merged
    shape_of = {i: shape for shape, idx in groups for i in idx}
    for shape, idx in merged:
        assert len({shape_of[i].n_kept + shape_of[i].n_distractors for i in idx}) == 1
        assert shape.n_rows == max(shape_of[i].n_rows for i in idx)
        real = sum(shape_of[i].n_rows + 1 for i in idx)
        assert len(idx) * (shape.n_rows + 1) <= MERGE_MAX_PADDING * real or len({shape_of[i] for i in idx}) == 1
    assert len(merged) < len(groups)  # 3, 4, 5 rows merged
    assert any(len({shape_of[i] for i in idx}) > 1 for _, idx in merged)


def test_merged_score_table_is_the_unmerged_reference_table(shipped, monkeypatch):
    """score's shared forward calls (small groups padded and merged, calls packed with several shape groups)
    against one call per shape group and the reference forward."""
    task = prepare_task(TaskSource("breast_cancer", "builtin"), seed=0, q=6, context_size=40)
    plan = ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed,
                           compress_rows=shipped.supports_context_weights)
    calls: list[list[tuple[int, ...]]] = []  # per forward pass: the context_x shape of each batch
    single, many = shipped.log_probs, shipped.log_probs_many

    def counted(context_x, *args, **kwargs):
        calls.append([tuple(context_x.shape)])
        return single(context_x, *args, **kwargs)

    def counted_many(batches, n_classes):
        calls.append([tuple(b.context_x.shape) for b in batches])
        return many(batches, n_classes)

    monkeypatch.setattr(shipped, "log_probs", counted)
    monkeypatch.setattr(shipped, "log_probs_many", counted_many)
    merged = score(shipped, plan)
    merged_calls = list(calls)
    calls.clear()
    shipped.module.fast_inference = False
    try:
        reference = score(shipped, plan, merge=False)
    finally:
        shipped.module.fast_inference = True
    assert all(len(c) == 1 for c in calls)  # merge=False: one shape group per call
    assert len(merged_calls) < len(calls)  # shape groups did share calls
    assert any(len({shape[1:] for shape in c}) > 1 for c in merged_calls)  # of different shapes in one pass
    assert sum(s[0] for c in merged_calls for s in c) <= sum(s[0] for c in calls for s in c)  # each context once
    keys = ["query_id", "member", "manipulation", "category"]
    assert merged[keys].equals(reference[keys])
    for column in ("loss", "entropy", "confidence"):
        assert np.max(np.abs(merged[column].to_numpy() - reference[column].to_numpy())) <= TOLERANCE


def _every_token_through_every_block(module, context_x, context_y, query_x, weight):
    """pfn-mini's function computed the plain way (its forward before it skipped unread work): every
    token through every block, keys and values computed for every token and the context's used."""
    n_context = context_x.shape[1]
    tokens = torch.cat([module._encode_features(context_x) + module.y_embedding(context_y),
                        module._encode_features(query_x)], dim=1)
    key_bias = None if weight is None else weight.float().log()[:, None, None, :]
    batch, length, width = tokens.shape
    for block in module.blocks:
        q, k, v = block.qkv(block.norm_attn(tokens)).chunk(3, dim=-1)

        def heads(t, block=block):  # bound now: called within this iteration only
            return t.reshape(batch, t.shape[1], block.n_heads, -1).transpose(1, 2)

        attended = F.scaled_dot_product_attention(heads(q), heads(k[:, :n_context]), heads(v[:, :n_context]),
                                                  attn_mask=key_bias).transpose(1, 2).reshape(batch, length, width)
        tokens = tokens + block.out(attended)
        tokens = tokens + block.ff(block.norm_ff(tokens))
    return module.head(tokens[:, n_context:])


@pytest.mark.parametrize("shape", [(150, 2, 1, 16), (40, 7, 3, 9), (4, 3, 2, 5)], ids=lambda s: "x".join(map(str, s)))
def test_both_forwards_skip_only_work_the_output_never_reads(shipped, shape):
    """Keys and values of query rows and the last block's context rows are never computed; the logits
    are still those of every token through every block, with and without row weights."""
    for weighted in (False, True):
        inputs = _inputs(*shape, seed=7, weighted=weighted)
        with torch.no_grad():
            full = _every_token_through_every_block(shipped.module, *inputs)
            for fast in (True, False):
                shipped.module.fast_inference = fast
                try:
                    out = shipped.module(*inputs)
                finally:
                    shipped.module.fast_inference = True
                assert out.shape == full.shape
                assert float((out - full).abs().max()) <= TOLERANCE


def test_training_gradients_equal_those_of_every_token_through_every_block():
    module = build_model("pfn-mini", weights="random", seed=6).module.train()
    inputs = _inputs(30, 5, 2, 8, seed=4, weighted=True)
    labels = torch.randint(0, 3, (30 * 2,), generator=torch.Generator().manual_seed(1))
    grads = []
    for forward in (module, lambda *a: _every_token_through_every_block(module, *a)):
        module.zero_grad()
        F.cross_entropy(forward(*inputs)[..., :3].reshape(-1, 3), labels).backward()
        grads.append({name: p.grad.clone() for name, p in module.named_parameters()})
    for name, reference in grads[1].items():
        assert torch.allclose(grads[0][name], reference, rtol=1e-4, atol=1e-6), name


def test_reference_forward_counts_only_the_products_the_output_reads(shipped):
    """FLOPs of the reference forward (what the probe benchmark credits) = those of every token through
    every block minus the products skipped: each block's keys and values of the M query rows, and the last
    block's queries, output and feed-forward products of the N context rows. (FlopCounterMode credits SDPA's
    CPU kernel with no FLOPs, so the attention's few products count in neither.)"""
    from torch.utils.flop_counter import FlopCounterMode

    batch, n_context, n_query = 20, 4, 2
    inputs = _inputs(batch, n_context, n_query, 10, seed=2, weighted=False)
    config = shipped.module.config
    counts = []
    shipped.module.fast_inference = False
    try:
        for forward in (shipped.module, lambda *a: _every_token_through_every_block(shipped.module, *a)):
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                forward(*inputs)
            counts.append(counter.get_total_flops())
    finally:
        shipped.module.fast_inference = True
    assert counts[0] > 0
    assert counts[1] - counts[0] == pfn_mini.unread_products_flops(config, batch, n_context, n_query)


def test_forward_many_gives_each_batch_its_own_forward(shipped):
    """Batches of different table counts, row counts, query counts, feature counts and weights in one pass:
    each gets what its own reference forward gives, in order (keys never cross batches)."""
    batches = [_inputs(90, 2, 1, 16, seed=1, weighted=True), _inputs(3, 9, 2, 7, seed=2, weighted=False),
               _inputs(40, 5, 1, 20, seed=3, weighted=True), _inputs(1, 1, 1, 4, seed=4, weighted=False)]
    module = shipped.module
    with torch.no_grad():
        packed = module.forward_many(batches)
        module.fast_inference = False
        try:
            reference = [module(*b) for b in batches]
        finally:
            module.fast_inference = True
    assert [tuple(p.shape) for p in packed] == [tuple(r.shape) for r in reference] == [
        (90, 1, 10), (3, 2, 10), (40, 1, 10), (1, 1, 10)]
    for p, r in zip(packed, reference):
        assert float((p - r).abs().max()) <= TOLERANCE
    # the same batches with the second one's tables shuffled: only its own outputs move with them
    shuffled = list(batches)
    order = torch.tensor([2, 0, 1])
    shuffled[1] = (batches[1][0][order], batches[1][1][order], batches[1][2][order], None)
    with torch.no_grad():
        again = module.forward_many(shuffled)
    assert float((again[1] - packed[1][order]).abs().max()) <= TOLERANCE
    assert all(torch.equal(again[i], packed[i]) for i in (0, 2, 3))


def test_pack_groups_fills_calls_up_to_the_token_budget():
    from probes.manipulations import PlanShape
    from probes.scoring import pack_groups

    # tokens per context = rows + 1: 3, 5, 11 and 21 (larger than the budget of 20)
    groups = ((PlanShape(2, 16, 0), tuple(range(0, 9))), (PlanShape(4, 14, 0), tuple(range(9, 12))),
              (PlanShape(10, 16, 2), (12,)), (PlanShape(20, 16, 2), (13,)), (PlanShape(2, 16, 0), (14, 15)))
    calls = pack_groups(groups, max_tokens=20)
    assert calls == [[(0, 1, 2, 3, 4, 5)],  # 18 tokens; a 7th context would make 21
                     [(6, 7, 8), (9, 10)],  # 9 + 10 tokens
                     [(11,), (12,)],  # 5 + 11
                     [(13,)],  # 21 tokens: alone
                     [(14, 15)]]
    tokens = {i: shape.n_rows + 1 for shape, idx in groups for i in idx}
    for call in calls[:3] + calls[4:]:
        assert sum(tokens[i] for chunk in call for i in chunk) <= 20
    assert [i for call in calls for chunk in call for i in chunk] == list(range(16))


def test_only_models_without_per_call_hooks_pack_batches():
    """A packed call gets no column layout or reference statistics, so an adapter that packs must not read
    them (every adapter class that declares packs_batches, whether or not its package is installed)."""
    import trainables.models  # noqa: F401  (registers every adapter)
    from trainables.models.base import ModelAdapter

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    packing = [cls for cls in subclasses(ModelAdapter) if cls.packs_batches]
    assert packing, "pfn-mini packs its batches"
    for cls in packing:
        assert cls.column_layout is ModelAdapter.column_layout, cls.__name__
        assert not cls.normalizes_over_context, cls.__name__
