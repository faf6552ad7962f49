"""The LM probes' settings and defaults, torch-free: what an LM sweep file's blocks are read into and take their
defaults from (``orchestrator.schema.lm_config``), so reading or refusing a sweep file never imports torch."""

from __future__ import annotations

from dataclasses import dataclass

from iclmem.vocab import NerVariant, values

__all__ = ["DEFAULT_BATCH_SIZE", "NER_VARIANTS", "NerSettings"]

DEFAULT_BATCH_SIZE = 32  # sequences per forward pass of the exposure and NET probes
NER_VARIANTS: tuple[str, ...] = values(NerVariant)  # the few-shot NER probe's entity variants, in order


@dataclass(frozen=True)
class NerSettings:
    """The few-shot NER probe (``probes.lm.ner.run_ner``): shots per prompt and how many hold the type, the answer's
    token budget, contextual calibration, the variants, the test draw and its size, and prompts per batch."""

    shots: int = 16
    positives: int = 9
    max_new_tokens: int = 15
    calibrate: bool = True
    variants: tuple[str, ...] = NER_VARIANTS
    test_seed: int = 0
    negative_ratio: float = 2.0  # positives : negatives
    max_test_sentences: int | None = None
    batch_size: int = 8
