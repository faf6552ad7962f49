"""The results table's ε lower-bound columns and their check against the DP accountant (issues #15, #43): each
checkpoint's classic (ε, δ), Gaussian-DP μ and one-run bounds headlined over the competing score kinds, each run's
headline bound, and on DP-SGD rows the accountant's figures and the consistency flags, checked at a level the run's
checks share. Pure pandas on the results rows; :func:`orchestrator.report.aggregate.aggregate` adds them to every table
it builds, and the report's privacy section (:mod:`orchestrator.report.epsilon`) states the levels used here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from iclmem.record import RUN_KEY

if TYPE_CHECKING:  # imported where used: the privacy math is not needed to read a results table
    from probes.gdp import GridCounts
    from trainables.dp import DPSettings

__all__ = [
    "CONSISTENCY_LEVEL",
    "BEYOND_CHANCE_LEVEL",
    "EpsilonInconsistencyWarning",
    "AccountantCheck",
    "CHECK_FLAGS",
    "gaussian_mechanism_or_why_not",
    "epsilon_columns",
]

# The level of a run's consistency flag. If DP-SGD meets its accountant's figures (and, for the classic and GDP
# checks, the rows are independent trials), every check of the run passes, all together, with probability at
# least 1 - CONSISTENCY_LEVEL: the run's checks share the level by a union bound, each read at
# CONSISTENCY_LEVEL / (the run's number of checks), so a run with many checkpoints does not fail more often.
CONSISTENCY_LEVEL = 0.05
# A check that still fails when the run's checks share this level instead is not chance: only then does the
# aggregator name a bug in the audit or the accounting (or a broken assumption) as the likely cause
BEYOND_CHANCE_LEVEL = 1e-6


class EpsilonInconsistencyWarning(UserWarning):
    """An audited lower bound exceeds the DP accountant's figure for the same checkpoint and neighbour relation
    at the run's consistency level (:data:`CONSISTENCY_LEVEL` shared by the run's checks)."""


@dataclass(frozen=True)
class AccountantCheck:
    """One checkpoint's audited bound against the accountant's figure for the bound's neighbour relation.
    ``bound_at(level)`` re-reads the bound at an error probability from the counts the probe recorded, so the
    check runs at its share of its run's level rather than at the level the bound was printed at."""

    flag: str  # the results column the check sets
    bound_name: str
    limit: float
    limit_name: str
    bound_at: Callable[[float], float]

    def exceeds(self, level: float) -> tuple[bool, float]:
        """(whether the bound read at ``level`` is above the accountant's figure, that bound)."""
        value = self.bound_at(level)
        return value > self.limit + 1e-9, value


# the flags the checks set, one per kind of bound
CHECK_FLAGS = ("epsilon_consistent", "gdp_consistent", "one_run_consistent")


def _kinds_of(row: pd.Series, all_kinds: list[str]) -> list[str]:
    listed = row.get("threshold_score_kinds")
    if isinstance(listed, str) and listed:
        return [k for k in listed.split(",") if k in all_kinds] or all_kinds
    return all_kinds


def _grids(row: pd.Series, kinds: list[str]) -> dict[str, GridCounts]:
    """The GDP grid counts (``probes.gdp.GridCounts``) the probe recorded for each of ``kinds``' calibrated
    scores; a kind without them (withheld, or a probe result from before they were recorded) is left out."""
    from probes.gdp import GridCounts

    return {k: GridCounts.from_json(text) for k in kinds
            if isinstance(text := row.get(f"calibrated_{k}_gdp_grid"), str)}


def _kind_headline(out: pd.DataFrame, kinds: list[str], bound: str,
                   companion: str) -> tuple[list[float], list[str | None], list[float]]:
    """Per row, over the score kinds: the largest ``calibrated_<kind>_<bound>`` among the row's competing kinds
    (``threshold_score_kinds``), its kind and its ``calibrated_<kind>_<companion>``."""
    import math

    best_values: list[float] = []
    best_kinds: list[str | None] = []
    companions: list[float] = []
    for _, row in out.iterrows():
        values = {k: float(row[f"calibrated_{k}_{bound}"]) for k in _kinds_of(row, kinds)
                  if pd.notna(row.get(f"calibrated_{k}_{bound}"))}
        best = max(values, key=lambda k: values[k], default=None)
        best_values.append(math.nan if best is None else values[best])
        best_kinds.append(best)
        companions.append(math.nan if best is None else float(row[f"calibrated_{best}_{companion}"]))
    return best_values, best_kinds, companions


def _gdp_headline(out: pd.DataFrame, kinds: list[str]) -> int:
    """Sets ``gdp_mu_lb`` and ``gdp_mu_lb_kind``: per row, the largest μ bound among the competing kinds, each
    re-read from its grid counts at ``GDP_BETA / K`` with K the number of competing kinds (Bonferroni: the
    maximum is chosen after looking, and holds at 1 - GDP_BETA for that). Returns how many rows had per-kind μ
    bounds but no counts to re-read (probe results from before the counts were recorded): their headline is
    NaN, since a maximum of bounds each at GDP_BETA holds only at K·GDP_BETA."""
    import math

    from probes.gdp import GDP_BETA

    values: list[float] = []
    best_kinds: list[str | None] = []
    without_counts = 0
    for _, row in out.iterrows():
        competing = _kinds_of(row, kinds)
        grids = _grids(row, competing)
        if not grids:
            values.append(math.nan)
            best_kinds.append(None)
            without_counts += any(pd.notna(row.get(f"calibrated_{k}_gdp_mu_lb")) for k in competing)
            continue
        mus = {k: grid.mu_lower_bound(GDP_BETA / len(competing)) for k, grid in grids.items()}
        best = max(mus, key=lambda k: mus[k])
        values.append(mus[best])
        best_kinds.append(best)
    out["gdp_mu_lb"], out["gdp_mu_lb_kind"] = values, best_kinds
    return without_counts


def gaussian_mechanism_or_why_not(row: Mapping[str, Any]) -> str | None:
    """None when the checkpoint's training is a Gaussian mechanism (DP-SGD with full batches, the only DP-SGD
    this code trains: a composition of Gaussian mechanisms, whose trade-off curve is Gaussian), else why a μ
    lower bound implies no ε lower bound there."""
    if pd.isna(row.get("dp_noise_multiplier")):
        return ("not a DP-SGD run: a μ lower bound implies an ε lower bound only for a mechanism whose trade-off "
                "curve is Gaussian (full-batch DP-SGD), and nothing says this training's is")
    rate = row.get("dp_sample_rate")
    if rate is not None and pd.notna(rate) and float(rate) != 1.0:
        return (f"DP-SGD with sampled batches (sample rate {float(rate):g}): its trade-off curve is not Gaussian, "
                "so a μ lower bound implies no ε lower bound")
    return None


def _gdp_epsilon(out: pd.DataFrame) -> None:
    """``gdp_epsilon_lb`` (the headline μ's ε at ``epsilon_lb_delta``) and the per-kind ``*_gdp_epsilon_lb`` kept
    only on rows whose training is a Gaussian mechanism; NaN elsewhere, with ``gdp_epsilon_lb_withheld`` saying
    why (:func:`gaussian_mechanism_or_why_not`)."""
    import math

    from probes.gdp import gdp_epsilon_at

    reasons = [gaussian_mechanism_or_why_not(row) for _, row in out.iterrows()]
    not_gaussian = np.array([r is not None for r in reasons], dtype=bool)
    out["gdp_epsilon_lb"] = [
        gdp_epsilon_at(float(mu), float(delta)) if reason is None and pd.notna(mu) and pd.notna(delta) else math.nan
        for reason, mu, delta in zip(reasons, out["gdp_mu_lb"], out["epsilon_lb_delta"])]
    for column in [c for c in out.columns if c.endswith("gdp_epsilon_lb")]:
        out.loc[not_gaussian, column] = math.nan
    out["gdp_epsilon_lb_withheld"] = reasons


def _accountant_checks(row: pd.Series, dp: DPSettings, kinds: list[str], eps_add_remove: float, eps_replace: float,
                       mu_replace: float) -> list[AccountantCheck]:
    """The checks one DP checkpoint's bounds can be held to: the classic (ε, δ) inequalities and the GDP μ at
    the grid's thresholds of every calibrated kind (Bonferroni over the kinds), against the replace-one figures
    ``eps_replace`` and ``mu_replace`` (the audit's game); the one-run bound, from the guesses that gave it,
    against the add/remove ``eps_add_remove`` (the canaries' game). Each is read at the accountant's own δ, so
    it always compares; a figure that is NaN (sampled batches: no replace-one claim) gets no check."""
    from probes.one_run import one_run_epsilon

    checks: list[AccountantCheck] = []
    grids = list(_grids(row, kinds).values())
    if grids and not np.isnan(eps_replace):
        checks.append(AccountantCheck(
            "epsilon_consistent", "classic (ε, δ) bound at the grid's thresholds", eps_replace,
            "the accountant's replace-one epsilon",
            lambda level: max(g.epsilon_lower_bound(dp.delta, level / len(grids)) for g in grids)))
    if grids and not np.isnan(mu_replace):
        checks.append(AccountantCheck(
            "gdp_consistent", "GDP mu_lb", mu_replace, "DP-SGD's exact replace-one mu",
            lambda level: max(g.mu_lower_bound(level / len(grids)) for g in grids)))
    needed = ("one_run_epsilon_lb", "one_run_m", "one_run_guesses", "one_run_correct", "one_run_tests")
    if all(pd.notna(row.get(c)) for c in needed):
        m, r, v, tests = (int(row[c]) for c in needed[1:])
        # the guesses that gave the bound, re-read at the check's share: with every test of the one-run grid
        # at level / tests, whichever is read holds (union bound), so the choice made at beta stays paid for
        checks.append(AccountantCheck(
            "one_run_consistent", "one-run epsilon_lb", eps_add_remove, "the accountant's add/remove epsilon",
            lambda level: one_run_epsilon(m, r, v, dp.delta, level / tests) if r > 0 else 0.0))
    return checks


def epsilon_columns(results: pd.DataFrame, log: Callable[[str], None] = print) -> pd.DataFrame:
    """Adds, beside the per-kind bounds the probe wrote (``calibrated_<kind>_epsilon_lb``, ``_gdp_mu_lb``,
    ``_gdp_epsilon_lb`` and the counts ``_gdp_grid``):

    * ``epsilon_lb``, ``epsilon_lb_kind``, ``epsilon_lb_delta``: the checkpoint's classic bound, the maximum over
      the competing score kinds (the family its verdict reads); no stated confidence (a maximum over every
      threshold, kind and checkpoint, uncorrected);
    * ``run_epsilon_lb`` (and ``_epoch``, ``_kind``): the run headline's, the maximum over the run's
      checkpoints and competing kinds;
    * ``gdp_mu_lb`` (``_kind``): the Gaussian-DP bound of the competing kinds, each kind re-read from its counts
      at ``GDP_BETA / K`` (:func:`_gdp_headline`), so the checkpoint's maximum holds at 95%;
      ``gdp_epsilon_lb``: its ε at ``epsilon_lb_delta``, only where the training is a Gaussian mechanism
      (full-batch DP-SGD); elsewhere it and every per-kind ``*_gdp_epsilon_lb`` are NaN and
      ``gdp_epsilon_lb_withheld`` says why;
    * DP-SGD rows (``dp_noise_multiplier`` set): ``dp_steps`` and ``dp_epsilon``, the accountant's (add/remove
      one) ε after the checkpoint's epoch; ``dp_epsilon_replace_one``, the same mechanism's ε for the
      neighbour relation the audit's game plays (:meth:`trainables.dp.DPSettings.epsilon_replace_one_at`);
      ``dp_mu`` / ``dp_mu_replace_one`` (DP-SGD's exact μ, full batches);
    * the consistency checks (:func:`_accountant_checks`): ``epsilon_consistent``, ``gdp_consistent``,
      ``one_run_consistent``, each False when its bound, re-read at ``consistency_level``, exceeds the
      accountant's figure for its neighbour relation (None: no such check here). A run's checks share
      :data:`CONSISTENCY_LEVEL` (``consistency_level`` = it divided by the run's number of checks), so its flags
      together err with probability at most 0.05 when the accountant is right (for the classic and GDP
      checks: and the rows are independent trials). A False is printed as a warning, and named a bug (or a
      broken assumption) only if the check fails at :data:`BEYOND_CHANCE_LEVEL` shared the same way too.

    Every bound's neighbour relation is declared once, in ``iclmem.record.NEIGHBOURS``.

    A checkpoint whose split is not exchangeable (``exchangeable`` False: the paper's unmatched
    shuffled_members design, or a blind baseline separating the groups) gets no bound from its split at all:
    every ``*epsilon_lb`` and ``*gdp_mu_lb`` column (and the counts behind them) but the canaries' one-run bound
    is NaN there and ``epsilon_lb_withheld`` says why, since its rates measure the label difference between the
    groups as much as membership.
    """
    import math

    from iclmem.vocab import SCORE_KINDS

    if results.empty:
        return results
    out = results.copy()
    if "exchangeable" in out.columns:
        separable = out["exchangeable"].map(lambda v: v is False or v == 0 or v == "False").to_numpy(bool)
        out["epsilon_lb_withheld"] = [
            ("members and non-members are separable without the model (label design "
             f"{row.get('label_design')}, blind AUC {float(row.get('blind_auc', math.nan)):.3f}): no ε lower bound")
            if sep else None for sep, (_, row) in zip(separable, out.iterrows())]
        # the split's bounds go; the canaries' one-run bound stays (inserted and held-out canaries are
        # exchangeable by their own design, whatever the members' labels)
        for column in [c for c in out.columns if c.endswith(("epsilon_lb", "gdp_mu_lb")) and not c.startswith("one_run_")]:
            out.loc[separable, column] = math.nan
        for column in [c for c in out.columns if c.endswith("gdp_grid")]:  # nothing to re-read them from either
            out.loc[separable, column] = None
    kinds = [k.value for k in SCORE_KINDS if f"calibrated_{k.value}_epsilon_lb" in out.columns]
    if not kinds:
        return out
    out["epsilon_lb"], out["epsilon_lb_kind"], out["epsilon_lb_delta"] = _kind_headline(
        out, kinds, "epsilon_lb", "epsilon_lb_delta")
    if any(f"calibrated_{k}_{c}" in out.columns for k in kinds for c in ("gdp_mu_lb", "gdp_grid")):
        without_counts = _gdp_headline(out, kinds)
        if without_counts:
            log(f"[iclmem] note: gdp_mu_lb is not set for {without_counts} checkpoint(s) whose probe results have "
                "no GDP grid counts (probed before they were recorded); probe them again for a GDP headline")
        _gdp_epsilon(out)
    keys = [c for c in RUN_KEY if c in out.columns]
    # the epoch as a float (NaN when no checkpoint has a bound): one dtype in memory and read back from parquet
    out["run_epsilon_lb"], out["run_epsilon_lb_epoch"], out["run_epsilon_lb_kind"] = math.nan, math.nan, None
    for _, group in out.groupby(keys, sort=False, dropna=False):
        valid = group["epsilon_lb"].dropna()
        if valid.empty:
            continue
        top = valid.idxmax()
        out.loc[group.index, "run_epsilon_lb"] = float(valid.loc[top])
        out.loc[group.index, "run_epsilon_lb_epoch"] = float(out.at[top, "epoch"])
        out.loc[group.index, "run_epsilon_lb_kind"] = out.at[top, "epsilon_lb_kind"]
    if "dp_noise_multiplier" not in out.columns:
        return out
    _accountant_columns(out, kinds, keys, log)
    return out


def _accountant_columns(out: pd.DataFrame, kinds: list[str], keys: list[str], log: Callable[[str], None]) -> None:
    """The DP rows' accountant figures and the consistency checks (:func:`epsilon_columns`), set in place."""
    import math
    import warnings

    from iclmem.vocab import Neighbours
    from trainables.dp import DPSettings

    n = len(out)
    spent, spent_replace, mu, mu_replace = ([math.nan] * n for _ in range(4))
    steps: list[int | None] = [None] * n
    checks: list[list[AccountantCheck]] = [[] for _ in range(n)]
    for pos, (_, row) in enumerate(out.iterrows()):
        if pd.isna(row.get("dp_noise_multiplier")):
            continue
        dp = DPSettings(**{f: row[f"dp_{f}"] for f in ("target_epsilon", "delta", "max_grad_norm", "noise_multiplier",
                                                     "epochs", "sample_rate", "steps_per_epoch", "accountant")})
        epoch = int(row["epoch"])
        spent[pos], spent_replace[pos] = dp.epsilon_at(epoch), dp.epsilon_replace_one_at(epoch)
        steps[pos] = dp.steps_at(epoch)
        # Gaussian-DP: μ has no δ, so the audit's μ and DP-SGD's exact μ always compare (full batches only)
        mu[pos], mu_replace[pos] = dp.mu_at(epoch), dp.mu_at(epoch, Neighbours.REPLACE_ONE)
        checks[pos] = _accountant_checks(row, dp, kinds, spent[pos], spent_replace[pos], mu_replace[pos])
    level = [math.nan] * n
    flags: dict[str, list[bool | None]] = {flag: [None] * n for flag in CHECK_FLAGS}
    failed: list[str] = []
    beyond_chance: list[str] = []
    for _, group in out.groupby(keys, sort=False, dropna=False):
        positions = [out.index.get_loc(i) for i in group.index]
        total = sum(len(checks[p]) for p in positions)
        if total == 0:
            continue
        share, strict = CONSISTENCY_LEVEL / total, BEYOND_CHANCE_LEVEL / total
        for p in positions:
            if not checks[p]:
                continue
            level[p] = share
            row = out.iloc[p]
            where = f"{row['run_id']} [{row.get('task')}] epoch {int(row['epoch'])}"
            for check in checks[p]:
                over, value = check.exceeds(share)
                flags[check.flag][p] = not over
                if not over:
                    continue
                text = (f"{where}: {check.bound_name} {value:.4g} > {check.limit_name} {check.limit:.4g} "
                        f"at level {share:.2g}")
                still_over, strict_value = check.exceeds(strict)
                if still_over:
                    text += f" (and {strict_value:.4g} at level {strict:.2g}: beyond chance)"
                    beyond_chance.append(text)
                failed.append(text)
    out["dp_epsilon"], out["dp_epsilon_replace_one"] = spent, spent_replace
    out["dp_steps"], out["dp_mu"], out["dp_mu_replace_one"] = steps, mu, mu_replace
    for flag, values in flags.items():  # True / False / None in every table, whether or not a run lacks a check
        out[flag] = pd.Series(values, index=out.index, dtype=object)
    out["consistency_level"] = level
    if failed:
        message = (f"{len(failed)} consistency check(s) exceed the accountant at level {CONSISTENCY_LEVEL:g} per run "
                   "(the level a run's checks share; the classic and GDP checks also assume the rows are independent "
                   "trials): an audited lower bound above what DP-SGD guarantees for the same neighbour relation: "
                   + "; ".join(failed))
        if beyond_chance:
            message += (f". {len(beyond_chance)} of them exceed it even at level {BEYOND_CHANCE_LEVEL:g}: that is not "
                        "chance, so a bug in the audit or in the DP accounting is the likely cause (or members and "
                        "non-members that are not exchangeable, or rows that are far from independent trials)")
        log(f"[iclmem] WARNING {message}")
        warnings.warn(message, EpsilonInconsistencyWarning, stacklevel=3)

