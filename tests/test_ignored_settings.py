"""#62, settings accepted and then ignored, or read as their opposite: each is refused by the real command before
any folder or cluster work, in one line naming the setting or flag (exit 2, no traceback), the user's files
byte-identical afterwards. In-process: no Ray, no training, no download."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_weak_inputs import BASE, _snapshot, refused

from trainables.models.extras import extra_is_installed


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _refused_before_any_folder(capsys, here: Path, text: str, *named: str) -> str:
    """The sweep file ``text`` refused by ``validate`` and by ``run``, each naming ``named``; no run folder, the
    sweep file untouched. The run's line."""
    sweep = here / "sweep.yaml"
    sweep.write_text(text)
    before = _snapshot(here)
    refused(capsys, ["validate", str(sweep)], str(sweep), *named)
    line = refused(capsys, ["run", str(sweep), "--out", str(here / "run")], str(sweep), *named)
    assert _snapshot(here) == before
    return line


def test_two_channels_or_report_slices_in_a_sweep_of_regime_context_alone_are_refused_naming_the_setting(capsys, here):
    context_only = BASE.replace("grid: {q: [30]}", "grid: {q: [30], regime: [context]}")
    _refused_before_any_folder(capsys, here, context_only + "probe: {two_channels: true}\n",
                               "probe.two_channels", "grid.regime is [context] alone", "fine-tuning regime")
    _refused_before_any_folder(capsys, here, context_only + "report: {slices: {top_k: 5, columns: [sepal_length]}}\n",
                               "report.slices.columns, report.slices.top_k", "no risk report is built")


def test_an_empty_weights_option_is_refused_naming_the_model_and_the_accepted_values(capsys, here):
    line = _refused_before_any_folder(capsys, here, BASE + "models:\n  - name: tabicl\n    options: {weights: }\n",
                                      "models.0", "model tabicl", "options.weights is empty")
    for accepted in ("hub (the default)", "mini", "random", "the path of a checkpoint file"):
        assert accepted in line, line


def test_a_quoted_false_allow_download_is_refused_not_read_as_true(capsys, here, monkeypatch):
    import trainables.models.tabicl_adapter as tabicl_adapter

    def no_download(*_args, **_kwargs):
        raise AssertionError("nothing may be downloaded or looked up in the Hugging Face cache")

    monkeypatch.setattr(tabicl_adapter, "hub_checkpoint", no_download)
    line = _refused_before_any_folder(capsys, here, BASE + "models:\n  - name: tabicl\n    options: {allow_download: "
                                      '"false"}\n', "models.0", "options.allow_download must be bool", "'false'")
    assert "quoted boolean" in line


@pytest.mark.skipif(not extra_is_installed("tabicl"), reason="the finetuner's keywords are read from the tabicl package")
@pytest.mark.parametrize("value", ["maybe", '"false"'])
def test_a_package_fine_tuner_option_of_the_wrong_type_is_refused_naming_it_and_its_type(capsys, here, value):
    _refused_before_any_folder(capsys, here, BASE + "models:\n  - name: tabicl\n    recipe: upstream\n    options: "
                               f"{{finetuner: {{early_stopping: {value}}}}}\n",
                               "options.finetuner.early_stopping must be bool",
                               "tabicl._finetune.FinetunedTabICLClassifier")


@pytest.mark.parametrize("wandb", [[], ["--wandb", "disabled"]])
def test_audit_context_refuses_a_wandb_project_without_wandb_before_any_folder(capsys, here, wandb):
    before = _snapshot(here)
    refused(capsys, ["audit-context", "iris", "--model", "pfn-mini", "--out", str(here / "audit"),
                     "--wandb-project", "foo", *wandb], "--wandb-project", "--wandb")
    assert _snapshot(here) == before
