"""The ``iclmem`` command: its parser (every command, its flags and their help) and ``main``, which runs one
command and ends with the same exit status for the same kind of end. The work behind each command lives in
the module named for it: ``cli_sweeps`` (run, resume, validate, lm), ``cli_report`` (report), ``cli_audits``
(models, probe, audit-context) and ``cli_planning`` (estimate, cluster-check); ``cli_folders`` checks the
folders a command is given."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

from iclmem.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    DiskFull,
    IclmemError,
    SweepInterrupted,
    is_disk_full,
)
from iclmem.vocab import AuditKind, LabelMode, WandbMode, values
from orchestrator.commands.cli_audits import cmd_audit_context, cmd_models, cmd_probe
from orchestrator.commands.cli_folders import check_folder_name
from orchestrator.commands.cli_planning import cmd_cluster_check, cmd_estimate
from orchestrator.commands.cli_report import cmd_report
from orchestrator.commands.cli_sweeps import cmd_lm, cmd_resume, cmd_run, cmd_validate

EPILOG = f"""exit status, the same for every command:
  0    done
  {EXIT_FAILURE}    failed at run time (e.g. checkpoints that could not be probed; the results that were
       made are kept)
  {EXIT_BAD_INPUT}    bad input: a sweep file, table, checkpoint or flag that is refused before any work
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C): `iclmem resume DIR` (or `iclmem lm resume DIR`) continues it;
       a second Ctrl-C exits at once

Run and resume keep Ray's, Tune's and W&B's console messages in RUN_DIR/console.log (--verbose shows them)."""


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


def build_parser() -> argparse.ArgumentParser:
    formatter = _HelpFormatter
    p = argparse.ArgumentParser(prog="iclmem", description="Audit tabular foundation models for memorization of "
                                "their fine-tuning data.", epilog=EPILOG, formatter_class=formatter)
    p.add_argument("--version", action="version", version=f"iclmem {_version()}", help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True)
    wandb_modes = values(WandbMode)

    def parser(parent: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
               **kwargs: Any) -> argparse.ArgumentParser:
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

    from orchestrator.audits.audit import DEFAULT_BOOTSTRAP, DEFAULTS, min_bootstrap

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

    from orchestrator.audits.audit_kinds import AUDIT_KINDS, kind_names
    from orchestrator.schema.audit_defaults import (
        DEFAULT_BINS,
        DEFAULT_CONTEXT_SIZE,
        DEFAULT_NULL_SPLITS,
        DEFAULT_REFERENCES,
        FILE_CONTEXT_SIZE,
        FILE_REFERENCES,
        MAX_BINS,
        MIN_BINS,
    )

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
    # None: not given (each --attack has its defaults, and refuses a setting it does not read)
    ca.add_argument("--context-size", type=_positive, default=None,
                    help=f"rows in the deployed context (N), and in each reference context (default "
                         f"{DEFAULT_CONTEXT_SIZE}; --attack file: {FILE_CONTEXT_SIZE})")
    ca.add_argument("--references", type=_positive, default=None,
                    help=f"reference contexts K: even, at most 256 (default {DEFAULT_REFERENCES}; --attack file: "
                         f"{FILE_REFERENCES})")
    ca.add_argument("--null-splits", type=int, default=None,
                    help="null splits of the non-members per attack (their detections are false positives; default "
                         f"{DEFAULT_NULL_SPLITS}; --attack membership only)")
    ca.add_argument("--seed", type=int, default=0, help="seed of the split and of the reference contexts")
    ca.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP,
                    help=f"bootstrap resamples of the AUC intervals, at least {min_bootstrap()}")
    ca.add_argument("--out", type=_out_folder, required=True,
                    help="audit folder: new, empty, or an earlier run of the same audit")
    ca.add_argument("--wandb", choices=wandb_modes, default=None,
                    help="also log the audit as one W&B run (its table of metrics, verdict and ROC figure; no row of "
                         "the table): offline into OUT/wandb, or online with WANDB_API_KEY set (default: no W&B)")
    ca.add_argument("--wandb-project", default=None,
                    help="W&B project of the run --wandb logs (default iclmem); refused without --wandb")
    ca.add_argument("--attack", choices=kind_names(), default=AuditKind.MEMBERSHIP.value,
                    help="; ".join(f"{name}{' (default)' if name == AuditKind.MEMBERSHIP.value else ''}: "
                                   f"{AUDIT_KINDS.get(name).asks}" for name in kind_names()))
    ca.add_argument("--file-mode", default=None,
                    help="--attack file: how the package saves (tabicl: kv (default) or repr, saved without its "
                         "training data; tabpfn-v2: fit_preprocessors (default) or fit_with_cache)")
    ca.add_argument("--file-pca", action="store_true", default=None,
                    help="--attack file: fit and audit the file on Stage I's 16 whitened PCA components instead of "
                         "the table's own columns (the default; a table wider than the package's limit is refused)")
    ca.add_argument("--sensitive", default=None, metavar="COLUMN",
                    help="--attack attribute: the column the attacker infers (a column the model reads as itself; a "
                         "one-hot encoded text column by its name, every level's indicator set at once)")
    ca.add_argument("--bins", type=_positive, default=None,
                    help="--attack attribute: quantile bins of a numeric sensitive column with more values than this "
                         f"in the table, {MIN_BINS} to {MAX_BINS} (default {DEFAULT_BINS})")
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
    except OSError as exc:  # a full disk under a command that has no handler of its own: named, not a traceback
        if not is_disk_full(exc):
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        print(f"iclmem: error: the disk ran full{where} ({str(exc).strip()[:200]}); free some space and run the "
              "command again", file=sys.stderr)
        return DiskFull.exit_code
    except KeyboardInterrupt:  # a command without a sweep of its own (probe, report, validate, lm ...)
        print("iclmem: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def entry() -> None:
    """The console script (and ``python -m orchestrator.cli``): :func:`main`, then the process ends with its
    status. A process that used Ray ends without the interpreter's finalization: every result, the report, the
    W&B runs and Ray's shutdown are done and flushed by then, and the native threads Ray, torch and numba leave
    behind can crash finalization (a driver under ``ray job submit`` was seen to segfault after its last line,
    and the job was marked FAILED for a finished sweep). ``main`` itself returns, so in-process callers (the
    tests) are unaffected."""
    code = main()
    if "ray" in sys.modules:
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
