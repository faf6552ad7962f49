"""Entity exposure: has the model seen this entity? (LM_PROBE_SPEC "Exposure"; paper eqs. 4-6).

Every entity is fed as ``[prefix] + tokens(entity)`` where the prefix is the tokenizer's unknown token
(GPT-2: ``<|endoftext|>``), and ``p(s_i | s_<i)`` is read for each entity token, all entities batched.

* word exposure       = prod over words of (1 if the word is one token, else p(its last token | before))
* transition exposure = min over the first tokens of words 2..k of p(token | before); NaN for one-word
  entities (they are skipped, as the spec says)
* rank exposure       = log2 |S| - log2 rank(x), rank by perplexity among the candidate set S
  (Carlini et al.); rank 1 = lowest perplexity, ties share the best rank ("competition" ranking:
  1 + number of candidates with strictly lower perplexity).

Choices the spec leaves open (paper silent):

* Words are whitespace-separated (the entity's whitespace is collapsed first). A token is assigned to
  the word holding its first non-space character, so punctuation inside a word ("SK-II") does not make
  a new word, unlike the tokenizer's own pre-tokenizer.
* ``leading_space=False`` (default): the entity is encoded right after the prefix with no added space,
  as the spec says ("the entity prefixed by a fixed string") and as the paper's thresholds were derived.
  ``True`` encodes ``" " + entity`` (GPT-2's running-text ``Ġword`` tokens); the thresholds would then
  have to be re-derived for it.
* One-word entities are left out of both exposure groups (unclassified under every rule) where the paper
  ignores them: MIT Movie and DBpedia-style entity lists ("rare or often spurious"); a rule's
  ``min_words`` says so.
* Perplexity for the rank exposure is over the entity's tokens only (the prefix is context).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from iclmem.errors import ConfigError, ProbeError
from iclmem.vocab import ExposureClass, ExposureMetric, values
from probes.lm.settings import DEFAULT_BATCH_SIZE
from probes.metrics import auc

if TYPE_CHECKING:  # the model (torch) is imported where entities are scored; reading thresholds needs none
    from probes.lm.model import LanguageModel

__all__ = [
    "EntityTokens",
    "ThresholdRule",
    "DEFAULT_THRESHOLDS",
    "MEMORIZED",
    "UNMEMORIZED",
    "UNCLASSIFIED",
    "default_thresholds",
    "tokenize_entity",
    "tokenize_entities",
    "exposures_from_logprobs",
    "rank_exposures",
    "compute_exposure",
    "classify",
    "classify_table",
    "memorized_lists",
    "exposure_auc",
    "EXPOSURE_COLUMNS",
]

MEMORIZED, UNMEMORIZED, UNCLASSIFIED = values(ExposureClass)
EXPOSURE_COLUMNS = ("entity", "entity_type", "n_words", "n_tokens", "word_exposure",
                    "transition_exposure", "log_perplexity", "rank_exposure")


@dataclass(frozen=True)
class ThresholdRule:
    """memorized iff exposure >= ``memorized``; unmemorized iff exposure <= ``unmemorized``."""

    metric: str  # an ExposureMetric value
    memorized: float
    unmemorized: float
    # entities with fewer words are unclassified under this rule (2: the paper ignores one-word entities)
    min_words: int = 1

    def __post_init__(self) -> None:
        if self.metric not in values(ExposureMetric):
            raise ConfigError(f"exposure metric must be one of {values(ExposureMetric)}, got {self.metric!r}")
        if not (0.0 <= self.unmemorized <= self.memorized <= 1.0):
            raise ConfigError(
                f"exposure thresholds need 0 <= unmemorized ({self.unmemorized}) <= memorized ({self.memorized}) <= 1"
            )

    @property
    def column(self) -> str:
        return f"{self.metric}_exposure"


# Paper Tables 8-9. WNUT2017 and generic BIO data have no row there (the paper does not split WNUT);
# they take CoNLL's word-exposure thresholds, the clean/regular-NE default.
DEFAULT_THRESHOLDS: dict[str, tuple[ThresholdRule, ...]] = {
    "conll2003": (ThresholdRule("word", 0.8, 1e-4),),
    # the paper ignores one-word entities of MIT Movie and DBpedia in both groups (min_words=2)
    "mit_movie": (ThresholdRule("transition", 1e-3, 1e-5, min_words=2),),
    "entity_list": (ThresholdRule("word", 1.0, 1e-6, min_words=2),
                    ThresholdRule("transition", 0.01, 1e-6, min_words=2)),  # DBpedia
    "wnut2017": (ThresholdRule("word", 0.8, 1e-4),),
    "bio": (ThresholdRule("word", 0.8, 1e-4),),
}


def default_thresholds(fmt: str) -> tuple[ThresholdRule, ...]:
    return DEFAULT_THRESHOLDS.get(fmt, DEFAULT_THRESHOLDS["bio"])


@dataclass(frozen=True)
class EntityTokens:
    ids: tuple[int, ...]  # entity tokens, prefix not included
    word_index: tuple[int, ...]  # word of each token (0-based)
    n_words: int


def _normalise(entity: str) -> list[str]:
    words = str(entity).split()
    if not words:
        raise ProbeError("cannot score an empty entity")
    return words


def _word_index(text: str, words: list[str], lead: str, offsets: Sequence[tuple[int, int]]) -> list[int]:
    """Word of each token from its character offsets: the word holding the token's first non-space
    character; a pure-space token belongs to the next word. ``text`` is ``lead + " ".join(words)``."""
    starts = []
    pos = len(lead)
    for word in words:
        starts.append(pos)
        pos += len(word) + 1
    last = len(words) - 1
    index: list[int] = []
    prev = 0
    for (s, e) in offsets:
        c = s
        while c < e and text[c] == " ":
            c += 1
        if c >= e:  # empty or pure-space span: the word after it
            w = min(bisect_right(starts, e - 1), last) if e > 0 else 0
        else:
            w = bisect_right(starts, c) - 1
        # offsets of byte-level pieces of one character can repeat; keep word indices monotone
        prev = max(prev, min(max(w, 0), last))
        index.append(prev)
    return index


def tokenize_entities(lm: LanguageModel, entities: Sequence[str], leading_space: bool = False) -> list[EntityTokens]:
    """Tokens of each entity and the whitespace word each token belongs to (one batched tokenizer call
    for fast tokenizers; incremental encoding of word prefixes otherwise)."""
    lead = " " if leading_space else ""
    word_lists = [_normalise(e) for e in entities]
    texts = [lead + " ".join(ws) for ws in word_lists]
    tok = lm.tokenizer
    out: list[EntityTokens] = []
    if getattr(tok, "is_fast", False):
        # the Rust tokenizer directly: same ids and offsets, without transformers' per-call overhead
        # (a third of the tokenization time for short entities)
        encodings = tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False) if texts else []
        for text, words, encoding in zip(texts, word_lists, encodings):
            ids, offsets = encoding.ids, encoding.offsets
            if not ids:
                raise ProbeError("an entity encoded to no token")
            out.append(EntityTokens(tuple(ids), tuple(_word_index(text, words, lead, offsets)), len(words)))
        return out
    for words in word_lists:
        so_far: list[int] = []
        index: list[int] = []
        for w in range(len(words)):
            upto = lm.encode(lead + " ".join(words[: w + 1]))
            if upto[: len(so_far)] != so_far:
                raise ProbeError(f"{lm.name}: cannot align tokens to words for this tokenizer")
            index.extend([w] * (len(upto) - len(so_far)))
            so_far = upto
        if not so_far:
            raise ProbeError("an entity encoded to no token")
        out.append(EntityTokens(tuple(so_far), tuple(index), len(words)))
    return out


def tokenize_entity(lm: LanguageModel, entity: str, leading_space: bool = False) -> EntityTokens:
    """Tokens of one entity and the whitespace word each one belongs to."""
    return tokenize_entities(lm, [entity], leading_space)[0]


def exposures_from_logprobs(logprobs: Sequence[float] | np.ndarray, word_index: Sequence[int]) -> tuple[float, float]:
    """(word exposure, transition exposure) from the entity tokens' log-probabilities.

    ``logprobs[k] = log p(token_k | prefix, token_<k)``, ``word_index[k]`` its word (non-decreasing)."""
    lp = [float(x) for x in logprobs]
    wi = list(word_index)
    if len(lp) != len(wi) or not lp:
        raise ProbeError("log-probabilities and word indices must be non-empty and of equal length")
    log_word = 0.0
    min_start = math.inf
    n = len(wi)
    for k in range(n):
        first = k == 0 or wi[k] != wi[k - 1]
        last = k == n - 1 or wi[k + 1] != wi[k]
        if last and not first:  # the last piece of a word split into several tokens
            log_word += lp[k]
        if first and k > 0:  # a token that starts a new word after the first
            min_start = min(min_start, lp[k])
    trans = math.exp(min_start) if min_start < math.inf else float("nan")
    return math.exp(log_word), trans


def rank_exposures(log_perplexity: Sequence[float], candidates: Sequence[float] | None = None) -> np.ndarray:
    """Carlini rank exposure of each value among the candidate set (default: the values themselves).

    With separate ``candidates`` each value is ranked within ``candidates`` plus itself."""
    x = np.asarray(log_perplexity, dtype=np.float64)
    if candidates is None:
        pool = np.sort(x)
        size = x.size
        rank = 1 + np.searchsorted(pool, x, side="left")
    else:
        pool = np.sort(np.asarray(candidates, dtype=np.float64))
        size = pool.size + 1
        rank = 1 + np.searchsorted(pool, x, side="left")
    return math.log2(size) - np.log2(rank)


def compute_exposure(lm: LanguageModel, entities: Sequence[str], entity_types: Sequence[str] | None = None,
                     batch_size: int = DEFAULT_BATCH_SIZE, leading_space: bool = False,
                     candidates: Sequence[str] | None = None) -> pd.DataFrame:
    """Word, transition and rank exposure of every entity, batched over entities.

    Returns a DataFrame with :data:`EXPOSURE_COLUMNS` in the order of ``entities``. ``candidates`` (strings)
    is the rank-exposure candidate set S; by default S is ``entities`` itself."""
    entities = [" ".join(_normalise(e)) for e in entities]
    types = list(entity_types) if entity_types is not None else [""] * len(entities)
    if len(types) != len(entities):
        raise ProbeError("entity_types must be as long as entities")
    toks = tokenize_entities(lm, entities, leading_space)
    prefix = lm.prefix_id
    from probes.lm.model import token_logprobs

    lps = token_logprobs(lm, [(prefix, *t.ids) for t in toks], batch_size)
    rows = []
    for e, typ, t, lp in zip(entities, types, toks, lps):
        w, tr = exposures_from_logprobs(lp, t.word_index)
        rows.append((e, typ, t.n_words, len(t.ids), w, tr, -float(lp.sum()) / len(lp)))
    df = pd.DataFrame(rows, columns=list(EXPOSURE_COLUMNS[:-1]))
    cand = None
    if candidates is not None:
        ctoks = tokenize_entities(lm, list(candidates), leading_space)
        clps = token_logprobs(lm, [(prefix, *t.ids) for t in ctoks], batch_size)
        cand = [float(-lp.mean()) for lp in clps]
    df["rank_exposure"] = rank_exposures(df["log_perplexity"].to_numpy(), cand)
    return df


def classify(values: Any, rule: ThresholdRule) -> np.ndarray:
    """"memorized" / "unmemorized" / "unclassified" per value (NaN, e.g. a one-word entity's
    transition exposure, is unclassified)."""
    v = np.asarray(values, dtype=np.float64)
    out = np.full(v.shape, UNCLASSIFIED, dtype=object)
    out[v >= rule.memorized] = MEMORIZED
    out[v <= rule.unmemorized] = UNMEMORIZED
    return out


def classify_table(exposure: pd.DataFrame, rules: Sequence[ThresholdRule]) -> pd.DataFrame:
    """Add one ``class_<metric>`` column per rule (the first rule is the dataset's primary criterion).
    Entities with fewer than the rule's ``min_words`` words are unclassified (in neither group)."""
    out = exposure.copy()
    for rule in rules:
        cls = classify(out[rule.column], rule)
        if rule.min_words > 1:
            cls[out["n_words"].to_numpy() < rule.min_words] = UNCLASSIFIED
        out[f"class_{rule.metric}"] = cls
    return out


def memorized_lists(classified: pd.DataFrame, rule: ThresholdRule) -> dict[str, list[str]]:
    """entity type -> memorized entities under ``rule`` (sorted), for the NER "test seen" variant."""
    col = f"class_{rule.metric}"
    if col not in classified.columns:
        classified = classify_table(classified, [rule])
    mem = classified[classified[col] == MEMORIZED]
    return {t: sorted(g["entity"].unique()) for t, g in mem.groupby("entity_type")}


def exposure_auc(seen: Any, unseen: Any) -> float:
    """AUC of an exposure separating seen (positive) from unseen entities; NaN values are dropped.
    Uses :func:`probes.metrics.auc` (Mann-Whitney, ties 1/2)."""
    s = np.asarray(seen, dtype=np.float64)
    u = np.asarray(unseen, dtype=np.float64)
    return auc(s[~np.isnan(s)], u[~np.isnan(u)])


def exposure_counts(classified: pd.DataFrame, rules: Sequence[ThresholdRule]) -> list[Mapping[str, Any]]:
    """Per (rule, entity type, class) counts, for the results table."""
    rows: list[Mapping[str, Any]] = []
    for rule in rules:
        col = f"class_{rule.metric}"
        for typ, g in classified.groupby("entity_type"):
            counts = g[col].value_counts()
            for cls in (MEMORIZED, UNMEMORIZED, UNCLASSIFIED):
                rows.append({"entity_type": typ, "criterion": rule.metric, "variant": cls,
                             "count": int(counts.get(cls, 0)), "n_eval": len(g)})
    return rows
