"""Planted ground truth for one model: can the audit find memorization that is known to be there?

The members of a built-in table get shuffled labels, the model is fine-tuned on them for many epochs (no
Ray: the pure fine-tuning and probe paths the sweep runs inside its actors), and the last checkpoint is
probed against the untouched model. Labels a model could only know by memorizing the rows: the
calibrated AUC's interval must lie above 0.5. Used by the adapter tests and by
``benchmarks/planted_adapters.py``; ``reference_statistics=False`` probes without handing the model the
fine-tuning context's feature statistics, which shows what a model that normalises over its context
loses without them.

The no-membership control (:func:`no_membership_check`) is the opposite: a model that never saw the audited
rows, audited as if it had. Every verdict on it other than no_signal (or collapse) is a false claim, in
every label mode; under the paper's unmatched ``shuffled_members`` design it fails, which is the witness
that the control can fail.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from iclmem.errors import ConfigError
from iclmem.record import RunIdentity
from iclmem.vocab import LabelDesign, LabelMode, Regime, SourceKind, Vocab

PLANTED_SUITE = ("base", "skew_true_x2", "position_first", "combo2_random_distractors_1")


class NoMembershipControl(Vocab):
    """Models that never saw the audited rows (``no_membership_check``)."""

    UNRELATED_TRUE = "unrelated_true"  # fine-tuned on other rows of the table, with their true labels
    UNRELATED_FLIPPED = "unrelated_flipped"  # the same rows with every label moved to the next class
    NOISED = "noised"  # the base model's weights plus Gaussian noise, never fine-tuned


def planted_check(model: str, options: Mapping[str, Any], *, lr: float = 1e-3, epochs: int = 200,
                  task: str = "iris", q: int = 30, context_size: int = 60, seed: int = 0, bootstrap: int = 200,
                  suite: Sequence[str] = PLANTED_SUITE, reference_statistics: bool = True,
                  torch_threads: int = 1) -> dict[str, Any]:
    """Fine-tune ``model`` on label-shuffled members and probe its last checkpoint; returns the results
    row (outcome, deciding score kind, calibrated AUC with its interval, loss ratio, ..., ``epoch``: the last
    epoch trained). ``options`` with ``recipe: upstream`` fine-tune through the package's own fine-tuner
    (``trainables.upstream``), which may stop early. Runs on
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
    from trainables.finetune import Finetuner
    from trainables.models import build_model
    from trainables.spec import FinetuneSpec
    from trainables.upstream import UpstreamFinetuner, upstream_options

    # Stage I under the model's own input contract (ConTextTab reads the real columns, TabICL/TabPFN
    # unreduced features), as a sweep prepares it for that model.
    prep = build_model(model, **options).prep_settings(PrepSettings(context_size=context_size))
    prepared = prepare_task(TaskSource(task, SourceKind.BUILTIN), prep, LabelMode.SHUFFLED_MEMBERS, seed=seed, q=q)
    spec = FinetuneSpec(model=model, model_options=dict(options), lr=lr, epochs=epochs, seed=seed)
    finetuner: Finetuner | UpstreamFinetuner
    if upstream_options(options):  # the package's own fine-tuner, its early stopping included
        finetuner = UpstreamFinetuner(spec, [prepared])
        finetuner.run(lambda _result, _path, _end: None)
    else:
        finetuner = Finetuner(spec, [prepared])
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
                                  RunIdentity(f"planted-{model}", task, model, Regime.SINGLE_FIXED.value, lr, q,
                                              LabelMode.SHUFFLED_MEMBERS.value, seed).as_dict(), epoch=finetuner.epoch)
    return result.row


def no_membership_check(control: NoMembershipControl | str, label_mode: LabelMode | str, *,
                        label_design: LabelDesign | str = LabelDesign.MATCHED, task: str = "breast_cancer",
                        q: int = 50, context_size: int = 64, seed: int = 0, unrelated_rows: int = 100,
                        lr: float = 3e-3, epochs: int = 60, noise: float = 1.0, bootstrap: int = 200,
                        suite: Sequence[str] = PLANTED_SUITE, torch_threads: int = 1,
                        prepared: Any = None, model: str = "pfn-mini",
                        options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Audit a model that never saw the audited members or non-members; returns the results row.
    ``model`` and ``options`` (default: pfn-mini's shipped weights) name the base model, built by
    ``build_model`` and prepared for under its own input contract, as a sweep does. ``prepared``: a prepared
    task to audit instead of the built-in ``task`` (its label mode and design are then its own).

    ``unrelated_*``: fine-tuned (``lr``, ``epochs``, single_fixed with C') on ``unrelated_rows`` rows that are
    neither members, non-members nor C', on their true labels or on labels moved one class on; ``noised``:
    the shipped weights plus N(0, (``noise`` x each tensor's std)^2), never trained. The split is Stage I's
    for ``label_mode`` and ``label_design``, probed with ``suite`` and no null splits."""
    import numpy as np
    import torch

    from probes.calibration import model_digest
    from probes.manipulations import suite_from_spec
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.data import PrepSettings, TaskSource, prepare_task
    from trainables.finetune import Finetuner
    from trainables.models import build_model
    from trainables.spec import FinetuneSpec

    control = NoMembershipControl(control)
    options = {"weights": "shipped"} if options is None and model == "pfn-mini" else dict(options or {})
    previous = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        base = build_model(model, **options)
        if prepared is None:
            prepared = prepare_task(TaskSource(task, SourceKind.BUILTIN),
                                    base.prep_settings(PrepSettings(context_size=context_size,
                                                                label_design=LabelDesign(label_design))),
                                    label_mode, seed=seed, q=q)
        if control is NoMembershipControl.NOISED:
            audited = build_model(model, **options)
            generator = torch.Generator().manual_seed(1000 + seed)
            with torch.no_grad():
                for parameter in audited.module.parameters():
                    std = float(parameter.std()) if parameter.numel() > 1 else float(parameter.abs().mean())
                    parameter.add_(noise * std * torch.randn(parameter.shape, generator=generator))
        else:
            used = np.zeros(len(prepared.labels), dtype=bool)
            used[prepared.member_idx] = used[prepared.nonmember_idx] = used[prepared.context_idx] = True
            free = np.flatnonzero(~used)
            if len(free) < unrelated_rows:
                raise ConfigError(f"task {task!r}: {len(free)} rows outside the audit, {unrelated_rows} asked for")
            rows = np.sort(np.random.default_rng([77, seed]).permutation(free)[:unrelated_rows])
            labels = np.array(prepared.labels)
            labels[rows] = np.asarray(prepared.original_labels)[rows]
            if control is NoMembershipControl.UNRELATED_FLIPPED:
                labels[rows] = (labels[rows] + 1) % prepared.n_classes
            elsewhere = dataclasses.replace(prepared, member_idx=rows, labels=labels,
                                            fingerprint=f"{prepared.fingerprint}-unrelated-{control.value}")
            finetuner = Finetuner(FinetuneSpec(model=model, model_options=options, lr=lr, epochs=epochs, seed=seed),
                                  [elsewhere])
            finetuner.train()
            audited = finetuner.model
        plan = ProbePlan.build(ProbeQueries.from_task(prepared), suite_from_spec(list(suite)), prepared.seed,
                               compress_rows=base.supports_context_weights)
        with tempfile.TemporaryDirectory() as cache:
            result = probe_checkpoint(audited, prepared, plan, cache, model_digest(base), base,
                                      ProbeSettings(n_resamples=bootstrap, null_splits=0),
                                      RunIdentity(f"control-{control.value}-{prepared.label_mode}-{seed}", prepared.name,
                                                  model, Regime.SINGLE_FIXED.value, lr, len(prepared.member_idx),
                                                  str(prepared.label_mode), seed).as_dict(),
                                      epoch=epochs)
        return result.row
    finally:
        torch.set_num_threads(previous)
