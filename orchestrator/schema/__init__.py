"""The sweep's schema and its defaults, read and validated at the boundary: the tabular sweep file
(:mod:`~orchestrator.schema.config`, with :mod:`~orchestrator.schema.config_base`'s shared blocks and
:mod:`~orchestrator.schema.config_reading`'s YAML checks), the LM sweep file (:mod:`~orchestrator.schema.lm_config`),
which of the two a file is (:mod:`~orchestrator.schema.sweep_files`), the report's slices
(:mod:`~orchestrator.schema.slices`), the audits' defaults (:mod:`~orchestrator.schema.audit_defaults`) and the
grid expanded into typed trials (:mod:`~orchestrator.schema.trials`). Imports no other folder of the orchestrator."""
