"""A worker node removed from a simulated cluster mid-sweep loses no finished result.

``tests/node_loss_driver.py`` runs in a subprocess on a Ray of its own (``ray.cluster_utils.Cluster``: a
head and two worker nodes on this host; the session's embedded Ray is left alone). Trials and probe
actors ask for the workers' ``worker`` resource. Once a trained checkpoint's probe result is stored and a
trial still runs, the driver kills one worker node outright (raylet, object store and every worker
process on it), preferring one that hosts a running trial and probe actors. Tune must resume the lost
trial from its last checkpoint on the surviving worker, the probe pool must get its actors back and
finish every probe, and the table must equal the same sweep's run uninterrupted on the session's Ray
(``rehearsal_reference``, shared with the Slurm rehearsal: tests/rehearsal_sweep.py).

Isolation from other Ray instances on the machine is that of ``tests/test_cluster_jobs.py``: its own
temp dir (``RAY_TMPDIR``), its own token file and a marker variable in the environment of every process
of the cluster; teardown kills exactly the processes that carry the marker, never ``ray stop``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from rehearsal_sweep import CHECKPOINT_EPOCHS, LRS, rehearsal_sweep

from iclmem.record import VOLATILE_COLUMNS

pytestmark = pytest.mark.slow  # end to end: real Ray Tune sweeps (`make test-fast` leaves them out)

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "node_loss_driver.py"
OUTCOMES = {"collapse", "memorization", "inversion", "overfitting", "no_signal"}
# how long a probe took and where it ran; the hash names the resources too (the reference runs on one node)
VOLATILE = [*VOLATILE_COLUMNS, "config_hash"]
TIMEOUT_S = 360


# ------------------------------------------------------------------------------------------- the test
def _sweep() -> dict:
    return rehearsal_sweep(
        # Trials and probe actors can only run on the workers (the head has no `worker`). Two trials at a
        # time: the third is still to come when the node goes. The surviving worker (2 CPUs, 2 `worker`)
        # holds both probe actors and one trial, so nothing waits forever for resources after the loss.
        {"cpus_per_trial": 1, "probe_actors": 2, "cpus_per_probe_actor": 0.25, "max_concurrent_trials": 2,
         "trial_resources": {"worker": 1}, "probe_resources": {"worker": 0.5}})


def _comparable(results: pd.DataFrame) -> pd.DataFrame:
    return results.drop(columns=VOLATILE).sort_values(["run_id", "epoch"]).reset_index(drop=True)


def test_a_node_removed_mid_sweep_loses_no_finished_result(isolated_ray_env, tmp_path, fault_ledger,
                                                           rehearsal_reference):
    env, _root, _token = isolated_ray_env
    sweep_file = tmp_path / "node_loss.json"
    sweep_file.write_text(json.dumps(_sweep()))
    run_dir = tmp_path / "run"
    started = time.monotonic()
    driver = subprocess.Popen([sys.executable, str(DRIVER), str(sweep_file), str(run_dir)],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        out, _ = driver.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        out, _ = driver.communicate(timeout=30)
        fault_ledger(injected=1, completed=False, identical=False)
        pytest.fail(f"the node-loss sweep did not finish in {TIMEOUT_S}s (a hang after the node loss?):\n{out[-8000:]}")
    elapsed = time.monotonic() - started
    lines = [line for line in out.splitlines() if line.startswith("NODE_LOSS_RESULT ")]
    assert lines, f"driver exited {driver.returncode} without a result after {elapsed:.0f}s:\n{out[-8000:]}"
    got = json.loads(lines[-1].removeprefix("NODE_LOSS_RESULT "))
    tail = "\n".join(line for line in out.splitlines() if not line.startswith("NODE_LOSS_RESULT "))[-8000:]
    print(f"node loss: removed {str(got.get('removed_node'))[:8]} hosting {got.get('removed_node_actors')} "
          f"at {got.get('removed_at_s')}s; timings {got['seconds']}; test {elapsed:.0f}s")

    # The fault really happened, mid-sweep, to a node doing work, and the node is gone.
    assert got["injected"], f"no node was removed ({got.get('not_injected_reason')}, {got.get('error')}):\n{tail}"
    assert got["removed_node"] in got["workers"]
    assert got["removed_node"] not in got["alive_after"]
    assert got["removed_node_actors"], got["actors_at_removal"]
    assert got["trained_results_at_removal"], got  # a trained checkpoint's result was finished before the loss
    assert got["before"], got

    # Every finished result is still there, byte for byte: not lost, not recomputed, not rewritten.
    lost = sorted(set(got["before"]) - {k for k, v in got["after"].items() if v})
    changed = sorted(k for k, v in got["before"].items() if got["after"].get(k) not in (None, v))

    # The sweep completed, and its table equals the uninterrupted run's.
    completed = got["sweep_error"] is None and Path(got["results_file"]).is_file()
    identical, difference = False, "no results table"
    if completed:
        try:
            pd.testing.assert_frame_equal(_comparable(pd.read_parquet(got["results_file"])),
                                          _comparable(rehearsal_reference))
            identical, difference = True, ""
        except AssertionError as exc:
            difference = str(exc)
    fault_ledger(injected=1, completed=completed, identical=identical)

    assert not lost, f"finished probe results lost after the node removal: {lost}"
    assert not changed, f"finished probe results rewritten after the node removal: {changed}"
    assert completed, (f"the sweep with a node removed did not complete:\n{got['sweep_error']}\n"
                       f"--- driver output ---\n{tail}")
    assert driver.returncode == 0, f"driver exited {driver.returncode}:\n{tail}"

    results = pd.read_parquet(got["results_file"])
    trained, controls = results[results["regime"] != "base"], results[results["regime"] == "base"]
    assert not results.duplicated(["run_id", "epoch"]).any(), results[["run_id", "epoch"]]
    assert trained["run_id"].nunique() == len(LRS), results[["run_id", "epoch"]]
    for run_id, group in trained.groupby("run_id"):
        assert sorted(group["epoch"]) == CHECKPOINT_EPOCHS, (run_id, sorted(group["epoch"]))
    assert controls["epoch"].tolist() == [0]  # the untouched base model, probed once
    assert set(results["outcome"]) <= OUTCOMES
    assert results["auc"].notna().all()
    assert set(results["probe_node"]) <= set(got["workers"])  # probed on the workers only
    assert identical, f"results differ from the uninterrupted run of the same sweep:\n{difference}"
