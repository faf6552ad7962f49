"""Ray session start-up, the one place a driver joins or starts Ray (tabular and LM sweeps alike), and
the quiet console a driver runs Ray under."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

DEFAULT_OBJECT_STORE_BYTES = 512 * 1024 * 1024
# How long a driver waits for a Ray head's port to accept a connection before calling the address wrong
# (ray.init itself retries an unreachable head for minutes, printing only to the console log).
ADDRESS_TIMEOUT_S = 5.0
_HOST_PORT = re.compile(r"^(?:ray://)?(?P<host>\[[^\]]+\]|[^:/\s]+):(?P<port>\d{1,5})$")


def unreachable_address(address: str | None, timeout: float = ADDRESS_TIMEOUT_S) -> str | None:
    """Why ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``) cannot be a Ray head, or None: nothing accepts a
    TCP connection on that port within ``timeout`` seconds. Other forms ("auto") are left to Ray, which
    answers them at once."""
    import socket

    match = _HOST_PORT.match((address or "").strip())
    if match is None:
        return None
    host, port = match.group("host").strip("[]"), int(match.group("port"))
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        reason = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or type(exc).__name__)
        return f"nothing answers on {host}:{port} ({reason} within {timeout:g} s)"


def ensure_ray(address: str | None = None, num_cpus: int | None = None,
               object_store_memory: int | None = None) -> bool:
    """Join ``address`` (e.g. "auto") or start an embedded local Ray (dashboard off, bounded object
    store, usage stats off); True when this call started it (so the caller shuts it down), False when a
    Ray session already existed in this process (a test session's, or the caller's)."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
                 object_store_memory=object_store_memory or DEFAULT_OBJECT_STORE_BYTES, log_to_driver=False)
    return True


class Console:
    """Where iclmem's own lines go while :func:`quiet_console` is in force: the terminal the command was
    started from, whatever Ray, Tune or wandb have done with the process's stdout and stderr."""

    def __init__(self, out: TextIO, err: TextIO, log_path: Path | None = None) -> None:
        self.out, self.err, self.log_path = out, err, log_path

    def line(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def error(self, text: str) -> None:
        print(text, file=self.err, flush=True)


@contextmanager
def quiet_console(log_path: Path | None) -> Iterator[Console]:
    """Send everything this process (and the Ray processes it starts) writes to stdout and stderr into
    ``log_path``, appended; iclmem's own lines go to the terminal through the yielded :class:`Console`.

    The redirect is at the file-descriptor level because the noise comes from places no Python setting
    reaches alike: Ray's C++ core and its token-auth notice, Tune's ``print`` of TensorBoard hints and its
    "performance bottleneck" logger warnings, wandb, and Python warnings with their source paths. With
    ``log_path=None`` (``--verbose``) nothing is redirected."""
    if log_path is None:
        yield Console(sys.stdout, sys.stderr)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    out = os.fdopen(os.dup(saved_out), "w", buffering=1, encoding="utf-8", errors="replace")
    err = os.fdopen(os.dup(saved_err), "w", buffering=1, encoding="utf-8", errors="replace")
    # A log is append-only (not an atomic rewrite): a crash can cost its torn last line, never earlier ones.
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        yield Console(out, err, log_path)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a stream closed under us: nothing left to flush
                pass
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        for fd in (saved_out, saved_err, log_fd):
            os.close(fd)
        out.close()
        err.close()
