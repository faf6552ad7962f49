"""The deployed-context audit (probes/attacks/context.py, orchestrator/audits/context_audit.py, `iclmem audit-context`):
planted context membership is found by every reference attack and the never-in-context control says
no_signal; an estimator that keeps nothing of a row gives no signal; bad settings are refused before any
work; the folder holds what the verdict rests on."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from iclmem.errors import ConfigError, ProbeError
from iclmem.runfolder import (
    CONTEXT_AUDIT_FILE,
    CONTEXT_ROC_FIGURE,
    CONTEXT_ROC_FILE,
    CONTEXT_SCORES_FILE,
    PROVENANCE_FILE,
    VERDICT_FILE,
    WANDB_DIR,
)
from iclmem.vocab import ContextAttack, ContextTarget, Outcome
from probes.attacks.context import ContextAuditInputs, audit_verdict, evaluate_context_audit, reference_contexts

N_CLASSES = 3


def _population(n_per_group: int, n_features: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = 2 * n_per_group
    y = np.tile(np.arange(N_CLASSES), n // N_CLASSES + 1)[:n]
    x = rng.normal(size=(n, n_features)).astype(np.float32) + y[:, None].astype(np.float32)
    member = np.zeros(n, dtype=bool)
    for c in range(N_CLASSES):  # label-matched: half of each class are members
        rows = rng.permutation(np.flatnonzero(y == c))
        member[rows[: len(rows) // 2]] = True
    return x, y, member


class PlantedMemorizer:
    """A scorer that keeps its context: a query identical to a context row gets that row's label with
    probability 0.9, any other query a smooth guess from its first feature (the same for every context)."""

    def __call__(self, context_x: np.ndarray, context_y: np.ndarray, query_x: np.ndarray) -> np.ndarray:
        guess = np.clip(np.rint(query_x[:, 0]), 0, N_CLASSES - 1).astype(int)
        p = np.full((len(query_x), N_CLASSES), 0.2 / (N_CLASSES - 1))
        p[np.arange(len(query_x)), guess] = 0.6
        p /= p.sum(axis=1, keepdims=True)
        keys = {row.tobytes(): label for row, label in zip(context_x, context_y, strict=True)}
        for i, row in enumerate(query_x):
            label = keys.get(row.tobytes())
            if label is not None:
                p[i] = 0.1 / (N_CLASSES - 1)
                p[i, label] = 0.9
        return np.log(p)


class ContextBlind:
    """A scorer whose prediction ignores the context entirely."""

    def __call__(self, context_x: np.ndarray, context_y: np.ndarray, query_x: np.ndarray) -> np.ndarray:
        logits = np.stack([-(query_x[:, 0] - c) ** 2 for c in range(N_CLASSES)], axis=1)
        return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def _inputs(n_per_group: int = 150) -> ContextAuditInputs:
    x, y, member = _population(n_per_group)
    rng = np.random.default_rng(99)
    control_y = y[member]
    control_x = (rng.normal(size=(n_per_group, x.shape[1])) + control_y[:, None]).astype(np.float32)
    return ContextAuditInputs(x, y, member, N_CLASSES, control_x, control_y)


def test_every_row_is_in_exactly_half_of_the_reference_contexts_and_each_holds_half_the_rows():
    masks = reference_contexts(300, 16, seed=3)
    assert masks.shape == (16, 300)
    assert (masks.sum(axis=0) == 8).all()
    assert (masks.sum(axis=1) == 150).all()
    assert not (masks[0] == masks[2]).all()
    with pytest.raises(ProbeError, match="even number"):
        reference_contexts(300, 15, seed=3)
    with pytest.raises(ProbeError, match="even number"):
        reference_contexts(300, 258, seed=3)


def test_planted_context_membership_is_found_by_every_reference_attack_and_the_control_says_no_signal():
    result = evaluate_context_audit(PlantedMemorizer(), _inputs(), n_references=16, seed=0, n_resamples=200,
                                    null_splits=3)
    for attack in (ContextAttack.CALIBRATED_LOSS, ContextAttack.LIRA_ONLINE, ContextAttack.LIRA_OFFLINE,
                   ContextAttack.RMIA):
        row = result.row(ContextTarget.DEPLOYED, attack)
        assert row["outcome"] == Outcome.MEMORIZATION.value, attack
        assert row["tpr_at_1pct_low"] > 0.3, (attack, row["tpr_at_1pct"])  # the planted effect is total
        assert row["null_memorization"] == 0, attack
    for row in result.rows_of(ContextTarget.CONTROL):
        assert row["outcome"] == Outcome.NO_SIGNAL.value, row["attack"]
        assert 0.35 < row["auc"] < 0.65, row["attack"]
    assert result.verdict.outcome == Outcome.MEMORIZATION
    assert result.verdict.trusted
    assert result.verdict.strongest in set(ContextAttack)
    assert len(result.scores[(ContextTarget.DEPLOYED.value, ContextAttack.RMIA.value)]) == 300


def test_a_scorer_that_ignores_its_context_gives_no_signal_under_every_attack():
    result = evaluate_context_audit(ContextBlind(), _inputs(), n_references=8, seed=1, n_resamples=200, null_splits=2)
    for row in result.rows:
        assert row["outcome"] == Outcome.NO_SIGNAL.value, (row["target"], row["attack"])
    # the statistics are identical under every context: the loss and LiRA scores do not depend on membership
    deployed = result.row(ContextTarget.DEPLOYED, ContextAttack.LOSS)
    control = result.row(ContextTarget.CONTROL, ContextAttack.LOSS)
    assert deployed["auc"] == pytest.approx(control["auc"])
    assert result.verdict.outcome == Outcome.NO_SIGNAL
    assert result.verdict.trusted


def test_a_control_false_alarm_or_a_separable_split_withholds_trust_from_the_verdict():
    rows = [{"target": "deployed", "attack": "loss", "outcome": "memorization", "tpr_at_1pct": 0.5, "auc": 0.9},
            {"target": "never_in_context", "attack": "loss", "outcome": "no_signal", "tpr_at_1pct": 0.0, "auc": 0.5}]
    assert audit_verdict(rows).trusted
    assert not audit_verdict(rows, exchangeable=False).trusted
    assert "blind baseline" in audit_verdict(rows, exchangeable=False).reason
    alarm = [rows[0], {**rows[1], "outcome": "memorization"}]
    verdict = audit_verdict(alarm)
    assert verdict.outcome == Outcome.MEMORIZATION
    assert not verdict.trusted
    assert "never-in-context control says memorization under loss" in verdict.reason
    assert not audit_verdict(rows[:1]).trusted  # no control run: not trusted either


# -- the command, on the shipped model and on scikit-learn estimators --------------------------------


def _cli(*args: str) -> int:
    from orchestrator.cli import main

    return main(["audit-context", *args])


@pytest.fixture(scope="module")
def pfn_mini_audit(tmp_path_factory):
    out = tmp_path_factory.mktemp("ctx") / "audit"
    code = _cli("digits", "--model", "pfn-mini", "--context-size", "128", "--references", "16", "--bootstrap", "200",
                "--null-splits", "3", "--out", str(out))
    assert code == 0
    return out


def test_pfn_mini_keeps_its_context_rows_findable_and_the_folder_holds_what_the_verdict_rests_on(pfn_mini_audit):
    out = pfn_mini_audit
    verdict = json.loads((out / VERDICT_FILE).read_text())
    assert verdict["outcome"] == "memorization"
    assert verdict["trusted"] is True
    table = pd.read_parquet(out / CONTEXT_AUDIT_FILE)
    lira = table[(table["target"] == "deployed") & (table["attack"] == "lira_online")].iloc[0]
    assert verdict["attacks"]["lira_online"]["epsilon_lb"] == pytest.approx(lira["epsilon_lb"])
    assert lira["epsilon_lb"] > 0  # a TPR far above the FPR proves some privacy loss
    assert len(table) == 2 * len(ContextAttack)
    deployed = table[table["target"] == "deployed"].set_index("attack")
    # measured here: LiRA online AUC 0.85, TPR@1% 0.20 (Clopper-Pearson lower bound 0.13): asserted with margin
    assert deployed.loc["lira_online", "auc_low"] > 0.7
    assert deployed.loc["lira_online", "tpr_at_1pct_low"] > 0.05  # five times the FPR, at the 95% lower bound
    assert (deployed.loc[["lira_online", "lira_offline", "rmia"], "outcome"] == "memorization").all()
    control = table[table["target"] == "never_in_context"]
    assert (control["outcome"] == "no_signal").all()
    assert control["auc"].between(0.35, 0.65).all()
    assert (table["context_size"] == 128).all()
    assert (table["n_members"] == 128).all()
    assert (table["n_nonmembers"] == 128).all()
    assert table["heldout_accuracy"].iloc[0] > 0.5  # digits under pfn-mini: a useful classifier
    scores = pd.read_parquet(out / CONTEXT_SCORES_FILE)
    assert len(scores) == 256
    assert scores["member"].sum() == 128
    assert scores["row_id"].is_unique
    assert set(scores.columns) >= {"row_id", "member", "deployed__lira_online", "never_in_context__rmia"}
    # the stored scores are the ones the table's AUC was computed from
    from probes.metrics import auc

    m = scores["member"].to_numpy()
    s = scores["deployed__lira_online"].to_numpy()
    assert auc(s[m], s[~m]) == pytest.approx(deployed.loc["lira_online", "auc"])
    roc = pd.read_parquet(out / CONTEXT_ROC_FILE)
    assert set(roc["attack"]) == {a.value for a in ContextAttack}
    assert (out / CONTEXT_ROC_FIGURE).stat().st_size > 10_000
    prov = json.loads((out / PROVENANCE_FILE).read_text())
    assert prov["kind"] == "audit"
    assert prov["config"]["references"] == 16
    assert prov["config_hash"] == table["config_hash"].iloc[0]


def test_the_same_audit_can_run_again_into_its_folder_and_another_is_refused(pfn_mini_audit, capsys):
    before = (pfn_mini_audit / PROVENANCE_FILE).read_text()
    code = _cli("digits", "--model", "pfn-mini", "--context-size", "128", "--references", "18", "--bootstrap", "200",
                "--null-splits", "3", "--out", str(pfn_mini_audit))
    assert code == 2
    assert "holds the audit of another set of settings" in capsys.readouterr().err
    assert (pfn_mini_audit / PROVENANCE_FILE).read_text() == before


def test_a_forest_estimator_is_audited_as_deployed_and_a_class_prior_gives_no_signal(tmp_path):
    forest, prior = tmp_path / "forest", tmp_path / "prior"
    common = ["--context-size", "96", "--references", "8", "--bootstrap", "200", "--null-splits", "2"]
    assert _cli("digits", "--estimator", "audit_estimators:forest", *common, "--out", str(forest)) == 0
    assert _cli("digits", "--estimator", "audit_estimators:class_prior", *common, "--out", str(prior)) == 0
    t = pd.read_parquet(forest / CONTEXT_AUDIT_FILE).set_index(["target", "attack"])
    assert t.loc[("deployed", "rmia"), "auc_low"] > 0.8  # measured 0.99 at N = 128
    assert t.loc[("deployed", "rmia"), "outcome"] == "memorization"
    assert (t.xs("never_in_context")["outcome"] == "no_signal").all()
    p = pd.read_parquet(prior / CONTEXT_AUDIT_FILE)
    assert (p["outcome"] == "no_signal").all()
    assert json.loads((prior / VERDICT_FILE).read_text())["outcome"] == "no_signal"


@pytest.mark.parametrize(("args", "message"), [
    (["--estimator", "no_such_module_xyz:f"], "module 'no_such_module_xyz' cannot be imported"),
    (["--estimator", "audit_estimators:missing"], "has no callable 'missing'"),
    (["--estimator", "audit_estimators:not_a_classifier"], "without fit and predict_proba"),
    (["--estimator", "sklearn.linear_model"], "give MODULE:FACTORY"),
    (["--model", "pfn-mini", "--references", "15"], "--references 15: an even number"),
    (["--model", "pfn-mini", "--bootstrap", "3"], "--bootstrap 3"),
])
def test_bad_settings_are_refused_naming_the_flag_before_any_folder_is_written(tmp_path, capsys, args, message):
    out = tmp_path / "never"
    assert _cli("digits", *args, "--out", str(out)) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_folder_of_someone_elses_files_is_refused_and_left_untouched(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert _cli("digits", "--model", "pfn-mini", "--references", "8", "--out", str(out)) == 2
    assert "not empty and not an iclmem audit folder" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "keep me"


def test_model_and_estimator_are_one_or_the_other(tmp_path):
    with pytest.raises(SystemExit) as exc:
        _cli("digits", "--model", "pfn-mini", "--estimator", "audit_estimators:forest", "--out", str(tmp_path / "x"))
    assert exc.value.code == 2
    from orchestrator.audits.context_audit import audit_context

    with pytest.raises(ConfigError, match="not both"):
        audit_context("digits", out=str(tmp_path / "y"))


def test_a_table_too_small_for_a_control_still_audits_but_withholds_trust(tmp_path):
    """iris (150 rows): N = 40 members and 40 non-members leave too few rows for a 40-row control."""
    out = tmp_path / "iris"
    assert _cli("iris", "--model", "pfn-mini", "--context-size", "40", "--references", "4", "--bootstrap", "200",
                "--null-splits", "0", "--out", str(out)) == 0
    verdict = json.loads((out / VERDICT_FILE).read_text())
    assert verdict["trusted"] is False
    assert "no never-in-context control" in verdict["reason"]
    assert set(pd.read_parquet(out / CONTEXT_AUDIT_FILE)["target"]) == {"deployed"}


def _audit_package_classifier(tmp_path, monkeypatch, attribute: str, checkpoint, factory: str):
    """Point ``audit_estimators.<attribute>`` at a written checkpoint and audit ``audit_estimators:<factory>``
    (N = 64, K = 4): (folder, table), both targets present."""
    import audit_estimators

    monkeypatch.setattr(audit_estimators, attribute, str(checkpoint))
    out = tmp_path / factory
    assert _cli("digits", "--estimator", f"audit_estimators:{factory}", "--context-size", "64", "--references", "4",
                "--bootstrap", "200", "--null-splits", "1", "--out", str(out)) == 0
    table = pd.read_parquet(out / CONTEXT_AUDIT_FILE)
    assert set(table["target"]) == {"deployed", "never_in_context"}
    return out, table


def test_tabpfns_own_fitted_classifier_is_audited_as_deployed_through_the_estimator_path(tmp_path, monkeypatch):
    """TabPFNClassifier (its preprocessing and ensemble) on a tiny random checkpoint in tabpfn's format: the
    audit fits it on every context and scores predict_proba; random weights keep nothing of a row, so every
    attack says no_signal on both targets."""
    pytest.importorskip("tabpfn", reason="tabpfn is not installed (pip install -e '.[tabpfn]')")
    from tabpfn.checkpoint import save_as_safetensors

    from trainables.models import build_model

    model = build_model("tabpfn-v2", weights="random", emsize=16, nlayers=1, nhead=2, seed=4)
    path = tmp_path / "tiny-tabpfn-v2-classifier.safetensors"
    save_as_safetensors({"config": model.options["config"], "state_dict": dict(model.module.state_dict())}, path)
    out, table = _audit_package_classifier(tmp_path, monkeypatch, "TABPFN_CHECKPOINT", path, "tabpfn_classifier")
    assert (table["outcome"] == "no_signal").all()
    verdict = json.loads((out / VERDICT_FILE).read_text())
    assert verdict["outcome"] == "no_signal"
    assert verdict["trusted"] is True
    assert json.loads((out / PROVENANCE_FILE).read_text())["config"]["estimator"] == \
        "audit_estimators:tabpfn_classifier"


def test_a_table_too_small_for_the_context_size_is_refused_naming_it_and_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "never"
    assert _cli("iris", "--model", "pfn-mini", "--context-size", "256", "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert "--context-size 256 needs 2 x 256 rows of iris" in err
    assert "only 149 remain" in err
    assert not out.exists()


def test_a_real_carte_table_with_text_columns_is_audited_and_its_control_says_no_signal(tmp_path):
    from conftest import CARTE_DIR

    if not (CARTE_DIR / "spotify.parquet").is_file():
        pytest.skip(f"the CARTE tables are not at {CARTE_DIR} (../shared beside the clone)")
    out = tmp_path / "spotify"
    assert _cli(f"{CARTE_DIR}:spotify", "--model", "pfn-mini", "--references", "32", "--bootstrap", "200",
                "--null-splits", "2", "--out", str(out)) == 0
    table = pd.read_parquet(out / CONTEXT_AUDIT_FILE).set_index(["target", "attack"])
    # measured here: LiRA and RMIA AUC 0.75-0.79 on the deployed context, the control 0.44-0.54
    assert (table.xs("deployed").loc[["lira_online", "lira_offline", "rmia"], "auc_low"] > 0.6).all()
    assert (table.xs("never_in_context")["outcome"] == "no_signal").all()
    assert json.loads((out / VERDICT_FILE).read_text())["trusted"] is True


def test_the_audit_logged_to_wandb_offline_holds_its_verdict_and_metrics_and_no_row_of_the_table(tmp_path,
                                                                                                 monkeypatch):
    from shared_sweep import CANARY, canary_table
    from synthetic_run_dir import read_wandb_records, wandb_config, wandb_summary

    monkeypatch.setenv("WANDB_SILENT", "true")
    table_file = canary_table(tmp_path / "patients.csv")
    out = tmp_path / "audit"
    assert _cli(f"{table_file}:target", "--model", "pfn-mini", "--context-size", "96", "--references", "4",
                "--bootstrap", "200", "--null-splits", "1", "--out", str(out), "--wandb", "offline") == 0
    logs = sorted((out / WANDB_DIR).glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1
    records = read_wandb_records(logs[0])
    summary, config = wandb_summary(records), wandb_config(records)
    verdict = json.loads((out / VERDICT_FILE).read_text())
    table = pd.read_parquet(out / CONTEXT_AUDIT_FILE)
    assert summary["verdict/outcome"] == verdict["outcome"]
    assert summary["verdict/trusted"] == verdict["trusted"]
    for row in table.itertuples():
        assert summary[f"{row.target}/{row.attack}/auc"] == pytest.approx(row.auc)
        assert summary[f"{row.target}/{row.attack}/outcome"] == row.outcome
    assert summary["context_audit"]["nrows"] == len(table)
    assert config["references"] == 4
    assert "task" not in config  # the file's path stays in the folder; the audit is named by the task's name
    assert config["audit_name"] == "context-patients"
    assert config["audit"] == "context"
    for path in (out / WANDB_DIR).rglob("*"):
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path
            assert str(table_file).encode() not in path.read_bytes(), path


def test_tabicls_own_fitted_classifier_is_audited_as_deployed_and_its_control_says_no_signal(tmp_path, monkeypatch):
    """TabICLClassifier (its ensemble) on a tiny random checkpoint in tabicl's format. Random attention can
    still favour a query's identical context row, so only the control is asserted: rows never in any
    context it was given get no membership verdict under any attack."""
    pytest.importorskip("tabicl", reason="tabicl is not installed (pip install -e '.[tabicl]')")
    import torch

    from trainables.models import build_model

    model = build_model("tabicl", weights="random", seed=4, embed_dim=16, col_num_blocks=1, col_nhead=2, col_num_inds=8,
                        row_num_blocks=1, row_nhead=2, row_num_cls=2, icl_num_blocks=1, icl_nhead=2, zero_init=False)
    path = tmp_path / "tiny-tabicl-classifier.ckpt"
    torch.save({"config": model.options["config"], "state_dict": model.module.state_dict()}, path)
    _, table = _audit_package_classifier(tmp_path, monkeypatch, "TABICL_CHECKPOINT", path, "tabicl_classifier")
    assert (table[table["target"] == "never_in_context"]["outcome"] == "no_signal").all()
    assert table["heldout_accuracy"].between(0, 1).all()


def test_two_disjoint_reference_sets_each_hold_every_row_in_half_of_their_contexts():
    from probes.attacks.context import ReferenceScores, reference_contexts

    masks = reference_contexts(40, 6, seed=3)
    refs = ReferenceScores(np.random.default_rng(0).normal(size=masks.shape), masks, seconds=6.0)
    first, second = refs.halves()
    assert (first.log_p.shape[0], second.log_p.shape[0]) == (2, 4)
    for half in (first, second):
        assert (half.in_reference.sum(axis=0) == half.in_reference.shape[0] // 2).all()
    np.testing.assert_array_equal(np.concatenate([first.log_p, second.log_p]), refs.log_p)
    assert ReferenceScores(refs.log_p[:2], masks[:2], 2.0).halves() is None  # one pair cannot be split
