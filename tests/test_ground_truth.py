"""The ground truth a planted run through a package's fine-tuner is read against (``probes.ground_truth``): whether
the weights moved towards the members' trained labels in the package's own frame (the training rows as the
context), white-box. As an instrument it must find memorization that is there, and must not find it in a model that
never saw the audited rows, nor on rows the run never trained on (null splits).

Its frame is the package's: a run of iclmem's own loop (C' as the context, members as queries) memorizes in that
frame instead, and the known-context channel is its yardstick (tests/test_minis.py); this ground truth read 0.32-0.55
on such runs (seeds 0-1 of both minis), which is why it is defined for ``recipe: upstream`` only."""

from __future__ import annotations

import pytest

from trainables.models.extras import extra_is_installed


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::probes.metrics.LowResolutionWarning")
@pytest.mark.skipif(not extra_is_installed("tabpfn-v2"), reason="tabpfn (the tabpfn-v2 extra) is not installed")
def test_the_ground_truth_finds_a_run_the_package_fine_tuner_memorized_and_not_a_model_that_never_saw_the_rows():
    """tabpfn-mini through ``FinetunedTabPFNClassifier`` with early stopping off (iris, Q 30 label-shuffled members,
    |C'| 60, lr 3e-3, 200 epochs, seed 0), and the control: the same fine-tuner and recipe on 30 rows outside the
    audit, their labels moved one class on. Seeds 0-4 (benchmarks/RESULTS.md, "Power on the recipes users run")
    read the planted run's interval low at 0.684-0.863 (memorized on every seed) and the controls' at 0.257-0.473
    over all 30 controls of every recipe (none memorized); the ground truth fired on 8 of 300 null splits. With
    forced AVX2 kernels (ATen, MKL, OpenBLAS, numba; seeds 0-4) the planted lows were 0.619-0.851 (0.688 at seed
    0), the controls' 0.269-0.404, and no null split of 15 fired. tabicl-mini is not asserted: its fine-tuner memorized on 3 of 5 seeds
    in this recipe, a finding, not a property."""
    from orchestrator.audits.upstream_power import planted_upstream_power

    out = planted_upstream_power("tabpfn-v2", {"weights": "mini", "recipe": "upstream",
                                               "finetuner": {"early_stopping": False}},
                                 lr=3e-3, epochs=200, seed=0, n_references=0, null_splits=3)
    target, control = out["target"], out["control"]
    assert target["epoch"] == 200
    assert target["ground_truth_memorized"], target["ground_truth_auc_low"]
    assert target["ground_truth_auc_low"] > 0.6
    assert (target["ground_truth_n_members"], target["ground_truth_n_nonmembers"]) == (30, 30)
    assert target["null_ground_truth_trials"] == 3
    assert target["null_ground_truth_memorized"] <= 1
    assert not control["ground_truth_memorized"], control["ground_truth_auc_low"]
    assert control["ground_truth_auc_low"] < 0.5
