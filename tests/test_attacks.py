"""Reference-model attacks (issue #16): LiRA online / offline and RMIA (probes/attacks.py), the reference
trials of a sweep (probe.references: config, Stage I, Tune, aggregation, report), and planted ground truth."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest

from iclmem.errors import ConfigError, ProbeError
from iclmem.vocab import Attack, LabelMode, TrialRole
from probes.attacks import (
    AttackInputs,
    ReferenceStatistics,
    attack_null_split,
    evaluate_attacks,
    fit_gaussians,
    lira_offline,
    lira_online,
    rmia,
)
from probes.metrics import auc

pytestmark = pytest.mark.filterwarnings("ignore::probes.metrics.LowResolutionWarning")


def _stats(n: int = 200, k: int = 8, gap: float = 1.0, sd: float = 0.1, seed: int = 0):
    """n queries, half of them members of the target; k references in complementary pairs. A model that
    trained on a query gives it N(gap, sd), one that did not N(0, sd), target and references alike."""
    rng = np.random.default_rng(seed)
    member = np.zeros(n, dtype=bool)
    member[: n // 2] = True
    in_ref = np.zeros((k, n), dtype=bool)
    for j in range(0, k, 2):
        half = rng.permutation(n) < n // 2
        in_ref[j], in_ref[j + 1] = half, ~half
    target = np.where(member, gap, 0.0) + rng.normal(0, sd, n)
    refs = np.where(in_ref, gap, 0.0) + rng.normal(0, sd, (k, n))
    return member, ReferenceStatistics(target, refs, in_ref)


# ------------------------------------------------------------------------------------------- unit: the math
def test_online_lira_separates_well_separated_in_and_out_distributions_perfectly():
    member, stats = _stats(gap=1.0, sd=0.1)
    scores = lira_online(stats)
    assert auc(scores[member], scores[~member]) == 1.0
    # the fitted means are the planted ones (medians of 4 in- and 4 out-statistics per query)
    fit = fit_gaussians(stats)
    assert abs(np.mean(fit.mu_in) - 1.0) < 0.02 and abs(np.mean(fit.mu_out)) < 0.02
    assert fit.global_variance  # 4 in + 4 out per query: Carlini's fixed (pooled) variance
    assert 0.08 < fit.sigma_in[0] < 0.12  # the pooled deviation of the in-statistics is the planted 0.1
    offline = lira_offline(stats)
    assert auc(offline[member], offline[~member]) == 1.0


def test_each_attack_carries_the_epsilon_lower_bound_its_scores_prove():
    """A perfect separation of n members from n non-members proves at most log(1/FPR_high) with
    FPR_high = 1 - 0.025^(1/n) (Clopper-Pearson at 0 false positives, δ = 0); identical distributions
    prove nothing near that."""
    from probes.attacks import attack_metric_columns

    member, stats = _stats(gap=1.0, sd=0.1)
    scores = lira_online(stats)
    n_m, n_n = int(member.sum()), int((~member).sum())
    cols = attack_metric_columns(scores, member, "x_", n_resamples=50, epsilon_delta=0.0)
    fpr_high = 1 - 0.025 ** (1 / n_n)
    tpr_low = 0.025 ** (1 / n_m)  # all members above the threshold: the lower end at TPR 1
    assert cols["x_epsilon_lb"] == pytest.approx(max(np.log(tpr_low / fpr_high), np.log((1 - fpr_high) / (1 - tpr_low))),
                                                 rel=1e-6)
    null_member, null_stats = _stats(n=2000, gap=0.0, sd=0.1, seed=1)
    null = attack_metric_columns(lira_online(null_stats), null_member, "x_", n_resamples=50)
    assert null["x_epsilon_lb"] < 0.3 * cols["x_epsilon_lb"]


def test_identical_in_and_out_distributions_give_chance_auc():
    member, stats = _stats(n=2000, gap=0.0, sd=0.1, seed=1)
    for scores in (lira_online(stats), lira_offline(stats)):
        assert abs(auc(scores[member], scores[~member]) - 0.5) < 0.04


def test_global_variance_fallback_with_one_in_reference_per_query():
    # K = 2 (one complementary pair): each query has exactly one in- and one out-statistic, so no per-query
    # spread exists; the pooled deviation of all in-statistics (Carlini's np.std(dat_in)) is used instead
    member, stats = _stats(n=400, k=2, gap=1.0, sd=0.1, seed=2)
    fit = fit_gaussians(stats)
    assert fit.global_variance
    assert np.all(fit.sigma_in == fit.sigma_in[0]) and 0.08 < fit.sigma_in[0] < 0.12
    assert np.allclose(fit.mu_in, stats.references[stats.in_reference.argmax(axis=0), np.arange(400)])
    scores = lira_online(stats)
    assert auc(scores[member], scores[~member]) > 0.99
    # with enough references (32 in + 32 out) the variances are per query
    _, many = _stats(n=50, k=64, seed=3)
    assert not fit_gaussians(many).global_variance


def test_lira_scores_follow_the_gaussian_formulas():
    from scipy.stats import norm

    member, stats = _stats(n=20, k=4, seed=4)
    fit = fit_gaussians(stats)
    i = 3
    s = stats.target[i]
    expected = norm.logpdf(s, fit.mu_in[i], fit.sigma_in[i]) - norm.logpdf(s, fit.mu_out[i], fit.sigma_out[i])
    assert lira_online(stats)[i] == pytest.approx(expected)
    assert lira_offline(stats)[i] == pytest.approx(-np.log(norm.sf(s, fit.mu_out[i], fit.sigma_out[i])))


def test_rmia_is_the_share_of_other_queries_with_a_lower_likelihood_ratio():
    target = np.log(np.array([0.9, 0.5, 0.2, 0.6]))
    refs = np.log(np.array([[0.3, 0.5, 0.2, 0.6], [0.3, 0.5, 0.2, 0.6]]))
    # LR = (3, 1, 1, 1): query 0 beats all three others, the rest beat none (ties do not count, gamma = 1)
    assert rmia(target, refs).tolist() == [1.0, 0.0, 0.0, 0.0]
    # a query the references find as easy as the target gets no credit however likely its label is
    assert rmia(np.log([0.99, 0.5]), np.log([[0.99, 0.25]])).tolist() == [0.0, 1.0]
    with pytest.raises(ProbeError):
        rmia(target, refs[:, :3])


def test_attack_null_splits_of_never_trained_rows_do_not_detect():
    member, stats = _stats(n=400, gap=1.0, sd=0.3, seed=5)
    log_p = -np.abs(stats.target)  # any log-likelihood: the null split must not depend on it
    columns, curves = evaluate_attacks(AttackInputs(member, stats, log_p, -np.abs(stats.references)),
                                       n_resamples=200, null_splits=3)
    for a in Attack:
        assert columns[f"{a.value}_null_detections"] == 0
        assert abs(columns[f"{a.value}_null_auc"] - 0.5) < 0.1
        assert len(json.loads(columns[f"{a.value}_null_evidence"])) == 3
    assert columns["lira_online_auc"] > 0.95 and columns["lira_online_auc_low"] > 0.9
    # Clopper-Pearson interval of TPR@1%: 200 members, 2 false positives allowed
    k = columns["lira_online_tpr_at_1pct_n_true_positives"]
    assert columns["lira_online_tpr_at_1pct"] == pytest.approx(k / 200)
    assert columns["lira_online_tpr_at_1pct_low"] < k / 200 < columns["lira_online_tpr_at_1pct_high"] or k == 200
    assert curves["lira_online"]["fpr"][0] == 0.0 and curves["rmia"]["tpr"][-1] == 1.0
    fake = attack_null_split(200, 0, 0)
    assert fake.sum() == 100 and (fake == attack_null_split(200, 0, 0)).all()


def test_reference_statistics_refuse_mismatched_shapes_and_nan():
    with pytest.raises(ProbeError, match=r"\[K, n\]"):
        ReferenceStatistics(np.zeros(3), np.zeros((2, 4)), np.zeros((2, 4), bool))
    with pytest.raises(ProbeError, match="non-finite"):
        ReferenceStatistics(np.array([0.0, np.nan]), np.zeros((2, 2)), np.zeros((2, 2), bool))


# ------------------------------------------------------------------------------------------- config and Stage I
def _sweep(**probe):
    from orchestrator.config import parse_sweep

    return parse_sweep({"name": "refs", "tasks": [{"name": "iris"}], "grid": {"q": [10]},
                        "probe": {"references": 4, **probe}}, "test")


def test_references_add_reference_trials_and_leave_the_runs_ids_and_hash_alone():
    from orchestrator.config import expand_grid, parse_sweep

    plain = parse_sweep({"name": "refs", "tasks": [{"name": "iris"}], "grid": {"q": [10]}}, "test")
    explicit_zero = parse_sweep({"name": "refs", "tasks": [{"name": "iris"}], "grid": {"q": [10]},
                                 "probe": {"references": 0}}, "test")
    assert plain.config_hash() == explicit_zero.config_hash()
    with_refs = _sweep()
    assert with_refs.config_hash() != plain.config_hash()
    trials = expand_grid(with_refs)
    (target,) = expand_grid(plain)
    assert trials[0] == target and trials[0].role == TrialRole.TARGET
    refs = trials[1:]
    assert [t.run_id for t in refs] == [f"{target.run_id}-ref{k}" for k in range(4)]
    assert all(t.role == TrialRole.REFERENCE and t.reference_of == target.run_id for t in refs)
    assert [t.reference_index for t in refs] == [0, 1, 2, 3]
    assert {(t.lr, t.q, t.label_mode, t.seed, t.regime) for t in refs} == {(target.lr, 10, "normal", 0, "single_fixed")}


def test_references_are_refused_with_other_regimes_and_one_reference():
    from orchestrator.config import parse_sweep

    with pytest.raises(ConfigError, match="probe.references"):
        parse_sweep({"name": "x", "tasks": [{"name": "iris"}, {"name": "wine"}],
                     "grid": {"regime": ["single_fixed", "multi_fixed"]}, "probe": {"references": 2}}, "t")
    with pytest.raises(ConfigError, match="references"):
        _sweep(references=1)
    with pytest.raises(ConfigError, match="references"):
        _sweep(references=65)


def test_reference_tasks_are_balanced_halves_of_the_population_with_their_own_fingerprints(tmp_path):
    from orchestrator.prepare import prepare_sweep

    prepared = prepare_sweep(_sweep(), tmp_path, log=lambda _m: None)
    target_key = prepared.trial_tasks[prepared.trials[0].run_id][0]
    target = prepared.tasks[target_key]
    population = set(np.concatenate([target.member_idx, target.nonmember_idx]).tolist())
    ins = np.zeros(len(target.labels), dtype=int)
    fingerprints = {target.fingerprint}
    for trial in prepared.trials[1:]:
        (key,) = prepared.trial_tasks[trial.run_id]
        ref = prepared.tasks[key]
        assert prepared.reference_tasks[key] == target_key
        assert set(ref.member_idx.tolist()) | set(ref.nonmember_idx.tolist()) == population
        assert len(ref.member_idx) == len(ref.nonmember_idx) == 10  # a half of 2Q = 20
        assert (ref.labels == target.labels).all() and (ref.context_idx == target.context_idx).all()
        ins[ref.member_idx] += 1
        fingerprints.add(ref.fingerprint)
    assert len({f[:16] for f in fingerprints}) == 5  # caches keyed by a fingerprint prefix never collide
    assert (ins[sorted(population)] == 2).all()  # complementary pairs: every row is in exactly K/2 = 2
    assert len(prepared.controls) == 1  # one base-model sanity check: the references share the target's


# ------------------------------------------------------------------------------------------- planted ground truth
def planted_attacks(*, n_references: int = 8, epochs: int = 150, lr: float = 1e-3, q: int = 30,
                    context_size: int = 60, seed: int = 0, bootstrap: int = 200, task: str = "iris",
                    label_mode: LabelMode = LabelMode.SHUFFLED_MEMBERS) -> dict:
    """pfn-mini on ``task`` without Ray: the target fine-tuned on label-shuffled members, K references on
    halves of its population (trainables.data.reference_task), every last checkpoint probed with the
    planted suite, the attacks computed as the aggregator computes them. Returns the target's results
    row with the attack columns, and the wall times of the target and of the references."""
    import tempfile

    import torch

    from orchestrator.aggregate import attacks_for_checkpoint
    from orchestrator.selfcheck import PLANTED_SUITE
    from probes.calibration import model_digest
    from probes.manipulations import suite_from_spec
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.data import PrepSettings, TaskSource, prepare_task, reference_task
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    torch.set_num_threads(1)  # as a sweep's trial runs (resources.torch_threads_per_trial); and fast on a busy host
    prep = build_model("pfn-mini").prep_settings(PrepSettings(context_size=context_size))
    prepared = prepare_task(TaskSource(task, "builtin"), prep, label_mode, seed=seed, q=q)
    base = build_model("pfn-mini")
    digest = model_digest(base)
    settings = ProbeSettings(n_resamples=bootstrap, null_splits=0)
    suite = suite_from_spec(list(PLANTED_SUITE))

    def run(t, cache):
        started = time.perf_counter()
        finetuner = Finetuner(FinetuneSpec(model="pfn-mini", lr=lr, epochs=epochs, seed=seed), [t])
        finetuner.train()
        plan = ProbePlan.build(ProbeQueries.from_task(t), suite, t.seed, compress_rows=base.supports_context_weights)
        result = probe_checkpoint(finetuner.model, t, plan, cache, digest, base, settings, {"run_id": "planted"},
                                  epoch=epochs)
        return result, time.perf_counter() - started

    with tempfile.TemporaryDirectory() as cache:
        target, target_s = run(prepared, cache)
        refs = [run(reference_task(prepared, k), cache) for k in range(n_references)]
    columns, _ = attacks_for_checkpoint(target.queries, [r.queries for r, _ in refs], n_resamples=bootstrap,
                                        null_splits=3, seed=seed)
    return {**target.row, **columns, "target_seconds": target_s, "reference_seconds": [s for _, s in refs],
            "query_tables": (target.queries, [r.queries for r, _ in refs])}


@pytest.mark.slow
def test_planted_label_shuffled_members_are_detected_by_lira_and_rmia_and_null_splits_are_not():
    """pfn-mini on iris, Q = 30, |C'| = 60, shuffled member labels, lr 1e-3, 300 epochs, K = 4 (~60 s on a
    loaded 2-core host). Measured (seed 0, 200 resamples): IclMem calibrated loss AUC 0.724 [0.583, ..],
    TPR@1% 0.000; on the probe statistic RMIA 0.720 [0.589, ..], TPR@1% 0.167, LiRA offline 0.613 [0.472, ..],
    LiRA online 0.563 [0.423, ..], both TPR@1% 0; on the known-context loss LiRA online 0.907 [0.832, ..],
    RMIA 0.952 [0.897, ..], both TPR@1% 0.467 (IclMem's base-calibrated known-context loss: 0.951, 0.733).
    LiRA is weaker than ΔS on the zero-information probe statistic: the spread of that statistic over
    reference fine-tunes (sd ~2.5 nats) dwarfs the per-query in/out gap (~0.9), so 2 in- and 2
    out-references per query cannot place a query's Gaussians (README, "Reference-model attacks")."""
    row = planted_attacks(n_references=4, epochs=300)
    # the base-calibrated score finds the planted members (as orchestrator.selfcheck's planted check does) ...
    assert row["calibrated_loss_auc_low"] > 0.5
    # ... and RMIA on the same statistic, at least as well at TPR@1% (no false positive allowed at Q = 30)
    assert row["rmia_auc_low"] > 0.5 and row["rmia_tpr_at_1pct"] >= row["calibrated_loss_tpr_at_1pct"]
    assert row["rmia_tpr_at_1pct"] > 0
    # on the known-context loss both LiRA and RMIA detect, far above chance and above ΔS's TPR@1%
    for a in ("lira_online", "lira_offline", "rmia"):
        assert row[f"known_context_{a}_auc_low"] > 0.75, a
        assert row[f"known_context_{a}_tpr_at_1pct"] > row["calibrated_loss_tpr_at_1pct"], a
    # LiRA online on the probe statistic is weaker than ΔS (see the docstring): the measured gap, kept honest
    assert row["lira_online_auc"] < row["calibrated_loss_auc"]
    # rows the target never trained on, labelled member at random (3 splits of its 30 non-members): no
    # attack on the probe statistic detects, and at most one of the 9 known-context intervals misses 0.5
    for a in Attack:
        evidence = json.loads(row[f"{a.value}_null_evidence"])
        assert all(r["auc_low"] <= 0.5 <= r["auc_high"] for r in evidence), (a, evidence)
    assert sum(row[f"known_context_{a.value}_null_detections"] for a in Attack) <= 1


# ------------------------------------------------------------------------------------------- a real sweep
@pytest.mark.slow
def test_a_sweep_with_references_writes_the_attack_columns_and_the_report_section(ray_session, tmp_path):
    from orchestrator.config import parse_sweep
    from orchestrator.reports import load_results, public_results
    from orchestrator.sweep import run_sweep

    sweep = parse_sweep({
        "name": "refs", "tasks": [{"name": "iris"}], "grid": {"q": [30], "label_mode": ["shuffled_members"]},
        "data": {"context_size": 60}, "training": {"epochs": 4, "checkpoint_epochs": [2, 4]},
        "probe": {"bootstrap": 50, "suite": ["base", "skew_true_x2"], "references": 2},
        "resources": {"cpus_per_probe_actor": 0.5}, "wandb": {"mode": "disabled"},
    }, "test")
    run_dir = tmp_path / "run"
    results = run_sweep(None, run_dir, sweep=sweep, progress=False, log=lambda _m: None)
    # the audited run and its sanity check only: the two reference trials are not audit targets
    assert sorted(results["regime"].unique()) == ["base", "single_fixed"] and "reference_of" not in results.columns
    audited = results[~results["sanity_check"].astype(bool)]
    assert sorted(audited["epoch"]) == [2, 4] and audited["run_id"].nunique() == 1
    refs = pd.read_parquet(run_dir / "reference_results.parquet")
    assert sorted(refs["run_id"].unique()) == [f"{audited['run_id'].iloc[0]}-ref{k}" for k in range(2)]
    assert set(refs["reference_of"]) == {audited["run_id"].iloc[0]} and sorted(refs["epoch"]) == [2, 2, 4, 4]
    for a in Attack:
        for column in (f"{a.value}_auc", f"{a.value}_auc_low", f"{a.value}_tpr_at_1pct", f"{a.value}_tpr_at_0_1pct",
                       f"{a.value}_tpr_at_1pct_high", f"{a.value}_null_auc", f"known_context_{a.value}_auc"):
            assert audited[column].between(0, 1).all(), column
        assert (audited[f"{a.value}_n_members"] == 30).all() and (audited[f"{a.value}_null_splits"] == 1).all()
    assert (audited["attack_references"] == 2).all()
    for a in Attack:  # the ε lower bound each attack proves, beside IclMem's own
        assert (audited[f"{a.value}_epsilon_lb"] >= 0).all(), a
    # every attack column reaches the report and W&B (the allow-list), and the report has the section
    public = public_results(pd.read_parquet(run_dir / "results.parquet"))
    assert {"lira_online_auc", "rmia_tpr_at_0_1pct", "lira_offline_null_evidence", "attack_roc"} <= set(public.columns)
    assert "lira_online_auc" in load_results(run_dir).columns
    page = (run_dir / "report.html").read_text()
    assert "Reference-model attacks: LiRA and RMIA" in page and "attacks_roc.png" in page
    assert (run_dir / "figures" / "attacks_roc.png").stat().st_size > 1000
    # the report's outcome counts see one audited run, not three
    assert "-ref0" not in page.split("Reference-model attacks")[0]
