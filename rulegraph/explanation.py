"""What an explanation returns, whatever the pass or method that made it; it shows itself in a
terminal (``repr``: one screen), in a notebook (``_repr_html_``), as a page (``to_html``) and as a
figure (``plot``), with the renderers of :mod:`rulegraph.render`."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .audit import Audit
from .errors import InputError

Tensor = torch.Tensor


@dataclass
class Explanation:
    """Relevance of each input position for the explained output scalar(s), plus the audit."""

    output: str                          # name of the explained graph output
    output_tensor: Tensor                # its full value (batch first)
    target: list[int]                    # explained index along the last axis, per batch item
    position: int | list[int] | None     # explained position for sequence outputs (or one per batch item)
    output_value: list[float]            # the explained scalar per batch item
    relevance: dict[str, Tensor]         # boundary key (input name) → per-position scores
    boundary: dict[str, Tensor]          # boundary key → full relevance tensor (e.g. batch × tokens × hidden)
    method: str                          # the rule set or method that made the scores (its name)
    audit: Audit | None = None
    tokens: list[list[str]] | None = None       # per item, the tokens as the tokenizer names them
    texts: list[list[str]] | None = None        # per item, each token as a reader sees it
    special: list[list[bool]] | None = None     # per item, which tokens are special ([CLS], [SEP]…)
    word_ids: list[list[int | None]] | None = None   # per item, each token's word (the tokenizer's; None: special)
    labels: list[str] | None = None
    names: dict[int, str] = field(default_factory=dict)   # output index → its token's text (language models)
    pixels: dict[str, Tensor] = field(default_factory=dict)   # image inputs (normalised), to show beside their relevance
    normalization: tuple | None = None          # (mean, std) of those images, per channel
    extra: dict[str, Any] = field(default_factory=dict)
    recorded: dict[str, Tensor] = field(default_factory=dict)   # relevance at the values asked for (record=…)
    contrast: list[int] | None = None    # subtracted index per batch item (target − contrast explained)
    score: str = "logit"                 # "logit", or "logprob" (see rulegraph.passes.base)

    @property
    def batch_size(self) -> int:
        return len(self.target)

    def name(self, index: int) -> str:
        """An output index as a reader knows it: its class label, or its token's text (with the id)."""
        if self.labels and 0 <= index < len(self.labels):
            return self.labels[index]
        return f"{self.names[index]!r} ({index})" if index in self.names else str(index)

    def __repr__(self) -> str:
        """One screen: what was explained, the tokens, the strongest for and against, the audit's verdict."""
        from .render.colour import explained_name, token_texts
        key = next(iter(self.relevance))
        scores = self.scores(key)
        lines = [f"Explanation({self.method}: {explained_name(self)} = {self.output_value[0]:.6g}"
                 + (f", item 1 of {self.batch_size}" if self.batch_size > 1 else "") + ")"]
        if self.boundary[key].dim() == 4:           # an image: its size and where its relevance is, not every pixel
            lines.append(_image_line(key, self.boundary[key][0]))
        else:
            named = self.texts is not None or self.tokens is not None
            tokens = token_texts(self, 0, len(scores))
            ranked = sorted(self.words(key), key=lambda ws: ws[1])
            lines += ["  tokens: " + _shorten("".join(tokens) if named else " ".join(tokens)),
                      "  for: " + (", ".join(f"{w} {s:+.3g}" for w, s in reversed(ranked[-3:]) if s > 0) or "—")
                      + "   against: " + (", ".join(f"{w} {s:+.3g}" for w, s in ranked[:3] if s < 0) or "—")]
        if self.audit is not None:
            c = self.audit.conservation
            lines.append(f"  audit: residual {c.residual:+.3g} (rel {c.relative_error:.1e}) "
                         f"{'ok' if self.audit.ok else 'FLAGGED'}, absorbed {c.absorbed:+.4g}, breaks {c.breaks:+.4g}"
                         + (f" (the batch's {self.batch_size} items summed)" if self.batch_size > 1 else ""))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from .render.page import explanation_fragment
        return explanation_fragment(self)

    def to_html(self, path: str | Path | None = None, *, overwrite: bool = False) -> str:
        """The explanation as a self-contained page; written to ``path`` when given (an existing
        file only with ``overwrite``)."""
        from .files import write_output
        from .render.page import explanations_page
        page = explanations_page([self])
        if path is not None:
            write_output(Path(path), page, overwrite, "the page")
        return page

    def plot(self, item: int = 0, ax=None):
        """Each token's score as a bar, or for an image the picture, the relevance over it and beside
        it (matplotlib, as ``rulegraph explain --png`` draws them); into ``ax`` when given (an image's
        relevance panel alone); returns the figure."""
        from .render.figure import explanation_figure, explanation_image_figure
        if any(v.dim() == 4 for v in self.boundary.values()):
            return explanation_image_figure(self, item, ax)
        return explanation_figure(self, item, ax)

    def scores(self, key: str | None = None, item: int = 0) -> list[float]:
        """Per-position scores of batch item ``item`` for one boundary key (default: the first)."""
        key = key or next(iter(self.relevance))
        return self.relevance[key][item].reshape(-1).tolist()

    def words(self, key: str | None = None, item: int = 0) -> list[tuple[str, float]]:
        """Item ``item``'s scores by word, for any method: the tokens of each word of the tokenizer's
        pre-tokenization (``word_ids``, the words of the decomposition's ``groups="word"``) merged, each
        with the sum of its tokens' scores; special tokens left out. Without word ids, a word starts
        after a space; without the tokens' texts, each position is its own word."""
        from .render.colour import token_texts, words
        scores = self.scores(key, item)
        special = self.special[item] if self.special else [False] * len(scores)
        named = self.texts is not None or self.tokens is not None
        texts = token_texts(self, item, len(scores))
        ids = self.word_ids[item] if self.word_ids and len(self.word_ids[item]) == len(scores) else None
        return words(texts if named else [f" {t}" for t in texts], scores, special, ids)

    def to_dict(self) -> dict:
        d: dict[str, Any] = {
            "method": self.method,
            "output": self.output,
            "target": self.target if self.batch_size > 1 else self.target[0],
            "output_value": self.output_value if self.batch_size > 1 else self.output_value[0],
            "relevance": {k: (v.tolist() if self.batch_size > 1 else v[0].tolist()) for k, v in self.relevance.items()},
        }
        if self.position is not None:
            d["position"] = self.position
        if self.contrast is not None or self.score != "logit":
            d["contrast"] = None if self.contrast is None else \
                self.contrast if self.batch_size > 1 else self.contrast[0]
            d["score"] = self.score
        if self.labels or self.names:
            d["target_name"] = [self.name(t) for t in self.target] if self.batch_size > 1 else self.name(self.target[0])
            if self.contrast is not None:
                names = [self.name(c) for c in self.contrast]
                d["contrast_name"] = names if self.batch_size > 1 else names[0]
        if self.labels:
            d["labels"] = self.labels
        if self.tokens is not None:
            d["tokens"] = self.tokens if self.batch_size > 1 else self.tokens[0]
        if self.texts is not None:
            d["texts"] = self.texts if self.batch_size > 1 else self.texts[0]
            by_word = [[{"word": w, "score": x} for w, x in self.words(item=b)] for b in range(self.batch_size)]
            d["words"] = by_word if self.batch_size > 1 else by_word[0]
        if self.audit is not None:
            d.update(self.audit.to_dict())
        d.update(self.extra)
        for key in ("logprob", "objective_value"):
            if key in self.extra and self.batch_size == 1:
                d[key] = self.extra[key][0]
        return d


def _image_line(key: str, relevance: Tensor) -> str:
    """An image's relevance in one line: its size, the sums for and against, the strongest pixel
    (relevance summed over the channels)."""
    pixel = relevance.double().sum(0)
    row, col = divmod(int(pixel.abs().argmax()), pixel.shape[1])
    return (f"  image {key} {'×'.join(map(str, relevance.shape))}: Σ {float(pixel.sum()):+.4g} "
            f"(for {float(pixel.clamp(min=0).sum()):+.4g}, against {float(pixel.clamp(max=0).sum()):+.4g}), "
            f"strongest {float(pixel[row, col]):+.3g} at row {row}, column {col}")


def _shorten(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"
