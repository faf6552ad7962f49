"""What a sweep will cost, before anything is launched: ``iclmem estimate CONFIG --workers N``. This module
runs the three steps, each in its own module:

1. **Count** the grid's work (``orchestrator.estimate.estimate_work``): runs, fine-tuning steps, checkpoints probed,
   probe and reference contexts, per (model, Q, task).
2. **Measure** unit costs of each configured model at each Q on each task of the grid (or on ``--task``) on
   the local device, and the machinery around the work on a local Ray (``orchestrator.estimate.estimate_measure``);
   each distinct unit once, within a time budget (:data:`UNIT_BUDGET_S`).
3. **Predict** device-seconds per phase and the wall time on N workers (``orchestrator.estimate.estimate_predict``).

``orchestrator.estimate.estimate_render`` writes the result as ``iclmem estimate`` prints it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.estimate.estimate_measure import (
    DRIVER_IMPORTS,
    WORKER_IMPORTS,
    Measuring,
    Overheads,
    UnitCosts,
    measure_process,
    measure_ray,
    measure_unit_costs,
)
from orchestrator.estimate.estimate_predict import Estimate, predict
from orchestrator.estimate.estimate_work import CostKey, count_work

# Each unit's measurement stops repeating its steps after this long (one pass of every step always runs): with
# one unit per (model, Q, task measured on), measuring stays a small share of any sweep it is worth estimating.
UNIT_BUDGET_S = 8.0


def unit_of(key: CostKey, forced_task: str | None) -> CostKey:
    """The unit a key's costs are measured as: its own (model, Q, task), or on ``forced_task`` (``--task``), where
    every task of a (model, Q) is the same unit, measured once."""
    return CostKey(key.model, key.q, forced_task or key.task)


# The machinery's costs (the driver's start, Ray's, a worker actor's, a Tune trial's and experiment's) are the
# machine's, not the sweep's: measured once (about 20 s of subprocesses) and reused for this long on the same
# machine and packages, so a second estimate pays only for its units. ``ICLMEM_REMEASURE=1`` measures again.
OVERHEADS_VALID_S = 24 * 3600


def _overheads_path(reports: int) -> Path:
    import hashlib
    import importlib.metadata as md
    import os
    import platform
    import sys

    from orchestrator.runfolder.timing import prediction_cache_dir

    versions = []
    for pkg in ("ray", "torch", "wandb"):
        try:
            versions.append(md.version(pkg))
        except md.PackageNotFoundError:
            versions.append("-")
    key = "|".join([platform.node(), sys.version, str(os.cpu_count()), *versions, str(reports)])
    return prediction_cache_dir().parent / "overheads" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def cached_overheads(reports: int) -> tuple[dict[str, float] | None, str | None]:
    """(the machinery's measured costs, when they were measured) from the cache, or (None, None) when absent,
    older than :data:`OVERHEADS_VALID_S`, unreadable, or ``ICLMEM_REMEASURE`` is set."""
    import json
    import os

    if os.environ.get("ICLMEM_REMEASURE"):
        return None, None
    try:
        record = json.loads(_overheads_path(reports).read_text())
        if time.time() - float(record["measured_at"]) > OVERHEADS_VALID_S:
            return None, None
        return {k: float(v) for k, v in record["overheads"].items()}, str(record["when"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


def keep_overheads(reports: int, timed: dict[str, float]) -> None:
    """Keep the machinery's measured costs for the next estimate on this machine (nothing if the cache folder
    cannot be written: the next estimate measures them again)."""
    from iclmem.atomic import write_json_atomic

    path = _overheads_path(reports)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"overheads": timed, "measured_at": time.time(),
                                 "when": time.strftime("%Y-%m-%d %H:%M:%S")})
    except OSError:
        pass


def estimate(config: str | Path, workers: int, device: str | None = None, task: str | None = None,
             epochs: int = 4, score_rounds: int = 1, threads: int | None = None,
             with_ray: bool = True, log: Any = None, unit_budget_s: float | None = UNIT_BUDGET_S) -> Estimate:
    """Count, measure and predict for a sweep file (see the module docstring). Each distinct unit is measured
    once (``--task``: one per model and Q, whatever the tasks), within ``unit_budget_s``."""
    import torch

    from orchestrator.schema.config import TaskConfig
    from orchestrator.schema.sweep_files import load_sweep
    from orchestrator.schema.trials import context_audit_specs
    from trainables.models.base import resolve_device

    sweep = load_sweep(config)
    work = count_work(sweep)
    audits = len(context_audit_specs(sweep))
    if not work.runs:
        from iclmem.errors import ConfigError

        raise ConfigError(f"{config}: no fine-tuning run to estimate"
                          + (f" (its only regime is context: {audits} deployed-context audit(s), which `iclmem "
                             "estimate` does not cost; one audit's time is that of `iclmem audit-context` on one "
                             "task, README 'Auditing a deployed estimator's context')" if audits else ""))
    if audits and log:
        log(f"note: the {audits} deployed-context audit(s) of regime context are not in this estimate")
    dev = resolve_device(device)
    previous = torch.get_num_threads()
    torch.set_num_threads(int(threads or 1))
    configs = {t.name: t for t in sweep.tasks}
    # --task: every key measured on that one task (quicker, blind to how the tasks differ); else each on its own
    forced = (configs.get(task) or TaskConfig(name=task)) if task else None
    dp_keys = {k for (tk, dp) in work.compositions for k in tk if dp}
    # the distinct units: each measured once (a DP-SGD epoch too where any of its keys has DP runs)
    units: dict[CostKey, list[CostKey]] = {}
    for key in sorted(work.runs_by):
        units.setdefault(unit_of(key, forced.name if forced else None), []).append(key)
    measured: dict[CostKey, UnitCosts] = {}
    started = time.perf_counter()
    try:
        for n, (unit, keys) in enumerate(units.items(), 1):
            task_config = forced or configs[unit.task]
            dp = any(k in dp_keys for k in keys)
            if log:
                log(f"measuring {unit.model} at Q={unit.q} on {dev}, task {task_config.name}"
                    f"{' (plain and DP-SGD epochs)' if dp else ''} (unit {n} of {len(units)}"
                    + (f", for {len(keys)} (model, Q, task) keys" if len(keys) > 1 else "")
                    + (f"; repeats within {unit_budget_s:g} s" if unit_budget_s is not None else "") + ") ...")
            measured[unit] = measure_unit_costs(sweep, unit.model, work.model_options.get(unit.model, {}), unit.q,
                                                task_config, dev, epochs=epochs, score_rounds=score_rounds,
                                                dp_epsilon=work.dp_epsilon if dp else None, budget_s=unit_budget_s)
    finally:
        torch.set_num_threads(previous)
    costs = {key: measured[unit] for unit, keys in units.items() for key in keys}
    units_s = time.perf_counter() - started
    if log:
        log("measuring the driver's start, Ray's start and a worker actor's start ...")
    started = time.perf_counter()
    cached_from = None
    if with_ray:
        reports = min(work.epochs, 100)
        timed, cached_from = cached_overheads(reports)
        if timed is None:
            timed = measure_ray(reports=reports)
            timed.setdefault("driver_start_s", measure_process(DRIVER_IMPORTS))  # measured in Ray's process, else here
            keep_overheads(reports, timed)
        overheads = Overheads(**timed)
    else:
        overheads = Overheads(driver_start_s=measure_process(DRIVER_IMPORTS),
                              actor_start_s=measure_process(WORKER_IMPORTS))
    measuring = Measuring(units_s=units_s, overheads_s=time.perf_counter() - started, units=len(units),
                          keys=len(costs), unit_budget_s=unit_budget_s,
                          cut_short=sum(c.cut_short for c in measured.values()), overheads_cached_from=cached_from)
    from orchestrator.estimate.estimate_disk import predict_disk

    disk = predict_disk(work, costs, sweep.training.keep_checkpoints, workers,
                        wandb=str(sweep.wandb.mode) != "disabled", storage_path=sweep.storage_path or "")
    return replace(predict(work, costs, workers, overheads, sweep.resources.probe_actors), measuring=measuring,
                   disk=disk)
