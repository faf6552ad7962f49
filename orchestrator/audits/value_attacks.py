"""The value-inference attacks on a prepared deployed-context audit (label, and attribute on a sensitive column),
shared by ``iclmem audit-context --attack label|attribute`` (:mod:`orchestrator.audits.inference_audit`) and a sweep's
regime-context audits with ``probe.value_inference`` (:mod:`orchestrator.audits.context_audit`): the sensitive column as
the model reads it, the imputation pool, and one attack run on the audit's population, scorer and control
(:mod:`probes.attacks.value_inference`, the math)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from iclmem.errors import ConfigError, DataError
from iclmem.vocab import AuditKind, ColumnKind
from orchestrator.schema.audit_defaults import DEFAULT_BINS

__all__ = ["DEFAULT_BINS", "run_value_attack", "sensitive_attribute", "value_attack_inputs"]

# --attack: membership is the context audit (orchestrator.audits.context_audit); label and attribute
# (iclmem.vocab.VALUE_ATTACKS) are value inference, run here


def sensitive_attribute(prepared: Any, population_x: np.ndarray, name: str, bins: int,
                        table_x: np.ndarray | None = None) -> Any:
    """The :class:`probes.attacks.value_inputs.SensitiveAttribute` of the prepared column ``name``: a text column's
    codes, a one-hot encoded column's levels (every indicator set at once), a number column with at most ``bins``
    values in the table (``table_x``: every prepared row, the
    imputation pool's included; default the population) as its values, any other number column in ``bins``
    quantile bins of the population. A column the model does not read as itself is a :class:`ConfigError` naming
    it."""
    from probes.attacks.value_inputs import SensitiveAttribute

    columns: Any = getattr(prepared, "columns", None)
    if columns is None:
        raise ConfigError(f"--sensitive {name!r}: the prepared table has no column description")
    names = tuple(columns.names)
    table = population_x if table_x is None else table_x
    # a categorical column one-hot encoded ("sex = F", "sex = M"): attacked as the column, every indicator at once
    levels = [i for i, c in enumerate(columns.columns) if c.one_hot_source == name]
    if name not in names and len(levels) >= 2:
        return SensitiveAttribute.one_hot(table, levels)
    if name in names:
        source = columns.columns[names.index(name)].one_hot_source
        if source is not None:
            raise ConfigError(f"--sensitive {name!r} is one level of the one-hot encoded column {source!r}: an attacker "
                              f"who knows the row's other indicators knows this one too; name the column, --sensitive "
                              f"{source!r}, to infer its value")
    if name not in names:
        readable = list(dict.fromkeys(c.one_hot_source or c.name for c in columns.columns
                                      if c.kind != ColumnKind.COMPONENT))
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
    # categorical over the table's values, so that every row the imputation baseline is fitted on has a candidate
    if kind == ColumnKind.TEXT or len(np.unique(table[:, column])) <= bins:
        return SensitiveAttribute.categorical(table, column)
    return SensitiveAttribute.binned(population_x, column, bins)


def value_attack_inputs(audit: Any, attack: str, sensitive: str | None, bins: int, task: str) -> tuple[Any, Any]:
    """(sensitive attribute, imputation pool) of an attribute attack on a prepared audit (None, None for ``label``):
    the column as the model reads it, and every prepared row outside the audited ones (never a target). A column
    the model does not read as itself is a :class:`ConfigError`; too few rows left for the baseline a
    :class:`DataError`: both before any scoring."""
    from probes.attacks.value_inputs import ImputationPool

    if attack != AuditKind.ATTRIBUTE:
        return None, None
    if not sensitive:
        raise ConfigError("attribute inference needs the sensitive column")
    prepared = audit.prepared
    features = np.asarray(prepared.features, dtype=np.float32)
    attribute = sensitive_attribute(prepared, np.asarray(audit.inputs.population_x), sensitive, bins, features)
    outside = np.setdiff1d(np.arange(len(prepared.labels)), audit.population)
    if len(outside) < 10:
        raise DataError(f"{task}: {len(outside)} rows outside the audited ones to fit the imputation baseline on, at "
                        "least 10 needed; audit fewer rows")
    return attribute, ImputationPool(features[outside], np.asarray(prepared.labels, dtype=np.int64)[outside])


def run_value_attack(audit: Any, attack: str, attribute: Any, pool: Any, *, references: int, seed: int,
                     bootstrap: int, note: Callable[[str], None], what: str) -> Any:
    """One value-inference attack on a prepared audit (its population, scorer and control), trusted by the
    membership audit's rule: its control clean and the split's blind baseline (the membership audit's, computed
    once per process) exchangeable."""
    from probes.attacks.value_inference import attribute_inference, label_inference
    from probes.probe_columns import blind_columns

    inputs = audit.inputs
    exchangeable = bool(blind_columns(audit.prepared)["exchangeable"])
    note(f"[iclmem] {attack} inference on {what}: context {inputs.context_size} rows, {references} reference "
         f"contexts" + (f", sensitive column {attribute.n_candidates} candidate values"
                        f"{' (binned)' if attribute.is_binned else ''}; imputation fitted on {len(pool.y)} rows"
                        if attribute is not None else ""))
    if attribute is None:
        return label_inference(audit.scorer, inputs, n_references=references, seed=seed, n_resamples=bootstrap,
                               exchangeable=exchangeable)
    return attribute_inference(audit.scorer, inputs, attribute, pool, n_references=references, seed=seed,
                               n_resamples=bootstrap, exchangeable=exchangeable)
