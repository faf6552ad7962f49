"""Run a small sweep on a simulated three-node Ray cluster and print where its work ran (as JSON).

Used by ``tests/test_cluster_jobs.py`` in a subprocess, never imported by pytest: it starts its own
``ray.cluster_utils.Cluster`` (a head plus two worker nodes, all on this host, each a separate raylet
with its own node id) and must not share a process with the test session's embedded Ray.

    python3 tests/cluster_sweep_driver.py SWEEP_JSON RUN_DIR

The head gets CPUs but no ``worker`` resource; the workers get ``worker`` slots. The sweep asks for
``worker`` in ``trial_resources`` and ``probe_resources``, so Ray can only place trials and probe actors
on the workers. The last stdout line is ``CLUSTER_RESULT {json}`` with the node ids and, for every
trial and probe actor, the node it ran on (from the GCS actor table, matched to Tune's per-trial
``pid`` in ``result.json``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def _trial_pids(tune_dir: Path) -> dict[str, list[int]]:
    """run_id -> the pids Tune recorded in each trial's result.json (one per attempt)."""
    pids: dict[str, list[int]] = {}
    for result in tune_dir.rglob("result.json"):
        for line in result.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            run_id = row.get("run_id") or result.parent.name
            if row.get("pid") is not None and row["pid"] not in pids.setdefault(run_id, []):
                pids[run_id].append(int(row["pid"]))
    return pids


def main(sweep_json: str, run_dir: str) -> int:
    import ray
    from ray._private import state
    from simulated_cluster import start_cluster

    from orchestrator.driver.sweep import run_sweep
    from orchestrator.schema.config import parse_sweep

    started = time.monotonic()
    cluster, workers = start_cluster()
    try:
        head_id = cluster.head_node.node_id
        worker_ids = [w.node_id for w in workers]
        alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
        print(f"[driver] cluster up in {time.monotonic() - started:.1f}s: head {head_id[:8]}, "
              f"workers {[w[:8] for w in worker_ids]}", file=sys.stderr, flush=True)

        sweep = parse_sweep(json.loads(Path(sweep_json).read_text()), sweep_json)
        results = run_sweep(None, run_dir, sweep=sweep,
                            log=lambda m: print(m, file=sys.stderr, flush=True))

        actors = list(state.actors().values())
        by_pid = {int(a["Pid"]): a for a in actors if a.get("Pid")}
        trial_nodes = {}
        for run_id, pids in _trial_pids(Path(run_dir) / "tune").items():
            trial_nodes[run_id] = [
                {"pid": pid, "node_id": by_pid[pid]["Address"]["NodeID"] if pid in by_pid else None,
                 "actor_class": by_pid[pid]["ActorClassName"] if pid in by_pid else None}
                for pid in pids
            ]
        probe_actor_nodes = sorted({a["Address"]["NodeID"] for a in actors if a["ActorClassName"] == "ProbeWorker"})
        out = {
            "head": head_id,
            "workers": worker_ids,
            "alive_nodes": {nid: {"resources": n.get("Resources", {}), "address": n.get("NodeManagerAddress")}
                            for nid, n in alive.items()},
            "results": results[["run_id", "regime", "epoch", "outcome", "auc", "probe_node"]].to_dict(orient="records"),
            "trial_nodes": trial_nodes,
            "probe_actor_nodes": probe_actor_nodes,
            "actor_classes": sorted({a["ActorClassName"] for a in actors}),
            "seconds": round(time.monotonic() - started, 1),
        }
        print("CLUSTER_RESULT " + json.dumps(out, default=str), flush=True)
        return 0
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
