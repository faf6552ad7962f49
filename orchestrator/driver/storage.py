"""Storage checks of a sweep: where Tune keeps checkpoints, whether every node and the driver can reach and write
it, and whether a disk ran full (and the resumable error a sweep then ends with).

Checked before Ray starts (:func:`unreachable_storage`), once Ray is up (:func:`check_storage`: a local path on a
multi-host cluster) and when a sweep fails (:func:`iclmem.errors.is_disk_full`, :func:`free_space`, :func:`disk_full_error`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from iclmem.errors import ConfigError, DiskFull
from iclmem.runfolder import RUN_STATE_FILE, TUNE_DIR, RunStatus, existing_ancestor, unwritable, write_run_state
from orchestrator.schema.config import SweepConfig


def storage_for(sweep: SweepConfig, run_dir: Path) -> str:
    """The sweep's storage_path; else $ICLMEM_STORAGE/<sweep>-<config hash> (set on clusters); else RUN_DIR/tune."""
    if sweep.storage_path:
        return sweep.storage_path
    shared = os.environ.get("ICLMEM_STORAGE")
    if shared:
        return f"{shared.rstrip('/')}/{sweep.name}-{sweep.config_hash()}"
    return str((run_dir / TUNE_DIR).resolve())


def check_storage(storage_path: str) -> None:
    """Tune needs storage every node can reach: refuse a plain local path on a multi-host cluster."""
    import ray

    if "://" in storage_path:
        return
    hosts = {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}  # type: ignore[no-untyped-call]  # ray's state API has no annotations
    declared_shared = os.environ.get("ICLMEM_SHARED_STORAGE") or (
        os.environ.get("ICLMEM_STORAGE") and storage_path.startswith(os.environ["ICLMEM_STORAGE"].rstrip("/")))
    if len(hosts) > 1 and not declared_shared:
        raise ConfigError(
            f"storage_path {storage_path!r} is a local folder, but the cluster spans {len(hosts)} hosts: Tune "
            "writes checkpoints on the worker that produced them and restores trials on other nodes, so every "
            "node must see the same storage. Set storage_path to s3://..., gs://..., or an NFS mount present "
            "on every node (export ICLMEM_STORAGE=<shared root> as cluster.yaml does, or ICLMEM_SHARED_STORAGE=1 to "
            "confirm that storage_path is a shared mount)."
        )


FULL_DISK_BYTES = 2**20  # a folder with less room than this counts as full


def free_space(run_dir: Path, storage: str | None) -> list[tuple[str, str, int]]:
    """(what, folder, free bytes) of the run folder and a local Tune storage."""
    import shutil

    out = []
    for label, folder in (("run folder", str(run_dir)), ("Tune storage", storage)):
        if folder and "://" not in folder:
            try:
                out.append((label, folder, int(shutil.disk_usage(existing_ancestor(folder)).free)))
            except OSError:
                pass
    return out


def disk_full_error(run_dir: Path, storage: str | None, detail: str) -> DiskFull:
    """The error a sweep ends with when a disk ran full: which folders are short of room and how much each
    has, and how to continue. Records the run as interrupted (resumable) when the state can still be written."""
    where = [f"{label} {folder}: {free / 2**20:.1f} MiB free" for label, folder, free in free_space(run_dir, storage)]
    try:
        write_run_state(run_dir, RunStatus.INTERRUPTED, note=f"stopped: disk full ({detail})"[:2000])
        recorded = ""
    except OSError:
        recorded = f" ({RUN_STATE_FILE} could not be updated: no room)"
    return DiskFull(f"a disk ran full ({detail[:300]}); {'; '.join(where) or 'see the paths above'}. The sweep stopped "
                    f"with every stored result kept{recorded}: free space (or point storage_path elsewhere), then "
                    f"`iclmem resume {run_dir}`")


STORAGE_CHECK_TIMEOUT_S = 30.0  # a bucket that does not answer a listing in this time is refused


def unreachable_storage(storage_path: str, timeout_s: float = STORAGE_CHECK_TIMEOUT_S) -> str | None:
    """Why Tune could not keep checkpoints at ``storage_path``, or None: a local folder must be creatable and
    writable; a bucket (``s3://``, ``gs://`` ...) must answer a listing within ``timeout_s`` seconds. Checked
    before Ray starts: otherwise the first trial fails with a traceback (or the filesystem retries for
    minutes) after Stage I."""
    if "://" not in storage_path or storage_path.startswith("file://"):
        # a storage path is given to be written in, beside other experiments: probed even when it holds them
        return unwritable(storage_path.removeprefix("file://"), probe_foreign=True)
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            import pyarrow.fs

            filesystem, path = pyarrow.fs.FileSystem.from_uri(storage_path)
            filesystem.get_file_info(path)
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - any failure to reach the bucket is the answer
            outcome.append(str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__)

    worker = threading.Thread(target=probe, name="iclmem-storage-check", daemon=True)  # a hung client is left behind
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        return f"no answer within {timeout_s:g} s (network, credentials or the bucket's name)"
    return outcome[0]
