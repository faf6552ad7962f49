"""Typed failures. Every error a user can cause names the file, column or setting at fault."""

from __future__ import annotations


class IclmemError(Exception):
    """Base of every error iclmem raises on purpose."""


class ConfigError(IclmemError):
    """A sweep file or setting is invalid. Raised before any cluster work starts."""


class DataError(IclmemError):
    """A table cannot be turned into a prepared task (missing file, bad target, too few rows, ...)."""


class SplitError(DataError):
    """No member / non-member split passed the distribution checks within the allowed redraws."""


class UnknownNameError(ConfigError, KeyError):
    """A registry was asked for a name it does not hold."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


class DuplicateNameError(IclmemError):
    """A registry was asked to register a name twice."""


class ModelError(IclmemError):
    """A model cannot be built, loaded or asked to do what it cannot (e.g. too many classes)."""


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


class ProbeError(IclmemError):
    """A probe could not be built or scored."""
