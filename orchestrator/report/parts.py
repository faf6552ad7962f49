"""Small pieces the report's optional sections share (privacy, attacks, canaries): one way to write a
figure and to render a table, so every section's files are written atomically and escaped alike."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["save_png", "html_table", "img_tag", "paragraph", "section_html"]


def save_png(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Render a standalone matplotlib ``Figure`` (no pyplot: global backend state stays alone) to ``path``
    atomically, creating its folder."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from iclmem.atomic import atomic_write

    FigureCanvasAgg(fig)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda handle: fig.savefig(handle, dpi=dpi, format="png"))


def html_table(table: pd.DataFrame) -> str:
    """A plain HTML table of ``table``'s columns and rows, every cell escaped."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                   for row in table.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def img_tag(figure_dir: str | Path, figure: Path, alt: str) -> str:
    """An <img> for ``figure`` (written in ``figure_dir``), by a path relative to the page's folder (taken
    to be ``figure_dir``'s parent)."""
    return f'<img src="{html.escape(f"{Path(figure_dir).name}/{figure.name}")}" alt="{html.escape(alt)}">'


def paragraph(text: str) -> str:
    """A <p> of plain ``text``, escaped."""
    return f"<p>{html.escape(text)}</p>"


def section_html(heading: str, blocks: Sequence[str], figure_dir: str | Path, figure: Path | None, alt: str) -> str:
    """An optional section of the report: its heading, its HTML ``blocks`` (paragraphs, tables) and, when
    one was written, its figure."""
    parts = [f"<h2>{html.escape(heading)}</h2>", *blocks]
    if figure is not None:
        parts.append(img_tag(figure_dir, figure, alt))
    return "\n".join(parts)
