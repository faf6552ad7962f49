"""Fault injection for the fault suite, from the test side: production code has no hooks for it.

``faulty_trainable`` is the production trainable with ``Finetuner.run_epoch`` wrapped, in the worker
process only, so that a trial whose config carries ``_fault_once_at_epoch`` fails once just before that
epoch (an exception, a SIGKILL of its worker, or a truncated latest checkpoint and then a crash). A marker
file in ``_fault_marker_dir`` remembers that the fault fired, so the retried trial runs through.
This module is pickled by value, so Ray workers need not import it from the tests folder.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import ray.cloudpickle

from trainables.finetune import Finetuner
from trainables.trainable import finetune_trainable

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def faulty_trainable(config: dict[str, Any], prepared: dict[str, Any] | None = None) -> None:
    trial = config.get("__trial__", config)
    original = Finetuner.run_epoch

    def run_epoch(self: Finetuner) -> Any:
        maybe_inject_fault(self.epoch + 1, trial)
        return original(self)

    Finetuner.run_epoch = run_epoch  # type: ignore[method-assign]
    try:
        finetune_trainable(config, prepared)
    finally:
        Finetuner.run_epoch = original  # type: ignore[method-assign]


def faulty_upstream_trainable(config: dict[str, Any], prepared: dict[str, Any] | None = None) -> None:
    """The same for a run fine-tuned by its package's own fine-tuner (recipe upstream): the fault fires in the
    package's logger hook, just before epoch ``_fault_once_at_epoch`` is reported."""
    from trainables.upstream import UpstreamFinetuner

    trial = config.get("__trial__", config)
    original = UpstreamFinetuner.run

    def run(self: UpstreamFinetuner, on_epoch: Any) -> Any:
        def faulty(result: Any, path: Any, end: Any) -> Any:
            maybe_inject_fault(result.epoch, trial)
            return on_epoch(result, path, end)

        return original(self, faulty)

    UpstreamFinetuner.run = run  # type: ignore[method-assign]
    try:
        finetune_trainable(config, prepared)
    finally:
        UpstreamFinetuner.run = original  # type: ignore[method-assign]


def maybe_inject_fault(epoch: int, config: dict[str, Any]) -> None:
    """Raise once at ``_fault_once_at_epoch`` (a marker file in
    ``_fault_marker_dir`` remembers it fired, so the retried trial runs through)."""
    at, marker_dir = config.get("_fault_once_at_epoch"), config.get("_fault_marker_dir")
    if at is None or marker_dir is None or int(at) != epoch:
        return
    marker = Path(marker_dir) / f"fault_{config['run_id']}"
    if marker.exists():
        return
    marker.write_text(str(epoch))
    if config.get("_fault_kind") == "truncate_latest_checkpoint":  # a half-written upload, then a crash
        _truncate_latest_checkpoint(Path(config["_fault_storage"]), config["run_id"], epoch - 1)
    if config.get("_fault_kind") == "sigkill":  # the worker process dies as if the node's OOM killer struck
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault at epoch {epoch}")


def _truncate_latest_checkpoint(storage: Path, run_id: str, epoch: int) -> None:
    """Cut this run's checkpoint weights of ``epoch`` (the newest one reported) in half, found by the run id
    in the manifests under Tune's storage folder. Waits (up to 60 s) until that checkpoint is in the storage
    and the driver has processed its result (its line is in the trial's result.json): under load the
    driver can see the crash before the last report, restore the checkpoint before it, and never meet the
    truncated one -- correct, but it would test nothing."""
    import json
    import time

    from trainables.finetune import META_FILE, MODEL_FILE

    deadline = time.monotonic() + 60
    while True:
        mine = []
        for manifest in storage.rglob(META_FILE):
            try:
                meta = json.loads(manifest.read_text())
            except (OSError, ValueError):  # a manifest being written right now
                continue
            if meta.get("metrics", {}).get("run_id") == run_id:
                mine.append((int(meta["epoch"]), manifest.parent / MODEL_FILE))
        if mine and max(mine)[0] >= epoch and _driver_saw(max(mine)[1].parent.parent / "result.json", epoch):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    _epoch, weights = max(mine)
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])


def _driver_saw(result_file: Path, epoch: int) -> bool:
    """True once the Tune driver has logged the result of ``epoch`` for this trial."""
    import json

    try:
        lines = result_file.read_text().splitlines()
    except OSError:
        return False
    epochs = []
    for line in lines:
        try:
            epochs.append(int(json.loads(line).get("epoch", -1)))
        except (ValueError, AttributeError):  # a line being appended right now
            continue
    return epoch in epochs


def failing_at_lr_trainable(config: dict[str, Any], prepared: dict[str, Any] | None = None) -> None:
    """The real trainable, except that a trial whose learning rate is ``_fail_lr`` (0.01) raises before
    its first epoch, its message coloured as Ray prints a worker's error: a setting the config accepts
    that fails every such trial at run time."""
    trial = config.get("__trial__", config)
    if float(trial["finetune"]["lr"]) == 0.01:
        raise RuntimeError("\x1b[36minjected\x1b[39m failure: lr 0.01 cannot be trained")
    finetune_trainable(config, prepared)


def full_disk_at_lr_trainable(config: dict[str, Any], prepared: dict[str, Any] | None = None) -> None:
    """The real trainable, except that a trial whose learning rate is 0.01 meets a full disk (ENOSPC, as a
    checkpoint write would) before its first epoch, while Tune's own state stays intact."""
    import errno

    trial = config.get("__trial__", config)
    if float(trial["finetune"]["lr"]) == 0.01:
        raise OSError(errno.ENOSPC, "No space left on device", "/scratch/checkpoint_000000/model.safetensors")
    finetune_trainable(config, prepared)
