"""``iclmem audit-context --attack label|attribute``: what a deployed in-context learner gives away about the
values of the rows in its context, beyond their membership. The shell around :mod:`probes.inference_attacks`
(the math): check the settings, prepare the table as the membership audit does (the same N members, N
label-matched non-members and never-in-context control, :func:`orchestrator.context_audit.prepare_context_audit`),
build the scorer, run the attack, write the folder. No Ray.

* ``label``: the attacker knows a row's features and reads the deployed model's prediction; the gain is its
  accuracy on the row against the same model without the row (the reference contexts that lack it), members
  against non-members.
* ``attribute`` (``--sensitive COLUMN``): the attacker knows the row's label and its other features and tries
  each value of the sensitive column; the gain is over an imputation baseline fitted on rows of the table outside
  the audited ones (never a target). The column must be one the model reads as itself: a model that reads PCA
  components of the whole row (pfn-mini on a wide table) has no such column, and is refused, naming why.

The folder (``--out``): ``provenance.json``, ``inference.parquet`` (one row per target, attack, group and
statistic, :meth:`~probes.inference_attacks.LabelInferenceResult.to_rows`: rates and intervals, no row values) and
``verdict.json`` (found, trusted, the headline gains) last, so a folder with a verdict is complete.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from iclmem.atomic import write_json_atomic, write_parquet_atomic
from iclmem.errors import ConfigError, DataError
from iclmem.provenance import Provenance
from iclmem.runfolder import INFERENCE_FILE, VERDICT_FILE
from iclmem.vocab import ColumnKind, InferenceGroup

# --attack: membership is the context audit (orchestrator.context_audit); these two are this module's
VALUE_ATTACKS = ("label", "attribute")
DEFAULT_BINS = 4


def sensitive_attribute(prepared: Any, population_x: np.ndarray, name: str, bins: int) -> Any:
    """The :class:`probes.inference_attacks.SensitiveAttribute` of the prepared column ``name``: a text column's
    codes, a number column with at most ``bins`` values in the population as its values, any other number column
    in ``bins`` quantile bins. A column the model does not read as itself is a :class:`ConfigError` naming it."""
    from probes.inference_attacks import SensitiveAttribute

    columns: Any = getattr(prepared, "columns", None)
    if columns is None:
        raise ConfigError(f"--sensitive {name!r}: the prepared table has no column description")
    names = tuple(columns.names)
    if name not in names:
        readable = [n for n, k in zip(names, columns.kinds, strict=True) if k != ColumnKind.COMPONENT]
        if not readable:
            raise ConfigError(f"--sensitive {name!r}: the model reads PCA components of the whole row, no column of "
                              "the table as itself, so no column can be attacked one by one (a model with the "
                              "numeric or cells input contract, or --estimator, reads the columns)")
        raise ConfigError(f"--sensitive {name!r}: the model reads no column of that name; it reads "
                          f"{', '.join(map(repr, readable))}")
    column = names.index(name)
    kind = columns.kinds[column]
    if kind == ColumnKind.COMPONENT:
        raise ConfigError(f"--sensitive {name!r}: the model reads it as a PCA component mixing every column, not as "
                          "a column of the table; attribute inference needs a model that reads the column itself")
    values = np.unique(population_x[:, column])
    if kind == ColumnKind.TEXT or len(values) <= bins:
        return SensitiveAttribute.categorical(population_x, column)
    return SensitiveAttribute.binned(population_x, column, bins)


def audit_inference(task: str, attack: str, *, out: str, model: str | None = None, estimator: str | None = None,
                    sensitive: str | None = None, bins: int = DEFAULT_BINS, context_size: int = 256,
                    references: int = 64, seed: int = 0, bootstrap: int | None = None,
                    log: Callable[[str], None] | None = None) -> Any:
    """Run one value-inference audit and write its folder; returns the result
    (:class:`~probes.inference_attacks.LabelInferenceResult` or ``AttributeInferenceResult``)."""
    from iclmem.runfolder import undo_if_refused
    from iclmem.runlock import hold_run_folder
    from orchestrator.audit import claim_audit_folder, parse_task, settings_hash, start_audit_folder, strict_json
    from orchestrator.context_audit import check_audit_settings, prepare_context_audit
    from probes.inference_attacks import ImputationPool, attribute_inference, label_inference

    note = log or (lambda line: print(line, file=sys.stderr))
    # every setting checked before any work
    if attack not in VALUE_ATTACKS:
        raise ConfigError(f"--attack {attack!r}: one of membership, {', '.join(VALUE_ATTACKS)}")
    if attack == "attribute" and not sensitive:
        raise ConfigError("--attack attribute needs --sensitive COLUMN: the column the attacker infers")
    if attack == "label" and sensitive:
        raise ConfigError("--sensitive is the column of --attack attribute; --attack label infers the target column")
    if bins < 2:
        raise ConfigError(f"--bins {bins}: at least 2")
    bootstrap = check_audit_settings(model, estimator, references, context_size, bootstrap)
    source = parse_task(task)
    config = {"audit": f"{attack}_inference", "task": task, "model": model, "estimator": estimator,
              "sensitive": sensitive, "bins": bins if attack == "attribute" else None, "context_size": context_size,
              "references": references, "seed": seed, "bootstrap": bootstrap}
    config_hash = settings_hash(config)
    out_dir = Path(out)
    from trainables.models.estimator import load_estimator_factory

    factory = load_estimator_factory(estimator) if estimator else None
    adapter = None
    if model is not None:
        from trainables.models import build_model

        adapter = build_model(model)
    claim_audit_folder(out_dir, config_hash, "--out", "set of settings")  # checks only: nothing written yet
    audit = prepare_context_audit(source, task, context_size, seed, adapter=adapter, factory=factory,
                                  estimator=estimator, note=note)
    inputs, prepared = audit.inputs, audit.prepared
    attribute = pool = None
    if attack == "attribute":
        assert sensitive is not None  # checked above
        attribute = sensitive_attribute(prepared, np.asarray(inputs.population_x), sensitive, bins)
        outside = np.setdiff1d(np.arange(len(prepared.labels)), audit.population)
        if len(outside) < 10:
            raise DataError(f"{task}: {len(outside)} rows outside the audited ones to fit the imputation baseline "
                            f"on, at least 10 needed; use a smaller --context-size")
        features = np.asarray(prepared.features, dtype=np.float32)
        pool = ImputationPool(features[outside], np.asarray(prepared.labels, dtype=np.int64)[outside])
    with undo_if_refused(out_dir), hold_run_folder(out_dir, "iclmem audit-context"):
        start_audit_folder(out_dir, Provenance.collect(kind="audit", sweep_name=f"{attack}-inference-{source.name}",
                                                       config=config, config_hash=config_hash, seeds=[seed]))
        note(f"[iclmem] {attack} inference on {task}: context {inputs.context_size} rows, {references} reference "
             f"contexts" + (f", sensitive column {sensitive!r} ({attribute.n_candidates} candidate values"
                            f"{', binned' if attribute.is_binned else ''}; imputation fitted on {len(pool.y)} rows)"
                            if attribute is not None and pool is not None else ""))
        if attribute is None:
            result: Any = label_inference(audit.scorer, inputs, n_references=references, seed=seed,
                                          n_resamples=bootstrap)
        else:
            assert pool is not None
            result = attribute_inference(audit.scorer, inputs, attribute, pool, n_references=references, seed=seed,
                                         n_resamples=bootstrap)
        rows = pd.DataFrame(result.to_rows())
        rows.insert(0, "config_hash", config_hash)
        write_parquet_atomic(rows, out_dir / INFERENCE_FILE)
        write_json_atomic(out_dir / VERDICT_FILE, strict_json(verdict_of(result, attack, config_hash)))
    return result


def verdict_of(result: Any, attack: str, config_hash: str) -> dict[str, Any]:
    """``verdict.json``: found, trusted (the control was run and found nothing) and each attack's headline gains on
    the deployed context and the control."""
    headline = {}
    for row in result.to_rows():
        if row["group"] == InferenceGroup.DIFFERENCE.value or row["statistic"].endswith("gain"):
            key = f"{row['target']}/{row['attack']}/{row['group']}/{row['statistic']}"
            headline[key] = {"value": row["value"], "low": row["low"], "high": row["high"]}
    return {"attack": attack, "found": bool(result.found), "trusted": bool(result.trusted),
            "config_hash": config_hash, "headline": headline}


def summary_lines(result: Any, attack: str) -> list[str]:
    """The audit in a few lines for the console: the verdict, then per target and attack the members' and the
    non-members' gains and their difference, with intervals."""
    verdict = ("FOUND: the deployed model discloses its context rows' " + ("labels" if attack == "label" else
                                                                             "sensitive values")
               if result.found else "not found")
    lines = [f"{attack} inference: {verdict} ({'trusted' if result.trusted else 'NOT trusted: no clean control'})",
             f"{'target':<18}{'attack':<22}{'group':<26}{'statistic':<22}{'value':>8}  interval"]
    for row in result.to_rows():
        if row["statistic"] in ("accuracy_gain", "gain") or row["group"] == InferenceGroup.DIFFERENCE.value:
            lines.append(f"{row['target']:<18}{row['attack']:<22}{row['group']:<26}{row['statistic']:<22}"
                         f"{row['value']:>8.3f}  [{row['low']:.3f}, {row['high']:.3f}]")
    return lines

