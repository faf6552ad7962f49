"""Seconds a probe actor spends per phase of one job (scoring, reference scoring, plans), for the run's
timings record (``orchestrator.runfolder.timing``). An actor runs one job at a time, so a per-process tally reset at
each job's start is that job's. A phase opened inside another counts toward the outer one: the reference
scores are computed by the scoring function, and they are reference scoring."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["phase", "reset", "tally", "use_clock"]

_TALLY: dict[str, float] = {}
_OPEN: list[str] = []
_CLOCK = [time.perf_counter]


def use_clock(clock: Any) -> None:
    """The clock phases are read on: the process's CPU time for a CPU actor (an actor sharing its cores is not
    charged for the others' work), wall time on a GPU."""
    _CLOCK[0] = clock


@contextmanager
def phase(name: str) -> Iterator[None]:
    if _OPEN:  # inside another phase: its time is the outer phase's
        yield
        return
    _OPEN.append(name)
    clock = _CLOCK[0]
    start = clock()
    try:
        yield
    finally:
        _OPEN.pop()
        _TALLY[name] = _TALLY.get(name, 0.0) + clock() - start


def reset() -> None:
    _TALLY.clear()


def tally() -> dict[str, float]:
    return dict(_TALLY)
