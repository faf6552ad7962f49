"""``iclmem run``, ``resume``, ``validate`` and ``lm run`` / ``resume`` / ``validate``: what each loads and
checks before it hands a sweep to its driver (``orchestrator.driver.sweep``, ``orchestrator.driver.lm_sweep``), and the
lines it prints once the driver is done."""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from iclmem.errors import ConfigError, IclmemError
from iclmem.runfolder import REPORT_FILE
from iclmem.vocab import WandbMode
from orchestrator.commands.cli_folders import check_outputs

DEFAULT_RUNS = Path("runs")


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
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.runfolder.prepare import check_models
    from orchestrator.schema.sweep_files import load_sweep

    sweep = load_sweep(args.config)
    if args.wandb:
        sweep = with_wandb_mode(sweep, args.wandb)
    check_models(sweep, args.config)  # an unknown option or a weights file that does not load: before the folder
    check_address(args.address)
    run_dir = Path(args.out) if args.out else _default_run_dir(args.config)
    print(f"[iclmem] sweep {sweep.name!r} ({sweep.config_hash()}) -> {run_dir}", flush=True)
    results = run_sweep(args.config, run_dir, sweep=sweep, address=args.address, progress=not args.quiet,
                        num_cpus=args.num_cpus, verbose=args.verbose, started_at=_process_started())
    print(f"[iclmem] {finished_line('done', results, _audit_count(sweep), run_dir)}")
    _print_leaked(results, run_dir)
    return 0


def finished_line(verb: str, results: Any, audits: int, run_dir: str | Path) -> str:
    """The line a finished sweep ends with: its checkpoint results and its deployed-context audits (regime
    ``context``), each counted where the sweep has any, and where its report is. A context-only sweep
    fine-tunes nothing: it says how many audits it ran, not "0 checkpoint results"."""
    n_results = 0 if results is None else len(results)
    parts = [f"{n_results} checkpoint results"] if n_results or not audits else []
    if audits:
        parts.append(f"{audits} deployed-context audit{'s' if audits != 1 else ''}")
    return f"{verb}: {' and '.join(parts)}; report at {Path(run_dir) / REPORT_FILE}"


def split_checks_line(config: str, tasks: int, audits: int) -> str:
    """What ``iclmem validate``'s dry Stage I checked: the prepared fine-tuning tasks and the deployed-context
    audits (whose Stage I runs in memory: the run prepares them again when it starts them)."""
    what = [f"{tasks} prepared task(s)"] if tasks or not audits else []
    if audits:
        what.append(f"{audits} deployed-context audit(s) (regime context, prepared in memory; the run prepares "
                    "them again at run time)")
    return f"{config}: {' and '.join(what)} pass the split checks"


def _audit_count(sweep: Any) -> int:
    """How many deployed-context audits (regime ``context``) the sweep runs; 0 without a sweep."""
    from orchestrator.schema.trials import context_audit_specs

    return 0 if sweep is None else len(context_audit_specs(sweep))


def _stored_sweep(run_dir: str | Path) -> Any:
    """The sweep a run folder holds, or None where it cannot be read (the line then counts results only)."""
    from orchestrator.runfolder.run_folder import RunFolder

    try:
        return RunFolder(Path(run_dir)).sweep_or_none
    except Exception:  # the resume already finished: a summary line never turns it into a failure
        return None


def _print_leaked(results: Any, run_dir: Path) -> None:
    """The final summary: the claim ledger's stated claims (what, how much, how sure, whether it holds on rounded
    outputs), as the report's first section states them; for a folder without a ledger, the runs that leaked;
    nothing for a sweep with no fine-tuned run (a context-audit-only sweep)."""
    from orchestrator.report.html import leaked_lines, ledger_lines
    from orchestrator.report.tables import outcome_summary
    from orchestrator.runfolder.run_folder import RunFolder

    if results is None or len(results) == 0 or outcome_summary(results)[1] == 0:
        return
    ledger = RunFolder(run_dir).claim_ledger()
    for line in ledger_lines(ledger) if ledger is not None else leaked_lines(results):
        print(f"[iclmem] {line}")


def cmd_resume(args: argparse.Namespace) -> int:
    from orchestrator.driver.sweep import run_sweep

    check_address(args.address)
    check_outputs(Path(args.run_dir), "iclmem resume")
    _check_trial_runs(Path(args.run_dir))
    results = run_sweep(None, args.run_dir, address=args.address, resume=True, progress=not args.quiet,
                        num_cpus=args.num_cpus, verbose=args.verbose, started_at=_process_started())
    print(f"[iclmem] {finished_line('resumed', results, _audit_count(_stored_sweep(args.run_dir)), args.run_dir)}")
    _print_leaked(results, Path(args.run_dir))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    import tempfile

    from orchestrator.audits.context_audit import check_context_audits
    from orchestrator.runfolder.prepare import prepare_sweep
    from orchestrator.schema.sweep_files import load_sweep
    from orchestrator.schema.trials import context_audit_specs, expand_grid

    sweep = load_sweep(args.config)
    trials = expand_grid(sweep)
    audits = context_audit_specs(sweep)
    if not args.schema_only:  # Stage I as a dry run: every table loads, splits and fits the models
        check_context_audits(sweep, print)
        with tempfile.TemporaryDirectory() as scratch:
            prepared = prepare_sweep(sweep, Path(scratch), log=lambda _m: None, source=args.config)
        print(split_checks_line(args.config, len(prepared.tasks), len(audits)))
        if prepared.trials:
            _check_disk(args.config, prepared)
    extra = f" and {len(audits)} deployed-context audits (regime context)" if audits else ""
    print(f"{args.config}: valid; {len(trials)} fine-tuning runs{extra}, config hash {sweep.config_hash()}")
    return 0


def _check_disk(config: str, prepared: Any) -> None:
    """``iclmem validate``: the bytes the sweep will write and whether the default run folder's disk (and Tune's
    storage's) has room for them; a :class:`ConfigError` with the numbers where not."""
    from orchestrator.driver.storage import storage_for
    from orchestrator.estimate.estimate_disk import check_room

    run_dir = _default_run_dir(config).resolve()
    line, problems = check_room(prepared, run_dir, storage_for(prepared.sweep, run_dir), os.cpu_count() or 1)
    print(f"{config}: {line}")
    if problems:
        raise ConfigError(f"{config}: not enough disk for this sweep:\n  - " + "\n  - ".join(problems))


def cmd_lm(args: argparse.Namespace) -> int:
    from iclmem.runfolder import LM_REPORT_FILE
    from orchestrator.driver.lm_sweep import run_lm_sweep
    from orchestrator.schema.sweep_files import load_lm_sweep

    if args.lm_command == "validate":
        import tempfile

        from orchestrator.driver.lm_sweep import resolve_inputs

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


def _check_trial_runs(run_dir: Path) -> None:
    """``RUN_DIR/wandb/trial_runs.json`` (the W&B run of every trial, read when a resumed sweep logs to W&B):
    a damaged one is named before any work, by the reader the W&B logger uses (``RunFolder.trial_runs``)."""
    from orchestrator.runfolder.run_folder import RunFolder

    RunFolder(run_dir).trial_runs()


def _check_lm_device(cfg: Any, where: str, address: str | None, *, validating: bool) -> None:
    """An LM sweep's ``device`` must exist where its probe actors run: on this machine unless --address joins a
    cluster. A resumed run's device is its ``lm_sweep.json``'s."""
    from orchestrator.schema.lm_config import unavailable_device

    if address:
        return  # the actors run on the cluster's nodes, which this machine cannot see
    if cfg is None:
        from iclmem.runfolder import LM_SWEEP_FILE

        stored = Path(where) / LM_SWEEP_FILE
        if not stored.is_file():
            return  # the resume itself names a folder that is not an LM run
        from orchestrator.schema.lm_config import parse_lm_sweep

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
