"""RunFolder is the one reader of a run folder: the sweep validated, tables checksum-verified, the public
columns only unless asked, and a table of an older shape refused with the iclmem that wrote it."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from iclmem.atomic import write_parquet_atomic
from iclmem.errors import DataError, ResultSchemaError
from iclmem.provenance import Provenance
from iclmem.record import RunIdentity
from iclmem.runfolder import RESULTS_FILE, RUN_STATE_FILE, SWEEP_FILE, RunStatus, write_run_state
from orchestrator.report.folder_claims import record_sweep
from orchestrator.runfolder.run_folder import RunFolder
from orchestrator.schema.config import parse_sweep


def _folder(tmp_path, *, rows: int = 40):
    """A run folder made by the sweep's writers: sweep.json and provenance.json (record_sweep) and a results
    table (write_parquet_atomic) with public and private columns."""
    sweep = parse_sweep({"name": "reader", "tasks": [{"name": "iris"}], "training": {"epochs": 6,
                                                                                    "checkpoint_epochs": [3, 6]}},
                        "test")
    record_sweep(tmp_path, sweep)
    ident = RunIdentity("r0", "iris", "pfn-mini", "single_fixed", 1e-3, 50, "normal", 0).as_dict()
    table = pd.DataFrame([{**ident, "epoch": e % 7, "outcome": "no_signal", "auc": 0.5 + e / 1000,
                           "rule": "selection_aware", "raw_memorization_flag": False,
                           "calibrated_memorization_flag": False,
                           "canary_records": "[]", "probe_node": "node-1"} for e in range(rows)])
    write_parquet_atomic(table, tmp_path / RESULTS_FILE)
    return RunFolder(tmp_path), sweep, table


def test_the_sweep_is_read_back_validated_and_equal_to_what_was_recorded(tmp_path):
    folder, sweep, _ = _folder(tmp_path)
    assert folder.sweep == sweep
    assert folder.sweep.config_hash() == sweep.config_hash()
    assert folder.sweep.training.checkpoint_epochs == [3, 6]
    assert RunFolder(tmp_path / "nowhere").sweep_or_none is None
    (tmp_path / SWEEP_FILE).write_text(json.dumps({"name": "reader", "tasks": "iris"}))  # not a sweep
    with pytest.raises(DataError, match="sweep.json"):
        RunFolder(tmp_path).sweep_or_none  # noqa: B018 - a damaged record is an error, never "no sweep"


def test_results_are_public_columns_unless_asked_and_the_private_ones_are_kept_on_disk(tmp_path):
    folder, _, table = _folder(tmp_path)
    public = folder.results()
    assert {"canary_records", "probe_node"} & set(public.columns) == set()
    assert {"run_id", "auc", "label_mode", "seed"} <= set(public.columns)
    pd.testing.assert_frame_equal(folder.results(public=False), table)
    assert folder.stored_result_rows() == len(table)


def test_a_flipped_bit_in_the_results_tables_pages_is_an_error_naming_the_file(tmp_path):
    import pyarrow.parquet as pq

    folder, _, _ = _folder(tmp_path, rows=4000)
    path = tmp_path / RESULTS_FILE
    clean = path.read_bytes()
    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunk = meta.column(list(pq.ParquetFile(path).schema.names).index("auc"))
    start = min(o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o is not None)
    for k in range(1, 7):  # bit rot at six places across the column's pages
        data = bytearray(clean)
        data[start + k * chunk.total_compressed_size // 7] ^= 0x01
        path.write_bytes(bytes(data))
        with pytest.raises(DataError, match=r"results.parquet: damaged results table"):
            folder.results()


def test_a_table_of_an_older_shape_is_refused_naming_the_iclmem_that_wrote_it(tmp_path):
    folder, _, table = _folder(tmp_path)
    record = Provenance.read(tmp_path)
    dataclasses.replace(record, iclmem_version="0.0.1").write(tmp_path)
    # a table from before the verdict rules and the memorization flags existed
    write_parquet_atomic(table.drop(columns=["rule", "raw_memorization_flag"]), tmp_path / RESULTS_FILE)
    with pytest.raises(ResultSchemaError, match=r"\['rule', 'raw_memorization_flag'\].*iclmem 0\.0\.1"):
        RunFolder(tmp_path).results()


def test_the_run_state_says_interrupted_and_a_damaged_state_reads_as_none(tmp_path):
    folder, _, _ = _folder(tmp_path)
    assert folder.run_state is None
    assert not folder.interrupted
    write_run_state(tmp_path, RunStatus.INTERRUPTED, incomplete_runs=["r0"])
    assert folder.interrupted
    assert folder.run_state["incomplete_runs"] == ["r0"]
    write_run_state(tmp_path, RunStatus.COMPLETE)
    assert not folder.interrupted
    (tmp_path / RUN_STATE_FILE).write_text("{not json")
    assert not folder.interrupted
    with pytest.raises(DataError, match="run_state.json"):
        folder.run_state  # noqa: B018


def test_roc_curves_are_listed_and_read_by_run_and_epoch(tmp_path):
    from iclmem.runfolder import roc_path

    folder, _, _ = _folder(tmp_path)
    curve = pd.DataFrame({"fpr": np.linspace(0, 1, 5), "tpr": np.linspace(0, 1, 5) ** 0.5})
    write_parquet_atomic(curve, roc_path(tmp_path, "r0", 6))
    files = folder.roc_files()
    assert files[["run_id", "epoch"]].to_dict("records") == [{"run_id": "r0", "epoch": 6}]
    pd.testing.assert_frame_equal(folder.roc("r0", 6), curve)
    assert folder.roc("r0", 3) is None


def test_the_results_schema_version_is_recorded_and_a_newer_one_is_refused_naming_both(tmp_path):
    from iclmem.record import RESULTS_SCHEMA_KEY, RESULTS_SCHEMA_VERSION

    folder, _, table = _folder(tmp_path)
    assert folder.results_schema_version() == 1  # written without a version: from before versions existed
    path = tmp_path / RESULTS_FILE
    write_parquet_atomic(table, path, metadata={RESULTS_SCHEMA_KEY: str(RESULTS_SCHEMA_VERSION)})
    assert folder.results_schema_version() == RESULTS_SCHEMA_VERSION
    pd.testing.assert_frame_equal(folder.results(public=False), table)  # the metadata changes no value
    write_parquet_atomic(table, path, metadata={RESULTS_SCHEMA_KEY: str(RESULTS_SCHEMA_VERSION + 1)})
    with pytest.raises(ResultSchemaError, match=rf"results schema {RESULTS_SCHEMA_VERSION + 1}.*reads schema "
                                                rf"{RESULTS_SCHEMA_VERSION} and older"):
        folder.results()
    write_parquet_atomic(table, path, metadata={RESULTS_SCHEMA_KEY: "two"})
    with pytest.raises(ResultSchemaError, match="'two' is not a version number"):
        folder.results()
