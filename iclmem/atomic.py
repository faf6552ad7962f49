"""Atomic file writes: the one helper behind every file iclmem promises to write whole.

A file is written under a temporary name in its own folder (same file system, so the rename is atomic),
flushed and fsynced, then renamed over the target: a reader, or a run killed mid-write, sees the old file
or the new one, never half of either. The temporary file is removed if the write fails.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[Any]], None] | Callable[[str], None], *,
                 binary: bool = True, to_path: bool = False) -> Path:
    """Write ``path`` atomically. ``write`` receives an open file handle (``binary`` selects the mode), or
    with ``to_path`` the temporary file's path, for writers that open files themselves (Parquet,
    safetensors, torch.save)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        if to_path:
            os.close(fd)
            write(tmp)  # type: ignore[arg-type]
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
        else:
            with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as handle:
                write(handle)  # type: ignore[arg-type]
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    return atomic_write(path, lambda handle: handle.write(data))


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike[str], obj: Any, **dumps: Any) -> Path:
    """JSON with sorted keys; non-finite floats are refused (bare ``NaN`` is not valid JSON)."""
    options: dict[str, Any] = {"indent": 1, "sort_keys": True, "allow_nan": False, **dumps}
    return write_text_atomic(path, json.dumps(obj, **options))


def read_json_object(path: str | os.PathLike[str], what: str, remedy: str) -> dict[str, Any]:
    """The JSON object at ``path`` that iclmem wrote with :func:`write_json_atomic` (a stored sweep, a
    record). :class:`~iclmem.errors.DataError` names the file when it is not JSON or not an object: ``what``
    names the record ("sweep record"), ``remedy`` says what to do ("start the sweep again in a new folder")."""
    from iclmem.errors import DataError

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: damaged, not the JSON iclmem wrote ({exc}); restore it from a copy, or {remedy}") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: damaged, not the {what} iclmem wrote (a JSON {type(data).__name__})")
    return data


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, inf) replaced by None, for JSON that other tools can read."""
    import math

    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_parquet_atomic(frame: Any, path: str | os.PathLike[str], metadata: dict[str, str] | None = None) -> Path:
    """A DataFrame as Parquet with a CRC32 on every data page (verified on read by
    ``probes.calibration.read_parquet_checked``: without it a flipped byte reads back as a wrong number);
    ``metadata``: key-value pairs added to the file's schema metadata (pandas' own are kept)."""
    if not metadata:
        return atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False, write_page_checksum=True),
                            to_path=True)
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           **{k.encode(): v.encode() for k, v in metadata.items()}})
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, write_page_checksum=True), to_path=True)


def parquet_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The key-value schema metadata of a Parquet file (pandas' own ``pandas`` entry left out)."""
    import pyarrow.parquet as pq

    raw = pq.read_schema(path).metadata or {}
    return {k.decode(): v.decode() for k, v in raw.items() if k != b"pandas"}


def read_parquet_checked(path: str | os.PathLike[str], columns: list[str] | None = None) -> Any:
    """The table :func:`write_parquet_atomic` wrote at ``path`` with every page checksum verified, or None
    (with a warning naming the file) when it is absent, truncated or fails a checksum: for stored parts that
    are recomputed when damaged."""
    import warnings

    import pandas as pd

    if not Path(path).is_file():
        return None
    try:
        return pd.read_parquet(path, columns=columns, page_checksum_verification=True)
    except Exception as exc:  # pyarrow raises several error types for damaged files
        warnings.warn(f"ignoring unreadable file {path} ({exc}); it will be recomputed", stacklevel=2)
        return None


def read_parquet_verified(path: str | os.PathLike[str], what: str, remedy: str,
                          columns: list[str] | None = None) -> Any:
    """The table at ``path`` with every page checksum verified; :class:`~iclmem.errors.DataError` names the file
    when it is truncated or altered (``what`` names the table, ``remedy`` says what rebuilds it)."""
    import pandas as pd

    from iclmem.errors import DataError

    try:
        return pd.read_parquet(path, columns=columns, page_checksum_verification=True)
    except Exception as exc:  # pyarrow raises several error types for damaged files
        raise DataError(f"{path}: damaged {what} ({type(exc).__name__}: {exc}); {remedy}") from None
