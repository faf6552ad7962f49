"""The report of a sweep, as its own package: what a run folder's results say, as tables, figures, an HTML
page and the sections each feature adds.

* The tables, pure pandas (no file is read or written there), one import point in
  :mod:`~orchestrator.report.tables`: :mod:`~orchestrator.report.selection` (the shared vocabulary, each run's
  peak checkpoint), :mod:`~orchestrator.report.null_rates` (the verdicts' measured false-positive rates),
  :mod:`~orchestrator.report.claims` (the claims beyond one run's headline), :mod:`~orchestrator.report.overview`
  (what the report's top says of the sweep), :mod:`~orchestrator.report.thresholds` (the rule and thresholds in
  force) and :mod:`~orchestrator.report.paper_tables` (one function per table of the paper, whose docstring names
  the table and what it is computed from).
* :mod:`~orchestrator.report.figures`: the figures, drawn from those tables (matplotlib, no pyplot state).
* :mod:`~orchestrator.report.epsilon`, :mod:`~orchestrator.report.attacks`,
  :mod:`~orchestrator.report.canaries`: the ε lower bounds, the reference-model attacks and the canaries,
  each a table, a figure and an HTML section; :mod:`~orchestrator.report.frontier`, the leakage-utility
  frontier (held-out accuracy against the strongest attack's TPR at 1% FPR);
  :mod:`~orchestrator.report.context_audits`, the deployed-context audits; :mod:`~orchestrator.report.parts`
  holds what they share.
* The page: :mod:`~orchestrator.report.page` (the shell and the blocks every section is written with),
  :mod:`~orchestrator.report.leaked` (which runs leaked: table, terminal lines, first section),
  :mod:`~orchestrator.report.summary` (the summary and definitions), :mod:`~orchestrator.report.verdict_rule`
  (the verdict-rule section) and :mod:`~orchestrator.report.html`, which assembles ``report.html`` (and
  writes ``lm_report.html``).
* :mod:`~orchestrator.report.wandb_summary`: what goes to W&B (the keys, the sweep-summary run's and each
  trial run's values, the W&B Report), computed from the same public tables; ``orchestrator.report.wandb_logger`` is
  the shell that writes them with ``wandb``.

Imports go one way: ``selection``, ``page`` and ``parts`` import no other report module; a table module imports
only tables; the feature sections import ``parts`` (and ``page``), never the tables' or the page's other parts;
the page's sections import the tables and ``page``; ``html`` imports them all and is imported only by this
package. Nothing private is imported across modules. The run folder is read through :class:`orchestrator.runfolder.run_folder.RunFolder` and the results row's columns are
:mod:`iclmem.record`'s. The names below are the package's API: ``from orchestrator import report`` then
``report.peak_checkpoints``.
"""

from orchestrator.report.html import write_html_report, write_lm_html_report
from orchestrator.report.tables import *  # noqa: F403 - the tables' public API (tables.__all__)
from orchestrator.report.tables import __all__ as _TABLES

__all__ = [*_TABLES, "write_html_report", "write_lm_html_report"]
