"""The value-inference attacks on a prepared deployed-context audit (label, and attribute on a sensitive column),
shared by ``iclmem audit-context --attack label|attribute`` (:mod:`orchestrator.audits.inference_audit`) and a sweep's
regime-context audits with ``probe.value_inference`` (:mod:`orchestrator.audits.context_audit`): the sensitive column as
the model reads it, the imputation pool, and one attack run on the audit's population, scorer and control
(:mod:`probes.attacks.value_inference`, the math)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from iclmem.errors import ConfigError, DataError
from iclmem.vocab import AuditKind, ColumnKind
from orchestrator.schema.audit_defaults import DEFAULT_BINS

__all__ = ["DEFAULT_BINS", "ValueAttackInputs", "filled_in_rows", "run_value_attack", "sensitive_attribute",
           "value_attack_inputs"]

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


def sensitive_source(prepared: Any, name: str) -> str:
    """The table column the prepared sensitive column ``name`` is read from: itself, or the column a one-hot
    encoded ``name`` names (:func:`sensitive_attribute` has checked that the model reads it)."""
    columns = prepared.columns
    if name in columns.names:
        return str(columns.columns[list(columns.names).index(name)].source or name)
    return name  # a one-hot encoded column: its levels' source


def filled_in_rows(audit: Any, name: str) -> np.ndarray | None:
    """bool [n rows of the prepared task]: the rows whose cell of the sensitive column ``name`` was missing in the
    table (read again from the audit's source, at the prepared rows' row ids), where the feature holds what Stage I
    filled in; None for an audit that does not know its table."""
    if getattr(audit, "source", None) is None:
        return None
    from trainables.data import load_table, missing_cells

    frame, _target, _kind = load_table(audit.source)
    frame.columns = [str(c) for c in frame.columns]  # as Stage I names them
    cells = frame[sensitive_source(audit.prepared, name)].iloc[np.asarray(audit.prepared.row_ids)]
    return missing_cells(cells.reset_index(drop=True))


@dataclass(frozen=True)
class ValueAttackInputs:
    """What an attribute attack needs besides the audit: the sensitive column as the model reads it
    (``probes.attacks.value_inputs.SensitiveAttribute``), the imputation pool (rows outside the audit with a value
    in the column), and which audited rows are scored (bool [2N] over P: those with a value of their own)."""

    attribute: Any
    pool: Any
    scored: np.ndarray | None
    sensitive: str

    @property
    def n_filled_in(self) -> int:
        """Audited rows left out of the scoring: their cell was missing in the table."""
        return 0 if self.scored is None else int((~self.scored).sum())


def value_attack_inputs(audit: Any, attack: str, sensitive: str | None, bins: int, task: str) -> ValueAttackInputs | None:
    """The :class:`ValueAttackInputs` of an attribute attack on a prepared audit (None for ``label``): the column as
    the model reads it, every prepared row outside the audited ones with a value in it (never a target), and the
    audited rows that have one. A column the model does not read as itself is a :class:`ConfigError`; too few rows
    left for the baseline a :class:`DataError`: both before any scoring."""
    from probes.attacks.value_inputs import ImputationPool

    if attack != AuditKind.ATTRIBUTE:
        return None
    if not sensitive:
        raise ConfigError("attribute inference needs the sensitive column")
    prepared = audit.prepared
    features = np.asarray(prepared.features, dtype=np.float32)
    attribute = sensitive_attribute(prepared, np.asarray(audit.inputs.population_x), sensitive, bins, features)
    missing = filled_in_rows(audit, sensitive)
    outside = np.setdiff1d(np.arange(len(prepared.labels)), audit.population)
    if missing is not None:
        outside = outside[~missing[outside]]  # the baseline learns the column's values, not Stage I's filling
    if len(outside) < 10:
        raise DataError(f"{task}: {len(outside)} rows outside the audited ones with a value in {sensitive!r} to fit "
                        "the imputation baseline on, at least 10 needed; audit fewer rows")
    pool = ImputationPool(features[outside], np.asarray(prepared.labels, dtype=np.int64)[outside])
    scored = None if missing is None else ~missing[np.asarray(audit.population)]
    if scored is not None:
        member = np.asarray(audit.inputs.member, dtype=bool)
        for group, rows in (("members", member), ("non-members", ~member)):
            if int((scored & rows).sum()) < 2:
                raise DataError(f"{task}: {int((scored & rows).sum())} of the {int(rows.sum())} audited {group} have a "
                                f"value in {sensitive!r} (the others are missing in the table), at least 2 needed")
    return ValueAttackInputs(attribute, pool, scored, sensitive)


def run_value_attack(audit: Any, attack: str, value_inputs: ValueAttackInputs | None, *, references: int, seed: int,
                     bootstrap: int, note: Callable[[str], None], what: str) -> Any:
    """One value-inference attack on a prepared audit (its population, scorer and control), trusted by the
    membership audit's rule: its control clean and the split's blind baseline (the membership audit's, computed
    once per process) exchangeable."""
    from probes.attacks.value_inference import attribute_inference, label_inference
    from probes.probe_columns import blind_columns

    inputs = audit.inputs
    exchangeable = bool(blind_columns(audit.prepared)["exchangeable"])
    v = value_inputs
    note(f"[iclmem] {attack} inference on {what}: context {inputs.context_size} rows, {references} reference "
         f"contexts" + (f", sensitive column {v.attribute.n_candidates} candidate values"
                        f"{' (binned)' if v.attribute.is_binned else ''}; imputation fitted on {len(v.pool.y)} rows"
                        if v is not None else ""))
    if v is not None and v.scored is not None and v.n_filled_in:
        note(f"[iclmem] {v.n_filled_in} of the {len(v.scored)} audited rows have no value in {v.sensitive!r} (missing "
             "in the table; Stage I filled it in): they stay in the contexts and are left out of the scoring")
    if v is None:
        return label_inference(audit.scorer, inputs, n_references=references, seed=seed, n_resamples=bootstrap,
                               exchangeable=exchangeable)
    return attribute_inference(audit.scorer, inputs, v.attribute, v.pool, n_references=references, seed=seed,
                               n_resamples=bootstrap, exchangeable=exchangeable, scored=v.scored)
