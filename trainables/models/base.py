"""The model adapter layer: one small interface every LTM implements, and the model registry.

Layers (after TabPFN's ``architectures/interface.py`` vs ``classifier.py``): the architecture is a plain
``torch.nn.Module``; an adapter wraps it with the one call iclmem needs (batched in-context
log-probabilities over a candidate set) plus weights I/O; orchestration never touches the module.

Shapes: B contexts, N context rows, M query rows, F features, C = |Y| candidate labels.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from iclmem.errors import CheckpointError, ModelError
from iclmem.registry import Registry
from iclmem.vocab import InputContract
from trainables.data import PrepSettings, TableColumns, contract_settings
from trainables.models.extras import (
    check_candidates,
    extra_status,  # noqa: F401  (re-exported for `iclmem models`)
    float32_compute,
    target_standardization,
)


class Invariance(str, Enum):
    """An exact symmetry of a model's prediction for a query, declared by its adapter.

    ``ROW_ORDER``: permuting the context rows leaves the prediction unchanged (no positional encoding
    over rows). ``UNIFORM_MULTIPLICITY``: repeating every context row the same number of times leaves it
    unchanged (attention over a context in which every row has k copies weighs each row k-fold in both
    numerator and denominator; with ``context_weight`` a log-count bias of log k on every key cancels in
    the softmax); declared only together with ``ROW_ORDER``. The probe engine scores contexts that are
    identical under the declared invariances once (:meth:`probes.scoring.ProbePlan.representatives`).
    Declare only what holds for every input, up to float rounding: tests/test_invariance.py checks each
    declaration on the adapters' real architectures."""

    ROW_ORDER = "row_order"
    UNIFORM_MULTIPLICITY = "uniform_multiplicity"


def candidate_log_probs(logits: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Log-probabilities [..., C] normalised over the candidates {0, ..., n_classes-1} only, in float32, from
    unnormalised scores [..., >= C] (a model's outputs beyond the candidates are no candidates)."""
    return torch.log_softmax(logits[..., :n_classes].float(), dim=-1)


class ContextBatch(NamedTuple):
    """One batch of same-shape tables for :meth:`ModelAdapter.log_probs_many`: context_x [B, N, F] float32,
    context_y [B, N] int64, query_x [B, M, F] float32, context_weight [B, N] (row multiplicities; models
    with ``supports_context_weights`` only) or None."""

    context_x: torch.Tensor
    context_y: torch.Tensor
    query_x: torch.Tensor
    context_weight: torch.Tensor | None = None


class ModelAdapter(abc.ABC):
    """A tabular in-context model seen through iclmem's eyes."""

    name: str = ""
    max_classes: int = 0
    max_features: int = 0
    # True when the model is invariant to the order of context rows and accepts row multiplicities
    # (``context_weight``) in place of repeated identical rows; the probe engine then scores skewed
    # and scaled contexts with one token per distinct row.
    supports_context_weights: bool = False
    # Exact symmetries of the model (see :class:`Invariance`); none unless an adapter declares them.
    invariances: frozenset[Invariance] = frozenset()
    # True when the model standardises each feature over its context rows (TabPFN v2). A zero-information
    # probe context repeats the query's features in every row, so such a model would see every feature
    # as constant and the query's features would vanish; the probe engine then hands it reference rows
    # (the fine-tuning context C') whose statistics it normalises with instead (:meth:`feature_statistics`).
    normalizes_over_context: bool = False
    # What the model is built to read (:class:`~iclmem.vocab.InputContract`): Stage I prepares every task
    # once per contract, and a sweep hands each model the task prepared for its own.
    input_contract: InputContract = InputContract.REDUCED
    # True when :meth:`log_probs_many` runs batches of different shapes in one forward pass (pfn-mini on the
    # CPU): the probe engine then fills each CPU forward call with several shape groups. Packed calls get
    # no per-call hooks, so such a model reads neither column layouts nor reference statistics.
    packs_batches: bool = False

    def __init__(self, module: torch.nn.Module, options: dict[str, Any] | None = None) -> None:
        self.module = module
        self.options = dict(options or {})
        # the column description of the task(s) the next calls are about (:meth:`use_columns`)
        self.columns: TableColumns | None = None

    # -------------------------------------------------------------------------------- inputs
    def prep_settings(self, settings: PrepSettings) -> PrepSettings:
        """Stage I settings for this model: ``settings`` (``data.*``) under its input contract and its own
        feature limit (:func:`trainables.data.contract_settings`)."""
        return contract_settings(settings, self.input_contract, self.max_features)

    def use_columns(self, *columns: TableColumns | None) -> None:
        """The hook through which a model meets its task(s): the column description of each task the
        following calls are about (several for a model fine-tuned on several tasks at once). Called by
        the fine-tuner and by every probe scoring pass. The default keeps the shared description (None
        when the tasks' differ or none is known); models that read columns override it."""
        known = [c for c in columns if c is not None]
        self.columns = known[0] if known and all(c == known[0] for c in known[1:]) else None

    @contextlib.contextmanager
    def column_layout(self, layout: torch.Tensor | None) -> Iterator[None]:
        """Within the block, materialised column j of context b is the task's column ``layout[b, j]``
        (int64 [B, F']; -1: a probe distractor column), as a probe context keeps some columns and appends
        noise. Outside it the columns are the task's full set, in order. A no-op for models that do not
        read columns."""
        yield

    # -------------------------------------------------------------------------------- prediction
    @abc.abstractmethod
    def _logits(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor) -> torch.Tensor:
        """Unnormalised scores [B, M, >= C] of which the first C columns are the candidates."""

    def _require_classifier(self) -> None:
        """Hook: adapters whose checkpoint may be a regressor refuse class log-probabilities here, before
        the shape checks, so the error names the remedy rather than "at most 0 candidate labels"."""
        return None  # a classifier has nothing to refuse

    def _weighted_logits(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor,
                         context_weight: torch.Tensor) -> torch.Tensor:
        raise ModelError(f"model {self.name!r} does not take context row multiplicities")

    def log_probs(
        self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor, n_classes: int,
        context_weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """context_x [B, N, F] float32, context_y [B, N] int64, query_x [B, M, F] -> [B, M, C] log-probs.

        Normalised over exactly the candidate set {0, ..., n_classes-1}; computed in float32 since member
        and non-member scores can differ by little. ``context_weight`` [B, N] (multiplicity of each
        context row) only for models with ``supports_context_weights``.
        """
        self._require_classifier()
        self.check_shapes(context_x, context_y, query_x, n_classes)
        if context_weight is None:
            logits = self._logits(context_x.float(), context_y.long(), query_x.float())
        else:
            logits = self._weighted_logits(context_x.float(), context_y.long(), query_x.float(), context_weight)
        return candidate_log_probs(logits, n_classes)

    def log_probs_many(self, batches: Sequence[ContextBatch], n_classes: int) -> list[torch.Tensor]:
        """:meth:`log_probs` of each batch ([B, M, C] each, in order); one forward pass for all of them where
        the model ``packs_batches``, else one each."""
        return [self.log_probs(b.context_x, b.context_y, b.query_x, n_classes, context_weight=b.context_weight)
                for b in batches]

    @contextlib.contextmanager
    def feature_statistics(self, reference_x: torch.Tensor | None) -> Iterator[None]:
        """Within the block, a model that ``normalizes_over_context`` standardises features with the
        statistics of ``reference_x`` [B, R, F] (row b for context b) instead of its contexts' own;
        other models ignore it."""
        if reference_x is None or not self.normalizes_over_context:
            yield
            return
        self._reference_x: torch.Tensor | None = reference_x
        try:
            yield
        finally:
            self._reference_x = None

    def check_shapes(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor, n_classes: int) -> None:
        if n_classes > self.max_classes:
            raise ModelError(f"model {self.name!r} supports at most {self.max_classes} candidate labels, got {n_classes}")
        if n_classes < 2:
            raise ModelError(f"a candidate set needs at least 2 labels, got {n_classes}")
        if context_x.ndim != 3 or query_x.ndim != 3 or context_y.ndim != 2:
            raise ModelError(
                f"expected context_x [B,N,F], context_y [B,N], query_x [B,M,F]; got {tuple(context_x.shape)}, "
                f"{tuple(context_y.shape)}, {tuple(query_x.shape)}"
            )
        if context_x.shape[-1] > self.max_features:
            raise ModelError(f"model {self.name!r} takes at most {self.max_features} features, got {context_x.shape[-1]}")

    @property
    def device(self) -> torch.device:
        """Where the module's weights live (inputs must be moved there)."""
        for tensor in self.module.parameters():
            return tensor.device
        return torch.device("cpu")

    def to(self, device: str | torch.device) -> ModelAdapter:
        """Move the module to ``device`` (in place); returns self."""
        self.module.to(torch.device(device))
        return self

    # -------------------------------------------------------------------------------- weights
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    # options that locate weights (a file, a hub version), not the architecture: dropped by skeleton_options
    WEIGHTS_OPTIONS = ("weights", "checkpoint", "checkpoint_version", "allow_download", "config")

    def skeleton_options(self) -> dict[str, Any]:
        """Options that build this model's architecture (size, task, temperature ...) with random weights,
        as recorded with it (``options["config"]`` holds an adapter's full architecture, read from the
        checkpoint it was loaded from): what a probe actor builds before loading the shared reference
        weights into it with :meth:`load_state_arrays`. Building from the sweep's options instead would
        take the default architecture, which a checkpoint of another size does not fit."""
        own = {k: v for k, v in self.options.items() if k not in self.WEIGHTS_OPTIONS}
        # the adapter's own options win over same-named architecture fields (TabPFN's config has a ``seed``)
        return {**(self.options.get("config") or {}), **own, "weights": "random"}

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Weights as numpy arrays: what ``ray.put`` shares zero-copy between actors on a node."""
        return {k: v.detach().cpu().numpy() for k, v in self.module.state_dict().items()}

    def load_state_arrays(self, arrays: dict[str, np.ndarray], copy: bool = True) -> None:
        """Load numpy weights. ``copy=False`` (inference only) makes the module use the arrays' own
        memory: arrays from ``ray.get`` live in the node's shared object store, so every probe actor on
        a node then reads one physical copy of the reference model instead of holding its own."""
        if copy:
            with torch.no_grad():
                state = self.module.state_dict()
                for key, value in arrays.items():
                    state[key].copy_(torch.from_numpy(np.asarray(value)))
            return
        import warnings

        with warnings.catch_warnings():
            # The object store hands out read-only buffers; nothing writes to a frozen reference model.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            shared = {k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()}
        for parameter in self.module.parameters():
            parameter.requires_grad_(False)
        self.module.load_state_dict(shared, assign=True)
        self.module.eval()

    def metadata(self) -> dict[str, str]:
        return {"model": self.name, "options": json.dumps(self.options, sort_keys=True)}

    def save(self, path: str | Path) -> None:
        """safetensors file; tensors only, so loading can never execute code."""
        from safetensors.torch import save_file

        tensors = {k: v.detach().cpu().contiguous().clone() for k, v in self.module.state_dict().items()}
        save_file(tensors, str(path), metadata=self.metadata())

    def load(self, path: str | Path) -> None:
        self.module.load_state_dict(read_weights(path))


class NativeRegressionAdapter(ModelAdapter):
    """An adapter whose checkpoint is a classifier or a native regressor (TabICL, TabPFN v2).

    A classifier scores labels through ``log_probs``: the raw outputs divided by ``softmax_temperature``.
    A regressor refuses that (``regressor_hint`` names the remedy) and scores candidate target values
    through ``candidate_log_probs``, with the model's own predictive density over standardised targets.
    Subclasses give the forward pass, the regressor check and the density."""

    task: str = "classification"
    softmax_temperature: float = 1.0
    regressor_hint: str = ""

    @abc.abstractmethod
    def _forward(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor) -> torch.Tensor:
        """[B, M, out] raw outputs (class logits, quantiles or bucket logits), float32, autocast off."""

    @abc.abstractmethod
    def _require_regressor(self) -> None:
        """Raise :class:`ModelError` unless the checkpoint can score candidate target values."""

    @abc.abstractmethod
    def _candidate_log_density(self, outputs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """outputs [B, M, out] from ``_forward``, standardised candidates z [B, M, C] -> log-density
        [B, M, C]; called in float32 compute."""

    def _logits(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor) -> torch.Tensor:
        return self._forward(context_x, context_y, query_x) / self.softmax_temperature

    def _require_classifier(self) -> None:
        if self.task != "classification":
            raise ModelError(self.regressor_hint)

    def candidate_log_probs(
        self,
        context_x: torch.Tensor,
        context_y_values: torch.Tensor,
        query_x: torch.Tensor,
        candidate_values: torch.Tensor,
        *,
        target_loc: float | torch.Tensor | None = None,
        target_scale: float | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Log-density of each candidate target value, normalised over the candidates: [B, M, C].

        ``context_y_values`` [B, N] are float targets; they and the candidates are standardised with the
        context mean/std as the packages' sklearn regressors do, unless ``target_loc``/``target_scale``
        are given."""
        self._require_regressor()
        candidates = check_candidates(context_x, context_y_values, query_x, candidate_values)
        if context_x.shape[-1] > self.max_features:
            raise ModelError(f"model {self.name!r} takes at most {self.max_features} features, got {context_x.shape[-1]}")
        loc, scale = target_standardization(context_y_values, target_loc, target_scale)
        y = ((context_y_values.double() - loc[:, None]) / scale[:, None]).float()
        z = ((candidates.double() - loc[:, None, None]) / scale[:, None, None]).float()
        outputs = self._forward(context_x.float(), y, query_x.float())  # [B, M, out]
        with float32_compute(outputs.device):
            log_density = self._candidate_log_density(outputs, z)  # [B, M, C]
        return torch.log_softmax(log_density.float(), dim=-1)


def resolve_device(requested: str | torch.device | None = None) -> torch.device:
    """The device fine-tuning and probing run on.

    ``"cpu"``, ``"cuda"``, ``"cuda:N"`` are taken as given (CUDA must then be present). ``None`` or
    ``"auto"`` (the default; the ``ICLMEM_DEVICE`` environment variable may set another) follows the
    resources: inside a Ray task or actor, CUDA exactly when Ray gave it GPUs (``ray.get_gpu_ids()``;
    Ray also hides the GPUs of a worker that asked for none); outside Ray, CUDA when torch sees one."""
    import os

    requested = requested if requested is not None else os.environ.get("ICLMEM_DEVICE", "auto")
    if isinstance(requested, torch.device):
        requested = str(requested)
    if requested != "auto":
        device = torch.device(requested)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ModelError(f"device {requested!r} asked for, but torch sees no CUDA device")
        return device
    if not torch.cuda.is_available():
        return torch.device("cpu")
    try:
        import ray

        if ray.is_initialized() and not ray.get_gpu_ids():
            return torch.device("cpu")
    except ImportError:  # pragma: no cover - ray is a dependency
        pass
    return torch.device("cuda")


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order (the weights themselves,
    unlike a file digest: safetensors may order its header differently on each write)."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())  # reshape: 0-dim tensors too
    return digest.hexdigest()


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Load tensors from safetensors, or a torch file with ``weights_only=True`` (pickled code is refused)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from exc
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path} is not a plain tensor file (refused to unpickle code): {exc}") from exc
    if isinstance(loaded, dict) and "model" in loaded and isinstance(loaded["model"], dict):
        loaded = loaded["model"]
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise CheckpointError(f"{path} does not hold a flat mapping of tensors")
    return loaded


ModelFactory = Callable[..., ModelAdapter]
MODELS: Registry[ModelFactory] = Registry("model")
