"""One Ray instance per test session (2 CPUs, no dashboard, bounded object store)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import tempfile
import uuid
from pathlib import Path

import psutil
import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

pytest_plugins = ["suite_profile_hook"]  # per-test times with ICLMEM_SUITE_PROFILE set (benchmarks/suite_profile.py)

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CARTE_DIR = SHARED / "data" / "carte"


@pytest.fixture(autouse=True)
def private_iclmem_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own ``$ICLMEM_CACHE`` (estimates kept for a run's comparison, the machine's measured
    overheads): a test's stubbed timings never reach the user's cache, and no test reads another's."""
    monkeypatch.setenv("ICLMEM_CACHE", str(tmp_path_factory.mktemp("iclmem-cache")))


@pytest.fixture(scope="session")
def ray_session():
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=300 * 1024 * 1024,
                 log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def real_sweep(tmp_path_factory, ray_session):
    """(run folder, results, driver log) of the session's one small real sweep (tests/shared_sweep.py),
    built on first use and shared by the end-to-end, report and W&B tests. Tests read it, never write it."""
    from shared_sweep import run_real_sweep

    return run_real_sweep(tmp_path_factory.mktemp("e2e"))


@pytest.fixture(scope="session")
def rehearsal_reference(tmp_path_factory, ray_session):
    """The results table of the cluster rehearsals' sweep run uninterrupted on the session's Ray
    (tests/rehearsal_sweep.py), built once for the node-loss and the Slurm rehearsals that must equal it."""
    from rehearsal_sweep import run_reference

    return run_reference(tmp_path_factory.mktemp("rehearsal"))


# ------------------------------------------------------------------------------- xdist scheduling
# `make test` runs two xdist workers with --dist loadgroup. A module whose tests share a fixture wider than one
# test (module, class, or the session's real sweep) goes to one worker as one unit: split between the two, each
# worker would build that fixture itself (the shared sweep alone is over a minute). The other tests are handed
# out one by one, the slow ones first, so that no long test starts last while the other worker idles.
_SHARED_SCOPES = ("module", "class")
# The modules of the longest tests (--durations on this 2-core machine: 40-100 s each), started first; a hint
# for the schedule only (a stale entry costs minutes, never a result)
_LONGEST_FIRST = ("test_node_loss", "test_pipeline", "test_interrupt", "test_dp", "test_tune_faults", "test_console",
                  "test_cluster_jobs", "test_slurm_rehearsal", "test_exchangeability")
_SHARED_SESSION_FIXTURES = ("real_sweep", "rehearsal_reference")


def _shares_a_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name, defs in info.name2fixturedefs.items():
        if defs and (defs[-1].scope in _SHARED_SCOPES or name in _SHARED_SESSION_FIXTURES):
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    # a module sharing a session fixture joins the other readers of it (one group per fixture, one build)
    grouped: dict[str, str] = {}
    for item in items:
        name = item.module.__name__
        if shared := [f for f in _SHARED_SESSION_FIXTURES if f in item.fixturenames]:
            grouped[name] = shared[0]
        elif _shares_a_fixture(item):
            grouped.setdefault(name, name)
    for item in items:
        if item.module.__name__ in grouped:
            item.add_marker(pytest.mark.xdist_group(grouped[item.module.__name__]))
    slow_tests: dict[str, int] = {}
    for item in items:
        if item.get_closest_marker("slow"):
            slow_tests[item.module.__name__] = slow_tests.get(item.module.__name__, 0) + 1
    # stable: a module's tests keep their order; the longest first, then the modules with the most slow tests
    # (the Makefile's --no-loadscope-reorder keeps this order instead of xdist's: groups with most tests first)
    def rank(item: pytest.Item) -> tuple[int, int]:
        name = item.module.__name__
        return (_LONGEST_FIRST.index(name) if name in _LONGEST_FIRST else len(_LONGEST_FIRST),
                -slow_tests.get(name, 0))

    items.sort(key=rank)


# ------------------------------------------------------------------------------- private Ray clusters
# Tests that start a Ray of their own (ray job submit, ray.cluster_utils.Cluster) run it in
# subprocesses with this environment: own temp dir and token, and a marker for an exact teardown.
REPO = Path(__file__).resolve().parents[1]
MARKER = "ICLMEM_TEST_CLUSTER"


def _marked(marker: str) -> list[psutil.Process]:
    procs = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(MARKER) == marker:
                procs.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return procs


def _kill_marked(marker: str, grace: float = 3.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process that carries this test's marker; returns survivors' pids."""
    for attempt in range(3):  # a dying raylet may still spawn a worker: sweep again
        procs = _marked(marker)
        if not procs:
            return []
        for proc in procs:
            try:
                proc.send_signal(signal.SIGTERM if attempt == 0 else signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace if attempt == 0 else 5)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in _marked(marker)]


@pytest.fixture
def isolated_ray_env():
    """Environment for a private Ray: own temp dir and token, token auth on, a marker for teardown."""
    root = Path(tempfile.mkdtemp(prefix="icj-", dir="/tmp"))  # short: AF_UNIX socket paths must stay < 108 chars
    token_file = root / "auth_token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))  # what `ray get-auth-token --generate` writes
    marker = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    env.update({
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file), "RAY_TMPDIR": str(root),
        "RAY_USAGE_STATS_ENABLED": "0", "WANDB_MODE": "disabled", "WANDB_SILENT": "true",
        "PYTHONUNBUFFERED": "1", MARKER: marker,
        # the project itself, for drivers and every Ray worker their raylets start (not only via the install)
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
    })
    try:
        yield env, root, token_file.read_text()
    finally:
        survivors = _kill_marked(marker)
        shutil.rmtree(root, ignore_errors=True)
        assert not survivors, f"processes of the test cluster survived teardown: {survivors}"


# ------------------------------------------------------------------------------------------ fault ledger
# Fault tests record what they injected and whether the sweep finished with identical results. The record
# travels with the test's report (user_properties), so the summary is right whether the tests ran in this
# process or in pytest-xdist workers.
FAULT_LEDGER = {"faults injected": 0, "sweeps completed": 0, "results identical": 0}
_LEDGER_PROPERTY = "iclmem_fault_ledger"


@pytest.fixture
def fault_ledger(request):
    def record(injected: int = 1, completed: bool = True, identical: bool = True) -> None:
        request.node.user_properties.append(
            (_LEDGER_PROPERTY, {"faults injected": injected, "sweeps completed": int(completed),
                                "results identical": int(identical)}))

    return record


def pytest_runtest_logreport(report):
    if report.when != "call":
        return
    for name, value in report.user_properties:
        if name == _LEDGER_PROPERTY:
            for key, count in value.items():
                FAULT_LEDGER[key] += count


def pytest_terminal_summary(terminalreporter):
    if FAULT_LEDGER["faults injected"]:
        line = " / ".join(f"{k}: {v}" for k, v in FAULT_LEDGER.items())
        terminalreporter.write_line(f"fault suite: {line}")
