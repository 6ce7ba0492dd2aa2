"""Showing explanations in the terminal (rich): coloured tokens, the words for and against, the
conservation summary and the audit tables. Colours and token text come from
:mod:`rulegraph.render.colour`, shared with the HTML pages and the figures."""
from __future__ import annotations

import os

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..audit import Audit
from ..explanation import Explanation
from ..render.colour import colour_scale, css, explained_name, ink, mass_note, shade, shares, token_texts, verdict


def heatmap_text(tokens: list[str], scores: list[float], special: list[bool] | None = None) -> Text:
    """Tokens (as a reader sees them, :func:`~rulegraph.render.colour.token_texts`) on their colours."""
    special = special or [False] * len(tokens)
    scale = colour_scale(scores, special)
    text = Text()
    for tok, score, sp in zip(tokens, scores, special):
        colour = shade(score, scale)
        text.append(" " if tok.startswith(" ") else "")
        text.append(tok.lstrip(" ") or repr(tok), style=f"{'underline ' if sp else ''}{ink(colour)} on {css(colour)}")
    return text


def top_words(scored: list[tuple[str, float]], k: int = 5) -> Text:
    """The ``k`` most relevant words (``Explanation.words``) for and against the output, with their scores."""
    ranked = sorted(distinct(scored), key=lambda ws: ws[1])
    text = Text("for: ", style="bold")
    text.append(", ".join(f"{w} {s:+.3g}" for w, s in reversed(ranked[-k:]) if s > 0) or "—")
    text.append("   against: ", style="bold")
    text.append(", ".join(f"{w} {s:+.3g}" for w, s in ranked[:k] if s < 0) or "—")
    return text


#: the most scores the terminal shows for one input (about a screen); the rest are in --json
SCREEN = 400


def image_key(e: Explanation) -> str | None:
    """The first input whose relevance is image-shaped (:func:`rulegraph.image.is_image`), else ``None``."""
    from ..image import is_image
    return next((k for k, v in e.boundary.items() if is_image(v)), None)


def image_lines(e: Explanation, item: int = 0) -> list:
    """What ``rulegraph explain`` prints for an image: one line on its relevance (shape, sum, where the
    most is), never a score per pixel, then the conservation summary."""
    from ..image import pixel_map
    key = image_key(e)
    lines = []
    if key is not None:
        heat = pixel_map(e.boundary[key], item)
        row, col = divmod(int(abs(heat).argmax()), heat.shape[1])
        lines.append(Text(f"{key}: image relevance {'×'.join(map(str, e.boundary[key].shape))}, "
                          f"{heat.shape[0]}×{heat.shape[1]} pixels (H×W), Σ {fmt(float(heat.sum()))}, largest "
                          f"|relevance| at row {row}, column {col}; --png or --html draws the heatmap, --json holds "
                          "every score"))
    return [*lines, summary_table(e, item)]


def audio_lines(e: Explanation, item: int = 0) -> list:
    """What ``rulegraph explain`` prints for a clip (``e.extra["audio"]``): its relevance over time as a strip of
    coloured spans (:class:`rulegraph.audio.OverTime`), the spans for and against, never a score per sample;
    then the conservation summary."""
    from ..audio import OverTime
    key, rate, per_second = (e.extra["audio"][k] for k in ("input", "sampling_rate", "per_second"))
    clip = OverTime.of(e.boundary[key][item], per_second)
    scores = [s for _, _, s in clip.spans]
    scale = colour_scale(scores, [False] * len(scores))
    strip = Text()
    for score in scores:
        strip.append("█", style=css(shade(score, scale)))
    head = Text(f"{key}: relevance over time, {clip.count} {clip.what} at {rate} Hz ({clip.seconds:.2f} s) in "
                f"{len(clip.spans)} spans of {clip.seconds / len(clip.spans) * 1e3:.0f} ms, Σ {fmt(clip.total)}, "
                f"largest |relevance| at {clip.peak:.3f} s; --png draws it over the input, --json holds every score")
    end = f"{clip.seconds:.2f} s"
    axis = Text(f"0 s{' ' * max(len(clip.spans) - 3 - len(end), 1)}{end}", style="dim")
    return [head, strip, axis, top_words([n for side in clip.strongest(3) for n in side], 3), summary_table(e, item)]


def distinct(scored: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """``(word, score)`` pairs with a word that occurs more than once marked with its position
    among the words (from 1: ``superb#2``, ``superb#7``), so that two of them can be told apart."""
    counts: dict[str, int] = {}
    for w, _ in scored:
        counts[w] = counts.get(w, 0) + 1
    return [(f"{w}#{i + 1}" if counts[w] > 1 else w, s) for i, (w, s) in enumerate(scored)]


def explanation_lines(e: Explanation, item: int = 0) -> list:
    """What ``rulegraph explain`` prints for one explained text: the tokens on their colours (the
    first :data:`SCREEN` of them), the words for and against, a note where special tokens hold the
    mass, the conservation summary. (A vision–language model's text: its token input, not its picture's.)"""
    key = next((k for k in e.relevance if k != image_key(e)), next(iter(e.relevance)))
    scores = e.scores(key, item)
    tokens = token_texts(e, item, len(scores))
    special = e.special[item] if e.special else None
    shown = len(scores) if len(scores) <= SCREEN else SCREEN
    lines = [heatmap_text(tokens[:shown], scores[:shown], special[:shown] if special else None)]
    if shown < len(scores):
        lines.append(Text(f"… {len(scores) - shown} more of {len(scores)} scores not shown (--json holds them all)",
                          style="dim"))
    lines.append(top_words(e.words(key, item)))
    note = mass_note(tokens, scores, special)
    if note:
        lines.append(Text(note, style="yellow"))
    return [*lines, summary_table(e, item)]


def png_paths(path, explanations: int) -> list:
    """Where ``--png PATH`` draws ``explanations`` explanations: ``PATH`` for one; one file per
    text for several, numbered from 1 before the suffix (``e.png`` → ``e-1.png``, ``e-2.png``…)."""
    from pathlib import Path
    if path is None:
        return []
    path = Path(path)
    if explanations == 1:
        return [path]
    return [path.with_name(f"{path.stem}-{i}{path.suffix}") for i in range(1, explanations + 1)]


def fmt(x: float) -> str:
    return f"{x:+.4g}"


def summary_table(e: Explanation, item: int = 0) -> Table:
    """The explained output and the graph-level conservation figures."""
    t = Table(title="conservation", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_row("explained", escape(f"{explained_name(e, item)} = {e.output_value[item]:.6g}"))
    if "objective" in e.extra:
        t.add_row("objective's value", f"{e.extra['objective_value'][item]:.6g}")
    if "final" in e.extra:
        f = e.extra["final"]
        t.add_row(escape(f"final {f['op']}"), escape(f"{f['output']} = {f['op']}({f['logits']}): the logits before it are "
                                                     "explained (--score probability explains its output)"))
    if "logprob" in e.extra:
        name = "log p[target] − log p[contrast]" if e.contrast is not None else "log p[target]"
        t.add_row(escape(name), f"{e.extra['logprob'][item]:.6g}")
    if e.audit is not None:
        c = e.audit.conservation
        flag = "[green]ok[/]" if e.audit.ok else "[red]FLAGGED[/]"
        words = shares(e)
        warn = "yellow" if words.flagged or words.near_zero else ""
        t.add_row("in words", Text(words.sentence, style=warn, justify="left"))
        for key, r in e.relevance.items():
            t.add_row(escape(f"Σ relevance at {key}"), fmt(float(r.sum())))
        t.add_row("absorbed (biases, constants, ε)", fmt(c.absorbed))
        t.add_row("expected breaks (by rule design)", f"{fmt(c.breaks)}  in {len(e.audit.expected)} node(s)")
        t.add_row("unexplained residual", f"{fmt(c.residual)}  rel {c.relative_error:.2e} {flag}")
        if "rounding" in e.extra:           # a graph rounding activations to integers (rulegraph.rounding)
            t.add_row("quantized graph", escape(e.extra["rounding"]["line"]))
        if c.stranded:
            t.add_row("stranded (no rule)", escape(", ".join(f"{k}: {fmt(v)}" for k, v in c.stranded.items())))
        if e.audit.unexpected:
            t.add_row("unexpected breaks", f"[red]{len(e.audit.unexpected)} conserving node(s) off by > "
                                           f"{e.audit.tolerance:g}[/] (see `rulegraph audit`)")
        else:
            t.add_row("unexpected breaks", f"[green]none[/] (every conserving node within {e.audit.tolerance:g})")
        t.add_row("", Text(verdict(e), style="dim"), end_section=True)
    return t


def reconstruction_table(audit) -> Table:
    """Largest |Σ components − value| per layer, absolute and relative to the node's largest |value|."""
    t = Table(title="reconstruction per layer: |Σ components − forward value|")
    for col in ("layer", "nodes", "max abs error", "max rel. error", "worst node"):
        t.add_column(col, justify="left" if col in ("layer", "worst node") else "right", overflow="fold")
    for r in audit.reconstruction:
        t.add_row(r.name, str(r.nodes), f"{r.max_abs_error:.2e}", f"{r.max_relative_error:.2e}", r.worst_node)
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

