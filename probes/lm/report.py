"""Tables shaped like the paper's Tables 2-6 and an HTML section, from the LM results table (the page
around it is written by ``orchestrator.report.html.write_lm_html_report``).

* Table 2  NET F1 per dataset and type: all / memorized / unmemorized, with counts (BIO datasets).
* Table 3  the same for entity lists (DBpedia), one block per exposure criterion (word, transition).
* Table 4  NET F1 with the weighted random-guess baseline and counts (every dataset).
* Table 5  few-shot NER: test as-is / seen / unseen, mean and std over seeds, count.
* Table 6  few-shot NER, test as-is: mean and std over seeds, count.

Std over seeds is the sample std (ddof=1), the spread the paper's "mean ± std" over three seeds reports;
one seed gives NaN (no spread can be estimated from one draw).
The HTML holds numbers and entity-type names only, never sentences or entity strings.
"""

from __future__ import annotations

import html
from collections.abc import Mapping

import numpy as np
import pandas as pd

from iclmem.vocab import NerVariant, values

__all__ = ["lm_tables", "lm_report_section", "TABLE_TITLES"]

TABLE_TITLES = {
    "table2": "Table 2 - Zero-shot NET F1 (all / memorized / unmemorized entities)",
    "table3": "Table 3 - Zero-shot NET F1 on entity lists, by exposure criterion (M / UM)",
    "table4": "Table 4 - Zero-shot NET F1 and weighted random guess",
    "table5": "Table 5 - 16-shot NER F1: test as-is / seen / unseen (mean, std over seeds)",
    "table6": "Table 6 - 16-shot NER F1, test as-is (mean, std over seeds)",
}
_KEYS = ["model", "dataset", "entity_type"]


def _order(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    if df.empty:
        return df
    out = df.copy()
    # macro-average last within each block, as in the paper
    out["_macro"] = out["entity_type"].eq("macro-average")
    out = out.sort_values([*[k for k in keys if k != "entity_type"], "_macro", "entity_type"]).drop(columns="_macro")
    return out.reset_index(drop=True)


def _net_memorization(res: pd.DataFrame, entity_lists: bool) -> pd.DataFrame:
    net = res[(res["probe"] == "net") & (res["dataset_format"].eq("entity_list") == entity_lists)]
    cols = [*_KEYS[:2], "criterion", "entity_type", "f1_all", "count_all", "f1_memorized", "count_memorized",
            "f1_unmemorized", "count_unmemorized"]
    if net.empty:
        return pd.DataFrame(columns=cols)
    allr = net[net["variant"] == "all"][[*_KEYS, "f1", "count"]].rename(columns={"f1": "f1_all", "count": "count_all"})
    sub = net[net["variant"].isin(["memorized", "unmemorized"])]
    rows = []
    for (model, dataset, crit), g in sub.groupby(["model", "dataset", "criterion"], sort=True):
        base = allr[(allr["model"] == model) & (allr["dataset"] == dataset)]
        for _, a in base.iterrows():
            row = {"model": model, "dataset": dataset, "criterion": crit, "entity_type": a["entity_type"],
                   "f1_all": a["f1_all"], "count_all": a["count_all"]}
            for v in ("memorized", "unmemorized"):
                hit = g[(g["variant"] == v) & (g["entity_type"] == a["entity_type"])]
                row[f"f1_{v}"] = float(hit["f1"].iloc[0]) if len(hit) else np.nan
                row[f"count_{v}"] = int(hit["count"].iloc[0]) if len(hit) else 0
            rows.append(row)
    return _order(pd.DataFrame(rows, columns=cols), [*_KEYS[:2], "criterion", "entity_type"])


def _ner(res: pd.DataFrame, variants: tuple[str, ...]) -> pd.DataFrame:
    ner = res[res["probe"] == "ner"]
    cols = [*_KEYS]
    for v in variants:
        key = v.replace("-", "_")
        cols += [f"f1_{key}_mean", f"f1_{key}_std"]
    cols += ["count", "n_seeds"]
    if ner.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (model, dataset, typ), g in ner.groupby(_KEYS, sort=True):
        row = {"model": model, "dataset": dataset, "entity_type": typ}
        for v in variants:
            f = g[g["variant"] == v]["f1"].astype(float).dropna()
            key = v.replace("-", "_")
            row[f"f1_{key}_mean"] = float(f.mean()) if len(f) else np.nan
            row[f"f1_{key}_std"] = float(f.std(ddof=1)) if len(f) > 1 else np.nan
        asis = g[g["variant"] == NerVariant.AS_IS]
        row["count"] = int(asis["count"].iloc[0]) if len(asis) else int(g["count"].max())
        row["n_seeds"] = int(g["seed"].nunique())
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


def lm_tables(results: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The five report tables (numeric columns; F1 in [0, 1] or NaN)."""
    res = results.copy()
    if "dataset_format" not in res.columns:
        res["dataset_format"] = ""
    net = res[(res["probe"] == "net") & (res["variant"] == "all")]
    t4 = _order(net[[*_KEYS, "f1", "baseline_f1", "count"]].rename(columns={"baseline_f1": "f1_random_guess"}),
                _KEYS)
    return {
        "table2": _net_memorization(res, entity_lists=False),
        "table3": _net_memorization(res, entity_lists=True),
        "table4": t4,
        "table5": _ner(res, values(NerVariant)),
        "table6": _ner(res, (NerVariant.AS_IS.value,)).rename(columns={"f1_as_is_mean": "f1_mean", "f1_as_is_std": "f1_std"}),
    }


def _fmt(x: object) -> str:
    if isinstance(x, (float, np.floating)):
        return "-" if np.isnan(x) else f"{x:.2f}"
    return html.escape(str(x))


def _display(df: pd.DataFrame) -> pd.DataFrame:
    """Merge ``*_mean``/``*_std`` pairs into "0.68 ± 0.04" cells."""
    out = pd.DataFrame(index=df.index)
    for c in df.columns:
        if c.endswith("_std") and c[:-4] + "_mean" in df.columns:
            continue
        if c.endswith("_mean") and c[:-5] + "_std" in df.columns:
            m, s = df[c], df[c[:-5] + "_std"]
            out[c[:-5]] = [("-" if np.isnan(a) else f"{a:.2f} ± {b:.2f}") for a, b in zip(m, s)]
        else:
            out[c] = [_fmt(v) for v in df[c]]
    return out


def lm_report_section(results: pd.DataFrame, tables: Mapping[str, pd.DataFrame] | None = None) -> str:
    """An HTML ``<section>`` with the five tables (for embedding in the project's report)."""
    tables = tables or lm_tables(results)
    parts = ['<section id="lm-probes">', "<h2>Named-entity probes of causal language models</h2>"]
    for key, title in TABLE_TITLES.items():
        t = tables.get(key)
        parts.append(f'<h3 id="lm-{key}">{html.escape(title)}</h3>')
        if t is None or t.empty:
            parts.append("<p>(no rows: probe not run or no data of this kind)</p>")
            continue
        parts.append(_display(t).to_html(index=False, escape=False, border=0, classes="data"))
    parts.append("</section>")
    return "\n".join(parts)
