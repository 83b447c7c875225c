"""The report page: `index.html` with the headline table, the outcomes table (the verifier's
reward beside the one the trainer used) and one <figure> per PNG.

Every figure element carries `data-figure` (its key, also the PNG's name),
`data-points` (data points drawn; 0 = a "no data" panel) and `data-empty`
("true"/"false"), so a browser test can tell an empty figure from a drawn one
without reading pixels. Self-contained: images are relative paths beside the page.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from rollstream.report.figures import Figure
from rollstream.report.tables import OUTCOME_CAPTION

STYLE = """body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}
td,th{padding:2px 12px;border-bottom:1px solid #ddd}th{text-align:left}
table.outcomes{margin-top:1em}table.outcomes td+td{text-align:right}figure{margin:1.5em 0}
caption{text-align:left;font-size:0.9em;color:#555}
img{max-width:100%;border:1px solid #eee}figcaption{font-size:0.9em;color:#555}
.nodata figcaption{color:#a00}code{background:#f4f4f4;padding:0 4px}"""


def figure_html(figure: Figure, src: str) -> str:
    empty = figure.points == 0
    caption = f"no data: {figure.empty_reason}" if empty else "; ".join(figure.notes) or figure.title
    return (
        f'<figure class="{"nodata" if empty else "drawn"}" data-figure="{html.escape(figure.key)}" '
        f'data-points="{figure.points}" data-empty="{str(empty).lower()}">'
        f'<img src="{html.escape(src)}" alt="{html.escape(figure.title)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def table_html(rows: Mapping[str, str]) -> str:
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows.items())
    return f'<table class="summary">{body}</table>'


def grid_html(columns: Sequence[str], rows: Sequence[Sequence[str]], css_class: str, caption: str) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in rows)
    return (
        f'<table class="{css_class}"><caption>{html.escape(caption)}</caption><tr>{head}</tr>{body}</table>'
    )


def page_html(
    run_id: str,
    source: str,
    summary: Mapping[str, str],
    figures: Sequence[tuple[Figure, str]],
    outcomes: tuple[Sequence[str], Sequence[Sequence[str]]] = ((), ()),
) -> str:
    """The whole page; `figures` are (figure, PNG path relative to the page), `outcomes` the
    outcomes table's (columns, rows)."""
    run = html.escape(run_id)
    body = "\n".join(figure_html(figure, src) for figure, src in figures)
    columns, rows = outcomes
    outcome_table = grid_html(columns, rows, "outcomes", OUTCOME_CAPTION) if rows else ""
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>Rollstream run {run}</title><style>{STYLE}</style></head><body>
<h1>Run {run}</h1>
<p>Every figure is queried from the SQL event store (<code>{html.escape(source)}</code>);
ask more with <code>rollstream sql "SELECT * FROM trajectories WHERE run_id = '{run}'"</code>.</p>
{table_html(summary)}
{outcome_table}
{body}
</body></html>
"""
