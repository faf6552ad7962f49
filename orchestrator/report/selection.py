"""Which rows and checkpoints a report table reads: the vocabulary the tables share (outcomes, regimes, score
kinds, the run key, the grid axes figures facet by), a checkpoint's AUC and score kind, a run's peak (headline)
and last checkpoint, and the fine-tuned rows. Pure pandas: no file is read or written here."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from iclmem.errors import DataError
from iclmem.record import FACET_AXES, RUN_KEY
from iclmem.vocab import BASE_MODEL_ROW, Outcome, Regime, ScoreKind, values
from iclmem.vocab import DETECTABLE as _DETECTABLE
from iclmem.vocab import MAIN_REGIME as _MAIN_REGIME

__all__ = [
    "OUTCOMES",
    "REGIMES",
    "SCORE_KINDS",
    "MAIN_REGIME",
    "DETECTABLE",
    "RUN_KEY",
    "FACET_AXES",
    "BASE_MANIPULATION",
    "competing_kinds",
    "checkpoint_auc",
    "checkpoint_kind",
    "filter_regime",
    "run_key_columns",
    "peak_checkpoints",
    "last_checkpoints",
    "outcome_order",
    "fine_tuned_rows",
]

OUTCOMES: tuple[str, ...] = values(Outcome)
REGIMES: tuple[str, ...] = values(Regime)
SCORE_KINDS: tuple[str, ...] = values(ScoreKind)
MAIN_REGIME: str = _MAIN_REGIME.value
DETECTABLE: str = _DETECTABLE.value
BASE_MANIPULATION = "base"  # the unmanipulated multiple-choice context every other manipulation varies


def competing_kinds(df: pd.DataFrame) -> tuple[str, ...]:
    """The score kinds that compete for a checkpoint's maximum signal, as the sweep's ``outcome.score_kinds``
    recorded them (``threshold_score_kinds``); every kind for results that predate the setting."""
    if "threshold_score_kinds" in df.columns:
        recorded = {k for v in df["threshold_score_kinds"].dropna().unique() for k in str(v).split(",") if k}
        kinds = tuple(k for k in SCORE_KINDS if k in recorded)
        if kinds:
            return kinds
    return SCORE_KINDS


def _kind_auc_columns(df: pd.DataFrame) -> list[str]:
    return [f"auc_{k}" for k in competing_kinds(df) if f"auc_{k}" in df.columns]


def checkpoint_auc(df: pd.DataFrame) -> pd.Series:
    """Highest calibrated AUC of each checkpoint over the competing score kinds present (NaN-safe)."""
    cols = _kind_auc_columns(df) + (["auc"] if "auc" in df.columns and not _kind_auc_columns(df) else [])
    if not cols:
        raise DataError("results have no calibrated AUC column (auc or auc_<kind>)")
    return df[cols].astype(float).max(axis=1, skipna=True)


def checkpoint_kind(df: pd.DataFrame) -> pd.Series:
    """The score kind that gives :func:`checkpoint_auc` (the deciding ``score_kind`` when it ties)."""
    cols = _kind_auc_columns(df)
    best = checkpoint_auc(df)
    fallback = (df["score_kind"].astype(object) if "score_kind" in df.columns
                else pd.Series(None, index=df.index, dtype=object))
    if not cols:
        return fallback
    out = fallback.copy()
    vals = df[cols].astype(float)
    for i in df.index:
        sk = fallback.get(i)
        row = vals.loc[i]
        if isinstance(sk, str) and f"auc_{sk}" in cols and row[f"auc_{sk}"] == best[i]:
            continue
        if "auc" in df.columns and isinstance(sk, str) and df.at[i, "auc"] == best[i]:
            continue
        if row.notna().any():
            out[i] = str(row.idxmax())[len("auc_"):]
    return out


def filter_regime(results: pd.DataFrame, regime: str | None) -> pd.DataFrame:
    if regime is None or "regime" not in results.columns:
        return results
    return results[results["regime"] == regime]


def run_key_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in RUN_KEY if c in df.columns]


def peak_checkpoints(results: pd.DataFrame, *, regime: str | None = None) -> pd.DataFrame:
    """One row per run: its peak checkpoint (highest calibrated AUC over epochs and score kinds).

    Adds ``peak_auc``, ``peak_kind``, ``n_checkpoints`` and ``last_epoch``. The base checkpoint (epoch 0)
    is a candidate only for runs without any other; ties go to the earliest epoch.
    """
    df = filter_regime(results, regime).copy()
    if df.empty:
        return df.assign(peak_auc=pd.Series(dtype=float), peak_kind=pd.Series(dtype=object),
                         n_checkpoints=pd.Series(dtype=int), last_epoch=pd.Series(dtype=int))
    key = run_key_columns(df)
    df["peak_auc"] = checkpoint_auc(df)
    df["peak_kind"] = checkpoint_kind(df)
    grp = df.groupby(key, sort=False, dropna=False)
    df["n_checkpoints"] = grp["epoch"].transform("size")
    df["last_epoch"] = grp["epoch"].transform("max")
    has_trained = grp["epoch"].transform(lambda e: bool((e > 0).any()))
    df["_demote"] = (df["epoch"] == 0) & has_trained
    df["_neg_auc"] = -df["peak_auc"].fillna(-np.inf)
    df = df.sort_values(key + ["_demote", "_neg_auc", "epoch"], kind="mergesort")
    peaks = df.drop_duplicates(subset=key, keep="first").drop(columns=["_demote", "_neg_auc"])
    return peaks.reset_index(drop=True)


def last_checkpoints(results: pd.DataFrame, *, regime: str | None = None) -> pd.DataFrame:
    df = filter_regime(results, regime)
    key = run_key_columns(df)
    return df.sort_values(key + ["epoch"], kind="mergesort").drop_duplicates(key, keep="last").reset_index(drop=True)


def outcome_order(values: Iterable[str]) -> list[str]:
    extra = sorted({str(v) for v in values if pd.notna(v)} - set(OUTCOMES))
    return list(OUTCOMES) + extra


def fine_tuned_rows(results: pd.DataFrame) -> pd.DataFrame:
    df = results
    if "epoch" in df.columns:
        df = df[df["epoch"] > 0]
    if "regime" in df.columns:
        df = df[df["regime"] != BASE_MODEL_ROW]
    return df
