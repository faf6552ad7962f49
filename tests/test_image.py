"""The container image definition, checked statically (`iclmem cluster-check Dockerfile`): the shipped
Dockerfile passes, and a copy broken in each way a cluster image goes wrong is refused naming the line."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.cluster.image import check_dockerfile, pyproject_pins

REPO = Path(__file__).resolve().parents[1]


def test_the_shipped_dockerfile_passes_and_pins_what_pyproject_pins():
    result = check_dockerfile(REPO / "Dockerfile")
    assert result.problems == []
    text = (REPO / "Dockerfile").read_text()
    pins = pyproject_pins(REPO / "pyproject.toml", {"tabicl", "tabpfn"})
    assert {"torch", "ray", "opacus", "tabicl", "tabpfn"} <= set(pins)
    for name, version in pins.items():
        assert re.search(rf"{name}(\[[^\]]*\])?=={re.escape(version)}", text), name


def _broken(tmp_path: Path, old: str, new: str) -> Path:
    folder = tmp_path / "ctx"
    folder.mkdir()
    shutil.copy(REPO / "pyproject.toml", folder / "pyproject.toml")
    text = (REPO / "Dockerfile").read_text()
    assert old in text, old
    (folder / "Dockerfile").write_text(text.replace(old, new, 1))
    return folder / "Dockerfile"


@pytest.mark.parametrize(("old", "new", "message"), [
    ("ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm", "ARG PYTHON_IMAGE=python:latest", r":\d+: base image 'python:latest' is 'latest'"),
    ("ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm", "ARG PYTHON_IMAGE=python:3.11", r"tag '3.11' moves with every release"),
    ("ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm", "ARG PYTHON_IMAGE=python", r"has no tag \(Docker takes 'latest'\)"),
    ("torch==2.13.0", "torch", r"pyproject.toml pins torch==2.13.0; the file installs it unpinned"),
    ("torch==2.13.0", "torch==2.12.0", r":\d+: pins torch==2.12.0, pyproject.toml pins 2.13.0"),
    ("ray[tune,default]==2.60.0", "ray[tune,default]==2.59.0", r"pins ray==2.59.0, pyproject.toml pins 2.60.0"),
    ("USER iclmem", "USER root", r"runs as root \(USER root\)"),
    ("    WANDB_MODE=offline", "    WANDB_MODE=offline WANDB_API_KEY=0123456789abcdef", r":\d+: ENV WANDB_API_KEY bakes a credential"),
    ("COPY configs ./configs", "COPY configs ./configs\nCOPY .netrc /home/iclmem/.netrc", r":\d+: COPY copies a credential file"),
    ("USER iclmem", "RUN wandb login 0123456789abcdef0123456789abcdef01234567\nUSER iclmem",
     r":\d+: RUN holds a W&B key given to `wandb login`"),
    ("ARG TORCH_VARIANT=cpu", "ARG TORCH_VARIANT=cpu\nARG WANDB_API_KEY",
     r":\d+: ARG WANDB_API_KEY passes a credential into the build, and the image's history keeps it"),
    ("ARG TORCH_VARIANT=cpu", "ARG TORCH_VARIANT=cpu\nARG WANDB_API_KEY=0123456789abcdef",
     r":\d+: ARG WANDB_API_KEY passes a credential into the build"),
    ("ARG TORCH_VARIANT=cpu", "ARG TORCH_VARIANT=cpu\n# AWS_ACCESS_KEY_ID=AKIAABCDEFGHIJKLMNOP",
     r":\d+: a comment holds an AWS access key id"),
    # #62: what a hostile tester added, one line each
    ("USER iclmem", "RUN huggingface-cli login --token hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567\nUSER iclmem",
     r":\d+: RUN holds a Hugging Face token"),
    ("USER iclmem", "RUN printf 'machine api.wandb.ai login user password 0123456789abcdef0123456789abcdef01234567' "
     "> /home/iclmem/.netrc\nUSER iclmem", r":\d+: RUN holds a .netrc password"),
    ("USER iclmem", "LABEL org.example.wandb_api_key=0123456789abcdef0123456789abcdef01234567\nUSER iclmem",
     r":\d+: LABEL holds a "),
    ("USER iclmem", "RUN pip install --index-url https://alice:s3cretpassw0rd@pypi.example.org/simple wandb\nUSER iclmem",
     r":\d+: RUN holds a password in a URL"),
    ("COPY configs ./configs", "COPY configs ./configs\nCOPY id_rsa /home/iclmem/.ssh/id_rsa",
     r":\d+: COPY copies a credential file into the image"),
])
def test_a_broken_image_is_refused_naming_the_line_and_the_fault(tmp_path, old, new, message):
    result = check_dockerfile(_broken(tmp_path, old, new))
    assert any(re.search(message, p) for p in result.problems), result.problems


def test_cluster_check_on_a_dockerfile_exits_2_with_the_problems_and_0_when_valid(tmp_path, capsys):
    assert main(["cluster-check", str(REPO / "Dockerfile")]) == 0
    assert "valid (base image pinned" in capsys.readouterr().out
    broken = _broken(tmp_path, "USER iclmem", "USER 0")
    assert main(["cluster-check", str(broken)]) == 2
    assert "runs as root (USER 0)" in capsys.readouterr().err


def test_the_build_context_leaves_out_run_folders_wandb_files_and_credentials():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {"runs", "wandb", ".netrc", ".git"} <= ignored


def test_without_pyproject_the_pins_are_not_compared_and_the_file_is_not_called_valid(tmp_path, capsys):
    """A Dockerfile with no pyproject.toml beside or above it: the pins cannot be compared with the driver's,
    so the check says so and refuses (exit 2) instead of reporting "pins equal"."""
    alone = tmp_path / "Dockerfile"
    shutil.copy(REPO / "Dockerfile", alone)
    (problem,) = check_dockerfile(alone).problems
    assert problem.startswith(f"{alone}: pip install pins: not compared: no pyproject.toml")
    assert "torch==2.13.0" in problem  # what could not be compared
    assert main(["cluster-check", str(alone)]) == 2
    captured = capsys.readouterr()
    assert "valid" not in captured.out
    assert "not compared" in captured.err


def test_a_dockerfile_in_a_subfolder_is_compared_with_the_checkouts_pyproject(tmp_path):
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "docker").mkdir()
    text = (REPO / "Dockerfile").read_text().replace("torch==2.13.0", "torch==2.12.0", 1)
    (tmp_path / "docker" / "gpu.Dockerfile").write_text(text)
    result = check_dockerfile(tmp_path / "docker" / "gpu.Dockerfile")
    assert any("pins torch==2.12.0, pyproject.toml pins 2.13.0" in p for p in result.problems), result.problems
    assert any("the nearest pyproject.toml above it" in n for n in result.notes)


@pytest.mark.parametrize("name", ["gpu.Dockerfile", "gpu.dockerfile", "Dockerfile.gpu", "app.Containerfile"])
def test_a_valid_dockerfile_by_another_name_ends_with_the_images_valid_line_not_rays(tmp_path, capsys, name):
    """`iclmem cluster-check gpu.Dockerfile` is dispatched as an image by the name rule the cluster check uses
    (orchestrator.cluster.cluster.is_dockerfile): its last line is the image check's "valid", not Ray's."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / name
    shutil.copy(REPO / "Dockerfile", path)
    before = path.read_bytes()
    assert main(["cluster-check", str(path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == (f"{path}: valid (base image pinned, pins equal to pyproject.toml's, no secret, "
                       "non-root user)")
    assert not any("Ray" in line for line in out)
    assert main(["cluster-check", str(path), "--sweep", "sweep.yaml"]) == 2  # an image has no node types
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("iclmem: error: --sweep checks a sweep against a cluster's node types")
    assert path.read_bytes() == before
