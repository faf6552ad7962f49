"""``iclmem models``, ``probe`` and ``audit-context``: the commands that audit one model outside a sweep (a
fine-tuned checkpoint or a deployed classifier against its base, a fitted estimator's context), and the
registered models they can audit."""

from __future__ import annotations

import argparse
import json

from iclmem.errors import ConfigError


def cmd_models(args: argparse.Namespace) -> int:
    from trainables.models import MODELS
    from trainables.models.checkpoints import DEFAULT_WEIGHTS
    from trainables.models.extras import extra_status

    for name in MODELS.names():
        default = DEFAULT_WEIGHTS.get(name)
        weights = weights_lines(name)
        print(f"{name}\n  package:  {extra_status(name)}\n  default:  weights: {default.weights} -> {default.source}"
              f"\n  weights:  {weights[0]}" + "".join(f"\n            {line}" for line in weights[1:])
              + f"\n  licence:  {default.licence}")
    return 0


def weights_lines(name: str) -> list[str]:
    """Every set of weights of model ``name`` this listing knows, one line each, and whether it is on this
    machine (nothing is downloaded to find out): the default (the hub checkpoint, or pfn-mini's shipped file),
    then the shipped mini of the package's own architecture where there is one, with the option that runs it."""
    from trainables.models.checkpoints import DEFAULT_WEIGHTS, MINI, MINI_CHECKPOINTS, is_available, mini_checkpoint
    from trainables.models.extras import extra_is_installed

    default = DEFAULT_WEIGHTS.get(name)
    here = "on this machine" if is_available(name) else "NOT on this machine (see README, 'Real models')"
    lines = [f"{default.weights} (the default): {here}"]
    if name in MINI_CHECKPOINTS:
        try:
            mini_checkpoint(name)
        except Exception:  # CheckpointError: the shipped file is missing (a partial install)
            lines.append(f"{MINI} (shipped with iclmem, {name}'s own architecture made small): NOT on this machine "
                         f"(missing from trainables/models/weights/; reinstall iclmem)")
        else:
            ready = (f"run it with models: [{{name: {name}, options: {{weights: {MINI}}}}}]" if extra_is_installed(name)
                     else "its package is missing (see 'package' above)")
            lines.append(f"{MINI} (shipped with iclmem, {name}'s own architecture made small): on this machine; "
                         f"{ready}")
    return lines


def cmd_probe(args: argparse.Namespace) -> int:
    from orchestrator.audits.audit import audit_checkpoint, audit_estimator

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
    """``iclmem audit-context``: the kind named by ``--attack`` (orchestrator/audits/audit_kinds.py), its settings checked
    before any work, then run; its lines printed and where its folder is."""
    from orchestrator.audits.audit_kinds import audit_kind, refuse_unread_settings
    from orchestrator.schema.outputs import WandbConfig

    spec = audit_kind(args.attack)
    refuse_unread_settings(spec, args)
    if args.wandb_project is not None and args.wandb in (None, "disabled"):
        raise ConfigError(f"--wandb-project {args.wandb_project!r} names the W&B project of the run --wandb logs, but "
                          f"{'--wandb is disabled' if args.wandb else 'no --wandb is given'}, so no run is logged: add "
                          "--wandb offline (or online), or drop --wandb-project")
    # the sweep's default project (wandb.project), declared once in the schema
    project = args.wandb_project if args.wandb_project is not None else WandbConfig.model_fields["project"].default
    print("\n".join(spec.run(args, project)))
    print(f"written to {args.out}")
    return 0
