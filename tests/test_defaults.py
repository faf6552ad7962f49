"""Every default declared once: the sweep schema (orchestrator/schema/config.py) reads its defaults from the settings
classes of the layers below (FinetuneSpec, PrepSettings, ProbeSettings, CanarySettings), and builds those
settings in one place each. A default sweep must build each settings class at exactly its own defaults, and
every setting the schema carries into one must reach it (a value the schema accepted and the builder dropped
would run at the default: accepted and ignored)."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.schema.config import parse_sweep
from orchestrator.schema.config_base import settings_default
from probes.outcomes import OutcomeThresholds
from probes.settings import ProbeSettings
from trainables.canaries import CanarySettings
from trainables.data.task import PrepSettings
from trainables.spec import FinetuneSpec

MINIMAL = {"name": "defaults", "tasks": [{"name": "iris"}]}


def _sweep(**blocks):
    return parse_sweep({**MINIMAL, **blocks}, "<test>")


def test_a_default_sweep_builds_stage_i_probe_and_schedule_settings_at_their_own_defaults():
    sweep = _sweep()
    assert sweep.data.prep_settings() == PrepSettings()
    assert sweep.probe_settings(n_checkpoints=1) == ProbeSettings()
    assert sweep.probe_settings().n_checkpoints == len(FinetuneSpec().schedule())
    assert sweep.training.schedule() == FinetuneSpec().schedule()
    spec_defaults = {f.name: getattr(FinetuneSpec(), f.name) for f in dataclasses.fields(FinetuneSpec)}
    training = sweep.training
    for name in ("epochs", "every_epoch", "grad_clip", "weight_decay"):
        assert getattr(training, name) == spec_defaults[name], name
    assert tuple(training.checkpoint_epochs) == spec_defaults["checkpoint_epochs"]
    canaries = _sweep(canaries={"kinds": ["outlier"]}).canaries
    assert CanarySettings.from_value(canaries.settings()) == CanarySettings(kinds=tuple(canaries.kinds))
    assert sweep.canaries.beta == ProbeSettings().canary_beta


@pytest.mark.parametrize(("block", "key", "value", "read"), [
    ("data", "context_size", 64, lambda s: s.data.prep_settings().context_size),
    ("data", "regression_bins", 7, lambda s: s.data.prep_settings().regression_bins),
    ("data", "max_features", 9, lambda s: s.data.prep_settings().max_features),
    ("data", "label_design", "unmatched", lambda s: s.data.prep_settings().label_design.value),
    ("probe", "bootstrap", 321, lambda s: s.probe_settings().n_resamples),
    ("probe", "null_splits", 3, lambda s: s.probe_settings().null_splits),
    ("canaries", "beta", 0.1, lambda s: s.probe_settings().canary_beta),
    ("training", "epochs", 7, lambda s: s.training.schedule()[-1]),
    ("training", "every_epoch", True, lambda s: len(s.training.schedule()) == s.training.epochs),
    ("outcome", "memorization_auc", 0.61, lambda s: s.probe_settings().thresholds.memorization_auc),
])
def test_each_setting_the_schema_carries_into_a_settings_class_reaches_it(block, key, value, read):
    sweep = _sweep(**{block: {key: value}})
    assert read(sweep) == (True if key == "every_epoch" else value)
    assert read(_sweep()) != read(sweep)  # the default differs, so the check could fail


def test_settings_default_reads_plain_and_factory_defaults_and_the_schema_uses_it():
    assert settings_default(PrepSettings, "context_size") == PrepSettings().context_size
    assert settings_default(ProbeSettings, "thresholds") == OutcomeThresholds()
    with pytest.raises(KeyError):
        settings_default(PrepSettings, "no_such_setting")


def test_the_audits_defaults_are_declared_once_and_every_reader_has_them():
    """K reference contexts, the context size, the null splits, the attribute bins and the saved-file audit's
    sizes are orchestrator/schema/audit_defaults.py's: the sweep schema's regime-context settings, each audit's own
    signature and the command line's help all give those values."""
    import inspect

    from orchestrator.audits.context_audit import audit_context
    from orchestrator.audits.inference_audit import audit_file, audit_inference
    from orchestrator.schema import audit_defaults as kinds
    from orchestrator.schema.config import ProbeConfig
    from orchestrator.schema.outputs import WandbConfig

    def defaults(function):
        return {name: p.default for name, p in inspect.signature(function).parameters.items()}

    assert ProbeConfig().context_references == kinds.DEFAULT_REFERENCES
    assert ProbeConfig().sensitive_bins == kinds.DEFAULT_BINS
    expected = {"context_size": kinds.DEFAULT_CONTEXT_SIZE, "references": kinds.DEFAULT_REFERENCES}
    assert {k: defaults(audit_context)[k] for k in expected} == expected
    assert defaults(audit_context)["null_splits"] == kinds.DEFAULT_NULL_SPLITS
    assert {k: defaults(audit_inference)[k] for k in expected} == expected
    assert defaults(audit_inference)["bins"] == kinds.DEFAULT_BINS
    assert (defaults(audit_file)["context_size"], defaults(audit_file)["references"]) == (
        kinds.FILE_CONTEXT_SIZE, kinds.FILE_REFERENCES)
    # no audit spells the W&B project again: a context audit without one logs to the schema's default
    assert defaults(audit_context)["project"] is None
    assert WandbConfig().project == WandbConfig.model_fields["project"].default


def test_the_audit_context_help_states_the_declared_defaults(capsys):
    from orchestrator.cli import main
    from orchestrator.schema import audit_defaults as kinds

    with pytest.raises(SystemExit):
        main(["audit-context", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default {kinds.DEFAULT_CONTEXT_SIZE}; --attack file: {kinds.FILE_CONTEXT_SIZE})" in text
    assert f"(default {kinds.DEFAULT_REFERENCES}; --attack file: {kinds.FILE_REFERENCES})" in text
    assert f"default {kinds.DEFAULT_NULL_SPLITS}; --attack membership only" in text
    assert f"(default {kinds.DEFAULT_BINS})" in text


def test_the_lm_schemas_defaults_are_the_lm_probes_own():
    """The LM sweep's ``ner:`` block builds :class:`probes.lm.settings.NerSettings` and reads every default from it,
    and the exposure probe's batch size and leading space are the exposure function's: a literal written again
    in the schema that drifts from the probe's turns this red."""
    import inspect

    from orchestrator.schema.lm_config import LMSweepConfig, NerConfig
    from probes.lm.exposure import compute_exposure
    from probes.lm.settings import NerSettings

    assert NerConfig().settings() == NerSettings()
    for name, field in NerConfig.model_fields.items():
        default = field.get_default(call_default_factory=True)
        settings_value = getattr(NerSettings(), name)
        assert (tuple(v.value for v in default) if name == "variants" else default) == settings_value, name
    exposure = {n: p.default for n, p in inspect.signature(compute_exposure).parameters.items()}
    assert LMSweepConfig.model_fields["batch_size"].default == exposure["batch_size"]
    assert LMSweepConfig.model_fields["leading_space"].default == exposure["leading_space"]
