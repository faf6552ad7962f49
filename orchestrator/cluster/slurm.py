"""Offline checks of a Slurm batch script for iclmem (``iclmem cluster-check slurm/iclmem.sbatch [--sweep]``).

From the file alone (no Slurm needed), what a Slurm launch gets wrong:

* the ``#SBATCH`` directives: one task per node (one Ray node per machine), a node count, a time limit, and a
  signal before the time limit that reaches the batch shell (``--signal=B:TERM@<s>``), so the sweep stops
  cleanly and resumably instead of being killed;
* Ray started across the nodes the way Ray documents it (``ray symmetric-run``) or the head / worker form
  (``ray start --head`` and ``ray start --address``), and ``iclmem run`` or ``resume`` with ``--address auto``;
* a ``trap`` on TERM that stops the driver (iclmem treats SIGTERM as Ctrl-C) and Ray;
* no literal credential, and no ``export WANDB_API_KEY`` (every ``srun`` step would inherit it);
* with ``--sweep``: a trial and a probe actor fit one node's ``--cpus-per-task`` / GPUs.

Every problem names the file and the line (or directive).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from orchestrator.cluster.cluster import sweeps_fit
from orchestrator.cluster.deploy_checks import ClusterCheck, comment_secret_problems, literal_secret
from orchestrator.schema.sweep_files import load_sweep

_DIRECTIVE = re.compile(r"^#SBATCH\s+(--?[A-Za-z-]+)(?:[=\s]+(\S+))?")
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$")


def _directives(lines: list[str]) -> dict[str, tuple[str, int]]:
    """``#SBATCH`` options before the first command (Slurm stops reading them there): name -> (value, line)."""
    out: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        match = _DIRECTIVE.match(stripped)
        if match:
            out[match.group(1).lstrip("-")] = (match.group(2) or "", number)
    return out


def _count(value: str) -> float:
    """A GPU count from ``--gpus-per-task`` (``2``, ``a100:2``) or ``--gres`` (``gpu:2``, ``gpu:a100:2``)."""
    tail = value.split(",")[0].rsplit(":", 1)[-1]
    return float(tail) if tail.isdigit() else 0.0


def check_sbatch(path: str | Path, sweeps: Sequence[str | Path] = ()) -> ClusterCheck:
    """The checks above on ``path``; resources against each sweep of ``sweeps``."""
    path = Path(path)
    where = str(path)
    result = ClusterCheck(where)
    loaded = [(str(p), load_sweep(p)) for p in sweeps]
    if not path.is_file():
        result.problems.append(f"{where}: {'file not found' if not path.exists() else 'not a file'}")
        return result
    lines = path.read_text().splitlines()
    code = [(n, line) for n, line in enumerate(lines, start=1) if line.strip() and not line.lstrip().startswith("#")]
    body = "\n".join(line for _, line in code)
    if not lines or not lines[0].startswith("#!"):
        result.problems.append(f"{where}:1: no #! line: sbatch needs the script's shell (#!/bin/bash)")
    sbatch = _directives(lines)
    if not sbatch:
        result.problems.append(f"{where}: no #SBATCH directive before the first command")
    for name, why in (("nodes", "how many machines Ray spans"), ("time", "Slurm's time limit")):
        if name not in sbatch:
            result.problems.append(f"{where}: #SBATCH --{name}: missing ({why})")
    tasks = sbatch.get("ntasks-per-node")
    if tasks is None or tasks[0] != "1":
        at = f"{where}:{tasks[1]}" if tasks else where
        result.problems.append(f"{at}: #SBATCH --ntasks-per-node: must be 1 (one Ray node per machine; Ray splits a "
                               "node's CPUs and GPUs among trials itself)")
    if "time" in sbatch and not _TIME.match(sbatch["time"][0]):
        result.problems.append(f"{where}:{sbatch['time'][1]}: #SBATCH --time={sbatch['time'][0]}: not a Slurm time "
                               "(minutes, H:MM:SS or D-HH:MM:SS)")
    signal = sbatch.get("signal")
    if signal is None or not re.match(r"^B:(TERM|INT|USR1)@\d+$", signal[0]):
        result.problems.append(f"{where}: #SBATCH --signal: set B:TERM@<seconds> so the batch shell hears the "
                               "time limit coming and stops the sweep resumably (without it Slurm kills it)")
    symmetric = "ray symmetric-run" in body
    head_worker = re.search(r"ray start[^\n]*--head", body) and re.search(r"ray start[^\n]*--address", body)
    if not symmetric and not head_worker:
        result.problems.append(f"{where}: starts no Ray cluster: use `srun ... ray symmetric-run --address HEAD:PORT "
                               "-- ...` or `ray start --head` on the first node and `ray start --address` on the others")
    runs = [(n, line) for n, line in code if re.search(r"\biclmem (run|resume)\b", line)]
    if not runs:
        result.problems.append(f"{where}: runs no `iclmem run` or `iclmem resume`")
    for number, line in runs:
        if "--address auto" not in line:
            result.problems.append(f"{where}:{number}: `iclmem` without `--address auto`: it would start its own "
                                   "one-node Ray instead of joining the allocation's cluster")
    if not re.search(r"^\s*trap\b[^\n]*\bTERM\b", body, flags=re.M):
        result.problems.append(f"{where}: no `trap ... TERM`: on scancel or the time limit the batch shell would "
                               "die without stopping the driver cleanly and Ray on every node")
    for number, line in code:
        if re.search(r"\bexport\s+WANDB_API_KEY\b", line):
            result.problems.append(f"{where}:{number}: exports WANDB_API_KEY: every srun step (every Ray node) would "
                                   "inherit it; read it from a 0600 file in the driver's command only")
        found = literal_secret(line)
        if found:
            result.problems.append(f"{where}:{number}: holds {found}")
    result.problems += comment_secret_problems("\n".join(lines), where, whole_line_only=True)
    if not re.search(r"\bICLMEM_STORAGE\b", body):
        result.problems.append(f"{where}: sets no ICLMEM_STORAGE: Tune's checkpoints must be on the shared file "
                               "system every node reaches")
    cpus = sbatch.get("cpus-per-task", ("1", 0))[0]
    gpus = _count(sbatch["gpus-per-task"][0]) if "gpus-per-task" in sbatch else (
        _count(sbatch["gres"][0]) if "gres" in sbatch else 0.0)
    nodes = int(sbatch["nodes"][0].split("-")[-1]) if "nodes" in sbatch and sbatch["nodes"][0][:1].isdigit() else 1
    resources = {"CPU": float(cpus) if cpus.replace(".", "", 1).isdigit() else 1.0}
    if gpus:
        resources["GPU"] = gpus
    prepared = {"provider": {"type": "slurm"}, "head_node_type": "node", "max_workers": nodes - 1,
                "available_node_types": {"node": {"resources": resources, "max_workers": nodes - 1}}}
    sweeps_fit(result, prepared, where, loaded)
    return result
