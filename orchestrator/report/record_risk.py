"""The data owner's risk report, as tables: whose rows leak, which groups leak more, through which channel.

Built by the aggregator from what a sweep already stores (every checkpoint's per-query table, every context
audit's per-row scores), written beside ``results.parquet`` and read by the report's first screen
(:mod:`orchestrator.report.risk`). Row ids only: a row id names a row of the source table; no value of a row is
copied into any of these files (slice names follow :mod:`orchestrator.schema.slices`' rule).

* ``record_risk.parquet``: per audited checkpoint (and per context audit), per attack, per row: member flag,
  membership score (higher = more member-like), risk (:func:`probes.record_risk.membership_posterior`: P(member |
  score) at the audit's share of members) and the row's rank by risk among the checkpoint's members.
* ``record_slices.parquet``: per task, which slices each row belongs to (:func:`orchestrator.schema.slices.task_slices`).
* ``slice_risk.parquet``: per run at its headline checkpoint (the report's peak), per attack and slice:
  :class:`probes.record_risk.SliceLeakage`.
* ``record_stability.parquet``: how far two rankings of the same rows by score agree
  (:func:`probes.record_risk.rank_stability`), ``between`` ``seeds`` (runs that differ only in their seed, per pair
  and attack, on the rows both trained on) or ``reference_sets`` (a context audit's members under two disjoint
  halves of its reference contexts, per attack that reads them).
* ``channel_crossing.parquet``: with ``probe.two_channels``, per run at its headline checkpoint, each channel's
  attacks measured within each stratum of the other membership (:func:`probes.two_channel.channel_crossing`): the
  deployed context among rows fine-tuned on and among rows not, the fine-tuned weights among rows in the context
  and among rows not.
* ``value_slices.parquet``: with ``probe.value_inference``, per context audit, value attack and slice: the
  members' gain and its difference to the non-members' (:func:`value_slices`).
* ``riskiest_records.parquet``: per task, the ``top_k`` member rows with the highest risk over every run and
  attack, with the run, attack, channel and slices that put them there.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from iclmem.record import CONFIGURATION_KEY, NULL_TRIAL_KEY, ROW_KEY
from iclmem.runfolder import REFERENCE_HALF_PREFIX
from iclmem.vocab import Channel, ContextTarget
from orchestrator.report.canary_and_value_risk import canary_ranking, canary_rows, value_slices
from probes.two_channel import CONTEXT_CHANNEL_PREFIX, IN_CONTEXT_COLUMN

__all__ = ["HIGH_RISK", "RECORD_ATTACKS", "RiskTables", "audited_rows", "record_rows", "risk_tables", "sweep_slices", "write_risk_report"]

# the per-query statistics of a checkpoint's query table (probes.query_tables.query_table) a record is scored by, each
# oriented higher = more member-like: IclMem's calibrated probe loss and the calibrated known-context loss
RECORD_ATTACKS: dict[str, Callable[[pd.DataFrame], Any]] = {
    "probe": lambda t: t["s_ref_loss"] - t["s_loss"],
    "known_context": lambda t: t["known_context_loss_base"] - t["known_context_loss"],
}
HIGH_RISK = 0.9  # a member row at or above this risk counts as at risk (P(member | score) at an even prior)


def _folds(member: np.ndarray) -> int:
    return int(min(5, member.sum(), (~member).sum()))


def _concat(*frames: pd.DataFrame) -> pd.DataFrame:
    """The non-empty frames, one after the other (an empty frame when none is)."""
    kept = [f for f in frames if not f.empty]
    return pd.concat(kept, ignore_index=True) if kept else pd.DataFrame()


def record_rows(row_ids: Any, member: Any, scores: Mapping[str, Any], identity: Mapping[str, Any],
                channel: Channel, seed: int = 0) -> pd.DataFrame:
    """One audit's per-record rows: per attack in ``scores`` (name -> score per row, higher = member), each
    row's score, risk and rank among the members (1 = riskiest); ``identity``'s columns lead each row. An audit
    with fewer than two members or non-members has no risk to fit and gets no rows."""
    from probes.record_risk import membership_posterior

    member = np.asarray(member, dtype=bool)
    if _folds(member) < 2:
        return pd.DataFrame()
    frames = []
    for attack, values in scores.items():
        score = np.asarray(values, dtype=np.float64)
        finite = np.isfinite(score)
        if _folds(member[finite]) < 2:
            continue
        risk = np.full(score.shape, np.nan)
        risk[finite] = membership_posterior(score[finite], member[finite], folds=_folds(member[finite]), seed=seed)
        frame = pd.DataFrame({"row_id": np.asarray(row_ids, dtype=np.int64), "member": member, "score": score,
                              "risk": risk})
        order = frame.loc[member & finite].sort_values(["risk", "score"], ascending=False, kind="mergesort").index
        frame["risk_rank"] = pd.Series(np.arange(1, order.size + 1), index=order).reindex(frame.index).astype("Int64")
        frame.insert(0, "attack", attack)
        frame.insert(0, "channel", channel.value)
        frames.append(frame)
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    for i, (column, value) in enumerate(identity.items()):
        out.insert(i, column, value)
    return out


def sweep_slices(sweep: Any, settings: Any) -> pd.DataFrame:
    """Every task's slices (:func:`orchestrator.schema.slices.task_slices`), the rows cleaned and encoded as Stage I
    does with the sweep's ``data:`` settings; the source tables are read again (where the audit runs: nothing
    leaves it)."""
    from orchestrator.runfolder.prepare import task_source
    from orchestrator.schema.slices import task_slices
    from trainables.data.sources import read_frame, resolve_source
    from trainables.data.table import build_table

    frames = []
    for task in sweep.tasks:
        resolved = resolve_source(task_source(task))
        with warnings.catch_warnings():  # Stage I said them already (dropped columns, PCA)
            warnings.simplefilter("ignore")
            table = build_table(resolved, sweep.data.prep_settings())
        frames.append(task_slices(task.name, table.features, table.labels, table.class_names, table.row_ids,
                                  read_frame(resolved), resolved.target, settings))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@dataclass(frozen=True)
class RiskTables:
    """The risk report's tables (see the module's docstring); empty frames where nothing applied."""

    records: pd.DataFrame
    slices: pd.DataFrame
    slice_risk: pd.DataFrame
    stability: pd.DataFrame
    riskiest: pd.DataFrame
    canaries: pd.DataFrame  # :func:`canary_ranking`
    crossing: pd.DataFrame  # :func:`_channel_crossing` (probe.two_channels)
    value_slices: pd.DataFrame  # :func:`value_slices` (probe.value_inference)
    # the slice tests on the null splits (:func:`_slice_null`), what the claim ledger measures the slice claims'
    # false-positive rate from; kept in memory, not written
    slice_null: pd.DataFrame = field(default_factory=pd.DataFrame)
    # the flagged runs' slice tests on rounded outputs (:func:`_slice_rounded`): whether a slice claim survives
    slice_rounded: pd.DataFrame = field(default_factory=pd.DataFrame)


AttackScores = Callable[[str, int], Mapping[str, pd.Series]]  # (run_id, epoch) -> attack -> score by query id


def _checkpoint_records(results: pd.DataFrame, query_table: Callable[[str, int], pd.DataFrame | None],
                        attack_scores: AttackScores | None = None,
                        headline: Mapping[str, int] | None = None) -> pd.DataFrame:
    """Every audited checkpoint's records through the fine-tuned weights; with ``probe.two_channels`` the context
    channel of the same rows too, at the run's headline checkpoint only (``headline``: run id -> epoch; the
    report reads that channel there, and its records at other epochs were never claimed on)."""
    frames = []
    for _, row in results.iterrows():
        if bool(row.get("sanity_check", False)):
            continue
        table = query_table(str(row["run_id"]), int(row["epoch"]))
        if table is None or "s_loss" not in table.columns:
            continue
        scores = {name: f(table) for name, f in RECORD_ATTACKS.items()
                  if name != "known_context" or "known_context_loss" in table.columns}
        identity = {"run_id": str(row["run_id"]), "task": str(row["task"]), "epoch": int(row["epoch"])}
        ids = table["query_id"].to_numpy(np.int64)
        reference_attacks = attack_scores(str(row["run_id"]), int(row["epoch"])) if attack_scores else {}
        row_scores = {**scores, **{name: s.reindex(ids).to_numpy(np.float64) for name, s in reference_attacks.items()}}
        weights = record_rows(table["query_id"], table["member"], row_scores, identity, Channel.FINE_TUNED_WEIGHTS,
                              seed=int(row.get("seed", 0)))
        at_headline = headline is None or headline.get(str(row["run_id"])) == int(row["epoch"])
        if IN_CONTEXT_COLUMN in table.columns and at_headline:  # probe.two_channels: the same rows' context channel
            in_context = table[IN_CONTEXT_COLUMN].to_numpy(bool)
            context = record_rows(table["query_id"], in_context,
                                  {c[len(CONTEXT_CHANNEL_PREFIX):]: table[c] for c in table.columns
                                   if c.startswith(CONTEXT_CHANNEL_PREFIX)},
                                  identity, Channel.DEPLOYED_CONTEXT, seed=int(row.get("seed", 0)))
            flags = pd.DataFrame({"row_id": table["query_id"].to_numpy(np.int64),
                                  "fine_tuned": table["member"].to_numpy(bool), "in_context": in_context})
            weights, context = (f.merge(flags, on="row_id", how="left") if not f.empty else f
                                for f in (weights, context))
            frames.append(context)
        frames.append(weights)
        canaries = row.get("canary_scores")
        if isinstance(canaries, str) and canaries and _folds(table["member"].to_numpy(bool)) >= 2:
            frames.append(canary_rows(canaries, scores, table["member"], identity))
    return _concat(*frames)


def _context_records(context_audits: pd.DataFrame | None, scores_of: Callable[[str], pd.DataFrame | None]) -> pd.DataFrame:
    """The deployed-context audits' rows (``regime: context``): each audit's every target x attack score."""
    if context_audits is None or context_audits.empty:
        return pd.DataFrame()
    frames = []
    for run_id, audit in context_audits.groupby("run_id", sort=True):
        table = scores_of(str(run_id))
        if table is None:
            continue
        # the deployed context's attacks only: the never-in-context control is a null, never an attack of the rows
        scores = {c: table[c] for c in table.columns if "__" in c and not c.startswith(REFERENCE_HALF_PREFIX)
                  and not c.startswith(f"{ContextTarget.CONTROL.value}__")}
        identity = {"run_id": str(run_id), "task": str(audit["task"].iloc[0]), "epoch": 0}
        frames.append(record_rows(table["row_id"], table["member"], scores, identity, Channel.DEPLOYED_CONTEXT,
                                  seed=int(audit["seed"].iloc[0]) if "seed" in audit.columns else 0))
    return _concat(*frames)


def context_null_records(context_audits: pd.DataFrame | None,
                         scores_of: Callable[[str], pd.DataFrame | None]) -> pd.DataFrame:
    """The deployed-context audits' null data: each audit's never-in-context control (a context of as many rows,
    with the members' label counts, holding none of the audited rows) scores the same rows under every attack, so
    a member flag there is a false positive. Its records carry the deployed target's attack names (a null trial of
    the same claim) and ``null_index`` 0; the claim ledger's slice claims on the deployed context read their rate
    from them."""
    if context_audits is None or context_audits.empty:
        return pd.DataFrame()
    control = f"{ContextTarget.CONTROL.value}__"
    frames = []
    for run_id, audit in context_audits.groupby("run_id", sort=True):
        table = scores_of(str(run_id))
        if table is None:
            continue
        scores = {f"{ContextTarget.DEPLOYED.value}__{c[len(control):]}": table[c] for c in table.columns
                  if c.startswith(control)}
        identity = {"run_id": str(run_id), "task": str(audit["task"].iloc[0]), "epoch": 0, "null_index": 0}
        frames.append(record_rows(table["row_id"], table["member"], scores, identity, Channel.DEPLOYED_CONTEXT,
                                  seed=int(audit["seed"].iloc[0]) if "seed" in audit.columns else 0))
    return _concat(*frames)


def _reference_set_stability(context_audits: pd.DataFrame | None, scores_of: Callable[[str], pd.DataFrame | None],
                             top_k: int) -> pd.DataFrame:
    """Per context audit and attack: its members' scores under two disjoint reference sets
    (:meth:`probes.attacks.context.ReferenceScores.halves`), compared as two runs of one configuration are. Scores,
    not risks: the risk is a step function of the score fitted per half, and its ties would blur the comparison.
    An attack whose two halves are identical reads no reference (the plain loss): equal by construction, it is
    left out."""
    from probes.record_risk import rank_stability

    if context_audits is None or context_audits.empty:
        return pd.DataFrame()
    rows = []
    for run_id, audit in context_audits.groupby("run_id", sort=True):
        table = scores_of(str(run_id))
        if table is None:
            continue
        member = table["member"].to_numpy(bool)
        first = f"{REFERENCE_HALF_PREFIX}a__"
        for column in (c for c in table.columns if c.startswith(first)):
            attack = column[len(first):]
            other = f"{REFERENCE_HALF_PREFIX}b__{attack}"
            if other not in table.columns:
                continue
            a, b = (table[c].to_numpy(np.float64) for c in (column, other))
            if np.array_equal(a, b, equal_nan=True):
                continue
            kept = member & np.isfinite(a) & np.isfinite(b)
            if not kept.any():
                continue
            ids = table["row_id"].to_numpy(np.int64)[kept]
            st = rank_stability(ids, a[kept], ids, b[kept], top_k)
            rows.append({"between": "reference_sets", "task": str(audit["task"].iloc[0]), "run_a": str(run_id),
                         "run_b": str(run_id), "attack": attack, **st.as_dict()})
    return pd.DataFrame(rows)


def audited_rows(records: pd.DataFrame) -> pd.DataFrame:
    """The records of the audit's own rows (the canaries, scored beside them, left out)."""
    if records.empty or "canary_copies" not in records.columns:
        return records
    return records[records["canary_copies"].isna()]


def _headline_epochs(results: pd.DataFrame) -> dict[str, int]:
    from orchestrator.report.selection import peak_checkpoints

    audited = results[~results.get("sanity_check", pd.Series(False, index=results.index)).astype(bool)]
    peaks = peak_checkpoints(audited)
    return {str(r): int(e) for r, e in zip(peaks["run_id"], peaks["epoch"], strict=True)} if not peaks.empty else {}


def _peak_family(results: pd.DataFrame) -> dict[str, int]:
    """Per run: how many (checkpoint, competing kind) pairs its headline was picked from (the selection-aware
    rule's K), which a slice test at the headline pays for as the verdict does (Bonferroni)."""
    from orchestrator.report.selection import competing_kinds, fine_tuned_rows

    ft = fine_tuned_rows(results)
    if ft.empty:
        return {}
    kinds = max(1, len(competing_kinds(results)))
    return {str(r): int(n) * kinds for r, n in ft.groupby("run_id", sort=False)["epoch"].size().items()}


def _run_slice_tests(group: pd.DataFrame, task_slices: pd.DataFrame, settings: Any, n_resamples: int,
                     exchangeable: bool) -> list[dict[str, Any]]:
    """One (audit, channel, attack)'s slice tests (:func:`probes.record_risk.slice_leakage`), unadjusted: the
    caller corrects over the run's whole family."""
    from orchestrator.schema.slices import slice_masks
    from probes.record_risk import slice_leakage

    group = group[np.isfinite(group["score"].to_numpy(np.float64))]
    masks = slice_masks(task_slices, group["row_id"])
    if not masks:
        return []
    names = {name: mask for (_, name), mask in masks.items()}
    family_of = {name: family for (family, name) in masks}
    leakage = slice_leakage(group["score"], group["member"], names, n_resamples=n_resamples,
                            permutations=settings.permutations, seed=0, exchangeable=exchangeable)
    return [{"family": family_of[item.slice], **item.as_dict()} for item in leakage]


def _correct_run_family(rows: pd.DataFrame, peak: Mapping[str, int], alpha: float = 0.05) -> pd.DataFrame:
    """Holm over each run's whole family of slice tests (every channel, attack and slice at its headline), after
    a Bonferroni for the headline's selection (``peak``: the run's checkpoints x competing kinds; a context
    audit's single audit pays nothing): ``p_holm`` / ``exposed`` and ``p_more_holm`` / ``leaks_more``."""
    from probes.record_risk import holm

    if rows.empty:
        return rows
    rows = rows.copy()
    for run_id, idx in rows.groupby("run_id", sort=False).groups.items():
        k = max(1, int(peak.get(str(run_id), 1)))
        for raw, adjusted, flag in (("p_value", "p_holm", "exposed"), ("p_more", "p_more_holm", "leaks_more")):
            p = np.minimum(1.0, rows.loc[idx, raw].to_numpy(np.float64) * k)
            rows.loc[idx, adjusted] = holm(p)
            rows.loc[idx, flag] = rows.loc[idx, adjusted].to_numpy(np.float64) < alpha
        rows.loc[idx, "family_size"] = int(np.isfinite(rows.loc[idx, "p_value"].to_numpy(np.float64)).sum()) * k
    rows["exposed"] = rows["exposed"].astype(bool)
    rows["leaks_more"] = rows["leaks_more"].astype(bool)
    return rows


def _slice_risk(records: pd.DataFrame, slices: pd.DataFrame, headline: Mapping[str, int], results: pd.DataFrame,
                settings: Any, n_resamples: int) -> pd.DataFrame:
    """Per run at its headline checkpoint (a context audit: its one audit), channel, attack and slice: the
    slice's leakage, corrected over the run's family (:func:`_correct_run_family`)."""
    if records.empty or slices.empty:
        return pd.DataFrame()
    exchangeable = (dict(zip(results["run_id"].astype(str), results["exchangeable"].fillna(False).astype(bool),
                             strict=True)) if "exchangeable" in results.columns else {})
    records = audited_rows(records)
    rows = []
    at_headline = records[[headline.get(str(r), e) == e for r, e in zip(records["run_id"], records["epoch"],
                                                                         strict=True)]]
    by_task = {str(t): g for t, g in slices.groupby("task", sort=False)}
    for (run_id, task, epoch, channel, attack), group in at_headline.groupby(
            [*ROW_KEY, "channel", "attack"], sort=True):
        task_slices = by_task.get(str(task))
        if task_slices is None:
            continue
        for item in _run_slice_tests(group, task_slices, settings, n_resamples,
                                     bool(exchangeable.get(str(run_id), False))):
            rows.append({"run_id": run_id, "task": task, "epoch": int(epoch), "channel": channel, "attack": attack,
                         **item})
    return _correct_run_family(pd.DataFrame(rows), _peak_family(results))


def null_records(results: pd.DataFrame, null_query_table: Callable[[str, int], pd.DataFrame | None]) -> pd.DataFrame:
    """The null splits' records: for each fine-tuned run and null split j, the split's rows at the run's null
    headline for j (:func:`orchestrator.report.null_rates.null_run_headlines`), scored by the record attacks
    whose null rows are stored, their risk fitted as the real rows' are; ``null_index`` names j."""
    from orchestrator.report.null_rates import null_records as null_evidence_records
    from orchestrator.report.null_rates import null_run_headlines, with_competing_null_scores

    recs = null_evidence_records(results)
    if recs.empty:
        return pd.DataFrame()
    heads = null_run_headlines(with_competing_null_scores(recs, results))
    seeds = (dict(zip(results["run_id"].astype(str), results["seed"], strict=True)) if "seed" in results.columns
             else {})
    frames = []
    for _, head in heads.iterrows():
        run_id, epoch, j = str(head["run_id"]), int(head["epoch"]), int(head["null_index"])
        table = null_query_table(run_id, epoch)
        if table is None or "null_index" not in table.columns:
            continue
        split = table[table["null_index"] == j]
        scores = {name: f(split) for name, f in RECORD_ATTACKS.items()
                  if name != "known_context" or "known_context_loss" in split.columns}
        frames.append(record_rows(split["query_id"], split["member"], scores,
                                  {"run_id": run_id, "task": str(head["task"]), "epoch": epoch, "null_index": j},
                                  Channel.FINE_TUNED_WEIGHTS, seed=int(seeds.get(run_id, 0))))
    return _concat(*frames)


def _slice_null(null: pd.DataFrame, slices: pd.DataFrame, results: pd.DataFrame, settings: Any) -> pd.DataFrame:
    """The slice tests on every null split j of every run (at its null headline), corrected over the run's family
    as the real split's are: per (run, j, attack, slice) its AUC and whether it was flagged. Every flag is a
    false positive (rows no model trained on)."""
    if null.empty or slices.empty:
        return pd.DataFrame()
    by_task = {str(t): g for t, g in slices.groupby("task", sort=False)}
    frames = []
    for (run_id, task, j), trial in null.groupby(list(NULL_TRIAL_KEY), sort=True):
        task_slices = by_task.get(str(task))
        if task_slices is None:
            continue
        rows = [{"run_id": run_id, "task": task, "null_index": int(j), "channel": channel, "attack": attack, **item}
                for (channel, attack), group in trial.groupby(["channel", "attack"], sort=True)
                for item in _run_slice_tests(group, task_slices, settings, 0, False)]
        frames.append(_correct_run_family(pd.DataFrame(rows), _peak_family(results)))
    return _concat(*frames)


# the record attacks on the rounded per-query statistics (probe.output_decimals), as RECORD_ATTACKS on the exact ones
ROUNDED_RECORD_ATTACKS: dict[str, Callable[[pd.DataFrame], Any]] = {
    "probe": lambda t: t["rounded_s_ref_loss"] - t["rounded_s_loss"],
    "known_context": lambda t: t["rounded_known_context_loss_base"] - t["rounded_known_context_loss"],
}


def _slice_rounded(slice_risk: pd.DataFrame, query_table: Callable[[str, int], pd.DataFrame | None],
                   slices: pd.DataFrame, results: pd.DataFrame, settings: Any) -> pd.DataFrame:
    """The slice tests again on rounded outputs, for the runs with a flagged slice of an attack in
    :data:`ROUNDED_RECORD_ATTACKS` (the only ones a claim is stated for): the run's headline rows scored on their
    rounded statistics, every slice of those attacks tested and corrected over the run's family as the exact
    ones are. Empty when nothing was flagged or the query tables hold no rounded statistics."""
    if slice_risk.empty or slices.empty:
        return pd.DataFrame()
    flagged = slice_risk[(slice_risk["exposed"].astype(bool) | slice_risk["leaks_more"].astype(bool))
                         & (slice_risk["channel"] == Channel.FINE_TUNED_WEIGHTS.value)
                         & slice_risk["attack"].isin(list(ROUNDED_RECORD_ATTACKS))]
    by_task = {str(t): g for t, g in slices.groupby("task", sort=False)}
    frames = []
    for (run_id, task, epoch), _ in flagged.groupby(list(ROW_KEY), sort=True):
        table = query_table(str(run_id), int(epoch))
        task_slices = by_task.get(str(task))
        if table is None or task_slices is None or "rounded_s_loss" not in table.columns:
            continue
        rows = []
        for attack, f in ROUNDED_RECORD_ATTACKS.items():
            if attack == "known_context" and "rounded_known_context_loss" not in table.columns:
                continue
            group = pd.DataFrame({"row_id": table["query_id"].to_numpy(np.int64), "member": table["member"],
                                  "score": f(table).to_numpy(np.float64)})
            rows += [{"run_id": run_id, "task": task, "epoch": int(epoch), "channel": Channel.FINE_TUNED_WEIGHTS.value,
                      "attack": attack, **item} for item in _run_slice_tests(group, task_slices, settings, 0, False)]
        frames.append(_correct_run_family(pd.DataFrame(rows), _peak_family(results)))
    return _concat(*frames)


def _with_null_band(slice_risk: pd.DataFrame, slice_null: pd.DataFrame) -> pd.DataFrame:
    """Each real slice result with what the same slice of the same attack gives on null data: ``null_fpr`` (the
    share of null trials where it was flagged exposed), ``null_auc_low`` / ``null_auc_high`` (2.5% and 97.5%
    quantiles of its null AUCs) and ``null_splits`` (their number); NaN where no null trial reached the slice."""
    out = slice_risk.drop(columns=[c for c in ("null_fpr", "null_auc_low", "null_auc_high", "null_splits")
                                   if c in slice_risk.columns])
    if slice_null.empty:
        return out.assign(null_splits=0, null_fpr=np.nan, null_auc_low=np.nan, null_auc_high=np.nan)
    scored = slice_null.dropna(subset=["auc"])
    band = (scored.groupby(["task", "channel", "attack", "slice"], sort=False)
            .agg(null_splits=("auc", "size"), null_fpr=("exposed", "mean"),
                 null_auc_low=("auc", lambda a: float(np.quantile(a, 0.025))),
                 null_auc_high=("auc", lambda a: float(np.quantile(a, 0.975)))).reset_index())
    out = out.merge(band, on=["task", "channel", "attack", "slice"], how="left")
    out["null_splits"] = out["null_splits"].fillna(0).astype(int)
    return out


def _stability(records: pd.DataFrame, headline: Mapping[str, int], results: pd.DataFrame, top_k: int) -> pd.DataFrame:
    """Pairs of runs of one configuration drawn with other seeds: agreement of their scores on the rows both
    trained on."""
    from probes.record_risk import rank_stability

    if records.empty:
        return pd.DataFrame()
    keys = [c for c in CONFIGURATION_KEY if c in results.columns]
    runs = results.drop_duplicates("run_id")
    records = audited_rows(records)
    weights = records[(records["channel"] == Channel.FINE_TUNED_WEIGHTS.value) & records["member"]]
    weights = weights[[headline.get(str(r)) == e for r, e in zip(weights["run_id"], weights["epoch"], strict=True)]]
    # the scores, not the risks: each risk is a step function of its own audit's scores (ties); grouped once by
    # run and attack, so a pair is two lookups, not two scans of every record
    weights = weights[np.isfinite(weights["score"].to_numpy(np.float64))]
    by_run = {(str(r), str(at)): g for (r, at), g in weights.groupby(["run_id", "attack"], sort=True)}
    attacks = sorted({at for _r, at in by_run})
    rows = []
    for config, group in runs.groupby(keys, sort=True, dropna=False):
        ids = sorted(str(r) for r in group["run_id"] if str(r) in headline)
        for a, b in seed_pairs(ids):
            for attack in attacks:
                ra, rb = by_run.get((a, attack)), by_run.get((b, attack))
                if ra is None or rb is None:
                    continue
                st = rank_stability(ra["row_id"], ra["score"], rb["row_id"], rb["score"], top_k)
                rows.append({"between": "seeds",
                             **dict(zip(keys, config if isinstance(config, tuple) else (config,), strict=True)),
                             "run_a": a, "run_b": b, "attack": attack, **st.as_dict()})
    return pd.DataFrame(rows)


# Up to this many seeds of one configuration, every pair of them is compared; beyond it, each seed with the next
# (in a ring): as many pairs as seeds, so the table grows with the runs, not with their square (32 seeds: 32 pairs,
# not 496). Seeds are exchangeable, so every pair is a draw of the same agreement: the medians the report reads
# stay unbiased, on fewer pairs.
ALL_PAIRS_UP_TO = 6


def seed_pairs(ids: list[str]) -> list[tuple[str, str]]:
    """The pairs of a configuration's runs (sorted ids) whose rankings are compared (:data:`ALL_PAIRS_UP_TO`)."""
    if len(ids) <= ALL_PAIRS_UP_TO:
        return [(a, b) for i, a in enumerate(ids) for b in ids[i + 1:]]
    return [(ids[i], ids[(i + 1) % len(ids)]) for i in range(len(ids))]


def _riskiest(records: pd.DataFrame, slices: pd.DataFrame, headline: Mapping[str, int], top_k: int) -> pd.DataFrame:
    """Per task, the ``top_k`` member rows at their highest risk over runs (at each run's headline) and attacks."""
    if records.empty:
        return pd.DataFrame()
    records = audited_rows(records)
    members = records[records["member"] & np.isfinite(records["risk"].to_numpy(np.float64))]
    members = members[[c != Channel.FINE_TUNED_WEIGHTS.value or headline.get(str(r)) == e
                       for r, e, c in zip(members["run_id"], members["epoch"], members["channel"], strict=True)]]
    if members.empty:
        return pd.DataFrame()
    # the cross-fitted risk is capped at 1 - 1/(2n), so the riskiest rows often tie: among them, a row at risk in
    # more audits (runs x attacks) comes first, then one that was a member in fewer runs (its risk recurs)
    at_risk = (members.assign(high=members["risk"] >= HIGH_RISK)
               .groupby(["task", "row_id"]).agg(audits_at_risk=("high", "sum"), runs_as_member=("run_id", "nunique"))
               .reset_index())
    worst = (members.sort_values(["risk", "score"], ascending=False, kind="mergesort")
             .drop_duplicates(["task", "row_id"], keep="first").merge(at_risk, on=["task", "row_id"], how="left")
             .sort_values(["task", "risk", "audits_at_risk", "runs_as_member"], ascending=[True, False, False, True],
                          kind="mergesort"))
    top = worst.groupby("task", sort=True, group_keys=False).head(top_k).copy()
    top["rank"] = top.groupby("task", sort=False).cumcount() + 1
    if not slices.empty:
        named = (slices.groupby(["task", "row_id"])["slice"].agg(lambda s: "; ".join(sorted(s))).rename("slices")
                 .reset_index())
        top = top.merge(named, on=["task", "row_id"], how="left")
    columns = ["task", "rank", "row_id", "risk", "audits_at_risk", "runs_as_member", "attack", "channel", "run_id",
               "epoch", "score", "slices"]
    return top[[c for c in columns if c in top.columns]].reset_index(drop=True)


def _channel_crossing(results: pd.DataFrame, query_table: Callable[[str, int], pd.DataFrame | None],
                      headline: Mapping[str, int], n_resamples: int) -> pd.DataFrame:
    """Two channels, same rows (``probe.two_channels``), per run at its headline checkpoint: the context channel's
    attacks among the rows fine-tuned on and among the rows not (:func:`probes.two_channel.channel_crossing`),
    ``target`` ``deployed``, and the same for the channel's control (``never_in_context``: a context of rows the
    run never saw in the deployed context's place, the same flags; its cells are a null of the channel). The
    weights channel never reads the deployed context: its cells within the context strata would be random halves
    of the same scores, equal by construction, so they are not computed."""
    from probes.two_channel import CONTEXT_CONTROL_PREFIX, channel_crossing

    rows = []
    for run_id, epoch in sorted(headline.items()):
        table = query_table(run_id, epoch)
        if table is None or IN_CONTEXT_COLUMN not in table.columns:
            continue
        task = str(results.loc[results["run_id"].astype(str) == run_id, "task"].iloc[0])
        fine_tuned, in_context = table["member"].to_numpy(bool), table[IN_CONTEXT_COLUMN].to_numpy(bool)
        for target, prefix in ((ContextTarget.DEPLOYED, CONTEXT_CHANNEL_PREFIX),
                               (ContextTarget.CONTROL, CONTEXT_CONTROL_PREFIX)):
            scores = {c[len(prefix):]: table[c].to_numpy(np.float64) for c in table.columns if c.startswith(prefix)}
            for cell in channel_crossing(fine_tuned, in_context, {}, scores, n_resamples=n_resamples):
                rows.append({"run_id": run_id, "task": task, "epoch": int(epoch), "target": target.value,
                             **cell.as_dict()})
    return pd.DataFrame(rows)


def risk_tables(results: pd.DataFrame, query_table: Callable[[str, int], pd.DataFrame | None],
                slices: pd.DataFrame, settings: Any, *, n_resamples: int,
                null_query_table: Callable[[str, int], pd.DataFrame | None] | None = None,
                context_audits: pd.DataFrame | None = None,
                context_scores: Callable[[str], pd.DataFrame | None] | None = None,
                attack_scores: AttackScores | None = None,
                inference_rows: Callable[[str], pd.DataFrame | None] | None = None) -> RiskTables:
    """The risk report's tables of an audited results table (reference trials' rows excluded by the caller);
    ``query_table(run_id, epoch)`` reads a checkpoint's per-query table, ``context_scores(run_id)`` a context
    audit's per-row scores, ``attack_scores(run_id, epoch)`` the reference-model attacks' per-record scores (with
    ``probe.references``), ``inference_rows(run_id)`` a context audit's per-row value-inference gains (with
    ``probe.value_inference``), ``null_query_table(run_id, epoch)`` a checkpoint's null splits' per-row table
    (their slice tests are :attr:`RiskTables.slice_null`); ``settings``: :class:`orchestrator.schema.slices.SliceSettings`."""
    headline = _headline_epochs(results) if not results.empty else {}
    records = _concat(_checkpoint_records(results, query_table, attack_scores, headline),
                      _context_records(context_audits, context_scores or (lambda _: None)))
    null = _concat(null_records(results, null_query_table) if null_query_table is not None else pd.DataFrame(),
                   context_null_records(context_audits, context_scores or (lambda _: None)))
    slice_null = _slice_null(null, slices, results, settings)
    slice_risk = _slice_risk(records, slices, headline, results, settings, n_resamples)
    return RiskTables(records=records, slices=slices, slice_risk=_with_null_band(slice_risk, slice_null),
                      slice_null=slice_null,
                      slice_rounded=_slice_rounded(slice_risk, query_table, slices, results, settings),
                      stability=_concat(_stability(records, headline, results, settings.top_k),
                                        _reference_set_stability(context_audits, context_scores or (lambda _: None),
                                                                 settings.top_k)),
                      riskiest=_riskiest(records, slices, headline, settings.top_k),
                      canaries=canary_ranking(records, headline),
                      crossing=_channel_crossing(results, query_table, headline, n_resamples),
                      value_slices=value_slices(context_audits, inference_rows or (lambda _: None), slices))


def write_risk_report(run_dir: Path, results: pd.DataFrame, query_table: Callable[[str, int], pd.DataFrame | None],
                      log: Callable[[str], None] = print, *, attack_scores: AttackScores | None = None,
                      null_query_table: Callable[[str, int], pd.DataFrame | None] | None = None
                      ) -> RiskTables | None:
    """Build the risk report's tables of a sweep folder (its audited ``results``, reference trials excluded) and
    write them beside ``results.parquet`` (atomic; every table, empty ones too, so none is left from an earlier
    build). None, writing nothing, for a folder without ``sweep.json`` (the slices need its tasks)."""
    from iclmem.atomic import write_parquet_atomic
    from iclmem.runfolder import (
        CANARY_RANKING_FILE,
        CHANNEL_CROSSING_FILE,
        RECORD_RISK_FILE,
        RECORD_SLICES_FILE,
        RECORD_STABILITY_FILE,
        RISKIEST_RECORDS_FILE,
        SLICE_RISK_FILE,
        VALUE_SLICES_FILE,
    )
    from orchestrator.runfolder.run_folder import RunFolder

    folder = RunFolder(run_dir)
    sweep = folder.sweep_or_none
    if sweep is None or results.empty:
        return None
    settings = sweep.report.slice_settings()
    audits = folder.context_audits()
    tables = risk_tables(results, query_table, sweep_slices(sweep, settings), settings,
                         n_resamples=sweep.probe.bootstrap, null_query_table=null_query_table,
                         context_audits=audits, context_scores=folder.context_audit_scores, attack_scores=attack_scores,
                         inference_rows=folder.inference_rows)
    for name, table in ((RECORD_RISK_FILE, tables.records), (RECORD_SLICES_FILE, tables.slices),
                        (SLICE_RISK_FILE, tables.slice_risk), (RECORD_STABILITY_FILE, tables.stability),
                        (RISKIEST_RECORDS_FILE, tables.riskiest), (CANARY_RANKING_FILE, tables.canaries),
                        (CHANNEL_CROSSING_FILE, tables.crossing), (VALUE_SLICES_FILE, tables.value_slices)):
        write_parquet_atomic(table, Path(run_dir) / name)
    # counts of rows at risk or slices flagged are claims: the claim ledger states them, beside their null rates
    log(f"[iclmem] risk report: {tables.records['row_id'].nunique() if not tables.records.empty else 0} rows scored "
        f"-> {Path(run_dir) / RECORD_RISK_FILE}")
    return tables
