"""Membership-inference metrics for one checkpoint (IclMem Stage II, spec "Metrics").

Pure numpy/scipy/pandas. One job: from a probe's scores to a checkpoint's metrics: orienting a score kind
(:func:`membership_score`), the per-checkpoint metrics of one kind (:class:`CheckpointMetrics`), the
per-query inputs ``S`` and ``S_ref`` (:class:`MembershipInput`), the scores-table helpers and the collapse
indicators. The rank statistics they rest on (AUC, TPR at FPR, ROC, bootstrap, Mann-Whitney, Clopper-Pearson)
live in :mod:`iclmem.stats`, whose conventions hold here (members positive, AUC = Mann-Whitney with ties 1/2,
the pessimistic TPR threshold rule, the stratified bootstrap, NaN refused); they stay importable from here.

* **Orientation.** :func:`membership_score` is the one place that turns a raw score difference into
  a membership score (``-delta`` for loss and entropy, ``+delta`` for confidence).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from iclmem.errors import ProbeError
from iclmem.stats import (
    DEFAULT_ALPHAS,
    DEFAULT_RESAMPLES,
    NAN_INTERVAL,
    BootstrapIntervals,
    BootstrapReplicates,
    Interval,
    LowResolutionWarning,
    RocCurve,
    TprAtFpr,
    allowed_false_positives,
    auc,
    bootstrap_indices,
    bootstrap_intervals,
    bootstrap_replicates,
    clopper_pearson,
    mann_whitney_p,
    roc_curve,
    score_array,
    tpr_at_fpr,
)
from iclmem.vocab import SCORE_KINDS, Calibration, ScoreKind
from probes.epsilon import DEFAULT_EPSILON_DELTA, EpsilonBound, epsilon_lower_bound
from probes.gdp import GdpBound, gdp_mu_lower_bound

__all__ = [
    "ScoreKind",
    "Calibration",
    "SCORE_KINDS",
    "SCORES_TABLE_COLUMNS",
    "DEFAULT_ALPHAS",
    "LowResolutionWarning",
    "membership_score",
    "auc",
    "TprAtFpr",
    "allowed_false_positives",
    "tpr_at_fpr",
    "RocCurve",
    "roc_curve",
    "Interval",
    "BootstrapReplicates",
    "bootstrap_indices",
    "bootstrap_replicates",
    "BootstrapIntervals",
    "bootstrap_intervals",
    "CheckpointMetrics",
    "membership_metrics",
    "mann_whitney_p",
    "clopper_pearson",
    "SplitScores",
    "MembershipInput",
    "validate_scores_table",
    "robustness_scores",
    "per_manipulation_auc",
    "GapStats",
    "gap_stats",
    "loss_ratio",
    "output_std",
]


# --------------------------------------------------------------------------------------------------
# vocabulary and orientation
# --------------------------------------------------------------------------------------------------


SCORES_TABLE_COLUMNS: tuple[str, ...] = (
    "query_id",
    "member",
    "manipulation",
    "category",
    "loss",
    "entropy",
    "confidence",
)


def membership_score(kind: ScoreKind | str, delta: Any) -> np.ndarray:
    """Orient a score (difference) so that members are the positive class.

    THE single place orientation is written. Fine-tuning on a row lowers its loss and entropy and
    raises its confidence, so the membership score is ``-delta`` for ``loss`` and ``entropy`` and
    ``+delta`` for ``confidence``. Higher membership score = more likely a member. ``delta`` is usually
    ``Delta S = S - S_ref`` but the same orientation applies to ``S`` or ``S_ref`` alone.
    """
    kind = _kind(kind)
    arr = np.asarray(delta, dtype=np.float64)
    if kind in (ScoreKind.LOSS, ScoreKind.ENTROPY):
        return -arr
    return arr.copy()


def _kind(kind: ScoreKind | str) -> ScoreKind:
    try:
        return ScoreKind(kind)
    except ValueError:
        raise ProbeError(
            f"unknown score kind {kind!r}; expected one of {[k.value for k in ScoreKind]}"
        ) from None


# --------------------------------------------------------------------------------------------------
# per-checkpoint metrics for one score kind
# --------------------------------------------------------------------------------------------------


def _alpha_label(alpha: float) -> str:
    return f"{alpha * 100:g}pct"


_V = TypeVar("_V")


def _lookup_alpha(table: Mapping[float, _V], alpha: float, what: str) -> _V:
    for a, v in table.items():
        if math.isclose(a, alpha, rel_tol=0.0, abs_tol=1e-12):
            return v
    raise ProbeError(f"{what} was not computed at alpha={alpha:g} (have {sorted(table)})")


@dataclass(frozen=True)
class CheckpointMetrics:
    """AUC and TPR@alpha (with bootstrap intervals) of one score kind under one calibration."""

    kind: ScoreKind
    calibration: Calibration
    auc: float
    auc_interval: Interval
    tpr: dict[float, TprAtFpr]  # alpha -> details
    tpr_interval: dict[float, Interval]  # alpha -> bootstrap interval of the TPR
    member_mean: float  # mean membership score of members (oriented)
    nonmember_mean: float
    n_resamples: int
    seed: int
    confidence: float = 0.95
    p_value: float = float("nan")  # one-sided Mann-Whitney p-value of the AUC (see mann_whitney_p)
    # the ε lower bound the attack implies (probes.epsilon), over every threshold of these scores
    epsilon: EpsilonBound | None = None
    # the Gaussian-DP μ lower bound of the same scores' whole ROC (probes.gdp) and the ε it implies at δ
    gdp: GdpBound | None = None

    def tpr_at(self, alpha: float) -> TprAtFpr:
        return _lookup_alpha(self.tpr, alpha, "TPR")

    def tpr_interval_at(self, alpha: float) -> Interval:
        return _lookup_alpha(self.tpr_interval, alpha, "TPR interval")

    @property
    def tpr_at_1pct(self) -> TprAtFpr:
        return self.tpr_at(0.01)

    @property
    def tpr_at_10pct(self) -> TprAtFpr:
        return self.tpr_at(0.10)

    @property
    def tpr_at_1pct_interval(self) -> Interval:
        return self.tpr_interval_at(0.01)

    @property
    def tpr_at_10pct_interval(self) -> Interval:
        return self.tpr_interval_at(0.10)

    @property
    def prefix(self) -> str:
        return f"{self.calibration.value}_{self.kind.value}"

    def as_dict(self, prefix: str | None = None) -> dict[str, float | int | str]:
        """Flat record, keys ``<calibration>_<kind>_<stat>``, e.g. ``calibrated_loss_auc``,
        ``calibrated_loss_tpr_at_1pct``, ``calibrated_loss_tpr_at_1pct_threshold``."""
        p = self.prefix if prefix is None else prefix
        out: dict[str, float | int | str] = {
            f"{p}_auc": self.auc,
            f"{p}_auc_low": self.auc_interval.low,
            f"{p}_auc_high": self.auc_interval.high,
            f"{p}_p_value": self.p_value,
        }
        for a, t in self.tpr.items():
            q = f"{p}_tpr_at_{_alpha_label(a)}"
            iv = self.tpr_interval.get(a, NAN_INTERVAL)
            out[q] = t.tpr
            out[f"{q}_low"] = iv.low
            out[f"{q}_high"] = iv.high
            out[f"{q}_threshold"] = t.threshold
            out[f"{q}_realized_fpr"] = t.realized_fpr
            out[f"{q}_n_false_positives"] = t.n_false_positives
            out[f"{q}_n_true_positives"] = t.n_true_positives
            out[f"{q}_allowed_false_positives"] = t.allowed_false_positives
        out[f"{p}_n_members"] = next(iter(self.tpr.values())).n_members if self.tpr else -1
        out[f"{p}_n_nonmembers"] = next(iter(self.tpr.values())).n_nonmembers if self.tpr else -1
        if self.epsilon is not None:
            # ``<p>_epsilon_lb`` and the δ it was computed for (``<p>_epsilon_lb_delta``) travel together, so a
            # row never states a bound without its δ; the side (a word) stays out of this numeric record
            out[f"{p}_epsilon_lb"] = self.epsilon.epsilon
            out[f"{p}_epsilon_lb_delta"] = self.epsilon.delta
        if self.gdp is not None:
            # μ, its ε, and the counts behind them (JSON): the aggregator re-reads the counts at the level the
            # checkpoint headline and the consistency checks need (probes.gdp.GridCounts)
            out.update(self.gdp.as_dict(p))
        return out


def membership_metrics(
    member_scores: Any,
    nonmember_scores: Any,
    kind: ScoreKind | str,
    calibration: Calibration | str = Calibration.CALIBRATED,
    *,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = 0.95,
    epsilon_delta: float = DEFAULT_EPSILON_DELTA,
) -> CheckpointMetrics:
    """All metrics of one kind from already-oriented membership scores (higher = member); the ε lower
    bound (:func:`probes.epsilon.epsilon_lower_bound`) and the Gaussian-DP μ bound
    (:func:`probes.gdp.gdp_mu_lower_bound`) at δ = ``epsilon_delta``, with Clopper-Pearson bounds at
    ``confidence``."""
    m = score_array(member_scores, "member scores")
    n = score_array(nonmember_scores, "non-member scores")
    alphas = tuple(dict.fromkeys(float(a) for a in alphas))
    tprs = {a: tpr_at_fpr(m, n, a) for a in alphas}
    if n_resamples > 0:
        bi = bootstrap_intervals(m, n, alphas, n_resamples, seed, confidence)
        auc_iv, tpr_iv = bi.auc, bi.tpr
    else:
        auc_iv, tpr_iv = NAN_INTERVAL, {a: NAN_INTERVAL for a in alphas}
    return CheckpointMetrics(
        kind=_kind(kind),
        calibration=Calibration(calibration),
        auc=auc(m, n),
        auc_interval=auc_iv,
        tpr=tprs,
        tpr_interval=tpr_iv,
        member_mean=float(m.mean()),
        nonmember_mean=float(n.mean()),
        n_resamples=int(n_resamples),
        seed=int(seed),
        confidence=float(confidence),
        p_value=mann_whitney_p(m, n),
        epsilon=epsilon_lower_bound(m, n, epsilon_delta, confidence),
        gdp=gdp_mu_lower_bound(m, n, epsilon_delta, confidence),
    )


# --------------------------------------------------------------------------------------------------
# per-query inputs: S and S_ref
# --------------------------------------------------------------------------------------------------


def _readonly(x: Any, name: str) -> np.ndarray:
    arr = np.array(x, dtype=np.float64).reshape(-1)
    n_nan = int(np.isnan(arr).sum())
    if n_nan:
        raise ProbeError(f"{name}: {n_nan} of {arr.size} scores are NaN")
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True, eq=False)
class SplitScores:
    """One score per member and per non-member query (raw or oriented, as the context says)."""

    members: np.ndarray
    nonmembers: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", _readonly(self.members, "members"))
        object.__setattr__(self, "nonmembers", _readonly(self.nonmembers, "nonmembers"))
        if self.members.size == 0 or self.nonmembers.size == 0:
            raise ProbeError(
                f"need at least one member and one non-member, got "
                f"{self.members.size} and {self.nonmembers.size}"
            )


@dataclass(frozen=True, eq=False)
class MembershipInput:
    """Per-query robustness scores ``S`` (fine-tuned) and ``S_ref`` (reference = base model), per
    score kind, members and non-members in the same order in both. Raw scores, not oriented."""

    fine_tuned: Mapping[ScoreKind, SplitScores]
    reference: Mapping[ScoreKind, SplitScores]
    member_ids: np.ndarray | None = None
    nonmember_ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        ft = {_kind(k): v for k, v in self.fine_tuned.items()}
        ref = {_kind(k): v for k, v in self.reference.items()}
        if set(ft) != set(ref):
            raise ProbeError(
                f"fine-tuned and reference scores cover different score kinds: "
                f"{sorted(k.value for k in ft)} vs {sorted(k.value for k in ref)}"
            )
        if not ft:
            raise ProbeError("no score kinds given")
        sizes = {(v.members.size, v.nonmembers.size) for v in (*ft.values(), *ref.values())}
        if len(sizes) != 1:
            raise ProbeError(f"score arrays differ in size across kinds/models: {sorted(sizes)}")
        object.__setattr__(self, "fine_tuned", ft)
        object.__setattr__(self, "reference", ref)

    @property
    def kinds(self) -> tuple[ScoreKind, ...]:
        return tuple(k for k in SCORE_KINDS if k in self.fine_tuned)

    @property
    def n_members(self) -> int:
        return next(iter(self.fine_tuned.values())).members.size

    @property
    def n_nonmembers(self) -> int:
        return next(iter(self.fine_tuned.values())).nonmembers.size

    def raw(self, kind: ScoreKind | str, calibration: Calibration | str) -> SplitScores:
        """Un-oriented per-query score: ``S - S_ref``, ``S`` or ``S_ref``."""
        kind, calibration = _kind(kind), Calibration(calibration)
        if kind not in self.fine_tuned:
            raise ProbeError(f"score kind {kind.value!r} not in this input")
        ft, ref = self.fine_tuned[kind], self.reference[kind]
        if calibration is Calibration.CALIBRATED:
            return SplitScores(ft.members - ref.members, ft.nonmembers - ref.nonmembers)
        if calibration is Calibration.UNCALIBRATED:
            return ft
        return ref

    def membership_scores(
        self, kind: ScoreKind | str, calibration: Calibration | str = Calibration.CALIBRATED
    ) -> SplitScores:
        """Oriented scores (higher = member), via :func:`membership_score`."""
        r = self.raw(kind, calibration)
        return SplitScores(membership_score(kind, r.members), membership_score(kind, r.nonmembers))

    def metrics(
        self,
        kind: ScoreKind | str,
        calibration: Calibration | str = Calibration.CALIBRATED,
        **kwargs: Any,
    ) -> CheckpointMetrics:
        """kwargs: ``alphas``, ``n_resamples``, ``seed``, ``confidence``, ``epsilon_delta`` of
        :func:`membership_metrics`."""
        s = self.membership_scores(kind, calibration)
        return membership_metrics(s.members, s.nonmembers, kind, calibration, **kwargs)

    def _all(self, calibration: Calibration, **kwargs: Any) -> dict[ScoreKind, CheckpointMetrics]:
        return {k: self.metrics(k, calibration, **kwargs) for k in self.kinds}

    def calibrated(self, **kwargs: Any) -> dict[ScoreKind, CheckpointMetrics]:
        """Metrics of ``Delta S = S - S_ref`` for every kind (the headline metrics)."""
        return self._all(Calibration.CALIBRATED, **kwargs)

    def uncalibrated(self, **kwargs: Any) -> dict[ScoreKind, CheckpointMetrics]:
        """Metrics of ``S`` alone (fine-tuned model, no difficulty calibration)."""
        return self._all(Calibration.UNCALIBRATED, **kwargs)

    def reference_only(self, **kwargs: Any) -> dict[ScoreKind, CheckpointMetrics]:
        """Metrics of ``S_ref`` alone (what the reference model's difficulty alone would flag)."""
        return self._all(Calibration.REFERENCE_ONLY, **kwargs)

    def calibration_impact(self, **kwargs: Any) -> pd.DataFrame:
        """One row per (kind, calibration) with AUC and TPRs, so calibration impact is visible."""
        rows = []
        for cal in Calibration:
            for kind, m in self._all(cal, **kwargs).items():
                row: dict[str, Any] = {"kind": kind.value, "calibration": cal.value}
                row.update(m.as_dict(prefix=""))
                rows.append({k.lstrip("_"): v for k, v in row.items()})
        return pd.DataFrame(rows)

    @classmethod
    def from_scores_tables(
        cls, fine_tuned: pd.DataFrame, reference: pd.DataFrame
    ) -> MembershipInput:
        """Build from two scores tables (fine-tuned, reference). Each is reduced to per-query
        robustness scores (:func:`robustness_scores`); the two must hold the same queries with the
        same member flags and the same manipulations."""
        s = robustness_scores(fine_tuned)
        r = robustness_scores(reference)
        if not s.index.equals(r.index):
            only_ft = s.index.difference(r.index)
            only_ref = r.index.difference(s.index)
            raise ProbeError(
                "fine-tuned and reference scores tables hold different queries "
                f"({len(only_ft)} only in fine-tuned, e.g. {list(only_ft[:3])}; "
                f"{len(only_ref)} only in reference, e.g. {list(only_ref[:3])})"
            )
        if not (s["member"].to_numpy() == r["member"].to_numpy()).all():
            bad = s.index[s["member"].to_numpy() != r["member"].to_numpy()]
            raise ProbeError(
                f"member flags differ between fine-tuned and reference tables for queries {list(bad[:5])}"
            )
        ft_manip = set(fine_tuned["manipulation"].unique())
        ref_manip = set(reference["manipulation"].unique())
        if ft_manip != ref_manip:
            raise ProbeError(
                "fine-tuned and reference tables use different manipulation suites: "
                f"only fine-tuned {sorted(ft_manip - ref_manip)[:5]}, "
                f"only reference {sorted(ref_manip - ft_manip)[:5]}"
            )
        mem = s["member"].to_numpy()
        kinds = [k for k in SCORE_KINDS if k.value in s.columns]
        ft = {k: SplitScores(s[k.value].to_numpy()[mem], s[k.value].to_numpy()[~mem]) for k in kinds}
        ref = {k: SplitScores(r[k.value].to_numpy()[mem], r[k.value].to_numpy()[~mem]) for k in kinds}
        return cls(
            fine_tuned=ft,
            reference=ref,
            member_ids=s.index.to_numpy()[mem],
            nonmember_ids=s.index.to_numpy()[~mem],
        )


# --------------------------------------------------------------------------------------------------
# scores tables: robustness score, per-manipulation AUC, gap statistics
# --------------------------------------------------------------------------------------------------


def validate_scores_table(df: pd.DataFrame, name: str = "scores table") -> pd.DataFrame:
    """Check the scores table contract (INTERFACES.md) and return it with ``member`` as bool.

    Refuses: missing columns, an empty table, duplicate (query_id, manipulation) rows, a query whose
    member flag varies, queries that were not all scored under the same manipulations, NaN scores,
    and a table with no members or no non-members."""
    missing = [c for c in SCORES_TABLE_COLUMNS if c not in df.columns]
    if missing:
        raise ProbeError(f"{name}: missing column(s) {missing}; expected {list(SCORES_TABLE_COLUMNS)}")
    if len(df) == 0:
        raise ProbeError(f"{name}: no rows")
    if df["member"].isna().any():
        raise ProbeError(f"{name}: column 'member' has missing values")
    for c in ("loss", "entropy", "confidence"):
        n_nan = int(pd.isna(df[c]).sum())
        if n_nan:
            raise ProbeError(f"{name}: column {c!r} has {n_nan} NaN value(s)")
    dup = df.duplicated(["query_id", "manipulation"])
    if dup.any():
        first = df.loc[dup, ["query_id", "manipulation"]].iloc[0].tolist()
        raise ProbeError(
            f"{name}: {int(dup.sum())} duplicate (query_id, manipulation) row(s), e.g. {first}"
        )
    out = df.copy()
    out["member"] = out["member"].astype(bool)
    flags = out.groupby("query_id", sort=False)["member"].nunique()
    if (flags > 1).any():
        raise ProbeError(
            f"{name}: member flag varies within query_id(s) {list(flags.index[flags > 1][:5])}"
        )
    counts = out.groupby("query_id", sort=False)["manipulation"].size()
    n_manip = out["manipulation"].nunique()
    if (counts != n_manip).any():
        short = counts.index[counts != n_manip]
        raise ProbeError(
            f"{name}: {len(short)} query(ies) were not scored under all {n_manip} manipulations, "
            f"e.g. query_id {short[0]!r} has {int(counts[short[0]])}"
        )
    per_query = out.groupby("query_id", sort=False)["member"].first()
    if per_query.all() or not per_query.any():
        raise ProbeError(f"{name}: needs both members and non-members")
    return out


def robustness_scores(df: pd.DataFrame) -> pd.DataFrame:
    """Robustness score ``S(q)`` = mean over manipulations of each score kind (spec "Scores").

    Returns a DataFrame indexed by ``query_id`` (sorted) with a bool ``member`` column and one column
    per score kind (``loss``, ``entropy``, ``confidence``). Raw scores, not oriented."""
    d = validate_scores_table(df)
    cols = [k.value for k in SCORE_KINDS]
    g = d.groupby("query_id", sort=True)
    out = g[cols].mean()
    out.insert(0, "member", g["member"].first().astype(bool))
    return out


def per_manipulation_auc(
    scores: pd.DataFrame,
    reference: pd.DataFrame | None = None,
    kinds: Iterable[ScoreKind | str] = SCORE_KINDS,
) -> pd.DataFrame:
    """AUC of each manipulation on its own (paper App. 7.3, "perturbation effectiveness").

    With ``reference`` the per-(query, manipulation) score is calibrated (``S - S_ref`` under the same
    manipulation); without it the fine-tuned score is used alone. Returns a DataFrame indexed by
    ``manipulation`` (suite order of first appearance) with ``category`` and one AUC column per kind."""
    kind_list = [_kind(k) for k in kinds]
    cols = [k.value for k in kind_list]
    d = validate_scores_table(scores, "fine-tuned scores table")
    if reference is not None:
        r = validate_scores_table(reference, "reference scores table")
        merged = d.merge(
            r[["query_id", "manipulation", "member", *cols]],
            on=["query_id", "manipulation"],
            how="outer",
            suffixes=("", "_ref"),
            indicator=True,
        )
        if (merged["_merge"] != "both").any():
            raise ProbeError(
                "fine-tuned and reference scores tables do not hold the same (query_id, manipulation) rows"
            )
        if (merged["member"].astype(bool) != merged["member_ref"].astype(bool)).any():
            raise ProbeError("member flags differ between fine-tuned and reference scores tables")
        for c in cols:
            merged[c] = merged[c] - merged[f"{c}_ref"]
        d = merged
    rows = []
    for manip, grp in d.groupby("manipulation", sort=False):
        mem = grp["member"].to_numpy(dtype=bool)
        row: dict[str, Any] = {"manipulation": manip, "category": grp["category"].iloc[0]}
        for k in kind_list:
            s = membership_score(k, grp[k.value].to_numpy())
            row[k.value] = auc(s[mem], s[~mem]) if mem.any() and (~mem).any() else float("nan")
        rows.append(row)
    return pd.DataFrame(rows).set_index("manipulation")


@dataclass(frozen=True)
class GapStats:
    """Context-overfitting gap statistics (spec "Metrics").

    ``per_manipulation[k]`` = g_k = mean member loss - mean non-member loss under manipulation k
    (fine-tuned model, raw probe loss, nats). ``mu_gap`` = mean of g_k over the suite;
    ``sigma_gap`` = POPULATION standard deviation (ddof=0) of g_k over the suite: the suite is the
    whole set being described, not a sample, and ddof=0 stays defined for a one-manipulation suite."""

    mu_gap: float
    sigma_gap: float
    per_manipulation: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        return {"mu_gap": self.mu_gap, "sigma_gap": self.sigma_gap}


def gap_stats(scores: pd.DataFrame) -> GapStats:
    d = validate_scores_table(scores)
    per: dict[str, float] = {}
    for manip, grp in d.groupby("manipulation", sort=False):
        mem = grp["member"].to_numpy(dtype=bool)
        loss = grp["loss"].to_numpy(dtype=np.float64)
        per[str(manip)] = float(loss[mem].mean() - loss[~mem].mean())
    g = np.fromiter(per.values(), dtype=np.float64)
    return GapStats(mu_gap=float(g.mean()), sigma_gap=float(g.std(ddof=0)), per_manipulation=per)


# --------------------------------------------------------------------------------------------------
# collapse indicators
# --------------------------------------------------------------------------------------------------


def loss_ratio(loss_ft: Any, loss_base: Any) -> float:
    """``L_FT / L_base``: mean ordinary in-context cross-entropy (context C', labels of D) of the
    fine-tuned model over that of the base model. Accepts per-query arrays or scalar means.
    A base loss of exactly 0 gives ``inf`` if the fine-tuned loss is positive, else 1.0."""
    ft = np.asarray(loss_ft, dtype=np.float64).reshape(-1)
    base = np.asarray(loss_base, dtype=np.float64).reshape(-1)
    if ft.size == 0 or base.size == 0:
        raise ProbeError("loss_ratio: empty loss array")
    if np.isnan(base).any():
        raise ProbeError("loss_ratio: base-model loss contains NaN")
    lf, lb = float(ft.mean()), float(base.mean())
    if math.isnan(lf):
        # a fine-tuned model that yields NaN losses has collapsed numerically
        return float("inf")
    if lb == 0.0:
        return float("inf") if lf > 0.0 else 1.0
    return lf / lb


def output_std(p_true: Any) -> float:
    """Population standard deviation (ddof=0) over queries of the fine-tuned model's probability of
    the true label; near zero means near-constant output."""
    p = np.asarray(p_true, dtype=np.float64).reshape(-1)
    if p.size == 0:
        raise ProbeError("output_std: empty probability array")
    return float(p.std(ddof=0))
