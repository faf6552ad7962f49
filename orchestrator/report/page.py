"""The report pages' look: the shell around the sections (the HTML head with its style and image-check script,
the title) and the blocks a section is written with (a formatted cell, a data table, a note, TPR@1% with its
caveat). One look for ``report.html``, ``lm_report.html`` and the context-only report."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from iclmem.record import INTEGER_COLUMNS
from probes.metrics import allowed_false_positives

__all__ = ["page", "fmt_value", "df_to_html", "note_html", "tpr_1pct_display"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em;color:#222;max-width:1400px}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table.data{border-collapse:collapse;font-size:13px;margin:.5em 0}
table.data th,table.data td{border:1px solid #ddd;padding:3px 7px;text-align:right}
table.data th{background:#f3f3f3} table.data tr:nth-child(even) td{background:#fafafa}
.note{color:#8a5a00;background:#fff7e0;border-left:4px solid #f0b400;padding:.4em .8em}
.scroll{overflow-x:auto;max-width:100%}
.caption{color:#555;font-size:13px} figure{margin:1em 0} figure img{max-width:100%;border:1px solid #eee}
dl.prov{display:grid;grid-template-columns:max-content auto;gap:2px 12px;font-size:13px}
dl.prov dt{font-weight:600} dl.prov dd{margin:0;font-family:monospace}
#summary{background:#f6f8fb;border:1px solid #d8dee8;padding:.2em 1.2em 1em}
p.verdict{font-size:18px} .warn{color:#9a2a00} table.data td.text{text-align:left;white-space:normal}
dl.defs dt{font-weight:600;margin-top:.5em} dl.defs dd{margin:0 0 0 1.5em;max-width:70em}
input.filter{margin:.5em 0 0;padding:3px 6px;width:28em;font-size:13px}
"""

# Sets data-img-total / data-img-loaded on <body> once every image has loaded (or failed), and each image's
# decoded size as data-size, so a headless browser can check that the page is complete and what it drew
# (`chromium --dump-dom`).
_IMG_CHECK_JS = """
window.addEventListener('load', function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) {
    imgs[i].setAttribute('data-size', imgs[i].naturalWidth + 'x' + imgs[i].naturalHeight);
    if (imgs[i].complete && imgs[i].naturalWidth > 0) { ok++; imgs[i].setAttribute('data-loaded', '1'); }
    else { imgs[i].setAttribute('data-loaded', '0'); }
  }
  document.body.setAttribute('data-img-total', String(imgs.length));
  document.body.setAttribute('data-img-loaded', String(ok));
});
"""


# Tables of more than FILTER_ROWS rows get a filter box (rows kept that contain every word typed, in any cell) and
# every table's headers sort on a click (numbers as numbers, blanks last; a second click reverses): with hundreds of
# runs, finding one run or the leaking ones must not mean scrolling. Plain script, nothing fetched.
FILTER_ROWS = 15
_TABLE_JS = """
window.addEventListener('DOMContentLoaded', function () {
  var tables = document.querySelectorAll('table.data');
  tables.forEach(function (table) {
    var body = table.tBodies[0]; if (!body) return;
    var rows = Array.prototype.slice.call(body.rows);
    if (rows.length > FILTER_ROWS) {
      var box = document.createElement('input');
      box.type = 'search'; box.className = 'filter';
      box.placeholder = 'filter these ' + rows.length + ' rows (words in any cell)';
      box.addEventListener('input', function () {
        var words = box.value.toLowerCase().split(/\\s+/).filter(Boolean), shown = 0;
        rows.forEach(function (r) {
          var text = r.textContent.toLowerCase();
          var keep = words.every(function (w) { return text.indexOf(w) >= 0; });
          r.style.display = keep ? '' : 'none'; if (keep) shown++;
        });
        box.setAttribute('data-shown', String(shown));
      });
      table.parentNode.parentNode.insertBefore(box, table.parentNode);
    }
    Array.prototype.forEach.call(table.tHead ? table.tHead.rows[0].cells : [], function (th, col) {
      th.title = 'sort'; th.style.cursor = 'pointer';
      th.addEventListener('click', function () {
        var up = th.getAttribute('data-sorted') !== 'up';
        Array.prototype.forEach.call(th.parentNode.cells, function (c) { c.removeAttribute('data-sorted'); });
        th.setAttribute('data-sorted', up ? 'up' : 'down');
        var key = function (r) { var t = r.cells[col] ? r.cells[col].textContent.trim() : '';
                                 var n = parseFloat(t); return t === '' ? null : (isNaN(n) || !/^[-+.\\d]/.test(t) ? t : n); };
        rows.sort(function (a, b) {
          var x = key(a), y = key(b);
          if (x === null) return 1; if (y === null) return -1;
          var c = (typeof x === typeof y) ? (x < y ? -1 : x > y ? 1 : 0) : (typeof x === 'number' ? -1 : 1);
          return up ? c : -c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
});
""".replace("FILTER_ROWS", str(FILTER_ROWS))


def page(title: str, parts: Iterable[str]) -> str:
    """The report page around its sections: one style for the tabular and the LM report."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f"<script>{_IMG_CHECK_JS}{_TABLE_JS}</script></head>"
        f"<body><h1>{html.escape(title)}</h1>{''.join(parts)}</body></html>\n"
    )


def fmt_value(col: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        if col == "lr" or col.endswith(("_pvalue", "p_value", "p_value_threshold")):  # 2e-7 must not read 0.000
            return f"{float(v):.3g}"
        if float(v).is_integer() and col in (*INTEGER_COLUMNS, "n_rows", "n_classes"):
            return str(int(v))
        return f"{float(v):.3f}"
    return str(v)


def df_to_html(df: pd.DataFrame, *, index: bool = False) -> str:
    """A small, escaped HTML table (floats to 3 decimals, learning rates in %g)."""
    d = df.reset_index() if index else df
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in d.columns)
    body = []
    for row in d.itertuples(index=False, name=None):
        cells = "".join(f"<td>{html.escape(fmt_value(str(c), v))}</td>" for c, v in zip(d.columns, row))
        body.append(f"<tr>{cells}</tr>")
    return f'<div class="scroll"><table class="data"><thead><tr>{head}</tr></thead>' \
           f'<tbody>{"".join(body)}</tbody></table></div>'


def note_html(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def tpr_1pct_display(df: pd.DataFrame) -> pd.DataFrame:
    """``tpr_at_1pct`` as text with "0 FP allowed" beside every value that rests on fewer than 100
    non-members (⌊0.01·n⌋ = 0), so the number is never read without its caveat."""
    if "tpr_at_1pct" not in df.columns:
        return df
    n = df["n_nonmembers"] if "n_nonmembers" in df.columns else df["q"] if "q" in df.columns else None
    if n is None:
        return df
    out = df.copy()
    cells = []
    for v, k in zip(out["tpr_at_1pct"], n):
        text = fmt_value("tpr_at_1pct", v)
        if text and pd.notna(k) and allowed_false_positives(0.01, int(k)) == 0:  # fewer than 100 non-members
            text += f" (0 FP allowed: {int(k)} non-members)"
        cells.append(text)
    out["tpr_at_1pct"] = cells
    return out
