"""The layering rule (tests/layering.py): iclmem < trainables < probes < orchestrator, no import up a layer, no
circle, no private name taken across modules -- on the tree itself, and a planted tree that breaks each rule
once, so the check is seen to fail."""

from __future__ import annotations

from pathlib import Path

from layering import circles, imports, private, problems, upward

REPO = Path(__file__).resolve().parents[1]


def test_the_tree_imports_no_higher_layer_has_no_circle_and_takes_no_private_name_across_modules():
    assert problems(REPO) == []


def _plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_layering_check_names_an_upward_import_a_circle_and_a_private_name_each_at_its_line(tmp_path):
    _plant(tmp_path, {
        "iclmem/__init__.py": "",
        "iclmem/core.py": "def lazily():\n    from probes.score import score  # up two layers, inside a function\n",
        "trainables/__init__.py": "",
        "trainables/a.py": "from trainables import b\n",
        "trainables/b.py": "import os\n\nfrom trainables.c import _helper\n",
        "trainables/c.py": "from trainables.a import thing\n_helper = 1\n",
        "probes/__init__.py": "",
        "probes/score.py": "import iclmem\nfrom trainables.a import thing\n",
        "orchestrator/__init__.py": "from orchestrator import run  # a package importing its submodule\n",
        "orchestrator/run.py": "from probes.score import score\n",
    })
    found = imports(tmp_path)
    assert [(i.source, i.target, i.line) for i in upward(found)] == [("iclmem.core", "probes.score", 2)]
    assert [(i.source, i.name) for i in private(found)] == [("trainables.b", "_helper")]
    assert circles(found) == [["trainables.a", "trainables.b", "trainables.c"]]
    lines = problems(tmp_path)
    assert len(lines) == 3
    assert lines[0].startswith("iclmem/core.py:2: iclmem.core imports probes.score")
    assert lines[1].startswith("trainables/b.py:3:")
    assert "_helper" in lines[1]
    assert "trainables/a.py:1 (trainables.a -> trainables.b)" in lines[2]
    # probes -> iclmem and -> trainables, orchestrator -> probes, a package -> its own submodule: all allowed
    assert not any("probes/score.py" in line or "orchestrator/" in line for line in lines)


def test_the_layer_graph_in_the_interfaces_doc_is_the_one_the_tree_has():
    from layering import mermaid

    doc = (REPO / "docs" / "INTERFACES.md").read_text()
    assert f"```mermaid\n{mermaid(REPO)}\n```" in doc


def test_relative_imports_import_module_private_attributes_and_folder_loops_are_each_named_at_their_line(tmp_path):
    _plant(tmp_path, {
        "iclmem/__init__.py": "",
        "iclmem/core.py": "import importlib\n\nimportlib.import_module('probes.score')  # up, by a literal name\n",
        "iclmem/loader.py": "import importlib\n\n\ndef load(name):\n    return importlib.import_module(name)\n",
        "trainables/__init__.py": "",
        "trainables/a.py": "from .b import _helper  # relative, private\n",
        "trainables/b.py": "_helper = 1\n",
        "probes/__init__.py": "",
        "probes/score.py": "from trainables import b as bee\n\nvalue = bee._helper  # a private attribute\n",
        "orchestrator/__init__.py": "",
        "orchestrator/schema/__init__.py": "",
        "orchestrator/schema/config.py": "from orchestrator.driver import sweep  # a folder above\n",
        "orchestrator/audits/__init__.py": "",
        "orchestrator/audits/audit.py": "from orchestrator.estimate.work import units  # a sibling of its rank\n",
        "orchestrator/estimate/__init__.py": "",
        "orchestrator/estimate/work.py": "from ..schema import config  # relative, down: allowed\nunits = 1\n",
        "orchestrator/driver/__init__.py": "",
        "orchestrator/driver/sweep.py": "from orchestrator.schema.config import thing  # down: allowed\n",
    })
    lines = problems(tmp_path)
    assert any(line.startswith("iclmem/core.py:3: iclmem.core imports probes.score") for line in lines), lines
    assert any(line.startswith("iclmem/loader.py:5:") and "named at run time" in line for line in lines), lines
    assert any(line.startswith("trainables/a.py:1:") and "_helper" in line for line in lines), lines
    assert any(line.startswith("probes/score.py:3:") and "reads the private name _helper" in line for line in lines)
    assert any(line.startswith("orchestrator/schema/config.py:1:") and "not below" in line for line in lines), lines
    assert any(line.startswith("orchestrator/audits/audit.py:1:") and "not below" in line for line in lines), lines
    assert any(line.startswith("loop between the orchestrator's folders: orchestrator.driver, orchestrator.schema")
               for line in lines), lines
    assert not any(line.startswith(("orchestrator/estimate/", "orchestrator/driver/")) for line in lines), lines
    assert any(line.startswith("circle of 2 modules: orchestrator.driver.sweep, orchestrator.schema.config")
               for line in lines), lines
    assert len(lines) == 8, lines


def test_a_tune_state_that_names_the_drivers_old_flat_modules_still_unpickles_after_the_move():
    """Tune pickles callbacks by module and name; a run folder written before the orchestrator's folders names
    orchestrator.tune_callbacks, orchestrator.sweep_timings and orchestrator.sweep (each a pickle reference to a
    class there, as such a state holds it)."""
    import pickle
    import sys

    from orchestrator.driver import sweep, sweep_timings, tune_callbacks

    old = [(b"orchestrator.tune_callbacks", b"ProbeOnCheckpoint", tune_callbacks.ProbeOnCheckpoint),
           (b"orchestrator.sweep_timings", b"TimeTrials", sweep_timings.TimeTrials),
           (b"orchestrator.sweep", b"LogTrialResults", tune_callbacks.LogTrialResults)]
    for module, _name, _cls in old:
        sys.modules.pop(module.decode(), None)
    for module, name, _cls in old:  # without the aliases the old names are gone: the check can fail
        try:
            pickle.loads(b"c" + module + b"\n" + name + b"\n.")
        except ModuleNotFoundError:
            continue
        raise AssertionError(f"{module.decode()} still imports")
    sweep.alias_moved_modules()
    try:
        for module, name, cls in old:
            assert pickle.loads(b"c" + module + b"\n" + name + b"\n.") is cls
    finally:
        for module, _name, _cls in old:
            sys.modules.pop(module.decode(), None)


MAX_MODULE_LINES = 700  # past this a module holds more than one job (#59): split it where its sections part


def test_no_module_of_the_four_packages_is_over_700_lines():
    from layering import module_files

    long = {str(path.relative_to(REPO)): n for path in module_files(REPO).values()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
