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
