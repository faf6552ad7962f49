"""Cluster-shaped runs, each on a Ray of its own in separate processes (the session's embedded Ray is left alone).

1. A scaled-down quickstart submitted with ``ray job submit`` to a real local head (``ray start --head``)
   whose dashboard (Jobs API) listens on loopback and requires token authentication, as in docs/CLUSTER.md.
2. A sweep on a simulated three-node cluster (``ray.cluster_utils.Cluster``: a head and two workers on
   this host) whose ``trial_resources``/``probe_resources`` pin trials and probe actors to the workers.

Isolation from other Ray instances on the machine: every process of these clusters gets its own temp
dir (``RAY_TMPDIR``, short enough for unix sockets, so ``ray_current_cluster`` is not the machine's
shared one), its own token file (``RAY_AUTH_TOKEN_PATH``; ``~/.ray/auth_token`` is not touched) and a
marker variable in its environment. Teardown kills exactly the processes that carry the marker: never
``ray stop``, which would take down every Ray on the machine, the test session's included.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pandas as pd
import pytest
import yaml

from iclmem.runfolder import RESULTS_FILE

pytestmark = pytest.mark.slow  # end to end: real Ray Tune sweeps (`make test-fast` leaves them out)

REPO = Path(__file__).resolve().parents[1]
OUTCOMES = {"collapse", "memorization", "inversion", "overfitting", "no_signal"}
SUITE = ["base", "position_first", "skew_true_x2"]
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


# ------------------------------------------------------------------------------------------- helpers
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sweep(name: str, **overrides) -> dict:
    sweep = {
        "name": name,
        "tasks": [{"name": "iris"}],
        "grid": {"lr": [1e-1, 1e-3], "q": [30]},
        "data": {"context_size": 60},
        "training": {"epochs": 4, "checkpoint_epochs": [1, 4]},
        "probe": {"suite": SUITE, "bootstrap": 50},
        "wandb": {"mode": "disabled"},
    }
    sweep.update(overrides)
    return sweep


def _check_results(results: pd.DataFrame, checkpoint_epochs: list[int]) -> None:
    trained = results[results["regime"] != "base"]
    controls = results[results["regime"] == "base"]
    assert trained["run_id"].nunique() == 2, results[["run_id", "regime", "epoch"]]
    for run_id, group in trained.groupby("run_id"):
        assert sorted(group["epoch"]) == checkpoint_epochs, (run_id, sorted(group["epoch"]))
    assert len(controls) == 1
    assert controls["epoch"].tolist() == [0]
    assert not results.duplicated(["run_id", "epoch"]).any()
    assert set(results["outcome"]) <= OUTCOMES, set(results["outcome"])
    assert results["auc"].notna().all()


RAY = str(Path(sys.executable).with_name("ray")) if Path(sys.executable).with_name("ray").is_file() else "ray"


def _ray_cli(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The `ray` command of this interpreter, run outside the repository (the job must not rely on our cwd)."""
    return subprocess.run([RAY, *args], env=env, cwd="/", capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------------------- 1: ray job submit
def _dashboard_status(url: str, token: str | None) -> int:
    request = urllib.request.Request(f"{url}/api/jobs/")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _state_api(url: str, token: str, resource: str) -> list[dict]:
    """``/api/v0/<resource>`` of the dashboard's state API (what ``ray list`` reads), dead entries included."""
    request = urllib.request.Request(f"{url}/api/v0/{resource}?limit=10000&detail=true&timeout=30",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        body = json.loads(response.read())
    assert body.get("result") is True, body
    return body["data"]["result"]["result"]


def _wait_for_dashboard(url: str, token: str, deadline: float) -> None:
    last = None
    while time.monotonic() < deadline:
        try:
            if _dashboard_status(url, token) == 200:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            last = exc
        time.sleep(1)
    raise AssertionError(f"the Jobs API at {url} did not come up: {last!r}")


def _job_status(env: dict, url: str, submission_id: str) -> str:
    """The job's status as `ray job status` prints it (e.g. "Job 'x' succeeded", "Status for job 'x': RUNNING")."""
    out = _ray_cli(env, "job", "status", "--address", url, submission_id, timeout=60)
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    quoted = re.escape(f"'{submission_id}'")
    final = re.search(rf"Job {quoted} (succeeded|failed|was stopped)", text)
    if final:
        return {"succeeded": "SUCCEEDED", "failed": "FAILED", "was stopped": "STOPPED"}[final.group(1)]
    other = re.search(rf"Status for job {quoted}: (?:JobStatus\.)?(\w+)", text)
    return other.group(1).upper() if other else f"?rc={out.returncode}: {text.strip()[-500:]}"


def test_quickstart_submitted_with_ray_job_submit_finishes_and_writes_results(isolated_ray_env, tmp_path):
    env, root, token = isolated_ray_env
    gcs_port, dash_port = _free_port(), _free_port()
    url = f"http://127.0.0.1:{dash_port}"
    started = time.monotonic()
    head = _ray_cli(env, "start", "--head", f"--port={gcs_port}", "--node-ip-address=127.0.0.1",
                    "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash_port}",
                    # the two ports that have fixed defaults (52365, 10001): free ones, beside any other Ray here
                    f"--dashboard-agent-listen-port={_free_port()}", f"--ray-client-server-port={_free_port()}",
                    "--num-cpus=2", f"--object-store-memory={200 * 1024 * 1024}", "--disable-usage-stats",
                    f"--temp-dir={root / 'ray'}", timeout=180)
    assert head.returncode == 0, head.stdout + head.stderr
    _wait_for_dashboard(url, token, started + 120)
    # Token authentication is really on: the Jobs API refuses a request without the token, and a wrong one.
    assert _dashboard_status(url, None) == 401
    assert _dashboard_status(url, "0" * 64) == 403
    # The dashboard (Jobs API) listens on loopback only. `--node-ip-address=127.0.0.1` does not make the
    # node itself loopback-only: `ray start` replaces a loopback node address with the host's routable
    # one (services.resolve_ip_for_localhost), so the GCS is reachable there, guarded by the token.
    node_ip = _state_api(url, token, "nodes")[0]["node_ip"]
    if node_ip != "127.0.0.1":
        with pytest.raises(OSError):  # noqa: PT011 - refused or unreachable, as long as nothing answers
            socket.create_connection((node_ip, dash_port), timeout=5).close()

    sweep_file = tmp_path / "quickstart_small.yaml"
    sweep_file.write_text(yaml.safe_dump(_sweep(
        "quickstart-job", resources={"cpus_per_trial": 1, "probe_actors": 1, "cpus_per_probe_actor": 0.5})))
    run_dir = tmp_path / "run"
    submission_id = f"icj-{uuid.uuid4().hex[:12]}"
    runtime_env = {"excludes": [".git", ".pretrain", "runs", ".venv", "wandb", "**/__pycache__",
                                ".pytest_cache", ".ruff_cache", "*.egg-info"]}
    submit = _ray_cli(env, "job", "submit", "--address", url, "--submission-id", submission_id, "--no-wait",
                      "--working-dir", str(REPO), "--runtime-env-json", json.dumps(runtime_env), "--",
                      sys.executable, "-m", "orchestrator.cli", "run", str(sweep_file), "--out", str(run_dir),
                      "--address", "auto", timeout=180)
    assert submit.returncode == 0, submit.stdout + submit.stderr

    deadline = time.monotonic() + 210
    status = "PENDING"
    while time.monotonic() < deadline:
        status = _job_status(env, url, submission_id)
        if status in TERMINAL:
            break
        time.sleep(3)
    logs = _ray_cli(env, "job", "logs", "--address", url, submission_id, timeout=60)
    job_log = (logs.stdout + logs.stderr)[-6000:]
    assert status == "SUCCEEDED", f"job {submission_id} ended {status} after {time.monotonic() - started:.0f}s:\n{job_log}"

    assert "[iclmem] done:" in job_log, job_log
    results = pd.read_parquet(run_dir / RESULTS_FILE)
    _check_results(results, [1, 4])
    assert (run_dir / "report.html").is_file()
    assert (run_dir / "provenance.json").is_file()
    # The trials ran in actors of this test's head, not on any other Ray of the machine. (Tune's `node_ip`
    # is no help: it is the host's address, shared by every Ray here.) The head's state API, asked with
    # the token, lists its actors with pid and node, dead ones included.
    nodes = _state_api(url, token, "nodes")
    assert [n["is_head_node"] for n in nodes] == [True], nodes
    actors = _state_api(url, token, "actors")
    on_head = {a["pid"]: a["class_name"] for a in actors if a.get("node_id") == nodes[0]["node_id"]}
    trial_pids = {json.loads(line)["pid"] for f in (run_dir / "tune").rglob("result.json")
                  for line in f.read_text().splitlines() if line.strip()}
    assert trial_pids, (trial_pids, on_head)
    assert trial_pids <= set(on_head), (trial_pids, on_head)
    assert {on_head[pid] for pid in trial_pids} == {"ImplicitFunc"}, on_head
    assert "ProbeWorker" in on_head.values(), on_head


# ------------------------------------------------------------------------------------------- 2: three nodes
def test_sweep_on_a_simulated_three_node_cluster_places_trials_and_probe_actors_on_workers(isolated_ray_env, tmp_path):
    env, _root, _token = isolated_ray_env
    sweep_file = tmp_path / "three_nodes.json"
    sweep_file.write_text(json.dumps(_sweep("three-nodes", resources={
        "cpus_per_trial": 1, "probe_actors": 2, "cpus_per_probe_actor": 0.5,
        "trial_resources": {"worker": 1}, "probe_resources": {"worker": 0.5},
    })))
    run_dir = tmp_path / "run"
    driver = subprocess.Popen([sys.executable, str(REPO / "tests" / "cluster_sweep_driver.py"), str(sweep_file),
                               str(run_dir)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    try:
        out, _ = driver.communicate(timeout=230)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        out, _ = driver.communicate(timeout=30)
        pytest.fail(f"the three-node sweep did not finish in time:\n{out[-6000:]}")
    assert driver.returncode == 0, out[-6000:]
    lines = [line for line in out.splitlines() if line.startswith("CLUSTER_RESULT ")]
    assert lines, out[-6000:]
    got = json.loads(lines[-1].removeprefix("CLUSTER_RESULT "))

    head, workers = got["head"], set(got["workers"])
    assert len(workers) == 2
    assert head not in workers
    assert set(got["alive_nodes"]) == workers | {head}
    assert "worker" not in got["alive_nodes"][head]["resources"]  # only the workers can satisfy the requests

    results = pd.DataFrame(got["results"])
    _check_results(results, [1, 4])
    # Every checkpoint, the base-model control included, was probed by an actor on a worker.
    assert set(results["probe_node"]) <= workers, (set(results["probe_node"]), workers, head)
    assert got["probe_actor_nodes"], got["probe_actor_nodes"]
    assert set(got["probe_actor_nodes"]) <= workers, got["probe_actor_nodes"]
    # Every trial (each attempt, by the pid Tune recorded) ran in an actor on a worker.
    assert len(got["trial_nodes"]) == 2, got["trial_nodes"]
    for run_id, attempts in got["trial_nodes"].items():
        assert attempts, run_id
        for attempt in attempts:
            assert attempt["node_id"] in workers, (run_id, attempt, head, got["actor_classes"])
