"""The estimate as the reader sees it: ``iclmem estimate``'s text (or markdown tables) of the grid's work,
the measured unit costs, the device time per phase and the predicted wall time, and how long measuring took."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from orchestrator.estimate.estimate_predict import Estimate
from orchestrator.runfolder.timing import human

MEASURING_SHARE = 0.25  # above this share of the predicted wall time, the output says why measuring took so long


def measuring_line(est: Estimate) -> str:
    """How long measuring took, what bounded it, and its share of the predicted wall time."""
    m = est.measuring
    assert m is not None
    bound = (f"each unit's repeats bounded to {m.unit_budget_s:g} s after one pass of every step"
             + (f", {m.cut_short} repeat(s) left out and extrapolated" if m.cut_short else "")
             if m.unit_budget_s is not None else "no time bound")
    share = m.total_s / max(est.wall_s, 1e-9)
    machinery = (f"the driver's start, Ray and Tune measured on this machine at {m.overheads_cached_from} and "
                 "reused (ICLMEM_REMEASURE=1 measures them again)" if m.overheads_cached_from
                 else f"the driver's start, Ray and Tune in {m.overheads_s:.0f} s (kept for the next estimate here)")
    line = (f"Measuring took {m.total_s:.0f} s: {m.units} distinct unit(s) measured once each for {m.keys} "
            f"(model, Q, task) key(s) in {m.units_s:.0f} s ({bound}); {machinery}. That is {share:.0%} of the "
            "predicted wall time.")
    if share > MEASURING_SHARE:
        line += (" The sweep is short: measuring its fixed costs (the driver's start, Ray's start, a Tune "
                 "experiment), which it pays once too, weighs as much as its work; a longer grid costs the same "
                 "to measure.")
    return line


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], markdown: bool) -> str:
    rows = [[str(c) for c in r] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)])


def render(est: Estimate, markdown: bool = False) -> str:
    """The estimate as text (or markdown tables): work, unit costs, compute and wall time."""
    w = est.work
    work_rows = [
        ("fine-tuning runs", f"{w.runs:,}"),
        ("fine-tuning steps", f"{w.steps:,}"),
        ("ICL evaluation forwards", f"{w.eval_forwards:,}"),
        ("checkpoints probed", f"{w.total('checkpoint_jobs'):,} (epochs {', '.join(map(str, w.schedule))})"),
        ("probe contexts (checkpoints)", f"{w.total('probe_contexts'):,}"),
        ("probe contexts (base-model controls)", f"{w.total('control_contexts'):,}"),
        ("references (computed once, shared)", f"{w.total('references'):,}"),
        ("reference contexts", f"{w.total('reference_contexts'):,} (sharing saves {w.reference_contexts_saved:,})"),
    ]
    cost_rows = [(f"{k.model} Q={k.q} {k.task}" + (f" (measured on {c.task})" if c.task != k.task else ""),
                  f"{c.epoch_s * 1e3:.1f}" + ("" if math.isnan(c.dp_epoch_s) else f" / DP {c.dp_epoch_s * 1e3:.1f}")
                  + f" (first +{(c.first_epoch_extra_s + c.dp_first_epoch_extra_s) * 1e3:.0f})",
                  f"{c.save_s * 1e3:.1f}", f"{c.plan_s:.2f}",
                  f"{c.contexts:,} ({c.forwards_saved:.0%} not forwarded)"
                  + (f" + {c.extra_contexts:,} null-split" if c.extra_contexts else ""),
                  f"{c.score_per_context_s * 1e3:.4f}",
                  f"{c.rest_s:.2f}", f"{c.prepare_s:.2f}") for k, c in est.costs.items()]
    measured_on = {c.task for c in est.costs.values()}
    where = (f"each (model, Q, task) on its own task ({len(est.costs)} measurements)" if all(
        k.task == c.task for k, c in est.costs.items()) else f"task {', '.join(sorted(measured_on))} only (--task)")
    compute_rows = [(k, human(v), f"{v / 3600:.3f}") for k, v in est.compute_s.items()]
    compute_rows += [(f"{k} (serial)", human(v), "") for k, v in est.serial_s.items()]
    text = [
        f"Grid: {w.runs} runs x {w.epochs} epochs on {', '.join(w.tasks)}; suite of {w.suite} manipulations.",
        "",
        _table(["work", "count"], work_rows, markdown),
        "",
        f"Unit costs measured on {est.device}, {where}; driver start "
        f"{est.overheads.driver_start_s:.1f} s, Ray start and stop {est.overheads.ray_start_s:.1f} s, worker actor "
        f"start {est.overheads.actor_start_s:.1f} s, Tune trial around the work {est.overheads.tune_trial_s:.1f} s, "
        f"Tune experiment {est.overheads.tune_fixed_s:.1f} s:",
        "",
        _table(["model, Q, task", "epoch ms (step+eval)", "save ms", "plan s", "contexts per probe", "score ms/context",
                "rest of probe s", "Stage I s"], cost_rows, markdown),
        "",
        _table(["compute", "device time", "device-hours"], compute_rows, markdown),
        "",
        f"Predicted on {est.workers} worker(s): wall time {human(est.wall_s)} ({est.wall_s:.0f} s; "
        + f"bound by {est.bound}"
        + f"), {est.device_hours:.3f} device-hours held, {est.parallel_s / 3600:.3f} busy.",
    ]
    from orchestrator.estimate.estimate_predict import driver_memory_bytes

    text.append(f"The driver (this process's Ray client, Tune's loop and the aggregation) peaks at about "
                f"{driver_memory_bytes(w) / 1e9:.1f} GB of memory; the aggregation and report after the last probe "
                f"take about {human(est.serial_s.get('aggregation and report', 0.0))} of the wall time.")
    if est.disk is not None:
        from orchestrator.estimate.estimate_disk import disk_line

        line, where = disk_line(est.disk), est.disk.storage_path or "the run folder's tune/"
        text.append(f"{line[0].upper()}{line[1:]}: Tune's storage ({where}) {est.disk.storage_final / 1e6:,.1f} MB, "
                    f"the rest of the run folder {est.disk.run_folder / 1e6:,.1f} MB.")
    if est.measuring is not None:
        text.append(measuring_line(est))
    needed = est.probe_actors_needed()
    if needed is not None:  # every checkpoint's probe waits for one of too few actors
        lifted = est.with_probe_actors(needed)
        text.append(f"The probes are the bottleneck: with resources.probe_actors = {needed} (each takes a worker's "
                    f"share of the devices) the prediction is {human(lifted.wall_s)}, bound by {lifted.bound}.")
    return "\n".join(text)
