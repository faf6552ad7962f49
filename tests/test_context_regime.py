"""A sweep's regime ``context``: the deployed-context audit for every task, model, Q and seed of the grid, run
as Ray tasks beside the fine-tuning trials, resumable, in the report; no fine-tuning."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from iclmem.errors import ConfigError, DataError
from orchestrator.schema.config import parse_sweep
from orchestrator.schema.trials import context_audit_specs, expand_grid


def _sweep(**over) -> dict:
    sweep = {"name": "ctx", "tasks": [{"name": "digits"}],
             "grid": {"regime": ["context"], "q": [64]},
             "probe": {"context_references": 16, "bootstrap": 50, "null_splits": 1},
             "resources": {"cpus_per_probe_actor": 0.5, "cpus_per_trial": 0.5},
             "wandb": {"mode": "disabled"}}
    return {**sweep, **over}


def test_regime_context_is_one_audit_per_task_model_q_and_seed_and_no_trial():
    sweep = parse_sweep(_sweep(tasks=[{"name": "digits"}, {"name": "iris"}],
                               grid={"regime": ["context", "single_fixed"], "q": [16, 32], "seed": [0, 1],
                                     "lr": [1e-3, 1e-2]}))
    specs = context_audit_specs(sweep)
    assert len(specs) == 2 * 2 * 2  # tasks x Q x seeds: lr is no axis of an audit
    assert len({s.run_id for s in specs}) == len(specs)
    assert {s.q for s in specs} == {16, 32}
    assert all("-context-" in s.run_id for s in specs)
    assert {t.regime for t in expand_grid(sweep)} == {"single_fixed"}  # no Tune trial for the audits
    assert context_audit_specs(parse_sweep(_sweep(grid={"regime": ["single_fixed"]}))) == []
    # the number of reference contexts is part of an audit's identity
    other = parse_sweep(_sweep(probe={"context_references": 32}))
    assert context_audit_specs(other)[0].run_id != context_audit_specs(parse_sweep(_sweep()))[0].run_id


def test_the_report_line_of_an_audit_takes_the_strongest_attack_on_the_deployed_context_and_the_control_max():
    from orchestrator.report.context_audits import context_audits_table

    rows = pd.DataFrame([
        {"run_id": "a", "task": "t", "model": "m", "q": 8, "seed": 0, "heldout_accuracy": 0.7, "target": target,
         "attack": attack, "auc": auc, "tpr_at_1pct": tpr, "tpr_at_0_1pct": tpr / 2}
        for target, attack, auc, tpr in (("deployed", "loss", 0.6, 0.05), ("deployed", "rmia", 0.8, 0.30),
                                          ("never_in_context", "loss", 0.5, 0.02),
                                          ("never_in_context", "rmia", 0.52, 0.04))])
    verdicts = {"a": {"outcome": "memorization", "trusted": True, "strongest_attack": "rmia"}}
    (line,) = context_audits_table(rows, verdicts).to_dict("records")
    assert line["strongest_attack"] == "rmia"
    assert line["auc"] == 0.8
    assert line["tpr_at_1pct"] == 0.30
    assert line["control_max_tpr_at_1pct"] == 0.04  # the control's highest, not the deployed context's
    assert line["verdict"] == "memorization"
    assert context_audits_table(rows, {}).empty  # an audit without its verdict (unfinished) has no line


def test_settings_of_the_context_regime_are_checked_at_validation():
    with pytest.raises(ConfigError, match="context_references 15: an even number"):
        parse_sweep(_sweep(probe={"context_references": 15}))
    with pytest.raises(ConfigError, match="context_references"):
        parse_sweep(_sweep(probe={"context_references": 512}))
    # reference fine-tunes and canaries belong to the fine-tuning regimes: beside context they are allowed
    parse_sweep(_sweep(grid={"regime": ["single_fixed", "context"]}, probe={"references": 2}))


def test_a_table_too_small_for_its_q_is_refused_before_any_folder_or_cluster_work(tmp_path):
    from orchestrator.driver.sweep import run_sweep

    sweep = parse_sweep(_sweep(tasks=[{"name": "iris"}], grid={"regime": ["context"], "q": [100]}))
    with pytest.raises(DataError, match=r"regime context, task 'iris', grid.q 100: grid.q 100 needs 2 x 100 rows"):
        run_sweep(None, tmp_path / "run", sweep=sweep, progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_sweep_with_regime_context_audits_the_deployed_context_beside_its_trials_and_resumes(ray_session, tmp_path):
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.runfolder.run_folder import RunFolder

    sweep = parse_sweep(_sweep(grid={"regime": ["single_fixed", "context"], "q": [64], "lr": [1e-3]},
                               data={"context_size": 64}, training={"epochs": 1, "checkpoint_epochs": [1]},
                               probe={"suite": ["base", "distractors_1"], "bootstrap": 50, "context_references": 16,
                                      "null_splits": 1, "value_inference": ["label"]}))
    run = tmp_path / "run"
    results = run_sweep(None, run, sweep=sweep, progress=False)
    assert sorted(results["epoch"]) == [0, 1]  # the fine-tuning regime's checkpoints, as ever
    (spec,) = context_audit_specs(sweep)
    folder = run / "context_audits" / spec.run_id
    verdict = json.loads((folder / "verdict.json").read_text())
    # planted by construction: the 64 rows in the deployed context are found against 64 label-matched others...
    assert verdict["outcome"] == "memorization"
    assert verdict["trusted"]
    table = RunFolder(run).context_audits()
    assert set(table["run_id"]) == {spec.run_id}
    deployed = table[table["target"] == "deployed"]
    assert deployed["p_value"].min() < 1e-6
    # ... and the control, 64 rows never in any context, is no_signal under every attack
    control = table[table["target"] == "never_in_context"]
    assert len(control) == 5
    assert (control["outcome"] == "no_signal").all()
    report = (run / "report.html").read_text()
    assert 'id="context-audits"' in report
    assert spec.run_id in report
    # probe.value_inference: label inference beside membership, its rows in the folder and its verdict in the
    # report (digits' labels follow from the features: the model without a row predicts it as well; on a table
    # whose labels are noise pfn-mini gives them away, tests/test_inference_audit.py)
    assert set(verdict["value_inference"]) == {"label"}
    assert verdict["value_inference"]["label"]["trusted"]
    inference = pd.read_parquet(folder / "inference.parquet")
    assert set(inference["target"]) == {"deployed", "never_in_context"}
    assert set(inference["attack"]) == {"label"}
    assert "label_inference" in report
    # ... and broken down by slice in the risk report: each class of digits, exact or permutation tests at the
    # Bonferroni level over the testable slices; a slice of fewer than 8 rows a side is too small, never exposed
    values = RunFolder(run).risk_tables()["value_slices"]
    assert set(values["attack"]) == {"label"}
    assert set(values["family"]) >= {"class"}
    small = (values["n_members"] < 8) | (values["n_nonmembers"] < 8)
    assert values["too_small"].eq(small).all()
    assert not values.loc[small, "exposed"].any()
    assert values.loc[~small, "p_difference"].between(0, 1).all()
    assert (values["level"] <= 0.05).all()
    # the never-in-context control is a null, not an attack of the rows: out of the per-record tables, and the
    # deployed context's slice tests run on it as on null data, so each slice carries how often the control flags it
    tables = RunFolder(run).risk_tables()
    assert not tables["records"]["attack"].str.startswith("never_in_context").any()
    audit_slices = tables["slice_risk"][tables["slice_risk"]["run_id"] == spec.run_id].dropna(subset=["auc"])
    assert not audit_slices.empty
    assert (audit_slices["null_splits"] == 1).all()
    assert audit_slices["null_fpr"].isin([0.0, 1.0]).all()
    ledger = RunFolder(run).claim_ledger()
    context_slices = ledger[ledger["subject"].str.contains(spec.run_id, regex=False)
                            & ledger["kind"].isin(["slice_exposed", "slice_leaks_more"])]
    assert not context_slices.empty  # the 64 rows in the deployed context are exposed in some slice
    assert (context_slices["n_null"] >= 1).all()
    assert (context_slices["reading"] != "leak").all()  # one control: too few null trials to read a rate
    # the records' stability across reference sets: the members' scores against two disjoint halves of the 16
    # reference contexts agree only in part (measured with `iclmem audit-context digits --model pfn-mini
    # --context-size 64 --references 16`, seeds 0-4: Spearman 0.64-0.88, top-20 overlap 0.55-0.85 for the four
    # reference attacks; two unrelated rankings of 64 rows give 0 +- 0.13). The plain loss reads no reference: its
    # halves are equal by construction, so it is left out
    stability = RunFolder(run).risk_tables()["stability"]
    across = stability[stability["between"] == "reference_sets"].set_index("attack")
    assert set(across.index) == {"calibrated_loss", "lira_online", "lira_offline", "rmia"}
    assert (across["n_common"] == 64).all()
    assert (across["spearman"] > 0.3).all()
    # resumed: the finished audit is kept, not run again
    stamp = (folder / "verdict.json").stat().st_mtime_ns
    lines: list[str] = []
    run_sweep(None, run, sweep=sweep, progress=False, log=lines.append)
    assert (folder / "verdict.json").stat().st_mtime_ns == stamp
    assert any("1 of 1 done before, kept" in line for line in lines), lines


@pytest.mark.slow
def test_a_sweep_of_regime_context_alone_writes_its_audits_and_a_report(ray_session, tmp_path):
    from orchestrator.driver.sweep import run_sweep

    sweep = parse_sweep(_sweep(wandb={"mode": "offline", "project": "ctx-test"}))
    results = run_sweep(None, tmp_path / "run", sweep=sweep, progress=False)
    assert results.empty  # no fine-tuned checkpoint
    (spec,) = context_audit_specs(sweep)
    assert (tmp_path / "run" / "context_audits" / spec.run_id / "context_roc.png").is_file()
    assert 'id="context-audits"' in (tmp_path / "run" / "report.html").read_text()
    # one offline W&B run per audit, holding no row of the table
    runs = list((tmp_path / "run" / "context_audits" / spec.run_id / "wandb").glob("offline-run-*"))
    assert len(runs) == 1


def test_validate_counts_the_audits_and_says_when_a_table_leaves_no_room_for_the_control(tmp_path, capsys):
    import yaml

    from orchestrator.cli import main

    config = tmp_path / "ctx.yaml"
    config.write_text(yaml.safe_dump(_sweep(tasks=[{"name": "iris"}], grid={"regime": ["context"], "q": [40]})))
    assert main(["validate", str(config)]) == 0
    out = capsys.readouterr().out
    assert "0 fine-tuning runs and 1 deployed-context audits (regime context)" in out
    assert "no never-in-context control, so the verdict is not trusted; use a larger table or a smaller grid.q" in out


def test_estimate_refuses_a_sweep_of_regime_context_alone_naming_its_audits(tmp_path, capsys):
    import yaml

    from orchestrator.cli import main

    config = tmp_path / "ctx.yaml"
    config.write_text(yaml.safe_dump(_sweep()))
    assert main(["estimate", str(config), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert "no fine-tuning run to estimate (its only regime is context: 1 deployed-context audit(s)" in err


@pytest.mark.skipif(not __import__("trainables.models.extras", fromlist=["x"]).extra_is_installed("tabpfn-v2"),
                    reason="tabpfn-v2: its optional extra is not installed")
def test_a_model_with_the_upstream_recipe_is_audited_as_its_package_deploys_it_on_the_raw_networks_rows():
    """Regime context with ``recipe: upstream``: the package's classifier on the model's weights (one fit per
    context: its preprocessing and ensemble) scores the same prepared rows the raw network would; with
    recipe iclmem the raw network does. The deployed scores equal the adapter's own ``deployed_log_probs``."""
    import numpy as np
    import torch

    from orchestrator.audits.context_audit import prepare_sweep_audit
    from probes.attacks.scorers import AdapterScorer, EstimatorScorer

    def audit(options):
        sweep = parse_sweep(_sweep(tasks=[{"name": "breast_cancer"}], grid={"regime": ["context"], "q": [24]},
                                   models=[{"name": "tabpfn-v2", "options": options}]))
        (spec,) = context_audit_specs(sweep)
        return prepare_sweep_audit(spec, sweep, lambda _line: None)

    raw, deployed = audit({"weights": "mini"}), audit({"weights": "mini", "recipe": "upstream"})
    assert isinstance(raw.scorer, AdapterScorer)
    assert isinstance(deployed.scorer, EstimatorScorer)
    x, y = np.asarray(raw.inputs.population_x), np.asarray(raw.inputs.population_y)
    np.testing.assert_array_equal(x, deployed.inputs.population_x)  # the same rows, prepared once
    member = np.asarray(raw.inputs.member)
    got = deployed.scorer(x[member], y[member], x[~member][:6])
    adapter = deployed.scorer.factory.__self__  # the adapter whose weights the package's classifier loads
    want = adapter.deployed_log_probs(torch.from_numpy(x[member]).float()[None], torch.from_numpy(y[member])[None],
                                      torch.from_numpy(x[~member][:6]).float()[None], 2)[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert not np.allclose(got, raw.scorer(x[member], y[member], x[~member][:6]), atol=1e-3)


def test_value_inference_settings_are_read_together_and_need_the_context_regime(tmp_path):
    with pytest.raises(ConfigError, match="set sensitive"):
        parse_sweep(_sweep(probe={"value_inference": ["attribute"]}))
    with pytest.raises(ConfigError, match="read only by value_inference"):
        parse_sweep(_sweep(probe={"value_inference": ["label"], "sensitive": "secret"}))
    with pytest.raises(ConfigError, match="add context to grid.regime"):
        parse_sweep(_sweep(grid={"regime": ["single_fixed"]}, probe={"value_inference": ["label"]}))
    from orchestrator.audits.context_audit import check_context_audits

    pca = parse_sweep(_sweep(probe={"value_inference": ["attribute"], "sensitive": "pixel_0_3",
                                    "context_references": 16}))
    with pytest.raises(ConfigError, match="probe.value_inference attribute, task 'digits', model pfn-mini: "
                                          "probe.sensitive 'pixel_0_3': the model reads PCA components"):
        check_context_audits(pca)
