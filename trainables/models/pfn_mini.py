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
        key_bias = None if context_weight is None else context_weight.float().log()[:, None, None, :]
        context_tokens = self._encode_features(context_x) + self.y_embedding(context_y)
        query_tokens = self._encode_features(query_x)
        tokens = torch.cat([context_tokens, query_tokens], dim=1)  # [B, N+M, D]
        for block in self.blocks:
            tokens = block(tokens, n_context, key_bias)
        return self.head(tokens[:, n_context:])
