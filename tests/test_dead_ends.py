"""Issue #45, the new-user trial's dead ends, side effects and silences: a refusal is exit 2 with one line naming
what is wrong, no traceback, the user's files byte-identical and nothing left behind; the command a refusal
advises works; iclmem never calls its own folder (a killed driver's leftovers) someone else's; a check writes
nothing among a user's files; and what iclmem decides for the user (an empty report, a recomputed reference
table, W&B offline instead of online) is said, not done silently.

No test here starts Ray: a sweep that passes its checks stops where the cluster work would begin (``_drive``
stubbed), and the probe actor's worker runs in this process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_run_folder_lock import _digests, _main  # the same helpers: a folder's digests, the CLI in-process

from iclmem.runfolder import RESULTS_FILE

REPO = Path(__file__).resolve().parents[1]
SWEEP = {"name": "dead-ends", "tasks": [{"name": "iris"}], "grid": {"q": [20]}, "data": {"context_size": 30},
         "training": {"epochs": 1, "checkpoint_epochs": [1]}, "wandb": {"mode": "disabled"}}
NO_STORAGE = "/proc/iclmem-cannot-keep-checkpoints"  # no process may create anything there, root included


def _refused(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("iclmem: error:")]
    assert len(errors) == 1, err
    for needle in needles:
        assert needle in err, err


def _sweep_file(tmp_path: Path, name: str, **changes) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, **changes}))
    return path


@pytest.fixture
def no_cluster(monkeypatch):
    """The sweep driver stops where Ray would start: every check, Stage I and the folder's records are real."""
    reached: list[Path] = []

    def drive(prepared, run_dir, **_kwargs):
        reached.append(run_dir)
        return pd.DataFrame()

    monkeypatch.setattr("orchestrator.driver.sweep._drive", drive)
    monkeypatch.setattr("orchestrator.driver.sweep.ensure_ray", lambda *_a, **_k: pytest.fail("Ray was started"))
    return reached


# ------------------------------------------------------------------------------------------------ dead ends
def test_a_sweep_refused_after_stage_one_leaves_its_folder_to_the_corrected_sweep(tmp_path, capsys, monkeypatch):
    """A refusal after Stage I (storage, resources, Ray head) kept the folder claimed by the refused config, and
    the `iclmem resume` the next run's refusal advised failed the same way: the corrected sweep now takes it."""
    from orchestrator.schema.config import parse_sweep

    monkeypatch.setattr("orchestrator.driver.sweep.ensure_ray", lambda *_a, **_k: pytest.fail("Ray was started"))
    out = tmp_path / "run"
    code, err = _main(capsys, "run", str(_sweep_file(tmp_path, "bad", storage_path=NO_STORAGE)), "--out", str(out))
    _refused(code, err, f"storage_path {NO_STORAGE}: cannot keep checkpoints there")
    state = json.loads((out / "run_state.json").read_text())
    assert state["status"] == "failed"
    assert state["refused"] is True
    refused_cache = sorted(p.name for p in (out / "prepared").iterdir())

    reached: list[Path] = []
    monkeypatch.setattr("orchestrator.driver.sweep._drive", lambda _prepared, run_dir, **_k: reached.append(run_dir)
                        or pd.DataFrame())
    fixed = _sweep_file(tmp_path, "fixed", grid={"q": [25]})  # corrected, and another Stage I
    code, err = _main(capsys, "run", str(fixed), "--out", str(out))
    assert code == 0, err
    assert reached == [out.resolve()], "the corrected sweep did not get to its cluster work"
    assert json.loads((out / "sweep.json").read_text())["grid"]["q"] == [25]
    fixed_hash = parse_sweep(yaml.safe_load(fixed.read_text())).config_hash()
    assert json.loads((out / "provenance.json").read_text())["config_hash"] == fixed_hash
    assert sorted(p.name for p in (out / "prepared").iterdir()) != refused_cache, "the refused sweep's rows stayed"


def test_a_sweep_that_started_work_is_never_taken_by_another_config(tmp_path, capsys, no_cluster):
    from iclmem.runfolder import RunStatus, write_run_state
    from orchestrator.report.folder_claims import record_sweep
    from orchestrator.schema.config import parse_sweep

    out = tmp_path / "run"
    out.mkdir()
    record_sweep(out, parse_sweep(SWEEP))
    write_run_state(out, RunStatus.FAILED, note="refused", refused=True)
    (out / "probes").mkdir()  # ... yet a result of it is stored
    before = _digests(out)
    code, err = _main(capsys, "run", str(_sweep_file(tmp_path, "other", grid={"q": [25]})), "--out", str(out))
    _refused(code, err, "holds a sweep of another config")
    assert _digests(out) == before
    assert no_cluster == []


def test_a_killed_drivers_leftovers_do_not_make_its_folder_foreign(tmp_path, capsys, no_cluster):
    """A driver killed between Stage I and sweep.json leaves its lock, its holder record, a half-written
    sweep.json under its temporary name and the prepared tasks: the folder is still iclmem's (empty), and the
    next run takes it, removing the half-written file."""
    import socket

    from iclmem.runfolder import folder_kind
    from orchestrator.audits.audit import claim_audit_folder

    out = tmp_path / "run"
    (out / "prepared").mkdir(parents=True)
    (out / "prepared" / f"{'ab' * 32}.npz").write_bytes(b"a prepared task")
    (out / "prepared" / f".{'ab' * 32}.json.k3j_9xq2.tmp").write_bytes(b"{")
    (out / "driver.lock").touch()
    (out / "driver.json").write_text(json.dumps({"pid": 2 ** 22 + 7, "host": socket.gethostname(),
                                                 "started": "2020-01-01T00:00:00Z", "command": "iclmem run"}))
    (out / ".sweep.json.a1b2c3d4.tmp").write_text('{"name": "half')
    (out / ".iclmem-write-check-zz9_x0ab").touch()
    assert folder_kind(out) == "empty"
    claim_audit_folder(out, "0" * 16, "--out")  # an audit may take it too (raises if not)

    code, err = _main(capsys, "run", str(_sweep_file(tmp_path, "sweep")), "--out", str(out))
    assert code == 0, err
    assert "taking over from the iclmem driver" in err
    assert no_cluster == [out.resolve()]
    assert not list(out.glob(".*")), "the killed driver's half-written files stayed"
    assert folder_kind(out) == "tabular"


def test_someones_files_that_look_like_leftovers_are_still_someones(tmp_path):
    from iclmem.runfolder import folder_kind

    for name in (".notes.tmp", ".draft.backup.tmp", "prepared"):
        folder = tmp_path / name.strip(".")
        folder.mkdir()
        if name == "prepared":
            (folder / "prepared").mkdir()
            (folder / "prepared" / "my-table.csv").write_text("a,b\n")
        else:
            (folder / name).write_text("mine")
        assert folder_kind(folder) == "foreign", name


def _flaky_estimator_module(tmp_path: Path, monkeypatch) -> None:
    """`flaky:make` fits twice, then fails: past the audit's first checks, after its folder is written."""
    (tmp_path / "flaky.py").write_text(
        "from sklearn.linear_model import LogisticRegression\n"
        "FITS = [0]\n"
        "class Flaky(LogisticRegression):\n"
        "    def fit(self, x, y):\n"
        "        FITS[0] += 1\n"
        "        if FITS[0] > 2:\n"
        "            raise RuntimeError('out of memory')\n"
        "        return super().fit(x, y)\n"
        "def make():\n"
        "    return Flaky(max_iter=200)\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_failed_audit_context_folder_does_not_block_the_corrected_rerun(tmp_path, capsys, monkeypatch):
    """An audit-context that fails once its folder is written leaves its provenance (no verdict): the rerun
    with corrected settings into the same --out was refused as "the audit of another set of settings"."""
    from iclmem.provenance import Provenance
    from orchestrator.audits.audit import settings_hash

    out = tmp_path / "audit"
    args = ["audit-context", "iris", "--out", str(out), "--references", "2", "--context-size", "20"]
    failed = {"audit": "context", "task": "iris", "model": None, "estimator": "flaky:make", "context_size": 20,
              "references": 2, "seed": 0, "bootstrap": 1000, "null_splits": 1}
    # what the failed run leaves (built directly: how it fails is context_audit's own business)
    out.mkdir()
    Provenance.collect(kind="audit", sweep_name="context-iris", config=failed, config_hash=settings_hash(failed),
                       seeds=[0]).write(out)
    code, err = _main(capsys, *args, "--estimator", "sklearn.linear_model:LogisticRegression")
    assert code == 0, err
    assert "holds an unfinished audit of another set of settings (flaky:make" in err
    assert (out / "verdict.json").is_file()
    record = Provenance.read(out)
    assert record is not None
    assert record.config["estimator"] == "sklearn.linear_model:LogisticRegression"

    # a finished audit of other settings stays refused, byte-identical
    before = _digests(out)
    code, err = _main(capsys, *args, "--estimator", "sklearn.linear_model:LogisticRegression", "--seed", "1")
    _refused(code, err, "holds the audit of another set of settings")
    assert _digests(out) == before


@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_an_audit_context_refused_mid_scoring_leaves_nothing_behind(tmp_path, capsys, monkeypatch, folder):
    """`flaky:make` passes the audit's one trial fit and fails while the reference contexts are scored, after
    the folder and its provenance are written: the refusal (exit 2, one line naming the estimator) takes them
    with it, so the folder is as it was (none, or empty) and nothing else changed."""
    _flaky_estimator_module(tmp_path, monkeypatch)
    sys.modules.pop("flaky", None)
    out = tmp_path / "audit"
    if folder == "empty":
        out.mkdir()
    before = {k: v for k, v in _digests(tmp_path).items()}
    try:
        code, err = _main(capsys, "audit-context", "iris", "--estimator", "flaky:make", "--out", str(out),
                          "--references", "2", "--context-size", "20")
    finally:
        sys.modules.pop("flaky", None)
    _refused(code, err, "--estimator flaky:make: its fit failed (RuntimeError: out of memory)")
    assert "[iclmem] context audit of iris" in err, "refused before scoring began: not the case under test"
    assert (not out.exists()) if folder == "missing" else list(out.iterdir()) == []
    assert {k: v for k, v in _digests(tmp_path).items() if "__pycache__" not in k} == before


SPY = ("import os\n"
       "from pathlib import Path\n"
       "from sklearn.linear_model import LogisticRegression\n"
       "SEEN = []\n"
       "class Spy(LogisticRegression):\n"
       "    def fit(self, x, y):\n"
       "        SEEN.append(None)\n"
       "        if len(SEEN) == 2:  # scoring: the folder and its provenance are written, no verdict yet\n"
       "            from orchestrator.audits.audit import claim_audit_folder\n"
       "            try:\n"
       "                claim_audit_folder(Path(os.environ['SPY_OUT']), 'another-audit', '--out', 'set of settings')\n"
       "            except Exception as exc:\n"
       "                SEEN[-1] = f'{type(exc).__name__}: {exc}'\n"
       "            else:\n"
       "                SEEN[-1] = 'let in'\n"
       "        return super().fit(x, y)\n"
       "def make():\n"
       "    return Spy(max_iter=200)\n")


def test_a_live_audit_context_holds_its_folder_so_another_audit_cannot_replace_it(tmp_path, capsys, monkeypatch):
    """While it scores, the folder holds provenance and no verdict: an unfinished audit, which an audit of other
    settings may replace. The live one holds driver.lock, so the other is refused as in use."""
    (tmp_path / "spy.py").write_text(SPY)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "audit"
    monkeypatch.setenv("SPY_OUT", str(out))
    sys.modules.pop("spy", None)
    try:
        code, err = _main(capsys, "audit-context", "iris", "--estimator", "spy:make", "--out", str(out),
                          "--references", "2", "--context-size", "20")
        seen = list(sys.modules["spy"].SEEN)
    finally:
        sys.modules.pop("spy", None)
    assert code == 0, err
    assert seen[1].startswith(f"RunFolderInUse: {out} is in use by another iclmem driver: pid {os.getpid()}"), seen[1]
    assert "iclmem audit-context" in seen[1]
    assert (out / "verdict.json").is_file()
    assert not (out / "driver.lock").exists()
    assert not (out / "driver.json").exists()


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    """A weights file of pfn-mini (its shipped base weights): the flags say the split."""
    from trainables.models.embedded import SHIPPED_WEIGHTS

    return Path(SHIPPED_WEIGHTS)


@pytest.mark.parametrize("case", ["too many members", "members not in the table"])
@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_a_refused_probe_leaves_no_provenance_and_no_prepared_rows(checkpoint, tmp_path, capsys, case, folder):
    out = tmp_path / "audit"
    if folder == "empty":
        out.mkdir()
    members = tmp_path / "members.txt"
    members.write_text("".join(f"{100_000 + i}\n" for i in range(20)))
    before = _digests(tmp_path)
    flags = (["--q", "2000"] if case == "too many members"
             else ["--q", "20", "--context-size", "30", "--members", str(members)])
    code, err = _main(capsys, "probe", str(checkpoint), "--base-model", "pfn-mini", "--task", "iris", *flags,
                      "--out", str(out))
    _refused(code, err, "too few rows" if case == "too many members" else "not in the table")
    assert _digests(tmp_path) == before, "a refused probe wrote something"
    assert (not out.exists()) if folder == "missing" else list(out.iterdir()) == []


# ------------------------------------------------------------------------------------------------ side effects
def test_run_refuses_a_users_folder_without_writing_in_it(tmp_path, capsys):
    """The write check created and deleted a file among the user's files (their project, ``/``, ``~``) before the
    folder was refused as not iclmem's: the folder's own mtime shows any such write."""
    from iclmem.runfolder import unwritable

    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    os.utime(home, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    before = _digests(home)
    code, err = _main(capsys, "run", str(_sweep_file(tmp_path, "sweep")), "--out", str(home))
    _refused(code, err, "is not empty and is not an iclmem run folder")
    assert unwritable(home) is None  # readable as writable without a write
    assert home.stat().st_mtime_ns == 1_000_000_000_000_000_000, "a file was created and removed in the folder"
    assert _digests(home) == before


# ------------------------------------------------------------------------------------------------ silences
HOLDER = ("import sys, time\n"
          "from iclmem.runlock import hold_run_folder\n"
          "with hold_run_folder(sys.argv[1], 'iclmem run'):\n"
          "    print('held', flush=True)\n"
          "    time.sleep(600)\n")


def _started_sweep(out: Path) -> Path:
    """A sweep folder as its driver leaves it before the first probe result: records, no results."""
    from iclmem.runfolder import RunStatus, write_run_state
    from orchestrator.report.folder_claims import record_sweep
    from orchestrator.schema.config import parse_sweep

    out.mkdir()
    record_sweep(out, parse_sweep(SWEEP))
    write_run_state(out, RunStatus.RUNNING)
    return out


def test_report_of_a_live_sweep_is_refused_and_of_a_stopped_one_without_results_says_so(tmp_path, capsys):
    out = _started_sweep(tmp_path / "run")
    before = _digests(out)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        code, err = _main(capsys, "report", str(out), "--wandb", "disabled")
        _refused(code, err, f"{out} is in use by another iclmem driver: pid {proc.pid}")
    finally:
        proc.send_signal(signal.SIGINT)  # ends normally: its lock and record go with it
        proc.wait(timeout=30)
    assert _digests(out) == before

    code, err = _main(capsys, "report", str(out), "--wandb", "disabled")
    _refused(code, err, f"{out} holds no probe result", "killed?", f"iclmem resume {out}", "nothing was written")
    assert _digests(out) == before, "a report without results wrote something (an empty table?)"
    assert not (out / RESULTS_FILE).exists()


def test_a_damaged_reference_table_is_recomputed_with_a_warning_naming_it(tmp_path):
    """The probe actor recomputed a damaged ``reference/*.parquet`` with a warning only its own stderr saw (the
    console log, on whatever node): it is now a note of the job, which the driver prints."""
    from orchestrator.runfolder.prepare import prepare_sweep
    from orchestrator.schema.config import parse_sweep
    from probes.actors import ProbeJob, ProbeWorker
    from probes.calibration import model_digest
    from probes.probe import ProbeSettings
    from trainables.models import build_model

    sweep = parse_sweep({**SWEEP, "models": [{"name": "pfn-mini", "options": {"weights": "shipped"}}]})
    prepared = prepare_sweep(sweep, tmp_path / "prepared", log=lambda _m: None)
    base = build_model("pfn-mini", weights="shipped")
    worker = ProbeWorker("pfn-mini", {"weights": "shipped"}, base.state_arrays(), model_digest(base), prepared.tasks,
                         "default", ProbeSettings(n_resamples=50, n_checkpoints=1), str(tmp_path / "reference"))
    key, identity = prepared.controls[0]
    job = ProbeJob(identity, 0, None, key, str(tmp_path / "probes"), "e0000")
    first = worker.run(job)
    assert first.notes == ()
    (damaged,) = sorted((tmp_path / "reference").glob("reference_*.parquet"))
    damaged.write_bytes(damaged.read_bytes()[:-40])  # truncated: its footer is gone
    again = worker.run(job)
    assert any(str(damaged) in note and "recomputed" in note for note in again.notes), again.notes
    assert again.row["auc"] == first.row["auc"]


def test_wandb_online_that_the_environment_turns_offline_is_said_naming_wandb_mode(tmp_path, capsys, monkeypatch,
                                                                                  no_cluster):
    import orchestrator.report.wandb_logger as W

    monkeypatch.setattr(W, "_SAID", set())
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    code, err = _main(capsys, "run", str(_sweep_file(tmp_path, "sweep")), "--out", str(tmp_path / "run"),
                      "--wandb", "online")
    assert code == 0, err
    said = [line for line in err.splitlines() if "WANDB_MODE=offline" in line]
    assert len(said) == 1, err
    assert said[0].startswith("iclmem: warning: W&B online mode requested"), err
    assert W.resolve_wandb_mode("online") == "offline"
    assert "WANDB_MODE" not in capsys.readouterr().err, "said more than once"
    monkeypatch.delenv("WANDB_MODE")
    assert W.resolve_wandb_mode("online") == "online"
    assert capsys.readouterr().err == ""


LM_DRIVER = ("import sys\n"
             "import pandas as pd\n"
             "import orchestrator.driver.lm_sweep as L\n"
             "import orchestrator.report.wandb_logger as W\n"
             "def drive(cfg, *_a, **_k):  # what the W&B logger at the end of a sweep resolves, inside the console\n"
             "    W.resolve_wandb_mode(str(cfg.wandb.mode))\n"
             "    return pd.DataFrame()\n"
             "L._resolve_new_or_continued = lambda cfg, run_dir: None\n"
             "L._drive_lm = drive\n"
             "from orchestrator.cli import main\n"
             "sys.exit(main(sys.argv[1:]))\n")


def test_lm_run_says_on_the_terminal_that_wandb_mode_turns_online_offline(tmp_path):
    """`iclmem lm run --wandb online` with WANDB_MODE=offline: the warning was printed first by the W&B logger at
    the end of the sweep, inside the quiet console (file descriptors 1 and 2 sent to console.log), so the terminal
    never saw it. It is said before the console is quieted, once, naming WANDB_MODE. A process of its own (the
    console redirects its descriptors); Ray's side is stubbed (inputs and units), the folder's records are real."""
    out = tmp_path / "lm-run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", LM_DRIVER, "lm", "run", str(REPO / "configs" / "lm_quickstart.yaml"),
                           "--out", str(out), "--wandb", "online"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "WANDB_MODE=offline" in line]
    assert len(said) == 1, proc.stderr
    assert said[0].startswith("iclmem: warning: W&B online mode requested"), proc.stderr
    assert "WANDB_MODE" not in (out / "console.log").read_text()
