"""``iclmem audit-context --attack label|attribute``: what a deployed in-context learner gives away about the
values of the rows in its context, beyond their membership. The shell around :mod:`probes.attacks.value_inference`
(the math): check the settings, prepare the table as the membership audit does (the same N members, N
label-matched non-members and never-in-context control, :func:`orchestrator.audits.context_audit.prepare_context_audit`),
build the scorer, run the attack, write the folder. No Ray.

* ``label``: the attacker knows a row's features and reads the deployed model's prediction; the gain is its
  accuracy on the row against the same model without the row (the reference contexts that lack it), members
  against non-members.
* ``attribute`` (``--sensitive COLUMN``): the attacker knows the row's label and its other features and tries
  each value of the sensitive column; the gain is over an imputation baseline fitted on rows of the table outside
  the audited ones (never a target). The column must be one the model reads as itself: a model that reads PCA
  components of the whole row (pfn-mini on a wide table) has no such column, and is refused, naming why.

The folder (``--out``): ``provenance.json``, ``inference.parquet`` (one row per target, attack, group and
statistic, :meth:`~probes.attacks.value_inference.LabelInferenceResult.to_rows`: rates and intervals, no row values) and
``verdict.json`` (found, trusted, the headline gains) last, so a folder with a verdict is complete.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from iclmem.atomic import write_json_atomic, write_parquet_atomic
from iclmem.errors import ConfigError, DataError, ProbeError
from iclmem.provenance import Provenance
from iclmem.runfolder import INFERENCE_FILE, SAVED_DIR, SAVED_FILE_TABLE, VERDICT_FILE
from iclmem.vocab import VALUE_ATTACKS, AuditKind, InferenceGroup
from orchestrator.audits.value_attacks import DEFAULT_BINS, run_value_attack, sensitive_attribute, value_attack_inputs
from orchestrator.schema.audit_defaults import (
    DEFAULT_CONTEXT_SIZE,
    DEFAULT_REFERENCES,
    FILE_CONTEXT_SIZE,
    FILE_REFERENCES,
    MAX_BINS,
    MIN_BINS,
)

__all__ = ["DEFAULT_BINS", "FILE_CONTEXT_SIZE", "FILE_REFERENCES", "audit_file", "audit_inference",
           "file_feature_limit", "log_value_audit_to_wandb", "rebuilt_line", "run_value_attack", "saved_file_lines", "saved_file_rows", "saved_file_verdict", "sensitive_attribute",
           "summary_lines", "value_attack_inputs", "verdict_of"]


def audit_inference(task: str, attack: str, *, out: str, model: str | None = None, estimator: str | None = None,
                    sensitive: str | None = None, bins: int = DEFAULT_BINS, context_size: int = DEFAULT_CONTEXT_SIZE,
                    references: int = DEFAULT_REFERENCES, seed: int = 0, bootstrap: int | None = None,
                    log: Callable[[str], None] | None = None) -> Any:
    """Run one value-inference audit and write its folder; returns the result
    (:class:`~probes.attacks.value_inference.LabelInferenceResult` or ``AttributeInferenceResult``)."""
    from iclmem.runfolder import undo_if_refused
    from iclmem.runlock import hold_run_folder
    from orchestrator.audits.audit import claim_audit_folder, parse_task, settings_hash, start_audit_folder, strict_json
    from orchestrator.audits.context_audit import audited_model, check_audit_settings, prepare_context_audit

    note = log or (lambda line: print(line, file=sys.stderr))
    # every setting checked before any work
    if attack not in VALUE_ATTACKS:
        raise ConfigError(f"--attack {attack!r}: the value-inference audits are {', '.join(VALUE_ATTACKS)}")
    if attack == AuditKind.ATTRIBUTE and not sensitive:
        raise ConfigError("--attack attribute needs --sensitive COLUMN: the column the attacker infers")
    if attack == AuditKind.LABEL and sensitive:
        raise ConfigError("--sensitive is the column of --attack attribute; --attack label infers the target column")
    if not MIN_BINS <= bins <= MAX_BINS:
        raise ConfigError(f"--bins {bins}: from {MIN_BINS} to {MAX_BINS} (each candidate value is a forward pass "
                          "over every audited row under every context)")
    bootstrap = check_audit_settings(model, estimator, references, context_size, bootstrap)
    source = parse_task(task)
    config = {"audit": f"{attack}_inference", "task": task, "model": model, "estimator": estimator,
              "sensitive": sensitive, "bins": bins if attack == AuditKind.ATTRIBUTE else None, "context_size": context_size,
              "references": references, "seed": seed, "bootstrap": bootstrap}
    config_hash = settings_hash(config)
    out_dir = Path(out)
    adapter, factory = audited_model(model, estimator)
    claim_audit_folder(out_dir, config_hash, "--out", "set of settings")  # checks only: nothing written yet
    audit = prepare_context_audit(source, task, context_size, seed, adapter=adapter, factory=factory,
                                  estimator=estimator, note=note, whole_columns=attack == AuditKind.ATTRIBUTE)
    value_inputs = value_attack_inputs(audit, attack, sensitive, bins, task)
    with undo_if_refused(out_dir), hold_run_folder(out_dir, "iclmem audit-context"):
        start_audit_folder(out_dir, Provenance.collect(kind="audit", sweep_name=f"{attack}-inference-{source.name}",
                                                       config=config, config_hash=config_hash, seeds=[seed]))
        result = run_value_attack(audit, attack, value_inputs, references=references, seed=seed,
                                  bootstrap=bootstrap, note=note, what=task)
        rows = pd.DataFrame(result.to_rows())
        rows.insert(0, "config_hash", config_hash)
        write_parquet_atomic(rows, out_dir / INFERENCE_FILE)
        write_json_atomic(out_dir / VERDICT_FILE, strict_json(verdict_of(result, attack, config_hash)))
    return result


def log_value_audit_to_wandb(out_dir: Path, table_file: str, mode: str, project: str) -> None:
    """The written audit (its table and verdict, as written) as one W&B run (offline into ``out_dir/wandb``
    unless ``online``)."""
    import json

    from orchestrator.report.wandb_logger import WandbResultsLogger
    from orchestrator.report.wandb_summary import VALUE_AUDIT_JOB_TYPE

    with WandbResultsLogger(project=project, group=out_dir.name, mode=mode, job_type=VALUE_AUDIT_JOB_TYPE) as logger:
        logger.log_value_audit(out_dir, pd.read_parquet(out_dir / table_file),
                               json.loads((out_dir / VERDICT_FILE).read_text()))


def verdict_of(result: Any, attack: str, config_hash: str) -> dict[str, Any]:
    """``verdict.json``: found, trusted (the control was run and found nothing, and the blind baseline found the split
    exchangeable: the membership audit's rule), why not, and each attack's headline gains on the deployed context
    and the control."""
    headline = {}
    for row in result.to_rows():
        if row["group"] == InferenceGroup.DIFFERENCE.value or row["statistic"].endswith("gain"):
            key = f"{row['target']}/{row['attack']}/{row['group']}/{row['statistic']}"
            headline[key] = {"value": row["value"], "low": row["low"], "high": row["high"]}
    return {"attack": attack, "found": bool(result.found), "trusted": bool(result.trusted),
            "distrust": "; ".join(result.distrust), "config_hash": config_hash, "headline": headline}


def summary_lines(result: Any, attack: str) -> list[str]:
    """The audit in a few lines for the console: the verdict, then per target and attack the members' and the
    non-members' gains and their difference, with intervals."""
    verdict = ("FOUND: the deployed model discloses its context rows' " + ("labels" if attack == AuditKind.LABEL else
                                                                             "sensitive values")
               if result.found else "not found")
    trust = "trusted" if result.trusted else f"NOT trusted: {'; '.join(result.distrust)}"
    lines = [f"{attack} inference: {verdict} ({trust})",
             f"{'target':<18}{'attack':<22}{'group':<26}{'statistic':<22}{'value':>8}  interval"]
    for row in result.to_rows():
        if row["statistic"] in ("accuracy_gain", "gain") or row["group"] == InferenceGroup.DIFFERENCE.value:
            lines.append(f"{row['target']:<18}{row['attack']:<22}{row['group']:<26}{row['statistic']:<22}"
                         f"{row['value']:>8.3f}  [{row['low']:.3f}, {row['high']:.3f}]")
    return lines



# ------------------------------------------------------------------------------------------ --attack file
# The saved-file audit (probes.attacks.saved_file): the package's classifier, on the shipped mini of its
# architecture, fitted on the deployed context and saved the package's own way; what the file gives back.
# FILE_CONTEXT_SIZE, FILE_REFERENCES (orchestrator/schema/audit_defaults.py): the saved-file audit's smaller defaults


def file_feature_limit(model: str) -> int:
    """The most feature columns ``model``'s package classifier is built for (its adapter's ``max_features``: TabPFN
    v2's pretraining limit, the same for TabICL here); the saved-file audit refuses a wider table of whole
    columns, naming ``--file-pca``."""
    if model == "tabicl":
        from trainables.models.tabicl_adapter import DEFAULT_MAX_FEATURES
    else:
        from trainables.models.tabpfn_adapter import DEFAULT_MAX_FEATURES
    return int(DEFAULT_MAX_FEATURES)


def audit_file(task: str, *, out: str, model: str, mode: str | None = None, context_size: int = FILE_CONTEXT_SIZE,
               references: int = FILE_REFERENCES, seed: int = 0, bootstrap: int | None = None,
               pca: bool = False, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Fit ``model``'s package classifier (``tabicl`` or ``tabpfn-v2``, on the shipped mini) on N rows of
    ``task``, save it as the package does (``mode``: TabICL's KV cache ``kv`` / ``repr`` with
    ``save_training_data=False``; TabPFN's ``fit_preprocessors`` / ``fit_with_cache``), load it back, and audit the
    file: what its bytes hold, the white-box cache-matching attack (which rows, where, with which label), the
    reconstruction of the rows' features against imputation, and membership through the loaded file, each beside
    a file fitted on the never-in-context control. Writes the folder ``out``; returns ``verdict.json``'s dict.

    The classifier reads the table's own columns, encoded (numbers standardised, categories one-hot; no PCA), and
    the reconstruction is scored per cell of those columns in each column's std over the prepared table; a table
    wider than the package's limit (:func:`file_feature_limit`) is refused. ``pca`` (``--file-pca``): Stage I's
    whitened PCA components instead (``data.max_features``, 16), each scored as its own cell."""
    from iclmem.runfolder import undo_if_refused
    from iclmem.runlock import hold_run_folder
    from orchestrator.audits.audit import claim_audit_folder, parse_task, settings_hash, start_audit_folder, strict_json
    from orchestrator.audits.context_audit import check_audit_settings, prepare_context_audit
    from probes.attacks import saved_file as sfa
    from probes.attacks import saved_file_cache as sfat
    from trainables.models.deployed import tabicl_mini_classifier

    note = log or (lambda line: print(line, file=sys.stderr))
    if model not in sfa.MODES:
        raise ConfigError(f"--attack file --model {model!r}: the saved-file audit knows {', '.join(sfa.MODES)} (their "
                          "package classifiers on the shipped minis)")
    if mode is not None and mode not in sfa.MODES[model]:
        raise ConfigError(f"--file-mode {mode!r}: {model} saves as one of {', '.join(sfa.MODES[model])}")
    mode = mode or sfa.MODES[model][0]
    bootstrap = check_audit_settings(model, None, references, context_size, bootstrap)
    source = parse_task(task)
    config = {"audit": "saved_file", "task": task, "model": model, "mode": mode, "context_size": context_size,
              "references": references, "seed": seed, "bootstrap": bootstrap,
              "features": "pca" if pca else "columns"}
    config_hash = settings_hash(config)
    out_dir = Path(out)
    claim_audit_folder(out_dir, config_hash, "--out", "set of settings")
    # Stage I as for an estimator: the table's own columns (no PCA) unless --file-pca
    audit = prepare_context_audit(source, task, context_size, seed, factory=tabicl_mini_classifier, note=note,
                                  whole_columns=not pca)
    inputs = audit.inputs
    width, limit = int(np.asarray(inputs.population_x).shape[1]), file_feature_limit(model)
    if not pca and width > limit:
        raise DataError(f"{task}: {width} encoded feature columns, more than the {limit} {model}'s package classifier "
                        f"is built for; --file-pca audits the file of Stage I's whitened PCA components instead "
                        f"(the reconstruction is then scored per component, not per table column)")
    prepared_columns = audit.prepared.columns
    sources = None if prepared_columns is None else [c.source for c in prepared_columns.columns]
    column_std = np.asarray(audit.prepared.features, dtype=np.float64).std(axis=0)
    if inputs.control_x is None:
        raise DataError(f"{task}: no never-in-context control fits beside {context_size} audited rows a side; the "
                        "saved-file audit needs the control's file to say what a file of other rows gives; use a "
                        "smaller --context-size")
    x, y, member = np.asarray(inputs.population_x), np.asarray(inputs.population_y), np.asarray(inputs.member)
    row_ids = audit.prepared.row_ids[audit.population]
    with undo_if_refused(out_dir), hold_run_folder(out_dir, "iclmem audit-context"):
        start_audit_folder(out_dir, Provenance.collect(kind="audit", sweep_name=f"saved-file-{source.name}",
                                                       config=config, config_hash=config_hash, seeds=[seed]))
        note(f"[iclmem] saved-file audit of {task}: {model} ({mode}) fitted on {int(member.sum())} rows, saved, "
             "loaded back")
        saved = sfa.save_and_reload(model, x[member], y[member], x, out_dir / SAVED_DIR / "audited", mode=mode)
        control = sfa.fit_and_save(model, inputs.control_x, inputs.control_y, out_dir / SAVED_DIR / "control",
                                   mode=mode)
        pool = sfat.Pool.from_audit(inputs, row_ids)
        note("[iclmem]   matching the file's cache against the audited rows (and the control's file)")
        match = sfat.cache_match_attack(saved.saved, pool, n_resamples=bootstrap, seed=seed)
        control_match = sfat.cache_match_attack(control, sfat.Pool.from_audit(inputs, row_ids, in_context=False),
                                               n_resamples=bootstrap, seed=seed)
        try:
            note("[iclmem]   rebuilding the context rows from the file")
            rebuilt: Any = sfat.reconstruct_context(saved.saved, pool, column_std=column_std, columns=sources,
                                                    seed=seed)
        except ProbeError as exc:  # a format the reconstruction does not cover: said, not hidden
            rebuilt = None
            note(f"[iclmem]   no reconstruction: {exc}")
        note(f"[iclmem]   membership through the loaded file ({references} reference contexts refitted)")
        membership = sfa.membership_through_file(saved.saved, inputs, control=control, n_references=references,
                                                 seed=seed, n_resamples=bootstrap)
        table = saved_file_rows(saved, match, control_match, rebuilt, membership)
        table.insert(0, "config_hash", config_hash)
        write_parquet_atomic(table, out_dir / SAVED_FILE_TABLE)
        verdict = strict_json(saved_file_verdict(saved, match, control_match, rebuilt, membership, config_hash,
                                                 "pca" if pca else "columns"))
        write_json_atomic(out_dir / VERDICT_FILE, verdict)
    return dict(verdict)


def saved_file_rows(saved: Any, match: Any, control_match: Any, rebuilt: Any, membership: Any) -> pd.DataFrame:
    """The audit's numbers, one row per (target, measure, statistic): rates, AUCs and errors, never a value."""
    rows: list[dict[str, Any]] = []

    def add(target: str, measure: str, statistic: str, value: float, low: float = float("nan"),
            high: float = float("nan")) -> None:
        rows.append({"target": target, "measure": measure, "statistic": statistic, "value": float(value),
                     "low": float(low), "high": float(high)})

    scan = saved.scan
    add("deployed", "file", "max_abs_prob_diff_after_reload", saved.max_abs_prob_diff)
    add("deployed", "file", "bytes", sum(size for name, size in saved.files[:1]))
    for name in ("rows_float32", "rows_float64", "cells_float32", "cells_float64", "cells_in_arrays"):
        add("deployed", "bytes_scan", name, getattr(scan, name))
    add("deployed", "bytes_scan", "labels_stored", float(scan.labels_stored))
    for target, m in (("deployed", match), ("never_in_context", control_match)):
        add(target, "cache_match", "member_matched", m.member_matched)
        add(target, "cache_match", "nonmember_matched", m.nonmember_matched)
        add(target, "cache_match", "position_accuracy", m.position_accuracy)
        add(target, "cache_match", "label_accuracy", m.label_accuracy)
        add(target, "cache_match", "auc", m.auc, m.auc_low, m.auc_high)
    if rebuilt is not None:
        add("deployed", "reconstruction", "label_accuracy", rebuilt.label_accuracy)
        for method in ("reconstruction", "pool_mean", "class_mean", "nearest_other_row"):
            errors = getattr(rebuilt, method)
            add("deployed", f"reconstruction:{method}", "cells_within", errors.cells_within)
            add("deployed", f"reconstruction:{method}", "rows_within", errors.rows_within)
            add("deployed", f"reconstruction:{method}", "median_abs_error_std", errors.median_abs)
            add("deployed", f"reconstruction:{method}", "rows_rebuilt", errors.rows_rebuilt)
    for r in membership.rows:
        add(r.target, f"membership:{r.attack}", "auc", r.auc, r.auc_low, r.auc_high)
    return pd.DataFrame(rows)


def saved_file_verdict(saved: Any, match: Any, control_match: Any, rebuilt: Any, membership: Any,
                       config_hash: str, features: str = "columns") -> dict[str, Any]:
    """``verdict.json``: whether the file gives its rows back (the cache-matching attack finds the rows in its
    context, at their place, and the control's file matches none), and the headline figures: of the rows scored,
    those rebuilt with every cell within :data:`~probes.attacks.saved_file_cache.RECONSTRUCTION_TOLERANCE` column
    std, and the median cell error, beside the best guess without the file; ``features``: "columns" (the table's
    own) or "pca" (``--file-pca``)."""
    from probes.attacks.saved_file_cache import RECONSTRUCTION_TOLERANCE

    gives_back = bool(match.position_accuracy > 0.5 and control_match.member_matched == 0.0)
    return {"audit": "saved_file", "model": saved.saved.model, "mode": saved.saved.mode,
            "file_gives_back_its_rows": gives_back, "trusted": bool(control_match.member_matched == 0.0),
            "predicts_as_fitted": bool(saved.max_abs_prob_diff < 1e-5),
            "raw_rows_in_bytes": int(saved.scan.rows_float32 + saved.scan.rows_float64),
            # a stored copy need not keep a row contiguous (TabPFN appends transformed columns): its cells, one by one
            "raw_cells_in_bytes": max(saved.scan.cells_float32, saved.scan.cells_float64) / max(1, saved.scan.n_cells),
            "labels_in_bytes": bool(saved.scan.labels_stored),
            "rows_identified": match.position_accuracy, "labels_recovered": match.label_accuracy,
            "nonmembers_matched": match.nonmember_matched,
            "reconstructed_rows_within_tolerance": None if rebuilt is None else rebuilt.reconstruction.rows_within,
            "imputation_rows_within_tolerance": None if rebuilt is None else rebuilt.best_imputation.rows_within,
            # the headline: rows rebuilt (every cell within the tolerance) of those scored, and the median cell
            # error in column standard deviations, over the table's columns (or PCA components with --file-pca)
            "features_read": "pca_components" if features == "pca" else "table_columns",
            "n_features": int(saved.saved.n_features),
            "n_columns": None if rebuilt is None else rebuilt.n_columns,
            "rows_rebuilt": None if rebuilt is None else rebuilt.reconstruction.rows_rebuilt,
            "rows_scored": None if rebuilt is None else rebuilt.reconstruction.n_rows,
            "median_cell_error_std": None if rebuilt is None else rebuilt.reconstruction.median_abs,
            "imputation_rows_rebuilt": None if rebuilt is None else rebuilt.best_imputation.rows_rebuilt,
            "imputation_median_cell_error_std": None if rebuilt is None else rebuilt.best_imputation.median_abs,
            "tolerance_std": RECONSTRUCTION_TOLERANCE,
            "membership_through_file": membership.outcome, "membership_trusted": membership.trusted,
            "config_hash": config_hash}


def rebuilt_line(verdict: Mapping[str, Any]) -> str:
    """The reconstruction's headline: "rebuilt: 39 of 40 rows within 0.1 std in every cell of the table's 30
    columns, median cell error 0.0002 std (best guess without the file: 0 of 40 rows, median 0.61 std)"."""
    if verdict.get("rows_rebuilt") is None:
        return "rebuilt: not attempted (no reconstruction for this file format)"
    what = (f"{verdict['n_columns']} PCA components (--file-pca)" if verdict["features_read"] == "pca_components"
            else f"the table's {verdict['n_columns']} columns")
    return (f"rebuilt: {verdict['rows_rebuilt']} of {verdict['rows_scored']} rows within {verdict['tolerance_std']:g} "
            f"std in every cell of {what}, median cell error {verdict['median_cell_error_std']:.2g} std (best guess "
            f"without the file: {verdict['imputation_rows_rebuilt']} of {verdict['rows_scored']} rows, median "
            f"{verdict['imputation_median_cell_error_std']:.2g} std)")


def saved_file_lines(verdict: Mapping[str, Any]) -> list[str]:
    """The saved-file audit in a few lines for the console."""
    def pct(v: Any) -> str:
        return "n/a" if v is None else f"{100 * float(v):.0f}%"

    return [f"saved file ({verdict['model']}, {verdict['mode']}): "
            + ("GIVES BACK ITS ROWS" if verdict["file_gives_back_its_rows"] else "its rows were not given back")
            + f" ({'trusted' if verdict['trusted'] else 'NOT trusted: the control file matched audited rows'})",
            f"predicts as the fitted classifier: {verdict['predicts_as_fitted']}; raw rows in its bytes: "
            f"{verdict['raw_rows_in_bytes']}, raw cells: {pct(verdict['raw_cells_in_bytes'])}; label vector in its "
            f"bytes: {verdict['labels_in_bytes']}",
            f"context rows identified at their place: {pct(verdict['rows_identified'])}, labels recovered: "
            f"{pct(verdict['labels_recovered'])}, other rows matched: {pct(verdict['nonmembers_matched'])}",
            rebuilt_line(verdict),
            f"membership through the loaded file: {verdict['membership_through_file']} "
            f"({'trusted' if verdict['membership_trusted'] else 'NOT trusted'})"]
