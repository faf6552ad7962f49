"""A reference trial (probe.references) reuses its target's base-model scores instead of computing its own:
same queries, contexts and labels, other member flags; its probe row must not change beyond float noise."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from iclmem.errors import ProbeError
from probes.manipulations import suite_from_spec
from probes.probe import ProbeSettings, probe_checkpoint
from probes.query_tables import with_member_flags
from probes.scoring import ProbePlan, ProbeQueries
from trainables.data import PrepSettings, TaskSource, prepare_task, reference_task
from trainables.finetune import Finetuner, FinetuneSpec
from trainables.models import build_model

SUITE = suite_from_spec(["base", "skew_true_x2", "skew_incorrect_k1_x3", "position_random"])


def _plan(task, base):
    return ProbePlan.build(ProbeQueries.from_task(task), SUITE, task.seed, compress_rows=base.supports_context_weights)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_reference_trial_probed_on_its_targets_base_scores_gives_the_row_it_would_compute_itself(tmp_path):
    torch.set_num_threads(1)
    target = prepare_task(TaskSource("iris", "builtin", None, None, None), PrepSettings(context_size=30),
                          "shuffled_members", 0, q=30)
    ref = reference_task(target, 1)
    base = build_model("pfn-mini")
    finetuner = Finetuner(FinetuneSpec(epochs=20, checkpoint_epochs=(20,)), [ref])
    for _ in range(20):
        finetuner.run_epoch()
    settings = ProbeSettings(n_resamples=50, null_splits=0)
    own = probe_checkpoint(finetuner.model, ref, _plan(ref, base), tmp_path / "own", "d", base, settings,
                           {"run_id": "r"}, 20).row
    shared_dir = tmp_path / "shared"
    target_plan = _plan(target, base)
    probe_checkpoint(base, target, target_plan, shared_dir, "d", base, settings, {"run_id": "t"}, 0)  # the target's
    before = sorted(p.name for p in shared_dir.glob("reference_*.parquet"))
    shared = probe_checkpoint(finetuner.model, ref, _plan(ref, base), shared_dir, "d", base, settings,
                              {"run_id": "r"}, 20, base_plan=(target.fingerprint, target_plan)).row
    # no new base-model table: the reference trial read the target's
    assert sorted(p.name for p in shared_dir.glob("reference_*.parquet")) == before
    assert len(before) == 1
    assert own["outcome"] == shared["outcome"]
    assert own["n_members"] == shared["n_members"] == 30
    for column in ("auc", "auc_loss", "auc_entropy", "auc_confidence", "mu_gap", "p_value"):
        assert shared[column] == pytest.approx(own[column], abs=1e-6), column


def test_member_flags_come_from_the_plan_and_foreign_queries_are_refused():
    target = prepare_task(TaskSource("iris", "builtin", None, None, None), PrepSettings(context_size=30), "normal", 0,
                          q=30)
    ref = reference_task(target, 0)
    base = build_model("pfn-mini")
    plan = _plan(ref, base)
    ids = np.asarray(plan.queries.query_ids)
    table = pd.DataFrame({"query_id": np.repeat(ids, 2), "member": False, "manipulation": "base",
                          "category": "c", "loss": 1.0, "entropy": 1.0, "confidence": 0.5})
    flagged = with_member_flags(table, plan)
    expected = dict(zip(ids.tolist(), np.asarray(plan.queries.member).tolist()))
    assert flagged["member"].tolist() == [expected[i] for i in flagged["query_id"]]
    assert flagged["member"].sum() == 2 * 30
    with pytest.raises(ProbeError, match="other queries"):
        with_member_flags(table.iloc[2:], plan)
