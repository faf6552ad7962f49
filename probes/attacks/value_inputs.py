"""The inputs of attribute inference (:mod:`probes.attacks.value_inference`): the sensitive column as a finite set
of candidate values (:class:`SensitiveAttribute`: a categorical column's codes, or a numeric column binned at
population quantiles by :func:`bin_numeric`) and the auxiliary rows the imputation baseline is fitted on
(:class:`ImputationPool`: never a target). Shapes: features float32 [n, F], labels int64 [n]; every check
names the column or the pool at fault. Pure numpy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from iclmem.errors import DataError, ProbeError

__all__ = ["ImputationPool", "SensitiveAttribute", "as_matrix", "bin_numeric", "check_column"]


def _quantile_edges(fit_values: np.ndarray, n_bins: int) -> np.ndarray:
    """float64 [<= n_bins - 1]: interior edges at the quantiles of ``fit_values`` (bin b: edges[b-1] <= v <
    edges[b]), tied quantiles merged and any edge that would leave a bin without a fit value dropped."""
    edges = np.unique(np.quantile(fit_values, np.linspace(0.0, 1.0, n_bins + 1)[1:-1]))
    while edges.size:
        counts = np.bincount(np.searchsorted(edges, fit_values, side="right"), minlength=edges.size + 1)
        empty = np.flatnonzero(counts == 0)
        if not empty.size:
            break
        b = int(empty[0])
        edges = np.delete(edges, max(b - 1, 0))  # merge the empty bin into its lower neighbour (bin 0: its upper)
    return np.asarray(edges, dtype=np.float64)


def _finite_column(values: Any, name: str) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        raise DataError(f"{name}: no values")
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
        raise DataError(f"{name}: {bad.size} of {v.size} values are missing or infinite (first at row {int(bad[0])})")
    return v


def bin_numeric(values: Any, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """A numeric column cut into at most ``n_bins`` bins at its own quantiles: (bin index int64 [n], centres
    float64 [B]), a centre being the mean of the values in its bin. Tied values never straddle an edge, so a
    column with few distinct values gets fewer bins (each holding at least one value); fewer than 2 is refused."""
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 2:
        raise ProbeError(f"bin_numeric: n_bins must be an integer >= 2, got {n_bins!r}")
    v = _finite_column(values, "bin_numeric: values")
    edges = _quantile_edges(v, int(n_bins))
    if edges.size == 0:
        raise DataError("bin_numeric: the column has a single distinct value: nothing to infer")
    index = np.searchsorted(edges, v, side="right").astype(np.int64)
    centres = np.bincount(index, weights=v) / np.bincount(index)
    return index, centres


@dataclass(frozen=True, eq=False)
class SensitiveAttribute:
    """The column the attacker wants and the values it tries. ``candidates`` float [V]: the codes of a categorical
    column, or the bin centres of a binned numeric one. ``edges`` None: a row's true candidate is the candidate
    its value equals (any other value is refused); else float64 [V - 1], the interior bin edges, and a row's true
    candidate is its bin. ``group`` (a one-hot encoded column, :meth:`one_hot`): the V indicator columns, candidate
    j being "indicator j on, the others off" (``on`` / ``off`` float32 [V]: each indicator's two encoded values), so
    the attacker sets, and never knows, every indicator of the column. Build one with :meth:`categorical`,
    :meth:`binned` or :meth:`one_hot`."""

    column: int
    candidates: np.ndarray  # float32 [V]
    edges: np.ndarray | None = None  # float64 [V - 1] (binned numeric)
    group: tuple[int, ...] = ()  # one-hot: the indicator column of each candidate (column = group[0])
    on: np.ndarray | None = None  # float32 [V]: indicator j's value in a row of level j
    off: np.ndarray | None = None  # float32 [V]: ... in a row of another level

    def __post_init__(self) -> None:
        if isinstance(self.column, bool) or not isinstance(self.column, (int, np.integer)) or self.column < 0:
            raise ProbeError(f"attribute inference: sensitive_column must be a column index >= 0, got {self.column!r}")
        c = np.asarray(self.candidates, dtype=np.float32).reshape(-1)
        if c.size < 2:
            raise ProbeError(f"attribute inference: {c.size} candidate value(s); need >= 2 (one is no secret)")
        if not np.isfinite(c).all() or np.unique(c).size != c.size:
            raise ProbeError("attribute inference: the candidates must be finite and distinct")
        c.flags.writeable = False
        object.__setattr__(self, "column", int(self.column))
        object.__setattr__(self, "candidates", c)
        if self.edges is not None:
            e = np.asarray(self.edges, dtype=np.float64).reshape(-1)
            if e.size != c.size - 1 or not np.isfinite(e).all() or (np.diff(e) <= 0).any():
                raise ProbeError(f"attribute inference: a binned column needs {c.size - 1} increasing finite edges for"
                                 f" {c.size} candidates, got {e.size}")
            e.flags.writeable = False
            object.__setattr__(self, "edges", e)
        if self.group:
            group = tuple(int(g) for g in self.group)
            if len(group) != c.size or len(set(group)) != len(group) or group[0] != self.column:
                raise ProbeError(f"attribute inference: a one-hot column needs {c.size} distinct indicator columns, "
                                 f"the first its column, got {group}")
            if self.on is None or self.off is None:
                raise ProbeError("attribute inference: a one-hot column needs its indicators' on and off values")
            on, off = (np.asarray(a, dtype=np.float32).reshape(-1) for a in (self.on, self.off))
            if on.size != c.size or off.size != c.size or (on == off).any():
                raise ProbeError("attribute inference: each indicator needs two distinct values, on and off")
            object.__setattr__(self, "group", group)
            object.__setattr__(self, "on", on)
            object.__setattr__(self, "off", off)

    @property
    def feature_columns(self) -> tuple[int, ...]:
        """The feature columns the attribute is: its indicators (one-hot), else its one column."""
        return self.group or (self.column,)

    def truth(self, x: Any, name: str = "values") -> np.ndarray:
        """int64 [m]: each row's true candidate, read off its feature columns (float [m, F])."""
        x = as_matrix(x, f"attribute inference: {name}")
        if not self.group:
            return self.index_of(x[:, self.column], name)
        assert self.on is not None
        lit = np.isclose(x[:, list(self.group)], self.on[None, :])  # [m, V]
        bad = np.flatnonzero(lit.sum(axis=1) != 1)
        if bad.size:
            raise DataError(f"attribute inference: {bad.size} of {len(x)} {name} have no or several levels of the "
                            f"one-hot column (first at row {int(bad[0])})")
        return np.asarray(lit.argmax(axis=1), dtype=np.int64)

    def with_candidate(self, x: np.ndarray, j: int) -> np.ndarray:
        """A copy of float [m, F] with the attribute set to candidate ``j`` in every row."""
        q = np.array(x, copy=True)
        if self.group:
            assert self.on is not None
            assert self.off is not None
            q[:, list(self.group)] = self.off[None, :]
            q[:, self.group[j]] = self.on[j]
        else:
            q[:, self.column] = self.candidates[j]
        return q

    @property
    def n_candidates(self) -> int:
        return int(self.candidates.size)

    @property
    def is_binned(self) -> bool:
        return self.edges is not None

    def index_of(self, values: Any, name: str = "values") -> np.ndarray:
        """int64 [m]: each value's candidate (its bin, for a binned column); a categorical value that is not a
        candidate is refused (the message names rows, never values)."""
        v = _finite_column(values, f"attribute inference: {name} of column {self.column}")
        if self.edges is not None:
            return np.searchsorted(self.edges, v, side="right").astype(np.int64)
        v32 = v.astype(np.float32)
        order = np.argsort(self.candidates, kind="stable")
        ranked = self.candidates[order]
        pos = np.clip(np.searchsorted(ranked, v32), 0, ranked.size - 1)
        missing = np.flatnonzero(ranked[pos] != v32)
        if missing.size:
            raise DataError(f"attribute inference: {missing.size} of {v.size} {name} of column {self.column} are not"
                            f" among the {ranked.size} candidates (first at row {int(missing[0])})")
        return np.asarray(order[pos], dtype=np.int64)

    @classmethod
    def categorical(cls, population_x: Any, column: int, candidates: Any = None) -> SensitiveAttribute:
        """A categorical column: the candidates are ``candidates`` (e.g. every code of the table's column) or,
        by default, the distinct values the population holds."""
        x = as_matrix(population_x, "population_x")
        check_column(column, x.shape[1])
        values = _finite_column(x[:, column], f"attribute inference: column {column}")
        c = np.unique(values.astype(np.float32)) if candidates is None else candidates
        attribute = cls(column, np.asarray(c))
        attribute.index_of(values, "population values")  # refuses a population value that is not a candidate
        return attribute

    @classmethod
    def one_hot(cls, table_x: Any, indicators: Any) -> SensitiveAttribute:
        """A categorical column one-hot encoded into ``indicators`` (feature column indices, one per level, >= 2):
        each indicator's on and off values are the larger and the smaller of the two it takes in ``table_x``."""
        x = as_matrix(table_x, "table_x")
        columns = [int(c) for c in indicators]
        for c in columns:
            check_column(c, x.shape[1])
        values = [np.unique(_finite_column(x[:, c], f"attribute inference: column {c}")) for c in columns]
        if len(columns) < 2 or any(v.size != 2 for v in values):
            raise DataError(f"attribute inference: a one-hot column needs >= 2 indicators of two values each, got "
                            f"{[v.size for v in values]} values in columns {columns}")
        attribute = cls(columns[0], np.arange(len(columns), dtype=np.float32), None, tuple(columns),
                        np.array([v[1] for v in values]), np.array([v[0] for v in values]))
        attribute.truth(x, "table rows")  # refuses rows with no or several levels
        return attribute

    @classmethod
    def binned(cls, population_x: Any, column: int, n_bins: int) -> SensitiveAttribute:
        """A numeric column binned at the population's quantiles (:func:`bin_numeric`): the candidates are the
        bin centres, a row's true candidate is its own bin."""
        x = as_matrix(population_x, "population_x")
        check_column(column, x.shape[1])
        values = _finite_column(x[:, column], f"attribute inference: column {column}")
        _, centres = bin_numeric(values, n_bins)
        return cls(column, centres, _quantile_edges(values, int(n_bins)))


@dataclass(frozen=True, eq=False)
class ImputationPool:
    """Rows the imputation baseline is fitted on: features float32 [M, F] (the sensitive column included: its
    value is what the imputer learns to predict) and labels int64 [M]. Never the audited rows: the control's
    rows, or rows of the table outside P and every context."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        x = np.asarray(self.x, dtype=np.float32)
        y = np.asarray(self.y, dtype=np.int64).reshape(-1)
        if x.ndim != 2 or x.shape[0] == 0:
            raise DataError(f"attribute inference: the imputation pool is empty or not a matrix (features {x.shape});"
                            " the baseline needs rows outside P")
        if y.shape != (x.shape[0],):
            raise DataError(f"attribute inference: imputation pool features {x.shape} with labels {y.shape}")
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "y", y)


def as_matrix(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim != 2:
        raise ProbeError(f"{name}: need a matrix [n, F], got shape {arr.shape}")
    return arr


def check_column(column: int, n_features: int) -> None:
    if isinstance(column, bool) or not isinstance(column, (int, np.integer)) or not 0 <= column < n_features:
        raise ProbeError(f"attribute inference: sensitive_column {column!r} out of range for {n_features} features")
