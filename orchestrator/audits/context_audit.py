"""``iclmem audit-context``: was a row in a fitted estimator's context? The shell around
:mod:`probes.attacks.context` (the math): settle and check the settings, prepare the table, build the scorer,
run the audit, write the folder. No Ray: the K reference contexts are forward passes of one process.

The estimator is either a registered model (``--model pfn-mini``: its adapter, the context as given, one
forward pass per context) or any scikit-learn-style classifier (``--estimator module:factory``: ``factory()``
returns an unfitted estimator with ``fit(X, y)`` and ``predict_proba(X)``; it is fitted on each context
and scored as deployed, its own preprocessing, subsampling and ensembling included, so a TabPFN or TabICL
classifier is audited as configured in the factory).

The folder (``--out``, new or empty, or this same audit's folder; created once the table is prepared):
``provenance.json`` (kind ``audit``, the
settings as resolved), ``context_audit.parquet`` (a row per target context and attack), ``context_roc.parquet``,
``context_scores.parquet`` (row ids, member flags and each attack's score: ids, not records),
``verdict.json`` and ``context_roc.png``. The table's rows stay in the folder; nothing is sent anywhere.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from iclmem.atomic import write_json_atomic, write_parquet_atomic
from iclmem.errors import ConfigError, DataError
from iclmem.provenance import Provenance
from iclmem.runfolder import (
    CONTEXT_AUDIT_FILE,
    CONTEXT_AUDITS_DIR,
    CONTEXT_AUDITS_FILE,
    CONTEXT_ROC_FIGURE,
    CONTEXT_ROC_FILE,
    CONTEXT_SCORES_FILE,
    INFERENCE_FILE,
    INFERENCE_ROWS_FILE,
    REFERENCE_HALF_PREFIX,
    VERDICT_FILE,
)
from iclmem.vocab import ContextAttack, ContextTarget, InputContract, LabelDesign, LabelMode

# a registered model's adapter as a scorer lives beside the two-channel audit, which scores fine-tuned checkpoints
# inside the probe; imported here for the context audit's callers
from orchestrator.schema.audit_defaults import DEFAULT_CONTEXT_SIZE, DEFAULT_NULL_SPLITS, DEFAULT_REFERENCES
from probes.attacks.scorers import AdapterScorer, EstimatorScorer

# Stage I reserves a fine-tuning context C' beside members and non-members; the context audit has no use for
# it but as the blind baseline's fallback rows, so it is kept small: the control needs the rows left over
BLIND_CONTEXT_ROWS = 32


# ------------------------------------------------------------------------------------------ the audit
@dataclass(frozen=True)
class PreparedContextAudit:
    """What an audit scores, built from the table: the inputs of :mod:`probes.attacks.context`, the scorer,
    the prepared task and the population's positions in it (members first)."""

    inputs: Any  # probes.attacks.context.ContextAuditInputs
    scorer: Any  # a probes.attacks.context.ContextScorer
    prepared: Any  # trainables.data.PreparedTask
    population: np.ndarray  # int64 [2N]: positions of P in the prepared task, members first
    # the table it was prepared from (trainables.data.TaskSource), for what Stage I does not keep: which cells were
    # missing before it filled them in (orchestrator.audits.value_attacks.filled_in_rows); None: built by hand
    source: Any = None


def prepare_context_audit(source: Any, task: str, context_size: int, seed: int, *, adapter: Any = None,
                          factory: Callable[[], Any] | None = None, estimator: str | None = None,
                          note: Callable[[str], None] = print, deployed: bool = False,
                          whole_columns: bool = False) -> PreparedContextAudit:
    """Stage I for a context audit under the model's input contract: N label-matched members and non-members
    (q = N), a small C' (:data:`BLIND_CONTEXT_ROWS`), and the control drawn from the rows left (N rows with
    the members' label counts; none when the table has too few, said through ``note``). ``deployed``: the
    adapter's weights scored as its package deploys them (``deployed_estimator``: a fit of the package's
    classifier per context, its preprocessing and ensemble included) on the same prepared rows as the raw
    network would be. ``whole_columns`` (an estimator only): every column kept as itself (numeric contract, no
    PCA), as an attack on one column needs."""
    from probes.attacks.context import ContextAuditInputs
    from trainables.data import PrepSettings, null_split, prepare_task

    if (adapter is None) == (factory is None):
        raise ConfigError("a context audit scores one estimator: a model's adapter or an estimator factory")
    settings = PrepSettings(context_size=BLIND_CONTEXT_ROWS, label_design=LabelDesign.MATCHED)
    if adapter is not None:
        settings = adapter.prep_settings(settings)
    elif whole_columns:  # an estimator reads the table's columns itself: no PCA, so each column stays one
        settings = dataclasses.replace(settings, contract=InputContract.NUMERIC, max_features=None)
    try:
        prepared = prepare_task(source, settings, LabelMode.NORMAL, seed, q=context_size)
    except DataError as exc:
        if "too few rows" not in str(exc):  # a missing file, a bad column ...: Stage I's own words
            raise
        raise DataError(f"--context-size {context_size} needs 2 x {context_size} rows of {task} (members and "
                        f"non-members) and {BLIND_CONTEXT_ROWS} more ({exc}); 3 x {context_size} + {BLIND_CONTEXT_ROWS}"
                        " give the never-in-context control too") from None
    population = np.concatenate([prepared.member_idx, prepared.nonmember_idx])
    member = np.zeros(len(population), dtype=bool)
    member[: len(prepared.member_idx)] = True
    features, labels = np.asarray(prepared.features), np.asarray(prepared.labels)
    control_x = control_y = None
    try:
        control_rows, _ = null_split(prepared, 0)
    except DataError:
        control_rows = np.zeros(0, dtype=np.int64)
    if len(control_rows) == context_size:
        control_x, control_y = features[control_rows], labels[control_rows]
    else:
        note(f"[iclmem] {task}: {len(control_rows)} rows outside the audited ones with the members' label counts, "
             f"{context_size} needed: no never-in-context control, so the verdict is not trusted; use a larger "
             "table or a smaller --context-size")
    inputs = ContextAuditInputs(features[population], labels[population], member, prepared.n_classes,
                                control_x, control_y)
    if deployed:
        if adapter is None or not callable(getattr(adapter, "deployed_estimator", None)):
            raise ConfigError(f"model {getattr(adapter, 'name', None)!r} has no package classifier to deploy it "
                              "through (recipe upstream: tabicl, tabpfn-v2)")
        scorer: Any = EstimatorScorer(adapter.deployed_estimator, prepared.n_classes,
                                      estimator or f"{adapter.name} as its package deploys it")
    elif adapter is not None:
        scorer = AdapterScorer(adapter, prepared.n_classes, prepared.columns)
    else:
        assert factory is not None  # one of adapter and factory, checked above
        scorer = EstimatorScorer(factory, prepared.n_classes, str(estimator))
    return PreparedContextAudit(inputs, scorer, prepared, population, source)


def check_audit_settings(model: str | None, estimator: str | None, references: int, context_size: int,
                         bootstrap: int | None) -> int:
    """The settings every ``audit-context`` audit shares (membership, label, attribute), checked before any work;
    returns the bootstrap resamples (None: the default)."""
    from orchestrator.audits.audit import DEFAULT_BOOTSTRAP, check_bootstrap_cap, min_bootstrap
    from probes.attacks.context import MAX_REFERENCES

    bootstrap = DEFAULT_BOOTSTRAP if bootstrap is None else int(bootstrap)
    if (model is None) == (estimator is None):
        raise ConfigError("give the audited estimator: --model NAME (a registered model, e.g. pfn-mini) or "
                          "--estimator MODULE:FACTORY (a scikit-learn-style classifier), not both")
    if references < 2 or references % 2 or references > MAX_REFERENCES:
        raise ConfigError(f"--references {references}: an even number from 2 to {MAX_REFERENCES} (every row is then "
                          "in exactly half of the reference contexts)")
    if context_size < 4:
        raise ConfigError(f"--context-size {context_size}: at least 4 rows")
    if bootstrap < min_bootstrap():
        raise ConfigError(f"--bootstrap {bootstrap}: at least {min_bootstrap()} resamples")
    check_bootstrap_cap(bootstrap)
    return bootstrap


def audited_model(model: str | None, estimator: str | None) -> tuple[Any, Callable[[], Any] | None]:
    """(adapter, estimator factory) of an audit: the registered model built, or the ``MODULE:FACTORY`` imported and
    tried once (:func:`trainables.models.estimator.load_estimator_factory`); the other one None."""
    from trainables.models.estimator import load_estimator_factory

    factory = load_estimator_factory(estimator) if estimator else None
    adapter = None
    if model is not None:
        from trainables.models import build_model

        adapter = build_model(model)
    return adapter, factory


def audit_context(task: str, *, out: str, model: str | None = None, estimator: str | None = None,
                  context_size: int = DEFAULT_CONTEXT_SIZE, references: int = DEFAULT_REFERENCES, seed: int = 0,
                  bootstrap: int | None = None, null_splits: int = DEFAULT_NULL_SPLITS,
                  wandb: str | None = None, project: str | None = None, log: Callable[[str], None] | None = None) -> Any:
    """Audit whether rows of ``task`` were in a fitted estimator's context; returns the
    :class:`probes.attacks.context.ContextAuditResult` and writes the folder ``out`` (and, with ``wandb``
    offline or online, one W&B run of project ``project``)."""
    from iclmem.runfolder import undo_if_refused
    from iclmem.runlock import hold_run_folder
    from orchestrator.audits.audit import claim_audit_folder, parse_task, settings_hash

    note = log or (lambda line: print(line, file=sys.stderr))
    # every setting checked before any work
    bootstrap = check_audit_settings(model, estimator, references, context_size, bootstrap)
    if null_splits < 0:
        raise ConfigError(f"--null-splits {null_splits}: zero or more")
    if wandb is not None:
        from iclmem.vocab import WandbMode

        try:
            WandbMode(wandb)
        except ValueError:
            raise ConfigError(f"--wandb {wandb!r}: one of {', '.join(m.value for m in WandbMode)}") from None
    source = parse_task(task)
    config = {"audit": "context", "task": task, "model": model, "estimator": estimator, "context_size": context_size,
              "references": references, "seed": seed, "bootstrap": bootstrap, "null_splits": null_splits}
    config_hash = settings_hash(config)
    out_dir = Path(out)
    adapter, factory = audited_model(model, estimator)
    claim_audit_folder(out_dir, config_hash, "--out", "set of settings")  # checks only: nothing written yet
    # Stage I in memory (a second or two): a table that cannot be audited leaves no folder behind
    audit = prepare_context_audit(source, task, context_size, seed, adapter=adapter, factory=factory,
                                  estimator=estimator, note=note)
    if factory is not None:  # one fit on the deployed context, so that an estimator that fails leaves no folder
        inputs = audit.inputs
        x, y = np.asarray(inputs.population_x), np.asarray(inputs.population_y)
        audit.scorer(x[inputs.member], y[inputs.member], x[~inputs.member][:8])
    # held while it scores (a second command on --out is refused, not let in to replace it as unfinished); an
    # estimator refused mid-scoring (a later fit fails) takes what this audit wrote into a new folder with it
    with undo_if_refused(out_dir), hold_run_folder(out_dir, "iclmem audit-context"):
        result, table, verdict = run_prepared_audit(audit, out_dir, task=task, sweep_name=f"context-{source.name}",
                                                    config=config, config_hash=config_hash, references=references,
                                                    seed=seed, bootstrap=bootstrap, null_splits=null_splits,
                                                    note=note)
        if wandb not in (None, "disabled"):
            from orchestrator.schema.outputs import WandbConfig

            # the sweep's default project (wandb.project), declared once in the schema
            log_to_wandb(out_dir, table, verdict, wandb,
                         project if project is not None else str(WandbConfig.model_fields["project"].default))
    return result


def run_prepared_audit(audit: PreparedContextAudit, out_dir: Path, *, task: str, sweep_name: str,
                       config: dict[str, Any], config_hash: str, references: int, seed: int, bootstrap: int,
                       null_splits: int, note: Callable[[str], None],
                       size_setting: str = "--context-size") -> tuple[Any, pd.DataFrame, dict[str, Any]]:
    """Score a prepared audit and write its folder (provenance first, the verdict last): (result, table,
    verdict as written). Shared by ``iclmem audit-context`` and a sweep's regime ``context``."""
    from orchestrator.audits.audit import start_audit_folder
    from probes.attacks.context import evaluate_context_audit
    from probes.metrics import LowResolutionWarning
    from probes.outcomes import OutcomeThresholds
    from probes.probe_columns import blind_columns

    start_audit_folder(out_dir, Provenance.collect(kind="audit", sweep_name=sweep_name, config=config,
                                                   config_hash=config_hash, seeds=[seed]))
    inputs, scorer, prepared, population = audit.inputs, audit.scorer, audit.prepared, audit.population
    member = inputs.member
    blind = blind_columns(prepared)
    context_size = int(member.sum())
    note(f"[iclmem] context audit of {task}: context {context_size} rows, {references} reference contexts, "
         f"{len(population)} rows audited")
    step = max(1, references // 8)

    def progress(k: int, total: int) -> None:
        if k % step == 0 or k == total:
            note(f"[iclmem]   reference contexts scored: {k}/{total}")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LowResolutionWarning)
        result = evaluate_context_audit(scorer, inputs, n_references=references, seed=seed, n_resamples=bootstrap,
                                        null_splits=null_splits, thresholds=OutcomeThresholds(), blind=blind,
                                        exchangeable=bool(blind["exchangeable"]), progress=progress)
    coarse = sorted({str(w.message).split(":")[0] for w in caught if issubclass(w.category, LowResolutionWarning)})
    if coarse:  # one line, not one per attack and split: with N non-members a TPR at FPR below ~10/N is coarse
        note(f"[iclmem] {', '.join(coarse)} rest on fewer than 10 allowed false positives among {context_size} "
             f"non-members: coarse estimates (a larger {size_setting} sharpens them)")
    table, verdict = write_audit_folder(out_dir, result, prepared.row_ids[population], member, config_hash)
    return result, table, verdict


def log_to_wandb(out_dir: Path, table: pd.DataFrame, verdict: dict[str, Any], mode: str, project: str,
                 group: str | None = None) -> None:
    """The written audit (its table and verdict as written) as one W&B run (offline unless ``online`` and a key
    is set): its public table, the verdict and each attack's numbers, the ROC figure
    (:meth:`orchestrator.report.wandb_logger.WandbResultsLogger.log_context_audit`). Files go to ``out_dir/wandb``."""
    from orchestrator.report.wandb_logger import WandbResultsLogger
    from orchestrator.report.wandb_summary import CONTEXT_AUDIT_JOB_TYPE

    with WandbResultsLogger(project=project, group=group or out_dir.name, mode=mode,
                            job_type=CONTEXT_AUDIT_JOB_TYPE) as logger:
        logger.log_context_audit(out_dir, table, verdict, out_dir / CONTEXT_ROC_FIGURE)


def write_audit_folder(out_dir: Path, result: Any, row_ids: np.ndarray, member: np.ndarray,
                       config_hash: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The audit's tables, verdict and figure (atomic writes; the verdict last, so a folder with a verdict is
    complete); returns the table and the verdict as written."""
    rows = pd.DataFrame(list(result.rows))
    rows.insert(0, "config_hash", config_hash)
    write_parquet_atomic(rows, out_dir / CONTEXT_AUDIT_FILE)
    roc = pd.DataFrame([{"target": t, "attack": a, "fpr": f, "tpr": r} for (t, a), c in result.curves.items()
                        for f, r in zip(c["fpr"], c["tpr"], strict=True)])
    write_parquet_atomic(roc, out_dir / CONTEXT_ROC_FILE)
    scores = pd.DataFrame({"row_id": np.asarray(row_ids, dtype=np.int64), "member": np.asarray(member, dtype=bool)})
    for (target, attack), values in result.scores.items():
        scores[f"{target}__{attack}"] = values
    for attack, (first, second) in result.reference_halves.items():  # stability across reference sets
        scores[f"{REFERENCE_HALF_PREFIX}a__{attack}"] = first
        scores[f"{REFERENCE_HALF_PREFIX}b__{attack}"] = second
    write_parquet_atomic(scores, out_dir / CONTEXT_SCORES_FILE)
    plot_context_roc(result, out_dir / CONTEXT_ROC_FIGURE)
    verdict = {**result.verdict.to_dict(), "config_hash": config_hash,
               "seconds_per_reference": result.seconds_per_reference,
               "blind": dict(result.blind),  # numpy scalars become plain values in strict_json
               "attacks": {r["attack"]: {"target": r["target"], "auc": r["auc"], "tpr_at_1pct": r["tpr_at_1pct"],
                                         "tpr_at_0_1pct": r["tpr_at_0_1pct"], "epsilon_lb": r["epsilon_lb"],
                                         "outcome": r["outcome"]}
                           for r in result.rows if r["target"] == ContextTarget.DEPLOYED.value}}
    from orchestrator.audits.audit import strict_json

    verdict = strict_json(verdict)  # NaN as null: the file parses as JSON
    write_json_atomic(out_dir / VERDICT_FILE, verdict)
    return rows, verdict


def plot_context_roc(result: Any, path: Path) -> None:
    """Log-log ROC of every attack: the deployed context solid, the never-in-context control dashed."""
    from matplotlib.figure import Figure

    from orchestrator.report.parts import save_png

    fig = Figure(figsize=(6.0, 5.0))
    ax = fig.subplots()
    n_nonmembers = int(result.rows[0]["n_nonmembers"])
    floor = 0.5 / max(1, n_nonmembers)  # half the smallest non-zero FPR: "no false positive" sits there
    for i, attack in enumerate(ContextAttack):
        for target, style in ((ContextTarget.DEPLOYED, "-"), (ContextTarget.CONTROL, ":")):
            curve = result.curves.get((target.value, attack.value))
            if curve is None:
                continue
            fpr = np.maximum(np.asarray(curve["fpr"], dtype=float), floor)
            tpr = np.maximum(np.asarray(curve["tpr"], dtype=float), floor)
            label = f"{attack.value}" + (" (control)" if target == ContextTarget.CONTROL else "")
            ax.plot(fpr, tpr, style, color=f"C{i}", label=label, linewidth=1.2)
    ax.plot([floor, 1], [floor, 1], color="grey", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title("Was the row in the deployed context?")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_png(fig, path)


def summary_lines(result: Any) -> list[str]:
    """The audit as a few lines for the console: the verdict, then per attack the AUC, TPR at 1% and 0.1%
    FPR and the verdict on the deployed context and the control."""
    v = result.verdict
    lines = [f"verdict: {v.outcome.value} ({'trusted' if v.trusted else 'NOT trusted'}): {v.reason}",
             f"strongest attack: {v.strongest.value}; held-out accuracy "
             f"{result.rows[0]['heldout_accuracy']:.3f}; blind AUC {result.blind.get('blind_auc', float('nan')):.3f}",
             f"{'attack':<16}{'target':<18}{'AUC':>7}{'TPR@1%':>9}{'TPR@0.1%':>10}{'ε_lb':>7}  outcome"]
    for r in result.rows:
        lines.append(f"{r['attack']:<16}{r['target']:<18}{r['auc']:>7.3f}{r['tpr_at_1pct']:>9.3f}"
                     f"{r['tpr_at_0_1pct']:>10.3f}{r['epsilon_lb']:>7.2f}  {r['outcome']}")
    return lines


# ------------------------------------------------------------------------------------------ regime context
# A sweep's regime ``context`` (orchestrator.schema.config.context_audit_specs): the audit above for every task,
# model, Q (the deployed context's rows) and seed, each in ``RUN_DIR/context_audits/<run id>/`` (the folder
# ``iclmem audit-context`` writes), run as Ray tasks beside the sweep's trials; a folder whose verdict names
# the same settings is done (a resumed sweep skips it).


def sweep_audit_config(spec: Any, sweep: Any) -> dict[str, Any]:
    """The settings one audit of a sweep's regime ``context`` is identified by (and its folder's hash of)."""
    config = {"audit": "context", "regime": "context", "sweep": sweep.name, "run_id": spec.run_id, "task": spec.task,
              "model": spec.model, "model_options": dict(spec.model_options), "context_size": spec.q,
              "references": sweep.probe.context_references, "seed": spec.seed, "bootstrap": sweep.probe.bootstrap,
              "null_splits": sweep.probe.null_splits}
    if sweep.probe.value_inference:  # only when set: an audit without them keeps the hash it had before they existed
        config.update(value_inference=list(sweep.probe.value_inference), sensitive=sweep.probe.sensitive,
                      sensitive_bins=sweep.probe.sensitive_bins)
    return config


def prepare_sweep_audit(spec: Any, sweep: Any, note: Callable[[str], None]) -> PreparedContextAudit:
    """Stage I of one regime-``context`` audit (in memory): its task under its model's input contract."""
    from orchestrator.runfolder.prepare import task_source
    from trainables.models import build_model

    task = next(t for t in sweep.tasks if t.name == spec.task)
    options = dict(spec.model_options)
    adapter = build_model(spec.model, **options)
    from trainables.upstream import upstream_options

    # recipe upstream: the package fine-tunes and deploys the weights, so its classifier is what is audited
    deployed = upstream_options(options)
    try:
        return prepare_context_audit(task_source(task), spec.task, spec.q, spec.seed, adapter=adapter, note=note,
                                     deployed=deployed)
    except DataError as exc:
        raise DataError(f"regime context, task {spec.task!r}, grid.q {spec.q}: {exc}".replace("--context-size",
                                                                                            "grid.q")) from None


def sweep_audit_done(run_dir: Path, spec: Any, sweep: Any) -> bool:
    """Whether this audit's folder holds a verdict of the same settings (a complete folder: its verdict is
    written last)."""
    from orchestrator.audits.audit import settings_hash

    path = Path(run_dir) / CONTEXT_AUDITS_DIR / spec.run_id / VERDICT_FILE
    if not path.is_file():
        return False
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not (isinstance(stored, dict) and stored.get("config_hash") == settings_hash(sweep_audit_config(spec, sweep))):
        return False
    # with value inference the verdict is written twice, its results in the second: a folder stopped between the
    # two is not done
    return set(stored.get("value_inference", {})) == set(sweep.probe.value_inference)


def run_sweep_audit(spec: Any, sweep: Any, run_dir: str) -> dict[str, Any]:
    """One regime-``context`` audit, start to folder; returns its verdict as written. What a Ray task runs."""
    import torch

    from orchestrator.audits.audit import settings_hash

    torch.set_num_threads(1)
    lines: list[str] = []
    audit = prepare_sweep_audit(spec, sweep, lines.append)
    config = sweep_audit_config(spec, sweep)
    # the value-inference attacks' inputs first: a column the model cannot be attacked on fails before any scoring
    from orchestrator.audits import value_attacks

    value_inputs = {attack: value_attacks.value_attack_inputs(audit, attack, sweep.probe.sensitive,
                                                                sweep.probe.sensitive_bins, spec.task)
                    for attack in sweep.probe.value_inference}
    out_dir = Path(run_dir) / CONTEXT_AUDITS_DIR / spec.run_id
    _, _, verdict = run_prepared_audit(
        audit, out_dir, task=spec.task, sweep_name=sweep.name, config=config,
        config_hash=settings_hash(config), references=sweep.probe.context_references, seed=spec.seed,
        bootstrap=sweep.probe.bootstrap, null_splits=sweep.probe.null_splits, note=lines.append,
        size_setting="grid.q")
    if value_inputs:  # beside the membership verdict: the rows in inference.parquet, found / trusted in the verdict
        frames, found = [], {}
        per_row: list[pd.DataFrame] = []
        row_ids = np.asarray(audit.prepared.row_ids)[audit.population].astype(np.int64)
        for attack, attack_inputs in value_inputs.items():
            result = value_attacks.run_value_attack(audit, attack, attack_inputs,
                                                      references=sweep.probe.context_references, seed=spec.seed,
                                                      bootstrap=sweep.probe.bootstrap, note=lines.append,
                                                      what=spec.task)
            frames.append(pd.DataFrame(result.to_rows()))
            found[attack] = {"found": bool(result.found), "trusted": bool(result.trusted)}
            # a row whose sensitive cell was missing in the table has no gain to slice: it was not scored
            scored = (attack_inputs.scored if attack_inputs is not None and attack_inputs.scored is not None
                      else np.ones(len(row_ids), dtype=bool))
            per_row.extend(pd.DataFrame({"row_id": row_ids[scored], "member": audit.inputs.member[scored],
                                         "attack": name, "gain": np.asarray(gains)[scored]})
                           for name, gains in result.row_gains().items())
        # per row (ids and gains only): the risk report's per-slice breakdown reads it
        write_parquet_atomic(pd.concat(per_row, ignore_index=True), out_dir / INFERENCE_ROWS_FILE)
        write_parquet_atomic(pd.concat(frames, ignore_index=True), out_dir / INFERENCE_FILE)
        verdict = {**verdict, "value_inference": found}
        write_json_atomic(out_dir / VERDICT_FILE, verdict)
    return {**verdict, "notes": [line for line in lines if "reference contexts scored" not in line]}


def collect_sweep_audits(run_dir: Path, specs: Sequence[Any]) -> pd.DataFrame:
    """Every finished audit's rows (``context_audit.parquet``), with its run id, task, model, Q and seed in
    front, as one table written to ``RUN_DIR/context_audits.parquet``; empty when none finished."""
    frames = []
    for spec in specs:
        path = Path(run_dir) / CONTEXT_AUDITS_DIR / spec.run_id / CONTEXT_AUDIT_FILE
        if not path.is_file():
            continue
        table = pd.read_parquet(path)
        for i, (column, value) in enumerate((("run_id", spec.run_id), ("task", spec.task), ("model", spec.model),
                                             ("q", spec.q), ("seed", spec.seed))):
            table.insert(i, column, value)
        frames.append(table)
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if not out.empty:
        write_parquet_atomic(out, Path(run_dir) / CONTEXT_AUDITS_FILE)
    return out


def check_context_audits(sweep: Any, note: Callable[[str], None] = lambda _line: None) -> None:
    """Stage I of every regime-``context`` audit, on the driver before Ray starts: a table too small for its
    Q (or any other problem Stage I finds) is named now, not in a Ray task; what Stage I says (a table too
    small for the never-in-context control, so the verdict cannot be trusted) goes to ``note``."""
    from orchestrator.audits.value_attacks import value_attack_inputs
    from orchestrator.schema.trials import context_audit_specs

    for spec in context_audit_specs(sweep):
        audit = prepare_sweep_audit(spec, sweep, lambda line: note(line.replace("--context-size", "grid.q")))
        for attack in sweep.probe.value_inference:  # the sensitive column named, per task and model, before Ray
            try:
                value_attack_inputs(audit, attack, sweep.probe.sensitive, sweep.probe.sensitive_bins, spec.task)
            except (ConfigError, DataError) as exc:
                raise type(exc)(f"probe.value_inference {attack}, task {spec.task!r}, model {spec.model}: "
                                f"{str(exc).replace('--sensitive', 'probe.sensitive')}") from None


def submit_context_audits(sweep: Any, run_dir: Path, log: Callable[[str], None]) -> list[tuple[Any, Any]]:
    """Start every regime-``context`` audit not done yet as a Ray task (``resources.cpus_per_probe_actor``
    CPUs each); (spec, object ref) pairs."""
    from orchestrator.schema.trials import context_audit_specs

    specs = context_audit_specs(sweep)
    if not specs:
        return []
    import ray

    pending = [s for s in specs if not sweep_audit_done(run_dir, s, sweep)]
    if len(pending) < len(specs):
        log(f"[iclmem] context audits: {len(specs) - len(pending)} of {len(specs)} done before, kept")
    if pending:
        log(f"[iclmem] context audits: {len(pending)} started ({sweep.probe.context_references} reference contexts "
            "each)")
    task = ray.remote(num_cpus=sweep.resources.cpus_per_probe_actor, max_retries=1)(run_sweep_audit)
    sweep_ref = ray.put(sweep)
    return [(spec, task.remote(spec, sweep_ref, str(run_dir))) for spec in pending]


def finish_context_audits(audits: list[tuple[Any, Any]], sweep: Any, run_dir: Path,
                          log: Callable[[str], None]) -> list[str]:
    """Wait for the audits, say each verdict, write ``context_audits.parquet`` from every finished folder;
    the failures, as ``run id: error`` lines (the others' folders are kept either way)."""
    from orchestrator.schema.trials import context_audit_specs

    specs = context_audit_specs(sweep)
    if not specs:
        return []
    import ray

    from orchestrator.report.wandb_logger import resolve_wandb_mode

    mode = resolve_wandb_mode(sweep.wandb.mode)
    failures = []
    for spec, ref in audits:
        try:
            verdict = ray.get(ref)
        except Exception as exc:  # a task's error, shown with its audit's id; the sweep goes on
            failures.append(f"{spec.run_id}: {type(exc).__name__}: {str(exc).splitlines()[-1] if str(exc) else ''}")
            continue
        for line in verdict.get("notes", []):
            log(line)
        log(f"[iclmem] context audit {spec.run_id}: {verdict['outcome']} "
            f"({'trusted' if verdict['trusted'] else 'NOT trusted'}; strongest attack {verdict['strongest_attack']})")
        if mode != "disabled":  # one W&B run per audit, in the sweep's project, grouped under the sweep
            folder = Path(run_dir) / CONTEXT_AUDITS_DIR / spec.run_id
            written = json.loads((folder / VERDICT_FILE).read_text())
            log_to_wandb(folder, pd.read_parquet(folder / CONTEXT_AUDIT_FILE), written, mode, sweep.wandb.project,
                         group=sweep.name)
    table = collect_sweep_audits(run_dir, specs)
    if not table.empty:
        log(f"[iclmem] {table['run_id'].nunique()} context audit(s) -> {Path(run_dir) / CONTEXT_AUDITS_FILE}")
    for line in failures:
        log(f"[iclmem] context audit failed: {line}")
    return failures
