"""Which clock measures a device's seconds: the one place that decides it, for the trainables' fine-tuning
timings and the probe actors' phase tallies alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["device_clock"]


def device_clock(device: Any) -> Callable[[], float]:
    """The clock of device-seconds on ``device``: this process's CPU time on a CPU (a process sharing its cores
    is not charged for the others' work), wall time otherwise."""
    return time.process_time if str(getattr(device, "type", device)) == "cpu" else time.perf_counter
