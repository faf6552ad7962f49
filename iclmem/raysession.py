"""Ray session start-up, the one place a driver joins or starts Ray (tabular and LM sweeps alike)."""

from __future__ import annotations

import os

DEFAULT_OBJECT_STORE_BYTES = 512 * 1024 * 1024


def ensure_ray(address: str | None = None, num_cpus: int | None = None,
               object_store_memory: int | None = None) -> bool:
    """Join ``address`` (e.g. "auto") or start an embedded local Ray (dashboard off, bounded object
    store, usage stats off); True when this call started it (so the caller shuts it down), False when a
    Ray session already existed in this process (a test session's, or the caller's)."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
                 object_store_memory=object_store_memory or DEFAULT_OBJECT_STORE_BYTES, log_to_driver=False)
    return True
