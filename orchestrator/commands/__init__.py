"""The command line's subcommands, one module per group: sweeps (``run``, ``resume``, ``lm``:
:mod:`~orchestrator.commands.cli_sweeps`), planning (``validate``, ``estimate``, ``cluster-check``:
:mod:`~orchestrator.commands.cli_planning`), audits (``probe``, ``audit-context``: :mod:`~orchestrator.commands.cli_audits`),
the report (:mod:`~orchestrator.commands.cli_report`) and what they share about run folders
(:mod:`~orchestrator.commands.cli_folders`). :mod:`orchestrator.cli` builds the parser and dispatches to them."""
