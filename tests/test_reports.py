"""Reports, figures and the HTML page on a fabricated run directory with planted, hand-checked numbers."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synthetic_run_dir import (
    CANARY,
    ENTROPY_PEAK_RUN,
    EXPECTED,
    MANIPULATIONS,
    PLAN,
    REGIME_PLAN,
    TIE_RUN,
    TRAINED,
    make_synthetic_run_dir,
    run_id,
)

from iclmem.errors import DataError
from iclmem.runfolder import RESULTS_FILE
from orchestrator import report as R
from orchestrator.report import figures as F
from orchestrator.runfolder.run_folder import RunFolder

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return make_synthetic_run_dir(tmp_path_factory.mktemp("run") / "sweep")


@pytest.fixture(scope="module")
def results(run_dir) -> pd.DataFrame:
    return RunFolder(run_dir).results()


@pytest.fixture(scope="module")
def report_path(run_dir) -> Path:
    return R.write_html_report(run_dir)


# A sweep with two label modes in which the model ignores one manipulation (position_last), one run stopped
# after epoch 2 and one run never stored anything: what the report's top and figures must not hide.
INCOMPLETE_RUN = run_id("single_fixed", "bin_task", 1e-2, 50)
NEVER_STORED_RUN = run_id("single_fixed", "reg_task", 1e-4, 512, "shuffled_members")
MODES = ("normal", "shuffled_members")


def _variant(root: Path, **kw) -> Path:
    return make_synthetic_run_dir(root, label_modes=MODES, noop=("position_last",),
                                  drop_epochs={INCOMPLETE_RUN: (5, 10)}, drop_runs=(NEVER_STORED_RUN,), **kw)


@pytest.fixture(scope="module")
def variant_dir(tmp_path_factory) -> Path:
    return _variant(tmp_path_factory.mktemp("variant") / "sweep")


@pytest.fixture(scope="module")
def variant_results(variant_dir) -> pd.DataFrame:
    return RunFolder(variant_dir).results()


@pytest.fixture(scope="module")
def variant_report(variant_dir) -> Path:
    return R.write_html_report(variant_dir)


# -- readers ---------------------------------------------------------------------------------------


def test_readers_keep_only_public_columns(run_dir, results):
    assert "raw_record" in pd.read_parquet(run_dir / RESULTS_FILE).columns
    assert "raw_record" not in results.columns
    assert {"auc_loss", "auc_entropy", "auc_confidence", "outcome", "raw_outcome"} <= set(results.columns)
    assert "raw_record" not in RunFolder(run_dir).split_report().columns
    assert "raw_record" not in RunFolder(run_dir).manipulation_auc().columns
    prov = RunFolder(run_dir).public_provenance()
    assert prov["config_hash"] == "cfg123"
    assert prov["git_commit"] == "abc123"
    assert prov["packages"]["numpy"] == np.__version__
    assert prov["packages"]["pandas"] == pd.__version__
    assert "config" not in prov
    assert CANARY not in json.dumps(prov)


def test_missing_results_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="results.parquet"):
        RunFolder(tmp_path).results()


def test_optional_readers_tolerate_missing_files(tmp_path):
    assert RunFolder(tmp_path).split_report() is None
    assert RunFolder(tmp_path).manipulation_auc() is None
    assert RunFolder(tmp_path).public_provenance() == {}
    assert RunFolder(tmp_path).roc_files().empty
    assert RunFolder(tmp_path).roc("x", 1) is None


# -- peak selection ----------------------------------------------------------------------------------


def test_peak_checkpoint_per_run(results):
    peaks = R.peak_checkpoints(results, regime="single_fixed").set_index("run_id")
    assert len(peaks) == 24
    for (task, lr, q), (outcome, epoch, auc, _onset) in PLAN.items():
        row = peaks.loc[run_id("single_fixed", task, lr, q)]
        assert row["epoch"] == epoch, (task, lr, q)
        assert row["outcome"] == outcome, (task, lr, q)
        assert row["peak_auc"] == pytest.approx(auc)


def test_peak_uses_every_score_kind_and_ties_go_to_the_earliest_epoch(results):
    peaks = R.peak_checkpoints(results).set_index("run_id")
    ent = peaks.loc[run_id("single_fixed", *ENTROPY_PEAK_RUN)]
    # the auc column (deciding kind: loss) peaks at epochs 1 and 5 (0.64); entropy reaches 0.66 at epoch 2
    assert ent["epoch"] == 2
    assert ent["peak_kind"] == "entropy"
    assert ent["peak_auc"] == pytest.approx(0.66)
    assert ent["auc"] == pytest.approx(0.58)
    assert ent["score_kind"] == "loss"
    assert peaks.loc[run_id("single_fixed", *TIE_RUN), "epoch"] == 2
    # inversion runs: base checkpoint (0.5) beats every trained one but is never the peak
    assert peaks.loc[run_id("single_fixed", "bin_task", 1e-4, 50), "epoch"] == 2


def test_multi_fixed_run_is_one_run_per_task(results):
    peaks = R.peak_checkpoints(results, regime="multi_fixed")
    assert len(peaks) == 4
    assert peaks["run_id"].nunique() == 2


# -- paper reports -----------------------------------------------------------------------------------


def test_outcome_rates_per_q(results):
    counts = R.outcome_counts_per_q(results)
    assert list(counts.columns) == ["n_runs", *R.OUTCOMES]
    assert counts.loc[50].drop("n_runs").to_dict() == EXPECTED["counts_q50"]
    assert counts.loc[512].drop("n_runs").to_dict() == EXPECTED["counts_q512"]
    assert counts.loc[50, "n_runs"] == 12
    assert counts.loc[512, "n_runs"] == 12
    rates = R.outcome_rates_per_q(results)
    assert rates.loc[50, "collapse"] == pytest.approx(4 / 12)
    assert rates.loc[512, "memorization"] == pytest.approx(2 / 12)
    assert rates.drop(columns="n_runs").sum(axis=1).tolist() == pytest.approx([1.0, 1.0])
    pooled = R.outcome_counts_per_q(results, regime=None)  # + 8 multi-task runs at Q=50
    assert pooled.loc[50, "n_runs"] == 20
    assert pooled.loc[50, "memorization"] == 4


def test_task_lr_q_table(results):
    t = R.task_lr_q_table(results)
    assert len(t) == 24
    assert {"task", "lr", "q", "outcome", "auc", "tpr_at_1pct", "tpr_at_10pct", "epoch"} <= set(t.columns)
    row = t[(t["task"] == "bin_task") & (t["lr"] == 1e-2) & (t["q"] == 50)].iloc[0]
    assert (row["outcome"], row["epoch"]) == ("memorization", 5)
    assert row["auc"] == pytest.approx(0.67)
    assert row["tpr_at_1pct"] == 0.05
    assert row["tpr_at_10pct"] == 0.25
    assert list(t["task"]) == sorted(t["task"])  # sorted by task, then q, then lr


def test_detectable_share_by_epoch(results):
    d = R.detectable_share_by_epoch(results)
    for q in (50, 512):
        dq = d[d["q"] == q].set_index("epoch")
        assert dq["n_detectable"].to_dict() == EXPECTED[f"detectable_q{q}"]
        assert (dq["n_runs"] == 12).all()
    assert d.set_index(["q", "epoch"]).loc[(50, 10), "share"] == pytest.approx(0.25)
    cum = R.detectable_share_by_epoch(results, cumulative=True).set_index(["q", "epoch"])
    assert cum.loc[(50, 10), "n_detectable"] == 3
    assert cum.loc[(512, 2), "n_detectable"] == 1


def test_peak_vulnerability_per_task(results):
    t = R.peak_vulnerability_per_task(results).set_index("task")
    assert list(t.index) == ["bin_task", "multi_task", "reg_task"]  # by peak AUC, descending
    for task, (auc, lr, q, epoch, n_mem) in EXPECTED["peak_vulnerability"].items():
        row = t.loc[task]
        assert row["peak_auc"] == pytest.approx(auc)
        assert (row["lr"], row["q"], row["epoch"], row["n_memorization"]) == (lr, q, epoch, n_mem)
        assert row["detectable_share"] == pytest.approx(n_mem / 8)


def test_split_validation(run_dir):
    t = R.split_validation(RunFolder(run_dir).split_report())
    assert len(t) == 6
    by = t.set_index(["task", "q"])
    assert by.loc[("reg_task", 50), "statistic"] == "ks"
    assert by.loc[("bin_task", 50), "statistic"] == "tvd"
    assert not by.loc[("multi_task", 512), "passed"]
    assert by["passed"].sum() == 5


def test_calibration_impact(results):
    t = R.calibration_impact(results)
    for q in (50, 512):
        assert t.loc[str(q), list(EXPECTED[f"calibration_q{q}"])].to_dict() == EXPECTED[f"calibration_q{q}"]
    assert t.loc["all", "calibrated_flags"] == 10
    assert t.loc["all", "raw_flags"] == 12
    runs = R.calibration_impact(results, level="run")
    assert runs.loc["50", "n"] == 8
    assert runs.loc["50", "calibrated_flags"] == 3
    assert runs.loc["50", "calibrated_only"] == 1
    assert runs.loc["50", "raw_only"] == 1


def test_perturbation_ranking(run_dir, results):
    manip = RunFolder(run_dir).manipulation_auc()
    t = R.perturbation_ranking(manip)
    assert list(t["manipulation"]) == EXPECTED["ranking"]
    assert list(t["rank"]) == [1, 2, 3, 4, 5, 6]
    assert t["mean_auc"].tolist() == pytest.approx([m for _, m in MANIPULATIONS.values()])
    assert (t["n"] == 24 * 4).all()
    with_base = R.perturbation_ranking(manip, include_base=True)
    # the base model's 0.99 for skew_incorrect counts: (0.99 + 4 * 0.50) / 5 = 0.598, now second
    assert list(with_base["manipulation"][:2]) == ["combo2_random_skew_true_x2", "skew_incorrect_k1_x2"]
    assert with_base.iloc[1]["mean_auc"] == pytest.approx(0.598)
    assert list(R.perturbation_ranking(manip, by="category")["category"]) == [c for c, _ in MANIPULATIONS.values()]
    at_peak = R.perturbation_ranking(manip, results=results, at_peak=True)
    assert (at_peak["n"] == 24).all()


def test_task_characteristics(run_dir, results):
    t = R.task_characteristics(results, RunFolder(run_dir).split_report()).set_index("task")
    assert list(t.index) == ["bin_task", "multi_task", "reg_task"]  # by memorization share
    assert t.loc["bin_task", "memorization_share"] == pytest.approx(0.5)
    assert t.loc["multi_task", "memorization_share"] == pytest.approx(1 / 8)
    assert t.loc["reg_task", "collapse_share"] == pytest.approx(2 / 8)
    assert (t.loc["multi_task", "n_classes"], t.loc["multi_task", "n_rows"]) == (5, 3000)
    assert t.loc["bin_task", "majority_share"] == 0.5
    assert t.loc["reg_task", "numeric_share"] == 0.8
    assert t.loc["bin_task", "max_peak_auc"] == pytest.approx(0.67)


def test_regime_comparison(results):
    t = R.regime_comparison(results)
    assert list(t["regime"]) == ["single_fixed", "single_fixed", "multi_fixed", "multi_random"]
    by = t.set_index(["regime", "q"])
    assert by.loc[("single_fixed", 50), "memorization_rate"] == pytest.approx(3 / 12)
    assert by.loc[("multi_fixed", 50), "n_runs"] == 4
    assert by.loc[("multi_fixed", 50), "memorization_rate"] == pytest.approx(0.25)
    assert by.loc[("multi_random", 50), "inversion_rate"] == pytest.approx(0.25)
    assert by.loc[("multi_random", 50), "memorization_rate"] == 0
    assert len(R.regime_comparison(results, by_task=True)) == 6 + 2 + 2


# -- figures ---------------------------------------------------------------------------------------------


def _assert_png(path: Path, min_bytes: int = 8_000) -> None:
    from matplotlib.image import imread

    assert path.is_file()
    assert path.parent.name == "figures"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", (path, len(data))
    assert len(data) > min_bytes, (path, len(data))
    img = imread(path)
    assert img.ndim == 3
    assert img.shape[0] > 200
    assert img.shape[1] > 200
    assert float(np.std(img[..., :3])) > 0.01  # not a blank canvas


def test_figures_are_valid_pngs(run_dir, results):
    paths = {
        "roc": F.plot_roc_curves(run_dir, results),
        "auc_task": F.plot_auc_over_epochs(run_dir, results),
        "auc_q": F.plot_auc_over_epochs(run_dir, results, panel="q", name="auc_over_epochs_by_q"),
        "heat": F.plot_outcome_heatmap(run_dir, results),
        "share": F.plot_detectable_share(run_dir, results),
        "perturb": F.plot_perturbation_ranking(run_dir, RunFolder(run_dir).manipulation_auc()),
    }
    for name, p in paths.items():
        assert p is not None, name
        _assert_png(p)
    assert F.plot_roc_curves(run_dir).name == "roc_curves.png"  # without results: files in name order


def test_roc_figure_is_skipped_without_roc_files(tmp_path, results):
    assert F.plot_roc_curves(tmp_path, results) is None


# -- HTML page -----------------------------------------------------------------------------------------


def _img_srcs(text: str) -> list[str]:
    return re.findall(r'<img[^>]*\bsrc="([^"]+)"', text)


def test_html_report_sections_and_images(run_dir, report_path):
    assert report_path == run_dir / "report.html"
    text = report_path.read_text()
    for sec in ("provenance", "outcome-rates", "task-table", "detectable-by-epoch", "peak-vulnerability",
                "split-validation", "calibration", "perturbations", "task-characteristics", "regimes", "roc"):
        assert f'id="{sec}"' in text, sec
    assert "cfg123" in text
    assert "abc123" in text
    assert "package numpy" in text
    srcs = _img_srcs(text)
    assert len(srcs) == 5
    for src in srcs:
        assert src.startswith("figures/")
        assert (run_dir / src).is_file()
        _assert_png(run_dir / src)
    assert not re.search(r'(src|href)="(https?:)?//', text)  # nothing fetched from the network
    assert "class=\"note\"" not in text  # every optional input was present


def test_html_report_never_contains_raw_records(run_dir, report_path):
    text = report_path.read_text()
    assert CANARY not in text
    assert "raw_record" not in text
    assert "sweep_config" not in text
    for png in (run_dir / "figures").glob("*.png"):
        assert CANARY.encode() not in png.read_bytes()


def test_html_report_without_optional_inputs(tmp_path):
    rd = make_synthetic_run_dir(tmp_path / "bare", with_optional=False)
    text = R.write_html_report(rd, embed_images=True).read_text()
    assert "split_report.parquet not found" in text
    assert "manipulation_auc.parquet not found" in text
    assert "Figure &#x27;roc_curves&#x27; not drawn: no files under roc/." in text
    assert "provenance.json not found" in text
    srcs = _img_srcs(text)
    assert srcs
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    assert CANARY not in text


# -- the report's top: verdict rule, counts, outcome line, completeness ------------------------------------


def _section(text: str, sid: str) -> str:
    """The HTML of ``<section id="sid">`` (sections do not nest)."""
    start = text.index(f'<section id="{sid}">')
    return text[start:text.index("</section>", start)]


def _visible(html_text: str) -> str:
    import html as _html

    return re.sub(r"\s+", " ", _html.unescape(re.sub(r"<[^>]+>", " ", html_text)))


def _planted_outcome_line() -> str:
    counts = Counter(o for o, *_ in PLAN.values()) + Counter(REGIME_PLAN.values())
    parts = [f"{counts[o]} {o}" for o in R.OUTCOMES if counts[o]]
    return f"{', '.join(parts)} of {sum(counts.values())} runs"


def test_report_top_states_rule_thresholds_counts_and_outcomes(report_path):
    text = report_path.read_text()
    assert text.index('<section id="summary">') < text.index('id="verdict-rule"') < text.index('id="provenance"')
    top = _visible(_section(text, "summary"))
    # every fine-tuned run at its peak; the planted outcomes are 7 collapse, 6 memorization, ... of 32
    assert _planted_outcome_line() == "7 collapse, 6 memorization, 4 inversion, 3 overfitting, 12 no_signal of 32 runs"
    assert f"Outcome: {_planted_outcome_line()}" in top
    assert "Rule in force: paper , strict mode off" in top
    assert "sweep.json" in top
    # 32 runs x 4 trained epochs; the 32 epoch-0 rows are the base model, counted apart
    assert "32 fine-tuned runs with 128 checkpoints (epochs 1, 2, 5, 10)" in top
    assert "The 32 base-model checkpoints" in top
    assert "left out of every count above" in top
    assert "Every one of the 32 fine-tuned runs has all 4 scheduled checkpoints" in top
    assert "Interrupted" not in top
    assert "incomplete" not in top
    assert "No-op" not in top
    rule = _visible(_section(text, "verdict-rule"))
    assert "Verdict rule: paper " in rule
    assert "collapse (loss ratio > 5 or output std < 0.01)" in rule
    assert "strict no" in rule
    assert "collapse_loss_ratio 5" in rule


def test_report_top_gives_the_task_peaks_false_positive_rate_as_not_covered(report_path, results):
    """#43: Tab. 8's peak is a maximum over a task's runs, outside the bound of one run's headline; the top
    says so beside the run headline's rate, and Tab. 8 says it too."""
    text = report_path.read_text()
    top = _visible(_section(text, "summary"))
    # the sweep's rule is the paper's (sweep.json): no guarantee at all, and the page says which would give one
    assert "run headline (no guarantee under the paper rule; selection_aware's 5% would cover it) 0 of 32" in top
    # one null split per checkpoint and three tasks: three null task peaks (single_fixed, as Tab. 8)
    assert "Not covered by the 5% guarantee: the task-level peak (Tab. 8): 0 of 3 null task peaks" in top
    claims = R.task_claim_error_rates(results).set_index(["rule", "claim"])
    assert tuple(claims.loc[("paper", R.TASK_PEAK.name), ["n_null", "n_memorization"]]) == (3, 0)
    assert "task_verdict" not in claims.index.get_level_values("claim")  # the rows record no p-value per kind
    table8 = _visible(_section(text, "peak-vulnerability"))
    assert "maxima over the task's runs: not covered by the 5% guarantee" in table8


def test_report_top_reads_the_thresholds_and_strict_mode_from_the_config(tmp_path):
    rd = make_synthetic_run_dir(tmp_path / "strict", outcome={"strict": True, "collapse_loss_ratio": 3.0})
    text = R.write_html_report(rd, make_figures=False).read_text()
    top = _visible(_section(text, "summary"))
    assert "strict mode on" in top
    rule = _visible(_section(text, "verdict-rule"))
    assert "Verdict rule: paper_strict" in rule
    assert "collapse (loss ratio > 3 or" in rule
    assert "AUC's 95% interval above 0.5 (strict)" in rule
    assert "collapse_loss_ratio 3 " in rule


def test_report_defines_its_numbers_with_the_real_sample_sizes(report_path):
    text = report_path.read_text()
    d = _visible(_section(text, "definitions"))
    for term in ("ΔS = S − S_ref", "loss = −log p(true label)", "entropy = H(p)", "confidence = p(true label)",
                 "Q is the number of member rows", "Loss ratio L_FT / L_base"):
        assert term in d, term
    assert "Q = 50: 50 members vs 50 non-members; Q = 512: 512 members vs 512 non-members" in d
    assert "50 non-members allow ⌊0.01·n⌋ = 0 false positives" in d  # 512 allow 5: not listed
    assert "512 non-members allow" not in d
    assert "50, 512 non-members" not in d


def test_run_table_shows_loss_ratio_sizes_and_flags_tpr_at_1pct_on_few_nonmembers(report_path):
    table = _section(report_path.read_text(), "task-table")
    head = re.search(r"<thead>(.*?)</thead>", table).group(1)
    for col in ("loss_ratio", "n_members", "n_nonmembers", "checkpoints", "status"):
        assert f"<th>{col}</th>" in head, col
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1])
    assert len(rows) == 24
    flagged = [r for r in rows if "0 FP allowed: 50 non-members" in r]
    assert len(flagged) == 12
    assert all("<td>50</td>" in r for r in flagged)
    collapse = next(r for r in rows if run_id("single_fixed", "bin_task", 1e-1, 50) in r)
    assert "<td>7.000</td>" in collapse
    assert "<td>4 of 4</td>" in collapse
    assert "<td>complete</td>" in collapse


def test_incomplete_and_never_stored_runs_are_marked_at_the_top_and_in_the_run_table(variant_report):
    text = variant_report.read_text()
    top = _visible(_section(text, "summary"))
    assert re.search(r"1 of \d+ runs are incomplete", top)
    assert f"{INCOMPLETE_RUN} (bin_task): 2 of 4 checkpoints, last epoch 2" in top
    assert "1 of the 48 single_fixed runs the grid schedules have no stored checkpoint" in top
    assert "Interrupted" not in top
    rows = re.findall(r"<tr>(.*?)</tr>", _section(text, "task-table"))
    mine = [r for r in rows if f"<td>{INCOMPLETE_RUN}</td>" in r]
    assert len(mine) == 1
    assert "<td>2 of 4</td>" in mine[0]
    assert "<td>incomplete</td>" in mine[0]
    assert sum("<td>incomplete</td>" in r for r in rows) == 1


def test_run_completeness_counts_stored_against_the_schedule(variant_results):
    comp = R.run_completeness(variant_results, TRAINED).set_index("run_id")
    assert comp.loc[INCOMPLETE_RUN, "status"] == "incomplete"
    assert comp.loc[INCOMPLETE_RUN, "n_stored"] == 2
    assert (comp.drop(index=INCOMPLETE_RUN)["status"] == "complete").all()
    # a run the driver recorded as diverged stopped by design: not a gap in the sweep
    comp = R.run_completeness(variant_results, TRAINED, diverged={INCOMPLETE_RUN}).set_index("run_id")
    assert comp.loc[INCOMPLETE_RUN, "status"] == "diverged"
    assert (comp.drop(index=INCOMPLETE_RUN)["status"] == "complete").all()
    assert (R.run_completeness(variant_results, None)["status"] == "unknown").all()


def test_an_interrupted_sweep_says_so_at_the_top_and_in_the_run_table(tmp_path):
    rd = _variant(tmp_path / "sweep", interrupted="run_state")
    assert RunFolder(rd).interrupted
    text = R.write_html_report(rd, make_figures=False).read_text()
    top = _visible(_section(text, "summary"))
    assert "Interrupted: the sweep was stopped" in top
    assert "iclmem resume RUN_DIR" in top
    assert re.search(r"1 of \d+ runs are interrupted", top)
    assert "1 of the 48 single_fixed runs the grid schedules have no stored checkpoint" in top
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", _section(text, "task-table")) if INCOMPLETE_RUN in r)
    assert "<td>interrupted</td>" in row


def test_without_a_sweep_config_completeness_is_not_claimed(tmp_path):
    rd = make_synthetic_run_dir(tmp_path / "bare", with_optional=False)
    assert not RunFolder(rd).interrupted
    top = _visible(_section(R.write_html_report(rd, make_figures=False).read_text(), "summary"))
    assert "Completeness not checked: no sweep.json" in top
    assert "Every one of" not in top
    assert "thresholds not recorded: no sweep.json and no threshold_* columns" in top  # the fixture records none
    # thresholds the rows record stand in for a missing config
    results = RunFolder(rd).results().assign(threshold_collapse_loss_ratio=4.0, threshold_strict=True)
    settings, source, disagree = R.thresholds_in_force(results, None)
    assert settings == {"collapse_loss_ratio": "4", "strict": "yes"}
    assert "threshold_* columns" in source
    assert not disagree
    from orchestrator.schema.config import parse_sweep

    other = parse_sweep({"name": "s", "tasks": [{"name": "iris"}], "outcome": {"collapse_loss_ratio": 5.0, "strict": True}},
                        "test")
    _, _, disagree = R.thresholds_in_force(results, other)
    assert disagree == ["collapse_loss_ratio"]  # classified under another config: the report says so


# -- manipulations that change nothing for the model ------------------------------------------------------


def test_noop_manipulations_are_named_in_the_summary_and_the_perturbation_section(variant_report, report_path):
    text = variant_report.read_text()
    assert "No-op manipulations for pfn-mini: 1 (position_last)" in _visible(_section(text, "summary"))
    pert = _visible(_section(text, "perturbations"))
    assert "1 manipulation(s) are no-ops for pfn-mini" in pert
    assert "position_last." in pert
    assert "no-op" not in report_path.read_text().lower()  # no manipulation of the main fixture is one


def test_noop_needs_identical_statistics_at_every_checkpoint(variant_dir, variant_results):
    manip = RunFolder(variant_dir).manipulation_auc()
    noops = R.noop_manipulations(manip, variant_results)
    assert list(noops["manipulation"]) == ["position_last"]
    assert set(noops["model"]) == {"pfn-mini"}

    def moved_at(task: str, lr: float) -> pd.DataFrame:
        out = manip.copy()
        at = (out["manipulation"] == "position_last") & (out["epoch"] == 5) \
            & (out["run_id"] == run_id("single_fixed", task, lr, 50))
        assert at.sum() == 1
        out.loc[at, "auc"] += 0.01
        return out

    # one checkpoint where it moves the AUC (a memorization run): it did something, so it is no no-op
    assert R.noop_manipulations(moved_at("bin_task", 1e-3), variant_results).empty
    # a collapsed checkpoint is no evidence either way (a constant model makes every context alike)
    assert list(R.noop_manipulations(moved_at("bin_task", 1e-1), variant_results)["manipulation"]) == ["position_last"]


# -- figures: grid axes are faceted or named, the chance line stays visible ---------------------------------


def _titles(fig) -> list[str]:
    return [ax.get_title() for ax in fig.axes if ax.get_visible()]


def test_figures_facet_label_modes_instead_of_pooling_them(variant_dir, variant_results, run_dir, results):
    auc = F.build_auc_over_epochs(variant_results)
    titles = _titles(auc)
    assert len(titles) == 3 * len(MODES)
    for mode in MODES:
        assert sum(f"label_mode = {mode}" in t for t in titles) == 3
    heat = F.build_outcome_heatmap(variant_results)
    assert sorted(_titles(heat)) == sorted(f"Q = {q}\nlabel_mode = {m}" for q in (50, 512) for m in MODES)
    share = F.build_detectable_share(variant_results)
    assert _titles(share) == [f"label_mode = {m}" for m in MODES]
    table = R.detectable_share_by_epoch(variant_results, by=("label_mode",))
    assert set(table["label_mode"]) == set(MODES)
    # the perturbation ranking pools memorized checkpoints across runs: its title says over what
    manip = RunFolder(variant_dir).manipulation_auc()
    title = F.build_perturbation_ranking(manip, variant_results).axes[0].get_title()
    assert re.search(r"\d+ memorized checkpoints pooled over label_mode normal \+ shuffled_members", title)
    assert "pooled" not in F.build_perturbation_ranking(RunFolder(run_dir).manipulation_auc(), results).axes[0].get_title()
    # a DP-SGD axis is a grid axis like any other: runs trained at another ε get their own panels
    dp = results.assign(dp_target_epsilon=np.where(results["lr"] >= 1e-2, 1.0, np.nan))
    assert sum("dp_target_epsilon = 1.0" in t for t in _titles(F.build_auc_over_epochs(dp))) == 3
    # one label mode: nothing to facet, one panel per task
    assert not any("label_mode" in t for t in _titles(F.build_auc_over_epochs(results)))
    assert len(_titles(F.build_auc_over_epochs(results))) == 3


def _curve_lines(ax):
    return [ln for ln in ax.get_lines() if ln.get_label() != F.CHANCE_LABEL and ln.get_xydata().shape[0] > 2]


def test_roc_legend_names_every_differing_axis_with_distinct_colours_and_chance_on_top(variant_dir, variant_results):
    from matplotlib.colors import to_hex

    fig = F.build_roc_figure(variant_dir, variant_results)
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    curves = _curve_lines(ax)
    assert len(curves) == 12
    assert len(set(legend)) == len(legend) == 13
    assert any("label_mode=normal" in t for t in legend)
    assert any("label_mode=shuffled_members" in t for t in legend)
    assert all(re.search(r"(bin|multi|reg)_task lr=\S+ Q=\d+ label_mode=\S+ e\d+ AUC=", t) for t in legend[:-1])
    assert len({to_hex(ln.get_color()) for ln in curves}) == 12
    chance = [ln for ln in ax.get_lines() if ln.get_label() == F.CHANCE_LABEL]
    assert len(chance) == 1
    assert F.CHANCE_LABEL in legend
    assert chance[0].get_zorder() > max(ln.get_zorder() for ln in curves)
    assert "model=pfn-mini" in ax.get_title()  # shared by every curve: said once, in the title


def test_roc_labels_name_an_axis_only_when_curves_differ_on_it():
    base = {"task": "t", "model": "m", "regime": "single_fixed", "lr": 1e-3, "q": 50, "label_mode": "normal",
            "epoch": 5, "auc": 0.6}
    labels = F.roc_legend_labels([{**base, "seed": 0, "run_id": "a"}, {**base, "seed": 1, "run_id": "b"}])
    assert labels == ["seed=0 e5 AUC=0.60", "seed=1 e5 AUC=0.60"]
    same = F.roc_legend_labels([{**base, "seed": 0, "run_id": "a"}, {**base, "seed": 0, "run_id": "b"}])
    assert len(set(same)) == 2  # alike on every axis: the run ids tell them apart


def test_auc_over_epochs_keeps_the_chance_line_above_the_curves(results):
    for ax in F.build_auc_over_epochs(results).axes:
        if not ax.get_visible():
            continue
        chance = [ln for ln in ax.get_lines() if ln.get_label() == F.CHANCE_LABEL]
        others = [ln for ln in ax.get_lines() if ln.get_label() != F.CHANCE_LABEL]
        assert len(chance) == 1
        assert chance[0].get_zorder() > max(ln.get_zorder() for ln in others)
        assert F.CHANCE_LABEL in [t.get_text() for t in ax.get_legend().get_texts()]


def _chromium(args: list[str], tmp: Path, timeout: int = 60) -> subprocess.CompletedProcess:
    base = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={tmp}"]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=timeout)


def _rendered(report: Path, profile: Path) -> str:
    """The DOM of ``report`` after Chromium loaded it, every image checked by the page's load handler."""
    dom = _chromium(["--virtual-time-budget=5000", "--dump-dom", report.resolve().as_uri()], profile)
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body, dom.stdout[:500]
    total = re.search(r'data-img-total="(\d+)"', body.group(1))
    loaded = re.search(r'data-img-loaded="(\d+)"', body.group(1))
    assert total, "the load handler did not run"
    assert loaded, "the load handler did not run"
    assert int(total.group(1)) == 5
    assert int(loaded.group(1)) == 5
    return dom.stdout


def _rendered_size(dom: str, figure: str) -> tuple[int, int]:
    img = re.search(rf'<img[^>]*src="figures/{figure}\.png"[^>]*>', dom)
    assert img, figure
    w, h = re.search(r'data-size="(\d+)x(\d+)"', img.group(0)).groups()
    return int(w), int(h)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium not installed (apt-get install chromium)")
def test_html_report_renders_in_headless_chromium(run_dir, report_path, variant_report, tmp_path):
    url = report_path.resolve().as_uri()
    dom = _rendered(report_path, tmp_path / "profile1")
    # the top section is the first thing on the page, with its outcome line and completeness
    first = re.findall(r'<section id="([a-z-]+)">', dom)[:2]
    assert first == ["leaked", "summary"]  # the runs that leaked, then the counts and the rule
    assert "6 of 32 runs leaked" in _visible(_section(dom, "leaked"))
    top = _visible(_section(dom, "summary"))
    assert f"Outcome: {_planted_outcome_line()}" in top
    assert "strict mode off" in top
    assert "The 32 base-model checkpoints" in top
    # the two-label-mode sweep: its figures load with a panel per label mode, and the page says so
    vdom = _rendered(variant_report, tmp_path / "profile3")
    assert "Interrupted" not in vdom
    assert re.search(r"1 of \d+ runs are incomplete", _visible(_section(vdom, "summary")))
    for name in ("auc_over_epochs", "outcome_heatmap", "detectable_share"):
        assert re.search(rf'<img[^>]*src="figures/{name}\.png"[^>]*alt="[^"]*\(one panel per label_mode\)"', vdom), name
        one, two = _rendered_size(dom, name), _rendered_size(vdom, name)
        assert two[0] * two[1] > 1.5 * one[0] * one[1], (name, one, two)  # twice the panels, drawn and decoded
    shot = tmp_path / "shot.png"
    res = _chromium([f"--screenshot={shot}", "--window-size=1200,2000", url], tmp_path / "profile2")
    assert res.returncode == 0, res.stderr[-2000:]
    assert shot.is_file(), res.stderr[-2000:]
    assert shot.stat().st_size > 20_000
    for profile in ("profile1", "profile2", "profile3"):
        shutil.rmtree(tmp_path / profile, ignore_errors=True)


def test_outcome_rates_and_peak_vulnerability_count_label_modes_apart_when_asked():
    from orchestrator.report import outcome_counts_per_q, outcome_rates_per_q, peak_vulnerability_per_task

    # two normal runs (no signal) and one planted shuffled run (memorized) at Q 20: pooled, a third of the
    # runs "memorize"; apart, none of the normal ones does
    df = pd.DataFrame({"run_id": ["a", "b", "c"], "task": ["t"] * 3, "regime": ["single_fixed"] * 3, "q": [20] * 3,
                       "label_mode": ["normal", "normal", "shuffled_members"], "epoch": [5] * 3,
                       "outcome": ["no_signal", "no_signal", "memorization"], "auc": [0.52, 0.55, 0.81],
                       "lr": [1e-3] * 3, "seed": [0] * 3, "model": ["pfn-mini"] * 3})
    pooled = outcome_rates_per_q(df)
    assert pooled.loc[20, "memorization"] == pytest.approx(1 / 3)
    assert pooled.loc[20, "n_runs"] == 3
    apart = outcome_rates_per_q(df, by=("label_mode",))
    assert apart.loc[("normal", 20), "memorization"] == 0
    assert apart.loc[("normal", 20), "n_runs"] == 2
    assert apart.loc[("shuffled_members", 20), "memorization"] == 1
    assert outcome_counts_per_q(df, by=("label_mode",)).loc[("normal", 20), "no_signal"] == 2
    vuln = peak_vulnerability_per_task(df, by=("label_mode",)).set_index("label_mode")
    assert vuln.loc["normal", "detectable_share"] == 0
    assert vuln.loc["shuffled_members", "detectable_share"] == 1
    assert peak_vulnerability_per_task(df)["detectable_share"].iloc[0] == pytest.approx(1 / 3)


def test_a_report_with_no_recorded_rule_names_the_schemas_default_rule_not_the_papers():
    """Defaults live in the schema (#30): rows and config that record no rule read as the rule a sweep
    would have used, selection_aware, not the paper's."""
    from orchestrator.schema.config import OutcomeConfig

    assert R.rule_in_force(pd.DataFrame({"outcome": ["no_signal"]}), {}) == OutcomeConfig().rule.value == "selection_aware"


# -- the live row shape: the session's real sweep (tests/shared_sweep.py) --------------------------------


@pytest.mark.slow
def test_the_report_of_a_real_sweep_reads_its_rows_rule_and_flags_through_the_run_folder(real_sweep):
    run_dir, results, _ = real_sweep
    folder = RunFolder(run_dir)
    public = folder.results()
    assert folder.sweep.name == "e2e"
    assert folder.sweep.outcome.rule == "selection_aware"
    assert set(public["rule"]) == {"selection_aware"}
    # App. 7.4 counts the rows' own flags over the non-collapsed fine-tuned checkpoints
    trained = public[public["fine_tuned"].astype(bool) & (public["outcome"] != "collapse")]
    impact = R.calibration_impact(public, regime=None).loc["all"]
    assert impact["n"] == len(trained)
    assert impact["calibrated_flags"] == int(trained["calibrated_memorization_flag"].sum())
    assert impact["raw_flags"] == int(trained["raw_memorization_flag"].sum())
    assert impact["calibrated_flags"] >= 1  # the planted shuffled members at lr 1e-3
    settings, source, disagree = R.thresholds_in_force(public, folder.sweep)
    assert source.startswith("the run's config")
    assert disagree == []
    assert R.rule_in_force(public, settings) == "selection_aware"
    page = (run_dir / "report.html").read_text()
    assert "selection_aware" in _visible(_section(page, "summary"))
    assert "blind" in _visible(_section(page, "summary")).lower()  # the blind baseline beside the verdicts


# -- the first screen: which runs leaked --------------------------------------------------------------
def _leaked_expected() -> list[tuple[str, str, int, float]]:
    """(run id, task, headline epoch, AUC of the deciding kind) of every run planted with memorization at its
    peak, highest AUC first (ties: run id)."""
    out = []
    for (task, lr, q), (outcome, peak, auc, _onset) in PLAN.items():
        if outcome == "memorization":
            deciding = 0.58 if (task, lr, q) == ENTROPY_PEAK_RUN else auc  # its peak is the entropy kind's
            out.append((run_id("single_fixed", task, lr, q), task, peak, deciding))
    for (regime, task, lr), outcome in REGIME_PLAN.items():
        if outcome == "memorization":
            out.append((run_id(regime, task, lr, 50), task, 2, 0.60))
    return sorted(out, key=lambda r: (-r[3], r[0]))


def test_the_first_section_names_the_leaked_runs_with_epoch_auc_interval_and_tpr(report_path):
    """Before the outcome counts and the rule: each run that leaked, its epoch, AUC with the interval, TPR@1%."""
    text = report_path.read_text()
    sections = re.findall(r'<section id="([a-z-]+)">', text)
    assert sections[:3] == ["leaked", "summary", "verdict-rule"]
    leaked = _section(text, "leaked")
    assert text.index("Runs that leaked") < text.index("Outcome:") < text.index("Rule in force")
    rows = re.findall(r"<tr><td>([^<]+)</td><td>([^<]+)</td><td>(\d+)</td><td>([^<]+)</td><td>([^<]+)</td>", leaked)
    expected = _leaked_expected()
    assert [r[0] for r in rows] == [e[0] for e in expected]  # exactly the memorization runs, highest AUC first
    for (rid, task, epoch, auc_text, tpr), (_, want_task, want_epoch, auc) in zip(rows, expected, strict=True):
        assert (task, int(epoch)) == (want_task, want_epoch), rid
        assert auc_text == f"{auc:.3f} [{auc - 0.05:.3f}, {auc + 0.05:.3f}]", rid  # AUC with its 95% interval
        assert tpr.startswith("0.050"), rid
    assert f"{len(expected)} of 32 runs leaked" in _visible(leaked)


def test_the_terminal_lines_name_the_same_leaked_runs(results):
    from orchestrator.report.leaked import leaked_lines

    lines = leaked_lines(results)
    assert lines[0] == "6 of 32 runs leaked (memorization at the headline checkpoint):"
    rid, task, epoch, auc = _leaked_expected()[0]
    assert lines[1] == (f"  {rid} [{task}, pfn-mini]: epoch {epoch}, AUC {auc:.3f} [{auc - 0.05:.3f}, {auc + 0.05:.3f}], "
                        "TPR@1% 0.050 (0 FP allowed)")
    assert leaked_lines(results.assign(outcome="no_signal"))[0].startswith("No run leaked: none of the 32")


def test_runs_flagged_by_the_known_context_alone_are_named_after_the_leaked_ones(results):
    """A run whose zero-information verdict is not memorization but whose known-context channel flagged a
    checkpoint is named apart, at its flagged checkpoint of highest known-context AUC; a run the verdict already
    calls leaked is not named twice, and results without the column name none."""
    from orchestrator.report.leaked import known_context_only_runs, leaked_html, leaked_lines

    leaked_ids = {e[0] for e in _leaked_expected()}
    ft = results[results["epoch"] > 0]
    quiet = sorted(set(ft["run_id"]) - leaked_ids)[0]
    loud = sorted(leaked_ids)[0]
    flagged = results.assign(known_context_memorization_flag=False, known_context_calibrated_auc=0.6,
                             known_context_calibrated_auc_low=0.55, known_context_calibrated_auc_high=0.65,
                             known_context_calibrated_tpr_at_10pct=0.3)
    epochs = sorted(ft.loc[ft["run_id"] == quiet, "epoch"])
    for epoch, auc in zip(epochs[:2], (0.71, 0.83)):
        at = (flagged["run_id"] == quiet) & (flagged["epoch"] == epoch)
        flagged.loc[at, ["known_context_memorization_flag", "known_context_calibrated_auc"]] = [True, auc]
    flagged.loc[flagged["run_id"] == loud, "known_context_memorization_flag"] = True
    table = known_context_only_runs(flagged)
    assert table["run_id"].tolist() == [quiet]
    assert (int(table["epoch"][0]), table["known_context_calibrated_auc"][0]) == (int(epochs[1]), 0.83)
    lines = leaked_lines(flagged)
    assert lines[lines.index(next(l for l in lines if "known context C' only" in l)) + 1].startswith(f"  {quiet} ")
    assert f"{quiet}" in leaked_html(flagged)
    assert "known context C′ only" in leaked_html(flagged)
    quiet_verdicts = leaked_lines(flagged.assign(outcome="no_signal"))  # no verdict of memorization at all
    assert quiet_verdicts[0].startswith("No run leaked")
    assert "known context C' only" in quiet_verdicts[1]
    assert known_context_only_runs(results).empty
    assert not any("known context" in line for line in leaked_lines(results))


def test_no_leak_says_so_first(tmp_path, results):
    from orchestrator.report.leaked import leaked_html

    assert "No run leaked" in leaked_html(results.assign(outcome="no_signal"))


def test_the_run_table_puts_auc_and_tpr_right_after_the_run_id(report_path):
    table = _section(report_path.read_text(), "task-table")
    header = re.findall(r"<th>([^<]+)</th>", table)
    assert header[:6] == ["run_id", "auc", "auc_low", "auc_high", "tpr_at_1pct", "tpr_at_10pct"]


def test_the_context_audit_says_how_the_strongest_attack_is_chosen_and_shows_the_auc_pick_too(tmp_path):
    """The strongest attack is the highest TPR at 1% FPR (ties: AUC), not the highest AUC: the section says the
    criterion and shows the attack the AUC would pick beside it."""
    from iclmem.runfolder import CONTEXT_AUDITS_DIR, CONTEXT_AUDITS_FILE, VERDICT_FILE
    from orchestrator.report.context_audits import context_audits_section_html

    rows = pd.DataFrame([
        {"run_id": "a", "task": "t", "model": "m", "q": 8, "seed": 0, "heldout_accuracy": 0.7, "target": target,
         "attack": attack, "auc": auc, "tpr_at_1pct": tpr, "tpr_at_0_1pct": tpr / 2}
        for target, attack, auc, tpr in (("deployed", "loss", 0.9, 0.05), ("deployed", "rmia", 0.7, 0.30),
                                          ("never_in_context", "loss", 0.5, 0.02))])
    rows.to_parquet(tmp_path / CONTEXT_AUDITS_FILE)
    (tmp_path / CONTEXT_AUDITS_DIR / "a").mkdir(parents=True)
    (tmp_path / CONTEXT_AUDITS_DIR / "a" / VERDICT_FILE).write_text(json.dumps(
        {"outcome": "memorization", "trusted": True, "strongest_attack": "rmia"}))
    section = context_audits_section_html(tmp_path)
    text = _visible(section)
    assert "highest TPR at 1% FPR" in text
    assert "not the one with the highest AUC" in text
    header = re.findall(r"<th>([^<]+)</th>", section)
    cells = re.findall(r"<td>([^<]*)</td>", section)
    line = dict(zip(header, cells))
    assert (line["strongest_attack"], line["auc"], line["tpr_at_1pct"]) == ("rmia", "0.700", "0.300")
    assert (line["highest_auc_attack"], line["highest_auc"], line["highest_auc_tpr_at_1pct"]) == ("loss", "0.900",
                                                                                                  "0.050")


def test_a_run_flagged_only_through_the_package_deployed_classifier_is_named_with_that_channels_auc(results):
    """recipe upstream: the known-context channel scored as the package deploys the weights has its own flag; a
    run only it flagged is named with that channel's AUC and says so, while a run the network's channel flagged
    keeps the network's AUC."""
    from orchestrator.report.leaked import known_context_only_runs, leaked_html, leaked_lines

    leaked_ids = {e[0] for e in _leaked_expected()}
    ft = results[results["epoch"] > 0]
    quiet = sorted(set(ft["run_id"]) - leaked_ids)
    deployed_only, network = quiet[0], quiet[1]
    flagged = results.assign(known_context_memorization_flag=False, known_context_calibrated_auc=0.52,
                             known_context_calibrated_auc_low=0.4, known_context_calibrated_auc_high=0.64,
                             known_context_calibrated_tpr_at_10pct=0.1,
                             deployed_known_context_memorization_flag=False, deployed_known_context_calibrated_auc=0.5,
                             deployed_known_context_calibrated_auc_low=0.4,
                             deployed_known_context_calibrated_auc_high=0.6,
                             deployed_known_context_calibrated_tpr_at_10pct=0.1)
    last = flagged["epoch"] == flagged.loc[flagged["run_id"] == deployed_only, "epoch"].max()
    at = (flagged["run_id"] == deployed_only) & last
    flagged.loc[at, ["deployed_known_context_memorization_flag", "deployed_known_context_calibrated_auc",
                     "deployed_known_context_calibrated_auc_low"]] = [True, 0.77, 0.66]
    flagged.loc[flagged["run_id"] == network, ["known_context_memorization_flag",
                                               "known_context_calibrated_auc"]] = [True, 0.7]
    table = known_context_only_runs(flagged).set_index("run_id")
    assert set(table.index) == {deployed_only, network}
    assert (table.loc[deployed_only, "channel"], table.loc[deployed_only, "known_context_calibrated_auc"],
            table.loc[deployed_only, "known_context_calibrated_auc_low"]) == ("deployed", 0.77, 0.66)
    assert (table.loc[network, "channel"], table.loc[network, "known_context_calibrated_auc"]) == ("network", 0.7)
    line = next(line for line in leaked_lines(flagged) if line.startswith(f"  {deployed_only} "))
    assert "as the package deploys the weights" in line
    assert "0.770" in line or "0.77" in line
    assert "deployed" in leaked_html(flagged)
    no_deployed = flagged.drop(columns=[c for c in flagged.columns if c.startswith("deployed_")])
    assert set(known_context_only_runs(no_deployed)["run_id"]) == {network}


_DRIVE_TABLE_JS = """<script>
window.addEventListener('load', function () {
  var box = document.querySelectorAll('input.filter')[INDEX];
  var table = box.nextElementSibling.querySelector('table.data');
  box.value = 'WORD'; box.dispatchEvent(new Event('input'));
  table.tHead.rows[0].cells[COLUMN].click(); table.tHead.rows[0].cells[COLUMN].click();  /* twice: descending */
  table.setAttribute('id', 'driven');
  document.body.setAttribute('data-driven', '1');
});
</script></body>"""


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium not installed (apt-get install chromium)")
def test_a_long_report_table_filters_on_every_word_typed_and_sorts_numbers_as_numbers(report_path, tmp_path):
    """With hundreds of runs a reader finds one by typing: the first table of more than FILTER_ROWS rows gets a filter
    box; typed words keep exactly the rows that contain them, and a header click sorts by that column (numbers by
    value: 10 after 9, not after 1)."""
    from orchestrator.report.page import FILTER_ROWS

    page = report_path.read_text()
    tables = re.findall(r'<table class="data">(.*?)</table>', page, flags=re.S)
    longs = [t for t in tables if t.count("<tr") - 1 > FILTER_ROWS]
    index = next(i for i, t in enumerate(longs) if "<th>run_id</th>" in t)  # the runs table
    long = longs[index]
    head = re.findall(r"<th>(.*?)</th>", long)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", long.split("</thead>")[1])]
    # a column of numbers whose order as text is not their order as numbers (10 sorts before 9 as text)
    numeric = next(i for i in range(len(head)) if all(re.fullmatch(r"-?[\d.]+", c[i]) for c in cells)
                   and sorted({c[i] for c in cells}, key=float) != sorted({c[i] for c in cells}))
    word = "reg_task" if "reg_task" in long else cells[0][0].split()[0]
    driven = tmp_path / "driven.html"
    driven.write_text(page.replace("</body>", _DRIVE_TABLE_JS.replace("WORD", word).replace("COLUMN", str(numeric))
                                   .replace("INDEX", str(index))))
    shutil.copytree(report_path.parent / "figures", tmp_path / "figures", dirs_exist_ok=True)
    dom = _chromium(["--virtual-time-budget=5000", "--dump-dom", driven.resolve().as_uri()], tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-driven="1"' in dom.stdout, "the page's table script did not run"
    table = re.search(r'<table class="data" id="driven">(.*?)</table>', dom.stdout, flags=re.S).group(1)
    rows = re.findall(r"<tr( style=\"[^\"]*\")?>(.*?)</tr>", table.split("</thead>")[1], flags=re.S)
    assert len(rows) == len(cells)  # sorting moves rows, never loses one
    shown = [r for style, r in rows if "none" not in style]
    hidden = [r for style, r in rows if "none" in style]
    assert shown
    assert all(word in _visible(r) for r in shown)
    assert all(word not in _visible(r) for r in hidden)
    assert len(shown) == sum(word in " ".join(c) for c in cells)
    values = [float(re.findall(r"<td[^>]*>(.*?)</td>", r)[numeric]) for _style, r in rows]
    assert values == sorted(values, reverse=True)
