"""One driver per run folder: ``iclmem run``, ``resume`` and ``report`` (and ``lm run`` / ``lm resume``) hold
the folder's lock while they work in it, so a second command on the same folder is refused instead of
training the same trials into the same ``tune/`` or rewriting the tables under the first.

The lock is ``fcntl.flock`` on ``RUN_DIR/driver.lock`` (an empty file, never written): the kernel releases
it when its process ends, however it ends (SIGKILL, a lost shell), so a lock can never outlive its holder on
this host. Who holds it (pid, host, when that process started, the command) is ``RUN_DIR/driver.json``,
written atomically by the holder once it has the lock; the refusal of a second command quotes it. A holder
record whose process is gone (the lock is free, the record is still there) is a driver that was killed: the
next command takes the folder over, rewriting the record, and says so on stderr. Both files are removed when
the holder ends normally (the lock file while still held, and an acquirer checks that the file it locked is
still the one in the folder, so two commands never both hold a lock); a folder this module created to hold
the lock is removed again when nothing else was written into it, so a refused command leaves nothing behind.
A holder also removes the files a killed command left half-written under a temporary name at the top of the
folder (``iclmem.runfolder.remove_temp_leftovers``): with the lock held nobody else is writing them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iclmem.runfolder import DRIVER_FILE, LOCK_FILE, remove_temp_leftovers

__all__ = ["Holder", "hold_run_folder", "read_holder", "refuse_if_held"]


def _stderr(line: str) -> None:
    print(f"iclmem: {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Holder:
    """The process holding a run folder's lock, as ``driver.json`` records it."""

    pid: int
    host: str
    started: str  # when the holding process started, UTC
    command: str  # e.g. "iclmem run"

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, started {self.started} (`{self.command}`)"

    def is_gone(self) -> bool:
        """Whether the process is known to have ended: it ran on this host and its pid is free (or taken by a
        process that started later). A process on another host is never known to be gone."""
        if self.host != socket.gethostname():
            return False
        import psutil

        try:
            created = psutil.Process(self.pid).create_time()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return True
        except psutil.Error:
            return False
        return _utc(created) > self.started  # the pid was reused by a younger process


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _this_process(command: str) -> Holder:
    import psutil

    return Holder(pid=os.getpid(), host=socket.gethostname(), started=_utc(psutil.Process().create_time()),
                  command=command)


def read_holder(run_dir: str | Path) -> Holder | None:
    """The record of who holds (or last held, if it was killed) ``run_dir``'s lock; None when there is none or
    it is not readable (a record being replaced, or damaged: the lock, not the record, decides)."""
    import json

    try:
        raw: dict[str, Any] = json.loads((Path(run_dir) / DRIVER_FILE).read_text(encoding="utf-8"))
        return Holder(pid=int(raw["pid"]), host=str(raw["host"]), started=str(raw["started"]),
                      command=str(raw["command"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _busy(run_dir: Path) -> Exception:
    from iclmem.errors import RunFolderInUse

    holder = read_holder(run_dir)
    if holder is None:
        return RunFolderInUse(f"{run_dir} is in use by another iclmem command (it holds {run_dir / LOCK_FILE} and has "
                              "not recorded itself yet); wait for it to end, then run this again; nothing was changed")
    if holder.is_gone():  # a process the dead driver started (a fork) still holds the lock
        return RunFolderInUse(
            f"{run_dir} is locked by a process left behind by the iclmem driver {holder.describe()}, which has "
            f"ended: stop that process (`fuser {run_dir / LOCK_FILE}` names it), then run this again; nothing was "
            "changed")
    return RunFolderInUse(f"{run_dir} is in use by another iclmem driver: {holder.describe()}; wait for it to end "
                          "(or stop it), then run this again; nothing was changed")


def _open_locked(run_dir: Path) -> int | None:
    """An open descriptor of ``run_dir``'s lock file, locked by this process; None when the file system has no
    locks (then no second driver can be refused). Raises :class:`~iclmem.errors.RunFolderInUse` when another
    process holds it."""
    import fcntl

    path = run_dir / LOCK_FILE
    while True:
        run_dir.mkdir(parents=True, exist_ok=True)  # again if a holder removed the folder it had created
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # opened only to lock it: nothing is written
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(run_dir) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return None
            raise
        try:  # the file locked must still be the folder's: a holder unlinks it before it lets go
            here = os.stat(path)
        except FileNotFoundError:
            os.close(fd)
            continue
        mine = os.fstat(fd)
        if (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
            return fd
        os.close(fd)


def refuse_if_held(run_dir: str | Path) -> None:
    """Raise :class:`~iclmem.errors.RunFolderInUse` when another process holds ``run_dir``'s lock; changes
    nothing (no file is created). Commands call it first, so a folder at work is refused as such rather than
    for what it does not hold yet (a new run's ``sweep.json``)."""
    import fcntl

    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDWR)
    except OSError:  # no lock file (no holder), or none that can be opened: hold_run_folder decides
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: two checks never refuse each other
    except BlockingIOError:
        raise _busy(Path(run_dir)) from None
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold_run_folder(run_dir: str | Path, command: str,
                    note: Callable[[str], None] = _stderr) -> Iterator[Holder]:
    """Hold ``run_dir``'s lock for the block (creating the folder if it is missing). Raises
    :class:`~iclmem.errors.RunFolderInUse` (exit 2), naming the live holder, when another process holds it;
    takes over the folder of a driver that was killed, saying so through ``note``."""
    from iclmem.atomic import write_json_atomic

    folder = Path(run_dir)
    created = not folder.exists()
    try:
        fd = _open_locked(folder)
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    if fd is None:
        note(f"warning: {folder}'s file system does not support file locks: a second iclmem command on this "
             "folder would not be refused")
    me = _this_process(command)
    try:
        previous = read_holder(folder)
        if previous is not None and fd is not None:
            note(f"{folder}: taking over from the iclmem driver {previous.describe()}, which ended without "
                 "releasing the folder (killed?); its results are kept")
        write_json_atomic(folder / DRIVER_FILE, {"pid": me.pid, "host": me.host, "started": me.started,
                                                 "command": me.command})
        if fd is not None:  # held: what a killed command left half-written is nobody's now
            remove_temp_leftovers(folder)
        yield me
    finally:
        with contextlib.suppress(FileNotFoundError):
            (folder / DRIVER_FILE).unlink()
        if fd is not None:
            with contextlib.suppress(FileNotFoundError):
                (folder / LOCK_FILE).unlink()  # while still held: see _open_locked
            os.close(fd)
        if created:
            with contextlib.suppress(OSError):  # only an empty folder: a refused command leaves nothing
                folder.rmdir()
