"""Ray side of an LM probe sweep: work units on the probe pool, one results table, the report and W&B.

``run_lm_sweep`` is what ``iclmem lm run`` and ``iclmem lm resume RUN_DIR`` call. It runs on the same core
as the tabular sweep (``orchestrator.driver.sweep``): the run-folder claim (``orchestrator.report.folder_claims``), Ctrl-C and the
console (``orchestrator.driver.console``), the config base and messages (``orchestrator.schema.lm_config``),
Ray start-up (``iclmem.raysession``), the probe pool (``probes.actors.ProbePool`` over
``LMUnitWorker``: retries, resends, results stored per unit with a checksum), the provenance record
(``kind = "lm"``), the run-folder names (``iclmem.runfolder``), atomic writes, the report page and the W&B
logger. Work units (``probes.lm.units``):

* exposure  per (model, dataset)                      - needed by NET subsets and NER "test seen"
* net       per (model, dataset, entity type)
* ner       per (model, dataset, entity type, seed)   - BIO datasets with a train and a test split

A NER unit that tests on memorized entities ("seen") is sent once its dataset's exposure unit is done
(the memorized lists are part of its parameters); every other unit is sent at once. Datasets are read and
checked in the driver before Ray starts (a config or data mistake costs nothing) and shipped once with
``ray.put``. The results table is built from the stored unit results only, so a resumed sweep and an
uninterrupted one go through the same code and give the same table; a unit that still fails after its
retries is named in a ``ProbeError`` raised after every other result is written.

Logs carry counts and names of models, datasets and types, never sentences.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from iclmem.atomic import atomic_write, write_json_atomic, write_parquet_atomic
from iclmem.errors import ConfigError, DataError, ProbeError, SweepInterrupted
from iclmem.provenance import Provenance
from iclmem.raysession import ensure_ray, quiet_console
from iclmem.runfolder import (
    CONSOLE_LOG_FILE,
    LM_ASSETS_DIR,
    LM_EXPOSURE_DIR,
    LM_REPORT_FILE,
    LM_RESULTS_FILE,
    LM_SWEEP_FILE,
    LM_UNITS_DIR,
    RunStatus,
    write_run_state,
)
from iclmem.vocab import LMProbe, NerVariant
from orchestrator.schema.lm_config import LMSweepConfig, parse_lm_sweep
from orchestrator.schema.sweep_files import load_lm_sweep
from probes.lm.data import DATASET_FORMATS, LMDataset, canonical_type, load_dataset
from probes.lm.exposure import ThresholdRule, exposure_counts, memorized_lists
from probes.lm.net import f1_table
from probes.lm.units import LMUnit, LMUnitResult, unit_key

__all__ = ["RESULT_COLUMNS", "LMInputs", "lm_provenance", "resolve_inputs", "run_lm_sweep"]

RESULT_COLUMNS = ("model", "dataset", "dataset_format", "probe", "entity_type", "seed", "variant", "criterion",
                  "f1", "precision", "recall", "count", "n_eval", "baseline_f1")
LM_PACKAGES = ("transformers", "tokenizers")  # recorded in the provenance beside the core packages


# ------------------------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class LMInputs:
    """What the units read, resolved in the driver before any cluster work."""

    models: dict[str, str]  # label -> local model directory
    datasets: dict[str, LMDataset]
    formats: dict[str, str]  # dataset -> format
    digests: dict[str, str]  # dataset -> content digest (part of every unit's key)
    rules: dict[str, tuple[ThresholdRule, ...]]  # dataset -> exposure threshold rules, primary first


def _dataset_digest(ds: LMDataset) -> str:
    content = repr((ds.format, sorted(ds.splits.items()), ds.entities().to_numpy().tolist()))
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def resolve_inputs(cfg: LMSweepConfig, run_dir: Path) -> LMInputs:
    """Model directories and loaded datasets; every missing directory or unusable dataset is refused here."""
    synth_model = synth_data = None
    if any(m.builtin for m in cfg.models) or any(d.builtin for d in cfg.datasets):
        from probes.lm.synthetic import build_synthetic_assets

        synth_model, synth_data = build_synthetic_assets(run_dir / LM_ASSETS_DIR / "synthetic")
    models: dict[str, str] = {}
    for m in cfg.models:
        path = str(synth_model) if m.builtin else str(m.path)
        if not Path(path).is_dir():
            raise ConfigError(f"model {m.label!r}: directory {path} does not exist")
        models[m.label] = path
    datasets: dict[str, LMDataset] = {}
    for d in cfg.datasets:
        data_path = synth_data if d.builtin else d.path
        assert data_path is not None  # the schema gives a dataset a path or builtin (built above)
        types = [canonical_type(t) for t in d.entity_types] if d.entity_types else None
        ds = load_dataset(data_path, d.data_format, d.name, types)
        if cfg.runs(LMProbe.NER) and not ds.supports_ner and not DATASET_FORMATS.get(d.data_format).is_entity_list:
            raise DataError(f"dataset {d.name!r}: NER needs a train and a test split file in {data_path}")
        if ds.entities().empty:
            raise DataError(f"dataset {d.name!r}: no entity found in {data_path}")
        datasets[d.name] = ds
    return LMInputs(models, datasets, {d.name: d.data_format for d in cfg.datasets},
                    {name: _dataset_digest(ds) for name, ds in datasets.items()},
                    {d.name: d.rules() for d in cfg.datasets})


def lm_provenance(cfg: LMSweepConfig) -> Provenance:
    return Provenance.collect(kind="lm", sweep_name=cfg.name, config=cfg.model_dump(mode="json"),
                              config_hash=cfg.config_hash(), seeds=cfg.seeds, extra_packages=LM_PACKAGES)


def _stored_config(run_dir: Path) -> LMSweepConfig:
    stored = run_dir / LM_SWEEP_FILE
    if not stored.is_file():
        try:
            record = Provenance.read(run_dir)
        except DataError:  # someone else's provenance.json
            record = None
        if record is not None and record.kind != "lm":
            raise ConfigError(f"{run_dir} is a {record.kind} run folder: resume it with `iclmem resume {run_dir}`")
        raise ConfigError(f"{run_dir} holds no {LM_SWEEP_FILE}: not an iclmem LM run folder")
    from iclmem.atomic import read_json_object

    return parse_lm_sweep(read_json_object(stored, "LM sweep record", "run the LM sweep again in a new folder"),
                          str(stored))


# ------------------------------------------------------------------------------------------- units
def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


@dataclass
class UnitPlan:
    """Every unit of a sweep, per (model, dataset). NER units that need the memorized lists are built when
    their exposure unit is done (:meth:`release`); until then they are ``waiting``."""

    cfg: LMSweepConfig
    inputs: LMInputs
    units_dir: Path
    exposure: dict[tuple[str, str], LMUnit] = field(default_factory=dict)
    net: dict[tuple[str, str], list[LMUnit]] = field(default_factory=dict)
    ner: dict[tuple[str, str], list[LMUnit]] = field(default_factory=dict)
    waiting: dict[tuple[str, str], list[tuple[str, int]]] = field(default_factory=dict)  # (type, seed)

    def unit(self, kind: LMProbe, model: str, dataset: str, params: dict[str, Any], entity_type: str = "",
             seed: int = -1) -> LMUnit:
        key = unit_key(kind.value, self.inputs.models[model], self.inputs.digests[dataset], self.cfg.device, params)
        parts = [kind.value, _safe(entity_type) if entity_type else "", f"s{seed}" if seed >= 0 else "", key]
        return LMUnit(kind.value, model, dataset, params, str(self.units_dir / f"{_safe(model)}__{_safe(dataset)}"),
                      "-".join(p for p in parts if p), entity_type, seed)

    @classmethod
    def build(cls, cfg: LMSweepConfig, inputs: LMInputs, units_dir: Path) -> UnitPlan:
        plan = cls(cfg, inputs, units_dir)
        settings = cfg.ner.settings()
        ner_needs_exposure = NerVariant.SEEN.value in settings.variants
        need_exposure = cfg.runs(LMProbe.EXPOSURE) or cfg.runs(LMProbe.NET) or (
            cfg.runs(LMProbe.NER) and ner_needs_exposure)
        for model in inputs.models:
            for name, ds in inputs.datasets.items():
                key, types = (model, name), ds.types()
                if need_exposure:
                    plan.exposure[key] = plan.unit(LMProbe.EXPOSURE, model, name, {
                        "rules": inputs.rules[name], "batch_size": cfg.batch_size,
                        "leading_space": cfg.leading_space})
                if cfg.runs(LMProbe.NET):
                    plan.net[key] = [plan.unit(LMProbe.NET, model, name, {
                        "entity_type": t, "types": types, "batch_size": cfg.batch_size}, t) for t in types]
                if cfg.runs(LMProbe.NER) and ds.supports_ner:
                    pending = [(t, seed) for t in types for seed in cfg.seeds]
                    if ner_needs_exposure:
                        plan.waiting[key] = pending
                    else:
                        plan.ner[key] = [plan._ner(key, t, seed, {}) for t, seed in pending]
        return plan

    def _ner(self, key: tuple[str, str], entity_type: str, seed: int, memorized: dict[str, list[str]]) -> LMUnit:
        params = {"entity_type": entity_type, "seed": seed, "settings": self.cfg.ner.settings(),
                  "memorized": memorized}
        return self.unit(LMProbe.NER, *key, params, entity_type, seed)

    def initial(self) -> list[LMUnit]:
        return [*self.exposure.values(), *(u for units in self.net.values() for u in units),
                *(u for units in self.ner.values() for u in units)]

    def release(self, key: tuple[str, str]) -> list[LMUnit]:
        """The NER units of ``key`` built with the memorized lists of its (stored) exposure result."""
        if key not in self.waiting:
            return []
        exposure = _load(self.exposure[key])
        if exposure is None:  # stored a moment ago; unreadable now: its NER units stay waiting (reported)
            return []
        memorized = memorized_lists(exposure, self.inputs.rules[key[1]][0])
        units = [self._ner(key, t, seed, memorized) for t, seed in self.waiting.pop(key)]
        self.ner[key] = units
        return units

    def total(self) -> int:
        return len(self.initial()) + sum(len(v) for v in self.waiting.values())


def _load(unit: LMUnit) -> pd.DataFrame | None:
    result = LMUnitResult.load(unit.out_dir, unit.stem)
    return None if result is None else result.table


def _describe(unit: LMUnit | dict[str, Any]) -> str:
    ident = unit.identity if isinstance(unit, LMUnit) else unit
    extra = "".join(f"/{v}" for v in (ident["entity_type"], f"s{ident['seed']}" if ident["seed"] >= 0 else "") if v)
    return f"{ident['probe']} {ident['model']}/{ident['dataset']}{extra}"


def pool_beyond_local_ray(resources: Any, available: dict[str, float]) -> list[str]:
    """What a Ray started on this machine (``available``: ``ray.cluster_resources()``) can never give the LM probe
    pool, one line each naming the setting: one actor's ask beyond the node, or all ``probe_actors`` at once
    (the pool creates them all at start, and an LM sweep has nothing else to run meanwhile)."""
    problems = []
    for setting, kind, amount in (("resources.cpus_per_probe_actor", "CPU", resources.cpus_per_probe_actor),
                                  ("resources.gpus_per_probe_actor", "GPU", resources.gpus_per_probe_actor),
                                  *((f"resources.probe_resources.{k}", k, v) for k, v in resources.probe_resources.items())):
        have = float(available.get(kind, 0.0))
        if amount and amount > have:
            problems.append(f"{setting}: {amount:g} {kind} asked, the local Ray has {have:g}")
        elif amount and resources.probe_actors * amount > have:
            fit = int(have // amount)
            problems.append(f"resources.probe_actors: {resources.probe_actors} actors x {amount:g} {kind} "
                            f"({setting}) = {resources.probe_actors * amount:g} {kind}, the local Ray has {have:g}: "
                            f"at most {fit} can start; lower probe_actors to {fit} or less")
    return problems


def start_lm_pool(cfg: LMSweepConfig, inputs: LMInputs) -> Any:
    import ray

    from probes.actors import LMUnitWorker, ProbePool

    res = cfg.resources
    return ProbePool(res.probe_actors, res.actor_options(), worker_class=LMUnitWorker, models=inputs.models,
                     datasets=ray.put(inputs.datasets), device=cfg.device,
                     torch_threads=max(1, int(res.cpus_per_probe_actor)))


def run_units(pool: Any, plan: UnitPlan, log: Callable[[str], None]) -> None:
    """Feed the pool until every unit is stored or has failed its retries; NER units that wait for an
    exposure unit are sent as soon as it is done."""
    for unit in plan.initial():
        pool.submit(unit)
    total, done = plan.total(), 0
    rows = pool.poll()
    while rows or pool.pending:
        for row in rows:
            done += 1
            if row["probe"] == LMProbe.EXPOSURE.value:
                for unit in plan.release((row["model"], row["dataset"])):
                    pool.submit(unit)
        if rows:
            log(f"[iclmem] lm units {done}/{total} done, {len(pool.failed)} failed")
        rows = pool.poll(timeout=0.5)


# ------------------------------------------------------------------------------------------- results
def _net_rows(model: str, dataset: str, fmt: str, preds: pd.DataFrame, exposure: pd.DataFrame | None,
              rules: tuple[ThresholdRule, ...], types: list[str]) -> list[dict[str, Any]]:
    rows = []

    def add(frame: pd.DataFrame, variant: str, criterion: str) -> None:
        for r in f1_table(frame["entity_type"], frame["predicted"], types).to_dict("records"):
            rows.append({"model": model, "dataset": dataset, "dataset_format": fmt, "probe": LMProbe.NET.value,
                         "seed": -1, "variant": variant, "criterion": criterion, "n_eval": len(frame), **r})

    add(preds, "all", "")
    if exposure is not None:
        joined = preds.merge(exposure, on=["entity", "entity_type"], how="left")
        for rule in rules:
            for variant in ("memorized", "unmemorized"):
                add(joined[joined[f"class_{rule.metric}"] == variant], variant, rule.metric)
    return rows


def collect_results(plan: UnitPlan, run_dir: Path) -> pd.DataFrame:
    """The results table from the stored unit results (a missing unit contributes no row; a NET block
    needs every type's unit) and the per-entity exposure lists beside it."""
    inputs, rows = plan.inputs, []
    exposures = {key: _load(unit) for key, unit in plan.exposure.items()}
    for (model, dataset), table in exposures.items():
        if table is None:
            continue
        path = run_dir / LM_EXPOSURE_DIR / f"{_safe(model)}__{_safe(dataset)}.tsv"
        atomic_write(path, lambda handle, t=table: t.to_csv(handle, sep="\t", index=False), binary=False)
        for r in exposure_counts(table, inputs.rules[dataset]):
            rows.append({"model": model, "dataset": dataset, "dataset_format": inputs.formats[dataset],
                         "probe": LMProbe.EXPOSURE.value, "seed": -1, **r})
    for (model, dataset), units in plan.net.items():
        preds = [_load(u) for u in units]
        if any(p is None for p in preds):
            continue
        rows += _net_rows(model, dataset, inputs.formats[dataset], pd.concat(preds, ignore_index=True),
                          exposures.get((model, dataset)), inputs.rules[dataset], inputs.datasets[dataset].types())
    for (model, dataset), units in plan.ner.items():
        for unit in units:
            table = _load(unit)
            for r in [] if table is None else table.to_dict("records"):
                rows.append({"model": model, "dataset": dataset, "dataset_format": inputs.formats[dataset],
                             "probe": LMProbe.NER.value, "entity_type": unit.entity_type, "seed": unit.seed,
                             "criterion": "", "baseline_f1": float("nan"),
                             **{k: r[k] for k in ("variant", "f1", "precision", "recall", "count", "n_eval")}})
    return _results_frame(rows)


def _results_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))
    for c in ("model", "dataset", "dataset_format", "probe", "entity_type", "variant", "criterion"):
        df[c] = df[c].fillna("").astype(str)
    df["seed"] = df["seed"].astype("int64")
    for c in ("count", "n_eval"):
        df[c] = df[c].fillna(0).astype("int64")
    for c in ("f1", "precision", "recall", "baseline_f1"):
        df[c] = df[c].astype("float64")
    return df


def log_to_wandb(cfg: LMSweepConfig, run_dir: Path, results: pd.DataFrame) -> None:
    from orchestrator.report.wandb_logger import WandbResultsLogger, resolve_wandb_mode

    mode = resolve_wandb_mode(str(cfg.wandb.mode))
    if mode == "disabled" or results.empty:
        return
    with WandbResultsLogger(cfg.wandb.project, group=cfg.name, entity=cfg.wandb.entity, mode=mode,
                            job_type="lm-summary") as logger:
        logger.log_lm_summary(run_dir, results, files=(run_dir / LM_REPORT_FILE, run_dir / LM_RESULTS_FILE))


# ------------------------------------------------------------------------------------------- the sweep
def run_lm_sweep(config_path: str | Path | None, run_dir: str | Path, *, config: LMSweepConfig | None = None,
                 address: str | None = None, num_cpus: int | None = None, resume: bool = False,
                 log: Callable[[str], None] = print, verbose: bool = True) -> pd.DataFrame:
    """Run (or, with ``resume``, finish from the run folder's stored config) an LM probe sweep; returns the
    results table (:data:`RESULT_COLUMNS`, also at ``RUN_DIR/lm_results.parquet``). Units already stored
    in ``RUN_DIR`` are not computed again.

    The run folder is handled as the tabular driver's (``orchestrator.driver.sweep.run_sweep``): a new run claims
    a new or empty folder, or one holding an LM run of the same config
    (``orchestrator.report.folder_claims.claim_run_folder``), before
    writing anything; ``run_state.json`` says running / complete / failed / interrupted; ``verbose=False``
    (the command line's default) keeps what Ray, wandb and Python warnings print in ``RUN_DIR/console.log``;
    Ctrl-C raises :class:`SweepInterrupted` (exit 130) after a bounded clean-up, every stored unit kept."""
    from orchestrator.driver.console import catch_interrupts

    with catch_interrupts() as interrupts:
        try:
            return _run_lm_sweep(config_path, run_dir, config=config, address=address, num_cpus=num_cpus,
                                 resume=resume, log=log, verbose=verbose, interrupts=interrupts)
        except KeyboardInterrupt:
            # the clean-up has run, and the state is recorded where the run folder was written
            folder = Path(run_dir).resolve()
            if (folder / LM_SWEEP_FILE).is_file():
                raise SweepInterrupted(str(folder), hint=_interrupted_hint(folder)) from None
            raise SweepInterrupted(str(folder), hint="interrupted before the run folder was written \u2014 start "
                                   f"again with `iclmem lm run {config_path or 'CONFIG'} --out {folder}`") from None


def _interrupted_hint(run_dir: Path) -> str:
    return f"interrupted \u2014 continue with `iclmem lm resume {run_dir}`"


def _stored_units(units_dir: Path) -> int:
    """How many unit results are stored (a unit's JSON is written last)."""
    return sum(1 for _ in units_dir.glob("*/*.json")) if units_dir.is_dir() else 0


def _resolve_new_or_continued(cfg: LMSweepConfig, run_dir: Path) -> LMInputs:
    """:func:`resolve_inputs`; when that fails (or is interrupted) for a folder that held no run yet, the
    built-in assets it may have started are removed, so the folder can be claimed again."""
    import shutil

    fresh = not (run_dir / LM_SWEEP_FILE).exists()
    existed = run_dir.exists()
    try:
        return resolve_inputs(cfg, run_dir)
    except BaseException:
        if fresh:
            shutil.rmtree(run_dir / LM_ASSETS_DIR, ignore_errors=True)
            if not existed and run_dir.is_dir() and not any(run_dir.iterdir()):
                run_dir.rmdir()
        raise


def _run_lm_sweep(config_path: str | Path | None, run_dir: str | Path, *, config: LMSweepConfig | None,
                  address: str | None, num_cpus: int | None, resume: bool, log: Callable[[str], None],
                  verbose: bool, interrupts: Any) -> pd.DataFrame:
    from iclmem.runlock import hold_run_folder, refuse_if_held
    from orchestrator.report.folder_claims import claim_run_folder, require_writable

    run_dir = Path(run_dir).resolve()
    refuse_if_held(run_dir)  # a folder another driver works in is refused as such, before anything is read
    if resume:
        cfg = _stored_config(run_dir)
    elif config is not None:
        cfg = config
    else:
        assert config_path is not None, "a new run is given its config or the config file"
        cfg = load_lm_sweep(config_path)
    require_writable(run_dir, resume)
    if not resume:
        claim_run_folder(run_dir, kind="lm", config_hash=cfg.config_hash())  # before anything is written
    with hold_run_folder(run_dir, "iclmem lm resume" if resume else "iclmem lm run"):  # one driver per folder
        if not resume:  # again under the lock: another driver may have written the folder since
            claim_run_folder(run_dir, kind="lm", config_hash=cfg.config_hash())
        return _run_lm_sweep_holding(cfg, run_dir, address=address, num_cpus=num_cpus, log=log, verbose=verbose,
                                     interrupts=interrupts)


def _run_lm_sweep_holding(cfg: LMSweepConfig, run_dir: Path, *, address: str | None, num_cpus: int | None,
                          log: Callable[[str], None], verbose: bool, interrupts: Any) -> pd.DataFrame:
    """:func:`_run_lm_sweep` once the folder's lock is held."""
    import warnings
    from contextlib import nullcontext

    from orchestrator.driver.console import console_warnings
    from orchestrator.report.wandb_logger import resolve_wandb_mode

    # says now, on the terminal (not in the console log that quiet_console opens below), when the environment's
    # WANDB_MODE overrides the sweep's wandb.mode; the W&B logger at the end resolves it again, silently
    resolve_wandb_mode(str(cfg.wandb.mode))
    # Python warnings of the inputs' loading are held until the run folder (and its console log) exists.
    with warnings.catch_warnings(record=True) as early_warnings:
        inputs = _resolve_new_or_continued(cfg, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / LM_SWEEP_FILE, cfg.model_dump(mode="json"))
    lm_provenance(cfg).write(run_dir)
    write_run_state(run_dir, RunStatus.RUNNING)

    def interrupted(how: str) -> None:
        write_run_state(run_dir, RunStatus.INTERRUPTED,
                        note=f"stopped by {how}; {_stored_units(run_dir / LM_UNITS_DIR)} unit result(s) kept; "
                             f"`iclmem lm resume {run_dir}` computes the rest")

    with quiet_console(None if verbose else run_dir / CONSOLE_LOG_FILE) as console, \
            (console_warnings(console) if not verbose else nullcontext()):
        for w in early_warnings:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        interrupts.console_fd = console.err.fileno()
        interrupts.run_dir, interrupts.resume_command = str(run_dir), "iclmem lm resume"
        if log is print:  # the default: iclmem's own lines go to the terminal, not into the console log
            log = console.line
        interrupts.record = lambda: interrupted("a second Ctrl-C, clean-up skipped")
        try:
            return _drive_lm(cfg, inputs, run_dir, address=address, num_cpus=num_cpus, log=log,
                             interrupts=interrupts)
        except KeyboardInterrupt:  # every unit stored so far is kept and not computed again on resume
            if interrupts.record is not None:  # not once the sweep is recorded complete
                interrupted("Ctrl-C")
            raise
        except BaseException as exc:
            write_run_state(run_dir, RunStatus.FAILED, note=f"{type(exc).__name__}: {exc}"[:2000])
            raise


def _drive_lm(cfg: LMSweepConfig, inputs: LMInputs, run_dir: Path, *, address: str | None, num_cpus: int | None,
              log: Callable[[str], None], interrupts: Any) -> pd.DataFrame:
    """Ray side of :func:`run_lm_sweep`: the units on the probe pool, then the table, the report and W&B."""
    import ray

    from orchestrator.report.html import write_lm_html_report

    plan = UnitPlan.build(cfg, inputs, run_dir / LM_UNITS_DIR)
    log(f"[iclmem] lm sweep {cfg.name!r}: {plan.total()} unit(s) on {len(inputs.models)} model(s) x "
        f"{len(inputs.datasets)} dataset(s) -> {run_dir}")

    started = False
    pool = None
    try:
        started = ensure_ray(address, num_cpus=num_cpus)
        if started and not address:  # a Ray started here cannot grow: probe actors it can never start would be waited for forever
            problems = pool_beyond_local_ray(cfg.resources, ray.cluster_resources())  # type: ignore[no-untyped-call]
            if problems:
                raise ConfigError("; ".join(problems))
        pool = start_lm_pool(cfg, inputs)
        run_units(pool, plan, log)
    finally:
        if pool is not None:
            pool.shutdown()
        if started:
            ray.shutdown()

    results = collect_results(plan, run_dir)
    write_parquet_atomic(results, run_dir / LM_RESULTS_FILE)
    write_lm_html_report(run_dir, results, title=f"LM probes - {cfg.name}")
    log_to_wandb(cfg, run_dir, results)
    for note in pool.notes:
        log(f"[iclmem] WARNING {note}")
    missing = [_describe(job) for job, _ in pool.failed]
    missing += [_describe({"probe": LMProbe.NER.value, "model": m, "dataset": d, "entity_type": t, "seed": s})
                for (m, d), waiting in plan.waiting.items() for t, s in waiting]
    if missing:
        first = pool.failed[0][1][:2000] if pool.failed else "its exposure unit did not finish"
        raise ProbeError(f"{len(missing)} LM unit(s) could not be run after retries: {missing}; first error: "
                         f"{first}. Every other result is saved in {run_dir}; `iclmem lm resume {run_dir}` "
                         "runs the missing ones again.")
    write_run_state(run_dir, RunStatus.COMPLETE)
    interrupts.record = None  # a Ctrl-C from here on leaves a complete sweep complete
    log(f"[iclmem] lm sweep {cfg.name!r}: {len(results)} result row(s) -> {run_dir / LM_RESULTS_FILE}")
    return results
