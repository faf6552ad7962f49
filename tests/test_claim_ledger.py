"""The claim ledger (orchestrator/report/claim_ledger.py) and the slice claims' family and null path
(orchestrator/report/record_risk.py): each claim fires on null data at or under its level, a planted leak is still found,
and a claim made on exact outputs only reads so."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from iclmem.vocab import ClaimKind, ClaimReading, RoundingCheck
from orchestrator.report.claim_records import NullTrials, effect_of_scores, reading
from orchestrator.report.record_risk import _correct_run_family, _run_slice_tests
from orchestrator.schema.slices import SliceSettings

SEEDS = range(5)
SETTINGS = SliceSettings(permutations=100)


def _slices(n: int) -> pd.DataFrame:
    """Four slices over rows 0..n-1 (two classes, two halves of an outlier score), as task_slices writes them."""
    rows = []
    for i in range(n):
        rows.append({"task": "t", "row_id": i, "family": "class", "slice": f"class {i % 2}"})
        rows.append({"task": "t", "row_id": i, "family": "outlier", "slice": "outlier high" if i % 3 == 0
                     else "outlier low"})
    return pd.DataFrame(rows)


def _run_tests(scores: dict[str, np.ndarray], member: np.ndarray, run_id: str, slices: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for attack, score in scores.items():
        group = pd.DataFrame({"row_id": np.arange(member.size), "member": member, "score": score})
        for item in _run_slice_tests(group, slices, SETTINGS, 0, False):
            rows.append({"run_id": run_id, "task": "t", "channel": "fine_tuned_weights", "attack": attack, **item})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("seed", SEEDS)
def test_slice_flags_paid_for_the_peak_and_corrected_over_the_run_fire_on_null_runs_at_or_under_the_level(seed):
    # 40 null runs of 4 checkpoints each: the headline is the checkpoint of highest AUC (picked on the same rows),
    # two attacks, four slices; a run is a false positive when any slice is flagged
    from iclmem.stats import auc

    rng = np.random.default_rng(seed)
    n, runs, checkpoints = 60, 40, 4
    member = np.arange(n) < n // 2
    slices = _slices(n)
    fired = 0
    for r in range(runs):
        draws = rng.normal(size=(checkpoints, 2, n))
        peak = int(np.argmax([auc(d[0][member], d[0][~member]) for d in draws]))
        tests = _run_tests({"probe": draws[peak, 0], "known_context": draws[peak, 1]}, member, f"r{r}", slices)
        corrected = _correct_run_family(tests, {f"r{r}": checkpoints})
        fired += bool(corrected["exposed"].any() or corrected["leaks_more"].any())
    # measured over seeds 0-4: 3, 0, 1, 1, 2 of 40 runs (7 of 200, 0.035); the per-attack Holm at the peak it
    # replaces fired on 11, 4, 4, 9, 7 (35 of 200, 0.175). The level is 0.05 per run (2 of 40)
    assert fired <= 4


@pytest.mark.parametrize("seed", SEEDS)
def test_a_planted_leaking_slice_is_still_found_after_the_run_family_correction(seed):
    rng = np.random.default_rng(seed)
    n = 120
    member = np.arange(n) < n // 2
    slices = _slices(n)
    score = rng.normal(size=n)
    score[member & (np.arange(n) % 2 == 0)] += 2.5  # class 0's members alone are exposed
    tests = _run_tests({"probe": score, "known_context": rng.normal(size=n)}, member, "r", slices)
    corrected = _correct_run_family(tests, {"r": 4})
    flagged = corrected[corrected["exposed"]]
    assert set(flagged["slice"]) >= {"class 0"}
    assert "class 1" not in set(flagged.loc[flagged["attack"] == "probe", "slice"])
    assert (corrected["family_size"] == 4 * len(tests)).all()


def test_a_claim_reads_as_a_leak_only_when_made_measured_within_its_level_and_holding_on_rounded_outputs():
    measured = NullTrials(40, 1)
    assert reading(True, measured, RoundingCheck.SURVIVES) is ClaimReading.LEAK
    assert reading(True, measured, RoundingCheck.NOT_TESTED) is ClaimReading.LEAK
    assert reading(True, measured, RoundingCheck.LOST) is ClaimReading.EXACT_OUTPUTS_ONLY
    assert reading(True, NullTrials(0, 0), RoundingCheck.SURVIVES) is ClaimReading.UNMEASURED
    assert reading(True, NullTrials(8, 0), RoundingCheck.SURVIVES) is ClaimReading.TOO_FEW_NULL_TRIALS
    assert reading(True, NullTrials(20, 2), RoundingCheck.SURVIVES) is ClaimReading.WITHIN_CHANCE
    assert reading(False, measured, RoundingCheck.SURVIVES) is ClaimReading.NOT_MADE
    assert NullTrials(40, 1).interval()[0] < 0.025 < NullTrials(40, 1).interval()[1]


def test_the_effect_size_tells_a_shift_of_1e_5_nats_from_one_of_a_nat_that_a_rank_test_cannot():
    rng = np.random.default_rng(0)
    reference_loss = rng.gamma(2.0, 0.5, size=200)  # the rows' spread of the raw loss: about 0.7 nats
    tiny = effect_of_scores(1e-5 + 1e-7 * rng.normal(size=100), 1e-7 * rng.normal(size=100), reference_loss)
    large = effect_of_scores(1.0 + 0.3 * rng.normal(size=100), 0.3 * rng.normal(size=100), reference_loss)
    assert tiny[0] == pytest.approx(1e-5, rel=0.1)
    assert tiny[1] < 1e-4
    assert large[1] > 0.5
    assert ClaimKind.ROWS_AT_RISK.value == "rows_at_risk"


@pytest.mark.slow  # a real sweep (`make test-fast` leaves it out)
def test_lr_1e_9_is_detectable_only_with_exact_outputs_a_planted_run_is_a_leak_and_null_trials_rarely_fire(
        tmp_path, ray_session):
    """The issue's new-user case, through Ray Tune, the probe pool and the aggregator, 5 seeds per learning rate:
    pfn-mini fine-tuned on label-shuffled members at lr 1e-9 moves their loss by about 1e-5 nats. The known
    context still ranks them (a rank test sees any shift), so claims are made on exact outputs; on probabilities
    rounded to 4 decimals every one of them is gone, and neither the console nor the first screen states a leak.
    At lr 1e-3 (planted memorization) the same sweep states a leak for the runs, and every claim's null trials
    (the null splits through its own path) fire at most once in ten."""
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.report.ledger import ledger_lines
    from orchestrator.runfolder.run_folder import RunFolder
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({
        "name": "lr-1e-9", "tasks": [{"name": "digits"}],
        "models": [{"name": "pfn-mini", "options": {"weights": "shipped"}}],
        "grid": {"q": [20], "lr": [1e-9, 1e-3], "label_mode": ["shuffled_members"], "seed": [0, 1, 2, 3, 4]},
        "data": {"context_size": 128},
        "training": {"epochs": 5, "checkpoint_epochs": [5]},
        "probe": {"bootstrap": 100, "null_splits": 2},
        "resources": {"cpus_per_trial": 0.5, "probe_actors": 1, "cpus_per_probe_actor": 0.5},
        "wandb": {"mode": "offline", "project": "iclmem-test"},
    })
    results = run_sweep(None, tmp_path / "run", sweep=sweep, log=lambda _m: None)
    lr = dict(zip(results["run_id"].astype(str), results["lr"], strict=True))
    ledger = RunFolder(tmp_path / "run").claim_ledger()
    runs = ledger[ledger["kind"].isin(["run_verdict", "known_context_flag"])].assign(
        lr=lambda d: d["subject"].map(lr))
    tiny, planted = runs[runs["lr"] == 1e-9], runs[runs["lr"] == 1e-3]
    assert tiny["subject"].nunique() == 5
    assert planted["subject"].nunique() == 5
    # what a rank test sees at lr 1e-9: the members' shift is a millionth of the rows' spread
    assert (tiny["relative_shift"].abs() < 1e-3).all()
    # measured (benchmarks/RESULTS.md, "The claim ledger"): at lr 1e-9 the known-context flag is made on the exact
    # outputs of 10 of 10 seeds and none holds on rounded ones; a test where nothing is made would not exercise
    # the rounded re-test
    made_tiny = tiny[tiny["made"].astype(bool)]
    assert made_tiny["subject"].nunique() >= 3
    assert (made_tiny["rounding"] == "lost").all()
    assert made_tiny["reading"].isin(["exact_outputs_only", "within_chance"]).all()
    # measured here: 4 of 5 planted seeds read as a leak (benchmarks/RESULTS.md: 9 of 10, two checkpoints)
    leaks = planted[planted["reading"] == "leak"]["subject"].nunique()
    assert leaks >= 3
    # every claim's null trials (10 runs x 2 null splits): measured 1 of 20 for the verdict and the known-context
    # flag, 0 of 20 for the slices, 2 of 20 for their union (runs_leaked, which then reads "no more than chance")
    measured = ledger[ledger["n_null"] == 20].drop_duplicates(["kind", "task"]).set_index("kind")
    assert set(measured.index) >= {"run_verdict", "known_context_flag", "runs_leaked"}
    assert (measured.drop(index="runs_leaked")["null_made"] <= 2).all()
    assert measured.loc["runs_leaked", "null_made"] <= 4
    lines = ledger_lines(ledger)
    stated = "\n".join(lines)
    assert all(run_id not in stated.split("Detectable only with exact outputs")[0]
               for run_id in made_tiny["subject"])
    page = (tmp_path / "run" / "report.html").read_text()
    assert 'id="claims"' in page
