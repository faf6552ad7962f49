"""The audit kinds of ``iclmem audit-context --attack`` are one registry (orchestrator/audits/audit_kinds.py): the command
line's choices, help, refusals and dispatch all come from it."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from iclmem.errors import ConfigError
from iclmem.vocab import AuditKind, values
from orchestrator.audits import audit_kinds
from orchestrator.audits.audit_kinds import (
    AUDIT_KINDS,
    OPTIONAL_SETTINGS,
    AuditKindSpec,
    audit_kind,
    kind_names,
    refuse_unread_settings,
)
from orchestrator.cli import build_parser, main


def _audit_context_action(name: str) -> argparse.Action:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in sub.choices["audit-context"]._actions if a.dest == name)


def test_every_audit_kind_of_the_vocabulary_is_registered_and_the_cli_offers_exactly_those():
    assert kind_names() == list(values(AuditKind))
    action = _audit_context_action("attack")
    assert list(action.choices) == kind_names()
    assert action.default == AuditKind.MEMBERSHIP.value
    for name in kind_names():  # each kind's help is its registration's
        assert AUDIT_KINDS.get(name).asks.split(",")[0] in " ".join(action.help.split())


def test_an_unknown_kind_is_a_config_error_naming_the_known_ones():
    with pytest.raises(ConfigError, match="unknown audit kind") as caught:
        audit_kind("membrship")
    for name in kind_names():
        assert name in str(caught.value)


@pytest.mark.parametrize("setting", sorted(OPTIONAL_SETTINGS))
def test_a_setting_is_refused_by_every_kind_that_does_not_read_it_and_accepted_by_those_that_do(setting):
    given = argparse.Namespace(**{name: "given" if name == setting else None for name in OPTIONAL_SETTINGS})
    readers = [name for name in kind_names() if setting in AUDIT_KINDS.get(name).reads]
    assert readers, f"{setting} is read by no kind: a flag nobody reads"
    for name in kind_names():
        spec = AUDIT_KINDS.get(name)
        if name in readers:
            refuse_unread_settings(spec, given)  # read: no refusal
            continue
        with pytest.raises(ConfigError) as caught:
            refuse_unread_settings(spec, given)
        message = str(caught.value)
        assert f"--attack {name}" in message
        assert "--" + setting.replace("_", "-") in message or setting == "estimator"  # the estimator's names both


def test_a_kind_that_names_an_undeclared_setting_is_refused_at_registration():
    spec = AuditKindSpec(AuditKind.LABEL, "x", frozenset({"no_such_flag"}), lambda _a, _p: [])
    with pytest.raises(ValueError, match="no_such_flag"):
        audit_kinds._register(spec)


def test_audit_context_runs_the_registered_kind_with_the_project_and_prints_its_lines(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake(args, project):
        seen.update(attack=args.attack, sensitive=args.sensitive, project=project)
        return ["line one of the fake audit", "line two"]

    registered = AUDIT_KINDS.get("attribute")
    monkeypatch.setitem(AUDIT_KINDS._items, "attribute", dataclasses.replace(registered, run=fake))
    out = tmp_path / "audit"
    assert main(["audit-context", "iris", "--model", "pfn-mini", "--attack", "attribute", "--sensitive", "petal",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    from orchestrator.schema.outputs import WandbConfig

    assert seen == {"attack": "attribute", "sensitive": "petal", "project": WandbConfig.model_fields["project"].default}
    assert "line one of the fake audit\nline two\n" in printed
    assert f"written to {out}" in printed
    # a setting the kind does not read is refused before its runner is called
    seen.clear()
    assert main(["audit-context", "iris", "--model", "pfn-mini", "--attack", "attribute", "--sensitive", "petal",
                 "--file-pca", "--out", str(out)]) == 2
    assert "--file-pca is a setting of --attack file; --attack attribute does not read it" in capsys.readouterr().err
    assert not seen


def test_a_sweeps_value_inference_setting_takes_exactly_the_value_inference_audit_kinds():
    """``probe.value_inference`` (a Literal in the schema) and ``--attack label|attribute`` are the same kinds:
    iclmem.vocab.VALUE_ATTACKS, each a registered audit kind run by the value-inference runner."""
    import typing

    from iclmem.vocab import VALUE_ATTACKS
    from orchestrator.schema.config import ProbeConfig

    (item,) = typing.get_args(ProbeConfig.model_fields["value_inference"].annotation)
    assert typing.get_args(item) == VALUE_ATTACKS
    runner = audit_kind(AuditKind.LABEL.value).run
    assert tuple(k.value for k in AuditKind if audit_kind(k.value).run is runner) == VALUE_ATTACKS
