"""``iclmem probe``: audit one fine-tuned checkpoint against its base model, without a sweep or Ray.

The checkpoint is a folder written by iclmem (``checkpoint.json`` + ``model.safetensors``, and in a sweep's
checkpoints ``ground_truth.json``) or a plain weights file of a registered model (``--base-model``).

What the checkpoint records is used, and a flag that contradicts it is refused (naming both values):
``checkpoint.json`` gives the model, the weights fine-tuning started from (the base) and the seed;
``ground_truth.json`` (written beside every checkpoint by the sweep's trainable) gives the task, label
mode, seed and the exact rows and labels of the members, non-members and context, so the audit probes the
split the model was trained on. Where nothing is recorded, the flags (or their defaults) say it. For a
model fine-tuned elsewhere pass ``members`` (a file of row ids, one per line); non-members are drawn from
the other rows with the same label distribution.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from iclmem.atomic import json_safe, write_json_atomic
from iclmem.errors import CheckpointError, ConfigError, DataError
from iclmem.provenance import Provenance
from iclmem.runfolder import (
    CONTEXT_AUDIT_FILE,
    CONTEXT_ROC_FIGURE,
    CONTEXT_ROC_FILE,
    CONTEXT_SCORES_FILE,
    GROUND_TRUTH_FILE,
    INFERENCE_FILE,
    PREPARED_DIR,
    PROBES_DIR,
    PROVENANCE_FILE,
    REFERENCE_DIR,
    SAVED_DIR,
    SAVED_FILE_TABLE,
    VERDICT_FILE,
    WANDB_DIR,
    undo_if_refused,
)
from iclmem.runlock import hold_run_folder
from iclmem.vocab import LabelDesign, LabelMode, SourceKind
from trainables.data.task import PrepSettings

# Draws of non-members for external members before the audit gives up on finding exchangeable ones: Stage I's
# first draw and its redraws (PrepSettings.max_redraws, read from there)
MAX_NONMEMBER_DRAWS = PrepSettings().max_redraws + 1

# What a probe uses when neither a flag nor the checkpoint says otherwise.
def _schema_defaults() -> tuple[dict[str, Any], int]:
    """A single probe's defaults are a sweep's (the schema's), declared once there: the first model, the
    first value of each grid axis, the context size and the bootstrap resamples."""
    from orchestrator.schema.config import DataConfig, GridConfig, ModelConfig, ProbeConfig

    grid = GridConfig()
    # the field's default, not ModelConfig(): building one checks the adapter's options, importing torch
    return ({"base_model": str(ModelConfig.model_fields["name"].default), "q": int(grid.q[0]), "label_mode": LabelMode(grid.label_mode[0]).value,
             "seed": int(grid.seed[0]), "context_size": int(DataConfig().context_size)}, int(ProbeConfig().bootstrap))


DEFAULTS, DEFAULT_BOOTSTRAP = _schema_defaults()


def min_bootstrap() -> int:
    """The sweep schema's lower bound on ``probe.bootstrap`` (one rule for a sweep and a single probe)."""
    from orchestrator.schema.config import ProbeConfig

    return int(next(m.ge for m in ProbeConfig.model_fields["bootstrap"].metadata if hasattr(m, "ge")))


def check_bootstrap_cap(bootstrap: int) -> None:
    """``--bootstrap`` within the sweep schema's upper bound (``probe.bootstrap``, :data:`MAX_BOOTSTRAP`)."""
    from orchestrator.schema.config_base import MAX_BOOTSTRAP

    if bootstrap > MAX_BOOTSTRAP:
        raise ConfigError(f"--bootstrap {bootstrap}: at most {MAX_BOOTSTRAP} resamples (a probe holds resamples x rows "
                          "of indices at once; the sweep's probe.bootstrap has the same bound)")


def parse_task(spec: str) -> Any:
    """``iris`` (built-in), ``DIR:name`` (CARTE folder), or ``FILE.csv:target`` / ``FILE.parquet:target``."""
    from trainables.data import TaskSource

    if ":" not in spec:
        if spec.endswith((".csv", ".parquet")):
            raise ConfigError(f"--task {spec}: a table needs its target column after a colon: --task {spec}:TARGET "
                              "(a CARTE folder is DIR:NAME)")
        return TaskSource(spec, SourceKind.BUILTIN)
    # a table's target is everything after the first ``.csv:`` / ``.parquet:``, so a column may hold colons
    # (``data.csv:a:b`` is column ``a:b`` of data.csv, not the CARTE folder ``data.csv:a``)
    table = re.match(r"(?P<file>.+?\.(?:csv|parquet)):(?P<target>.+)\Z", spec, flags=re.S)
    if table is not None:
        return TaskSource(Path(table["file"]).stem, SourceKind.TABLE, table["file"], table["target"])
    left, right = spec.rsplit(":", 1)
    if not left or not right:
        raise ConfigError(f"--task {spec}: give a built-in task name, CARTE_DIR:NAME or FILE.csv:TARGET")
    return TaskSource(right, SourceKind.CARTE, left)


# ------------------------------------------------------------------------------------------ inputs
@dataclasses.dataclass(frozen=True)
class MemberFile:
    """A ``--members`` file: row ids, and the label each was trained on when the file gives one."""

    row_ids: np.ndarray  # int64 [n]
    labels: tuple[str, ...] | None  # the trained label of each row (class names), or None


def read_member_file(path: str | Path) -> MemberFile:
    """``ROW_ID`` or ``ROW_ID,LABEL`` per line (every line alike; a tab or spaces also separate): the rows
    the checkpoint was fine-tuned on and, under a shuffled label mode, the label each was trained with."""
    file = Path(path)
    ids = read_member_ids(file, allow_labels=True)
    text = file.read_text()
    labels: list[str] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            parts = [p for p in re.split(r"[,\t ]+", line, maxsplit=1) if p]
            labels.append(parts[1].strip() if len(parts) > 1 else "")
    given = [bool(v) for v in labels]
    if any(given) and not all(given):
        first = given.index(False) if given[0] else given.index(True)
        raise DataError(f"{file}: some lines give a trained label and others do not (line {first + 1} of the ids "
                        "differs from the first); give ROW_ID,LABEL on every line or on none")
    return MemberFile(ids, tuple(labels) if all(given) else None)


def read_member_ids(path: str | Path, allow_labels: bool = False) -> np.ndarray:
    """Row ids, one per line (blank lines and ``#`` comments skipped); :class:`DataError` naming the file
    and line of anything else, of a repeated id, and of a file with none. With ``allow_labels`` a line may
    carry a label after its id (``ROW_ID,LABEL``), read by :func:`read_member_file`."""
    file = Path(path)
    if not file.is_file():
        raise DataError(f"members file not found: {file}" + (" (it is a folder)" if file.is_dir() else ""))
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"members file {file} cannot be read as text: {exc}") from exc
    seen: dict[int, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        head = re.split(r"[,\t ]+", line, maxsplit=1)[0] if allow_labels else line
        try:
            value = int(head)
        except ValueError:
            raise DataError(f"{file}:{number}: {head!r} is not an integer row id (one row id per line"
                            + (", optionally followed by its trained label: ROW_ID,LABEL)" if allow_labels else ")")) from None
        if value < 0:
            raise DataError(f"{file}:{number}: row id {value} is negative")
        if value in seen:
            raise DataError(f"{file}:{number}: row id {value} is given twice (first on line {seen[value]})")
        seen[value] = number
    if not seen:
        raise DataError(f"{file}: holds no member row ids (one integer row id per line)")
    if len(seen) < 2:
        raise DataError(f"{file}: holds {len(seen)} member row id; a membership AUC compares at least two members "
                        "with two non-members, so give at least two")
    return np.array(list(seen), dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class CheckpointRecord:
    """What an iclmem checkpoint folder says about how it was made (None: not recorded)."""

    path: Path
    model: str
    model_options: dict[str, Any]  # the fine-tuning's model options; ``weights`` is the base it started from
    seed: int | None
    truth: dict[str, Any] | None  # the single task's entry of ground_truth.json
    canaries: dict[str, Any] | None = None  # the run's canary settings (checkpoint.json's spec), if it had any
    canaries_fingerprint: str | None = None  # ... and the fingerprint ground_truth.json records for them
    canary_label: int | None = None  # ... and their rare_label canaries' label (a reference's is its target's)

    @property
    def task(self) -> str | None:
        return None if self.truth is None else str(self.truth["task"])

    @property
    def label_mode(self) -> str | None:
        return None if self.truth is None else str(self.truth["label_mode"])

    @property
    def q(self) -> int | None:
        return None if self.truth is None else len(self.truth["member_row_ids"])

    @property
    def context_per_class(self) -> int | None:
        return None if self.truth is None else int(self.truth["split_report"]["context_per_class"])


def read_checkpoint_record(path: Path) -> CheckpointRecord | None:
    """The record of an iclmem checkpoint folder; None for a weights file; :class:`CheckpointError` for a
    folder that is not a checkpoint or a record that is damaged."""
    from trainables.finetune import META_FILE, verify_checkpoint

    if not path.is_dir():
        return None
    if not (path / META_FILE).is_file():
        raise CheckpointError(f"{path}: not an iclmem checkpoint folder (no {META_FILE}) and not a weights file")
    manifest = verify_checkpoint(path)
    spec = manifest.get("spec") or {}
    seed = spec.get("seed")
    truth = None
    canaries_fingerprint = None
    canary_label = None
    truth_path = path / GROUND_TRUTH_FILE
    if truth_path.is_file():
        try:
            log = json.loads(truth_path.read_text())
            tasks = log["tasks"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{truth_path}: unreadable ground-truth log ({exc})") from exc
        if len(tasks) != 1:
            raise ConfigError(f"{path} was fine-tuned on {len(tasks)} tasks ({', '.join(t['task'] for t in tasks)}): "
                              "`iclmem probe` audits single-task checkpoints; the sweep's report covers this one")
        truth = tasks[0]
        canary_log = log.get("canaries") or {}
        canaries_fingerprint = canary_log.get("fingerprint")
        rare = {int(label) for kind, label in zip(canary_log.get("kinds") or [], canary_log.get("labels") or [])
                if kind == "rare_label"}
        canary_label = rare.pop() if len(rare) == 1 else None
    return CheckpointRecord(path, str(manifest["model"]), dict(manifest.get("model_options") or {}),
                            None if seed is None else int(seed), truth, spec.get("canaries"), canaries_fingerprint,
                            canary_label)


def _settle(name: str, flag: Any, recorded: Any, source: str) -> Any:
    """The flag's value, the recorded one, or the default; a flag that contradicts the record is refused."""
    if recorded is None:
        return DEFAULTS[name] if flag is None else flag
    if flag is not None and flag != recorded:
        option = "--" + name.replace("_", "-")
        raise ConfigError(f"{option} {flag} conflicts with the checkpoint: {source} records {name} {recorded}; "
                          f"drop {option} to audit the split the checkpoint was trained on")
    return recorded


# ------------------------------------------------------------------------------------------ splits
def _resplit(task: Any, members: np.ndarray, nonmembers: np.ndarray, context: np.ndarray,
             labels: np.ndarray | None = None) -> Any:
    """The task with another split (positions into its arrays). The fingerprint, which names every cache
    (the Stage I cache, the base model's reference scores and in-context losses), is extended by the split,
    so a second probe with other members never reads the first one's cached scores."""
    labels = np.asarray(task.labels) if labels is None else labels
    digest = hashlib.sha256(task.fingerprint.encode())
    for arr in (members, nonmembers, context, labels):
        a = np.ascontiguousarray(arr, dtype=np.int64)
        digest.update(str(a.shape).encode() + a.tobytes())
    frozen = []
    for arr in (members, nonmembers, context, labels):
        a = np.array(arr, dtype=np.int64)
        a.flags.writeable = False
        frozen.append(a)
    return dataclasses.replace(task, member_idx=frozen[0], nonmember_idx=frozen[1], context_idx=frozen[2],
                               labels=frozen[3], fingerprint=digest.hexdigest())  # hex, as every fingerprint


def _positions(task: Any, row_ids: Any, what: str, source: str) -> np.ndarray:
    position = {int(r): i for i, r in enumerate(task.row_ids)}
    missing = [int(r) for r in row_ids if int(r) not in position]
    if missing:
        raise DataError(f"{what} row ids of {source} not in the table (after deduplication): {missing[:10]}")
    return np.array([position[int(r)] for r in row_ids], dtype=np.int64)


def with_members(task: Any, member_row_ids: np.ndarray, seed: int, source: str = "--members",
                 member_labels: Sequence[str] | None = None) -> Any:
    """The task re-split around externally given members (row ids of the source table).

    The members are scored on ``member_labels`` (class names: the labels they were trained with) when
    given, else on the table's labels, which only a ``normal`` run trained on: under a shuffled label mode
    the trained labels must be given (a member scored on its true label while it was trained on a permuted
    one would be measured against the wrong answer). Non-members are drawn with the members' label counts
    from the rows outside the members and C'; when the members carry given labels, the non-members' table
    labels are permuted among themselves, so the two groups carry labels from the same kind of draw."""
    members = _positions(task, member_row_ids, "member", source)
    if member_labels is None and task.label_mode is not LabelMode.NORMAL:
        raise ConfigError(f"--members {source}: label mode {task.label_mode.value} trains members on labels other "
                          "than the table's, and the file gives none: add each row's trained label after its id "
                          "(ROW_ID,LABEL), or audit with --label-mode normal")
    rest = np.setdiff1d(np.arange(len(task.row_ids)), members)
    context = np.setdiff1d(np.asarray(task.context_idx), members)
    rest = np.setdiff1d(rest, context)
    rng = np.random.default_rng(seed)
    labels = np.array(task.original_labels, dtype=np.int64)
    labels[context] = np.asarray(task.labels)[context]  # C' as Stage I labels it for this mode
    if member_labels is not None:
        index = {name: i for i, name in enumerate(task.class_names)}
        unknown = sorted({v for v in member_labels if v not in index})
        if unknown:
            raise DataError(f"{source}: labels {unknown[:10]} are not classes of task {task.name!r} "
                            f"({list(task.class_names)[:10]})")
        labels[members] = [index[v] for v in member_labels]
    from trainables.data.blind import task_blind_baseline

    for attempt in range(MAX_NONMEMBER_DRAWS):
        # as Stage I does, a draw whose groups are separable without the model is drawn again
        rng = np.random.default_rng(seed if attempt == 0 else [seed, attempt])
        nonmembers = []
        for label, count in zip(*np.unique(labels[members], return_counts=True)):
            pool = rest[task.original_labels[rest] == label]
            if len(pool) < count:
                raise DataError(f"not enough non-member rows of label {task.class_names[label]!r} to match the "
                                f"members of {source}")
            nonmembers.append(rng.choice(pool, size=count, replace=False))
        chosen = np.sort(np.concatenate(nonmembers))
        drawn = labels.copy()
        if member_labels is not None:
            drawn[chosen] = labels[chosen[rng.permutation(len(chosen))]]
        split = _resplit(task, members, chosen, context, labels=drawn)
        if not task_blind_baseline(split).separable:
            return split
    raise DataError(f"{source}: in {MAX_NONMEMBER_DRAWS} draws of non-members, every one was separable from the "
                    "members without the model (blind baseline interval excluding 0.5): the members' labels differ "
                    "from the table's other rows beyond chance")


def with_recorded_split(task: Any, truth: dict[str, Any], source: str) -> Any:
    """The task split exactly as the checkpoint's ground-truth log records it: the same member, non-member
    and context rows with the labels the run trained on and was probed on (shuffled ones included). The
    other rows (the null splits' pool) keep the labels Stage I gives them under the recorded design."""
    if list(task.class_names) != list(truth["class_names"]):
        raise DataError(f"the table's classes {list(task.class_names)[:10]} are not the ones {source} records "
                        f"({list(truth['class_names'])[:10]}): is --task the table this checkpoint was trained on?")
    labels = np.array(task.labels, dtype=np.int64)
    parts = []
    for part in ("member", "nonmember", "context"):
        rows = _positions(task, truth[f"{part}_row_ids"], part, source)
        labels[rows] = np.asarray(truth[f"{part}_labels"], dtype=np.int64)
        parts.append(rows)
    members, nonmembers, context = parts
    return _resplit(task, members, nonmembers, context, labels=labels)


# ------------------------------------------------------------------------------------------ models
def _build_weights(name: str, options: dict[str, Any], weights: Path, role: str) -> Any:
    """A model of ``name`` with ``weights`` (a file, or an iclmem checkpoint folder); weights of another
    model or shape are a CheckpointError naming the file, not a torch traceback."""
    from iclmem.errors import IclmemError
    from trainables.finetune import load_checkpoint_model
    from trainables.models import build_model

    try:
        if weights.is_dir():
            return load_checkpoint_model(weights)
        return build_model(name, **{**options, "weights": str(weights)})
    except IclmemError:
        raise
    except (RuntimeError, ValueError, KeyError, OSError, TypeError) as exc:  # torch's load_state_dict and kin
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{weights}: not {role} weights of model {name!r} ({first[:300]}); give the model "
                              "they belong to with --base-model, or the right file") from exc


def audit_checkpoint(checkpoint: str, task: str | None = None, *, base_model: str | None = None,
                     base_options: dict[str, Any] | None = None, base_weights: str | None = None, out: str | None = None,
                     q: int | None = None, label_mode: str | None = None, seed: int | None = None,
                     bootstrap: int = DEFAULT_BOOTSTRAP, members: str | None = None,
                     context_size: int | None = None, log: Any = None) -> dict[str, Any]:
    """Audit ``checkpoint``; None for a setting means "as the checkpoint records it, else the default"."""
    from probes.calibration import model_digest
    from probes.manipulations import default_suite
    from probes.outcomes import OutcomeThresholds
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.data import PrepSettings, load_prepared, prepare_task, save_prepared, task_fingerprint
    from trainables.models import build_model

    note = log or (lambda line: print(line, file=sys.stderr))
    lowest = min_bootstrap()
    if bootstrap < lowest:
        raise ConfigError(f"--bootstrap {bootstrap}: at least {lowest} resamples are needed for the AUC and TPR "
                          f"intervals the verdict reads (the sweep's probe.bootstrap has the same bound)")
    check_bootstrap_cap(bootstrap)
    if label_mode is not None:
        label_mode = LabelMode(label_mode).value
    path = Path(checkpoint)
    if not path.exists():
        raise ConfigError(f"checkpoint not found: {path}")
    if base_weights is not None and not Path(base_weights).is_file():
        raise ConfigError(f"--base-weights {base_weights}: file not found")
    member_file = read_member_file(members) if members else None  # a bad file fails before any work
    member_ids = None if member_file is None else member_file.row_ids
    record = read_checkpoint_record(path)

    # What the checkpoint records wins over defaults; a contradicting flag is refused.
    truth_file = f"{path / GROUND_TRUTH_FILE}"
    meta_file = f"{path / 'checkpoint.json'}"
    model_name = _settle("base_model", base_model, record.model if record else None, meta_file)
    label_mode = _settle("label_mode", label_mode, record.label_mode if record else None, truth_file)
    recorded_seed = None if record is None else (record.truth["seed"] if record.truth else record.seed)
    seed = _settle("seed", seed, recorded_seed, truth_file if record and record.truth else meta_file)
    q = _settle("q", q, record.q if record else None, truth_file)
    source = parse_task(task) if task else None
    if record is not None and record.truth is not None:
        if source is None:
            from trainables.data import BUILTIN_TASKS

            if record.task not in BUILTIN_TASKS:  # a table's path is not in the checkpoint's record
                raise ConfigError(f"{path} was fine-tuned on task {record.task!r}, read from a table whose path the "
                                  f"checkpoint does not record: give that table with --task FILE.csv:TARGET (or "
                                  f"--task CARTE_DIR:{record.task}); its rows and classes are checked against "
                                  f"{truth_file}")
            source = parse_task(record.task or "")
        elif source.kind == "table" and source.name != record.task:
            source = dataclasses.replace(source, name=str(record.task))  # a file's name need not be the task's
        elif source.name != record.task:
            raise ConfigError(f"--task {task} conflicts with the checkpoint: {truth_file} records task {record.task}")
    if source is None:
        raise ConfigError(f"--task is needed: {path} records no task (no {GROUND_TRUTH_FILE})")
    if record is not None and record.truth is None:
        note(f"[iclmem] {path} records no split ({GROUND_TRUTH_FILE} is written beside a sweep's checkpoints): "
             f"auditing q={q}, label mode {label_mode}, seed {seed}, context size "
             f"{context_size or DEFAULTS['context_size']} from the flags or their defaults")

    # the default folder is the checkpoint's own: a second checkpoint of the same task gets another one
    out_dir = Path(out) if out else Path("runs") / f"audit-{source.name}-{audit_hash(path)[:8]}"
    if record is not None and record.truth is not None:
        n_classes = len(record.truth["class_names"])
        per_class = record.context_per_class or 0
        if context_size is not None and context_size // n_classes != per_class:
            raise ConfigError(f"--context-size {context_size} conflicts with the checkpoint: {truth_file} records "
                              f"a context of {per_class} rows per class ({per_class * n_classes} rows)")
        context_size = per_class * n_classes
    context_size = context_size if context_size is not None else DEFAULTS["context_size"]
    options = dict(base_options if base_options is not None else (record.model_options if record else {}))
    if base_weights is not None:
        base = _build_weights(model_name, options, Path(base_weights), "base")
    else:
        base = build_model(model_name, **options)
    model = _build_weights(model_name, options, path, "fine-tuned")  # weights of another model: refused here
    # flags and models are settled: claimed before any work, so that an audit stopped half-way can run again
    claim_audit_folder(out_dir, audit_hash(path), "--out" if out else "the default audit folder", note=note)
    # Stage I under the base model's input contract (ConTextTab reads the real columns, TabICL and TabPFN
    # unreduced numbers), as a sweep prepares the task for that model
    # a log written before label-matched non-members existed records no design: those runs used the paper's
    design = (record.truth.get("label_design", LabelDesign.UNMATCHED.value)
              if record is not None and record.truth is not None else LabelDesign.MATCHED.value)
    # in memory (or read from an earlier audit's cache), and every check of it made, before anything is written:
    # a task, members file or canary record refused leaves no folder (and no prepared rows) behind
    # the design as the log records it, a string: PrepSettings makes it a LabelDesign and names an unknown one
    prep_settings = base.prep_settings(PrepSettings(context_size=context_size, label_design=cast(LabelDesign, design)))
    fingerprint = task_fingerprint(source, prep_settings, label_mode, seed, q, None)
    cache_dir = out_dir / PREPARED_DIR
    stage_one = (load_prepared(fingerprint, cache_dir) if cache_dir.is_dir() else None) or \
        prepare_task(source, prep_settings, label_mode, seed, q, None)
    prepared = stage_one
    if member_ids is not None:
        ids = member_ids
        if record is not None and record.truth is not None:
            if set(ids.tolist()) != set(int(r) for r in record.truth["member_row_ids"]):
                raise ConfigError(f"--members {members} conflicts with the checkpoint: {truth_file} records other "
                                  f"member rows ({len(record.truth['member_row_ids'])} ids); drop --members")
            prepared = with_recorded_split(prepared, record.truth, truth_file)
        else:
            assert member_file is not None
            assert members is not None  # member_file was read from it
            prepared = with_members(prepared, ids, seed, source=members, member_labels=member_file.labels)
    elif record is not None and record.truth is not None:
        prepared = with_recorded_split(prepared, record.truth, truth_file)

    plan = ProbePlan.build(ProbeQueries.from_task(prepared), default_suite(), seed,
                           compress_rows=base.supports_context_weights)
    settings = ProbeSettings(n_resamples=bootstrap, thresholds=OutcomeThresholds())
    identity = {"run_id": f"audit-{path.name}", "task": source.name, "model": model_name, "regime": "external",
                "lr": float("nan"), "q": len(prepared.member_idx), "label_mode": label_mode, "seed": seed}
    canaries = None
    if record is not None and record.canaries is not None:
        from trainables.canaries import make_canaries

        # the canaries the run trained on, rebuilt (a reference run's rare_label ones carry its target's label)
        canaries = make_canaries(dataclasses.replace(prepared, canary_label=record.canary_label), record.canaries)
        if record.canaries_fingerprint and canaries.fingerprint != record.canaries_fingerprint:
            raise CheckpointError(f"{path}: the canaries rebuilt from {meta_file} differ from those {truth_file} "
                                  "records (was the task prepared with other settings?)")
    provenance = audit_provenance(path, {"checkpoint": str(path.resolve()), "task": task or record_task_spec(source),
                                         "base_model": model_name, "base_options": options, "base_weights": base_weights,
                                         "q": q, "label_mode": label_mode, "seed": seed, "bootstrap": bootstrap,
                                         "context_size": context_size, "members": members}, seed)
    with undo_if_refused(out_dir), hold_run_folder(out_dir, "iclmem probe"):
        start_audit_folder(out_dir, provenance)
        if load_prepared(fingerprint, cache_dir) is None:
            save_prepared(stage_one, cache_dir)
        result = probe_checkpoint(model, prepared, plan, out_dir / REFERENCE_DIR, model_digest(base), base, settings,
                                  identity, epoch=-1, canaries=canaries)
        result.save(out_dir / PROBES_DIR, path.name)
        write_json_atomic(out_dir / VERDICT_FILE, strict_json(result.row))
    return dict(result.row)


def audit_estimator(estimator: str, base_estimator: str, task: str, *, members: str, out: str | None = None,
                    label_mode: str | None = None, seed: int | None = None, bootstrap: int = DEFAULT_BOOTSTRAP,
                    context_size: int | None = None, log: Any = None) -> dict[str, Any]:
    """The black-box audit of a deployed classifier (``iclmem probe --estimator``): ``estimator`` and
    ``base_estimator`` are ``MODULE:FACTORY`` specs of classifiers with ``fit`` / ``predict_proba`` (the
    deployed one, e.g. a ``TabPFNClassifier`` on fine-tuned weights, and the same on the weights fine-tuning
    started from); ``members`` the file of the rows its weights were fine-tuned on. Every probe context is a
    ``fit`` and its query a ``predict_proba``
    (:class:`trainables.models.estimator.EstimatorAdapter`), so the estimator is scored with its own
    preprocessing and ensembling; otherwise the audit is ``iclmem probe``'s, same verdict and folder."""
    from probes.calibration import model_digest
    from probes.manipulations import default_suite
    from probes.outcomes import OutcomeThresholds
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.data import PrepSettings, load_or_prepare
    from trainables.models.estimator import EstimatorAdapter, load_estimator_factory

    note = log or (lambda line: print(line, file=sys.stderr))
    if bootstrap < min_bootstrap():
        raise ConfigError(f"--bootstrap {bootstrap}: at least {min_bootstrap()} resamples are needed for the AUC and "
                          "TPR intervals the verdict reads (the sweep's probe.bootstrap has the same bound)")
    check_bootstrap_cap(bootstrap)
    label_mode = LabelMode(label_mode or DEFAULTS["label_mode"]).value
    seed = DEFAULTS["seed"] if seed is None else int(seed)
    context_size = DEFAULTS["context_size"] if context_size is None else int(context_size)
    member_file = read_member_file(members)  # a bad file fails before any work
    source = parse_task(task)
    model = EstimatorAdapter(load_estimator_factory(estimator, "--estimator"), estimator, "--estimator")
    base = EstimatorAdapter(load_estimator_factory(base_estimator, "--base-estimator"), base_estimator, "--base-estimator")
    config = {"estimator": estimator, "base_estimator": base_estimator, "task": task, "members": members,
              "label_mode": label_mode, "seed": seed, "bootstrap": bootstrap, "context_size": context_size}
    identity_hash = settings_hash(config)
    out_dir = Path(out) if out else Path("runs") / f"audit-{source.name}-{identity_hash[:8]}"
    claim_audit_folder(out_dir, identity_hash, "--out" if out else "the default audit folder", "estimator", note=note)
    # Stage I in memory, before the folder is made: a table or members file that cannot be audited leaves none
    n_members = len(member_file.row_ids)
    prepared = load_or_prepare(source, PrepSettings(context_size=context_size, label_design=LabelDesign.MATCHED),
                               label_mode, seed, q=n_members)
    prepared = with_members(prepared, member_file.row_ids, seed, source=members, member_labels=member_file.labels)
    # one checked fit of each estimator on the members, scored on a few non-members: one that fails or answers
    # what no probability is (NaN, inf, negative) is one line naming its flag, and leaves no folder
    for adapter in (model, base):
        adapter.fit_once(prepared.features[prepared.member_idx], prepared.labels[prepared.member_idx],
                         prepared.features[prepared.nonmember_idx[:8]], prepared.n_classes)
    plan = ProbePlan.build(ProbeQueries.from_task(prepared), default_suite(), seed, compress_rows=False)
    settings = ProbeSettings(n_resamples=bootstrap, thresholds=OutcomeThresholds())
    identity = {"run_id": f"audit-estimator-{identity_hash[:8]}", "task": source.name, "model": EstimatorAdapter.name,
                "regime": "external", "lr": float("nan"), "q": n_members, "label_mode": label_mode, "seed": seed}
    with undo_if_refused(out_dir), hold_run_folder(out_dir, "iclmem probe"):
        start_audit_folder(out_dir, Provenance.collect(kind="audit", sweep_name=f"audit-{source.name}", config=config,
                                                       config_hash=identity_hash, seeds=[seed]))
        note(f"[iclmem] black-box audit of {estimator} against {base_estimator}: {len(plan.planned)} probe contexts "
             f"per model and split, each a fit and a predict_proba")
        result = probe_checkpoint(model, prepared, plan, out_dir / REFERENCE_DIR, model_digest(base), base, settings,
                                  identity, epoch=-1)
        result.save(out_dir / PROBES_DIR, "estimator")
        write_json_atomic(out_dir / VERDICT_FILE, strict_json(result.row))
    return dict(result.row)


def audit_provenance(checkpoint: Path, config: dict[str, Any], seed: int | None) -> Provenance:
    """The audit folder's provenance record (kind "audit"): the settings the audit ran with, as resolved."""
    return Provenance.collect(kind="audit", sweep_name=f"audit-{checkpoint.name}", config=config,
                              config_hash=audit_hash(checkpoint), seeds=[] if seed is None else [int(seed)])


def record_task_spec(source: Any) -> str:
    """The ``--task`` form of a task source (what ``parse_task`` reads back)."""
    if source.kind == "table":
        return f"{source.path}:{source.target}"
    if source.kind == "carte":
        return f"{source.path}:{source.name}"
    return str(source.name)


def settings_hash(config: dict[str, Any]) -> str:
    """An audit folder's identity when it audits no checkpoint file (``probe --estimator``, ``audit-context``):
    its settings as resolved. A folder is reused only by an audit with the same settings."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def audit_hash(checkpoint: Path) -> str:
    """An audit folder's identity: the checkpoint it audits (its resolved path). A folder is reused for a
    new audit of the same checkpoint only."""
    return hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:16]


# What an audit (``iclmem probe``, ``iclmem audit-context``) writes in its folder: an unfinished audit holding
# nothing else may be replaced by an audit of other settings (claim_audit_folder, start_audit_folder)
AUDIT_NAMES = frozenset({PROVENANCE_FILE, PREPARED_DIR, REFERENCE_DIR, PROBES_DIR, VERDICT_FILE, CONTEXT_AUDIT_FILE,
                         CONTEXT_ROC_FILE, CONTEXT_SCORES_FILE, CONTEXT_ROC_FIGURE, WANDB_DIR, INFERENCE_FILE,
                         SAVED_DIR, SAVED_FILE_TABLE})


def unfinished_audit(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds an audit that never wrote its verdict (it failed, was refused half-way by an
    older iclmem, or was stopped) and nothing but what an audit writes: it holds no result to keep, so an audit
    of other settings may take its place."""
    from iclmem.runfolder import content

    return not (out_dir / VERDICT_FILE).exists() and all(p.name in AUDIT_NAMES for p in content(out_dir))


def claim_audit_folder(out_dir: Path, identity: str, flag: str, what: str = "checkpoint",
                       note: Any = None) -> None:
    """An audit (``iclmem probe``, ``iclmem audit-context``) writes into a new or empty folder, into the folder
    of the same audit (``identity``: its provenance's config hash), or into the folder of an unfinished audit of
    other settings (no verdict: it failed or was stopped; :func:`unfinished_audit`), which it replaces, saying
    so through ``note``; never among someone else's files, over another audit's verdict, into a folder another
    command holds, or into a sweep's run folder. :class:`ConfigError` (nothing written) otherwise. ``what``
    names the kind of audit in the message."""
    from iclmem.runfolder import folder_kind, unwritable
    from iclmem.runlock import refuse_if_held

    say = note or (lambda line: print(line, file=sys.stderr))
    refuse_if_held(out_dir)  # an audit at work in the folder is refused as such
    found = folder_kind(out_dir)
    where = f"{flag} {out_dir}"
    if found == "audit":
        record = Provenance.read(out_dir)
        if record is None or record.config_hash != identity:
            config = record.config if record is not None else {}
            audited = config.get("checkpoint") or config.get("estimator") or config.get("task") or "?"
            if not unfinished_audit(out_dir):
                raise ConfigError(f"{where} holds the audit of another {what} ({audited}); give --out a new folder")
            say(f"[iclmem] {where} holds an unfinished audit of another {what} ({audited}: no {VERDICT_FILE}, it "
                "failed or was stopped): this audit replaces it")
    if found in ("tabular", "lm"):
        raise ConfigError(f"{where} is an iclmem run folder; an audit writes into a folder of its own: give --out a "
                          "new folder")
    if found == "foreign":
        what_is = "a file" if out_dir.exists() and not out_dir.is_dir() else "not empty and not an iclmem audit folder"
        raise ConfigError(f"{where} is {what_is}: iclmem writes nothing among other files; give --out a new or empty "
                          "folder")
    problem = unwritable(out_dir)
    if problem:
        raise ConfigError(f"{where}: {problem}")


def start_audit_folder(out_dir: Path, record: Provenance) -> None:
    """Make the audit folder and write its provenance, once every check of the audit has passed. An unfinished
    audit of other settings that :func:`claim_audit_folder` let this one replace is removed first (its cached
    rows, scores and stored result are not this audit's); the same audit's are kept, to be continued."""
    import shutil

    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        previous = Provenance.read(out_dir)
    except DataError:
        previous = None
    if previous is not None and previous.config_hash != record.config_hash and unfinished_audit(out_dir):
        for name in AUDIT_NAMES:
            entry = out_dir / name
            if entry.is_dir():
                shutil.rmtree(entry)
            elif entry.exists():
                entry.unlink()
    record.write(out_dir)


def strict_json(row: dict[str, Any]) -> Any:
    """The row as plain JSON values with every NaN or infinity as null: ``verdict.json`` must parse as
    JSON (a bare ``NaN`` is not JSON), and "not defined" is what null says."""

    def plain(value: Any) -> Any:
        return value.item() if isinstance(value, np.generic) else str(value)

    return json_safe(json.loads(json.dumps(row, default=plain, allow_nan=True)))
