"""End to end on the embedded defaults: the session's real sweep (tests/shared_sweep.py: Ray Tune, pfn-mini,
W&B offline), checked many ways.

The grid plants its ground truth: lr 1e-1 must collapse, label-shuffled members fine-tuned at lr 1e-3
for 40 epochs must be detected as memorization, every fine-tuned checkpoint is probed on a null split too,
and the untouched base model probed as if it were a checkpoint (the pipeline sanity check) must give
exactly no signal.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from shared_sweep import CANARY, FAKE_WANDB_KEY

pytestmark = pytest.mark.slow  # end to end: real Ray Tune sweeps (`make test-fast` leaves them out)


@pytest.fixture
def sweep_run(real_sweep):
    """The session's real sweep (tests/conftest.py: built once, shared with the report and W&B tests)."""
    return real_sweep


def _by(results: pd.DataFrame, **where) -> pd.DataFrame:
    mask = np.ones(len(results), dtype=bool)
    for key, value in where.items():
        mask &= (results[key] == value).to_numpy()
    return results[mask]


def test_every_run_has_one_result_per_scheduled_checkpoint(sweep_run):
    _, results, _ = sweep_run
    trained = results[results["regime"] == "single_fixed"]
    assert sorted(trained["run_id"].unique().size for _ in [0]) == [4]
    for _, group in trained.groupby("run_id"):
        assert sorted(group["epoch"]) == [1, 10, 40]
    assert not results.duplicated(["run_id", "epoch"]).any()
    required = ["task", "model", "regime", "lr", "q", "label_mode", "seed", "epoch", "outcome", "score_kind", "auc",
                "auc_low", "auc_high", "tpr_at_1pct", "tpr_at_10pct", "loss_ratio", "mu_gap", "sigma_gap",
                "config_hash", "git_commit"]
    assert set(required) <= set(results.columns)
    assert set(results["outcome"]) <= {"collapse", "memorization", "inversion", "overfitting", "no_signal"}


def test_tune_wrote_checkpoints_by_epoch_with_their_metrics(sweep_run):
    run_dir, _, _ = sweep_run
    manifests = [json.loads(p.read_text()) for p in (run_dir / "tune").rglob("checkpoint.json")]
    assert len(manifests) == 4 * 3
    for manifest in manifests:
        assert manifest["epoch"] in (1, 10, 40)
        assert {"train_loss", "member_icl_accuracy", "nonmember_icl_accuracy"} <= set(manifest["metrics"])
        assert manifest["metrics"]["epoch"] == manifest["epoch"]
    weights = list((run_dir / "tune").rglob("model.safetensors"))
    assert len(weights) == 12
    # the ground-truth log sits next to every checkpoint: members, non-members, C' and the null split probed
    logs = [json.loads(p.read_text()) for p in (run_dir / "tune").rglob("ground_truth.json")]
    assert len(logs) == 12
    for log in logs:
        (task,) = log["tasks"]
        assert len(task["member_row_ids"]) == 50
        assert len(task["null_splits"]) == 3  # probe.null_splits: 3 (tests/shared_sweep.py)
        used = set(task["member_row_ids"]) | set(task["nonmember_row_ids"]) | set(task["context_row_ids"])
        for split in task["null_splits"]:
            assert not used & set(split["member_row_ids"] + split["nonmember_row_ids"])


def test_every_fine_tuned_checkpoint_is_probed_on_a_null_split_under_every_rule(sweep_run):
    run_dir, results, _ = sweep_run
    trained = results[results["regime"] == "single_fixed"]
    assert (trained["null_splits"] == 3).all()
    assert all(len(json.loads(v)) == 3 for v in trained["null_evidence"])
    for rule in ("paper", "paper_strict", "selection_aware", "selection_aware_strict"):
        assert f"outcome_{rule}" in results.columns
        assert f"null_memorization_{rule}" in results.columns
    assert (results["rule"] == "selection_aware").all()
    assert (results["outcome"] == results["outcome_selection_aware"]).all()
    text = (run_dir / "report.html").read_text()
    assert "Verdict rule: selection_aware" in text
    assert "of 12 null splits" in text  # 4 runs x 3 null splits at run-headline level


def test_high_learning_rate_collapses_the_model(sweep_run):
    _, results, _ = sweep_run
    for mode in ("normal", "shuffled_members"):
        run = _by(results, lr=0.1, label_mode=mode)
        assert "collapse" in set(run["outcome"]), run[["epoch", "outcome", "loss_ratio", "output_std"]]
        collapsed = run[run["outcome"] == "collapse"]
        assert ((collapsed["loss_ratio"] > 5) | (collapsed["output_std"] < 0.01)).all()


def test_shuffled_member_labels_are_detected_as_memorization(sweep_run):
    _, results, _ = sweep_run
    final = _by(results, lr=0.001, label_mode="shuffled_members", epoch=40).iloc[0]
    assert final["outcome"] == "memorization", final.to_dict()
    assert final["auc"] > 0.65
    assert final["auc_low"] > 0.5
    assert final["tpr_at_10pct"] >= 0.2
    # the ε lower bound of a detected run is positive; the base-model sanity check proves nothing
    assert final["epsilon_lb"] > 0
    assert final["run_epsilon_lb"] >= final["epsilon_lb"]
    checks = results[results["regime"] == "base"]
    assert (checks["epsilon_lb"] == 0).all()
    # the shuffled labels are learned: members are predicted from C' far better than non-members
    assert final["member_icl_accuracy"] > final["nonmember_icl_accuracy"] + 0.2
    page = (sweep_run[0] / "report.html").read_text()
    assert "Privacy: ε lower bounds and DP-SGD" in page
    assert "epsilon_over_epochs.png" in page


def test_the_pipeline_sanity_check_on_the_untouched_base_model_gives_exactly_no_signal(sweep_run):
    # not a control (ΔS ≡ 0 by construction: it cannot fail); it checks the pipeline end to end
    _, results, _ = sweep_run
    checks = results[results["regime"] == "base"]
    assert len(checks) == 2  # one per (task, Q, label mode, seed)
    assert checks["sanity_check"].all()
    assert not results.loc[results["regime"] != "base", "sanity_check"].any()
    for _, row in checks.iterrows():
        assert row["null_splits"] == 0
        assert row["outcome"] == "no_signal"
        assert row["auc"] == 0.5
        assert row["epoch"] == 0
        assert row["loss_ratio"] == 1.0


def test_reports_and_figures_are_written(sweep_run):
    run_dir, _, logs = sweep_run
    assert (run_dir / "report.html").is_file()
    pngs = list((run_dir / "figures").glob("*.png"))
    assert len(pngs) >= 3
    assert all(p.stat().st_size > 5000 for p in pngs)
    assert any("report" in line for line in logs)
    split = pd.read_parquet(run_dir / "split_report.parquet")
    assert (split["tvd"] < 0.05).all()


def test_the_report_draws_the_leakage_utility_frontier_of_the_true_label_runs(sweep_run):
    """The real sweep's two true-label runs (lr 1e-1 collapses, lr 1e-3 does not) give the frontier: each
    checkpoint that did not collapse placed by held-out accuracy and its strongest attack; no frontier point
    beaten by another; a collapsed checkpoint is no setting to pick and is left out."""
    from iclmem.record import RESULTS_SCHEMA_VERSION
    from orchestrator.report.frontier import FRONTIER_FIGURE, frontier_table
    from orchestrator.runfolder.run_folder import RunFolder

    run_dir, _, _ = sweep_run
    results = RunFolder(run_dir).results()
    assert RunFolder(run_dir).results_schema_version() == RESULTS_SCHEMA_VERSION  # the aggregator records it
    table = frontier_table(results)
    true_labels = results[(results["label_mode"] == "normal") & ~results["sanity_check"].astype(bool)]
    collapsed = true_labels["outcome"] == "collapse"
    assert collapsed.any()  # lr 1e-1 collapses: the case the frontier must leave out
    kept = true_labels[~collapsed]
    assert len(table) == len(kept)  # every true-label checkpoint that did not collapse has both numbers
    assert set(zip(table["run_id"], table["epoch"])) == set(zip(kept["run_id"], kept["epoch"]))
    merged = table.merge(kept, on=["run_id", "epoch"])
    assert (merged["heldout_accuracy"] == merged["nonmember_icl_accuracy"]).all()
    assert (merged["leakage_tpr_at_1pct"] >= merged["tpr_at_1pct"]).all()
    # the known-context attack is one of the attacks the frontier's leakage is the strongest of
    assert (merged["leakage_tpr_at_1pct"] >= merged["known_context_calibrated_tpr_at_1pct"]).all()
    front = table[table["on_frontier"]]
    assert not front.empty
    for row in table.itertuples():
        beaten = front[(front["heldout_accuracy"] >= row.heldout_accuracy)
                       & (front["leakage_tpr_at_1pct"] <= row.leakage_tpr_at_1pct)
                       & ((front["heldout_accuracy"] > row.heldout_accuracy)
                          | (front["leakage_tpr_at_1pct"] < row.leakage_tpr_at_1pct))]
        assert row.on_frontier == beaten.empty, row
    page = (run_dir / "report.html").read_text()
    assert '<section id="frontier">' in page
    assert (run_dir / "figures" / FRONTIER_FIGURE).stat().st_size > 5000


def test_provenance_written_by_the_sweep_reaches_the_report_and_the_wandb_summary(sweep_run):
    """One writer, one reader: the record a real sweep wrote is read back whole, and its package
    versions (and config hash) are shown in report.html and logged with the W&B summary run."""
    from synthetic_run_dir import read_wandb_records, wandb_config

    from iclmem.provenance import Provenance

    run_dir, results, _ = sweep_run
    record = Provenance.read(run_dir)
    assert record is not None
    assert record.kind == "tabular"
    assert record.sweep_name == "e2e"
    assert record.config_hash == results["config_hash"].iloc[0]
    assert record.seeds == (0,)
    assert record.packages["torch"] == torch_version()
    assert "ray" in record.packages
    page = (run_dir / "report.html").read_text()
    for name in ("torch", "ray", "numpy"):
        assert f"package {name}</dt><dd>{record.packages[name]}</dd>" in page, name
    summary = [r for p in _wandb_runs(run_dir) for r in [read_wandb_records(p)] if "results_table" in str(r)]
    assert len(summary) == 1
    logged = wandb_config(summary[0])["provenance"]  # set at wandb.init: in the run record, not a config record
    assert logged["packages"]["torch"] == record.packages["torch"]
    assert logged["config_hash"] == record.config_hash


def test_the_wandb_summary_run_holds_what_the_report_package_computes_from_the_folder(sweep_run):
    """The sweep-summary run a real sweep logged holds, key for key, the summary and the share history
    :mod:`orchestrator.report.wandb_summary` computes from the folder's public results; its outcome counts
    are the peak checkpoints' counted independently."""
    from synthetic_run_dir import read_wandb_records, wandb_history, wandb_summary

    from orchestrator import report as R
    from orchestrator.report import wandb_summary as S
    from orchestrator.runfolder.run_folder import RunFolder

    run_dir, _, _ = sweep_run
    public = RunFolder(run_dir).results(public=True)
    summary_runs = [records for p in _wandb_runs(run_dir) for records in [read_wandb_records(p)]
                    if "results_table" in str(records)]
    assert len(summary_runs) == 1
    logged = wandb_summary(summary_runs[0])
    want = S.summary_scalars(public)
    assert {k: logged[k] for k in want} == pytest.approx(want)
    peaks = R.peak_checkpoints(public, regime=None)
    counts = {k.split("/", 1)[1]: v for k, v in want.items() if k.startswith("outcome_counts/")}
    assert counts == peaks["outcome"].value_counts().reindex(list(counts), fill_value=0).to_dict()
    assert sum(counts.values()) == len(peaks)
    assert want["n_runs"] == public["run_id"].nunique()
    assert want["n_checkpoints"] == len(public)
    history = [{k: v for k, v in row.items() if not k.startswith("_")} for row in wandb_history(summary_runs[0])
               if S.EPOCH_KEY in row]
    assert history == S.share_history(public)
    assert history, "the detectable share over epochs was not logged"


def torch_version() -> str:
    import torch

    return torch.__version__


def _wandb_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


def test_each_run_logged_its_config_training_and_probe_metrics_to_its_own_wandb_run(sweep_run):
    """One offline W&B run per trial (and per base-model control), opened by the driver: flat config,
    the epochs Tune recorded, and at each checkpoint's epoch the probe row results.parquet holds."""
    from synthetic_run_dir import read_wandb_records, wandb_config, wandb_history, wandb_summary

    from orchestrator import report as R
    from orchestrator.runfolder.run_folder import RunFolder

    run_dir, results, _ = sweep_run
    trained = {}  # run_id -> [(epoch, train_loss)] as Tune recorded them
    for path in (run_dir / "tune").rglob("result.json"):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        trained[lines[0]["run_id"]] = [(r["epoch"], r["train_loss"]) for r in lines]
    ids = {r: e["wandb_id"] for r, e in RunFolder(run_dir).trial_runs()["runs"].items()}
    assert set(ids) == set(results["run_id"])
    assert len(set(ids.values())) == len(ids)
    peaks = R.peak_checkpoints(R.public_results(results), regime=None).set_index("run_id")
    n_trials = 0
    for run_id, rows in results.groupby("run_id"):
        files = sorted((run_dir / "wandb").glob(f"offline-run-*-{ids[run_id]}/run-{ids[run_id]}.wandb"))
        assert len(files) == 1, run_id
        records = read_wandb_records(files[0])
        assert [r.run.run_group for r in records if r.HasField("run")] == ["e2e"]
        config, first = wandb_config(records), rows.iloc[0]
        assert "__trial__" not in config
        assert config["sweep"] == "e2e"
        for key in ("run_id", "task", "model", "regime", "lr", "q", "label_mode", "seed", "config_hash"):
            assert config[key] == first[key], (run_id, key)
        history = wandb_history(records)
        training = [(h["epoch"], h["train_loss"]) for h in history if "train_loss" in h]
        if first["regime"] == "base":
            assert training == []
            assert run_id not in trained
        else:
            n_trials += 1
            # epochs exactly, losses to float precision (pytest.approx takes no list of tuples since 9.2)
            assert [e for e, _ in training] == [e for e, _ in trained[run_id]], run_id
            assert [loss for _, loss in training] == pytest.approx([loss for _, loss in trained[run_id]]), run_id
            assert all("member_icl_accuracy" in h for h in history if "train_loss" in h)
        probed = {h["epoch"]: h for h in history if "probe/outcome" in h}
        assert sorted(probed) == sorted(rows["epoch"]), run_id
        for row in rows.itertuples(index=False):
            logged = probed[row.epoch]
            assert (logged["probe/outcome"], logged["probe/score_kind"]) == (row.outcome, row.score_kind)
            for key in ("auc", "auc_low", "auc_high", "tpr_at_1pct", "tpr_at_10pct", "loss_ratio"):
                want = getattr(row, key)  # a missing value (NaN) is left out of the logged row
                assert logged.get(f"probe/{key}") == (None if pd.isna(want) else pytest.approx(want)), (run_id, key)
        # lineage: every checkpoint as a reference artifact of its run (aliases epoch-N, weights' sha256 from
        # its manifest), and one alert when the run is found memorized
        artifacts = [r.artifact for r in records if r.HasField("artifact")]
        if first["regime"] == "base":
            assert artifacts == []
        else:
            epochs = [int(x.removeprefix("epoch-")) for a in artifacts for x in a.aliases if x.startswith("epoch-")]
            assert sorted(epochs) == sorted(rows["epoch"])
            assert all(json.loads(a.metadata)["weights_sha256"] for a in artifacts)
            assert all(e.ref.startswith("file://") for a in artifacts for e in a.manifest.contents)
        alerts = [r.alert.title for r in records if r.HasField("alert")]
        assert alerts == ([f"memorization: {run_id}"] if (rows["outcome"] == "memorization").any() else []), run_id
        summary = wandb_summary(records)
        assert summary["peak/outcome"] == peaks.loc[run_id, "outcome"]
        assert summary["peak/epoch"] == peaks.loc[run_id, "epoch"]
        assert summary["probe/last_epoch"] == rows["epoch"].max()
    assert n_trials == 4
    summary_runs = [p for p in _wandb_runs(run_dir) if "results_table" in str(read_wandb_records(p))]
    assert len(summary_runs) == 1  # the sweep-level tables, figures and artifact stay in the summary run
    assert any(r.HasField("artifact") for r in read_wandb_records(summary_runs[0]))


def test_the_wandb_key_from_the_environment_appears_in_no_file_the_sweep_wrote(sweep_run, ray_session):
    """Every file under the run folder (prepared tasks, Tune storage, W&B offline runs, reports), the
    Ray session's logs and the W&B settings in the home folder are free of the key."""
    run_dir, _, logs = sweep_run
    assert not any(FAKE_WANDB_KEY in line for line in logs)
    session_dir = Path(ray_session._private.worker._global_node.get_session_dir_path())
    roots = [run_dir, session_dir / "logs", Path.home() / ".netrc", Path.home() / ".config" / "wandb"]
    scanned, leaks = 0, []
    for root in roots:
        for path in ([root] if root.is_file() else root.rglob("*") if root.is_dir() else []):
            if path.is_file():
                scanned += 1
                if FAKE_WANDB_KEY.encode() in path.read_bytes():
                    leaks.append(str(path))
    assert leaks == []
    assert scanned > 50  # the sweep really wrote files (W&B runs, Tune trials, probes, reports)


def test_no_raw_record_reaches_wandb_logs_or_report(sweep_run):
    """A canary planted in a feature column appears nowhere the tool publishes."""
    run_dir, _, logs = sweep_run
    assert not any(CANARY in line for line in logs)
    leaks = []
    for path in run_dir.rglob("*"):
        if path.is_file() and "prepared" not in path.parts:
            if CANARY.encode() in path.read_bytes():
                leaks.append(str(path.relative_to(run_dir)))
    assert leaks == []


def test_the_risk_report_ranks_the_memorized_runs_members_first_and_names_no_row_value(sweep_run):
    """The data owner's tables (#47) from the real sweep: every audited checkpoint's rows scored by both attacks,
    the memorized run's members at higher risk than its non-members, the riskiest rows all members, slices of
    every default family with the text column's rare levels unnamed, and no cell of any table holding a row value."""
    from iclmem.runfolder import RISK_TABLE_FILES
    from orchestrator.runfolder.run_folder import RunFolder

    run_dir, results, _ = sweep_run
    tables = RunFolder(run_dir).risk_tables()
    records = tables["records"]
    audited = results[~results["sanity_check"].astype(bool)]
    weights = records[records["channel"] == "fine_tuned_weights"]
    per_checkpoint = weights.groupby(["run_id", "epoch", "attack"]).agg(members=("member", "sum"), rows=("member", "size"))
    assert len(per_checkpoint) == 2 * len(audited)  # the probe and the known context, at every audited checkpoint
    assert (per_checkpoint["members"] == 50).all()
    assert (per_checkpoint["rows"] == 100).all()
    assert records["risk"].between(0, 1).all()
    memorized = audited[(audited["label_mode"] == "shuffled_members") & (audited["lr"] == 1e-3)]
    last = memorized[memorized["epoch"] == memorized["epoch"].max()]
    mine = weights[(weights["run_id"] == last["run_id"].iloc[0]) & (weights["epoch"] == last["epoch"].iloc[0])
                   & (weights["attack"] == "probe")]
    # measured: 0.24 on this sweep (calibrated AUC 0.76-0.89 over seeds); no signal gives 0 +- 0.03
    assert mine.loc[mine["member"], "risk"].mean() - mine.loc[~mine["member"], "risk"].mean() > 0.1
    riskiest = tables["riskiest"]
    assert len(riskiest) == 20
    assert set(riskiest["row_id"]) <= set(records.loc[records["member"], "row_id"])
    slices = tables["slices"]
    assert {"class", "outlier", "near_duplicates", "rare_categories"} <= set(slices["family"])
    assert "patient_note: rare level (fewer than 10 rows)" in set(slices["slice"])
    slice_risk = tables["slice_risk"]
    assert set(slice_risk["run_id"]) == set(audited["run_id"])
    scored = slice_risk.dropna(subset=["auc"])
    assert not scored.empty
    # the probe's and the known context's slices carry how often the same slice was flagged on the null splits
    # (rows the run never saw, at the run's null headline, through the same tests); the context channel's do not
    measured = scored[(scored["channel"] == "fine_tuned_weights") & scored["attack"].isin(["probe", "known_context"])]
    assert (measured["null_splits"] > 0).mean() > 0.5
    assert measured.loc[measured["null_splits"] > 0, "null_fpr"].between(0, 1).all()
    assert (scored.loc[scored["channel"] == "deployed_context", "null_splits"] == 0).all()
    assert (scored["family_size"] >= scored.groupby("run_id")["slice"].transform("size")).all()
    for name in RISK_TABLE_FILES:
        table = pd.read_parquet(run_dir / name)
        for column in table.columns:
            if table[column].dtype == object:
                assert not table[column].astype(str).str.contains(CANARY, regex=False).any(), (name, column)
    from synthetic_run_dir import read_wandb_records, wandb_summary

    (summary_run,) = [records for p in _wandb_runs(run_dir) for records in [read_wandb_records(p)]
                      if "results_table" in str(records)]
    logged = wandb_summary(summary_run)  # the W&B summary run holds both tables (as table references)
    assert "risk/riskiest_records" in logged
    assert "risk/slice_risk" in logged
    assert "risk/channel_crossing" in logged
    assert "claims/ledger" in logged  # the claims the summary can make, with their null rates (#56)
    page = (run_dir / "report.html").read_text()
    assert "Whose rows leak" in page
    assert "risk_by_slice.png" in page
    assert (run_dir / "figures" / "risk_by_slice.png").stat().st_size > 1000
    assert "Two channels, same rows" in page


def test_two_channels_the_fine_tuned_checkpoint_deployed_with_half_its_rows_is_audited_on_the_same_rows(sweep_run):
    """probe.two_channels (#47): at every fine-tuned checkpoint the same 100 rows are scored through the weights
    (50 fine-tuned on) and through a deployed context (half of each side, label-matched); the memorized run's
    weights channel separates its members inside both context strata, and pfn-mini, which reads its context, is
    found through the context inside both fine-tuned strata."""
    run_dir, results, _ = sweep_run
    from orchestrator.runfolder.run_folder import RunFolder

    tables = RunFolder(run_dir).risk_tables()
    records = tables["records"]
    context = records[records["channel"] == "deployed_context"]
    audited = results[~results["sanity_check"].astype(bool)]
    per_checkpoint = context.groupby(["run_id", "epoch", "attack"]).agg(members=("member", "sum"),
                                                                         rows=("member", "size"))
    # the five context attacks at each fine-tuned run's headline checkpoint (the only one the report reads)
    assert len(per_checkpoint) == 5 * audited["run_id"].nunique()
    assert (per_checkpoint["rows"] == 100).all()
    assert per_checkpoint["members"].between(44, 56).all()  # half of each (fine-tuned, label) cell
    cells = context.drop_duplicates(["run_id", "epoch", "row_id"])
    both = cells.groupby(["run_id", "epoch"]).apply(lambda g: int((g["fine_tuned"] & g["in_context"]).sum()),
                                                    include_groups=False)
    assert both.between(20, 30).all()  # rows in both channels, about a quarter
    crossing = tables["crossing"]
    memorized = audited[(audited["label_mode"] == "shuffled_members") & (audited["lr"] == 1e-3)]
    mine = crossing[crossing["run_id"] == memorized["run_id"].iloc[0]]
    run = mine[mine["target"] == "deployed"].set_index(["channel", "attack", "stratum"])
    # the channel's control: a context of rows the run never saw in the deployed context's place, same flags
    control = mine[mine["target"] == "never_in_context"].set_index(["channel", "attack", "stratum"])
    assert set(control.index) == set(run.index)
    # the weights' cells within the context strata are equal by construction (the weights never read the
    # context): not kept. Measured on this sweep: the context's calibrated loss 0.80 / 0.81 (interval lows 0.68)
    # within the two fine-tuned strata; the lr 1e-1 runs 0.45-0.62
    assert set(crossing["channel"]) == {"deployed_context"}
    for stratum in ("fine_tuned", "not_fine_tuned"):
        assert run.loc[("deployed_context", "calibrated_loss", stratum), "auc"] > 0.65
        assert abs(control.loc[("deployed_context", "calibrated_loss", stratum), "auc"] - 0.5) < 0.2


def test_the_claim_ledger_states_the_memorized_run_with_how_much_how_sure_and_rounding_and_nothing_unmeasured(
        sweep_run):
    """The claim ledger (#56) of the real sweep: the memorized run's verdict is a claim made with its effect size,
    a null rate measured on the null splits through the run's headline selection, and it holds on outputs
    rounded to 4 decimals; the collapsed runs make no claim; every claim the first screen and the console state
    has a measured rate, and the report opens with them."""
    from orchestrator.runfolder.run_folder import RunFolder

    run_dir, results, logs = sweep_run
    ledger = RunFolder(run_dir).claim_ledger()
    assert ledger is not None
    assert not ledger.empty
    audited = results[~results["sanity_check"].astype(bool)]
    memorized = audited[(audited["label_mode"] == "shuffled_members") & (audited["lr"] == 1e-3)]["run_id"].iloc[0]
    verdicts = ledger[ledger["kind"] == "run_verdict"].set_index("subject")
    mine = verdicts.loc[memorized]
    assert mine["made"]
    assert mine["reading"] == "leak"
    assert mine["rounding"] == "survives"
    assert mine["n_null"] == 3 * audited["run_id"].nunique()  # three null splits per checkpoint: 3 trials a run
    assert mine["null_rate"] <= 0.05
    assert mine["auc"] > 0.6
    # a model that memorized moves its members' loss by a share of the rows' spread, not by 1e-5 of it
    assert mine["relative_shift"] > 0.01
    collapsed = audited[audited["lr"] == 1e-1]["run_id"].unique()
    assert not verdicts.loc[list(collapsed), "made"].any()
    stated = ledger[ledger["made"].astype(bool) & (ledger["reading"] != "unmeasured")]
    assert (stated["n_null"] > 0).all()
    assert stated["statement"].str.contains("null trials").all()
    page = (run_dir / "report.html").read_text()
    assert page.index('id="claims"') < page.index('id="risk"')
    assert mine["statement"] in page.replace("&#x27;", "'")
    assert any("claim ledger:" in line for line in logs)
