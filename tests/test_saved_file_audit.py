"""Saved, fitted package classifiers and what they keep of their context (probes/attacks/saved_file.py), on the
shipped minis and Stage I's breast-cancer split (40 members, 40 label-matched non-members, a 40-row
never-in-context control). The functions are tested on Stage I's 16 whitened PCA components (``--file-pca``: a
reconstruction on the table's 30 columns takes 90 s here); the command, on wine's own 13 columns (its default), 30 rows a side.

Planted: a TabICL file saved without its training data, as TabICL's docs recommend for privacy, still predicts
as the fitted classifier, holds no raw row, column or label vector in its bytes, and yet its KV cache gives
every member back (exact match at its position, its label) and lets its features be rebuilt far better than any
imputation from the pool; TabPFN's default file holds the raw rows and labels outright, and its cache-only mode
still gives the members away. Control: a file fitted on the control context (none of the pool's rows) matches no
pool row, refutes the claim that the members are in it, and its scores carry no membership signal. The bars are
the figures measured here (in the tests' docstrings) with margin.
"""

from __future__ import annotations

import numpy as np
import pytest

from iclmem.errors import CheckpointError, DataError, ModelError, ProbeError
from iclmem.vocab import ContextAttack, ContextTarget
from probes.attacks import saved_file as sfa
from probes.attacks import saved_file_cache as sfat
from trainables.models.extras import extra_is_installed

pytestmark = pytest.mark.skipif(not (extra_is_installed("tabicl") and extra_is_installed("tabpfn-v2")),
                                reason="needs both package extras (tabicl, tabpfn)")

CONTEXT = 40


@pytest.fixture(scope="module")
def audit():
    from orchestrator.audits.context_audit import prepare_context_audit
    from trainables.data import TaskSource
    from trainables.models.deployed import tabicl_mini_classifier

    prepared = prepare_context_audit(TaskSource("breast_cancer", "builtin"), "breast_cancer", CONTEXT, 0,
                                     factory=tabicl_mini_classifier, note=lambda _line: None)
    assert prepared.inputs.control_x is not None  # the table has rows enough for the never-in-context control
    return prepared


@pytest.fixture(scope="module")
def files(audit, tmp_path_factory):
    """Each package's file of the members (with save-and-reload checks) and of the control context."""
    inputs = audit.inputs
    x, y, member = inputs.population_x, inputs.population_y, inputs.member
    root = tmp_path_factory.mktemp("saved")
    out = {}
    for model, mode in ((sfa.TABICL, "kv"), (sfa.TABPFN, "fit_preprocessors"), (sfa.TABPFN, "fit_with_cache")):
        out[model, mode] = sfa.save_and_reload(model, x[member], y[member], x, root / f"{model}-{mode}", mode=mode)
        out[model, mode, "control"] = sfa.fit_and_save(model, inputs.control_x, inputs.control_y,
                                                       root / f"{model}-{mode}-control", mode=mode)
    return out


def _pool(audit, in_context: bool = True) -> sfat.Pool:
    return sfat.Pool.from_audit(audit.inputs, audit.prepared.row_ids[audit.population], in_context=in_context)


# ------------------------------------------------------------------------------------------ what the files hold
def test_tabicl_file_without_training_data_predicts_as_fitted_and_holds_no_raw_row(files):
    """Measured: probabilities identical (0.0), no row/column/label pattern, 1 of 640 cells' float32 bytes (a
    coincidence in the cache tensors), all 32 column extremes recoverable from the stored X_min_/X_max_."""
    r = files[sfa.TABICL, "kv"]
    assert r.max_abs_prob_diff < 1e-5
    assert r.saved.n_context == CONTEXT
    scan = r.scan
    assert scan.rows_float32 == scan.rows_float64 == scan.columns_float32 == scan.columns_float64 == 0
    assert scan.cells_float64 == 0
    assert scan.cells_float32 <= 0.01 * scan.n_cells
    assert not scan.labels_stored
    assert scan.extremes_recovered is not None
    assert scan.extremes_recovered >= r.saved.n_features  # the column minima and maxima are in the file
    assert not [s.path for s in r.stored if "X_transformed_" in s.path or s.path.endswith((".X_", ".y_"))]
    # the cache: layer 0's K and V of every context row, in each of the 8 members (4 per normalisation)
    layer0 = r.stored_at("icl_cache.kv[0].")
    assert len(layer0) == 4  # key and value, two normalisations
    assert all(len(s.shape) == 4 and s.shape[0] == 4 and s.shape[2] == CONTEXT for s in layer0)
    assert r.stored_at("col_cache.kv[0].key")


def test_tabpfn_default_file_holds_the_raw_rows_and_labels(files):
    """Measured: every raw column stored contiguous as float64 (16/16), every cell, the label vector."""
    r = files[sfa.TABPFN, "fit_preprocessors"]
    assert r.max_abs_prob_diff < 1e-5
    assert r.scan.columns_float64 == r.saved.n_features
    assert r.scan.cells_float64 == r.scan.n_cells
    assert r.scan.labels_stored
    stored = r.stored_at("ensemble_members[0].X_train")
    assert stored
    assert stored[0].shape[0] == CONTEXT
    cached = files[sfa.TABPFN, "fit_with_cache"]  # the cache mode drops X_train, keeps the labels
    assert cached.max_abs_prob_diff < 1e-5
    assert not cached.stored_at(".X_train")
    assert cached.scan.columns_float64 == 0
    assert cached.scan.labels_stored


# ------------------------------------------------------------------------------------------ matching the cache
@pytest.mark.parametrize(("model", "mode"), [(sfa.TABICL, "kv"), (sfa.TABPFN, "fit_preprocessors"),
                                             (sfa.TABPFN, "fit_with_cache")])
def test_the_file_gives_each_member_its_position_and_its_label_back(audit, files, model, mode):
    """Measured (all three): 40/40 members matched at their own position with their label, 0/40 non-members
    matched, AUC 1.0; members' relative distance <= 1.4e-15, the nearest other row's >= 3.8e-3."""
    r = sfat.cache_match_attack(files[model, mode].saved, _pool(audit), n_resamples=200)
    assert r.n_members == r.n_in_context == CONTEXT
    assert r.member_matched >= 0.95
    assert r.nonmember_matched == 0.0
    assert r.position_accuracy >= 0.95
    assert r.label_accuracy >= 0.95
    assert r.auc_low > 0.9
    assert r.member_distance_max < 1e-10
    assert r.other_distance_min > 100 * sfat.MATCH_TOLERANCE
    assert len(r.scores) == len(r.row_ids) == 2 * CONTEXT


@pytest.mark.parametrize(("model", "mode"), [(sfa.TABICL, "kv"), (sfa.TABPFN, "fit_with_cache")])
def test_a_file_of_other_rows_matches_none_and_refutes_a_false_claim(audit, files, model, mode):
    """Control, measured: no pool row matched, the claim that the members are in it refuted (0 positions,
    0 labels), AUC of the scores over the audited split 0.44-0.55 with intervals holding 0.5."""
    control = files[model, mode, "control"]
    r = sfat.cache_match_attack(control, _pool(audit, in_context=False), n_resamples=200)
    assert r.member_matched == r.nonmember_matched == 0.0
    assert r.n_in_context == 0
    assert r.auc_low < 0.5 < r.auc_high
    assert r.other_distance_min > 100 * sfat.MATCH_TOLERANCE
    claimed = sfat.cache_match_attack(control, _pool(audit, in_context=True), n_resamples=0)
    assert claimed.position_accuracy == claimed.label_accuracy == 0.0


def test_the_repr_cache_gives_the_members_away_as_well(audit, tmp_path):
    inputs = audit.inputs
    x, y, member = inputs.population_x, inputs.population_y, inputs.member
    saved = sfa.fit_and_save(sfa.TABICL, x[member], y[member], tmp_path, mode="repr")
    r = sfat.cache_match_attack(saved, _pool(audit), n_resamples=0)
    assert r.member_matched >= 0.95
    assert r.nonmember_matched == 0.0
    assert r.label_accuracy >= 0.95


# ------------------------------------------------------------------------------------------ reconstruction
def test_the_tabicl_cache_gives_the_rows_features_and_labels_back(audit, files):
    """Measured (16 PCA components, 300 iterations, when the attacker's sample still held the targets): labels
    40/40 without the pool; 99.8% of cells and 39/40 rows within 0.1 pool std (median error
    1.5e-4 std; the last row's one cell off is its column's outlying maximum), against 9-14% of cells and no
    row for the pool mean, the class mean given the label, and the nearest other pool row chosen with the
    truth."""
    r = sfat.reconstruct_context(files[sfa.TABICL, "kv"].saved, _pool(audit), max_iter=300)  # 16 components: enough
    assert r.n_scored == CONTEXT
    assert r.label_accuracy >= 0.95
    assert r.reconstruction.cells_within >= 0.85
    assert r.reconstruction.rows_within >= 0.75
    assert r.reconstruction.median_abs < 0.01
    for baseline in (r.pool_mean, r.class_mean, r.nearest_other_row):
        assert baseline.cells_within < 0.3
        assert baseline.rows_within < 0.1
        assert r.reconstruction.median_abs < baseline.median_abs / 10
    assert r.fit_residual_median < sfat.RESIDUAL_CONVERGED


def test_the_tabpfn_default_file_gives_its_rows_back_exactly(audit, files):
    r = sfat.reconstruct_context(files[sfa.TABPFN, "fit_preprocessors"].saved, _pool(audit))
    assert r.label_accuracy == 1.0
    assert r.reconstruction.rows_within == 1.0
    assert r.reconstruction.rmse == 0.0
    with pytest.raises(ProbeError, match="fit_with_cache"):
        sfat.reconstruct_context(files[sfa.TABPFN, "fit_with_cache"].saved, _pool(audit))


# ------------------------------------------------------------------------------------------ membership by loss
def test_membership_through_the_file_is_found_and_the_control_file_says_no_signal(audit, files):
    """Measured (8 references): loss AUC 0.78 [0.68, 0.88], RMIA 0.90 [0.81, 0.96], memorization under every
    attack; the control file no_signal under every attack, AUCs 0.49-0.54."""
    r = sfa.membership_through_file(files[sfa.TABICL, "kv"].saved, audit.inputs,
                                    control=files[sfa.TABICL, "kv", "control"], n_references=8, n_resamples=500)
    assert r.context_size == CONTEXT
    assert r.outcome == "memorization"
    assert r.trusted
    loss = r.row(ContextTarget.DEPLOYED, ContextAttack.LOSS)
    assert loss.auc > 0.65
    assert loss.auc_low > 0.55
    assert r.row(ContextTarget.DEPLOYED, ContextAttack.RMIA).auc_low > 0.6
    control = [row for row in r.rows if row.target == ContextTarget.CONTROL.value]
    assert len(control) == len(ContextAttack)
    assert all(row.outcome == "no_signal" for row in control)
    assert all(row.auc_low < 0.5 < row.auc_high for row in control)


# ------------------------------------------------------------------------------------------ refusals
def test_bad_inputs_are_refused_naming_what_is_wrong(audit, files, tmp_path):
    inputs = audit.inputs
    x, y, member = inputs.population_x, inputs.population_y, inputs.member
    with pytest.raises(ModelError, match="'xgboost'"):
        sfa.fit_and_save("xgboost", x[member], y[member], tmp_path)
    with pytest.raises(ModelError, match="mode 'fit_with_cache'"):
        sfa.fit_and_save(sfa.TABICL, x[member], y[member], tmp_path, mode="fit_with_cache")
    with pytest.raises(DataError, match="context labels"):
        sfa.fit_and_save(sfa.TABICL, x[member], y[member][:-1], tmp_path)
    saved = files[sfa.TABICL, "kv"].saved
    narrow = sfat.Pool(x[:, :-1], y, member, np.full(len(y), -1), np.arange(len(y)))
    with pytest.raises(DataError, match="15 features"):
        sfat.cache_match_attack(saved, narrow)
    with pytest.raises(ProbeError, match="not fitted on the audit's members"):
        sfa.membership_through_file(files[sfa.TABICL, "kv", "control"], inputs)
    with pytest.raises(ProbeError, match="not the one"):
        sfa.scan_file(saved, x[~member], y[~member])
    broken = tmp_path / "broken.pkl"
    broken.write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match="broken.pkl"):
        sfa.load_saved(sfa.SavedFile(sfa.TABICL, "kv", str(broken), CONTEXT, x.shape[1], 2, saved.context_digest))


# ------------------------------------------------------------------------------------------ the command
def test_the_command_audits_tabicls_file_on_the_tables_columns_and_heads_with_rows_rebuilt_and_median_cell_error(
        tmp_path, capsys):
    """``iclmem audit-context --attack file``: the classifier reads the table's own columns (wine: 13, no PCA); the
    folder holds the file and the control's, the table of rates and the verdict; TabICL's file saved as its docs
    recommend for privacy gives back every row's place and label, the control's file none, and the console's
    headline is the rows rebuilt and the median cell error; no row value reaches the table."""
    import json

    import pandas as pd

    from orchestrator.cli import main

    out = tmp_path / "file-audit"
    assert main(["audit-context", "wine", "--model", "tabicl", "--attack", "file", "--bootstrap", "100",
                 "--context-size", "30", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "GIVES BACK ITS ROWS (trusted)" in printed
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["features_read"] == "table_columns"
    assert verdict["n_features"] == verdict["n_columns"] == 13  # wine's 13 columns, each itself
    assert f"rebuilt: {verdict['rows_rebuilt']} of 30 rows within 0.1 std in every cell of the table's 13 columns, " \
           f"median cell error {verdict['median_cell_error_std']:.2g} std" in printed
    assert verdict["file_gives_back_its_rows"]
    assert verdict["predicts_as_fitted"]
    assert verdict["raw_rows_in_bytes"] == 0  # the package's claim, as far as the bytes go
    assert verdict["rows_identified"] == 1.0
    assert verdict["labels_recovered"] == 1.0
    assert verdict["rows_scored"] == 30
    # the file rebuilds rows no guess without it does, and its cells far closer
    assert verdict["rows_rebuilt"] > verdict["imputation_rows_rebuilt"]
    assert verdict["median_cell_error_std"] < verdict["imputation_median_cell_error_std"] / 5
    table = pd.read_parquet(out / "saved_file.parquet")
    control = table[(table["target"] == "never_in_context") & (table["measure"] == "cache_match")]
    assert (control.set_index("statistic").loc[["member_matched", "nonmember_matched"], "value"] == 0).all()
    assert set(table.select_dtypes("object").columns) <= {"config_hash", "target", "measure", "statistic"}
    assert sorted(p.name for p in (out / "saved").iterdir()) == ["audited", "control"]


def test_a_table_wider_than_the_package_is_refused_naming_the_limit_and_the_pca_flag(tmp_path, capsys, monkeypatch):
    from orchestrator.audits import inference_audit
    from orchestrator.cli import main

    monkeypatch.setattr(inference_audit, "file_feature_limit", lambda model: 12)
    out = tmp_path / "wide"
    assert main(["audit-context", "wine", "--model", "tabicl", "--attack", "file", "--context-size", "30",
                 "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "13 encoded feature columns, more than the 12" in err
    assert "--file-pca" in err
    assert not (out / "verdict.json").exists()


def test_the_error_is_per_table_column_a_one_hot_category_one_cell_and_pca_components_are_named_as_such():
    guess = np.zeros((2, 3))
    truth = np.array([[0.0, 0.5, 0.0], [0.0, 0.0, 0.0]])  # row 0: one of the category's two indicators off
    one_hot = sfat._errors(guess, truth, np.ones(3), sfat._column_groups(["a", "cat", "cat"], 3)[0])
    assert (one_hot.rows_rebuilt, one_hot.n_rows) == (1, 2)
    assert one_hot.cells_within == 3 / 4  # 2 rows x 2 columns, one cell off
    assert sfat._column_groups([None, None], 2)[1] == "component"
    assert sfat._column_groups(["a", "b"], 2)[1] == "column"


def test_the_file_attack_refuses_settings_that_are_not_its_own_before_any_work(tmp_path, capsys):
    from orchestrator.cli import main

    cases = [(["--model", "pfn-mini"], "the saved-file audit knows tabicl, tabpfn-v2"),
             (["--model", "tabicl", "--file-mode", "fit_with_cache"], "tabicl saves as one of kv, repr"),
             (["--estimator", "tests.audit_estimators:class_prior"], "--estimator and --sensitive are not its settings"),
             ]
    for i, (args, words) in enumerate(cases):
        out = tmp_path / f"refused{i}"
        assert main(["audit-context", "breast_cancer", "--attack", "file", *args, "--out", str(out)]) != 0
        assert words in capsys.readouterr().err
        assert not out.exists()
    out = tmp_path / "mode"
    assert main(["audit-context", "breast_cancer", "--model", "pfn-mini", "--file-mode", "kv", "--out", str(out)]) != 0
    assert "--file-mode is a setting of --attack file" in capsys.readouterr().err
    assert main(["audit-context", "breast_cancer", "--model", "pfn-mini", "--file-pca", "--out", str(out)]) != 0
    assert "--file-pca is a setting of --attack file" in capsys.readouterr().err
