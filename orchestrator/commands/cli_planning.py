"""``iclmem estimate`` and ``cluster-check``: the commands that plan a sweep before it is launched: its cost on
N workers (``orchestrator.estimate.estimate``), and whether the deployment file it will run with (a ``ray up``
cluster.yaml, a KubeRay manifest, a Slurm script, a Dockerfile) passes its offline checks."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from iclmem.errors import ConfigError

_ESTIMATE_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")  # what trainables.models.base.resolve_device takes


def cmd_estimate(args: argparse.Namespace) -> int:
    from orchestrator.estimate.estimate import estimate
    from orchestrator.estimate.estimate_render import render
    from orchestrator.runfolder.timing import comparison_lines, read_timings, save_prediction
    from orchestrator.schema.sweep_files import load_sweep

    if args.device is not None and not _ESTIMATE_DEVICE.fullmatch(args.device):
        raise ConfigError(f"--device {args.device!r}: one of auto, cpu, cuda or cuda:N (a GPU's index)")
    timings = None
    if args.compare:  # a finished run: its own sweep and worker count, unless the command line names others
        from iclmem.runfolder import SWEEP_FILE

        timings = read_timings(args.compare)  # before any measuring: a folder without timings fails at once
        config = args.config or str(Path(args.compare) / SWEEP_FILE)
        workers = args.workers or timings.workers
    elif not args.config:
        raise ConfigError("iclmem estimate needs a sweep file (or --compare RUN_DIR)")
    else:
        config, workers = args.config, args.workers or 1
    est = estimate(config, workers, device=args.device, task=args.task, epochs=args.epochs,
                   threads=args.threads, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(render(est, markdown=args.markdown))
    prediction = est.prediction(load_sweep(config).config_hash())
    if timings is None:
        saved = save_prediction(prediction)  # `iclmem run` of this sweep prints its times beside it
        if saved is not None:
            print(f"(kept as {saved}: `iclmem run` of this sweep compares its measured times with it)")
    else:
        print()
        print(f"Beside the run {args.compare} ({timings.trials} trials, {timings.checkpoints} checkpoint results, "
              f"{timings.workers} workers, recorded {timings.recorded_at}):")
        print("\n".join(comparison_lines(prediction, timings)))
    return 0


def cmd_cluster_check(args: argparse.Namespace) -> int:
    from orchestrator.cluster.cluster import check_cluster_file, is_dockerfile

    if is_dockerfile(args.cluster_yaml):  # Dockerfile, Containerfile, Dockerfile.gpu, gpu.Dockerfile, ...
        return _report_check(args, _check_image(args), "base image pinned, pins equal to pyproject.toml's, no "
                             "secret, non-root user")
    if Path(args.cluster_yaml).suffix in (".sbatch", ".slurm"):
        from orchestrator.cluster.slurm import check_sbatch

        checked = "directives, Ray launch, iclmem on the head, clean stop, secrets, shared storage"
        return _report_check(args, check_sbatch(args.cluster_yaml, args.sweep),
                             checked + (f"; resources of {', '.join(args.sweep)}" if args.sweep else ""))
    if _is_kuberay(Path(args.cluster_yaml)):
        from orchestrator.cluster.kuberay import check_manifest

        checked = "KubeRay schema, entrypoint, images, secrets, shared storage"
        return _report_check(args, check_manifest(args.cluster_yaml, args.sweep),
                             checked + (f"; resources of {', '.join(args.sweep)}" if args.sweep else ""))
    result = check_cluster_file(args.cluster_yaml, args.sweep)  # a sweep that does not load: ConfigError, exit 2
    checked = "Ray's validation, shared storage, secrets"
    if args.sweep:
        checked += f"; storage, secrets and resources of {', '.join(args.sweep)}"
    return _report_check(args, result, checked)


def _check_image(args: argparse.Namespace) -> Any:
    from orchestrator.cluster.image import check_dockerfile

    if args.sweep:
        raise ConfigError("--sweep checks a sweep against a cluster's node types; an image has none (give it with "
                          "cluster.yaml or a k8s manifest)")
    return check_dockerfile(args.cluster_yaml)


def _is_kuberay(path: Path) -> bool:
    """A KubeRay manifest (``apiVersion: ray.io/...``) rather than a ``ray up`` cluster file."""
    try:
        return bool(re.search(r"^apiVersion:\s*ray\.io/", path.read_text(), flags=re.M))
    except (OSError, UnicodeDecodeError):
        return False


def _report_check(args: argparse.Namespace, result: Any, checked: str) -> int:
    """A cluster-check's notes, then its problems (exit 2, bad input, like every other command's refusal; see
    the exit codes in `iclmem --help`) or that the file is valid and what was checked."""
    for note in result.notes:
        print(f"note: {note}")
    if result.problems:
        print(f"{args.cluster_yaml}: {len(result.problems)} problem(s):", file=sys.stderr)
        for p in result.problems:
            print(f"  - {p}", file=sys.stderr)
        return 2
    print(f"{args.cluster_yaml}: valid ({checked})")
    return 0
