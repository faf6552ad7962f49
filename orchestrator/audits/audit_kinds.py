"""The audit kinds of ``iclmem audit-context --attack``: one registry, each kind declared once with what it asks
of a deployed in-context learner (the ``--attack`` help), the settings it reads beyond the common ones, and how
it runs. The command line takes its choices, its help and its refusals from here, so a new kind touches its own
module (the audit), its registration below and its test.

The settings only some kinds read are listed in :data:`OPTIONAL_SETTINGS`, each with the refusal a kind that does
not read it answers with (before any work: a setting given and then ignored would be a silent wrong result)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from iclmem.errors import ConfigError, UnknownNameError
from iclmem.registry import Registry
from iclmem.runfolder import INFERENCE_FILE, SAVED_FILE_TABLE
from iclmem.vocab import AuditKind, values
from orchestrator.schema.audit_defaults import (
    DEFAULT_BINS,
    DEFAULT_CONTEXT_SIZE,
    DEFAULT_NULL_SPLITS,
    DEFAULT_REFERENCES,
    FILE_CONTEXT_SIZE,
    FILE_REFERENCES,
)

__all__ = ["AUDIT_KINDS", "OPTIONAL_SETTINGS", "AuditKindSpec", "audit_kind", "kind_names", "refuse_unread_settings"]

# (args, the W&B project) -> the lines the command prints once the audit folder is written
AuditRunner = Callable[[argparse.Namespace, str], list[str]]


@dataclass(frozen=True)
class AuditKindSpec:
    """One audit kind: its name, what it asks (the ``--attack`` help), which of :data:`OPTIONAL_SETTINGS` it
    reads, and its runner (arguments as parsed, the W&B project -> the lines to print)."""

    kind: AuditKind
    asks: str
    reads: frozenset[str]
    run: AuditRunner


# argument name -> the refusal of a kind that does not read it ({attack}: the kind given, {readers}: those that
# read it); a kind's reads name these keys
OPTIONAL_SETTINGS: dict[str, str] = {
    "estimator": "--attack {attack} audits --model tabicl or tabpfn-v2's saved file: --estimator and --sensitive "
                 "are not its settings",
    "null_splits": "--null-splits with --attack {attack}: the value-inference and saved-file audits read the "
                   "never-in-context control, not null splits",
    "sensitive": "--sensitive is the column of --attack attribute, one of the settings of --attack {readers} only; "
                 "--attack {attack} does not read it",
    "bins": "--bins is one of the settings of --attack {readers} only; --attack {attack} does not read it",
    "file_mode": "--file-mode is a setting of --attack {readers}; --attack {attack} does not read it",
    "file_pca": "--file-pca is a setting of --attack {readers}; --attack {attack} does not read it",
}

AUDIT_KINDS: Registry[AuditKindSpec] = Registry("audit kind (--attack)")


def _register(spec: AuditKindSpec) -> None:
    unknown = spec.reads - OPTIONAL_SETTINGS.keys()
    if unknown:  # a kind that names a setting nobody declared would never be refused or read
        raise ValueError(f"audit kind {spec.kind}: reads {sorted(unknown)}, not among {sorted(OPTIONAL_SETTINGS)}")
    AUDIT_KINDS.register(spec.kind.value, spec)


def audit_kind(name: str) -> AuditKindSpec:
    """The registered kind ``name``; an unknown one is a :class:`ConfigError` naming the known ones."""
    try:
        return AUDIT_KINDS.get(str(name))
    except UnknownNameError as exc:
        raise ConfigError(f"--attack: {exc}") from None


def kind_names() -> list[str]:
    """The registered kinds in the vocabulary's order (membership, the default, first)."""
    return [name for name in values(AuditKind) if name in AUDIT_KINDS]


def refuse_unread_settings(spec: AuditKindSpec, args: argparse.Namespace) -> None:
    """A setting given (not None) that ``spec`` does not read is refused, naming it and the kinds that do."""
    for name, refusal in OPTIONAL_SETTINGS.items():
        if getattr(args, name, None) is not None and name not in spec.reads:
            readers = " or ".join(k for k in kind_names() if name in AUDIT_KINDS.get(k).reads)
            raise ConfigError(refusal.format(attack=spec.kind.value, readers=readers))


# --------------------------------------------------------------------------------------------- the kinds
def _membership(args: argparse.Namespace, project: str) -> list[str]:
    from orchestrator.audits.context_audit import audit_context, summary_lines

    result = audit_context(args.task, out=args.out, model=args.model, estimator=args.estimator,
                           context_size=args.context_size or DEFAULT_CONTEXT_SIZE,
                           references=args.references or DEFAULT_REFERENCES, seed=args.seed,
                           bootstrap=args.bootstrap,
                           null_splits=DEFAULT_NULL_SPLITS if args.null_splits is None else args.null_splits,
                           wandb=args.wandb, project=project)
    return summary_lines(result)


def _value_inference(args: argparse.Namespace, project: str) -> list[str]:
    from orchestrator.audits import inference_audit

    found = inference_audit.audit_inference(
        args.task, args.attack, out=args.out, model=args.model, estimator=args.estimator,
        sensitive=args.sensitive, bins=DEFAULT_BINS if args.bins is None else args.bins,
        context_size=args.context_size or DEFAULT_CONTEXT_SIZE, references=args.references or DEFAULT_REFERENCES,
        seed=args.seed, bootstrap=args.bootstrap)
    if args.wandb not in (None, "disabled"):
        inference_audit.log_value_audit_to_wandb(Path(args.out), INFERENCE_FILE, args.wandb, project)
    return inference_audit.summary_lines(found, args.attack)


def _saved_file(args: argparse.Namespace, project: str) -> list[str]:
    from orchestrator.audits import inference_audit

    verdict = inference_audit.audit_file(
        args.task, out=args.out, model=args.model, mode=args.file_mode,
        context_size=args.context_size or FILE_CONTEXT_SIZE,
        references=args.references or FILE_REFERENCES, seed=args.seed, bootstrap=args.bootstrap,
        pca=bool(args.file_pca))
    if args.wandb not in (None, "disabled"):
        inference_audit.log_value_audit_to_wandb(Path(args.out), SAVED_FILE_TABLE, args.wandb, project)
    return inference_audit.saved_file_lines(verdict)


for _spec in (
    AuditKindSpec(AuditKind.MEMBERSHIP, "was the row in the context", frozenset({"estimator", "null_splits"}),
                  _membership),
    AuditKindSpec(AuditKind.LABEL, "does the deployed model give away the label of a row it holds, beyond the same "
                  "model without the row", frozenset({"estimator"}), _value_inference),
    AuditKindSpec(AuditKind.ATTRIBUTE, "does it give away --sensitive COLUMN of a row whose label and other columns "
                  "are known, beyond imputation from rows outside the audit",
                  frozenset({"estimator", "sensitive", "bins"}), _value_inference),
    AuditKindSpec(AuditKind.FILE, "--model tabicl or tabpfn-v2, its package classifier on the shipped mini fitted, "
                  "saved the package's way and audited as a file (its bytes, its cache matched and inverted, "
                  "membership through it)", frozenset({"file_mode", "file_pca"}), _saved_file),
):
    _register(_spec)
