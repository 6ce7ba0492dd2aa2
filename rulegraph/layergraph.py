"""The relevance graph of a transformer: positions × layers, from the input tokens through each
block's residual stream and attention heads to the explained output (``explain(…, graph=True)``,
``rulegraph explain --graph out.json|out.html|out.png``).

**Nodes** are (layer, position): ``N[l, p] = Σ_i R(h_l)[p, i]``, the relevance the walk brings to the
hidden state ``h_l`` at position ``p`` (:func:`rulegraph.stream.hidden_states`: ``h_0`` what the
embeddings hand to block 0, ``h_l`` what block ``l − 1`` hands on). Each ``h_l`` is a cut of the graph, so
the ledger's conservation holds between them: ``Σ_p N[l, p] = Σ_p N[l + 1, p] − A_l`` with ``A_l`` what
the nodes of block ``l`` absorbed or broke (the audit's own figures).

**Edges** are the attention's messages from query ``q`` to key ``k`` in block ``l`` and head ``h``: the
value product ``O[h, q, d] = Σ_k P[h, q, k] · V[h, k, d]`` receives ``R_O[h, q, d]`` from the walk, and
the z-rule of LRP (Bach et al. 2015, "On Pixel-Wise Explanations for Non-Linear Classifier Decisions by
Layer-Wise Relevance Propagation", PLOS ONE) splits it over the summands::

    E[l, h, q, k] = Σ_d  P[h, q, k] · V[h, k, d] / O[h, q, d] · R_O[h, q, d]     (0 where O = 0)

— the message AttnLRP's uniform rule for a product of two activations then halves between the value
``V[k]`` and the probability ``P[q, k]`` (Achtibat et al. 2024, "AttnLRP: Attention-Aware Layer-Wise
Relevance Propagation for Transformers", ICML). Summed over keys, the edges into a query are
the relevance at the attention output there: ``Σ_k E[l, h, q, k] = Σ_d R_O[h, q, d]`` (where ``O ≠ 0``),
the per-(position, head) relevance ``--at "block l attention output"`` returns. The rest of ``N[l+1, q]``
stays at position ``q`` (the residual path, the MLP) or is absorbed; the relevance that reaches the
probabilities reaches query and key positions through the scores.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .errors import ModelError
from .ir import Graph, Node

Tensor = torch.Tensor

#: the strongest token-to-token edges listed (``paths``) and drawn, per block
TOP_EDGES = 8


@dataclass(frozen=True)
class Sites:
    """The values a relevance graph reads: the hidden states and each block's value product."""

    states: list[str]                 # h_0 … h_L
    products: list[Node]              # the value product of block 0 … L − 1
    producers: list[str]              # the node producing each hidden state

    @property
    def recorded(self) -> frozenset[str]:
        """Where the walk records relevance: the hidden states and the value products' outputs."""
        return frozenset(self.states) | frozenset(p.outputs[0] for p in self.products)

    @property
    def kept(self) -> frozenset[str]:
        """The forward values read afterwards: the probabilities and values each product multiplies."""
        return frozenset(v for p in self.products for v in p.inputs[:2])


def sites(graph: Graph) -> Sites:
    """The hidden states and the value product of each block, refused where they do not pair up."""
    from .heads import attention_nodes, block_numbers
    from .stream import hidden_states
    states = hidden_states(graph)
    numbers = block_numbers(graph)
    products = sorted((p for _, p in attention_nodes(graph)), key=lambda p: numbers[p.name])
    if len(products) != len(states) - 1 or [numbers[p.name] for p in products] != list(range(len(products))):
        raise ModelError(f"the relevance graph needs one attention block per transformer block; the graph has "
                         f"{len(states) - 1} blocks and {len(products)} attention value products")
    return Sites(states, products, [graph.producer[v].name for v in states])


@dataclass
class RelevanceGraph:
    """Relevance per (layer, position) and the attention's query → key messages between layers."""

    layers: list[str]                 # "embeddings", "block 0", …: the hidden state each row holds
    states: list[str]                 # the hidden states' value names
    nodes: Tensor                     # [batch, layers, positions]: N[l, p]
    edges: list[Tensor]               # per block [batch, heads, query, key]: E[l, h, q, k]
    absorbed: list[float] | None      # per block: what its nodes absorbed or broke (None: no audit)
    output: list[float]               # the explained value, per batch item
    tokens: list[list[str]] | None = None   # per item, as the reader sees them (set by the API)

    def names(self, item: int = 0) -> list[str]:
        """Each position's token as a reader sees it (its number where the tokens are not known or padded)."""
        positions = self.nodes.shape[2]
        tokens = self.tokens[item] if self.tokens else []
        return [*tokens, *map(str, range(len(tokens), positions))][:positions]

    def paths(self, item: int = 0, top: int = TOP_EDGES) -> list[dict[str, Any]]:
        """Per block the ``top`` strongest token-to-token edges by |E| (over heads), strongest first, each with
        its share of the relevance at the attention output of its query and its strongest head."""
        out = []
        for b, e in enumerate(self.edges):
            summed = e[item].sum(0)
            into = summed.sum(1)
            order = summed.abs().flatten().argsort(descending=True, stable=True)[:top]
            for flat in order.tolist():
                q, k = divmod(flat, summed.shape[1])
                heads = e[item, :, q, k]
                out.append({"block": b, "query": q, "key": k, "relevance": float(summed[q, k]),
                            "share": float(summed[q, k] / into[q]) if into[q] != 0 else None,
                            "head": int(heads.abs().argmax())})
        return out

    def item(self, i: int) -> RelevanceGraph:
        return RelevanceGraph(self.layers, self.states, self.nodes[i:i + 1], [e[i:i + 1] for e in self.edges],
                              self.absorbed, [self.output[i]], [self.tokens[i]] if self.tokens else None)

    def to_dict(self, item: int = 0) -> dict[str, Any]:
        tokens = self.names(item)
        return {"layers": self.layers, "states": self.states, "tokens": tokens, "output": self.output[item],
                "nodes": self.nodes[item].tolist(), "absorbed": self.absorbed,
                "attention": [{"block": b, "heads": e.shape[1], "into": e[item].sum(2).T.tolist(),
                               "edges": e[item].sum(0).tolist(), "per_head": e[item].tolist()}
                              for b, e in enumerate(self.edges)],
                "paths": self.paths(item),
                "formula": "nodes[l][p] = Σ_i R(h_l)[p,i]; "
                           "edges E[l,h,q,k] = Σ_d P[h,q,k]·V[h,k,d]/O[h,q,d]·R_O[h,q,d] (docs/inside.md)"}

    def _repr_html_(self) -> str:
        """The layered flow diagram as SVG (a notebook shows it; :func:`rulegraph.render.flow.svg`)."""
        from .render.flow import svg
        return f'<div class="rulegraph" style="overflow-x:auto">{svg(self)}</div>'

    def plot(self, item: int = 0):
        """The diagram as a matplotlib figure (:func:`rulegraph.render.flow.figure`)."""
        from .render.flow import figure
        return figure(self, item)

    def __repr__(self) -> str:
        return (f"RelevanceGraph({len(self.layers)} layers × {self.nodes.shape[2]} positions, "
                f"{len(self.edges)} attention blocks)")


def build(found: Sites, recorded: dict[str, Tensor], values: Any, plan: Any, audit: Any,
          output: list[float]) -> RelevanceGraph:
    """The graph from the relevance the walk recorded (and brought to the boundary, where ``h_0`` is a token
    lookup's output) and the forward's values (computed again where the forward
    freed them) — see the module doc for the formulas."""
    def value(v: str) -> Tensor:
        return (values[v] if v in values else plan.recompute(values, v)).detach().double().cpu()

    def arrived(v: str) -> Tensor:
        r = recorded.get(v)
        return torch.zeros_like(value(v)) if r is None else r.detach().double().cpu()

    nodes = torch.stack([r.flatten(2).sum(2) if r.dim() > 2 else r for r in map(arrived, found.states)], 1)
    edges = []
    for p in found.products:
        probs, v, o = value(p.inputs[0]), value(p.inputs[1]), value(p.outputs[0])
        if probs.dim() != 4 or v.dim() != 4 or o.dim() != 4:
            raise ModelError(f"attention at {p.name!r}: probabilities {tuple(probs.shape)}, values {tuple(v.shape)}; "
                             "expected [batch, heads, query, key] and [batch, heads, key, d]")
        if v.shape[1] != probs.shape[1]:            # grouped queries: each value head serves several
            v = v.repeat_interleave(probs.shape[1] // v.shape[1], 1)
        ratio = torch.where(o != 0, arrived(p.outputs[0]) / torch.where(o != 0, o, 1), 0)
        edges.append(probs * torch.einsum("bhkd,bhqd->bhqk", v, ratio))
    absorbed = _absorbed(found, audit) if audit is not None else None
    layers = ["embeddings", *(f"block {b}" for b in range(len(found.products)))]
    return RelevanceGraph(layers, found.states, nodes, edges, absorbed, output)


def _absorbed(found: Sites, audit: Any) -> list[float] | None:
    """Per block ``l``, what the audited nodes between ``h_l`` and ``h_{l+1}`` absorbed or broke: in walk order
    (last node first), from the producer of ``h_{l+1}`` (it included) to that of ``h_l`` (it excluded)."""
    nodes = [n for n in audit.nodes if n.rule != "boundary"]
    at = {n.name: i for i, n in enumerate(nodes)}
    at.setdefault(found.producers[0], len(nodes))       # h_0 the boundary (a token lookup): the walk's end
    if not all(p in at for p in found.producers):
        return None
    k = [at[p] for p in found.producers]
    return [sum(n.absorbed + n.breaks for n in nodes[k[b + 1]:k[b]]) for b in range(len(k) - 1)]
