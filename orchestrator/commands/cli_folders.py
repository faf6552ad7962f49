"""The folders a command is given (``--out``, ``RUN_DIR``), checked before any work: a name the file system and
the tools below take (``check_folder_name``, for every command), and nothing in the way of the files
``iclmem report`` and ``iclmem resume`` rewrite there (``check_outputs``)."""

from __future__ import annotations

import os
from pathlib import Path

from iclmem.errors import ConfigError


def check_folder_name(flag: str, text: str) -> None:
    """A folder a command writes in (``--out``, ``RUN_DIR``) must have a name the tools below can take: UTF-8
    (Ray, Parquet and W&B encode paths as UTF-8) and within the file system's NAME_MAX per part and PATH_MAX
    in all. Checked before any work, in one line naming the flag."""
    shown = os.fsencode(text).decode("utf-8", "backslashreplace")
    short = shown if len(shown) <= 80 else f"{shown[:40]}...{shown[-20:]}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{flag} {short!r}: the name is not UTF-8 (bytes of another encoding, shown as \\x..); "
                          "Ray, Parquet and W&B take UTF-8 paths only: name the folder in UTF-8") from None
    absolute = Path(text).expanduser().absolute()
    known = next((p for p in (absolute, *absolute.parents) if _is_dir_quietly(p)), Path("/"))
    name_max, path_max = _path_limit(known, "PC_NAME_MAX", 255), _path_limit(known, "PC_PATH_MAX", 4096)
    for part in absolute.parts[1:]:
        if len(os.fsencode(part)) > name_max:
            raise ConfigError(f"{flag} {short!r}: a folder name of {len(os.fsencode(part))} bytes in it; the file "
                              f"system takes at most {name_max} (NAME_MAX): give a shorter name")
    if len(os.fsencode(absolute)) >= path_max:
        raise ConfigError(f"{flag} {short!r}: a path of {len(os.fsencode(absolute))} bytes; the file system takes "
                          f"at most {path_max - 1} (PATH_MAX), and the run's own files go below it: give a shorter path")


def _is_dir_quietly(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a name too long to look up
        return False


def _path_limit(folder: Path, name: str, default: int) -> int:
    try:
        return int(os.pathconf(folder, name))
    except (OSError, ValueError):
        return default


# Files and folders `iclmem report` and `iclmem resume` (re)write in a run folder: one that is in the way (a
# folder where a file goes, or a file where a folder goes) is named before any work, not when it is written.
def check_outputs(run_dir: Path, command: str) -> None:
    """Refuse a sweep folder where an entry of its layout (``iclmem.runfolder.SWEEP_TOP_FILES`` / ``_DIRS``, and the W&B
    folder's) has the other kind, naming it and the remedy, before anything is read or written."""
    from iclmem.runfolder import SWEEP_TOP_DIRS, SWEEP_TOP_FILES, SWEEP_WANDB_ENTRIES, WANDB_DIR

    entries = [(run_dir / name, "file") for name in SWEEP_TOP_FILES]
    entries += [(run_dir / name, "folder") for name in SWEEP_TOP_DIRS]
    entries += [(run_dir / WANDB_DIR / name, kind) for name, kind in SWEEP_WANDB_ENTRIES]
    for path, kind in entries:
        if not path.exists() and not path.is_symlink():
            continue
        if kind == "file" and not path.is_file():
            raise ConfigError(f"{path} is a folder, not a file: `{command}` reads and writes the file {path.name} "
                              "there; move the folder away (nothing was changed)")
        if kind == "folder" and not path.is_dir():
            raise ConfigError(f"{path} is a file, not a folder: `{command}` keeps its {path.name} files there; move "
                              "the file away (nothing was changed)")
