"""The relevance graph (:class:`rulegraph.layergraph.RelevanceGraph`) drawn as a layered flow diagram:
one row per hidden state (the embeddings at the bottom, the last block at the top), one column per
token; a node's disc is its relevance N[l, p] (area ∝ |N|, red for the output, blue against), a line
from a key in one row to a query in the next is an attention edge E (width ∝ |E|; per block the
strongest :data:`~rulegraph.layergraph.TOP_EDGES`), the faint verticals the position-local path
(residual, MLP). As self-contained SVG in a page (``rulegraph explain --graph out.html``) and as PNG
(matplotlib, ``--graph out.png``)."""
from __future__ import annotations

import html
import math

from .colour import NEGATIVE, POSITIVE

COLUMN, ROW, MARGIN, LEFT, RADIUS = 78, 96, 30, 130, 16


def _layout(g, item: int):
    """What both drawings read: the nodes, their count, the largest |N|, the strongest edges, the largest |E|, the
    tokens."""
    nodes = g.nodes[item]
    layers, positions = nodes.shape
    top = max(float(nodes.abs().max()), 1e-300)
    links = [(p["block"], p["query"], p["key"], p["relevance"]) for p in g.paths(item)]
    strongest = max([abs(w) for *_, w in links] or [1e-300]) or 1e-300
    return nodes, layers, positions, top, links, strongest, g.names(item)


def _xy(layers: int, layer: int, position: int) -> tuple[float, float]:
    return LEFT + position * COLUMN, MARGIN + 20 + (layers - 1 - layer) * ROW


def _rgb(value: float) -> str:
    return "rgb{}".format(POSITIVE if value >= 0 else NEGATIVE)


def svg(g, item: int = 0) -> str:
    """The diagram as an ``<svg>`` element (each node and edge titled with its figures)."""
    nodes, layers, positions, top, links, strongest, tokens = _layout(g, item)
    width, height = LEFT + positions * COLUMN + MARGIN, 2 * MARGIN + 2 * RADIUS + 60 + (layers - 1) * ROW
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="system-ui,sans-serif" font-size="12">']
    for p in range(positions):          # the position-local path
        x, y0 = _xy(layers, 0, p)
        parts.append(f'<line x1="{x}" y1="{y0}" x2="{x}" y2="{_xy(layers, layers - 1, p)[1]}" stroke="#ccc" '
                     'stroke-width="1"/>')
    for b, q, k, w in links:
        (x1, y1), (x2, y2) = _xy(layers, b, k), _xy(layers, b + 1, q)
        parts.append(f'<line class="edge" x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{_rgb(w)}" '
                     f'stroke-opacity="0.7" stroke-width="{0.5 + 7 * abs(w) / strongest:.2f}">'
                     f'<title>block {b}: {html.escape(tokens[q])} (query {q}) → {html.escape(tokens[k])} (key {k}): '
                     f'{w:+.4g}</title></line>')
    for layer in range(layers):
        y = _xy(layers, layer, 0)[1]
        parts.append(f'<text x="{LEFT - 30}" y="{y + 4}" text-anchor="end">{html.escape(g.layers[layer])}</text>')
        for p in range(positions):
            x, _ = _xy(layers, layer, p)
            value = float(nodes[layer, p])
            r = max(1.5, RADIUS * math.sqrt(abs(value) / top))
            parts.append(f'<circle class="node" cx="{x}" cy="{y}" r="{r:.2f}" fill="{_rgb(value)}">'
                         f'<title>{html.escape(g.layers[layer])}, {html.escape(tokens[p])} (position {p}): '
                         f'{value:+.4g}</title></circle>')
    y = _xy(layers, 0, 0)[1] + RADIUS + 18
    for p, t in enumerate(tokens):
        x = _xy(layers, 0, p)[0]
        parts.append(f'<text x="{x}" y="{y}" text-anchor="end" transform="rotate(-35 {x} {y})">'
                     f'{html.escape(t.strip() or repr(t))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def page(g, model: str = "", item: int = 0) -> str:
    """A self-contained page: the diagram, what it shows, and per block the strongest edges."""
    from .page import _legend, _page, _prose
    tokens = g.names(item)
    rows = "".join(f"<tr><td>{p['block']}</td><td>{html.escape(tokens[p['query']])} ({p['query']})</td>"
                   f"<td>{html.escape(tokens[p['key']])} ({p['key']})</td><td>{p['relevance']:+.4g}</td>"
                   f"<td>{'' if p['share'] is None else format(p['share'], '.1%')}</td><td>{p['head']}</td></tr>"
                   for p in g.paths(item))
    absorbed = "" if g.absorbed is None else "; absorbed per block " + ", ".join(f"{a:+.3g}" for a in g.absorbed)
    body = (f'<div class="rulegraph"><h1>relevance graph{": " + html.escape(model) if model else ""}</h1>'
            + _legend() +
            "<p>" + _prose(f"Discs: the relevance at each hidden state and position (area ∝ |R|). Lines: per block "
                           f"the strongest attention edges from a query (row above) to a key (row below), the "
                           f"value product's LRP message E[q, k] = Σ_d P[q,k]·V[k,d]/O[q,d]·R_O[q,d] summed over "
                           f"heads; grey verticals: the position-local path (residual, MLP). Explained value "
                           f"{g.output[item]:+.4g}{absorbed} (docs/inside.md).") + "</p>"
            + '<div style="overflow-x:auto">' + svg(g, item) + "</div>" +
            "<table><tr><th>block</th><th>query</th><th>key</th><th>E</th><th>share of the query's attention"
            f"</th><th>strongest head</th></tr>{rows}</table></div>")
    return _page(f"relevance graph {model}", body, wide=True)


def figure(g, item: int = 0):
    """The diagram as a matplotlib figure."""
    from .figure import _pyplot
    plt = _pyplot()
    nodes, layers, positions, top, links, strongest, tokens = _layout(g, item)
    fig, ax = plt.subplots(figsize=(min(2.5 + 0.9 * positions, 20), 1.5 + 1.2 * layers))
    colour = {True: tuple(c / 255 for c in POSITIVE), False: tuple(c / 255 for c in NEGATIVE)}
    for p in range(positions):
        ax.plot([p, p], [0, layers - 1], color="#cccccc", linewidth=0.8, zorder=0)
    for b, q, k, w in links:
        ax.plot([k, q], [b, b + 1], color=colour[w >= 0], alpha=0.7, linewidth=0.4 + 5 * abs(w) / strongest, zorder=1)
    for layer in range(layers):
        values = [float(nodes[layer, p]) for p in range(positions)]
        ax.scatter(range(positions), [layer] * positions, s=[max(4.0, 500 * abs(v) / top) for v in values],
                   c=[colour[v >= 0] for v in values], zorder=2)
    ax.set_xticks(range(positions), [t.strip() or repr(t) for t in tokens], rotation=40, ha="right", fontsize=9)
    ax.set_yticks(range(layers), g.layers, fontsize=9)
    ax.set_xlim(-0.7, positions - 0.3)
    ax.set_ylim(-0.6, layers - 0.4)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"relevance graph: value {g.output[item]:+.4g}; discs R per position, lines attention edges",
                 fontsize=10)
    fig.tight_layout()
    return fig
