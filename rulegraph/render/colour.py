"""Colours and token text: a score's colour (red for, blue against, white at 0), the ink that
reads on it, and tokens as a reader expects them (WordPiece ``##`` joined, BPE ``Ġ``/``▁`` as
spaces)."""
from __future__ import annotations

import math

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


def words(tokens: list[str], scores: list[float], special: list[bool],
          word_ids: list[int | None] | None = None) -> list[tuple[str, float]]:
    """Tokens as a reader sees them merged into words, each with the sum of its tokens' scores;
    special tokens left out. A word is one of ``word_ids`` (the tokenizer's), else starts with a space."""
    merged: list[list | None] = []
    previous = None
    for i, (text, score, sp) in enumerate(zip(tokens, scores, special)):
        word = word_ids[i] if word_ids is not None else None
        same = previous is not None and word == previous if word_ids is not None else not text.startswith(" ")
        previous = word
        if sp:
            merged.append(None)
        elif merged and merged[-1] is not None and same:
            merged[-1][0] += text
            merged[-1][1] += score
        else:
            merged.append([text.strip(), score])
    return [(w, s) for w, s in filter(None, merged)]


def css(colour: tuple[int, int, int]) -> str:
    """``rgb(r,g,b)``, without spaces (rich reads no spaces in a style's colour)."""
    return "rgb({},{},{})".format(*colour)


def token_texts(e, item: int = 0, n: int | None = None) -> list[str]:
    """Item ``item``'s tokens as a reader sees them: the decoded texts, else the tokenizer's tokens
    made readable (:func:`display_tokens`), else the positions."""
    if e.texts is not None:
        return list(e.texts[item])
    if e.tokens is not None:
        return display_tokens(list(e.tokens[item]))
    return [str(k) for k in range(n if n is not None else len(e.scores(None, item)))]


def explained_name(e, item: int = 0) -> str:
    """What was explained, with names: ``logits['positive']``, ``logits[' Paris' (6342)]``; with a
    contrast ``logits[A] − logits[B]``; for a log-probability without a contrast
    ``logits[A] − Σ p·logits`` (p held constant); an objective as written, linearised."""
    if "objective" in e.extra:
        held = " (p held constant)" if "logprob" in e.extra["objective"] else ""
        return f"{e.output}: {e.extra['objective']}{held}"
    name = f"{e.output}[{e.name(e.target[item])}]"
    if e.contrast is not None:
        return f"{name} − {e.output}[{e.name(e.contrast[item])}]"
    if e.score == "logprob":
        return f"{name} − Σ p·{e.output} (p held constant)"
    return name


def shares(e):
    """The audit's shares of the explained value in words (:meth:`rulegraph.audit.Conservation.summary`),
    naming the inputs as they are: tokens, an image's pixels, or a clip's samples."""
    return e.audit.conservation.summary(e.method, e.batch_size, input_units(e))


def input_units(e) -> str:
    """What the explanation's input is made of, as the prose names it: tokens, an image's pixels, a clip's
    samples (or a spectrogram's frames); a vision–language model's tokens and pixels."""
    if any(v.dim() == 4 for v in e.boundary.values()):
        return "tokens and pixels" if len(e.boundary) > 1 and e.tokens else "pixels"
    if "audio" in e.extra:
        return "frames" if e.boundary[e.extra["audio"]["input"]].dim() == 3 else "samples"
    return "tokens"


def verdict(e) -> str:
    """The audit in one sentence a reader can act on: is the residual small, and what do the
    absorbed and broken amounts mean for these rules."""
    if e.audit is None:
        return "not audited (the method is not a rule set, or audit=False)"
    c = e.audit.conservation
    size = abs(c.output_value) or 1.0
    if not e.audit.ok:
        return (f"FLAGGED: {c.residual:+.3g} of the explained {c.output_value:+.4g} is not accounted for; "
                "run `rulegraph audit` to see which node loses it")
    parts = [f"conserved: the inputs' relevance, the absorbed and the broken amounts add up to the explained "
             f"value (residual {abs(c.relative_error):.1e} of it)"]
    if abs(c.breaks) > 1e-3 * size:
        ops = sorted({n.op for n in e.audit.expected})
        parts.append(f"the breaks ({c.breaks:+.3g}) are by design: the rules of `{e.method}` at "
                     f"{len(e.audit.expected)} node(s) ({', '.join(ops)}) do not conserve")
    masked = (e.extra.get("condition") or {}).get("absorbed")       # conditional relevance (rulegraph.inside)
    if abs(c.absorbed) > 1e-3 * size:
        parts.append(f"absorbed ({c.absorbed:+.3g}) went to " +
                     (f"the units the condition masked out ({masked:+.3g}) and " if masked else "") +
                     f"biases, position embeddings, LayerNorm β and ε, not to the input {input_units(e)}")
    return "; ".join(parts)


def scales(g) -> list[float]:
    """Each drawn column's largest |relevance| (every step's, then the span's): a column's colours are
    on its own scale."""
    matrix = g.drawn()[1].nan_to_num()
    return [float(matrix[:, c].abs().max()) or 1.0 if len(matrix) else 1.0 for c in range(matrix.shape[1])]


def matrix_cells(g):
    """Per matrix row: its token, its group, and per drawn column (:meth:`Generation.drawn`: each step,
    then the span's) ``(value, colour)`` or ``None`` where the step does not see the row (the row
    comes after the step's position)."""
    columns = scales(g)
    matrix = g.drawn()[1]
    for r, (tok, group) in enumerate(zip(g.rows, g.groups)):
        values = [float(matrix[r, c]) for c in range(matrix.shape[1])]
        yield tok, group, [None if math.isnan(x) else (x, shade(x, columns[c])) for c, x in enumerate(values)]
