"""Stage I ground truth: load a task, prepare it once, split it into members / non-members / context.

The contract is ``docs/INTERFACES.md`` (PreparedTask) and the "Stage I — ground truth" section of the
method spec. The submodules, lowest first (each imports only those above it):

* :mod:`~trainables.data.blind`: the blind baseline, members vs non-members told apart without the model;
* :mod:`~trainables.data.task`: the records: task source, settings, split report, columns, prepared task;
* :mod:`~trainables.data.sources`: where a table comes from (built-in, CARTE, CSV / parquet) and reading it;
* :mod:`~trainables.data.encoding`: how each column is read and encoded into features, and PCA;
* :mod:`~trainables.data.table`: cleaning, labelling and encoding a table before the split;
* :mod:`~trainables.data.split`: drawing the split, with the distribution and blind checks;
* :mod:`~trainables.data.derived_splits`: null splits, reference halves and the ground-truth log;
* :mod:`~trainables.data.cache`: the fingerprint and the on-disk cache of prepared tasks;
* :mod:`~trainables.data.prepare`: ``prepare_task`` end to end, and ``load_or_prepare``.

The names other modules use are importable from here.
"""

from iclmem.vocab import ColumnKind, InputContract, LabelDesign, LabelMode, TaskKind
from trainables.data.cache import PREP_FORMAT_VERSION, load_prepared, save_prepared, task_fingerprint
from trainables.data.derived_splits import ground_truth_log, null_split, null_split_task, reference_half, reference_task
from trainables.data.encoding import (
    CELL_CLIP_QUANTILES,
    DATE_PARSE_MIN_SHARE,
    NUMERIC_PARSE_MIN_SHARE,
    ONE_HOT_MAX_CATEGORIES,
    missing_cells,
)
from trainables.data.prepare import load_or_prepare, prepare_task
from trainables.data.sources import BUILTIN_TASKS, BuiltinTask, load_table
from trainables.data.table import INFER_REGRESSION_MIN_UNIQUE
from trainables.data.task import (
    DISTRACTOR_COLUMNS,
    FeatureColumn,
    PreparedTask,
    PrepSettings,
    SplitReport,
    TableColumns,
    TaskSource,
    contract_settings,
)

__all__ = [
    "TaskKind",
    "LabelMode",
    "LabelDesign",
    "TaskSource",
    "PrepSettings",
    "SplitReport",
    "PreparedTask",
    "FeatureColumn",
    "TableColumns",
    "InputContract",
    "ColumnKind",
    "DISTRACTOR_COLUMNS",
    "contract_settings",
    "BuiltinTask",
    "BUILTIN_TASKS",
    "load_table",
    "missing_cells",
    "prepare_task",
    "load_or_prepare",
    "task_fingerprint",
    "ground_truth_log",
    "null_split",
    "null_split_task",
    "reference_half",
    "reference_task",
    "save_prepared",
    "load_prepared",
    "PREP_FORMAT_VERSION",
    "ONE_HOT_MAX_CATEGORIES",
    "NUMERIC_PARSE_MIN_SHARE",
    "DATE_PARSE_MIN_SHARE",
    "INFER_REGRESSION_MIN_UNIQUE",
    "CELL_CLIP_QUANTILES",
]
