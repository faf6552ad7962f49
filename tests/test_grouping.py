"""Every grouping of results rows is named once, in iclmem/record.py: no module of orchestrator/ or probes/ spells
out a tuple or list of two or more identity / grid columns (a run's key, a configuration, a figure's lines, a
table's order); each imports the name (``RUN_KEY``, ``CHECKPOINT_ID``, ``CONFIGURATION_KEY``, ...) instead.

A literal counts when all its elements are strings and at least two different ones are identity columns,
grid axes or ``epoch``. Left alone: the LM probe sweep's own table (its ``model`` and ``seed`` are not the
tabular grid's), and the literals below that list what a table shows or a file holds rather than how rows
are grouped, each with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

from iclmem import record

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("orchestrator", "probes")
GROUPED = frozenset((*record.IDENTITY_COLUMNS, *record.GRID_AXES, "epoch"))

# (file, where: the name a module-level literal is assigned to, else the function it is in, its identity / grid
# columns in order) -> why it is not a grouping. A literal that gains or loses one of those columns is matched
# no more and must be named in iclmem/record.py or justified here again.
NOT_GROUPINGS: dict[tuple[str, str, tuple[str, ...]], str] = {
    ("orchestrator/runfolder/run_folder.py", "REQUIRED_RESULT_COLUMNS", ("run_id", "task", "epoch")):
        "a run-folder file's schema: the columns results.parquet must have to be read",
    ("orchestrator/runfolder/run_folder.py", "SPLIT_COLUMNS", ("task", "label_mode", "seed", "q")):
        "a run-folder file's schema: the public columns of split_report.parquet",
    ("orchestrator/runfolder/run_folder.py", "MANIPULATION_COLUMNS", ("run_id", "task", "epoch")):
        "a run-folder file's schema: manipulation_auc.parquet's columns",
    ("orchestrator/runfolder/run_folder.py", "CONTEXT_AUDITS_COLUMNS", ("run_id", "task", "model", "q", "seed")):
        "a run-folder file's schema: context_audits.parquet's columns",
    ("orchestrator/runfolder/run_folder.py", "roc_files", ("run_id", "epoch")):
        "the columns of the ROC file listing the reader builds (run, epoch, path), not a grouping",
    ("orchestrator/report/record_risk.py", "_riskiest", ("task", "run_id", "epoch")):
        "the riskiest-records table's columns, in the order it shows them",
    ("orchestrator/report/risk.py", "risk_section_html", ("task", "run_id")):
        "the flagged-slices table's columns, in the order it shows them",
    ("orchestrator/report/html.py", "RUN_TABLE_LEAD", ("run_id", "epoch")):
        "the run table's leading columns, in the order it shows them",
    ("orchestrator/report/leaked.py", "LEAKED_COLUMNS",
     ("run_id", "task", "model", "q", "lr", "label_mode", "seed", "epoch")):
        "the leaked-runs table's columns, in the order it shows them",
    ("orchestrator/report/leaked.py", "_where", ("task", "model")):
        "what a leaked run's line names beside its id (a run id does not name its model)",
    ("orchestrator/report/paper_tables.py", "peak_vulnerability_per_task", ("lr", "q", "epoch", "run_id")):
        "the columns of the best run copied into a task's summary row, beside its metrics",
    ("orchestrator/report/epsilon.py", "epsilon_section_html", ("task", "label_mode", "lr", "dp_target_epsilon")):
        "the ε table's columns shown even when empty (the others only when some run has a value)",
    ("orchestrator/report/figures.py", "build_auc_over_epochs", ("task", "q")):
        "the figure's two panel layouts its `panel` argument may name",
}


def _lm_only_columns() -> frozenset[str]:
    """The LM probe sweep's columns the tabular grid does not have (orchestrator.driver.lm_sweep.RESULT_COLUMNS, read
    from the source: importing the LM sweep would start more than this test needs)."""
    tree = ast.parse((REPO / "orchestrator" / "driver" / "lm_sweep.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "RESULT_COLUMNS" for t in targets):
                return frozenset(ast.literal_eval(node.value)) - GROUPED
    raise AssertionError("orchestrator/driver/lm_sweep.py no longer declares RESULT_COLUMNS")


def _string_literal(node: ast.AST) -> tuple[str, ...] | None:
    if isinstance(node, ast.Tuple | ast.List) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return tuple(str(e.value) for e in node.elts)
    return None


def _where(path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, where, strings) of every all-string tuple or list literal in ``path``."""
    found: list[tuple[int, str, tuple[str, ...]]] = []

    def visit(node: ast.AST, scope: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            scope = node.name
        elif isinstance(node, ast.Assign | ast.AnnAssign) and scope == "<module>":
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if names and node.value is not None:
                visit(node.value, names[0])
                return
        strings = _string_literal(node)
        if strings is not None:
            found.append((getattr(node, "lineno", 0), scope, strings))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(ast.parse(path.read_text(), str(path)), "<module>")
    return found


def _literal_groupings() -> tuple[list[str], set[tuple[str, str, tuple[str, ...]]]]:
    lm_only = _lm_only_columns()
    offenders, excused = [], set()
    for sub in SCANNED:
        for path in sorted((REPO / sub).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for line, scope, strings in _where(path):
                named = tuple(dict.fromkeys(s for s in strings if s in GROUPED))
                if len(named) < 2 or lm_only.intersection(strings):
                    continue
                if (rel, scope, named) in NOT_GROUPINGS:
                    excused.add((rel, scope, named))
                else:
                    offenders.append(f"{rel}:{line} ({scope}): {list(strings)}")
    return offenders, excused


def test_no_grouping_of_identity_or_grid_columns_is_spelled_out_outside_the_record():
    offenders, excused = _literal_groupings()
    assert offenders == [], ("name these groupings in iclmem/record.py and import them (or, for a list of what "
                             "a table shows, justify it in tests/test_grouping.py NOT_GROUPINGS):\n  "
                             + "\n  ".join(offenders))
    # an exception whose literal is gone is dropped, so that it cannot excuse a new one later
    assert set(NOT_GROUPINGS) - excused == set()


def test_the_scan_finds_a_grouping_and_lets_an_lm_table_and_a_column_header_pair_be(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('KEY = ("task", "model", "recipe")\n'
                      'def f(df):\n    return df.groupby(["run_id", "epoch", "attack"]), [("task", "task")]\n'
                      'LM = ("model", "dataset", "seed")\n')
    lm_only = _lm_only_columns()
    hits = [(scope, s) for _, scope, s in _where(source)
            if len({c for c in s if c in GROUPED}) >= 2 and not lm_only.intersection(s)]
    assert hits == [("KEY", ("task", "model", "recipe")), ("f", ("run_id", "epoch", "attack"))]


def test_the_named_groupings_hold_declared_columns_and_agree_with_the_grid():
    derived = {"recipe"}  # the model's training recipe, read from model_options by the readers that group by it
    # columns of the per-record risk tables (and the null trials' records, by null split), beside the results columns
    per_record = {"channel", "attack", "null_index"}
    groupings = {name: getattr(record, name) for name in record.__all__
                 if name.endswith(("_KEY", "_ID", "_AXES", "_GROUP", "_GROUPBY", "_LINE", "_SETTING", "_CELL",
                                   "_ORDER")) and not isinstance(getattr(record, name), str)}
    assert {"RUN_KEY", "ROW_KEY", "CHECKPOINT_ID", "CONFIGURATION_KEY", "FACET_AXES", "FRONTIER_GROUP",
            "WANDB_LINE_GROUP", "WANDB_WORKSPACE_GROUPBY", "PAPER_RUN_ORDER"} <= set(groupings)
    for name, columns in groupings.items():
        assert isinstance(columns, tuple), name
        assert len(set(columns)) == len(columns), name
        unknown = [c for c in columns if not record.is_result_column(c) and c not in derived | per_record]
        assert unknown == [], (name, unknown)
    # a configuration is a run's grid point without its seed (and the recipe, which its model's options name)
    assert set(record.CONFIGURATION_KEY) == (set(record.GRID_AXES) - {"seed"}) | derived
    assert set(record.FACET_AXES) <= set(record.GRID_AXES)
    assert record.ROW_KEY == (*record.RUN_KEY, "epoch")
    assert set(record.CHECKPOINT_ID) <= set(record.CHECKPOINT_KEY)


def test_the_report_modules_use_the_records_groupings():
    from orchestrator.report import frontier, selection, wandb_summary

    assert selection.RUN_KEY is record.RUN_KEY
    assert selection.FACET_AXES is record.FACET_AXES
    assert frontier.GROUP is record.FRONTIER_GROUP
    assert frontier.SETTING is record.FRONTIER_SETTING
    assert wandb_summary.TRIAL_LINE_GROUP is record.WANDB_LINE_GROUP
    assert wandb_summary.WORKSPACE_GROUPBY is record.WANDB_WORKSPACE_GROUPBY


def test_a_trial_spec_holds_its_run_identity():
    from orchestrator.schema.config import parse_sweep
    from orchestrator.schema.trials import expand_grid

    sweep = parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "grid": {"q": [20], "seed": [0, 1]},
                         "probe": {"references": 2}})
    trials = expand_grid(sweep)
    assert [str(t.role) for t in trials] == ["target", "reference", "reference"] * 2
    for trial in trials:
        assert isinstance(trial.identity, record.RunIdentity)
        assert [getattr(trial, c) for c in record.IDENTITY_COLUMNS] == list(trial.identity.as_dict().values())
    target, reference = trials[:2]
    assert reference.identity == record.RunIdentity(**{**target.identity.as_dict(), "run_id": f"{target.run_id}-ref0"})
