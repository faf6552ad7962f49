"""Power on the recipe users run: a planted run fine-tuned through its package's own fine-tuner (``recipe:
upstream``), K reference fine-tunes through the same fine-tuner and recipe, every channel's attacks, and the run's
ground truth -- with a no-membership control against the same references.

No Ray: the fine-tuning (``trainables.upstream.UpstreamFinetuner``), probe (``probes.probe.probe_checkpoint``) and
attack (``orchestrator.report.aggregate.attacks_for_checkpoint``) code a sweep's trials, probe actors and aggregator run.
Used by ``benchmarks/minis.py --parts upstream`` and ``tests/test_upstream_power.py``.

* The planted target: ``task``'s members with shuffled labels (label-matched non-members), fine-tuned by the
  package's fine-tuner from the shipped mini with the recipe ``finetuner`` names (its default: early stopping on
  C'), probed at the last epoch it trained.
* The control: the same fine-tuner and recipe on rows outside the audit (no member, non-member or C' row), their
  labels moved one class on (noise to fit, as the members' shuffled labels are), audited as if it had trained on
  the members: every detection on it is false.
* References: K fine-tunes, reference k on its half of the population (``trainables.data.reference_task``), under
  its own training seed (``trainables.finetune.reference_training_seed``: the package's ``random_state``, so its
  row order, chunking and fine-tuning ensemble) and with that seed as its deployed classifier's ``random_state``
  (the deployed ensemble's preprocessing and shifts), each probed at the last epoch it trained (early stopping
  ends references at epochs of their own: recipe output against recipe output). Both targets share them, as two
  targets of one population would.
* Ground truth (``probes.ground_truth``): whether the target's weights moved towards its members' trained labels
  in the package's own frame, and the same test on ``null_splits`` null splits of rows it never saw.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from iclmem.record import ATTACK_CHANNELS, RunIdentity
from iclmem.vocab import LabelMode, Regime, SourceKind

__all__ = ["CHANNELS", "planted_upstream_power"]

# the channels an upstream run is audited through: results-column prefix of the attack -> its name
CHANNELS = ATTACK_CHANNELS


def _control_task(prepared: Any, seed: int) -> Any:
    """``prepared`` with its training rows replaced by rows outside the audit (as many as its members, at most all
    that are free), their labels moved one class on: what the control fine-tunes on."""
    from iclmem.errors import ConfigError

    used = np.zeros(len(prepared.labels), dtype=bool)
    used[prepared.member_idx] = used[prepared.nonmember_idx] = used[prepared.context_idx] = True
    free = np.flatnonzero(~used)
    n = min(len(prepared.member_idx), len(free))
    if n < 8:
        raise ConfigError(f"task {prepared.name!r}: {len(free)} rows outside the audit; the control needs >= 8")
    rows = np.sort(np.random.default_rng([78, seed]).permutation(free)[:n])
    labels = np.array(prepared.labels)
    labels[rows] = (np.asarray(prepared.original_labels)[rows] + 1) % prepared.n_classes
    return dataclasses.replace(prepared, member_idx=rows, labels=labels,
                               fingerprint=f"{prepared.fingerprint}-control-unrelated")


def planted_upstream_power(model: str, options: Mapping[str, Any], *, lr: float, epochs: int,
                           task: str = "iris", q: int = 30, context_size: int = 60, seed: int = 0,
                           n_references: int = 4, bootstrap: int = 200, null_splits: int = 5,
                           suite: Sequence[str] | None = None, control: bool = True,
                           torch_threads: int = 1) -> dict[str, Any]:
    """The planted target, the control and ``n_references`` references (module docstring). Returns
    ``target`` and ``control`` (each: its probe results row with every attack's columns, ``ground_truth_*``,
    ``null_ground_truth_memorized`` (of ``null_ground_truth_trials``), ``seconds``), ``reference_seconds``,
    ``reference_epochs`` and the query tables (``tables``: target, control, references) the attacks read."""
    import torch

    from orchestrator.audits.selfcheck import PLANTED_SUITE
    from orchestrator.report.aggregate import attacks_for_checkpoint
    from probes.calibration import model_digest
    from probes.ground_truth import memorization_ground_truth
    from probes.manipulations import suite_from_spec
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.data import PrepSettings, TaskSource, null_split, prepare_task, reference_task
    from trainables.finetune import reference_training_seed
    from trainables.models import build_model
    from trainables.spec import FinetuneSpec
    from trainables.upstream import UpstreamFinetuner, upstream_options

    if not upstream_options(options):
        raise ValueError(f"model {model}: options must name recipe upstream, got {dict(options)}")
    previous = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        base = build_model(model, **options)
        digest = model_digest(base)
        prep = base.prep_settings(PrepSettings(context_size=context_size))
        prepared = prepare_task(TaskSource(task, SourceKind.BUILTIN), prep, LabelMode.SHUFFLED_MEMBERS, seed=seed, q=q)
        settings = ProbeSettings(n_resamples=bootstrap, null_splits=0)
        probe_suite = suite_from_spec(list(suite or PLANTED_SUITE))

        def plan_of(t: Any) -> Any:
            return ProbePlan.build(ProbeQueries.from_task(t), probe_suite, t.seed,
                                   compress_rows=base.supports_context_weights)

        def fine_tune(train_on: Any, training_seed: int) -> tuple[Any, float]:
            started = time.perf_counter()
            finetuner = UpstreamFinetuner(FinetuneSpec(model=model, model_options=dict(options), lr=lr, epochs=epochs,
                                                       seed=training_seed), [train_on])
            finetuner.run(lambda _result, _path, _end: None)
            return finetuner, time.perf_counter() - started

        def probe(model_: Any, audited: Any, cache: str, identity: dict[str, Any], epoch: int,
                  base_plan: Any = None) -> Any:
            return probe_checkpoint(model_, audited, plan_of(audited), cache, digest, base, settings, identity,
                                    epoch=epoch, base_plan=base_plan)

        identity = RunIdentity(f"upstream-{model}", task, model, Regime.SINGLE_FIXED.value, lr, q,
                               LabelMode.SHUFFLED_MEMBERS.value, seed).as_dict()
        targets: dict[str, Any] = {}
        with tempfile.TemporaryDirectory() as cache:
            for name, train_on in (("target", prepared), *((("control", _control_task(prepared, seed)),)
                                                           if control else ())):
                finetuner, seconds = fine_tune(train_on, seed)
                started = time.perf_counter()
                result = probe(finetuner.model, prepared, cache, identity, finetuner.epoch)
                truth = memorization_ground_truth(finetuner.model, base, train_on, seed=seed, n_resamples=bootstrap,
                                                  members=prepared.member_idx, nonmembers=prepared.nonmember_idx)
                nulls = [memorization_ground_truth(finetuner.model, base, train_on, seed=seed, n_resamples=bootstrap,
                                                   members=m, nonmembers=n)
                         for m, n in (null_split(prepared, j) for j in range(null_splits if name == "target" else 0))]
                targets[name] = (result, {**truth.as_dict(), "null_ground_truth_trials": len(nulls),
                                          "null_ground_truth_memorized": sum(g.memorized for g in nulls),
                                          "epoch": finetuner.epoch,
                                          "seconds": seconds + time.perf_counter() - started})
            target_plan = (prepared.fingerprint, plan_of(prepared))
            references, reference_seconds, reference_epochs = [], [], []
            for k in range(n_references):
                training_seed = reference_training_seed(seed, k)
                half = reference_task(prepared, k)
                finetuner, seconds = fine_tune(half, training_seed)
                started = time.perf_counter()
                references.append(probe(finetuner.model, half, cache,
                                        {**identity, "run_id": f"{identity['run_id']}-ref{k}",
                                         "reference_training_seed": training_seed},
                                        finetuner.epoch, base_plan=target_plan).queries)
                reference_seconds.append(seconds + time.perf_counter() - started)
                reference_epochs.append(finetuner.epoch)
        out: dict[str, Any] = {"reference_seconds": reference_seconds, "reference_epochs": reference_epochs}
        for name, (result, extra) in targets.items():
            columns: dict[str, Any] = {}
            if references:
                computed = attacks_for_checkpoint(result.queries, references, n_resamples=bootstrap,
                                                  null_splits=null_splits, seed=seed)
                columns = computed[0] if computed is not None else {}
            out[name] = {**result.row, **columns, **extra}
        out["tables"] = {name: result.queries for name, (result, _) in targets.items()} | {"references": references}
        return out
    finally:
        torch.set_num_threads(previous)
