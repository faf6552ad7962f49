"""Timings of a tabular sweep, measured in the driver: each trial's wall time and work as Tune reports them
(:class:`TimeTrials`), what the driver spent around them (:class:`Spent`), and ``RUN_DIR/timings.json`` with the
wall-time line written from both once the sweep is complete (:func:`record_timings`; the record's format and
phases are ``orchestrator.runfolder.timing``'s)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from iclmem.runfolder import TIMINGS_FILE

if TYPE_CHECKING:
    from orchestrator.runfolder.prepare import PreparedSweep


@dataclass
class Spent:
    """What the driver measured around the trials: Tune's ``fit``, the final drain of the probe pools, the probe
    actors' start, the workers the trials share, and the results table once the sweep is complete."""

    fit_s: float = 0.0
    drain_s: float = 0.0
    actor_start_s: float = 0.0
    workers: int = 0
    results: pd.DataFrame | None = None


class TimeTrials:
    """Tune callback: each trial's wall time as the driver sees it (start to completion) and the epoch and save
    seconds its results report (``trainables.trainable.EPOCH_SECONDS`` / ``SAVE_SECONDS``), for the run's
    timings (``orchestrator.runfolder.timing``). Left out of Tune's pickled state: a resumed driver times its own part."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.started: dict[str, float] = {}
        self.trial_s = self.epoch_s = self.save_s = self.work_wall_s = 0.0
        self.first_start: float | None = None
        self.last_end: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._reset()

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        now = time.perf_counter()
        self.started[str(trial.trial_id)] = now
        self.first_start = now if self.first_start is None else self.first_start

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any],
                        **info: Any) -> None:
        from trainables.trainable import EPOCH_SECONDS, EPOCH_WALL_SECONDS, SAVE_SECONDS, SAVE_WALL_SECONDS

        self.epoch_s += float(result.get(EPOCH_SECONDS) or 0.0)
        self.save_s += float(result.get(SAVE_SECONDS) or 0.0)
        self.work_wall_s += float(result.get(EPOCH_WALL_SECONDS) or 0.0) + float(result.get(SAVE_WALL_SECONDS) or 0.0)

    def _ended(self, trial: Any) -> None:
        now = time.perf_counter()
        start = self.started.pop(str(trial.trial_id), None)
        if start is not None:
            self.trial_s += now - start
        self.last_end = now

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._ended(trial)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._ended(trial)

    @property
    def span_s(self) -> float:
        """From the first trial's start to the last one's end."""
        if self.first_start is None or self.last_end is None:
            return 0.0
        return max(self.last_end - self.first_start, 0.0)


def trial_timer() -> TimeTrials:
    """A :class:`TimeTrials` that is also a Tune ``Callback`` (Tune imported only here)."""
    from ray.tune import Callback

    class _TimeTrials(TimeTrials, Callback):
        pass

    return _TimeTrials()


def record_timings(run_dir: Path, prepared: PreparedSweep, spent: Spent, timer: TimeTrials, clock: Any,
                   wall_from: float | None, resumed: bool, log: Callable[[str], None]) -> None:
    """Writes RUN_DIR/timings.json (``orchestrator.runfolder.timing``) and prints the wall time; beside the last
    ``iclmem estimate`` of this sweep when there is one. Never fails the sweep: its results are in."""
    from orchestrator.runfolder.timing import Phase, RunTimings, comparison_lines, human, load_prediction, write_timings

    try:
        from orchestrator.runfolder.run_folder import RunFolder

        results = spent.results if spent.results is not None else pd.DataFrame()
        # the reference trials' checkpoints (probe.references) are probed like any other, their rows kept apart
        references = RunFolder(run_dir).reference_results()
        if references is not None:
            results = pd.concat([results, references], ignore_index=True)

        def total(column: str) -> float:
            return float(pd.to_numeric(results[column], errors="coerce").fillna(0).sum()) if column in results else 0.0

        score_s, reference_s, plan_s = (total(f"probe_{n}_seconds") for n in ("score", "reference", "plan"))
        tune_fixed = max(spent.fit_s - timer.span_s, 0.0)
        clock.add(Phase.TUNE_FIXED, tune_fixed)
        work = {Phase.TRIALS.value: max(timer.trial_s - timer.work_wall_s, 0.0),
                Phase.FINETUNE.value: timer.epoch_s + timer.save_s,
                Phase.SCORING.value: score_s, Phase.REFERENCE.value: reference_s, Phase.PLANS.value: plan_s,
                Phase.PROBE_REST.value: max(total("probe_device_seconds") - score_s - reference_s - plan_s, 0.0),
                Phase.ACTOR_START.value: spent.actor_start_s}
        notes = (() if Phase.DRIVER_START.value in clock.seconds
                 else ("driver start not measured: run_sweep called from Python",))
        timings = RunTimings(
            wall_s=time.time() - (wall_from or time.time()), parallel_s=timer.span_s + spent.drain_s,
            serial=dict(clock.seconds), work=work, workers=int(spent.workers),
            probe_actors=prepared.sweep.resources.probe_actors, trials=len(prepared.trials),
            checkpoints=int(len(results)), resumed=resumed, recorded_at=time.strftime("%Y-%m-%d %H:%M:%S"),
            notes=notes)
        write_timings(run_dir, timings)
        biggest = sorted(((v, k) for k, v in {**timings.serial, **timings.work}.items()), reverse=True)[:3]
        log(f"[iclmem] wall time {human(timings.wall_s)}; most of it: "
            + ", ".join(f"{k} {human(v)}" for v, k in biggest) + f" (per phase: {run_dir / TIMINGS_FILE})")
        prediction = load_prediction(prepared.sweep.config_hash())
        if prediction is None:
            log(f"[iclmem] `iclmem estimate --compare {run_dir}` sets a prediction beside these times")
        else:
            summary = next(line for line in comparison_lines(prediction, timings) if line.startswith("predicted "))
            log(f"[iclmem] beside `iclmem estimate` of {prediction.created}: {summary}")
    except Exception as exc:  # noqa: BLE001 - the timings are a report on the run, never a reason to fail it
        log(f"[iclmem] WARNING the run's timings were not recorded: {type(exc).__name__}: {exc}")
