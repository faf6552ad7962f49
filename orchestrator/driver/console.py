"""Ctrl-C and the console of a sweep driver, tabular (``orchestrator.driver.sweep``) or LM (``orchestrator.driver.lm_sweep``):
SIGINT and SIGTERM turned into a clean, recorded stop (a second one exits at once), and what reaches the terminal
while Ray's, Tune's and wandb's output goes to the run's console log."""

from __future__ import annotations

import logging
import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from iclmem.errors import EXIT_INTERRUPTED
from iclmem.raysession import Console


class Interrupts:
    """SIGINT (Ctrl-C) while a sweep driver runs.

    The first stops the sweep. While ``Tuner.fit`` runs it is turned into Tune's own graceful stop,
    SIGUSR1 (Ray 2.x ``tune.py``: the loop ends after the current step, the experiment state is saved,
    trials are stopped), rather than a KeyboardInterrupt raised somewhere inside Tune's loop. Tune's
    own SIGINT handler is switched off (``TUNE_DISABLE_SIGINT_HANDLER``) because the driver must know
    the sweep was interrupted, which that handler only logs (with a ``Tuner.restore`` hint that is wrong
    for iclmem). Outside ``fit`` (Stage I, the final drain) it raises KeyboardInterrupt. A second SIGINT
    ends the process at once (``os._exit``): whatever clean-up is under way is abandoned."""

    def __init__(self) -> None:
        self.count = 0
        self.in_tune = False
        self.console_fd = 2  # where the second Ctrl-C's one line goes; the terminal under quiet_console
        self.run_dir = ""
        self.resume_command = "iclmem resume"  # what continues the sweep (``iclmem lm resume`` for LM sweeps)
        self.record: Callable[[], None] | None = None  # records the interruption in the run folder

    @property
    def interrupted(self) -> bool:
        return self.count > 0

    def handler(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count > 1:
            if self.record is not None:
                try:  # one small atomic write, so that the folder does not claim a driver is still running
                    self.record()
                except Exception:  # exiting at once matters more than the record
                    pass
            hint = f"; `{self.resume_command} {self.run_dir}` continues it" if self.run_dir else ""
            os.write(self.console_fd, f"iclmem: interrupted again, exiting at once{hint}\n".encode())
            os._exit(EXIT_INTERRUPTED)
        if self.in_tune and _tune_listens_to_sigusr1():
            os.kill(os.getpid(), signal.SIGUSR1)
            return
        raise KeyboardInterrupt


def _tune_listens_to_sigusr1() -> bool:
    handler = signal.getsignal(signal.SIGUSR1)
    return callable(handler) and getattr(handler, "__module__", "").startswith("ray.tune")


@contextmanager
def catch_interrupts() -> Iterator[Interrupts]:
    """Install :class:`Interrupts` for SIGINT and SIGTERM for the duration of a sweep (main thread only:
    Python delivers signals there; elsewhere the process's own handling stays)."""
    state = Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous = signal.getsignal(signal.SIGINT)
    previous_term = signal.getsignal(signal.SIGTERM)
    previous_usr1 = signal.getsignal(signal.SIGUSR1)
    previous_env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    signal.signal(signal.SIGINT, state.handler)
    # SIGTERM is how a scheduler stops a job (Slurm's scancel and time limit, Kubernetes deleting a pod): the
    # same clean stop as Ctrl-C, so the run is recorded interrupted and `iclmem resume` continues it
    signal.signal(signal.SIGTERM, state.handler)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGUSR1, previous_usr1)  # Tune leaves its handler installed after fit
        if previous_env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = previous_env


class DropRestoreHint(logging.Filter):
    """Tune ends an interrupted run with "Resume experiment with: Tuner.restore(...)"; an iclmem sweep is
    continued with ``iclmem resume``, which the driver prints instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tuner.restore" not in record.getMessage()


# iclmem's own packages: a warning raised there is about the user's sweep (a dropped column, a damaged cache
# entry) and is shown on the console too, in one line; other packages' warnings go to the console log only.
OWN_PACKAGES = tuple(str(Path(__file__).resolve().parents[2] / name) + os.sep
                     for name in ("iclmem", "orchestrator", "trainables", "probes"))


@contextmanager
def console_warnings(console: Console) -> Iterator[None]:
    """While a quiet console is in force: every Python warning in full (with its source path) into the
    console log, and iclmem's own ones also as one line (each once) on the terminal."""
    original = warnings.showwarning
    shown: set[str] = set()

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        original(message, category, filename, lineno, file, line)
        text = f"[iclmem] warning: {message}"
        if str(filename).startswith(OWN_PACKAGES) and text not in shown:
            shown.add(text)
            console.error(text)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original
