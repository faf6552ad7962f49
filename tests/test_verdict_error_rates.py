"""Verdicts with measured error rates (issue #14): null splits, the selection-aware rule, Clopper-Pearson
intervals, and the paper's tables computed as the paper computes them.

The planted truth is known both ways: a checkpoint fine-tuned on shuffled member labels has memorized its
members (the real split must be detected) and has never seen the rows of its null splits (every
memorization verdict on them is a false positive)."""

from __future__ import annotations

import json
import tempfile
import warnings

import numpy as np
import pandas as pd
import pytest

from iclmem.errors import ProbeError
from iclmem.runfolder import RESULTS_FILE
from iclmem.vocab import Outcome, VerdictRule
from orchestrator import report as R
from probes.calibration import reference_key
from probes.manipulations import default_suite
from probes.metrics import Calibration, MembershipInput, ScoreKind, clopper_pearson, mann_whitney_p
from probes.outcomes import OutcomeThresholds, build_evidence, classify
from probes.probe import ProbeSettings, headline_columns, known_context_columns, probe_checkpoint
from probes.scoring import ProbePlan, ProbeQueries
from trainables.data import TaskSource, ground_truth_log, null_split, null_split_task, prepare_task
from trainables.spec import TrialConfig

pytestmark = pytest.mark.filterwarnings("ignore::probes.metrics.LowResolutionWarning")


# ------------------------------------------------------------------ statistics


def test_clopper_pearson_interval_matches_the_exact_binomial_interval():
    from scipy import stats

    for k, n in ((0, 20), (2, 20), (5, 100), (100, 100)):
        iv = clopper_pearson(k, n)
        ref = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
        assert iv.low == pytest.approx(ref.low, abs=1e-9)
        assert iv.high == pytest.approx(ref.high, abs=1e-9)
    assert clopper_pearson(0, 100).high == pytest.approx(1 - 0.025 ** (1 / 100))
    with pytest.raises(ProbeError):
        clopper_pearson(3, 2)


def test_mann_whitney_p_value_keeps_its_level_under_the_null_and_detects_a_shift():
    rng = np.random.default_rng(0)
    p = np.array([mann_whitney_p(rng.normal(size=50), rng.normal(size=50)) for _ in range(2000)])
    assert 0.035 < float((p < 0.05).mean()) < 0.065
    assert mann_whitney_p(rng.normal(1.0, 1, 50), rng.normal(size=50)) < 1e-4
    assert mann_whitney_p(np.zeros(5), np.zeros(5)) == 1.0


# ------------------------------------------------------------------ null splits (Stage I)


@pytest.fixture(scope="module")
def task():
    return prepare_task(TaskSource("breast_cancer", "builtin"), label_mode="shuffled_members", q=50)


def test_a_null_split_uses_only_never_trained_rows_with_the_members_label_counts(task):
    used = set(task.member_idx) | set(task.nonmember_idx) | set(task.context_idx)
    for j in range(5):
        m, n = null_split(task, j)
        assert not (set(m) & used)
        assert not (set(n) & used)
        assert not (set(m) & set(n))
        want = np.bincount(task.labels[task.member_idx], minlength=task.n_classes)
        assert (np.bincount(task.labels[m], minlength=2) == want).all()
        assert (np.bincount(task.labels[n], minlength=2) == want).all()
    a, b = null_split(task, 0), null_split(task, 1)
    assert (null_split(task, 0)[0] == a[0]).all()
    assert not np.array_equal(a[0], b[0])


def test_null_splits_are_in_the_ground_truth_log(task):
    log = ground_truth_log(task, null_splits=2)
    assert [s["index"] for s in log["null_splits"]] == [0, 1]
    m, n = null_split(task, 1)
    assert log["null_splits"][1]["member_row_ids"] == [int(v) for v in task.row_ids[m]]
    assert not set(log["null_splits"][0]["member_row_ids"]) & set(log["member_row_ids"])
    assert ground_truth_log(task)["null_splits"] == []


def test_the_reference_cache_key_covers_which_rows_are_probed(task):
    suite = default_suite()[:2]
    real = ProbePlan.build(ProbeQueries.from_task(task), suite, task.seed)
    null = ProbePlan.build(ProbeQueries.from_task(null_split_task(task, 0)), suite, task.seed)
    assert reference_key(task.fingerprint, real, "d") != reference_key(task.fingerprint, null, "d")
    again = ProbePlan.build(ProbeQueries.from_task(task), suite, task.seed)
    assert reference_key(task.fingerprint, real, "d") == reference_key(task.fingerprint, again, "d")


# ------------------------------------------------------------------ planted truth, both ways


EPOCHS = (1, 5, 10)
N_NULL = 20


@pytest.fixture(scope="module")
def shuffled_run(task):
    """A checkpoint series fine-tuned on shuffled member labels, every checkpoint probed on the real split
    and on 20 null splits (the pure path a probe actor runs)."""
    import torch

    from probes.calibration import model_digest
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    torch.manual_seed(0)
    base = build_model("pfn-mini", weights="shipped")
    ft = Finetuner(FinetuneSpec(model="pfn-mini", model_options={"weights": "shipped"}, lr=1e-3,
                                epochs=max(EPOCHS)), [task])
    plan = ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed,
                           compress_rows=base.supports_context_weights)
    settings = ProbeSettings(n_resamples=200, null_splits=N_NULL, n_checkpoints=len(EPOCHS))
    cache = tempfile.mkdtemp()
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while ft.epoch < max(EPOCHS):
            ft.run_epoch()
            if ft.epoch in EPOCHS:
                identity = {"run_id": "shuffled", "task": task.name, "regime": "single_fixed", "q": 50}
                rows.append(probe_checkpoint(ft.model, task, plan, cache, model_digest(base), base, settings,
                                             identity, ft.epoch).row)
    return pd.DataFrame(rows)


@pytest.mark.slow  # fine-tunes (`make test-fast` leaves it out)
def test_shuffled_member_labels_are_detected_on_the_real_split_and_not_on_its_null_splits(shuffled_run):
    last = shuffled_run[shuffled_run["epoch"] == max(EPOCHS)].iloc[0]
    assert last["outcome"] == Outcome.MEMORIZATION
    assert last["rule"] == VerdictRule.SELECTION_AWARE
    assert last["auc_low"] > 0.5
    assert last["p_value"] < last["p_value_threshold"]
    records = json.loads(last["null_evidence"])
    assert len(records) == N_NULL == last["null_splits"]
    assert last["null_memorization_selection_aware"] == 0
    assert all(r["outcome_selection_aware"] != Outcome.MEMORIZATION for r in records)
    # the null splits' AUC intervals are not above chance as the real split's is
    assert sum(r["auc_low_loss"] > 0.5 for r in records) <= 2


def test_over_twenty_null_splits_the_default_rule_run_headline_is_memorization_at_most_twice(shuffled_run):
    rates = R.null_error_rates(shuffled_run).set_index(["rule", "level"])
    head = rates.loc[(VerdictRule.SELECTION_AWARE.value, "run_headline")]
    assert head["n_null"] == N_NULL >= 20
    assert head["n_memorization"] <= 2
    assert rates.loc[(VerdictRule.SELECTION_AWARE.value, "checkpoint"), "n_null"] == N_NULL * len(EPOCHS)
    # the interval is the exact binomial one of the count
    iv = clopper_pearson(int(head["n_memorization"]), int(head["n_null"]))
    assert (head["fpr_low"], head["fpr_high"]) == pytest.approx((iv.low, iv.high))


def test_a_probe_row_carries_every_rule_every_kind_and_the_known_context_baseline(shuffled_run):
    row = shuffled_run.iloc[-1]
    for r in VerdictRule:
        assert row[f"outcome_{r.value}"] in {o.value for o in Outcome}
    for k in ScoreKind:
        for cal in Calibration:
            assert f"{cal.value}_{k.value}_auc" in row.index
            assert f"{cal.value}_{k.value}_p_value" in row.index
    kind = row["score_kind"]
    assert row["raw_auc"] == row[f"uncalibrated_{kind}_auc"]
    assert row["ref_auc"] == row[f"reference_only_{kind}_auc"]
    assert row["tpr_at_10pct"] == row[f"calibrated_{kind}_tpr_at_10pct"]
    # the attacker who knows C' does at least as well as chance on a memorized checkpoint
    assert row["known_context_calibrated_auc"] > 0.5


def test_a_memorized_checkpoint_stays_memorization_on_outputs_rounded_to_four_decimals(shuffled_run):
    """The rounded re-test (probe.output_decimals, default 4) on a real fine-tune: shuffled member labels move
    p(y*) by far more than the printed digits, so the verdict survives rounding; every null split carries the
    rounded verdict and AUCs its null rate is measured from."""
    last = shuffled_run[shuffled_run["epoch"] == max(EPOCHS)].iloc[0]
    assert last["output_decimals"] == 4
    assert last["rounded_outcome"] == Outcome.MEMORIZATION.value
    assert last["rounded_auc"] == pytest.approx(last["auc"], abs=0.02)
    assert last["rounded_p_value"] < last["p_value_threshold"]
    for record in json.loads(last["null_evidence"]):
        assert record["rounded_outcome"] in {o.value for o in Outcome}
        for k in ScoreKind:
            assert abs(record[f"rounded_auc_{k.value}"] - record[f"auc_{k.value}"]) < 0.05


# ------------------------------------------------------------------ the error-rate tables read what they should


def _null(index, auc, flagged):
    verdict = Outcome.MEMORIZATION.value if flagged else Outcome.NO_SIGNAL.value
    return {"index": index, "n_members": 50, "n_nonmembers": 50, "auc_loss": auc, "auc_entropy": auc - 0.01,
            "auc_confidence": 0.99, **{f"outcome_{r.value}": verdict for r in VerdictRule}}


def test_run_headline_error_rate_takes_the_null_splits_peak_checkpoint():
    # null split 0: the flagged checkpoint is the peak -> a headline false positive;
    # null split 1: the flagged checkpoint is not the peak -> none. Confidence (0.99) does not compete.
    rows = [
        {"run_id": "r", "task": "t", "epoch": 0, "regime": "base", "null_evidence": json.dumps([_null(0, 0.9, True)])},
        {"run_id": "r", "task": "t", "epoch": 1, "regime": "single_fixed", "threshold_score_kinds": "loss,entropy",
         "null_evidence": json.dumps([_null(0, 0.70, True), _null(1, 0.55, True)])},
        {"run_id": "r", "task": "t", "epoch": 2, "regime": "single_fixed", "threshold_score_kinds": "loss,entropy",
         "null_evidence": json.dumps([_null(0, 0.60, False), _null(1, 0.65, False)])},
    ]
    rates = R.null_error_rates(pd.DataFrame(rows)).set_index(["rule", "level"])
    ck = rates.loc[("paper", "checkpoint")]
    assert (ck["n_null"], ck["n_memorization"]) == (4, 2)  # the base row (epoch 0) is not a trial
    hd = rates.loc[("paper", "run_headline")]
    assert (hd["n_null"], hd["n_memorization"]) == (2, 1)
    assert hd["fpr"] == 0.5


def test_report_top_states_the_rule_its_thresholds_and_its_measured_rate(tmp_path, shuffled_run):
    results = shuffled_run.copy()
    results.to_parquet(tmp_path / RESULTS_FILE, index=False)
    R.write_html_report(tmp_path, make_figures=False)
    text = (tmp_path / "report.html").read_text()
    top = text[: text.index('id="provenance"')]
    assert "Verdict rule: selection_aware" in top
    assert "family_alpha" in top
    assert f"of {N_NULL} null splits" in top
    assert "Clopper-Pearson" in top
    assert "sanity check" in text
    assert "not a control" in text


# ------------------------------------------------------------------ the paper's tables as the paper computes them


def _tables(seed=0, n=40, entropy_shift=1.5, loss_shift=0.0):
    """Scores tables (one manipulation) where members differ from non-members in entropy only."""
    rng = np.random.default_rng(seed)
    rows, ref = [], []
    for i in range(2 * n):
        member = i < n
        e = rng.normal() - (entropy_shift if member else 0.0)
        loss = rng.normal() - (loss_shift if member else 0.0)
        rows.append({"query_id": i, "member": member, "manipulation": "base", "category": "base",
                     "loss": 2.0 + loss, "entropy": 2.0 + e, "confidence": 0.5})
        ref.append({"query_id": i, "member": member, "manipulation": "base", "category": "base",
                    "loss": 2.0, "entropy": 2.0, "confidence": 0.5})
    return pd.DataFrame(rows), pd.DataFrame(ref)


def test_a_rows_auc_interval_tprs_raw_and_reference_auc_all_come_from_the_deciding_kind():
    ft, ref = _tables()
    settings = ProbeSettings(n_resamples=100)
    ev = build_evidence(ft, ref, 1.0, 0.2, n_resamples=100)
    verdict = classify(ev)
    assert verdict.outcome is Outcome.MEMORIZATION
    assert verdict.score_kind is ScoreKind.ENTROPY
    kind, row = headline_columns(MembershipInput.from_scores_tables(ft, ref), ev, verdict, settings)
    assert kind is ScoreKind.ENTROPY
    assert row["score_kind"] == "entropy"
    m = ev.calibrated[ScoreKind.ENTROPY]
    assert (row["auc"], row["auc_low"], row["tpr_at_10pct"]) == (m.auc, m.auc_interval.low, m.tpr_at_10pct.tpr)
    assert row["raw_auc"] == row["uncalibrated_entropy_auc"] != row["uncalibrated_loss_auc"]
    assert row["raw_score_kind"] == "entropy"


def test_known_context_baseline_is_the_plain_loss_attack_on_the_fine_tuning_pairs():
    member = np.array([True] * 10 + [False] * 10)
    loss_ft = np.where(member, 0.1, 1.0) + np.linspace(0, 0.01, 20)
    cols = known_context_columns(loss_ft, np.ones(20), member, ProbeSettings(n_resamples=50))
    assert cols["known_context_auc"] == 1.0
    assert cols["known_context_calibrated_auc"] == 1.0
    cols = known_context_columns(np.ones(20), np.ones(20), member, ProbeSettings(n_resamples=50))
    assert cols["known_context_auc"] == 0.5


def test_the_known_context_flag_is_the_memorization_rule_on_the_calibrated_known_context_loss():
    """Set where the base-calibrated known-context loss of members is clearly lower (AUC 1, TPR 1), not where
    only the uncalibrated loss is (the base model found the members as easy), and never on a collapsed
    checkpoint; under selection_aware its family is one score per checkpoint, so more checkpoints raise
    the bar (30 + 30 rows perfectly apart pass at one checkpoint, exact p = 1 / C(60, 30) ~ 8.5e-18, and fail at
    10^20 checkpoints, whose bar is 0.05 / 10^20)."""
    member = np.array([True] * 30 + [False] * 30)
    separated = np.where(member, 0.1, 1.0) + np.linspace(0, 0.01, 60)
    settings = ProbeSettings(n_resamples=50)
    assert known_context_columns(separated, np.ones(60), member, settings)["known_context_memorization_flag"]
    calibrated_away = known_context_columns(separated, separated, member, settings)
    assert calibrated_away["known_context_auc"] == 1.0
    assert not calibrated_away["known_context_memorization_flag"]
    assert not known_context_columns(separated, np.ones(60), member, settings,
                                     collapsed=True)["known_context_memorization_flag"]
    many = ProbeSettings(n_resamples=50, n_checkpoints=10**20)
    assert not known_context_columns(separated, np.ones(60), member, many)["known_context_memorization_flag"]


def test_calibration_impact_compares_the_same_rule_over_non_collapsed_checkpoints_only():
    rows = [
        {"run_id": "a", "task": "t", "regime": "single_fixed", "q": 50, "epoch": 1, "outcome": "collapse",
         "raw_outcome": "memorization", "raw_memorization_flag": True, "calibrated_memorization_flag": True},
        {"run_id": "b", "task": "t", "regime": "single_fixed", "q": 50, "epoch": 1, "outcome": "memorization",
         "raw_outcome": "no_signal", "raw_memorization_flag": False, "calibrated_memorization_flag": True},
        {"run_id": "c", "task": "t", "regime": "single_fixed", "q": 50, "epoch": 1, "outcome": "inversion",
         "raw_outcome": "memorization", "raw_memorization_flag": True, "calibrated_memorization_flag": False},
    ]
    t = R.calibration_impact(pd.DataFrame(rows)).loc["all"]
    assert t["n"] == 2
    assert t["raw_flags"] == 1
    assert t["calibrated_flags"] == 1
    assert t["raw_only"] == 1
    assert t["calibrated_only"] == 1


def test_perturbation_effectiveness_is_over_memorized_checkpoints_as_delta_to_the_unmanipulated_context():
    results = pd.DataFrame([
        {"run_id": "m", "task": "t", "regime": "single_fixed", "epoch": 1, "outcome": "memorization", "auc_loss": 0.70},
        {"run_id": "n", "task": "t", "regime": "single_fixed", "epoch": 1, "outcome": "no_signal", "auc_loss": 0.50},
        {"run_id": "o", "task": "t", "regime": "single_fixed", "epoch": 1, "outcome": "memorization", "auc_loss": 0.80},
    ])
    manip = pd.DataFrame([
        {"run_id": "m", "task": "t", "epoch": 1, "manipulation": "base", "category": "base", "auc": 0.65},
        {"run_id": "m", "task": "t", "epoch": 1, "manipulation": "a", "category": "x", "auc": 0.75},
        {"run_id": "m", "task": "t", "epoch": 1, "manipulation": "b", "category": "y", "auc": 0.60},
        # a non-memorized checkpoint where b looks best: must not count
        {"run_id": "n", "task": "t", "epoch": 1, "manipulation": "base", "category": "base", "auc": 0.50},
        {"run_id": "n", "task": "t", "epoch": 1, "manipulation": "a", "category": "x", "auc": 0.40},
        {"run_id": "n", "task": "t", "epoch": 1, "manipulation": "b", "category": "y", "auc": 0.99},
        # a suite without the base context: compared with the checkpoint's overall AUC instead
        {"run_id": "o", "task": "t", "epoch": 1, "manipulation": "a", "category": "x", "auc": 0.90},
    ])
    t = R.perturbation_effectiveness(manip, results).set_index("manipulation")
    assert list(t.index) == ["a", "base", "b"]
    # a: (0.75 - 0.65 against base, 0.90 - 0.80 against o's overall) / 2; b: 0.60 - 0.65
    assert t.loc["a", "mean_delta_auc"] == pytest.approx(0.10)
    assert t.loc["a", "reference"] == "base+overall"
    assert t.loc["b", "mean_delta_auc"] == pytest.approx(-0.05)
    assert t.loc["base", "mean_delta_auc"] == 0.0
    assert t.loc["b", "mean_delta_auc_vs_suite"] == pytest.approx(-0.10)
    assert t["n"].tolist() == [2, 1, 1]


def test_the_peak_checkpoint_of_a_run_is_chosen_over_the_competing_kinds_only():
    results = pd.DataFrame([
        {"run_id": "r", "task": "t", "epoch": 1, "auc_loss": 0.6, "auc_entropy": 0.55, "auc_confidence": 0.95,
         "threshold_score_kinds": "loss,entropy", "outcome": "no_signal"},
        {"run_id": "r", "task": "t", "epoch": 2, "auc_loss": 0.7, "auc_entropy": 0.50, "auc_confidence": 0.50,
         "threshold_score_kinds": "loss,entropy", "outcome": "memorization"},
    ])
    peak = R.peak_checkpoints(results).iloc[0]
    assert peak["epoch"] == 2
    assert peak["peak_kind"] == "loss"


def test_the_sweep_setting_for_null_splits_and_the_rule_reach_the_probe(tmp_path):
    from orchestrator.driver.probe_pools import checkpoints_per_run
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({"name": "x", "tasks": [{"name": "iris"}], "probe": {"null_splits": 3},
                         "training": {"epochs": 30, "checkpoint_epochs": [1, 5, 10, 30]},
                         "outcome": {"rule": "paper", "score_kinds": ["loss", "entropy", "confidence"]}}, "x")
    assert sweep.probe.null_splits == 3
    assert checkpoints_per_run(sweep) == 4
    th = OutcomeThresholds.from_dict(sweep.outcome.model_dump())
    assert th.verdict_rule is VerdictRule.PAPER
    assert len(th.score_kinds) == 3
    assert parse_sweep({"name": "x", "tasks": [{"name": "iris"}]}, "x").probe.null_splits == 1


def test_split_scores_are_the_same_whether_scored_alone_or_in_the_pool():
    # the pool trick rests on a query's contexts not depending on the other queries
    task = prepare_task(TaskSource("iris", "builtin"), q=10, context_size=30)
    suite = default_suite()[:3]
    alone = ProbePlan.build(ProbeQueries.from_task(null_split_task(task, 0)), suite, task.seed)
    m, n = null_split(task, 0)
    pool_rows = np.unique(np.concatenate([m, n, *null_split(task, 1)]))
    alone_plans = {(alone.queries.query_ids[p.query_index], p.manipulation_index): p.plan for p in alone.planned}
    from probes.probe import null_pool_plan

    pool = null_pool_plan(task, [null_split(task, 0), null_split(task, 1)], alone)
    assert len(pool.queries.query_ids) == len(pool_rows)
    for p in pool.planned:
        key = (pool.queries.query_ids[p.query_index], p.manipulation_index)
        if key in alone_plans:
            assert np.array_equal(alone_plans[key].labels, p.plan.labels)


# ------------------------------------------------------------------ realistic regimes


def test_a_multi_task_run_is_probed_on_every_one_of_its_tasks(tmp_path):
    from orchestrator.driver.probe_pools import jobs_for
    from orchestrator.runfolder.prepare import prepare_sweep, trial_config
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({"name": "mf", "tasks": [{"name": "iris"}, {"name": "wine"}],
                         "grid": {"regime": ["multi_fixed"], "lr": [1e-3], "q": [10]},
                         "data": {"context_size": 30}, "training": {"epochs": 2, "checkpoint_epochs": [1, 2]}},
                        "mf")
    prepared = prepare_sweep(sweep, tmp_path / "prepared", log=lambda _m: None)
    (trial,) = prepared.trials
    jobs = jobs_for(TrialConfig.from_tune(trial_config(trial, prepared)), 2, None, tmp_path / "probes")
    assert [j.identity["task"] for j in jobs] == ["iris", "wine"]
    assert [prepared.tasks[j.task_key].name for j in jobs] == ["iris", "wine"]
    assert len({j.stem for j in jobs}) == 2
    assert all(j.identity["run_id"] == trial.run_id for j in jobs)


def test_multi_random_keeps_its_context_uniform_and_every_class_in_the_queries_on_a_70_30_task(tmp_path):
    from trainables.finetune import random_draw

    rng = np.random.default_rng(0)
    n = 400
    frame = pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n),
                          "y": np.where(np.arange(n) < 280, "major", "minor")})
    frame.to_csv(tmp_path / "t.csv", index=False)
    # multi_random's pool: Q + context_size members (20 + 60); the minority holds 24 of them
    task = prepare_task(TaskSource("t", "table", tmp_path / "t.csv", "y"), q=80, context_size=60)
    pool_counts = np.bincount(task.labels[task.member_idx])
    assert pool_counts.min() < 30  # fewer minority members than a uniform 60-row context asks for
    for epoch in range(1, 6):
        ctx, queries = random_draw(task, epoch, 0, n_queries=20)
        counts = np.bincount(task.labels[ctx], minlength=2)
        assert counts[0] == counts[1] > 0
        assert set(task.labels[queries]) == {0, 1}
        assert not set(ctx) & set(queries)
        assert set(ctx) | set(queries) <= set(task.member_idx)
        assert len(queries) == 20


# ------------------------------------------------------------------ LM probes as the paper computes them


def test_one_word_entities_are_in_neither_exposure_group_for_mit_movie_and_dbpedia_lists():
    from probes.lm.exposure import UNCLASSIFIED, classify_table, default_thresholds

    table = pd.DataFrame({"entity": ["Alien", "The Godfather"], "entity_type": ["creative work"] * 2,
                          "n_words": [1, 2], "word_exposure": [1.0, 1.0], "transition_exposure": [np.nan, 0.5]})
    for fmt in ("mit_movie", "entity_list"):
        out = classify_table(table, default_thresholds(fmt))
        for rule in default_thresholds(fmt):
            assert out[f"class_{rule.metric}"].iloc[0] == UNCLASSIFIED
            assert out[f"class_{rule.metric}"].iloc[1] == "memorized"
    # CoNLL keeps its (many) one-word entities under word exposure
    assert classify_table(table, default_thresholds("conll2003"))["class_word"].iloc[0] == "memorized"


def test_an_entity_is_encoded_right_after_the_prefix_without_an_added_space():
    import inspect

    from orchestrator.schema.lm_config import LMSweepConfig
    from probes.lm.exposure import compute_exposure, tokenize_entities

    assert inspect.signature(compute_exposure).parameters["leading_space"].default is False
    assert inspect.signature(tokenize_entities).parameters["leading_space"].default is False
    assert LMSweepConfig.model_fields["leading_space"].default is False


def test_ner_seed_spread_is_the_sample_standard_deviation():
    from probes.lm.report import lm_tables

    rows = [{"model": "m", "dataset": "d", "probe": "ner", "entity_type": "person", "variant": "as-is",
             "criterion": "", "seed": s, "f1": f, "baseline_f1": 0.1, "count": 10}
            for s, f in enumerate([0.5, 0.7, 0.9])]
    t = lm_tables(pd.DataFrame(rows))["table6"]
    assert t["f1_std"].iloc[0] == pytest.approx(np.std([0.5, 0.7, 0.9], ddof=1))


def _two_task_sweep(tmp_path, regime):
    from orchestrator.runfolder.prepare import prepare_sweep
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({"name": regime, "tasks": [{"name": "iris"}, {"name": "wine"}],
                         "models": [{"name": "pfn-mini", "options": {"weights": "shipped"}}],
                         "grid": {"regime": [regime], "lr": [1e-3], "q": [10]}, "data": {"context_size": 30},
                         "training": {"epochs": 2, "checkpoint_epochs": [2]}}, regime)
    return prepare_sweep(sweep, tmp_path / "prepared", log=lambda _m: None)


def test_a_multi_fixed_checkpoint_yields_a_probe_row_for_each_of_its_tasks(tmp_path):
    from orchestrator.driver.probe_pools import jobs_for
    from orchestrator.runfolder.prepare import trial_config
    from probes.actors import ProbeWorker
    from probes.calibration import model_digest
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    prepared = _two_task_sweep(tmp_path, "multi_fixed")
    (trial,) = prepared.trials
    config = trial_config(trial, prepared)
    ft = Finetuner(FinetuneSpec(**config["finetune"]), [prepared.tasks[k] for k in config["task_keys"]])
    ft.train()
    ft.save(tmp_path / "ckpt")
    base = build_model("pfn-mini", weights="shipped")
    worker = ProbeWorker("pfn-mini", {"weights": "shipped"}, base.state_arrays(), model_digest(base), prepared.tasks,
                         "default", ProbeSettings(n_resamples=50, n_checkpoints=1), str(tmp_path / "ref"))
    jobs = jobs_for(TrialConfig.from_tune(config), 2, str(tmp_path / "ckpt"), tmp_path / "probes")
    rows = [worker.run(job).row for job in jobs]
    assert [r["task"] for r in rows] == ["iris", "wine"]
    assert {r["run_id"] for r in rows} == {trial.run_id}
    assert all(r["null_splits"] == 1 for r in rows)
    assert rows[0]["n_members"] == 10
    assert rows[0]["auc"] != rows[1]["auc"]


def test_multi_random_trains_one_model_on_both_tasks_every_epoch(tmp_path):
    from orchestrator.runfolder.prepare import trial_config
    from trainables.finetune import Finetuner, FinetuneSpec

    prepared = _two_task_sweep(tmp_path, "multi_random")
    (trial,) = prepared.trials
    config = trial_config(trial, prepared)
    tasks = [prepared.tasks[k] for k in config["task_keys"]]
    assert [t.name for t in tasks] == ["iris", "wine"]
    ft = Finetuner(FinetuneSpec(**config["finetune"]), tasks)
    batches = ft.batches(1)
    assert [b.n_classes for b in batches] == [t.n_classes for t in tasks]  # one batch of each task
    ft.run_epoch()
    steps = {int(s["step"]) for s in ft.optimizer.state_dict()["state"].values()}
    assert steps == {2}  # one model, one step per task in the epoch


# ------------------------------------------------------------------ #29: rates over what could be a false positive


def test_null_trials_on_collapsed_checkpoints_are_left_out_of_the_non_collapsed_rate():
    collapsed = {**_null(1, 0.9, False), **{f"outcome_{r.value}": Outcome.COLLAPSE.value for r in VerdictRule}}
    rows = [
        {"run_id": "r", "task": "t", "epoch": 1, "regime": "single_fixed", "threshold_score_kinds": "loss,entropy",
         "null_evidence": json.dumps([_null(0, 0.70, True), collapsed])},
        {"run_id": "r", "task": "t", "epoch": 2, "regime": "single_fixed", "threshold_score_kinds": "loss,entropy",
         "null_evidence": json.dumps([_null(0, 0.60, False), _null(1, 0.55, False)])},
    ]
    rates = R.null_error_rates(pd.DataFrame(rows)).set_index(["rule", "level"])
    assert tuple(rates.loc[("paper", "checkpoint"), ["n_null", "n_memorization"]]) == (4, 1)
    assert tuple(rates.loc[("paper", "checkpoint_non_collapsed"), ["n_null", "n_memorization"]]) == (3, 1)
    # null split 1's headline is the collapsed epoch-1 trial (AUC 0.9): no trial left for it
    assert tuple(rates.loc[("paper", "run_headline"), ["n_null", "n_memorization"]]) == (2, 1)
    assert tuple(rates.loc[("paper", "run_headline_non_collapsed"), ["n_null", "n_memorization"]]) == (1, 1)


def test_the_task_peak_is_reported_beside_the_same_maximum_over_its_null_splits():
    def row(run, epoch, auc, nulls):
        return {"run_id": run, "task": "t", "epoch": epoch, "regime": "single_fixed", "lr": 1e-3, "q": 50,
                "outcome": "no_signal", "auc": auc, "auc_loss": auc, "auc_entropy": auc - 0.05,
                "threshold_score_kinds": "loss,entropy",
                "null_evidence": json.dumps([_null(j, a, False) for j, a in enumerate(nulls)])}

    results = pd.DataFrame([row("a", 1, 0.62, [0.55, 0.58]), row("a", 2, 0.60, [0.61, 0.52]),
                            row("b", 1, 0.66, [0.57, 0.64])])
    peak = R.peak_vulnerability_per_task(results).iloc[0]
    assert peak["peak_auc"] == pytest.approx(0.66)
    # null split 0: max(0.55, 0.61, 0.57) = 0.61; null split 1: max(0.58, 0.52, 0.64) = 0.64 -> 95th pct
    assert peak["null_peak_n"] == 2
    assert peak["null_peak_auc"] == pytest.approx(np.percentile([0.61, 0.64], 95))
    # split by a grid axis the null records do not carry themselves: each value gets its own null peak
    by_mode = results.assign(label_mode=["normal", "normal", "shuffled_members"])
    table = R.peak_vulnerability_per_task(by_mode, by=("label_mode",)).set_index("label_mode")
    assert table.loc["normal", "null_peak_auc"] == pytest.approx(np.percentile([0.61, 0.58], 95))
    assert table.loc["shuffled_members", "null_peak_auc"] == pytest.approx(np.percentile([0.57, 0.64], 95))


def test_every_probe_row_carries_its_blind_baseline_and_the_collapse_indicators_views(shuffled_run, task):
    from trainables.data.blind import task_blind_baseline

    blind = task_blind_baseline(task)
    for _, row in shuffled_run.iterrows():
        assert (row["blind_auc"], row["blind_auc_low"], row["blind_auc_high"]) == (blind.auc, blind.auc_low,
                                                                                 blind.auc_high)
        assert row["label_design"] == "matched"
        assert row["exchangeable"]
        assert row["loss_ratio"] == min(row["loss_ratio_true"], row["loss_ratio_spec"])
    # the null splits were drawn from rows whose labels were permuted like the members': at chance too
    for rec in json.loads(shuffled_run.iloc[-1]["null_evidence"]):
        assert 0.3 < rec["blind_auc"] < 0.7


def test_the_report_prints_the_blind_baseline_and_warns_when_the_groups_are_separable(tmp_path, shuffled_run):
    matched = tmp_path / "matched"
    matched.mkdir()
    shuffled_run.to_parquet(matched / RESULTS_FILE, index=False)
    R.write_html_report(matched, make_figures=False)
    top = (matched / "report.html").read_text()
    top = top[: top.index('id="provenance"')]
    assert "Blind baseline:" in top
    assert "separable without the model" not in top
    unmatched = tmp_path / "unmatched"
    unmatched.mkdir()
    paper = shuffled_run.assign(label_design="unmatched", exchangeable=False, blind_auc=0.79, blind_auc_low=0.7,
                                blind_auc_high=0.87, blind_separable=True)
    paper.to_parquet(unmatched / RESULTS_FILE, index=False)
    R.write_html_report(unmatched, make_figures=False)
    top = (unmatched / "report.html").read_text()
    top = top[: top.index('id="provenance"')]
    assert "separable without the model in 1 of 1 runs" in top
    assert "unmatched design" in top


# ------------------------------------------------------------------ #43: claims beyond one run's headline


CLAIM_RUNS, CLAIM_NULLS, CLAIM_EPOCHS, CLAIM_N = 10, 10, (1, 2), 40
PLANTED_RUN = 0  # the one run whose real split memorized (epoch 2)


def _scores_tables(member_loss):
    """Scores tables of one checkpoint on one split (one manipulation; the reference model scores every row
    2.0): the members' probe losses as given, the non-members' spread evenly over [1, 3]. Only the loss
    separates them; entropy and confidence are the same for every row."""
    nonmember_loss = 2.0 + np.linspace(-1.0, 1.0, CLAIM_N)
    ft, ref = [], []
    rows = [(True, v) for v in member_loss] + [(False, v) for v in nonmember_loss]
    for i, (member, loss) in enumerate(rows):
        base = {"query_id": i, "member": member, "manipulation": "base", "category": "base"}
        ft.append({**base, "loss": float(loss), "entropy": 2.0, "confidence": 0.5})
        ref.append({**base, "loss": 2.0, "entropy": 2.0, "confidence": 0.5})
    return pd.DataFrame(ft), pd.DataFrame(ref)


# members worse than the non-members: no rule says memorization
QUIET = 2.0 + np.linspace(-1.0, 1.0, CLAIM_N) + 0.5
# what chance gives one null split of a run now and then: 14 members below every non-member, the rest among
# them; AUC 0.67, p 0.004: below the selection-aware bar of one run (0.05 / 4) but not the task's (0.05 / 40)
LUCKY = np.concatenate([np.linspace(0.0, 0.5, 14), 2.0 + np.linspace(-1.0, 1.0, CLAIM_N - 14) + 1e-3])
# every member below every non-member (p 1e-14): real memorization
PLANTED = np.linspace(0.0, 0.5, CLAIM_N)


def _attack_scores(attack_null_index, seed):
    """One attack's scores on the checkpoint's members then non-members: all tied, except that the half of the
    non-members attack null split ``attack_null_index`` labels member (None: none) scores above the rest."""
    from probes.attacks.membership import attack_null_split

    scores = np.zeros(2 * CLAIM_N)
    if attack_null_index is not None:
        scores[CLAIM_N:][attack_null_split(CLAIM_N, attack_null_index, seed)] = 1.0
    return scores


def _claims_row(seed, epoch, settings):
    """The results row of checkpoint ``epoch`` of run ``seed``, assembled by the probe's own writers
    (``build_evidence``, ``verdicts_by_rule``, ``headline_columns`` and the null-split record of
    ``probes.probe``; the attacks' ``probes.attacks.membership.score_columns``) from planted scores tables.

    IclMem's null split j of run r is lucky (memorization under the selection-aware rule) only when j == r, at
    epoch 2; LiRA online's attack null split (r + 5) % 10 is, at epoch 1. Everything else is quiet."""
    from iclmem.record import check_row
    from iclmem.vocab import Attack
    from probes.attacks.membership import score_columns
    from probes.outcomes import CheckpointOutcome
    from probes.probe import _null_record, verdicts_by_rule

    th, n_ckpt = settings.thresholds, settings.n_checkpoints
    real = _scores_tables(PLANTED if (seed, epoch) == (PLANTED_RUN, 2) else QUIET)
    evidence = build_evidence(*real, 1.0, 0.2, thresholds=th, n_resamples=settings.n_resamples)
    verdicts = verdicts_by_rule(evidence, th, n_ckpt)
    verdict = verdicts[th.verdict_rule]
    _, head = headline_columns(MembershipInput.from_scores_tables(*real), evidence, verdict, settings)
    records = []
    for j in range(CLAIM_NULLS):
        null = _scores_tables(LUCKY if (j, epoch) == (seed, 2) else QUIET)
        null_evidence = build_evidence(*null, 1.0, 0.2, thresholds=th, n_resamples=settings.n_resamples)
        records.append(_null_record(j, null_evidence, verdicts_by_rule(null_evidence, th, n_ckpt), CLAIM_N, CLAIM_N))
    row = {"run_id": f"t-s{seed}", "task": "t", "model": "pfn-mini", "regime": "single_fixed", "lr": 1e-3,
           "q": CLAIM_N, "label_mode": "normal", "seed": seed, **CheckpointOutcome(epoch, evidence, verdict).as_dict(),
           "sanity_check": False, "fine_tuned": True, "rule": th.verdict_rule.value,
           **{f"outcome_{r.value}": v.outcome.value for r, v in verdicts.items()}, **head,
           "n_members": CLAIM_N, "n_nonmembers": CLAIM_N, "null_splits": CLAIM_NULLS,
           **{f"null_memorization_{r.value}": sum(rec[f"outcome_{r.value}"] == Outcome.MEMORIZATION.value
                                                 for rec in records) for r in VerdictRule},
           "null_evidence": json.dumps(records, sort_keys=True)}
    member = np.arange(2 * CLAIM_N) < CLAIM_N
    for attack in Attack:
        lucky = (seed + 5) % CLAIM_NULLS if (attack is Attack.LIRA_ONLINE and epoch == 1) else None
        cols, _ = score_columns(_attack_scores(lucky, seed), member, f"{attack.value}_", n_resamples=20,
                                null_splits=CLAIM_NULLS, seed=seed, thresholds=th, n_checkpoints=n_ckpt)
        row.update(cols)
    check_row(row, "the #43 fixture")
    return row


@pytest.fixture(scope="module")
def claims_results():
    """One task, ten runs (seeds) of two checkpoints, ten null splits each, and the attacks' columns with
    their run headlines as the aggregator adds them (``orchestrator.report.aggregate.attack_headline_columns``)."""
    from orchestrator.report.aggregate import attack_headline_columns

    settings = ProbeSettings(n_resamples=50, null_splits=CLAIM_NULLS, n_checkpoints=len(CLAIM_EPOCHS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = [_claims_row(seed, epoch, settings) for seed in range(CLAIM_RUNS) for epoch in CLAIM_EPOCHS]
    return attack_headline_columns(pd.DataFrame(rows))


def test_the_fixture_plants_one_lucky_null_split_per_run_for_iclmem_and_for_lira(claims_results):
    sa = VerdictRule.SELECTION_AWARE.value
    by_run = claims_results.groupby("run_id")
    assert (by_run[f"null_memorization_{sa}"].sum() == 1).all()
    assert (by_run["lira_online_null_memorization"].sum() == 1).all()
    assert (claims_results["lira_online_run_null_memorization"] == 1).all()
    assert claims_results[["lira_offline_null_memorization", "rmia_null_memorization"]].eq(0).all().all()
    assert list(claims_results.loc[claims_results["outcome"] == Outcome.MEMORIZATION.value, "run_id"]) == ["t-s0"]


def test_a_task_peak_over_runs_is_a_false_positive_far_more_often_than_one_runs_headline(claims_results):
    sa = VerdictRule.SELECTION_AWARE.value
    runs = R.null_error_rates(claims_results).set_index(["rule", "level"])
    assert tuple(runs.loc[(sa, "run_headline"), ["n_null", "n_memorization"]]) == (100, 10)  # 10% per run
    assert tuple(runs.loc[(sa, "checkpoint"), ["n_null", "n_memorization"]]) == (200, 10)
    claims = R.task_claim_error_rates(claims_results).set_index(["rule", "claim"])
    # every null split index has one lucky run, and the task's peak over runs picks it: 10 of 10
    peak = claims.loc[(sa, R.TASK_PEAK.name)]
    assert (peak["n_null"], peak["n_memorization"], bool(peak["covered"])) == (10, 10, False)
    iv = clopper_pearson(10, 10)
    assert (peak["fpr_low"], peak["fpr_high"]) == pytest.approx((iv.low, iv.high))
    assert tuple(claims.loc[(sa, R.TASK_ANY_RUN.name), ["n_null", "n_memorization"]]) == (10, 10)
    # the Bonferroni over the task's runs (F = 10 runs x 2 checkpoints x 2 kinds) rejects every lucky split
    controlled = claims.loc[(sa, R.TASK_VERDICT.name)]
    assert (controlled["n_null"], controlled["n_memorization"], bool(controlled["covered"])) == (10, 0, True)
    # ... and still finds the run that memorized its real members (p 1e-14 against 0.05 / 40)
    table8 = R.peak_vulnerability_per_task(claims_results).iloc[0]
    assert table8["task_verdict"] == Outcome.MEMORIZATION.value
    assert table8["task_family_size"] == 40
    assert table8["task_p_value_threshold"] == pytest.approx(0.05 / 40)


def test_iclmem_or_any_attack_is_a_false_positive_more_often_than_either_alone(claims_results):
    sa = VerdictRule.SELECTION_AWARE.value
    rates = R.any_attack_error_rates(claims_results).set_index("claim")
    assert set(rates["rule"]) == {sa}  # the rule the attacks' verdicts were decided by
    checkpoint = rates.loc[R.CHECKPOINT_ANY_ATTACK.name]
    # IclMem's 10 lucky null splits (epoch 2) and LiRA online's 10 (epoch 1) never share a checkpoint
    assert (checkpoint["n_null"], checkpoint["n_memorization"], bool(checkpoint["covered"])) == (200, 20, False)
    head = rates.loc[R.RUN_HEADLINE_ANY_ATTACK.name]
    # per run, IclMem's null headline j = r and LiRA's j = r + 5 (mod 10): 20 of 100, each alone 10
    assert (head["n_null"], head["n_memorization"]) == (100, 20)
    iv = clopper_pearson(20, 100)
    assert (head["fpr_low"], head["fpr_high"]) == pytest.approx((iv.low, iv.high))
    both = R.claim_error_rates(claims_results)
    assert {R.TASK_PEAK.name, R.CHECKPOINT_ANY_ATTACK.name} <= set(both["claim"])


def test_the_report_top_labels_the_uncovered_claims_with_their_measured_rates(tmp_path, claims_results):
    from iclmem.atomic import write_parquet_atomic

    write_parquet_atomic(claims_results, tmp_path / RESULTS_FILE)
    text = R.write_html_report(tmp_path, make_figures=False).read_text()
    top = text[: text.index('id="provenance"')]
    summary = top[top.index('id="summary"'): top.index('id="verdict-rule"')]
    for part in (summary, top[top.index('id="verdict-rule"'):]):
        assert "Not covered by the 5% guarantee" in part
        assert "the task-level peak (Tab. 8): 10 of 10 null task peaks (100.0%" in part
        assert "IclMem or any attack at the run headline: 20 of 100 null run headlines (20.0%" in part
        assert "Tab. 8&#x27;s task_verdict (Bonferroni over every run of the task): 0 of 10 null tasks" in part
    assert "run headline (the claim the 5% guarantee covers) 10 of 100 null run headlines (10.0%" in summary
    assert "no: not covered by the 5% guarantee" in top
    table8 = text[text.index('<section id="peak-vulnerability">'):]
    table8 = table8[: table8.index("</section>")]
    assert "not covered by the 5% guarantee" in table8
    assert "<th>task_verdict</th>" in table8


@pytest.mark.slow  # fine-tunes (`make test-fast` leaves it out)
def test_the_known_context_flag_is_measured_on_every_null_split_and_is_rarely_set_there(shuffled_run):
    for _, row in shuffled_run.iterrows():
        records = json.loads(row["null_evidence"])
        assert [r["index"] for r in records] == list(range(N_NULL))
        assert row["null_known_context_flags"] == sum(bool(r["known_context_flag"]) for r in records)
    # a run-headline style count: a null split index is a false positive of the channel when any checkpoint of
    # the run flagged it (the flag's family spans the run's checkpoints)
    by_index = [any(json.loads(v)[j]["known_context_flag"] for v in shuffled_run["null_evidence"])
                for j in range(N_NULL)]
    print(f"known-context flag on null splits: {int(shuffled_run['null_known_context_flags'].sum())} of "
          f"{N_NULL * len(shuffled_run)} checkpoint trials, {sum(by_index)} of {N_NULL} run-level; real split: "
          f"{shuffled_run['known_context_memorization_flag'].tolist()}")
    # this fixture (breast_cancer, seed 0) flags 3 of 20; at the flag's nominal 5% the chance of 6 or more is
    # 0.0003. Its rate over seeds is measured by benchmarks/verdict_error_rates.py (RESULTS.md, per family:
    # 0.005-0.020 on iris, 5 seeds x 2 label modes x 20 null splits)
    assert sum(by_index) <= 5, sum(by_index)
