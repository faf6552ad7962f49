"""Every file of a sweep's run folder has its name in ``iclmem.runfolder`` and a reader in ``RunFolder``: the
reference trials' results (checked as the results are), the regime-context audits' table and verdicts, the run's
timings and the W&B trial-run ledger. Each fixture is written by the sweep's own writer (the aggregator,
``collect_sweep_audits``, ``write_timings``, ``TrialRunsLedger.save``) and read back; a damaged file is an error
naming it, a missing one reads as None."""

from __future__ import annotations

import ast
import io
import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import iclmem.runfolder as layout
from iclmem.atomic import write_parquet_atomic
from iclmem.errors import DataError, ResultSchemaError
from iclmem.record import RESULTS_SCHEMA_KEY, RESULTS_SCHEMA_VERSION, RunIdentity
from iclmem.runfolder import (
    CONTEXT_AUDITS_DIR,
    CONTEXT_AUDITS_FILE,
    PROBES_DIR,
    REFERENCE_RESULTS_FILE,
    TIMINGS_FILE,
    TRIAL_RUNS_FILE,
    VERDICT_FILE,
    WANDB_DIR,
    probe_stem,
)
from orchestrator.runfolder.run_folder import RunFolder

REPO = Path(__file__).resolve().parents[1]
EPOCHS = (1, 2)
TARGET = "r0"
REFERENCES = ("r0-ref0", "r0-ref1")


# ------------------------------------------------------------------------------------------- the names
def test_the_timings_and_ledger_names_are_the_layouts_and_still_importable_where_they_were():
    import orchestrator.report.wandb_logger as wandb_logger
    import orchestrator.runfolder.timing as timing

    assert timing.TIMINGS_FILE is layout.TIMINGS_FILE == "timings.json"
    assert wandb_logger.TRIAL_RUNS_FILE is layout.TRIAL_RUNS_FILE == "trial_runs.json"
    # the timings record is a file at the top of a sweep folder (a killed write's temporary is a leftover there)
    assert layout.TIMINGS_FILE in layout._top_level_files()
    assert layout.TRIAL_RUNS_FILE not in layout._top_level_files()  # it lives under wandb/


def test_no_module_spells_a_file_name_the_layout_defines():
    """Code builds every path from ``iclmem.runfolder``'s names: a file name of it spelled out as a string
    anywhere in the packages (a path, an f-string's part) is a second definition that can drift."""
    files = {v: k for k, v in vars(layout).items()
             if re.fullmatch(r"[A-Z_]+_(FILE|FIGURE)", k) and isinstance(v, str)}
    allowed = {("iclmem/provenance.py", "provenance.json")}  # PROVENANCE_FILE's definition, which runfolder imports
    found = []
    for package in ("iclmem", "trainables", "probes", "orchestrator"):
        for path in sorted((REPO / package).rglob("*.py")):
            where = path.relative_to(REPO).as_posix()
            if where == "iclmem/runfolder.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), where)):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in files
                        and (where, node.value) not in allowed):
                    found.append(f"{where}:{node.lineno}: {node.value!r} (iclmem.runfolder.{files[node.value]})")
    assert found == []


# ------------------------------------------------------------------------------------------- reference results
def _row(run_id: str, epoch: int, **extra: object) -> dict:
    """A checkpoint's results row as the probe writes one (``probes.probe``): identity, verdict, rule, flags."""
    identity = RunIdentity(run_id, "iris", "pfn-mini", "single_fixed", 1e-3, 50, "normal", 0).as_dict()
    return {**identity, "epoch": epoch, "outcome": "no_signal", "raw_outcome": "no_signal", "auc": 0.52,
            "auc_low": 0.45, "auc_high": 0.59, "score_kind": "loss", "rule": "selection_aware",
            "raw_memorization_flag": False, "calibrated_memorization_flag": False, "fine_tuned": True,
            "sanity_check": False, "n_members": 50, "n_nonmembers": 50, "probe_score_seconds": 0.25, **extra}


@pytest.fixture(scope="module")
def with_references(tmp_path_factory):
    """A sweep with two reference trials per run, its probe results stored (``ProbeResult.save``) and aggregated
    by the aggregator, which writes the reference trials' rows to reference_results.parquet."""
    from orchestrator.report.aggregate import aggregate
    from orchestrator.report.folder_claims import record_sweep
    from orchestrator.schema.config import parse_sweep
    from probes.probe import ProbeResult

    run_dir = tmp_path_factory.mktemp("references")
    record_sweep(run_dir, parse_sweep({"name": "refs", "tasks": [{"name": "iris"}], "probe": {"references": 2},
                                       "training": {"epochs": 2, "checkpoint_epochs": list(EPOCHS)}}, "test"))
    rows = {}
    for run_id in (TARGET, *REFERENCES):
        extra = {} if run_id == TARGET else {"reference_of": TARGET, "reference_index": REFERENCES.index(run_id)}
        for epoch in EPOCHS:
            rows[run_id, epoch] = _row(run_id, epoch, **extra)
            manip = pd.DataFrame({"run_id": [run_id], "task": ["iris"], "epoch": [epoch], "manipulation": ["base"],
                                  "category": ["base"], "auc": [0.52]})
            roc = pd.DataFrame({"fpr": [0.0, 0.5, 1.0], "tpr": [0.0, 0.55, 1.0]})
            ProbeResult(rows[run_id, epoch], manip, roc).save(run_dir / PROBES_DIR / run_id, probe_stem(epoch))
    aggregate(run_dir, log=lambda _m: None, wandb_mode="disabled")
    return run_dir, rows


def test_the_reference_trials_rows_are_read_back_as_the_aggregator_wrote_them_and_apart_from_the_results(
        with_references):
    run_dir, rows = with_references
    folder = RunFolder(run_dir)
    references = folder.reference_results()
    assert sorted(zip(references["run_id"], references["epoch"], strict=True)) == [
        (r, e) for r in REFERENCES for e in EPOCHS]
    assert set(references["reference_of"]) == {TARGET}
    for record in references.to_dict("records"):
        assert record["probe_score_seconds"] == rows[record["run_id"], record["epoch"]]["probe_score_seconds"]
    assert set(folder.results()["run_id"]) == {TARGET}  # the audited runs only
    assert RunFolder(run_dir / "nowhere").reference_results() is None  # a sweep without reference trials


def _flip(path: Path, column: str) -> None:
    """One flipped bit in the last byte of ``column``'s pages (page data, which the page checksums cover)."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunk = meta.column(list(pq.ParquetFile(path).schema.names).index(column))
    start = min(o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o is not None)
    data = bytearray(path.read_bytes())
    data[start + chunk.total_compressed_size - 1] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_damaged_reference_results_table_is_refused_naming_the_file(with_references, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(with_references[0], run_dir)
    path = run_dir / REFERENCE_RESULTS_FILE
    clean = path.read_bytes()
    _flip(path, "auc")
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: damaged reference results table"):
        RunFolder(run_dir).reference_results()
    path.write_bytes(clean[: len(clean) // 2])  # a copy cut short
    with pytest.raises(DataError, match=re.escape(str(path))):
        RunFolder(run_dir).reference_results()
    path.write_bytes(clean)
    assert len(RunFolder(run_dir).reference_results()) == len(REFERENCES) * len(EPOCHS)


def test_reference_results_of_a_newer_schema_or_an_older_shape_are_refused_as_the_results_are(with_references,
                                                                                             tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(with_references[0], run_dir)
    path = run_dir / REFERENCE_RESULTS_FILE
    table = RunFolder(run_dir).reference_results()
    write_parquet_atomic(table, path, metadata={RESULTS_SCHEMA_KEY: str(RESULTS_SCHEMA_VERSION + 1)})
    with pytest.raises(ResultSchemaError, match=rf"{re.escape(str(path))}: results schema {RESULTS_SCHEMA_VERSION + 1}"):
        RunFolder(run_dir).reference_results()
    write_parquet_atomic(table.drop(columns=["rule"]), path)
    with pytest.raises(ResultSchemaError, match=rf"{re.escape(str(path))}: missing required column\(s\) \['rule'\]"):
        RunFolder(run_dir).reference_results()
    assert len(RunFolder(run_dir).results()) == len(EPOCHS)  # the results table itself is untouched


# ------------------------------------------------------------------------------------------- context audits
class _ContextBlind:
    """A scorer whose prediction ignores its context (the audit finds nothing, quickly)."""

    def __call__(self, context_x: np.ndarray, context_y: np.ndarray, query_x: np.ndarray) -> np.ndarray:
        logits = np.stack([-(query_x[:, 0] - c) ** 2 for c in range(3)], axis=1)
        return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


@pytest.fixture(scope="module")
def context_sweep(tmp_path_factory):
    """A sweep of regime context whose audits' folders are written by ``write_audit_folder`` and gathered into
    context_audits.parquet by ``collect_sweep_audits``, as the driver does."""
    from iclmem.stats import LowResolutionWarning
    from orchestrator.audits.context_audit import collect_sweep_audits, write_audit_folder
    from orchestrator.report.folder_claims import record_sweep
    from orchestrator.schema.config import parse_sweep
    from orchestrator.schema.trials import context_audit_specs
    from probes.attacks.context import ContextAuditInputs, evaluate_context_audit

    run_dir = tmp_path_factory.mktemp("context")
    sweep = parse_sweep({"name": "ctx", "tasks": [{"name": "iris"}], "grid": {"regime": ["context"], "q": [30],
                                                                             "seed": [0, 1]}}, "test")
    record_sweep(run_dir, sweep)
    specs = context_audit_specs(sweep)
    verdicts = {}
    for spec in specs:
        rng = np.random.default_rng(spec.seed)
        y = np.tile(np.arange(3), 20)
        x = (rng.normal(size=(60, 2)) + y[:, None]).astype(np.float32)
        member = np.zeros(60, dtype=bool)
        member[rng.permutation(60)[:30]] = True
        inputs = ContextAuditInputs(x, y, member, 3, x[member] + 0.5, y[member])
        with warnings.catch_warnings():  # 30 non-members: the TPR at a low FPR is coarse, and said so
            warnings.simplefilter("ignore", LowResolutionWarning)
            result = evaluate_context_audit(_ContextBlind(), inputs, n_references=4, seed=spec.seed,
                                            n_resamples=50, null_splits=1)
        _, verdicts[spec.run_id] = write_audit_folder(run_dir / CONTEXT_AUDITS_DIR / spec.run_id, result,
                                                      np.arange(60), member, "hash")
    table = collect_sweep_audits(run_dir, specs)
    return run_dir, table, verdicts


def test_the_context_audits_table_and_verdicts_are_read_back_as_the_driver_wrote_them(context_sweep):
    run_dir, table, verdicts = context_sweep
    folder = RunFolder(run_dir)
    pd.testing.assert_frame_equal(folder.context_audits(), table)
    assert set(table["run_id"]) == set(verdicts)
    for run_id, verdict in verdicts.items():
        assert folder.context_audit_verdict(run_id) == verdict
    assert folder.context_audit_verdict("no-such-audit") is None
    assert RunFolder(run_dir / "nowhere").context_audits() is None  # a sweep without regime context


def test_the_reports_context_section_reads_the_audits_through_the_run_folder(context_sweep, tmp_path):
    from orchestrator.report.context_audits import context_audits_section_html

    run_dir, table, verdicts = context_sweep
    html = context_audits_section_html(run_dir)
    assert all(run_id in html for run_id in verdicts)
    assert context_audits_section_html(tmp_path) == ""  # no audits, no section
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    run_id = sorted(verdicts)[0]
    damaged = copy / CONTEXT_AUDITS_DIR / run_id / VERDICT_FILE
    damaged.write_text("{not json")
    with pytest.raises(DataError, match=re.escape(str(damaged))):
        context_audits_section_html(copy)


def test_a_damaged_context_audits_table_is_refused_naming_the_file(context_sweep, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(context_sweep[0], run_dir)
    path = run_dir / CONTEXT_AUDITS_FILE
    clean = path.read_bytes()
    _flip(path, "auc")
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: damaged table of context audits"):
        RunFolder(run_dir).context_audits()
    write_parquet_atomic(pd.read_parquet(io.BytesIO(clean)).drop(columns=["attack"]), path)
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: not the table of context audits.*'attack'"):
        RunFolder(run_dir).context_audits()


# ------------------------------------------------------------------------------------------- timings
def _timings():
    from orchestrator.runfolder.timing import SERIAL_PHASES, WORK_PHASES, RunTimings

    return RunTimings(wall_s=100.0, parallel_s=80.0, serial={p.value: 2.0 for p in SERIAL_PHASES},
                      work={p.value: 1.0 for p in WORK_PHASES}, workers=4, probe_actors=2, trials=8, checkpoints=16,
                      resumed=True, recorded_at="2026-01-01 00:00:00", notes=("a note",))


def test_the_timings_are_read_back_as_the_record_write_timings_wrote(tmp_path):
    from orchestrator.runfolder.timing import write_timings

    assert RunFolder(tmp_path).timings() is None  # no complete sweep yet
    timings = _timings()
    assert write_timings(tmp_path, timings) == tmp_path / TIMINGS_FILE
    assert RunFolder(tmp_path).timings() == timings


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", json.dumps({"wall_s": 1.0}),
                                  json.dumps({**_timings().as_dict(), "serial": {"coffee break": 1.0}})])
def test_a_damaged_timings_record_is_refused_naming_the_file(tmp_path, text):
    path = tmp_path / TIMINGS_FILE
    path.write_text(text)
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: not an iclmem timings record"):
        RunFolder(tmp_path).timings()


# ------------------------------------------------------------------------------------------- W&B trial runs
def test_the_trial_run_ledger_is_read_back_as_the_logger_saved_it_and_a_damaged_one_is_named(tmp_path):
    from orchestrator.report.wandb_logger import TrialRunsLedger

    path = tmp_path / WANDB_DIR / TRIAL_RUNS_FILE
    assert RunFolder(tmp_path).trial_runs() is None  # no trial logged to W&B yet
    ledger = TrialRunsLedger(path, "0123456789abcdef")
    ledger.entry(TARGET)["trained_to"] = 2
    ledger.save()
    stored = RunFolder(tmp_path).trial_runs()
    assert stored == {"token": ledger.token, "runs": ledger.runs}
    assert stored["runs"][TARGET]["trained_to"] == 2
    assert TrialRunsLedger(path, "0123456789abcdef").runs == ledger.runs  # the logger reads it back the same way
    path.write_text(json.dumps({"token": ledger.token, "runs": ["not", "a", "mapping"]}))
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: damaged"):
        RunFolder(tmp_path).trial_runs()
    path.unlink()
    path.mkdir()
    with pytest.raises(DataError, match=rf"{re.escape(str(path))} is a folder"):
        RunFolder(tmp_path).trial_runs()
