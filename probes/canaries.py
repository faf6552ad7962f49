"""Canary exposure: how far a checkpoint singles out the canaries it was trained on.

Secret-Sharer style (Carlini et al., "The Secret Sharer"): a canary's exposure is how highly its score
ranks among the scores of canaries drawn the same way that the run never saw (the held-out canaries of
its kind, ``trainables.canaries``), in bits:

    exposure(c) = log2(H + 1) - log2(1 + #{held-out h : stat(h) >= stat(c)})

with H held-out canaries of c's kind. A canary no better than a random draw has an expected exposure of
about 1.3 bits (the mean of log2((H+1)/r) over a uniform rank r: 1.33 for H = 32, 1/ln 2 = 1.44 as H
grows); one above every held-out canary reaches the maximum log2(H + 1) (5.04 bits for H = 32). Ties
count against the canary, so an untouched model, whose calibrated statistics are all zero, gives every
canary exposure 0 exactly.

Two statistics, both oriented so that higher = more member-like:

* ``probe``: the zero-information probe's calibrated loss, -(S - S_ref) over the manipulation suite
  (what IclMem's verdict reads);
* ``known_context``: the calibrated loss of the canary's trained label predicted with the fine-tuning
  context C', -(loss_ft - loss_base) (what an attacker who knows C' reads).

Beside them, the Secret Sharer's own measure over the candidate labels: the rank of the canary's trained
label among the C candidates under the checkpoint with C' (1 = most probable).

Exposure has no significance level; :func:`canary_tests` gives one: a one-sided Mann-Whitney rank test of
the inserted canaries' statistic against the held-out ones' (pooled over kinds; per copy count as well in
the exposure design), whose p-value is valid because inserted and held-out canaries are exchangeable
draws before training. ``canary_detected`` is p < ``beta``. For the one_run design it also gives the
one-run ε lower bound (``probes.one_run``) of both statistics on the canaries' coins.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from iclmem.vocab import CanaryKind


def exposure_bits(stats: np.ndarray, holdout_stats: np.ndarray) -> np.ndarray:
    """float64 [n]: exposure of each statistic in ``stats`` against the held-out ones (module docstring)."""
    stats = np.asarray(stats, dtype=np.float64)
    held = np.sort(np.asarray(holdout_stats, dtype=np.float64))
    if held.size == 0:
        raise ValueError("exposure needs at least one held-out canary")
    at_least = held.size - np.searchsorted(held, stats, side="left")  # held-out h with h >= stat
    bits: np.ndarray = np.log2(held.size + 1.0) - np.log2(1.0 + at_least)
    return bits


def label_ranks(log_probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """int64 [n]: rank (1 = most probable) of each row's ``labels`` entry among its candidates; ties
    count against the label (an untouched uniform prediction ranks it last)."""
    lp = np.asarray(log_probs, dtype=np.float64)
    own = lp[np.arange(lp.shape[0]), np.asarray(labels, dtype=np.int64)]
    ranks: np.ndarray = (lp >= own[:, None]).sum(axis=1).astype(np.int64)
    return ranks


def canary_records(ids: np.ndarray, kinds: tuple[CanaryKind, ...], copies: np.ndarray,
                   probe_stat: np.ndarray, known_stat: np.ndarray, ranks: np.ndarray,
                   n_classes: int) -> list[dict[str, Any]]:
    """One record per inserted canary: its kind, copies, both statistics, both exposures and the label
    rank, the exposures measured against the held-out canaries (copies 0) of its own kind."""
    copies = np.asarray(copies, dtype=np.int64)
    kind_values = np.array([CanaryKind(k).value for k in kinds])
    out: list[dict[str, Any]] = []
    for kind in dict.fromkeys(kind_values):
        mine = kind_values == kind
        held, inserted = mine & (copies == 0), np.flatnonzero(mine & (copies > 0))
        if held.any():
            exp_probe = exposure_bits(probe_stat[inserted], probe_stat[held])
            exp_known = exposure_bits(known_stat[inserted], known_stat[held])
        else:  # a one_run draw that put every canary of a kind in (probability 2^-m): nothing to rank against
            exp_probe = exp_known = np.full(inserted.size, np.nan)
        for j, i in enumerate(inserted):
            out.append({"id": int(ids[i]), "kind": str(kind), "copies": int(copies[i]),
                        "probe_stat": float(probe_stat[i]), "exposure": float(exp_probe[j]),
                        "known_context_stat": float(known_stat[i]), "known_context_exposure": float(exp_known[j]),
                        "label_rank": int(ranks[i]),
                        "label_exposure": float(np.log2(n_classes) - np.log2(ranks[i])),
                        "holdout": int(held.sum())})
    return out


def summary_columns(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The results row's canary columns: per copy count k, the mean exposure over every kind
    (``canary_exposure_c<k>``), over one kind (``canary_<kind>_exposure_c<k>``), of the known-context
    statistic (``canary_known_context_exposure_c<k>``) and the mean label rank (``canary_label_rank_c<k>``);
    ``canary_exposure_max`` (log2(H + 1)) and every record as JSON (``canary_records``)."""
    out: dict[str, Any] = {"canary_records": json.dumps(records, sort_keys=True)}
    if not records:
        return out
    out["canary_holdout"] = int(min(r["holdout"] for r in records))
    out["canary_exposure_max"] = float(np.log2(out["canary_holdout"] + 1.0))
    for k in sorted({r["copies"] for r in records}):
        group = [r for r in records if r["copies"] == k]
        out[f"canary_exposure_c{k}"] = float(np.mean([r["exposure"] for r in group]))
        out[f"canary_known_context_exposure_c{k}"] = float(np.mean([r["known_context_exposure"] for r in group]))
        out[f"canary_label_rank_c{k}"] = float(np.mean([r["label_rank"] for r in group]))
        for kind in dict.fromkeys(r["kind"] for r in group):
            out[f"canary_{kind}_exposure_c{k}"] = float(np.mean([r["exposure"] for r in group if r["kind"] == kind]))
    return out


def canary_tests(kinds: tuple[CanaryKind, ...], copies: np.ndarray, probe_stat: np.ndarray, known_stat: np.ndarray,
                 beta: float) -> dict[str, Any]:
    """The rank tests of inserted (copies > 0) against held-out (copies 0) canaries: ``canary_p_value`` (the
    probe statistic), ``canary_known_context_p_value``, ``canary_detected`` (probe p < ``beta``) and, with
    several copy counts, ``canary_p_value_c<k>`` (canaries of k copies against every held-out one). NaN
    p-values where a side is empty (a one_run draw can leave one empty, with probability 2^-m)."""
    from probes.metrics import mann_whitney_p

    copies = np.asarray(copies, dtype=np.int64)
    inserted, held = copies > 0, copies == 0

    def p_of(stat: np.ndarray, rows: np.ndarray) -> float:
        if not rows.any() or not held.any():
            return float("nan")
        return mann_whitney_p(np.asarray(stat)[rows], np.asarray(stat)[held])

    out: dict[str, Any] = {"canary_p_value": p_of(probe_stat, inserted),
                           "canary_known_context_p_value": p_of(known_stat, inserted), "canary_beta": float(beta)}
    out["canary_detected"] = bool(out["canary_p_value"] < beta)  # NaN < beta is False: nothing detected
    counts = sorted(set(copies[inserted].tolist()))
    if len(counts) > 1:
        for k in counts:
            out[f"canary_p_value_c{k}"] = p_of(probe_stat, copies == k)
    return out


def one_run_columns(copies: np.ndarray, probe_stat: np.ndarray, known_stat: np.ndarray, delta: float, beta: float,
                    tie_seed: int) -> dict[str, Any]:
    """The one-run bound of both statistics on one_run canaries (in = copies 1): ``one_run_epsilon_lb`` (the
    larger; every test of both attacks shares ``beta``), ``one_run_epsilon_lb_<attack>``, the guesses that
    gave the headline and the design's numbers (m, canaries in, δ, β)."""
    from probes.one_run import one_run_audits

    bounds = one_run_audits({"probe": probe_stat, "known_context": known_stat}, np.asarray(copies) > 0, delta, beta,
                            tie_seed)
    best_name = max(bounds, key=lambda k: bounds[k].epsilon)
    best = bounds[best_name]
    out: dict[str, Any] = {f"one_run_epsilon_lb_{name}": b.epsilon for name, b in bounds.items()}
    out.update({"one_run_epsilon_lb": best.epsilon, "one_run_epsilon_lb_attack": best_name,
                "one_run_guesses": best.guesses, "one_run_correct": best.correct, "one_run_m": best.m,
                "one_run_n_in": best.n_in, "one_run_delta": best.delta, "one_run_beta": best.beta,
                "one_run_tests": best.tests})
    return out


__all__ = ["exposure_bits", "label_ranks", "canary_records", "summary_columns", "canary_tests", "one_run_columns"]
