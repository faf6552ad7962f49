"""The orchestration layer (Ray, Tune, W&B, the command line), one folder a job, lowest first:

* :mod:`orchestrator.schema`: the sweep files, validated at the boundary, their defaults and the typed trials;
* :mod:`orchestrator.runfolder`: Stage I for a grid, the run folder's reader and the timing record;
* :mod:`orchestrator.report`: aggregation, the claim ledger, the risk report, the HTML report and W&B;
* :mod:`orchestrator.audits`, :mod:`orchestrator.estimate`, :mod:`orchestrator.cluster`: the audits without a
  sweep, ``iclmem estimate``, and the cluster and launch checks;
* :mod:`orchestrator.driver`: the tabular and LM sweep drivers on Ray Tune;
* :mod:`orchestrator.commands` and :mod:`orchestrator.cli`: the command line.

A folder imports only folders above it in this list (tests/layering.py checks it, with no loop between folders).
Imports every layer below (``iclmem``, ``trainables``, ``probes``)."""
