"""Stage I ground truth (trainables/data/): loading, cleaning, preprocessing, split, label modes, cache."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from iclmem.errors import ConfigError, DataError, SplitError
from trainables.data import (
    BUILTIN_TASKS,
    BuiltinTask,
    PreparedTask,
    PrepSettings,
    TaskKind,
    TaskSource,
    ground_truth_log,
    load_or_prepare,
    prepare_task,
    task_fingerprint,
)
from trainables.data import prepare as prepare_module

CARTE_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "carte"
CARTE_TASKS = ["spotify", "wine_dot_com_prices", "wine_vivino_price"]


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------


def builtin(name: str) -> TaskSource:
    return TaskSource(name=name, kind="builtin")


def write_table(tmp_path: Path, frame: pd.DataFrame, name: str = "t.parquet") -> Path:
    path = tmp_path / name
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    return path


def write_carte(directory: Path, name: str, frame: pd.DataFrame, config: dict, nested: bool = False) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if nested:
        (directory / name).mkdir()
        frame.to_parquet(directory / name / "raw.parquet", index=False)
        (directory / name / "config_data.json").write_text(json.dumps(config))
    else:
        frame.to_parquet(directory / f"{name}.parquet", index=False)
        (directory / f"config_{name}.json").write_text(json.dumps(config))


def numeric_frame(n: int, seed: int = 0, n_classes: int = 2) -> pd.DataFrame:
    """n distinct rows of two float features and a balanced integer label."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n), "y": np.arange(n) % n_classes})


def assert_valid_split(task: PreparedTask, q: int, context_size: int) -> None:
    m, nm, ctx = task.member_idx, task.nonmember_idx, task.context_idx
    assert len(m) == len(nm) == q
    assert len(set(m) | set(nm) | set(ctx)) == len(m) + len(nm) + len(ctx), "splits must be disjoint"
    per_class = context_size // task.n_classes
    assert len(ctx) == per_class * task.n_classes
    assert np.all(np.bincount(task.labels[ctx], minlength=task.n_classes) == per_class), "context not uniform"
    # stratified: members and non-members hold the same number of rows of every label
    assert np.array_equal(
        np.bincount(task.labels[m], minlength=task.n_classes), np.bincount(task.labels[nm], minlength=task.n_classes)
    )
    report = task.split_report
    if task.task_kind is TaskKind.REGRESSION:
        assert report.ks is not None
        assert report.ks < 0.05
        assert report.ks_pvalue is not None
        assert 0.0 <= report.ks_pvalue <= 1.0
        assert report.wasserstein is not None
        assert report.wasserstein >= 0.0
    else:
        assert report.tvd < 0.05
        assert report.ks is None
    for name in ("features", "labels", "original_labels", "row_ids", "member_idx", "nonmember_idx", "context_idx"):
        assert not getattr(task, name).flags.writeable, name
    assert task.features.dtype == np.float32
    assert np.isfinite(task.features).all()
    for name in ("labels", "original_labels", "row_ids", "member_idx", "nonmember_idx", "context_idx"):
        assert getattr(task, name).dtype == np.int64, name


def array_bytes(task: PreparedTask) -> dict[str, bytes]:
    names = ("features", "labels", "original_labels", "row_ids", "member_idx", "nonmember_idx", "context_idx")
    return {n: getattr(task, n).tobytes() for n in names}


@pytest.fixture(scope="module")
def cancer_normal() -> PreparedTask:
    return prepare_task(builtin("breast_cancer"), label_mode="normal", seed=0)


# ------------------------------------------------------------------------------------------------
# split checks on real tables
# ------------------------------------------------------------------------------------------------

# iris (150 rows) and wine (178 rows) are smaller than 2*50 + 128, so they use q=30, context 60;
# digits (10 classes) and diabetes (10 bins) get a uniform context of 12 per label = 120 rows.
BUILTIN_SIZES = [
    ("breast_cancer", 50, 128),
    ("digits", 50, 128),
    ("diabetes", 50, 128),
    ("wine", 30, 60),
    ("iris", 30, 60),
]


@pytest.mark.parametrize(("name", "q", "context_size"), BUILTIN_SIZES)
def test_builtin_tasks_split_passes_distribution_checks(name: str, q: int, context_size: int) -> None:
    task = prepare_task(builtin(name), q=q, context_size=context_size, seed=0)
    assert_valid_split(task, q, context_size)
    assert task.task_kind is BUILTIN_TASKS.get(name).task


@pytest.mark.skipif(not CARTE_DIR.is_dir(), reason=f"CARTE tables not present at {CARTE_DIR}")
@pytest.mark.parametrize("name", CARTE_TASKS)
def test_carte_tasks_split_passes_distribution_checks(name: str) -> None:
    task = prepare_task(TaskSource(name=name, kind="carte", path=str(CARTE_DIR)), q=50, context_size=128, seed=0)
    assert_valid_split(task, 50, 128)
    expected = TaskKind.CLASSIFICATION if name == "spotify" else TaskKind.REGRESSION
    assert task.task_kind is expected
    assert task.n_features <= 16
    if expected is TaskKind.REGRESSION:
        assert task.n_classes == 10
        assert len(task.context_idx) == 120


def test_regression_split_ks_is_at_most_one_over_q() -> None:
    # Matched pairs by target value: member and non-member ECDFs differ by at most one row.
    for seed in range(3):
        task = prepare_task(builtin("diabetes"), q=50, context_size=128, seed=seed)
        assert task.split_report.ks <= 1 / 50 + 1e-12


# ------------------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------------------


def test_carte_nested_layout_is_loaded(tmp_path: Path) -> None:
    frame = numeric_frame(200).rename(columns={"y": "label"})
    write_carte(tmp_path, "toy", frame, {"target_name": "label", "task": "classification", "entity_name": "x"}, nested=True)
    task = prepare_task(TaskSource(name="toy", kind="carte", path=str(tmp_path)), q=20, context_size=40)
    assert task.task_kind is TaskKind.CLASSIFICATION
    assert task.class_names == ("0", "1")
    assert task.split_report.n_rows == 200


def test_carte_flat_layout_reads_target_and_task_from_config(tmp_path: Path) -> None:
    frame = numeric_frame(200)
    frame["price"] = np.linspace(1.0, 50.0, 200)
    write_carte(tmp_path, "toy", frame, {"target_name": "price", "task": "regression", "entity_name": "x"})
    task = prepare_task(TaskSource(name="toy", kind="carte", path=str(tmp_path)), q=25, context_size=40)
    assert task.task_kind is TaskKind.REGRESSION
    assert task.n_features == 3  # a, b and the integer y, which is a feature here


def test_plain_csv_table_with_named_target(tmp_path: Path) -> None:
    path = write_table(tmp_path, numeric_frame(120, n_classes=3), "t.csv")
    task = prepare_task(TaskSource(name="t", kind="table", path=str(path), target="y"), q=20, context_size=30)
    assert task.task_kind is TaskKind.CLASSIFICATION
    assert task.n_classes == 3
    assert task.n_features == 2, "the target must not be among the features"


def test_mixed_column_types_are_encoded_and_all_nan_column_warned(tmp_path: Path) -> None:
    n = 300
    rng = np.random.default_rng(1)
    frame = pd.DataFrame(
        {
            "num": rng.normal(size=n),
            "num_missing": np.where(np.arange(n) % 7 == 0, np.nan, rng.normal(size=n)),
            "year_text": [("N.V." if i % 20 == 0 else str(1990 + i % 30)) for i in range(n)],
            "colour": rng.choice(["red", "white", None], size=n),
            "name": [f"wine {i}" for i in range(n)],
            "when": [f"2020-{1 + i % 12:02d}-{1 + i % 28:02d}" for i in range(n)],
            "stamp": pd.date_range("2001-01-01", periods=n, freq="D"),
            "flag": np.arange(n) % 2 == 0,
            "empty": [None] * n,
            "y": rng.choice(["cat", "dog"], size=n),
        }
    )
    path = write_table(tmp_path, frame)
    source = TaskSource(name="mixed", kind="table", path=str(path), target="y")
    with pytest.warns(UserWarning, match="'empty'"):
        task = prepare_task(source, PrepSettings(max_features=None), q=30, context_size=40)
    report = task.split_report
    assert report.dropped_columns == ("empty",)
    assert (report.n_numeric_columns, report.n_categorical_columns, report.n_date_columns) == (4, 2, 2)
    # num, num_missing + indicator, year_text + indicator, colour one-hot (red, white, <missing>),
    # name ordinal, when, stamp, flag
    assert report.n_encoded_features == 12 == task.n_features
    assert np.isfinite(task.features).all()
    assert task.class_names == ("cat", "dog")
    # fitted on the whole table: every non-constant column is standardized over all rows
    assert np.allclose(task.features.mean(axis=0), 0.0, atol=1e-5)
    assert np.allclose(task.features.std(axis=0), 1.0, atol=1e-4)
    # dates become numbers in time order
    stamp_col = next(j for j in range(task.n_features) if np.corrcoef(task.features[:, j], np.arange(n))[0, 1] > 0.999)
    assert np.all(np.diff(task.features[np.argsort(task.row_ids), stamp_col]) > 0)
    with pytest.warns(UserWarning, match="column .empty. has only missing values"):
        reduced = prepare_task(source, PrepSettings(max_features=5), q=30, context_size=40)
    assert reduced.n_features == 5
    assert 0.0 < reduced.split_report.pca_explained_variance < 1.0


def test_classification_class_names_sorted_in_natural_order(tmp_path: Path) -> None:
    frame = numeric_frame(180)
    frame["y"] = np.array([10, 2, 1])[np.arange(180) % 3]
    path = write_table(tmp_path, frame)
    task = prepare_task(TaskSource(name="t", kind="table", path=str(path), target="y", task="classification"), q=20, context_size=30)
    assert task.class_names == ("1", "2", "10")
    assert np.array_equal(task.labels[task.row_ids == 0], [2])  # row 0 has label 10 -> index 2


def test_regression_target_cut_into_quantile_bins(tmp_path: Path) -> None:
    frame = numeric_frame(100)
    frame["y"] = np.arange(1, 101, dtype=float)  # 1..100 in 4 bins: 25 values each
    path = write_table(tmp_path, frame)
    source = TaskSource(name="t", kind="table", path=str(path), target="y", task="regression")
    task = prepare_task(source, PrepSettings(regression_bins=4), q=25, context_size=8)
    assert task.class_names == ("[1, 25]", "(25, 50]", "(50, 75]", "(75, 100]")
    assert task.bin_edges == (1.0, 25.0, 50.0, 75.0, 100.0)
    assert np.array_equal(np.bincount(task.labels), [25, 25, 25, 25])
    assert np.array_equal(task.labels, (task.target_values > 25).astype(int) + (task.target_values > 50) + (task.target_values > 75))


def test_tied_regression_target_warns_about_fewer_bins(tmp_path: Path) -> None:
    frame = numeric_frame(200)
    frame["y"] = np.concatenate([np.zeros(120), np.arange(1.0, 81.0)])  # 60% ties at 0
    path = write_table(tmp_path, frame)
    source = TaskSource(name="t", kind="table", path=str(path), target="y", task="regression")
    with pytest.warns(UserWarning, match="leave 4 quantile bins instead of 10"):
        task = prepare_task(source, q=25, context_size=20)
    assert task.class_names == ("[0, 20]", "(20, 40]", "(40, 60]", "(60, 80]")


def test_regression_target_is_inferred_for_many_numeric_values(tmp_path: Path) -> None:
    frame = numeric_frame(150)
    frame["y"] = np.linspace(0, 1, 150)
    path = write_table(tmp_path, frame)
    task = prepare_task(TaskSource(name="t", kind="table", path=str(path), target="y"), q=25, context_size=30)
    assert task.task_kind is TaskKind.REGRESSION


# ------------------------------------------------------------------------------------------------
# deduplication
# ------------------------------------------------------------------------------------------------


def test_dedup_drops_planted_exact_and_feature_duplicates_with_counts(tmp_path: Path) -> None:
    base = numeric_frame(200)  # rows 0..199, all distinct
    exact = base.iloc[[3, 4, 5]]  # -> rows 200, 201, 202: exact copies
    conflicting = base.iloc[[10, 11]].assign(y=lambda f: 1 - f["y"])  # -> rows 203, 204: same features, other label
    missing_target = base.iloc[[20]].assign(y=np.nan)  # -> row 205
    frame = pd.concat([base, exact, conflicting, missing_target], ignore_index=True)
    path = write_table(tmp_path, frame)
    task = prepare_task(TaskSource(name="t", kind="table", path=str(path), target="y"), q=20, context_size=40)
    report = task.split_report
    assert report.n_rows_source == 206
    assert report.n_missing_target == 1
    assert report.n_exact_duplicates == 3
    assert report.n_feature_duplicates == 4  # both rows of each conflicting pair: 10, 11, 203, 204
    assert report.n_rows == 206 - 1 - 3 - 4 == len(task.row_ids)
    kept = set(task.row_ids.tolist())
    assert kept.isdisjoint({10, 11, 200, 201, 202, 203, 204, 205})
    assert {3, 4, 5, 20} <= kept  # the first copy of an exact duplicate stays
    assert len({tuple(r) for r in task.features.tolist()}) == len(task.features)


# ------------------------------------------------------------------------------------------------
# label modes
# ------------------------------------------------------------------------------------------------


def test_normal_mode_trains_on_true_labels(cancer_normal: PreparedTask) -> None:
    assert np.array_equal(cancer_normal.labels, cancer_normal.original_labels)


def test_unmatched_shuffled_members_permutes_member_labels_only(cancer_normal: PreparedTask) -> None:
    """The paper's design (data.label_design: unmatched): only the members' labels are permuted."""
    task = prepare_task(builtin("breast_cancer"), PrepSettings(label_design="unmatched"),
                        label_mode="shuffled_members", seed=0)
    m = task.member_idx
    changed = np.flatnonzero(task.labels != task.original_labels)
    assert changed.size > 0, "only member labels may change"
    assert set(changed) <= set(m), "only member labels may change"
    assert np.array_equal(np.sort(task.labels[m]), np.sort(task.original_labels[m])), "member marginal preserved"
    assert task.split_report.label_design == "unmatched"
    assert not task.split_report.exchangeable
    assert np.array_equal(np.bincount(task.labels), np.bincount(task.original_labels)), "table marginal preserved"
    # nothing else differs from the normal task
    assert np.array_equal(task.original_labels, cancer_normal.original_labels)
    for name in ("features", "row_ids", "member_idx", "nonmember_idx", "context_idx"):
        assert getattr(task, name).tobytes() == getattr(cancer_normal, name).tobytes(), name


def test_shuffled_all_permutes_labels_over_whole_table(cancer_normal: PreparedTask) -> None:
    task = prepare_task(builtin("breast_cancer"), label_mode="shuffled_all", seed=0)
    changed = np.flatnonzero(task.labels != task.original_labels)
    outside = np.setdiff1d(changed, task.member_idx)
    assert outside.size > 0.2 * len(task.labels), "labels must change across the table, not only members"
    assert np.array_equal(np.bincount(task.labels), np.bincount(task.original_labels)), "table marginal preserved"
    # the split is stratified by the shuffled labels, so members keep the table's label shares
    assert np.array_equal(np.bincount(task.labels[task.member_idx]), np.bincount(cancer_normal.labels[cancer_normal.member_idx]))
    assert np.array_equal(task.original_labels, cancer_normal.original_labels)
    assert task.features.tobytes() == cancer_normal.features.tobytes()
    assert task.row_ids.tobytes() == cancer_normal.row_ids.tobytes()
    assert_valid_split(task, 50, 128)


def test_shuffled_all_regression_permutes_raw_targets_consistently_with_bins() -> None:
    normal = prepare_task(builtin("diabetes"), seed=0)
    task = prepare_task(builtin("diabetes"), label_mode="shuffled_all", seed=0)
    assert np.array_equal(np.sort(task.target_values), np.sort(normal.target_values))
    assert not np.array_equal(task.target_values, normal.target_values)
    edges = np.asarray(task.bin_edges)
    assert np.array_equal(task.labels, np.searchsorted(edges[1:-1], task.target_values, side="left"))
    assert_valid_split(task, 50, 128)


# ------------------------------------------------------------------------------------------------
# determinism, fingerprint, cache
# ------------------------------------------------------------------------------------------------


def test_same_seed_gives_byte_identical_task(cancer_normal: PreparedTask) -> None:
    again = prepare_task(builtin("breast_cancer"), label_mode="normal", seed=0)
    assert array_bytes(again) == array_bytes(cancer_normal)
    assert again.fingerprint == cancer_normal.fingerprint
    assert again.split_report == cancer_normal.split_report
    assert again == cancer_normal


def test_different_seed_gives_different_split_and_fingerprint(cancer_normal: PreparedTask) -> None:
    other = prepare_task(builtin("breast_cancer"), label_mode="normal", seed=1)
    assert other.fingerprint != cancer_normal.fingerprint
    assert not np.array_equal(other.member_idx, cancer_normal.member_idx)
    assert other != cancer_normal


def test_fingerprint_covers_every_setting_and_source_bytes(tmp_path: Path) -> None:
    source = builtin("breast_cancer")
    base = task_fingerprint(source, PrepSettings(), "normal", 0)
    variants = [
        task_fingerprint(source, PrepSettings(regression_bins=5), "normal", 0),
        task_fingerprint(source, PrepSettings(max_features=8), "normal", 0),
        task_fingerprint(source, PrepSettings(max_redraws=3), "normal", 0),
        task_fingerprint(source, PrepSettings(tvd_max=0.1), "normal", 0),
        task_fingerprint(source, PrepSettings(ks_max=0.1), "normal", 0),
        task_fingerprint(source, PrepSettings(), "normal", 0, q=40),
        task_fingerprint(source, PrepSettings(), "normal", 0, context_size=64),
        task_fingerprint(source, PrepSettings(), "shuffled_all", 0),
        task_fingerprint(source, PrepSettings(), "normal", 1),
        task_fingerprint(builtin("wine"), PrepSettings(), "normal", 0),
    ]
    assert len({base, *variants}) == len(variants) + 1
    path = write_table(tmp_path, numeric_frame(50))
    table = TaskSource(name="t", kind="table", path=str(path), target="y")
    before = task_fingerprint(table)
    write_table(tmp_path, numeric_frame(50, seed=9))
    assert task_fingerprint(table) != before, "changed file bytes must change the fingerprint"


def test_cache_round_trip_is_identical_and_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    source = builtin("diabetes")
    first = load_or_prepare(source, PrepSettings(), "shuffled_members", 3, q=50, context_size=128, cache_dir=cache)
    assert sorted(p.name for p in cache.iterdir()) == [f"{first.fingerprint}.json", f"{first.fingerprint}.npz"]

    def no_recompute(*args: object, **kwargs: object) -> PreparedTask:
        raise AssertionError("a cached task must not be prepared again")

    # load_or_prepare looks prepare_task up in its own module
    monkeypatch.setattr(prepare_module, "prepare_task", no_recompute)
    loaded = load_or_prepare(source, PrepSettings(), "shuffled_members", 3, q=50, context_size=128, cache_dir=cache)
    assert loaded == first
    assert array_bytes(loaded) == array_bytes(first)
    assert loaded.target_values.tobytes() == first.target_values.tobytes()
    assert loaded.split_report == first.split_report
    assert loaded.class_names == first.class_names
    assert loaded.bin_edges == first.bin_edges
    assert not loaded.features.flags.writeable
    assert not loaded.labels.flags.writeable


def test_corrupt_cache_entry_is_recomputed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = load_or_prepare(builtin("iris"), q=30, context_size=60, cache_dir=cache)
    (cache / f"{first.fingerprint}.npz").write_bytes(b"not a zip file")
    again = load_or_prepare(builtin("iris"), q=30, context_size=60, cache_dir=cache)
    assert again == first


# ------------------------------------------------------------------------------------------------
# preprocessing is fitted once
# ------------------------------------------------------------------------------------------------


def test_features_of_a_row_do_not_depend_on_its_split(cancer_normal: PreparedTask) -> None:
    other_seed = prepare_task(builtin("breast_cancer"), seed=5)
    other_sizes = prepare_task(builtin("breast_cancer"), seed=0, q=20, context_size=32)
    for other in (other_seed, other_sizes):
        assert other.features.tobytes() == cancer_normal.features.tobytes()
        assert other.row_ids.tobytes() == cancer_normal.row_ids.tobytes()
    # a row that is a member in one draw and a non-member in the other keeps its features
    moved = np.intersect1d(cancer_normal.member_idx, other_seed.nonmember_idx)
    assert moved.size > 0
    assert np.array_equal(cancer_normal.features[moved], other_seed.features[moved])


def test_prepared_arrays_are_read_only(cancer_normal: PreparedTask) -> None:
    with pytest.raises(ValueError, match="read-only"):
        cancer_normal.features[0, 0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        cancer_normal.labels[0] = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        cancer_normal.seed = 3  # type: ignore[misc]


# ------------------------------------------------------------------------------------------------
# ground-truth log
# ------------------------------------------------------------------------------------------------


def test_ground_truth_log_is_json_and_names_rows_and_trained_labels() -> None:
    task = prepare_task(builtin("breast_cancer"), label_mode="shuffled_members", seed=2)
    log = json.loads(json.dumps(ground_truth_log(task)))
    assert log["member_row_ids"] == task.row_ids[task.member_idx].tolist()
    assert log["nonmember_row_ids"] == task.row_ids[task.nonmember_idx].tolist()
    assert log["context_row_ids"] == task.row_ids[task.context_idx].tolist()
    assert log["member_labels"] == task.labels[task.member_idx].tolist()
    assert log["member_original_labels"] == task.original_labels[task.member_idx].tolist()
    assert log["context_labels"] == task.labels[task.context_idx].tolist()
    assert log["label_mode"] == "shuffled_members"
    assert log["seed"] == 2
    assert log["fingerprint"] == task.fingerprint
    assert log["class_names"] == list(task.class_names)
    assert log["split_report"]["tvd"] == task.split_report.tvd


# ------------------------------------------------------------------------------------------------
# bad input -> typed errors that name the problem
# ------------------------------------------------------------------------------------------------


def test_missing_table_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(DataError, match="nope.csv"):
        prepare_task(TaskSource(name="t", kind="table", path=str(missing), target="y"))


def test_missing_carte_table_names_the_directory_and_layouts(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"toy\.parquet.*config_toy\.json.*raw\.parquet"):
        prepare_task(TaskSource(name="toy", kind="carte", path=str(tmp_path)))
    with pytest.raises(DataError, match="not found"):
        prepare_task(TaskSource(name="toy", kind="carte", path=str(tmp_path / "absent")))


def test_misspelled_target_lists_columns_and_suggests_close_match(tmp_path: Path) -> None:
    frame = numeric_frame(50).rename(columns={"y": "popularity"})
    write_carte(tmp_path, "toy", frame, {"target_name": "popularty", "task": "classification", "entity_name": "x"})
    with pytest.raises(DataError) as err:
        prepare_task(TaskSource(name="toy", kind="carte", path=str(tmp_path)))
    message = str(err.value)
    assert "'popularty' not found" in message
    assert "['a', 'b', 'popularity']" in message
    assert "did you mean 'popularity'" in message


def test_carte_config_without_target_or_with_bad_task_is_named(tmp_path: Path) -> None:
    write_carte(tmp_path / "a", "toy", numeric_frame(50), {"task": "classification"})
    with pytest.raises(DataError, match="config_toy.json.*'target_name'"):
        prepare_task(TaskSource(name="toy", kind="carte", path=str(tmp_path / "a")))
    write_carte(tmp_path / "b", "toy", numeric_frame(50), {"target_name": "y", "task": "ranking"})
    with pytest.raises(DataError, match="'ranking'"):
        prepare_task(TaskSource(name="toy", kind="carte", path=str(tmp_path / "b")))


def test_single_class_target_is_rejected(tmp_path: Path) -> None:
    path = write_table(tmp_path, numeric_frame(300).assign(y="spam"))
    with pytest.raises(DataError, match=r"target column 'y' has a single class \('spam'\)"):
        prepare_task(TaskSource(name="t", kind="table", path=str(path), target="y"))


def test_too_few_rows_says_how_many_are_needed_and_present() -> None:
    with pytest.raises(DataError, match=r"228 rows are needed, but only 178 remain"):
        prepare_task(builtin("wine"), q=50, context_size=128)


def test_class_with_too_few_rows_is_named(tmp_path: Path) -> None:
    frame = numeric_frame(300)
    frame["y"] = np.where(np.arange(300) < 5, "rare", "common")
    path = write_table(tmp_path, frame)
    with pytest.raises(DataError, match=r"class 'rare' has 5 rows but"):
        prepare_task(TaskSource(name="t", kind="table", path=str(path), target="y"), q=50, context_size=40)


def test_regression_target_with_text_names_column_and_bad_value(tmp_path: Path) -> None:
    frame = numeric_frame(300).assign(price=[str(i) for i in range(299)] + ["cheap"])
    path = write_table(tmp_path, frame)
    source = TaskSource(name="t", kind="table", path=str(path), target="price", task="regression")
    with pytest.raises(DataError, match=r"regression target column 'price' has 1 non-numeric value\(s\), e.g. 'cheap'"):
        prepare_task(source)


def test_unknown_builtin_lists_known_names() -> None:
    with pytest.raises(ConfigError, match="'iriss'.*breast_cancer, diabetes, digits, iris, wine"):
        prepare_task(builtin("iriss"))


def test_duplicated_target_column_cannot_become_a_feature(monkeypatch: pytest.MonkeyPatch) -> None:
    def load() -> pd.DataFrame:
        frame = numeric_frame(300)
        return pd.concat([frame, frame[["y"]]], axis=1)  # a second 'y' column

    monkeypatch.setitem(BUILTIN_TASKS._items, "dup_target", BuiltinTask(load, "y", TaskKind.CLASSIFICATION))
    with pytest.raises(DataError, match=r"duplicate column names \['y'\]"):
        prepare_task(builtin("dup_target"))


def test_split_that_cannot_pass_ks_raises_split_error_after_redraws() -> None:
    # with q=10 distinct targets the KS statistic is at least 1/10 >= 0.05
    with pytest.raises(SplitError, match=r"after 20 redraws \(seeds 0\.\.20\).*KS statistic 0\.1000"):
        prepare_task(builtin("diabetes"), q=10, context_size=20)


def test_split_that_cannot_pass_tvd_raises_split_error() -> None:
    with pytest.raises(SplitError, match=r"after 2 redraws.*TVD 0\.0000 >= tvd_max 0\.0"):
        prepare_task(builtin("iris"), PrepSettings(tvd_max=0.0, max_redraws=2), q=30, context_size=60)


def test_context_smaller_than_class_count_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="context_size 5 is smaller than the number of classes"):
        prepare_task(builtin("digits"), context_size=5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"regression_bins": 1}, "regression_bins"),
        ({"max_features": 0}, "max_features"),
        ({"q": 0}, "q must be"),
        ({"context_size": -1}, "context_size"),
        ({"tvd_max": 2.0}, "tvd_max"),
    ],
)
def test_invalid_settings_are_config_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        PrepSettings(**kwargs)


def test_invalid_source_and_label_mode_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown source kind 'csv'"):
        TaskSource(name="t", kind="csv")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs the target column"):
        TaskSource(name="t", kind="table", path="x.csv")
    with pytest.raises(ConfigError, match="unknown task kind 'ranking'"):
        TaskSource(name="t", kind="builtin", task="ranking")  # type: ignore[arg-type]
    assert TaskSource(name="t", kind="builtin", task="regression").task is TaskKind.REGRESSION  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown label_mode 'shuffled'"):
        prepare_task(builtin("iris"), label_mode="shuffled", q=30, context_size=60)


def test_matched_shuffled_members_permutes_each_group_among_itself(cancer_normal: PreparedTask) -> None:
    """The default design: members, non-members and the rows outside the split each have their labels
    permuted among themselves (C' keeps its true labels), so every group keeps its label counts and the
    members and non-members carry labels from the same kind of draw."""
    task = prepare_task(builtin("breast_cancer"), label_mode="shuffled_members", seed=0)
    m, n, c = task.member_idx, task.nonmember_idx, task.context_idx
    rest = np.setdiff1d(np.arange(len(task.labels)), np.concatenate([m, n, c]))
    for group in (m, n, rest):
        assert not np.array_equal(task.labels[group], task.original_labels[group])
        assert np.array_equal(np.bincount(task.labels[group], minlength=2),
                              np.bincount(task.original_labels[group], minlength=2))
    assert np.array_equal(task.labels[c], task.original_labels[c])
    # the members' permutation is the one the paper's design draws: the same rows train on the same labels
    unmatched = prepare_task(builtin("breast_cancer"), PrepSettings(label_design="unmatched"),
                             label_mode="shuffled_members", seed=0)
    assert np.array_equal(task.member_idx, unmatched.member_idx)
    assert np.array_equal(task.labels[m], unmatched.labels[m])
    assert task.split_report.label_design == "matched"
    assert task.split_report.exchangeable


# On a binary task a permutation leaves about half the member labels right, so the unmatched groups differ
# less (measured 0.69-0.79 at |C'| = 60) than on 3+ classes (0.77-0.96)
@pytest.mark.parametrize(("name", "q", "unmatched_above"), [("iris", 30, 0.7), ("wine", 30, 0.7), ("breast_cancer", 50, 0.6),
                                                    ("digits", 100, 0.7)])
def test_the_blind_baseline_sits_at_chance_on_matched_splits_and_separates_unmatched_ones(name, q,
                                                                                           unmatched_above) -> None:
    """A logistic regression fitted on C' alone tells the paper's unmatched groups apart (members scored on
    permuted labels, non-members on true ones) and cannot tell the matched ones apart."""
    for seed in (0, 1):
        matched = prepare_task(builtin(name), PrepSettings(context_size=60), "shuffled_members", seed=seed, q=q)
        unmatched = prepare_task(builtin(name), PrepSettings(context_size=60, label_design="unmatched"),
                                 "shuffled_members", seed=seed, q=q)
        for task in (matched, prepare_task(builtin(name), PrepSettings(context_size=60), "normal", seed=seed, q=q)):
            r = task.split_report
            assert r.blind_auc_low <= 0.5 <= r.blind_auc_high, (name, seed, r)
            assert 0.35 <= r.blind_auc <= 0.65, (name, seed, r)
        assert unmatched.split_report.blind_auc > unmatched_above, (name, seed)
        assert unmatched.split_report.blind_auc_low > 0.5, (name, seed)
        assert not unmatched.split_report.exchangeable


def test_a_split_whose_groups_are_separable_without_the_model_is_redrawn(monkeypatch) -> None:
    """Stage I refuses a draw whose blind interval excludes 0.5 and redraws; when no draw passes it fails
    naming the task and the label mode."""
    import trainables.data.blind as blind
    import trainables.data.split as split_module  # where the redraw loop looks blind_baseline up

    calls = []
    real = split_module.blind_baseline

    def first_separable(*args, **kwargs):
        calls.append(1)
        out = real(*args, **kwargs)
        return blind.BlindBaseline(0.9, 0.8, 0.95, out.n_members, out.n_nonmembers) if len(calls) == 1 else out

    monkeypatch.setattr(split_module, "blind_baseline", first_separable)
    task = prepare_task(builtin("iris"), PrepSettings(context_size=30), "normal", seed=0, q=30)
    assert task.split_report.blind_redraws == 1
    assert task.split_report.split_seed == 1
    assert task.split_report.blind_auc_low <= 0.5 <= task.split_report.blind_auc_high

    monkeypatch.setattr(split_module, "blind_baseline", lambda *a, **k: blind.BlindBaseline(0.2, 0.1, 0.3, 30, 30))
    with pytest.raises(SplitError, match=r"task 'iris', label_mode shuffled_members: .*separable without the model"):
        prepare_task(builtin("iris"), PrepSettings(context_size=30, max_redraws=3), "shuffled_members", seed=0, q=30)


def test_the_blind_baseline_is_remembered_per_split_never_across_splits() -> None:
    """A split's blind baseline is computed once per process and reused for every checkpoint; a null split
    of the same task (other members and non-members) gets its own, equal to a fresh computation."""
    from trainables.data import TaskSource, prepare_task
    from trainables.data.blind import compute_task_blind_baseline, task_blind_baseline

    task = prepare_task(TaskSource("digits", "builtin"), label_mode="shuffled_members", seed=0, q=50, context_size=128)
    real = task_blind_baseline(task)
    assert task_blind_baseline(task) is real  # the second checkpoint's call: no refit
    rows = np.concatenate([task.member_idx, task.nonmember_idx])
    other = np.random.default_rng(1).permutation(rows)
    null_members, null_nonmembers = np.sort(other[:50]), np.sort(other[50:])
    null = task_blind_baseline(task, null_members, null_nonmembers)
    assert null == compute_task_blind_baseline(task, null_members, null_nonmembers)
    assert null != real
