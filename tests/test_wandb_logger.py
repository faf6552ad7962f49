"""The results loggers: no-op defaults, offline W&B summary and per-trial runs (inspected on disk), the W&B Report."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from synthetic_run_dir import (
    CANARY,
    make_synthetic_run_dir,
    read_wandb_records,
    run_id,
    wandb_config,
    wandb_history,
    wandb_summary,
)

from iclmem.errors import ConfigError
from iclmem.runfolder import PREPARED_DIR, RESULTS_FILE, TUNE_DIR, WANDB_DIR
from iclmem.vocab import LabelMode, Outcome, Regime, ScoreKind
from orchestrator import report as R
from orchestrator.report import wandb_logger as W
from orchestrator.report import wandb_summary as S
from orchestrator.runfolder.run_folder import RunFolder

FAKE_KEY = "fakekey-canary-0123456789abcdef0123456789abcdef"
GROUP = "synthetic-sweep"


# -- interface and mode ------------------------------------------------------------------------------


def test_mode_is_offline_unless_online_and_key_present():
    assert W.resolve_wandb_mode(None, environ={}) == "offline"
    assert W.resolve_wandb_mode("offline", environ={"WANDB_API_KEY": FAKE_KEY}) == "offline"
    assert W.resolve_wandb_mode("online", environ={}) == "offline"
    assert W.resolve_wandb_mode("online", environ={"WANDB_API_KEY": FAKE_KEY}) == "online"
    assert W.resolve_wandb_mode("online", environ={"WANDB_API_KEY": FAKE_KEY, "WANDB_MODE": "offline"}) == "offline"
    assert W.resolve_wandb_mode("disabled", environ={}) == "disabled"
    with pytest.raises(ValueError, match="'cloud'"):
        W.resolve_wandb_mode("cloud", environ={})


def test_importing_the_module_does_not_import_wandb():
    code = ("import sys, orchestrator.report.wandb_logger as w; w.WandbResultsLogger('p', 'g'); "
            "w.make_results_logger('none').log_summary('.', None); "
            "w.WandbTrialLogger('.', project='p', group='g', config_hash='h').finish(); "
            "w.make_trial_logger('none').log_probe({}); "
            "assert 'wandb' not in sys.modules and 'wandb_workspaces' not in sys.modules, 'wandb imported'")
    res = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]


def test_null_logger_is_the_default_and_satisfies_the_protocol(tmp_path):
    logger = W.make_results_logger(None)
    assert isinstance(logger, W.NullResultsLogger)
    assert isinstance(logger, W.ResultsLogger)
    logger.log_summary(tmp_path, pd.DataFrame(), {})
    logger.finish()
    assert list(tmp_path.iterdir()) == []
    assert isinstance(W.make_results_logger("wandb", project="p", group="g"), W.ResultsLogger)
    with pytest.raises(ValueError, match="unknown results logger 'tensorboard'"):
        W.make_results_logger("tensorboard")


def test_keys_are_stable_and_safe():
    assert S.roc_key("single_fixed_bin task_lr0.01_q50", 5) == "roc/single_fixed_bin_task_lr0.01_q50_e5"


# -- an offline summary run --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """Log the synthetic sweep offline once; return (run_dir, offline run dir, records, logger)."""
    root = tmp_path_factory.mktemp("wb")
    run_dir = make_synthetic_run_dir(root / "sweep")
    raw = pd.read_parquet(run_dir / RESULTS_FILE)  # has the raw_record canary column
    assert CANARY in set(raw["raw_record"].str.slice(0, len(CANARY)))
    from orchestrator.report import figures as F

    figs = {"outcome_heatmap": F.plot_outcome_heatmap(run_dir, RunFolder(run_dir).results()),
            "detectable_share": F.plot_detectable_share(run_dir, RunFolder(run_dir).results())}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_API_KEY", FAKE_KEY)  # present, but the run must stay offline and never store it
        for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
            mp.setenv(var, str(root / "wandb-home" / var.lower()))
        logger = W.WandbResultsLogger(project="iclmem-test", group=GROUP, mode="offline", max_roc_curves=5)
        logger.log_summary(run_dir, raw, figs)
        logger.finish()
    offline = sorted((run_dir / WANDB_DIR).glob("offline-run-*"))
    assert len(offline) == 1, list((run_dir / WANDB_DIR).iterdir())
    records = read_wandb_records(next(offline[0].glob("run-*.wandb")))
    return run_dir, offline[0], records, logger, root


def test_offline_run_lives_under_run_dir(logged):
    run_dir, offline, records, logger, _ = logged
    assert offline.parent == run_dir / WANDB_DIR
    assert logger.mode == "offline"
    assert logger.run is None
    kinds = {r.WhichOneof("record_type") for r in records}
    assert {"run", "history", "summary", "artifact"} <= kinds


def test_summary_table_and_media_files(logged):
    run_dir, offline, records, _, _ = logged
    media = offline / "files" / "media"
    tables = list((media / "table").glob("results_table_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert {"run_id", "outcome", "auc", "tpr_at_1pct", "epoch"} <= set(table["columns"])
    assert "raw_record" not in table["columns"]
    assert len(table["data"]) == 160
    peak = json.loads(next((media / "table").glob("peak_table_*.table.json")).read_text())
    assert len(peak["data"]) == 24 + 8
    images = sorted(p.name for p in (media / "images" / "figures").glob("*.png"))
    assert len(images) == 2
    assert any(n.startswith("outcome_heatmap") for n in images)
    rocs = list((media / "table" / "roc").glob("*_table_*.table.json"))
    assert len(rocs) == 5
    assert set(json.loads(rocs[0].read_text())["columns"]) == {"fpr", "tpr"}


def test_summary_holds_outcome_counts(logged):
    _, _, records, _, _ = logged
    s = wandb_summary(records)
    assert s["outcome_counts/collapse"] == 7
    assert s["outcome_counts/memorization"] == 6
    assert s["outcome_counts/inversion"] == 4
    assert s["n_runs"] == 32
    assert s["outcome_rate/single_fixed/q=50/collapse"] == pytest.approx(4 / 12)
    assert s["max_peak_auc"] == pytest.approx(0.67)
    assert s["results_table"]["_type"] == "table-file"
    assert s["results_table"]["nrows"] == 160


def test_history_has_the_detectable_share_over_epochs_and_no_per_configuration_keys(logged):
    """Per-configuration AUC is the trial runs' (grouped by config), not summary keys naming a config."""
    _, _, records, _, _ = logged
    by_epoch = {row["epoch"]: row for row in wandb_history(records) if "epoch" in row}
    assert sorted(by_epoch) == [0, 1, 2, 5, 10]
    assert by_epoch[10]["detectable_share/q=50"] == pytest.approx(0.25)
    assert by_epoch[5]["detectable_share/q=512"] == pytest.approx(1 / 12)
    keys = {k for row in by_epoch.values() for k in row if not k.startswith("_")}
    assert keys == {"epoch", "detectable_share/q=50", "detectable_share/q=512"}


def test_results_artifact_is_recorded_with_public_files(logged):
    run_dir, _, records, _, _ = logged
    arts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact" and r.artifact.type == "iclmem-results"]
    assert len(arts) == 1
    assert arts[0].name == f"iclmem-results-{GROUP}"
    entries = {e.path: Path(e.local_path) for e in arts[0].manifest.contents}
    assert set(entries) == {"results.parquet", "peak_checkpoints.parquet", "split_report.parquet",
                            "manipulation_auc.parquet"}
    for path in entries.values():
        assert path.is_file()
        assert run_dir / WANDB_DIR in path.parents
    exported = pd.read_parquet(entries["results.parquet"])
    assert len(exported) == 160
    assert "raw_record" not in exported.columns


def _assert_no_canary_or_key(run_dir: Path, root: Path) -> None:
    """Every file W&B wrote (the run folder's and W&B's home) is free of the raw record and the key."""
    scanned = 0
    for base in (run_dir / WANDB_DIR, root / "wandb-home"):
        for p in base.rglob("*"):
            if p.is_file():
                data = p.read_bytes()
                assert CANARY.encode() not in data, p
                assert FAKE_KEY.encode() not in data, p
                scanned += 1
    assert scanned > 10


def test_no_raw_record_or_api_key_in_any_wandb_file(logged):
    run_dir, _, _, _, root = logged
    _assert_no_canary_or_key(run_dir, root)


# -- W&B Report --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wr():
    return pytest.importorskip("wandb_workspaces.reports.v2", reason="pip install wandb-workspaces")


def test_build_report_blocks_and_panel_queries(wr, logged, trial_runs):
    run_dir, _, records, _, _ = logged
    results = RunFolder(run_dir).results()
    report = S.build_wandb_report("my-entity", "iclmem-test", GROUP, results, run_dir=run_dir, max_roc_panels=5)
    assert isinstance(report, wr.Report)
    assert (report.entity, report.project) == ("my-entity", "iclmem-test")
    grids = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    headings = [b.text for b in report.blocks if isinstance(b, wr.H2)]
    assert headings == ["Outcomes", "ROC curves (log-log in the HTML report)", "AUC over epochs"]
    assert len(grids) == 2 + 3  # outcomes, ROC, and AUC over epochs for each of the three tasks
    for g in grids:
        assert len(g.runsets) == 1
        assert g.runsets[0].project == "iclmem-test"
        assert GROUP in g.runsets[0].filters
        assert "Group" in g.runsets[0].filters

    outcome, roc, *auc = grids
    table = [p for p in outcome.panels if isinstance(p, wr.WeavePanelSummaryTable)]
    assert len(table) == 1
    assert table[0].table_name == S.PEAK_TABLE_KEY
    bars = [p for p in outcome.panels if isinstance(p, wr.BarPlot)][0]
    assert bars.metrics == [f"outcome_counts/{o}" for o in R.OUTCOMES]

    assert len(roc.panels) == 5
    assert all(isinstance(p, wr.CustomChart) for p in roc.panels)
    best = run_id("single_fixed", "bin_task", 1e-2, 50)  # highest peak AUC (0.67) at epoch 5
    assert roc.panels[0].query == {"summaryTable": {"tableKey": f"roc/{best}_e5_table"}}
    assert roc.panels[0].chart_name == "wandb/line/v0"
    assert roc.panels[0].chart_fields == {"x": "fpr", "y": "tpr"}

    for grid, task in zip(auc, ("bin_task", "multi_task", "reg_task")):
        (panel,), (trials,) = grid.panels, grid.runsets  # the task's trial runs, one line per configuration
        assert isinstance(panel, wr.LinePlot)
        assert panel.title == f"AUC over epochs: {task}"
        assert (panel.x, panel.y, panel.groupby_aggfunc) == ("epoch", [S.CHECKPOINT_AUC_KEY], "mean")
        assert f"'{task}'" in str(trials.filters)
        assert "JobType" in str(trials.filters)
        assert trials.groupby == ["config.model", "config.regime", "config.label_mode", "config.lr", "config.q"]

    # every key the report reads was logged by the summary run
    summary = wandb_summary(records)
    for p in roc.panels:
        assert p.query["summaryTable"]["tableKey"] in summary
    assert set(bars.metrics) <= set(summary)
    assert S.PEAK_TABLE_KEY in summary


def test_report_is_saved_only_when_asked(wr, monkeypatch):
    saved = []
    monkeypatch.setattr(wr.Report, "save", lambda self, *a, **k: saved.append(self) or self)
    S.build_wandb_report("e", "p", "g", tasks=["t"], roc_keys=["roc/r_e1"])
    assert saved == []
    report = S.build_wandb_report("e", "p", "g", roc_keys=["roc/r_e1"], publish=True)
    assert saved == [report]


# -- per-trial runs, written by the sweep driver -----------------------------------------------------

TRIAL_A = run_id("single_fixed", "bin_task", 1e-2, 50)  # memorization, peak AUC 0.67 at epoch 5
TRIAL_B = run_id("single_fixed", "bin_task", 1e-3, 512)  # peak 0.66 at epoch 2, from auc_entropy
CONFIG_HASH = "cfg123"
RAY_BOOKKEEPING = {"pid": 4242, "hostname": "node-1", "node_ip": "10.0.0.1", "timestamp": 1_700_000_000,
                   "training_iteration": 3, "trial_id": "abc_00000", "done": False, "date": "2026-11-30"}


def _tune_result(run: str, epoch: int) -> dict:
    """What Tune hands ``on_trial_result``: the trainable's metrics plus Tune's bookkeeping."""
    return {"run_id": run, "epoch": epoch, "train_loss": 1.0 / epoch, "member_icl_accuracy": 0.5 + epoch / 100,
            "nonmember_icl_accuracy": 0.5, "diverged": False, "time_this_iter_s": 0.25, **RAY_BOOKKEEPING,
            "note": CANARY}


def _as_vocab(row: dict) -> dict:
    """Closed-vocabulary fields as the sweep holds them: enum members, not plain strings."""
    return {**row, "regime": Regime(row["regime"]), "label_mode": LabelMode(row["label_mode"]),
            **({"outcome": Outcome(row["outcome"]), "score_kind": ScoreKind(row["score_kind"])} if "outcome" in row else {})}


def _probe_rows(results: pd.DataFrame, run: str, epochs) -> list[dict]:
    """Probe rows as the pool returns them (raw_record canary included), in the given epoch order."""
    by_epoch = {int(r["epoch"]): r for r in results[results["run_id"] == run].to_dict("records")}
    return [_as_vocab(dict(by_epoch[e], probe_seconds=1.5, probe_node="node-1")) for e in epochs]


@pytest.fixture(scope="module")
def trial_runs(tmp_path_factory):
    """Two drivers log into the same run folder: the first sees part of two trials (probe rows out of
    epoch order), the second is ``iclmem resume`` after a restart: Tune re-reports an epoch the first
    already logged, then the rest; the catch-up pass brings every stored probe row again."""
    root = tmp_path_factory.mktemp("trials")
    results = pd.read_parquet(make_synthetic_run_dir(root / "synthetic", with_optional=False) / RESULTS_FILE)
    run_dir = root / "sweep"
    identities = {r: _as_vocab({k: results[results["run_id"] == r].iloc[0][k] for k in
                                ("run_id", "task", "model", "regime", "lr", "q", "label_mode", "seed",
                                 "config_hash", "git_commit")} | {"model_options": "{}"}) for r in (TRIAL_A, TRIAL_B)}
    loggers = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_API_KEY", FAKE_KEY)  # present, as on a cluster: offline runs must not store it
        for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
            mp.setenv(var, str(root / "wandb-home" / var.lower()))
        first = W.make_trial_logger("wandb", run_dir=run_dir, project="iclmem-test", group=GROUP,
                                    config_hash=CONFIG_HASH, mode="offline")
        for e in range(1, 7):
            first.log_training(identities[TRIAL_A], _tune_result(TRIAL_A, e))
        for e in range(1, 11):
            first.log_training(identities[TRIAL_B], _tune_result(TRIAL_B, e))
        for row in _probe_rows(results, TRIAL_A, [5, 2, 1]) + _probe_rows(results, TRIAL_B, [10, 5, 2, 1, 0]):
            first.log_probe(row)
        first_ids = {r: run.id for r, run in first.runs.items()}
        first.finish()
        loggers.append(first)
        time.sleep(1.1)  # offline folders are named by the second a run starts; a real restart takes longer
        second = W.make_trial_logger("wandb", run_dir=run_dir, project="iclmem-test", group=GROUP,
                                     config_hash=CONFIG_HASH, mode="offline")
        for e in range(5, 11):  # restored from the epoch-5 checkpoint: epoch 6 runs (and reports) again
            second.log_training(identities[TRIAL_A], _tune_result(TRIAL_A, e))
        for row in _probe_rows(results, TRIAL_A, [0, 1, 2, 5, 10]) + _probe_rows(results, TRIAL_B, [0, 1, 2, 5, 10]):
            second.log_probe(row)
        second_ids = {r: run.id for r, run in second.runs.items()}
        second.finish()
        loggers.append(second)
    return run_dir, results, first_ids, second_ids, root


def _offline_files(run_dir: Path, wandb_id: str) -> list[Path]:
    """The run's transaction logs, oldest driver first (folders are named by start time)."""
    return sorted((run_dir / WANDB_DIR).glob(f"offline-run-*-{wandb_id}/run-{wandb_id}.wandb"))


def test_a_restarted_driver_continues_each_trial_run_under_the_same_id(trial_runs):
    run_dir, _, first_ids, second_ids, _ = trial_runs
    assert first_ids == second_ids
    assert set(first_ids) == {TRIAL_A, TRIAL_B}
    assert len(set(first_ids.values())) == 2
    assert all(i.startswith(CONFIG_HASH) for i in first_ids.values())
    ledger = json.loads((run_dir / WANDB_DIR / W.TRIAL_RUNS_FILE).read_text())
    assert {r: e["wandb_id"] for r, e in ledger["runs"].items()} == first_ids
    for wandb_id in first_ids.values():
        files = _offline_files(run_dir, wandb_id)
        assert len(files) == 2  # one per driver; `wandb sync` appends them to one run in start order
        for path in files:
            run_records = [r.run for r in read_wandb_records(path) if r.WhichOneof("record_type") == "run"]
            assert run_records[0].run_id == wandb_id
            assert run_records[0].run_group == GROUP
            assert run_records[0].job_type == S.TRIAL_JOB_TYPE


def test_another_run_folder_of_the_same_sweep_gets_other_run_ids(trial_runs, tmp_path):
    run_dir, _, first_ids, _, _ = trial_runs
    same = W.TrialRunsLedger(run_dir / WANDB_DIR / W.TRIAL_RUNS_FILE, CONFIG_HASH)
    other = W.TrialRunsLedger(tmp_path / W.TRIAL_RUNS_FILE, CONFIG_HASH)
    assert same.entry(TRIAL_A)["wandb_id"] == first_ids[TRIAL_A]
    assert other.entry(TRIAL_A)["wandb_id"] != first_ids[TRIAL_A]


def test_each_trial_run_has_its_flat_config(trial_runs):
    run_dir, results, first_ids, _, _ = trial_runs
    for run, wandb_id in first_ids.items():
        row = results[results["run_id"] == run].iloc[0]
        for path in _offline_files(run_dir, wandb_id):
            config = wandb_config(read_wandb_records(path))
            assert "__trial__" not in config
            assert config["sweep"] == GROUP
            for key in ("run_id", "task", "model", "regime", "lr", "q", "label_mode", "seed", "config_hash"):
                assert config[key] == row[key], key
            assert "model_options" not in config  # not on the public allow-list


def test_training_metrics_are_logged_once_per_epoch_without_tune_bookkeeping(trial_runs):
    run_dir, _, first_ids, _, _ = trial_runs
    for run, last in ((TRIAL_A, 10), (TRIAL_B, 10)):
        rows = [h for p in _offline_files(run_dir, first_ids[run]) for h in wandb_history(read_wandb_records(p))
                if "train_loss" in h]
        assert [h["epoch"] for h in rows] == list(range(1, last + 1))  # epoch 6, re-reported, is not repeated
        for h in rows:
            assert h["train_loss"] == pytest.approx(1.0 / h["epoch"])
            assert h["member_icl_accuracy"] == pytest.approx(0.5 + h["epoch"] / 100)
            assert h["time_this_iter_s"] == 0.25
            assert h["diverged"] is False
            assert not set(RAY_BOOKKEEPING) & set(h)
            assert "note" not in h
            assert "run_id" not in h


def test_each_checkpoint_probe_row_is_logged_once_at_its_epoch_with_its_public_metrics(trial_runs):
    run_dir, results, first_ids, _, _ = trial_runs
    public = set(R.public_results(results).columns) - set(S.TRIAL_CONFIG_KEYS) - {"epoch"}
    for run, wandb_id in first_ids.items():
        probed = [h for p in _offline_files(run_dir, wandb_id) for h in wandb_history(read_wandb_records(p))
                  if "probe/outcome" in h]
        expected = results[results["run_id"] == run].set_index("epoch")
        assert sorted(h["epoch"] for h in probed) == sorted(expected.index)  # each once, across both drivers
        for h in probed:
            want = expected.loc[h["epoch"]]
            assert {k for k in h if k.startswith("probe/")} == {f"probe/{k}" for k in public} | {S.CHECKPOINT_AUC_KEY}
            assert h[S.CHECKPOINT_AUC_KEY] == pytest.approx(R.checkpoint_auc(expected.loc[[h["epoch"]]]).iloc[0])
            for k in ("auc", "auc_low", "auc_high", "tpr_at_1pct", "tpr_at_10pct", "loss_ratio", "raw_auc",
                      "ref_auc", "auc_entropy"):
                assert h[f"probe/{k}"] == pytest.approx(want[k]), k
            for k in ("outcome", "score_kind", "raw_outcome"):
                assert h[f"probe/{k}"] == want[k], k


def test_every_trial_metric_is_plotted_against_epoch(trial_runs):
    run_dir, _, first_ids, _, _ = trial_runs
    for path in _offline_files(run_dir, first_ids[TRIAL_A]):
        metrics = [r.metric for r in read_wandb_records(path) if r.WhichOneof("record_type") == "metric"]
        assert any(m.glob_name == "*" and m.step_metric == "epoch" for m in metrics)


def test_run_summary_holds_the_last_checkpoint_and_the_peak(trial_runs):
    run_dir, results, first_ids, _, _ = trial_runs
    peaks = R.peak_checkpoints(R.public_results(results), regime=None).set_index("run_id")
    for run, (peak_epoch, peak_auc, peak_kind) in ((TRIAL_A, (5, 0.67, "loss")), (TRIAL_B, (2, 0.66, "entropy"))):
        s = wandb_summary(read_wandb_records(_offline_files(run_dir, first_ids[run])[-1]))
        assert (s["peak/epoch"], s["peak/auc"], s["peak/score_kind"]) == (peak_epoch, pytest.approx(peak_auc), peak_kind)
        assert s["peak/outcome"] == peaks.loc[run, "outcome"]
        last = results[(results["run_id"] == run) & (results["epoch"] == 10)].iloc[0]
        assert s["probe/last_epoch"] == 10
        assert s["probe/outcome"] == last["outcome"]
        assert s["probe/auc"] == pytest.approx(last["auc"])
    # the first driver saw TRIAL_A's probe rows in the order 5, 2, 1: its summary is still epoch 5's
    s = wandb_summary(read_wandb_records(_offline_files(run_dir, first_ids[TRIAL_A])[0]))
    assert s["probe/last_epoch"] == 5
    assert s["peak/epoch"] == 5


def test_no_raw_record_or_api_key_in_any_trial_run_file(trial_runs):
    run_dir, _, _, _, root = trial_runs
    _assert_no_canary_or_key(run_dir, root)


def test_the_null_trial_logger_is_the_default_and_satisfies_the_protocol(tmp_path):
    logger = W.make_trial_logger(None)
    assert isinstance(logger, W.NullTrialLogger)
    assert isinstance(logger, W.TrialLogger)
    logger.log_training({"run_id": "r"}, {"epoch": 1, "train_loss": 0.1})
    logger.log_probe({"run_id": "r", "epoch": 1, "auc": 0.5})
    logger.finish()
    wandb_logger = W.make_trial_logger("wandb", run_dir=tmp_path, project="p", group="g", config_hash="h")
    assert isinstance(wandb_logger, W.TrialLogger)
    wandb_logger.finish()  # no run was opened: nothing to finish, no file written
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError):
        W.make_trial_logger("tensorboard")


def test_finish_with_a_timeout_returns_while_wandb_hangs_and_without_one_waits(tmp_path):
    """After a Ctrl-C the wandb service may have had the same SIGINT and ``run.finish()`` then never
    returns; the interrupted driver must still end within its bound."""
    import threading
    import time

    release = threading.Event()
    finished: list[str] = []

    class _HangingRun:
        def finish(self) -> None:
            release.wait(60)
            finished.append("hanging")

    class _Run:
        def finish(self) -> None:
            finished.append("plain")

    logger = W.WandbTrialLogger(tmp_path, project="p", group="g", config_hash="h")
    logger._runs["r1"] = _HangingRun()
    started = time.monotonic()
    assert logger.finish(timeout=0.5) is False
    assert time.monotonic() - started < 5
    assert logger.runs == {}
    assert finished == []
    release.set()

    logger._runs["r2"] = _Run()
    assert logger.finish() is True
    assert "plain" in finished


def test_a_ctrl_c_while_the_summary_run_logs_waits_for_wandb_only_within_the_bound(tmp_path, monkeypatch):
    """The summary logger (tabular and LM drivers' last W&B upload) closes its run like the trial logger:
    after a Ctrl-C inside its block no longer than WANDB_FINISH_TIMEOUT_S; otherwise it waits as before."""
    import threading
    import time

    monkeypatch.setattr(W, "WANDB_FINISH_TIMEOUT_S", 0.5)
    release = threading.Event()
    finished: list[str] = []

    class _Run:
        def __init__(self, hangs: bool) -> None:
            self.hangs, self.dir = hangs, str(tmp_path)

        def finish(self) -> None:
            if self.hangs:
                release.wait(60)
            finished.append("hanging" if self.hangs else "plain")

    logger = W.WandbResultsLogger("p", mode="disabled", teardown_on_finish=False)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), logger:  # noqa: PT012 - the interrupt must come from inside the block
        logger._run = _Run(hangs=True)
        raise KeyboardInterrupt
    assert time.monotonic() - started < 5
    assert finished == []
    assert logger._run is None
    release.set()

    with W.WandbResultsLogger("p", mode="disabled", teardown_on_finish=False) as plain:
        plain._run = _Run(hangs=False)
    assert "plain" in finished
    assert plain._run is None


class _RecordingTrialLogger(W.NullTrialLogger):
    def __init__(self) -> None:
        self.training: list[tuple[str, int]] = []
        self.probes: list[tuple[str, int]] = []

    def log_training(self, identity, result) -> None:
        self.training.append((identity["run_id"], result["epoch"]))

    def log_probe(self, row) -> None:
        self.probes.append((row["run_id"], row["epoch"]))


class _Pool:
    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def poll(self) -> list[dict]:
        rows, self.rows = self.rows, []
        return rows


def test_tune_callbacks_feed_the_trial_logger_and_are_reattached_after_a_restart(tmp_path):
    """Tune pickles its callbacks into the experiment state: the open runs stay out of it, and
    ``iclmem resume`` hands the restored callbacks the new driver's trial logger."""
    from types import SimpleNamespace

    from ray import cloudpickle

    from orchestrator.driver.progress import Progress
    from orchestrator.driver.tune_callbacks import reattach, trial_results_callback, tune_callback
    from trainables.spec import TUNE_AXIS, FinetuneSpec, TrialConfig

    typed = TrialConfig(run_id="r1", task_keys=("k",), identity={"run_id": "r1"}, finetune=FinetuneSpec())
    trial = SimpleNamespace(config={TUNE_AXIS: typed.to_tune()}, status="RUNNING")  # as Tune holds it
    before = _RecordingTrialLogger()
    callbacks = [tune_callback(_Pool([{"run_id": "r1", "epoch": 1, "outcome": "no_signal"}]), tmp_path,
                                Progress(1, enabled=False), before), trial_results_callback(before)]
    callbacks[1].on_trial_result(0, [trial], trial, {"epoch": 1, "train_loss": 0.5})
    callbacks[0].on_step_end(0, [trial])
    assert before.training == [("r1", 1)]
    assert before.probes == [("r1", 1)]

    restored = cloudpickle.loads(cloudpickle.dumps(callbacks))  # as Tuner.restore reads them back
    assert all(c.trial_logger is None for c in restored)
    restored[1].on_trial_result(0, [trial], trial, {"epoch": 2, "train_loss": 0.4})  # nothing to log to yet
    after = _RecordingTrialLogger()
    tuner = SimpleNamespace(_local_tuner=SimpleNamespace(get_run_config=lambda: SimpleNamespace(callbacks=restored)))
    reattach(tuner, _Pool([{"run_id": "r1", "epoch": 2, "outcome": "no_signal"}]), tmp_path,
             Progress(1, enabled=False), after)
    restored[1].on_trial_result(0, [trial], trial, {"epoch": 3, "train_loss": 0.3})
    restored[0].on_step_end(0, [trial])
    assert after.training == [("r1", 3)]
    assert after.probes == [("r1", 2)]
    assert before.training == [("r1", 1)]


def test_a_run_wandb_cannot_open_switches_trial_logging_off_instead_of_aborting_the_sweep(tmp_path, monkeypatch, caplog):
    """The logger runs inside Tune's callbacks, where an exception would end the sweep."""
    import wandb

    attempts = []

    def unreachable(**kwargs):
        attempts.append(kwargs["id"])
        raise wandb.errors.CommError("network unreachable")

    monkeypatch.setattr(wandb, "init", unreachable)
    logger = W.WandbTrialLogger(tmp_path, project="p", group="g", config_hash="h", mode="offline")
    with caplog.at_level("WARNING", logger=W.__name__):
        logger.log_training({"run_id": "r1"}, {"epoch": 1, "train_loss": 0.5})
        logger.log_training({"run_id": "r2"}, {"epoch": 1, "train_loss": 0.5})
        logger.log_probe({"run_id": "r1", "epoch": 1, "auc": 0.5, "outcome": "no_signal"})
    logger.finish()
    assert len(attempts) == 1  # not retried per trial: online, each try can block the sweep for a minute
    assert "CommError: network unreachable" in logger.unavailable
    assert "could not open the run of trial r1" in caplog.text
    assert logger.ledger.entry("r1")["trained_to"] == 0
    assert logger.ledger.entry("r1")["probed"] == []


# -- a real sweep interrupted and resumed ------------------------------------------------------------


class _DriverDied(Exception):
    """Stands in for the sweep driver dying mid-sweep (raised test-side, from a Tune callback)."""


class _DiesAtEpoch:
    """Wraps the sweep's real trial logger; the driver dies when Tune reports ``epoch``."""

    def __init__(self, inner, epoch: int) -> None:
        self.inner, self.epoch = inner, epoch

    def log_training(self, identity, result) -> None:
        if result.get("epoch") == self.epoch:
            raise _DriverDied(f"driver died at epoch {self.epoch}")
        self.inner.log_training(identity, result)

    def log_probe(self, row) -> None:
        self.inner.log_probe(row)

    def finish(self, timeout: float | None = None) -> bool:
        return self.inner.finish(timeout)


@pytest.mark.slow
def test_iclmem_resume_continues_each_trial_run_under_its_id_and_logs_each_epoch_once(ray_session, tmp_path,
                                                                                      monkeypatch):
    """A real Tune sweep (W&B offline) whose driver dies after epoch 4 of 6, then ``resume``: the trial's
    run is reopened under the same id, and across the two drivers' offline logs every epoch's training
    metrics and every checkpoint's probe row appear exactly once."""
    from orchestrator.driver import sweep as S
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({
        "name": "wb-resume", "tasks": [{"name": "iris"}], "grid": {"lr": [1e-3], "q": [20]},
        "data": {"context_size": 30}, "training": {"epochs": 6, "checkpoint_epochs": [2, 4, 6]},
        "probe": {"bootstrap": 20, "suite": ["base", "position_first"], "base_as_checkpoint": False},
        "resources": {"cpus_per_trial": 1, "cpus_per_probe_actor": 0.5},
        "wandb": {"mode": "offline", "project": "iclmem-test"},
    })
    run_dir = tmp_path / "run"
    real = S.trial_logger_for
    monkeypatch.setattr(S, "trial_logger_for", lambda sw, rd: _DiesAtEpoch(real(sw, rd), 5))
    with pytest.raises(Exception, match="driver died at epoch 5|Tune run failed"):
        S.run_sweep(None, run_dir, sweep=sweep, progress=False)
    runs = json.loads((run_dir / WANDB_DIR / W.TRIAL_RUNS_FILE).read_text())["runs"]
    assert len(runs) == 1
    assert next(iter(runs.values()))["trained_to"] == 4
    monkeypatch.setattr(S, "trial_logger_for", real)
    results = S.run_sweep(None, run_dir, resume=True, progress=False)

    assert set(results["run_id"]) == set(runs)
    assert sorted(results["epoch"]) == [2, 4, 6]
    (run, entry), = json.loads((run_dir / WANDB_DIR / W.TRIAL_RUNS_FILE).read_text())["runs"].items()
    assert entry["wandb_id"] == runs[run]["wandb_id"]
    assert (entry["trained_to"], entry["probed"]) == (6, [2, 4, 6])
    files = _offline_files(run_dir, entry["wandb_id"])
    assert len(files) == 2  # one per driver, the same run id
    logs = [read_wandb_records(p) for p in files]
    training = [[h["epoch"] for h in wandb_history(r) if "train_loss" in h] for r in logs]
    assert training[0] == [1, 2, 3, 4]
    assert training[0] + training[1] == [1, 2, 3, 4, 5, 6]
    probed = sorted(h["epoch"] for r in logs for h in wandb_history(r) if "probe/outcome" in h)
    assert probed == [2, 4, 6]
    for r in logs:
        config = wandb_config(r)
        assert (config["run_id"], config["task"], config["lr"], config["sweep"]) == (run, "iris", 1e-3, "wb-resume")
    peak = R.peak_checkpoints(R.public_results(results), regime=None).iloc[0]
    summary = wandb_summary(logs[1])
    assert (summary["peak/epoch"], summary["peak/outcome"], summary["probe/last_epoch"]) == (
        peak["epoch"], peak["outcome"], 6)


# ------------------------------------------------------------------------------------------------- lineage
def test_a_checkpoint_is_logged_as_a_reference_artifact_with_its_inputs_and_a_memorization_alert_once(tmp_path):
    """W&B lineage, offline: the checkpoint folder (written by the real Finetuner.save) becomes an artifact
    that references it (no weights uploaded) with its weights' sha256; the run names its prepared task and
    base weights; a memorization verdict raises one alert, a no_signal one none."""
    from synthetic_run_dir import read_wandb_records

    from trainables.data import TaskSource, prepare_task, save_prepared
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.spec import TrialConfig

    run_dir = tmp_path / "run"
    task = prepare_task(TaskSource("iris", "builtin"), seed=0, q=20, context_size=30)
    save_prepared(task, run_dir / PREPARED_DIR)
    finetune = {"model": "pfn-mini", "model_options": {"weights": "shipped"}, "regime": "single_fixed",
                "lr": 1e-3, "epochs": 1, "seed": 0}
    finetuner = Finetuner(FinetuneSpec(**finetune), [task])
    finetuner.run_epoch()
    checkpoint = finetuner.save(tmp_path / TUNE_DIR / "trial" / "checkpoint_000000")
    manifest = json.loads((checkpoint / "checkpoint.json").read_text())
    identity = {"run_id": "iris-single_fixed-lr0.001-q20", "task": "iris", "model": "pfn-mini",
                "regime": "single_fixed", "lr": 1e-3, "q": 20, "label_mode": "normal", "seed": 0}
    config = TrialConfig(run_id=identity["run_id"], task_keys=(task.fingerprint,), identity=identity,
                         finetune=FinetuneSpec(**finetune))
    logger = W.make_trial_logger("wandb", run_dir=run_dir, project="iclmem-test", group="g", config_hash="abc123",
                                 mode="offline")
    logger.log_checkpoint(config, 1, str(checkpoint))
    logger.log_checkpoint(config, 1, str(checkpoint))  # Tune's catch-up pass hands it again: logged once
    for outcome in ("no_signal", "memorization", "memorization"):
        logger.log_probe({**identity, "epoch": 1, "outcome": outcome, "auc": 0.91, "tpr_at_1pct": 0.4})
    wandb_id = logger.runs[identity["run_id"]].id
    logger.finish()
    records = [r for path in sorted((run_dir / WANDB_DIR).glob(f"offline-run-*-{wandb_id}/run-{wandb_id}.wandb"))
               for r in read_wandb_records(path)]
    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert len(artifacts) == 1
    (art,) = artifacts
    assert art.name == S.artifact_name("checkpoint", identity["run_id"])
    assert art.type == "model"
    assert "epoch-1" in list(art.aliases)
    meta = json.loads(art.metadata)
    assert meta["weights_sha256"] == manifest["weights_sha256"]
    assert meta["files"]["model.safetensors"]["sha256"] == manifest["files"]["model.safetensors"]["sha256"]
    refs = [entry.ref for entry in art.manifest.contents]
    assert refs
    assert all(ref.startswith(f"file://{checkpoint}") for ref in refs)  # references: nothing uploaded
    alerts = [r.alert for r in records if r.WhichOneof("record_type") == "alert"]
    assert [a.title for a in alerts] == [f"memorization: {identity['run_id']}"]
    assert "AUC 0.910" in alerts[0].text
    summary = {item.key: json.loads(item.value_json) for r in records if r.WhichOneof("record_type") == "summary"
               for item in r.summary.update}
    assert S.artifact_name("task", task.fingerprint) in summary.values()
    assert any(str(v).startswith("base-pfn-mini") for v in summary.values())


def test_an_epsilon_lower_bound_above_the_accountant_raises_an_alert_and_agreement_none():
    row = {"run_id": "r", "epoch": 3, "outcome": "no_signal", "epsilon_consistent": False, "epsilon_lb": 2.5,
           "dp_epsilon": 1.0, "dp_epsilon_replace_one": 2.1}
    title, text = S.alert_for(row)
    assert title == "ε lower bound above the accountant's: r"
    # the bound is held against the accountant's figure for its own neighbour relation, and says which
    assert "2.5 (replace-one) exceeds DP-SGD's 2.1 (replace-one)" in text
    assert S.alert_for({**row, "epsilon_consistent": True}) is None
    one_run = {**row, "epsilon_consistent": True, "one_run_consistent": False, "one_run_epsilon_lb": 1.4}
    assert "1.4 (add/remove) exceeds DP-SGD's 1.0 (add/remove)" in S.alert_for(one_run)[1]
    gdp = {**row, "epsilon_consistent": None, "gdp_consistent": False, "gdp_mu_lb": 0.9, "dp_mu_replace_one": 0.5}
    assert S.alert_for(gdp)[0] == "GDP μ lower bound above the accountant's: r"
    assert S.alert_for({"run_id": "r", "epoch": 3, "outcome": "overfitting"}) is None


@pytest.fixture(scope="module")
def workspaces():
    return pytest.importorskip("wandb_workspaces.workspaces", reason="pip install wandb-workspaces")


def test_the_workspace_groups_the_trial_runs_by_task_lr_q_and_label_mode_and_plots_what_they_log(
        workspaces, trial_runs):
    from synthetic_run_dir import read_wandb_records, wandb_history

    workspace = S.build_wandb_workspace("my-entity", "iclmem-test", GROUP)
    assert isinstance(workspace, workspaces.Workspace)
    assert (workspace.entity, workspace.project) == ("my-entity", "iclmem-test")
    assert [str(g) for g in workspace.runset_settings.groupby] == [str(workspaces.Config(k)) for k in
                                                                    ("task", "lr", "q", "label_mode")]
    assert f"'{GROUP}'" in str(workspace.runset_settings.filters)
    assert "'trial'" in str(workspace.runset_settings.filters)
    plotted = {y for section in workspace.sections for panel in section.panels for y in panel.y}
    assert all(panel.x == "epoch" for section in workspace.sections for panel in section.panels)
    # every plotted key is one the trial runs log
    run_dir, _, first_ids, _, _ = trial_runs
    logged = {k for wandb_id in first_ids.values() for path in _offline_files(run_dir, wandb_id)
              for h in wandb_history(read_wandb_records(path)) for k in h}
    assert plotted - {"train_loss", "member_icl_accuracy", "nonmember_icl_accuracy"} <= logged
    assert "train_loss" in logged


def test_the_workspace_is_saved_only_when_asked(workspaces, monkeypatch):
    saved = []
    monkeypatch.setattr(workspaces.Workspace, "save", lambda self, *a, **k: saved.append(self) or self)
    S.build_wandb_workspace("e", "p", "g")
    assert saved == []
    workspace = S.build_wandb_workspace("e", "p", "g", publish=True)
    assert saved == [workspace]
    with pytest.raises(ConfigError, match="quotes"):
        S.build_wandb_workspace("e", "p", "g'x")


def test_online_the_summary_run_uses_every_fine_tuned_checkpoint_artifact_offline_none(logged, monkeypatch):
    """Lineage from the verdicts to the checkpoints: the summary run uses `checkpoint-<run>:epoch-<n>` of each
    fine-tuned row (online only: W&B refuses use_artifact offline); the base model's sanity checks have none."""
    run_dir, *_ = logged
    results = RunFolder(run_dir).results()
    refs = S.checkpoint_artifact_refs(R.public_results(results))
    tuned = results[~results["sanity_check"].astype(bool)]
    assert len(refs) == len(tuned.drop_duplicates(["run_id", "epoch"]))
    assert all(":epoch-" in ref and ref.startswith("checkpoint-") for ref in refs)

    used: list[str] = []

    class FakeRun:
        summary: dict = {}

        def define_metric(self, *a, **k): ...
        def log(self, *a, **k): ...
        def log_artifact(self, *a, **k): ...
        def use_artifact(self, ref):
            used.append(ref)

    for mode, expected in (("offline", []), ("online", refs)):
        used.clear()
        logger = W.WandbResultsLogger(project="p", group="g", mode="offline")
        logger.mode = mode
        monkeypatch.setattr(logger, "_start", lambda *a, **k: FakeRun())
        logger.log_summary(run_dir, results)
        assert used == expected, mode


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"runs": [1]}', '{"runs": {"r1": 3}}', '{"token": 5}',
                                  "\udcff"])
def test_a_damaged_trial_run_ledger_is_one_line_naming_the_file_and_is_left_alone(tmp_path, text):
    """The ledger is read with iclmem.atomic.read_json_object: a damaged one is a DataError naming the file (exit
    2 at the command line), never a JSONDecodeError or an AttributeError from inside the logger."""
    from iclmem.errors import DataError

    path = tmp_path / WANDB_DIR / W.TRIAL_RUNS_FILE
    path.parent.mkdir()
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    before = path.read_bytes()
    with pytest.raises(DataError) as err:
        W.TrialRunsLedger(path, CONFIG_HASH)
    message = str(err.value)
    assert message.startswith(f"{path}")
    assert "\n" not in message
    assert "damaged" in message
    if text not in ("[1, 2]",):  # a JSON that is no object: read_json_object names what it is instead
        assert "delete it to start the trials' W&B runs afresh" in message
    assert err.value.exit_code == 2
    assert path.read_bytes() == before
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["wandb", f"wandb/{W.TRIAL_RUNS_FILE}"]


def test_a_trial_run_ledger_that_is_a_folder_is_named_as_such(tmp_path):
    from iclmem.errors import DataError

    path = tmp_path / W.TRIAL_RUNS_FILE
    path.mkdir()
    with pytest.raises(DataError, match="is a folder, not the W&B trial-run ledger"):
        W.TrialRunsLedger(path, CONFIG_HASH)
