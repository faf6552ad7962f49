"""The report of a sweep, as its own package: what a run folder's results say, as tables, figures, an HTML
page and the sections each feature adds.

* :mod:`~orchestrator.report.tables`: pure pandas, one function per table of the paper (docstrings name the
  table and what it is computed from); no file is read or written there.
* :mod:`~orchestrator.report.figures`: the figures, drawn from those tables (matplotlib, no pyplot state).
* :mod:`~orchestrator.report.epsilon`, :mod:`~orchestrator.report.attacks`,
  :mod:`~orchestrator.report.canaries`: the ε lower bounds, the reference-model attacks and the canaries,
  each a table, a figure and an HTML section; :mod:`~orchestrator.report.frontier`, the leakage-utility
  frontier (held-out accuracy against the strongest attack's TPR at 1% FPR); :mod:`~orchestrator.report.parts`
  holds what they share.
* :mod:`~orchestrator.report.html`: the page (``report.html``, ``lm_report.html``).
* :mod:`~orchestrator.report.wandb_summary`: what goes to W&B (the keys, the sweep-summary run's and each
  trial run's values, the W&B Report), computed from the same public tables; ``orchestrator.wandb_logger`` is
  the shell that writes them with ``wandb``.

The run folder is read through :class:`orchestrator.run_folder.RunFolder` and the results row's columns are
:mod:`iclmem.record`'s.
The names below are the package's API: ``from orchestrator import report`` then ``report.peak_checkpoints``.
"""

from orchestrator.report.html import write_html_report, write_lm_html_report
from orchestrator.report.tables import *  # noqa: F403 - the tables' public API (tables.__all__)
from orchestrator.report.tables import __all__ as _TABLES

__all__ = [*_TABLES, "write_html_report", "write_lm_html_report"]
