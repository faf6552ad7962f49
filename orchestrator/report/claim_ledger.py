"""The claim ledger: every statement about leakage that the console, the report's first screen or the W&B summary
makes, as one typed line with how much (its effect size), what it selected over and what it is corrected for,
how often the same path makes it on null data (rows no model trained on), and whether it holds again on rounded
outputs. A claim whose false-positive rate is not measured does not reach the first screen.

Pure pandas and numpy over what a sweep already stores (results rows with their ``null_evidence``, every
checkpoint's query table and null-split query table, the risk report's tables); no Ray. Written by
:func:`write_claim_ledger` as ``claims.parquet`` beside ``results.parquet``; read back by
:meth:`orchestrator.runfolder.run_folder.RunFolder.claim_ledger`. Row ids and group names only, never a row's values.

Null paths, per kind (docs/METHOD.md, "The claim ledger"):

* ``run_verdict``: null split j of every checkpoint of a run goes through the run's headline selection (the
  highest competing-kind AUC over epochs, :func:`orchestrator.report.null_rates.null_run_headlines`) and the
  sweep's rule; one null trial per (run, j), pooled over the task's runs.
* ``known_context_flag``: the flag on null split j of every checkpoint, OR over the run's checkpoints as the
  claim ORs them; one trial per (run, j).
* ``reference_attack`` (``probe.references``): per run and channel (the probe's statistic, the known-context
  loss, and for recipe upstream that loss as the package deploys the weights), any of the channel's attacks
  (LiRA online, LiRA offline, RMIA) calling the run memorization at its headline; attack null split j of every
  checkpoint goes through each attack's headline selection and rule (``probes.attacks.membership.attack_run_headline``), a
  null trial per (run, j) a false positive when any of the channel's attacks fires on it.
* ``runs_leaked``: the union of the claims above, one family: a null trial per (run, j) is a false positive when
  any fires on its null split j.
* ``rows_at_risk``: null split j's rows scored at the run's null headline, their risk fitted as the real rows'
  (:func:`orchestrator.report.record_risk.record_rows`), the count of member rows at or above the bar taken over the
  task's runs and the same attacks; the claim is made when the real count exceeds every null trial's, its rate
  is the share of null trials that reach the real count.
* ``slice_exposed`` / ``slice_leaks_more``: the slice tests of :func:`orchestrator.report.record_risk.slice_claims` on
  null split j at the run's null headline (same slices, attacks and correction); a null trial per (run, j) is a
  false positive when any slice is flagged.
* ``task_verdict``: :func:`orchestrator.report.claims.task_claim_error_rates`.
* ``deployed_known_context_flag``: the deployed classifier's flag on null split j of every checkpoint, per (run, j).
* ``value_slice_exposed`` has no null path yet: ``unmeasured``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from iclmem.record import NULL_TRIAL_KEY
from iclmem.vocab import Attack, ClaimKind, ClaimReading, Outcome, RoundingCheck
from orchestrator.report.claim_records import LEDGER_COLUMNS, LedgerClaim, NullTrials, effect_of_scores, reading
from orchestrator.report.claim_words import ATTACK_CHANNEL_WORDS, next_step, statement

__all__ = ["claim_ledger", "run_claims", "rows_at_risk_claims", "shown_claims", "write_claim_ledger"]

MEMORIZATION = Outcome.MEMORIZATION.value
QueryTable = Callable[[str, int], "pd.DataFrame | None"]


_NAN = float("nan")


def _claim(kind: ClaimKind, task: str, subject: str, made: bool, trials: NullTrials, rounding: RoundingCheck,
           **values: Any) -> LedgerClaim:
    low, high = trials.interval() if trials.n else (_NAN, _NAN)
    base: dict[str, Any] = {f.name: _NAN for f in fields(LedgerClaim)}
    base.update(family="", family_size=0, selection="", correction="", null_path="", statement="", next_step="",
                output_decimals=_NAN)
    base.update(values)
    read = reading(made, trials, rounding)
    base.update(kind=kind.value, task=str(task), subject=str(subject), made=bool(made), n_null=int(trials.n),
                null_made=int(trials.made), null_rate=trials.rate, null_rate_low=low, null_rate_high=high,
                rounding=rounding.value, reading=read.value)
    claim = LedgerClaim(**base)
    return LedgerClaim(**{**claim.as_dict(), "statement": statement(claim), "next_step": next_step(claim)})


# ------------------------------------------------------------------------------------------------ run claims
_REFERENCE_ATTACKS = tuple(a.value for a in Attack)


def _attack_null_hits(run_rows: pd.DataFrame, prefix: str) -> pd.Series | None:
    """Per attack null split j of one run: whether any of the channel's attacks calls null run j memorization at
    its headline (``probes.attacks.membership.null_headline_outcomes``, as ``_run_null_memorization`` counts them); None
    without attack evidence."""
    import json

    from probes.attacks.membership import null_headline_outcomes

    hits: dict[int, bool] = {}
    seen = False
    for attack in _REFERENCE_ATTACKS:
        column = f"{prefix}{attack}_null_evidence"
        if column not in run_rows.columns:
            continue
        evidence = [json.loads(raw) if isinstance(raw, str) else [] for raw in run_rows[column]]
        for j, outcome in null_headline_outcomes(run_rows["epoch"].astype(int).tolist(), evidence).items():
            seen = True
            hits[j] = hits.get(j, False) or outcome == MEMORIZATION
    return pd.Series(hits, dtype=bool).rename_axis("null_index") if seen else None


def _reference_attack_claims(run_rows: pd.DataFrame, key_values: tuple[Any, ...], key: list[str],
                             decimals: float) -> list[tuple[str, dict[str, Any], bool, pd.Series]]:
    """Per channel with reference-attack columns: (its prefix, the run's claim's fields, whether it is made: any
    attack's headline verdict memorization, its null hits indexed by (run key..., null_index)); the caller pools
    the hits over the task's runs into the claim's trials."""
    out = []
    for prefix, words in ATTACK_CHANNEL_WORDS.items():
        heads = [f"{prefix}{a}_run_outcome" for a in _REFERENCE_ATTACKS if f"{prefix}{a}_run_outcome" in run_rows.columns]
        if not heads or run_rows[heads].isna().all().all():
            continue
        outcomes = run_rows[heads].iloc[0]
        made = bool((outcomes == MEMORIZATION).any())
        aucs = {a: float(run_rows[f"{prefix}{a}_run_auc"].iloc[0]) for a in _REFERENCE_ATTACKS
                if f"{prefix}{a}_run_auc" in run_rows.columns and pd.notna(run_rows[f"{prefix}{a}_run_auc"].iloc[0])}
        best = max(aucs, key=lambda a: aucs[a]) if aucs else None
        at = (run_rows[run_rows["epoch"] == run_rows[f"{prefix}{best}_run_epoch"].iloc[0]]
              if best is not None else run_rows.iloc[:0])
        row = at.iloc[0] if not at.empty else run_rows.iloc[0]
        hits = _attack_null_hits(run_rows, prefix)
        if hits is None:
            hits = pd.Series(dtype=bool).rename_axis("null_index")
        hits.index = pd.MultiIndex.from_tuples([(*key_values, j) for j in hits.index], names=[*key, "null_index"])

        def value(column: str, row: pd.Series = row, prefix: str = prefix, best: str | None = best) -> float:
            return float(row.get(f"{prefix}{best}_{column}", _NAN)) if best is not None else _NAN

        claim_values = dict(
            family=f"channel {prefix or 'probe_'}: {len(heads)} attacks x the run's checkpoints",
            family_size=len(heads) * len(run_rows),
            selection=f"any attack on {words}, each at its checkpoint of highest AUC",
            correction="each attack's rule (Bonferroni over the run's checkpoints); the OR over attacks is paid by "
                       "the measured null rate",
            auc=value("auc"), auc_low=value("auc_low"), auc_high=value("auc_high"), tpr_at_1pct=value("tpr_at_1pct"),
            epsilon_lb=value("epsilon_lb"),
            null_path="attack null split j (non-members labelled as members) of every checkpoint through each "
                      "attack's headline selection and rule, any attack of the channel, per (run, j)",
            output_decimals=decimals)
        out.append((prefix, claim_values, made, hits))
    return out


def _rule_column(results: pd.DataFrame) -> str:
    from orchestrator.report.claims import recorded_rule

    return f"outcome_{recorded_rule(results)}"


def _null_recs(results: pd.DataFrame) -> pd.DataFrame:
    from orchestrator.report.null_rates import null_records, with_competing_null_scores

    recs = null_records(results)
    return recs if recs.empty else with_competing_null_scores(recs, results)


def _trials(hits: pd.Series) -> NullTrials:
    return NullTrials(int(len(hits)), int(hits.astype(bool).sum()))


def _decimals(results: pd.DataFrame) -> float:
    if "output_decimals" in results.columns and results["output_decimals"].notna().any():
        return float(results["output_decimals"].dropna().iloc[0])
    return _NAN


def _score_effect(table: pd.DataFrame | None, kind: str) -> tuple[float, float]:
    """(shift, relative shift) of a checkpoint's calibrated ``kind`` score from its query table."""
    from probes.metrics import membership_score

    if table is None or f"s_{kind}" not in table.columns:
        return _NAN, _NAN
    member = table["member"].to_numpy(bool)
    score = membership_score(kind, table[f"s_{kind}"].to_numpy(np.float64) - table[f"s_ref_{kind}"].to_numpy(np.float64))
    return effect_of_scores(score[member], score[~member], table[f"s_ref_{kind}"])


def _known_context_effect(table: pd.DataFrame | None) -> tuple[float, float]:
    if table is None or "known_context_loss" not in table.columns:
        return _NAN, _NAN
    member = table["member"].to_numpy(bool)
    score = table["known_context_loss_base"].to_numpy(np.float64) - table["known_context_loss"].to_numpy(np.float64)
    return effect_of_scores(score[member], score[~member], table["known_context_loss_base"])


def _rounding(row: Mapping[str, Any], column: str, expected: Any) -> RoundingCheck:
    value = row.get(column)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return RoundingCheck.NOT_TESTED
    return RoundingCheck.SURVIVES if value == expected or (isinstance(expected, bool) and bool(value) == expected) \
        else RoundingCheck.LOST


def _any_checkpoint(recs: pd.DataFrame, trial: list[str], column: str) -> pd.Series | None:
    """Per null trial (``trial``: the run key and null index), whether ``column`` fired at any checkpoint; None
    when the null records do not carry it (the flag was not computed on null splits)."""
    if recs.empty or column not in recs.columns or recs[column].isna().all():
        return None
    return recs.groupby(trial, sort=True)[column].apply(lambda s: bool(s.fillna(False).astype(bool).any()))


def _union_rounding(made: list[LedgerClaim]) -> RoundingCheck:
    """A union of claims survives rounding when one of its made claims does, and is lost when all are."""
    checks = {c.rounding for c in made}
    if RoundingCheck.SURVIVES.value in checks:
        return RoundingCheck.SURVIVES
    if checks and checks == {RoundingCheck.LOST.value}:
        return RoundingCheck.LOST
    return RoundingCheck.NOT_TESTED


def run_claims(results: pd.DataFrame, query_table: QueryTable) -> list[LedgerClaim]:
    """Per fine-tuned run: its verdict, its known-context flag, the deployed flag where the run has one, and per
    task the union ``runs_leaked``, each with the null trials of its own path (see the module's docstring)."""
    from orchestrator.report.null_rates import null_run_headlines
    from orchestrator.report.selection import RUN_KEY, fine_tuned_rows, peak_checkpoints

    ft = fine_tuned_rows(results)
    if ft.empty or "outcome" not in ft.columns:
        return []
    rule = _rule_column(results)
    decimals = _decimals(results)
    key = [c for c in RUN_KEY if c in ft.columns]
    peaks = peak_checkpoints(ft)
    recs = _null_recs(results)
    heads = null_run_headlines(recs) if not recs.empty else pd.DataFrame(columns=[*key, "null_index"])
    kinds = len({k for k in ("loss", "entropy", "confidence") if f"calibrated_{k}_auc" in ft.columns}) or 1
    out: list[LedgerClaim] = []
    for task, task_peaks in peaks.groupby("task", sort=True):
        task_runs = set(task_peaks["run_id"].astype(str))
        task_heads = heads[heads["run_id"].astype(str).isin(task_runs)] if not heads.empty else heads
        verdict_trials = (_trials(task_heads[rule] == MEMORIZATION) if rule in task_heads.columns
                          else NullTrials(0, 0))
        task_recs = recs[recs["run_id"].astype(str).isin(task_runs)] if not recs.empty else recs
        flag_hits = _any_checkpoint(task_recs, [*key, "null_index"], "known_context_flag")
        flag_trials = _trials(flag_hits) if flag_hits is not None else NullTrials(0, 0)
        deployed_hits = _any_checkpoint(task_recs, [*key, "null_index"], "deployed_known_context_flag")
        # reference attacks per run and channel, their null hits pooled per channel over the task's runs
        attack_claims: dict[str, list[tuple[str, dict[str, Any], bool, pd.Series]]] = {}
        attack_hits: dict[str, list[pd.Series]] = {}
        for _, head in task_peaks.iterrows():
            run_id = str(head["run_id"])
            run_rows = ft[ft["run_id"].astype(str) == run_id]
            found = _reference_attack_claims(run_rows, tuple(head[c] for c in key), key, decimals)
            attack_claims[run_id] = found
            for prefix, _, _, hits in found:
                attack_hits.setdefault(prefix, []).append(hits)
        pooled_attack_hits = {p: pd.concat(h) for p, h in attack_hits.items()}
        union = pd.Series(dtype=bool)
        if rule in task_heads.columns and flag_hits is not None:
            union = task_heads.set_index([*key, "null_index"])[rule].eq(MEMORIZATION)
            for hits in (flag_hits, deployed_hits, *pooled_attack_hits.values()):
                if hits is not None and not hits.empty:
                    both = union.index.union(hits.index)
                    union = union.reindex(both, fill_value=False) | hits.reindex(both, fill_value=False)
        components: list[LedgerClaim] = []
        for _, head in task_peaks.iterrows():
            run_id, epoch = str(head["run_id"]), int(head["epoch"])
            n_ckpt = int(head.get("n_checkpoints", 1))
            kind = str(head.get("score_kind") or "loss")
            shift, relative = _score_effect(query_table(run_id, epoch), kind)
            made = str(head["outcome"]) == MEMORIZATION
            components.append(_claim(
                ClaimKind.RUN_VERDICT, task, run_id, made, verdict_trials,
                _rounding(head, "rounded_outcome", MEMORIZATION) if made else RoundingCheck.NOT_TESTED,
                family=f"the run's checkpoints x competing score kinds ({n_ckpt} x {kinds})",
                family_size=n_ckpt * kinds, selection="the checkpoint and score kind of highest calibrated AUC",
                correction=str(head.get("rule", "")), auc=float(head.get("auc", _NAN)),
                auc_low=float(head.get("auc_low", _NAN)), auc_high=float(head.get("auc_high", _NAN)),
                tpr_at_1pct=float(head.get("tpr_at_1pct", _NAN)), shift=shift, relative_shift=relative,
                epsilon_lb=float(head.get("epsilon_lb", _NAN)) if pd.notna(head.get("epsilon_lb", _NAN)) else _NAN,
                null_path="null split j of every checkpoint through the run's headline selection and rule, per "
                          "(run, j), pooled over the task's runs",
                output_decimals=decimals))
            run_rows = ft[ft["run_id"].astype(str) == run_id]
            if "known_context_memorization_flag" in run_rows.columns:
                flags = run_rows[run_rows["known_context_memorization_flag"].fillna(False).astype(bool)]
                flagged = not flags.empty and not made
                at = (flags.sort_values(["known_context_calibrated_auc", "epoch"], ascending=[False, True])
                      .iloc[0] if not flags.empty else run_rows.sort_values("known_context_calibrated_auc").iloc[-1])
                shift, relative = _known_context_effect(query_table(run_id, int(at["epoch"])))
                components.append(_claim(
                    ClaimKind.KNOWN_CONTEXT_FLAG, task, run_id, flagged, flag_trials,
                    _rounding(at, "rounded_known_context_memorization_flag", True) if flagged
                    else RoundingCheck.NOT_TESTED,
                    family=f"the run's checkpoints, one score ({len(run_rows)} tests)", family_size=len(run_rows),
                    selection="any checkpoint (an OR over the run's checkpoints)", correction="Bonferroni over the "
                    "run's checkpoints", auc=float(at.get("known_context_calibrated_auc", _NAN)),
                    auc_low=float(at.get("known_context_calibrated_auc_low", _NAN)),
                    auc_high=float(at.get("known_context_calibrated_auc_high", _NAN)),
                    tpr_at_1pct=float(at.get("known_context_calibrated_tpr_at_1pct", _NAN)), shift=shift,
                    relative_shift=relative, null_path="the flag on null split j of every checkpoint, OR over the "
                    "run's checkpoints, per (run, j)", output_decimals=decimals))
            deployed = "deployed_known_context_memorization_flag"
            if deployed in run_rows.columns and run_rows[deployed].notna().any():
                fired = bool(run_rows[deployed].eq(True).any()) and not made
                components.append(_claim(
                    ClaimKind.DEPLOYED_KNOWN_CONTEXT_FLAG, task, run_id, fired,
                    _trials(deployed_hits) if deployed_hits is not None else NullTrials(0, 0), RoundingCheck.NOT_TESTED,
                    family="the run's checkpoints", family_size=len(run_rows), selection="any checkpoint",
                    correction="Bonferroni over the run's checkpoints",
                    null_path="the deployed classifier's flag on null split j of every checkpoint, OR over the "
                              "run's checkpoints, per (run, j)", output_decimals=decimals))
            for prefix, values, attack_made, _ in attack_claims.get(run_id, []):
                components.append(_claim(ClaimKind.REFERENCE_ATTACK, task, run_id, attack_made,
                                         _trials(pooled_attack_hits[prefix]), RoundingCheck.NOT_TESTED, **values))
        out.extend(components)
        count = len({c.subject for c in components if c.made})
        per_j = (union.groupby(level="null_index").sum() if not union.empty else pd.Series(dtype=float))
        out.append(_claim(
            ClaimKind.RUNS_LEAKED, task, "", count > 0, _trials(union) if not union.empty else NullTrials(0, 0),
            _union_rounding([c for c in components if c.made]),
            family="every run of the task x (its verdict, its known-context flags, its reference attacks)",
            family_size=len(components), selection="the union of the claims per run",
            correction="none beyond each claim's own: the union's rate is measured", count=float(count),
            null_count_mean=float(per_j.mean()) if not per_j.empty else _NAN,
            null_count_max=float(per_j.max()) if not per_j.empty else _NAN,
            null_path="per (run, j): the run's null headline verdict OR its known-context flags OR its reference "
                      "attacks' null headlines on null split j",
            output_decimals=decimals))
    return out


# ------------------------------------------------------------------------------------------------ rows at risk


RISK_ATTACKS = ("probe", "known_context")  # the attacks whose null rows are stored (the reference attacks' are not)


def _risk_scores(table: pd.DataFrame, rounded: bool) -> dict[str, np.ndarray]:
    """The record attacks' scores of a query table (:data:`orchestrator.report.record_risk.RECORD_ATTACKS`, or their rounded
    twins), those whose statistics the table holds."""
    from orchestrator.report.record_risk import RECORD_ATTACKS, ROUNDED_RECORD_ATTACKS

    prefix, attacks = ("rounded_", ROUNDED_RECORD_ATTACKS) if rounded else ("", RECORD_ATTACKS)
    needed = {"probe": f"{prefix}s_loss", "known_context": f"{prefix}known_context_loss"}
    return {name: np.asarray(score(table), np.float64) for name, score in attacks.items()
            if needed[name] in table.columns}


def _rows_at_risk(table: pd.DataFrame, seed: int, bar: float, rounded: bool) -> set[int]:
    """Row ids of the member rows at or above ``bar`` under any of :data:`RISK_ATTACKS` in one audit."""
    from iclmem.vocab import Channel
    from orchestrator.report.record_risk import record_rows

    scores = _risk_scores(table, rounded)
    if not scores:
        return set()
    rec = record_rows(table["query_id"], table["member"], scores, {}, Channel.FINE_TUNED_WEIGHTS, seed=seed)
    if rec.empty:
        return set()
    return set(rec.loc[rec["member"] & (rec["risk"] >= bar), "row_id"].astype(int))


def rows_at_risk_claims(results: pd.DataFrame, query_table: QueryTable, null_query_table: QueryTable | None,
                        bar: float) -> list[LedgerClaim]:
    """Per task: the member rows at risk >= ``bar`` (any run at its headline, any of :data:`RISK_ATTACKS`) against
    the same count on each null split j (every run at its null headline for j): the claim is made when the real
    count exceeds every null trial's; its rate is how often the same rule fires on a null trial against the
    others (leave one out)."""
    from orchestrator.report.null_rates import null_run_headlines
    from orchestrator.report.selection import fine_tuned_rows, peak_checkpoints

    ft = fine_tuned_rows(results)
    if ft.empty:
        return []
    decimals = _decimals(results)
    peaks = peak_checkpoints(ft)
    recs = _null_recs(results)
    heads = null_run_headlines(recs) if not recs.empty else pd.DataFrame()
    out = []
    for task, task_peaks in peaks.groupby("task", sort=True):
        real: set[int] = set()
        real_rounded: set[int] = set()
        rounded_tested = False
        for _, head in task_peaks.iterrows():
            table = query_table(str(head["run_id"]), int(head["epoch"]))
            if table is None:
                continue
            seed = int(head.get("seed", 0))
            real |= _rows_at_risk(table, seed, bar, rounded=False)
            if "rounded_s_loss" in table.columns:
                rounded_tested = True
                real_rounded |= _rows_at_risk(table, seed, bar, rounded=True)
        null_counts: dict[int, set[int]] = {}
        null_rounded: dict[int, set[int]] = {}
        if null_query_table is not None and not heads.empty:
            task_heads = heads[heads["run_id"].astype(str).isin(set(task_peaks["run_id"].astype(str)))]
            for _, head in task_heads.iterrows():
                table = null_query_table(str(head["run_id"]), int(head["epoch"]))
                if table is None:
                    continue
                j = int(head["null_index"])
                split = table[table["null_index"] == j]
                seed = int(head.get("seed", 0)) if "seed" in head else 0
                null_counts.setdefault(j, set()).update(_rows_at_risk(split, seed, bar, rounded=False))
                if "rounded_s_loss" in split.columns:
                    null_rounded.setdefault(j, set()).update(_rows_at_risk(split, seed, bar, rounded=True))
        counts = np.array([len(v) for v in null_counts.values()], dtype=np.float64)
        n = len(real)
        made = bool(counts.size and n > counts.max())
        # the same rule on each null trial, the others standing in for the null: it fires when that trial's count
        # exceeds every other's (about 1 in J by exchangeability, so the claim needs some 20 null splits to be read)
        fired = sum(bool(c > np.delete(counts, i).max()) for i, c in enumerate(counts)) if counts.size > 1 else 0
        trials = NullTrials(int(counts.size) if counts.size > 1 else 0, int(fired))
        rounding = RoundingCheck.NOT_TESTED
        if made and rounded_tested:
            bar_rounded = max((len(v) for v in null_rounded.values()), default=int(counts.max()))
            rounding = RoundingCheck.SURVIVES if len(real_rounded) > bar_rounded else RoundingCheck.LOST
        out.append(_claim(
            ClaimKind.ROWS_AT_RISK, task, "", made, trials, rounding,
            family="the task's runs x attacks " + "/".join(RISK_ATTACKS), family_size=len(task_peaks) * 2,
            selection="each run's headline checkpoint; a row counts once over runs and attacks",
            correction="the count is compared with the same count on null splits",
            count=float(n), null_count_mean=float(counts.mean()) if counts.size else _NAN,
            null_count_max=float(counts.max()) if counts.size else _NAN,
            null_path="null split j of every run at its null headline, risk fitted as for the real rows, rows at "
                      "risk counted over runs and attacks; rate: the same rule on each null trial against the others",
            output_decimals=decimals))
    return out


# ------------------------------------------------------------------------------------------------ the ledger


def _slice_claims(slice_claims: pd.DataFrame | None, slice_null: pd.DataFrame | None,
                  slice_rounded: pd.DataFrame | None = None, decimals: float = _NAN) -> list[LedgerClaim]:
    """One claim per flagged (run, channel, attack, slice) and test, with the null rate of its run's family and
    whether the same slice test fires again on rounded outputs (``slice_rounded``: the slice tests of the runs
    with a flagged slice, on their rounded per-row scores, corrected alike; None: not re-tested)."""
    again: dict[str, set[tuple[str, str, str]]] = {}
    if slice_rounded is not None and not slice_rounded.empty:
        for test in ("exposed", "leaks_more"):
            fired = slice_rounded[slice_rounded[test].astype(bool)]
            again[test] = set(zip(fired["run_id"].astype(str), fired["attack"].astype(str),
                                  fired["slice"].astype(str), strict=True))
        retested = set(slice_rounded["run_id"].astype(str))
    else:
        retested = set()
    if slice_claims is None or slice_claims.empty:
        return []
    # per test and channel: the null trials (a run's null split, or a context audit's never-in-context control),
    # each a false positive when any of its slices is flagged; a claim is measured when its (channel, attack) was
    # tested on null data (the reference attacks' null rows are not scored: never)
    rates: dict[tuple[str, str], NullTrials] = {}
    tested: set[tuple[str, str]] = set()
    if slice_null is not None and not slice_null.empty:
        tested = set(zip(slice_null["channel"].astype(str), slice_null["attack"].astype(str), strict=True))
        for channel, part in slice_null.groupby("channel", sort=True):
            for test in ("exposed", "leaks_more"):
                rates[(test, str(channel))] = _trials(part.groupby(list(NULL_TRIAL_KEY), sort=True)[test].any())
    out = []
    for test, kind in (("exposed", ClaimKind.SLICE_EXPOSED), ("leaks_more", ClaimKind.SLICE_LEAKS_MORE)):
        flagged = slice_claims[slice_claims[test].astype(bool)]
        for _, r in flagged.iterrows():
            measured = (str(r["channel"]), str(r["attack"])) in tested
            rounding = RoundingCheck.NOT_TESTED
            if measured and str(r["run_id"]) in retested:
                rounding = (RoundingCheck.SURVIVES if (str(r["run_id"]), str(r["attack"]), str(r["slice"]))
                            in again.get(test, set()) else RoundingCheck.LOST)
            out.append(_claim(
                kind, str(r["task"]), f"{r['slice']} ({r['attack']}, run {r['run_id']})", True,
                rates.get((test, str(r["channel"])), NullTrials(0, 0)) if measured else NullTrials(0, 0), rounding,
                family="the run's slices x attacks x channels, times the headline's checkpoints x kinds",
                family_size=int(r.get("family_size", 0)), selection="the run's headline checkpoint",
                correction="Bonferroni for the headline's selection, then Holm over the family",
                auc=float(r["auc"]), auc_low=float(r.get("auc_low", _NAN)), auc_high=float(r.get("auc_high", _NAN)),
                tpr_at_1pct=float(r.get("tpr_at_1pct", _NAN)),
                null_path="the same slice tests on null split j at the run's null headline (a context audit: on its "
                          "never-in-context control); per (run, j), a false positive when any slice is flagged",
                output_decimals=decimals))
    return out


def _task_verdict_rounding(results: pd.DataFrame, task: str, threshold: float, made: bool) -> RoundingCheck:
    """The task verdict on rounded outputs: some fine-tuned checkpoint of the task whose rounded verdict is
    memorization with a rounded p-value (its headline kind's) below the same Bonferroni threshold."""
    from orchestrator.report.selection import fine_tuned_rows

    ft = fine_tuned_rows(results)
    if not made or "rounded_outcome" not in ft.columns or "rounded_p_value" not in ft.columns:
        return RoundingCheck.NOT_TESTED
    mine = ft[ft["task"].astype(str) == task]
    if mine["rounded_outcome"].isna().all():
        return RoundingCheck.NOT_TESTED
    hit = (mine["rounded_outcome"] == MEMORIZATION) & (mine["rounded_p_value"].astype(float) < threshold)
    return RoundingCheck.SURVIVES if bool(hit.any()) else RoundingCheck.LOST


def _task_verdict_claims(results: pd.DataFrame) -> list[LedgerClaim]:
    from orchestrator.report.claims import TASK_VERDICT, recorded_rule, task_claim_error_rates, task_verdicts

    verdicts = task_verdicts(results, regime=None)
    if verdicts.empty:
        return []
    rates = task_claim_error_rates(results, regime=None)
    rule = recorded_rule(results)
    rate = rates[(rates["claim"] == TASK_VERDICT.name) & (rates["rule"] == rule)] if not rates.empty else rates
    trials = NullTrials(int(rate["n_null"].iloc[0]), int(rate["n_memorization"].iloc[0])) if len(rate) else NullTrials(0, 0)
    decimals = _decimals(results)
    out = []
    for _, v in verdicts.iterrows():
        made = v["task_verdict"] == MEMORIZATION
        threshold = float(v["task_p_value_threshold"])
        out.append(_claim(ClaimKind.TASK_VERDICT, str(v["task"]), "", made, trials,
                          _task_verdict_rounding(results, str(v["task"]), threshold, made),
                          family=f"every run's checkpoints x kinds ({int(v['task_family_size'])})",
                          family_size=int(v["task_family_size"]), selection="some checkpoint of some run",
                          correction=f"Bonferroni: p below {threshold:.2g}",
                          null_path="null split j of every run of the task, decided as the real split",
                          output_decimals=decimals))
    return out


def _value_slice_claims(value_slices: pd.DataFrame | None) -> list[LedgerClaim]:
    if value_slices is None or value_slices.empty or "exposed" not in value_slices.columns:
        return []
    return [_claim(ClaimKind.VALUE_SLICE_EXPOSED, str(r["task"]), f"{r['slice']} ({r['attack']}, audit {r['run_id']})",
                   True, NullTrials(0, 0), RoundingCheck.NOT_TESTED, family="the audit's slices",
                   selection="none", correction="per slice",
                   null_path="none yet: the never-in-context control is not run through the slices")
            for _, r in value_slices[value_slices["exposed"].astype(bool)].iterrows()]


def claim_ledger(results: pd.DataFrame, query_table: QueryTable, null_query_table: QueryTable | None = None, *,
                 risk_bar: float = 0.9, slice_claims: pd.DataFrame | None = None,
                 slice_null: pd.DataFrame | None = None, slice_rounded: pd.DataFrame | None = None,
                 value_slices: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every claim of an audited results table (reference trials excluded by the caller) as the ledger's rows
    (:data:`LEDGER_COLUMNS`), made ones first."""
    claims: list[LedgerClaim] = [*run_claims(results, query_table),
                                 *rows_at_risk_claims(results, query_table, null_query_table, risk_bar),
                                 *_slice_claims(slice_claims, slice_null, slice_rounded, _decimals(results)),
                                 *_task_verdict_claims(results),
                                 *_value_slice_claims(value_slices)]
    table = pd.DataFrame([c.as_dict() for c in claims], columns=list(LEDGER_COLUMNS))
    if table.empty:
        return table
    order = {r.value: i for i, r in enumerate(ClaimReading)}
    return (table.assign(_o=table["reading"].map(order)).sort_values(["_o", "task", "kind", "subject"], kind="mergesort")
            .drop(columns="_o").reset_index(drop=True))


def shown_claims(ledger: pd.DataFrame) -> pd.DataFrame:
    """The claims the first screen and the console state: made, with a measured false-positive rate."""
    if ledger is None or ledger.empty:
        return pd.DataFrame(columns=list(LEDGER_COLUMNS))
    return ledger[ledger["made"].astype(bool) & (ledger["reading"] != ClaimReading.UNMEASURED.value)]


def write_claim_ledger(run_dir: Path, ledger: pd.DataFrame, log: Callable[[str], None] = print) -> Path:
    """Write the ledger as ``claims.parquet`` (atomic) and say on the console how many claims it holds."""
    from iclmem.atomic import write_parquet_atomic
    from iclmem.runfolder import CLAIM_LEDGER_FILE

    path = write_parquet_atomic(ledger, Path(run_dir) / CLAIM_LEDGER_FILE)
    counts = ledger["reading"].value_counts() if not ledger.empty else pd.Series(dtype=int)
    log(f"[iclmem] claim ledger: {len(ledger)} claims tested; made: "
        + ", ".join(f"{counts.get(r.value, 0)} {r.value}" for r in ClaimReading if r is not ClaimReading.NOT_MADE)
        + f" -> {path}")
    return path
