"""pfn-mini: the small in-context classifier iclmem ships as its default model.

A prior-data fitted network in the TabPFN v1 style: every table row is one token, context rows carry a
label embedding, and every token attends to the context tokens only (queries never see each other, so
a query's prediction does not depend on which other queries share its batch). It has no positional
encoding: the model is invariant to the order of context rows, like TabPFN.

Features are not normalised inside the model: iclmem fits preprocessing once per task and never on a
probe context (a context of identical rows would standardise every feature to zero), so the model must
take features as they come. Pretraining standardises each synthetic table once over all its rows to
match.

Shapes: B tables, N context rows, M query rows, F features (F <= max_features), C classes (C <= max_classes).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class PfnMiniConfig:
    max_features: int = 20
    max_classes: int = 10
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 256

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class ContextAttentionBlock(nn.Module):
    """Pre-norm transformer block whose keys and values come from the context tokens only.

    Only the work the model's output reads is done: keys and values of the context rows (a query row is
    never a key), and in the last block (``queries_only``) the query rows' attention and feed-forward (the
    head reads nothing else). Context rows' keys and values never depend on query rows, so this is the same
    function as running every token through every block, with about a fifth fewer products on the probe's
    contexts (tests/test_fast_forward.py checks both forwards against that full computation).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm_attn = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm_ff = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, tokens: torch.Tensor, n_context: int, key_bias: torch.Tensor | None = None,
                queries_only: bool = False) -> torch.Tensor:
        # tokens: [B, N+M, D]; the first n_context tokens are the context rows. Returns [B, N+M, D], or the
        # query rows [B, M, D] if queries_only. key_bias: [B, 1, 1, N] added to the attention logits (log row
        # multiplicities), or None.
        batch, length, width = tokens.shape
        head_dim = width // self.n_heads
        h = self.norm_attn(tokens)
        if queries_only:
            tokens, h_query = tokens[:, n_context:], h[:, n_context:]
        else:
            h_query = h
        weight, bias = self.qkv.weight, self.qkv.bias  # rows: q, k, v (qkv.chunk(3) of one product)
        q = F.linear(h_query, weight[:width], bias[:width])
        k, v = F.linear(h[:, :n_context], weight[width:], bias[width:]).chunk(2, dim=-1)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, t.shape[1], self.n_heads, head_dim).transpose(1, 2)  # [B, H, rows, Dh]

        attended = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=key_bias)
        attended = attended.transpose(1, 2).reshape(batch, q.shape[1], width)
        tokens = tokens + self.out(attended)
        return tokens + self.ff(self.norm_ff(tokens))

    def _per_head(self, t: torch.Tensor, batch: int, rows: int) -> torch.Tensor:
        """[B*rows, D] (rows table-major) -> [B, H, rows, Dh], SDPA's layout."""
        return t.reshape(batch, rows, self.n_heads, -1).transpose(1, 2)

    def forward_inference(self, tokens: torch.Tensor, batch: int, n_context: int,
                          context_weight: torch.Tensor | None, queries_only: bool = False,
                          masks: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """``forward`` for CPU inference without autograd, on flat tokens in context-first layout: the
        B*N context rows (table-major), then the B*M query rows (table-major), [B*(N+M), D]. Returns the
        tokens in the same layout, updated in place, or the query rows [B*M, D] if ``queries_only``.
        ``context_weight`` [B, N] or None (``forward``'s key_bias is its log); ``masks``: a per-forward
        cache for ``_context_attention`` (the same for every block).

        The same math rearranged for pfn-mini's shapes (D = 128, 2-11 keys per table), where the
        memory-bound work around the matrix products costs about as much as the products (measured in the
        *Probe throughput* section of benchmarks/RESULTS.md); log-probs agree with ``forward`` to rounding
        (tests/test_fast_forward.py):

        * context rows first, so that keys and values are products over a contiguous slice of context rows
          (k and v apart, each contiguous, so the attention takes plain views of them) and the last block
          runs on a contiguous slice of query rows;
        * the first feed-forward layer, its bias and its exact (erf) GELU as one oneDNN product (``_linear``)
          instead of ``addmm`` copying the bias into its output first and a separate GELU pass;
        * residuals as ``tokens.addmm_(a, W.T).add_(b)`` = ``tokens + (a @ W.T + b)``, without temporaries;
        * attention by ``_context_attention`` instead of SDPA's CPU flash kernel, whose per-(table, head)
          overhead dominates at 2-11 keys, written straight into one output; k and v without their biases,
          which the attention does not need: softmax over the keys ignores q.b_k, the same for every key of
          a query, and the attention weights sum to 1, so b_v comes out as it went in and joins the output
          layer's bias: out(a + b_v) = a W_o^T + (b_o + W_o b_v).
        """
        width = tokens.shape[1]
        n_rows = tokens.shape[0] // batch
        n_query = n_rows - n_context
        split = batch * n_context  # context rows before, query rows after
        small = tokens.shape[0] < _SHORTCUT_MIN_ROWS  # the whole call's tokens, also in the last block
        h = F.layer_norm(tokens, (width,), self.norm_attn.weight, self.norm_attn.bias, self.norm_attn.eps)
        if queries_only:
            tokens, h_query, segments = tokens[split:], h[split:], [(0, n_query)]
        else:
            h_query, segments = h, [(0, n_context), (split, n_query)]
        w, b = self.qkv.weight, self.qkv.bias
        q = torch.addmm(b[:width], h_query, w[:width].t())  # [rows, D]
        k = torch.mm(h[:split], w[width:2 * width].t())  # [B*N, D]
        v = torch.mm(h[:split], w[2 * width:].t())
        attended = torch.empty_like(q)
        out_bias = torch.addmv(self.out.bias, self.out.weight, b[2 * width:])
        sdpa_context: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None
        for start, n_rows_each in segments:
            rows = slice(start, start + batch * n_rows_each)
            if (small
                    or not _context_attention(q[rows], k, v, batch, n_rows_each, n_context, self.n_heads,
                                              context_weight, masks, attended[rows])):
                # few tokens (SDPA's one kernel beats the shortcut's small ops), or logits outside the
                # shortcut's exact range: SDPA, as in forward (with k's bias the shortcut leaves out; v's is
                # in out_bias); the keys, values and log weights once for the block's segments
                if sdpa_context is None:
                    sdpa_context = (self._per_head(k + b[width:2 * width], batch, n_context),
                                    self._per_head(v, batch, n_context),
                                    None if context_weight is None else context_weight.float().log()[:, None, None, :])
                keys, values, key_bias = sdpa_context
                sdpa = F.scaled_dot_product_attention(self._per_head(q[rows], batch, n_rows_each), keys, values,
                                                      attn_mask=key_bias)
                attended[rows] = sdpa.transpose(1, 2).reshape(-1, width)
        tokens.addmm_(attended, self.out.weight.t()).add_(out_bias)
        h = F.layer_norm(tokens, (width,), self.norm_ff.weight, self.norm_ff.bias, self.norm_ff.eps)
        first, act, second = self.ff
        assert isinstance(first, nn.Linear) and isinstance(act, nn.GELU) and act.approximate == "none"
        assert isinstance(second, nn.Linear)
        hidden = _linear(h, first.weight, first.bias, gelu=True)
        return tokens.addmm_(hidden, second.weight.t()).add_(second.bias)


# oneDNN's fused linear (the op Inductor's CPU backend calls): bias and the exact GELU inside the product.
# Its fixed cost per call is higher than addmm's, so it serves products of at least _ONEDNN_MIN_ROWS rows
# (measured: from ~300 rows on, linear + GELU ~10-15% faster than addmm + gelu; below, slower). For the
# plain linear layers it is no faster than addmm at any size here, so those stay addmm.
_ONEDNN_LINEAR = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_ONEDNN_MIN_ROWS = 256


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, gelu: bool = False) -> torch.Tensor:
    """F.linear(x, weight, bias), then the exact GELU if ``gelu``; x [R, in] -> [R, out], float32 on CPU."""
    if _ONEDNN_LINEAR and x.shape[0] >= _ONEDNN_MIN_ROWS:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu" if gelu else "none", [],
                                                  "none" if gelu else "")
    out = torch.addmm(bias, x, weight.t())
    return F.gelu(out) if gelu else out


# Largest attention logit the shortcut exponentiates without subtracting a maximum, and the smallest softmax
# denominator it accepts: within these exp() neither overflows nor loses precision to underflow, so skipping
# the max subtraction changes nothing but rounding. Outside them the caller uses SDPA.
_MAX_LOGIT = 60.0
_MIN_DENOMINATOR = 1e-20
# Below this many (query row, key) pairs per table one product per table over every (head, head) pair is
# cheaper than one per head (measured on 40-1000 tables: the query rows' segment, 1 row x 2-30 keys,
# cross-head 1.5-2.5x faster; context rows x 2-6 keys 1.3-2.4x faster; 8 x 8 and up, per head 1.0-2x faster).
_CROSS_HEAD_BELOW = 64
# Below this many tokens per forward the shortcut's ~20 small ops per block cost more than SDPA's one kernel
# (forward_inference then uses SDPA).
_SHORTCUT_MIN_ROWS = 256


def _context_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int, length: int,
                       n_context: int, n_heads: int, context_weight: torch.Tensor | None,
                       masks: dict[int, torch.Tensor] | None, out: torch.Tensor) -> bool:
    """softmax(q k^T / sqrt(Dh) + log w) v per table and head, into ``out``: what SDPA computes in
    ``ContextAttentionBlock.forward``.

    q: contiguous [B*L, D] (L query rows per table); k, v: contiguous [B*N, D] (N keys per table);
    context_weight: [B, N] or None; masks: a cache of the cross-head masks by L (or None); out: contiguous
    [B*L, D]. Returns False, writing nothing, when a logit exceeds _MAX_LOGIT or a denominator is below
    _MIN_DENOMINATOR (or NaN): the caller then uses SDPA.

    Why it equals SDPA:
    * softmax(x)_j = exp(x_j) / sum_i exp(x_i) with no maximum subtracted: identical in exact arithmetic,
      and within the two bounds only rounding differs (~1e-7 relative);
    * exp(x + log w) = w exp(x): the row multiplicities scale the exponentiated logits (or the rows of
      [v | 1]) instead of biasing them;
    Two layouts of the logits' products (same result, chosen by speed):
    * per head (L x N >= _CROSS_HEAD_BELOW): for each head a batch of per-table [L, Dh] x [Dh, N] products on
      strided views of q and k; [v | 1] (times w) gives numerator and denominator in one product;
    * cross-head (fewer pairs, e.g. a table's query row): per table, q viewed [L*H, Dh] (rows = (token, head)) times k viewed
      [N*H, Dh]: every head's logits plus the cross-head ones (head h's query, head h' != h's key), which a
      0/1 mask (times w) zeroes after exp() -- 4x the attention's few FLOPs in one product per table
      instead of 2 x H tiny ones. The masked weights times v viewed [N*H, Dh] give each (token, head) row
      its own head's sum, already in the [B*L, D] layout; their row sums are the denominators.
    """
    width = q.shape[1]
    head_dim = width // n_heads
    scale = head_dim ** -0.5
    dtype, device = q.dtype, q.device
    if length * n_context < _CROSS_HEAD_BELOW:
        logits = torch.empty(batch, length * n_heads, n_context * n_heads, dtype=dtype, device=device)
        torch.baddbmm(logits, q.view(batch, length * n_heads, head_dim),
                      k.view(batch, n_context * n_heads, head_dim).transpose(1, 2), beta=0.0, alpha=scale,
                      out=logits)
        if not float(logits.max()) <= _MAX_LOGIT:  # also catches NaN
            return False
        mask = None if masks is None else masks.get(length)
        if mask is None:
            mask = torch.eye(n_heads, dtype=dtype, device=device)[None, :, None, :]  # [1, H, 1, H]
            mask = mask.expand(length, n_heads, n_context, n_heads).reshape(1, length * n_heads, -1)
            if context_weight is not None:  # [B, 1, N*H]: w of each key row, repeated per head
                mask = mask * context_weight.to(dtype).repeat_interleave(n_heads, dim=1)[:, None, :]
            if masks is not None:
                masks[length] = mask
        weights = logits.exp_().mul_(mask)  # unnormalised attention weights, 0 across heads
        denominator = weights.sum(-1, keepdim=True)  # [B, L*H, 1]
        if not float(denominator.min()) >= _MIN_DENOMINATOR:
            return False
        result = out.view(batch, length * n_heads, head_dim)
        torch.bmm(weights, v.view(batch, n_context * n_heads, head_dim), out=result)
        result.div_(denominator)
        return True

    q4, k4 = q.view(batch, length, n_heads, head_dim), k.view(batch, n_context, n_heads, head_dim)
    logits = torch.empty(n_heads, batch, length, n_context, dtype=dtype, device=device)
    for head in range(n_heads):
        torch.baddbmm(logits[head], q4[:, :, head], k4[:, :, head].transpose(1, 2), beta=0.0, alpha=scale,
                      out=logits[head])
    if not float(logits.max()) <= _MAX_LOGIT:
        return False
    logits.exp_()
    values = torch.empty(n_heads, batch, n_context, head_dim + 1, dtype=dtype, device=device)
    values[..., :head_dim] = v.view(batch, n_context, n_heads, head_dim).permute(2, 0, 1, 3)
    values[..., head_dim] = 1.0
    if context_weight is not None:
        values.mul_(context_weight.to(dtype).view(1, batch, n_context, 1))
    sums = torch.bmm(logits.view(n_heads * batch, length, n_context),
                     values.view(n_heads * batch, n_context, head_dim + 1)).view(n_heads, batch, length, -1)
    denominator = sums[..., head_dim:]
    if not float(denominator.min()) >= _MIN_DENOMINATOR:
        return False
    torch.div(sums[..., :head_dim], denominator, out=out.view(batch, length, n_heads, head_dim).permute(2, 0, 1, 3))
    return True


def unread_products_flops(config: PfnMiniConfig, batch: int, n_context: int, n_query: int) -> int:
    """FLOPs (2 per multiply-add) of the products that every token through every block would add to what
    ``ContextAttentionBlock`` computes for ``batch`` tables of ``n_context`` + ``n_query`` rows, none of
    which the output reads: keys and values of the query rows in every block, and the last block's query,
    output and feed-forward products of the context rows (tests/test_fast_forward.py checks it against
    FlopCounterMode; the probe benchmark reports it)."""
    d, d_ff = config.d_model, config.d_ff
    query_keys_values = config.n_layers * n_query * 2 * (2 * d * d)
    last_block_context = n_context * 2 * (d * d + d * d + 2 * d * d_ff)
    return batch * (query_keys_values + last_block_context)


class PfnMini(nn.Module):
    def __init__(self, config: PfnMiniConfig | None = None) -> None:
        super().__init__()
        self.config = config or PfnMiniConfig()
        c = self.config
        self.x_encoder = nn.Linear(c.max_features, c.d_model)
        self.y_embedding = nn.Embedding(c.max_classes, c.d_model)
        self.blocks = nn.ModuleList(
            ContextAttentionBlock(c.d_model, c.n_heads, c.d_ff) for _ in range(c.n_layers)
        )
        self.head = nn.Sequential(
            nn.LayerNorm(c.d_model), nn.Linear(c.d_model, c.d_ff), nn.GELU(), nn.Linear(c.d_ff, c.max_classes)
        )
        self.fast_inference = True  # see uses_fast_inference

    def _encode_features(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, L, F] -> [B, L, D]. Zero-pad to max_features and rescale so the encoder sees the same
        # total feature energy whatever F is (TabPFN's trick for variable feature counts).
        n_features = x.shape[-1]
        if n_features > self.config.max_features:
            raise ValueError(f"pfn-mini takes at most {self.config.max_features} features, got {n_features}")
        padded = F.pad(x, (0, self.config.max_features - n_features))
        return self.x_encoder(padded * math.sqrt(self.config.max_features / max(n_features, 1)))

    def forward(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor,
                context_weight: torch.Tensor | None = None) -> torch.Tensor:
        # context_x: [B, N, F]; context_y: [B, N] int64; query_x: [B, M, F] -> logits [B, M, max_classes]
        # context_weight: [B, N] row multiplicities, or None. Identical context rows stay identical
        # through every layer (they see the same keys), so one row with multiplicity c plus a log(c)
        # bias on its attention logit computes exactly what c copies of it would, with fewer tokens.
        batch, n_context, _ = context_x.shape
        n_query = query_x.shape[1]
        context_tokens = self._encode_features(context_x) + self.y_embedding(context_y)  # [B, N, D]
        query_tokens = self._encode_features(query_x)  # [B, M, D]
        last = len(self.blocks) - 1
        if self.uses_fast_inference(context_tokens):
            width = context_tokens.shape[-1]
            # context-first flat layout (see forward_inference); cat's fresh output: updated in place
            flat = torch.cat([context_tokens.reshape(batch * n_context, width),
                              query_tokens.reshape(batch * n_query, width)])
            masks: dict[int, torch.Tensor] = {}  # the attention's cross-head masks, the same for every block
            for i, block in enumerate(self.blocks):
                flat = block.forward_inference(flat, batch, n_context, context_weight, queries_only=i == last,
                                               masks=masks)
            return self.head(flat.view(batch, n_query, width))
        tokens = torch.cat([context_tokens, query_tokens], dim=1)  # [B, N+M, D]
        key_bias = None if context_weight is None else context_weight.float().log()[:, None, None, :]
        for i, block in enumerate(self.blocks):
            tokens = block(tokens, n_context, key_bias, queries_only=i == last)
        return self.head(tokens)  # [B, M, D]: the last block keeps the query rows only

    def uses_fast_inference(self, tokens: torch.Tensor) -> bool:
        """The blocks' ``forward_inference`` (same math, fewer memory passes; see it) serves CPU float32
        forwards without autograd -- the probe's and every ``torch.no_grad`` prediction; training and
        GPUs keep ``forward``. ``fast_inference = False`` on the module turns it off (tests, FLOP counts)."""
        return (self.fast_inference and not torch.is_grad_enabled() and tokens.device.type == "cpu"
                and tokens.dtype == torch.float32)
