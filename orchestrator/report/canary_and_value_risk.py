"""Two tables of the risk report beside the rows' own risk: the canaries' ranks among the audited rows under each
attack's statistic (:func:`canary_rows`, :func:`canary_ranking`: where a planted canary would stand if it were a
row), and per slice whether a value-inference audit's members give their values away (:func:`value_slices`, exact
small-sample tests at the Bonferroni level over the audit's slices). Pure pandas over stored tables."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from iclmem.record import ROW_KEY
from iclmem.vocab import Channel

__all__ = ["canary_ranking", "canary_rows", "value_slices"]


# a canary's statistics (the results row's ``canary_scores``, probes/probe.py) under each record attack's name
_CANARY_STATISTICS = {"probe": "probe_stat", "known_context": "known_context_stat"}


def canary_rows(canary_scores: str, row_scores: Mapping[str, Any], member: Any,
                identity: Mapping[str, Any]) -> pd.DataFrame:
    """A checkpoint's canaries as records: each attack's statistic and the risk the map fitted on the
    checkpoint's rows gives it (:func:`probes.record_risk.posterior_map`; the canaries are not in that fit).
    ``member``: inserted (copies > 0); ``canary_copies``: how often it was trained on (0: held out)."""
    import json

    from probes.record_risk import posterior_map

    canaries = pd.DataFrame(json.loads(canary_scores))
    if canaries.empty:
        return pd.DataFrame()
    frames = []
    for attack, statistic in _CANARY_STATISTICS.items():
        if attack not in row_scores or statistic not in canaries.columns:
            continue
        scores = np.asarray(row_scores[attack], dtype=np.float64)
        finite = np.isfinite(scores)
        fit = posterior_map(scores[finite], np.asarray(member, dtype=bool)[finite])
        values = canaries[statistic].to_numpy(np.float64)
        frames.append(pd.DataFrame({"channel": Channel.FINE_TUNED_WEIGHTS.value, "attack": attack,
                                    "row_id": canaries["id"].to_numpy(np.int64),
                                    "member": canaries["copies"].to_numpy(np.int64) > 0, "score": values,
                                    "risk": fit(values), "canary_copies": canaries["copies"].to_numpy(np.int64)}))
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    for i, (column, value) in enumerate(identity.items()):
        out.insert(i, column, value)
    return out


def canary_ranking(records: pd.DataFrame, headline: Mapping[str, int]) -> pd.DataFrame:
    """Ground truth for the ranking, per run (at its headline checkpoint), attack and copy count: the inserted
    canaries of that count ranked among the member rows and themselves by score (the risk is a monotone map of
    it, so the score only breaks the risk's ties); precision@k with k = their number (chance: their share of the
    ranked records); and the AUC of those canaries against the held-out ones (0.5: the ranking cannot tell a
    canary trained on that often from an untrained one). Pooling the counts would let the most-copied canaries
    carry the rest."""
    from iclmem.stats import auc
    from probes.record_risk import precision_at_k

    if records.empty or "canary_copies" not in records.columns:
        return pd.DataFrame()
    rows = []
    at_headline = records[[headline.get(str(r)) == e for r, e in zip(records["run_id"], records["epoch"], strict=True)]]
    for (run_id, task, epoch, attack), group in at_headline.groupby([*ROW_KEY, "attack"], sort=True):
        canary = group["canary_copies"].notna()
        if not canary.any():
            continue
        copies = group["canary_copies"]
        held = group.loc[canary & ~group["member"], "score"].to_numpy(np.float64)
        members = group.loc[~canary & group["member"], "score"].to_numpy(np.float64)
        for c in sorted(int(v) for v in copies[canary & group["member"]].unique()):
            planted = group.loc[canary & group["member"] & (copies == c), "score"].to_numpy(np.float64)
            k = planted.size
            score = np.r_[members, planted]
            positive = np.r_[np.zeros(members.size, bool), np.ones(k, bool)]
            rows.append({"run_id": run_id, "task": task, "epoch": int(epoch), "attack": attack, "copies": c,
                         "inserted": k, "held_out": int(held.size), "member_rows": int(members.size),
                         "precision_at_k": precision_at_k(score, positive, k), "chance": k / score.size,
                         "inserted_vs_held_out_auc": auc(planted, held) if held.size else float("nan")})
    return pd.DataFrame(rows)


def value_slices(context_audits: pd.DataFrame | None, rows_of: Callable[[str], pd.DataFrame | None],
                 slices: pd.DataFrame, permutations: int = 9999) -> pd.DataFrame:
    """Per context audit with ``probe.value_inference``, value attack and slice: the members' mean gain and the
    members-minus-non-members gain on the slice's rows, each tested exactly or by permutation
    (:func:`probes.attacks.value_slices.value_slice_test`) at the Bonferroni level over the audit's slices that can
    be tested for that attack; ``exposed`` when both tests clear it; ``too_small`` for a slice with fewer than
    :data:`probes.attacks.value_slices.MIN_SLICE_SIDE` rows a side (never exposed). Row ids in, group names out."""
    from orchestrator.schema.slices import slice_masks
    from probes.attacks.value_slices import MIN_SLICE_SIDE, value_slice_test

    if context_audits is None or context_audits.empty or slices.empty:
        return pd.DataFrame()
    by_task = {str(t): g for t, g in slices.groupby("task", sort=False)}
    out = []
    for run_id, audit in context_audits.groupby("run_id", sort=True):
        table = rows_of(str(run_id))
        task = str(audit["task"].iloc[0])
        if table is None or task not in by_task:
            continue
        for attack, rows in table.groupby("attack", sort=True):
            member = rows["member"].to_numpy(bool)
            masks = slice_masks(by_task[task], rows["row_id"])
            testable = sum((m & member).sum() >= MIN_SLICE_SIDE and (m & ~member).sum() >= MIN_SLICE_SIDE
                           for m in masks.values())
            level = 0.05 / max(1, testable)
            for (family, name), mask in masks.items():
                test = value_slice_test(rows["gain"].to_numpy(np.float64)[mask], member[mask], alpha_slice=level,
                                        permutations=permutations)
                out.append({"run_id": str(run_id), "task": task, "attack": str(attack), "family": family,
                            "slice": name, "n_members": test.n_members, "n_nonmembers": test.n_nonmembers,
                            "members_gain": test.members_gain, "gain_difference": test.gain_difference,
                            "p_members": test.p_members, "p_difference": test.p_difference, "level": level,
                            "too_small": test.too_small, "exposed": test.exposed})
    return pd.DataFrame(out)
