"""multi_random audits C' (issue #43): the known-context baseline and the ICL metrics never let a row see itself.

Stage I puts C' into multi_random's member pool, so with C' as every row's context about 72% of the members
were predicted with themselves, label included, in the context, and the untouched base model told members
from non-members (pfn-mini on digits: known-context AUC 0.63 over seeds 0-4). ``probes.known_context``
predicts every audited row there with C' less one row of its own label (itself when it is in C'); the
fixed-context regimes keep their one forward pass with all of C', bit for bit.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from iclmem.errors import ProbeError
from probes.calibration import model_digest
from probes.known_context import KnownContextPlan, known_context_predictions
from probes.manipulations import default_suite
from probes.probe import ProbeSettings, base_icl, probe_checkpoint
from probes.scoring import ProbePlan, ProbeQueries, icl_predictions
from trainables.data import PrepSettings, TaskSource, null_split_task, prepare_task, reference_task
from trainables.models import build_model

pytestmark = pytest.mark.filterwarnings("ignore::probes.metrics.LowResolutionWarning")

SEEDS = (0, 1, 2, 3, 4)


@pytest.fixture(scope="module")
def base() -> Any:
    return build_model("pfn-mini", weights="shipped")


def _pool_task(base: Any, seed: int, label_mode: str = "normal", name: str = "digits") -> Any:
    """A task as Stage I prepares it for multi_random (orchestrator.runfolder.prepare: C' in the member pool)."""
    settings = base.prep_settings(PrepSettings(context_in_pool=True))
    return prepare_task(TaskSource(name, "builtin"), settings, label_mode, seed=seed, q=50)


def _fixed_task(base: Any, seed: int, label_mode: str = "normal", name: str = "digits") -> Any:
    """A task as Stage I prepares it for single_fixed and multi_fixed (iris, 150 rows, at a smaller size)."""
    q, context_size = (20, 60) if name == "iris" else (50, 128)
    return prepare_task(TaskSource(name, "builtin"), base.prep_settings(PrepSettings(context_size=context_size)),
                        label_mode, seed=seed, q=q)


class Recording:
    """pfn-mini seen through a window: every forward pass's contexts and queries are kept (features identify a
    row: Stage I drops rows whose feature vector equals another's)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.module = inner, inner.module
        self.calls: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # context_x [B,N,F], context_y [B,N], query_x [B,M,F]

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def use_columns(self, *columns: Any) -> None:
        self.inner.use_columns(*columns)

    def log_probs(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor, n_classes: int,
                  context_weight: torch.Tensor | None = None) -> torch.Tensor:
        self.calls.append((context_x.numpy().copy(), context_y.numpy().copy(), query_x.numpy().copy()))
        return self.inner.log_probs(context_x, context_y, query_x, n_classes, context_weight=context_weight)


def _row_of(task: Any) -> dict[bytes, int]:
    features = np.asarray(task.features, dtype=np.float32)
    return {features[i].tobytes(): i for i in range(len(features))}


def _contexts_seen(model: Recording, task: Any) -> dict[int, list[np.ndarray]]:
    """For every predicted row (position into the task), the context rows of each forward pass it was in."""
    row_of = _row_of(task)
    seen: dict[int, list[np.ndarray]] = {}
    for context_x, _, query_x in model.calls:
        for b in range(context_x.shape[0]):
            context = np.array([row_of[r.tobytes()] for r in context_x[b]])
            for q in query_x[b]:
                seen.setdefault(row_of[q.tobytes()], []).append(context)
    return seen


# ------------------------------------------------------------------ no row in its own context


@pytest.mark.parametrize("label_mode", ["normal", "shuffled_members"])
def test_in_multi_random_no_prediction_of_a_row_uses_a_context_holding_that_row(base, label_mode):
    task = _pool_task(base, seed=0, label_mode=label_mode)
    assert np.isin(task.context_idx, task.member_idx).all()  # the confound: C' is audited as members
    model = Recording(base)
    predictions = known_context_predictions(model, task)
    seen = _contexts_seen(model, task)
    audited = np.concatenate([task.member_idx, task.nonmember_idx])
    assert set(seen) == set(audited.tolist())
    labels = np.asarray(task.labels)
    context_counts = np.bincount(labels[task.context_idx], minlength=task.n_classes)
    for row, contexts in seen.items():
        for context in contexts:
            assert row not in context
            # every row, member or not, sees C' less one row of its own label: the same size and the same
            # label counts relative to its own label
            assert len(context) == len(task.context_idx) - 1
            assert set(context) <= set(task.context_idx.tolist())
            want = context_counts.copy()
            want[labels[row]] -= 1
            assert np.bincount(labels[context], minlength=task.n_classes).tolist() == want.tolist()
    # batched by left-out row: far fewer forward passes than rows, and at most |C'| contexts in all
    assert len(model.calls) < 10
    assert sum(c[0].shape[0] for c in model.calls) <= len(task.context_idx)
    # each row's prediction is the one it gets alone with its own context (queries never see each other)
    plan = KnownContextPlan.for_task(task)
    features, y = torch.from_numpy(np.array(task.features)), torch.from_numpy(np.array(task.labels))
    with torch.no_grad():
        for i in range(0, len(audited), 37):
            ctx = torch.from_numpy(plan.context_of(i))
            alone = base.log_probs(features[ctx][None], y[ctx][None], features[audited[i]][None, None], task.n_classes)
            loss = -float(alone[0, 0, labels[audited[i]]])
            assert predictions.loss[i] == pytest.approx(loss, abs=1e-5)


def test_the_left_out_row_depends_on_the_row_alone_not_on_whether_it_is_a_member(base):
    task = _pool_task(base, seed=1)
    plan = KnownContextPlan.for_task(task)
    assert plan.left_out is not None
    in_context = np.isin(plan.query_rows, task.context_idx)
    np.testing.assert_array_equal(plan.left_out[in_context], plan.query_rows[in_context])
    # swap the members outside C' with as many non-members: every row keeps the row its context leaves out
    outside = np.setdiff1d(task.member_idx, task.context_idx)
    swapped = dataclasses.replace(task, member_idx=np.sort(np.concatenate([task.context_idx,
                                                                          task.nonmember_idx[: len(outside)]])),
                                  nonmember_idx=np.sort(np.concatenate([task.nonmember_idx[len(outside):], outside])))
    other = KnownContextPlan.for_task(swapped)
    assert other.left_out is not None
    before = dict(zip(plan.query_rows.tolist(), plan.left_out.tolist()))
    after = dict(zip(other.query_rows.tolist(), other.left_out.tolist()))
    assert before == after


# ------------------------------------------------------------------ the fixed-context regimes are unchanged


@pytest.mark.parametrize(("name", "label_mode"), [("digits", "normal"), ("iris", "shuffled_members"),
                                             ("breast_cancer", "shuffled_all"), ("diabetes", "normal")])
def test_fixed_context_regimes_hold_no_audited_row_in_c_prime_and_predict_exactly_as_before(base, name, label_mode):
    for seed in (0, 1):
        task = _fixed_task(base, seed, label_mode, name)
        derived = [task, reference_task(task, 0), null_split_task(task, 0)] if name == "digits" else [task]
        for t in derived:
            audited = np.concatenate([t.member_idx, t.nonmember_idx])
            assert not np.isin(audited, t.context_idx).any()
            plan = KnownContextPlan.for_task(t, regime="single_fixed")
            assert plan.left_out is None
            assert plan.cache_tag() == ""
    model = Recording(base)
    new = known_context_predictions(model, task, regime="multi_fixed")
    assert len(model.calls) == 1  # one forward pass, with all of C'
    assert model.calls[0][0].shape[:2] == (1, len(task.context_idx))
    old = icl_predictions(base, task)
    for field in old._fields:  # bit for bit
        np.testing.assert_array_equal(getattr(new, field), getattr(old, field))


def test_a_fixed_context_regime_with_an_audited_row_in_c_prime_is_refused(base):
    task = _pool_task(base, seed=0)
    for regime in ("single_fixed", "multi_fixed"):
        with pytest.raises(ProbeError, match="keeps C' apart"):
            KnownContextPlan.for_task(task, regime=regime)
    for regime in (None, "multi_random", "base"):
        assert KnownContextPlan.for_task(task, regime=regime).leaves_one_out
    # C' partly among the members: no split this probe knows
    part = dataclasses.replace(task, member_idx=np.setdiff1d(task.member_idx, task.context_idx[:1]))
    with pytest.raises(ProbeError, match="only in part"):
        KnownContextPlan.for_task(part)


# ------------------------------------------------------------------ the base model's cache


def test_a_base_frame_cached_with_c_prime_as_every_rows_context_is_not_read_for_multi_random(base):
    task = _pool_task(base, seed=2)
    digest = model_digest(base)
    with tempfile.TemporaryDirectory() as cache:
        # what base_icl cached before issue #43, under the name it used then
        stale = icl_predictions(base, task)
        pd.DataFrame({"loss": stale.loss, "p_true": stale.p_true, "loss_original": stale.loss_original}).to_parquet(
            f"{cache}/base_icl2_{task.fingerprint[:16]}_{digest}.parquet")
        loss, p_true, loss_original = base_icl(cache, task, digest, base)
    fresh = known_context_predictions(base, task)
    np.testing.assert_array_equal(loss, fresh.loss)
    np.testing.assert_array_equal(p_true, fresh.p_true)
    np.testing.assert_array_equal(loss_original, fresh.loss_original)
    assert not np.array_equal(loss, stale.loss)
    # a fixed-context task keeps its key: its cached frame is still the right one
    fixed = _fixed_task(base, seed=2)
    with tempfile.TemporaryDirectory() as cache:
        base_icl(cache, fixed, digest, base)
        assert os.listdir(cache) == [f"base_icl2_{fixed.fingerprint[:16]}_{digest}.parquet"]


# ------------------------------------------------------------------ the untouched model sits at chance


def _t_interval(values: list[float]) -> tuple[float, float]:
    """95% Student-t interval of the mean over seeds."""
    a = np.asarray(values, dtype=np.float64)
    half = float(stats.t.ppf(0.975, len(a) - 1) * a.std(ddof=1) / np.sqrt(len(a)))
    return float(a.mean()) - half, float(a.mean()) + half


def test_the_untouched_base_model_cannot_tell_multi_random_members_from_non_members(base):
    """The base model probed as a checkpoint (the pipeline's own base-model row) on multi_random tasks of five
    seeds. Measured before the fix (seeds 0-4): known-context AUC 0.60-0.67 (mean 0.633), members' ICL
    accuracy 0.053 above the non-members' and their ICL loss 0.163 nats below. After: AUC mean 0.507, accuracy
    gap -0.005, loss gap +0.023, each seed's AUC within 0.07 of 0.5 (sd over seeds 0.045)."""
    suite = [m for m in default_suite() if m.name == "base"]
    settings = ProbeSettings(n_resamples=200, null_splits=0)
    digest = model_digest(base)
    rows = []
    with tempfile.TemporaryDirectory() as cache, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in SEEDS:
            task = _pool_task(base, seed)
            plan = ProbePlan.build(ProbeQueries.from_task(task), suite, task.seed,
                                   compress_rows=base.supports_context_weights)
            identity = {"run_id": f"digits-base-pool-s{seed}", "task": task.name, "regime": "base", "q": 50}
            rows.append(probe_checkpoint(base, task, plan, cache, digest, base, settings, identity, 0).row)
    table = pd.DataFrame(rows)
    auc = table["known_context_auc"].tolist()
    low, high = _t_interval(auc)
    assert low < 0.5 < high, auc
    assert abs(float(np.mean(auc)) - 0.5) < 0.04, auc
    assert max(abs(a - 0.5) for a in auc) < 0.1, auc
    for metric in ("accuracy", "loss"):
        gap = (table[f"member_icl_{metric}"] - table[f"nonmember_icl_{metric}"]).tolist()
        low, high = _t_interval(gap)
        assert low < 0.0 < high, (metric, gap)
    assert abs(float(np.mean(table["member_icl_accuracy"] - table["nonmember_icl_accuracy"]))) < 0.03
    assert abs(float(np.mean(table["member_icl_loss"] - table["nonmember_icl_loss"]))) < 0.06
    # the base model against itself: ratios of exactly 1, calibrated known-context loss at exactly chance
    assert (table["loss_ratio_spec"] == 1.0).all()
    assert (table["known_context_calibrated_auc"] == 0.5).all()


def test_the_per_epoch_member_metrics_of_multi_random_leave_c_prime_out(base):
    """The metrics a trial reports to Tune every epoch (``Finetuner.evaluate``) predict with all of C': in
    multi_random its rows are left out of the members evaluated there (no row in its own context), and the
    base model's member and non-member accuracy then agree within sampling error; single_fixed evaluates
    every member as before."""
    from iclmem.vocab import Regime
    from trainables.finetune import Finetuner, FinetuneSpec

    task = _pool_task(base, 0)
    finetuner = Finetuner(FinetuneSpec(model="pfn-mini", regime=Regime.MULTI_RANDOM, epochs=1), [task])
    (members,) = finetuner._eval_members
    evaluated = {tuple(r) for r in members.query_x[0].numpy()}
    in_context = {tuple(r) for r in finetuner._fixed[0].context_x[0].numpy()} if finetuner._fixed else set()
    c_prime = {tuple(r) for r in np.asarray(task.features, np.float32)[task.context_idx]}
    assert not evaluated & c_prime
    assert len(evaluated) == len(task.member_idx) - len(task.context_idx)
    assert not evaluated & in_context
    metrics = finetuner.evaluate()
    # with C' in the evaluation the members read ~0.07 more accurate than the non-members (the confound)
    assert abs(metrics["member_icl_accuracy"] - metrics["nonmember_icl_accuracy"]) < 0.1
    fixed = _fixed_task(base, 0)
    single = Finetuner(FinetuneSpec(model="pfn-mini", epochs=1), [fixed])
    assert single._eval_members[0].query_x.shape[1] == len(fixed.member_idx)
