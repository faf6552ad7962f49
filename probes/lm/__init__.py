"""Named-entity probes of causal language models (LM_PROBE_SPEC.md; paper: seeds/001).

Public API:

* data       :func:`load_dataset`, :func:`read_bio`, :func:`read_entity_list`, :class:`Sentence`,
             :data:`DATASET_FORMATS` (conll2003, wnut2017, mit_movie, bio, entity_list)
* model      :func:`load_lm` (local directory only), :func:`token_logprobs`, :func:`greedy_generate`
* exposure   :func:`compute_exposure` (word / transition / rank exposure, batched), :func:`classify`,
             :data:`DEFAULT_THRESHOLDS`, :func:`memorized_lists`, :func:`exposure_auc`
* NET        :func:`predict_types`, :func:`f1_table`, :data:`NET_KEYWORDS`
* NER        :func:`run_ner`, :func:`is_correct`, :func:`levenshtein`, :func:`calibrate`
* units      :data:`LM_UNITS` (exposure, net, ner work units), :class:`LMUnit`, :class:`LMUnitResult`
* report     :func:`lm_tables`, :func:`lm_report_section`

The sweep driver that runs the units on the probe pool is ``orchestrator.driver.lm_sweep`` (``iclmem lm``).

Submodules import torch / transformers lazily where they can; ``import probes.lm`` needs torch, pandas,
pydantic and pyyaml.
"""

from probes.lm.data import (
    DATASET_FORMATS,
    LMDataset,
    Sentence,
    Span,
    canonical_type,
    load_dataset,
    read_bio,
    read_entity_list,
    write_bio,
)
from probes.lm.exposure import (
    DEFAULT_THRESHOLDS,
    ThresholdRule,
    classify,
    classify_table,
    compute_exposure,
    exposure_auc,
    memorized_lists,
    rank_exposures,
)
from probes.lm.model import LanguageModel, greedy_generate, load_lm, token_logprobs
from probes.lm.ner import NerSettings, calibrate, is_correct, levenshtein, matches_gold, run_ner
from probes.lm.net import NET_KEYWORDS, f1_table, predict_types
from probes.lm.report import lm_report_section, lm_tables
from probes.lm.units import LM_UNITS, LMUnit, LMUnitResult

__all__ = [
    "DATASET_FORMATS", "LMDataset", "Sentence", "Span", "canonical_type", "load_dataset", "read_bio",
    "read_entity_list", "write_bio",
    "DEFAULT_THRESHOLDS", "ThresholdRule", "classify", "classify_table", "compute_exposure", "exposure_auc",
    "memorized_lists", "rank_exposures",
    "LanguageModel", "greedy_generate", "load_lm", "token_logprobs",
    "NerSettings", "calibrate", "is_correct", "levenshtein", "matches_gold", "run_ner",
    "NET_KEYWORDS", "f1_table", "predict_types",
    "lm_report_section", "lm_tables",
    "LM_UNITS", "LMUnit", "LMUnitResult",
]
