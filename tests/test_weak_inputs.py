"""#45, the new-user trial's weak cases: each refused input ends in one line on stderr naming the file, setting,
flag or column at fault, exit 2, no traceback, the user's files byte-identical and nothing left behind (no run or
audit folder claimed) when it is refused before any work. In-process, no Ray started, no training."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from iclmem.runfolder import RESULTS_FILE
from orchestrator.cli import main

BASE = """name: weak
tasks:
  - name: iris
grid: {q: [30]}
data: {context_size: 60}
training: {epochs: 2, checkpoint_epochs: [1, 2]}
wandb: {mode: disabled}
"""
SHIPPED = Path(__file__).resolve().parents[1] / "trainables" / "models" / "weights" / "pfn_mini.safetensors"
LM_QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "lm_quickstart.yaml"


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every folder (None) under ``root``: equal before and after = nothing changed."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def refused(capsys, argv: list[str], *named: str) -> str:
    """``iclmem argv`` exits 2 with one stderr line, no traceback, naming each of ``named``; that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("iclmem: error: "), err
    for name in named:
        assert name in lines[0], (name, err)
    return lines[0]


def _sweep(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ------------------------------------------------------------------------------------------ sweep files
def test_an_unknown_model_option_is_named_by_validate_and_run_before_any_folder(capsys, here):
    sweep = _sweep(here, BASE + "models:\n  - name: pfn-mini\n    options: {nonsense: 1}\n")
    before = _snapshot(here)
    for argv in (["validate", str(sweep)], ["run", str(sweep), "--out", str(here / "run")]):
        line = refused(capsys, argv, "models.0", "pfn-mini", "unknown option 'nonsense'")
        assert "TypeError" not in line
    assert _snapshot(here) == before


def test_a_yaml_nested_thousands_deep_is_one_line_not_a_recursion_error(capsys, here):
    deep = _sweep(here, BASE + "probe: {suite: " + "[" * 5000 + "]" * 5000 + "}\n")
    line = refused(capsys, ["validate", "--schema-only", str(deep)], str(deep), "nested too deeply")
    assert "RecursionError" not in line


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_a_non_finite_weight_decay_is_refused_by_the_schema(capsys, here, value):
    sweep = _sweep(here, BASE.replace("checkpoint_epochs: [1, 2]}", f"checkpoint_epochs: [1, 2], weight_decay: {value}}}"))
    refused(capsys, ["validate", "--schema-only", str(sweep)], "training.weight_decay", "finite")


def test_a_cache_dir_that_is_a_file_is_refused_by_the_schema_and_left_alone(capsys, here):
    blocker = here / "cache"
    blocker.write_bytes(b"not a folder\n")
    sweep = _sweep(here, BASE.replace("context_size: 60}", "context_size: 60, cache_dir: cache}"))
    before = _snapshot(here)
    refused(capsys, ["validate", "--schema-only", str(sweep)], "data.cache_dir", "is a file, not a folder")
    refused(capsys, ["run", str(sweep), "--out", str(here / "run")], "data.cache_dir", str(blocker))
    assert _snapshot(here) == before


@pytest.mark.parametrize("value", ["1e12", "1.0e12", "1000000000000"])
def test_a_bootstrap_of_1e12_is_refused_by_the_schema(capsys, here, value):
    sweep = _sweep(here, BASE + f"probe: {{bootstrap: {value}}}\n")
    refused(capsys, ["validate", "--schema-only", str(sweep)], "probe.bootstrap")


@pytest.mark.parametrize("command", [["probe", str(SHIPPED), "--base-model", "pfn-mini", "--task", "iris"],
                                     ["audit-context", "iris", "--model", "pfn-mini"]])
def test_a_bootstrap_of_1e12_is_refused_on_the_command_line_before_any_folder(capsys, here, command):
    refused(capsys, [*command, "--bootstrap", str(10**12), "--out", str(here / "audit")], "--bootstrap", "at most")
    assert not (here / "audit").exists()


def test_a_garbage_weights_file_is_refused_at_validation_naming_the_file(capsys, here):
    garbage = here / "garbage.pt"
    garbage.write_bytes(b"these are not weights\n")
    sweep = _sweep(here, BASE + f"models:\n  - name: pfn-mini\n    options: {{weights: {garbage}}}\n")
    before = _snapshot(here)
    for argv in (["validate", str(sweep)], ["run", str(sweep), "--out", str(here / "run")]):
        refused(capsys, argv, "models.0", str(garbage), "does not load")
    assert _snapshot(here) == before


def test_an_empty_wandb_project_is_refused_by_the_schema(capsys, here):
    for project in ("''", "'a/b'"):
        sweep = _sweep(here, BASE.replace("{mode: disabled}", f"{{mode: disabled, project: {project}}}"))
        refused(capsys, ["validate", "--schema-only", str(sweep)], "wandb.project")


def test_a_folder_given_as_the_sweep_file_is_named_a_folder(capsys, here):
    (here / "configs").mkdir()
    line = refused(capsys, ["validate", "configs"], "configs", "is a folder")
    assert "not found" not in line
    refused(capsys, ["run", "configs", "--out", str(here / "run")], "is a folder")
    assert not (here / "run").exists()


def test_yaml_merge_keys_merge_as_safe_load_does(capsys, here):
    """``<<: *anchor`` is what PyYAML's safe_load merges; a key of the mapping itself overrides the merged one,
    and a key given twice in one mapping is still refused."""
    import yaml

    from orchestrator.schema.sweep_files import load_sweep

    text = ("name: weak\ntasks:\n  - &iris {name: iris}\n  - {<<: *iris, name: iris2, builtin: iris}\n"
            "grid: {q: [30]}\ndata: {context_size: 60}\n"
            "training:\n  <<: {epochs: 9, checkpoint_epochs: [1, 2]}\n  epochs: 2\nwandb: {mode: disabled}\n")
    sweep = load_sweep(_sweep(here, text))
    assert yaml.safe_load(text)["training"] == {"epochs": 2, "checkpoint_epochs": [1, 2]}
    assert sweep.training.epochs == 2
    assert sweep.training.checkpoint_epochs == [1, 2]
    assert [t.name for t in sweep.tasks] == ["iris", "iris2"]
    twice = _sweep(here, BASE + "outcome: {}\noutcome: {}\n", "twice.yaml")
    refused(capsys, ["validate", "--schema-only", str(twice)], "duplicate key 'outcome'")


def test_an_lm_sweep_file_and_a_tabular_one_are_told_apart_in_one_line(capsys, here):
    tabular = _sweep(here, BASE)
    refused(capsys, ["lm", "validate", str(tabular)], str(tabular), "tabular sweep file", "`iclmem validate")
    refused(capsys, ["lm", "validate", "--schema-only", str(tabular)], "tabular sweep file")
    refused(capsys, ["validate", str(LM_QUICKSTART)], "an LM sweep file", "`iclmem lm validate")


# ------------------------------------------------------------------------------------------ LM device
def test_an_lm_device_of_cuda_without_cuda_is_refused_before_any_work(capsys, here, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = _sweep(here, LM_QUICKSTART.read_text().replace("device: cpu", "device: cuda"), "lm.yaml")
    refused(capsys, ["lm", "validate", str(config)], str(config), "device cuda", "no CUDA")
    refused(capsys, ["lm", "run", str(config), "--out", str(here / "run"), "--quiet"], "device cuda", "no CUDA")
    assert not (here / "run").exists()
    assert main(["lm", "validate", "--schema-only", str(config)]) == 0  # the file alone, for a GPU cluster
    capsys.readouterr()
    typo = _sweep(here, LM_QUICKSTART.read_text().replace("device: cpu", "device: gpu"), "typo.yaml")
    refused(capsys, ["lm", "validate", "--schema-only", str(typo)], "device", "'gpu'")


# ------------------------------------------------------------------------------------------ flags
def test_an_address_that_is_no_address_is_refused_before_any_folder(capsys, here):
    sweep = _sweep(here, BASE)
    refused(capsys, ["run", str(sweep), "--out", str(here / "run"), "--address", "not a host"],
            "--address 'not a host'", "HOST:PORT")
    assert not (here / "run").exists()


def test_address_auto_without_a_cluster_is_refused_before_any_folder(capsys, here, monkeypatch):
    import ray._private.services as services

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: [])  # no Ray on this machine, whatever runs here
    monkeypatch.setattr(services, "find_bootstrap_address", lambda _temp_dir: None)
    sweep = _sweep(here, BASE)
    refused(capsys, ["run", str(sweep), "--out", str(here / "run"), "--address", "auto"], "--address auto",
            "no running Ray cluster")
    assert not (here / "run").exists()


def test_estimate_names_a_device_torch_does_not_know(capsys, here):
    refused(capsys, ["estimate", str(_sweep(here, BASE)), "--device", "tpu"], "--device 'tpu'")


@pytest.mark.parametrize("out", ["bad\udcffname", "x" * 300, "/".join(["y" * 200] * 30)],
                         ids=["not-utf8", "over-name-max", "over-path-max"])
@pytest.mark.parametrize("command", ["run", "audit-context"])
def test_an_out_folder_name_the_tools_cannot_take_is_refused_before_any_folder(capsys, here, out, command):
    argv = (["run", str(_sweep(here, BASE))] if command == "run"
            else ["audit-context", "iris", "--model", "pfn-mini"])
    before = _snapshot(here)
    refused(capsys, [*argv, "--out", out], "--out", "UTF-8" if "\udcff" in out else "MAX")
    assert _snapshot(here) == before


# ------------------------------------------------------------------------------------------ run folders
def _run_folder(root: Path) -> Path:
    """A sweep's run folder (the reporting tests' synthetic one), its provenance made that of its sweep.json."""
    from synthetic_run_dir import make_synthetic_run_dir

    from orchestrator.schema.config import read_stored_sweep

    run = make_synthetic_run_dir(root / "run")
    record = json.loads((run / "provenance.json").read_text())
    record["config_hash"] = read_stored_sweep(run).config_hash()
    (run / "provenance.json").write_text(json.dumps(record))
    return run


@pytest.mark.parametrize("name", ["results.parquet", "report.html"])
def test_report_names_a_folder_where_its_file_goes_and_changes_nothing(capsys, here, name):
    run = _run_folder(here)
    (run / name).unlink(missing_ok=True)
    (run / name).mkdir()
    before = _snapshot(run)
    refused(capsys, ["report", str(run), "--force"], f"{run / name} is a folder")
    assert _snapshot(run) == before


def test_resume_names_a_damaged_wandb_trial_ledger_and_changes_nothing(capsys, here):
    run = _run_folder(here)
    (run / "wandb").mkdir()
    (run / "wandb" / "trial_runs.json").write_text("{not json")
    before = _snapshot(run)
    refused(capsys, ["resume", str(run)], str(run / "wandb" / "trial_runs.json"), "damaged")
    assert _snapshot(run) == before


def test_report_does_not_say_it_recomputes_a_damaged_probe_result(capsys, here):
    run = _run_folder(here)
    (run / "probes" / "r1").mkdir(parents=True)
    (run / "probes" / "r1" / "e0003.json").write_text('{"row": ')
    assert main(["report", str(run), "--force"]) == 0
    err = capsys.readouterr().err
    assert "e0003.json" in err
    assert "left out of the report" in err
    assert "recomput" not in err.replace("recomputes nothing", "")


@pytest.mark.parametrize("command", ["run", "resume"])
def test_run_and_resume_end_by_naming_the_runs_that_leaked(capsys, here, monkeypatch, command):
    """The final summary lists the leaked runs (run id, epoch, AUC with its interval, TPR@1%), as the report's
    first section does, not only the report's path."""
    import pandas as pd

    from orchestrator.report.leaked import leaked_lines

    run = _run_folder(here)
    results = pd.read_parquet(run / RESULTS_FILE)
    monkeypatch.setattr("orchestrator.driver.sweep.run_sweep", lambda *_a, **_k: results)
    argv = ["resume", str(run)] if command == "resume" else ["run", str(_sweep(here, BASE)), "--out", str(run)]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    expected = leaked_lines(results)
    assert expected[0].startswith("6 of 32 runs leaked")
    assert len(expected) == 7
    at = out.index(f"[iclmem] {expected[0]}")
    assert out[at:at + len(expected)] == [f"[iclmem] {line}" for line in expected]
    for needle in ("epoch", "AUC", "TPR@1%"):
        assert needle in out[at + 1]


# ------------------------------------------------------------------------------------------ tasks and estimators
def test_a_target_column_with_a_colon_is_a_column_not_a_carte_folder(capsys, here):
    from orchestrator.audits.audit import parse_task

    source = parse_task("data.csv:a:b")
    assert (source.kind, source.path, source.target) == ("table", "data.csv", "a:b")
    assert parse_task("carte_dir:spotify").kind == "carte"
    line = refused(capsys, ["audit-context", "missing.csv:a:b", "--model", "pfn-mini", "--out", str(here / "a")],
                   "missing.csv")
    assert "CARTE" not in line
    assert not (here / "a").exists()


def test_one_member_row_is_named_as_too_few_members_not_as_the_blind_baseline(capsys, here):
    members = here / "members.txt"
    members.write_text("3\n")
    line = refused(capsys, ["probe", str(SHIPPED), "--base-model", "pfn-mini", "--task", "iris", "--members",
                            str(members), "--q", "20", "--context-size", "40", "--out", str(here / "audit")],
                   str(members), "1 member row id", "at least two")
    assert "blind" not in line
    assert not (here / "audit").exists()


ESTIMATORS = '''
import numpy as np
from sklearn.dummy import DummyClassifier


class FitRaises:
    def fit(self, x, y):
        raise RuntimeError("boom in fit")

    def predict_proba(self, x):
        return np.full((len(x), 2), 0.5)


class _Prior(DummyClassifier):
    def __init__(self):
        super().__init__(strategy="prior")


class NanProba(_Prior):
    def predict_proba(self, x):
        return super().predict_proba(x) * np.nan


class NegativeProba(_Prior):
    def predict_proba(self, x):
        p = super().predict_proba(x)
        p[:, 0] = -1.0
        return p


class InfProba(_Prior):
    def predict_proba(self, x):
        p = super().predict_proba(x)
        p[:, 0] = np.inf
        return p
'''


@pytest.fixture
def estimators(here, monkeypatch):
    package = here / "weak_estimators"
    package.mkdir()
    (package / "good.py").write_text(ESTIMATORS)
    (package / "broken.py").write_text("def factory(:\n")
    monkeypatch.syspath_prepend(str(package))
    yield package
    for name in ("good", "broken"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize(("spec", "named"), [
    ("good:FitRaises", ["its fit failed", "boom in fit"]),
    ("good:NanProba", ["predict_proba returned", "NaN"]),
    ("good:NegativeProba", ["predict_proba returned", "negative"]),
    ("good:InfProba", ["predict_proba returned", "infinite"]),
    ("broken:factory", ["broken.py does not parse", "line 1"]),
])
def test_an_estimator_that_fails_is_named_before_any_audit_folder(capsys, here, estimators, spec, named):
    before = _snapshot(estimators)
    refused(capsys, ["audit-context", "iris", "--estimator", spec, "--context-size", "20", "--references", "2",
                     "--out", str(here / "audit")], f"--estimator {spec}", *named)
    assert not (here / "audit").exists()
    assert {k: v for k, v in _snapshot(estimators).items() if "__pycache__" not in k} == before


def test_the_checked_estimator_passes_a_good_one_through():
    """The wrapper that names a failing estimator changes nothing for one that works."""
    from sklearn.dummy import DummyClassifier

    from probes.attacks.scorers import EstimatorScorer

    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    y = np.array([0, 1] * 10)
    out = EstimatorScorer(lambda: DummyClassifier(strategy="prior"), 2, "sklearn.dummy:DummyClassifier")(x, y, x[:5])
    assert np.allclose(np.exp(out), 0.5)



@pytest.fixture
def digits_members(here):
    """A members file of 20 row ids of the built-in digits task, as the black-box probe prepares it."""
    from iclmem.vocab import LabelDesign
    from orchestrator.audits.audit import DEFAULTS
    from trainables.data import PrepSettings, TaskSource, load_or_prepare

    task = load_or_prepare(TaskSource("digits", "builtin"),
                           PrepSettings(context_size=DEFAULTS["context_size"], label_design=LabelDesign.MATCHED.value),
                           "normal", 0, q=20)
    members = here / "members.txt"
    members.write_text("\n".join(str(int(i)) for i in np.asarray(task.row_ids)[np.asarray(task.member_idx)]) + "\n")
    return members


@pytest.mark.parametrize(("flag", "spec", "named"), [
    ("--estimator", "good:FitRaises", ["its fit failed", "boom in fit"]),
    ("--estimator", "good:NanProba", ["predict_proba returned", "NaN"]),
    ("--estimator", "good:NegativeProba", ["predict_proba returned", "negative"]),
    ("--estimator", "good:InfProba", ["predict_proba returned", "infinite"]),
    ("--estimator", "broken:factory", ["broken.py does not parse", "line 1"]),
    ("--base-estimator", "good:NanProba", ["predict_proba returned", "NaN"]),
])
def test_a_black_box_estimator_that_fails_is_named_in_one_line_before_any_probe_folder(capsys, here, estimators,
                                                                                       digits_members, flag, spec,
                                                                                       named):
    """`iclmem probe --estimator`: the same checked wrapper as audit-context's, tried once before the folder."""
    pair = {"--estimator": "sklearn.dummy:DummyClassifier", "--base-estimator": "sklearn.dummy:DummyClassifier",
            flag: spec}
    before = {k: v for k, v in _snapshot(here).items() if "__pycache__" not in k}
    refused(capsys, ["probe", "--estimator", pair["--estimator"], "--base-estimator", pair["--base-estimator"],
                     "--task", "digits", "--members", str(digits_members), "--bootstrap", "200",
                     "--out", str(here / "audit")], f"{flag} {spec}", *named)
    assert not (here / "audit").exists()
    assert {k: v for k, v in _snapshot(here).items() if "__pycache__" not in k} == before


def test_a_yaml_alias_bomb_in_a_sweep_is_refused_in_one_short_line(capsys, here):
    """#62: the bomb in ``models.options`` was refused, with a one-line error of 254 MB (the expanded value)."""
    bomb = ["  a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdefg", "bcdefgh"):
        bomb.append(f"  {name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    text = BASE + "models:\n  - name: pfn-mini\n    options:\n" + "\n".join("    " + b for b in bomb) + "\n"
    line = refused(capsys, ["validate", "--schema-only", str(_sweep(here, text))], "sweep.yaml", "alias bomb")
    assert len(line) < 400


def test_a_dp_target_epsilon_too_large_to_calibrate_is_refused_at_validation(capsys, here):
    """#62: ``grid.dp: [1e308]`` hung after Stage I (Opacus's noise search never ends there); 1e6 still calibrates."""
    sweep = _sweep(here, BASE.replace("grid: {q: [30]}", "grid: {q: [30], dp: [1e308]}"))
    refused(capsys, ["validate", "--schema-only", str(sweep)], "grid.dp", "above 1e+06")
    from orchestrator.schema.sweep_files import load_sweep

    assert load_sweep(_sweep(here, BASE.replace("grid: {q: [30]}", "grid: {q: [30], dp: [1000000.0]}"),
                             "ok.yaml")).grid.dp == [1e6]
