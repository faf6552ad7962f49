"""A rehearsal of slurm/iclmem.sbatch on this machine: the script's own body (not a copy) in its head-worker
launch, on a fake two-node allocation, with the worker node stopped mid-sweep; the sweep completes on the head
and its results equal a single-node run of the same sweep (``rehearsal_reference``, shared with the node-loss
rehearsal: tests/rehearsal_sweep.py).

What stands in for Slurm, on ``PATH`` (tests only): ``scontrol show hostnames`` names three nodes; ``srun -w NODE
CMD`` runs CMD here, giving each node's ``ray start`` its own ports (the defaults 52365 and 10001 are fixed, so
two raylets on one machine would collide) and a ``worker`` resource the sweep's trials and probe actors ask for
(four on the worker node, three on the head: room there for a trial and both probe actors once the worker
is gone), so work runs on the worker and stopping it loses running work; ``ray stop`` is a no-op (the
real one would stop every Ray on the machine, the test session's included; a node's processes are stopped by
killing its ``srun`` step, as Slurm does). The cluster is isolated as in tests/test_cluster_jobs.py: its own
temp dir and token, and a marker on each of its processes that teardown kills.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from rehearsal_sweep import CHECKPOINT_EPOCHS, EPOCHS, rehearsal_sweep

from iclmem.record import VOLATILE_COLUMNS
from iclmem.runfolder import RESULTS_FILE

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "slurm" / "iclmem.sbatch"
VOLATILE = [*VOLATILE_COLUMNS, "config_hash"]  # where and how long; the hash names the resources too
TIMEOUT_S = 420

SRUN = r"""#!/bin/bash
# srun for the rehearsal: run the command here, as node -w NODE would
node=n1
while [ $# -gt 0 ]; do
  case "$1" in
    -w) node="$2"; shift 2 ;;
    --*|-N|-n) shift ;;
    *) break ;;
  esac
done
if [ "$1" = "hostname" ]; then echo 127.0.0.1; exit 0; fi
if [ "$1" = "ray" ] && [ "$2" = "start" ]; then
  echo $$ > "$REHEARSAL_DIR/$node.pid"
  extra_var="REHEARSAL_ARGS_$node"
  exec "$@" ${!extra_var}
fi
exec "$@"
"""
SCONTROL = """#!/bin/bash
# scontrol show hostnames: the rehearsal's nodes
printf '%s\\n' $REHEARSAL_NODES
"""
RAY = """#!/bin/bash
# ray, except `ray stop`: the real one stops every Ray on this machine
if [ "$1" = "stop" ]; then exit 0; fi
exec "$REHEARSAL_REAL_RAY" "$@"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sweep() -> dict:
    # trials and probe actors only where there is `worker` (see the module docstring)
    return rehearsal_sweep({"cpus_per_trial": 1, "probe_actors": 2, "cpus_per_probe_actor": 0.25,
                            "max_concurrent_trials": 2, "trial_resources": {"worker": 2},
                            "probe_resources": {"worker": 0.5}, "stall_timeout_min": 3})


def _shims(folder: Path) -> Path:
    folder.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("ray", RAY)):
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


def _tree(pid: int) -> set[int]:
    """The pids of a process and everything under it (empty once it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return {root.pid, *(p.pid for p in root.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def _checkpointed_trials_in(pids: set[int], out_dir: Path) -> set[str]:
    """The folders of the Tune trials that those of ``pids`` run and that have saved two checkpoints (epochs 1
    and 30). A function trainable's actor is titled ``ray::ImplicitFunc...`` and works in a folder named after
    its trial, the name of the trial's folder in the sweep's storage, where its checkpoints are persisted. Two,
    not one: a checkpoint is on disk before Tune's driver has taken the report that registers it (a trial lost in
    between restarts from scratch), and a function trainable's report waits for the driver to take the one
    before it. (Tune's result files are no use here: it writes them in buffered chunks, often only once a trial
    has ended.)"""
    import psutil

    folders = {d.parent for d in out_dir.glob("tune/*/tune/*/checkpoint_*")}
    checkpointed = {d.name for d in folders if len(list(d.glob("checkpoint_*"))) >= 2}
    found = set()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if "ImplicitFunc" in " ".join(proc.cmdline()) and Path(proc.cwd()).name in checkpointed:
                found.add(Path(proc.cwd()).name)
        except psutil.Error:
            pass  # gone meanwhile
    return found


def _kill_tree(pid: int) -> set[int]:
    """A node lost: its `ray start` step and every process under it (raylet, object store, workers), at once;
    their pids."""
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return set()
    procs = [*root.children(recursive=True), root]
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    return {p.pid for p in procs}


def _comparable(results: pd.DataFrame) -> pd.DataFrame:
    return results.drop(columns=VOLATILE).sort_values(["run_id", "epoch"]).reset_index(drop=True)


def test_the_sbatch_script_runs_a_sweep_across_its_nodes_and_survives_losing_one(isolated_ray_env, tmp_path,
                                                                                    rehearsal_reference, fault_ledger):
    env, root, _token = isolated_ray_env
    sweep_file = tmp_path / "rehearsal.yaml"
    sweep_file.write_text(yaml.safe_dump(_sweep()))
    out_dir = tmp_path / "run"
    shims = _shims(tmp_path / "bin")
    rehearsal = tmp_path / "steps"
    rehearsal.mkdir()
    store = f"--object-store-memory={150 * 1024 * 1024}"
    env = {**env,
           "PATH": f"{shims}{os.pathsep}{env['PATH']}", "REHEARSAL_REAL_RAY": shutil.which("ray") or "ray",
           "REHEARSAL_DIR": str(rehearsal), "REHEARSAL_NODES": "n1 n2",
           "REHEARSAL_ARGS_n1": f"--dashboard-agent-listen-port={_free_port()} --ray-client-server-port={_free_port()} "
                                f"{store} --temp-dir={root / 'ray'} --resources={{\"worker\":3}}",
           "REHEARSAL_ARGS_n2": f"--dashboard-agent-listen-port={_free_port()} {store} --resources={{\"worker\":4}}",
           "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_CPUS_PER_TASK": "2", "SLURM_GPUS_PER_TASK": "0",
           "ICLMEM_RAY_LAUNCH": "head-worker", "ICLMEM_RAY_PORT": str(_free_port()),
           "ICLMEM_SWEEP": str(sweep_file), "ICLMEM_OUT": str(out_dir)}
    started = time.monotonic()
    job = subprocess.Popen(["bash", str(SBATCH)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lost_at, lost, killed = None, set(), set()
    try:
        # stop node n2 while a trial runs there that has saved checkpoints (the trial it runs now, not one that
        # ran there before: under load n2 can join late, probe actors start slowly, and a trial can end on n2
        # before any probe result is stored; killing an idle n2 would lose nothing and prove nothing)
        while time.monotonic() - started < TIMEOUT_S and job.poll() is None:
            n2 = _tree(int((rehearsal / "n2.pid").read_text())) if (rehearsal / "n2.pid").is_file() else set()
            if lost := _checkpointed_trials_in(n2, out_dir):
                lost_at = time.monotonic() - started
                killed = _kill_tree(int((rehearsal / "n2.pid").read_text()))
                break
            time.sleep(0.2)
        out, _ = job.communicate(timeout=max(10.0, TIMEOUT_S - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, _ = job.communicate(timeout=30)
        pytest.fail(f"the rehearsal did not finish in {TIMEOUT_S}s:\n{out[-6000:]}")
    print(f"rehearsal: node n2 stopped at {lost_at}s, job done in {time.monotonic() - started:.0f}s")
    assert lost_at is not None, f"no node was stopped: the sweep ended first or n2 never started\n{out[-6000:]}"
    assert job.returncode == 0, out[-6000:]
    assert "[iclmem] 2 node(s), head n1 (127.0.0.1:" in out
    assert "[iclmem] done:" in out, out[-6000:]

    results = pd.read_parquet(out_dir / RESULTS_FILE)
    trained = results[results["regime"] != "base"]
    assert trained["run_id"].nunique() == 3
    for run_id, group in trained.groupby("run_id"):
        assert sorted(group["epoch"]) == CHECKPOINT_EPOCHS, run_id
    # the lost node was running a trial that had saved its checkpoints: Tune recorded the trial's failure, restored
    # it from a checkpoint on the head, and it reported every epoch to the last. The reports of the processes
    # that survived start just past a checkpointed epoch (1 or 30), where a rerun from scratch would start at 1
    # (Tune either rewrites a restored trial's result file from the checkpoint on or appends to the reports the
    # lost actor had flushed)
    for trial in lost:
        folder = next((out_dir / "tune").glob(f"*/tune/{trial}"))
        assert any(word in (folder / "error.txt").read_text() for word in ("unavailable", "died")), trial
        reports = [json.loads(line) for line in (folder / "result.json").read_text().splitlines() if line]
        before = [r["epoch"] for r in reports if r["pid"] in killed]
        after = [r["epoch"] for r in reports if r["pid"] not in killed]
        assert [r["epoch"] for r in reports] == before + after, (trial, before, after)
        assert after, (trial, before)
        assert after[0] - 1 in CHECKPOINT_EPOCHS[:2], (trial, before, after)
        assert after == list(range(after[0], EPOCHS + 1)), (trial, before, after)
    assert not results.duplicated(["run_id", "epoch"]).any()

    # the same sweep on one node (the session's Ray, no `worker` resource asked for): the same table
    identical = False
    try:
        pd.testing.assert_frame_equal(_comparable(results), _comparable(rehearsal_reference))
        identical = True
    finally:
        fault_ledger(injected=1, completed=True, identical=identical)
    print(f"rehearsal test: {time.monotonic() - started:.0f}s in all; probe nodes {sorted(set(results['probe_node']))}")
    assert json.loads((out_dir / "run_state.json").read_text())["status"] == "complete"
