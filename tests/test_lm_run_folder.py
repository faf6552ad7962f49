"""The LM probe driver (`iclmem lm run`, `iclmem lm resume`) on the tabular driver's run-folder machinery:
it writes only into a new or empty folder or an LM run of the same config (refusing anything else before
writing a byte), records how it ended in run_state.json, keeps Ray's and W&B's output in console.log, and
turns Ctrl-C into exit 130 with the `iclmem lm resume` hint, every stored unit kept."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from iclmem.errors import ConfigError, SweepInterrupted
from iclmem.runfolder import (
    CONSOLE_LOG_FILE,
    LM_RESULTS_FILE,
    LM_SWEEP_FILE,
    LM_UNITS_DIR,
    RUN_STATE_FILE,
    RunStatus,
    read_run_state,
)
from orchestrator import cli
from orchestrator.driver import lm_sweep


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _stored_units(run: Path) -> dict[Path, tuple[int, int]]:
    """Every stored unit result (its JSON is written last) -> (inode, mtime_ns): a rewrite changes either."""
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (run / LM_UNITS_DIR).glob("*/*.json")}


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """The smallest LM sweep that does real work: a tiny GPT-2 (a few training steps on the synthetic
    world's corpus, as tests/test_lm_probes.py's ``planted`` but untrained enough to take seconds), one
    entity list, the exposure probe only: one unit on one probe actor, W&B off."""
    from probes.lm.synthetic import corpus_sentences, make_world, train_tiny_gpt2

    root = tmp_path_factory.mktemp("lm_folder")
    world = make_world(0)
    model = train_tiny_gpt2([s.text for s in corpus_sentences(world, n=100, seed=1)], root / "tiny", seed=0,
                            steps=5, n_positions=128)
    (root / "entities.tsv").write_text("".join(f"{e}\t{t}\n" for t, es in world.planted.items() for e in es[:4]))
    sweep = {"name": "lm-folder", "models": [{"name": "tiny", "path": str(model)}],
             "datasets": [{"name": "toy-list", "path": "entities.tsv", "format": "entity_list"}],
             "probes": ["exposure"], "seeds": [0], "resources": {"probe_actors": 1, "cpus_per_probe_actor": 0.5},
             "wandb": {"mode": "disabled"}}
    config = root / "lm.yaml"
    config.write_text(yaml.safe_dump(sweep))
    other = root / "other.yaml"
    other.write_text(yaml.safe_dump({**sweep, "name": "lm-other", "batch_size": 8}))
    return SimpleNamespace(config=config, other=other, root=root)


def _users_folder(folder: Path) -> Path:
    (folder / "notes").mkdir(parents=True)
    (folder / "lm_results.parquet").write_bytes(b"my own table")
    (folder / "provenance.json").write_text('{"mine": true}')
    (folder / "notes" / "todo.txt").write_text("keep me")
    return folder


# ------------------------------------------------------------------------------------------- refusals
def test_lm_run_refuses_a_folder_of_someone_elses_files_exits_2_and_writes_nothing(lm, tmp_path, capsys):
    folder = _users_folder(tmp_path / "mine")
    before = _digests(folder)
    assert cli.main(["lm", "run", str(lm.config), "--out", str(folder), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"iclmem: error: {folder.resolve()} is not empty and is not an iclmem run folder" in err
    assert "give --out a new or empty folder" in err
    assert "Traceback" not in err
    assert _digests(folder) == before
    assert sorted(p.name for p in folder.iterdir()) == [
        "lm_results.parquet", "notes", "provenance.json"]


def test_lm_run_refuses_an_lm_run_of_another_config_and_points_to_lm_resume(lm, tmp_path):
    from orchestrator.schema.sweep_files import load_lm_sweep

    folder = tmp_path / "run"
    folder.mkdir()
    other = load_lm_sweep(lm.other)
    lm_sweep.lm_provenance(other).write(folder)
    (folder / LM_SWEEP_FILE).write_text(other.model_dump_json())
    before = _digests(folder)
    this = load_lm_sweep(lm.config)
    assert this.config_hash() != other.config_hash()
    with pytest.raises(ConfigError, match=rf"another config \('lm-other', hash {other.config_hash()}; this one is "
                       rf"{this.config_hash()}\): continue that one with `iclmem lm resume {folder}`"):
        lm_sweep.run_lm_sweep(lm.config, folder, log=lambda _line: None)
    assert _digests(folder) == before


def test_lm_run_refuses_a_tabular_run_folder_and_asks_for_a_new_one(lm, tmp_path, capsys):
    from orchestrator.report.folder_claims import record_sweep
    from orchestrator.schema.config import parse_sweep

    folder = tmp_path / "tabular"
    folder.mkdir()
    record_sweep(folder, parse_sweep({"name": "tab", "tasks": [{"name": "iris"}], "wandb": {"mode": "disabled"}}))
    before = _digests(folder)
    assert cli.main(["lm", "run", str(lm.config), "--out", str(folder), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{folder} holds a tabular sweep (`iclmem run`); give --out a new folder" in err
    assert _digests(folder) == before


def test_lm_resume_of_a_folder_that_is_not_an_lm_run_exits_2_and_writes_nothing(tmp_path, capsys):
    folder = _users_folder(tmp_path / "mine")
    before = _digests(folder)
    assert cli.main(["lm", "resume", str(folder), "--quiet"]) == 2
    assert "not an iclmem LM run folder" in capsys.readouterr().err
    assert _digests(folder) == before
    assert cli.main(["lm", "resume", str(tmp_path / "nowhere"), "--quiet"]) == 2
    assert not (tmp_path / "nowhere").exists()


def test_ctrl_c_before_the_run_folder_is_written_leaves_no_folder_and_says_to_start_again(lm, tmp_path, monkeypatch):
    run = tmp_path / "run"

    def interrupted(cfg, run_dir):  # Ctrl-C while the inputs load (the built-in assets half built)
        (run_dir / "lm_assets" / ".synthetic.tmp").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(lm_sweep, "resolve_inputs", interrupted)
    with pytest.raises(SweepInterrupted) as caught:
        lm_sweep.run_lm_sweep(lm.config, run, log=lambda _line: None)
    assert str(caught.value) == (f"interrupted before the run folder was written \u2014 start again with "
                                 f"`iclmem lm run {lm.config} --out {run.resolve()}`")
    assert caught.value.exit_code == 130
    assert not run.exists()


# ------------------------------------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def complete_run(lm, ray_session, tmp_path_factory):
    run = tmp_path_factory.mktemp("lm_complete") / "run"
    results = lm_sweep.run_lm_sweep(lm.config, run, log=lambda _line: None, verbose=False)
    return SimpleNamespace(dir=run, results=results)


@pytest.mark.slow  # a real LM sweep (`make test-fast` leaves it out)
@pytest.mark.ray
def test_a_finished_lm_run_records_complete_and_keeps_the_console_log(complete_run):
    run = complete_run.dir
    state = read_run_state(run)
    assert state is not None
    assert state["status"] == RunStatus.COMPLETE
    assert state["note"] == ""
    assert (run / CONSOLE_LOG_FILE).is_file()  # quiet console: Ray's output went here
    assert len(_stored_units(run)) == 1
    assert not complete_run.results.empty
    assert (run / LM_RESULTS_FILE).is_file()


@pytest.mark.ray
def test_lm_run_of_the_same_config_continues_the_folder_computing_nothing_again(lm, complete_run, capsys):
    run = complete_run.dir
    before = _stored_units(run)
    table = (run / LM_RESULTS_FILE).stat().st_mtime_ns
    assert cli.main(["lm", "run", str(lm.config), "--out", str(run), "--quiet"]) == 0
    assert f"language-model probes: {len(complete_run.results)} result rows" in capsys.readouterr().out
    assert _stored_units(run) == before
    assert (run / LM_RESULTS_FILE).stat().st_mtime_ns != table  # the table was made again, from the stored unit
    state = read_run_state(run)
    assert state is not None
    assert state["status"] == RunStatus.COMPLETE


@pytest.mark.slow  # a real LM sweep (`make test-fast` leaves it out)
@pytest.mark.ray
def test_ctrl_c_records_the_interruption_keeps_the_units_and_lm_resume_finishes(
        lm, ray_session, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    real = lm_sweep.run_units

    def units_then_ctrl_c(pool, plan, log):  # Ctrl-C once the units are stored, before the table is made
        real(pool, plan, log)
        raise KeyboardInterrupt

    monkeypatch.setattr(lm_sweep, "run_units", units_then_ctrl_c)
    assert cli.main(["lm", "run", str(lm.config), "--out", str(run), "--quiet"]) == 130
    assert f"interrupted \u2014 continue with `iclmem lm resume {run.resolve()}`" in capsys.readouterr().err
    state = read_run_state(run)
    assert state is not None
    assert state["status"] == RunStatus.INTERRUPTED
    assert "1 unit result(s) kept" in state["note"]
    assert f"iclmem lm resume {run.resolve()}" in state["note"]
    kept = _stored_units(run)
    assert len(kept) == 1
    assert not (run / LM_RESULTS_FILE).exists()
    assert (run / CONSOLE_LOG_FILE).is_file()

    monkeypatch.undo()
    assert cli.main(["lm", "resume", str(run), "--quiet"]) == 0
    assert _stored_units(run) == kept  # the kept unit is not computed again
    state = read_run_state(run)
    assert state is not None
    assert state["status"] == RunStatus.COMPLETE
    assert (run / LM_RESULTS_FILE).is_file()


def test_a_failed_lm_run_records_failed_with_its_error(lm, tmp_path, monkeypatch):
    def no_ray(*args, **kwargs):
        raise RuntimeError("no Ray here")

    monkeypatch.setattr(lm_sweep, "ensure_ray", no_ray)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="no Ray here"):
        lm_sweep.run_lm_sweep(lm.config, run, log=lambda _line: None)
    state = read_run_state(run)
    assert state is not None
    assert state["status"] == RunStatus.FAILED
    assert state["note"] == "RuntimeError: no Ray here"
    assert (run / RUN_STATE_FILE).is_file()


def test_an_lm_pool_the_local_ray_can_never_start_is_refused_naming_the_setting_and_the_bound():
    """#62: ``probe_actors: 100000`` hung ``iclmem lm run`` (the pool creates every actor at start and waits for
    them); on a Ray started here the pool must fit the machine, or the run is refused before any unit."""
    from orchestrator.driver.lm_sweep import pool_beyond_local_ray
    from orchestrator.schema.lm_config import ProbeActorsConfig

    two_cpus = {"CPU": 2.0, "memory": 1e9}
    assert pool_beyond_local_ray(ProbeActorsConfig(probe_actors=2, cpus_per_probe_actor=1), two_cpus) == []
    assert pool_beyond_local_ray(ProbeActorsConfig(probe_actors=4, cpus_per_probe_actor=0.5), two_cpus) == []
    (problem,) = pool_beyond_local_ray(ProbeActorsConfig(probe_actors=100000, cpus_per_probe_actor=1), two_cpus)
    assert problem.startswith("resources.probe_actors: 100000 actors x 1 CPU")
    assert "lower probe_actors to 2 or less" in problem
    (problem,) = pool_beyond_local_ray(ProbeActorsConfig(probe_actors=1, gpus_per_probe_actor=1), two_cpus)
    assert problem == "resources.gpus_per_probe_actor: 1 GPU asked, the local Ray has 0"
