"""The documentation stays whole and inside the repository.

* docs/CONFIG.md lists every key the sweep schemas accept (walked from the pydantic models), and only those;
* docs/RUN_FOLDER.md names every file and folder of ``iclmem/runfolder.py``;
* README.md and docs/*.md link nothing outside the repository, and every relative link resolves.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
LM_HEADING = "## LM sweep"


def _sub_models(annotation: typing.Any) -> list[tuple[type[BaseModel], bool]]:
    """The pydantic models inside a field's type, each with whether it sits in a list (``key[].sub``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, False)]
    in_list = typing.get_origin(annotation) in (list, tuple)
    return [(m, in_list or nested) for arg in typing.get_args(annotation) for m, nested in _sub_models(arg)]


def config_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every key path the schema accepts: ``grid.lr``, ``tasks[].name``, ``datasets[].thresholds[].metric``."""
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        for sub, in_list in _sub_models(field.annotation):
            keys += config_keys(sub, f"{prefix}{name}{'[]' if in_list else ''}.")
    return keys


def _config_doc() -> tuple[str, str]:
    text = (REPO / "docs" / "CONFIG.md").read_text()
    assert LM_HEADING in text
    tabular, lm = text.split(LM_HEADING, 1)
    return tabular, lm


def _documented_keys(section: str) -> set[str]:
    """The keys a section's tables list: the first cell of each row, in backticks."""
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))


def test_every_config_key_is_documented_and_every_documented_key_exists():
    from orchestrator.schema.config import SweepConfig
    from orchestrator.schema.lm_config import LMSweepConfig

    for model, section in zip((SweepConfig, LMSweepConfig), _config_doc()):
        schema = set(config_keys(model))
        documented = _documented_keys(section)
        assert len(schema) > 20  # the walk reached the nested blocks
        assert not schema - documented, f"{model.__name__}: keys missing from docs/CONFIG.md: {sorted(schema - documented)}"
        assert not documented - schema, f"docs/CONFIG.md lists keys {model.__name__} does not accept: " \
                                        f"{sorted(documented - schema)}"


def test_the_key_walk_sees_nested_and_listed_blocks():
    from orchestrator.schema.config import SweepConfig
    from orchestrator.schema.lm_config import LMSweepConfig

    tabular, lm = set(config_keys(SweepConfig)), set(config_keys(LMSweepConfig))
    assert {"tasks[].carte", "grid.lr", "outcome.rule", "resources.probe_actors", "wandb.mode"} <= tabular
    assert {"datasets[].thresholds[].metric", "ner.shots", "models[].builtin"} <= lm


def run_folder_names() -> dict[str, str]:
    """Every file and folder name ``iclmem/runfolder.py`` defines (module constants named *_FILE / *_DIR)."""
    import iclmem.runfolder as rf

    return {k: v for k, v in vars(rf).items() if re.fullmatch(r"[A-Z_]+_(FILE|DIR)", k) and isinstance(v, str)}


def test_every_run_folder_name_is_documented():
    names = run_folder_names()
    assert {"RESULTS_FILE", "SWEEP_FILE", "PROVENANCE_FILE", "TUNE_DIR", "LM_UNITS_DIR"} <= set(names)
    text = (REPO / "docs" / "RUN_FOLDER.md").read_text()
    table_names = set(re.findall(r"^\| `([^`]+?)/?`", text, flags=re.M)) | set(re.findall(r"`([\w.]+)/?`", text))
    missing = {k: v for k, v in names.items() if v not in table_names}
    assert not missing, f"docs/RUN_FOLDER.md does not describe {missing}"


# -------------------------------------------------------------------------------------------------- links

_FENCE = re.compile(r"^```.*?^```", flags=re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]+`")
_MD_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_AUTOLINK = re.compile(r"<([a-z][a-z0-9+.-]*:[^>\s]+)>", flags=re.I)
_URL = re.compile(r"\bhttps?://[^\s)<>`'\"]+", flags=re.I)  # storage URIs (s3://, gs://) are no links
# Addresses that appear inside commands and config samples and are no link to read: the Ray dashboard on
# this machine (an SSH tunnel), and Google's OAuth scope, an identifier a GCP node config must contain.
_CODE_ADDRESSES = (re.compile(r"^http://(127\.0\.0\.1|localhost)(:\d+)?(/|$)"),
                   re.compile(r"^https://www\.googleapis\.com/auth/cloud-platform$"))


def _prose(text: str) -> str:
    return _CODE_SPAN.sub(" ", _FENCE.sub(" ", text))


def _code(text: str) -> str:
    return " ".join(_FENCE.findall(text) + _CODE_SPAN.findall(_FENCE.sub(" ", text)))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_docs_link_nothing_outside_the_repository(doc):
    text = doc.read_text()
    targets = _MD_LINK.findall(text) + _AUTOLINK.findall(text)
    external = [t for t in targets if re.match(r"^[a-z][a-z0-9+.-]*:", t, flags=re.I)]
    assert not external, f"{doc.name} links outside the repository: {external}"
    bare = _URL.findall(_prose(text))
    assert not bare, f"{doc.name} names web addresses in its text: {bare}"
    in_code = [u for u in _URL.findall(_code(text)) if not any(a.match(u) for a in _CODE_ADDRESSES)]
    assert not in_code, f"{doc.name} has web addresses in its code samples: {in_code}"
    assert "../shared" not in text, f"{doc.name} points outside the repository (../shared)"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_to_a_file_in_the_repository(doc):
    broken = []
    for target in _MD_LINK.findall(_FENCE.sub(" ", doc.read_text())):
        path = target.split("#", 1)[0]
        if not path:  # a link within the page
            continue
        resolved = (doc.parent / path).resolve()
        if not resolved.exists() or REPO not in resolved.parents:
            broken.append(target)
    assert not broken, f"{doc.name}: links that do not resolve to a file in the repository: {broken}"


def test_the_link_checks_catch_what_they_are_for(tmp_path):
    """The patterns above on a page that breaks every rule: each must be caught."""
    page = ("See [the paper](https://example.org/paper), <https://example.org>, http://example.org/x and "
            "[spec](../shared/method/SPEC.md).\n```bash\ncurl https://example.org/data\n"
            "ray dashboard  # http://127.0.0.1:8265\n```\n")
    assert [t for t in _MD_LINK.findall(page) + _AUTOLINK.findall(page) if "://" in t] == \
        ["https://example.org/paper", "https://example.org"]
    assert _URL.findall(_prose(page)) == ["https://example.org/paper", "https://example.org", "http://example.org/x"]
    code = [u for u in _URL.findall(_code(page)) if not any(a.match(u) for a in _CODE_ADDRESSES)]
    assert code == ["https://example.org/data"]
    doc = tmp_path / "PAGE.md"
    doc.write_text(page)
    assert not (doc.parent / "../shared/method/SPEC.md").resolve().exists()


# ------------------------------------------------------------------------------------------- claims that are testable
def test_cluster_md_states_the_exit_status_cluster_check_returns(tmp_path, capsys):
    """docs/CLUSTER.md: a refused file exits 2 (not 1), and the per-node-type min_workers check it describes is
    made: run the real command on a file that breaks it."""
    import yaml

    from orchestrator.cli import main

    text = (REPO / "docs" / "CLUSTER.md").read_text()
    assert "Exit status: 0 valid; 2 refused" in text
    assert "1 problems" not in text
    assert "Each node type's own `min_workers` at most its `max_workers`" in text
    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    config["available_node_types"]["gpu.4x"].update(min_workers=3, max_workers=2)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert main(["cluster-check", str(path)]) == 2
    assert f"{path}: available_node_types.gpu.4x.min_workers: 3 is more than its max_workers 2" in capsys.readouterr().err
    assert main(["cluster-check", str(REPO / "cluster.yaml")]) == 0


def test_base_yaml_says_what_validate_does_without_the_carte_tables(tmp_path, capsys):
    """configs/base.yaml's data note: `iclmem validate` looks for the tables (exit 2, each missing one named);
    `--schema-only` passes without them. A copy in a folder without ../data/carte makes the tables missing."""
    from orchestrator.cli import main

    comment = (REPO / "configs" / "base.yaml").read_text()
    assert "without the folder it exits 2 naming every missing" in comment
    assert "does not look for the files" not in comment
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "base.yaml").write_text(comment)
    assert main(["validate", str(folder / "base.yaml")]) == 2
    assert "task 'beer_ratings': CARTE directory not found" in capsys.readouterr().err
    assert main(["validate", str(folder / "base.yaml"), "--schema-only"]) == 0


def test_the_readme_gives_one_quickstart_time():
    text = (REPO / "README.md").read_text()
    assert "about two minutes on 2 cores: 112 s measured from a clean clone" in text
    assert "a few minutes" not in text.lower()
