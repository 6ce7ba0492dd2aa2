"""Self-contained HTML: an explanation (the tokens on their colours with each score, the
conservation figures in words, the per-layer chart), several on one page, and a generation's
matrix. ``Explanation._repr_html_`` and ``rulegraph explain --html`` use the same functions."""
from __future__ import annotations

import html
import re

from .colour import (NEGATIVE, POSITIVE, colour_scale, explained_name, ink, mass_note, matrix_cells, shade, shares,
                     token_texts, verdict)
from .figure import explanation_image_figure, save_png

# a fragment's style holds only selectors inside its own element: in a notebook it sits in the
# notebook's page, whose body, headings and tables are not the fragment's to restyle
_CSS = """
.rulegraph{font-family:system-ui,sans-serif;color:#222}
.rulegraph h2{font-size:1.1em;margin-top:2em;border-top:1px solid #ddd;padding-top:1em}
.rulegraph .tokens{font-size:1.1em;line-height:1.2em}
.rulegraph .tok{display:inline-block;text-align:center;padding:.2em .25em;margin:.1em 0;border-radius:3px}
.rulegraph .tok small{display:block;font-size:.62em;opacity:.85;color:inherit} .rulegraph .special{outline:1px dashed #888}
.rulegraph .note{background:#fff6d6;padding:.3em .6em;border-radius:3px}
.rulegraph table{border-collapse:collapse;margin:.8em 0;font-size:.9em}
.rulegraph td,.rulegraph th{padding:.2em .7em;text-align:right;border-bottom:1px solid #eee}
.rulegraph td:first-child,.rulegraph th:first-child{text-align:left}
.rulegraph img.heatmap{max-width:100%} .rulegraph .ok{color:#2a7} .rulegraph .bad{color:#c22;font-weight:bold}
.rulegraph .legend span{padding:.1em .5em;margin-right:.4em} .rulegraph small{color:#666}
"""
# a page's own: the body and its title
_PAGE_CSS = ("body{font-family:system-ui,sans-serif;margin:2em auto;max-width:60em;padding:0 1em;color:#222}"
             "body.wide{max-width:none;margin:2em} h1{font-size:1.4em}")


def _span(tok: str, score: float, scale: float, special: bool) -> str:
    """A token with its score printed under it, on its colour, in the ink that reads on it."""
    colour = shade(score, scale)
    lead = " " if tok.startswith(" ") else ""
    cls = "tok special" if special else "tok"
    return (f'{lead}<span class="{cls}" style="background:rgb{colour};color:{ink(colour)}" '
            f'title="{score:+.6g}">{html.escape(tok.lstrip(" "))}<small>{score:+.2g}</small></span>')


def _layer_chart(audit) -> str:
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


def explanation_fragment(e, heading: str = "") -> str:
    """One explanation (every batch item) as HTML without the page around it: what a notebook shows."""
    headings = [heading] if e.batch_size == 1 else \
        [f"{heading} item {item + 1}: {_text(e, item)}".strip(" :") for item in range(e.batch_size)]
    return f'<div class="rulegraph"><style>{_CSS}</style>{_legend()}{_items(e, headings)}</div>'


def explanations_page(results: list, model: str = "") -> str:
    """A self-contained page: per explanation the heatmap, the conservation figures and the layer chart."""
    body = [f'<h1>rulegraph explanation</h1><div class="rulegraph"><p><small>model {html.escape(model)}</small></p>',
            _legend()]
    for i, e in enumerate(results):
        if e.batch_size == 1:
            text = _text(e, 0)
            headings = [f"{i + 1}. {text}" if len(results) > 1 or text else ""]
        else:
            number = f"{i + 1}. " if len(results) > 1 else ""
            headings = [f"{number}item {item + 1}: {_text(e, item)}".strip(" :") for item in range(e.batch_size)]
        body.append(_items(e, headings))
    body.append("</div>")
    return _page("rulegraph explanation", "".join(body))


def _items(e, headings: list[str]) -> str:
    """Every batch item (its tokens or image, what was explained), then the audit: one item's under
    it, a batch's once after its items (the audit's figures are the batch's sums)."""
    return "".join(_item(e, item, heading) for item, heading in enumerate(headings)) + \
        ("" if e.audit is None else _audit(e))


def _page(title: str, body: str, wide: bool = False) -> str:
    """A self-contained page; ``wide`` pages (a generation's matrix) use the window's width."""
    opening = '<body class="wide">' if wide else "<body>"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_PAGE_CSS}{_CSS}</style></head>{opening}{body}</body></html>")


def _prose(text: str) -> str:
    """Plain text as HTML, its `code` spans as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


def _legend() -> str:
    return (f'<p class="legend"><span style="background:rgb{POSITIVE};color:#fff">for the output</span>'
            f'<span style="background:rgb{NEGATIVE};color:#fff">against it</span></p>')


def _text(e, item: int) -> str:
    text = e.extra.get("text")
    return text[item] if isinstance(text, list) else (text or "")


def _item(e, item: int, heading: str) -> str:
    """One batch item: the tokens on their colours, or the image, or both (a vision–language model's text and
    picture), and what was explained."""
    from ..image import is_image
    images = [k for k, v in e.boundary.items() if is_image(v)]
    texted = bool(e.tokens) and any(k not in images for k in e.relevance)      # tokens to show, beside a picture
    keys = ([k for k in e.relevance if k not in images][:1] if texted or not images else []) + images[:1]
    scored = {k: e.scores(k, item) for k in keys}
    shown = not texted and (images or "audio" in e.extra)                        # drawn, not as tokens
    parts = [f"<h2>{html.escape(heading)}</h2>" if heading else ""]
    sums = " and ".join(f"<code>{html.escape(k)}</code> (Σ {sum(v):+.4g})" for k, v in scored.items())
    parts.append(f"<p>explained <b>{html.escape(explained_name(e, item))} = {e.output_value[item]:.5g}</b> "
                 f"with <code>{html.escape(e.method)}</code>; scores from {sums}</p>")
    condition = e.extra.get("condition")
    if condition:               # conditional relevance (rulegraph.inside): which units this map kept
        masked = "" if condition["absorbed"] is None else f"; {condition['absorbed']:+.4g} masked out, booked as absorbed"
        parts.append(f"<p>conditioned on <code>{html.escape('; '.join(condition['conditions']))}</code>"
                     f"{html.escape(masked)}</p>")
    if images:          # an image: the picture, its relevance over it and beside it
        parts.append(_image(e, images[0], item))
    elif "audio" in e.extra:        # a clip: its relevance over time under its waveform, never a score per sample
        parts.append(_clip(e, item))
    if not shown:
        scores = scored[keys[0]]
        tokens = token_texts(e, item, len(scores))
        special = e.special[item] if e.special else [False] * len(tokens)
        scale = colour_scale(scores, special)
        parts.append('<p class="tokens">' + "".join(_span(t, s, scale, sp) for t, s, sp in
                                                   zip(tokens, scores, special)) + "</p>")
        note = mass_note(tokens, scores, special)
        if note:
            parts.append(f'<p class="note">{html.escape(note)}</p>')
    return "".join(parts)


def _audit(e) -> str:
    """The conservation figures, the verdict and the per-layer chart (a batch's: summed over its items)."""
    c = e.audit.conservation
    status = ('<span class="ok">within tolerance</span>' if e.audit.ok else '<span class="bad">FLAGGED</span>')
    rows = [("explained output", f"{c.output_value:+.5g}")]
    rows += [(f"Σ relevance at {k}", f"{float(v.sum()):+.5g}") for k, v in e.relevance.items()]
    rows += [("absorbed (biases, constants, ε)", f"{c.absorbed:+.5g}"), ("breaks (by rule design)", f"{c.breaks:+.5g}"),
             ("unexplained residual", f"{c.residual:+.3g} (rel {c.relative_error:.1e}, {status})")]
    if "rounding" in e.extra:               # a graph rounding activations to integers (rulegraph.rounding)
        rows.append(("quantized graph", html.escape(e.extra["rounding"]["line"])))
    title = "conservation" if e.batch_size == 1 else f"conservation of the batch ({e.batch_size} items summed)"
    words = shares(e)
    parts = ["<h2>the batch's audit</h2>" if e.batch_size > 1 else "",
             f'<p class="{"note" if words.flagged or words.near_zero else "verdict"}">{_prose(words.sentence)}</p>',
             f"<table><tr><th>{title}</th><th></th></tr>" +
             "".join(f"<tr><td>{html.escape(a)}</td><td>{b}</td></tr>" for a, b in rows) + "</table>",
             f'<p class="verdict">{_prose(verdict(e))}</p>']
    if e.audit.layers:
        parts.append("<p><small>relevance per layer, summed over the layer's border (in: from the layer "
                     "above, out: to the layer below), what its constants absorbed and what its "
                     "non-conservative rules broke; bars share one scale, positive to the right</small></p>")
        parts.append(_layer_chart(e.audit))
    return "".join(parts)


# -- a generation's matrix ---------------------------------------------------------------------

#: what a generation's first row group is called on its page (a decoder-only model's: "prompt")
SOURCES = {"source": "source", "audio": "clip"}


def generation_fragment(g, model: str = "") -> str:
    """The matrix as a coloured table (hover for exact values) and the steps, without the page."""
    head = "".join(f"<th><div>{html.escape(c)}</div></th>" for c in g.drawn()[0])
    body = []
    for tok, group, cells in matrix_cells(g):
        tds = "".join('<td class="none"></td>' if cell is None else
                      f'<td style="background:rgb{cell[1]};color:{ink(cell[1])}" title="{cell[0]:+.6g}">{cell[0]:+.2g}</td>'
                      for cell in cells)
        body.append(f'<tr class="{group}"><th>{html.escape(tok)}</th>{tds}</tr>')
    shares = g.shares()
    steps = "".join(
        f"<tr><td>{i + 1}</td><td>{html.escape(s.text)}</td><td>{s.probability:.3g}</td><td>{s.output_value:.5g}</td>"
        + "".join(f"<td>{'—' if v[i] != v[i] else f'{100 * float(v[i]):.0f}%'}</td>" for v in shares.values())
        + f"<td>{'' if s.residual is None else f'{s.residual:+.2e}'}</td></tr>" for i, s in enumerate(g.steps))
    if g.span is not None:
        steps += (f"<tr><td>Σ</td><td>the span</td><td></td><td>{g.span.output_value:.5g}</td>"
                  + "<td></td>" * len(shares)
                  + f"<td>{'' if g.span.residual is None else f'{g.span.residual:+.2e}'}</td></tr>")
    prompt = html.escape(g.prompt or g.extra.get("audio", {}).get("note", ""))       # a clip: what was done to it
    generated = html.escape(g.continuation or "")
    model_line = f"model {html.escape(model)}, " if model else ""
    return (
        f'<div class="rulegraph-matrix"><style>{_MATRIX_CSS.replace("LAST", g.groups[-1] if g.groups else "x")}</style>'
        f"<p><small>{model_line}method <code>{html.escape(g.method)}</code>, {g.mode}</small></p>"
        f"<p>{SOURCES.get(g.groups[0] if g.groups else '', 'prompt')}: <b>{prompt}</b><br>"
        f"{'generated' if g.mode == 'greedy' else 'continuation'}: <b>{generated}</b></p>"
        f'<p class="legend"><span style="background:rgb{POSITIVE};color:#fff">for the generated token</span>'
        f'<span style="background:rgb{NEGATIVE};color:#fff">against it</span> each column on its own scale; '
        f"rows in italics: the {html.escape(g.groups[-1] if g.groups else '')} prefix; grey: not an input of that step</p>"
        f'<div class="scroll"><table class="matrix"><tr><th>row \\ generated</th>{head}</tr>{"".join(body)}</table></div>'
        "<h3>steps</h3><table><tr><th>step</th><th>token</th><th>p</th><th>explained</th>"
        + "".join(f"<th>{html.escape(name)} share</th>" for name in shares) +
        f"<th>residual</th></tr>{steps}</table></div>")


def generation_page(g, model: str = "") -> str:
    """A self-contained page of :func:`generation_fragment`."""
    return _page("rulegraph generation", f"<h1>rulegraph: explained generation</h1>{generation_fragment(g, model)}",
                 wide=True)


_MATRIX_CSS = (".rulegraph-matrix{font-family:system-ui,sans-serif;color:#222}"
               ".rulegraph-matrix table{border-collapse:collapse;font-size:12px}"
               ".rulegraph-matrix .scroll{overflow-x:auto;max-width:100%}"
               ".rulegraph-matrix td,.rulegraph-matrix th{border:1px solid #ddd;padding:2px 5px;white-space:nowrap}"
               ".rulegraph-matrix td,.rulegraph-matrix th{text-align:right}"
               ".rulegraph-matrix td:first-child,.rulegraph-matrix th:first-child{text-align:left}"
               ".rulegraph-matrix th div{writing-mode:vertical-rl;transform:rotate(180deg)}"
               ".rulegraph-matrix td.none{background:#f4f4f4}.rulegraph-matrix tr.LAST th{font-style:italic}"
               ".rulegraph-matrix .legend span{padding:2px 6px;margin-right:6px}")


def _image(e, key: str, item: int) -> str:
    """The image figure (:func:`rulegraph.render.figure.explanation_image_figure`) as an embedded PNG."""
    import base64

    data = base64.b64encode(save_png(explanation_image_figure(e, item))).decode("ascii")
    return f'<p><img class="heatmap" alt="relevance of {html.escape(key)}" src="data:image/png;base64,{data}"></p>'


def _clip(e, item: int) -> str:
    """A clip's figure (:func:`rulegraph.render.figure.explanation_audio_figure`) as an embedded PNG."""
    import base64

    from ..audio import OverTime
    from .figure import explanation_audio_figure
    key, rate = e.extra["audio"]["input"], e.extra["audio"]["sampling_rate"]
    clip = OverTime.of(e.boundary[key][item], e.extra["audio"]["per_second"])
    data = base64.b64encode(save_png(explanation_audio_figure(e, item))).decode("ascii")
    return (f'<p>{html.escape(key)}: {clip.count} {clip.what} at {rate} Hz ({clip.seconds:.2f} s)</p>'
            f'<p><img class="heatmap" alt="relevance of {html.escape(key)} over time" src="data:image/png;base64,{data}"></p>')
