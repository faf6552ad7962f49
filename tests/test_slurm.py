"""The Slurm batch script, checked offline (`iclmem cluster-check slurm/iclmem.sbatch --sweep SWEEP`): the shipped
script passes, and a copy broken in each way a Slurm launch goes wrong is refused naming the line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.cluster.slurm import check_sbatch

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "slurm" / "iclmem.sbatch"


@pytest.mark.parametrize("sweep", ["realistic.yaml", "quickstart.yaml"])
def test_the_shipped_script_passes_with_the_shipped_sweeps(sweep):
    assert check_sbatch(SBATCH, [REPO / "configs" / sweep]).problems == []


def _broken(tmp_path: Path, old: str, new: str) -> Path:
    text = SBATCH.read_text()
    assert old in text, old
    path = tmp_path / "iclmem.sbatch"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(("old", "new", "message"), [
    ("#SBATCH --ntasks-per-node=1", "#SBATCH --ntasks-per-node=4", r":\d+: #SBATCH --ntasks-per-node: must be 1"),
    ("#SBATCH --signal=B:TERM@120\n", "", r"#SBATCH --signal: set B:TERM@<seconds>"),
    ("#SBATCH --time=24:00:00\n", "", r"#SBATCH --time: missing"),
    ("trap 'stop_all; exit 143' TERM INT", "", r"no `trap ... TERM`"),
    ("  COMMAND=(iclmem run \"$ICLMEM_SWEEP\" --out \"$ICLMEM_OUT\" --address auto)",
     "  COMMAND=(iclmem run \"$ICLMEM_SWEEP\" --out \"$ICLMEM_OUT\")", r":\d+: `iclmem` without `--address auto`"),
    ("export RAY_USAGE_STATS_ENABLED=0", "export RAY_USAGE_STATS_ENABLED=0\nexport WANDB_API_KEY=\"$(cat ~/.wandb_key)\"",
     r":\d+: exports WANDB_API_KEY: every srun step"),
    ("export RAY_USAGE_STATS_ENABLED=0", "export RAY_USAGE_STATS_ENABLED=0\nWANDB_API_KEY=0123456789abcdef0123",
     r":\d+: holds a literal WANDB_API_KEY"),
    ("export RAY_USAGE_STATS_ENABLED=0", "export RAY_USAGE_STATS_ENABLED=0\nwandb login 0123456789abcdef0123456789abcdef01234567",
     r":\d+: holds a W&B key given to `wandb login`"),
    ("export RAY_USAGE_STATS_ENABLED=0", "# AKIAABCDEFGHIJKLMNOP\nexport RAY_USAGE_STATS_ENABLED=0",
     r":\d+: a comment holds an AWS access key id"),
    (": \"${ICLMEM_STORAGE:=${ICLMEM_OUT%/}/tune}\"\nexport ICLMEM_STORAGE\n", "", r"sets no ICLMEM_STORAGE"),
])
def test_a_broken_script_is_refused_naming_the_line(tmp_path, old, new, message):
    result = check_sbatch(_broken(tmp_path, old, new))
    assert any(re.search(message, p) for p in result.problems), result.problems


def test_a_script_that_starts_no_ray_cluster_is_refused(tmp_path):
    text = re.sub(r"ray (symmetric-run|start)", "echo", SBATCH.read_text())
    path = tmp_path / "iclmem.sbatch"
    path.write_text(text)
    assert any("starts no Ray cluster" in p for p in check_sbatch(path).problems)


def test_a_sweep_asking_more_gpus_than_a_node_has_is_refused_naming_the_setting(tmp_path):
    sweep = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    sweep.setdefault("resources", {})["gpus_per_trial"] = 2
    path = tmp_path / "gpu2.yaml"
    path.write_text(yaml.safe_dump(sweep))
    problems = check_sbatch(SBATCH, [path]).problems
    assert any(re.search(r"gpu2.yaml: resources.gpus_per_trial: a trial needs \{.*GPU 2\}", p) for p in problems)


def test_cluster_check_knows_an_sbatch_script_by_its_suffix(tmp_path, capsys):
    assert main(["cluster-check", str(SBATCH)]) == 0
    assert "valid (directives, Ray launch" in capsys.readouterr().out
    assert main(["cluster-check", str(_broken(tmp_path, "#SBATCH --time=24:00:00\n", ""))]) == 2
    assert "#SBATCH --time: missing" in capsys.readouterr().err
