"""The results row is declared once (iclmem.record): the writer refuses what it does not declare, and no
other module lists the identity columns."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from iclmem.errors import ResultSchemaError
from iclmem.record import (
    CHECKPOINT_KEY,
    COLUMNS,
    IDENTITY_COLUMNS,
    RunIdentity,
    check_columns,
    check_row,
    column_meaning,
    is_public,
)

REPO = Path(__file__).resolve().parents[1]


def _row(**extra):
    return {"run_id": "r", "task": "t", "model": "tabicl-mini", "regime": "single_fixed", "lr": 1e-3, "q": 8,
            "label_mode": "normal", "seed": 0, "epoch": 4, "auc": 0.7, **extra}


def test_a_row_with_an_undeclared_column_is_refused_at_the_writer_naming_the_column(tmp_path):
    from probes.probe import ProbeResult

    result = ProbeResult(_row(raw_feature_values=[1.0, 2.0]), pd.DataFrame({"auc": [0.5]}),
                         pd.DataFrame({"fpr": [0.0], "tpr": [0.0]}))
    with pytest.raises(ResultSchemaError, match="raw_feature_values"):
        result.save(tmp_path, "e0004")
    assert not list(tmp_path.iterdir())  # refused before anything was written
    ProbeResult(_row(), result.manipulation_auc, result.roc).save(tmp_path, "e0004")  # the declared row is written
    assert (tmp_path / "e0004.json").is_file()


def test_a_row_without_its_identity_or_with_a_fractional_seed_is_refused():
    row = _row()
    del row["label_mode"]
    with pytest.raises(ResultSchemaError, match="label_mode"):
        check_row(row, "here")
    with pytest.raises(ResultSchemaError, match="seed"):
        check_row(_row(seed=1.5), "here")
    with pytest.raises(ResultSchemaError, match="epoch"):
        check_row(_row(epoch=True), "here")
    with pytest.raises(ResultSchemaError, match="seed"):
        check_row(_row(seed=float("inf")), "here")  # refused as not an integer, not an OverflowError
    check_row(_row(seed=np.int64(3), epoch=4.0), "here")  # integral numbers of any type are integers


def test_a_table_with_an_undeclared_column_is_refused_naming_it():
    with pytest.raises(ResultSchemaError, match="mystery"):
        check_columns([*CHECKPOINT_KEY, "auc_loss", "mystery"], "results.parquet")
    check_columns([*CHECKPOINT_KEY, "auc_loss", "lira_online_tpr_at_1pct_low", "canary_exposure_c4"], "x")


def test_identity_is_read_from_a_row_and_names_a_missing_column():
    ident = RunIdentity.from_row(_row())
    assert ident.as_dict() == {c: _row()[c] for c in IDENTITY_COLUMNS}
    with pytest.raises(ResultSchemaError, match="task"):
        RunIdentity.from_row({k: v for k, v in _row().items() if k != "task"})


def test_only_ids_config_metrics_and_verdicts_are_public():
    for name in ("auc", "auc_loss", "run_id", "outcome_paper", "rmia_run_outcome", "known_context_lira_offline_auc",
                 "canary_exposure_c8", "threshold_family_alpha"):
        assert is_public(name), name
    for name in ("canary_records", "probe_node", "model_options", "reasons", "raw_record", "features", 3):
        assert not is_public(name), name


def test_every_declared_column_has_a_meaning():
    assert all(c.meaning.strip() for c in COLUMNS.values())
    assert "bootstrap" in column_meaning("auc_low")
    assert "ROC" in column_meaning("tpr_at_5pct_high")
    with pytest.raises(ResultSchemaError, match="not a results column"):
        column_meaning("nonsense")


def test_no_module_but_the_record_lists_the_identity_columns():
    # the identity tuple in its declared order ("model", "regime", ..., "seed"), written out in any module
    # other than iclmem/record.py (the config's grid validator names "regime", ..., "seed" as fields, not columns)
    words = r'["\']\s*,\s*["\']'.join(IDENTITY_COLUMNS[2:])
    pattern = re.compile(r'["\']' + words + r'["\']')
    offenders = [str(p.relative_to(REPO)) for sub in ("iclmem", "orchestrator", "probes", "trainables")
                 for p in (REPO / sub).rglob("*.py")
                 if p.name != "record.py" and pattern.search(p.read_text())]
    assert offenders == []


def test_each_paper_table_is_one_function_whose_docstring_names_the_table_and_its_source():
    import inspect

    from orchestrator.report import tables

    assert len(tables.PAPER_TABLES) == 9
    for reference, name in tables.PAPER_TABLES.items():
        doc = inspect.getdoc(getattr(tables, name))
        assert doc is not None, name
        assert reference.lower() in doc.splitlines()[0].lower(), (reference, name)
        assert "from" in doc.split("\n\n")[0], (reference, name)  # says what it is computed from
