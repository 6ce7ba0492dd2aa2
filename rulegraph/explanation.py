"""What an explanation returns, whatever the pass or method that made it; it shows itself in a
terminal (``repr``: one screen), in a notebook (``_repr_html_``), as a page (``to_html``) and as a
figure (``plot``), with the renderers of :mod:`rulegraph.render`."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .audit import Audit
from .errors import InputError

Tensor = torch.Tensor


def row_of(position: Any, rows: list[int] | tuple[int, ...] | None) -> Any:
    """The row(s) of an output holding only the positions ``rows`` (a language model's head computed where
    explained, :mod:`rulegraph.canonize.rows`) that hold ``position`` (an int, or one per batch item);
    ``position`` itself where ``rows`` is ``None``. A position not computed is refused, naming those that were."""
    if rows is None or position is None:
        return position
    index = {p: k for k, p in enumerate(rows)}

    def one(p: int) -> int:
        if p not in index:
            raise InputError(f"the logits at position {p} were not computed (only at {', '.join(map(str, rows))}); "
                             f"explain(…, logits='all') computes every position")
        return index[p]
    return one(int(position)) if isinstance(position, (numbers.Integral, Tensor)) else [one(int(p)) for p in position]


def at_position(out: Tensor, position: Any, rows: list[int] | tuple[int, ...] | None = None) -> Tensor:
    """``[batch, classes]``: a ``[batch, positions, classes]`` output at ``position`` (an int, or one per batch
    item), read through ``rows`` (:func:`row_of`); any other output as it is (``[batch]`` as ``[batch, 1]``)."""
    out = out.unsqueeze(-1) if out.dim() == 1 else out
    if out.dim() != 3:
        return out
    at = row_of(position, rows)
    at = [int(at)] * out.shape[0] if isinstance(at, (numbers.Integral, Tensor)) else [int(p) for p in at]
    return out[torch.arange(out.shape[0]), at]


@dataclass
class Explanation:
    """Relevance of each input position for the explained output scalar(s), plus the audit."""

    output: str                          # name of the explained graph output
    output_tensor: Tensor                # its value (batch first); a language model's at ``rows`` only
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
    clip: dict[str, Tensor] = field(default_factory=dict)     # a clip's samples as the model took them (extra["audio"])
    extra: dict[str, Any] = field(default_factory=dict)
    recorded: dict[str, Tensor] = field(default_factory=dict)   # relevance at the values asked for (record=…)
    inside: dict[str, list] = field(default_factory=dict)     # selector → rulegraph.inside.Inside per value (at=…)
    graph: Any = None                    # rulegraph.layergraph.RelevanceGraph (graph=True)
    contrast: list[int] | None = None    # subtracted index per batch item (target − contrast explained)
    score: str = "logit"                 # "logit", or "logprob" (see rulegraph.passes.base)
    item_of: tuple[int, int] | None = None   # (index, batch size) for an item taken from a batch (``e[i]``)
    #: input name → ``[batch, positions]`` bool, the positions that hold tokens (its attention mask): an
    #: item's scores, words and views leave its padding out; an input not named here: every position
    real: dict[str, Tensor] = field(default_factory=dict)
    #: the positions ``output_tensor``'s rows hold where a language model's head was computed only where
    #: explained (``explain(…, logits="all")`` computes every position); ``None``: every position
    rows: list[int] | None = None

    @property
    def batch_size(self) -> int:
        return len(self.target)

    def __len__(self) -> int:
        """The number of batch items."""
        return self.batch_size

    def __iter__(self):
        return (self[i] for i in range(self.batch_size))

    def __getitem__(self, item: int) -> Explanation:
        """Batch item ``item`` as an explanation of batch 1: its scores, tokens, texts, target and
        output value, over its own tokens (its padding left out, by its attention mask). The audit is
        the batch's (the relevance pass sums each node's figures over the batch, so an item's own would
        need its own walk); ``repr`` says so."""
        i = self._item(item)
        n = self.batch_size

        def one(v: Any) -> Any:
            if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == n:
                return v[i:i + 1]
            if isinstance(v, (list, tuple)) and len(v) == n:
                return [v[i]]
            return v

        def own(k: str, v: Tensor) -> Tensor:          # item i's positions that hold tokens (no padding)
            return one(v)[:, self.real[k][i]] if k in self.real else one(v)

        extra = {k: (v[i] if k == "text" and isinstance(v, list) else one(v)) for k, v in self.extra.items()}
        return replace(
            self, output_tensor=one(self.output_tensor), target=[self.target[i]],
            position=self.position[i] if isinstance(self.position, list) else self.position,
            output_value=[self.output_value[i]], relevance={k: own(k, v) for k, v in self.relevance.items()},
            boundary={k: own(k, v) for k, v in self.boundary.items()}, real={},
            tokens=one(self.tokens), texts=one(self.texts), special=one(self.special), word_ids=one(self.word_ids),
            pixels={k: one(v) for k, v in self.pixels.items()}, clip={k: one(v) for k, v in self.clip.items()},
            extra=extra,
            recorded={k: one(v) for k, v in self.recorded.items()},
            inside={k: [x.item(i) for x in v] for k, v in self.inside.items()},
            graph=None if self.graph is None else self.graph.item(i),
            contrast=None if self.contrast is None else [self.contrast[i]],
            item_of=(i, n) if self.item_of is None else self.item_of)

    def output_at(self, position: int | None = None) -> Tensor:
        """``[batch, classes]``: the output at ``position`` (default each item's explained one, else the last
        computed), read through :attr:`rows` (:func:`at_position`)."""
        at = self.position if position is None else position
        if at is None and self.output_tensor.dim() == 3:
            at = (self.rows or [self.output_tensor.shape[1] - 1])[-1]
        return at_position(self.output_tensor, at, self.rows)

    def _item(self, item: Any) -> int:
        """``item`` checked: an int in range (negative counts from the end), else a one-line error."""
        if not isinstance(item, numbers.Integral) or isinstance(item, bool):
            raise InputError(f"a batch item is an int (0…{self.batch_size - 1}), got {item!r}")
        i = int(item) + (self.batch_size if item < 0 else 0)
        if not 0 <= i < self.batch_size:
            raise InputError(f"item {item} is not in this batch of {self.batch_size} (items 0…{self.batch_size - 1})")
        return i

    def _key(self, key: str | None) -> str:
        if key is None:
            return next(iter(self.relevance))
        if key not in self.relevance:
            raise InputError(f"no input named {key!r} in this explanation; its inputs: {', '.join(self.relevance)}")
        return key

    def at(self, selector: str | None = None) -> list:
        """The relevance at the values ``selector`` picked (as given to ``explain(…, at=…)``; default the
        first asked for): an :class:`~rulegraph.inside.Inside` per value, per position and unit."""
        if not self.inside:
            raise InputError("no values were asked for: explain(…, at='block 1 attention output') records them "
                             "(docs/inside.md)")
        if selector is None:
            return next(iter(self.inside.values()))
        if selector not in self.inside:
            raise InputError(f"{selector!r} was not asked for; asked: {', '.join(map(repr, self.inside))}")
        return self.inside[selector]

    def name(self, index: int) -> str:
        """An output index as a reader knows it: its class label, or its token's text (with the id)."""
        if self.labels and 0 <= index < len(self.labels):
            return self.labels[index]
        return f"{self.names[index]!r} ({index})" if index in self.names else str(index)

    def __repr__(self) -> str:
        """One screen: what was explained, the tokens, the strongest for and against, the audit's
        verdict; a batch lists each item in brief, then the batch's audit."""
        if self.batch_size > 1:
            return self._batch_repr()
        from .render.colour import explained_name
        key = next(iter(self.relevance))
        of = f", item {self.item_of[0]} of a batch of {self.item_of[1]}" if self.item_of else ""
        lines = [f"Explanation({self.method}: {explained_name(self)} = {self.output_value[0]:.6g}{of})"]
        if self.boundary[key].dim() == 4:           # an image: its size and where its relevance is, not every pixel
            lines.append(_image_line(key, self.boundary[key][0]))
        elif "audio" in self.extra:                 # a clip: its length and its spans of time for and against
            lines += self._clip_lines(0)
        else:
            tokens, pro, con = self._brief(0, key)
            lines += ["  tokens: " + tokens, "  for: " + pro + "   against: " + con]
        if self.audit is not None:
            lines.append(self._audit_line()
                         + (f" (batch audit: the batch's {self.item_of[1]} items summed)" if self.item_of else ""))
            lines += self._rounding_lines()
        return "\n".join(lines)

    def _batch_repr(self) -> str:
        from .render.colour import explained_name
        key = next(iter(self.relevance))
        lines = [f"Explanation({self.method}: a batch of {self.batch_size} items; e[i] is item i)"]
        for i in range(self.batch_size):
            head = f"  [{i}] {explained_name(self, i)} = {self.output_value[i]:.6g}"
            if self.boundary[key].dim() == 4:
                lines.append(head + _image_line(key, self.boundary[key][i]).replace(f"  image {key}", ";", 1))
            elif "audio" in self.extra:
                lines.append(f"{head}: {self._clip_lines(i)[0].strip()}")
            else:
                tokens, pro, _ = self._brief(i, key, width=60)
                lines.append(f"{head}: {tokens}   for: {pro}")
        if self.audit is not None:
            lines.append(self._audit_line() + f" (the batch's {self.batch_size} items summed)")
            lines += self._rounding_lines()
        return "\n".join(lines)

    def _clip_lines(self, item: int) -> list[str]:
        """A clip's length and the spans of time (:class:`rulegraph.audio.OverTime`) most for and against."""
        from .audio import OverTime
        key = self.extra["audio"]["input"]
        clip = OverTime.of(self.boundary[key][item], self.extra["audio"]["per_second"])
        pro, con = (", ".join(f"{n} {s:+.3g}" for n, s in side) or "—" for side in clip.strongest(3))
        return [f"  clip {key}: {clip.count} {clip.what}, {clip.seconds:.2f} s", f"  for: {pro}   against: {con}"]

    def _brief(self, item: int, key: str, width: int = 100) -> tuple[str, str, str]:
        """Item ``item``'s tokens (shortened to ``width``), its strongest words for and against."""
        from .render.colour import token_texts
        n = len(self.scores(item, key))
        named = self.texts is not None or self.tokens is not None
        tokens = token_texts(self, item, n)
        ranked = sorted(self.words(item, key), key=lambda ws: ws[1])
        return (_shorten("".join(tokens) if named else " ".join(tokens), width),
                ", ".join(f"{w} {s:+.3g}" for w, s in reversed(ranked[-3:]) if s > 0) or "—",
                ", ".join(f"{w} {s:+.3g}" for w, s in ranked[:3] if s < 0) or "—")

    def _audit_line(self) -> str:
        c = self.audit.conservation
        return (f"  audit: residual {c.residual:+.3g} (rel {c.relative_error:.1e}) "
                f"{'ok' if self.audit.ok else 'FLAGGED'}, absorbed {c.absorbed:+.4g}, breaks {c.breaks:+.4g}")

    def _rounding_lines(self) -> list[str]:
        """A quantized graph's forward against onnxruntime's, beside its own rounding (rulegraph.rounding)."""
        return [f"  {self.extra['rounding']['line']}"] if "rounding" in self.extra else []

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
        """Batch item ``item``'s scores, each token's as a bar, or for an image the picture, the
        relevance over it and beside it, or for a clip its relevance over time under its waveform (matplotlib,
        as ``rulegraph explain --png`` draws them); into ``ax`` when given (an image's relevance panel alone);
        returns the figure."""
        from .render.figure import explanation_audio_figure, explanation_figure, explanation_image_figure
        item = self._item(item)
        if any(v.dim() == 4 for v in self.boundary.values()):
            return explanation_image_figure(self, item, ax)
        if "audio" in self.extra:
            return explanation_audio_figure(self, item)
        return explanation_figure(self, item, ax)

    def scores(self, item: int = 0, key: str | None = None) -> list[float]:
        """Per-position scores of batch item ``item`` for one input (``key``; default the first), over
        the item's own tokens (its padding left out, by its attention mask). The former order ``scores(key, item)`` still works: an int is an item, a str an input name."""
        item, key = _item_key(item, key)
        key, item = self._key(key), self._item(item)
        scores = self.relevance[key][item]
        return (scores[self.real[key][item]] if key in self.real else scores).reshape(-1).tolist()

    def words(self, item: int = 0, key: str | None = None) -> list[tuple[str, float]]:
        """Item ``item``'s scores by word, for any method: the tokens of each word of the tokenizer's
        pre-tokenization (``word_ids``, the words of the decomposition's ``groups="word"``) merged, each
        with the sum of its tokens' scores; special tokens left out. Without word ids, a word starts
        after a space; without the tokens' texts, each position is its own word."""
        from .render.colour import token_texts, words
        item, key = _item_key(item, key)
        item = self._item(item)
        scores = self.scores(item, key)
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
            "relevance": {k: ([self.scores(b, k) for b in range(self.batch_size)] if k in self.real else v.tolist())
                          if self.batch_size > 1 else (self.scores(0, k) if k in self.real else v[0].tolist())
                          for k, v in self.relevance.items()},
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
            from .render.colour import shares
            d["conservation"].update(shares(self).to_dict())
        d.update(self.extra)
        if self.inside:
            d["inside"] = {k: [_unbatched(x.to_dict(), self.batch_size) for x in v] for k, v in self.inside.items()}
        if self.graph is not None:          # the relevance graph (graph=True), per item
            graphs = [self.graph.to_dict(b) for b in range(self.batch_size)]
            d["graph"] = graphs[0] if self.batch_size == 1 else graphs
        for key in ("logprob", "objective_value"):
            if key in self.extra and self.batch_size == 1:
                d[key] = self.extra[key][0]
        return d


class Targets(list):
    """Several explanations of one input from one forward and one walk: a list of :class:`Explanation`,
    one per target in the order asked (``explain(…, targets=…)``; for ``"top-K"``, highest first) and, for
    conditions with alternatives (``condition="…:heads=0|1"``), one per map, target by target; each with
    its own audit."""

    def __repr__(self) -> str:
        """One screen: per target (and map) what was explained, its value, its strongest tokens, its audit."""
        from .render.colour import explained_name
        lines = [f"Targets({self[0].method if self else '—'}: {len(self)} explanation(s); t[k] is the k-th)"]
        maps = len({tuple((e.extra.get("condition") or {}).get("conditions", ())) for e in self}) > 1
        for k, e in enumerate(self):
            head = f"  [{k}] {explained_name(e)} = {e.output_value[0]:.6g}"
            if maps:
                head += " | " + "; ".join(e.extra["condition"]["conditions"])
            key = next(iter(e.relevance))
            if e.boundary[key].dim() == 4:
                lines.append(head + _image_line(key, e.boundary[key][0]).replace(f"  image {key}", ";", 1))
            else:
                _, pro, con = e._brief(0, key, width=60)
                lines.append(f"{head}   for: {pro}   against: {con}")
            if e.audit is not None:
                lines.append("    " + e._audit_line().strip())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from .render.page import explanation_fragment
        from .render.colour import explained_name
        return "".join(explanation_fragment(e, explained_name(e)) for e in self)

    def to_html(self, path: str | Path | None = None, *, overwrite: bool = False) -> str:
        """Every target's explanation on one self-contained page; written to ``path`` when given."""
        from .files import write_output
        from .render.page import explanations_page
        page = explanations_page(list(self))
        if path is not None:
            write_output(Path(path), page, overwrite, "the page")
        return page

    def to_dict(self) -> dict:
        return {"targets": [e.to_dict() for e in self]}


def _unbatched(d: dict, batch: int) -> dict:
    """A per-item figure of an :class:`~rulegraph.inside.Inside` as one item's where the batch is one
    (as :meth:`Explanation.to_dict` gives the scores)."""
    if batch == 1:
        d.update({k: d[k][0] for k in ("total", "per_head", "per_unit", "per_position", "relevance") if k in d})
    return d


def _item_key(item: Any, key: Any) -> tuple[Any, Any]:
    """The arguments of ``scores`` / ``words`` in either order, told apart by type (an int is an
    item, a str an input name); anything else is left for the checks to refuse."""
    if (isinstance(item, str) or item is None) and (key is None or isinstance(key, numbers.Integral)):
        return (0 if key is None else key), item           # the former order: scores(key, item)
    if isinstance(key, numbers.Integral) and not isinstance(key, bool):
        raise InputError(f"key is an input name (a str), got {key!r}; the item comes first: scores(item, key=…)")
    return item, key


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
