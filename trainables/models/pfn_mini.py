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
    """Pre-norm transformer block whose keys and values come from the context tokens only."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm_attn = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm_ff = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, tokens: torch.Tensor, n_context: int, key_bias: torch.Tensor | None = None) -> torch.Tensor:
        # tokens: [B, N+M, D]; the first n_context tokens are the context rows.
        # key_bias: [B, 1, 1, N] added to the attention logits (log row multiplicities), or None.
        batch, length, width = tokens.shape
        head_dim = width // self.n_heads
        q, k, v = self.qkv(self.norm_attn(tokens)).chunk(3, dim=-1)  # each [B, N+M, D]

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, t.shape[1], self.n_heads, head_dim).transpose(1, 2)  # [B, H, L, Dh]

        attended = F.scaled_dot_product_attention(
            heads(q), heads(k[:, :n_context]), heads(v[:, :n_context]), attn_mask=key_bias
        )  # [B, H, N+M, Dh]
        attended = attended.transpose(1, 2).reshape(batch, length, width)
        tokens = tokens + self.out(attended)
        return tokens + self.ff(self.norm_ff(tokens))

    def forward_inference(self, tokens: torch.Tensor, batch: int, n_context: int,
                          context_weight: torch.Tensor | None) -> torch.Tensor:
        """``forward`` on flat tokens [B*(N+M), D] (each table's N context then M query rows, as ``forward``'s
        [B, N+M, D] flattened), for CPU inference without autograd: ``tokens`` is updated in place and
        returned; ``context_weight`` [B, N] or None (``forward``'s key_bias is its log).

        The same math rearranged for pfn-mini's shapes (D = 128, 2-11 keys per table), where the
        memory-bound work around the matrix products costs about as much as the products (measured in the
        *Probe throughput* section of benchmarks/RESULTS.md); log-probs agree with ``forward`` to rounding
        (tests/test_fast_forward.py):

        * the first feed-forward layer, its bias and its exact (erf) GELU as one oneDNN product (``_linear``)
          instead of ``addmm`` copying the bias into its output first and a separate GELU pass;
        * residuals as ``tokens.addmm_(a, W.T).add_(b)`` = ``tokens + (a @ W.T + b)``, without temporaries;
        * attention by ``_context_attention`` instead of SDPA's CPU flash kernel, whose per-(table, head)
          overhead dominates at 2-11 keys; q and (k, v) as two products so that q comes out contiguous
          and the attention takes per-table views of it without a copy; k and v without their biases,
          which the attention does not need (see below).
        """
        width = tokens.shape[1]
        length = tokens.shape[0] // batch
        h = F.layer_norm(tokens, (width,), self.norm_attn.weight, self.norm_attn.bias, self.norm_attn.eps)
        attended = None
        if batch * length >= _SHORTCUT_MIN_ROWS:
            # the rows of qkv.weight that chunk(3) gives to q, then k and v: q comes out contiguous [B*L, D].
            # k and v without their biases (no bias copied into the product's output): softmax over the keys
            # ignores q.b_k, the same for every key of a query, and the attention weights sum to 1, so b_v
            # comes out as it went in and joins the output layer's bias: out(a + b_v) = a W_o^T + (b_o + W_o b_v).
            w, b = self.qkv.weight, self.qkv.bias
            q = torch.addmm(b[:width], h, w[:width].t())
            kv = torch.mm(h, w[width:].t())  # [B*L, 2D]
            attended = _context_attention(q, kv, batch, length, n_context, self.n_heads, context_weight)
            if attended is not None:
                out_bias = torch.addmv(self.out.bias, self.out.weight, b[2 * width:])
        if attended is None:  # few tokens, or logits outside the shortcut's exact range: SDPA, as in forward
            out_bias = self.out.bias
            qkv = torch.addmm(self.qkv.bias, h, self.qkv.weight.t())  # [B*L, 3D]
            q, k, v = qkv[:, :width], qkv[:, width:2 * width], qkv[:, 2 * width:]  # chunk(3, dim=-1): views

            def heads(t: torch.Tensor, n: int) -> torch.Tensor:
                return t.view(batch, length, self.n_heads, -1)[:, :n].transpose(1, 2)

            key_bias = None if context_weight is None else context_weight.float().log()[:, None, None, :]
            attended = F.scaled_dot_product_attention(
                heads(q, length), heads(k, n_context), heads(v, n_context), attn_mask=key_bias
            ).transpose(1, 2).reshape(batch * length, width)
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
# Below this many keys one product per table over every (head, head) pair is cheaper than one per head
# (measured: 2-5 keys: cross-head ~1.5x faster; 6-11 keys: per head up to ~1.3x faster).
_CROSS_HEAD_BELOW = 6
# Below this many tokens per forward the shortcut's ~20 small ops per block cost more than SDPA's one kernel
# (forward_inference then uses SDPA).
_SHORTCUT_MIN_ROWS = 256


def _context_attention(q: torch.Tensor, kv: torch.Tensor, batch: int, length: int, n_context: int,
                       n_heads: int, context_weight: torch.Tensor | None) -> torch.Tensor | None:
    """softmax(q k^T / sqrt(Dh) + log w) v per table and head, the keys and values being each table's first
    ``n_context`` tokens: what SDPA computes in ``ContextAttentionBlock.forward``.

    q: contiguous [B*L, D] and kv: contiguous [B*L, 2D] (k then v; L tokens per table);
    context_weight: [B, N] or None. Returns [B*L, D], or None (the caller then uses SDPA) when a logit
    exceeds _MAX_LOGIT or a denominator is below _MIN_DENOMINATOR (or NaN).

    Why it equals SDPA:
    * softmax(x)_j = exp(x_j) / sum_i exp(x_i) with no maximum subtracted: identical in exact arithmetic,
      and within the two bounds only rounding differs (~1e-7 relative);
    * exp(x + log w) = w exp(x): the row multiplicities scale the rows of [v | 1] instead of biasing logits;
    * [v | 1]: the product of exp(logits) with the extra column (ones, or w) is sum_i w_i exp(x_i), the
      softmax denominator, so one product gives numerator and denominator.
    Two layouts of the logits' products (same result, chosen by speed):
    * per head (N >= _CROSS_HEAD_BELOW): for each head a batch of per-table [L, Dh] x [Dh, N] products on
      strided views of q and k;
    * cross-head (fewer keys): per table, q viewed [L*H, Dh] (rows = (token, head)) times k's context rows
      copied to [N*H, Dh]: every head's logits plus the cross-head ones (head h's query, head h' != h's
      key), which a 0/1 mask zeroes after exp() -- 4x the attention's few FLOPs in one product per table
      instead of 2 x H tiny ones. The masked weights times [v | 1] viewed [N*H, Dh+1] give each
      (token, head) row its own head's sums, already in the [B*L, D] layout.
    """
    width = q.shape[1]
    head_dim = width // n_heads
    scale = head_dim ** -0.5
    dtype, device = q.dtype, q.device
    per_table = kv.view(batch, length, 2 * width)
    k = per_table[:, :n_context, :width]  # [B, N, D], row stride 2D
    v = per_table[:, :n_context, width:].view(batch, n_context, n_heads, head_dim)
    if n_context < _CROSS_HEAD_BELOW:
        logits = torch.empty(batch, length * n_heads, n_context * n_heads, dtype=dtype, device=device)
        keys = k.reshape(batch, n_context * n_heads, head_dim)  # a copy of the context rows
        torch.baddbmm(logits, q.view(batch, length * n_heads, head_dim), keys.transpose(1, 2), beta=0.0,
                      alpha=scale, out=logits)
        if not float(logits.max()) <= _MAX_LOGIT:  # also catches NaN
            return None
        same_head = torch.eye(n_heads, dtype=dtype, device=device)[None, :, None, :]  # [1, H, 1, H]
        same_head = same_head.expand(length, n_heads, n_context, n_heads).reshape(1, length * n_heads, -1)
        weights = logits.exp_().mul_(same_head)  # unnormalised attention weights, 0 across heads
        values = torch.empty(batch, n_context, n_heads, head_dim + 1, dtype=dtype, device=device)
        values[..., :head_dim] = v
        values[..., head_dim] = 1.0
        if context_weight is not None:
            values.mul_(context_weight.to(dtype).view(batch, n_context, 1, 1))
        out = torch.bmm(weights, values.view(batch, n_context * n_heads, head_dim + 1))  # [B, L*H, Dh+1]
        denominator = out[..., head_dim:]
        if not float(denominator.min()) >= _MIN_DENOMINATOR:
            return None
        return (out[..., :head_dim] / denominator).view(batch * length, width)

    q4, k4 = q.view(batch, length, n_heads, head_dim), k.view(batch, n_context, n_heads, head_dim)
    logits = torch.empty(n_heads, batch, length, n_context, dtype=dtype, device=device)
    for head in range(n_heads):
        torch.baddbmm(logits[head], q4[:, :, head], k4[:, :, head].transpose(1, 2), beta=0.0, alpha=scale,
                      out=logits[head])
    if not float(logits.max()) <= _MAX_LOGIT:
        return None
    logits.exp_()
    values = torch.empty(n_heads, batch, n_context, head_dim + 1, dtype=dtype, device=device)
    values[..., :head_dim] = v.permute(2, 0, 1, 3)
    values[..., head_dim] = 1.0
    if context_weight is not None:
        values.mul_(context_weight.to(dtype).view(1, batch, n_context, 1))
    out = torch.bmm(logits.view(n_heads * batch, length, n_context),
                    values.view(n_heads * batch, n_context, head_dim + 1)).view(n_heads, batch, length, head_dim + 1)
    denominator = out[..., head_dim:]
    if not float(denominator.min()) >= _MIN_DENOMINATOR:
        return None
    attended = torch.empty(batch, length, n_heads, head_dim, dtype=dtype, device=device)
    torch.div(out[..., :head_dim], denominator, out=attended.permute(2, 0, 1, 3))
    return attended.view(batch * length, width)


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
        n_context = context_x.shape[1]
        context_tokens = self._encode_features(context_x) + self.y_embedding(context_y)
        query_tokens = self._encode_features(query_x)
        tokens = torch.cat([context_tokens, query_tokens], dim=1)  # [B, N+M, D]
        if self.uses_fast_inference(tokens):
            batch, length, width = tokens.shape
            flat = tokens.view(batch * length, width)  # cat's fresh output: the blocks update it in place
            for block in self.blocks:
                flat = block.forward_inference(flat, batch, n_context, context_weight)
            return self.head(flat.view(batch, length, width)[:, n_context:])
        key_bias = None if context_weight is None else context_weight.float().log()[:, None, None, :]
        for block in self.blocks:
            tokens = block(tokens, n_context, key_bias)
        return self.head(tokens[:, n_context:])

    def uses_fast_inference(self, tokens: torch.Tensor) -> bool:
        """The blocks' ``forward_inference`` (same math, fewer memory passes; see it) serves CPU float32
        forwards without autograd -- the probe's and every ``torch.no_grad`` prediction; training and
        GPUs keep ``forward``. ``fast_inference = False`` on the module turns it off (tests, FLOP counts)."""
        return (self.fast_inference and not torch.is_grad_enabled() and tokens.device.type == "cpu"
                and tokens.dtype == torch.float32)
