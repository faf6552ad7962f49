"""What a sweep keeps of its checkpoints (``training.keep_checkpoints``, :class:`iclmem.vocab.KeepCheckpoints`).

Every checkpoint Tune writes holds the weights (what a probe reads) and the resume state (optimizer and RNG, or the
package's own checkpoint under recipe upstream: what a resumed trial continues from, about twice the weights'
bytes under AdamW). Only two readers ever need them: the probe jobs of that checkpoint, and Tune when it resumes a
trial from its *latest* checkpoint. So:

* the resume state of a checkpoint is removed as soon as it is no longer a running trial's latest (a newer one was
  written, or the trial finished), under every policy but ``all``;
* the weights are removed once every probe job of the checkpoint has stored its result, under ``last`` (all but each
  run's last checkpoint) and ``none`` (all, once the run finished);
* a running trial's latest checkpoint keeps everything, and so does the latest of a trial that failed (``iclmem
  resume`` continues it from there).

Folders are never removed: each keeps its manifest (what was removed and why, the weights' digest) and its
ground-truth log. A removed file is recomputed from the run's config when a reader needs it after all (a result
lost after the removal, a resumed trial): fine-tuning is deterministic in its config and seed, and the recomputed
weights are checked against the digest the manifest recorded (``trainables.recompute``).

The keeper runs in the driver, on Tune's storage through the pyarrow file system Tune wrote with (a local disk or
a bucket). It holds no Ray object; the Tune callback feeds it (``orchestrator.driver.tune_callbacks``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iclmem.runfolder import ROW_SUFFIX
from iclmem.vocab import KeepCheckpoints


def checkpoint_files() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the resume state's files under recipe iclmem and recipe upstream, the weights' file). Imported when a
    checkpoint is first handled: the driver's modules import no torch before a sweep starts."""
    from trainables.finetune import MODEL_FILE, STATE_FILE
    from trainables.upstream import UPSTREAM_STATE_FILE

    return (STATE_FILE, UPSTREAM_STATE_FILE), (MODEL_FILE,)


def result_stored(out_dir: str, stem: str) -> bool:
    """Whether a probe job's result is stored: its row file is written last (``probes.probe.ProbeResult.save``)."""
    return (Path(out_dir) / f"{stem}{ROW_SUFFIX}").is_file()


@dataclass
class KeptCheckpoint:
    """One checkpoint of one run as the keeper tracks it: where it is, and what it still holds."""

    run_id: str
    epoch: int
    filesystem: Any  # pyarrow.fs.FileSystem
    path: str
    jobs: tuple[tuple[str, str], ...]  # (out_dir, stem) of each probe job of the checkpoint
    resume_removed: bool = False
    weights_removed: bool = False

    def probed(self) -> bool:
        return all(result_stored(out_dir, stem) for out_dir, stem in self.jobs)


@dataclass
class CheckpointKeeper:
    """Applies ``policy`` to the checkpoints it is told of. ``add`` a checkpoint when Tune wrote it, ``finish`` a run
    when its trial ended without error, ``settle`` whenever probe results may have come in (cheap: it looks only at
    runs with something left to remove)."""

    policy: KeepCheckpoints
    log: Callable[[str], None] = print
    runs: dict[str, dict[str, KeptCheckpoint]] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    unsettled: set[str] = field(default_factory=set)
    freed_bytes: dict[str, int] = field(default_factory=lambda: {"resume": 0, "weights": 0})
    failures: list[str] = field(default_factory=list)

    def add(self, run_id: str, epoch: int, filesystem: Any, path: str, jobs: Iterable[tuple[str, str]]) -> None:
        """A checkpoint Tune has written (or one found on storage by a resumed driver's catch-up pass)."""
        if self.policy == KeepCheckpoints.ALL:
            return
        kept = self.runs.setdefault(run_id, {})
        if path not in kept:
            kept[path] = KeptCheckpoint(run_id, int(epoch), filesystem, path, tuple(jobs))
        self.unsettled.add(run_id)
        self._settle(run_id)

    def finish(self, run_id: str) -> None:
        """The run's trial ended without error: its latest checkpoint is no longer a resume point."""
        self.finished.add(run_id)
        if run_id in self.runs:
            self.unsettled.add(run_id)
            self._settle(run_id)

    def settle(self) -> None:
        """Remove what the policy allows now, for every run with something left to remove."""
        for run_id in sorted(self.unsettled):
            self._settle(run_id)

    def _settle(self, run_id: str) -> None:
        checkpoints = sorted(self.runs.get(run_id, {}).values(), key=lambda k: k.epoch)
        if not checkpoints:
            self.unsettled.discard(run_id)
            return
        latest, done = checkpoints[-1], run_id in self.finished
        resume_files, weight_files = checkpoint_files()
        left = False
        for kept in checkpoints:
            if kept is latest and not done:  # Tune resumes the trial from here: everything stays
                left = True
                continue
            if not kept.resume_removed:
                self._remove(kept, resume_files, "resume")
            drop_weights = self.policy == KeepCheckpoints.NONE or (self.policy == KeepCheckpoints.LAST
                                                                    and kept is not latest)
            if drop_weights and not kept.weights_removed:
                if kept.probed():
                    self._remove(kept, weight_files, "weights")
                else:
                    left = True
        if not left:
            self.unsettled.discard(run_id)

    def _remove(self, kept: KeptCheckpoint, names: tuple[str, ...], what: str) -> None:
        from trainables.finetune import remove_checkpoint_files

        why = f"training.keep_checkpoints: {self.policy}"
        try:
            self.freed_bytes[what] += remove_checkpoint_files(kept.filesystem, kept.path, names, why)
        except (OSError, ValueError) as exc:  # a storage hiccup costs bytes, never a result: say so once, keep going
            self.failures.append(f"{kept.path}: {type(exc).__name__}: {exc}")
            self.log(f"[iclmem] WARNING could not remove {what} files of checkpoint {kept.path} "
                     f"({type(exc).__name__}: {exc}); they stay")
        if what == "resume":
            kept.resume_removed = True
        else:
            kept.weights_removed = True

    def summary(self) -> str:
        """One console line: what the policy removed."""
        mb = {k: v / 1e6 for k, v in self.freed_bytes.items()}
        return (f"[iclmem] checkpoints (training.keep_checkpoints: {self.policy}): removed {mb['resume']:.1f} MB of "
                f"resume state and {mb['weights']:.1f} MB of probed weights from {sum(map(len, self.runs.values()))} "
                "checkpoint(s); manifests and ground-truth logs kept")


def tune_checkpoint_location(checkpoint: Any) -> tuple[Any, str]:
    """The pyarrow file system and path of a Tune checkpoint (a local folder has the local file system)."""
    import pyarrow.fs as pafs

    filesystem = getattr(checkpoint, "filesystem", None) or pafs.LocalFileSystem()
    return filesystem, str(checkpoint.path)
