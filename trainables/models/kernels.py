"""Compiled CPU kernels for pfn-mini's inference forward (``ContextAttentionBlock.forward_inference``).

pfn-mini's attention runs over tiny tables (2-40 keys per table, thousands of tables per forward call):
a handful of FLOPs per (table, head), which eager PyTorch spends as a dozen batched ops with per-matrix
overhead each. Here one loop does a whole call's attention, every (query row, head) in registers: logits,
the softmax (maximum subtracted, as SDPA does) and the weighted sum of values, straight into the output.

Compiled by numba on first use in a process (about a second) and cached on disk next to this file
(``__pycache__``), so later processes -- probe actors, Ray workers -- load it instead. Single-threaded:
probe actors run one torch thread each.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


def _attention(q: np.ndarray, query_bias: np.ndarray, k: np.ndarray, v: np.ndarray, weight: np.ndarray, weighted: bool,
               batch: int, length: int, n_context: int, n_heads: int, out: np.ndarray
               ) -> None:  # pragma: no cover (compiled)
    width = q.shape[1]
    head_dim = width // n_heads
    scale = np.float32(1.0 / math.sqrt(head_dim))
    logits = np.empty(n_context, np.float32)
    acc = np.empty(head_dim, np.float32)
    query = np.empty(head_dim, np.float32)
    for b in range(batch):
        first_key = b * n_context
        for row in range(b * length, (b + 1) * length):
            for h in range(n_heads):
                c0 = h * head_dim
                for d in range(head_dim):  # the query product's bias added as the row is read
                    query[d] = q[row, c0 + d] + query_bias[c0 + d]
                top = np.float32(-np.inf)
                for j in range(n_context):
                    key = k[first_key + j, c0:c0 + head_dim]
                    s = np.float32(0.0)
                    for d in range(head_dim):
                        s += query[d] * key[d]
                    s *= scale
                    logits[j] = s
                    if s > top and not (weighted and weight[b, j] == 0.0):  # a weight-0 key is no key (SDPA: -inf)
                        top = s
                denominator = np.float32(0.0)
                acc[:] = 0.0
                for j in range(n_context):
                    if weighted and weight[b, j] == 0.0:
                        continue  # not 0 * exp(): a weight-0 key's logit may lie far above the others'
                    p = np.exp(logits[j] - top)
                    if weighted:
                        p *= weight[b, j]
                    denominator += p
                    value = v[first_key + j, c0:c0 + head_dim]
                    for d in range(head_dim):
                        acc[d] += p * value[d]
                inverse = np.float32(1.0) / denominator
                written = out[row, c0:c0 + head_dim]
                for d in range(head_dim):
                    written[d] = acc[d] * inverse


def _attention_pairs(q: np.ndarray, query_bias: np.ndarray, k: np.ndarray, v: np.ndarray, weight: np.ndarray,
                     weighted: bool, batch: int, length: int, n_context: int, n_heads: int, out: np.ndarray
                     ) -> None:  # pragma: no cover
    # _attention for tables of >= 2 query rows, two rows at a time: each key and value row loaded once for
    # both (measured 13-24% faster at 2-33 rows per table; slower at 1 row, which _attention keeps). An odd
    # last row pairs with itself: computed twice, written once.
    width = q.shape[1]
    head_dim = width // n_heads
    scale = np.float32(1.0 / math.sqrt(head_dim))
    logits = np.empty((2, n_context), np.float32)
    acc0 = np.empty(head_dim, np.float32)
    acc1 = np.empty(head_dim, np.float32)
    q0 = np.empty(head_dim, np.float32)
    q1 = np.empty(head_dim, np.float32)
    for b in range(batch):
        first_key = b * n_context
        end = (b + 1) * length
        for row in range(b * length, end, 2):
            other = min(row + 1, end - 1)
            for h in range(n_heads):
                c0 = h * head_dim
                for d in range(head_dim):
                    q0[d] = q[row, c0 + d] + query_bias[c0 + d]
                    q1[d] = q[other, c0 + d] + query_bias[c0 + d]
                top0 = np.float32(-np.inf)
                top1 = np.float32(-np.inf)
                for j in range(n_context):
                    key = k[first_key + j, c0:c0 + head_dim]
                    s0 = np.float32(0.0)
                    s1 = np.float32(0.0)
                    for d in range(head_dim):
                        s0 += q0[d] * key[d]
                        s1 += q1[d] * key[d]
                    s0 *= scale
                    s1 *= scale
                    logits[0, j] = s0
                    logits[1, j] = s1
                    if not (weighted and weight[b, j] == 0.0):  # a weight-0 key is no key (SDPA: -inf)
                        top0 = max(top0, s0)
                        top1 = max(top1, s1)
                denominator0 = np.float32(0.0)
                denominator1 = np.float32(0.0)
                acc0[:] = 0.0
                acc1[:] = 0.0
                for j in range(n_context):
                    if weighted and weight[b, j] == 0.0:
                        continue  # not 0 * exp(): a weight-0 key's logit may lie far above the others'
                    p0 = np.exp(logits[0, j] - top0)
                    p1 = np.exp(logits[1, j] - top1)
                    if weighted:
                        p0 *= weight[b, j]
                        p1 *= weight[b, j]
                    denominator0 += p0
                    denominator1 += p1
                    value = v[first_key + j, c0:c0 + head_dim]
                    for d in range(head_dim):
                        acc0[d] += p0 * value[d]
                        acc1[d] += p1 * value[d]
                inverse0 = np.float32(1.0) / denominator0
                inverse1 = np.float32(1.0) / denominator1
                for d in range(head_dim):
                    out[row, c0 + d] = acc0[d] * inverse0
                    out[other, c0 + d] = acc1[d] * inverse1


@functools.cache
def _compiled(pairs: bool) -> Callable[..., None]:
    import numba  # imported on first use: ~0.3 s that processes which never probe on CPU do not pay

    # reassoc: the dot products and sums over a head's 32 dimensions vectorise (float rounding only, like
    # any BLAS); no fast-math beyond it, and numpy's error model (0/0 is NaN, not an exception), so NaN and
    # infinities propagate as in SDPA
    return numba.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy",
                      fastmath={"reassoc", "contract"})(_attention_pairs if pairs else _attention)


_NO_WEIGHT = np.ones((1, 1), dtype=np.float32)


def context_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int, length: int, n_context: int,
                      n_heads: int, weight: torch.Tensor | None, out: torch.Tensor,
                      query_bias: torch.Tensor | None = None) -> None:
    """softmax(q' k^T / sqrt(Dh)) v per table and head, q' = q + ``query_bias`` (each row), with each key's
    softmax term scaled by its row's ``weight`` (= a log-weight bias on its logit, as
    ``ContextAttentionBlock.forward`` gives SDPA), into ``out``. The query product's bias is added here, as
    each query row is read, so that the product need not copy it into its output first (measured 1-2% less
    forward time on the probe).

    q, out: [B*L, D] (L query rows per table, table-major); k, v: [B*N, D] (N keys per table); weight: [B, N]
    or None; query_bias: [D] or None (zero); D = n_heads * Dh. All C-contiguous float32 on the CPU (row slices
    of contiguous tensors are)."""
    tensors: dict[str, Any] = {"q": q, "k": k, "v": v, "out": out}
    if weight is not None:
        tensors["weight"] = weight
    if query_bias is not None:
        tensors["query_bias"] = query_bias
    for name, t in tensors.items():
        if t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"context_attention takes contiguous float32 CPU tensors; {name} is {t.dtype} on "
                             f"{t.device}, contiguous={t.is_contiguous()}")
    if (q.shape[0] != batch * length or k.shape[0] != batch * n_context or v.shape != k.shape or out.shape != q.shape
            or (weight is not None and tuple(weight.shape) != (batch, n_context))
            or (query_bias is not None and tuple(query_bias.shape) != (q.shape[1],))):
        raise ValueError(f"context_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, out "
                         f"{tuple(out.shape)}, weight {None if weight is None else tuple(weight.shape)}, query_bias "
                         f"{None if query_bias is None else tuple(query_bias.shape)} do not fit "
                         f"{batch} tables of {length} query rows and {n_context} keys")
    weights = _NO_WEIGHT if weight is None else weight.numpy()
    bias = np.zeros(q.shape[1], np.float32) if query_bias is None else query_bias.numpy()
    _compiled(length >= 2)(q.numpy(), bias, k.numpy(), v.numpy(), weights, weight is not None, batch, length, n_context,
                           n_heads, out.numpy())
