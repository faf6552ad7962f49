"""Sweep files: a small declarative YAML validated into typed config at the boundary.

``load_sweep(path)`` reads the YAML (following ``include:`` of a shared base file), validates it with
pydantic and reports *every* mistake at once, each with its path in the file. Inside, a sweep expands
into frozen ``TrialSpec`` dataclasses, one per fine-tuning run.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AllowInfNan,
    BaseModel,
    Field,
    StrictInt,
    create_model,
    field_serializer,
    field_validator,
    model_validator,
)

from iclmem.errors import ConfigError, DataError
from iclmem.vocab import AuditKind, KeepCheckpoints, LabelDesign, LabelMode, Recipe, Regime, TaskKind
from orchestrator.schema.audit_defaults import DEFAULT_BINS, DEFAULT_REFERENCES, MAX_BINS, MIN_BINS
from orchestrator.schema.canaries import CanaryConfig
from orchestrator.schema.config_base import MAX_BOOTSTRAP, SEED_MAX, StrictConfig, settings_default
from orchestrator.schema.config_reading import resolve_path, validate_config
from orchestrator.schema.outputs import (
    WANDB_NAME_MAX,
    WANDB_RESULTS_ARTIFACT_PREFIX,
    ReportConfig,
    SlicesConfig,
    WandbConfig,
)
from orchestrator.schema.resources import ResourcesConfig
from probes.settings import OUTPUT_DECIMALS_MAX, OUTPUT_DECIMALS_MIN, ProbeSettings
from trainables.data.task import PrepSettings
from trainables.dp import DEFAULT_DP_DELTA, DPAccountant
from trainables.spec import FinetuneSpec

_FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max, without importing numpy here
def config_hash_of(data: dict[str, Any]) -> str:
    """The hash of a config's JSON form (what ``sweep.json`` stores), without validating it again.

    Settings added after run folders existed (:data:`HASH_NEUTRAL_FIELDS`) are left out of the hash
    while they hold their default, so a sweep that does not use them keeps the hash (and the run folder,
    Tune storage and W&B runs it names) it had before they existed."""
    return hashlib.sha256(json.dumps(_hash_form(data), sort_keys=True).encode()).hexdigest()[:16]


# Settings added after run folders existed, by (block, key): left out of the hash while they hold their
# default, which is read from the schema (the block's default model), never written here a second time.
HASH_NEUTRAL_FIELDS: tuple[tuple[str, str], ...] = (
    ("grid", "dp"), ("training", "dp_delta"), ("training", "dp_max_grad_norm"), ("training", "dp_accountant"),
    ("outcome", "epsilon_delta"), ("probe", "references"), ("resources", "stall_timeout_min"),
    ("probe", "context_references"), ("canaries", "design"), ("canaries", "m"), ("canaries", "beta"),
    ("canaries", "delta"), ("probe", "two_channels"), ("probe", "value_inference"), ("probe", "sensitive"),
    ("probe", "sensitive_bins"), ("probe", "output_decimals"),
    ("training", "keep_checkpoints"),
)
# Blocks added after run folders existed: left out of the hash while they hold their defaults.
HASH_NEUTRAL_BLOCKS: tuple[str, ...] = ("canaries", "report")
# Keys of list entries added after run folders existed, by (list, key): likewise.
HASH_NEUTRAL_ITEM_FIELDS: tuple[tuple[str, str], ...] = (("models", "recipe"),)


@functools.cache
def _hash_neutral_defaults() -> tuple[dict[tuple[str, str], Any], dict[str, Any]]:
    """The schema's defaults of :data:`HASH_NEUTRAL_FIELDS` and :data:`HASH_NEUTRAL_BLOCKS`, in the JSON form
    ``model_dump(mode="json")`` gives them."""
    blocks = {name: field.default.model_dump(mode="json") for name, field in SweepConfig.model_fields.items()
              if isinstance(field.default, BaseModel)}
    return {(b, k): blocks[b][k] for b, k in HASH_NEUTRAL_FIELDS}, {b: blocks[b] for b in HASH_NEUTRAL_BLOCKS}


def _hash_form(data: dict[str, Any]) -> dict[str, Any]:
    fields_default, blocks_default = _hash_neutral_defaults()
    out = {k: v for k, v in data.items() if not (k in blocks_default and v == blocks_default[k])}
    for name, key in HASH_NEUTRAL_ITEM_FIELDS:
        default = ModelConfig().model_dump(mode="json")[key] if name == "models" else None
        if isinstance(out.get(name), list):
            out[name] = [{k: v for k, v in item.items() if not (k == key and v == default)}
                         if isinstance(item, dict) else item for item in out[name]]
    for (block, key), default in fields_default.items():
        section = out.get(block)
        if isinstance(section, dict) and key in section and section[key] == default:
            out[block] = {k: v for k, v in section.items() if k != key}
    return out


class TaskConfig(StrictConfig):
    # Names become folder and file names (prepared tasks, probe results): letters, digits, . _ - only,
    # not starting with a dot, so no name can point outside the run folder.
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=80)
    builtin: str | None = None  # defaults to ``name`` when no other source is given
    carte: str | None = None  # CARTE data folder (either layout)
    path: str | None = None  # a CSV or parquet file
    target: str | None = None
    task: TaskKind | None = None

    @model_validator(mode="after")
    def _one_source(self) -> TaskConfig:
        sources = [s for s in (self.builtin, self.carte, self.path) if s]
        if len(sources) > 1:
            raise ValueError("give one of builtin, carte or path, not several")
        if self.path and not self.target:
            raise ValueError("a table given by path needs `target` (the column to predict)")
        return self


def _shown_weights(weights: Any) -> str:
    return "null: YAML reads `weights:` with nothing after it as null" if weights is None else f"{weights!r}"


def _accepted_weights(model: str) -> str:
    """The values a model's ``weights`` option takes, for a refusal: its default, the shipped mini where it has
    one, random initialisation, a checkpoint file."""
    from trainables.models.checkpoints import DEFAULT_WEIGHTS, MINI, MINI_CHECKPOINTS, RANDOM

    default = DEFAULT_WEIGHTS.get(model).weights if model in DEFAULT_WEIGHTS else None
    named = [f"{default} (the default)"] if default else []
    if model in MINI_CHECKPOINTS:
        named.append(f"{MINI} (the shipped small pretrained checkpoint)")
    named.append(f"{RANDOM} (a seeded random initialisation, no pretrained weights)")
    return f"one of: {', '.join(named)} or the path of a checkpoint file"


class ModelConfig(StrictConfig):
    name: str = "pfn-mini"
    # Who fine-tunes: iclmem's own loop, or the package's own fine-tuner with its defaults, scored as its
    # estimator deploys (trainables.upstream; models with such a fine-tuner only). Passed to the adapter as
    # its `recipe` option, so checkpoints, reference scores and run ids tell the two apart.
    recipe: Recipe = Recipe.ICLMEM
    # Adapter options; none given: the adapter's own defaults (pfn-mini: its shipped weights; TabICL,
    # TabPFN v2, ConTextTab: the official checkpoint from the local Hugging Face cache). `iclmem models`.
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _recipe_is_an_option(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("options", {}), dict):
            return data  # pydantic names the wrong type
        options = dict(data.get("options") or {})
        given, field = options.get("recipe"), data.get("recipe")
        if given is not None and field is not None and str(given) != str(getattr(field, "value", field)):
            raise ValueError(f"model {data.get('name')}: recipe {field!r} and options.recipe {given!r} disagree")
        recipe = field if field is not None else given
        if recipe is not None and str(getattr(recipe, "value", recipe)) == Recipe.UPSTREAM.value:
            options["recipe"] = Recipe.UPSTREAM.value
        elif given is not None and str(given) == Recipe.ICLMEM.value:
            options.pop("recipe")  # iclmem's own loop is the adapters' default: one spelling, one run id
        return {**data, "options": options, **({"recipe": recipe} if recipe is not None else {})}

    @model_validator(mode="after")
    def _options_fit_the_adapter(self) -> ModelConfig:
        """An empty ``weights`` (which the adapters read as random initialisation) and a value of another type
        than the adapter's builder declares (``allow_download: "false"``, a true string) are refused, named."""
        from trainables.keyword_types import keyword_type_problem
        from trainables.models import MODELS

        if self.name not in MODELS:
            return self  # SweepConfig names the unknown model with the known ones
        if "weights" in self.options:
            weights = self.options["weights"]
            if weights is None or (isinstance(weights, str) and not weights.strip()):
                raise ValueError(f"model {self.name}: options.weights is empty ({_shown_weights(weights)}); give "
                                 f"{_accepted_weights(self.name)}; or leave weights out for the default")
        builder = MODELS.get(self.name)
        for key, value in self.options.items():
            problem = keyword_type_problem(builder, key, value, f"the {self.name} adapter")
            if problem is not None:
                raise ValueError(f"model {self.name}: options.{key} {problem}")
        return self

    @model_validator(mode="after")
    def _recipe_has_a_fine_tuner(self) -> ModelConfig:
        if self.recipe is Recipe.UPSTREAM:
            from trainables.upstream_recipes import UPSTREAM_RECIPES

            if self.name not in UPSTREAM_RECIPES:
                raise ValueError(f"model {self.name}: recipe upstream needs a package fine-tuner iclmem drives; models "
                                 f"with one: {', '.join(UPSTREAM_RECIPES.names())}")
            if self.options.get("finetuner"):
                from trainables.models.extras import extra_is_installed
                from trainables.upstream_recipes import check_finetuner_settings

                if extra_is_installed(self.name):  # without the package, building the model names what is missing
                    try:
                        check_finetuner_settings(self.name, self.options["finetuner"])
                    except ConfigError as exc:
                        raise ValueError(str(exc)) from None
        return self


class GridConfig(StrictConfig):
    regime: list[Regime] = [Regime.SINGLE_FIXED]
    lr: list[float] = [1e-3]
    # strict: YAML's `true` or "50" is not a count of rows or a seed (pydantic would take them as 1 and 50)
    q: list[StrictInt] = [50]
    label_mode: list[LabelMode] = [LabelMode.NORMAL]
    seed: list[StrictInt] = [0]
    # DP-SGD target ε of each run (trainables.dp); inf (YAML .inf or "inf") = plain fine-tuning
    dp: list[Annotated[float, AllowInfNan(True)]] = [math.inf]

    @field_validator("lr")
    @classmethod
    def _positive_lr(cls, values: list[float]) -> list[float]:
        for v in values:
            if not v > 0:
                raise ValueError(f"learning rates must be > 0, got {v}")
            # the optimizer holds the rate as a float32: past its range every trial fails on its first step
            if not v <= _FLOAT32_MAX:
                raise ValueError(f"learning rate {v} does not fit a float32 (at most {_FLOAT32_MAX:.3g}): every "
                                 "trial would fail on its first step")
        return values

    @field_validator("q")
    @classmethod
    def _positive_q(cls, values: list[int]) -> list[int]:
        for v in values:
            if v < 2:
                # Q = 1 makes every AUC 0 or 1 and its interval a point: no split can pass the blind baseline
                raise ValueError(f"Q (member rows) must be >= 2, got {v}: a membership AUC compares at least two "
                                 "members with two non-members")
        return values

    @field_validator("seed")
    @classmethod
    def _seed_in_range(cls, values: list[int]) -> list[int]:
        for v in values:
            if not 0 <= v <= SEED_MAX:
                raise ValueError(f"seeds must be integers in [0, {SEED_MAX}] (what numpy and scikit-learn accept), "
                                 f"got {v}")
        return values

    @field_validator("dp")
    @classmethod
    def _positive_epsilon(cls, values: list[float]) -> list[float]:
        from trainables.dp import MAX_TARGET_EPSILON

        for v in values:
            if not v > 0:  # also refuses NaN
                raise ValueError(f"DP target epsilons must be > 0 (inf = no DP), got {v}")
            if math.isfinite(v) and v > MAX_TARGET_EPSILON:
                raise ValueError(f"DP target epsilon {v:g} is above {MAX_TARGET_EPSILON:g}: e^ε protects nothing "
                                 "there, and calibrating its noise would not end; inf = plain fine-tuning")
        return values

    @field_serializer("dp", when_used="json")
    def _dp_json(self, values: list[float]) -> list[float | str]:
        # JSON has no infinity (sweep.json is written with allow_nan=False); "inf" validates back to inf
        return ["inf" if math.isinf(v) else v for v in values]

    @field_validator("regime", "lr", "q", "label_mode", "seed", "dp")
    @classmethod
    def _non_empty(cls, values: list[Any]) -> list[Any]:
        if not values:
            raise ValueError("a grid axis needs at least one value")
        if len(set(values)) != len(values):
            raise ValueError(f"duplicate values on a grid axis: {values}")
        return values


class TrainingConfig(StrictConfig):
    epochs: int = Field(settings_default(FinetuneSpec, "epochs"), ge=1)
    # Default: the paper's schedule, up to ``epochs``. Epochs given here must all be <= ``epochs``.
    checkpoint_epochs: list[int] = list(settings_default(FinetuneSpec, "checkpoint_epochs"))
    every_epoch: bool = settings_default(FinetuneSpec, "every_epoch")
    grad_clip: float = Field(settings_default(FinetuneSpec, "grad_clip"), gt=0)
    weight_decay: float = Field(settings_default(FinetuneSpec, "weight_decay"), ge=0)
    # DP-SGD runs (grid.dp finite) only: δ of their (ε, δ) guarantee, the per-query-row clipping norm (it
    # replaces grad_clip there) and Opacus's accountant (rdp or prv)
    dp_delta: float = Field(DEFAULT_DP_DELTA, gt=0, lt=1)
    dp_max_grad_norm: float = Field(1.0, gt=0, allow_inf_nan=False)
    dp_accountant: DPAccountant = DPAccountant.RDP
    # which checkpoint files stay once probed (orchestrator/driver/checkpoint_keeping.py; docs/CONFIG.md says why the
    # default keeps every checkpoint's weights and no finished one's optimizer state)
    keep_checkpoints: KeepCheckpoints = KeepCheckpoints.WEIGHTS

    def schedule(self) -> tuple[int, ...]:
        """The epochs a run of this block writes a checkpoint at (``FinetuneSpec.schedule``: the one rule)."""
        return FinetuneSpec(epochs=self.epochs, checkpoint_epochs=tuple(self.checkpoint_epochs),
                            every_epoch=self.every_epoch).schedule()

    @model_validator(mode="after")
    def _schedule_fits(self) -> TrainingConfig:
        if not self.checkpoint_epochs and not self.every_epoch:
            raise ValueError("checkpoint_epochs is empty and every_epoch is false: nothing would be probed")
        if any(e < 1 for e in self.checkpoint_epochs):
            raise ValueError("checkpoint_epochs must be >= 1 (epoch 0 is the shared base model)")
        beyond = [e for e in self.checkpoint_epochs if e > self.epochs]
        # The paper's default schedule is trimmed to ``epochs``; a stored sweep.json repeats it in full (every
        # field is dumped), so only a schedule other than the default is refused for running past the end.
        default = TrainingConfig.model_fields["checkpoint_epochs"].default
        if beyond and "checkpoint_epochs" in self.model_fields_set and self.checkpoint_epochs != default:
            raise ValueError(f"checkpoint_epochs {beyond} exceed epochs ({self.epochs}): they would never be written; "
                             "drop them or raise epochs")
        if self.checkpoint_epochs and min(self.checkpoint_epochs) > self.epochs:
            raise ValueError(
                f"epochs ({self.epochs}) is smaller than every checkpoint epoch {self.checkpoint_epochs}"
            )
        return self


class DataConfig(StrictConfig):
    context_size: int = Field(settings_default(PrepSettings, "context_size"), ge=2)
    regression_bins: int = Field(settings_default(PrepSettings, "regression_bins"), ge=2)
    max_features: int = Field(settings_default(PrepSettings, "max_features"), ge=1)
    # shuffled_members only: ``matched`` (default) permutes the non-members' labels among themselves as the
    # members' are, so the two groups are exchangeable before training; ``unmatched`` is the paper's design
    # (non-members on true labels), kept to reproduce it: its groups are separable without the model
    label_design: LabelDesign = settings_default(PrepSettings, "label_design")
    # Stage I cache shared across run folders (prepared tasks are immutable and named by a hash of every
    # input); default: RUN_DIR/prepared.
    cache_dir: str | None = None

    def prep_settings(self) -> PrepSettings:
        """Stage I's settings from this block (the one place the block becomes them); the rest at their defaults."""
        return PrepSettings(regression_bins=self.regression_bins, max_features=self.max_features,
                            context_size=self.context_size, label_design=self.label_design)

    @field_validator("cache_dir")
    @classmethod
    def _cache_is_a_folder(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.strip():
            raise ValueError("cache_dir is empty: name a folder, or leave it out for RUN_DIR/prepared")
        from iclmem.runfolder import existing_ancestor

        try:
            part = existing_ancestor(value)
            blocked = part.exists() and not part.is_dir()
        except OSError as exc:  # a name too long for the file system
            raise ValueError(f"cache_dir {value[:60]!r}...: not a usable folder name ({exc.strerror or exc})") from None
        if blocked:
            raise ValueError(f"{str(part)!r} is a file, not a folder: Stage I keeps its prepared tasks under "
                             "cache_dir, so it must be a folder (or a path to create)")
        return value


class ProbeConfig(StrictConfig):
    suite: Literal["default"] | list[str | dict[str, Any]] = "default"
    base_as_checkpoint: bool = True  # probe the untouched base model as a checkpoint: the pipeline sanity check
    # resamples of the AUC/TPR intervals, which strict mode's rule reads. At most MAX_BOOTSTRAP: every probe
    # holds resamples x rows of indices at once, so a number far past it (1e12) validates, trains the whole grid
    # and then fails every probe with a MemoryError
    bootstrap: int = Field(settings_default(ProbeSettings, "n_resamples"), ge=10, le=MAX_BOOTSTRAP)
    # null splits probed on every fine-tuned checkpoint (never-trained rows labelled member / non-member at
    # random): the measured false-positive rate of every verdict rule comes from them
    null_splits: int = Field(settings_default(ProbeSettings, "null_splits"), ge=0)
    # the rounded re-test: every verdict is also computed on outputs rounded to this many decimals, as a deployed
    # model returns them (the results' rounded_* columns); null = no rounded re-test
    output_decimals: int | None = Field(settings_default(ProbeSettings, "output_decimals"), ge=OUTPUT_DECIMALS_MIN,
                                        le=OUTPUT_DECIMALS_MAX)
    # K reference fine-tunes per audited run (LiRA / RMIA, probes/attacks/membership.py): each trains with the run's
    # recipe on a random half of its members + non-members; 0 = off
    references: int = Field(0, ge=0, le=64)
    # regime context: K reference contexts of each deployed-context audit (even; every row in half of them)
    context_references: int = Field(DEFAULT_REFERENCES, ge=2, le=256)
    # two channels, same rows (probes/two_channel.py): every fine-tuned checkpoint is also deployed with a context
    # of half its member and half its non-member rows, and those rows are audited through that context against
    # context_references reference contexts on the same weights, beside the probe (the risk report crosses them)
    two_channels: bool = False
    # regime context: value-inference attacks run on each audit beside membership (probes/attacks/value_inference.py):
    # label, and attribute on the column sensitive (numeric: sensitive_bins quantile bins)
    # (the kinds are AuditKind's value-inference members, VALUE_INFERENCE_KINDS; tests/test_audit_kinds.py ties them)
    value_inference: list[Literal["label", "attribute"]] = Field(default_factory=list)
    sensitive: str | None = None
    sensitive_bins: int = Field(DEFAULT_BINS, ge=MIN_BINS, le=MAX_BINS)

    @model_validator(mode="after")
    def _sensitive_goes_with_attribute(self) -> ProbeConfig:
        attribute = AuditKind.ATTRIBUTE.value
        if attribute in self.value_inference and not self.sensitive:
            raise ValueError("value_inference has attribute: set sensitive, the column the attacker infers")
        if self.sensitive and attribute not in self.value_inference:
            raise ValueError(f"sensitive {self.sensitive!r} is read only by value_inference: [attribute]; add it or "
                             "drop sensitive")
        if self.sensitive_bins != DEFAULT_BINS and attribute not in self.value_inference:
            raise ValueError("sensitive_bins is read only by value_inference: [attribute]")
        if len(set(self.value_inference)) != len(self.value_inference):
            raise ValueError(f"value_inference {self.value_inference}: each attack once")
        return self

    @field_validator("context_references")
    @classmethod
    def _even_context_references(cls, value: int) -> int:
        if value % 2:
            raise ValueError(f"context_references {value}: an even number (every row is then in exactly half of "
                             "the reference contexts)")
        return value

    @field_validator("references")
    @classmethod
    def _enough_references(cls, value: int) -> int:
        if value == 1:
            raise ValueError("references: 1 cannot fit in- and out-distributions; use 0 (off) or 2..64")
        return value

    @field_validator("suite")
    @classmethod
    def _suite_valid(cls, value: Any) -> Any:
        if value == "default":
            return value
        from iclmem.errors import IclmemError
        from probes.manipulations import suite_from_spec

        try:
            suite_from_spec(value)
        except IclmemError as exc:  # pydantic reports ValueErrors with the field's path
            raise ValueError(str(exc)) from None
        return value


def _outcome_config() -> type[BaseModel]:
    """The sweep's ``outcome:`` block, derived field by field from ``OutcomeThresholds`` (the one place
    the rule's settings and defaults are declared); values are checked by that class at the boundary."""
    import typing

    from probes.outcomes import OutcomeThresholds

    hints = typing.get_type_hints(OutcomeThresholds)
    fields: dict[str, Any] = {f.name: (hints[f.name], f.default) for f in dataclasses.fields(OutcomeThresholds)}

    def _thresholds_valid(self: BaseModel) -> BaseModel:
        try:
            OutcomeThresholds.from_dict(self.model_dump())
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self

    # pydantic annotates __validators__ as plain callables, but a decorated validator is a descriptor proxy: what
    # pydantic's docs pass there (its replacement, __namespace__, needs pydantic 2.14)
    validators = {"_thresholds_valid": model_validator(mode="after")(_thresholds_valid)}
    return create_model("OutcomeConfig", __base__=StrictConfig,
                        __validators__=validators,  # type: ignore[arg-type]
                        **fields)


if typing.TYPE_CHECKING:
    from probes.outcomes import OutcomeThresholds

    class OutcomeConfig(StrictConfig, OutcomeThresholds):
        """What the type checker sees of the block ``_outcome_config`` builds at run time (mypy cannot follow
        ``create_model``): a StrictConfig whose fields are OutcomeThresholds' fields, names, types and defaults.
        Not an OutcomeThresholds at run time."""
else:
    OutcomeConfig = _outcome_config()


class SweepConfig(StrictConfig):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    tasks: list[TaskConfig]
    # a factory: a default built here would run ModelConfig's check of the adapter's options, which imports
    # every adapter (torch) when this module is imported, and a refusal that needs no model would wait for it
    models: list[ModelConfig] = Field(default_factory=lambda: [ModelConfig()])
    grid: GridConfig = GridConfig()
    training: TrainingConfig = TrainingConfig()
    data: DataConfig = DataConfig()
    probe: ProbeConfig = ProbeConfig()
    canaries: CanaryConfig = CanaryConfig()
    outcome: OutcomeConfig = OutcomeConfig()
    resources: ResourcesConfig = ResourcesConfig()
    wandb: WandbConfig = WandbConfig()
    report: ReportConfig = ReportConfig()
    storage_path: str | None = None
    max_failures: int = Field(2, ge=0)


    def config_hash(self) -> str:
        """Names a validated config (run folders, provenance): the hash of its JSON form."""
        return config_hash_of(self.model_dump(mode="json"))

    def probe_settings(self, n_checkpoints: int | None = None) -> ProbeSettings:
        """How this sweep's checkpoints are probed (the one place the ``probe:``, ``outcome:`` and ``canaries:``
        blocks become :class:`ProbeSettings`); ``n_checkpoints``: the selection-aware family's checkpoints per
        run (default: the training schedule's)."""
        from probes.outcomes import OutcomeThresholds

        return ProbeSettings(n_resamples=self.probe.bootstrap,
                             thresholds=OutcomeThresholds.from_dict(self.outcome.model_dump()),
                             null_splits=self.probe.null_splits, output_decimals=self.probe.output_decimals,
                             n_checkpoints=len(self.training.schedule()) if n_checkpoints is None else n_checkpoints,
                             canary_beta=self.canaries.beta, canary_delta=self.canaries.delta,
                             context_channel_references=self.probe.context_references if self.probe.two_channels
                             else 0)
    @field_validator("storage_path")
    @classmethod
    def _storage_is_a_folder(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.strip():
            raise ValueError(f"empty ({value!r}): name an absolute folder or a URI (s3://bucket/...), "
                             "or leave storage_path out for RUN_DIR/tune")
        if "://" in value:  # a bucket is reached at launch (orchestrator.driver.storage.unreachable_storage)
            scheme, _, rest = value.partition("://")
            if scheme == "file":
                if not rest.startswith("/"):
                    raise ValueError(f"{value!r} names no absolute folder: write file:///abs/folder "
                                     "or the absolute folder itself")
                return value
            if not rest.strip("/") or rest.startswith("/"):
                raise ValueError(f"{value!r} names no bucket: write {scheme}://<bucket>/<folder> "
                                 "(Ray Tune would otherwise write into a bucket of its own choosing)")
            return value
        if "$" in value:
            raise ValueError(f"{value!r} holds a shell variable, which iclmem passes to Ray Tune unexpanded: write "
                             "the value out (the overlay in docs/CLUSTER.md lets the shell expand $ICLMEM_STORAGE)")
        if not Path(value).is_absolute():
            raise ValueError(f"{value!r} is not an absolute path: Ray Tune takes an absolute folder or a URI "
                             "(s3://bucket/..., gs://bucket/...) and fails on a relative or ~ path once the sweep "
                             "has started; write the absolute folder")
        from iclmem.runfolder import existing_ancestor

        part = existing_ancestor(value)
        if part.exists() and not part.is_dir():
            raise ValueError(f"{str(part)!r} is a file, not a folder: Tune keeps checkpoints under "
                             "storage_path, so it must be a folder (or s3://..., gs://...)")
        return value

    @field_validator("tasks")
    @classmethod
    def _unique_tasks(cls, tasks: list[TaskConfig]) -> list[TaskConfig]:
        if not tasks:
            raise ValueError("a sweep needs at least one task")
        names = [t.name for t in tasks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate task names: {dupes}")
        return tasks

    @model_validator(mode="after")
    def _wandb_names_fit(self) -> SweepConfig:
        """The W&B artifact names this sweep logs fit W&B's limit (checked now, not when the finished run logs
        them): the results artifact named after the sweep (each trial's checkpoint artifact, named after its run
        id, is checked where the run ids are made: :func:`orchestrator.schema.trials.expand_grid`)."""
        results = f"{WANDB_RESULTS_ARTIFACT_PREFIX}{self.name}"
        if len(results) > WANDB_NAME_MAX:
            raise ValueError(f"name is {len(self.name)} characters: the sweep's W&B results artifact "
                             f"{WANDB_RESULTS_ARTIFACT_PREFIX}<name> would be {len(results)}, past W&B's limit of "
                             f"{WANDB_NAME_MAX} characters for an artifact name; give a name of at most "
                             f"{WANDB_NAME_MAX - len(WANDB_RESULTS_ARTIFACT_PREFIX)} characters")
        return self

    @model_validator(mode="after")
    def _value_inference_needs_the_context_regime(self) -> SweepConfig:
        if self.probe.value_inference and Regime.CONTEXT not in self.grid.regime:
            raise ValueError(f"probe.value_inference {self.probe.value_inference} runs on the deployed-context "
                             "audits: add context to grid.regime")
        return self

    @model_validator(mode="after")
    def _context_alone_reads_no_fine_tuning_settings(self) -> SweepConfig:
        """A sweep whose only regime is context fine-tunes nothing: what only a fine-tuned checkpoint reads (the
        second channel of ``probe.two_channels``) or only the risk report built from the checkpoints' results
        reads (``report.slices``) would do nothing there, so it is refused, named."""
        if any(r is not Regime.CONTEXT for r in self.grid.regime):
            return self
        if self.probe.two_channels:
            raise ValueError("probe.two_channels: true deploys every fine-tuned checkpoint with a context beside the "
                             "probe, but grid.regime is [context] alone, which fine-tunes nothing: add a fine-tuning "
                             "regime (single_fixed, multi_fixed, multi_random) to grid.regime, or drop "
                             "probe.two_channels (each context audit already audits the deployed context)")
        default = SlicesConfig()
        changed = [f"report.slices.{k}" for k in SlicesConfig.model_fields
                   if getattr(self.report.slices, k) != getattr(default, k)]
        if changed:
            raise ValueError(f"{', '.join(changed)}: the risk report that report.slices groups is built from the "
                             "fine-tuned checkpoints' results, and grid.regime is [context] alone, which fine-tunes "
                             "nothing, so no risk report is built: add a fine-tuning regime "
                             "(single_fixed, multi_fixed, multi_random) to grid.regime, or drop report.slices")
        return self

    @model_validator(mode="after")
    def _dp_fits_the_regimes(self) -> SweepConfig:
        if any(math.isfinite(e) for e in self.grid.dp) and Regime.MULTI_RANDOM in self.grid.regime:
            raise ValueError("grid.dp with a finite epsilon cannot run regime multi_random: its contexts are drawn "
                             "from the member rows, whose influence as context rows DP-SGD does not bound; "
                             "sweep multi_random in a file without grid.dp")
        return self

    @model_validator(mode="after")
    def _upstream_recipes_get_what_they_honour(self) -> SweepConfig:
        """The package fine-tuners take one table and plain steps: what they cannot honour is refused."""
        upstream = [m.name for m in self.models if m.recipe is Recipe.UPSTREAM]
        if not upstream:
            return self
        who = f"models {upstream} with recipe upstream (the package's own fine-tuner)"
        other = [str(r) for r in self.grid.regime if r not in (Regime.SINGLE_FIXED, Regime.CONTEXT)]
        if other:
            raise ValueError(f"grid.regime {other}: {who} fit one table per run, regime single_fixed only")
        if any(math.isfinite(e) for e in self.grid.dp):
            raise ValueError(f"grid.dp: {who} have no DP-SGD (no per-row clipping or noise); audit DP runs with "
                             "recipe iclmem")
        if self.canaries.enabled:
            raise ValueError(f"canaries: {who} cannot insert canary rows; sweep canaries with recipe iclmem")
        return self

    @model_validator(mode="after")
    def _single_task_settings_fit_the_regimes(self) -> SweepConfig:
        """probe.references and canaries are defined on one task's members and non-members (regime context
        fine-tunes nothing: neither applies to it)."""
        other = [str(r) for r in self.grid.regime if r not in (Regime.SINGLE_FIXED, Regime.CONTEXT)]
        if not other:
            return self
        if self.probe.references:
            raise ValueError(f"probe.references ({self.probe.references}) needs every run to be regime single_fixed, "
                             f"but grid.regime has {other}: reference fine-tunes are defined on one task's "
                             "members and non-members; sweep those regimes in a file without probe.references")
        if self.canaries.enabled:
            raise ValueError(f"canaries are inserted into one task's members, so every run must be regime "
                             f"single_fixed, but grid.regime has {other}; sweep those regimes in a file without "
                             "canaries")
        return self

    @field_validator("models")
    @classmethod
    def _known_models(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        from trainables.models import MODELS

        if not models:
            raise ValueError("a sweep needs at least one model")
        for m in models:
            if m.name not in MODELS:
                raise ValueError(f"unknown model {m.name!r}; known: {', '.join(MODELS.names())}")
        return models


def parse_sweep(data: dict[str, Any], source: str = "<sweep>") -> SweepConfig:
    return validate_config(SweepConfig, data, source)


def read_stored_sweep(run_dir: str | Path) -> SweepConfig:
    """The validated sweep a run folder records (``sweep.json``, written by ``orchestrator.report.folder_claims.record_sweep``):
    the one reader ``resume``, ``report`` and ``run``'s folder claim share. :class:`DataError` names the file
    when it is missing, not JSON, or not a sweep this iclmem accepts."""
    from iclmem.atomic import read_json_object
    from iclmem.runfolder import SWEEP_FILE

    path = Path(run_dir) / SWEEP_FILE
    if not path.is_file():
        raise DataError(f"{Path(run_dir)} holds no {SWEEP_FILE}: not an iclmem run folder")
    data = read_json_object(path, "sweep record", "start the sweep again in a new folder")
    try:
        return parse_sweep(data, str(path))
    except ConfigError as exc:
        raise DataError(f"{exc}\n({path} is not a sweep this iclmem version accepts: edited by hand, or written by "
                        "another version)") from None


def resolve_paths(sweep: SweepConfig, base_dir: Path) -> SweepConfig:
    """Relative data paths in a sweep file are relative to the file, not to the working directory."""
    tasks = [t.model_copy(update={"carte": resolve_path(t.carte, base_dir), "path": resolve_path(t.path, base_dir)})
             for t in sweep.tasks]
    return sweep.model_copy(update={"tasks": tasks})
