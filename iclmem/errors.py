"""Typed failures. Every error a user can cause names the file, column or setting at fault.

Each class carries the exit status ``iclmem`` ends with when it reaches the command line (``main`` in
``orchestrator/cli.py`` applies it, for every command alike): :data:`EXIT_BAD_INPUT` for what the user
gave (a sweep file, a flag, a table, a checkpoint), :data:`EXIT_FAILURE` for work that failed at run time,
:data:`EXIT_INTERRUPTED` for a run stopped by Ctrl-C (128 + SIGINT, what a shell reports for it)."""

from __future__ import annotations

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2  # also argparse's status for a bad flag, so both kinds of bad input read the same
EXIT_INTERRUPTED = 130


class IclmemError(Exception):
    """Base of every error iclmem raises on purpose."""

    exit_code = EXIT_FAILURE


class ConfigError(IclmemError):
    """A sweep file or setting is invalid. Raised before any cluster work starts."""

    exit_code = EXIT_BAD_INPUT


class RunFolderInUse(IclmemError):
    """Another iclmem command holds the run folder (``iclmem.runlock``): refused before any work, nothing
    changed. The message names the folder and the holder (pid, host, start, command)."""

    exit_code = EXIT_BAD_INPUT


class DataError(IclmemError):
    """A table cannot be turned into a prepared task (missing file, bad target, too few rows, ...)."""

    exit_code = EXIT_BAD_INPUT


class SplitError(DataError):
    """No member / non-member split passed the distribution checks within the allowed redraws."""


class UnknownNameError(ConfigError, KeyError):
    """A registry was asked for a name it does not hold."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


class DuplicateNameError(IclmemError):
    """A registry was asked to register a name twice (a programming error, not the user's input)."""


class ModelError(IclmemError):
    """A model cannot be built, loaded or asked to do what it cannot (e.g. too many classes): the model
    named or the weights given are at fault, so it is bad input."""

    exit_code = EXIT_BAD_INPUT


class CheckpointError(ModelError):
    """A checkpoint is missing, corrupt, or not a plain tensor file."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is missing, truncated or altered: its size or sha256 differs from the manifest
    written with it. ``path`` names the file at fault."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # keeps ``path`` when Ray ships the error from an actor to the driver
        return (type(self), (str(self), self.path))


class ResultSchemaError(IclmemError):
    """A results row or table does not match ``iclmem.record``: an undeclared column, a missing identity
    column, or a table in a shape this iclmem no longer reads (the message names the version that wrote it)."""


class ProbeError(IclmemError):
    """A probe could not be built or scored."""


class TrialsFailed(IclmemError):
    """Fine-tuning trials ended on an error: the sweep is not complete, whatever else it stored (exit 1;
    ``run_state.json`` says failed and names the runs). ``causes`` maps each distinct cause (one line) to
    the run ids it stopped."""

    def __init__(self, message: str, causes: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.causes = dict(causes or {})


# how a full disk or quota reads in an error's text (a trial's error as Tune reports it, pyarrow's OSError)
_NO_SPACE = ("No space left on device", "[Errno 28]", "errno 28", "Disk quota exceeded", "[Errno 122]")


def is_disk_full(error: BaseException | str) -> bool:
    """Whether ``error`` (an exception with its causes, or a trial's error text) is a full disk or quota."""
    import errno

    seen: set[int] = set()
    current: BaseException | str | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(marker in str(current) for marker in _NO_SPACE):
            return True
        current = (current.__cause__ or current.__context__) if isinstance(current, BaseException) else None
    return False


class DiskFull(IclmemError):
    """A disk the sweep writes to (the run folder, Tune's storage) ran full: the sweep stopped with what it
    had stored kept, ``run_state.json`` says interrupted, and ``iclmem resume`` continues once there is room
    (exit 1)."""


class SweepStalled(IclmemError):
    """A sweep made no progress for ``resources.stall_timeout_min`` (trials or probe actors waiting for
    resources the cluster does not give): stopped, resumable, exit 1. The message quotes what Ray waits for."""


class SweepInterrupted(IclmemError):
    """The user stopped a sweep (Ctrl-C); every finished result is kept in ``run_dir`` and
    ``iclmem resume run_dir`` continues it (``hint`` replaces that advice where it does not apply)."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, run_dir: str, hint: str | None = None) -> None:
        super().__init__(hint or f"interrupted \u2014 continue with `iclmem resume {run_dir}`")
        self.run_dir = run_dir
        self.hint = hint

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:
        return (type(self), (self.run_dir, self.hint))
