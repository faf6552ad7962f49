"""Atomic, checksummed storage: damaged results are detected, named, and recomputed rather than trusted."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from probes.probe import ProbeResult


def _result() -> ProbeResult:
    from iclmem.record import RunIdentity

    row = {**RunIdentity("r", "iris", "pfn-mini", "single_fixed", 1e-3, 8, "normal", 0).as_dict(), "epoch": 3,
           "outcome": "no_signal", "auc": 0.5}
    manip = pd.DataFrame({"run_id": ["r"], "epoch": [3], "manipulation": ["base"], "category": ["base"], "auc": [0.5]})
    return ProbeResult(row, manip, pd.DataFrame({"fpr": [0.0, 1.0], "tpr": [0.0, 1.0]}))


def test_a_saved_result_round_trips(tmp_path):
    _result().save(tmp_path, "e0003")
    loaded = ProbeResult.load(tmp_path, "e0003")
    assert loaded.row == _result().row
    assert loaded.manipulation_auc.equals(_result().manipulation_auc)
    assert not list(tmp_path.glob(".*tmp"))  # no temporary file left behind


def test_a_tampered_result_fails_its_checksum_and_is_named_in_a_warning(tmp_path):
    _result().save(tmp_path, "e0003")
    path = tmp_path / "e0003.json"
    stored = json.loads(path.read_text())
    stored["row"]["auc"] = 0.9  # bit rot or a hand edit
    path.write_text(json.dumps(stored))
    with pytest.warns(UserWarning, match="e0003.json"):
        assert ProbeResult.load(tmp_path, "e0003") is None


def test_a_truncated_part_of_a_result_makes_it_recomputed(tmp_path):
    _result().save(tmp_path, "e0003")
    manip = tmp_path / "e0003.manip.parquet"
    manip.write_bytes(manip.read_bytes()[:50])
    with pytest.warns(UserWarning, match="e0003.manip.parquet"):
        assert ProbeResult.load(tmp_path, "e0003") is None


def test_a_half_written_result_is_named_and_recomputed(tmp_path):
    (tmp_path / "e0001.json").write_text('{"row": {"run_id": "r"')  # a crash mid-write of a non-atomic writer
    with pytest.warns(UserWarning, match=r"e0001.json is damaged \(not JSON\); recomputing it"):
        assert ProbeResult.load(tmp_path, "e0001") is None


def test_a_result_missing_a_part_is_named_and_one_never_computed_is_silent(tmp_path, recwarn):
    assert ProbeResult.load(tmp_path, "e0002") is None  # not computed yet: nothing to say
    assert not [w for w in recwarn if "e0002" in str(w.message)]
    _result().save(tmp_path, "e0003")
    (tmp_path / "e0003.roc.parquet").unlink()
    with pytest.warns(UserWarning, match=r"e0003.roc.parquet is missing; recomputing it"):
        assert ProbeResult.load(tmp_path, "e0003") is None


def test_a_damaged_prepared_task_cache_entry_is_recomputed(tmp_path):
    from trainables.data import TaskSource, load_or_prepare

    source = TaskSource("iris", "builtin")
    first = load_or_prepare(source, q=30, context_size=60, cache_dir=tmp_path)
    npz = next(tmp_path.glob("*.npz"))
    npz.write_bytes(npz.read_bytes()[:100])
    with pytest.warns(UserWarning, match=npz.name):
        again = load_or_prepare(source, q=30, context_size=60, cache_dir=tmp_path)
    assert again == first


def test_a_flipped_bit_anywhere_in_a_score_tables_data_pages_is_caught_and_named(tmp_path):
    import numpy as np
    import pyarrow.parquet as pq

    from iclmem.atomic import read_parquet_checked, write_parquet_atomic

    table = pd.DataFrame({"score": np.linspace(-3.0, 3.0, 4000), "row": np.arange(4000)})
    path = tmp_path / "reference_x.parquet"
    write_parquet_atomic(table, path)
    pd.testing.assert_frame_equal(read_parquet_checked(path), table)
    clean = path.read_bytes()
    columns = pq.ParquetFile(path).metadata.row_group(0)
    chunks = [columns.column(i) for i in range(2)]  # each: an optional dictionary page, then data pages
    pages = [(min(o for o in (c.dictionary_page_offset, c.data_page_offset) if o is not None), c.total_compressed_size)
             for c in chunks]
    positions = [start + k * size // 7 for start, size in pages for k in range(1, 7)]
    for position in positions:  # bit rot at 12 places across both columns' pages
        data = bytearray(clean)
        data[position] ^= 0x01
        path.write_bytes(bytes(data))
        with pytest.warns(UserWarning, match="reference_x.parquet"):
            assert read_parquet_checked(path) is None, position
