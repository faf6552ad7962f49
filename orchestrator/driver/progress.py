"""Progress of a sweep, as the driver sees it: the status line, what each trial and checkpoint came to, and the
watchdog that turns a sweep which stopped moving (trials waiting for resources no node gives) into an error
saying why."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

    from orchestrator.runfolder.prepare import PreparedSweep


class Watchdog:
    """Notices a sweep that stopped moving: :meth:`observe` is given, at every step of the driver's loop, a
    value that changes whenever anything progresses (trial states, epochs reported, probe results) and
    whether work is visibly under way; it answers True once neither has happened for ``timeout_s``
    seconds (never with ``timeout_s`` 0). A trial that waits for resources no node gives leaves Tune's loop
    turning without progress: this is what turns that silent hang into an error."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s, self.clock = float(timeout_s), clock
        self._signature: Any = object()
        self._since = clock()

    def observe(self, signature: Any, busy: bool = False) -> bool:
        now = self.clock()
        if busy or signature != self._signature:
            self._signature, self._since = signature, now
            return False
        return self.timeout_s > 0 and now - self._since >= self.timeout_s

    @property
    def idle_s(self) -> float:
        return self.clock() - self._since


def console_tail(console_log: Path | None, tail_bytes: int = 50_000, since: int = 0) -> str:
    """The end of the run's console log (what Ray and Tune printed), from byte ``since`` on (what this
    driver appended), or "" without one."""
    if console_log is None or not console_log.is_file():
        return ""
    with open(console_log, "rb") as handle:
        handle.seek(max(since, console_log.stat().st_size - tail_bytes))
        return handle.read().decode("utf-8", "replace")


# Lines of Ray's and Tune's log that say why nothing is scheduled (quoted when a sweep stalls)
_RAY_WAIT_REASONS = re.compile(r"insufficient|infeasible|cannot be scheduled|no available node|enough resources|"
                               r"waiting for resources|pending", re.IGNORECASE)


def ray_wait_reason(console_log: Path | None, tail_bytes: int = 200_000) -> str | None:
    """The last line of the run's console log (what Ray and Tune printed) that says why work waits."""
    for line in reversed(console_tail(console_log, tail_bytes).splitlines()):
        if _RAY_WAIT_REASONS.search(line) and "[iclmem]" not in line:
            return " ".join(line.split())[:400]
    return None


def _resources_text(resources: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items()) if v and not k.startswith(("node:", "memory",
                     "object_store_memory", "accelerator_type"))) or "nothing"


def stall_reason(trials: Sequence[Trial], idle_s: float, console_log: Path | None) -> str:
    """One paragraph: how long nothing moved, what waits and what it asks, what the cluster has, and Ray's own
    explanation from the console log when it gave one."""
    import ray

    pending = [t for t in trials if str(t.status) == "PENDING"]
    parts = [f"no progress for {idle_s / 60:.1f} min"]
    if pending:
        asks: dict[str, float] = {}
        try:
            factory = pending[0].placement_group_factory
            if factory is not None:
                asks = dict(factory.required_resources)
        except Exception:  # noqa: BLE001 - the explanation must not fail on an internal attribute
            asks = {}
        parts.append(f"{len(pending)} trial(s) waiting to start, each asking {_resources_text(asks)}")
    try:
        # ray's state API has no annotations
        total, free = ray.cluster_resources(), ray.available_resources()  # type: ignore[no-untyped-call]
        parts.append(f"the cluster holds {_resources_text(total)} ({_resources_text(free)} free)")
    except Exception:  # noqa: BLE001
        pass
    quote = ray_wait_reason(console_log)
    if quote:
        parts.append(f'Ray says: "{quote}"')
    return "; ".join(parts)


class Progress:
    """What the driver has seen of the sweep so far (trial states, each checkpoint's outcome), and its status line."""

    def __init__(self, n_trials: int, enabled: bool = True, log: Callable[[str], None] = print) -> None:
        self.n_trials, self.enabled, self.log = n_trials, enabled, log
        self.done = self.failed = self.running = 0
        self.watchdog: Watchdog | None = None  # set by the driver from resources.stall_timeout_min
        self.console_log: Path | None = None  # where Ray's messages go (quoted when the sweep stalls)
        self.stall: str | None = None  # why the sweep was stopped for making no progress
        self.verdicts: dict[tuple[str, int], str] = {}  # (run_id, epoch) -> outcome; a re-probe counts once
        self.trial_status: dict[str, str] = {}  # run_id -> Tune's status of its trial, as last seen
        self._last_line = ""
        self._last_time = 0.0

    def outcome(self, row: dict[str, Any]) -> None:
        self.verdicts[(row["run_id"], int(row["epoch"]))] = row["outcome"]

    def show(self, force: bool = False) -> None:
        """Print a status line when something changed, and at least every 30 s while work goes on."""
        counts: dict[str, int] = {}
        for outcome in self.verdicts.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        outcomes = " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "-"
        line = (f"[iclmem] trials {self.done}/{self.n_trials} done, {self.running} running, {self.failed} failed | "
                f"checkpoints probed {len(self.verdicts)} | outcomes {outcomes}")
        now = time.monotonic()
        if self.enabled and (force or line != self._last_line or now - self._last_time > 30):
            self.log(line)
            self._last_line, self._last_time = line, now


def incomplete_runs(prepared: PreparedSweep, progress: Progress) -> list[str]:
    """Run ids whose trial Tune had not seen to the end (status TERMINATED) when the sweep stopped; a
    trial the driver never saw counts as incomplete."""
    return sorted(t.run_id for t in prepared.trials if progress.trial_status.get(t.run_id) != "TERMINATED")
