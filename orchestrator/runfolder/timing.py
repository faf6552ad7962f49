"""What a finished run spent, phase by phase: written by ``iclmem run``, read by ``iclmem estimate --compare``.

The phases are the estimate's own (:class:`Phase`, declared once: ``orchestrator.estimate.estimate_predict.predict`` keys its
prediction by them), so a run's record and a prediction line up row by row:

* **serial** phases run on the driver, one after the other: its start (imports), Ray's start and stop,
  Stage I, the Tune experiment's own setup and teardown, and aggregation with the report;
* **work** phases are device-seconds spent in parallel on the workers: the Tune trials around the work
  (each trial's wall time less its epochs and saves), fine-tuning (epochs and checkpoint saves, timed by
  the trainable), and on the probe actors their start, probe plans, scoring, reference scoring and the rest
  of each probe (timed by the actor: ``probe_*_seconds`` columns of the results).

:func:`compare` sets a prediction beside a record: per phase the predicted and the measured seconds and
the error's share of the wall time (work phases divided by the workers that share them), and names the
phase with the largest error.

Pure: no Ray here (``orchestrator.driver.sweep`` collects the numbers and calls :func:`write_timings`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from iclmem.errors import DataError
from iclmem.runfolder import TIMINGS_FILE  # the layout's name; kept importable from here
from iclmem.vocab import Vocab

__all__ = ["Phase", "SERIAL_PHASES", "WORK_PHASES", "PROBE_ACTOR_PHASES", "RunTimings", "TIMINGS_FILE",
           "PhaseClock", "write_timings", "read_timings", "compare", "PhaseComparison"]


class Phase(Vocab):
    """The phases of a sweep, as the estimate predicts them and a run records them."""

    DRIVER_START = "driver start (imports)"
    RAY = "Ray start and stop"
    STAGE_I = "Stage I (driver)"
    TUNE_FIXED = "Tune experiment (setup, teardown)"
    REPORT = "aggregation and report"
    TRIALS = "Tune trials (actor start, imports, reports)"
    FINETUNE = "fine-tuning (epochs + checkpoint saves)"
    SCORING = "probe scoring (checkpoints + controls)"
    PROBE_REST = "rest of probes (ICL, bootstrap, AUCs)"
    REFERENCE = "reference scoring (once per reference)"
    PLANS = "probe plans (per task and probe actor)"
    ACTOR_START = "probe actor start"


SERIAL_PHASES: tuple[Phase, ...] = (Phase.DRIVER_START, Phase.RAY, Phase.STAGE_I, Phase.TUNE_FIXED, Phase.REPORT)
WORK_PHASES: tuple[Phase, ...] = (Phase.TRIALS, Phase.FINETUNE, Phase.SCORING, Phase.PROBE_REST, Phase.REFERENCE,
                                  Phase.PLANS, Phase.ACTOR_START)
# the work phases that run on the probe actors (the rest runs in the Tune trials)
PROBE_ACTOR_PHASES: frozenset[Phase] = frozenset({Phase.SCORING, Phase.PROBE_REST, Phase.REFERENCE, Phase.PLANS,
                                                  Phase.ACTOR_START})


@dataclass(frozen=True)
class RunTimings:
    """One run's record (``RUN_DIR/timings.json``): seconds per phase, the wall time and what ran it."""

    wall_s: float  # from the driver process's start to the end of the report
    parallel_s: float  # wall time of the parallel phase: Tune's trials and the probe drain after them
    serial: dict[str, float]  # Phase value -> seconds on the driver
    work: dict[str, float]  # Phase value -> device-seconds on the workers
    workers: int  # the parallel slots the run had: CPUs of its Ray (GPUs for a CUDA sweep)
    probe_actors: int
    trials: int
    checkpoints: int
    resumed: bool = False  # a resumed run's record covers only what this driver did
    recorded_at: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.serial) - {p.value for p in SERIAL_PHASES}) + sorted(
            set(self.work) - {p.value for p in WORK_PHASES})
        if unknown:
            raise DataError(f"timings: unknown phase(s) {unknown}; known: {[p.value for p in Phase]}")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunTimings:
        data = dict(data)
        data["notes"] = tuple(data.get("notes", ()))
        return cls(**data)


def write_timings(run_dir: str | Path, timings: RunTimings) -> Path:
    """The one writer of ``timings.json`` (atomic)."""
    from iclmem.atomic import write_json_atomic

    return write_json_atomic(Path(run_dir) / TIMINGS_FILE, timings.as_dict())


def read_timings(run_dir: str | Path) -> RunTimings:
    """The one reader: a clear error naming the file when it is missing or not a record of this kind
    (``orchestrator.runfolder.run_folder.RunFolder.timings`` reads it through here, None when it is missing)."""
    path = Path(run_dir) / TIMINGS_FILE
    if not path.is_file():
        raise DataError(f"{path}: no timings: the run did not finish under an iclmem that records them (`iclmem run` "
                        "writes it at the end of a complete sweep)")
    try:
        return RunTimings.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError, DataError) as exc:  # DataError: a phase this iclmem does not know
        raise DataError(f"{path}: not an iclmem timings record ({exc})") from None


class PhaseClock:
    """Wall seconds of the driver's phases: ``with clock(Phase.STAGE_I): ...`` adds to that phase."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, phase: Phase) -> _Lap:
        return _Lap(self, Phase(phase))

    def add(self, phase: Phase, seconds: float) -> None:
        key = Phase(phase).value
        self.seconds[key] = self.seconds.get(key, 0.0) + max(float(seconds), 0.0)


class _Lap:
    def __init__(self, clock: PhaseClock, phase: Phase) -> None:
        self.clock, self.phase, self.start = clock, phase, 0.0

    def __enter__(self) -> _Lap:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.clock.add(self.phase, time.perf_counter() - self.start)


@dataclass(frozen=True)
class PhaseComparison:
    phase: str
    serial: bool
    predicted_s: float
    actual_s: float
    wall_share_s: float  # the error's weight in the wall time: (predicted - actual), divided by the workers
    #                      that share it for a work phase

    @property
    def ratio(self) -> float:
        return self.predicted_s / self.actual_s if self.actual_s > 0 else math.nan


def compare(predicted_serial: dict[str, float], predicted_work: dict[str, float], workers: int, probe_actors: int,
            timings: RunTimings) -> list[PhaseComparison]:
    """Every phase, predicted beside measured, largest wall-time error first. A work phase's error is spread
    over the workers that do it (the probe actors for their phases, every worker for the trials')."""
    rows = []
    for phase in SERIAL_PHASES:
        p, a = float(predicted_serial.get(phase.value, 0.0)), float(timings.serial.get(phase.value, 0.0))
        rows.append(PhaseComparison(phase.value, True, p, a, p - a))
    for phase in WORK_PHASES:
        p, a = float(predicted_work.get(phase.value, 0.0)), float(timings.work.get(phase.value, 0.0))
        share = max(1, min(probe_actors, workers) if phase in PROBE_ACTOR_PHASES else workers)
        rows.append(PhaseComparison(phase.value, False, p, a, (p - a) / share))
    return sorted(rows, key=lambda r: -abs(r.wall_share_s))


@dataclass(frozen=True)
class Prediction:
    """What ``iclmem estimate`` predicted, per phase, kept so that a run of the same sweep can be set beside it
    (``iclmem run`` prints the comparison at its end; ``iclmem estimate --compare`` makes a fresh one)."""

    serial: dict[str, float]  # Phase value -> seconds
    work: dict[str, float]  # Phase value -> device-seconds
    longest_s: float  # the longest chain: one run's start, epochs, saves and the probes of its last checkpoint
    probe_actors: int
    workers: int  # the workers it was made for
    config_hash: str = ""
    device: str = ""
    created: str = ""
    disk_bytes: int = 0  # the bytes the sweep writes, at its end (orchestrator.estimate.estimate_disk; 0: not predicted)

    def parallel_s(self, workers: int) -> float:
        """The parallel phase on ``workers``: its largest lower bound, as ``orchestrator.estimate.estimate`` says."""
        n = max(int(workers), 1)
        probe = sum(v for k, v in self.work.items() if Phase(k) in PROBE_ACTOR_PHASES)
        return max(sum(self.work.values()) / n, probe / max(min(self.probe_actors, n), 1), self.longest_s)

    def wall_s(self, workers: int) -> float:
        return sum(self.serial.values()) + self.parallel_s(workers)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def prediction_cache_dir() -> Path:
    """Where ``iclmem estimate`` keeps its last prediction per sweep: ``$ICLMEM_CACHE`` or the user's cache
    folder (``$XDG_CACHE_HOME/iclmem``, else ``~/.cache/iclmem``), under ``estimates/``. Never beside the
    user's own files."""
    import os

    root = os.environ.get("ICLMEM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "iclmem")
    return Path(root) / "estimates"


def save_prediction(prediction: Prediction) -> Path | None:
    """The prediction under its sweep's config hash (the last one made wins); None where the cache folder
    cannot be written (a read-only home: the estimate still prints, only the run's comparison is lost)."""
    from iclmem.atomic import write_json_atomic

    try:
        folder = prediction_cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        return write_json_atomic(folder / f"{prediction.config_hash}.json", prediction.as_dict())
    except OSError:
        return None


def load_prediction(config_hash: str) -> Prediction | None:
    path = prediction_cache_dir() / f"{config_hash}.json"
    try:
        return Prediction(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def human(seconds: float) -> str:
    """Seconds as a person reads them: s, min, h or d."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def comparison_lines(prediction: Prediction, timings: RunTimings) -> list[str]:
    """The comparison as text: a table of phases and a closing line with the ratio and the worst phase."""
    rows = compare(prediction.serial, prediction.work, timings.workers, prediction.probe_actors, timings)
    predicted = prediction.wall_s(timings.workers)
    width = max(len(r.phase) for r in rows) + 9
    lines = [f"{'phase':<{width}} {'predicted':>10} {'measured':>10} {'ratio':>6} {'wall error':>11}"]
    for r in rows:
        name = r.phase + (" (serial)" if r.serial else "")
        ratio = "–" if math.isnan(r.ratio) else f"{r.ratio:.2f}"
        lines.append(f"{name:<{width}} {r.predicted_s:>9.1f}s {r.actual_s:>9.1f}s {ratio:>6} {r.wall_share_s:>+10.1f}s")
    lines.append(f"{'wall time':<{width}} {predicted:>9.1f}s {timings.wall_s:>9.1f}s "
                 f"{predicted / timings.wall_s if timings.wall_s else math.nan:>6.2f}")
    worst = rows[0]
    lines.append(f"predicted {human(predicted)} on {timings.workers} worker(s), measured {human(timings.wall_s)} "
                 f"(predicted / measured = {predicted / timings.wall_s:.2f}); the largest error is {worst.phase}: "
                 f"{'over' if worst.wall_share_s > 0 else 'under'}-predicted by {abs(worst.wall_share_s):.1f} s of wall time")
    if timings.resumed:
        lines.append("note: a resumed run; its record covers what the last driver did, the prediction the whole sweep")
    return lines
