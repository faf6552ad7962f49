"""One probe, end to end and Ray-free: score a checkpoint, calibrate, measure, classify.

``probe_checkpoint`` is what a probe actor runs per job. Its output is a ``ProbeResult``: one flat
results row (config, metrics, intervals, verdict and the numbers that decided it), the per-manipulation
AUCs and the ROC curve of the deciding score — metrics, ids and curves only, never feature values.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from iclmem.atomic import write_json_atomic, write_parquet_atomic
from iclmem.vocab import Outcome
from probes.calibration import model_digest, read_parquet_checked, reference_scores
from probes.metrics import (
    Calibration,
    MembershipInput,
    ScoreKind,
    auc,
    loss_ratio,
    output_std,
    per_manipulation_auc,
    roc_curve,
)
from probes.outcomes import CheckpointOutcome, OutcomeThresholds, build_evidence, classify, memorization_holds
from probes.scoring import ProbePlan, icl_predictions, score


@dataclass(frozen=True)
class ProbeSettings:
    n_resamples: int = 1000
    thresholds: OutcomeThresholds = field(default_factory=OutcomeThresholds)
    bootstrap_seed: int = 0


@dataclass(frozen=True)
class ProbeResult:
    row: dict[str, Any]  # one row of results.parquet
    manipulation_auc: pd.DataFrame  # manipulation, category, auc (calibrated loss)
    roc: pd.DataFrame  # fpr, tpr of the deciding (or loss) calibrated score
    notes: tuple[str, ...] = ()  # warnings for the driver's log (not stored: results do not depend on them)

    def save(self, directory: str | Path, stem: str) -> Path:
        """Atomic, idempotent: the same inputs write the same files under the same names."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_parquet_atomic(self.manipulation_auc, directory / f"{stem}.manip.parquet")
        write_parquet_atomic(self.roc, directory / f"{stem}.roc.parquet")
        payload = json.dumps(self.row, sort_keys=True, default=_jsonable)
        digest = hashlib.sha256(payload.encode()).hexdigest()
        return write_json_atomic(directory / f"{stem}.json", {"row": json.loads(payload), "sha256": digest},
                                 indent=None, allow_nan=True)

    @classmethod
    def load(cls, directory: str | Path, stem: str) -> "ProbeResult | None":
        """A stored result, or None when any part is missing or fails its checksum (then it is recomputed)."""
        directory = Path(directory)
        try:
            stored = json.loads((directory / f"{stem}.json").read_text())
        except (OSError, ValueError):
            return None
        payload = json.dumps(stored.get("row"), sort_keys=True)
        if hashlib.sha256(payload.encode()).hexdigest() != stored.get("sha256"):
            import warnings

            warnings.warn(f"probe result {directory / (stem + '.json')} fails its checksum; recomputing", stacklevel=2)
            return None
        manip = read_parquet_checked(directory / f"{stem}.manip.parquet")
        roc = read_parquet_checked(directory / f"{stem}.roc.parquet")
        if manip is None or roc is None:
            return None
        return cls(stored["row"], manip, roc)


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


def base_icl(cache_dir: str | Path, task: Any, base_digest: str, base_model: Any) -> tuple[np.ndarray, np.ndarray]:
    """The base model's ordinary ICL (loss, p_true) per query, cached like the reference scores."""
    path = Path(cache_dir) / f"base_icl_{task.fingerprint[:16]}_{base_digest}.parquet"
    cached = read_parquet_checked(path)
    if cached is None:
        model = base_model() if callable(base_model) and not hasattr(base_model, "log_probs") else base_model
        loss, p_true = icl_predictions(model, task)
        cached = pd.DataFrame({"loss": loss, "p_true": p_true})
        write_parquet_atomic(cached, path)
    return cached["loss"].to_numpy(), cached["p_true"].to_numpy()


def probe_checkpoint(
    model: Any,
    task: Any,
    plan: ProbePlan,
    cache_dir: str | Path,
    base_digest: str,
    base_model: Any | Callable[[], Any],
    settings: ProbeSettings,
    identity: dict[str, Any],
    epoch: int,
) -> ProbeResult:
    """Probe ``model`` (a checkpoint of the run ``identity``) against the shared reference model."""
    reference = reference_scores(cache_dir, task.fingerprint, plan, base_digest, base_model)
    finetuned = score(model, plan)
    loss_ft, p_true_ft = icl_predictions(model, task)
    loss_base, _ = base_icl(cache_dir, task, base_digest, base_model)
    ratio = loss_ratio(float(np.mean(loss_ft)), float(np.mean(loss_base)))
    std = output_std(p_true_ft)
    th = settings.thresholds
    evidence = build_evidence(finetuned, reference, ratio, std, thresholds=th, n_resamples=settings.n_resamples,
                              seed=settings.bootstrap_seed, model_was_fine_tuned=model is not base_model)
    verdict = classify(evidence, th)
    outcome = CheckpointOutcome(epoch, evidence, verdict)

    # Headline kind: the deciding one, else the kind with the highest calibrated AUC.
    kind = verdict.score_kind or max(evidence.calibrated, key=lambda k: evidence.calibrated[k].auc)
    m = evidence.calibrated[kind]
    raw_m = evidence.uncalibrated_loss
    row: dict[str, Any] = {
        **identity,
        **outcome.as_dict(),
        "score_kind": ScoreKind(kind).value,
        "auc": m.auc, "auc_low": m.auc_interval.low, "auc_high": m.auc_interval.high,
        "tpr_at_1pct": m.tpr_at_1pct.tpr, "tpr_at_10pct": m.tpr_at_10pct.tpr,
        "tpr_at_1pct_low": m.tpr_at_1pct_interval.low, "tpr_at_1pct_high": m.tpr_at_1pct_interval.high,
        "tpr_at_10pct_low": m.tpr_at_10pct_interval.low, "tpr_at_10pct_high": m.tpr_at_10pct_interval.high,
        "loss_ratio": ratio, "output_std": std,
        "mu_gap": evidence.gap.mu_gap, "sigma_gap": evidence.gap.sigma_gap,
        "raw_auc": raw_m.auc,
        "reasons": json.dumps(verdict.reasons, default=_jsonable, sort_keys=True),
        "n_members": int(plan.queries.member.sum()), "n_nonmembers": int((~plan.queries.member).sum()),
    }
    for k, km in evidence.calibrated.items():
        row[f"auc_{ScoreKind(k).value}"] = km.auc
    # Reference alone and raw-vs-calibrated flags (paper App. 7.4), on the loss kind.
    scores = MembershipInput.from_scores_tables(finetuned, reference)
    ref = scores.membership_scores(ScoreKind.LOSS, Calibration.REFERENCE_ONLY)
    row["ref_auc"] = auc(ref.members, ref.nonmembers)
    row["raw_memorization_flag"] = memorization_holds(raw_m, th)
    row["calibrated_memorization_flag"] = bool(verdict.checks.get(Outcome.MEMORIZATION.value, False))
    row["raw_outcome"] = (Outcome.MEMORIZATION if row["raw_memorization_flag"] else Outcome.NO_SIGNAL).value

    manip = per_manipulation_auc(finetuned, reference)
    manip = manip.reset_index()[["manipulation", "category", ScoreKind.LOSS.value]].rename(columns={ScoreKind.LOSS.value: "auc"})
    manip.insert(0, "epoch", epoch)
    manip.insert(0, "run_id", identity.get("run_id", ""))

    calibrated = scores.membership_scores(kind, Calibration.CALIBRATED)
    curve = roc_curve(calibrated.members, calibrated.nonmembers)
    roc = pd.DataFrame({"fpr": curve.fpr, "tpr": curve.tpr})
    return ProbeResult(row, manip, roc)


__all__ = ["ProbeResult", "ProbeSettings", "probe_checkpoint", "base_icl", "model_digest"]
