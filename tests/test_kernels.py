"""The compiled attention of pfn-mini's inference forward (trainables/models/kernels.py) against the
attention written out by hand and against SDPA, the reference forward's kernel."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trainables.models.kernels import context_attention


def _sdpa(q, k, v, batch, length, n_context, n_heads, weight):
    """What ContextAttentionBlock.forward computes: SDPA per table and head with a log-weight bias."""
    def heads(t, rows):
        return t.reshape(batch, rows, n_heads, -1).transpose(1, 2)

    bias = None if weight is None else weight.log()[:, None, None, :]
    out = F.scaled_dot_product_attention(heads(q, length), heads(k, n_context), heads(v, n_context), attn_mask=bias)
    return out.transpose(1, 2).reshape(batch * length, -1)


def test_one_table_by_hand():
    """One table, one head of width 1, two keys: softmax over the keys by hand, with row weights."""
    q = torch.tensor([[2.0]])
    k = torch.tensor([[0.5], [-1.0]])
    v = torch.tensor([[3.0], [7.0]])
    weight = torch.tensor([[1.0, 3.0]])
    out = torch.empty(1, 1)
    context_attention(q, k, v, 1, 1, 2, 1, weight, out)
    e0, e1 = 1.0 * math.exp(2.0 * 0.5), 3.0 * math.exp(2.0 * -1.0)  # logits q.k / sqrt(1), times the weights
    assert out.item() == pytest.approx((e0 * 3.0 + e1 * 7.0) / (e0 + e1), rel=1e-6)
    context_attention(q, k, v, 1, 1, 2, 1, None, out)
    e0, e1 = math.exp(1.0), math.exp(-2.0)
    assert out.item() == pytest.approx((e0 * 3.0 + e1 * 7.0) / (e0 + e1), rel=1e-6)


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "row_weights"])
@pytest.mark.parametrize(("batch", "length", "n_context"), [(50, 1, 2), (20, 3, 3), (7, 11, 11), (3, 40, 40), (5, 1, 1)])
def test_matches_sdpa_per_table_and_head(batch, length, n_context, weighted):
    g = torch.Generator().manual_seed(batch * 100 + length + n_context)
    q, k, v = (torch.randn(batch * rows, 128, generator=g) for rows in (length, n_context, n_context))
    weight = torch.randint(1, 5, (batch, n_context), generator=g).float() if weighted else None
    out = torch.full_like(q, float("nan"))
    context_attention(q, k, v, batch, length, n_context, 4, weight, out)
    assert float((out - _sdpa(q, k, v, batch, length, n_context, 4, weight)).abs().max()) <= 1e-5


@pytest.mark.parametrize("length", [1, 2, 5], ids=lambda n: f"{n}_rows")
def test_query_bias_is_added_to_every_query_row(length):
    """The query product's bias, given apart: the kernel on q with it equals the kernel (and SDPA) on q + bias,
    in the one-row loop and the two-row loop (odd and even rows)."""
    g = torch.Generator().manual_seed(length)
    batch, n_context = 9, 4
    q, k, v = (torch.randn(batch * rows, 128, generator=g) for rows in (length, n_context, n_context))
    bias = torch.randn(128, generator=g) * 3
    weight = torch.randint(1, 4, (batch, n_context), generator=g).float()
    with_bias = torch.empty_like(q)
    context_attention(q, k, v, batch, length, n_context, 4, weight, with_bias, query_bias=bias)
    added = torch.empty_like(q)
    context_attention(q + bias, k, v, batch, length, n_context, 4, weight, added)
    assert float((with_bias - added).abs().max()) <= 1e-5
    assert float((with_bias - _sdpa(q + bias, k, v, batch, length, n_context, 4, weight)).abs().max()) <= 1e-5
    context_attention(q, k, v, batch, length, n_context, 4, weight, added)  # without it: another attention
    assert float((with_bias - added).abs().max()) > 1e-2


def test_large_logits_and_zero_weights():
    """Logits of several hundred (exp overflows float32 unless the maximum is subtracted) and keys of
    weight 0 (no key at all: the padding rows of score's merged calls)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8 * 3, 128, generator=g) * 30 for _ in range(3))
    weight = torch.ones(8, 3)
    weight[:, 2] = 0.0
    out = torch.empty_like(q)
    context_attention(q, k, v, 8, 3, 3, 4, weight, out)
    assert torch.isfinite(out).all()
    without = torch.empty_like(q)
    keep = torch.arange(24).view(8, 3)[:, :2].reshape(-1)
    context_attention(q, k[keep].contiguous(), v[keep].contiguous(), 8, 3, 2, 4, None, without)
    assert float((out - without).abs().max()) <= 1e-4  # values of size ~30: float rounding only


def test_views_of_row_slices_write_only_their_rows():
    """forward_inference hands the kernel row slices of one token tensor: the rows outside stay as they were."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(30, 128, generator=g) for _ in range(3))
    out = torch.zeros(30, 128)
    context_attention(q[10:20], k[4:14], v[4:14], 5, 2, 2, 4, None, out[10:20])
    assert torch.equal(out[:10], torch.zeros(10, 128))
    assert torch.equal(out[20:], torch.zeros(10, 128))
    assert float((out[10:20] - _sdpa(q[10:20], k[4:14], v[4:14], 5, 2, 2, 4, None)).abs().max()) <= 1e-5


def test_refuses_what_it_cannot_read():
    q = torch.randn(4, 128)
    out = torch.empty(4, 128)
    with pytest.raises(ValueError, match="contiguous float32 CPU"):
        context_attention(q.t().contiguous().t(), q, q, 4, 1, 1, 4, None, out)
    with pytest.raises(ValueError, match="contiguous float32 CPU"):
        context_attention(q.double(), q, q, 4, 1, 1, 4, None, out)
    with pytest.raises(ValueError, match="do not fit 2 tables"):
        context_attention(q, q, q, 2, 1, 1, 4, None, out)
    with pytest.raises(ValueError, match="do not fit 4 tables"):
        context_attention(q, q, q, 4, 1, 1, 4, torch.ones(4, 2), out)  # weights of 2 keys per table, not 1
    with pytest.raises(ValueError, match="query_bias \\(64,\\) do not fit"):
        context_attention(q, q, q, 4, 1, 1, 4, None, out, query_bias=torch.zeros(64))
