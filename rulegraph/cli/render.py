"""Showing explanations: coloured tokens and audit tables in the terminal (rich), and a
self-contained HTML heatmap page with the per-layer conservation chart."""
from __future__ import annotations

import html
import os

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..audit import Audit
from ..explanation import Explanation

POSITIVE = (220, 50, 47)    # relevance for the explained output
NEGATIVE = (38, 110, 210)   # relevance against it


def display_tokens(tokens: list[str]) -> list[str]:
    """Token strings as a reader expects them: WordPiece ``##`` joins, BPE ``Ġ``/``▁`` spaces."""
    bpe = any(t.startswith(("Ġ", "▁")) for t in tokens)
    out = []
    for i, t in enumerate(tokens):
        if t.startswith("##"):
            out.append(t[2:])
        elif t.startswith(("Ġ", "▁")):
            out.append(" " + t[1:])
        else:
            out.append(t if bpe or not i else " " + t)
    return out


def shade(score: float, scale: float) -> tuple[int, int, int]:
    """Background colour: white at 0, saturated at ±scale."""
    a = 0.0 if scale <= 0 else min(abs(score) / scale, 1.0)
    base = POSITIVE if score >= 0 else NEGATIVE
    return tuple(round(255 + (c - 255) * a) for c in base)


def ink(background: tuple[int, int, int]) -> str:
    """Black or white, whichever reads better on ``background`` (WCAG relative luminance)."""
    def linear(c: int) -> float:
        c = c / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(c) for c in background)
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.18 else "white"


def colour_scale(scores: list[float], special: list[bool]) -> float:
    """The |score| shown saturated: the largest over the ordinary tokens, or over all when only
    special tokens carry relevance."""
    ordinary = [abs(s) for s, sp in zip(scores, special) if not sp]
    return max(ordinary, default=0.0) or max((abs(s) for s in scores), default=0.0)


def heatmap_text(tokens: list[str], scores: list[float], special: list[bool] | None = None) -> Text:
    special = special or [False] * len(tokens)
    scale = colour_scale(scores, special)
    text = Text()
    for tok, score, sp in zip(display_tokens(tokens), scores, special):
        colour = shade(score, scale)
        lead = " " if tok.startswith(" ") else ""
        text.append(lead)
        text.append(tok.lstrip(" "), style=f"{'underline ' if sp else ''}{ink(colour)} on rgb{colour}")
    return text


def mass_note(tokens: list[str], scores: list[float], special: list[bool] | None) -> str | None:
    """Where the relevance mass is, when the special tokens ([CLS], [SEP]…) hold a large share of it:
    the words for and against the output then tell only part of the story."""
    special = special or [False] * len(tokens)
    total = sum(abs(s) for s in scores)
    held = [(t, s) for t, s, sp in zip(tokens, scores, special) if sp and s]
    share = sum(abs(s) for _, s in held) / total if total else 0.0
    if share < 0.25:
        return None
    listed = ", ".join(f"{t} {s:+.3g}" for t, s in sorted(held, key=lambda ts: -abs(ts[1]))[:3])
    return (f"special tokens hold {share:.0%} of |relevance| ({listed}; Σ all tokens {sum(scores):+.3g})")


def words(tokens: list[str], scores: list[float], special: list[bool]) -> list[tuple[str, float]]:
    """Tokens merged into words (WordPiece ``##`` pieces; BPE pieces without a ``Ġ``/``▁``
    space marker), each with the sum of its tokens' scores; special tokens left out."""
    bpe = any(t.startswith(("Ġ", "▁")) for t in tokens)
    merged: list[list | None] = []
    for raw, score, sp in zip(tokens, scores, special):
        continues = raw.startswith("##") or (bpe and not raw.startswith(("Ġ", "▁")))
        piece = raw[2:] if raw.startswith("##") else raw.lstrip("Ġ▁")
        if sp:
            merged.append(None)
        elif continues and merged and merged[-1] is not None:
            merged[-1][0] += piece
            merged[-1][1] += score
        else:
            merged.append([piece, score])
    return [(w, s) for w, s in filter(None, merged)]


def top_tokens(tokens: list[str], scores: list[float], special: list[bool] | None = None, k: int = 5) -> Text:
    """The ``k`` most relevant words for and against the output, with their scores."""
    ranked = sorted(words(tokens, scores, special or [False] * len(tokens)), key=lambda ws: ws[1])
    text = Text("for: ", style="bold")
    text.append(", ".join(f"{w} {s:+.3g}" for w, s in reversed(ranked[-k:]) if s > 0) or "—")
    text.append("   against: ", style="bold")
    text.append(", ".join(f"{w} {s:+.3g}" for w, s in ranked[:k] if s < 0) or "—")
    return text


def fmt(x: float) -> str:
    return f"{x:+.4g}"


def explained_name(e: Explanation, item: int = 0) -> str:
    """``logits[7]``; with a contrast ``logits[7] − logits[9]``; for a log-probability without a
    contrast ``logits[7] − Σ p·logits`` (p held constant); an objective as written, linearised."""
    if "objective" in e.extra:
        held = " (p held constant)" if "logprob" in e.extra["objective"] else ""
        return f"{e.output}: {e.extra['objective']}{held}"
    name = f"{e.output}[{e.target[item]}]"
    if e.contrast is not None:
        return f"{name} − {e.output}[{e.contrast[item]}]"
    if e.score == "logprob":
        return f"{name} − Σ p·{e.output} (p held constant)"
    return name


def summary_table(e: Explanation, item: int = 0) -> Table:
    """The explained output and the graph-level conservation figures."""
    t = Table(title="conservation", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column(justify="right")
    label = e.labels[e.target[item]] if e.labels and e.target[item] < len(e.labels) else str(e.target[item])
    shown = "" if "objective" in e.extra else f"  ({label})"
    t.add_row("explained", escape(f"{explained_name(e, item)} = {e.output_value[item]:.6g}{shown}"))
    if "objective" in e.extra:
        t.add_row("objective's value", f"{e.extra['objective_value'][item]:.6g}")
    if "logprob" in e.extra:
        name = "log p[target] − log p[contrast]" if e.contrast is not None else "log p[target]"
        t.add_row(escape(name), f"{e.extra['logprob'][item]:.6g}")
    if e.audit is not None:
        c = e.audit.conservation
        flag = "[green]ok[/]" if e.audit.ok else "[red]FLAGGED[/]"
        t.add_row("Σ relevance at inputs", fmt(c.input_total))
        t.add_row("absorbed (biases, constants, ε)", fmt(c.absorbed))
        t.add_row("expected breaks (by rule design)", f"{fmt(c.breaks)}  in {len(e.audit.expected)} node(s)")
        t.add_row("unexplained residual", f"{fmt(c.residual)}  rel {c.relative_error:.2e} {flag}")
        if c.stranded:
            t.add_row("stranded (no rule)", escape(", ".join(f"{k}: {fmt(v)}" for k, v in c.stranded.items())))
        if e.audit.unexpected:
            t.add_row("unexpected breaks", f"[red]{len(e.audit.unexpected)} conserving node(s) off by > "
                                           f"{e.audit.tolerance:g}[/] (see `rulegraph audit`)")
        else:
            t.add_row("unexpected breaks", f"[green]none[/] (every conserving node within {e.audit.tolerance:g})")
    return t


def layers_table(audit: Audit) -> Table:
    t = Table(title="per layer (Σ over the batch)")
    for col in ("layer", "relevance in", "relevance out", "absorbed", "breaks", "rel. error", "nodes"):
        t.add_column(col, justify="left" if col == "layer" else "right")
    for layer in audit.layers:
        t.add_row(escape(layer.name), fmt(layer.relevance_in), fmt(layer.relevance_out), fmt(layer.absorbed),
                  fmt(layer.breaks), f"{layer.relative_error:.1e}", str(layer.nodes))
    return t


def experts_table(audit: Audit) -> Table:
    """Per mixture-of-experts block, the relevance each expert received and how many positions picked it."""
    experts = max((len(x.relevance) for x in audit.experts), default=0)
    t = Table(title="relevance per expert (Σ over positions; in brackets: positions that picked it)")
    t.add_column("layer")
    for e in range(experts):
        t.add_column(f"expert {e}", justify="right")
    for x in audit.experts:
        t.add_row(escape(x.layer), *(f"{fmt(r)} [dim]({k})[/]" for r, k in zip(x.relevance, x.tokens)))
    return t


def short_names(names: list[str]) -> dict[str, str]:
    """Node names without the path prefix they all share (``/model/bert/encoder/``)."""
    prefix = os.path.commonprefix(names) if len(names) > 1 else ""
    cut = prefix.rfind("/") + 1
    return {n: n[cut:] or n for n in names}


def nodes_table(audit: Audit, limit: int | None = 25) -> Table:
    """Nodes ordered by how much relevance they absorbed, broke or lost."""
    nodes = sorted(audit.nodes, key=lambda n: -(abs(n.absorbed) + abs(n.breaks) + abs(n.error)))
    shown = nodes if limit is None else nodes[:limit]
    names = short_names([n.name for n in audit.nodes])
    t = Table(title=f"per node ({len(shown)} of {len(nodes)}, largest absorbed/breaks/errors first)")
    for col in ("node", "op", "rule", "in", "out", "absorbed", "breaks", "rel. error"):
        t.add_column(col, justify="left" if col in ("node", "op", "rule") else "right", overflow="fold")
    for n in shown:
        err = f"{n.relative_error:.1e}" if n.conserving else "—"
        if n.conserving and n.relative_error > audit.tolerance:
            err = f"[red]{err}[/]"
        line = n.where.rsplit(":", 1)[-1]
        t.add_row(escape(names[n.name]), escape(n.op), f"{escape(n.rule)} [dim]:{escape(line)}[/]", fmt(n.relevance_in), fmt(n.relevance_out),
                  fmt(n.absorbed), fmt(n.breaks), err)
    return t


# -- HTML ------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:2em;border-top:1px solid #ddd;padding-top:1em}
.tokens{font-size:1.1em;line-height:1.2em}
.tok{display:inline-block;text-align:center;padding:.2em .25em;margin:.1em 0;border-radius:3px}
.tok small{display:block;font-size:.62em;opacity:.85;color:inherit} .special{outline:1px dashed #888}
.note{background:#fff6d6;padding:.3em .6em;border-radius:3px}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}
td,th{padding:.2em .7em;text-align:right;border-bottom:1px solid #eee} td:first-child,th:first-child{text-align:left}
.ok{color:#2a7} .bad{color:#c22;font-weight:bold} .legend span{padding:.1em .5em;margin-right:.4em}
small{color:#666}
"""


def _span(tok: str, score: float, scale: float, special: bool) -> str:
    """A token with its score printed under it, on its colour, in the ink that reads on it."""
    colour = shade(score, scale)
    lead = " " if tok.startswith(" ") else ""
    cls = "tok special" if special else "tok"
    return (f'{lead}<span class="{cls}" style="background:rgb{colour};color:{ink(colour)}" '
            f'title="{score:+.6g}">{html.escape(tok.lstrip(" "))}<small>{score:+.2g}</small></span>')


def _layer_chart(audit: Audit) -> str:
    """Grouped horizontal bars per layer: relevance in, out, absorbed, breaks (inline SVG)."""
    series = [("in", "#555"), ("out", "#999"), ("absorbed", "#d4a017"), ("breaks", "#c22")]
    rows = [(layer.name, [layer.relevance_in, layer.relevance_out, layer.absorbed, layer.breaks])
            for layer in audit.layers]
    scale = max((abs(v) for _, vals in rows for v in vals), default=1.0) or 1.0
    bar, gap, label_w, half = 7, 10, 90, 220
    height = len(rows) * (4 * bar + gap) + 30
    axis_y = height - 20
    height += 16
    parts = [f'<svg width="{label_w + 2 * half + 40}" height="{height}" font-size="11">',
             f'<line x1="{label_w + half}" y1="0" x2="{label_w + half}" y2="{axis_y}" stroke="#aaa"/>',
             f'<line x1="{label_w}" y1="{axis_y}" x2="{label_w + 2 * half}" y2="{axis_y}" stroke="#aaa"/>']
    for frac in (-1, -0.5, 0, 0.5, 1):       # the axis: relevance, one scale for every bar
        x = label_w + half + frac * half
        parts.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 4}" stroke="#aaa"/>'
                     f'<text x="{x:.1f}" y="{axis_y + 14}" text-anchor="middle">{frac * scale:+.3g}</text>')
    y = 5
    for name, vals in rows:
        parts.append(f'<text x="0" y="{y + 2 * bar + 3}">{html.escape(name)}</text>')
        for (label, colour), v in zip(series, vals):
            w = abs(v) / scale * half
            x = label_w + half - (w if v < 0 else 0)
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{bar - 1}" fill="{colour}">'
                         f'<title>{label}: {v:+.4g}</title></rect>')
            y += bar
        y += gap
    legend_x = label_w
    for label, colour in series:
        parts.append(f'<rect x="{legend_x}" y="{height - 12}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{legend_x + 14}" y="{height - 3}">{label}</text>')
        legend_x += 80
    parts.append("</svg>")
    return "".join(parts)


def html_report(items: list[tuple[Explanation, list[str] | None, list[bool] | None, str | None]],
                model: str) -> str:
    """A self-contained page: per explanation the heatmap, the conservation figures and the layer chart."""
    body = [f"<h1>rulegraph explanation</h1><p><small>model {html.escape(model)}</small></p>",
            '<p class="legend"><span style="background:rgb(220,50,47);color:#fff">for the output</span>'
            '<span style="background:rgb(38,110,210);color:#fff">against it</span></p>']
    for i, (e, tokens, special, text) in enumerate(items):
        key = next(iter(e.relevance))
        scores = e.scores(key)
        tokens = tokens or [str(k) for k in range(len(scores))]
        special = special or [False] * len(tokens)
        scale = colour_scale(scores, special)
        label = e.labels[e.target[0]] if e.labels and e.target[0] < len(e.labels) else str(e.target[0])
        body.append(f"<h2>{i + 1}. {html.escape(text or '')}</h2>")
        body.append(f"<p>explained <b>{html.escape(explained_name(e))} = {e.output_value[0]:.5g}</b> "
                    f"({html.escape(label)}) with rules <code>{html.escape(e.rules)}</code>; scores from "
                    f"<code>{html.escape(key)}</code></p>")
        body.append('<p class="tokens">' + "".join(_span(t, s, scale, sp) for t, s, sp in
                                                  zip(display_tokens(tokens), scores, special)) + "</p>")
        note = mass_note(tokens, scores, special)
        if note:
            body.append(f'<p class="note">{html.escape(note)}</p>')
        if e.audit is not None:
            c = e.audit.conservation
            status = ('<span class="ok">within tolerance</span>' if e.audit.ok
                      else '<span class="bad">FLAGGED</span>')
            body.append("<table><tr><th>conservation</th><th></th></tr>"
                        f"<tr><td>explained output</td><td>{c.output_value:+.5g}</td></tr>"
                        f"<tr><td>Σ relevance at inputs</td><td>{c.input_total:+.5g}</td></tr>"
                        f"<tr><td>absorbed</td><td>{c.absorbed:+.5g}</td></tr>"
                        f"<tr><td>breaks</td><td>{c.breaks:+.5g}</td></tr>"
                        f"<tr><td>unexplained residual</td><td>{c.residual:+.3g} (rel {c.relative_error:.1e}, "
                        f"{status})</td></tr></table>")
            body.append("<p><small>relevance per layer, summed over the layer's border (in: from the layer "
                        "above, out: to the layer below), what its constants absorbed and what its "
                        "non-conservative rules broke; bars share one scale, positive to the right</small></p>")
            body.append(_layer_chart(e.audit))
    return f"<!doctype html><html><head><meta charset='utf-8'><title>rulegraph</title><style>{_CSS}</style></head>" \
           f"<body>{''.join(body)}</body></html>"
