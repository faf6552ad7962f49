"""A generated world with planted ground truth, and a tiny GPT-2 trained on it, all offline.

Used by the tests, the benchmark and the quickstart (``builtin: synthetic`` models and datasets).
Entities are made of syllables; *planted* entities occur many times in the LM's training corpus, the
others never. Unseen controls come in two kinds: random lowercase strings (unknown words: word exposure
should be low) and re-pairings of planted first and last names (known words, unseen transition:
transition exposure should be low).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from iclmem.atomic import write_json_atomic
from probes.lm.data import Sentence, Span, write_bio

__all__ = ["SyntheticWorld", "make_world", "corpus_sentences", "dataset_sentences", "train_tiny_gpt2",
           "build_tokenizer", "build_synthetic_assets", "random_strings", "ner_format_texts",
           "typing_texts"]

_SYLLABLES = ("ka", "lo", "mi", "ten", "sa", "ru", "vo", "ne", "di", "por", "ga", "lin", "fe", "mar",
              "to", "bel", "su", "ri", "dan", "co")
_TEMPLATES = (
    "{person} lives in {location} .",
    "{person} works for {organisation} .",
    "{organisation} opened an office in {location} .",
    "yesterday {person} met {person} in {location} .",
    "{organisation} hired {person} last year .",
    "the weather in {location} was cold today .",
    "we went to the market and bought some bread .",
    "it rained all day and the roads were wet .",
    "the report from {organisation} was late again .",
    "a letter for {person} arrived this morning .",
)
_TAG = {"person": "PER", "location": "LOC", "organisation": "ORG"}


def _word(rng: np.random.Generator, lo: int = 2, hi: int = 3) -> str:
    n = int(rng.integers(lo, hi + 1))
    return str("".join(rng.choice(_SYLLABLES, size=n)).capitalize())


def random_strings(rng: np.random.Generator, n: int, length: int = 8) -> list[str]:
    letters = list("abcdefghijklmnopqrstuvwxyz")
    return ["".join(rng.choice(letters, size=length)) for _ in range(n)]


@dataclass(frozen=True)
class SyntheticWorld:
    planted: dict[str, tuple[str, ...]]  # type -> entities present in the LM corpus
    held_out: dict[str, tuple[str, ...]]  # type -> entities only in the dataset files (never in the corpus)
    recombined: tuple[str, ...]  # planted first names with other planted last names (never in the corpus)
    random: tuple[str, ...]  # random lowercase strings (never in the corpus)


def make_world(seed: int = 0, n_planted: int = 16, n_held_out: int = 8) -> SyntheticWorld:
    rng = np.random.default_rng(seed)
    seen: set[str] = set()

    def unique(fn: Callable[[], str]) -> str:
        while True:
            x = fn()
            if x not in seen:
                seen.add(x)
                return x

    firsts = [unique(lambda: _word(rng)) for _ in range(n_planted + n_held_out)]
    lasts = [unique(lambda: _word(rng)) for _ in range(n_planted + n_held_out)]
    persons = [f"{f} {l}" for f, l in zip(firsts, lasts)]
    locations = [unique(lambda: _word(rng, 2, 3)) for _ in range(n_planted + n_held_out)]
    organisations = [unique(lambda: _word(rng, 2, 2)) + " " + str(rng.choice(["Industries", "Bank", "United"]))
                     for _ in range(n_planted + n_held_out)]
    planted = {"person": tuple(persons[:n_planted]), "location": tuple(locations[:n_planted]),
               "organisation": tuple(organisations[:n_planted])}
    held = {"person": tuple(persons[n_planted:]), "location": tuple(locations[n_planted:]),
            "organisation": tuple(organisations[n_planted:])}
    recombined = tuple(f"{firsts[i]} {lasts[(i + 1 + i % 3) % n_planted]}" for i in range(n_planted))
    return SyntheticWorld(planted, held, recombined, tuple(random_strings(rng, n_planted)))


def _fill(template: str, pools: Mapping[str, Sequence[str]], rng: np.random.Generator) -> Sentence:
    tokens: list[str] = []
    spans: list[Span] = []
    for piece in template.split():
        if piece.startswith("{") and piece.endswith("}"):
            typ = piece[1:-1]
            ent = str(pools[typ][int(rng.integers(len(pools[typ])))])
            start = len(tokens)
            tokens.extend(ent.split())
            spans.append(Span(start, len(tokens), typ))
        else:
            tokens.append(piece)
    return Sentence(tuple(tokens), tuple(spans))


def corpus_sentences(world: SyntheticWorld, n: int = 1200, seed: int = 1) -> list[Sentence]:
    """The LM training corpus: templates filled with planted entities only."""
    rng = np.random.default_rng(seed)
    return [_fill(_TEMPLATES[int(rng.integers(len(_TEMPLATES)))], world.planted, rng) for _ in range(n)]


def dataset_sentences(world: SyntheticWorld, n: int, seed: int) -> list[Sentence]:
    """NER/NET data: templates filled with planted and held-out entities."""
    rng = np.random.default_rng(seed)
    pools = {t: list(world.planted[t]) + list(world.held_out[t]) for t in world.planted}
    return [_fill(_TEMPLATES[int(rng.integers(len(_TEMPLATES)))], pools, rng) for _ in range(n)]


def ner_format_texts(world: SyntheticWorld, n: int = 400, seed: int = 4, pairs: int = 3) -> list[str]:
    """Blocks in the few-shot NER prompt format (planted entities only), so that the tiny model learns
    the "Sentence: / <type>:" pattern the NER probe asks it to continue."""
    from probes.lm.ner import build_prompt, example_answer

    rng = np.random.default_rng(seed)
    types = list(world.planted)
    out = []
    for _ in range(n):
        sents = [_fill(_TEMPLATES[int(rng.integers(len(_TEMPLATES)))], world.planted, rng) for _ in range(pairs)]
        typ = types[int(rng.integers(len(types)))]
        out.append(build_prompt(sents[:-1], typ, sents[-1].text) + example_answer(sents[-1], typ) + "\n")
    return out


def typing_texts(world: SyntheticWorld, n: int = 300, seed: int = 5) -> list[str]:
    """"<planted entity> is a <keyword>" statements (NET keywords), so zero-shot NET has something to
    find for planted entities and nothing for held-out ones."""
    from probes.lm.net import NET_KEYWORDS

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        typ = list(world.planted)[int(rng.integers(len(world.planted)))]
        ent = world.planted[typ][int(rng.integers(len(world.planted[typ])))]
        kw = NET_KEYWORDS[typ][int(rng.integers(len(NET_KEYWORDS[typ])))]
        out.append(f"{ent} is a {kw} .")
    return out


def build_tokenizer(texts: Sequence[str], vocab_size: int = 1000) -> Any:
    """A byte-level BPE tokenizer (GPT-2 style) trained on ``texts``, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast_tokenizer: Any = PreTrainedTokenizerFast  # transformers' constructors are untyped
    return fast_tokenizer(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                          unk_token="<|endoftext|>", pad_token="<|endoftext|>")


def train_tiny_gpt2(texts: Sequence[str], out_dir: str | Path, seed: int = 0, steps: int = 300,
                    batch_size: int = 32, lr: float = 3e-3, vocab_size: int = 1000, n_positions: int = 1024,
                    extra_tokenizer_texts: Sequence[str] = (), n_embd: int = 64, n_layer: int = 2,
                    n_head: int = 2) -> Path:
    """Train a 2-layer GPT-2 on ``texts`` (one sample each, ``<|endoftext|>`` before and after) and save
    model + tokenizer with ``save_pretrained``. About 20 s on one CPU thread at 200 steps."""
    import torch

    threads = torch.get_num_threads()
    # One thread: on a small shared CPU, two threads of a tiny model mostly spin-wait (60x slower here).
    torch.set_num_threads(1)
    try:
        return _train(texts, out_dir, seed, steps, batch_size, lr, vocab_size, n_positions,
                      extra_tokenizer_texts, n_embd, n_layer, n_head)
    finally:
        torch.set_num_threads(threads)


def _train(texts: Sequence[str], out_dir: str | Path, seed: int, steps: int, batch_size: int, lr: float,
           vocab_size: int, n_positions: int, extra_tokenizer_texts: Sequence[str], n_embd: int, n_layer: int,
           n_head: int) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    tokenizer = build_tokenizer(list(texts) + list(extra_tokenizer_texts), vocab_size)
    eot = tokenizer.eos_token_id
    config_class: Any = GPT2Config  # transformers' constructors are untyped
    cfg = config_class(vocab_size=len(tokenizer), n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
                       n_head=n_head, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot,
                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)  # type: ignore[no-untyped-call]
    encoded = [[eot, *tokenizer(t, add_special_tokens=False)["input_ids"], eot] for t in texts]
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        idx = rng.integers(len(encoded), size=batch_size)
        width = max(len(encoded[i]) for i in idx)
        ids = torch.full((batch_size, width), eot, dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        for r, i in enumerate(idx):
            seq = torch.tensor(encoded[i])
            ids[r, : len(seq)] = seq
            labels[r, : len(seq)] = seq
            mask[r, : len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()  # type: ignore[no-untyped-call]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_synthetic_assets(root: str | Path, seed: int = 0, steps: int = 300) -> tuple[Path, Path]:
    """Build (once; later calls reuse it) a tiny trained GPT-2 and a CoNLL-2003-format dataset folder.

    Returns (model_dir, dataset_dir). Writing goes to a temporary folder renamed into place."""
    root = Path(root)
    model_dir, data_dir, marker = root / "model", root / "conll", root / "assets.json"
    if marker.is_file() and model_dir.is_dir() and data_dir.is_dir():
        return model_dir, data_dir
    tmp = root.parent / f".{root.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    world = make_world(seed)
    texts = ([s.text for s in corpus_sentences(world, seed=seed + 1)] + ner_format_texts(world, seed=seed + 4)
             + typing_texts(world, seed=seed + 5))
    t0 = time.time()
    train_tiny_gpt2(texts, tmp / "model", seed=seed, steps=steps)
    write_bio(dataset_sentences(world, 120, seed + 2), tmp / "conll" / "train.txt")
    write_bio(dataset_sentences(world, 60, seed + 3), tmp / "conll" / "test.txt")
    write_json_atomic(tmp / "assets.json", {"seed": seed, "steps": steps, "train_seconds": round(time.time() - t0, 2)})
    root.parent.mkdir(parents=True, exist_ok=True)
    if root.exists():
        shutil.rmtree(root)
    os.replace(tmp, root)
    return model_dir, data_dir
