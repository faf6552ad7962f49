"""`iclmem probe`: audit a single checkpoint against the base model, no sweep and no Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from iclmem.errors import ConfigError, DataError
from orchestrator.audits.audit import audit_checkpoint, parse_task
from trainables.data import TaskSource, prepare_task
from trainables.finetune import Finetuner, FinetuneSpec
from trainables.models.embedded import SHIPPED_WEIGHTS

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def memorizing_checkpoint(tmp_path_factory):
    # digits (10 classes: a permutation leaves ~90% of the member labels wrong): under label-matched
    # non-members the planted signal has margin (seeds 0-2: AUC 0.75-0.86, interval from 0.69, TPR@10%
    # 0.33-0.53, p <= 3e-10), where breast_cancer's binary labels gave AUC 0.70 with TPR@10% 0.04-0.14
    task = prepare_task(TaskSource("digits", "builtin"), label_mode="shuffled_members", seed=0, q=100, context_size=100)
    finetuner = Finetuner(FinetuneSpec(lr=3e-3, epochs=60, seed=0), [task])
    finetuner.train()
    return finetuner.save(tmp_path_factory.mktemp("ckpt") / "e60"), task


def test_task_specs_name_builtin_carte_and_file_sources():
    assert parse_task("iris") == TaskSource("iris", "builtin")
    assert parse_task("data/carte:spotify") == TaskSource("spotify", "carte", "data/carte")
    assert parse_task("x/t.csv:label") == TaskSource("t", "table", "x/t.csv", "label")


@pytest.mark.slow  # fine-tunes (`make test-fast` leaves it out)
def test_auditing_a_memorizing_checkpoint_finds_memorization(memorizing_checkpoint, tmp_path):
    checkpoint, _ = memorizing_checkpoint
    row = audit_checkpoint(str(checkpoint), "digits", label_mode="shuffled_members", bootstrap=200, q=100,
                           context_size=100, out=str(tmp_path / "audit"))
    assert row["outcome"] == "memorization"
    assert row["auc"] > 0.6
    assert json.loads((tmp_path / "audit" / "verdict.json").read_text())["outcome"] == "memorization"


@pytest.mark.slow  # fine-tunes (`make test-fast` leaves it out)
def test_external_member_ids_give_the_same_members_as_the_ground_truth_log(memorizing_checkpoint, tmp_path):
    checkpoint, task = memorizing_checkpoint
    ids = tmp_path / "members.txt"
    ids.write_text("\n".join(f"{r},{task.class_names[y]}" for r, y in zip(task.row_ids[task.member_idx],
                                                                         task.labels[task.member_idx])))
    row = audit_checkpoint(str(checkpoint), "digits", label_mode="shuffled_members", bootstrap=100, q=100,
                           context_size=100, members=str(ids), out=str(tmp_path / "audit"))
    assert row["n_members"] == 100
    assert row["outcome"] == "memorization"
    assert row["exchangeable"]
    assert row["blind_auc_low"] <= 0.5 <= row["blind_auc_high"]


def test_external_members_of_a_shuffled_run_without_their_trained_labels_are_refused(memorizing_checkpoint, tmp_path):
    """Scoring members on their table labels when they were trained on permuted ones would measure them
    against the wrong answer: the file must give each row's trained label, else the audit stops early."""
    checkpoint, task = memorizing_checkpoint
    ids = tmp_path / "members.txt"
    ids.write_text("\n".join(str(r) for r in task.row_ids[task.member_idx]))
    with pytest.raises(ConfigError, match=r"gives none: add each row's trained label .*ROW_ID,LABEL"):
        audit_checkpoint(str(checkpoint), "digits", label_mode="shuffled_members", bootstrap=100, q=100,
                         context_size=100, members=str(ids), out=str(tmp_path / "audit"))
    assert not (tmp_path / "audit" / "verdict.json").exists()
    mixed = tmp_path / "mixed.txt"
    mixed.write_text(f"{task.row_ids[task.member_idx[0]]},3\n{task.row_ids[task.member_idx[1]]}\n")
    with pytest.raises(DataError, match="some lines give a trained label and others do not"):
        audit_checkpoint(str(checkpoint), "digits", label_mode="shuffled_members", members=str(mixed))


@pytest.mark.slow  # a CLI audit (`make test-fast` leaves it out)
def test_the_untouched_base_weights_audit_as_no_signal_through_the_cli(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "probe", str(SHIPPED_WEIGHTS), "--task", "iris", "--q", "30",
         "--context-size", "60", "--bootstrap", "50", "--out", str(tmp_path / "a")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout[out.stdout.index("{"):])
    assert verdict["outcome"] == "no_signal"
    assert verdict["auc"] == 0.5


def test_a_missing_checkpoint_is_refused_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="nope"):
        audit_checkpoint(str(tmp_path / "nope"), "iris")
