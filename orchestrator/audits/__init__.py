"""The audits a user runs on a model without a sweep of their own, and the checks around them: one checkpoint
(:mod:`~orchestrator.audits.audit`), the audit kinds' registry behind ``iclmem audit-context --attack``
(:mod:`~orchestrator.audits.audit_kinds`), the deployed-context audit (:mod:`~orchestrator.audits.context_audit`),
value inference and saved files (:mod:`~orchestrator.audits.inference_audit`, :mod:`~orchestrator.audits.value_attacks`),
power on the packages' own fine-tuners (:mod:`~orchestrator.audits.upstream_power`) and the null self-check
(:mod:`~orchestrator.audits.selfcheck`). The attacks' math is :mod:`probes.attacks`'; these are its shells. Imports
the schema, the run folder and the report, never the driver or the command line."""
