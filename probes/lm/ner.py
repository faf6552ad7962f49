"""Few-shot NER as reading comprehension (LM_PROBE_SPEC "Few-shot NER"; paper Sec. 3.2 and 4).

Prompt (paper Fig. 2), one line pair per example, then the test sentence::

    Sentence:\t<text>\n<type>:\t<entity or none>\n ... Sentence:\t<test>\n<type>:\t

16 examples: 9 holding an entity of the target type and 7 drawn at random from the rest of the training
split; greedy decoding of at most 15 new tokens, stopping at a newline; the first generated token is
chosen from the calibrated distribution ``softmax(W p)``, ``W = diag(p_cf)^-1``, where ``p_cf`` is the
next-token distribution after the same prompt with the content-free test sentence "N/A".

Choices the spec leaves open (say so if you change them):

* The prompt starts with the model's prefix token (GPT-2: ``<|endoftext|>``, a document boundary).
* An example's answer is the FIRST entity of the type in its sentence (the meta-learner extracts one
  entity at a time); the 16 examples are shuffled with the seed; if the prompt plus 15 tokens would
  exceed the model's context, examples are dropped from the front until it fits.
* Calibration changes only which first token is picked; tokens 2..15 are plain greedy (Zhao et al.
  2021 calibrate the first token of generations). ``softmax(W p)`` (paper) and ``W p / sum(W p)``
  (Zhao et al.'s code) have the same argmax; :func:`calibrate` offers both.
* Test sampling uses ``test_seed`` (default 0), not the example seed, so the three seeds score the same
  test sentences and their spread is that of the example draws; "about 2:1" is
  ``round(n_positive / 2)`` negatives (all negatives when fewer).
* Test seen / unseen replace EVERY entity of the test sentence (paper: "all NEs are replaced"): seen
  draws from the memorized list of the entity's own type (an entity whose type has no memorized entity
  is kept); unseen draws a random 8-letter lowercase string that is neither a word of the dataset nor a
  single token of the model (our stand-in for "does not exist in English").
* F1 per sentence outcome: a positive sentence answered correctly is a TP; answered "none" (or empty)
  a FN; answered with a wrong entity both a FP and a FN. A negative sentence answered incorrectly is a
  FP. F1 = 2TP / (2TP + FP + FN). ``count`` = positive test sentences.
* Scoring is literal to the spec: on a sentence with no gold entity, an answer sharing no
  (whitespace, case-folded) word with the sentence is correct, the empty answer included.
"""

from __future__ import annotations

import math
import string
import zlib
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from iclmem.errors import ProbeError
from iclmem.vocab import NerVariant
from probes.lm.data import Sentence
from probes.lm.model import LanguageModel, greedy_generate, next_token_logprobs
from probes.lm.settings import NER_VARIANTS, NerSettings

__all__ = [
    "levenshtein",
    "matches_gold",
    "is_correct",
    "outcome",
    "f1_from_outcomes",
    "calibrate",
    "sample_examples",
    "sample_test",
    "example_answer",
    "build_prompt",
    "random_nonword",
    "make_variant",
    "run_ner",
]

NONE = "none"
CONTENT_FREE = "N/A"


# ------------------------------------------------------------------------------------------- scoring
def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions), two-row dynamic programme."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        cur = [i]
        for j, cb in enumerate(b, start=1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def matches_gold(prediction: str, gold: str) -> bool:
    """Case-insensitive equality, or Levenshtein distance / len(gold) < 0.2."""
    p, g = prediction.strip().lower(), gold.strip().lower()
    if p == g:
        return True
    return len(g) > 0 and levenshtein(p, g) / len(g) < 0.2


def _words(text: str) -> set[str]:
    return set(text.lower().split())


def is_correct(prediction: str, golds: Sequence[str], sentence_text: str) -> bool:
    """The paper's rule: with gold entities, matching any one is correct; with none, "none" or an answer
    sharing no word with the input is correct."""
    if golds:
        return any(matches_gold(prediction, g) for g in golds)
    p = prediction.strip().lower()
    return p == NONE or not (_words(p) & _words(sentence_text))


def _is_none(prediction: str) -> bool:
    p = prediction.strip().lower()
    return p == NONE or p == ""


def outcome(prediction: str, golds: Sequence[str], sentence_text: str) -> tuple[int, int, int, int]:
    """(TP, FP, FN, TN) contribution of one test sentence."""
    correct = is_correct(prediction, golds, sentence_text)
    if golds:
        if correct:
            return 1, 0, 0, 0
        return (0, 0, 1, 0) if _is_none(prediction) else (0, 1, 1, 0)
    return (0, 0, 0, 1) if correct else (0, 1, 0, 0)


def f1_from_outcomes(outcomes: Sequence[tuple[int, int, int, int]]) -> dict[str, float]:
    tp, fp, fn, tn = (int(x) for x in np.sum(np.asarray(outcomes, dtype=np.int64).reshape(-1, 4), axis=0))
    prec = tp / (tp + fp) if tp + fp else 0.0
    rec = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else 0.0
    return {"precision": prec, "recall": rec, "f1": f1, "tp": tp, "fp": fp, "fn": fn, "tn": tn}


def calibrate(p: np.ndarray, p_cf: np.ndarray, mode: str = "softmax") -> np.ndarray:
    """Contextual calibration of a probability vector: ``W p`` with ``W = diag(p_cf)^-1``, then
    ``softmax`` (paper, "softmax") or division by the sum (Zhao et al.'s code, "normalize")."""
    p = np.asarray(p, dtype=np.float64)
    p_cf = np.asarray(p_cf, dtype=np.float64)
    if p.shape != p_cf.shape:
        raise ProbeError("p and p_cf must have the same shape")
    if (p_cf <= 0).any():
        raise ProbeError("the content-free distribution must be positive everywhere")
    q = p / p_cf
    if mode == "normalize":
        normalized: np.ndarray = q / q.sum()
        return normalized
    if mode == "softmax":
        e = np.exp(q - q.max())
        softmax: np.ndarray = e / e.sum()
        return softmax
    raise ProbeError(f"unknown calibration mode {mode!r}")


# ------------------------------------------------------------------------------------------- sampling
def _rng(*keys: object) -> np.random.Generator:
    return np.random.default_rng([zlib.crc32(str(k).encode()) for k in keys])


def sample_examples(train: Sequence[Sentence], entity_type: str, seed: int, shots: int = 16,
                    positives: int = 9) -> list[Sentence]:
    """``positives`` sentences holding the type, then ``shots - positives`` at random from the rest of
    the training split, shuffled."""
    rng = _rng("examples", entity_type, seed)
    pos_idx = [i for i, s in enumerate(train) if s.has_type(entity_type)]
    chosen = list(rng.choice(pos_idx, size=min(positives, len(pos_idx)), replace=False)) if pos_idx else []
    rest = sorted(set(range(len(train))) - set(chosen))
    k = min(shots - len(chosen), len(rest))
    if k > 0:
        chosen += list(rng.choice(rest, size=k, replace=False))
    order = rng.permutation(len(chosen))
    return [train[int(chosen[i])] for i in order]


def sample_test(test: Sequence[Sentence], entity_type: str, seed: int = 0, ratio: float = 2.0,
                max_sentences: int | None = None) -> list[Sentence]:
    """All sentences holding the type plus about ``1/ratio`` as many negatives (capped by ``max_sentences``
    at the same ratio)."""
    rng = _rng("test", entity_type, seed)
    pos = [i for i, s in enumerate(test) if s.has_type(entity_type)]
    neg = [i for i, s in enumerate(test) if not s.has_type(entity_type)]
    n_neg = min(len(neg), int(round(len(pos) / ratio)))
    if max_sentences is not None and len(pos) + n_neg > max_sentences:
        keep_pos = min(len(pos), max(1, int(round(max_sentences * len(pos) / (len(pos) + n_neg)))))
        n_neg = min(n_neg, max_sentences - keep_pos)
        pos = sorted(rng.choice(pos, size=keep_pos, replace=False).tolist())
    neg_pick = sorted(rng.choice(neg, size=n_neg, replace=False).tolist()) if n_neg > 0 else []
    return [test[i] for i in sorted(pos + neg_pick)]


def example_answer(sentence: Sentence, entity_type: str) -> str:
    ents = sentence.entities(entity_type)
    return ents[0] if ents else NONE


def _pair(text: str, entity_type: str, answer: str | None) -> str:
    return f"Sentence:\t{text}\n{entity_type}:\t" + ("" if answer is None else f"{answer}\n")


def build_prompt(examples: Sequence[Sentence], entity_type: str, test_text: str) -> str:
    return "".join(_pair(s.text, entity_type, example_answer(s, entity_type)) for s in examples) + \
        _pair(test_text, entity_type, None)


def random_nonword(rng: np.random.Generator, lm: LanguageModel | None = None, avoid: set[str] | None = None,
                   length: int = 8) -> str:
    for _ in range(1000):
        s = "".join(rng.choice(list(string.ascii_lowercase), size=length))
        if avoid and s in avoid:
            continue
        if lm is not None and len(lm.encode(" " + s)) <= 1:
            continue
        return s
    raise ProbeError("could not draw a non-word string")


def make_variant(sentences: Sequence[Sentence], variant: str, seed: int,
                 memorized: Mapping[str, Sequence[str]] | None = None, lm: LanguageModel | None = None,
                 vocabulary: set[str] | None = None) -> list[Sentence]:
    """The test sentences as-is, or with every entity replaced (seen: memorized entity of its type;
    unseen: random non-word lowercase string)."""
    if variant == NerVariant.AS_IS:
        return list(sentences)
    if variant not in NER_VARIANTS:
        raise ProbeError(f"unknown NER test variant {variant!r}; expected one of {NER_VARIANTS}")
    out = []
    for k, s in enumerate(sentences):
        rng = _rng("variant", variant, seed, k)
        repl: dict[int, str] = {}
        for i, sp in enumerate(s.spans):
            if variant == NerVariant.SEEN:
                pool = (memorized or {}).get(sp.type) or []
                if pool:
                    repl[i] = str(pool[int(rng.integers(len(pool)))])
            else:
                repl[i] = random_nonword(rng, lm, vocabulary)
        out.append(s.replace_spans(repl))
    return out


# ------------------------------------------------------------------------------------------- run
def _fit_prompt(lm: LanguageModel, examples: list[Sentence], entity_type: str, text: str,
                max_new: int) -> list[int]:
    ex = list(examples)
    while True:
        ids = [lm.prefix_id, *lm.encode(build_prompt(ex, entity_type, text))]
        if lm.max_length is None or len(ids) + max_new <= lm.max_length:
            return ids
        if not ex:
            raise ProbeError(f"{lm.name}: a test sentence alone exceeds the model's {lm.max_length} positions")
        ex = ex[1:]


def answer_text(lm: LanguageModel, ids: Sequence[int]) -> str:
    return lm.decode(ids).split("\n", 1)[0].strip()


_DEFAULT_SETTINGS = NerSettings()  # frozen: one instance serves every call


def run_ner(lm: LanguageModel, train: Sequence[Sentence], test: Sequence[Sentence], entity_type: str,
            seed: int, settings: NerSettings = _DEFAULT_SETTINGS,
            memorized: Mapping[str, Sequence[str]] | None = None) -> pd.DataFrame:
    """One (type, seed) NER run over the requested test variants.

    Returns one row per variant: variant, f1, precision, recall, count (positive sentences), n_eval,
    tp, fp, fn, tn. A "seen" variant with no memorized entity of the type gets NaN F1."""
    examples = sample_examples(train, entity_type, seed, settings.shots, settings.positives)
    base = sample_test(test, entity_type, settings.test_seed, settings.negative_ratio, settings.max_test_sentences)
    bias = None
    if settings.calibrate:
        cf = _fit_prompt(lm, examples, entity_type, CONTENT_FREE, settings.max_new_tokens)
        bias = -next_token_logprobs(lm, [cf])[0]
    vocabulary = {w.lower() for s in (*train, *test) for w in s.tokens}
    rows = []
    for variant in settings.variants:
        if variant == NerVariant.SEEN and not (memorized or {}).get(entity_type):
            rows.append({"variant": variant, "f1": float("nan"), "precision": float("nan"),
                         "recall": float("nan"), "count": 0, "n_eval": 0, "tp": 0, "fp": 0, "fn": 0, "tn": 0})
            continue
        sents = make_variant(base, variant, settings.test_seed, memorized, lm, vocabulary)
        prompts = [_fit_prompt(lm, examples, entity_type, s.text, settings.max_new_tokens) for s in sents]
        gen = greedy_generate(lm, prompts, settings.max_new_tokens, first_token_bias=bias,
                              batch_size=settings.batch_size)
        outs = [outcome(answer_text(lm, g), s.entities(entity_type), s.text) for g, s in zip(gen, sents)]
        score = f1_from_outcomes(outs) if outs else {"f1": math.nan, "precision": math.nan, "recall": math.nan,
                                                     "tp": 0, "fp": 0, "fn": 0, "tn": 0}
        rows.append({"variant": variant, **score, "count": sum(s.has_type(entity_type) for s in sents),
                     "n_eval": len(sents)})
    cols = ["variant", "f1", "precision", "recall", "count", "n_eval", "tp", "fp", "fn", "tn"]
    return pd.DataFrame(rows)[cols]
