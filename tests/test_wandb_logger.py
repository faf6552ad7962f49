"""The results logger: no-op default, offline W&B summary run (inspected on disk) and the W&B Report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from orchestrator import reports as R
from orchestrator import wandb_logger as W
from synthetic_run_dir import CANARY, PLAN, make_synthetic_run_dir, read_wandb_records, run_id

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
    with pytest.raises(ValueError):
        W.resolve_wandb_mode("cloud", environ={})


def test_importing_the_module_does_not_import_wandb():
    code = ("import sys, orchestrator.wandb_logger as w; w.WandbResultsLogger('p', 'g'); "
            "w.make_results_logger('none').log_summary('.', None); "
            "assert 'wandb' not in sys.modules and 'wandb_workspaces' not in sys.modules, 'wandb imported'")
    res = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]


def test_null_logger_is_the_default_and_satisfies_the_protocol(tmp_path):
    logger = W.make_results_logger(None)
    assert isinstance(logger, W.NullResultsLogger) and isinstance(logger, W.ResultsLogger)
    logger.log_summary(tmp_path, pd.DataFrame(), {})
    logger.finish()
    assert list(tmp_path.iterdir()) == []
    assert isinstance(W.make_results_logger("wandb", project="p", group="g"), W.ResultsLogger)
    with pytest.raises(ValueError):
        W.make_results_logger("tensorboard")


def test_keys_are_stable_and_safe():
    assert W.roc_key("single_fixed_bin task_lr0.01_q50", 5) == "roc/single_fixed_bin_task_lr0.01_q50_e5"
    assert W.auc_key("bin/task", 1e-3, 50, regime="single_fixed") == "auc/bin_task/single_fixed/lr=0.001/q=50"


# -- an offline summary run --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """Log the synthetic sweep offline once; return (run_dir, offline run dir, records, logger)."""
    root = tmp_path_factory.mktemp("wb")
    run_dir = make_synthetic_run_dir(root / "sweep")
    raw = pd.read_parquet(run_dir / "results.parquet")  # has the raw_record canary column
    assert CANARY in set(raw["raw_record"].str.slice(0, len(CANARY)))
    from orchestrator import figures as F

    figs = {"outcome_heatmap": F.plot_outcome_heatmap(run_dir, R.load_results(run_dir)),
            "detectable_share": F.plot_detectable_share(run_dir, R.load_results(run_dir))}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_API_KEY", FAKE_KEY)  # present, but the run must stay offline and never store it
        for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
            mp.setenv(var, str(root / "wandb-home" / var.lower()))
        logger = W.WandbResultsLogger(project="iclmem-test", group=GROUP, mode="offline", max_roc_curves=5)
        logger.log_summary(run_dir, raw, figs)
        logger.finish()
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1, list((run_dir / "wandb").iterdir())
    records = read_wandb_records(next(offline[0].glob("run-*.wandb")))
    return run_dir, offline[0], records, logger, root


def _summary(records) -> dict:
    out = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            for item in r.summary.update:
                path = [item.key] if item.key else list(item.nested_key)
                node = out
                for part in path[:-1]:  # nested keys (e.g. a table's metadata) become nested dicts
                    node = node.setdefault(part, {})
                node[path[-1]] = json.loads(item.value_json)
    return out


def test_offline_run_lives_under_run_dir(logged):
    run_dir, offline, records, logger, _ = logged
    assert offline.parent == run_dir / "wandb"
    assert logger.mode == "offline" and logger.run is None  # finished
    kinds = {r.WhichOneof("record_type") for r in records}
    assert {"run", "history", "summary", "artifact"} <= kinds


def test_summary_table_and_media_files(logged):
    run_dir, offline, records, _, _ = logged
    media = offline / "files" / "media"
    tables = list((media / "table").glob("results_table_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert {"run_id", "outcome", "auc", "tpr_at_1pct", "epoch"} <= set(table["columns"])
    assert "raw_record" not in table["columns"] and len(table["data"]) == 160
    peak = json.loads(next((media / "table").glob("peak_table_*.table.json")).read_text())
    assert len(peak["data"]) == 24 + 8
    images = sorted(p.name for p in (media / "images" / "figures").glob("*.png"))
    assert len(images) == 2 and any(n.startswith("outcome_heatmap") for n in images)
    rocs = list((media / "table" / "roc").glob("*_table_*.table.json"))
    assert len(rocs) == 5
    assert set(json.loads(rocs[0].read_text())["columns"]) == {"fpr", "tpr"}


def test_summary_holds_outcome_counts(logged):
    _, _, records, _, _ = logged
    s = _summary(records)
    assert s["outcome_counts/collapse"] == 7 and s["outcome_counts/memorization"] == 6  # 5 main + 1 multi_fixed
    assert s["outcome_counts/inversion"] == 4 and s["n_runs"] == 32
    assert s["outcome_rate/single_fixed/q=50/collapse"] == pytest.approx(4 / 12)
    assert s["max_peak_auc"] == pytest.approx(0.67)
    assert s["results_table"]["_type"] == "table-file" and s["results_table"]["nrows"] == 160


def test_history_has_auc_over_epochs(logged):
    _, _, records, _, _ = logged
    rows = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
    by_epoch = {row["epoch"]: row for row in rows if "epoch" in row}
    assert sorted(by_epoch) == [0, 1, 2, 5, 10]
    key = W.auc_key("bin_task", 1e-2, 50, model="pfn_mini", regime="single_fixed", label_mode="normal")
    assert by_epoch[5][key] == pytest.approx(0.67) and by_epoch[0][key] == pytest.approx(0.5)
    assert by_epoch[10]["detectable_share/q=50"] == pytest.approx(0.25)


def test_results_artifact_is_recorded_with_public_files(logged):
    run_dir, _, records, _, _ = logged
    arts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact" and r.artifact.type == "iclmem-results"]
    assert len(arts) == 1 and arts[0].name == f"iclmem-results-{GROUP}"
    entries = {e.path: Path(e.local_path) for e in arts[0].manifest.contents}
    assert set(entries) == {"results.parquet", "peak_checkpoints.parquet", "split_report.parquet",
                            "manipulation_auc.parquet"}
    for path in entries.values():
        assert path.is_file() and run_dir / "wandb" in path.parents
    exported = pd.read_parquet(entries["results.parquet"])
    assert len(exported) == 160 and "raw_record" not in exported.columns


def test_no_raw_record_or_api_key_in_any_wandb_file(logged):
    run_dir, _, _, _, root = logged
    scanned = 0
    for base in (run_dir / "wandb", root / "wandb-home"):
        for p in base.rglob("*"):
            if p.is_file():
                data = p.read_bytes()
                assert CANARY.encode() not in data, p
                assert FAKE_KEY.encode() not in data, p
                scanned += 1
    assert scanned > 10


# -- W&B Report --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wr():
    return pytest.importorskip("wandb_workspaces.reports.v2", reason="pip install wandb-workspaces")


def test_build_report_blocks_and_panel_queries(wr, logged):
    run_dir, _, records, logger, _ = logged
    results = R.load_results(run_dir)
    report = W.build_wandb_report("my-entity", "iclmem-test", GROUP, results, run_dir=run_dir, max_roc_panels=5)
    assert isinstance(report, wr.Report)
    assert (report.entity, report.project) == ("my-entity", "iclmem-test")
    grids = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    headings = [b.text for b in report.blocks if isinstance(b, wr.H2)]
    assert headings == ["Outcomes", "ROC curves (log-log in the HTML report)", "AUC over epochs"]
    assert len(grids) == 3
    for g in grids:
        assert len(g.runsets) == 1 and g.runsets[0].project == "iclmem-test"
        assert GROUP in g.runsets[0].filters and "Group" in g.runsets[0].filters

    outcome, roc, auc = grids
    table = [p for p in outcome.panels if isinstance(p, wr.WeavePanelSummaryTable)]
    assert len(table) == 1 and table[0].table_name == W.PEAK_TABLE_KEY
    bars = [p for p in outcome.panels if isinstance(p, wr.BarPlot)][0]
    assert bars.metrics == [f"outcome_counts/{o}" for o in R.OUTCOMES]

    assert len(roc.panels) == 5 and all(isinstance(p, wr.CustomChart) for p in roc.panels)
    best = run_id("single_fixed", "bin_task", 1e-2, 50)  # highest peak AUC (0.67) at epoch 5
    assert roc.panels[0].query == {"summaryTable": {"tableKey": f"roc/{best}_e5_table"}}
    assert roc.panels[0].chart_name == "wandb/line/v0" and roc.panels[0].chart_fields == {"x": "fpr", "y": "tpr"}

    assert [p.title for p in auc.panels] == [f"AUC over epochs: {t}" for t in ("bin_task", "multi_task", "reg_task")]
    assert all(isinstance(p, wr.LinePlot) and p.x == "epoch" for p in auc.panels)
    n_bin_lines = sum(1 for (t, _, _) in PLAN if t == "bin_task") + 4  # 8 single_fixed + 2 multi_fixed + 2 multi_random
    assert len(auc.panels[0].y) == n_bin_lines

    # every key the report reads was logged by the summary run
    summary = _summary(records)
    for p in roc.panels:
        assert p.query["summaryTable"]["tableKey"] in summary
    logged_history = logger.logged_keys
    for p in auc.panels:
        assert set(p.y) <= logged_history
    assert set(bars.metrics) <= set(summary)
    assert W.PEAK_TABLE_KEY in summary


def test_report_is_saved_only_when_asked(wr, monkeypatch):
    saved = []
    monkeypatch.setattr(wr.Report, "save", lambda self, *a, **k: saved.append(self) or self)
    W.build_wandb_report("e", "p", "g", auc_keys={"t": ["auc/t/lr=0.01/q=50"]}, roc_keys=["roc/r_e1"])
    assert saved == []
    report = W.build_wandb_report("e", "p", "g", roc_keys=["roc/r_e1"], publish=True)
    assert saved == [report]


# -- the Tune logging actors -------------------------------------------------------------------------


class _StubTrial:
    """What WandbLoggerCallback._start_logging_actor reads of a trial."""

    def __init__(self, path: Path) -> None:
        self.local_path = str(path)


@pytest.mark.parametrize("online", [True, False])
def test_tune_logging_actors_get_the_key_only_online_and_never_as_a_logged_runtime_env_variable(
        ray_session, tmp_path, monkeypatch, online):
    """Ray's own callback ships WANDB_API_KEY as a runtime-env variable, which Ray's runtime-env agent
    writes to its log in plain text; ours passes it as an actor argument, and only when online."""
    import os

    import ray

    from orchestrator.sweep import key_safe_wandb_callback

    shipped = key_safe_wandb_callback(online=online)

    class KeyReportingActor(shipped._logger_actor_cls):
        def run(self):  # instead of wandb.init: report the key this actor process sees
            return os.environ.get("WANDB_API_KEY")

    class Callback(shipped):
        _logger_actor_cls = KeyReportingActor

    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    callback = Callback(project="p", dir=str(tmp_path))
    callback.setup()
    trial = _StubTrial(tmp_path)
    callback._start_logging_actor(trial, [], id="t", name="t", project="p", config={"lr": 0.1}, reinit=True)
    assert os.environ["WANDB_API_KEY"] == FAKE_KEY  # the driver's environment is left as it was
    assert not callback._remote_logger_class._default_options.get("runtime_env", {}).get("env_vars")
    seen = ray.get(callback._trial_logging_futures[trial], timeout=120)
    assert seen == (FAKE_KEY if online else None)  # the session's Ray started without a key in its environment
    callback._cleanup_logging_actors(timeout=5, kill_on_timeout=True)
    session_logs = Path(ray_session._private.worker._global_node.get_session_dir_path()) / "logs"
    leaks = [str(p) for p in session_logs.rglob("*") if p.is_file() and FAKE_KEY.encode() in p.read_bytes()]
    assert leaks == []
