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
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from trainables.models.kernels import context_attention


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
        result: torch.Tensor = tokens + self.ff(self.norm_ff(tokens))
        return result

    def forward_inference(self, tokens: torch.Tensor, groups: Sequence[TableGroup], split: int,
                          queries_only: bool = False) -> torch.Tensor:
        """``forward`` for CPU inference without autograd, on flat tokens [R, D] in context-first layout: the
        context rows of every group (each group's table-major), then their query rows, ``split`` = the
        number of context rows; ``groups`` says where each group's rows are (several batches of tables of
        different shapes share one call: ``PfnMini.forward_many``). Returns the tokens in the same layout,
        updated in place, or the query rows [R - split, D] if ``queries_only``.

        The same math rearranged for pfn-mini's shapes (D = 128, 2-40 keys per table), where the
        memory-bound work around the matrix products costs about as much as the products (measured in the
        *Probe throughput* section of benchmarks/RESULTS.md); log-probs agree with ``forward`` to rounding
        (tests/test_fast_forward.py):

        * context rows first, so that keys and values are products over a contiguous slice of context rows
          and the last block runs on a contiguous slice of query rows; the token-wise work (layer norms,
          products, residuals) of every group in one op each;
        * the first feed-forward layer, its bias and its exact (erf) GELU as one oneDNN product (``_linear``)
          instead of ``addmm`` copying the bias into its output first and a separate GELU pass;
        * residuals as ``tokens.addmm_(a, W.T).add_(b)`` = ``tokens + (a @ W.T + b)``, without temporaries;
        * the attention of each group by one compiled loop (``kernels.context_attention``) instead of SDPA's
          CPU flash kernel, whose per-(table, head) overhead dominates at 2-40 keys, written straight into
          one output; k and v without their biases, which the attention does not need: softmax over the
          keys ignores q.b_k, the same for every key of a query, and the attention weights sum to 1, so b_v
          comes out as it went in and joins the output layer's bias: out(a + b_v) = a W_o^T + (b_o + W_o b_v);
          q's bias added by the attention as it reads each query row (no pass copying it into q first).
        """
        width = tokens.shape[1]
        h = F.layer_norm(tokens, (width,), self.norm_attn.weight, self.norm_attn.bias, self.norm_attn.eps)
        if queries_only:
            tokens, h_query, first_row = tokens[split:], h[split:], split
        else:
            h_query, first_row = h, 0
        w, b = self.qkv.weight, self.qkv.bias  # rows: q, k, v
        q = torch.mm(h_query, w[:width].t())  # [rows, D], its bias added by the attention
        k = torch.mm(h[:split], w[width:2 * width].t())  # [context rows, D]
        v = torch.mm(h[:split], w[2 * width:].t())
        attended = torch.empty_like(q)
        for group in groups:
            keys = slice(group.context_start, group.context_start + group.batch * group.n_context)
            segments = [(group.query_start, group.n_query)]
            if not queries_only:  # the context rows attend too
                segments.insert(0, (group.context_start, group.n_context))
            for start, rows_each in segments:
                rows = slice(start - first_row, start - first_row + group.batch * rows_each)
                context_attention(q[rows], k[keys], v[keys], group.batch, rows_each, group.n_context, self.n_heads,
                                  group.weight, attended[rows], query_bias=b[:width])
        out_bias = torch.addmv(self.out.bias, self.out.weight, b[2 * width:])
        tokens.addmm_(attended, self.out.weight.t()).add_(out_bias)
        h = F.layer_norm(tokens, (width,), self.norm_ff.weight, self.norm_ff.bias, self.norm_ff.eps)
        first, act, second = self.ff
        assert isinstance(first, nn.Linear)
        assert isinstance(act, nn.GELU)
        assert act.approximate == "none"
        assert isinstance(second, nn.Linear)
        hidden = _linear(h, first.weight, first.bias, gelu=True)
        return tokens.addmm_(hidden, second.weight.t()).add_(second.bias)


@dataclass(frozen=True)
class TableGroup:
    """Where one batch of same-shape tables lies in ``forward_inference``'s flat tokens: ``batch`` tables of
    ``n_context`` context rows from row ``context_start`` and ``n_query`` query rows from row ``query_start``
    (each table-major); ``weight`` [batch, n_context] float32 contiguous row multiplicities, or None."""

    batch: int
    n_context: int
    n_query: int
    context_start: int
    query_start: int
    weight: torch.Tensor | None


# oneDNN's fused linear (the op Inductor's CPU backend calls): bias and the exact GELU inside the product.
# Its fixed cost per call is higher than addmm's, so it serves products of at least _ONEDNN_MIN_ROWS rows
# (measured: from ~300 rows on, linear + GELU ~10-15% faster than addmm + gelu; below, slower). For the
# plain linear layers it is no faster than addmm at any size here, so those stay addmm.
_ONEDNN_LINEAR = (torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
                  and hasattr(torch.ops.mkldnn, "_linear_pointwise"))
_ONEDNN_MIN_ROWS = 256


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, gelu: bool = False) -> torch.Tensor:
    """F.linear(x, weight, bias), then the exact GELU if ``gelu``; x [R, in] -> [R, out], float32 on CPU."""
    if _ONEDNN_LINEAR and x.shape[0] >= _ONEDNN_MIN_ROWS:
        fused: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu" if gelu else "none", [],
                                                                 "none" if gelu else "")
        return fused
    out = torch.addmm(bias, x, weight.t())
    return F.gelu(out) if gelu else out


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

    def _encoder_operands(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., F] -> (x', W') with F.linear(x', W', b) the encoder's output [..., D], to rounding.

        For the inference forward: the encoder reads F features zero-padded to max_features (see
        ``_encode_features``); the zero columns add nothing, so only the F real features' weight columns
        are multiplied, with no padded copy of x. The sums run over fewer terms, so the result can differ
        from the padded product in the last bits (by how much depends on the CPU's matmul kernels). Fewer than
        two features keep zero columns up to two: MKL's one-column product rounded further from the padded one."""
        n_features = x.shape[-1]
        scale = self._feature_scale(n_features)
        if n_features < 2:
            x, n_features = F.pad(x, (0, 2 - n_features)), 2
        return x * scale, self.x_encoder.weight[:, :n_features]

    def _encode_features(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, L, F] -> [B, L, D]. Zero-pad to max_features and rescale so the encoder sees the same
        # total feature energy whatever F is (TabPFN's trick for variable feature counts). Training keeps
        # the padded product: fine-tuning on shuffled labels for hundreds of epochs amplifies any change of
        # rounding into other weights and verdicts, and the multiply skipping the zero columns rounds like
        # the padded one on some CPUs only (on an AVX2-only machine its gradients differed in the last bits).
        n_features = x.shape[-1]
        scale = self._feature_scale(n_features)
        encoded: torch.Tensor = self.x_encoder(F.pad(x, (0, self.config.max_features - n_features)) * scale)
        return encoded

    def _feature_scale(self, n_features: int) -> float:
        """sqrt(max_features / F): F features read as max_features carry the same total energy; refuses F
        above max_features."""
        if n_features > self.config.max_features:
            raise ValueError(f"pfn-mini takes at most {self.config.max_features} features, got {n_features}")
        return math.sqrt(self.config.max_features / max(n_features, 1))

    def forward(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor,
                context_weight: torch.Tensor | None = None) -> torch.Tensor:
        # context_x: [B, N, F]; context_y: [B, N] int64; query_x: [B, M, F] -> logits [B, M, max_classes]
        # context_weight: [B, N] row multiplicities, or None. Identical context rows stay identical
        # through every layer (they see the same keys), so one row with multiplicity c plus a log(c)
        # bias on its attention logit computes exactly what c copies of it would, with fewer tokens.
        if self.uses_fast_inference(self.x_encoder.weight):
            return self._forward_inference([(context_x, context_y, query_x, context_weight)])[0]
        n_context = context_x.shape[1]
        context_tokens = self._encode_features(context_x) + self.y_embedding(context_y)  # [B, N, D]
        query_tokens = self._encode_features(query_x)  # [B, M, D]
        last = len(self.blocks) - 1
        tokens = torch.cat([context_tokens, query_tokens], dim=1)  # [B, N+M, D]
        key_bias = None if context_weight is None else context_weight.float().log()[:, None, None, :]
        for i, block in enumerate(self.blocks):
            tokens = block(tokens, n_context, key_bias, queries_only=i == last)
        logits: torch.Tensor = self.head(tokens)  # [B, M, D]: the last block keeps the query rows only
        return logits

    def forward_many(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]
                     ) -> list[torch.Tensor]:
        """``forward`` of each (context_x, context_y, query_x, context_weight) in ``batches``, each batch with
        its own B, N, M and F: on the CPU inference path one pass for all of them (their token-wise work in
        one op per layer, each batch's attention over its own tables), else one ``forward`` each."""
        if not batches or not self.uses_fast_inference(self.x_encoder.weight):  # the tokens' dtype and device
            return [self.forward(*inputs) for inputs in batches]
        return self._forward_inference(batches)

    def _forward_inference(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]
                           ) -> list[torch.Tensor]:
        """The blocks' ``forward_inference`` over batches (context_x [B, N, F], context_y [B, N], query_x
        [B, M, F], row weights [B, N] or None), encoded straight into one context-first flat tensor [rows, D]
        (each row the encoder's product written in place, context rows then plus their labels' embeddings: no
        zero-padded features, no per-batch token tensors, no concatenation); logits per batch."""
        split = sum(context_x.shape[0] * context_x.shape[1] for context_x, _, _, _ in batches)
        n_rows = split + sum(query_x.shape[0] * query_x.shape[1] for _, _, query_x, _ in batches)
        weight, bias = self.x_encoder.weight, self.x_encoder.bias
        flat = torch.empty(n_rows, weight.shape[0], dtype=weight.dtype, device=weight.device)  # updated in place
        labels = self.y_embedding.weight  # [C, D]
        groups, context_start, query_start = [], 0, split
        for context_x, context_y, query_x, row_weight in batches:
            (batch, n_context, _), n_query = context_x.shape, query_x.shape[1]
            (context_features, feature_weight), (query_features, _) = map(self._encoder_operands, (context_x, query_x))
            width = feature_weight.shape[1]
            # the sums in forward's order: (x W^T + b) + the label's embedding
            context = torch.addmm(bias, context_features.reshape(-1, width), feature_weight.t(),
                                  out=flat[context_start:context_start + batch * n_context])
            context.add_(F.embedding(context_y.reshape(-1), labels))
            torch.addmm(bias, query_features.reshape(-1, width), feature_weight.t(),
                        out=flat[query_start:query_start + batch * n_query])
            groups.append(TableGroup(batch, n_context, n_query, context_start, query_start,
                                     None if row_weight is None else row_weight.to(torch.float32).contiguous()))
            context_start += batch * n_context
            query_start += batch * n_query
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            flat = cast(ContextAttentionBlock, block).forward_inference(flat, groups, split, queries_only=i == last)
        logits = self.head(flat)  # [query rows of every batch, max_classes]
        out, start = [], 0
        for group in groups:
            rows = group.batch * group.n_query
            out.append(logits[start:start + rows].view(group.batch, group.n_query, -1))
            start += rows
        return out

    def uses_fast_inference(self, tokens: torch.Tensor) -> bool:
        """The blocks' ``forward_inference`` (same math, fewer memory passes; see it) serves CPU float32
        forwards without autograd -- the probe's and every ``torch.no_grad`` prediction; training and
        GPUs keep ``forward``. ``fast_inference = False`` on the module turns it off (tests, FLOP counts)."""
        return (self.fast_inference and not torch.is_grad_enabled() and tokens.device.type == "cpu"
                and tokens.dtype == torch.float32)
