"""The ``iclmem`` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from iclmem.errors import IclmemError

DEFAULT_RUNS = Path("runs")


def _default_run_dir(config: str) -> Path:
    return DEFAULT_RUNS / f"{Path(config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.config import load_sweep
    from orchestrator.sweep import run_sweep

    sweep = load_sweep(args.config)
    if args.wandb:
        sweep = sweep.model_copy(update={"wandb": sweep.wandb.model_copy(update={"mode": args.wandb})})
    run_dir = Path(args.out) if args.out else _default_run_dir(args.config)
    print(f"[iclmem] sweep {sweep.name!r} ({sweep.config_hash()}) -> {run_dir}")
    results = run_sweep(args.config, run_dir, sweep=sweep, address=args.address, progress=not args.quiet,
                        num_cpus=args.num_cpus)
    print(f"[iclmem] done: {len(results)} checkpoint results; report at {run_dir / 'report.html'}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from orchestrator.sweep import run_sweep

    results = run_sweep(None, args.run_dir, address=args.address, resume=True, progress=not args.quiet,
                        num_cpus=args.num_cpus)
    print(f"[iclmem] resumed: {len(results)} checkpoint results; report at {Path(args.run_dir) / 'report.html'}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    import tempfile

    from orchestrator.config import expand_grid, load_sweep
    from orchestrator.prepare import prepare_sweep

    sweep = load_sweep(args.config)
    trials = expand_grid(sweep)
    if not args.schema_only:  # Stage I as a dry run: every table loads, splits and fits the models
        with tempfile.TemporaryDirectory() as scratch:
            prepared = prepare_sweep(sweep, Path(scratch), log=lambda _m: None, source=args.config)
        print(f"{args.config}: {len(prepared.tasks)} prepared task(s) pass the split checks")
    print(f"{args.config}: valid; {len(trials)} fine-tuning runs, config hash {sweep.config_hash()}")
    return 0


def cmd_lm(args: argparse.Namespace) -> int:
    from iclmem.runfolder import LM_REPORT_FILE
    from iclmem.vocab import WandbMode
    from orchestrator.lm_config import load_lm_sweep
    from orchestrator.lm_sweep import run_lm_sweep

    if args.lm_command == "validate":
        import tempfile

        from orchestrator.lm_sweep import resolve_inputs

        cfg = load_lm_sweep(args.config)
        if not args.schema_only:  # every model directory and dataset loads (the built-in world is built)
            with tempfile.TemporaryDirectory() as scratch:
                inputs = resolve_inputs(cfg, Path(scratch))
            print(f"{args.config}: {len(inputs.models)} model(s) and {len(inputs.datasets)} dataset(s) load")
        print(f"{args.config}: valid; config hash {cfg.config_hash()}")
        return 0
    quiet = (lambda _line: None) if args.quiet else print
    if args.lm_command == "resume":
        run_dir = Path(args.run_dir)
        results = run_lm_sweep(None, run_dir, resume=True, address=args.address, num_cpus=args.num_cpus, log=quiet)
    else:
        cfg = load_lm_sweep(args.config)
        if args.wandb:
            cfg = cfg.model_copy(update={"wandb": cfg.wandb.model_copy(update={"mode": WandbMode(args.wandb)})})
        run_dir = Path(args.out) if args.out else _default_run_dir(args.config)
        results = run_lm_sweep(args.config, run_dir, config=cfg, address=args.address, num_cpus=args.num_cpus,
                               log=quiet)
    print(f"[iclmem] language-model probes: {len(results)} result rows; report at {run_dir / LM_REPORT_FILE}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from iclmem.runfolder import folder_kind
    from orchestrator.aggregate import aggregate

    run_dir = Path(args.run_dir)
    if folder_kind(run_dir) != "tabular":  # never write tables and a report into someone else's folder
        raise IclmemError(f"{run_dir} is not an iclmem sweep folder (it holds no sweep.json); `iclmem report` "
                          "rebuilds the results of a folder `iclmem run` wrote")
    results = aggregate(run_dir, wandb_mode=args.wandb)
    if args.wandb_report:
        from orchestrator.wandb_logger import build_wandb_report, resolve_wandb_mode

        if resolve_wandb_mode(args.wandb or "online") != "online":
            raise IclmemError("--wandb-report publishes to W&B: pass --wandb online and export WANDB_API_KEY")
        sweep = json.loads((run_dir / "sweep.json").read_text())
        entity = sweep["wandb"].get("entity") or os.environ.get("WANDB_ENTITY")
        if not entity:
            raise IclmemError("--wandb-report needs a W&B entity: set wandb.entity in the sweep or WANDB_ENTITY")
        report = build_wandb_report(entity, sweep["wandb"]["project"], sweep["name"], results, run_dir=run_dir,
                                    publish=True)
        print(f"[iclmem] W&B report: {getattr(report, 'url', '')}")
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
    from orchestrator.audit import audit_checkpoint

    row = audit_checkpoint(args.checkpoint, args.task, base_model=args.base_model, out=args.out,
                           q=args.q, label_mode=args.label_mode, seed=args.seed, bootstrap=args.bootstrap,
                           members=args.members, context_size=args.context_size)
    keys = ["outcome", "score_kind", "auc", "auc_low", "auc_high", "tpr_at_1pct", "tpr_at_10pct", "loss_ratio"]
    print(json.dumps({k: row.get(k) for k in keys}, indent=1, default=str))
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from orchestrator.estimate import estimate, render

    est = estimate(args.config, args.workers, device=args.device, task=args.task, epochs=args.epochs,
                   threads=args.threads, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(render(est, markdown=args.markdown))
    return 0


def cmd_cluster_check(args: argparse.Namespace) -> int:
    from orchestrator.cluster import check_cluster_file

    result = check_cluster_file(args.cluster_yaml, args.sweep)  # a sweep that does not load: ConfigError, exit 2
    for note in result.notes:
        print(f"note: {note}")
    if result.problems:
        print(f"{args.cluster_yaml}: {len(result.problems)} problem(s):", file=sys.stderr)
        for p in result.problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    checked = "Ray's validation, shared storage, secrets"
    if args.sweep:
        checked += f"; storage, secrets and resources of {', '.join(args.sweep)}"
    print(f"{args.cluster_yaml}: valid ({checked})")
    return 0


def _version() -> str:
    from iclmem.provenance import git_commit, package_versions

    return f"{package_versions(('iclmem',)).get('iclmem', 'unknown')} (git {git_commit()[:12]})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="iclmem", description="Audit tabular foundation models for memorization of their fine-tuning data.")
    p.add_argument("--version", action="version", version=f"iclmem {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    def ray_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--address", default=None, help="join an existing Ray cluster ('auto'); default: embedded local Ray")
        sp.add_argument("--num-cpus", type=int, default=None, help="CPUs of the embedded local Ray")
        sp.add_argument("--quiet", action="store_true", help="no live progress lines")

    r = sub.add_parser("run", help="Stage I, fine-tuning, probing and aggregation in one pipelined sweep")
    r.add_argument("config")
    r.add_argument("--out", default=None, help="run folder (default: ./runs/<config>-<time>)")
    r.add_argument("--wandb", choices=["offline", "online", "disabled"], default=None)
    ray_args(r)
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("resume", help="resume a sweep whose driver stopped; finished trials are not re-run")
    s.add_argument("run_dir")
    ray_args(s)
    s.set_defaults(func=cmd_resume)

    v = sub.add_parser("validate", help="check a sweep file, reporting every mistake at once")
    v.add_argument("config")
    v.add_argument("--schema-only", action="store_true", help="check the file only, without loading any table")
    v.set_defaults(func=cmd_validate)

    lm = sub.add_parser("lm", help="language-model probes: entity exposure, zero-shot typing, few-shot NER")
    lm_sub = lm.add_subparsers(dest="lm_command", required=True)
    lr = lm_sub.add_parser("run", help="run an LM sweep file's probes on the probe pool")
    lr.add_argument("config", help="LM sweep YAML (see configs/lm_quickstart.yaml)")
    lr.add_argument("--out", default=None, help="run folder (default: ./runs/<config>-<time>)")
    lr.add_argument("--wandb", choices=["offline", "online", "disabled"], default=None,
                    help="override the sweep's wandb.mode (default: the sweep's, offline unless set)")
    ray_args(lr)
    lres = lm_sub.add_parser("resume", help="finish an LM sweep from its run folder; stored units are not recomputed")
    lres.add_argument("run_dir")
    ray_args(lres)
    lv = lm_sub.add_parser("validate", help="check an LM sweep file, reporting every mistake at once; then load "
                           "its models and datasets")
    lv.add_argument("config")
    lv.add_argument("--schema-only", action="store_true", help="check the file only, without loading data")
    lm.set_defaults(func=cmd_lm)

    rep = sub.add_parser("report", help="rebuild results table, reports and W&B summary from stored results")
    rep.add_argument("run_dir")
    rep.add_argument("--wandb", choices=["offline", "online", "disabled"], default=None)
    rep.add_argument("--wandb-report", action="store_true", help="also publish a W&B Report (online mode, key in env)")
    rep.set_defaults(func=cmd_report)

    m = sub.add_parser("models", help="registered model adapters and whether their extras are installed")
    m.set_defaults(func=cmd_models)

    pr = sub.add_parser("probe", help="audit one fine-tuned checkpoint folder against a base model")
    pr.add_argument("checkpoint")
    pr.add_argument("--task", required=True, help="built-in task name, a CARTE folder:name, or file.csv:target")
    pr.add_argument("--base-model", default="pfn-mini")
    pr.add_argument("--q", type=int, default=50)
    pr.add_argument("--label-mode", default="normal")
    pr.add_argument("--seed", type=int, default=0)
    pr.add_argument("--bootstrap", type=int, default=1000)
    pr.add_argument("--context-size", type=int, default=128)
    pr.add_argument("--members", default=None, help="file of member row ids (one per line) for a model fine-tuned elsewhere")
    pr.add_argument("--out", default=None)
    pr.set_defaults(func=cmd_probe)

    e = sub.add_parser("estimate", help="the grid's work, unit costs measured on this device, and the predicted "
                       "wall time and device-hours on N workers, before anything is launched")
    e.add_argument("config")
    e.add_argument("--workers", type=int, default=1, help="parallel slots: cores of a CPU sweep, GPUs of a CUDA one")
    e.add_argument("--device", default=None, help="auto (default: CUDA when present), cpu or cuda")
    e.add_argument("--task", default=None, help="measure on this task (default: the sweep's first; any built-in name)")
    e.add_argument("--epochs", type=int, default=4, help="fine-tuning epochs timed per model and Q")
    e.add_argument("--threads", type=int, default=1, help="torch threads, as each trial uses")
    e.add_argument("--markdown", action="store_true", help="tables as markdown")
    e.set_defaults(func=cmd_estimate)

    c = sub.add_parser("cluster-check", help="validate a cluster.yaml offline: Ray's own checks, shared storage, "
                       "secrets, and with --sweep the sweep's resources against the node types")
    c.add_argument("cluster_yaml")
    c.add_argument("--sweep", action="append", default=[], metavar="SWEEP_YAML",
                   help="also check this sweep's storage_path, secrets and resource requests (repeatable)")
    c.set_defaults(func=cmd_cluster_check)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except IclmemError as exc:
        print(f"iclmem: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
