"""Canaries (issue #16 item 3): crafted rows inserted 1, 2, 4, 8 times into a run's members, their
Secret-Sharer-style exposure against held-out canaries, planted ground truth, and a real sweep."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from iclmem.errors import ConfigError
from iclmem.runfolder import RESULTS_FILE
from iclmem.vocab import CanaryKind, ColumnKind
from probes.canaries import canary_records, exposure_bits, label_ranks, summary_columns
from trainables.canaries import OUTLIER_SIGMAS, CanarySettings, make_canaries, rarest_member_label
from trainables.data import PrepSettings, TaskSource, prepare_task


def _task(name: str = "iris", q: int = 30, context: int = 30, mode: str = "normal"):
    return prepare_task(TaskSource(name, "builtin", None, None, None), PrepSettings(context_size=context), mode, 0, q=q)


# ------------------------------------------------------------------------------------------- the math
def test_exposure_counts_held_out_canaries_scoring_at_least_as_high():
    held = np.array([3.0, 0.0, 2.0, 1.0])  # H = 4: the ceiling is log2(5)
    got = exposure_bits(np.array([3.5, 2.0, -1.0, 3.0]), held)
    # above all: log2 5 - log2 1; two at or above 2.0: log2 5 - log2 3; all four: 0; a tie counts against: 1 above
    assert got == pytest.approx([math.log2(5), math.log2(5) - math.log2(3), 0.0, math.log2(5) - 1.0])
    with pytest.raises(ValueError, match="held-out"):
        exposure_bits(np.array([1.0]), np.array([]))


def test_label_rank_is_one_for_the_most_probable_label_and_ties_count_against_it():
    lp = np.log(np.array([[0.7, 0.2, 0.1], [0.2, 0.7, 0.1], [1 / 3, 1 / 3, 1 / 3]]))
    assert label_ranks(lp, np.array([0, 2, 1])).tolist() == [1, 3, 3]


def test_records_measure_each_kind_against_its_own_held_out_canaries_and_summaries_group_by_copies():
    ids = -np.arange(1, 9)
    kinds = (CanaryKind.OUTLIER,) * 4 + (CanaryKind.RARE_LABEL,) * 4
    copies = np.array([1, 8, 0, 0, 1, 8, 0, 0])
    # outliers: held out 0 and 1; rare_label: held out 10 and 11 (its inserted ones would be 0 bits against them)
    probe = np.array([5.0, 0.5, 0.0, 1.0, 5.0, 12.0, 10.0, 11.0])
    records = canary_records(ids, kinds, copies, probe, probe.copy(), np.array([1, 2, 3, 3, 1, 1, 3, 3]), 4)
    assert [(r["id"], r["kind"], r["copies"]) for r in records] == [(-1, "outlier", 1), (-2, "outlier", 8),
                                                                   (-5, "rare_label", 1), (-6, "rare_label", 8)]
    assert [r["exposure"] for r in records] == pytest.approx([math.log2(3), math.log2(3) - 1, 0.0, math.log2(3)])
    assert [r["label_exposure"] for r in records] == pytest.approx([2.0, 1.0, 2.0, 2.0])  # log2 4 - log2 rank
    cols = summary_columns(records)
    assert cols["canary_holdout"] == 2
    assert cols["canary_exposure_max"] == pytest.approx(math.log2(3))
    assert cols["canary_exposure_c1"] == pytest.approx(math.log2(3) / 2)
    assert cols["canary_outlier_exposure_c8"] == pytest.approx(math.log2(3) - 1)
    assert cols["canary_rare_label_exposure_c8"] == pytest.approx(math.log2(3))
    assert cols["canary_label_rank_c8"] == pytest.approx(1.5)
    assert len(json.loads(cols["canary_records"])) == 4


# ------------------------------------------------------------------------------------------- the canaries
def test_canaries_are_a_pure_function_of_task_and_settings_with_the_planned_layout():
    task = _task()
    settings = CanarySettings(kinds=(CanaryKind.OUTLIER, CanaryKind.RARE_LABEL), copies=(1, 2, 4, 8), per_group=3,
                              holdout=10)
    a, b = make_canaries(task, settings), make_canaries(task, settings.as_dict())
    assert a.fingerprint == b.fingerprint
    assert np.array_equal(a.features, b.features)
    per_kind = 3 * 4 + 10
    assert len(a) == 2 * per_kind
    assert a.ids.tolist() == list(range(-1, -2 * per_kind - 1, -1))
    assert a.copies[:per_kind].tolist() == [1] * 3 + [2] * 3 + [4] * 3 + [8] * 3 + [0] * 10
    x, y = a.training_rows()
    assert x.shape == (2 * 3 * 15, task.n_features)
    assert settings.n_inserted_rows == 90
    # outliers: every number 4-6 standard deviations from its column's mean
    mean, std = task.features.mean(axis=0), task.features.std(axis=0)
    outliers = a.features[:per_kind]
    dist = np.abs(outliers - mean) / std
    assert (dist > OUTLIER_SIGMAS[0] - 1e-3).all()
    assert (dist < OUTLIER_SIGMAS[1] + 1e-3).all()
    # rare_label: the members' rarest label, features of a row of another label the run never sees
    rare = a.labels[per_kind:]
    assert (rare == rarest_member_label(task)).all()
    used = set(task.row_ids[np.concatenate([task.member_idx, task.nonmember_idx, task.context_idx])].tolist())
    sources = a.source_row_ids[per_kind:]
    assert not (set(sources.tolist()) & used)
    assert (a.source_row_ids[:per_kind] == -1).all()
    position = {int(r): i for i, r in enumerate(task.row_ids)}
    assert all(task.labels[position[int(s)]] != rare[0] for s in sources)
    jitter = a.features[per_kind:] - task.features[[position[int(s)] for s in sources]]
    assert 0 < np.abs(jitter / std).max() < 0.6  # jittered (0.1 sd), so no canary equals a table row
    # another seed: other canaries; the log names them without feature values
    other = make_canaries(_task().__class__(**{**_task().__dict__, "seed": 1}), settings)
    assert other.fingerprint != a.fingerprint
    log = a.log()
    assert log["fingerprint"] == a.fingerprint
    assert "features" not in log
    assert log["copies"] == a.copies.tolist()


def test_text_columns_of_a_cells_task_get_words_of_their_vocabulary(tmp_path):
    from iclmem.vocab import InputContract
    from trainables.data import contract_settings

    rng = np.random.default_rng(0)
    n = 120
    frame = pd.DataFrame({"colour": rng.choice(["red", "green", "blue"], n), "size": rng.normal(size=n),
                          "label": rng.choice(["a", "b"], n)})
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    settings = contract_settings(PrepSettings(context_size=20), InputContract.CELLS, 500)
    task = prepare_task(TaskSource("t", "table", str(path), "label", None), settings, "normal", 0, q=20)
    text = [j for j, k in enumerate(task.columns.kinds) if k is ColumnKind.TEXT]
    assert text, task.columns
    canaries = make_canaries(task, {"kinds": ["outlier", "rare_label"], "per_group": 2, "holdout": 8})
    for j in text:
        codes = canaries.features[:, j]
        assert np.array_equal(codes, np.round(codes))
        assert codes.min() >= 0
        assert codes.max() < len(task.columns.columns[j].vocabulary)


def test_settings_refuse_empty_duplicate_or_zero_copy_counts():
    for bad in ({"kinds": []}, {"kinds": ["outlier", "outlier"]}, {"kinds": ["outlier"], "copies": [0, 1]},
                {"kinds": ["outlier"], "holdout": 0}):
        with pytest.raises(ConfigError):
            CanarySettings.from_value(bad)


# ------------------------------------------------------------------------------------------- fine-tuning
def test_the_finetuner_trains_on_every_canary_copy_and_reports_member_metrics_of_the_real_members():
    from trainables.finetune import Finetuner, FinetuneSpec

    task = _task()
    spec = FinetuneSpec(epochs=1, checkpoint_epochs=(1,), canaries={"kinds": ["outlier"], "per_group": 2,
                                                                    "copies": [1, 3], "holdout": 4})
    finetuner = Finetuner(spec, [task])
    (batch,) = finetuner.batches(1)
    assert batch.query_x.shape[1] == 30 + 2 * (1 + 3)
    x, y = finetuner.canaries.training_rows()
    assert torch.equal(batch.query_x[0, 30:], torch.from_numpy(x))
    assert torch.equal(batch.query_y[0, 30:], torch.from_numpy(y))
    assert finetuner._eval_members[0].query_x.shape[1] == 30
    assert FinetuneSpec(**spec.to_dict()) == spec
    assert spec.to_dict()["canaries"]["copies"] == [1, 3]
    assert "canaries" not in FinetuneSpec(epochs=1).to_dict()  # a run without canaries records what it always did
    with pytest.raises(ConfigError, match="single_fixed"):
        FinetuneSpec(regime="multi_fixed", canaries={"kinds": ["outlier"]})


# ------------------------------------------------------------------------------------------- planted ground truth
def _probe_canaries(model, task, canaries, base, cache):
    from probes.manipulations import default_suite
    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries

    plan = ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed,
                           compress_rows=base.supports_context_weights)
    return probe_checkpoint(model, task, plan, cache, "base", base, ProbeSettings(n_resamples=20, null_splits=0),
                            {"run_id": "planted"}, 5, canaries=canaries).row


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_planted_canary_exposure_grows_with_copies_and_is_zero_on_the_untouched_model(tmp_path):
    """digits (10 labels), 8 outlier canaries per copy count, 32 held out, 5 epochs at lr 3e-4 (before every
    copy count is memorized). Measured (this test's numbers): probe exposure 1.78 / 2.42 / 3.73 / 4.22 bits
    for 1 / 2 / 4 / 8 copies, known-context 2.03 / 2.36 / 3.80 / 4.00; label rank 4.9 / 3.9 / 1.1 / 1.6;
    chance is 1.33 bits, the ceiling 5.04. The test asks for a 1.5-bit (probe) and 1-bit (known context) gap between 4-8 and
    1-2 copies, and ranks falling with copies."""
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    torch.set_num_threads(1)
    task = _task("digits")
    spec = FinetuneSpec(epochs=5, lr=3e-4, checkpoint_epochs=(5,),
                        canaries={"kinds": ["outlier"], "per_group": 8, "holdout": 32})
    finetuner = Finetuner(spec, [task])
    for _ in range(5):
        finetuner.run_epoch()
    base = build_model("pfn-mini")
    row = _probe_canaries(finetuner.model, task, finetuner.canaries, base, tmp_path)
    probe = [row[f"canary_exposure_c{k}"] for k in (1, 2, 4, 8)]
    known = [row[f"canary_known_context_exposure_c{k}"] for k in (1, 2, 4, 8)]
    ranks = [row[f"canary_label_rank_c{k}"] for k in (1, 2, 4, 8)]
    assert np.mean(probe[2:]) - np.mean(probe[:2]) >= 1.5, probe
    assert np.mean(known[2:]) - np.mean(known[:2]) >= 1.0, known
    assert ranks[3] < ranks[0], ranks
    assert np.mean(ranks[2:]) < np.mean(ranks[:2]), ranks
    assert row["canary_exposure_max"] == pytest.approx(math.log2(33))
    # sanity check (true by construction: ΔS ≡ 0): the untouched model singles out no canary
    untouched = _probe_canaries(base, task, finetuner.canaries, base, tmp_path)
    assert all(untouched[f"canary_exposure_c{k}"] == 0.0 for k in (1, 2, 4, 8))
    assert all(untouched[f"canary_known_context_exposure_c{k}"] == 0.0 for k in (1, 2, 4, 8))


def _planted_ranking_records(seed: int, shift_per_doubling: float = 2.5, n: int = 60, per_copy: int = 8):
    """One checkpoint's records: n member and n non-member rows scored N(0, 1); per copy count c, ``per_copy``
    inserted canaries scored N(shift * log2 c, 1) (one copy: no shift at all); 2 * per_copy held-out canaries
    scored N(0, 1)."""
    rng = np.random.default_rng(seed)
    frames = [pd.DataFrame({"member": np.r_[np.ones(n, bool), np.zeros(n, bool)], "score": rng.normal(size=2 * n),
                            "canary_copies": np.nan})]
    for c in (1, 2, 4, 8):
        frames.append(pd.DataFrame({"member": True, "canary_copies": float(c),
                                    "score": rng.normal(size=per_copy) + shift_per_doubling * math.log2(c)}))
    frames.append(pd.DataFrame({"member": False, "canary_copies": 0.0, "score": rng.normal(size=2 * per_copy)}))
    records = pd.concat(frames, ignore_index=True)
    records.insert(0, "attack", "probe")
    records.insert(0, "epoch", 3)
    records.insert(0, "task", "t")
    records.insert(0, "run_id", "r")
    records["row_id"] = np.arange(len(records))
    return records


def test_canary_ranking_ranks_each_copy_count_on_its_own_and_more_copies_rank_higher():
    """METHOD.md: the canaries of one copy count are ranked among the member rows and themselves. Pooled, one
    k over every count, the 8-copy canaries would carry the 1-copy ones (issue #56 finding 11)."""
    from orchestrator.report.canary_and_value_risk import canary_ranking

    records = _planted_ranking_records(0)
    elsewhere = records.assign(epoch=1, score=-records["score"])  # not the headline checkpoint: ignored
    table = canary_ranking(pd.concat([records, elsewhere], ignore_index=True), {"r": 3}).set_index("copies")
    assert list(table.index) == [1, 2, 4, 8]
    assert (table["inserted"] == 8).all()
    assert (table["held_out"] == 16).all()
    assert (table["member_rows"] == 60).all()
    assert table["chance"].eq(8 / 68).all()  # their share of the ranked rows: 60 members and themselves
    precision, auc = table["precision_at_k"], table["inserted_vs_held_out_auc"]
    assert precision.is_monotonic_increasing
    assert auc.is_monotonic_increasing
    # one copy, no shift: about chance (these bounds hold on 492 of 500 seeds of this draw; seed 0 is one)
    assert precision[1] <= 0.4
    assert abs(auc[1] - 0.5) < 0.3
    assert precision[8] == 1.0
    assert auc[8] == 1.0


# ------------------------------------------------------------------------------------------- the sweep file
def _sweep(**canaries):
    from orchestrator.schema.config import parse_sweep

    return parse_sweep({"name": "c", "tasks": [{"name": "iris"}], "canaries": canaries}, "test")


def test_canaries_off_leave_run_ids_and_hash_alone_and_on_change_them():
    from orchestrator.schema.config import parse_sweep
    from orchestrator.schema.trials import expand_grid

    plain = parse_sweep({"name": "c", "tasks": [{"name": "iris"}]}, "test")
    off = _sweep()
    on = _sweep(kinds=["outlier"])
    assert off.config_hash() == plain.config_hash()
    assert expand_grid(off) == expand_grid(plain)
    assert on.config_hash() != plain.config_hash()
    assert expand_grid(on)[0].run_id != expand_grid(plain)[0].run_id


def test_canaries_are_refused_with_other_regimes_and_bad_settings_name_the_setting():
    from orchestrator.schema.config import parse_sweep

    with pytest.raises(ConfigError, match="canaries"):
        parse_sweep({"name": "c", "tasks": [{"name": "iris"}, {"name": "wine"}],
                     "grid": {"regime": ["multi_fixed"]}, "canaries": {"kinds": ["outlier"]}}, "test")
    with pytest.raises(ConfigError, match="canaries.kinds"):
        _sweep(kinds=["outlier", "outlier"])
    with pytest.raises(ConfigError, match="canaries.copies"):
        _sweep(kinds=["outlier"], copies=[0])
    with pytest.raises(ConfigError, match="canaries.kinds"):
        _sweep(kinds=["loud"])


def test_the_estimate_counts_the_canaries_probe_contexts():
    from orchestrator.estimate.estimate_work import count_work

    plain, on = count_work(_sweep()), count_work(_sweep(kinds=["outlier", "rare_label"], per_group=2, holdout=8))
    runs, checkpoints, suite = 1, len(plain.schedule), plain.suite
    assert on.total("probe_contexts") - plain.total("probe_contexts") == runs * checkpoints * 2 * (2 * 4 + 8) * suite



def test_the_estimate_times_a_probe_with_its_canaries_without_counting_their_contexts_twice(monkeypatch):
    """measure_unit_costs runs the rest of a probe with the run's canaries (their known-context forwards on
    the checkpoint are in rest_s); their probe contexts, counted by count_work, are not also counted as
    the extra contexts of other plans (with null splits off there are none)."""
    import probes.probe as probe_mod
    from orchestrator.estimate.estimate_measure import measure_unit_costs
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({"name": "c", "tasks": [{"name": "iris"}], "data": {"context_size": 30},
                         "probe": {"bootstrap": 20, "suite": ["base", "skew_true_x2"], "null_splits": 0},
                         "canaries": {"kinds": ["outlier"], "per_group": 2, "copies": [1, 4], "holdout": 8}}, "test")
    seen = []
    original = probe_mod.canary_columns

    def recorded(model, task, plan, canaries, *args, **kwargs):
        seen.append(len(canaries.ids))
        return original(model, task, plan, canaries, *args, **kwargs)

    monkeypatch.setattr(probe_mod, "canary_columns", recorded)
    costs = measure_unit_costs(sweep, "pfn-mini", {}, 20, sweep.tasks[0], torch.device("cpu"), epochs=1)
    assert seen
    assert all(n == 2 * 2 + 8 for n in seen)
    assert costs.extra_contexts == 0
    assert costs.extra_reference_contexts == 0

# ------------------------------------------------------------------------------------------- a real sweep
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_sweep_with_canaries_logs_them_probes_their_exposure_and_reports_it(ray_session, tmp_path):
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.report import public_results
    from orchestrator.schema.config import parse_sweep

    sweep = parse_sweep({
        "name": "canaries", "tasks": [{"name": "iris"}], "grid": {"q": [20]},
        "data": {"context_size": 30}, "training": {"epochs": 4, "checkpoint_epochs": [2, 4]},
        "probe": {"bootstrap": 20, "suite": ["base", "skew_true_x2"], "null_splits": 0},
        "canaries": {"kinds": ["outlier", "rare_label"], "per_group": 2, "copies": [1, 8], "holdout": 8},
        "resources": {"cpus_per_probe_actor": 0.5}, "wandb": {"mode": "disabled"},
    }, "test")
    run_dir = tmp_path / "run"
    results = run_sweep(None, run_dir, sweep=sweep, progress=False, log=lambda _m: None)
    audited = results[~results["sanity_check"].astype(bool)].sort_values("epoch")
    assert audited["epoch"].tolist() == [2, 4]
    for k in (1, 8):
        assert audited[f"canary_exposure_c{k}"].between(0, math.log2(9)).all()
        assert audited[f"canary_outlier_exposure_c{k}"].notna().all()
    records = json.loads(audited["canary_records"].iloc[-1])
    assert sorted({(r["kind"], r["copies"]) for r in records}) == [("outlier", 1), ("outlier", 8),
                                                                   ("rare_label", 1), ("rare_label", 8)]
    # the checkpoint's ground-truth log names the canaries the run trained on, and the trainable's canaries
    # are the probe's (one fingerprint)
    truth_files = sorted((run_dir / "tune").rglob("ground_truth.json"))
    assert truth_files
    log = json.loads(truth_files[-1].read_text())["canaries"]
    assert log["copies"].count(8) == 4
    assert log["copies"].count(0) == 16
    assert all(i < 0 for i in log["ids"])
    from orchestrator.audits.audit import audit_checkpoint
    from orchestrator.runfolder.prepare import prepare_sweep

    (task,) = prepare_sweep(sweep, tmp_path / "prep", log=lambda _m: None).tasks.values()
    assert make_canaries(task, log["settings"]).fingerprint == log["fingerprint"]
    # `iclmem probe` on that checkpoint rebuilds the same canaries (it checks the fingerprint) and scores them
    verdict = audit_checkpoint(str(truth_files[-1].parent), out=str(tmp_path / "audit"), bootstrap=20,
                               log=lambda _line: None)
    assert len(json.loads(verdict["canary_records"])) == 8
    assert 0 <= verdict["canary_exposure_c8"] <= math.log2(9)
    public = public_results(pd.read_parquet(run_dir / RESULTS_FILE))
    assert {"canary_exposure_c8", "canary_rare_label_exposure_c1", "canary_label_rank_c8"} <= set(public.columns)
    assert "canary_records" not in public.columns
    page = (run_dir / "report.html").read_text()
    assert "Canaries: exposure by number of copies" in page
    assert "canary_exposure.png" in page
    assert (run_dir / "figures" / "canary_exposure.png").stat().st_size > 1000


# ------------------------------------------------------------------------------------------- the real adapters
@pytest.mark.parametrize("name", ["tabicl", "tabpfn-v2", "contexttab"])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_canaries_train_and_probe_through_every_real_adapter_on_its_own_inputs(name, tmp_path):
    """Tiny random instances: a canary is a row in the model's own input contract (ConTextTab: real
    columns), trained with its copies and scored by the probe; the untouched model exposes none."""
    from test_adapter_contract import CLASSIFIERS, _require

    from probes.probe import ProbeSettings, probe_checkpoint
    from probes.scoring import ProbePlan, ProbeQueries
    from trainables.finetune import Finetuner, FinetuneSpec
    from trainables.models import build_model

    _require(name)
    torch.manual_seed(0)
    options = CLASSIFIERS[name]
    base = build_model(name, **options)
    settings = base.prep_settings(PrepSettings(context_size=12))
    task = prepare_task(TaskSource("iris", "builtin", None, None, None), settings, "normal", 0, q=6)
    canaries = {"kinds": ["outlier", "rare_label"], "copies": [1, 4], "per_group": 2, "holdout": 4}
    finetuner = Finetuner(FinetuneSpec(model=name, model_options=options, epochs=2, checkpoint_epochs=(2,),
                                       canaries=canaries), [task], model=build_model(name, **options))
    assert finetuner.batches(1)[0].query_x.shape[1] == 6 + 2 * 2 * (1 + 4)
    for _ in range(2):
        finetuner.run_epoch()
    plan = ProbePlan.build(ProbeQueries.from_task(task), _small_suite(), task.seed,
                           compress_rows=base.supports_context_weights)
    row = probe_checkpoint(finetuner.model, task, plan, tmp_path, "base", base,
                           ProbeSettings(n_resamples=10, null_splits=0), {"run_id": name}, 2,
                           canaries=finetuner.canaries).row
    records = json.loads(row["canary_records"])
    assert len(records) == 2 * 2 * 2
    assert row["canary_exposure_max"] == pytest.approx(math.log2(5))
    for k in (1, 4):
        assert 0 <= row[f"canary_exposure_c{k}"] <= math.log2(5)
        assert 1 <= row[f"canary_label_rank_c{k}"] <= task.n_classes
    untouched = probe_checkpoint(base, task, plan, tmp_path, "base", base, ProbeSettings(n_resamples=10, null_splits=0),
                                 {"run_id": "base"}, 0, canaries=finetuner.canaries).row
    assert untouched["canary_exposure_c1"] == 0.0
    assert untouched["canary_exposure_c4"] == 0.0


def _small_suite():
    from probes.manipulations import suite_from_spec

    return suite_from_spec(["base", "skew_true_x2"])
