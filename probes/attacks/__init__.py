"""Every attack's math, pure and Ray-free: what the orchestrator's shells schedule, write and report.

* :mod:`probes.attacks.membership`: the reference-model membership attacks (LiRA online and offline, RMIA)
  on per-query statistics, their null splits and verdicts by IclMem's memorization rule;
* :mod:`probes.attacks.context`: the deployed-context audit (was a row in a fitted learner's context?),
  reference contexts as reference models;
* :mod:`probes.attacks.value_inference`: label and attribute inference through a deployed context, with their
  imputation pools and controls;
* :mod:`probes.attacks.saved_file` and :mod:`probes.attacks.saved_file_cache`: what a saved TabICL or TabPFN
  classifier file keeps of its context (saving, byte scan, membership through the file) and the attacks on its
  cache (matching candidate rows, reconstructing the context);
* :mod:`probes.attacks.scorers`: a registered model's adapter and a scikit-learn-style classifier as the
  scorer every context attack calls.

Shapes and conventions (members positive, higher score = member) are each module's own docstring's.
"""
