"""One probe, end to end and Ray-free: score a checkpoint, calibrate, measure, classify.

``probe_checkpoint`` is what a probe actor runs per job. Its output is a ``ProbeResult``: one flat
results row (config, metrics, intervals, verdict and the numbers that decided it), the per-manipulation
AUCs and the ROC curve of the deciding score — metrics, ids and curves only, never feature values.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from iclmem.atomic import read_parquet_checked, write_json_atomic, write_parquet_atomic
from iclmem.errors import ProbeError
from iclmem.record import check_row
from iclmem.runfolder import MANIPULATION_SUFFIX, NULL_QUERIES_SUFFIX, QUERIES_SUFFIX, ROC_SUFFIX, ROW_SUFFIX
from iclmem.vocab import SCORE_KINDS, CanaryDesign, CanaryKind, ContextTarget, Outcome, VerdictRule
from probes.calibration import model_digest, reference_scores, resolve_model
from probes.canaries import canary_records, canary_tests, label_ranks, one_run_columns
from probes.canaries import summary_columns as canary_summary_columns
from probes.known_context import KnownContextPlan, known_context_predictions
from probes.metrics import (
    Calibration,
    MembershipInput,
    ScoreKind,
    membership_metrics,
    membership_score,
    per_manipulation_auc,
    robustness_scores,
    roc_curve,
)
from probes.outcomes import CheckpointOutcome, OutcomeThresholds, build_evidence, classify, memorization_holds
from probes.probe_columns import (
    blind_columns,
    collapse_indicators,
    deployed_seed,
    deployed_utility_columns,
    icl_utility_columns,
)
from probes.query_tables import (
    DEPLOYED_PREFIX,
    deployed_statistics,
    known_context_statistics,
    query_table,
    score_statistics,
    split_scores_table,
    with_member_flags,
)
from probes.scoring import (
    ROUNDED_PREFIX,
    ProbePlan,
    ProbeQueries,
    distribution_scores,
    icl_log_probs,
    icl_predictions,
    rounded_loss,
    rounded_view,
    score,
)
from probes.settings import ProbeSettings
from trainables.data import null_split
from trainables.data.blind import task_blind_baseline


@dataclass(frozen=True)
class ProbeResult:
    row: dict[str, Any]  # one row of results.parquet
    manipulation_auc: pd.DataFrame  # manipulation, category, auc (calibrated loss)
    roc: pd.DataFrame  # fpr, tpr of the deciding (or loss) calibrated score
    notes: tuple[str, ...] = ()  # warnings for the driver's log (not stored: results do not depend on them)
    # per query: query_id, member, S and S_ref of every score kind (means over the suite), the known-context
    # loss on the checkpoint and on the base model -- what the reference-model attacks (probes/attacks/membership.py)
    # read; None for a result stored before it existed
    queries: pd.DataFrame | None = None
    # per null split and query (:func:`null_query_frame`): null_index, query_id, member (the split's fake flag),
    # S and S_ref of every score kind, the known-context loss on the checkpoint and the base model, and with output
    # decimals their rounded_ counterparts -- exactly what each null split's verdict and known-context flag were
    # computed from; None when no null split was probed (the base model, null_splits 0, or stored before)
    null_queries: pd.DataFrame | None = None

    def save(self, directory: str | Path, stem: str) -> Path:
        """Atomic, idempotent: the same inputs write the same files under the same names. The row is checked
        against ``iclmem.record`` first: an undeclared column is refused here, before anything is written."""
        directory = Path(directory)
        check_row(self.row, f"probe result {directory / stem}")
        directory.mkdir(parents=True, exist_ok=True)
        write_parquet_atomic(self.manipulation_auc, directory / f"{stem}{MANIPULATION_SUFFIX}")
        write_parquet_atomic(self.roc, directory / f"{stem}{ROC_SUFFIX}")
        if self.queries is not None:  # before the checksummed row, which marks the result complete
            write_parquet_atomic(self.queries, directory / f"{stem}{QUERIES_SUFFIX}")
        if self.null_queries is not None:
            write_parquet_atomic(self.null_queries, directory / f"{stem}{NULL_QUERIES_SUFFIX}")
        payload = json.dumps(self.row, sort_keys=True, default=_jsonable)
        digest = hashlib.sha256(payload.encode()).hexdigest()
        return write_json_atomic(directory / f"{stem}{ROW_SUFFIX}", {"row": json.loads(payload), "sha256": digest},
                                 indent=None, allow_nan=True)

    @classmethod
    def load(cls, directory: str | Path, stem: str) -> ProbeResult | None:
        """A stored result, or None when any part is missing or fails its checksum (then it is recomputed)."""
        import warnings

        directory = Path(directory)
        main = directory / f"{stem}{ROW_SUFFIX}"
        if not main.exists():
            return None  # not computed yet

        def damaged(path: Path, why: str) -> None:  # said on the console: a resume names what it recomputes
            warnings.warn(f"probe result {path} {why}; recomputing it", stacklevel=3)

        try:
            stored = json.loads(main.read_text())
        except (OSError, ValueError):
            damaged(main, "is damaged (not JSON)")
            return None
        payload = json.dumps(stored.get("row") if isinstance(stored, dict) else None, sort_keys=True)
        if not isinstance(stored, dict) or hashlib.sha256(payload.encode()).hexdigest() != stored.get("sha256"):
            damaged(main, "fails its checksum")
            return None
        parts = {}
        optional = (QUERIES_SUFFIX, NULL_QUERIES_SUFFIX)  # absent from results stored before them
        for suffix in (MANIPULATION_SUFFIX, ROC_SUFFIX, *optional):
            path = directory / f"{stem}{suffix}"
            parts[suffix] = read_parquet_checked(path)
            if parts[suffix] is None and (path.exists() or suffix not in optional):
                if not path.exists():  # a damaged one was named by read_parquet_checked already
                    damaged(path, "is missing")
                return None
        return cls(stored["row"], parts[MANIPULATION_SUFFIX], parts[ROC_SUFFIX], queries=parts[QUERIES_SUFFIX],
                   null_queries=parts[NULL_QUERIES_SUFFIX])


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if hasattr(value, "value"):
        return value.value
    return str(value)


def _cached_frame(path: Path, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """The table at ``path``, computed and written (atomically) when it is missing or unreadable."""
    cached = read_parquet_checked(path)
    if cached is None:
        cached = compute()
        write_parquet_atomic(cached, path)
    return cached


def base_icl(cache_dir: str | Path, task: Any, base_digest: str,
             base_model: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The base model's ordinary ICL per query, cached like the reference scores: (loss, p) of the label as
    probed, and the loss of the table's own label (what the collapse indicators read). Predicted exactly as
    the checkpoints are (``probes.known_context``: in multi_random no row with itself in its context); the
    leave-one-out computation has its own cache key, so a frame cached with C' as every row's context is
    never read for it, while the fixed-context regimes keep theirs (same numbers, same key)."""
    plan = KnownContextPlan.for_task(task)

    def compute() -> pd.DataFrame:
        predictions = known_context_predictions(resolve_model(base_model), task, plan=plan)
        return pd.DataFrame({"loss": predictions.loss, "p_true": predictions.p_true,
                             "loss_original": predictions.loss_original})

    tag = plan.cache_tag()
    name = f"base_icl2_{task.fingerprint[:16]}_{base_digest}" if not tag else \
        f"base_icl_{tag}_{task.fingerprint[:16]}_{base_digest}"
    cached = _cached_frame(Path(cache_dir) / f"{name}.parquet", compute)
    return cached["loss"].to_numpy(), cached["p_true"].to_numpy(), cached["loss_original"].to_numpy()


# plans over other rows than a task's own (null-split pools, canaries), built once per key in a process and
# reused for every checkpoint
_DERIVED_PLANS: dict[tuple[Any, ...], ProbePlan] = {}
_DERIVED_PLANS_MAX = 64


def _derived_plan(key: tuple[Any, ...], plan: ProbePlan, query_ids: np.ndarray, member: np.ndarray,
                  labels: np.ndarray, features: np.ndarray, n_classes: int) -> ProbePlan:
    """A plan over the given rows with ``plan``'s suite, seed, row compression, C' statistics and columns."""
    key = (*key, plan.suite_fingerprint, plan.seed, plan.row_weights is not None)
    if key not in _DERIVED_PLANS:
        if len(_DERIVED_PLANS) >= _DERIVED_PLANS_MAX:
            _DERIVED_PLANS.pop(next(iter(_DERIVED_PLANS)))
        queries = ProbeQueries(query_ids=np.asarray(query_ids, np.int64), member=np.asarray(member, bool),
                               labels=np.asarray(labels, np.int64), features=np.asarray(features, np.float32),
                               n_classes=int(n_classes), reference_rows=plan.queries.reference_rows,
                               columns=plan.queries.columns)
        _DERIVED_PLANS[key] = ProbePlan.build(queries, plan.suite, plan.seed, compress_rows=plan.row_weights is not None)
    return _DERIVED_PLANS[key]


def null_pool_plan(task: Any, splits: list[tuple[np.ndarray, np.ndarray]], plan: ProbePlan) -> ProbePlan:
    """One probe plan over the union of the rows of ``splits`` (same suite, seed and row compression as
    ``plan``). A query's contexts depend only on (seed, query id, label), never on the other queries, so
    scoring the union once and cutting it into the splits gives each split the scores it would get alone,
    at the cost of scoring each row once however many splits share it."""
    rows = np.unique(np.concatenate([np.concatenate(s) for s in splits]))
    return _derived_plan(("null", task.fingerprint, hashlib.sha256(rows.tobytes()).hexdigest()), plan,
                         np.asarray(task.row_ids)[rows], np.zeros(len(rows), dtype=bool),  # each split sets its own flags
                         np.asarray(task.labels)[rows], np.asarray(task.features)[rows], task.n_classes)


def verdicts_by_rule(evidence: Any, thresholds: OutcomeThresholds, n_checkpoints: int) -> dict[VerdictRule, Any]:
    """The checkpoint's verdict under every rule whose error rate is measured (same thresholds otherwise)."""
    return {r: classify(evidence, thresholds.for_rule(r), n_checkpoints) for r in VerdictRule}


def _null_record(index: int, evidence: Any, verdicts: dict[VerdictRule, Any], n_members: int,
                 n_nonmembers: int, blind_auc: float = float("nan")) -> dict[str, Any]:
    """What the error-rate tables need of one null split on one checkpoint: its size, the calibrated AUC,
    interval and p-value per score kind (the peak selection reads the AUCs), its verdict per rule, and its
    blind baseline's AUC (both sides carry labels from one generator, so it sits at chance)."""
    rec: dict[str, Any] = {"index": int(index), "n_members": int(n_members), "n_nonmembers": int(n_nonmembers),
                           "blind_auc": float(blind_auc)}
    for k, m in evidence.calibrated.items():
        kv = ScoreKind(k).value
        rec[f"auc_{kv}"] = float(m.auc)
        rec[f"auc_low_{kv}"] = float(m.auc_interval.low)
        rec[f"p_value_{kv}"] = float(m.p_value)
    for r, v in verdicts.items():
        rec[f"outcome_{r.value}"] = v.outcome.value
    return rec


def _metrics_columns(m: Any, prefix: str) -> dict[str, Any]:
    """AUC, its interval and p-value, and TPR at 1% / 10% (with intervals) of one metrics object."""
    return {
        f"{prefix}auc": m.auc, f"{prefix}auc_low": m.auc_interval.low, f"{prefix}auc_high": m.auc_interval.high,
        f"{prefix}p_value": m.p_value,
        f"{prefix}tpr_at_1pct": m.tpr_at_1pct.tpr, f"{prefix}tpr_at_10pct": m.tpr_at_10pct.tpr,
        f"{prefix}tpr_at_1pct_low": m.tpr_at_1pct_interval.low,
        f"{prefix}tpr_at_1pct_high": m.tpr_at_1pct_interval.high,
        f"{prefix}tpr_at_10pct_low": m.tpr_at_10pct_interval.low,
        f"{prefix}tpr_at_10pct_high": m.tpr_at_10pct_interval.high,
    }


def probe_checkpoint(
    model: Any,
    task: Any,
    plan: ProbePlan,
    cache_dir: str | Path,
    base_digest: str,
    base_model: Any | Callable[[], Any],
    settings: ProbeSettings,
    identity: Mapping[str, Any],
    epoch: int,
    canaries: Any = None,
    base_plan: tuple[str, ProbePlan] | None = None,
) -> ProbeResult:
    """Probe ``model`` (a checkpoint of the run ``identity``) against the shared reference model.

    A fine-tuned checkpoint is also probed on ``settings.null_splits`` null splits of the task (rows it
    never saw, labelled member / non-member at random, see ``trainables.data.null_split``); the untouched
    base model (the pipeline sanity check) is not, its ΔS being zero by construction. With ``canaries`` (the
    run's ``trainables.canaries.CanarySet``) the row also carries each canary's exposure (``canary_*``).
    ``base_plan`` = (task fingerprint, plan) of another split of the same queries whose base-model scores
    stand in for this plan's (a reference trial uses its target's): same rows, labels and contexts, only
    the member flags differ, and those are taken from ``plan``. ``identity``: the run's
    ``iclmem.record.RunIdentity`` columns and any other declared run columns (config hash, DP settings);
    :meth:`ProbeResult.save` refuses a row without all of them."""
    decimals = settings.output_decimals
    if base_plan is None:
        reference = reference_scores(cache_dir, task.fingerprint, plan, base_digest, base_model, decimals)
    else:
        reference = with_member_flags(reference_scores(cache_dir, base_plan[0], base_plan[1], base_digest, base_model,
                                                       decimals), plan)
    finetuned = score(model, plan, decimals=decimals)
    # C' as the known context, no row in its own (multi_random audits C': probes.known_context)
    predictions = known_context_predictions(model, task, regime=identity.get("regime"))
    loss_ft = predictions.loss
    loss_base, _, loss_base_original = base_icl(cache_dir, task, base_digest, base_model)
    # ICLPredictions hold members then non-members (ProbeQueries.from_task's order)
    member_first = np.arange(len(task.member_idx) + len(task.nonmember_idx)) < len(task.member_idx)
    collapse = collapse_indicators(predictions, loss_base, loss_base_original, member_first)
    ratio, std = collapse["loss_ratio"], collapse["output_std"]
    th = settings.thresholds
    n_ckpt = settings.n_checkpoints
    fine_tuned = model is not base_model
    deployed_state = deployed_seed(identity)  # the deployed classifier's random_state (recipe upstream only)
    evidence = build_evidence(finetuned, reference, ratio, std, thresholds=th, n_resamples=settings.n_resamples,
                              seed=settings.bootstrap_seed, model_was_fine_tuned=fine_tuned)
    verdicts = verdicts_by_rule(evidence, th, n_ckpt)
    verdict = verdicts[th.verdict_rule]
    outcome = CheckpointOutcome(epoch, evidence, verdict)

    scores = MembershipInput.from_scores_tables(finetuned, reference)
    kind, row = headline_columns(scores, evidence, verdict, settings)
    # sanity_check: the untouched base model probed as a checkpoint (ΔS ≡ 0: a pipeline check, not a control)
    row = {**identity, **outcome.as_dict(), "sanity_check": not fine_tuned, "rule": th.verdict_rule.value,
           **{f"outcome_{r.value}": v.outcome.value for r, v in verdicts.items()}, **row,
           **collapse, **blind_columns(task),
           "n_members": int(plan.queries.member.sum()), "n_nonmembers": int((~plan.queries.member).sum()),
           **icl_utility_columns(predictions, plan.queries.member),
           **deployed_utility_columns(model, task, seed=deployed_state)}
    collapsed = verdict.checks.get(Outcome.COLLAPSE.value, False)
    row.update(known_context_columns(loss_ft, loss_base, plan.queries.member, settings, collapsed=collapsed))
    if decimals is not None:
        row.update(rounded_columns(finetuned, reference, kind, loss_ft, loss_base, plan.queries.member, ratio, std,
                                   settings, fine_tuned, collapsed))
    deployed_losses: tuple[np.ndarray, np.ndarray] | None = None
    if fine_tuned:
        deployed = deployed_known_context(model, task, cache_dir, base_digest, base_model, settings,
                                          collapsed=collapsed, seed=deployed_state)
        if deployed is not None:
            deployed_columns, deployed_losses = deployed
            row.update(deployed_columns)
    null_row, null_queries = _null_columns(model, task, plan, cache_dir, base_digest, base_model, settings, ratio,
                                           std, fine_tuned, collapsed=collapsed, seed=deployed_state)
    row.update(null_row)
    if canaries is not None:
        row.update(canary_columns(model, task, plan, canaries, cache_dir, base_digest, base_model, settings,
                                  int(identity.get("seed", 0))))

    manip = per_manipulation_auc(finetuned, reference)
    manip = manip.reset_index()[["manipulation", "category", ScoreKind.LOSS.value]].rename(columns={ScoreKind.LOSS.value: "auc"})
    manip.insert(0, "epoch", epoch)
    manip.insert(0, "run_id", identity.get("run_id", ""))

    calibrated = scores.membership_scores(kind, Calibration.CALIBRATED)
    curve = roc_curve(calibrated.members, calibrated.nonmembers)
    roc = pd.DataFrame({"fpr": curve.fpr, "tpr": curve.tpr})
    queries = query_table(finetuned, reference, plan, loss_ft, loss_base, decimals)
    if deployed_losses is not None:
        # the deployed channel's per-row losses: the reference attacks' inputs through the deployed classifier
        queries = queries.join(deployed_statistics(plan.queries.query_ids, *deployed_losses), on="query_id")
    if fine_tuned and settings.context_channel_references:
        queries = queries.join(context_channel_table(model, plan, settings, int(identity.get("seed", 0)), task),
                               on="query_id")
    return ProbeResult(row, manip, roc, queries=queries, null_queries=null_queries)


def context_channel_table(model: Any, plan: ProbePlan, settings: ProbeSettings, seed: int,
                          task: Any = None) -> pd.DataFrame:
    """The context channel of the same rows (:mod:`probes.two_channel`): each query row's deployed-context flag
    (half of the members and half of the non-members, drawn from the run's seed) and every deployed-context
    attack's score of it through the fine-tuned ``model``, indexed by query id. With ``task`` also the control
    (``context_control__<attack>``): the same attacks with a context of rows the run never saw, the deployed
    context's label counts, as the deployed context, against the same references and flags: a null of the
    channel (absent when the task has too few free rows of some label)."""
    from probes.attacks.scorers import AdapterScorer
    from probes.two_channel import (
        CONTEXT_CHANNEL_PREFIX,
        CONTEXT_CONTROL_PREFIX,
        IN_CONTEXT_COLUMN,
        context_channel_targets,
        control_context_rows,
        deployed_context_mask,
    )

    q = plan.queries
    in_context = deployed_context_mask(q.member, q.labels, seed)
    control = None
    if task is not None:
        used = np.zeros(len(task.labels), dtype=bool)
        used[np.concatenate([np.asarray(task.member_idx), np.asarray(task.nonmember_idx),
                             np.asarray(task.context_idx)])] = True
        free = np.flatnonzero(~used)
        rows = control_context_rows(q.labels[in_context], free, np.asarray(task.labels)[free], seed)
        if rows is not None:
            control = (np.asarray(task.features, dtype=np.float32)[rows], np.asarray(task.labels, np.int64)[rows])
    scored = context_channel_targets(AdapterScorer(model, q.n_classes, q.columns), q.features, q.labels, in_context,
                                     q.n_classes, settings.context_channel_references, seed, control)
    columns: dict[str, Any] = {IN_CONTEXT_COLUMN: in_context}
    for target, prefix in ((ContextTarget.DEPLOYED, CONTEXT_CHANNEL_PREFIX), (ContextTarget.CONTROL,
                                                                              CONTEXT_CONTROL_PREFIX)):
        columns.update({f"{prefix}{a}": v for a, v in scored.get(target, {}).items()})
    table = pd.DataFrame(columns, index=np.asarray(q.query_ids, np.int64))
    table.index.name = "query_id"
    return table


def canary_plan(task: Any, canaries: Any, plan: ProbePlan) -> ProbePlan:
    """The probe plan of a run's canaries (inserted ones as members, held-out ones as non-members), with
    the task's plan's suite, seed, context statistics and columns."""
    return _derived_plan(("canaries", task.fingerprint, canaries.fingerprint), plan, canaries.ids, canaries.inserted,
                         canaries.labels, canaries.features, task.n_classes)


def canary_columns(model: Any, task: Any, plan: ProbePlan, canaries: Any, cache_dir: str | Path, base_digest: str,
                   base_model: Any, settings: ProbeSettings | None = None, tie_seed: int = 0) -> dict[str, Any]:
    """Exposure of the run's canaries at this checkpoint (``probes.canaries``): the probe's calibrated
    loss and the known-context calibrated loss of every canary, inserted and held out, and the rank of its
    trained label; the base model's statistics of both are computed once and cached like the reference
    scores of the real split. Beside them the rank tests' p-values and, for one_run canaries, the one-run
    ε lower bound at ``settings.canary_beta`` and δ ``settings.canary_delta`` (unset: the outcome's
    ``epsilon_delta``), guesses' ties broken by ``tie_seed``."""
    settings = settings or ProbeSettings()
    cplan = canary_plan(task, canaries, plan)
    ref_key = f"{task.fingerprint}|canaries|{canaries.fingerprint}"
    reference = robustness_scores(reference_scores(cache_dir, ref_key, cplan, base_digest, base_model))
    finetuned = robustness_scores(score(model, cplan))
    ids = np.asarray(canaries.ids, np.int64)
    loss = ScoreKind.LOSS.value
    probe_stat = membership_score(ScoreKind.LOSS, finetuned.loc[ids, loss].to_numpy() - reference.loc[ids, loss].to_numpy())
    labels = torch.from_numpy(np.asarray(canaries.labels, np.int64))

    def base_loss() -> pd.DataFrame:
        log_probs = icl_log_probs(resolve_model(base_model), task, canaries.features, plan.queries.columns)
        return pd.DataFrame({"loss": distribution_scores(log_probs, labels)["loss"].astype(np.float64)})

    lp_ft = icl_log_probs(model, task, canaries.features, plan.queries.columns)
    loss_base = _cached_frame(Path(cache_dir) / f"base_icl_canaries_{task.fingerprint[:16]}_"
                              f"{canaries.fingerprint[:16]}_{base_digest}.parquet", base_loss)["loss"].to_numpy()
    known_stat = membership_score(ScoreKind.LOSS,
                                  distribution_scores(lp_ft, labels)["loss"].astype(np.float64) - loss_base)
    records = canary_records(ids, canaries.kinds, canaries.copies, probe_stat, known_stat,
                             label_ranks(lp_ft.numpy(), canaries.labels), int(task.n_classes))
    out = canary_summary_columns(records)
    # every canary, held-out ones too, for the risk report's ranking (orchestrator/report/record_risk.py)
    out["canary_scores"] = json.dumps([{"id": int(i), "kind": CanaryKind(k).value, "copies": int(c),
                                        "probe_stat": float(p), "known_context_stat": float(s)}
                                       for i, k, c, p, s in zip(ids, canaries.kinds, canaries.copies, probe_stat,
                                                                known_stat, strict=True)], sort_keys=True)
    out.update(canary_tests(canaries.kinds, canaries.copies, probe_stat, known_stat, settings.canary_beta))
    if canaries.settings.design is CanaryDesign.ONE_RUN:
        delta = settings.thresholds.epsilon_delta if settings.canary_delta is None else settings.canary_delta
        out.update(one_run_columns(canaries.copies, probe_stat, known_stat, delta, settings.canary_beta, tie_seed))
    return out


def rounded_columns(finetuned: pd.DataFrame, reference: pd.DataFrame, kind: ScoreKind, loss_ft: np.ndarray,
                    loss_base: np.ndarray, member: np.ndarray, ratio: float, std: float, settings: ProbeSettings,
                    fine_tuned: bool = True, collapsed: bool = False) -> dict[str, Any]:
    """The rounded re-test of one checkpoint (``settings.output_decimals`` d): the verdict, the headline metrics and
    the known-context flag once more, on the outputs rounded to d decimals as a deployed model returns them.

    The rounded scores tables (:func:`probes.scoring.rounded_view` of the tables scored with d) go through the
    same :func:`build_evidence` and the sweep's rule with the same thresholds, family (n_checkpoints) and bootstrap
    seed; the collapse indicators are the exact ones (collapse is the model's state, not what an attacker
    reads), so a collapsed checkpoint stays collapsed. ``rounded_auc*`` / ``rounded_p_value`` are the calibrated
    metrics of ``kind`` (the row's headline kind, chosen on the exact outputs); the known-context columns are the
    calibrated loss attack on the rounded losses of the checkpoint and the base model, with the exact flag's rule."""
    d = settings.output_decimals
    if d is None:
        raise ProbeError("the rounded re-test needs probe setting output_decimals")
    th = settings.thresholds
    evidence = build_evidence(rounded_view(finetuned), rounded_view(reference), ratio, std, thresholds=th,
                              n_resamples=settings.n_resamples, seed=settings.bootstrap_seed,
                              model_was_fine_tuned=fine_tuned)
    verdict = classify(evidence, th.for_rule(th.verdict_rule), settings.n_checkpoints)
    m = evidence.calibrated[kind]
    member = np.asarray(member, dtype=bool)
    known = _known_context_metrics(rounded_loss(loss_ft, d) - rounded_loss(loss_base, d), member,
                                   Calibration.CALIBRATED, settings)
    return {"output_decimals": int(d), f"{ROUNDED_PREFIX}outcome": verdict.outcome.value,
            f"{ROUNDED_PREFIX}auc": m.auc, f"{ROUNDED_PREFIX}auc_low": m.auc_interval.low,
            f"{ROUNDED_PREFIX}auc_high": m.auc_interval.high, f"{ROUNDED_PREFIX}p_value": m.p_value,
            **{f"{ROUNDED_PREFIX}known_context_calibrated_{name}": value for name, value in
               (("auc", known.auc), ("auc_low", known.auc_interval.low), ("auc_high", known.auc_interval.high),
                ("p_value", known.p_value))},
            f"{ROUNDED_PREFIX}known_context_memorization_flag": _known_context_flag(known, settings, collapsed)}


def headline_columns(scores: MembershipInput, evidence: Any, verdict: Any,
                     settings: ProbeSettings) -> tuple[ScoreKind, dict[str, Any]]:
    """The headline kind and the row's metric columns.

    Headline kind: the deciding one, else the competing kind with the highest calibrated AUC. Every
    headline column (AUC, interval, p-value, TPRs with intervals, raw and reference-only AUC, and the ROC
    drawn from it) is of this one kind. Beside them: calibrated, uncalibrated and reference-only metrics of
    every score kind, and the raw-score memorization flag (the same rule, over the same competing kinds,
    on S instead of ΔS: paper App. 7.4)."""
    th, n_ckpt = settings.thresholds, settings.n_checkpoints
    kw = dict(alphas=(0.01, 0.10, th.memorization_alpha), n_resamples=settings.n_resamples,
              seed=settings.bootstrap_seed, epsilon_delta=th.epsilon_delta)
    competing = [k for k in th.score_kinds if k in evidence.calibrated] or list(evidence.calibrated)
    kind = ScoreKind(verdict.score_kind or max(competing, key=lambda k: evidence.calibrated[k].auc))
    uncal = scores.uncalibrated(**kw)
    ref_only = scores.reference_only(**kw)
    raw_flags = {k: memorization_holds(uncal[k], th, n_ckpt) for k in competing}
    raw_kind = max((k for k in competing if raw_flags[k]), key=lambda k: uncal[k].auc, default=None)
    row: dict[str, Any] = {
        "score_kind": kind.value,
        **_metrics_columns(evidence.calibrated[kind], ""),
        "p_value_threshold": th.p_value_threshold(n_ckpt), "n_checkpoints_in_family": n_ckpt,
        "mu_gap": evidence.gap.mu_gap, "sigma_gap": evidence.gap.sigma_gap,
        "raw_auc": uncal[kind].auc, "ref_auc": ref_only[kind].auc,
        "reasons": json.dumps(verdict.reasons, default=_jsonable, sort_keys=True),
    }
    for k in SCORE_KINDS:
        if k not in evidence.calibrated:
            continue
        row[f"auc_{k.value}"] = evidence.calibrated[k].auc
        row[f"raw_auc_{k.value}"] = uncal[k].auc
        row[f"ref_auc_{k.value}"] = ref_only[k].auc
        row.update(uncal[k].as_dict())
        row.update(ref_only[k].as_dict())
    row["raw_memorization_flag"] = raw_kind is not None
    row["raw_score_kind"] = None if raw_kind is None else raw_kind.value
    row["calibrated_memorization_flag"] = bool(verdict.checks.get(Outcome.MEMORIZATION.value, False))
    row["raw_outcome"] = (Outcome.MEMORIZATION if row["raw_memorization_flag"] else Outcome.NO_SIGNAL).value
    return kind, row


def known_context_columns(loss_ft: np.ndarray, loss_base: np.ndarray, member: np.ndarray,
                          settings: ProbeSettings, collapsed: bool = False) -> dict[str, Any]:
    """The known-context baseline: the plain loss attack on the exact fine-tuning context-query pairs.

    The attacker knows C' and asks the checkpoint for each query's label with C' as context (the per-epoch
    evaluation's computation, per query); lower loss = member. An upper bound of what the checkpoint
    leaks in its own training setting, beside the zero-information probe. ``known_context_calibrated_*``
    subtracts the base model's loss on the same pair.

    ``known_context_memorization_flag``: the memorization rule (:func:`probes.outcomes.memorization_holds`,
    the run's thresholds) on the calibrated known-context loss, in a selection-aware family of its own (one
    score per checkpoint), never on a collapsed checkpoint. It does not decide the outcome, which stays the
    zero-information probe's (the method's contract); it is the second channel a verdict of no_signal must
    be read with, because a model whose in-context read-out finds a memorized label only among rows like C'
    (TabICL's architecture, docs/METHOD.md "Where the zero-information probe is blind") shows nothing in a
    context of copies of the query."""
    member = np.asarray(member, dtype=bool)
    raw = _known_context_metrics(np.asarray(loss_ft, np.float64), member, Calibration.UNCALIBRATED, settings)
    calibrated = _known_context_metrics(np.asarray(loss_ft, np.float64) - np.asarray(loss_base, np.float64), member,
                                        Calibration.CALIBRATED, settings)
    return {**_metrics_columns(raw, "known_context_"), **_metrics_columns(calibrated, "known_context_calibrated_"),
            "known_context_memorization_flag": _known_context_flag(calibrated, settings, collapsed)}


def _known_context_metrics(loss: np.ndarray, member: np.ndarray, calibration: Calibration,
                           settings: ProbeSettings) -> Any:
    """The loss attack's metrics on one known-context loss (lower = member), at the rule's alphas."""
    alphas = tuple(dict.fromkeys((0.01, 0.10, float(settings.thresholds.memorization_alpha))))
    s = membership_score(ScoreKind.LOSS, loss)
    return membership_metrics(s[member], s[~member], ScoreKind.LOSS, calibration, alphas=alphas,
                              n_resamples=settings.n_resamples, seed=settings.bootstrap_seed)


def _known_context_flag(calibrated: Any, settings: ProbeSettings, collapsed: bool) -> bool:
    """The memorization rule on the calibrated known-context metrics, its own family (one score per checkpoint),
    never on a collapsed checkpoint."""
    return bool(not collapsed and memorization_holds(calibrated, settings.thresholds, settings.n_checkpoints,
                                                     n_competing=1))



def deployed_known_context_columns(model: Any, task: Any, cache_dir: str | Path, base_digest: str,
                                   base_model: Any, settings: ProbeSettings, collapsed: bool = False,
                                   split_tag: str = "", seed: int | None = None) -> dict[str, Any]:
    """The columns of :func:`deployed_known_context` (empty for every model but recipe upstream's)."""
    deployed = deployed_known_context(model, task, cache_dir, base_digest, base_model, settings, collapsed=collapsed,
                                      split_tag=split_tag, seed=seed)
    return {} if deployed is None else deployed[0]


def deployed_known_context(model: Any, task: Any, cache_dir: str | Path, base_digest: str,
                           base_model: Any, settings: ProbeSettings, collapsed: bool = False,
                           split_tag: str = "", seed: int | None = None
                           ) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray]] | None:
    """A model fine-tuned by its package's own fine-tuner (``recipe`` upstream): the known-context channel
    scored as the package deploys the weights (``trainables.upstream.deployed_losses``: its preprocessing and
    ensemble, C' as the context, ``seed`` its ``random_state``: :func:`deployed_seed`), calibrated by the base
    weights deployed the same way under the same seed (cached like :func:`base_icl`): (the columns of
    :func:`known_context_columns` prefixed ``deployed_`` and ``deployed_known_context_memorization_flag``, (the
    per-row losses float64 [n_members + n_nonmembers] on the checkpoint and on the base, members first)). The
    package fine-tunes on its own preprocessed features, so what it memorized can show here and not through the
    raw network on iclmem's encoding; the raw channel's columns stay beside it, so a report shows both and
    their difference. None for every other model. ``split_tag`` names another split of the same task (a null
    split: ``null<j>``) in the base model's cache key, whose rows differ while the task's fingerprint does not."""
    from trainables.upstream import deployed_losses, upstream_options

    if not upstream_options(getattr(model, "options", {})):
        return None

    def compute() -> pd.DataFrame:
        return pd.DataFrame({"loss": deployed_losses(resolve_model(base_model), task, seed=seed)})

    # the deployed classifier reads the model's options (its ensemble size, preprocessing) and its seed, so both
    # are in the key
    deployment = {k: v for k, v in sorted(model.options.items()) if k != "weights"}
    options_key = hashlib.sha256(json.dumps(deployment, sort_keys=True, default=str).encode()).hexdigest()[:12]
    seed_tag = "" if seed is None else f"s{int(seed)}_"
    cache_name = f"base_deployed_{split_tag}{seed_tag}{task.fingerprint[:16]}_{base_digest}_{options_key}"
    loss_base = _cached_frame(Path(cache_dir) / f"{cache_name}.parquet", compute)["loss"].to_numpy(np.float64)
    loss_ft = np.asarray(deployed_losses(model, task, seed=seed), np.float64)
    member = np.arange(len(task.member_idx) + len(task.nonmember_idx)) < len(task.member_idx)
    columns = known_context_columns(loss_ft, loss_base, member, settings, collapsed=collapsed)
    return {DEPLOYED_PREFIX + name: value for name, value in columns.items()}, (loss_ft, loss_base)


def _null_known_context_losses(model: Any, task: Any, index: int, split: tuple[np.ndarray, np.ndarray],
                               cache_dir: str | Path, base_digest: str,
                               base_model: Any) -> tuple[np.ndarray, np.ndarray]:
    """The known-context losses (float64, the split's members then non-members) of null split ``index``
    (``split``: its fake members and non-members, rows the run never saw), predicted with C' as the context by the
    checkpoint and by the base model (cached per split)."""
    null_task = dataclasses.replace(task, member_idx=split[0], nonmember_idx=split[1])

    def compute() -> pd.DataFrame:
        return pd.DataFrame({"loss": icl_predictions(resolve_model(base_model), null_task).loss})

    name = f"base_icl_null{index}_{task.fingerprint[:16]}_{base_digest}"
    loss_base = _cached_frame(Path(cache_dir) / f"{name}.parquet", compute)["loss"].to_numpy()
    return np.asarray(icl_predictions(model, null_task).loss, np.float64), np.asarray(loss_base, np.float64)


def _null_known_context_flag(loss_ft: np.ndarray, loss_base: np.ndarray, member: np.ndarray,
                             settings: ProbeSettings, collapsed: bool) -> bool:
    """The known-context flag on a null split's losses (:func:`_null_known_context_losses`): the flag's own rule on
    the calibrated loss. Set, it is a false positive of the known-context channel."""
    return _known_context_flag(_known_context_metrics(loss_ft - loss_base, member, Calibration.CALIBRATED, settings),
                               settings, collapsed)


def null_query_frame(index: int, finetuned: pd.DataFrame, reference: pd.DataFrame, query_ids: np.ndarray,
                     loss_ft: np.ndarray, loss_base: np.ndarray, decimals: int | None = None) -> pd.DataFrame:
    """One null split's rows of ``ProbeResult.null_queries``: ``null_index``, then :func:`score_statistics` of its
    scores tables (``member``: the split's fake flag) joined with :func:`known_context_statistics` of its known-context
    losses (``query_ids``: the split's members then non-members, the losses' order)."""
    out = score_statistics(finetuned, reference, decimals)
    out.insert(0, "null_index", np.full(len(out), int(index), dtype=np.int64))
    known = known_context_statistics(query_ids, loss_ft, loss_base, decimals)
    return out.join(known, on="query_id").reset_index(drop=True)


def _null_columns(model: Any, task: Any, plan: ProbePlan, cache_dir: str | Path, base_digest: str,
                  base_model: Any, settings: ProbeSettings, ratio: float, std: float,
                  fine_tuned: bool, collapsed: bool = False,
                  seed: int | None = None) -> tuple[dict[str, Any], pd.DataFrame | None]:
    """Null-split columns: how many were probed, how many each rule called memorization, how many the
    known-context channel flagged (``null_known_context_flags``: the same flag as the real split's, on the null
    rows predicted with C' as the context, calibrated by the base model), and the per-split record
    (``null_evidence``, JSON) the run-headline error rates are computed from; with ``settings.output_decimals``
    each record also holds the rounded re-test's verdict under the sweep's rule (``rounded_outcome``), its
    calibrated AUC per kind (``rounded_auc_<kind>``) and its known-context flag (``rounded_known_context_flag``).
    Beside the columns: the per-split per-query statistics all of it was computed from
    (``ProbeResult.null_queries``), None when no split was probed."""
    th = settings.thresholds
    decimals = settings.output_decimals
    n = settings.null_splits if fine_tuned else 0
    records = []
    frames = []
    if n:
        splits = [null_split(task, j) for j in range(n)]
        pool_plan = null_pool_plan(task, splits, plan)
        pool_ref = reference_scores(cache_dir, task.fingerprint, pool_plan, base_digest, base_model, decimals)
        pool_ft = score(model, pool_plan, decimals=decimals)
        row_ids = np.asarray(task.row_ids)
        for j, (members, nonmembers) in enumerate(splits):
            mid, nid = row_ids[members], row_ids[nonmembers]
            ft_j, ref_j = split_scores_table(pool_ft, mid, nid), split_scores_table(pool_ref, mid, nid)
            evidence = build_evidence(ft_j, ref_j, ratio, std, thresholds=th, n_resamples=settings.n_resamples,
                                      seed=settings.bootstrap_seed)
            verdicts = verdicts_by_rule(evidence, th, settings.n_checkpoints)
            blind = task_blind_baseline(task, members, nonmembers)
            record = _null_record(j, evidence, verdicts, len(members), len(nonmembers), blind.auc)
            member = np.arange(len(members) + len(nonmembers)) < len(members)
            loss_ft, loss_base = _null_known_context_losses(model, task, j, (members, nonmembers), cache_dir,
                                                            base_digest, base_model)
            record["known_context_flag"] = _null_known_context_flag(loss_ft, loss_base, member, settings, collapsed)
            # recipe upstream: the deployed classifier's flag on the same null rows, its false-positive rate
            deployed = deployed_known_context_columns(
                model, dataclasses.replace(task, member_idx=members, nonmember_idx=nonmembers), cache_dir,
                base_digest, base_model, settings, collapsed=collapsed, split_tag=f"null{j}_", seed=seed)
            if deployed:
                record["deployed_known_context_flag"] = bool(deployed[f"{DEPLOYED_PREFIX}known_context_memorization_flag"])
            if decimals is not None:
                rounded = build_evidence(rounded_view(ft_j), rounded_view(ref_j), ratio, std, thresholds=th,
                                         n_resamples=settings.n_resamples, seed=settings.bootstrap_seed)
                record[f"{ROUNDED_PREFIX}outcome"] = classify(rounded, th.for_rule(th.verdict_rule),
                                                              settings.n_checkpoints).outcome.value
                for k, m in rounded.calibrated.items():
                    record[f"{ROUNDED_PREFIX}auc_{ScoreKind(k).value}"] = float(m.auc)
                record[f"{ROUNDED_PREFIX}known_context_flag"] = _null_known_context_flag(
                    rounded_loss(loss_ft, decimals), rounded_loss(loss_base, decimals), member, settings, collapsed)
            records.append(record)
            frames.append(null_query_frame(j, ft_j, ref_j, np.concatenate([mid, nid]), loss_ft, loss_base, decimals))
    out: dict[str, Any] = {"null_splits": n}
    for r in VerdictRule:
        out[f"null_memorization_{r.value}"] = sum(rec[f"outcome_{r.value}"] == Outcome.MEMORIZATION.value
                                                 for rec in records)
    out["null_known_context_flags"] = sum(bool(rec["known_context_flag"]) for rec in records)
    out["null_evidence"] = json.dumps(records, sort_keys=True)
    return out, (pd.concat(frames, ignore_index=True) if frames else None)


__all__ = ["ProbeResult", "ProbeSettings", "probe_checkpoint", "context_channel_table", "base_icl", "model_digest", "null_pool_plan", "verdicts_by_rule", "known_context_columns", "deployed_known_context_columns", "headline_columns", "null_query_frame", "rounded_columns"]
