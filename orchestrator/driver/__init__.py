"""The sweep drivers on Ray Tune: the tabular sweep (:mod:`~orchestrator.driver.sweep`) with its probe actor pools
(:mod:`~orchestrator.driver.probe_pools`), Tune callbacks (:mod:`~orchestrator.driver.tune_callbacks`), failures and
resumes (:mod:`~orchestrator.driver.failures`), checkpoint keeping and storage
(:mod:`~orchestrator.driver.checkpoint_keeping`, :mod:`~orchestrator.driver.storage`), progress and timings
(:mod:`~orchestrator.driver.progress`, :mod:`~orchestrator.driver.sweep_timings`) and the console
(:mod:`~orchestrator.driver.console`); the LM sweep (:mod:`~orchestrator.driver.lm_sweep`). Imports every folder
below the command line."""
