"""Showing an explained generation (:class:`rulegraph.generation.Generation`, decoder-only or
encoder–decoder): rows are the tokens a step can rely on, columns the generated tokens. In the
terminal (rich), as a self-contained HTML page, and as a PNG heatmap (matplotlib). Each column is
coloured on its own scale (its largest |relevance| saturated), since the explained logits of
different steps differ in size. Rows after the first group (the generated or target prefix) are
marked with their group's name."""
from __future__ import annotations

import html
import math
from pathlib import Path

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..generation import Generation
from .render import display_tokens, ink, shade

#: the largest matrix drawn cell by cell in the terminal; larger ones show the per-step table only
TERMINAL_ROWS, TERMINAL_COLUMNS = 40, 16


def _scales(g: Generation) -> list[float]:
    return [max((abs(x) for x in s.scores), default=0.0) or 1.0 for s in g.steps]


def steps_table(g: Generation, k: int = 5) -> Table:
    """One line per generated token: its probability, the explained value, each row group's share,
    the audit's residual and the ``k`` rows it relied on most."""
    t = Table(title=escape(f"{g.method}: {len(g.steps)} generated token(s), {g.mode}"))
    shares = g.shares()
    columns = ("step", "token", "p", "explained", *(f"{group} share" for group in shares), "residual",
               f"top {k} rows (relevance)")
    for col in columns:
        t.add_column(col, justify="left" if col in ("token", columns[-1]) else "right", overflow="fold")
    rows = display_tokens(g.rows)
    scales = _scales(g)
    for i, s in enumerate(g.steps):
        top = sorted(range(len(s.scores)), key=lambda r: -s.scores[r])[:k]
        cell = Text()
        for r in top:
            colour = shade(s.scores[r], scales[i])
            cell.append(f"{rows[r]!s}".strip() or repr(rows[r]), style=f"{ink(colour)} on rgb{colour}")
            cell.append(f" {s.scores[r]:+.3g}  ")
        residual = "" if s.residual is None else f"{s.residual:+.2e}"
        share = ["—" if x != x else f"{100 * x:.0f}%" for x in (float(v[i]) for v in shares.values())]
        t.add_row(str(i + 1), escape(display_tokens([s.text])[0]), f"{s.probability:.3f}", f"{s.output_value:.4g}",
                  *share, residual, cell)
    return t


def matrix_table(g: Generation) -> Table | None:
    """The matrix cell by cell (rows × generated tokens), or ``None`` when it is too large to read."""
    if len(g.rows) > TERMINAL_ROWS or len(g.steps) > TERMINAL_COLUMNS:
        return None
    t = Table(title="relevance of each row token (rows) for each generated token (columns)")
    t.add_column("row")
    for c in display_tokens(g.columns):
        t.add_column(escape(c.strip() or repr(c)), justify="right")
    for tok, group, cells in _rows(g):
        t.add_row(escape(tok.strip() or repr(tok)) + (f" [dim]({group})[/]" if group != g.groups[0] else ""),
                  *("" if cell is None else f"[{ink(cell[1])} on rgb{cell[1]}]{cell[0]:+.2g}[/]" for cell in cells))
    return t


def _rows(g: Generation):
    """Per matrix row: its token, its group, and per step ``(value, colour)`` or ``None`` where the
    step does not see the row (the row comes after the step's position)."""
    scales = _scales(g)
    for r, (tok, group) in enumerate(zip(display_tokens(g.rows), g.groups)):
        values = [float(g.matrix[r, c]) for c in range(len(g.steps))]
        yield tok, group, [None if math.isnan(x) else (x, shade(x, scales[c])) for c, x in enumerate(values)]


def html_page(g: Generation, model: str) -> str:
    """A self-contained page: the matrix as a coloured table (hover for exact values)."""
    head = "".join(f"<th><div>{html.escape(c)}</div></th>" for c in display_tokens(g.columns))
    body = []
    for tok, group, cells in _rows(g):
        tds = "".join('<td class="none"></td>' if cell is None else
                      f'<td style="background:rgb{cell[1]};color:{ink(cell[1])}" title="{cell[0]:+.6g}">{cell[0]:+.2g}</td>'
                      for cell in cells)
        body.append(f'<tr class="{group}"><th>{html.escape(tok)}</th>{tds}</tr>')
    steps = "".join(
        f"<tr><td>{i + 1}</td><td>{html.escape(display_tokens([s.text])[0])}</td><td>{s.probability:.3f}</td>"
        f"<td>{s.output_value:.5g}</td><td>{'' if s.residual is None else f'{s.residual:+.2e}'}</td></tr>"
        for i, s in enumerate(g.steps))
    prompt = html.escape(g.prompt or "")
    generated = html.escape(g.continuation or "")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>rulegraph generation</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ddd;padding:2px 5px}th div{writing-mode:vertical-rl;transform:rotate(180deg)}"
        f"td.none{{background:#f4f4f4}}tr.{g.groups[-1]} th{{font-style:italic}}.legend span{{padding:2px 6px;margin-right:6px}}"
        "</style></head><body>"
        f"<h1>rulegraph: explained generation</h1><p><small>model {html.escape(model)}, method "
        f"<code>{html.escape(g.method)}</code>, {g.mode}</small></p>"
        f"<p>prompt: <b>{prompt}</b><br>generated: <b>{generated}</b></p>"
        '<p class="legend"><span style="background:rgb(220,50,47);color:#fff">for the generated token</span>'
        '<span style="background:rgb(38,110,210);color:#fff">against it</span> each column on its own scale; '
        f"rows in italics: the {g.groups[-1]} prefix; grey: not an input of that step</p>"
        f"<table><tr><th>row \\ generated</th>{head}</tr>{''.join(body)}</table>"
        "<h2>steps</h2><table><tr><th>step</th><th>token</th><th>p</th><th>explained</th><th>residual</th></tr>"
        f"{steps}</table></body></html>")


def write_png(g: Generation, path: Path, title: str = "") -> Path:
    """The matrix as a heatmap: red for, blue against, each column scaled to its largest |relevance|,
    grey where a row is not an input of the step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    m = g.matrix.numpy() / np.array(_scales(g))[None, :]
    rows, cols = m.shape
    fig, ax = plt.subplots(figsize=(min(2 + 0.45 * cols, 14), min(1.5 + 0.22 * rows, 40)))
    cmap = matplotlib.colormaps["bwr"].copy()
    cmap.set_bad("#eeeeee")
    shown = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    every = max(1, rows // 60)
    labels = [t.strip() or repr(t) for t in display_tokens(g.rows)]
    ax.set_yticks(range(0, rows, every), [labels[r] for r in range(0, rows, every)], fontsize=8)
    ax.set_xticks(range(cols), [t.strip() or repr(t) for t in display_tokens(g.columns)], rotation=90, fontsize=8)
    if g.groups and g.groups[-1] != g.groups[0]:
        ax.axhline(g.groups.index(g.groups[-1]) - 0.5, color="black", linewidth=0.8)
    ax.set_xlabel("generated token")
    ax.set_ylabel(" and ".join(dict.fromkeys(g.groups)) + " tokens")
    ax.set_title(title or f"{g.method}: relevance per generated token", fontsize=10)
    fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04, label="relevance / column's max |relevance|")
    from ..files import save_figure
    try:
        return save_figure(fig, Path(path), "the heatmap", dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
