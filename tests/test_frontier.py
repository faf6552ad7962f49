"""The report's leakage-utility frontier (orchestrator/report/frontier.py): which settings no other beats on
held-out accuracy and leakage together, from rows in the live results shape."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from orchestrator.report.frontier import frontier_section_html, frontier_table, leakage_columns


def _row(run_id: str, epoch: int, accuracy: float, tpr: float, *, lira: float = math.nan, label_mode: str = "normal",
         sanity: bool = False, model: str = "pfn-mini", lr: float = 1e-3, outcome: str = "no_signal") -> dict:
    return {"run_id": run_id, "task": "digits", "model": model, "regime": "single_fixed", "lr": lr, "q": 50,
            "label_mode": label_mode, "seed": 0, "epoch": epoch, "sanity_check": sanity, "outcome": outcome,
            "nonmember_icl_accuracy": accuracy, "tpr_at_1pct": tpr, "lira_online_tpr_at_1pct": lira}


def test_the_frontier_keeps_exactly_the_settings_no_other_beats_on_both_axes():
    rows = [
        _row("a", 1, 0.90, 0.50),                # on the frontier: the most accurate
        _row("a", 2, 0.90, 0.60),                # beaten by a@1 (same accuracy, less leakage)
        _row("b", 1, 0.80, 0.05, lira=0.10),     # on the frontier; LiRA is its strongest attack (0.10)
        _row("b", 2, 0.70, 0.20),                # beaten by b@1
        _row("c", 1, 0.95, 0.99, label_mode="shuffled_members"),  # not a true-label run: left out
        _row("base", 0, 0.99, 0.0, sanity=True),                  # the sanity check: left out
        _row("d", 1, 0.60, 0.02, model="other"),  # another model: its own frontier
    ]
    table = frontier_table(pd.DataFrame(rows))
    assert set(table["run_id"]) == {"a", "b", "d"}
    front = {(r.run_id, r.epoch) for r in table.itertuples() if r.on_frontier}
    assert front == {("a", 1), ("b", 1), ("d", 1)}
    b1 = table[(table["run_id"] == "b") & (table["epoch"] == 1)].iloc[0]
    assert b1["leakage_tpr_at_1pct"] == pytest.approx(0.10)
    assert b1["strongest_attack"] == "lira_online"
    assert table.loc[table["run_id"] == "a", "strongest_attack"].eq("iclmem").all()
    assert table["dp_target_epsilon"].map(math.isinf).all()  # no DP column: every setting is "no DP"
    assert leakage_columns(pd.DataFrame(rows)) == {"tpr_at_1pct": "iclmem", "lira_online_tpr_at_1pct": "lira_online"}


def test_no_utility_column_or_no_usable_row_gives_no_section(tmp_path):
    rows = pd.DataFrame([_row("a", 1, 0.9, 0.5)])
    assert frontier_table(rows.drop(columns=["nonmember_icl_accuracy"])).empty
    assert frontier_table(rows.assign(label_mode="shuffled_all")).empty
    assert frontier_section_html(rows.assign(label_mode="shuffled_all"), tmp_path) == ""
    assert not list(tmp_path.iterdir())


def test_collapsed_checkpoints_are_no_setting_to_pick(tmp_path):
    """A collapse leaks little because the model broke: it must not sit on the frontier (or in the table)."""
    rows = [
        _row("a", 1, 0.90, 0.50),
        _row("b", 1, 0.80, 0.20),
        _row("c", 1, 0.85, 0.0, outcome="collapse"),   # would beat b on both axes if it counted
        _row("c", 2, 0.10, 0.0, outcome="collapse"),   # and be the zero-leakage end of the frontier
    ]
    table = frontier_table(pd.DataFrame(rows))
    assert "c" not in set(table["run_id"])
    assert {(r.run_id, r.epoch) for r in table.itertuples() if r.on_frontier} == {("a", 1), ("b", 1)}
    section = frontier_section_html(pd.DataFrame(rows), tmp_path)
    assert "2 collapsed checkpoint(s) left out" in section


def test_settings_at_zero_leakage_are_drawn_on_top_of_the_axis(tmp_path, monkeypatch):
    """Points at TPR 0 sit on the left spine: markers unclipped, above it."""
    import orchestrator.report.frontier as frontier_mod

    drawn = {}
    monkeypatch.setattr(frontier_mod, "save_png", lambda fig, path: drawn.setdefault("fig", fig) and path)
    table = frontier_table(pd.DataFrame([_row("a", 1, 0.9, 0.0), _row("b", 1, 0.8, 0.0, lr=1e-2)]))
    frontier_mod.frontier_figure(table, tmp_path / "f.png")
    (ax,) = drawn["fig"].axes
    artists = [*ax.collections, *[line for line in ax.lines if line.get_marker() == "o"]]
    assert artists
    assert all(not a.get_clip_on() for a in artists)


def test_the_known_context_attack_counts_as_leakage_so_a_setting_quiet_to_the_probe_is_not_mistaken_for_safe():
    """On the minis the known-context channel finds what the zero-information probe does not: a checkpoint the
    probe sees nothing in but the base-calibrated known-context loss attack does must place by that TPR."""
    quiet = {**_row("a", 1, 0.95, 0.0), "known_context_calibrated_tpr_at_1pct": 0.30}
    honest = {**_row("b", 1, 0.93, 0.05), "known_context_calibrated_tpr_at_1pct": 0.04}
    deployed = {**_row("c", 1, 0.94, 0.0), "known_context_calibrated_tpr_at_1pct": 0.01,
                "deployed_known_context_calibrated_tpr_at_1pct": 0.20}
    table = frontier_table(pd.DataFrame([quiet, honest, deployed])).set_index("run_id")
    assert table.loc["a", "leakage_tpr_at_1pct"] == pytest.approx(0.30)
    assert table.loc["a", "strongest_attack"] == "known_context"
    assert table.loc["c", "strongest_attack"] == "known_context_deployed"
    assert table.loc["b", "strongest_attack"] == "iclmem"
    # by the probe alone "a" would beat "b" on both axes; with the known-context attack both are on the frontier
    assert table["on_frontier"].all()
    probe_only = frontier_table(pd.DataFrame([_row("a", 1, 0.95, 0.0), _row("b", 1, 0.93, 0.05)])).set_index("run_id")
    assert not bool(probe_only.loc["b", "on_frontier"])
