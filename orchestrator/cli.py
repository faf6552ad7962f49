"""The ``iclmem`` command."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from iclmem.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED, ConfigError, IclmemError, SweepInterrupted
from iclmem.vocab import LabelMode, WandbMode, values

DEFAULT_RUNS = Path("runs")

EPILOG = f"""exit status, the same for every command:
  0    done
  {EXIT_FAILURE}    failed at run time (e.g. checkpoints that could not be probed; the results that were
       made are kept)
  {EXIT_BAD_INPUT}    bad input: a sweep file, table, checkpoint or flag that is refused before any work
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C): `iclmem resume DIR` (or `iclmem lm resume DIR`) continues it;
       a second Ctrl-C exits at once

Run and resume keep Ray's, Tune's and W&B's console messages in RUN_DIR/console.log (--verbose shows them)."""


def _default_run_dir(config: str) -> Path:
    return DEFAULT_RUNS / f"{Path(config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def with_wandb_mode(config: Any, mode: str) -> Any:
    """The sweep (tabular or LM) with ``--wandb MODE`` in place of its ``wandb.mode``, as the enum the schema
    holds (``model_copy`` does not validate: a plain string would serialise with a warning)."""
    return config.model_copy(update={"wandb": config.wandb.model_copy(update={"mode": WandbMode(mode)})})


def _process_started() -> float:
    """When this process started (``time.time()`` seconds): the run's timings count the driver's own start."""
    import psutil

    return float(psutil.Process().create_time())


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.config import load_sweep
    from orchestrator.prepare import check_models
    from orchestrator.sweep import run_sweep

    sweep = load_sweep(args.config)
    if args.wandb:
        sweep = with_wandb_mode(sweep, args.wandb)
    check_models(sweep, args.config)  # an unknown option or a weights file that does not load: before the folder
    check_address(args.address)
    run_dir = Path(args.out) if args.out else _default_run_dir(args.config)
    print(f"[iclmem] sweep {sweep.name!r} ({sweep.config_hash()}) -> {run_dir}", flush=True)
    results = run_sweep(args.config, run_dir, sweep=sweep, address=args.address, progress=not args.quiet,
                        num_cpus=args.num_cpus, verbose=args.verbose, started_at=_process_started())
    print(f"[iclmem] done: {len(results)} checkpoint results; report at {run_dir / 'report.html'}")
    _print_leaked(results)
    return 0


def _print_leaked(results: Any) -> None:
    """The final summary's runs that leaked (run id, epoch, AUC with its interval, TPR@1%), as the report's first
    section lists them; nothing for a sweep with no fine-tuned run (a context-audit-only sweep)."""
    from orchestrator.report.html import leaked_lines
    from orchestrator.report.tables import outcome_summary

    if results is None or len(results) == 0 or outcome_summary(results)[1] == 0:
        return
    for line in leaked_lines(results):
        print(f"[iclmem] {line}")


def cmd_resume(args: argparse.Namespace) -> int:
    from orchestrator.sweep import run_sweep

    check_address(args.address)
    _check_outputs(Path(args.run_dir), "iclmem resume")
    _check_trial_runs(Path(args.run_dir))
    results = run_sweep(None, args.run_dir, address=args.address, resume=True, progress=not args.quiet,
                        num_cpus=args.num_cpus, verbose=args.verbose, started_at=_process_started())
    print(f"[iclmem] resumed: {len(results)} checkpoint results; report at {Path(args.run_dir) / 'report.html'}")
    _print_leaked(results)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    import tempfile

    from orchestrator.config import context_audit_specs, expand_grid, load_sweep
    from orchestrator.context_audit import check_context_audits
    from orchestrator.prepare import prepare_sweep

    sweep = load_sweep(args.config)
    trials = expand_grid(sweep)
    audits = context_audit_specs(sweep)
    if not args.schema_only:  # Stage I as a dry run: every table loads, splits and fits the models
        check_context_audits(sweep, print)
        with tempfile.TemporaryDirectory() as scratch:
            prepared = prepare_sweep(sweep, Path(scratch), log=lambda _m: None, source=args.config)
        print(f"{args.config}: {len(prepared.tasks)} prepared task(s) pass the split checks")
    extra = f" and {len(audits)} deployed-context audits (regime context)" if audits else ""
    print(f"{args.config}: valid; {len(trials)} fine-tuning runs{extra}, config hash {sweep.config_hash()}")
    return 0


def cmd_lm(args: argparse.Namespace) -> int:
    from iclmem.runfolder import LM_REPORT_FILE
    from orchestrator.lm_config import load_lm_sweep
    from orchestrator.lm_sweep import run_lm_sweep

    if args.lm_command == "validate":
        import tempfile

        from orchestrator.lm_sweep import resolve_inputs

        cfg = load_lm_sweep(args.config)
        if not args.schema_only:  # every model directory and dataset loads (the built-in world is built)
            _check_lm_device(cfg, args.config, None, validating=True)
            with tempfile.TemporaryDirectory() as scratch:
                inputs = resolve_inputs(cfg, Path(scratch))
            print(f"{args.config}: {len(inputs.models)} model(s) and {len(inputs.datasets)} dataset(s) load")
        print(f"{args.config}: valid; config hash {cfg.config_hash()}")
        return 0
    quiet = (lambda _line: None) if args.quiet else print
    check_address(args.address)
    if args.lm_command == "resume":
        run_dir = Path(args.run_dir)
        _check_lm_device(None, str(run_dir), args.address, validating=False)
        results = run_lm_sweep(None, run_dir, resume=True, address=args.address, num_cpus=args.num_cpus, log=quiet,
                               verbose=args.verbose)
    else:
        cfg = load_lm_sweep(args.config)
        _check_lm_device(cfg, args.config, args.address, validating=False)
        if args.wandb:
            cfg = with_wandb_mode(cfg, args.wandb)
        run_dir = Path(args.out) if args.out else _default_run_dir(args.config)
        results = run_lm_sweep(args.config, run_dir, config=cfg, address=args.address, num_cpus=args.num_cpus,
                               log=quiet, verbose=args.verbose)
    print(f"[iclmem] language-model probes: {len(results)} result rows; report at {run_dir / LM_REPORT_FILE}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from iclmem.runfolder import folder_kind, unwritable
    from iclmem.runlock import hold_run_folder, refuse_if_held
    from orchestrator.run_folder import RunFolder

    run_dir = Path(args.run_dir)
    refuse_if_held(run_dir)  # a folder a driver works in is refused as such, before anything is read
    if folder_kind(run_dir) != "tabular":  # never write tables and a report into someone else's folder
        raise ConfigError(f"{run_dir} is not an iclmem sweep folder (it holds no sweep.json); `iclmem report` "
                          "rebuilds the results of a folder `iclmem run` wrote")
    sweep = RunFolder(run_dir).sweep  # a damaged sweep.json is named before anything is rewritten
    problem = unwritable(run_dir)
    if problem:
        raise ConfigError(f"{run_dir}: {problem}; `iclmem report` rewrites the tables and the report there")
    _check_outputs(run_dir, "iclmem report")
    with hold_run_folder(run_dir, "iclmem report"):  # no driver starts in the folder while its tables are rebuilt
        return _report(args, run_dir, sweep)


def _report(args: argparse.Namespace, run_dir: Path, sweep: Any) -> int:
    from orchestrator.aggregate import aggregate
    from orchestrator.sweep import results_config_mismatch

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
        from orchestrator.wandb_logger import resolve_wandb_mode

        if resolve_wandb_mode(args.wandb or "online") != "online":
            raise ConfigError(f"{publish[0]} publishes to W&B: pass --wandb online and export WANDB_API_KEY")
        if not entity:
            raise ConfigError(f"{publish[0]} needs a W&B entity: set wandb.entity in the sweep or WANDB_ENTITY")
    # the report reads what is stored and recomputes nothing: a damaged probe result is left out, said so
    with _reworded_warnings(_REPORT_REWORDING.format(run_dir=run_dir)):
        results = aggregate(run_dir, wandb_mode=args.wandb, replace_fewer=args.force, forced=mismatch)
    if args.wandb_report:
        from orchestrator.report.wandb_summary import build_wandb_report

        report = build_wandb_report(entity, sweep.wandb.project, sweep.name, results, run_dir=run_dir,
                                    publish=True)
        print(f"[iclmem] W&B report: {getattr(report, 'url', '')}")
    if args.wandb_workspace:
        from orchestrator.report.wandb_summary import build_wandb_workspace

        workspace = build_wandb_workspace(str(entity), sweep.wandb.project, sweep.name, publish=True)
        print(f"[iclmem] W&B workspace: {getattr(workspace, 'url', '')}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from trainables.models import MODELS
    from trainables.models.base import extra_status
    from trainables.models.checkpoints import DEFAULT_WEIGHTS, is_available

    for name in MODELS.names():
        default = DEFAULT_WEIGHTS.get(name)
        here = "on this machine" if is_available(name) else "NOT on this machine (see README, 'Real models')"
        print(f"{name}\n  package:  {extra_status(name)}\n  default:  weights: {default.weights} -> {default.source}"
              f"\n  weights:  {here}\n  licence:  {default.licence}")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from orchestrator.audit import audit_checkpoint, audit_estimator

    if args.estimator is not None:
        clashes = [flag for flag, value in (("CHECKPOINT", args.checkpoint), ("--base-model", args.base_model),
                                            ("--base-weights", args.base_weights), ("--q", args.q)) if value is not None]
        missing = [flag for flag, value in (("--base-estimator", args.base_estimator), ("--task", args.task),
                                            ("--members", args.members)) if value is None]
        if clashes or missing:
            raise ConfigError("--estimator audits a deployed classifier: it needs --base-estimator, --task and "
                              "--members (the rows its weights were fine-tuned on)"
                              + (f"; missing: {', '.join(missing)}" if missing else "")
                              + (f"; it takes no {', '.join(clashes)}" if clashes else ""))
        row = audit_estimator(args.estimator, args.base_estimator, args.task, members=args.members, out=args.out,
                              label_mode=args.label_mode, seed=args.seed, bootstrap=args.bootstrap,
                              context_size=args.context_size)
    elif args.checkpoint is None or args.base_estimator is not None:
        raise ConfigError("give a CHECKPOINT (an iclmem checkpoint folder or a weights file), or --estimator with "
                          "--base-estimator for a deployed classifier")
    else:
        row = audit_checkpoint(args.checkpoint, args.task, base_model=args.base_model, base_weights=args.base_weights,
                               out=args.out, q=args.q, label_mode=args.label_mode, seed=args.seed,
                               bootstrap=args.bootstrap, members=args.members, context_size=args.context_size)
    keys = ["outcome", "score_kind", "auc", "auc_low", "auc_high", "tpr_at_1pct", "tpr_at_10pct", "loss_ratio",
            "blind_auc", "blind_auc_low", "blind_auc_high", "exchangeable"]
    print(json.dumps({k: row.get(k) for k in keys}, indent=1, default=str))
    return 0


def cmd_audit_context(args: argparse.Namespace) -> int:
    from orchestrator.context_audit import audit_context, summary_lines

    result = audit_context(args.task, out=args.out, model=args.model, estimator=args.estimator,
                           context_size=args.context_size, references=args.references, seed=args.seed,
                           bootstrap=args.bootstrap, null_splits=args.null_splits, wandb=args.wandb,
                           project=args.wandb_project)
    print("\n".join(summary_lines(result)))
    print(f"written to {args.out}")
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from orchestrator.config import load_sweep
    from orchestrator.estimate import estimate, render
    from orchestrator.timing import comparison_lines, read_timings, save_prediction

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
    from orchestrator.cluster import check_cluster_file, is_dockerfile

    if is_dockerfile(args.cluster_yaml):  # Dockerfile, Containerfile, Dockerfile.gpu, gpu.Dockerfile, ...
        return _report_check(args, _check_image(args), "base image pinned, pins equal to pyproject.toml's, no "
                             "secret, non-root user")
    if Path(args.cluster_yaml).suffix in (".sbatch", ".slurm"):
        from orchestrator.slurm import check_sbatch

        checked = "directives, Ray launch, iclmem on the head, clean stop, secrets, shared storage"
        return _report_check(args, check_sbatch(args.cluster_yaml, args.sweep),
                             checked + (f"; resources of {', '.join(args.sweep)}" if args.sweep else ""))
    if _is_kuberay(Path(args.cluster_yaml)):
        from orchestrator.kuberay import check_manifest

        checked = "KubeRay schema, entrypoint, images, secrets, shared storage"
        return _report_check(args, check_manifest(args.cluster_yaml, args.sweep),
                             checked + (f"; resources of {', '.join(args.sweep)}" if args.sweep else ""))
    result = check_cluster_file(args.cluster_yaml, args.sweep)  # a sweep that does not load: ConfigError, exit 2
    checked = "Ray's validation, shared storage, secrets"
    if args.sweep:
        checked += f"; storage, secrets and resources of {', '.join(args.sweep)}"
    return _report_check(args, result, checked)


_ESTIMATE_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")  # what trainables.models.base.resolve_device takes
# ``HOST:PORT`` or ``ray://HOST:PORT`` (a bracketed IPv6 host too), the forms --address takes besides auto / local
_ADDRESS = re.compile(r"(?:ray://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})")
_NO_ADDRESS = "drop --address to start an embedded local Ray"


def check_address(address: str | None) -> None:
    """``--address`` of run, resume and lm run / resume, checked before any work: ``auto`` needs a Ray cluster
    this machine can find (``ray start --head`` here, or RAY_ADDRESS), anything else must be ``HOST:PORT``
    or ``ray://HOST:PORT`` (whether a head answers there is checked once the config is, by the driver)."""
    if address is None:
        return
    text = address.strip()
    if text == "local":
        return
    if text == "auto":
        from ray._private.services import get_ray_address_from_environment

        try:
            get_ray_address_from_environment("auto", None)
        except ConnectionError:
            raise ConfigError("--address auto: no running Ray cluster found on this machine (no `ray start --head` "
                              f"here and no RAY_ADDRESS); start one, give its HOST:PORT, or {_NO_ADDRESS}") from None
        return
    match = _ADDRESS.fullmatch(text)
    if match is None or not 0 < int(match.group("port")) < 65536:
        shown = os.fsencode(address).decode("utf-8", "backslashreplace")
        raise ConfigError(f"--address {shown!r}: not a Ray address; give auto, HOST:PORT (e.g. 10.0.0.5:6379, what "
                          f"`ray status` prints) or ray://HOST:PORT, or {_NO_ADDRESS}")


# Files and folders `iclmem report` and `iclmem resume` (re)write in a run folder: one that is in the way (a
# folder where a file goes, or a file where a folder goes) is named before any work, not when it is written.
def _run_folder_outputs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    from iclmem.runfolder import (
        CONTEXT_AUDITS_FILE,
        FIGURES_DIR,
        MANIPULATION_AUC_FILE,
        PROBES_DIR,
        REFERENCE_RESULTS_FILE,
        REPORT_FILE,
        RESULTS_FILE,
        ROC_DIR,
        SPLIT_REPORT_FILE,
    )

    files = (RESULTS_FILE, REFERENCE_RESULTS_FILE, SPLIT_REPORT_FILE, MANIPULATION_AUC_FILE, REPORT_FILE,
             CONTEXT_AUDITS_FILE)
    return files, (ROC_DIR, FIGURES_DIR, PROBES_DIR)


def _check_outputs(run_dir: Path, command: str) -> None:
    files, folders = _run_folder_outputs()
    for name in files:
        path = run_dir / name
        if path.exists() and not path.is_file():
            raise ConfigError(f"{path} is a folder, not a file: `{command}` writes the file {name} there; move the "
                              "folder away (nothing was changed)")
    for name in folders:
        path = run_dir / name
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{path} is a file, not a folder: `{command}` keeps its {name} files there; move the "
                              "file away (nothing was changed)")


def _check_trial_runs(run_dir: Path) -> None:
    """``RUN_DIR/wandb/trial_runs.json`` (the W&B run of every trial, read when a resumed sweep logs to W&B):
    a damaged one is named before any work, by the reader the W&B logger uses."""
    from iclmem.runfolder import WANDB_DIR
    from orchestrator.wandb_logger import TRIAL_RUNS_FILE, TrialRunsLedger

    TrialRunsLedger.read(run_dir / WANDB_DIR / TRIAL_RUNS_FILE)


def _check_lm_device(cfg: Any, where: str, address: str | None, *, validating: bool) -> None:
    """An LM sweep's ``device`` must exist where its probe actors run: on this machine unless --address joins a
    cluster. A resumed run's device is its ``lm_sweep.json``'s."""
    from orchestrator.lm_config import unavailable_device

    if address:
        return  # the actors run on the cluster's nodes, which this machine cannot see
    if cfg is None:
        from iclmem.runfolder import LM_SWEEP_FILE

        stored = Path(where) / LM_SWEEP_FILE
        if not stored.is_file():
            return  # the resume itself names a folder that is not an LM run
        from orchestrator.lm_config import parse_lm_sweep

        try:
            cfg = parse_lm_sweep(json.loads(stored.read_text(encoding="utf-8")), str(stored))
        except (ValueError, OSError, IclmemError):
            return  # the resume names a damaged record itself
    why = unavailable_device(cfg)
    if why is None:
        return
    if validating:
        raise ConfigError(f"{where}: {why}: set device: cpu, or validate on a machine with it (`iclmem lm validate "
                          "--schema-only` checks the file alone)")
    raise ConfigError(f"{where}: {why}, where the embedded Ray's probe actors would run: set device: cpu, or join a "
                      "cluster with that device with --address")


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


def _check_image(args: argparse.Namespace) -> Any:
    from orchestrator.image import check_dockerfile

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


def _version() -> str:
    from iclmem.provenance import git_commit, package_versions

    return f"{package_versions(('iclmem',)).get('iclmem', 'unknown')} (git {git_commit()[:12]})"


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default and, for a closed vocabulary, its choices."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.help is argparse.SUPPRESS or not action.option_strings:
            return text
        if action.choices is not None and "%(choices)" not in text:
            text += " (choices: {})".format(", ".join(str(c) for c in action.choices))
        if "default" not in text and action.default is not argparse.SUPPRESS:
            if isinstance(action, argparse._StoreTrueAction):
                text += " (default: off)"
            elif isinstance(action, argparse._AppendAction):
                text += " (default: none)"
            else:
                text += " (default: %(default)s)"
        return text


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _folder(name: str) -> Any:
    """The argparse type of a folder argument (``--out``, ``RUN_DIR``). An empty name (an unset shell variable:
    ``--out "$RUN"``) is refused rather than read as "not given" or as ".", which would write the run somewhere
    the user did not name."""

    def folder(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{name} is empty ({text!r}): give the folder by name (an unset shell "
                                             "variable?)" + (", or leave --out out for the default"
                                                             if name == "--out" else ""))
        return text

    return folder


_out_folder = _folder("--out")
_run_dir = _folder("RUN_DIR")


def check_folder_name(flag: str, text: str) -> None:
    """A folder a command writes in (``--out``, ``RUN_DIR``) must have a name the tools below can take: UTF-8
    (Ray, Parquet and W&B encode paths as UTF-8) and within the file system's NAME_MAX per part and PATH_MAX
    in all. Checked before any work, in one line naming the flag."""
    shown = os.fsencode(text).decode("utf-8", "backslashreplace")
    short = shown if len(shown) <= 80 else f"{shown[:40]}...{shown[-20:]}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{flag} {short!r}: the name is not UTF-8 (bytes of another encoding, shown as \\x..); "
                          "Ray, Parquet and W&B take UTF-8 paths only: name the folder in UTF-8") from None
    absolute = Path(text).expanduser().absolute()
    known = next((p for p in (absolute, *absolute.parents) if _is_dir_quietly(p)), Path("/"))
    name_max, path_max = _path_limit(known, "PC_NAME_MAX", 255), _path_limit(known, "PC_PATH_MAX", 4096)
    for part in absolute.parts[1:]:
        if len(os.fsencode(part)) > name_max:
            raise ConfigError(f"{flag} {short!r}: a folder name of {len(os.fsencode(part))} bytes in it; the file "
                              f"system takes at most {name_max} (NAME_MAX): give a shorter name")
    if len(os.fsencode(absolute)) >= path_max:
        raise ConfigError(f"{flag} {short!r}: a path of {len(os.fsencode(absolute))} bytes; the file system takes "
                          f"at most {path_max - 1} (PATH_MAX), and the run's own files go below it: give a shorter path")


def _is_dir_quietly(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a name too long to look up
        return False


def _path_limit(folder: Path, name: str, default: int) -> int:
    try:
        return int(os.pathconf(folder, name))
    except (OSError, ValueError):
        return default


def build_parser() -> argparse.ArgumentParser:
    formatter = _HelpFormatter
    p = argparse.ArgumentParser(prog="iclmem", description="Audit tabular foundation models for memorization of "
                                "their fine-tuning data.", epilog=EPILOG, formatter_class=formatter)
    p.add_argument("--version", action="version", version=f"iclmem {_version()}", help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True)
    wandb_modes = values(WandbMode)

    def parser(parent: argparse._SubParsersAction, name: str, **kwargs: str) -> argparse.ArgumentParser:
        return parent.add_parser(name, formatter_class=formatter, **kwargs)

    def ray_args(sp: argparse.ArgumentParser, console_log: bool = True) -> None:
        sp.add_argument("--address", default=None,
                        help="join an existing Ray cluster ('auto' or HOST:PORT) (default: start an embedded local Ray)")
        sp.add_argument("--num-cpus", type=_positive, default=None,
                        help="CPUs of the embedded local Ray (default: every CPU of this machine)")
        sp.add_argument("--quiet", action="store_true", help="no live progress lines")
        if console_log:
            sp.add_argument("--verbose", action="store_true",
                            help="show Ray's, Tune's, W&B's and Python's warnings on the console instead of "
                                 "keeping them in RUN_DIR/console.log")

    r = parser(sub, "run", help="Stage I, fine-tuning, probing and aggregation in one pipelined sweep")
    r.add_argument("config", help="sweep YAML (see configs/)")
    r.add_argument("--out", type=_out_folder, default=None,
                   help="run folder, new or empty (default: ./runs/<config>-<time>)")
    r.add_argument("--wandb", choices=wandb_modes, default=None,
                   help="override the sweep's wandb.mode (default: the sweep's)")
    ray_args(r)
    r.set_defaults(func=cmd_run)

    s = parser(sub, "resume", help="resume a sweep whose driver stopped; finished trials are not re-run")
    s.add_argument("run_dir", type=_run_dir, help="the run folder of `iclmem run`")
    ray_args(s)
    s.set_defaults(func=cmd_resume)

    v = parser(sub, "validate", help="check a sweep file, reporting every mistake at once")
    v.add_argument("config", help="sweep YAML")
    v.add_argument("--schema-only", action="store_true", help="check the file only, without loading any table")
    v.set_defaults(func=cmd_validate)

    lm = parser(sub, "lm", help="language-model probes: entity exposure, zero-shot typing, few-shot NER")
    lm_sub = lm.add_subparsers(dest="lm_command", required=True)
    lr = parser(lm_sub, "run", help="run an LM sweep file's probes on the probe pool")
    lr.add_argument("config", help="LM sweep YAML (see configs/lm_quickstart.yaml)")
    lr.add_argument("--out", type=_out_folder, default=None, help="run folder: new, empty, or an LM run of the same "
                    "config to "
                    "continue (default: ./runs/<config>-<time>)")
    lr.add_argument("--wandb", choices=wandb_modes, default=None,
                    help="override the sweep's wandb.mode (default: the sweep's, offline unless set)")
    lres = parser(lm_sub, "resume", help="finish an LM sweep from its run folder; stored units are not recomputed")
    lres.add_argument("run_dir", type=_run_dir, help="the run folder of `iclmem lm run`")
    for lm_driver in (lr, lres):
        ray_args(lm_driver, console_log=False)
        lm_driver.add_argument("--verbose", action="store_true",
                               help="show Ray's, W&B's and Python's warnings on the console instead of keeping "
                                    "them in RUN_DIR/console.log")
    lv = parser(lm_sub, "validate", help="check an LM sweep file, reporting every mistake at once; then load "
                "its models and datasets")
    lv.add_argument("config", help="LM sweep YAML")
    lv.add_argument("--schema-only", action="store_true", help="check the file only, without loading data")
    lm.set_defaults(func=cmd_lm)

    rep = parser(sub, "report", help="rebuild results table, reports and W&B summary from stored results")
    rep.add_argument("run_dir", type=_run_dir, help="the run folder of `iclmem run`")
    rep.add_argument("--wandb", choices=wandb_modes, default=None,
                     help="W&B mode of the summary run (default: the sweep's)")
    rep.add_argument("--wandb-report", action="store_true", help="also publish a W&B Report (online mode, key in env)")
    rep.add_argument("--wandb-workspace", action="store_true",
                     help="also save a W&B workspace of the trial runs, grouped by task, lr, Q and label mode "
                          "(online mode, key in env)")
    rep.add_argument("--force", action="store_true",
                     help="rebuild even when the stored probe results cover fewer checkpoints than the results "
                          "table already holds, or when sweep.json no longer matches the config hash "
                          "provenance.json records for the results (or provenance.json is missing); both are "
                          "otherwise refused, leaving the folder as it is. A report made despite the second is "
                          "marked as forced at its top")
    rep.set_defaults(func=cmd_report)

    m = parser(sub, "models", help="registered model adapters and whether their extras are installed")
    m.set_defaults(func=cmd_models)

    from orchestrator.audit import DEFAULT_BOOTSTRAP, DEFAULTS, min_bootstrap

    recorded = "default: as the checkpoint records it, else {}"
    pr = parser(sub, "probe", help="audit one fine-tuned checkpoint against its base model",
                description=textwrap.fill(
                    "Audit one checkpoint: an iclmem checkpoint folder (its checkpoint.json and ground_truth.json "
                    "say the model, task, split and labels; flags that contradict them are refused) or a weights "
                    "file of --base-model.", 100))
    pr.add_argument("checkpoint", nargs="?", default=None,
                    help="iclmem checkpoint folder, or a weights file of --base-model (not with --estimator)")
    pr.add_argument("--estimator", default=None, metavar="MODULE:FACTORY",
                    help="audit a deployed classifier instead of a checkpoint: a callable returning it unfitted "
                         "(fit, predict_proba), e.g. a TabPFNClassifier on fine-tuned weights; scored as deployed, "
                         "each probe context one fit (needs --base-estimator, --task, --members)")
    pr.add_argument("--base-estimator", default=None, metavar="MODULE:FACTORY",
                    help="with --estimator: the same classifier on the weights fine-tuning started from")
    pr.add_argument("--task", default=None, help="built-in task name, a CARTE folder:name, or file.csv:target "
                    "(default: the task the checkpoint records; needed for a weights file)")
    pr.add_argument("--base-model", default=None,
                    help=f"registered model name, see `iclmem models` ({recorded.format(DEFAULTS['base_model'])})")
    pr.add_argument("--base-weights", default=None, metavar="PATH",
                    help="weights file of the base model the checkpoint was fine-tuned from, e.g. a local "
                         "TabICL checkpoint (default: the weights the checkpoint records, else the model's default)")
    pr.add_argument("--q", type=_positive, default=None, help=f"members per split ({recorded.format(DEFAULTS['q'])})")
    pr.add_argument("--label-mode", choices=values(LabelMode), default=None,
                    help=f"labels the model was trained on ({recorded.format(DEFAULTS['label_mode'])})")
    pr.add_argument("--seed", type=int, default=None, help=f"split seed ({recorded.format(DEFAULTS['seed'])})")
    pr.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP,
                    help=f"bootstrap resamples of the AUC and TPR intervals, at least {min_bootstrap()}")
    pr.add_argument("--context-size", type=_positive, default=None,
                    help=f"context rows ({recorded.format(DEFAULTS['context_size'])})")
    pr.add_argument("--members", default=None, metavar="FILE",
                    help="file of member row ids, one per line, for a model fine-tuned elsewhere (default: "
                         "the members the checkpoint records, else iclmem's own split); ROW_ID,LABEL gives the "
                         "label each was trained with, which a shuffled --label-mode requires")
    pr.add_argument("--out", type=_out_folder, default=None, help="audit folder: new, empty, or an earlier audit of the "
                    "same checkpoint (default: "
                    "./runs/audit-<task>-<checkpoint id>)")
    pr.set_defaults(func=cmd_probe)

    from orchestrator.context_audit import DEFAULT_CONTEXT_SIZE, DEFAULT_NULL_SPLITS, DEFAULT_REFERENCES

    ca = parser(sub, "audit-context", help="was a row in a fitted estimator's context? (no fine-tuning, no Ray)",
                description=textwrap.fill(
                    "Audit a fitted in-context learner as deployed: N rows of the table are its context "
                    "(members), N label-matched rows are not (non-members); K reference contexts (each row in "
                    "half of them) calibrate the known-context loss, LiRA and RMIA; a never-in-context control "
                    "must give no signal for the verdict to be trusted.", 100))
    ca.add_argument("task", help="built-in task name, a CARTE folder:name, or file.csv:target")
    which = ca.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", default=None, help="registered model, see `iclmem models` (e.g. pfn-mini)")
    which.add_argument("--estimator", default=None, metavar="MODULE:FACTORY",
                       help="a callable returning an unfitted scikit-learn-style classifier (fit, predict_proba), "
                            "audited as configured: its preprocessing, subsampling and ensembling included")
    ca.add_argument("--context-size", type=_positive, default=DEFAULT_CONTEXT_SIZE,
                    help="rows in the deployed context (N), and in each reference context")
    ca.add_argument("--references", type=_positive, default=DEFAULT_REFERENCES,
                    help="reference contexts K: even, at most 256")
    ca.add_argument("--null-splits", type=int, default=DEFAULT_NULL_SPLITS,
                    help="null splits of the non-members per attack (their detections are false positives)")
    ca.add_argument("--seed", type=int, default=0, help="seed of the split and of the reference contexts")
    ca.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP,
                    help=f"bootstrap resamples of the AUC intervals, at least {min_bootstrap()}")
    ca.add_argument("--out", type=_out_folder, required=True,
                    help="audit folder: new, empty, or an earlier run of the same audit")
    ca.add_argument("--wandb", choices=wandb_modes, default=None,
                    help="also log the audit as one W&B run (its table of metrics, verdict and ROC figure; no row of "
                         "the table): offline into OUT/wandb, or online with WANDB_API_KEY set (default: no W&B)")
    ca.add_argument("--wandb-project", default="iclmem", help="W&B project of that run")
    ca.set_defaults(func=cmd_audit_context)

    e = parser(sub, "estimate", help="the grid's work, unit costs measured on this device, and the predicted "
               "wall time and device-hours on N workers, before anything is launched")
    e.add_argument("config", nargs="?", default=None, help="sweep YAML (with --compare: the run's own by default)")
    e.add_argument("--workers", type=_positive, default=None,
                   help="parallel slots: cores of a CPU sweep, GPUs of a CUDA one (default 1; with --compare, "
                        "the run's)")
    e.add_argument("--compare", metavar="RUN_DIR", default=None,
                   help="a finished run: the estimate beside the times it recorded (RUN_DIR/timings.json), phase "
                        "by phase, naming the phase with the largest error")
    e.add_argument("--device", default=None,
                   help="auto, cpu, cuda or cuda:N (default: auto, CUDA when present)")
    e.add_argument("--task", default=None, help="measure on this task (default: the sweep's first; any built-in name)")
    e.add_argument("--epochs", type=_positive, default=4, help="fine-tuning epochs timed per model and Q")
    e.add_argument("--threads", type=_positive, default=1, help="torch threads, as each trial uses")
    e.add_argument("--markdown", action="store_true", help="tables as markdown")
    e.set_defaults(func=cmd_estimate)

    c = parser(sub, "cluster-check", help="validate a cluster.yaml offline: Ray's own checks, shared storage, "
               "secrets, and with --sweep the sweep's resources against the node types")
    c.add_argument("cluster_yaml", help="Ray cluster launcher YAML")
    c.add_argument("--sweep", action="append", default=[], metavar="SWEEP_YAML",
                   help="also check this sweep's storage_path, secrets and resource requests (repeatable)")
    c.set_defaults(func=cmd_cluster_check)
    return p


@contextlib.contextmanager
def _short_warnings(enabled: bool) -> Iterator[None]:
    """Python warnings as one line each, without the source path and line the default format adds, and
    each message once. ``run`` and ``resume`` (tabular and LM) keep the full form, in the run folder's
    console log."""
    import warnings

    if not enabled:
        yield
        return
    shown: set[str] = set()

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        text = f"iclmem: warning: {category.__name__}: {message}"
        if text not in shown:
            shown.add(text)
            print(text, file=sys.stderr, flush=True)

    previous, warnings.showwarning = warnings.showwarning, show
    try:
        yield
    finally:
        warnings.showwarning = previous


def main(argv: list[str] | None = None) -> int:
    """Parse and run one command; every command ends with the same exit status for the same kind of end
    (see ``EPILOG``): a bad flag exits through argparse with 2, like any other bad input."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    args = build_parser().parse_args(argv)
    try:
        for flag, attr in (("--out", "out"), ("RUN_DIR", "run_dir")):
            if getattr(args, attr, None):
                check_folder_name(flag, getattr(args, attr))
        # run, resume, lm run and lm resume keep the full form, in the run folder's console log
        sweeping = args.command in ("run", "resume") or (args.command == "lm" and args.lm_command in ("run", "resume"))
        with _short_warnings(not sweeping):
            return int(args.func(args) or 0)
    except SweepInterrupted as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return exc.exit_code
    except IclmemError as exc:
        print(f"iclmem: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # a command without a sweep of its own (probe, report, validate, lm ...)
        print("iclmem: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
