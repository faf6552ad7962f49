"""Canaries with a significance level and the one_run design (issue #33): independent inclusion coins from
the run's seed, the rank test's p-value, the one-run ε bound through a real sweep, DP-SGD's consistency
checks for each neighbour relation, and the report's lines."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from iclmem.errors import ConfigError
from iclmem.runfolder import RESULTS_FILE
from iclmem.vocab import CanaryDesign, CanaryKind
from probes.canaries import canary_tests
from trainables.canaries import CanarySettings, make_canaries
from trainables.data import PrepSettings, TaskSource, prepare_task

ONE_RUN = {"kinds": ["outlier", "rare_label"], "design": "one_run", "m": 64}


def _task(seed: int = 0, name: str = "iris"):
    return prepare_task(TaskSource(name, "builtin", None, None, None), PrepSettings(context_size=30), "normal", seed,
                        q=30)


def _sweep(**canaries):
    from orchestrator.schema.config import parse_sweep

    return parse_sweep({"name": "c", "tasks": [{"name": "iris"}], "canaries": canaries}, "test")


def test_one_run_canaries_are_each_in_by_a_coin_of_the_seed_and_the_log_records_the_coins():
    first, again, other = make_canaries(_task(0), ONE_RUN), make_canaries(_task(0), ONE_RUN), make_canaries(_task(1), ONE_RUN)
    assert len(first) == 128
    assert set(first.copies.tolist()) == {0, 1}
    assert np.array_equal(first.copies, again.copies)
    assert first.fingerprint == again.fingerprint
    assert not np.array_equal(first.copies, other.copies)  # another seed, other coins
    # fair coins: over 10 seeds x 128 canaries the share in is 1/2 within 4 standard deviations (0.056)
    share = np.mean([make_canaries(_task(s), ONE_RUN).copies.mean() for s in range(10)])
    assert abs(share - 0.5) < 0.056
    log = first.log()
    assert log["settings"] == {"kinds": ["outlier", "rare_label"], "design": "one_run", "m": 64}
    assert log["copies"] == first.copies.tolist()
    # each kind gets its own m draws, in and out alike
    kinds = np.array([k.value for k in first.kinds])
    assert (kinds == "outlier").sum() == 64
    assert (kinds == "rare_label").sum() == 64
    assert first.settings.n_inserted_rows == 64  # the expected count, which DP-SGD divides by


def test_the_exposure_designs_settings_and_run_ids_are_unchanged_by_the_one_run_fields():
    from orchestrator.schema.trials import expand_grid

    exposure = CanarySettings((CanaryKind.OUTLIER,))
    assert exposure.as_dict() == {"kinds": ["outlier"], "copies": [1, 2, 4, 8], "per_group": 4, "holdout": 32}
    on, one_run = _sweep(kinds=["outlier"]), _sweep(kinds=["outlier"], design="one_run")
    from orchestrator.schema.config import config_hash_of

    # the hash of a sweep written before the one_run fields existed (its canaries block without them)
    before = on.model_dump(mode="json")
    before["canaries"] = {k: v for k, v in before["canaries"].items() if k not in ("design", "m", "beta", "delta")}
    assert on.config_hash() == config_hash_of(before)
    assert one_run.config_hash() != on.config_hash()
    assert expand_grid(on)[0].run_id != expand_grid(one_run)[0].run_id
    # beta changes no weights: the same run, the probe reads it
    assert expand_grid(_sweep(kinds=["outlier"], beta=0.01))[0].run_id == expand_grid(on)[0].run_id


def test_settings_of_the_other_design_are_refused_naming_them():
    with pytest.raises(ConfigError, match="per_group.*design exposure"):
        _sweep(kinds=["outlier"], design="one_run", per_group=8)
    with pytest.raises(ConfigError, match="m belong.*design one_run"):
        _sweep(kinds=["outlier"], m=64)
    with pytest.raises(ConfigError, match="canaries.m"):
        _sweep(kinds=["outlier"], design="one_run", m=4)
    with pytest.raises(ConfigError, match="canaries.beta"):
        _sweep(kinds=["outlier"], beta=0.7)


def test_the_rank_test_detects_planted_inserted_canaries_and_stays_quiet_on_exchangeable_ones():
    rng = np.random.default_rng(3)
    kinds = (CanaryKind.OUTLIER,) * 48
    copies = np.array([1] * 8 + [8] * 8 + [0] * 32)
    shifted = np.where(copies > 0, 2.5, 0.0) + rng.normal(0, 1, 48)
    planted = canary_tests(kinds, copies, shifted, shifted, beta=0.05)
    assert planted["canary_p_value"] < 1e-4
    assert planted["canary_detected"]
    assert planted["canary_p_value_c8"] < 0.01
    assert planted["canary_p_value_c1"] < 0.01
    # no shift: over 200 draws the test fires in about beta of them (at most 2x beta here)
    fired = sum(canary_tests(kinds, copies, x, x, 0.05)["canary_detected"]
                for x in (rng.normal(0, 1, 48) for _ in range(200)))
    assert fired <= 20
    flat = canary_tests(kinds, copies, np.zeros(48), np.zeros(48), 0.05)
    assert flat["canary_p_value"] == 1.0
    assert not flat["canary_detected"]


def test_dp_sgd_divides_by_the_expected_canary_count_so_the_coins_do_not_set_the_steps_scale():
    from trainables.dp import DPSettings
    from trainables.finetune import Finetuner, FinetuneSpec

    dp = DPSettings.calibrate(4.0, 1e-5, 1.0, 2)
    counts = set()
    for seed in (0, 1):
        finetuner = Finetuner(FinetuneSpec(epochs=2, seed=seed, canaries=ONE_RUN, dp=dp), [_task(seed)])
        batch = finetuner.batches(1)[0]
        assert batch.query_y.numel() == 30 + int(finetuner.canaries.copies.sum())  # the drawn canaries train
        counts.add(finetuner._public_rows(batch))
    assert counts == {30 + 64}


# ------------------------------------------------------------------------------------------- a real sweep
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_sweep_of_one_run_canaries_bounds_epsilon_from_one_run_below_the_accountant(ray_session, tmp_path):
    """digits, 128 outlier canaries each in by a coin, lr 3e-3, 10 epochs, a DP run at ε = 4 and its plain
    twin. The plain run memorizes the canaries: its one-run bound is well above zero (2.30 measured, the
    ceiling of 128 canaries) and the rank test fires; the DP run's bound stays below the accountant's
    add/remove ε (0.36 measured), checked per neighbour relation; the page prints each relation."""
    import pandas as pd

    from orchestrator.driver.sweep import run_sweep
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({
        "name": "one-run", "tasks": [{"name": "digits"}],
        "grid": {"q": [30], "lr": [3e-3], "dp": [4, "inf"]},
        "data": {"context_size": 30}, "training": {"epochs": 10, "checkpoint_epochs": [5, 10]},
        "probe": {"bootstrap": 20, "suite": ["base", "skew_true_x2"], "null_splits": 0},
        "canaries": {"kinds": ["outlier"], "design": "one_run"},
        "resources": {"cpus_per_trial": 1, "cpus_per_probe_actor": 1}, "wandb": {"mode": "disabled"},
    }, "test")
    run_dir = tmp_path / "run"
    run_sweep(None, run_dir, sweep=sweep, progress=False, log=lambda _m: None)
    stored = pd.read_parquet(run_dir / RESULTS_FILE)
    tuned = stored[~stored["sanity_check"].astype(bool)]
    last = tuned[tuned["epoch"] == 10]
    plain = last[last["dp_target_epsilon"].isna()].iloc[0]  # a run without DP has no target ε
    private = last[last["dp_target_epsilon"] == 4.0].iloc[0]
    assert plain["one_run_m"] == 128
    assert 30 < plain["one_run_n_in"] < 98
    assert plain["one_run_epsilon_lb"] > 1.5
    assert plain["canary_detected"]
    assert plain["canary_p_value"] < 1e-6
    assert 0 <= private["one_run_epsilon_lb"] <= private["dp_epsilon"] <= 4.0
    assert private["one_run_consistent"]
    assert private["gdp_consistent"]
    assert private["dp_mu"] == pytest.approx(math.sqrt(10) / private["dp_noise_multiplier"])
    assert private["dp_mu_replace_one"] == pytest.approx(2 * private["dp_mu"])
    assert private["one_run_delta"] == pytest.approx(1e-5)
    assert private["one_run_beta"] == 0.05
    # the coins the probe read are the ones the trainable logged
    truth = [json.loads(p.read_text())["canaries"] for p in sorted((run_dir / "tune").rglob("ground_truth.json"))]
    assert all(t["settings"]["design"] == "one_run" for t in truth)
    assert {sum(t["copies"]) for t in truth} == {int(plain["one_run_n_in"])}  # one seed, one draw of coins
    page = (run_dir / "report.html").read_text()
    for text in ("one-run ε_lb (add/remove)", "accountant ε (add/remove)", "accountant ε (replace-one)",
                 "classic ε_lb (replace-one)", "rank-test p", "Design one_run: 128 canaries"):
        assert text in page, text
    assert CanaryDesign.ONE_RUN.value in json.dumps(json.loads((run_dir / "sweep.json").read_text())["canaries"])
