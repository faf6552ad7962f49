"""Controlled fine-tuning, as pure torch: no Ray here, so every step is unit-testable.

Regimes (ICLMEM_SPEC.md, "Stage I — controlled fine-tuning"):
* ``single_fixed``: each epoch is one AdamW step on (context C', the Q member rows as queries).
* ``multi_fixed``: one model, one such step per task per epoch.
* ``multi_random``: each task's pool is its member rows, which Stage I makes the Q members together with
  C' (``PrepSettings.context_in_pool``; as many non-members, C''s label counts included); every epoch
  draws a fresh uniform-label context of ``context_size`` rows and Q query rows from the pool, so every
  pool row is a member (spec: "every pool row is a member").

A ``Finetuner`` holds the model, optimizer and RNG; ``save``/``restore`` move all three through a
checkpoint folder so a resumed run continues bit-exactly.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from iclmem.atomic import atomic_write, write_json_atomic
from iclmem.errors import CheckpointError, ConfigError, CorruptCheckpointError
from iclmem.vocab import CanaryDesign, Regime
from trainables.canaries import CanarySet, make_canaries
from trainables.dp import PerRowMode, clipped_gradient_sum, noisy_gradient, vmap_unsupported, warn_loop_fallback
from trainables.models import ModelAdapter, build_model, read_weights
from trainables.models.base import resolve_device, weights_digest
from trainables.spec import FinetuneSpec as FinetuneSpec  # re-exported: callers import it from here

MODEL_FILE = "model.safetensors"
STATE_FILE = "trainer_state.pt"
META_FILE = "checkpoint.json"


# A reference fine-tune's own randomness (LiRA / RMIA shadow models): a stream separate from every
# trainables.data stream, so a reference's seed never equals a run seed it could be confused with
_REFERENCE_TRAINING_STREAM = 0x5EF


def reference_training_seed(run_seed: int, reference_index: int) -> int:
    """The training seed of reference fine-tune ``reference_index`` of a run with seed ``run_seed``.

    A reference model must not share its target's randomness: with the target's seed it would start from
    the same initialisation, draw the same batches and, on a DP run, add *the same DP noise*, so an attack
    calibrated on it would see the noise the target added and its ε lower bound would no longer be limited
    by the accountant. The seed is derived from (run seed, index) by numpy's SeedSequence (a hash: no two
    (run seed, index) pairs of a sweep share a stream, and none equals a run's own seed stream), so a
    reference is as reproducible as its target and a recomputed reference checkpoint equals the lost one.
    Only the training randomness changes: the reference's rows are still its half of the target's
    population (trainables.data.reference_task), prepared under the run seed."""
    if reference_index < 0:
        raise ConfigError(f"reference_index must be >= 0, got {reference_index}")
    state = np.random.SeedSequence([_REFERENCE_TRAINING_STREAM, int(run_seed), int(reference_index)])
    return int(state.generate_state(1, dtype=np.uint32)[0] & 0x7FFFFFFF)  # torch.manual_seed takes any int; 31 bits


@dataclass(frozen=True)
class Batch:
    """One in-context training step's input. Shapes: N context rows, M query rows, F features."""

    context_x: torch.Tensor  # float32 [1, N, F]
    context_y: torch.Tensor  # int64 [1, N]
    query_x: torch.Tensor  # float32 [1, M, F]
    query_y: torch.Tensor  # int64 [1, M]
    n_classes: int

    def to(self, device: torch.device) -> Batch:
        return Batch(self.context_x.to(device), self.context_y.to(device), self.query_x.to(device),
                     self.query_y.to(device), self.n_classes)


def fixed_batch(task: Any, query_idx: np.ndarray | None = None) -> Batch:
    """(C', members as queries) of a prepared task, with the labels the run trains on."""
    query_idx = task.member_idx if query_idx is None else query_idx
    x = torch.from_numpy(np.array(task.features, dtype=np.float32))
    y = torch.from_numpy(np.array(task.labels, dtype=np.int64))
    ctx, qry = torch.from_numpy(np.array(task.context_idx)), torch.from_numpy(np.array(query_idx))
    return Batch(x[ctx][None], y[ctx][None], x[qry][None], y[qry][None], task.n_classes)


def with_canaries(batch: Batch, canaries: CanarySet) -> Batch:
    """``batch`` with every inserted canary copy appended to its queries (M + sum of copies query rows)."""
    x, y = canaries.training_rows()
    device = batch.query_x.device
    return Batch(batch.context_x, batch.context_y,
                 torch.cat([batch.query_x, torch.from_numpy(np.array(x))[None].to(device)], dim=1),
                 torch.cat([batch.query_y, torch.from_numpy(np.array(y))[None].to(device)], dim=1), batch.n_classes)


@torch.no_grad()
def icl_metrics(model: ModelAdapter, batches: dict[str, Sequence[Batch]]) -> dict[str, float]:
    """``<name>_icl_accuracy`` and ``<name>_icl_loss`` (mean NLL) of each named list of batches: the
    model's ordinary in-context predictions (eval mode; the module's mode is restored after)."""
    was_training = model.module.training
    model.module.eval()
    out: dict[str, float] = {}
    try:
        for name, group in batches.items():
            correct, total, nll = 0.0, 0, 0.0
            for b in group:
                lp = model.log_probs(b.context_x, b.context_y, b.query_x, b.n_classes)
                correct += float((lp.argmax(-1) == b.query_y).sum())
                nll += float(F.nll_loss(lp.reshape(-1, b.n_classes), b.query_y.reshape(-1), reduction="sum"))
                total += b.query_y.numel()
            out[f"{name}_icl_accuracy"] = correct / total
            out[f"{name}_icl_loss"] = nll / total
    finally:
        model.module.train(was_training)
    return out


def icl_utility(model: ModelAdapter, task: Any) -> dict[str, float]:
    """Utility of a (fine-tuned) model on a prepared task: in-context accuracy and loss with C' on the
    members (the labels the run trained on) and on the non-members, as a results row's columns
    ``member_icl_accuracy``, ``nonmember_icl_accuracy``, ``member_icl_loss``, ``nonmember_icl_loss``."""
    device = model.device
    return icl_metrics(model, {"member": [fixed_batch(task).to(device)],
                               "nonmember": [fixed_batch(task, task.nonmember_idx).to(device)]})


def uniform_context(labels: np.ndarray, size: int, n_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Positions (into ``labels``) of a context with the same number of rows of every label."""
    per_class = size // n_classes
    chosen = []
    for c in range(n_classes):
        candidates = np.flatnonzero(labels == c)
        take = min(per_class, len(candidates))
        chosen.append(rng.choice(candidates, size=take, replace=False))
    return np.sort(np.concatenate(chosen))


def random_draw(task: Any, epoch: int, seed: int, n_queries: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """multi_random's draw for one epoch: row positions (into the task's arrays) of the context and of the
    queries, both from the member pool. The context holds the same number of rows of every class of the
    pool, at most ``context_size // n_classes`` and at most one fewer than the class's pool rows, so on an
    imbalanced task it stays uniform and every class keeps rows for the queries; the queries take one row
    of every class left first, then the rest at random."""
    pool = np.array(task.member_idx)
    rng = np.random.default_rng([seed, epoch, int(task.fingerprint[:8], 16)])
    labels = np.asarray(task.labels)[pool]
    counts = np.bincount(labels, minlength=task.n_classes)
    per_class = max(1, min(len(task.context_idx) // task.n_classes, int(counts[counts > 0].min()) - 1))
    ctx_pos = uniform_context(labels, per_class * task.n_classes, task.n_classes, rng)
    rest = np.setdiff1d(np.arange(len(pool)), ctx_pos)
    n_q = min(n_queries or len(rest), len(rest))
    first = [rng.choice(rest[labels[rest] == c]) for c in np.unique(labels[rest])][:n_q]
    others = np.setdiff1d(rest, first)
    q_pos = np.concatenate([np.asarray(first, dtype=np.int64),
                            rng.choice(others, size=n_q - len(first), replace=False)]).astype(np.int64)
    return pool[ctx_pos], pool[q_pos]


def random_batch(task: Any, epoch: int, seed: int, n_queries: int | None = None) -> Batch:
    """multi_random: a fresh uniform context and Q queries drawn from the member pool (:func:`random_draw`)."""
    ctx_rows, query_rows = random_draw(task, epoch, seed, n_queries)
    x = torch.from_numpy(np.array(task.features, dtype=np.float32))
    y = torch.from_numpy(np.array(task.labels, dtype=np.int64))
    ctx, qry = torch.from_numpy(ctx_rows), torch.from_numpy(query_rows)
    return Batch(x[ctx][None], y[ctx][None], x[qry][None], y[qry][None], task.n_classes)


@dataclass(frozen=True)
class EpochResult:
    epoch: int
    train_loss: float
    diverged: bool
    metrics: dict[str, float]


class Finetuner:
    """Fine-tunes one adapter on one or more prepared tasks under a regime.

    ``device`` (see :func:`~trainables.models.base.resolve_device`; default: CUDA when the process was
    given a GPU) holds the model, the optimizer state and every batch; checkpoints are written from CPU
    copies, so a checkpoint trained on one device loads on any."""

    def __init__(self, spec: FinetuneSpec, tasks: Sequence[Any], model: ModelAdapter | None = None,
                 device: str | torch.device | None = None) -> None:
        if not tasks:
            raise ConfigError("fine-tuning needs at least one task")
        if spec.regime == Regime.SINGLE_FIXED and len(tasks) != 1:
            raise ConfigError(f"regime single_fixed takes exactly one task, got {len(tasks)}")
        if str(spec.model_options.get("recipe", "iclmem")) != "iclmem":
            raise ConfigError(f"model {spec.model!r} has recipe {spec.model_options['recipe']!r}: it is fine-tuned by "
                              "trainables.upstream.UpstreamFinetuner (the package's own fine-tuner), not iclmem's loop")
        self.spec = spec
        self.tasks = list(tasks)
        torch.manual_seed(spec.seed)
        self.model = model or build_model(spec.model, **spec.model_options)
        self.model.use_columns(*(getattr(t, "columns", None) for t in self.tasks))  # the tasks' column descriptions
        self.device = resolve_device(device)
        self.model.to(self.device)
        self.model.module.train()
        self.optimizer = torch.optim.AdamW(
            self.model.trainable_parameters(), lr=spec.lr, weight_decay=spec.weight_decay
        )
        self.epoch = 0
        self.dp = spec.dp
        # DP noise comes from its own CPU generator, saved with each checkpoint (see noisy_gradient)
        self._dp_generator = torch.Generator().manual_seed(spec.seed)
        self._per_row_mode = PerRowMode.VMAP
        members = [fixed_batch(t).to(self.device) for t in self.tasks]
        # canaries (single_fixed only): their copies are extra query rows of the one training batch; the
        # per-epoch member metrics stay those of the real members
        self.canaries = make_canaries(self.tasks[0], spec.canaries) if spec.canaries is not None else None
        self._fixed = members if self.canaries is None else [with_canaries(members[0], self.canaries)]
        # the per-epoch member metrics (reported to Tune) never predict a row with itself in the context: in
        # multi_random C' is part of the member pool, so its rows are left out of the member evaluation there
        # (the probe's results rows use leave-one-out contexts instead: probes.known_context)
        self._eval_members = members if spec.regime != Regime.MULTI_RANDOM else [
            fixed_batch(t, np.setdiff1d(t.member_idx, t.context_idx)).to(self.device) for t in self.tasks]
        self._eval_nonmembers = [fixed_batch(t, t.nonmember_idx).to(self.device) for t in self.tasks]

    def _public_rows(self, batch: Batch) -> int:
        """What a DP step divides the noisy sum by: a number that does not depend on which rows are in.
        One_run canaries are in by coin flips, so their count is the expected one, never the drawn one
        (dividing by the drawn count would let the update's scale tell how many canaries went in)."""
        if self.canaries is not None and self.canaries.settings.design is CanaryDesign.ONE_RUN:
            return int(self._eval_members[0].query_y.numel()) + self.canaries.settings.n_inserted_rows
        return int(batch.query_y.numel())

    # ---------------------------------------------------------------------------------------- steps
    def batches(self, epoch: int) -> list[Batch]:
        if self.spec.regime == Regime.MULTI_RANDOM:
            return [random_batch(t, epoch, self.spec.seed, self.spec.queries_per_step).to(self.device)
                    for t in self.tasks]
        return self._fixed

    def step(self, batch: Batch) -> float:
        if self.dp is not None:
            return self.dp_step(batch)
        log_probs = self.model.log_probs(batch.context_x, batch.context_y, batch.query_x, batch.n_classes)
        loss = F.nll_loss(log_probs.reshape(-1, batch.n_classes), batch.query_y.reshape(-1))
        if not torch.isfinite(loss):
            return float("nan")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(self.model.trainable_parameters(), self.spec.grad_clip)
        self.optimizer.step()
        return float(loss.detach())

    def dp_step(self, batch: Batch) -> float:
        """One DP-SGD step (:mod:`trainables.dp`): per-query-row gradients, each clipped to
        ``dp.max_grad_norm``, summed, Gaussian noise of std ``noise_multiplier x max_grad_norm`` added, divided
        by the number of query rows; then the optimizer's step (post-processing). Returns the mean loss."""
        assert self.dp is not None
        try:
            sums, losses, _norms = clipped_gradient_sum(self.model, batch, self.dp.max_grad_norm, self._per_row_mode)
        except (RuntimeError, NotImplementedError) as exc:
            if self._per_row_mode is not PerRowMode.VMAP or not vmap_unsupported(exc):
                raise
            warn_loop_fallback(self.spec.model, exc)
            self._per_row_mode = PerRowMode.LOOP
            sums, losses, _norms = clipped_gradient_sum(self.model, batch, self.dp.max_grad_norm, self._per_row_mode)
        if not torch.isfinite(losses).all():
            return float("nan")
        grads = noisy_gradient(sums, self.dp.noise_std, self._public_rows(batch), self._dp_generator)
        self.optimizer.zero_grad(set_to_none=True)
        for p, g in zip(self.model.trainable_parameters(), grads):
            p.grad = g
        self.optimizer.step()
        return float(losses.mean())

    def dp_record(self) -> dict[str, Any] | None:
        """The DP statement of the current weights (settings, accounted steps, ε spent); None without DP."""
        return None if self.dp is None else {**self.dp.record(self.epoch), "per_row_gradients": self._per_row_mode.value}

    def run_epoch(self) -> EpochResult:
        """One epoch; a NaN/inf loss, non-finite weights, or finite weights whose predictions are not finite
        (weights so large that the forward pass overflows) mark the run diverged (weights untouched)."""
        epoch = self.epoch + 1
        losses = [self.step(b) for b in self.batches(epoch)]
        diverged = not all(math.isfinite(v) for v in losses) or not self._weights_finite()
        self.epoch = epoch
        metrics = {} if diverged else self.evaluate()
        if not all(math.isfinite(v) for v in metrics.values()):
            # a checkpoint of such weights could not be probed (every score NaN): not a result to keep
            diverged, metrics = True, {}
        return EpochResult(epoch, float(np.mean(losses)), diverged, metrics)

    def _weights_finite(self) -> bool:
        return all(torch.isfinite(p).all() for p in self.model.trainable_parameters())

    def evaluate(self) -> dict[str, float]:
        """In-context accuracy with the real context C', on members (their trained labels) and non-members."""
        return icl_metrics(self.model, {"member": self._eval_members, "nonmember": self._eval_nonmembers})

    def train(self, callback: Callable[[EpochResult, Finetuner], Any] | None = None) -> list[EpochResult]:
        """Run to ``spec.epochs``; ``callback(result, finetuner)`` after each epoch may save checkpoints."""
        results = []
        while self.epoch < self.spec.epochs:
            result = self.run_epoch()
            results.append(result)
            if callback is not None:
                callback(result, self)
            if result.diverged:
                break
        return results

    # ---------------------------------------------------------------------------------------- checkpoints
    def save(self, directory: str | Path, metrics: dict[str, Any] | None = None) -> Path:
        """Weights (safetensors), optimizer and RNG state (tensors only) and a JSON manifest that records
        each file's size and sha256, so a truncated or altered file is caught on resume
        (:func:`verify_checkpoint`). Every file is written under a temporary name and renamed; the
        manifest goes last, so a folder with a manifest holds every file the manifest names."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write(directory / MODEL_FILE, self.model.save, to_path=True)
        state = {"optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state(), "epoch": self.epoch}
        if self.dp is not None:
            state["dp_rng"] = self._dp_generator.get_state()
        atomic_write(directory / STATE_FILE, lambda tmp: torch.save(state, tmp), to_path=True)
        manifest = {"epoch": self.epoch, "model": self.spec.model, "model_options": self.spec.model_options,
                    "spec": self.spec.to_dict(), "metrics": metrics or {},
                    "files": {name: file_record(directory / name) for name in (MODEL_FILE, STATE_FILE)},
                    # the file digest guards the bytes; this one the weights themselves (safetensors may
                    # order its header differently on each write, so equal weights can give unequal files)
                    "weights_sha256": weights_digest(self.model.module.state_dict())}
        if self.dp is not None:
            manifest["dp"] = self.dp_record()
        write_json_atomic(directory / META_FILE, manifest, indent=2, default=str, allow_nan=True)
        return directory

    def restore(self, directory: str | Path) -> None:
        """Continue from a checkpoint folder; raises :class:`CorruptCheckpointError` (naming the file)
        before touching any state when a file fails its recorded size or checksum."""
        directory = Path(directory)
        require_files(directory, verify_checkpoint(directory), (MODEL_FILE, STATE_FILE))
        self.model.module.load_state_dict(read_weights(directory / MODEL_FILE))
        try:
            state = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"cannot read trainer state {directory / STATE_FILE}: {exc}") from exc
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        if self.dp is not None:
            if "dp_rng" not in state:
                raise CheckpointError(f"{directory / STATE_FILE} holds no DP noise generator state: it was not written "
                                      "by a DP-SGD run, so this run cannot continue from it")
            self._dp_generator.set_state(state["dp_rng"])
        self.epoch = int(state["epoch"])


def file_record(path: Path) -> dict[str, Any]:
    """Size and sha256 of a file, as stored in a checkpoint manifest."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def checkpoint_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of a checkpoint folder; :class:`CorruptCheckpointError` if it is missing or unreadable."""
    path = Path(directory) / META_FILE
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise CorruptCheckpointError(f"checkpoint manifest missing: {path}", str(path)) from None
    except (OSError, ValueError) as exc:
        raise CorruptCheckpointError(f"checkpoint manifest {path} is unreadable or truncated: {exc}", str(path)) from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or "model" not in manifest:
        raise CorruptCheckpointError(f"checkpoint manifest {path} lacks the model name or file checksums", str(path))
    return manifest


def verify_checkpoint(directory: str | Path) -> dict[str, Any]:
    """Check every file a checkpoint's manifest names against its recorded size and sha256.

    Returns the manifest; raises :class:`CorruptCheckpointError` naming the first file that is missing,
    truncated (size differs) or altered (checksum differs)."""
    directory = Path(directory)
    manifest = checkpoint_manifest(directory)
    for name, expected in sorted(manifest["files"].items()):
        path = directory / name
        if not path.is_file():
            raise CorruptCheckpointError(f"checkpoint file missing: {path}", str(path))
        size = path.stat().st_size
        if size != expected.get("bytes"):
            raise CorruptCheckpointError(
                f"checkpoint file {path} is truncated or altered: {size} bytes, the manifest recorded "
                f"{expected.get('bytes')}", str(path))
        actual = file_record(path)["sha256"]
        if actual != expected.get("sha256"):
            raise CorruptCheckpointError(
                f"checkpoint file {path} fails its checksum (sha256 {actual[:12]}..., the manifest recorded "
                f"{str(expected.get('sha256'))[:12]}...)", str(path))
    return manifest


# The manifest's record of files a sweep removed after probing (training.keep_checkpoints): name -> the file's
# record (bytes, sha256) and why it went
REMOVED_KEY = "removed"


def require_files(directory: Path, manifest: dict[str, Any], names: Sequence[str]) -> None:
    """:class:`CorruptCheckpointError` when a file a reader needs was removed by the sweep's
    ``training.keep_checkpoints`` (the manifest says so): the probe and a resumed trial then recompute it
    from the run's config, as for any lost file, and the error says why it is gone."""
    removed = manifest.get(REMOVED_KEY) or {}
    for name in names:
        if name in removed:
            path = directory / name
            why = removed[name].get("why") if isinstance(removed[name], dict) else removed[name]
            raise CorruptCheckpointError(f"checkpoint file {path} was removed after probing ({why})", str(path))


def remove_checkpoint_files(filesystem: Any, directory: str, names: Sequence[str], why: str) -> int:
    """Remove ``names`` from the checkpoint folder ``directory`` on a pyarrow ``filesystem`` (a local disk or a
    bucket: where Tune keeps it) and return the bytes freed. The manifest is rewritten first, without those
    files and with why each went (:data:`REMOVED_KEY`), then the files go: a crash in between leaves a file the
    manifest no longer names (bytes, not damage), never a manifest naming a file that is gone. The manifest and
    the ground-truth log always stay, so a removed checkpoint is still named, dated and checkable."""
    import pyarrow.fs as pafs

    meta = f"{directory.rstrip('/')}/{META_FILE}"
    with filesystem.open_input_stream(meta) as handle:
        manifest = json.loads(handle.read().decode())
    files = dict(manifest.get("files") or {})
    gone = [n for n in names if n in files]
    if not gone:
        return 0
    manifest["files"] = {n: r for n, r in files.items() if n not in gone}
    # each removed file keeps its record (size, sha256) beside why it went: what was there stays checkable
    manifest[REMOVED_KEY] = {**(manifest.get(REMOVED_KEY) or {}), **{n: {**files[n], "why": why} for n in gone}}
    payload = json.dumps(manifest, indent=2, default=str, allow_nan=True).encode()
    if isinstance(filesystem, pafs.LocalFileSystem):  # atomic on a disk; an object store's put is atomic already
        write_json_atomic(Path(meta), manifest, indent=2, default=str, allow_nan=True)
    else:
        with filesystem.open_output_stream(meta) as handle:
            handle.write(payload)
    freed = 0
    for name in gone:
        try:
            filesystem.delete_file(f"{directory.rstrip('/')}/{name}")
            freed += int(files[name].get("bytes", 0))
        except FileNotFoundError:
            pass
    return freed


def load_checkpoint_model(directory: str | Path) -> ModelAdapter:
    """The fine-tuned model stored in a checkpoint folder written by ``Finetuner.save`` (verified first:
    :class:`CorruptCheckpointError` names a missing, truncated, altered or removed file)."""
    directory = Path(directory)
    if not (directory / META_FILE).is_file() and not (directory / MODEL_FILE).is_file():
        raise CheckpointError(f"not a checkpoint folder (no {META_FILE}): {directory}")
    manifest = verify_checkpoint(directory)
    require_files(directory, manifest, (MODEL_FILE,))
    options = {**manifest.get("model_options", {}), "weights": str(directory / MODEL_FILE)}
    return build_model(manifest["model"], **options)
