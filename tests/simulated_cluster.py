"""A head and two worker nodes on this host (``ray.cluster_utils.Cluster``), for the cluster drivers.

Imported by ``tests/cluster_sweep_driver.py`` and ``tests/node_loss_driver.py``, which run in
subprocesses of their own; never by the pytest session (its embedded Ray must stay alone)."""

from __future__ import annotations

from typing import Any

OBJECT_STORE = 120 * 1024 * 1024


def start_cluster(head_system_config: dict[str, Any] | None = None) -> tuple[Any, list[Any]]:
    """Start the cluster and connect this process; returns (cluster, worker nodes).

    The head has CPUs (so a request that ignored the custom resource could land there) but no
    ``worker`` resource; each worker has 2 CPUs and 2 ``worker`` slots."""
    import ray
    from ray.cluster_utils import Cluster

    head_args: dict[str, Any] = {"num_cpus": 2, "include_dashboard": False, "object_store_memory": OBJECT_STORE}
    if head_system_config:
        head_args["_system_config"] = head_system_config
    cluster = Cluster(initialize_head=True, head_node_args=head_args)
    try:
        workers = [cluster.add_node(num_cpus=2, resources={"worker": 2}, object_store_memory=OBJECT_STORE)
                   for _ in range(2)]
        cluster.wait_for_nodes(timeout=120)
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster, workers
