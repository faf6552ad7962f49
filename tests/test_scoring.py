"""Batched probe scoring and calibration on hand-checkable models."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from probes.calibration import model_digest, reference_scores
from probes.manipulations import default_suite, suite_from_spec
from probes.metrics import MembershipInput, ScoreKind
from probes.scoring import ProbePlan, ProbeQueries, distribution_scores, score
from trainables.data import TaskSource, prepare_task
from trainables.models import build_model
from trainables.models.base import ModelAdapter


class ContextBlindAdapter(ModelAdapter):
    """Predicts from the query features alone: a fixed linear map, the context never looked at."""

    name = "context-blind"
    max_classes = 10
    max_features = 32

    def __init__(self) -> None:
        super().__init__(torch.nn.Linear(1, 1))

    def _logits(self, context_x, context_y, query_x):
        # query_x [B, M, F] -> [B, M, 10]; use the first two feature columns, which drop_features
        # and distractors never remove or alter (distractors are appended after the kept columns).
        first = query_x[..., :1]
        return torch.cat([first * k for k in range(10)], dim=-1)


@pytest.fixture(scope="module")
def task():
    return prepare_task(TaskSource("iris", "builtin"), seed=0, q=30, context_size=60)


@pytest.fixture(scope="module")
def plan(task):
    return ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed)


def test_distribution_scores_by_hand():
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    out = distribution_scores(lp, torch.tensor([1]))
    assert out["loss"][0] == pytest.approx(np.log(4))
    assert out["confidence"][0] == pytest.approx(0.25)
    assert out["entropy"][0] == pytest.approx(-(0.5 * np.log(0.5) + 2 * 0.25 * np.log(0.25)))


def test_the_score_table_has_one_row_per_query_and_manipulation(task, plan):
    table = score(build_model("pfn-mini"), plan)
    assert len(table) == 60 * 48
    assert list(table.columns) == ["query_id", "member", "manipulation", "category", "loss", "entropy", "confidence"]
    assert table.groupby("query_id")["manipulation"].nunique().eq(48).all()
    assert table["member"].sum() == 30 * 48
    np.testing.assert_allclose(table["confidence"], np.exp(-table["loss"]), rtol=1e-5)


def test_a_model_that_ignores_the_context_scores_all_48_manipulations_identically(task):
    # Drop-features can remove the first column; keep a suite whose manipulations all keep column 0
    # by probing a one-feature view: with one feature, drop_features drops nothing.
    one_feature = ProbeQueries.from_task(task)
    one_feature = ProbeQueries(one_feature.query_ids, one_feature.member, one_feature.labels,
                               one_feature.features[:, :1].copy(), one_feature.n_classes)
    table = score(ContextBlindAdapter(), ProbePlan.build(one_feature, default_suite(), 0))
    spread = table.groupby("query_id")[["loss", "entropy", "confidence"]].agg(lambda v: v.max() - v.min())
    assert (spread.to_numpy() == 0).all()


def test_the_base_model_probed_as_if_fine_tuned_gives_delta_s_exactly_zero(task, plan, tmp_path):
    base = build_model("pfn-mini")
    reference = reference_scores(tmp_path, task.fingerprint, plan, model_digest(base), base)
    again = score(build_model("pfn-mini"), plan)
    mi = MembershipInput.from_scores_tables(again, reference)
    for kind in ScoreKind:
        delta = mi.raw(kind, "calibrated")
        assert np.all(delta.members == 0)
        assert np.all(delta.nonmembers == 0)
        assert mi.metrics(kind, "calibrated", n_resamples=0).auc == 0.5


def test_reference_scores_are_computed_once_and_reused(task, plan, tmp_path):
    base = build_model("pfn-mini")
    digest = model_digest(base)
    first = reference_scores(tmp_path, task.fingerprint, plan, digest, base)
    calls = []
    second = reference_scores(tmp_path, task.fingerprint, plan, digest, lambda: calls.append(1))
    assert calls == []
    assert first.equals(second)
    assert len(list(tmp_path.glob("reference_*.parquet"))) == 1


def test_a_corrupt_reference_cache_is_recomputed_with_a_warning(task, plan, tmp_path):
    base = build_model("pfn-mini")
    digest = model_digest(base)
    first = reference_scores(tmp_path, task.fingerprint, plan, digest, base)
    cached = next(tmp_path.glob("reference_*.parquet"))
    cached.write_bytes(cached.read_bytes()[:100])  # truncated
    with pytest.warns(UserWarning, match=cached.name):
        again = reference_scores(tmp_path, task.fingerprint, plan, digest, base)
    assert again.equals(first)


def test_batched_scores_equal_one_context_at_a_time(task):
    suite = suite_from_spec(["base", "skew_true_x3", "scale_random_f5", "combo2_random_distractors_2"])
    queries = ProbeQueries.from_task(task)
    plan = ProbePlan.build(queries, suite, 0)
    model = build_model("pfn-mini")
    batched = score(model, plan)
    from probes.context_plans import materialize

    single = []
    with torch.no_grad():
        for entry in plan.planned:
            cx, qx = materialize(entry.plan, queries.features[entry.query_index])
            lp = model.log_probs(torch.from_numpy(cx)[None], torch.from_numpy(entry.plan.labels)[None],
                                 torch.from_numpy(qx)[None, None], queries.n_classes)[0, 0]
            single.append(float(-lp[queries.labels[entry.query_index]]))
    np.testing.assert_allclose(batched["loss"].to_numpy(), np.array(single, dtype=np.float32), rtol=1e-4, atol=1e-5)


def test_compressed_rows_with_multiplicities_score_like_the_repeated_rows(task):
    """Skewed and scaled contexts scored as distinct rows + counts equal the full contexts."""
    queries = ProbeQueries.from_task(task)
    full = ProbePlan.build(queries, default_suite(), 0)
    compact = ProbePlan.build(queries, default_suite(), 0, compress_rows=True)
    assert sum(p.plan.n_rows for p in compact.planned) < 0.7 * sum(p.plan.n_rows for p in full.planned)
    assert len(compact.groups) < len(full.groups)
    model = build_model("pfn-mini")
    a, b = score(model, full), score(model, compact)
    pd.testing.assert_frame_equal(a[["query_id", "member", "manipulation"]], b[["query_id", "member", "manipulation"]])
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(a["entropy"], b["entropy"], rtol=1e-4, atol=1e-5)


def test_models_without_row_multiplicities_refuse_them():
    from iclmem.errors import ModelError

    with pytest.raises(ModelError, match="multiplicities"):
        ContextBlindAdapter().log_probs(torch.zeros(1, 2, 1), torch.zeros(1, 2, dtype=torch.long),
                                        torch.zeros(1, 1, 1), 2, context_weight=torch.ones(1, 2))
