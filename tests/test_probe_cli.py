"""`iclmem probe` made safe: it audits the split an iclmem checkpoint records and refuses flags that
contradict it, refuses too few bootstrap resamples, writes strict JSON, keys its caches by the member set,
and answers bad members files, foreign weights and non-checkpoint folders with clear errors (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from iclmem.atomic import write_json_atomic
from iclmem.errors import CheckpointError, ConfigError, DataError
from iclmem.runfolder import GROUND_TRUTH_FILE, VERDICT_FILE
from orchestrator.audits.audit import audit_checkpoint
from trainables.data import TaskSource, ground_truth_log, prepare_task
from trainables.finetune import MODEL_FILE, Finetuner, FinetuneSpec
from trainables.models.embedded import SHIPPED_WEIGHTS

REPO = Path(__file__).resolve().parents[1]
IRIS = {"q": 20, "context_size": 30}  # the split of the plain checkpoint below, which records none


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", WANDB_MODE="disabled")
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "probe", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def _no_nan_constants(name: str) -> None:
    raise AssertionError(f"bare {name} in JSON")


def _sweep_checkpoint(folder: Path, lr: float, epochs: int) -> Path:
    """A checkpoint folder as a sweep writes it: Finetuner.save's files and, beside them, the trainable's
    ground-truth log; label-shuffled members of breast_cancer (Q 50, context 128)."""
    task = prepare_task(TaskSource("breast_cancer", "builtin"), label_mode="shuffled_members", seed=0, q=50,
                        context_size=128)
    finetuner = Finetuner(FinetuneSpec(lr=lr, epochs=epochs, seed=0), [task])
    finetuner.train()
    folder = finetuner.save(folder)
    write_json_atomic(folder / GROUND_TRUTH_FILE, {"run_id": "r", "regime": "single_fixed",
                                                   "tasks": [ground_truth_log(task)]})
    return folder


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return _sweep_checkpoint(tmp_path_factory.mktemp("recorded") / "e1", 1e-3, 1)


@pytest.fixture(scope="module")
def memorized(tmp_path_factory):
    # 10 AdamW steps at 3e-3 memorize the shuffled labels (AUC about 0.74, interval above 0.6)
    return _sweep_checkpoint(tmp_path_factory.mktemp("memorized") / "e10", 3e-3, 10)


@pytest.fixture(scope="module")
def memorized_audit(memorized, tmp_path_factory):
    out = tmp_path_factory.mktemp("audit")
    proc = _cli(str(memorized), "--bootstrap", "50", "--out", str(out))
    return proc, out


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A checkpoint folder written by Finetuner.save alone (no ground-truth log), and its task."""
    task = prepare_task(TaskSource("iris", "builtin"), seed=0, q=20, context_size=30)
    finetuner = Finetuner(FinetuneSpec(lr=1e-3, epochs=2, seed=0), [task])
    finetuner.train()
    return finetuner.save(tmp_path_factory.mktemp("plain") / "e2"), task


# ------------------------------------------------------------------------------- the recorded split
@pytest.mark.slow  # fine-tunes to memorization, then audits through the command line (over 30 s here)
def test_a_memorized_checkpoint_probed_with_no_flags_gets_the_verdict_of_its_own_split(memorized_audit):
    proc, out = memorized_audit
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout[proc.stdout.index("{"):])
    # with the defaults (normal labels) instead of the recorded shuffled ones this came out as "collapse"
    assert verdict["outcome"] == "memorization"
    assert verdict["auc"] > 0.6
    row = json.loads((out / VERDICT_FILE).read_text())
    assert (row["task"], row["label_mode"], row["q"], row["n_members"]) == ("breast_cancer", "shuffled_members", 50, 50)
    assert ".py:" not in proc.stderr  # Python warnings in one line, without their source path


@pytest.mark.slow  # reads the audit above
def test_the_verdict_file_is_strict_json_with_null_for_undefined_numbers(memorized_audit):
    _, out = memorized_audit
    text = (out / VERDICT_FILE).read_text()
    row = json.loads(text, parse_constant=_no_nan_constants)  # NaN / Infinity are not JSON
    assert row["lr"] is None  # an external checkpoint has no learning rate: null, not NaN


@pytest.mark.parametrize(("flags", "message"), [
    ({"label_mode": "normal"}, r"--label-mode normal conflicts .*records label_mode shuffled_members"),
    ({"q": 30}, r"--q 30 conflicts .*records q 50"),
    ({"seed": 3}, r"--seed 3 conflicts .*records seed 0"),
    ({"context_size": 60}, r"--context-size 60 conflicts .*64 rows per class \(128 rows\)"),
    ({"base_model": "tabicl"}, r"--base-model tabicl conflicts .*checkpoint.json records base_model pfn-mini"),
    ({"task": "iris"}, r"--task iris conflicts .*records task breast_cancer"),
])
def test_a_flag_that_contradicts_the_checkpoint_is_refused_naming_both_values(recorded, tmp_path, flags, message):
    with pytest.raises(ConfigError, match=message):
        audit_checkpoint(str(recorded), out=str(tmp_path / "a"), bootstrap=50, **flags)
    assert not (tmp_path / "a").exists()  # refused before any work


def test_the_command_line_refuses_a_conflicting_flag_with_exit_2(recorded, tmp_path):
    proc = _cli(str(recorded), "--label-mode", "shuffled_all", "--out", str(tmp_path / "a"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "--label-mode shuffled_all conflicts" in proc.stderr
    assert "shuffled_members" in proc.stderr


# ------------------------------------------------------------------------------- settings
@pytest.mark.parametrize("value", ["-5", "0", "9"])
def test_bootstrap_below_the_schema_minimum_is_refused(plain, tmp_path, value):
    folder, _ = plain
    proc = _cli(str(folder), "--task", "iris", "--bootstrap", value, "--out", str(tmp_path / "a"))
    assert proc.returncode == 2
    assert f"--bootstrap {value}: at least 10 resamples" in proc.stderr
    assert not (tmp_path / "a").exists()


def test_bootstrap_above_the_schema_maximum_is_refused_before_any_work(tmp_path, capsys):
    from orchestrator.cli import main
    from orchestrator.schema.config_base import MAX_BOOTSTRAP

    too_many = str(MAX_BOOTSTRAP + 1)
    assert main(["probe", str(tmp_path / "no-such-checkpoint"), "--task", "iris", "--bootstrap", too_many,
                 "--out", str(tmp_path / "a")]) == 2
    assert f"--bootstrap {too_many}: at most {MAX_BOOTSTRAP} resamples" in capsys.readouterr().err
    assert main(["audit-context", "iris", "--model", "pfn-mini", "--bootstrap", too_many,
                 "--out", str(tmp_path / "b")]) == 2
    assert f"--bootstrap {too_many}: at most {MAX_BOOTSTRAP} resamples" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "b").exists()


def test_an_unknown_label_mode_is_refused_with_the_enums_choices(plain):
    folder, _ = plain
    proc = _cli(str(folder), "--task", "iris", "--label-mode", "bogus")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "invalid choice: 'bogus' (choose from 'normal', 'shuffled_members', 'shuffled_all')" in proc.stderr


# ------------------------------------------------------------------------------- members and caches
def _ids(path: Path, ids) -> Path:
    path.write_text("\n".join(str(int(i)) for i in ids) + "\n")
    return path


def test_a_second_probe_with_other_members_does_not_reuse_the_first_ones_cached_scores(plain, tmp_path):
    folder, task = plain
    first = _ids(tmp_path / "first.txt", task.row_ids[task.member_idx])
    second = _ids(tmp_path / "second.txt", task.row_ids[task.nonmember_idx])  # other rows entirely
    shared, fresh = tmp_path / "shared", tmp_path / "fresh"
    audit_checkpoint(str(folder), "iris", bootstrap=20, members=str(first), out=str(shared), **IRIS)
    reused = audit_checkpoint(str(folder), "iris", bootstrap=20, members=str(second), out=str(shared), **IRIS)
    alone = audit_checkpoint(str(folder), "iris", bootstrap=20, members=str(second), out=str(fresh), **IRIS)
    for key in ("auc", "auc_low", "auc_high", "loss_ratio", "n_members", "outcome"):
        assert reused[key] == alone[key], key
    assert len(list((shared / "reference").iterdir())) > len(list((fresh / "reference").iterdir()))


@pytest.mark.parametrize(("content", "message"), [
    ("12\n7x\n", r"members.txt:2: '7x' is not an integer row id"),
    ("12\n\n40\n12\n", r"members.txt:4: row id 12 is given twice \(first on line 1\)"),
    ("", r"members.txt: holds no member row ids"),
    ("# only a comment\n\n", r"members.txt: holds no member row ids"),
    ("3\n-4\n", r"members.txt:2: row id -4 is negative"),
])
def test_a_bad_members_file_is_refused_naming_the_file_and_line(plain, tmp_path, content, message):
    folder, _ = plain
    members = tmp_path / "members.txt"
    members.write_text(content)
    with pytest.raises(DataError, match=message):
        audit_checkpoint(str(folder), "iris", members=str(members), out=str(tmp_path / "a"))


def test_a_missing_members_file_is_refused_on_the_command_line_without_a_traceback(plain, tmp_path):
    folder, _ = plain
    proc = _cli(str(folder), "--task", "iris", "--members", str(tmp_path / "nope.txt"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"members file not found: {tmp_path / 'nope.txt'}" in proc.stderr


# ------------------------------------------------------------------------------- checkpoints and weights
def test_an_empty_folder_is_not_a_checkpoint(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError) as caught:
        audit_checkpoint(str(empty), "iris")
    assert str(caught.value) == f"{empty}: not an iclmem checkpoint folder (no checkpoint.json) and not a weights file"
    proc = _cli(str(empty), "--task", "iris")
    assert proc.returncode == 2
    assert "not an iclmem checkpoint folder (no checkpoint.json)" in proc.stderr


def _foreign_weights(tmp_path: Path) -> dict[str, Path]:
    from safetensors.torch import save_file

    from trainables.models import build_model

    other_shape = build_model("pfn-mini", weights="random", d_model=64, d_ff=128)
    paths = {"another shape": tmp_path / "narrow.safetensors", "another model": tmp_path / "other.safetensors"}
    save_file({k: v.contiguous() for k, v in other_shape.module.state_dict().items()}, str(paths["another shape"]))
    save_file({"encoder.weight": torch.zeros(3, 3)}, str(paths["another model"]))
    return paths


def test_weights_of_another_model_or_shape_are_a_checkpoint_error_not_a_torch_traceback(tmp_path):
    for weights in _foreign_weights(tmp_path).values():
        with pytest.raises(CheckpointError, match=rf"{weights}: not fine-tuned weights of model 'pfn-mini'"):
            audit_checkpoint(str(weights), "iris", out=str(tmp_path / "a"), **IRIS)
    proc = _cli(str(weights), "--task", "iris", "--q", "20", "--context-size", "30", "--out", str(tmp_path / "b"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "not fine-tuned weights" in proc.stderr


def test_base_weights_name_the_base_models_file(plain, tmp_path):
    folder, _ = plain
    # the recorded base (pfn-mini's shipped weights), given as a file: the same audit as without the flag
    given = audit_checkpoint(str(folder), "iris", base_weights=str(SHIPPED_WEIGHTS), bootstrap=20,
                             out=str(tmp_path / "given"), **IRIS)
    recorded = audit_checkpoint(str(folder), "iris", bootstrap=20, out=str(tmp_path / "recorded"), **IRIS)
    assert (given["auc"], given["loss_ratio"], given["outcome"]) == (
        recorded["auc"], recorded["loss_ratio"], recorded["outcome"])
    wrong = _foreign_weights(tmp_path)["another shape"]
    with pytest.raises(CheckpointError, match=rf"{wrong}: not base weights of model 'pfn-mini'"):
        audit_checkpoint(str(folder), "iris", base_weights=str(wrong), out=str(tmp_path / "w"), **IRIS)
    # a real model whose weights this machine lacks (TabICL) is given them the same way
    proc = _cli(str(folder / MODEL_FILE), "--task", "iris", "--base-model", "tabicl", "--base-weights",
                str(tmp_path / "tabicl-v1.ckpt"))
    assert proc.returncode == 2
    assert f"--base-weights {tmp_path / 'tabicl-v1.ckpt'}: file not found" in proc.stderr


# ------------------------------------------------------------------------------- the audit folder (#34)
def _digests(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_probe_never_writes_among_a_users_files_or_over_their_verdict(recorded, tmp_path):
    users = tmp_path / "mine"
    users.mkdir()
    (users / VERDICT_FILE).write_text('{"my": "own verdict"}')
    (users / "notes.txt").write_text("keep")
    before = _digests(users)
    with pytest.raises(ConfigError, match="not empty and not an iclmem audit folder"):
        audit_checkpoint(str(recorded), out=str(users))
    assert _digests(users) == before
    a_file = tmp_path / "a-file"
    a_file.write_text("keep")
    proc = _cli(str(recorded), "--out", str(a_file))
    assert proc.returncode == 2
    assert f"--out {a_file} is a file" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert a_file.read_text() == "keep"


def test_an_audit_folder_takes_a_new_audit_of_its_own_checkpoint_only(recorded, plain, tmp_path):
    from orchestrator.report.folder_claims import record_sweep
    from orchestrator.schema.config import parse_sweep

    out = tmp_path / "audit"
    first = audit_checkpoint(str(recorded), bootstrap=20, out=str(out))
    again = audit_checkpoint(str(recorded), bootstrap=20, out=str(out))  # the same checkpoint: its verdict anew
    assert again["auc"] == first["auc"]
    assert json.loads((out / "provenance.json").read_text())["kind"] == "audit"
    before = _digests(out)
    with pytest.raises(ConfigError, match=r"holds the audit of another checkpoint"):
        audit_checkpoint(str(plain[0]), "iris", bootstrap=20, out=str(out), **IRIS)
    assert _digests(out) == before
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record_sweep(run_dir, parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "wandb": {"mode": "disabled"}}))
    with pytest.raises(ConfigError, match="is an iclmem run folder"):
        audit_checkpoint(str(recorded), out=str(run_dir))


def test_a_table_task_without_its_target_is_named_as_such(plain, tmp_path):
    proc = _cli(str(plain[0]), "--task", "rows.csv", "--out", str(tmp_path / "a"))
    assert proc.returncode == 2
    assert "--task rows.csv: a table needs its target column after a colon" in proc.stderr


def test_a_checkpoint_of_a_table_task_asks_for_its_table_and_audits_it_under_another_file_name(tmp_path):
    from sklearn.datasets import load_iris

    frame = load_iris(as_frame=True).frame.rename(columns={"target": "species"})
    table = tmp_path / "flowers.csv"
    frame.to_csv(table, index=False)
    task = prepare_task(TaskSource("flowers", "table", str(table), "species"), seed=0, q=20, context_size=30)
    finetuner = Finetuner(FinetuneSpec(lr=1e-3, epochs=1, seed=0), [task])
    finetuner.train()
    folder = finetuner.save(tmp_path / "e1")
    write_json_atomic(folder / GROUND_TRUTH_FILE, {"run_id": "r", "regime": "single_fixed",
                                                   "tasks": [ground_truth_log(task)]})
    with pytest.raises(ConfigError, match=r"fine-tuned on task 'flowers', read from a table .* --task FILE.csv:TARGET"):
        audit_checkpoint(str(folder), out=str(tmp_path / "a"))
    copy = tmp_path / "copy-of-the-table.csv"  # the same rows under another file name
    copy.write_bytes(table.read_bytes())
    row = audit_checkpoint(str(folder), f"{copy}:species", bootstrap=20, out=str(tmp_path / "b"))
    assert row["task"] == "flowers"
    assert row["n_members"] == 20
