"""Planted ground truth for one model: can the audit find memorization that is known to be there?

The members of a built-in table get shuffled labels, the model is fine-tuned on them for many epochs (no
Ray: the pure fine-tuning and probe paths the sweep runs inside its actors), and the last checkpoint is
probed against the untouched model. Labels a model could only know by memorizing the rows: the
calibrated AUC's interval must lie above 0.5. Used by the adapter tests and by
``benchmarks/planted_adapters.py``; ``reference_statistics=False`` probes without handing the model the
fine-tuning context's feature statistics, which shows what a model that normalises over its context
loses without them.
"""

from __future__ import annotations

import dataclasses
import tempfile
from typing import Any, Mapping, Sequence

from iclmem.vocab import LabelMode

PLANTED_SUITE = ("base", "skew_true_x2", "position_first", "combo2_random_distractors_1")


def planted_check(model: str, options: Mapping[str, Any], *, lr: float = 1e-3, epochs: int = 200,
                  task: str = "iris", q: int = 30, context_size: int = 60, seed: int = 0, bootstrap: int = 200,
                  suite: Sequence[str] = PLANTED_SUITE, reference_statistics: bool = True,
                  torch_threads: int = 1) -> dict[str, Any]:
    """Fine-tune ``model`` on label-shuffled members and probe its last checkpoint; returns the results
    row (outcome, deciding score kind, calibrated AUC with its interval, loss ratio, ...). Runs on
    ``torch_threads`` threads, like a sweep's trial (``resources.torch_threads_per_trial``, default 1): the
    thread count changes the order of float sums, and over hundreds of steps the fine-tuned weights with it."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        return _planted_check(model, options, lr=lr, epochs=epochs, task=task, q=q, context_size=context_size,
                              seed=seed, bootstrap=bootstrap, suite=suite, reference_statistics=reference_statistics)
    finally:
        torch.set_num_threads(previous)


def _planted_check(model: str, options: Mapping[str, Any], *, lr: float, epochs: int, task: str, q: int,
                   context_size: int, seed: int, bootstrap: int, suite: Sequence[str],
                   reference_statistics: bool) -> dict[str, Any]:
    from probes.calibration import model_digest
    from probes.manipulations import suite_from_spec
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.data import PrepSettings, TaskSource, prepare_task
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    # Stage I under the model's own input contract (ConTextTab reads the real columns, TabICL/TabPFN
    # unreduced features), as a sweep prepares it for that model.
    prep = build_model(model, **options).prep_settings(PrepSettings(context_size=context_size))
    prepared = prepare_task(TaskSource(task, "builtin"), prep, LabelMode.SHUFFLED_MEMBERS, seed=seed, q=q)
    finetuner = Finetuner(FinetuneSpec(model=model, model_options=dict(options), lr=lr, epochs=epochs, seed=seed),
                          [prepared])
    finetuner.train()
    base = build_model(model, **options)
    queries = ProbeQueries.from_task(prepared)
    if not reference_statistics:
        queries = dataclasses.replace(queries, reference_rows=None)
    plan = ProbePlan.build(queries, suite_from_spec(list(suite)), prepared.seed,
                           compress_rows=base.supports_context_weights)
    with tempfile.TemporaryDirectory() as cache:
        result = probe_checkpoint(finetuner.model, prepared, plan, cache, model_digest(base), base,
                                  ProbeSettings(n_resamples=bootstrap, null_splits=0),  # the planted split only
                                  {"run_id": f"planted-{model}"}, epoch=epochs)
    return result.row
