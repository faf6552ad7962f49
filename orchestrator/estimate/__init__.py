"""``iclmem estimate``: the grid's units of work (:mod:`~orchestrator.estimate.estimate_work`), their costs
measured on this device (:mod:`~orchestrator.estimate.estimate_measure`), the disk a sweep writes
(:mod:`~orchestrator.estimate.estimate_disk`), the predicted wall time (:mod:`~orchestrator.estimate.estimate_predict`),
its rendering (:mod:`~orchestrator.estimate.estimate_render`) and the command's assembly
(:mod:`~orchestrator.estimate.estimate`). Imports the schema and the run folder."""
