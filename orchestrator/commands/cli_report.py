"""``iclmem report``: a sweep folder's tables, report and W&B summary rebuilt from its stored results, in a
folder no driver holds, refused where the results were made with another config (unless ``--force``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iclmem.errors import ConfigError
from orchestrator.commands.cli_folders import check_outputs

if TYPE_CHECKING:
    from orchestrator.schema.config import SweepConfig


def cmd_report(args: argparse.Namespace) -> int:
    from iclmem.runfolder import folder_kind, unwritable
    from iclmem.runlock import hold_run_folder, refuse_if_held
    from orchestrator.runfolder.run_folder import RunFolder

    run_dir = Path(args.run_dir)
    refuse_if_held(run_dir)  # a folder a driver works in is refused as such, before anything is read
    if folder_kind(run_dir) != "tabular":  # never write tables and a report into someone else's folder
        raise ConfigError(f"{run_dir} is not an iclmem sweep folder (it holds no sweep.json); `iclmem report` "
                          "rebuilds the results of a folder `iclmem run` wrote")
    folder = RunFolder(run_dir)
    sweep = folder.sweep  # a damaged sweep.json is named before anything is rewritten
    folder.split_report()  # ... and a damaged split report (Stage I's, which report reads and never rewrites)
    problem = unwritable(run_dir)
    if problem:
        raise ConfigError(f"{run_dir}: {problem}; `iclmem report` rewrites the tables and the report there")
    check_outputs(run_dir, "iclmem report")
    with hold_run_folder(run_dir, "iclmem report"):  # no driver starts in the folder while its tables are rebuilt
        return _report(args, run_dir, sweep)


def _report(args: argparse.Namespace, run_dir: Path, sweep: SweepConfig) -> int:
    from orchestrator.report.aggregate import aggregate
    from orchestrator.report.folder_claims import results_config_mismatch

    # the report shows sweep.json's rule and thresholds: over results made with another config they would lie
    mismatch = results_config_mismatch(run_dir, sweep)
    if mismatch is not None and not args.force:
        raise ConfigError(f"{mismatch} The report would show its rule and thresholds over verdicts made with "
                          "others. Restore the edited or deleted file from a copy, or run `iclmem report --force` "
                          "to report anyway (the report is then marked as forced); nothing was changed")
    if mismatch is not None:
        print(f"iclmem: warning: reporting anyway (--force), the report marked as forced: {mismatch}",
              file=sys.stderr, flush=True)
    publish = [flag for flag, on in (("--wandb-report", args.wandb_report),
                                     ("--wandb-workspace", args.wandb_workspace)) if on]
    entity = sweep.wandb.entity or os.environ.get("WANDB_ENTITY")
    if publish:  # checked before the tables are rebuilt
        from orchestrator.report.wandb_logger import resolve_wandb_mode

        if resolve_wandb_mode(args.wandb or "online") != "online":
            raise ConfigError(f"{publish[0]} publishes to W&B: pass --wandb online and export WANDB_API_KEY")
        if not entity:
            raise ConfigError(f"{publish[0]} needs a W&B entity: set wandb.entity in the sweep or WANDB_ENTITY")
    # the report reads what is stored and recomputes nothing: a damaged probe result is left out, said so
    with _reworded_warnings(_REPORT_REWORDING.format(run_dir=run_dir)):
        results = aggregate(run_dir, wandb_mode=args.wandb, replace_fewer=args.force, forced=mismatch)
    if args.wandb_report:
        from orchestrator.report.wandb_summary import build_wandb_report

        report = build_wandb_report(str(entity), sweep.wandb.project, sweep.name, results, run_dir=run_dir,
                                    publish=True)
        print(f"[iclmem] W&B report: {getattr(report, 'url', '')}")
    if args.wandb_workspace:
        from orchestrator.report.wandb_summary import build_wandb_workspace

        workspace = build_wandb_workspace(str(entity), sweep.wandb.project, sweep.name, publish=True)
        print(f"[iclmem] W&B workspace: {getattr(workspace, 'url', '')}")
    return 0


_REPORT_REWORDING = ("left out of the report (`iclmem report` recomputes nothing; `iclmem resume {run_dir}` "
                     "probes it again)")
_RECOMPUTE_WORDS = re.compile(r"(; recomputing it|; it will be recomputed)$")


@contextlib.contextmanager
def _reworded_warnings(instead: str) -> Iterator[None]:
    """Warnings that promise a recomputation (a damaged stored result) said as what a reader does with them."""
    import warnings

    previous = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        text = _RECOMPUTE_WORDS.sub(f"; {instead}", str(message))
        previous(category(text) if isinstance(message, Warning) else text, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous
