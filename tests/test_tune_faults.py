"""Faults survived on real Ray Tune: a crashed trial resumes bit-exactly; a killed driver resumes its sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from iclmem.record import VOLATILE_COLUMNS
from iclmem.runfolder import REFERENCE_RESULTS_FILE, RESULTS_FILE
from trainables.data import TaskSource, prepare_task
from trainables.models import read_weights

pytestmark = pytest.mark.slow  # end to end: real Ray Tune sweeps (`make test-fast` leaves them out)

REPO = Path(__file__).resolve().parents[1]


def _trial(task, run_id: str, **extra):
    return {
        "run_id": run_id, "task_keys": [task.fingerprint], "identity": {"run_id": run_id},
        "finetune": {"model": "pfn-mini", "model_options": {"weights": "shipped"}, "regime": "single_fixed",
                     "lr": 1e-3, "epochs": 6, "checkpoint_epochs": [], "every_epoch": True, "seed": 7},
        **extra,
    }


def _identity(run_id: str) -> dict:
    """A probe job's run identity (iclmem.record.RunIdentity): the probe writes it into every row."""
    from iclmem.record import RunIdentity

    return RunIdentity(run_id, "iris", "pfn-mini", "single_fixed", 1e-3, 30, "normal", 0).as_dict()


def _final_weights(result) -> dict[str, torch.Tensor]:
    with result.checkpoint.as_directory() as directory:
        return read_weights(Path(directory) / "model.safetensors")


@pytest.mark.parametrize("fault", ["exception", "sigkill"])
def test_a_trial_that_crashes_resumes_from_its_last_checkpoint_bit_exactly(ray_session, tmp_path, fault, fault_ledger):
    from fault_injection import faulty_trainable
    from ray import tune

    task = prepare_task(TaskSource("iris", "builtin"), seed=0, q=30, context_size=60)
    markers = tmp_path / "markers"
    markers.mkdir()
    configs = [
        _trial(task, "faulty", _fault_once_at_epoch=4, _fault_marker_dir=str(markers), _fault_kind=fault),
        _trial(task, "clean"),
    ]
    tuner = tune.Tuner(
        tune.with_parameters(faulty_trainable, prepared={task.fingerprint: task}),
        param_space={"__trial__": tune.grid_search(configs)},
        run_config=tune.RunConfig(name="faults", storage_path=str(tmp_path / "tune"), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=1)),
    )
    grid = tuner.fit()
    assert not grid.errors
    by_id = {r.config["__trial__"]["run_id"]: r for r in grid}
    assert (markers / "fault_faulty").read_text() == "4"  # the fault really fired
    faulty, clean = by_id["faulty"], by_id["clean"]
    assert faulty.metrics["epoch"] == clean.metrics["epoch"] == 6
    # The retried trial restarted from its epoch-3 checkpoint, not from scratch: no epoch reported twice, and
    # epochs 4-6 reported after it. (Epochs 1-3 are there too unless a loaded machine let the crash overtake
    # Tune's buffered results of them: a from-scratch restart would report 1, 2, 3 again.)
    reported = (Path(faulty.path) / "result.json").read_text().splitlines()
    epochs = [json.loads(line)["epoch"] for line in reported if line.strip()]
    assert epochs == sorted(set(epochs)), epochs
    assert epochs[-3:] == [4, 5, 6], epochs
    for key, value in _final_weights(clean).items():
        assert torch.equal(value, _final_weights(faulty)[key]), key
    fault_ledger(injected=1, completed=True, identical=True)


def _cli(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0", "WANDB_MODE": "offline"}
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def _saved_as_finished(run_dir: Path, trial_id: str) -> bool:
    """Whether Tune's newest saved experiment state (``experiment_state-*.json``) records ``trial_id`` as
    TERMINATED."""
    states = sorted((run_dir / "tune").rglob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime)
    if not states:
        return False
    try:
        trials = json.loads(states[-1].read_text())["trial_data"]
    except (ValueError, KeyError, OSError):  # caught mid-write: look again on the next poll
        return False
    for entry in trials:
        trial = json.loads(entry[0])
        if trial.get("trial_id") == trial_id:
            return trial.get("status") == "TERMINATED"
    return False


def _kill_driver_once_a_trial_reaches(driver: subprocess.Popen, run_dir: Path, epoch: int,
                                      run_id_matches: Callable[[str], bool] = lambda _run_id: True,
                                      timeout: float = 300.0) -> Path:
    """Wait until some trial whose run id ``run_id_matches`` has reported ``epoch`` as its last result (its
    ``result.json`` under ``run_dir/tune``) and Tune's saved experiment state records it as finished, then
    SIGKILL the driver's process group; that trial's ``result.json``. Fails with the driver's output if it
    ended first, or after ``timeout`` seconds.

    Finished means persisted: between a trial's last report and the next save of Tune's experiment state
    (seconds under load) the trial is finished only in the driver's memory, and a driver killed then is
    resumed by Tune from the last checkpoint the saved state names, which is Tune's contract, not a re-run of
    a finished trial."""
    deadline = time.monotonic() + timeout
    finished = None
    while time.monotonic() < deadline and finished is None:
        for result in (run_dir / "tune").rglob("result.json"):
            lines = [json.loads(line) for line in result.read_text().splitlines() if line.strip()]
            if (lines and lines[-1].get("epoch") == epoch and run_id_matches(str(lines[-1].get("run_id")))
                    and _saved_as_finished(run_dir, str(lines[-1].get("trial_id")))):
                finished = result
        time.sleep(0.5)
    assert finished is not None, (driver.communicate(timeout=5)[0] if driver.poll() is not None
                                  else f"no matching trial reached epoch {epoch}")
    assert driver.poll() is None, "the sweep ended before Tune saved a finished trial: nothing left to kill"
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait(timeout=30)
    return finished


def _finished_trial_results(run_dir: Path, epochs: int) -> dict[str, Path]:
    """run id -> ``result.json`` of every trial under ``run_dir/tune`` whose last report is epoch ``epochs``."""
    found = {}
    for result in (run_dir / "tune").rglob("result.json"):
        lines = [json.loads(line) for line in result.read_text().splitlines() if line.strip()]
        if lines and lines[-1].get("epoch") == epochs:
            found[str(lines[-1]["run_id"])] = result
    return found


def test_a_killed_driver_resumes_without_rerunning_finished_trials_reference_trials_included(
        ray_session, tmp_path, fault_ledger):
    """The driver joins the session's Ray and is SIGKILLed once a *reference* trial (probe.references) has
    finished, after its audited run (each run is followed by its references, one trial at a time);
    ``iclmem resume`` completes the sweep and neither finished trial reports an epoch twice. Under
    ``training.keep_checkpoints: last``, a checkpoint whose weights were removed and whose result is then lost is
    recomputed from the run's config; the table, its attack columns included, equals an uninterrupted run's."""
    address = ray_session.get_runtime_context().gcs_address
    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump({
        "name": "killme",
        "tasks": [{"name": "iris"}],
        "grid": {"q": [30], "label_mode": ["shuffled_members"]},
        "data": {"context_size": 60},
        "training": {"epochs": 8, "checkpoint_epochs": [2, 8], "keep_checkpoints": "last"},
        "probe": {"bootstrap": 50, "suite": ["base", "position_first", "skew_true_x2"], "base_as_checkpoint": False,
                  "references": 2},
        "resources": {"max_concurrent_trials": 1, "cpus_per_probe_actor": 0.5},
        "wandb": {"mode": "disabled"},
    }))
    run_dir = tmp_path / "run"
    driver = _cli("run", str(config), "--out", str(run_dir), "--address", address, start_new_session=True)
    _kill_driver_once_a_trial_reaches(driver, run_dir, 8, lambda run_id: "-ref" in run_id)
    finished = _finished_trial_results(run_dir, 8)
    audited = [run_id for run_id in finished if "-ref" not in run_id]
    assert audited, finished  # the audited run finished before its references...
    assert len(finished) >= 2, finished  # ... and at least one of them
    # the audited run's epoch-2 checkpoint loses its weights (as the keeper does once it is probed, which the
    # killed driver may or may not have got to) and then its stored result: resume must recompute both
    import pyarrow.fs as pafs

    from trainables.finetune import MODEL_FILE, remove_checkpoint_files

    target = finished[audited[0]]
    early = next(p for p in target.parent.glob("checkpoint_*") if json.loads((p / "checkpoint.json").read_text())["epoch"] == 2)
    remove_checkpoint_files(pafs.LocalFileSystem(), str(early), [MODEL_FILE], "training.keep_checkpoints: last")
    for stored in (run_dir / "probes" / audited[0]).glob("e0002*"):
        stored.unlink()

    resumed = _cli("resume", str(run_dir), "--address", address)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    assert f"{early / MODEL_FILE} was removed after probing" in out
    assert "weights match the recorded checksum" in out
    for meta in (run_dir / "tune").rglob("checkpoint.json"):  # after resume: the policy's files, every manifest
        kept = {p.name for p in meta.parent.iterdir()}
        assert (MODEL_FILE in kept) == (json.loads(meta.read_text())["epoch"] == 8), (meta, kept)
        assert "trainer_state.pt" not in kept, (meta, kept)
    for run_id, result in finished.items():  # not one epoch of a finished trial re-run
        epochs = [json.loads(line)["epoch"] for line in result.read_text().splitlines() if line.strip()]
        assert epochs == list(range(1, 9)), (run_id, epochs)
    import pandas as pd

    results = pd.read_parquet(run_dir / RESULTS_FILE)
    references = pd.read_parquet(run_dir / REFERENCE_RESULTS_FILE)
    assert results["run_id"].nunique() == 1
    assert sorted(results["epoch"]) == [2, 8]
    assert references["run_id"].nunique() == 2
    assert sorted(references["epoch"]) == [2, 2, 8, 8]
    assert (results["attack_references"] == 2).all()

    # The resumed sweep's results equal an uninterrupted run of the same config and seed.
    from orchestrator.driver.sweep import run_sweep

    clean = run_sweep(config, tmp_path / "clean", progress=False)
    attack = [c for c in results.columns if c.startswith(("lira_", "rmia_", "known_context_lira", "known_context_rmia"))]
    assert len(attack) > 60
    volatile = list(VOLATILE_COLUMNS)
    a = results.drop(columns=volatile).sort_values(["run_id", "epoch"]).reset_index(drop=True)
    b = clean.drop(columns=volatile).sort_values(["run_id", "epoch"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
    fault_ledger(injected=1, completed=True, identical=True)


def test_a_probe_actor_killed_mid_job_is_replaced_and_its_job_rerun(ray_session, tmp_path, fault_ledger):
    import ray

    from probes.actors import ProbeJob, ProbePool
    from probes.calibration import model_digest
    from probes.probe import ProbeSettings
    from trainables.models import build_model

    task = prepare_task(TaskSource("iris", "builtin"), seed=0, q=30, context_size=60)
    base = build_model("pfn-mini")
    pool = ProbePool(1, {"num_cpus": 0.5}, base_model_name="pfn-mini", base_options={"weights": "shipped"},
                     base_weights=ray.put(base.state_arrays()), base_digest=model_digest(base),
                     tasks=ray.put({task.fingerprint: task}), suite_spec="default",
                     settings=ProbeSettings(n_resamples=50), cache_dir=str(tmp_path / "ref"))
    try:
        pool.submit(ProbeJob(_identity("k"), 0, None, task.fingerprint, str(tmp_path / "p"), "e0"))
        time.sleep(1.0)  # the job is under way
        ray.kill(pool.actors[0], no_restart=False)  # the actor process dies; Ray restarts it
        rows = pool.drain()
    finally:
        pool.shutdown()
    assert len(rows) == 1
    assert rows[0]["outcome"] == "no_signal"
    assert not pool.failed
    assert (tmp_path / "p" / "e0.json").is_file()
    fault_ledger(injected=1, completed=True, identical=rows[0]["auc"] == 0.5)


def test_a_probe_job_already_in_flight_is_not_submitted_twice(ray_session, tmp_path):
    """The sweep's catch-up pass resubmits every checkpoint; one still being probed must not run twice."""
    import ray

    from probes.actors import ProbeJob, ProbePool
    from probes.calibration import model_digest
    from probes.probe import ProbeSettings
    from trainables.models import build_model

    task = prepare_task(TaskSource("iris", "builtin"), seed=0, q=30, context_size=60)
    base = build_model("pfn-mini")
    pool = ProbePool(2, {"num_cpus": 0.5}, base_model_name="pfn-mini", base_options={"weights": "shipped"},
                     base_weights=ray.put(base.state_arrays()), base_digest=model_digest(base),
                     tasks=ray.put({task.fingerprint: task}), suite_spec=["base"],
                     settings=ProbeSettings(n_resamples=20), cache_dir=str(tmp_path / "ref"))
    job = ProbeJob(_identity("k"), 0, None, task.fingerprint, str(tmp_path / "p"), "e0")
    try:
        pool.submit(job)
        pool.submit(job)  # in flight: ignored
        assert len(pool.pending) == 1
        rows = pool.drain()
        pool.submit(job)  # stored now: answered from disk, no actor call
        assert not pool.pending
        assert len(pool.poll()) == 1
    finally:
        pool.shutdown()
    assert len(rows) == 1
    assert not pool.failed


def test_a_sweep_whose_trials_fail_ends_failed_naming_each_cause_and_keeps_the_others_results(ray_session, tmp_path,
                                                                                              monkeypatch):
    """A trial that fails at run time is a failure, not a finished sweep: run_sweep raises TrialsFailed (exit
    1 on the command line) after aggregating what the other trials stored, with one line per distinct cause
    naming the runs, and run_state.json says failed and lists them (#34)."""
    import fault_injection

    import trainables.trainable
    from iclmem.errors import EXIT_FAILURE, TrialsFailed
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.schema.config import parse_sweep
    from orchestrator.schema.trials import expand_grid

    monkeypatch.setattr(trainables.trainable, "finetune_trainable", fault_injection.failing_at_lr_trainable)
    sweep = parse_sweep({
        "name": "failing", "tasks": [{"name": "iris"}], "grid": {"lr": [1e-3, 1e-2], "q": [10]},
        "data": {"context_size": 30}, "training": {"epochs": 2, "checkpoint_epochs": [1, 2]},
        "probe": {"suite": ["base", "skew_true_x2"], "bootstrap": 10, "null_splits": 0},
        "resources": {"cpus_per_trial": 0.5, "cpus_per_probe_actor": 0.5}, "wandb": {"mode": "disabled"},
    })
    lines: list[str] = []
    with pytest.raises(TrialsFailed, match=r"1 of 2 trial\(s\) failed") as caught:
        run_sweep(None, tmp_path / "run", sweep=sweep, progress=False, log=lines.append)
    failed = [t.run_id for t in expand_grid(sweep) if t.lr == 1e-2]
    assert caught.value.causes == {"RuntimeError: injected failure: lr 0.01 cannot be trained": failed}
    assert TrialsFailed.exit_code == EXIT_FAILURE
    assert any(line.startswith("[iclmem] 1 trial(s) failed: RuntimeError: injected failure") and failed[0] in line
               for line in lines), lines
    state = json.loads((tmp_path / "run" / "run_state.json").read_text())
    assert state["status"] == "failed"
    assert state["incomplete_runs"] == failed
    import pandas as pd

    results = pd.read_parquet(tmp_path / "run" / RESULTS_FILE)
    trained = results[results["regime"] == "single_fixed"]
    assert sorted(trained["epoch"]) == [1, 2]
    assert set(trained["lr"]) == {1e-3}


def test_resources_the_local_ray_cannot_give_are_refused_before_any_trial_instead_of_hanging(ray_session, tmp_path):
    """A trial or probe actor asking for more than the one local node holds would wait forever with the
    console at "running 0" (#34): it is refused at once, naming the setting, with Stage I's results kept."""
    from iclmem.errors import ConfigError
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.schema.config import parse_sweep

    base = {"name": "greedy", "tasks": [{"name": "iris"}], "grid": {"q": [10]}, "data": {"context_size": 30},
            "training": {"epochs": 1, "checkpoint_epochs": [1]}, "wandb": {"mode": "disabled"}}
    for resources, expected in (({"gpus_per_trial": 1}, r"resources.gpus_per_trial: 1 GPU asked, the local Ray has 0 "
                                                         r"\(no GPU found\)"),
                                ({"cpus_per_trial": 1000}, r"resources.cpus_per_trial: 1000 CPU asked, the local Ray has 2"),
                                ({"gpus_per_probe_actor": 1}, r"resources.gpus_per_probe_actor: 1 GPU"),
                                ({"cpus_per_trial": 2}, r"resources.cpus_per_trial: 2 CPU asked, but the 1 probe "
                                                        r"actor\(s\) hold 1 of the local Ray's 2 CPU")):
        run_dir = tmp_path / "-".join(f"{k}{v}" for k, v in resources.items())
        with pytest.raises(ConfigError, match=expected):
            run_sweep(None, run_dir, sweep=parse_sweep({**base, "resources": resources}), progress=False,
                      log=lambda _m: None)
        assert json.loads((run_dir / "run_state.json").read_text())["status"] == "failed"
        assert not (run_dir / "tune").exists() or not any((run_dir / "tune").rglob("checkpoint_*"))
        assert any((run_dir / "prepared").glob("*.npz"))  # Stage I's work is kept


def test_a_sweep_that_waits_for_resources_no_node_gives_stops_after_the_stall_timeout_saying_why(ray_session, tmp_path):
    """On a cluster (--address) the driver cannot know every node type in advance: a trial asking for a
    resource nobody holds waits in Tune's loop with the console at "running 0" (#34). After
    resources.stall_timeout_min without progress the sweep stops, names what the trials ask and what the
    cluster has, exits 1 (SweepStalled) and stays resumable (run_state interrupted)."""
    from iclmem.errors import SweepStalled
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({"name": "stalled", "tasks": [{"name": "iris"}], "grid": {"q": [10]},
                         "data": {"context_size": 30}, "training": {"epochs": 1, "checkpoint_epochs": [1]},
                         "resources": {"trial_resources": {"iclmem_absent_accelerator": 1}, "stall_timeout_min": 0.05},
                         "wandb": {"mode": "disabled"}})
    started = time.monotonic()
    with pytest.raises(SweepStalled) as caught:
        run_sweep(None, tmp_path / "run", sweep=sweep, address="auto", progress=False, log=lambda _m: None)
    waited = time.monotonic() - started
    message = str(caught.value)
    assert "no progress for 0.1 min" in message, message
    assert "1 trial(s) waiting to start" in message, message  # 3 s
    assert "iclmem_absent_accelerator 1" in message, message
    assert "the cluster holds CPU 2" in message, message
    assert "iclmem resume" in message
    assert SweepStalled.exit_code == 1
    assert waited < 120, f"the stall was noticed only after {waited:.0f} s"
    state = json.loads((tmp_path / "run" / "run_state.json").read_text())
    assert state["status"] == "interrupted"
    assert "no progress" in state["note"]


def test_the_watchdog_fires_only_after_the_timeout_without_change_and_never_while_busy():
    from orchestrator.driver.progress import Watchdog

    now = [0.0]
    dog = Watchdog(60, clock=lambda: now[0])
    assert not dog.observe("a")
    now[0] = 59
    assert not dog.observe("a")
    now[0] = 61
    assert dog.observe("a")  # 61 s without a change
    assert not dog.observe("b")  # a change restarts the clock
    now[0] = 200
    assert not dog.observe("b", busy=True)  # a running trial is progress
    now[0] = 259
    assert not dog.observe("b")
    now[0] = 261
    assert dog.observe("b")
    assert not Watchdog(0, clock=lambda: now[0]).observe("x")
    assert not Watchdog(0, clock=lambda: 1e9).observe("x")


def test_the_stall_message_quotes_the_last_line_where_ray_says_why_it_waits(tmp_path):
    from orchestrator.driver.progress import ray_wait_reason

    log = tmp_path / "console.log"
    log.write_text("(raylet) something else\n[iclmem] trials 0/1 done, 0 running\nWARNING insufficient_resources_"
                   "manager.py:163 -- Ignore this message if the cluster is autoscaling. No trial is running and no "
                   "new trial has been started within the last 60 seconds. This could be due to the cluster not "
                   "having enough resources available.\n[iclmem] 1 trial pending (iclmem's own line, not Ray's)\n"
                   "unrelated tail\n")
    quote = ray_wait_reason(log)
    assert quote is not None
    assert quote.startswith("WARNING insufficient_resources_manager.py:163")
    assert ray_wait_reason(tmp_path / "absent.log") is None


@pytest.fixture
def small_disk(tmp_path):
    """A 10 MiB file system: room for one pfn-mini checkpoint (6.9 MB), not two."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=10m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill ({made.stderr.strip() or made.returncode}): needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_disk_that_runs_full_stops_the_sweep_resumably_and_resume_finishes_it_once_there_is_room(
        ray_session, tmp_path, small_disk, monkeypatch):
    """#34: a full disk gave 16 tracebacks and left run_state "running". Now: one error naming the folder
    short of room (DiskFull, exit 1), the stored results kept, run_state interrupted; after room is made,
    `resume` sets Tune's half-written state aside (saying so; when the disk ran full while Tune wrote it) and
    finishes with every checkpoint probed."""
    from iclmem.errors import DiskFull
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.estimate import estimate_disk
    from orchestrator.schema.config import parse_sweep

    # the check before the start refuses this sweep (its peak is above 10 MiB): here the disk fills after the check
    # passed (another writer on it), which is what the handling below is for
    monkeypatch.setattr(estimate_disk, "room_problems", lambda *_a, **_k: [])
    sweep = parse_sweep({"name": "full", "tasks": [{"name": "iris"}], "grid": {"q": [20]}, "data": {"context_size": 30},
                         "training": {"epochs": 2, "checkpoint_epochs": [1, 2]}, "max_failures": 0,
                         "storage_path": str(small_disk / "tune"), "wandb": {"mode": "disabled"}})
    run_dir = tmp_path / "run"
    with pytest.raises(DiskFull) as caught:
        run_sweep(None, run_dir, sweep=sweep, progress=False, log=lambda _m: None)
    message = str(caught.value)
    assert f"Tune storage {small_disk / 'tune'}: 0.0 MiB free" in message
    assert f"iclmem resume {run_dir}" in message
    assert DiskFull.exit_code == 1
    state = json.loads((run_dir / "run_state.json").read_text())
    assert state["status"] == "interrupted"
    assert "disk full" in state["note"]
    # whatever was stored before the disk ran full (the epoch-1 probe result, when it finished in time) stays
    kept = {str(p): p.read_bytes() for p in (run_dir / "probes").rglob("*.json")}

    # whether the disk ran full while Tune wrote its experiment state depends on timing: read it as resume will
    from orchestrator.driver.sweep import damaged_tune_state
    from orchestrator.runfolder.prepare import EXPERIMENT_NAME

    damaged = damaged_tune_state(str(small_disk / "tune" / EXPERIMENT_NAME))

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    lines: list[str] = []
    results = run_sweep(None, run_dir, resume=True, progress=False, log=lines.append)
    trained = results[results["regime"] == "single_fixed"]
    assert sorted(trained["epoch"]) == [1, 2]
    assert json.loads((run_dir / "run_state.json").read_text())["status"] == "complete"
    assert all(Path(name).read_bytes() == data for name, data in kept.items())
    # a half-written state is set aside, saying so; an intact one is restored, and nothing is said
    set_aside = any("experiment state" in line and "is damaged" in line and "set aside" in line for line in lines)
    assert set_aside == (damaged is not None), (damaged, lines)


def test_a_trial_that_meets_a_full_disk_ends_the_sweep_resumably_not_as_a_failed_trial(ray_session, tmp_path,
                                                                                      monkeypatch):
    """The other way a full disk shows: a trial's own write fails with ENOSPC while Tune's state stays
    readable. That is no fault of the trial's settings: DiskFull (exit 1), run_state interrupted, not
    TrialsFailed with run_state failed."""
    import fault_injection

    import trainables.trainable
    from iclmem.errors import DiskFull
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.schema.config import parse_sweep

    monkeypatch.setattr(trainables.trainable, "finetune_trainable", fault_injection.full_disk_at_lr_trainable)
    sweep = parse_sweep({
        "name": "full-trial", "tasks": [{"name": "iris"}], "grid": {"lr": [1e-2], "q": [10]},
        "data": {"context_size": 30}, "training": {"epochs": 1, "checkpoint_epochs": [1]}, "max_failures": 0,
        "probe": {"suite": ["base", "skew_true_x2"], "bootstrap": 10, "null_splits": 0},
        "resources": {"cpus_per_trial": 0.5, "cpus_per_probe_actor": 0.5}, "wandb": {"mode": "disabled"},
    })
    with pytest.raises(DiskFull, match=r"a disk ran full \(OSError: \[Errno 28\] No space left on device") as caught:
        run_sweep(None, tmp_path / "run", sweep=sweep, progress=False, log=lambda _m: None)
    assert f"iclmem resume {tmp_path / 'run'}" in str(caught.value)
    state = json.loads((tmp_path / "run" / "run_state.json").read_text())
    assert state["status"] == "interrupted"
    assert "disk full" in state["note"]
