"""The audits' defaults, declared once (a leaf: it imports nothing): the command line's flags, the audits' own
signatures (orchestrator/audits/context_audit.py, inference_audit.py, value_attacks.py), the audit kinds' runners and
the sweep schema's ``probe.context_references`` and ``probe.sensitive_bins`` (regime context) all read these."""

from __future__ import annotations

__all__ = ["DEFAULT_BINS", "MAX_BINS", "MIN_BINS", "DEFAULT_CONTEXT_SIZE", "DEFAULT_NULL_SPLITS", "DEFAULT_REFERENCES", "FILE_CONTEXT_SIZE",
           "FILE_REFERENCES"]

DEFAULT_CONTEXT_SIZE = 256  # rows in a deployed context and in each reference context
DEFAULT_REFERENCES = 64  # reference contexts K (even: every row is in exactly half of them)
DEFAULT_NULL_SPLITS = 5  # null splits of the non-members per membership attack
DEFAULT_BINS = 4  # quantile bins of a numeric sensitive column (attribute inference)
MIN_BINS, MAX_BINS = 2, 64  # one candidate is no secret; each candidate is a forward pass over every audited row
# a saved-file audit refits the package's classifier on every reference context: fewer, smaller ones by default
FILE_CONTEXT_SIZE = 40
FILE_REFERENCES = 8
