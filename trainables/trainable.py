"""The Ray Tune function trainable: a thin shell around ``trainables.finetune.Finetuner``.

It is a pure function of (config, checkpoint): it rebuilds everything from ``config``, resumes from
``tune.get_checkpoint()`` when Tune restarts it (a retried failure or a restored sweep), and reports
metrics and checkpoint together with ``tune.report``. Epoch 0 (the base model) is never saved per run:
the reference model is shared by every run instead.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ray import tune

from trainables.finetune import FinetuneSpec, Finetuner

def _maybe_inject_fault(epoch: int, config: dict[str, Any]) -> None:
    """Test hook for fault-injection tests: raise once at ``_fault_once_at_epoch`` (a marker file in
    ``_fault_marker_dir`` remembers it fired, so the retried trial runs through)."""
    at, marker_dir = config.get("_fault_once_at_epoch"), config.get("_fault_marker_dir")
    if at is None or marker_dir is None or int(at) != epoch:
        return
    marker = Path(marker_dir) / f"fault_{config['run_id']}"
    if marker.exists():
        return
    marker.write_text(str(epoch))
    if config.get("_fault_kind") == "sigkill":  # the worker process dies as if the node's OOM killer struck
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault at epoch {epoch}")


def finetune_trainable(config: dict[str, Any], prepared: dict[str, Any] | None = None) -> None:
    """``prepared`` maps task fingerprints to prepared tasks; bound with ``tune.with_parameters`` so the
    tasks travel through the object store to any node, with no shared file system needed for them."""
    import torch

    config = config.get("__trial__", config)  # the sweep driver passes each whole trial config as one grid value
    torch.set_num_threads(int(config.get("torch_threads", 1)))
    spec = FinetuneSpec(**config["finetune"])
    finetuner = Finetuner(spec, [prepared[key] for key in config["task_keys"]])
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            finetuner.restore(directory)
    schedule = set(spec.schedule())
    identity = {"run_id": config["run_id"]}

    while finetuner.epoch < spec.epochs:
        _maybe_inject_fault(finetuner.epoch + 1, config)
        result = finetuner.run_epoch()
        metrics = {**identity, "epoch": result.epoch, "train_loss": result.train_loss,
                   "diverged": result.diverged, **result.metrics}
        if result.diverged:
            # Divergence is a result: stop cleanly; the last good checkpoint stays the latest one.
            tune.report(metrics)
            return
        if result.epoch in schedule:
            with tempfile.TemporaryDirectory() as tmp:
                finetuner.save(tmp, metrics)
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))
        else:
            tune.report(metrics)
