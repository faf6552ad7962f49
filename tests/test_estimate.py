"""`iclmem estimate`: the grid's work counted, unit costs measured, wall time predicted."""

from __future__ import annotations

import dataclasses

import pytest

import orchestrator.estimate.estimate as estimate_mod
from orchestrator.cli import main
from orchestrator.estimate.estimate import estimate
from orchestrator.estimate.estimate_measure import REPO, Budget, Overheads, UnitCosts, median_time
from orchestrator.estimate.estimate_predict import predict
from orchestrator.estimate.estimate_render import render
from orchestrator.estimate.estimate_work import count_work
from orchestrator.schema.sweep_files import load_sweep

OVERHEADS = Overheads(driver_start_s=1.0, ray_start_s=4.0, actor_start_s=1.5, tune_trial_s=2.0, tune_fixed_s=0.5)

SWEEP = """
name: tiny
tasks:
  - name: breast_cancer
models:
  - name: pfn-mini
    options: {weights: shipped}
grid:
  regime: [single_fixed]
  lr: [1.0e-1, 1.0e-3]
  q: [20]
  label_mode: [normal, shuffled_members]
  seed: [0]
training:
  epochs: 5
  checkpoint_epochs: [1, 5]
data:
  context_size: 64
probe:
  suite: [base, position_first, scale_uniform_x2]
  bootstrap: 50
resources:
  probe_actors: 1
wandb:
  mode: disabled
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(SWEEP)
    return path


def test_work_is_counted_from_the_grid_as_by_hand(config):
    work = count_work(load_sweep(config))
    key = ("pfn-mini", 20, "breast_cancer")
    assert work.runs == 4  # 2 lr x 1 Q x 2 label modes
    assert work.steps == 4 * 5
    assert work.eval_forwards == 2 * 5 * 4
    assert work.schedule == (1, 5)
    assert work.checkpoint_jobs == {key: 8}
    assert work.probe_contexts == {key: 4 * 2 * (2 * 20) * 3}  # runs x checkpoints x 2Q x suite
    assert work.references == {key: 2}
    assert work.controls == {key: 2}
    assert work.reference_contexts == {key: 2 * 40 * 3}
    assert work.control_contexts == {key: 2 * 40 * 3}
    assert work.reference_contexts_saved == 2 * (2 - 1) * 40 * 3  # each reference shared by 2 runs
    assert work.prepared_tasks == 2


def _costs(**changes) -> dict:
    base = UnitCosts(model="pfn-mini", q=20, device="cpu", task="breast_cancer", prepare_s=0.5, epoch_s=0.1,
                     save_s=0.05, plan_s=0.2, contexts=120, forwards_saved=0.3, score_per_context_s=1e-3, rest_s=0.4)
    return {("pfn-mini", 20, "breast_cancer"): dataclasses.replace(base, **changes)}


def test_prediction_adds_each_kind_of_work_and_divides_the_parallel_part_by_the_workers(config):
    work = count_work(load_sweep(config))
    one = predict(work, _costs(), 1, OVERHEADS)
    c = one.compute_s
    assert c["fine-tuning (epochs + checkpoint saves)"] == pytest.approx(4 * (5 * 0.1 + 2 * 0.05))
    # one trial slot on 1 worker: its actor starts once (1.5 s), then 4 trials of 2.0 s each
    assert c["Tune trials (actor start, imports, reports)"] == pytest.approx(1.5 + 4 * 2.0)
    assert c["probe actor start"] == pytest.approx(1 * 1.5)
    assert c["probe scoring (checkpoints + controls)"] == pytest.approx((960 + 240) * 1e-3)
    assert c["reference scoring (once per reference)"] == pytest.approx(240 * 1e-3)
    assert c["rest of probes (ICL, bootstrap, AUCs)"] == pytest.approx((8 + 2) * 0.4)
    # the aggregation after the last probe: 10 checkpoint rows (8 + 2 controls), 2Q = 40 query rows, 1 null split, no
    # W&B summary run
    from orchestrator.estimate.estimate_predict import (
        REPORT_FIXED_S,
        REPORT_QUERY_ROW_S,
        REPORT_ROW_S,
        REPORT_WANDB_SHARE,
    )

    report = (REPORT_FIXED_S + 10 * (REPORT_ROW_S + REPORT_QUERY_ROW_S * 40 * 2)) * (1 - REPORT_WANDB_SHARE)
    assert one.serial_s == pytest.approx({"driver start (imports)": 1.0, "Ray start and stop": 4.0,
                                          "Stage I (driver)": 2 * 0.5, "Tune experiment (setup, teardown)": 0.5,
                                          "aggregation and report": report})
    assert one.wall_s == pytest.approx(6.5 + report + one.parallel_s)
    two = predict(work, _costs(), 2, OVERHEADS)
    assert two.wall_s == pytest.approx(6.5 + report + one.parallel_s / 2)
    assert one.on(2).wall_s == pytest.approx(two.wall_s)
    # many workers: bound by the longest chain (a run's start, epochs, saves, then its last probe)
    many = predict(work, _costs(), 1000, OVERHEADS, probe_actors=1000)
    assert many.longest_s == pytest.approx(1.5 + 2.0 + 5 * 0.1 + 2 * 0.05 + 120 * 1e-3 + 0.4)
    assert many.wall_s == pytest.approx(6.5 + report + many.longest_s)
    assert many.bound == "the longest run"
    assert many.device_hours == pytest.approx(1000 * many.longest_s / 3600)


def test_probe_work_on_too_few_probe_actors_bounds_the_wall_time(config):
    """Every checkpoint's probe runs on one of the probe actors: with 1 of them its work is serial however
    many workers there are, and the estimate says so (and how many actors would lift the bound)."""
    work = count_work(load_sweep(config))
    costs = _costs(score_per_context_s=0.05)  # probing dominates
    one_actor = predict(work, costs, 8, OVERHEADS, probe_actors=1)
    c = one_actor.compute_s
    probe_work = (c["probe scoring (checkpoints + controls)"] + c["rest of probes (ICL, bootstrap, AUCs)"]
                  + c["reference scoring (once per reference)"] + c["probe plans (per task and probe actor)"]
                  + c["probe actor start"])
    assert one_actor.probe_s == pytest.approx(probe_work)
    assert probe_work > one_actor.parallel_s / 8  # the bound binds here
    serial = sum(one_actor.serial_s.values())  # 6.5 s and the aggregation after the last probe
    assert one_actor.wall_s == pytest.approx(serial + probe_work)
    assert one_actor.bound == "the 1 probe actor(s)"
    needed = one_actor.probe_actors_needed()
    assert needed is not None
    assert 1 < needed <= 8
    lifted = one_actor.with_probe_actors(needed)
    assert lifted.wall_s < one_actor.wall_s
    assert lifted.probe_actors == needed
    assert f"with resources.probe_actors = {needed}" in render(one_actor)
    # with as many probe actors as workers the same work is bound by total work / N again
    eight = predict(work, costs, 8, OVERHEADS, probe_actors=8)
    assert eight.bound == "total work / N"
    assert eight.wall_s == pytest.approx(serial + eight.parallel_s / 8)
    assert eight.wall_s < one_actor.wall_s
    # probe actors beyond the workers do not add parallelism
    assert predict(work, costs, 2, OVERHEADS, probe_actors=50).phase_s >= predict(work, costs, 2, OVERHEADS,
                                                                                   probe_actors=2).phase_s


def test_slower_unit_costs_predict_a_longer_sweep(config):
    work = count_work(load_sweep(config))
    fast = predict(work, _costs(), 2, OVERHEADS)
    slow = predict(work, _costs(epoch_s=1.0, score_per_context_s=1e-2), 2, OVERHEADS)
    assert slow.wall_s > fast.wall_s


@pytest.mark.slow  # times fine-tuning epochs (`make test-fast` leaves it out)
def test_estimate_measures_the_configured_model_on_this_device_and_renders_it(config):
    est = estimate(config, workers=3, device="cpu", epochs=1, with_ray=False)
    (costs,) = est.costs.values()
    assert costs.device == "cpu"
    assert costs.contexts == 40 * 3
    assert costs.forwards_saved == pytest.approx(2 / 3)  # pfn-mini: position_first and scale_uniform_x2 = base
    assert costs.extra_contexts > 0  # a fine-tuned checkpoint's probe also scores its null split's pool
    for name in ("prepare_s", "epoch_s", "save_s", "plan_s", "score_per_context_s", "rest_s"):
        assert getattr(costs, name) > 0, name
    o = est.overheads
    assert o.actor_start_s > 0
    assert o.driver_start_s > 0
    assert o.ray_start_s == 0
    assert o.trial_s == o.actor_start_s
    # the bytes it writes, from sizes measured beside the times: AdamW keeps two moments per weight, so the resume
    # state is twice the weights (and the RNG state beside them)
    assert 2.0 <= costs.resume_bytes / costs.weights_bytes <= 2.1
    assert costs.result_bytes > 10_000
    assert costs.prepared_bytes > 1_000
    assert est.disk is not None
    assert est.disk.policy == "weights"
    assert est.on(4).disk is not None
    text = render(est)
    assert "Disk: about" in text
    assert "The driver (this process's Ray client" in text
    assert "aggregation and report after the last probe take about" in text
    assert "Predicted on 3 worker(s)" in text
    assert "fine-tuning runs" in text
    assert "| fine-tuning runs | 4 |" in render(est, markdown=True)


def test_cli_estimate_prints_work_and_predicted_wall_time(config, capsys, monkeypatch):
    monkeypatch.setattr(estimate_mod, "measure_process", lambda code, repeats=1: 1.5)  # no subprocesses here
    monkeypatch.setattr(estimate_mod, "measure_ray", lambda reports: {
        "ray_start_s": 4.5, "actor_start_s": 2.5, "tune_trial_s": 3.0 + reports / 100, "tune_fixed_s": 1.0})
    assert main(["estimate", str(config), "--workers", "2", "--epochs", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "Predicted on 2 worker(s): wall time" in out
    assert ("driver start 1.5 s, Ray start and stop 4.5 s, worker actor start 2.5 s, Tune trial around the work "
            "3.0 s, Tune experiment 1.0 s") in out


def test_a_second_estimate_on_this_machine_reuses_the_measured_overheads_and_says_so(config, capsys, monkeypatch):
    """The driver's, Ray's and Tune's costs are the machine's, not the sweep's: measured by the first estimate, reused
    by the next (its measuring is then its units only), measured again under ICLMEM_REMEASURE=1."""
    calls = []

    def measured(reports):
        calls.append(reports)
        return {"ray_start_s": 4.5, "actor_start_s": 2.5, "tune_trial_s": 3.0, "tune_fixed_s": 1.0}

    monkeypatch.setattr(estimate_mod, "measure_process", lambda code, repeats=1: 1.5)
    monkeypatch.setattr(estimate_mod, "measure_ray", measured)
    argv = ["estimate", str(config), "--workers", "2", "--epochs", "1", "--device", "cpu"]
    assert main(argv) == 0
    assert "(kept for the next estimate here)" in capsys.readouterr().out
    assert main(argv) == 0
    second = capsys.readouterr().out
    assert len(calls) == 1
    assert "measured on this machine at" in second
    assert "Ray start and stop 4.5 s" in second  # the kept figures, not new ones
    monkeypatch.setenv("ICLMEM_REMEASURE", "1")
    assert main(argv) == 0
    assert len(calls) == 2


# ------------------------------------------------------------------------------------------------ measuring once
TWO_TASKS = SWEEP.replace("  - name: breast_cancer\n", "  - name: breast_cancer\n  - name: wine\n").replace(
    "q: [20]", "q: [20, 30]")


def _counting(monkeypatch) -> list[tuple]:
    """measure_unit_costs replaced by a stub that records its (model, Q, task, budget) calls; no subprocess."""
    calls: list[tuple] = []

    def fake(sweep, model, options, q, task_config, device, **kw):
        calls.append((model, q, task_config.name, kw.get("budget_s")))
        return UnitCosts(model=model, q=q, device="cpu", task=task_config.name, prepare_s=0.5, epoch_s=0.1,
                         save_s=0.05, plan_s=0.2, contexts=120, forwards_saved=0.3, score_per_context_s=1e-3,
                         rest_s=0.4, cut_short=1)

    monkeypatch.setattr(estimate_mod, "measure_unit_costs", fake)
    monkeypatch.setattr(estimate_mod, "measure_process", lambda code, repeats=1: 1.5)
    monkeypatch.setattr(estimate_mod, "measure_ray", lambda reports: {
        "driver_start_s": 1.0, "ray_start_s": 4.5, "actor_start_s": 2.5, "tune_trial_s": 3.0, "tune_fixed_s": 1.0})
    return calls


def test_with_task_each_model_and_q_is_measured_once_whatever_the_tasks(tmp_path, monkeypatch):
    """`--task digits` measures every task's keys on digits: one unit per (model, Q), not one per task (the
    README's `iclmem estimate configs/paper.yaml --task digits` measured the same unit 20 times)."""
    path = tmp_path / "two.yaml"
    path.write_text(TWO_TASKS)
    calls = _counting(monkeypatch)
    est = estimate(path, workers=2, task="digits")
    assert sorted(c[:3] for c in calls) == [("pfn-mini", 20, "digits"), ("pfn-mini", 30, "digits")]
    assert len(est.costs) == 4  # 2 tasks x 2 Q, each priced with its unit's costs
    assert est.costs[("pfn-mini", 20, "wine")] is est.costs[("pfn-mini", 20, "breast_cancer")]
    assert est.measuring.units == 2
    assert est.measuring.keys == 4
    calls.clear()
    est = estimate(path, workers=2)  # without --task each (model, Q, task) is its own unit, still once each
    assert sorted(c[:3] for c in calls) == sorted((m, q, t) for m, q, t in est.costs)
    assert len(calls) == len(set(calls)) == 4


def test_the_paper_grid_with_task_digits_measures_two_units(monkeypatch):
    """The README's own example: 10 tasks x Q {50, 512} are 20 keys, 2 units."""
    calls = _counting(monkeypatch)
    est = estimate(REPO / "configs" / "paper.yaml", workers=32, task="digits")
    assert len(est.costs) == 20
    assert sorted(c[:3] for c in calls) == [("pfn-mini", 50, "digits"), ("pfn-mini", 512, "digits")]


def test_each_unit_is_measured_within_the_time_budget_and_the_output_says_so(config, monkeypatch):
    calls = _counting(monkeypatch)
    est = estimate(config, workers=2, unit_budget_s=3.0)
    assert {c[3] for c in calls} == {3.0}  # the budget reaches the measurement
    text = render(est)
    assert "Measuring took" in text
    assert "1 distinct unit(s) measured once each for 1 (model, Q, task) key(s)" in text
    assert "repeats bounded to 3 s" in text
    assert "1 repeat(s) left out and extrapolated" in text
    assert "of the predicted wall time" in text


def test_a_spent_budget_stops_the_repeats_after_one_call():
    """Counts calls, not seconds: a budget of 0 s allows each step its one pass and no repeat."""
    calls = []
    spent = Budget(0.0)
    assert median_time(lambda: calls.append(1), 5, spent) >= 0
    assert len(calls) == 1
    assert spent.cut_short == 1
    calls.clear()
    spent.warm_then_time(lambda: calls.append(1), 3)  # the warm-up call is the sample
    assert len(calls) == 1
    calls.clear()
    unbounded = Budget(None)
    unbounded.warm_then_time(lambda: calls.append(1), 3)
    assert len(calls) == 4
    assert unbounded.cut_short == 0
