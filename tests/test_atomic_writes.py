"""Every file the README's run-folder table names is written whole or not at all.

A real run folder is built by the real writers (Stage I cache, a fine-tuned checkpoint, a probe result,
the reference cache, the results tables, report and figures, sweep.json and provenance.json). Then each
writer runs again while the write is interrupted at the worst moment: the new bytes are in the temporary
file, not yet renamed (``os.fsync`` raises KeyboardInterrupt, as a Ctrl-C there would). Every file must
still hold its old bytes, a file that did not exist must still not exist, and no temporary file may be
left behind. Run once more without the interruption, the same writers change those files, so the check
covers files that really are rewritten. ``wandb/`` is W&B's own (offline runs it writes itself) and
``tune/`` storage beyond the checkpoint folder is Tune's; both are left out.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from iclmem.atomic import write_json_atomic, write_parquet_atomic, write_text_atomic

REPO = Path(__file__).resolve().parents[1]


class Interrupted(KeyboardInterrupt):
    pass


@pytest.fixture
def interruption(monkeypatch):
    """``on()``: every atomic write stops after its bytes reach the temporary file; ``off()``: writes run."""

    def fsync(_fd: int) -> None:
        raise Interrupted("interrupted before the rename")

    return SimpleNamespace(on=lambda: monkeypatch.setattr(os, "fsync", fsync), off=monkeypatch.undo)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _temporaries(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and p.name.endswith(".tmp")]


@pytest.mark.parametrize("write", [
    lambda p: write_text_atomic(p, "new text " * 1000),
    lambda p: write_json_atomic(p, {"new": list(range(1000))}),
    lambda p: write_parquet_atomic(pd.DataFrame({"x": range(1000)}), p),
])
def test_an_interrupted_write_leaves_the_old_file_or_none(tmp_path, interruption, write):
    existing, absent = tmp_path / "existing", tmp_path / "absent"
    existing.write_bytes(b"old bytes")
    interruption.on()
    for target in (existing, absent):
        with pytest.raises(Interrupted):
            write(target)
    assert existing.read_bytes() == b"old bytes"
    assert not absent.exists()
    assert _temporaries(tmp_path) == []


def _run_folder_writers(run_dir: Path, variant: int):
    """The real writer of every file in the README's table, in an order that builds a run folder;
    ``variant`` changes what they write (another seed, another config), so a rewrite changes bytes."""
    from iclmem.runfolder import PREPARED_DIR, PROBES_DIR, REFERENCE_DIR, TUNE_DIR
    from iclmem.vocab import LabelMode
    from orchestrator.report.aggregate import aggregate
    from orchestrator.report.folder_claims import record_sweep
    from orchestrator.schema.config import parse_sweep
    from probes.calibration import model_digest
    from probes.manipulations import suite_from_spec
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.data import PrepSettings, TaskSource, load_or_prepare, save_prepared
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    sweep = parse_sweep({"name": f"atomic{variant}", "tasks": [{"name": "iris"}], "grid": {"q": [20]},
                         "data": {"context_size": 30}})
    task = load_or_prepare(TaskSource("iris", "builtin"), PrepSettings(context_size=30), LabelMode.SHUFFLED_MEMBERS,
                           seed=0, q=20, cache_dir=run_dir / PREPARED_DIR)
    finetuner = Finetuner(FinetuneSpec(lr=1e-3, epochs=2 + variant, seed=variant), [task])
    finetuner.train()
    base = build_model("pfn-mini", weights="shipped")
    plan = ProbePlan.build(ProbeQueries.from_task(task), suite_from_spec(["base", "position_first"]), task.seed)
    identity = {"run_id": "r0", "task": "iris", "model": "pfn-mini", "regime": "single_fixed", "lr": 1e-3,
                "q": 20, "label_mode": "shuffled_members", "seed": 0}
    prepared = SimpleNamespace(tasks={task.fingerprint: task})
    return [
        ("sweep.json, provenance.json", lambda: record_sweep(run_dir, sweep)),
        ("prepared/", lambda: save_prepared(dataclasses.replace(task, name=f"iris{variant}"), run_dir / PREPARED_DIR)),
        ("tune/ checkpoint", lambda: finetuner.save(run_dir / TUNE_DIR / "checkpoint_000000")),
        ("probes/ and reference/", lambda: probe_checkpoint(
            finetuner.model, task, plan, run_dir / REFERENCE_DIR, model_digest(base) + str(variant), base,
            ProbeSettings(n_resamples=20 + variant), identity, epoch=1).save(run_dir / PROBES_DIR / "r0", "e0001")),
        ("results, tables, report.html, figures/",
         lambda: aggregate(run_dir, prepared, log=lambda _m: None, wandb_mode="disabled")),
    ]


def test_every_file_of_the_run_folder_table_survives_an_interrupted_rewrite(tmp_path, interruption):
    run_dir = tmp_path / "run"
    for _name, write in _run_folder_writers(run_dir, 0):
        write()
    before = _snapshot(run_dir)
    for expected in ("sweep.json", "provenance.json", "results.parquet", "manipulation_auc.parquet",
                     "split_report.parquet", "report.html", "probes/r0/e0001.json",
                     "tune/checkpoint_000000/model.safetensors", "tune/checkpoint_000000/checkpoint.json"):
        assert expected in before, expected
    assert any(k.startswith("figures/") for k in before)
    assert any(k.startswith("reference/") for k in before)
    assert any(k.startswith("prepared/") for k in before)
    assert any(k.startswith("roc/") for k in before)

    writers = _run_folder_writers(run_dir, 1)  # built before the interruption starts
    interruption.on()
    for name, write in writers:
        with pytest.raises(Interrupted):
            write()
        assert _snapshot(run_dir) == before, f"{name}: a file changed although its write was interrupted"
        assert _temporaries(run_dir) == [], name

    # The same writers, not interrupted, do rewrite those files (so the check above was not vacuous).
    interruption.off()
    for _name, write in _run_folder_writers(run_dir, 1):
        write()
    after = _snapshot(run_dir)
    changed = {k for k in before if after.get(k) != before[k]}
    for expected in ("sweep.json", "provenance.json", "results.parquet", "report.html", "probes/r0/e0001.json",
                     "tune/checkpoint_000000/checkpoint.json"):
        assert expected in changed, expected


# Writes that bypass iclmem.atomic: a method that writes a file, called anywhere but inside an
# ``atomic_write(...)`` call on the same line.
_DIRECT_WRITE = re.compile(r"\.(write_text|write_bytes|to_parquet|to_csv|savefig|savez)\(|torch\.save\(|"
                           r"open\([^)]*[\"'][wa]b?[\"']")


# Append-only logs, where a torn last line is what a crash can cost and every earlier line survives.
_APPEND_ONLY = {("trainables/models/pretrain.py", 'with curve.open("a") as fh:')}


def test_no_production_module_writes_a_file_except_through_the_atomic_helper():
    offenders = []
    for package in ("iclmem", "orchestrator", "probes", "trainables"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name == "atomic.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if (str(path.relative_to(REPO)), line.strip()) in _APPEND_ONLY:
                    continue
                if _DIRECT_WRITE.search(line) and "atomic_write(" not in line and not line.lstrip().startswith("#"):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert offenders == []


def test_a_damaged_json_record_is_named_with_what_it_is_and_what_to_do(tmp_path):
    from iclmem.atomic import read_json_object, write_json_atomic
    from iclmem.errors import DataError

    good = write_json_atomic(tmp_path / "ok.json", {"a": 1})
    assert read_json_object(good, "sweep record", "start again") == {"a": 1}
    (tmp_path / "cut.json").write_text('{"a": ')
    with pytest.raises(DataError, match=r"cut.json: damaged, not the JSON iclmem wrote .*; restore it from a copy, or "
                                        r"start again"):
        read_json_object(tmp_path / "cut.json", "sweep record", "start again")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(DataError, match=r"list.json: damaged, not the sweep record iclmem wrote \(a JSON list\)"):
        read_json_object(tmp_path / "list.json", "sweep record", "start again")
