"""Small plotly helpers so notebooks stay thin (tables without pandas)."""
from __future__ import annotations

from typing import Any, Sequence

import plotly.graph_objects as go


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def table(rows: Sequence[dict[str, Any]], title: str | None = None, columns: Sequence[str] | None = None):
    """A plotly Table figure from a list of dict rows (same keys)."""
    if not rows:
        raise ValueError("table() needs at least one row")
    cols = list(columns or rows[0].keys())
    cells = [[_fmt(r.get(c)) for r in rows] for c in cols]
    fig = go.Figure(go.Table(header=dict(values=cols, align="left"), cells=dict(values=cells, align="left")))
    fig.update_layout(title=title, height=min(120 + 28 * len(rows), 900), margin=dict(l=10, r=10, t=40, b=10))
    return fig


def text_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """The same rows as a fixed-width text table (for terminals and logs)."""
    if not rows:
        return "(no rows)"
    cols = list(columns or rows[0].keys())
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])
