"""Causal-LM access for the probes: local loading, batched padding-aware log-probabilities, greedy decoding.

Everything batches over sequences. Scoring pads on the right (a causal model's real tokens never attend
to the pads after them, and positions stay 0..n-1); generation pads on the left with explicit position
ids and a key/value cache. Any torch module whose ``forward(input_ids=..., attention_mask=...)`` returns
an object with ``.logits`` (or a tuple whose first item is the logits) can stand in for a Hugging Face
model; such stand-ins are decoded without a cache.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from iclmem.errors import ModelError, ProbeError
from probes.lm.settings import DEFAULT_BATCH_SIZE

__all__ = [
    "LanguageModel",
    "load_lm",
    "token_logprobs",
    "next_token_logprobs",
    "greedy_generate",
]


@dataclass
class LanguageModel:
    """A causal LM and its tokenizer. ``prefix_id`` is the fixed token put before every scored string."""

    model: Any
    tokenizer: Any
    name: str = "lm"
    device: str = "cpu"
    max_length: int | None = None
    # Right-padded scoring needs no padding mask in a causal LM: a real position never attends to the
    # pads after it, so its logits are unchanged (checked by the tests). Scoring therefore passes an
    # all-ones mask, which transformers does not materialize (a padded mask costs ~40% of a small
    # model's batched forward). Set True for a model whose outputs at real positions could depend on
    # later tokens.
    mask_right_padding: bool = False
    _newline_ids: torch.Tensor | None = field(default=None, repr=False)

    # -- tokens ---------------------------------------------------------------------------------
    @property
    def prefix_id(self) -> int:
        """The paper prefixes entities with "the default unknown token"; GPT-2's unknown token is its
        ``<|endoftext|>`` (also its BOS/EOS). Falls back to BOS, then EOS."""
        tok = self.tokenizer
        for attr in ("unk_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(tok, attr, None)
            if value is not None:
                return int(value)
        raise ModelError(f"{self.name}: the tokenizer has no unknown, BOS or EOS token to prefix with")

    @property
    def pad_id(self) -> int:
        for attr in ("pad_token_id", "eos_token_id", "unk_token_id"):
            value = getattr(self.tokenizer, attr, None)
            if value is not None:
                return int(value)
        return 0

    @property
    def eos_id(self) -> int | None:
        value = getattr(self.tokenizer, "eos_token_id", None)
        return None if value is None else int(value)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def newline_ids(self) -> torch.Tensor:
        """Ids of every token whose text holds a newline (decoding stops at the first one)."""
        if self._newline_ids is None:
            texts = self.tokenizer.batch_decode([[i] for i in range(self.vocab_size)])
            self._newline_ids = torch.tensor([i for i, t in enumerate(texts) if "\n" in t], dtype=torch.long)
        return self._newline_ids

    # -- forward --------------------------------------------------------------------------------
    @property
    def supports_cache(self) -> bool:
        try:
            from transformers import PreTrainedModel
        except ImportError:  # pragma: no cover
            return False
        return isinstance(self.model, PreTrainedModel)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs: Any) -> Any:
        mask = None if attention_mask is None else attention_mask.to(self.device)
        return self.model(input_ids=input_ids.to(self.device), attention_mask=mask, **kwargs)


def _logits(out: Any) -> torch.Tensor:
    logits: torch.Tensor = out.logits if hasattr(out, "logits") else out[0]
    return logits


_CACHE: dict[tuple[str, str], LanguageModel] = {}
_CACHE_LOCK = threading.Lock()


def load_lm(path: str | Path, device: str = "cpu", name: str | None = None, cache: bool = True) -> LanguageModel:
    """Load a Hugging Face causal LM and its tokenizer from a local directory (never the network).

    Models are cached per process (a Ray worker that runs several tasks loads each model once)."""
    path = Path(path)
    key = (str(path.resolve()), device)
    if cache and key in _CACHE:
        return _CACHE[key]
    if not path.is_dir():
        raise ModelError(f"model directory {path} does not exist")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover
        raise ModelError("the LM probes need transformers: pip install 'iclmem[lm]'") from exc
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)  # type: ignore[no-untyped-call]
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"cannot load a causal LM from {path}: {exc}") from exc
    model.eval().to(device)  # type: ignore[no-untyped-call]
    cfg = getattr(model, "config", None)
    max_length = None
    for attr in ("n_positions", "max_position_embeddings"):
        if cfg is not None and getattr(cfg, attr, None):
            max_length = int(getattr(cfg, attr))
            break
    lm = LanguageModel(model, tokenizer, name or path.name, device, max_length)
    if cache:
        with _CACHE_LOCK:
            _CACHE[key] = lm
    return lm


def _chunks(order: Sequence[int], size: int) -> list[list[int]]:
    return [list(order[i : i + size]) for i in range(0, len(order), size)]


@torch.inference_mode()
def token_logprobs(lm: LanguageModel, sequences: Sequence[Sequence[int]],
                   batch_size: int = DEFAULT_BATCH_SIZE) -> list[np.ndarray]:
    """``log p(s_i | s_<i)`` for i = 1..n-1 of every token sequence (float64 arrays of length n-1).

    Sequences are sorted by length and scored ``batch_size`` at a time, right-padded, so one forward
    pass serves many sequences; padding does not change any value (only real positions are read, and
    causality keeps pads out of them)."""
    if batch_size < 1:
        raise ProbeError(f"batch_size must be >= 1, got {batch_size}")
    seqs = [list(s) for s in sequences]
    if lm.max_length is not None:
        too_long = [i for i, s in enumerate(seqs) if len(s) > lm.max_length]
        if too_long:
            raise ProbeError(f"{lm.name}: {len(too_long)} sequence(s) exceed the model's {lm.max_length} positions")
    out: list[np.ndarray | None] = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    for chunk in _chunks(order, batch_size):
        width = max(len(seqs[i]) for i in chunk)
        if width < 2:
            for i in chunk:
                out[i] = np.zeros(0, dtype=np.float64)
            continue
        ids_np = np.full((len(chunk), width), lm.pad_id, dtype=np.int64)
        mask_np = np.zeros((len(chunk), width), dtype=np.int64)
        for r, i in enumerate(chunk):
            ids_np[r, : len(seqs[i])] = seqs[i]
            mask_np[r, : len(seqs[i])] = 1
        ids, mask = torch.from_numpy(ids_np), torch.from_numpy(mask_np)
        # (do not pass use_cache=False: transformers 4.x GPT-2 then builds a full mask on every call,
        # 7x slower for one short sequence)
        # all ones unless mask_right_padding: same logits at real positions, and transformers skips
        # building an all-ones mask (a padded one costs ~40% of a small model's forward)
        logits = _logits(lm.forward(ids, mask if lm.mask_right_padding else torch.ones_like(ids))).float()[:, :-1]
        target = ids[:, 1:].to(logits.device)
        lp = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        lp_np = lp.double().cpu().numpy()
        for r, i in enumerate(chunk):
            out[i] = lp_np[r, : len(seqs[i]) - 1].copy()
    return cast("list[np.ndarray]", out)  # every index was filled above


def _left_pad(lm: LanguageModel, seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), lm.pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        if len(s):
            ids[r, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[r, width - len(s) :] = 1
    return ids, mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _step_kwargs(lm: LanguageModel, mask: torch.Tensor) -> dict[str, Any]:
    if lm.supports_cache:
        return {"position_ids": _positions(mask).to(lm.device), "use_cache": True}
    return {}


@torch.inference_mode()
def next_token_logprobs(lm: LanguageModel, prompts: Sequence[Sequence[int]],
                        batch_size: int = DEFAULT_BATCH_SIZE) -> np.ndarray:
    """Log-distribution of the token after each prompt, ``[n_prompts, vocab]`` (float64)."""
    rows: list[np.ndarray | None] = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    for chunk in _chunks(order, batch_size):
        ids, mask = _left_pad(lm, [prompts[i] for i in chunk])
        kwargs = _step_kwargs(lm, mask)
        kwargs.pop("use_cache", None)
        logits = _logits(lm.forward(ids, mask, **kwargs))[:, -1].double()
        lp = torch.log_softmax(logits, dim=-1).cpu().numpy()
        for r, i in enumerate(chunk):
            rows[i] = lp[r]
    return np.stack(rows)  # type: ignore[arg-type]


@torch.inference_mode()
def greedy_generate(lm: LanguageModel, prompts: Sequence[Sequence[int]], max_new_tokens: int = 15,
                    first_token_bias: np.ndarray | None = None, stop_at_newline: bool = True,
                    batch_size: int = 8) -> list[list[int]]:
    """Greedy continuation of each prompt, at most ``max_new_tokens``, stopping after a token that holds
    a newline (or EOS). ``first_token_bias`` (``[vocab]`` or ``[n_prompts, vocab]``, log space) is added
    to the first step's log-probabilities only: contextual calibration passes ``-log p_cf`` here.

    Returns the generated ids per prompt (the stopping token included; callers cut at the newline)."""
    if max_new_tokens < 1:
        return [[] for _ in prompts]
    newline = lm.newline_ids() if stop_at_newline else torch.zeros(0, dtype=torch.long)
    stop = newline if lm.eos_id is None else torch.cat([newline, torch.tensor([lm.eos_id])])
    bias_all = None
    if first_token_bias is not None:
        bias_all = torch.as_tensor(np.asarray(first_token_bias, dtype=np.float64))
        if bias_all.ndim == 1:
            bias_all = bias_all.unsqueeze(0).expand(len(prompts), -1)
    results: list[list[int]] = [[] for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    for chunk in _chunks(order, batch_size):
        ids, mask = _left_pad(lm, [prompts[i] for i in chunk])
        done = torch.zeros(len(chunk), dtype=torch.bool)
        out = lm.forward(ids, mask, **_step_kwargs(lm, mask))
        past = getattr(out, "past_key_values", None) if lm.supports_cache else None
        logits = _logits(out)[:, -1].double().cpu()
        for step in range(max_new_tokens):
            logp = torch.log_softmax(logits, dim=-1)
            if step == 0 and bias_all is not None:
                logp = logp + bias_all[chunk, : logp.shape[-1]]
            nxt = logp.argmax(dim=-1)
            for r, i in enumerate(chunk):
                if not done[r]:
                    results[i].append(int(nxt[r]))
            done = done | torch.isin(nxt, stop)
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            nxt = torch.where(done, torch.full_like(nxt, lm.pad_id), nxt)
            mask = torch.cat([mask, torch.ones((len(chunk), 1), dtype=torch.long)], dim=1)
            if past is not None:
                pos = _positions(mask)[:, -1:]
                out = lm.forward(nxt.unsqueeze(1), mask, position_ids=pos.to(lm.device),
                                 past_key_values=past, use_cache=True)
                past = out.past_key_values
            else:
                ids = torch.cat([ids, nxt.unsqueeze(1)], dim=1)
                out = lm.forward(ids, mask, **_step_kwargs(lm, mask))
            logits = _logits(out)[:, -1].double().cpu()
    return results
