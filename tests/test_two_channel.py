"""Two channels, same rows (probes/two_channel.py): the deployed context's draw, a model that holds its context
found through it on every seed, a model that ignores its context not, and each channel measured within the
other's strata. The real path (a fine-tuned pfn-mini in a Ray sweep) is in test_pipeline.py."""

from __future__ import annotations

import numpy as np
import pytest

from iclmem.errors import ProbeError
from iclmem.stats import auc
from probes.two_channel import channel_crossing, context_channel_scores, deployed_context_mask

SEEDS = range(5)


def _rows(seed: int, n: int = 80, features: int = 5, classes: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features float32 [n, F], labels with no relation to the features, fine-tuned flags: the first half)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = rng.integers(0, classes, size=n).astype(np.int64)
    return x, y, np.arange(n) < n // 2


def _holds_its_context(context_x: np.ndarray, context_y: np.ndarray, query_x: np.ndarray) -> np.ndarray:
    """A soft nearest-neighbour classifier: a query that is a row of the context takes that row's label."""
    d2 = ((query_x[:, None, :] - context_x[None, :, :]) ** 2).sum(-1)
    weight = np.exp(-d2 / 0.1)
    p = np.stack([weight[:, context_y == c].sum(1) for c in range(3)], axis=1) + 1e-3
    return np.log(p / p.sum(1, keepdims=True))


def _ignores_its_context(context_x: np.ndarray, context_y: np.ndarray, query_x: np.ndarray) -> np.ndarray:
    """A model that never read its context: the same output whatever the context holds."""
    logits = np.stack([query_x[:, 0], query_x[:, 1], -query_x[:, 0]], axis=1).astype(np.float64)
    return logits - np.log(np.exp(logits).sum(1, keepdims=True))


def test_the_deployed_context_holds_half_of_every_fine_tuned_and_label_cell():
    for seed in SEEDS:
        _, y, ft = _rows(seed)
        mask = deployed_context_mask(ft, y, seed)
        for flag in (True, False):
            for label in range(3):
                cell = (ft == flag) & (y == label)
                assert abs(int(mask[cell].sum()) - cell.sum() / 2) <= 0.5
        assert abs(int(mask.sum()) - len(y) // 2) <= 6  # odd cells give their spare row by a fair draw
    _, y, ft = _rows(0)
    assert not np.array_equal(deployed_context_mask(ft, y, 0), deployed_context_mask(ft, y, 1))
    with pytest.raises(ProbeError, match="fine-tuned flags"):
        deployed_context_mask(ft[:-1], y, 0)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_model_that_holds_its_context_is_found_through_it_among_fine_tuned_rows_and_the_rest(seed):
    x, y, ft = _rows(seed)
    in_context = deployed_context_mask(ft, y, seed)
    scores = context_channel_scores(_holds_its_context, x, y, in_context, 3, n_references=8, seed=seed)
    assert set(scores) == {"loss", "calibrated_loss", "lira_online", "lira_offline", "rmia"}
    cells = {(c.channel.value, c.attack, c.stratum): c for c in channel_crossing(ft, in_context, {}, scores,
                                                                                   n_resamples=100, seed=seed)}
    for stratum in ("fine_tuned", "not_fine_tuned"):
        cell = cells[("deployed_context", "calibrated_loss", stratum)]
        # measured over seeds 0-4: AUC 0.905-1.000, interval low 0.78-1.00 (an exact copy of the query is in the
        # context); the control below gives 0.31-0.68
        assert cell.auc > 0.85, cell
        assert cell.auc_low > 0.7, cell
        assert cell.n_members + cell.n_nonmembers == 40


def test_the_control_a_context_that_holds_none_of_the_rows_is_not_found_on_any_seed():
    """The same model deployed with a context of other rows (the audited rows' label counts, none of them): every
    attack against the same references must find nothing, or the channel's verdict is not to be trusted."""
    aucs = []
    for seed in SEEDS:
        x, y, ft = _rows(seed)
        in_context = deployed_context_mask(ft, y, seed)
        other_x, _, _ = _rows(seed + 100)
        control = (other_x[: in_context.sum()], y[in_context])
        scores = context_channel_scores(_holds_its_context, x, y, in_context, 3, n_references=8, seed=seed,
                                        control=control)
        for cell in channel_crossing(ft, in_context, {}, scores, n_resamples=100, seed=seed):
            aucs.append(cell.auc)
            # measured over seeds 0-4: AUC 0.31-0.68 in a stratum; the planted model gives 0.9-1.0
            assert cell.auc < 0.8, cell
    assert abs(float(np.mean(aucs)) - 0.5) < 0.06, np.mean(aucs)


def test_a_model_that_never_reads_its_context_scores_zero_by_construction_a_sanity_check():
    """Sanity check (true by construction, not a control): the reference-calibrated attacks of a model whose
    output does not depend on its context are exactly zero for every row."""
    x, y, ft = _rows(0)
    scores = context_channel_scores(_ignores_its_context, x, y, deployed_context_mask(ft, y, 0), 3, n_references=8,
                                    seed=0)
    np.testing.assert_allclose(scores["calibrated_loss"], 0.0, atol=1e-12)


def test_each_channel_is_measured_within_the_strata_of_the_other():
    """Weights that memorised the fine-tuned rows (a planted score shift) and a model that holds its context:
    each channel separates its own members inside both strata of the other, and a channel whose scores carry
    the *other* membership only (the weights' shift, read as a context score) is at chance inside each stratum."""
    rng = np.random.default_rng(3)
    x, y, ft = _rows(3, n=120)
    in_context = deployed_context_mask(ft, y, 3)
    weights = {"probe": rng.normal(size=len(y)) + 3.0 * ft}
    context = context_channel_scores(_holds_its_context, x, y, in_context, 3, n_references=8, seed=3)
    context["weights_shift_only"] = weights["probe"]
    cells = {(c.channel.value, c.attack, c.stratum): c
             for c in channel_crossing(ft, in_context, weights, context, n_resamples=100)}
    for stratum in ("in_context", "not_in_context"):
        assert cells[("fine_tuned_weights", "probe", stratum)].auc > 0.9
    for stratum in ("fine_tuned", "not_fine_tuned"):
        assert cells[("deployed_context", "calibrated_loss", stratum)].auc > 0.9
        # within one stratum every row has the same fine-tuned flag: the weights' shift cannot tell context rows
        shifted = cells[("deployed_context", "weights_shift_only", stratum)]
        assert shifted.auc_low < 0.5 < shifted.auc_high
    # pooled, that same score would look like a context signal wherever the two memberships were correlated
    assert auc(weights["probe"][ft], weights["probe"][~ft]) > 0.9


def test_bad_inputs_are_refused_naming_what_is_wrong():
    x, y, ft = _rows(0)
    in_context = deployed_context_mask(ft, y, 0)
    with pytest.raises(ProbeError, match="even number"):
        context_channel_scores(_holds_its_context, x, y, in_context, 3, n_references=3, seed=0)
    with pytest.raises(ProbeError, match="context flags"):
        channel_crossing(ft, in_context[:-1], {}, {})
    with pytest.raises(ProbeError, match="'probe' scores"):
        channel_crossing(ft, in_context, {"probe": np.zeros(3)}, {})


def test_the_sweeps_control_takes_free_rows_with_the_contexts_label_counts_and_shares_the_references():
    """The control a sweep deploys in the context's place (probes.probe.context_channel_table): rows from the
    free pool only, the deployed context's label counts, None when a label runs short; scored with the deployed
    context against one set of references (the deployed scores equal the channel's alone)."""
    from iclmem.vocab import ContextTarget
    from probes.two_channel import context_channel_targets, control_context_rows

    x, y, ft = _rows(0)
    in_context = deployed_context_mask(ft, y, 0)
    free_x, free_y, _ = _rows(7, n=200)
    free_rows = np.arange(1000, 1200)
    rows = control_context_rows(y[in_context], free_rows, free_y, seed=0)
    assert rows is not None
    assert set(rows) <= set(free_rows)
    assert len(set(rows)) == len(rows) == int(in_context.sum())
    np.testing.assert_array_equal(np.bincount(free_y[rows - 1000], minlength=3),
                                  np.bincount(y[in_context], minlength=3))
    assert control_context_rows(y[in_context], free_rows[:5], free_y[:5], seed=0) is None
    control = (free_x[rows - 1000], free_y[rows - 1000])
    both = context_channel_targets(_holds_its_context, x, y, in_context, 3, 8, 0, control)
    alone = context_channel_scores(_holds_its_context, x, y, in_context, 3, n_references=8, seed=0)
    for attack, values in alone.items():
        np.testing.assert_array_equal(both[ContextTarget.DEPLOYED][attack], values)
    control_auc = auc(both[ContextTarget.CONTROL]["calibrated_loss"][in_context],
                      both[ContextTarget.CONTROL]["calibrated_loss"][~in_context])
    assert abs(control_auc - 0.5) < 0.25
