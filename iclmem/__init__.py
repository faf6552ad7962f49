"""The core every layer builds on: errors, registries, closed vocabularies, run-folder layout and
provenance, atomic file writes, Ray session start-up and the results logger. No Ray or torch at import."""
