"""Reference fine-tunes through a package's own fine-tuner (``recipe: upstream`` with ``probe.references``): paired
with their target by recipe output when early stopping ends them at epochs of their own, scheduled as Tune trials
under their own seeds, and every attack also through the classifier the package deploys."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from orchestrator.report.aggregate import reference_checkpoints, upstream_last_epochs
from orchestrator.schema.config import parse_sweep
from trainables.models.extras import extra_is_installed

TINY = dict(weights="random", emsize=16, nlayers=1, nhead=2)


def _references(epochs_by_reference: dict[int, list[int]]) -> pd.DataFrame:
    rows = [{"run_id": f"t-ref{k}", "reference_of": "t", "reference_index": k, "epoch": e}
            for k, epochs in epochs_by_reference.items() for e in epochs]
    return pd.DataFrame(rows)


def test_references_pair_by_epoch_when_every_one_trained_the_target_epochs():
    refs = _references({0: [1, 5, 10], 1: [1, 5, 10]})
    assert reference_checkpoints(refs, "t", 5) == [("t-ref0", 5), ("t-ref1", 5)]
    # recipe iclmem (no last epoch given): a reference without the epoch is missing, never paired elsewhere
    assert reference_checkpoints(_references({0: [1, 5], 1: [1]}), "t", 5) == [("t-ref0", 5)]


def test_an_early_stopped_upstream_target_meets_each_reference_at_its_own_last_epoch():
    # the target stopped at 17; reference 0 ran on to 40, reference 1 stopped at 9
    refs = _references({0: [1, 5, 10, 40], 1: [1, 5, 9]})
    assert reference_checkpoints(refs, "t", 17, target_last_epoch=17) == [("t-ref0", 40), ("t-ref1", 9)]
    # an earlier target epoch: the same epoch where the reference has it, its last where it ended before
    assert reference_checkpoints(refs, "t", 10, target_last_epoch=17) == [("t-ref0", 10), ("t-ref1", 9)]
    assert reference_checkpoints(refs, "t", 5, target_last_epoch=17) == [("t-ref0", 5), ("t-ref1", 5)]
    assert reference_checkpoints(refs, "other", 5, target_last_epoch=17) == []


def test_only_recipe_upstream_targets_are_paired_by_recipe_output():
    results = pd.DataFrame({"run_id": ["u", "u", "i", "i"], "epoch": [1, 17, 1, 30],
                            "model_options": [json.dumps({"recipe": "upstream"})] * 2 + [json.dumps({})] * 2})
    assert upstream_last_epochs(results) == {"u": 17}


def _sweep(**over) -> dict:
    sweep = {"name": "up-refs", "tasks": [{"name": "breast_cancer"}],
             "models": [{"name": "tabpfn-v2", "recipe": "upstream", "options": TINY}],
             "grid": {"q": [32], "label_mode": ["shuffled_members"]}, "data": {"context_size": 64},
             "wandb": {"mode": "disabled"}}
    return {**sweep, **over}


@pytest.mark.skipif(not extra_is_installed("tabpfn-v2"), reason="tabpfn (the tabpfn-v2 extra) is not installed")
def test_an_upstream_sweep_with_references_is_validated_and_the_estimate_counts_its_reference_fine_tunes():
    from orchestrator.estimate.estimate_work import count_work

    without = count_work(parse_sweep(_sweep()))
    with_refs = count_work(parse_sweep(_sweep(probe={"references": 4})))
    assert with_refs.runs == 5 * without.runs  # a target and its 4 reference fine-tunes, each through the package


@pytest.mark.skipif(not extra_is_installed("tabpfn-v2"), reason="tabpfn (the tabpfn-v2 extra) is not installed")
def test_upstream_references_run_as_tune_trials_and_every_attack_also_reads_the_deployed_ensemble(
        ray_session, tmp_path):
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.runfolder.run_folder import RunFolder

    sweep = parse_sweep(_sweep(
        grid={"lr": [1e-2], "q": [32], "label_mode": ["shuffled_members"]},
        training={"epochs": 3, "checkpoint_epochs": [1, 3]},
        probe={"suite": ["base", "skew_true_x2"], "bootstrap": 20, "references": 2, "null_splits": 2},
        resources={"cpus_per_probe_actor": 0.5, "cpus_per_trial": 0.5}))
    results = run_sweep(None, tmp_path / "run", sweep=sweep, progress=False)
    references = RunFolder(tmp_path / "run").reference_results()
    assert references is not None
    assert len(references) > 0
    # each reference trained under a seed of its own, not its target's
    seeds = references.groupby("reference_index")["reference_training_seed"].first()
    assert len(set(seeds)) == 2
    assert 0 not in set(seeds)
    # its deployed classifier drew its own ensemble too: the deployed channel's per-row losses were stored
    tuned = results[results["epoch"] == 3]
    assert (tuned["attack_references"] == 2).all()
    for attack in ("lira_online", "lira_offline", "rmia"):
        for prefix in ("", "known_context_", "deployed_known_context_"):
            column = f"{prefix}{attack}_auc"
            assert tuned[column].between(0, 1).all(), column
        # measured like the network's: attack null splits, their false positives counted
        assert (tuned[f"deployed_known_context_{attack}_null_splits"] == 2).all()
        assert tuned[f"deployed_known_context_{attack}_null_memorization"].between(0, 2).all()
    # the deployed statistic differs from the network's (its own classifier, not a copy of a column)
    assert not np.allclose(tuned["deployed_known_context_rmia_auc"], tuned["known_context_rmia_auc"])
    # every channel's attacks are claims of the ledger with null trials through their own path, in the union
    ledger = RunFolder(tmp_path / "run").claim_ledger()
    attacks = ledger[ledger["kind"] == "reference_attack"]
    n_runs = tuned["run_id"].nunique()
    assert len(attacks) == 3 * n_runs  # probe, known context, deployed known context
    assert (attacks["n_null"] == 2 * n_runs).all()  # (run, attack null split j)
    assert attacks["auc"].between(0, 1).all()
    assert attacks["statement"].str.contains("as the package deploys the weights").sum() == n_runs
    union = ledger[ledger["kind"] == "runs_leaked"].iloc[0]
    assert union["n_null"] >= attacks["n_null"].max()


def test_a_channels_null_trial_fires_when_any_attack_calls_its_null_headline_memorization():
    from orchestrator.report.claim_ledger import _attack_null_hits

    def evidence(*records):
        return json.dumps([{"index": j, "auc": auc, "outcome": outcome} for j, auc, outcome in records])

    rows = pd.DataFrame({
        "epoch": [1, 5],
        # null split 0: LiRA's headline is epoch 5 (AUC 0.7), memorization there; null split 1: its headline
        # (epoch 1, 0.6) says no_signal although epoch 5 said memorization at a lower AUC -- not a hit
        "lira_online_null_evidence": [evidence((0, 0.55, "memorization"), (1, 0.6, "no_signal")),
                                      evidence((0, 0.7, "memorization"), (1, 0.52, "memorization"))],
        "rmia_null_evidence": [evidence((0, 0.5, "no_signal"), (1, 0.5, "no_signal"), (2, 0.9, "memorization")),
                               evidence((0, 0.5, "no_signal"), (1, 0.5, "no_signal"), (2, 0.4, "no_signal"))],
    })
    hits = _attack_null_hits(rows, "")
    assert hits.to_dict() == {0: True, 1: False, 2: True}
    assert _attack_null_hits(rows, "deployed_known_context_") is None
