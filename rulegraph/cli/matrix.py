"""An explained generation (:class:`rulegraph.generation.Generation`, decoder-only or
encoder–decoder) in the terminal: rows are the tokens a step can rely on, columns the generated
tokens. Each column is coloured on its own scale (its largest |relevance| saturated), since the
explained logits of different steps differ in size; rows after the first group (the generated or
target prefix) are marked with their group's name. The HTML page and the PNG are
:mod:`rulegraph.render` (``Generation.to_html``, ``Generation.plot``)."""
from __future__ import annotations

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..generation import Generation
from ..render.colour import css, ink, matrix_cells, scales, shade

#: the largest matrix drawn cell by cell in the terminal; larger ones show the per-step table only
TERMINAL_ROWS, TERMINAL_COLUMNS = 40, 16


def steps_table(g: Generation, k: int = 5) -> Table:
    """One line per generated token: its probability, the explained value, each row group's share,
    the audit's residual and the ``k`` rows it relied on most."""
    t = Table(title=escape(f"{g.method}: {len(g.steps)} generated token(s), {g.mode}"))
    shares = g.shares()
    columns = ("step", "token", "p", "explained", *(f"{group} share" for group in shares), "residual",
               f"top {k} rows (relevance)")
    for col in columns:
        t.add_column(col, justify="left" if col in ("token", columns[-1]) else "right", overflow="fold")
    rows = g.rows
    column_scales = scales(g)
    names = [f"{r!s}".strip() or repr(r) for r in rows]
    names = [f"{n}#{r + 1}" if names.count(n) > 1 else n for r, n in enumerate(names)]   # a token held twice: its row
    for i, s in enumerate(g.steps):
        top = sorted(range(len(s.scores)), key=lambda r: -s.scores[r])[:k]
        cell = Text()
        for r in top:
            colour = shade(s.scores[r], column_scales[i])
            cell.append(names[r], style=f"{ink(colour)} on {css(colour)}")
            cell.append(f" {s.scores[r]:+.3g}  ")
        residual = "" if s.residual is None else f"{s.residual:+.2e}"
        share = ["—" if x != x else f"{100 * x:.0f}%" for x in (float(v[i]) for v in shares.values())]
        t.add_row(str(i + 1), escape(repr(s.text)), f"{s.probability:.3g}", f"{s.output_value:.4g}",
                  *share, residual, cell)
    if g.span is not None:                       # the tokens as one objective: its own row, on its own scale
        top = sorted(range(len(g.span.scores)), key=lambda r: -g.span.scores[r])[:k]
        cell = Text()
        for r in top:
            colour = shade(g.span.scores[r], column_scales[-1])
            cell.append(names[r], style=f"{ink(colour)} on {css(colour)}")
            cell.append(f" {g.span.scores[r]:+.3g}  ")
        t.add_row("Σ", "the span", "", f"{g.span.output_value:.4g}", *([""] * len(shares)),
                  "" if g.span.residual is None else f"{g.span.residual:+.2e}", cell)
    return t


def matrix_table(g: Generation) -> Table | None:
    """The matrix cell by cell (rows × generated tokens), or ``None`` when it is too large to read."""
    if len(g.rows) > TERMINAL_ROWS or len(g.steps) > TERMINAL_COLUMNS:
        return None
    t = Table(title="relevance of each row token (rows) for each generated token (columns)")
    t.add_column("row")
    for header in g.drawn()[0]:                   # the step's number: a token generated twice is two columns
        number, _, token = header.partition(" ")
        t.add_column(escape(f"{number} {token.strip() or repr(token)}"), justify="right")
    for tok, group, cells in matrix_cells(g):
        t.add_row(escape(tok.strip() or repr(tok)) + (f" [dim]({group})[/]" if group != g.groups[0] else ""),
                  *("" if cell is None else Text(f"{cell[0]:+.2g}", style=f"{ink(cell[1])} on {css(cell[1])}")
                    for cell in cells))
    return t
