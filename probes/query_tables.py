"""The per-query tables a probe stores beside its results row (``ProbeResult.queries``), sorted by query id: the
suite-mean scores S and S_ref of every score kind, the known-context losses, LiRA's per-manipulation logits and
the deployed channel's losses, each also read off rounded outputs where the probe rounds; and the scores of one
split cut from a pool's table, with its member flags. Pure pandas; never a feature value."""

from __future__ import annotations

import numpy as np
import pandas as pd

from iclmem.errors import ProbeError
from iclmem.vocab import SCORE_KINDS
from probes.attacks.membership import LOGIT_PREFIX, logit_of_loss
from probes.metrics import ScoreKind, robustness_scores
from probes.scoring import ROUNDED_PREFIX, ProbePlan, rounded_loss, rounded_view

__all__ = ["DEPLOYED_PREFIX", "deployed_statistics", "known_context_statistics", "query_table", "score_statistics", "split_scores_table"]

# the deployed channel's columns: a package fine-tune's weights as its package deploys them
DEPLOYED_PREFIX = "deployed_"


def split_scores_table(pool: pd.DataFrame, member_ids: np.ndarray, nonmember_ids: np.ndarray) -> pd.DataFrame:
    """The rows of a pool scores table that belong to one split, with that split's member flags."""
    keep = pool["query_id"].isin(np.concatenate([member_ids, nonmember_ids]))
    table = pool.loc[keep].copy()
    table["member"] = table["query_id"].isin(member_ids).to_numpy()
    return table.reset_index(drop=True)


def with_member_flags(table: pd.DataFrame, plan: ProbePlan) -> pd.DataFrame:
    """A scores table of the same queries as ``plan`` (any order, any member flags) with ``plan``'s member
    flags; a query ``plan`` does not hold is an error, not a silent drop."""
    q = plan.queries
    ids = np.asarray(q.query_ids, np.int64)
    flags = pd.Series(np.asarray(q.member, bool), index=ids)
    if set(table["query_id"].unique()) != set(ids.tolist()):
        raise ProbeError("the base-model scores stood in for another split hold other queries than the plan")
    out = table.copy()
    out["member"] = flags.loc[out["query_id"].to_numpy(np.int64)].to_numpy()
    return out


def score_statistics(finetuned: pd.DataFrame, reference: pd.DataFrame, decimals: int | None = None) -> pd.DataFrame:
    """Per query (sorted by query id): query_id, member, and S / S_ref of every score kind (``s_<kind>``,
    ``s_ref_<kind>``: means over the suite, what the calibrated metrics read), and with ``decimals`` the same of the
    rounded outputs (``rounded_s_<kind>``, ``rounded_s_ref_<kind>``)."""
    s, r = robustness_scores(finetuned), robustness_scores(reference)
    out = pd.DataFrame({"query_id": s.index.to_numpy(np.int64), "member": s["member"].to_numpy(bool)})
    views = [("", s, r)]
    if decimals is not None:
        views.append((ROUNDED_PREFIX, robustness_scores(rounded_view(finetuned)),
                      robustness_scores(rounded_view(reference))))
    for prefix, fs, rs in views:
        for k in SCORE_KINDS:
            if k.value in fs.columns:
                out[f"{prefix}s_{k.value}"] = fs[k.value].to_numpy(np.float64)
                out[f"{prefix}s_ref_{k.value}"] = rs.loc[fs.index, k.value].to_numpy(np.float64)
    return out


def known_context_statistics(query_ids: np.ndarray, loss_ft: np.ndarray, loss_base: np.ndarray,
                             decimals: int | None = None) -> pd.DataFrame:
    """Indexed by query id: the known-context loss on the checkpoint and on the base model
    (``known_context_loss``, ``known_context_loss_base``), and with ``decimals`` both read off p(y*) rounded to
    them (``rounded_known_context_loss``, ``rounded_known_context_loss_base``: :func:`probes.scoring.rounded_loss`)."""
    loss_ft, loss_base = np.asarray(loss_ft, np.float64), np.asarray(loss_base, np.float64)
    columns = {"known_context_loss": loss_ft, "known_context_loss_base": loss_base}
    if decimals is not None:
        columns[f"{ROUNDED_PREFIX}known_context_loss"] = rounded_loss(loss_ft, decimals)
        columns[f"{ROUNDED_PREFIX}known_context_loss_base"] = rounded_loss(loss_base, decimals)
    return pd.DataFrame(columns, index=np.asarray(query_ids, np.int64))


def query_table(finetuned: pd.DataFrame, reference: pd.DataFrame, plan: ProbePlan, loss_ft: np.ndarray,
                loss_base: np.ndarray, decimals: int | None = None) -> pd.DataFrame:
    """Per-query statistics of one checkpoint (see ``ProbeResult.queries``), sorted by query id: those of
    :func:`score_statistics` and :func:`known_context_statistics`, and LiRA's per-manipulation logits."""
    out = score_statistics(finetuned, reference, decimals)
    known = known_context_statistics(plan.queries.query_ids, loss_ft, loss_base, decimals)
    # LiRA's per-manipulation statistic (probes.attacks.membership): the logit of p(y*) under each manipulation, in
    # suite order, for the fine-tuned model only (each reference trial's own table holds its own)
    order = list(dict.fromkeys(finetuned["manipulation"]))
    per_manip = finetuned.pivot(index="query_id", columns="manipulation", values=ScoreKind.LOSS.value)[order]
    logits = pd.DataFrame(logit_of_loss(per_manip.to_numpy(np.float64)), index=per_manip.index.astype(np.int64),
                          columns=[f"{LOGIT_PREFIX}{m}" for m in order])
    return out.join(known, on="query_id").join(logits, on="query_id").reset_index(drop=True)


def deployed_statistics(query_ids: np.ndarray, loss_ft: np.ndarray, loss_base: np.ndarray) -> pd.DataFrame:
    """Indexed by query id: the deployed channel's per-row losses (``deployed_known_context_loss`` on the
    checkpoint, ``deployed_known_context_loss_base`` on the base weights, both deployed alike), the inputs of
    the reference attacks through the classifier the package deploys (``orchestrator.report.aggregate``)."""
    return pd.DataFrame({f"{DEPLOYED_PREFIX}known_context_loss": np.asarray(loss_ft, np.float64),
                         f"{DEPLOYED_PREFIX}known_context_loss_base": np.asarray(loss_base, np.float64)},
                        index=np.asarray(query_ids, np.int64))
