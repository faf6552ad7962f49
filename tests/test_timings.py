"""A run's own per-phase times (orchestrator/runfolder/timing.py) and `iclmem estimate --compare`: the record a real
sweep writes, checked against Tune's and the probe actors' own numbers, and the comparison that names the
phase with the largest error."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

import orchestrator.estimate.estimate as estimate_mod
from iclmem.errors import DataError
from iclmem.runfolder import RESULTS_FILE, SWEEP_FILE, TIMINGS_FILE, TUNE_DIR
from orchestrator.cli import main
from orchestrator.estimate.estimate_measure import Overheads, UnitCosts
from orchestrator.estimate.estimate_predict import predict
from orchestrator.estimate.estimate_work import count_work
from orchestrator.runfolder.timing import (
    SERIAL_PHASES,
    WORK_PHASES,
    Phase,
    PhaseClock,
    Prediction,
    RunTimings,
    compare,
    load_prediction,
    read_timings,
    save_prediction,
)
from orchestrator.schema.config import parse_sweep
from orchestrator.schema.sweep_files import load_sweep


def _timings(**work) -> RunTimings:
    base = {p.value: 1.0 for p in WORK_PHASES}
    return RunTimings(wall_s=100.0, parallel_s=80.0, serial={p.value: 2.0 for p in SERIAL_PHASES},
                      work={**base, **work}, workers=4, probe_actors=2, trials=8, checkpoints=16)


def test_compare_spreads_a_work_phases_error_over_the_workers_that_share_it_and_ranks_by_wall_error():
    timings = _timings(**{Phase.FINETUNE.value: 40.0, Phase.SCORING.value: 10.0})
    predicted_work = {p.value: 1.0 for p in WORK_PHASES} | {Phase.FINETUNE.value: 20.0, Phase.SCORING.value: 22.0}
    rows = compare({p.value: 2.0 for p in SERIAL_PHASES} | {Phase.RAY.value: 9.0}, predicted_work, 4, 2, timings)
    by = {r.phase: r for r in rows}
    assert by[Phase.FINETUNE.value].wall_share_s == pytest.approx((20 - 40) / 4)  # the trials share 4 workers
    assert by[Phase.SCORING.value].wall_share_s == pytest.approx((22 - 10) / 2)  # the 2 probe actors share it
    assert by[Phase.RAY.value].wall_share_s == pytest.approx(7.0)  # serial: all of it
    assert rows[0].phase == Phase.RAY.value
    assert rows[1].phase == Phase.SCORING.value
    assert by[Phase.FINETUNE.value].ratio == pytest.approx(0.5)


def test_a_prediction_is_bound_by_its_largest_lower_bound_on_any_number_of_workers():
    work = {p.value: 0.0 for p in WORK_PHASES} | {Phase.FINETUNE.value: 100.0, Phase.SCORING.value: 60.0}
    p = Prediction(serial={Phase.RAY.value: 5.0}, work=work, longest_s=30.0, probe_actors=1, workers=2)
    assert p.wall_s(2) == pytest.approx(5 + 80)  # 160 / 2
    assert p.wall_s(4) == pytest.approx(5 + 60)  # the one probe actor's 60 s
    assert Prediction(serial={}, work=work, longest_s=30.0, probe_actors=8, workers=2).wall_s(100) == pytest.approx(30)


def test_the_timings_record_refuses_unknown_phases_and_its_reader_names_a_missing_file(tmp_path):
    with pytest.raises(DataError, match="unknown phase"):
        RunTimings(wall_s=1, parallel_s=1, serial={"coffee": 1.0}, work={}, workers=1, probe_actors=1, trials=1,
                   checkpoints=1)
    with pytest.raises(DataError, match=str(tmp_path / TIMINGS_FILE)):
        read_timings(tmp_path)
    clock = PhaseClock()
    with clock(Phase.STAGE_I):
        pass
    clock.add(Phase.STAGE_I, 2.0)
    assert 2.0 <= clock.seconds[Phase.STAGE_I.value] < 2.5


def test_a_kept_prediction_is_found_by_its_sweeps_hash_and_only_there(tmp_path, monkeypatch):
    monkeypatch.setenv("ICLMEM_CACHE", str(tmp_path))
    p = Prediction(serial={Phase.RAY.value: 1.0}, work={}, longest_s=2.0, probe_actors=1, workers=2, config_hash="abc")
    assert save_prediction(p) == tmp_path / "estimates" / "abc.json"
    assert load_prediction("abc") == p
    assert load_prediction("other") is None


SWEEP = {
    "name": "per-task", "tasks": [{"name": "iris"}, {"name": "digits"}],
    "grid": {"q": [20], "lr": [1e-3], "dp": [1, "inf"]},
    "training": {"epochs": 10, "checkpoint_epochs": [10]}, "data": {"context_size": 64},
    "resources": {"cpus_per_trial": 0.5, "cpus_per_probe_actor": 0.5}, "wandb": {"mode": "disabled"},
}


def _cost(task: str, epoch_s: float, dp_epoch_s: float = math.nan, first: float = 0.0, dp_first: float = 0.0) -> UnitCosts:
    return UnitCosts(model="pfn-mini", q=20, device="cpu", task=task, prepare_s=0.1, epoch_s=epoch_s, save_s=0.0,
                     plan_s=0.0, contexts=10, forwards_saved=0.0, score_per_context_s=0.0, rest_s=0.0,
                     dp_epoch_s=dp_epoch_s, first_epoch_extra_s=first, dp_first_epoch_extra_s=dp_first)


def test_work_is_counted_per_task_and_dp_and_each_task_is_costed_with_its_own_units():
    work = count_work(parse_sweep(SWEEP, "test"))
    keys = sorted(work.runs_by)
    assert [k.task for k in keys] == ["digits", "iris"]
    assert all(n == 2 for n in work.runs_by.values())
    assert work.dp_runs == 2
    assert work.dp_epsilon == 1.0
    costs = {keys[0]: _cost("digits", 1.0, 10.0, first=0.2, dp_first=3.0), keys[1]: _cost("iris", 0.1, 1.0)}
    o = Overheads(actor_start_s=2.0, tune_trial_s=0.5)
    est = predict(work, costs, 2, o, 1)
    # 10 epochs of: digits plain 1 + DP 10, iris plain 0.1 + DP 1; and each run's first-epoch warm-up once
    assert est.compute_s[Phase.FINETUNE.value] == pytest.approx(10 * (1 + 10 + 0.1 + 1) + 0.2 + 3.0)
    # 2 workers, a probe actor's 0.5 CPU: 3 trial slots, each starting its actor once; 4 trials
    assert work.trial_slots(2) == 3
    assert est.compute_s[Phase.TRIALS.value] == pytest.approx(3 * 2.0 + 4 * 0.5)
    assert est.on(8).compute_s[Phase.TRIALS.value] == pytest.approx(4 * 2.0 + 4 * 0.5)  # never more slots than trials


def test_a_multi_task_run_steps_on_each_task_every_epoch_and_is_probed_on_each():
    sweep = parse_sweep({**SWEEP, "grid": {"q": [20], "lr": [1e-3], "regime": ["multi_fixed"]}}, "test")
    work = count_work(sweep)
    assert work.runs == 1
    assert work.steps == 10 * 2
    ((task_keys, dp), n), = work.compositions.items()
    assert n == 1
    assert not dp
    assert {k.task for k in task_keys} == {"iris", "digits"}
    assert sum(work.checkpoint_jobs.values()) == 2  # one checkpoint, probed on each task
    costs = {k: _cost(k.task, 1.0 if k.task == "digits" else 0.1) for k in task_keys}
    est = predict(work, costs, 2, Overheads(actor_start_s=1.0), 1)
    assert est.compute_s[Phase.FINETUNE.value] == pytest.approx(10 * (1.0 + 0.1))


@pytest.mark.slow  # times plain and DP-SGD epochs (`make test-fast` leaves it out)
def test_the_estimate_measures_dp_epochs_where_the_grid_has_dp_runs(tmp_path, monkeypatch):
    import yaml

    monkeypatch.setattr(estimate_mod, "measure_process", lambda code, repeats=1: 1.0)
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "tasks": [{"name": "iris"}], "probe": {"suite": ["base"]}}))
    est = estimate_mod.estimate(path, 2, device="cpu", epochs=2, with_ray=False)
    (cost,) = est.costs.values()
    # per-row gradients, clipping and noise: a DP epoch costs several plain ones
    assert cost.dp_epoch_s > 2 * cost.epoch_s > 0


# ------------------------------------------------------------------------------------------- a real run
def test_a_finished_run_records_its_phase_times_as_tune_and_the_probe_actors_report_them(real_sweep):
    run_dir, _results, _log = real_sweep
    timings = read_timings(run_dir)
    stored = pd.read_parquet(run_dir / RESULTS_FILE)
    sweep = load_sweep(run_dir / SWEEP_FILE)
    from orchestrator.schema.trials import expand_grid

    assert timings.trials == len(expand_grid(sweep))
    assert timings.checkpoints == len(stored)
    assert timings.workers == 2
    assert timings.probe_actors == sweep.resources.probe_actors
    # the probe phases are the sums of the actors' own per-job figures
    assert timings.work[Phase.SCORING.value] == pytest.approx(stored["probe_score_seconds"].sum())
    assert timings.work[Phase.REFERENCE.value] == pytest.approx(stored["probe_reference_seconds"].sum())
    assert timings.work[Phase.PROBE_REST.value] == pytest.approx(
        stored["probe_device_seconds"].sum() - stored[["probe_score_seconds", "probe_reference_seconds",
                                                       "probe_plan_seconds"]].sum().sum(), abs=1e-6)
    # fine-tuning is the sum of what the trials reported, epoch by epoch (Tune's own result files)
    reported = 0.0
    for result_file in (run_dir / TUNE_DIR).rglob("result.json"):
        for line in result_file.read_text().splitlines():
            row = json.loads(line)
            reported += row.get("epoch_seconds", 0.0) + row.get("save_seconds", 0.0)
    assert reported > 0
    assert timings.work[Phase.FINETUNE.value] == pytest.approx(reported, rel=1e-6)
    for phase in (Phase.SCORING, Phase.PROBE_REST, Phase.ACTOR_START, Phase.TRIALS):
        assert timings.work[phase.value] > 0, phase
    for phase in (Phase.STAGE_I, Phase.RAY, Phase.REPORT):
        assert timings.serial[phase.value] > 0, phase
    assert timings.wall_s >= timings.parallel_s > 0
    assert timings.notes == ("driver start not measured: run_sweep called from Python",)


def test_estimate_compare_sets_the_prediction_beside_the_run_and_names_the_largest_error(real_sweep, capsys,
                                                                                       monkeypatch):
    run_dir, _results, _log = real_sweep
    monkeypatch.setattr(estimate_mod, "measure_process", lambda code, repeats=1: 1.5)  # no subprocesses here
    monkeypatch.setattr(estimate_mod, "measure_ray", lambda reports: {
        "ray_start_s": 4.0, "actor_start_s": 2.5, "tune_trial_s": 0.5, "tune_fixed_s": 1.0})
    assert main(["estimate", "--compare", str(run_dir), "--epochs", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("Beside the run"):].splitlines()
    assert table[1].split() == ["phase", "predicted", "measured", "ratio", "wall", "error"]
    rows = table[2:2 + len(SERIAL_PHASES) + len(WORK_PHASES)]
    named = [p.value for p in Phase if any(r.startswith(p.value) for r in rows)]
    assert sorted(named) == sorted(p.value for p in Phase)  # every phase, once
    timings = read_timings(run_dir)
    first = next(p for p in Phase if rows[0].startswith(p.value))
    measured = {**timings.serial, **timings.work}.get(first.value, 0.0)
    assert f"{measured:.1f}s" in rows[0]
    errors = [abs(float(r.split()[-1].rstrip("s"))) for r in rows]
    assert errors[0] == max(errors)  # largest wall error first ...
    assert f"the largest error is {first.value}" in out  # ... and named
    assert f"{timings.workers} worker(s), measured" in out


def test_estimate_compare_on_a_folder_without_timings_fails_before_measuring_and_names_the_file(tmp_path, capsys,
                                                                                               monkeypatch):
    monkeypatch.setattr(estimate_mod, "measure_unit_costs", lambda *a, **k: pytest.fail("measured anyway"))
    assert main(["estimate", "--compare", str(tmp_path)]) == 2
    assert "timings.json" in capsys.readouterr().err
