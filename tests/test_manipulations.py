"""Stage II manipulations: the default suite, each primitive, composition, seeding, materialisation."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from iclmem.errors import ConfigError, ProbeError, UnknownNameError
from probes import manipulations as mm
from probes.context_plans import materialize, materialize_batch
from probes.manipulations import (
    ContextPlan,
    Manipulation,
    apply,
    build_plans,
    default_suite,
    group_by_shape,
    rng_for,
    step,
    suite_fingerprint,
    suite_from_spec,
    suite_to_spec,
)

# Hand-made example: 3 candidate labels, 4 features, true label 1.
M, F, TRUE = 3, 4, 1
X_Q = np.array([10.0, 20.0, 30.0, 40.0], dtype=np.float32)
SUITE = {m.name: m for m in default_suite()}

# The spec's table, written out here independently of the module's own constant.
SPEC_COUNTS = {
    "base": 1,
    "position": 3,
    "skew_true": 3,
    "skew_incorrect": 9,
    "skew_mixed": 3,
    "scale_uniform": 3,
    "scale_random": 3,
    "drop_features": 2,
    "distractors": 2,
    "combo2": 9,
    "combo3": 10,
}


def plan_of(name: str, seed: int = 0, query_id: int = 7, true_label: int = TRUE, m: int = M, f: int = F) -> ContextPlan:
    return apply(SUITE[name], true_label, m, f, rng_for(seed, query_id, name))


def plans_over_queries(name: str, n: int = 200, **kw) -> list[ContextPlan]:
    return [plan_of(name, query_id=q, **kw) for q in range(n)]


def label_counts(plan: ContextPlan, m: int = M) -> list[int]:
    return np.bincount(plan.labels, minlength=m).tolist()


def true_block_is_contiguous(plan: ContextPlan, true_label: int = TRUE) -> bool:
    where = np.flatnonzero(plan.labels == true_label)
    return bool(np.all(np.diff(where) == 1))


def others_in_sorted_order(plan: ContextPlan, true_label: int = TRUE) -> bool:
    others = plan.labels[plan.labels != true_label]
    return bool(np.all(np.diff(others) >= 0))


# ---------------------------------------------------------------------------------------------- suite


def test_default_suite_has_exactly_48_manipulations():
    assert len(default_suite()) == 48


def test_default_suite_category_counts_match_the_spec_table_in_table_order():
    suite = default_suite()
    assert Counter(m.category for m in suite) == SPEC_COUNTS
    # categories appear as contiguous blocks in the table's order
    order = list(dict.fromkeys(m.category for m in suite))
    assert order == list(SPEC_COUNTS)


def test_default_suite_names_are_unique_stable_and_listed_in_the_module_docstring():
    names = [m.name for m in default_suite()]
    assert len(set(names)) == 48
    for expected in (
        "base",
        "position_random",
        "position_first",
        "position_last",
        "skew_true_x2",
        "skew_incorrect_k1_x2",
        "skew_mixed_t2_i3",
        "scale_uniform_x2",
        "scale_random_f5",
        "drop_features_a",
        "drop_features_b",
        "distractors_1",
        "combo2_random_skew_true_x2",
    ):
        assert expected in names
    for name in names:
        assert name in mm.__doc__


def test_default_suite_parameters_follow_the_spec():
    def params(name: str) -> list[dict]:
        return [s.to_spec() for s in SUITE[name].steps]

    assert {(s["k"], s["repeat"]) for n in SUITE if n.startswith("skew_incorrect") for s in params(n)} == {
        (k, r) for k in (1, 2, 3) for r in (2, 3, 5)
    }
    assert {
        (s["true_repeat"], s["incorrect_repeat"]) for n in SUITE if n.startswith("skew_mixed") for s in params(n)
    } == {(2, 3), (3, 2), (5, 2)}
    assert [params(f"scale_uniform_x{f}") for f in (2, 5, 10)] == [
        [{"primitive": "scale_uniform", "factor": f}] for f in (2, 5, 10)
    ]
    assert [params(f"scale_random_f{f}") for f in (2, 5, 10)] == [
        [{"primitive": "scale_random", "max_factor": f}] for f in (2, 5, 10)
    ]
    combo2 = [n for n in SUITE if SUITE[n].category == "combo2"]
    for n in combo2:  # every combo2 starts from a random position
        assert {"primitive": "position", "where": "random"} in params(n)
        assert len(params(n)) == 2
    for n in (n for n in SUITE if SUITE[n].category == "combo3"):
        assert len(params(n)) == 3


def test_manipulations_can_be_registered_and_suites_are_plain_data():
    spec = suite_to_spec(default_suite())
    assert suite_from_spec([{**s, "name": s["name"] + "_copy"} for s in spec])[5].steps == default_suite()[5].steps
    assert suite_fingerprint(default_suite()) == suite_fingerprint(suite_from_spec([m.name for m in default_suite()]))
    assert suite_fingerprint(default_suite()) != suite_fingerprint(default_suite()[:-1])


# ---------------------------------------------------------------------------------------------- primitives


def test_base_is_one_row_per_candidate_label_in_sorted_order_with_every_feature():
    plan = plan_of("base")
    assert plan.labels.tolist() == [0, 1, 2]
    assert plan.keep_columns.tolist() == [0, 1, 2, 3]
    assert plan.distractors.shape == (4, 0)
    cx, qx = materialize(plan, X_Q)
    assert cx.shape == (3, 4)
    assert cx.dtype == np.float32
    assert np.array_equal(cx, np.tile(X_Q, (3, 1)))
    assert np.array_equal(qx, X_Q)


def test_position_first_and_last_move_the_true_label_row_and_keep_the_others_sorted():
    assert plan_of("position_first").labels.tolist() == [1, 0, 2]
    assert plan_of("position_last").labels.tolist() == [0, 2, 1]


def test_position_random_puts_the_true_label_row_at_every_position_over_queries():
    seen = Counter()
    for plan in plans_over_queries("position_random", 120):
        assert label_counts(plan) == [1, 1, 1]
        assert others_in_sorted_order(plan)
        seen[int(np.flatnonzero(plan.labels == TRUE)[0])] += 1
    assert set(seen) == {0, 1, 2}  # uniform over the 3 gaps, original position included


def test_skew_true_repeats_the_true_label_row():
    for r in (2, 3, 5):
        plan = plan_of(f"skew_true_x{r}")
        assert label_counts(plan) == [1, r, 1]
        assert plan.labels.tolist() == sorted(plan.labels.tolist())  # no position step: sorted layout


def test_skew_incorrect_repeats_k_incorrect_labels_and_never_the_true_one():
    for r in (2, 3, 5):
        one = [label_counts(p) for p in plans_over_queries(f"skew_incorrect_k1_x{r}", 40)]
        assert all(c[TRUE] == 1 and sorted(c) == [1, 1, r] for c in one)
        assert {tuple(c) for c in one} == {(r, 1, 1), (1, 1, r)}  # which incorrect label is random
        # k=2 and k=3 both cover the two incorrect labels of a 3-label task (k capped at m-1)
        assert label_counts(plan_of(f"skew_incorrect_k2_x{r}")) == [r, 1, r]
        assert label_counts(plan_of(f"skew_incorrect_k3_x{r}")) == [r, 1, r]


def test_skew_incorrect_caps_k_at_m_minus_1_for_binary_tasks():
    for k in (1, 2, 3):
        plan = plan_of(f"skew_incorrect_k{k}_x3", true_label=0, m=2)
        assert label_counts(plan, 2) == [1, 3]


def test_skew_mixed_repeats_the_true_label_and_one_random_incorrect_label():
    for name, a, b in (("skew_mixed_t2_i3", 2, 3), ("skew_mixed_t3_i2", 3, 2), ("skew_mixed_t5_i2", 5, 2)):
        counts = [label_counts(p) for p in plans_over_queries(name, 40)]
        assert all(c[TRUE] == a and sorted(c[:TRUE] + c[TRUE + 1 :]) == [1, b] for c in counts)
        assert {tuple(c) for c in counts} == {(b, a, 1), (1, a, b)}


def test_scale_uniform_multiplies_every_row():
    for f in (2, 5, 10):
        plan = plan_of(f"scale_uniform_x{f}")
        assert label_counts(plan) == [f, f, f]
        assert plan.n_rows == 3 * f


def test_scale_random_repeats_each_row_between_1_and_f_times_independently():
    for f in (2, 5, 10):
        counts = np.array([label_counts(p) for p in plans_over_queries(f"scale_random_f{f}", 80)])
        assert counts.min() == 1
        assert counts.max() == f
        assert len({tuple(c) for c in counts}) > 1  # rows draw independently


def test_drop_features_drops_two_random_columns_and_keeps_the_rest_sorted():
    keeps = {
        tuple(plan_of(name, query_id=q).keep_columns.tolist())
        for name in ("drop_features_a", "drop_features_b")
        for q in range(40)
    }
    assert all(len(k) == 2 and list(k) == sorted(k) for k in keeps)
    assert len(keeps) > 1
    cx, qx = materialize(plan_of("drop_features_a"), X_Q)
    assert cx.shape == (3, 2)
    assert set(qx.tolist()) < set(X_Q.tolist())


def test_drop_features_drops_one_column_below_3_features_and_none_with_one_feature():
    assert plan_of("drop_features_a", f=2).n_kept == 1
    assert plan_of("drop_features_a", f=3).n_kept == 1
    plan = plan_of("drop_features_a", f=1)  # never the last column: the query must stay visible
    assert plan.keep_columns.tolist() == [0]


def test_distractors_add_fresh_columns_for_every_context_row_and_the_query_row():
    for d in (1, 2):
        plan = plan_of(f"distractors_{d}")
        assert plan.distractors.shape == (4, d)
        assert plan.distractors.dtype == np.float32
        assert plan.keep_columns.tolist() == [0, 1, 2, 3]
        cx, qx = materialize(plan, X_Q)
        assert cx.shape == (3, 4 + d)
        assert qx.shape == (4 + d,)
        assert np.array_equal(cx[:, 4:], plan.distractors[:3])
        assert np.array_equal(qx[4:], plan.distractors[3])  # the query row gets its own values
        assert np.all(plan.distractors != 0)
        assert len(np.unique(plan.distractors)) == plan.distractors.size


# ---------------------------------------------------------------------------------------------- combos


def test_combo2_random_position_with_skew_true_moves_the_whole_true_block():
    starts = set()
    for plan in plans_over_queries("combo2_random_skew_true_x3", 120):
        assert label_counts(plan) == [1, 3, 1]
        assert true_block_is_contiguous(plan)
        assert others_in_sorted_order(plan)
        starts.add(int(np.flatnonzero(plan.labels == TRUE)[0]))
    assert starts == {0, 1, 2}


def test_combo3_random_skew_true_with_drop_features_or_one_distractor():
    for r in (2, 3, 5):
        for plan in plans_over_queries(f"combo3_random_skew_true_x{r}_drop_features", 20):
            assert label_counts(plan) == [1, r, 1]
            assert true_block_is_contiguous(plan)
            assert plan.n_kept == 2
            assert plan.n_distractors == 0
        for plan in plans_over_queries(f"combo3_random_skew_true_x{r}_distractors_1", 20):
            assert label_counts(plan) == [1, r, 1]
            assert true_block_is_contiguous(plan)
            assert plan.n_kept == 4
            assert plan.distractors.shape == (r + 3, 1)


def test_combo3_random_skew_incorrect_with_one_distractor():
    for r in (2, 3):
        for plan in plans_over_queries(f"combo3_random_skew_incorrect_k1_x{r}_distractors_1", 20):
            c = label_counts(plan)
            assert c[TRUE] == 1
            assert sorted(c) == [1, 1, r]
            assert plan.distractors.shape == (r + 3, 1)
            assert plan.n_kept == 4


def test_combo3_first_scale_uniform_x5_with_drop_features():
    plan = plan_of("combo3_first_scale_uniform_x5_drop_features")
    assert plan.labels.tolist() == [1] * 5 + [0] * 5 + [2] * 5
    assert plan.n_kept == 2
    assert plan.n_distractors == 0


def test_combo3_last_scale_random_f5_with_two_distractors():
    for plan in plans_over_queries("combo3_last_scale_random_f5_distractors_2", 20):
        c = label_counts(plan)
        assert all(1 <= x <= 5 for x in c)
        assert plan.labels[-c[TRUE] :].tolist() == [TRUE] * c[TRUE]
        assert others_in_sorted_order(plan)
        assert plan.distractors.shape == (sum(c) + 1, 2)
        assert plan.n_kept == 4


def test_steps_compose_in_phase_order_whatever_order_they_are_listed_in():
    steps = (
        step("distractors", n=1),
        step("position", where="first"),
        step("skew_true", repeat=2),
        step("drop_features"),
    )
    a = Manipulation("mixed_up", "custom", steps)
    b = Manipulation("mixed_up", "custom", tuple(reversed(steps)))
    assert a == b
    assert [s.primitive for s in a.steps] == ["skew_true", "position", "drop_features", "distractors"]
    assert apply(a, TRUE, M, F, rng_for(0, 1, "x")) == apply(b, TRUE, M, F, rng_for(0, 1, "x"))
    # the distractors are drawn after the skew, so they cover every row of the skewed context
    assert apply(a, TRUE, M, F, rng_for(0, 1, "x")).distractors.shape == (5, 1)


# ---------------------------------------------------------------------------------------------- seeding


def test_same_seed_gives_byte_identical_plans():
    ids, labels = np.arange(10, dtype=np.int64) * 13, np.arange(10, dtype=np.int64) % M
    first = build_plans(default_suite(), 42, ids, labels, M, F)
    second = build_plans(default_suite(), 42, ids, labels, M, F)
    assert len(first) == 10 * 48
    assert [p.plan.to_bytes() for p in first] == [p.plan.to_bytes() for p in second]
    assert [(p.query_index, p.manipulation_index) for p in first] == [(q, j) for q in range(10) for j in range(48)]


def test_rng_for_is_stable_across_processes_and_hash_seeds():
    code = (
        "from probes.manipulations import rng_for; "
        "print(rng_for(3, 11, 'position_random').integers(1 << 62, size=3).tolist())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(rng_for(3, 11, "position_random").integers(1 << 62, size=3).tolist())


def test_different_query_id_seed_or_manipulation_name_gives_different_randomness():
    draw = lambda s, q, n: rng_for(s, q, n).integers(1 << 62, size=4).tolist()  # noqa: E731
    base = draw(0, 5, "drop_features_a")
    assert draw(0, 5, "drop_features_a") == base
    assert draw(0, 6, "drop_features_a") != base
    assert draw(1, 5, "drop_features_a") != base
    assert draw(0, 5, "drop_features_b") != base
    # the two drop_features draws pick different columns for some queries
    assert any(plan_of("drop_features_a", query_id=q) != plan_of("drop_features_b", query_id=q) for q in range(20))
    assert any(plan_of("distractors_1", query_id=0, seed=s) != plan_of("distractors_1", query_id=0) for s in (1, 2))


# ---------------------------------------------------------------------------------------------- batching


def test_materialize_batch_equals_per_plan_materialize_within_each_shape_group():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((6, F)).astype(np.float32)
    planned = build_plans(default_suite(), 0, np.arange(6, dtype=np.int64), np.array([0, 1, 2, 0, 1, 2]), M, F)
    groups = group_by_shape(planned)
    assert sorted(i for idx in groups.values() for i in idx) == list(range(len(planned)))
    for shape, idx in groups.items():
        plans = [planned[i].plan for i in idx]
        xs = X[[planned[i].query_index for i in idx]]
        cx, cy, qx = materialize_batch(plans, xs)
        assert cx.shape == (len(idx), shape.n_rows, shape.n_kept + shape.n_distractors)
        assert cy.dtype == np.int64
        assert cx.dtype == qx.dtype == np.float32
        for b, plan in enumerate(plans):
            one_cx, one_qx = materialize(plan, xs[b])
            assert np.array_equal(cx[b], one_cx)
            assert np.array_equal(qx[b], one_qx)
            assert np.array_equal(cy[b], plan.labels)


def test_materialize_batch_rejects_plans_of_different_shapes():
    with pytest.raises(ProbeError, match="one shape"):
        materialize_batch([plan_of("base"), plan_of("skew_true_x2")], np.stack([X_Q, X_Q]))


def test_plans_are_read_only():
    plan = plan_of("distractors_1")
    with pytest.raises(ValueError, match="read-only"):
        plan.labels[0] = 2
    with pytest.raises(ValueError, match="read-only"):
        plan.distractors[0, 0] = 0.0


def test_apply_rejects_single_label_tasks_and_out_of_range_true_labels():
    with pytest.raises(ProbeError):
        apply(SUITE["base"], 0, 1, F, rng_for(0, 0, "base"))
    with pytest.raises(ProbeError):
        apply(SUITE["base"], 3, M, F, rng_for(0, 0, "base"))
    with pytest.raises(ProbeError):
        apply(SUITE["base"], 0, M, 0, rng_for(0, 0, "base"))


# ---------------------------------------------------------------------------------------------- specs


def test_suite_from_spec_accepts_default_names_and_custom_step_lists():
    suite = suite_from_spec(
        [
            "base",
            "skew_true_x2",
            {
                "name": "my_skew",
                "category": "mine",
                "steps": [{"primitive": "skew_true", "repeat": 4}, {"primitive": "position", "where": "last"}],
            },
            {"name": "plain", "steps": []},
        ]
    )
    assert [m.name for m in suite] == ["base", "skew_true_x2", "my_skew", "plain"]
    assert suite[1] is SUITE["skew_true_x2"]
    assert suite[2].category == "mine"
    assert suite[3].category == "custom"
    assert apply(suite[2], TRUE, M, F, rng_for(0, 0, "my_skew")).labels.tolist() == [0, 2, 1, 1, 1, 1]


def test_suite_from_spec_unknown_primitive_raises_unknown_name_listing_the_known_ones():
    with pytest.raises(UnknownNameError) as info:
        suite_from_spec([{"name": "x", "steps": [{"primitive": "shuffle"}]}])
    for known in ("skew_true", "position", "distractors", "drop_features"):
        assert known in str(info.value)


def test_suite_from_spec_unknown_manipulation_name_raises_unknown_name():
    with pytest.raises(UnknownNameError, match="skew_true_x2"):
        suite_from_spec(["skew_true_x4"])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "empty"),
        (["base", "base"], "twice"),
        ([{"name": "a", "steps": []}, {"name": "a", "steps": []}], "twice"),
        ([{"name": "base", "steps": []}], "registered"),
        ([{"name": "a", "steps": [{"primitive": "skew_true"}]}], "repeat"),
        ([{"name": "a", "steps": [{"primitive": "skew_true", "repeat": 0}]}], ">= 1"),
        ([{"name": "a", "steps": [{"primitive": "skew_true", "repeat": True}]}], "integer"),
        ([{"name": "a", "steps": [{"primitive": "skew_true", "repeat": 2, "times": 3}]}], "unknown parameter"),
        ([{"name": "a", "steps": [{"primitive": "position", "where": "middle"}]}], "one of"),
        ([{"name": "a", "steps": "skew_true"}], "list"),
        ([{"name": "a", "steps": [], "weight": 1}], "unknown key"),
        ([{"name": "bad name", "steps": []}], "must match"),
        ([3], "name or a mapping"),
        ("base", "list"),
    ],
)
def test_suite_from_spec_rejects_invalid_suites_with_config_error(spec, message):
    with pytest.raises(ConfigError, match=message):
        suite_from_spec(spec)
