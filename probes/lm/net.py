"""Zero-shot named-entity typing by minimum perplexity (LM_PROBE_SPEC "Zero-shot NET"; paper eqs. 2-3).

For entity ``e`` every keyword ``k`` of every candidate type is scored with the perplexity of
``"e is a k"`` and the type of the lowest-perplexity keyword is predicted. All (entity, keyword)
sentences are scored in batches.

Choices the spec leaves open:

* The template is used literally, "is a" even before a vowel ("is a organisation"), as in the paper.
* Every sentence is preceded by the same prefix token as the exposure test (GPT-2: ``<|endoftext|>``,
  a document boundary) so that its first token is scored too; perplexity is over all sentence tokens.
* A type without keywords in the spec's table (WNUT's corporation, group, product) uses its own name as
  its single keyword ("we do not include other keywords for product, corporation and group").
* F1 per type is the one-vs-rest F1 of the multi-class prediction; the macro-average is the mean over
  the types present in the evaluated set; "baseline_f1" is the expected F1 of the paper's weighted
  random guess (guessing type t with its frequency p_t gives precision = recall = p_t).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from iclmem.errors import ProbeError
from probes.lm.model import LanguageModel, token_logprobs
from probes.lm.settings import DEFAULT_BATCH_SIZE

__all__ = ["NET_KEYWORDS", "MACRO", "keywords_for", "net_query", "predict_types", "f1_table"]

NET_KEYWORDS: dict[str, tuple[str, ...]] = {
    "person": ("person", "character"),
    "location": ("location", "place", "city", "country"),
    "organisation": ("organisation", "company", "group", "institution", "club", "corporation"),
    "creative work": ("work", "title", "movie", "song", "book"),
}
MACRO = "macro-average"


def keywords_for(types: Sequence[str], overrides: Mapping[str, Sequence[str]] | None = None
                 ) -> dict[str, tuple[str, ...]]:
    out = {}
    for t in types:
        kws = (overrides or {}).get(t) or NET_KEYWORDS.get(t) or (t,)
        out[t] = tuple(kws)
    return out


def net_query(entity: str, keyword: str) -> str:
    return f"{entity} is a {keyword}"


def predict_types(lm: LanguageModel, entities: Sequence[str], types: Sequence[str],
                  keywords: Mapping[str, Sequence[str]] | None = None,
                  batch_size: int = DEFAULT_BATCH_SIZE) -> pd.DataFrame:
    """Predicted type per entity. Columns: entity, predicted, keyword, log_perplexity (of the winner)."""
    if not types:
        raise ProbeError("NET needs at least one candidate type")
    kw = keywords_for(types, keywords)
    pairs = [(t, k) for t in types for k in kw[t]]
    prefix = lm.prefix_id
    seqs = [(prefix, *lm.encode(net_query(e, k))) for e in entities for (_, k) in pairs]
    lps = token_logprobs(lm, seqs, batch_size)
    nll = np.array([-lp.mean() for lp in lps], dtype=np.float64).reshape(len(entities), len(pairs))
    best = nll.argmin(axis=1) if len(entities) else np.zeros(0, dtype=int)
    return pd.DataFrame({
        "entity": list(entities),
        "predicted": [pairs[b][0] for b in best],
        "keyword": [pairs[b][1] for b in best],
        "log_perplexity": nll[np.arange(len(entities)), best] if len(entities) else np.zeros(0),
    })


def f1_table(gold: Sequence[str], predicted: Sequence[str], types: Sequence[str] | None = None) -> pd.DataFrame:
    """Per-type precision, recall, F1 and count (gold entities of the type), plus a macro-average row.

    Types with no gold entity in this set are left out (an empty subset gives an empty table)."""
    g = np.asarray(list(gold), dtype=object)
    p = np.asarray(list(predicted), dtype=object)
    if g.shape != p.shape:
        raise ProbeError("gold and predicted labels differ in length")
    types = list(types) if types is not None else sorted(set(g))
    rows = []
    for t in types:
        n = int((g == t).sum())
        if n == 0:
            continue
        tp = int(((g == t) & (p == t)).sum())
        n_pred = int((p == t).sum())
        prec = tp / n_pred if n_pred else 0.0
        rec = tp / n
        f1 = 2 * prec * rec / (prec + rec) if prec + rec > 0 else 0.0
        rows.append({"entity_type": t, "precision": prec, "recall": rec, "f1": f1, "count": n,
                     "baseline_f1": n / len(g)})
    if rows:
        df = pd.DataFrame(rows)
        rows.append({"entity_type": MACRO, "precision": float(df["precision"].mean()),
                     "recall": float(df["recall"].mean()), "f1": float(df["f1"].mean()),
                     "count": int(df["count"].sum()), "baseline_f1": float(df["baseline_f1"].mean())})
    return pd.DataFrame(rows, columns=["entity_type", "precision", "recall", "f1", "count", "baseline_f1"])
