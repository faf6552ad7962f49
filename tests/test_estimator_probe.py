"""The black-box probe (`iclmem probe --estimator`): a deployed classifier is scored from fit / predict_proba
alone, each probe context one fit; rows memorized in its "weights" are found against label-matched
non-members, and the same classifier holding other rows gets no membership verdict."""

from __future__ import annotations

import json

import audit_estimators
import numpy as np
import pytest

from orchestrator.cli import main

TASK = "digits"
N_MEMBERS = 20
COMMON = ["--task", TASK, "--base-estimator", "audit_estimators:centroid", "--bootstrap", "200"]


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """The task as the audit prepares it around a members file: (members file, prepared task)."""
    from iclmem.vocab import LabelDesign
    from orchestrator.audits.audit import DEFAULTS, with_members
    from trainables.data import PrepSettings, TaskSource, load_or_prepare

    root = tmp_path_factory.mktemp("bb")
    first = load_or_prepare(TaskSource(TASK, "builtin"),
                            PrepSettings(context_size=DEFAULTS["context_size"], label_design=LabelDesign.MATCHED.value),
                            "normal", 0, q=N_MEMBERS)
    ids = np.asarray(first.row_ids)[np.asarray(first.member_idx)]
    members = root / "members.txt"
    members.write_text("\n".join(str(int(i)) for i in ids) + "\n")
    task = with_members(first, ids, 0, source=str(members))
    return members, task


def _audit(tmp_path, members, memorized_rows, memorized_labels, monkeypatch) -> dict:
    monkeypatch.setattr(audit_estimators, "MEMORIZED", (memorized_rows, memorized_labels))
    out = tmp_path / "audit"
    assert main(["probe", "--estimator", "audit_estimators:memorizer", *COMMON, "--members", str(members),
                 "--out", str(out)]) == 0
    return json.loads((out / "verdict.json").read_text())


def test_rows_memorized_by_a_deployed_classifier_are_found_from_its_probabilities(tmp_path, split, monkeypatch):
    members, task = split
    rows = np.asarray(task.features)[np.asarray(task.member_idx)]
    labels = np.asarray(task.labels)[np.asarray(task.member_idx)]
    row = _audit(tmp_path, members, rows, labels, monkeypatch)
    assert row["outcome"] == "memorization"
    assert row["auc_low"] > 0.8  # memorized rows are scored 0.9 on their label wherever a probe context keeps them
    assert row["model"] == "estimator"
    assert row["n_members"] == N_MEMBERS
    assert row["exchangeable"] is True
    prov = json.loads((tmp_path / "audit" / "provenance.json").read_text())
    assert prov["config"]["estimator"] == "audit_estimators:memorizer"


def test_the_same_classifier_holding_rows_it_was_never_audited_on_gets_no_membership_verdict(tmp_path, split,
                                                                                            monkeypatch):
    """The control: it memorized C' (rows that are neither members nor non-members), so it saw no audited row."""
    members, task = split
    context = np.asarray(task.context_idx)
    row = _audit(tmp_path, members, np.asarray(task.features)[context], np.asarray(task.labels)[context], monkeypatch)
    assert row["outcome"] == "no_signal"
    assert 0.3 < row["auc"] < 0.7


@pytest.mark.parametrize(("args", "message"), [
    (["--estimator", "audit_estimators:centroid", "--task", TASK, "--members", "m.txt"], "missing: --base-estimator"),
    (["ckpt", "--estimator", "audit_estimators:centroid", *COMMON, "--members", "m.txt"], "takes no CHECKPOINT"),
    (["--base-estimator", "audit_estimators:centroid", "--task", TASK], "give a CHECKPOINT"),
    (["--estimator", "nope_xyz:f", *COMMON, "--members", "MEMBERS"], "--estimator nope_xyz:f: module 'nope_xyz'"),
])
def test_black_box_flags_are_checked_before_any_work(tmp_path, split, capsys, args, message):
    members, _ = split
    args = [str(members) if a == "MEMBERS" else a for a in args]
    assert main(["probe", *args, "--out", str(tmp_path / "never")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


@pytest.fixture(scope="module")
def shuffled_split(tmp_path_factory, split):
    """The same members trained on permuted labels: a ROW_ID,LABEL file and the task as the audit re-splits it."""
    from orchestrator.audits.audit import with_members

    _, task = split
    root = tmp_path_factory.mktemp("bb-shuffled")
    ids = np.asarray(task.row_ids)[np.asarray(task.member_idx)]
    labels = np.asarray(task.labels)[np.asarray(task.member_idx)]
    trained = np.random.default_rng(7).permutation(labels)
    names = [task.class_names[int(v)] for v in trained]
    members = root / "members.txt"
    members.write_text("".join(f"{int(i)},{n}\n" for i, n in zip(ids, names, strict=True)))
    from iclmem.vocab import LabelDesign
    from orchestrator.audits.audit import DEFAULTS
    from trainables.data import PrepSettings, TaskSource, load_or_prepare

    first = load_or_prepare(TaskSource(TASK, "builtin"),
                            PrepSettings(context_size=DEFAULTS["context_size"], label_design=LabelDesign.MATCHED.value),
                            "shuffled_members", 0, q=N_MEMBERS)
    return members, with_members(first, ids, 0, source=str(members), member_labels=names)


@pytest.mark.parametrize("memorized", ["members", "context"])
def test_under_shuffled_member_labels_memorized_members_are_found_and_other_rows_are_not(
        tmp_path, shuffled_split, monkeypatch, memorized):
    """The other label mode: members trained on permuted labels (given in the members file), non-members on
    labels permuted the same way (label-matched). A classifier holding the members with their trained labels
    is found; holding C' instead, it gets no membership verdict."""
    members, task = shuffled_split
    rows = np.asarray(task.member_idx if memorized == "members" else task.context_idx)
    monkeypatch.setattr(audit_estimators, "MEMORIZED", (np.asarray(task.features)[rows], np.asarray(task.labels)[rows]))
    out = tmp_path / "audit"
    assert main(["probe", "--estimator", "audit_estimators:memorizer", *COMMON, "--members", str(members),
                 "--label-mode", "shuffled_members", "--out", str(out)]) == 0
    row = json.loads((out / "verdict.json").read_text())
    assert row["label_mode"] == "shuffled_members"
    assert row["exchangeable"] is True
    if memorized == "members":
        assert row["outcome"] == "memorization"
        assert row["auc_low"] > 0.8
    else:
        assert row["outcome"] == "no_signal"
        assert 0.3 < row["auc"] < 0.7
