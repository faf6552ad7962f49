"""The rounded re-test (probe.output_decimals, issue #56): every verdict and claim computed again on the outputs
rounded as a deployed model returns them, and each null split's per-query statistics stored beside its summary
(``ProbeResult.null_queries``), so that null data can go through the same path as the real split."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from iclmem.errors import ConfigError
from iclmem.stats import auc
from iclmem.vocab import Outcome, ScoreKind
from probes.calibration import reference_key
from probes.manipulations import suite_from_spec
from probes.metrics import Calibration
from probes.outcomes import build_evidence, classify
from probes.probe import (
    ProbeResult,
    ProbeSettings,
    _known_context_flag,
    _known_context_metrics,
    probe_checkpoint,
    rounded_columns,
)
from probes.scoring import (
    ROUNDED_SCORE_COLUMNS,
    ProbePlan,
    ProbeQueries,
    distribution_scores,
    rounded_loss,
    rounded_view,
)

pytestmark = pytest.mark.filterwarnings("ignore::probes.metrics.LowResolutionWarning")


def _log_probs(rows: list[list[float]]) -> torch.Tensor:
    return torch.log(torch.tensor(rows, dtype=torch.float64)).float()


def test_rounded_scores_are_read_off_the_probability_vector_rounded_to_d_decimals():
    # p = (0.70004, 0.29992, 0.00004) at 4 decimals is printed (0.7000, 0.2999, 0.0000)
    lp = _log_probs([[0.70004, 0.29992, 0.00004]] * 2)
    out = distribution_scores(lp, torch.tensor([0, 2]), decimals=4)
    assert out["loss"] == pytest.approx([-math.log(0.70004), -math.log(0.00004)], rel=1e-5)
    assert out["rounded_confidence"] == pytest.approx([0.7, 0.0], abs=1e-7)
    # a printed 0 is read as half the last digit, 0.00005: finite, and below the exact loss of 10.13
    assert out["rounded_loss"] == pytest.approx([0.356675, 9.903488], abs=1e-5)
    # -(0.7 ln 0.7 + 0.2999 ln 0.2999), the printed 0 left out, the vector not renormalised
    assert out["rounded_entropy"] == pytest.approx([0.610846, 0.610846], abs=1e-5)
    # the exact entropy also counts the 0.00004 the printed vector drops: + 0.00004 * 10.13
    assert out["entropy"] == pytest.approx([0.611227, 0.611227], abs=1e-5)
    # without decimals only the exact scores
    assert set(distribution_scores(lp, torch.tensor([0, 2]))) == {"loss", "entropy", "confidence"}
    # the known-context loss rounded the same way: p(y*) = 0.123456 reads 0.1235, p = 0.00004 reads 0.00005
    assert rounded_loss(np.array([-math.log(0.123456), -math.log(0.00004)]), 4) == pytest.approx(
        [-math.log(0.1235), -math.log(0.00005)], rel=1e-12)
    assert rounded_loss(np.array([-math.log(0.123456)]), 2) == pytest.approx([-math.log(0.12)], rel=1e-12)


def _planted_tables(shift: float, n: int = 40) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray, np.ndarray]:
    """Fine-tuned and reference scores tables of n members and n non-members (two classes, y* = 0, two
    manipulations): the reference's p(y*) = 0.3 + 0.004 i + 0.00002 (printed at 4 decimals as 0.3 + 0.004 i), the
    fine-tuned model's the same plus ``shift`` on the members only. Also the known-context losses (same p)."""
    member = np.arange(2 * n) < n
    p_ref = 0.3 + 0.004 * np.arange(2 * n) + 0.00002
    p_ft = p_ref + shift * member

    def table(p: np.ndarray) -> pd.DataFrame:
        frames = []
        for manipulation in ("base", "position_first"):
            lp = torch.log(torch.from_numpy(np.stack([p, 1 - p], axis=1)))
            scores = distribution_scores(lp, torch.zeros(2 * n, dtype=torch.int64), decimals=4)
            frames.append(pd.DataFrame({"query_id": np.arange(2 * n), "member": member,
                                        "manipulation": manipulation, "category": "c", **scores}))
        return pd.concat(frames, ignore_index=True)

    return table(p_ft), table(p_ref), -np.log(p_ft), -np.log(p_ref)


@pytest.mark.parametrize(("shift", "survives"), [(1e-6, False), (0.05, True)])
def test_a_shift_far_below_the_printed_digits_is_memorization_on_exact_outputs_only(shift, survives):
    finetuned, reference, loss_ft, loss_base = _planted_tables(shift)
    member = finetuned.drop_duplicates("query_id")["member"].to_numpy(bool)
    settings = ProbeSettings(n_resamples=50, output_decimals=4)
    th = settings.thresholds
    exact = build_evidence(finetuned, reference, 1.0, 0.2, thresholds=th, n_resamples=50)
    assert exact.calibrated[ScoreKind.LOSS].auc == pytest.approx(1.0)
    assert classify(exact, th, 1).outcome is Outcome.MEMORIZATION
    row = rounded_columns(finetuned, reference, ScoreKind.LOSS, loss_ft, loss_base, member, 1.0, 0.2, settings)
    assert row["output_decimals"] == 4
    exact_known = _known_context_metrics(loss_ft - loss_base, member, Calibration.CALIBRATED, settings)
    assert exact_known.auc == pytest.approx(1.0)
    if survives:
        assert row["rounded_outcome"] == Outcome.MEMORIZATION.value
        assert row["rounded_auc"] == pytest.approx(1.0)
        assert row["rounded_known_context_calibrated_auc"] == pytest.approx(1.0)
        assert row["rounded_known_context_memorization_flag"]
    else:  # every rounded ΔS is 0: members and non-members tie
        assert (rounded_view(finetuned)["loss"] == rounded_view(reference)["loss"]).all()
        assert row["rounded_auc"] == pytest.approx(0.5)
        assert row["rounded_p_value"] > 0.4
        assert row["rounded_outcome"] != Outcome.MEMORIZATION.value
        assert row["rounded_known_context_calibrated_auc"] == pytest.approx(0.5)
        assert not row["rounded_known_context_memorization_flag"]


def test_output_decimals_outside_one_to_eight_is_refused_naming_the_setting():
    from orchestrator.schema.config import parse_sweep

    base = {"name": "s", "tasks": [{"name": "iris"}]}
    assert parse_sweep(base).probe_settings().output_decimals == 4
    assert parse_sweep({**base, "probe": {"output_decimals": None}}).probe_settings().output_decimals is None
    assert parse_sweep({**base, "probe": {"output_decimals": 6}}).probe_settings().output_decimals == 6
    for bad in (0, 9):
        with pytest.raises(ConfigError, match="probe.output_decimals"):
            parse_sweep({**base, "probe": {"output_decimals": bad}})
    with pytest.raises(ConfigError, match="output_decimals"):
        ProbeSettings(output_decimals=0)


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory):
    """pfn-mini on iris and a copy of it with its weights nudged (a "fine-tuned" checkpoint without training),
    a two-manipulation plan, and one reference cache shared by every probe of this module."""
    from trainables.data import PrepSettings, TaskSource, prepare_task
    from trainables.models import build_model

    task = prepare_task(TaskSource("iris", "builtin"), PrepSettings(context_size=30), "normal", 0, q=20)
    base = build_model("pfn-mini", weights="shipped")
    model = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.module.parameters():
            p.add_(0.05 * p.std().nan_to_num() * torch.randn(p.shape, generator=gen))
    plan = ProbePlan.build(ProbeQueries.from_task(task), suite_from_spec(["base", "position_first"]), task.seed,
                           compress_rows=base.supports_context_weights)
    return task, base, model, plan, tmp_path_factory.mktemp("reference")


def _probe(perturbed, decimals):
    task, base, model, plan, cache = perturbed
    settings = ProbeSettings(n_resamples=20, null_splits=2, output_decimals=decimals)
    identity = {"run_id": "r", "task": task.name, "model": "pfn-mini", "regime": "single_fixed", "lr": 1e-3,
                "q": 20, "label_mode": "normal", "seed": 0}
    return probe_checkpoint(model, task, plan, cache, "digest", base, settings, identity, 1)


def test_null_queries_hold_exactly_what_each_null_splits_verdict_was_computed_from(perturbed, tmp_path):
    result = _probe(perturbed, 4)
    row, nulls = result.row, result.null_queries
    records = json.loads(row["null_evidence"])
    assert nulls is not None
    assert sorted(nulls["null_index"].unique()) == [0, 1]
    settings = ProbeSettings(n_resamples=20, output_decimals=4)
    for j, record in enumerate(records):
        split = nulls[nulls["null_index"] == j]
        assert len(split) == record["n_members"] + record["n_nonmembers"]
        m = split["member"].to_numpy(bool)
        assert m.sum() == record["n_members"]
        for prefix in ("", "rounded_"):
            for kind in ("loss", "entropy", "confidence"):
                delta = (split[f"{prefix}s_ref_{kind}"] - split[f"{prefix}s_{kind}"]).to_numpy()
                if kind == "confidence":  # higher confidence = member
                    delta = -delta
                # entropy and loss: lower = member
                key = f"{prefix}auc_{kind}"
                assert auc(delta[m], delta[~m]) == pytest.approx(record[key], abs=1e-9), (j, key)
        # the known-context flags recomputed from the stored losses
        for prefix, flag in (("", "known_context_flag"), ("rounded_", "rounded_known_context_flag")):
            loss = (split[f"{prefix}known_context_loss"] - split[f"{prefix}known_context_loss_base"]).to_numpy()
            metrics = _known_context_metrics(loss, m, Calibration.CALIBRATED, settings)
            assert record[flag] == _known_context_flag(metrics, settings, row["outcome"] == Outcome.COLLAPSE.value)
        assert record["rounded_outcome"] in {o.value for o in Outcome}
    for column in ("output_decimals", "rounded_outcome", "rounded_auc", "rounded_auc_low", "rounded_auc_high",
                   "rounded_p_value", "rounded_known_context_calibrated_auc",
                   "rounded_known_context_memorization_flag"):
        assert column in row, column
    assert {"rounded_s_loss", "rounded_s_ref_loss", "rounded_known_context_loss",
            "rounded_known_context_loss_base"} <= set(result.queries.columns)
    # stored beside the row and read back; a result stored before null_queries existed loads without them
    result.save(tmp_path, "e0001")
    loaded = ProbeResult.load(tmp_path, "e0001")
    pd.testing.assert_frame_equal(loaded.null_queries, nulls)
    from iclmem.runfolder import NULL_QUERIES_SUFFIX

    (tmp_path / f"e0001{NULL_QUERIES_SUFFIX}").unlink()
    older = ProbeResult.load(tmp_path, "e0001")
    assert older is not None
    assert older.null_queries is None
    assert older.row == loaded.row


def test_without_output_decimals_there_is_no_rounded_re_test_and_no_rounded_cache_is_read(perturbed):
    task, base, model, plan, cache = perturbed
    assert reference_key(task.fingerprint, plan, "digest") != reference_key(task.fingerprint, plan, "digest", 4)
    assert reference_key(task.fingerprint, plan, "digest", 4) != reference_key(task.fingerprint, plan, "digest", 3)
    result = _probe(perturbed, None)
    assert not [c for c in result.row if c.startswith("rounded_") or c == "output_decimals"]
    assert not [c for c in result.queries.columns if c.startswith("rounded_")]
    assert not [c for c in result.null_queries.columns if c.startswith("rounded_")]
    assert not [k for r in json.loads(result.row["null_evidence"]) for k in r if k.startswith("rounded_")]
    # a reference table scored with decimals (the module's other probe) is never read without them, nor the reverse
    tables = [pd.read_parquet(p) for p in cache.glob("reference_*.parquet")]
    assert {all(c in t.columns for c in ROUNDED_SCORE_COLUMNS) for t in tables} == {True, False}
