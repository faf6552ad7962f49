"""Run a small sweep on a simulated three-node Ray cluster, remove a worker node mid-sweep, and report.

Used by ``tests/test_node_loss.py`` in a subprocess, never imported by pytest: it starts its own
``ray.cluster_utils.Cluster`` (a head plus two worker nodes, all on this host, each a separate raylet
with its own node id) and must not share a process with the test session's embedded Ray.

    python3 tests/node_loss_driver.py SWEEP_JSON RUN_DIR

The head gets CPUs but no ``worker`` resource; the workers get ``worker`` slots, and the sweep asks for
``worker`` in ``trial_resources`` and ``probe_resources``, so trials and probe actors run on the workers.
The sweep runs in the main thread; a watcher thread waits until a trained checkpoint's probe result is
stored while a trial is still running, records every finished probe result file with its sha256, and
kills one worker node (``Cluster.remove_node(..., allow_graceful=False)``: its raylet, object store and
every worker process on it die at once), preferring one that hosts a running trial and probe actors
(see ``Watcher``). The uninterrupted reference the table must equal is the test's (the same sweep on the
session's Ray, ``tests/rehearsal_sweep.py``). The last stdout line is ``NODE_LOSS_RESULT {json}``: node ids,
what the removed node hosted, the finished result files with their digests before the removal and after the
sweep, the results table (main columns; the full table is ``results.parquet``), errors and timings.
Exit status 0 when the sweep completed.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
import traceback
from pathlib import Path

from iclmem.runfolder import RESULTS_FILE

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the driver is run as a script: make the project importable from any install state
    sys.path.insert(0, str(REPO))

# How long the GCS takes to declare the killed node dead (and so to restart its actors elsewhere): 10
# missed health checks 3 s apart, about 30 s. Ray's default is 5 (about 15 s here, where the dead raylet's
# port refuses connections at once); a machine that vanishes from the network (checks time out after
# 10 s each) takes longer still. 30 s keeps the outage longer than any short retry budget, every time.
# A killed raylet fails its health checks at once (the connection is refused), so the GCS declares it dead
# after threshold x period (8 s here; Ray's default 3 s x 5). A live but busy raylet fails a check only by
# not answering within health_check_timeout_ms (Ray's 10 s), 8 times in a row: no false node death.
HEAD_SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 8}
RESULT_SUFFIXES = (".json", ".manip.parquet", ".roc.parquet")  # what ProbeResult.save writes per checkpoint
WATCH_TIMEOUT_S = 240.0


def _log(message: str) -> None:
    print(f"[node-loss] {message}", file=sys.stderr, flush=True)


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def finished_probe_files(probes_dir: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file of every finished probe result (its ``.json`` is written last)."""
    files: dict[str, str] = {}
    for result in sorted(probes_dir.glob("*/*.json")):
        if result.name.startswith("."):  # an atomic write in progress
            continue
        stem = result.name.removesuffix(".json")
        for suffix in RESULT_SUFFIXES:
            path = result.with_name(stem + suffix)
            digest = _sha256(path)
            if digest is not None:
                files[str(path.relative_to(probes_dir))] = digest
    return files


def trained_results(probes_dir: Path) -> list[str]:
    """Finished probe results of trained checkpoints (epoch > 0; the base-model control is epoch 0)."""
    done = []
    for result in sorted(probes_dir.glob("*/*.json")):
        if result.name.startswith("."):
            continue
        try:
            row = json.loads(result.read_text())["row"]
        except (OSError, ValueError, KeyError):
            continue
        if int(row.get("epoch", 0)) > 0:
            done.append(str(result.relative_to(probes_dir)))
    return done


def checkpoints_written(tune_dir: Path) -> dict[str, int]:
    """Trial folder -> how many checkpoints Tune has persisted for it. (Tune's own params.json and
    result.json reach storage late, in periodic syncs; the checkpoint folders show a trial's progress.)"""
    return {trial.name: sum(1 for c in trial.glob("checkpoint_*") if c.is_dir())
            for trial in tune_dir.glob("*/*") if trial.is_dir()}


def live_actors(worker_ids: list[str]) -> dict[str, dict[str, list[int]]]:
    """worker node id -> {actor class -> pids} of the ALIVE trial (ImplicitFunc) and probe actors on it."""
    from ray._private import state

    out: dict[str, dict[str, list[int]]] = {nid: {} for nid in worker_ids}
    for actor in state.actors().values():
        if actor.get("State") != "ALIVE" or actor.get("ActorClassName") not in ("ImplicitFunc", "ProbeWorker"):
            continue
        node = (actor.get("Address") or {}).get("NodeID")
        if node in out:
            out[node].setdefault(actor["ActorClassName"], []).append(int(actor.get("Pid") or 0))
    return out


class Watcher(threading.Thread):
    """Waits until a trained checkpoint's probe result is stored while a trial still runs, then removes
    one worker node, preferring (in this order) one that hosts a running trial and a probe actor, one
    that hosts a probe actor, one that hosts a running trial; and, for up to GRACE_S, a moment when some
    persisted checkpoint is still being probed (its job is then in flight when the node goes)."""

    GRACE_S = 6.0

    def __init__(self, cluster, workers, run_dir: Path, n_trials: int, n_checkpoints: int,
                 done: threading.Event) -> None:
        super().__init__(name="node-loss-watcher", daemon=True)
        self.cluster, self.workers, self.run_dir, self.done = cluster, workers, run_dir, done
        self.n_trials, self.n_checkpoints = n_trials, n_checkpoints
        self.report: dict = {"injected": False}
        self.started_at = time.monotonic()

    def run(self) -> None:
        try:
            self._watch()
        except BaseException:  # reported, never raised into the sweep
            self.report["error"] = traceback.format_exc()
            _log(f"watcher failed:\n{self.report['error']}")

    def _watch(self) -> None:
        probes_dir, tune_dir = self.run_dir / "probes", self.run_dir / "tune"
        worker_ids = [w.node_id for w in self.workers]
        deadline = time.monotonic() + WATCH_TIMEOUT_S
        last_view, last_shown, ready_since = None, 0.0, None
        while not self.done.is_set() and time.monotonic() < deadline:
            time.sleep(0.2)
            trained = trained_results(probes_dir)
            written = checkpoints_written(tune_dir)
            complete = sum(n >= self.n_checkpoints for n in written.values())
            unprobed = sum(written.values()) - len(trained)  # persisted checkpoints whose result is not stored yet
            actors = live_actors(worker_ids)
            view = (len(trained), sorted(written.values()), {nid[:8]: a for nid, a in actors.items()})
            if view != last_view and time.monotonic() - last_shown > 1.0:  # what it waits on, for a failure's log
                _log(f"watching: trained results {view[0]}, checkpoints per trial {view[1]}, actors {view[2]}")
                last_view, last_shown = view, time.monotonic()
            with_trial = [nid for nid in worker_ids if actors[nid].get("ImplicitFunc")]
            if not trained or complete >= self.n_trials or not with_trial:
                continue
            ready_since = ready_since or time.monotonic()
            if unprobed <= 0 and time.monotonic() - ready_since < self.GRACE_S:
                continue
            with_probe = [nid for nid in worker_ids if actors[nid].get("ProbeWorker")]
            both = [nid for nid in with_trial if nid in with_probe]
            victim_id = (both or with_probe or with_trial)[0]
            victim = next(w for w in self.workers if w.node_id == victim_id)
            before = finished_probe_files(probes_dir)
            self.report.update({
                "removed_node": victim_id,
                "removed_node_actors": actors[victim_id],
                "surviving_node": next(nid for nid in worker_ids if nid != victim_id),
                "actors_at_removal": actors,
                "checkpoints_at_removal": written,  # trial folder -> checkpoints persisted so far
                "unprobed_checkpoints_at_removal": unprobed,
                "trained_results_at_removal": trained,
                "before": before,
                "removed_at_s": round(time.monotonic() - self.started_at, 1),
            })
            _log(f"removing node {victim_id[:8]} (actors {actors[victim_id]}); {len(before)} result files stored; "
                 f"checkpoints per trial {sorted(written.values())}, {unprobed} not probed yet")
            t0 = time.monotonic()
            self.cluster.remove_node(victim, allow_graceful=False)
            self.report["remove_node_s"] = round(time.monotonic() - t0, 1)
            self.report["injected"] = True
            _log(f"node {victim_id[:8]} removed in {self.report['remove_node_s']}s")
            return
        self.report["not_injected_reason"] = "the sweep ended first" if self.done.is_set() else "watch timed out"


def _rows(results) -> list[dict]:
    if results is None:
        return []
    columns = [c for c in ("run_id", "regime", "lr", "epoch", "outcome", "auc", "auc_low", "auc_high", "tpr_at_1pct",
                           "tpr_at_10pct", "loss_ratio", "probe_node") if c in results.columns]
    frame = results[columns].sort_values(["run_id", "epoch"])
    return json.loads(frame.to_json(orient="records", double_precision=15))


def _run(run_sweep, sweep, run_dir: Path, **kwargs):
    """(results, None, seconds) or (whatever results.parquet holds, the error's traceback, seconds)."""
    import pandas as pd

    t0 = time.monotonic()
    try:
        return run_sweep(None, run_dir, sweep=sweep, log=lambda m: print(m, file=sys.stderr, flush=True),
                         **kwargs), None, time.monotonic() - t0
    except Exception:
        error = traceback.format_exc()
        _log(f"the sweep into {run_dir} failed:\n{error}")
        stored = run_dir / RESULTS_FILE
        return (pd.read_parquet(stored) if stored.is_file() else None), error[-4000:], time.monotonic() - t0


def _alive_nodes() -> list[str]:
    import ray

    return sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))


def main(sweep_json: str, run_dir: str) -> int:
    import ray
    from simulated_cluster import start_cluster

    from orchestrator.driver.sweep import run_sweep
    from orchestrator.runfolder.prepare import expand_grid
    from orchestrator.schema.config import parse_sweep

    started = time.monotonic()
    sweep = parse_sweep(json.loads(Path(sweep_json).read_text()), sweep_json)
    run_path = Path(run_dir).resolve()
    cluster, workers = start_cluster(HEAD_SYSTEM_CONFIG)
    try:
        head_id = cluster.head_node.node_id
        worker_ids = [w.node_id for w in workers]
        cluster_up = time.monotonic() - started
        _log(f"cluster up in {cluster_up:.1f}s: head {head_id[:8]}, workers {[w[:8] for w in worker_ids]}")

        t = sweep.training
        n_checkpoints = t.epochs if t.every_epoch else len({e for e in t.checkpoint_epochs if e <= t.epochs})
        done = threading.Event()
        watcher = Watcher(cluster, workers, run_path, len(expand_grid(sweep)), n_checkpoints, done)
        watcher.start()
        try:
            results, sweep_error, sweep_s = _run(run_sweep, sweep, run_path)
        finally:
            done.set()
            watcher.join(timeout=60)
        fault = watcher.report
        after = {name: _sha256(run_path / "probes" / name) for name in fault.get("before", {})}
        _log(f"sweep with node loss ended in {sweep_s:.1f}s")
        alive_after = _alive_nodes()
        deadline = time.monotonic() + 60  # the GCS declares the killed node dead once its health checks fail
        while fault.get("removed_node") in alive_after and time.monotonic() < deadline:
            time.sleep(1)
            alive_after = _alive_nodes()

        out = {
            "head": head_id,
            "workers": worker_ids,
            "alive_after": alive_after,
            "sweep_error": sweep_error,
            **{k: v for k, v in fault.items() if k != "before"},
            "before": fault.get("before", {}),
            "after": after,
            "final_files": finished_probe_files(run_path / "probes"),
            "results_file": str(run_path / RESULTS_FILE),
            "results": _rows(results),
            "seconds": {"cluster_up": round(cluster_up, 1), "sweep": round(sweep_s, 1),
                        "total": round(time.monotonic() - started, 1)},
        }
        print("NODE_LOSS_RESULT " + json.dumps(out, default=str), flush=True)
        return 0 if sweep_error is None else 1
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
