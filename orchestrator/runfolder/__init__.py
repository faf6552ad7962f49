"""What a run folder holds before and after the sweep: Stage I for a grid (:mod:`~orchestrator.runfolder.prepare`:
the prepared tasks the trials and probes read), the folder's reader (:mod:`~orchestrator.runfolder.run_folder`) and the
run's timing record (:mod:`~orchestrator.runfolder.timing`). Imports only :mod:`orchestrator.schema`."""
