"""``iclmem audit-context --attack label|attribute`` (#48) through the command: a model that holds its rows gives
away their labels and a sensitive column beyond the same model without the row and beyond imputation, on every
seed, and its never-in-context control is clean; a model that keeps nothing of any row gives nothing away; pfn-mini
gives away the labels of the rows in its context. Bad settings are refused before any work, naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from iclmem.runfolder import INFERENCE_FILE, VERDICT_FILE

SEEDS = range(5)


def _table(folder, seed: int) -> str:
    """A table whose label and column ``secret`` (4 values) are independent of everything else: only a model that
    holds a row can tell them; imputation and generalisation get chance."""
    rng = np.random.default_rng(seed)
    n = 300
    frame = pd.DataFrame(rng.normal(size=(n, 5)), columns=[f"f{i}" for i in range(5)])
    frame["secret"] = rng.integers(0, 4, n)
    frame["label"] = rng.integers(0, 3, n)
    path = folder / f"table{seed}.csv"
    frame.to_csv(path, index=False)
    return f"{path}:label"


def _audit(folder, task: str, *args: str) -> dict:
    from orchestrator.cli import main

    out = folder / f"audit-{abs(hash((task, args))) % 10**8}"
    assert main(["audit-context", task, *args, "--context-size", "60", "--references", "8", "--bootstrap", "200",
                 "--out", str(out)]) == 0
    verdict = json.loads((out / VERDICT_FILE).read_text())
    verdict["table"] = pd.read_parquet(out / INFERENCE_FILE)
    return verdict


def _value(verdict: dict, key: str) -> float:
    return float(verdict["headline"][key]["value"])


def test_a_model_that_holds_its_rows_gives_away_their_labels_on_every_seed_and_its_control_is_clean(tmp_path):
    for seed in SEEDS:
        v = _audit(tmp_path, _table(tmp_path, seed), "--estimator", "tests.audit_estimators:nearest_rows",
                   "--attack", "label", "--seed", str(seed))
        assert v["found"], seed
        assert v["trusted"], seed
        # measured on seed 0: members' accuracy gain 0.63, non-members' 0.18 (3 neighbours: a near row helps them)
        assert _value(v, "deployed/label/members/accuracy_gain") > 0.4
        assert abs(_value(v, "never_in_context/label/members_minus_nonmembers/accuracy_gain")) < 0.3
        assert set(v["table"]["target"]) == {"deployed", "never_in_context"}


def test_a_model_that_holds_its_rows_gives_away_a_sensitive_column_beyond_imputation(tmp_path):
    for seed in SEEDS:
        v = _audit(tmp_path, _table(tmp_path, seed), "--estimator", "tests.audit_estimators:nearest_rows",
                   "--attack", "attribute", "--sensitive", "secret", "--seed", str(seed))
        assert v["found"], seed
        assert v["trusted"], seed
        # measured on seed 0: members' gain over imputation 0.65 (interval low 0.53), non-members' 0.04
        assert _value(v, "deployed/attribute_model/members/gain") > 0.35
        table = v["table"]
        assert table.loc[table["statistic"] == "imputation_accuracy", "value"].between(0.05, 0.5).all()


def test_rows_whose_sensitive_cell_is_missing_in_the_table_are_left_out_of_the_scoring_and_the_baseline(tmp_path,
                                                                                                        capsys):
    """A quarter of the ``secret`` cells empty: Stage I fills them in (the column's median, its missing-value
    indicator beside it), so the feature there is no value the row has. Those audited rows are left out of every
    statistic and said; the imputation baseline is fitted on the rows outside the audit that have a value."""
    import re

    path = _table(tmp_path, 0).rsplit(":", 1)[0]
    frame = pd.read_csv(path)
    empty = np.random.default_rng(1).random(len(frame)) < 0.25
    frame.loc[empty, "secret"] = np.nan
    frame.to_csv(path, index=False)
    verdict = _audit(tmp_path, f"{path}:label", "--estimator", "tests.audit_estimators:nearest_rows", "--attack",
                     "attribute", "--sensitive", "secret")
    captured = capsys.readouterr()
    out = captured.out + captured.err  # the notes go to stderr
    left_out = re.search(r"(\d+) of the 120 audited rows have no value in 'secret'", out)
    assert left_out, out
    n_left_out = int(left_out.group(1))
    assert 0 < n_left_out < 60
    fitted = int(re.search(r"imputation fitted on (\d+) rows", out).group(1))
    assert fitted == (len(frame) - 120) - (int(empty.sum()) - n_left_out)  # the rows outside with a value
    table = verdict["table"]
    scored = table[(table["statistic"] == "gain") & table["group"].isin(["members", "nonmembers"])]
    for _, rows in scored.groupby(["target", "attack"]):
        assert int(rows["n_rows"].sum()) == 120 - n_left_out
    assert verdict["found"]  # the rows with a value still give theirs away


def _categorical_table(folder, seed: int) -> str:
    """:func:`_table` with the secret a text column of 4 levels (one-hot encoded by Stage I into 4 indicators)."""
    frame = pd.read_csv(_table(folder, seed).rsplit(":", 1)[0])
    frame["secret"] = frame["secret"].map(lambda v: f"level-{v}")
    path = folder / f"categorical{seed}.csv"
    frame.to_csv(path, index=False)
    return f"{path}:label"


def test_a_categorical_sensitive_column_is_inferred_as_the_column_every_indicator_set_at_once(tmp_path, capsys):
    """``--sensitive secret`` of a one-hot encoded text column: the attacker sets all 4 indicators to each level in
    turn (never knowing any of them), the imputer sees none of them. A model that holds its rows gives the level away
    on every seed, the class prior never; one level's indicator alone is refused, naming the column to give."""
    from orchestrator.cli import main

    for seed in SEEDS:
        task = _categorical_table(tmp_path, seed)
        held = _audit(tmp_path, task, "--estimator", "tests.audit_estimators:nearest_rows", "--attack", "attribute",
                      "--sensitive", "secret", "--seed", str(seed))
        assert held["found"], seed
        assert held["trusted"], seed
        # measured on seeds 0-4: members' gain 0.64-0.68 (interval low 0.50-0.55); the class prior's -0.03-0.02
        assert _value(held, "deployed/attribute_model/members/gain") > 0.35, seed
        prior = _audit(tmp_path, task, "--estimator", "tests.audit_estimators:class_prior", "--attack", "attribute",
                       "--sensitive", "secret", "--seed", str(seed))
        assert not prior["found"], seed
    out = tmp_path / "one-level"
    assert main(["audit-context", task, "--estimator", "tests.audit_estimators:nearest_rows", "--attack", "attribute",
                 "--sensitive", "secret = level-0", "--context-size", "60", "--references", "8", "--out", str(out)]) == 2
    assert "one level of the one-hot encoded column 'secret'" in capsys.readouterr().err
    assert not out.exists()


def test_a_model_that_keeps_nothing_of_any_row_gives_nothing_away(tmp_path):
    """The class-prior classifier predicts the context's label counts for every row: the control of the model side."""
    found = []
    for seed in SEEDS:
        task = _table(tmp_path, seed)
        for attack in (("--attack", "label"), ("--attack", "attribute", "--sensitive", "secret")):
            v = _audit(tmp_path, task, "--estimator", "tests.audit_estimators:class_prior", *attack, "--seed", str(seed))
            found.append(v["found"])
    assert not any(found)


def test_pfn_mini_gives_away_the_labels_of_the_rows_in_its_context(tmp_path):
    """Measured on three seeds of this table (benchmarks/RESULTS.md, "Label and attribute inference"): members'
    accuracy gain 0.44-0.55, its difference to the non-members' 0.35-0.56, found and trusted on each; the sensitive
    column 1 of 3."""
    v = _audit(tmp_path, _table(tmp_path, 1), "--model", "pfn-mini", "--attack", "label", "--seed", "1")
    assert v["found"]
    assert v["trusted"]
    assert _value(v, "deployed/label/members_minus_nonmembers/accuracy_gain") > 0.25


def test_a_sensitive_column_with_values_only_outside_the_audited_rows_is_attacked_over_the_tables_values(tmp_path):
    """A number column of at most --bins values in the table, some of them only among the rows outside the audit
    (the imputation pool): its candidates are the table's values, so the baseline is fitted and the audit runs,
    where it used to end with "imputation pool values ... are not among the candidates"."""
    rng = np.random.default_rng(0)
    n = 300
    frame = pd.DataFrame(rng.normal(size=(n, 3)), columns=["f0", "f1", "f2"])
    frame["age"] = rng.integers(20, 80, n)  # 60 values: the 120 audited rows hold fewer of them than the table
    frame["label"] = rng.integers(0, 3, n)
    path = tmp_path / "ages.csv"
    frame.to_csv(path, index=False)
    verdict = _audit(tmp_path, f"{path}:label", "--estimator", "tests.audit_estimators:nearest_rows", "--attack",
                     "attribute", "--sensitive", "age", "--bins", "64")
    assert verdict["table"]["value"].notna().any()


def test_value_inference_settings_are_refused_before_any_work_naming_the_flag(tmp_path, capsys):
    from orchestrator.cli import main

    task = _table(tmp_path, 0)
    cases = [
        (["--estimator", "tests.audit_estimators:class_prior", "--attack", "attribute"], "needs --sensitive"),
        (["--estimator", "tests.audit_estimators:class_prior", "--attack", "label", "--sensitive", "secret"],
         "--sensitive is the column of --attack attribute"),
        (["--estimator", "tests.audit_estimators:class_prior", "--attack", "attribute", "--sensitive", "nope"],
         "reads no column of that name"),
        (["--estimator", "tests.audit_estimators:class_prior", "--sensitive", "secret"],
         "settings of --attack attribute"),
        (["--estimator", "tests.audit_estimators:class_prior", "--attack", "attribute", "--sensitive", "secret",
          "--bins", "200"], "--bins 200: from 2 to 64"),
    ]
    for i, (args, words) in enumerate(cases):
        out = tmp_path / f"refused{i}"
        assert main(["audit-context", task, *args, "--context-size", "60", "--references", "8", "--out", str(out)]) != 0
        assert words in capsys.readouterr().err
        assert not out.exists()
    out = tmp_path / "pca"
    assert main(["audit-context", "digits", "--model", "pfn-mini", "--attack", "attribute", "--sensitive", "pixel_0_3",
                 "--context-size", "60", "--references", "8", "--out", str(out)]) != 0
    assert "PCA components of the whole row" in capsys.readouterr().err
    assert not out.exists()


def test_a_value_audit_logs_its_rates_and_verdict_to_wandb_offline_and_no_row_value(tmp_path):
    """``--wandb offline``: one W&B run in the folder, its summary the verdict (found, trusted, the headline gains),
    its table the rates; a table whose every cell is distinct (the noise table) has none of its cells in it."""
    from synthetic_run_dir import read_wandb_records, wandb_summary

    from orchestrator.cli import main

    task = _table(tmp_path, 0)
    out = tmp_path / "logged"
    assert main(["audit-context", task, "--estimator", "tests.audit_estimators:nearest_rows", "--attack", "label",
                 "--context-size", "60", "--references", "8", "--bootstrap", "200", "--wandb", "offline",
                 "--out", str(out)]) == 0
    (log,) = list((out / "wandb").rglob("*.wandb"))
    summary = wandb_summary(read_wandb_records(log))
    assert summary["verdict/found"] is True
    assert summary["verdict/trusted"] is True
    assert summary["verdict/headline/deployed/label/members/accuracy_gain/value"] > 0.4
    assert "value_audit" in summary
    # the cells as the file spells them (e.g. "0.12573022319325043"), first 10 characters
    lines = Path(task.rsplit(":", 1)[0]).read_text().splitlines()[1:]
    cells = [c[:10] for line in lines for c in line.split(",")[:2] if len(c) >= 10]
    text = b"".join(p.read_bytes() for p in (out / "wandb").rglob("*") if p.is_file())
    assert len(cells) > 500
    assert not [c for c in cells if c.encode() in text]


def test_a_setting_given_at_its_default_value_is_read_or_refused_never_swapped(tmp_path, capsys, monkeypatch):
    """--context-size 256 given with --attack file reaches the audit as 256 (the file audit's own default is 40),
    and --null-splits 5 / --bins 4, the values other attacks default to, are refused where they are not read."""
    from orchestrator.audits import inference_audit
    from orchestrator.cli import main

    seen = {}

    def audit_file(task, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)  # the wiring only: no fit

    monkeypatch.setattr(inference_audit, "audit_file", audit_file)
    with pytest.raises(SystemExit):
        main(["audit-context", "breast_cancer", "--model", "tabicl", "--attack", "file", "--context-size", "256",
              "--references", "64", "--out", str(tmp_path / "f")])
    assert (seen["context_size"], seen["references"]) == (256, 64)
    task = _table(tmp_path, 0)
    for args, words in ((["--attack", "label", "--null-splits", "5"], "--null-splits with --attack label"),
                        (["--attack", "label", "--bins", "4"], "--bins is one of the settings of --attack attribute"),
                        (["--bins", "4"], "--attack membership does not read it")):
        out = tmp_path / "refused"
        assert main(["audit-context", task, "--estimator", "tests.audit_estimators:class_prior", *args,
                     "--out", str(out)]) != 0
        assert words in capsys.readouterr().err
        assert not out.exists()
