"""Reports, figures and the HTML page on a fabricated run directory with planted, hand-checked numbers."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
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
    TIE_RUN,
    make_synthetic_run_dir,
    run_id,
)

from iclmem.errors import DataError
from orchestrator import figures as F
from orchestrator import reports as R

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return make_synthetic_run_dir(tmp_path_factory.mktemp("run") / "sweep")


@pytest.fixture(scope="module")
def results(run_dir) -> pd.DataFrame:
    return R.load_results(run_dir)


@pytest.fixture(scope="module")
def report_path(run_dir) -> Path:
    return R.write_html_report(run_dir)


# -- readers ---------------------------------------------------------------------------------------


def test_readers_keep_only_public_columns(run_dir, results):
    assert "raw_record" in pd.read_parquet(run_dir / "results.parquet").columns
    assert "raw_record" not in results.columns
    assert {"auc_loss", "auc_entropy", "auc_confidence", "outcome", "raw_outcome"} <= set(results.columns)
    assert "raw_record" not in R.load_split_report(run_dir).columns
    assert "raw_record" not in R.load_manipulation_auc(run_dir).columns
    prov = R.load_provenance(run_dir)
    assert prov["config_hash"] == "cfg123" and prov["git_commit"] == "abc123"
    assert prov["packages"]["numpy"] == np.__version__ and prov["packages"]["pandas"] == pd.__version__
    assert "config" not in prov and CANARY not in json.dumps(prov)


def test_missing_results_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="results.parquet"):
        R.load_results(tmp_path)


def test_optional_readers_tolerate_missing_files(tmp_path):
    assert R.load_split_report(tmp_path) is None
    assert R.load_manipulation_auc(tmp_path) is None
    assert R.load_provenance(tmp_path) == {}
    assert R.list_roc_files(tmp_path).empty
    assert R.load_roc(tmp_path, "x", 1) is None


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
    assert ent["epoch"] == 2 and ent["peak_kind"] == "entropy"
    assert ent["peak_auc"] == pytest.approx(0.66) and ent["auc"] == pytest.approx(0.58)
    assert ent["score_kind"] == "loss"
    assert peaks.loc[run_id("single_fixed", *TIE_RUN), "epoch"] == 2
    # inversion runs: base checkpoint (0.5) beats every trained one but is never the peak
    assert peaks.loc[run_id("single_fixed", "bin_task", 1e-4, 50), "epoch"] == 2


def test_multi_fixed_run_is_one_run_per_task(results):
    peaks = R.peak_checkpoints(results, regime="multi_fixed")
    assert len(peaks) == 4 and peaks["run_id"].nunique() == 2


# -- paper reports -----------------------------------------------------------------------------------


def test_outcome_rates_per_q(results):
    counts = R.outcome_counts_per_q(results)
    assert list(counts.columns) == ["n_runs", *R.OUTCOMES]
    assert counts.loc[50].drop("n_runs").to_dict() == EXPECTED["counts_q50"]
    assert counts.loc[512].drop("n_runs").to_dict() == EXPECTED["counts_q512"]
    assert counts.loc[50, "n_runs"] == 12 and counts.loc[512, "n_runs"] == 12
    rates = R.outcome_rates_per_q(results)
    assert rates.loc[50, "collapse"] == pytest.approx(4 / 12)
    assert rates.loc[512, "memorization"] == pytest.approx(2 / 12)
    assert rates.drop(columns="n_runs").sum(axis=1).tolist() == pytest.approx([1.0, 1.0])
    pooled = R.outcome_counts_per_q(results, regime=None)  # + 8 multi-task runs at Q=50
    assert pooled.loc[50, "n_runs"] == 20 and pooled.loc[50, "memorization"] == 4


def test_task_lr_q_table(results):
    t = R.task_lr_q_table(results)
    assert len(t) == 24
    assert {"task", "lr", "q", "outcome", "auc", "tpr_at_1pct", "tpr_at_10pct", "epoch"} <= set(t.columns)
    row = t[(t["task"] == "bin_task") & (t["lr"] == 1e-2) & (t["q"] == 50)].iloc[0]
    assert (row["outcome"], row["epoch"]) == ("memorization", 5)
    assert row["auc"] == pytest.approx(0.67) and row["tpr_at_1pct"] == 0.05 and row["tpr_at_10pct"] == 0.25
    assert list(t["task"]) == sorted(t["task"])  # sorted by task, then q, then lr


def test_detectable_share_by_epoch(results):
    d = R.detectable_share_by_epoch(results)
    for q in (50, 512):
        dq = d[d["q"] == q].set_index("epoch")
        assert dq["n_detectable"].to_dict() == EXPECTED[f"detectable_q{q}"]
        assert (dq["n_runs"] == 12).all()
    assert d.set_index(["q", "epoch"]).loc[(50, 10), "share"] == pytest.approx(0.25)
    cum = R.detectable_share_by_epoch(results, cumulative=True).set_index(["q", "epoch"])
    assert cum.loc[(50, 10), "n_detectable"] == 3 and cum.loc[(512, 2), "n_detectable"] == 1


def test_peak_vulnerability_per_task(results):
    t = R.peak_vulnerability_per_task(results).set_index("task")
    assert list(t.index) == ["bin_task", "multi_task", "reg_task"]  # by peak AUC, descending
    for task, (auc, lr, q, epoch, n_mem) in EXPECTED["peak_vulnerability"].items():
        row = t.loc[task]
        assert row["peak_auc"] == pytest.approx(auc)
        assert (row["lr"], row["q"], row["epoch"], row["n_memorization"]) == (lr, q, epoch, n_mem)
        assert row["detectable_share"] == pytest.approx(n_mem / 8)


def test_split_validation(run_dir):
    t = R.split_validation(R.load_split_report(run_dir))
    assert len(t) == 6
    by = t.set_index(["task", "q"])
    assert by.loc[("reg_task", 50), "statistic"] == "ks" and by.loc[("bin_task", 50), "statistic"] == "tvd"
    assert not by.loc[("multi_task", 512), "passed"]
    assert by["passed"].sum() == 5


def test_calibration_impact(results):
    t = R.calibration_impact(results)
    for q in (50, 512):
        assert t.loc[str(q), list(EXPECTED[f"calibration_q{q}"])].to_dict() == EXPECTED[f"calibration_q{q}"]
    assert t.loc["all", "calibrated_flags"] == 10 and t.loc["all", "raw_flags"] == 12
    runs = R.calibration_impact(results, level="run")
    assert runs.loc["50", "n"] == 8 and runs.loc["50", "calibrated_flags"] == 3  # 12 runs, 4 collapsed
    assert runs.loc["50", "calibrated_only"] == 1 and runs.loc["50", "raw_only"] == 1


def test_perturbation_ranking(run_dir, results):
    manip = R.load_manipulation_auc(run_dir)
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
    t = R.task_characteristics(results, R.load_split_report(run_dir)).set_index("task")
    assert list(t.index) == ["bin_task", "multi_task", "reg_task"]  # by memorization share
    assert t.loc["bin_task", "memorization_share"] == pytest.approx(0.5)
    assert t.loc["multi_task", "memorization_share"] == pytest.approx(1 / 8)
    assert t.loc["reg_task", "collapse_share"] == pytest.approx(2 / 8)
    assert (t.loc["multi_task", "n_classes"], t.loc["multi_task", "n_rows"]) == (5, 3000)
    assert t.loc["bin_task", "majority_share"] == 0.5 and t.loc["reg_task", "numeric_share"] == 0.8
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

    assert path.is_file() and path.parent.name == "figures"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > min_bytes, (path, len(data))
    img = imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 200
    assert float(np.std(img[..., :3])) > 0.01  # not a blank canvas


def test_figures_are_valid_pngs(run_dir, results):
    paths = {
        "roc": F.plot_roc_curves(run_dir, results),
        "auc_task": F.plot_auc_over_epochs(run_dir, results),
        "auc_q": F.plot_auc_over_epochs(run_dir, results, panel="q", name="auc_over_epochs_by_q"),
        "heat": F.plot_outcome_heatmap(run_dir, results),
        "share": F.plot_detectable_share(run_dir, results),
        "perturb": F.plot_perturbation_ranking(run_dir, R.load_manipulation_auc(run_dir)),
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
    assert "cfg123" in text and "abc123" in text and "package numpy" in text
    srcs = _img_srcs(text)
    assert len(srcs) == 5
    for src in srcs:
        assert src.startswith("figures/") and (run_dir / src).is_file()
        _assert_png(run_dir / src)
    assert not re.search(r'(src|href)="(https?:)?//', text)  # nothing fetched from the network
    assert "class=\"note\"" not in text  # every optional input was present


def test_html_report_never_contains_raw_records(run_dir, report_path):
    text = report_path.read_text()
    assert CANARY not in text and "raw_record" not in text and "sweep_config" not in text
    for png in (run_dir / "figures").glob("*.png"):
        assert CANARY.encode() not in png.read_bytes()


def test_html_report_without_optional_inputs(tmp_path):
    rd = make_synthetic_run_dir(tmp_path / "bare", with_optional=False)
    text = R.write_html_report(rd, embed_images=True).read_text()
    assert "split_report.parquet not found" in text and "manipulation_auc.parquet not found" in text
    assert "Figure &#x27;roc_curves&#x27; not drawn: no files under roc/." in text
    assert "provenance.json not found" in text
    srcs = _img_srcs(text)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert CANARY not in text


def _chromium(args: list[str], tmp: Path, timeout: int = 60) -> subprocess.CompletedProcess:
    base = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={tmp}"]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium not installed (apt-get install chromium)")
def test_html_report_renders_in_headless_chromium(run_dir, report_path, tmp_path):
    url = report_path.resolve().as_uri()
    dom = _chromium(["--virtual-time-budget=5000", "--dump-dom", url], tmp_path / "profile1")
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body, dom.stdout[:500]
    total = re.search(r'data-img-total="(\d+)"', body.group(1))
    loaded = re.search(r'data-img-loaded="(\d+)"', body.group(1))
    assert total and loaded, "the load handler did not run"
    assert int(total.group(1)) == 5 and int(loaded.group(1)) == 5
    shot = tmp_path / "shot.png"
    res = _chromium([f"--screenshot={shot}", "--window-size=1200,2000", url], tmp_path / "profile2")
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    assert shot.stat().st_size > 20_000
    shutil.rmtree(tmp_path / "profile1", ignore_errors=True)
    shutil.rmtree(tmp_path / "profile2", ignore_errors=True)
