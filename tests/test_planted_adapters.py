"""Planted ground truth through each real adapter (tiny, randomly initialised from its own architecture):
label-shuffled members, many epochs at lr 1e-3 (3e-3 for TabICL's tiny instance), must be detected
(calibrated AUC interval above 0.5).

TabPFN v2 standardises every feature over its context rows; a zero-information probe context repeats
the query in every row, so without help every feature is constant and the query's features vanish. The
probe hands such a model the fine-tuning context's statistics; the control below probes the same
checkpoint without them and must find nothing, which is why the fix is there.
"""

from __future__ import annotations

import pytest
import torch
from test_adapter_contract import CLASSIFIERS

from orchestrator.audits.selfcheck import planted_check
from trainables.models import build_model
from trainables.models.extras import extra_is_installed

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::probes.metrics.LowResolutionWarning")]


def _require(name: str) -> None:
    if not extra_is_installed(name):
        pytest.skip(f"{name}: its optional extra is not installed")


# Epochs each tiny model needs (benchmarks/planted_adapters.py: TabPFN v2 0.89 [0.79, 0.97] at 200, ConTextTab
# 0.80 [0.67, 0.91] at 100 reading iris's real columns, one thread as a trial runs). TabICL's tiny instance
# is the weakest and its verdict moves with the CPU's rounding: at lr 1e-3 one machine measured 0.68
# [0.55, 0.80] and another 0.61 [0.48, 0.76] (seeds 1, 2: 0.59, 0.50); at lr 3e-3, 200 epochs, seeds 0, 1,
# 2 gave 0.69 [0.57, ..], 0.72 [0.59, ..], 0.69 [0.54, ..] there. Trained on two threads it stays marginal.
EPOCHS = {"tabpfn-v2": 200, "contexttab": 100, "tabicl": 200}
LEARNING_RATES = {"tabpfn-v2": 1e-3, "contexttab": 1e-3, "tabicl": 3e-3}


@pytest.mark.parametrize("name", sorted(EPOCHS))
def test_label_shuffled_members_are_detected_through_each_real_adapter(name):
    _require(name)
    row = planted_check(name, CLASSIFIERS[name], lr=LEARNING_RATES[name], epochs=EPOCHS[name])
    assert row["auc_low"] > 0.5, row
    assert row["outcome"] == "memorization"


def test_tabpfn_probed_without_the_fine_tuning_contexts_statistics_sees_no_query_features():
    _require("tabpfn-v2")
    row = planted_check("tabpfn-v2", CLASSIFIERS["tabpfn-v2"], reference_statistics=False)
    assert row["auc_low"] <= 0.5 <= row["auc_high"], row
    assert row["outcome"] != "memorization", row


def test_a_model_that_normalises_over_its_context_sees_the_query_only_with_reference_statistics():
    _require("tabpfn-v2")
    model = build_model("tabpfn-v2", **CLASSIFIERS["tabpfn-v2"], seed=1)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():  # TabPFN zero-initialises its residual outputs; give them weights to read x with
        for parameter in model.module.parameters():
            if not parameter.abs().max() > 0:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    queries = torch.randn(2, 1, 5, generator=generator) * 3  # two different queries
    context_x = queries.expand(2, 8, 5).clone()  # zero information: every context row is the query
    context_y = torch.tensor([[0, 1, 2, 0, 1, 2, 0, 1]] * 2)
    with torch.no_grad():
        alone = model.log_probs(context_x, context_y, queries, 3)
        with model.feature_statistics(torch.randn(2, 20, 5, generator=generator)):
            with_reference = model.log_probs(context_x, context_y, queries, 3)
        after = model.log_probs(context_x, context_y, queries, 3)
    # the query's features vanished: the two queries' outputs agree to rounding (not bit for bit: on two
    # threads the batch's two tables can take different kernel paths), against > 1e-3 with the statistics
    assert float((alone[0] - alone[1]).abs().max()) <= 1e-5
    assert (with_reference[0] - with_reference[1]).abs().max() > 1e-3  # now they reach the model
    assert torch.equal(after, alone)  # the statistics apply within the block only
