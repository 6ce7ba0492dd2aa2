"""Conservation audit: where relevance was kept, absorbed, broken or lost.

Per node (from the tensors each rule produced):

``relevance_in``   Σ relevance arriving at the node's outputs
``relevance_out``  Σ relevance handed to its relevance-carrying inputs
``absorbed``       Σ relevance handed to constants (biases, position embeddings,
                   LayerNorm β, masks) and to stabilisers (ε)
``breaks``         in − out − absorbed, for a rule that does not conserve on this node
                   by design (GI through GELU, the AttnLRP softmax rule, ``stop``):
                   an *expected* break; each rule says how it departs from
                   conservation (``Rule.breaking``, reported per node as ``semantics``)
``error``          the same difference for a rule that should conserve — rounding,
                   or a defect; above the tolerance it is an *unexpected* break; ``relative_error`` is it over the largest of |in|,
                   |out|, |absorbed| and, where those cancel, Σ|R| arriving (GI's
                   relevance after a LayerNorm sums to ~0 from large terms)

Per layer (``embeddings`` / ``block i`` / ``head``), ``relevance_in`` and
``relevance_out`` are the flows crossing the layer's border. For the graph:
Σ boundary relevance + Σ absorbed + Σ breaks should reconstruct the explained
output; the remainder is the *unexplained residual* (rounding at conserving nodes,
and relevance stranded where no rule took it). With a batch, every figure is the
sum over the batch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from .relevance import Flow
from .ruleset import Binding
from .rules import RULES

#: a conserving node whose relative error exceeds this is flagged, per dtype
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-9}


@dataclass
class NodeAudit:
    name: str
    op: str
    layer: str
    rule: str
    where: str
    conserving: bool
    relevance_in: float
    relevance_out: float
    absorbed: float
    breaks: float
    error: float
    relative_error: float
    semantics: str = ""       # how the rule departs from conservation (Rule.breaking)


@dataclass
class LayerAudit:
    name: str
    relevance_in: float = 0.0
    relevance_out: float = 0.0
    absorbed: float = 0.0
    breaks: float = 0.0
    nodes: int = 0

    @property
    def relative_error(self) -> float:
        """|in − out − absorbed − breaks| over the largest of those four magnitudes."""
        terms = (self.relevance_in, self.relevance_out, self.absorbed, self.breaks)
        gap = terms[0] - terms[1] - terms[2] - terms[3]
        return abs(gap) / max(max(map(abs, terms)), 1e-30)


@dataclass
class Conservation:
    output_value: float
    input_total: float
    absorbed: float
    breaks: float
    residual: float
    relative_error: float
    stranded: dict[str, float] = field(default_factory=dict)


@dataclass
class Audit:
    conservation: Conservation
    layers: list[LayerAudit]
    nodes: list[NodeAudit]
    tolerance: float

    @property
    def unexpected(self) -> list[NodeAudit]:
        """Conserving nodes whose relative error exceeds the tolerance."""
        return [n for n in self.nodes if n.conserving and n.relative_error > self.tolerance]

    @property
    def expected(self) -> list[NodeAudit]:
        """Nodes whose rule does not conserve there by design and broke conservation (breaks ≠ 0)."""
        return [n for n in self.nodes if not n.conserving and n.breaks != 0.0]

    @property
    def ok(self) -> bool:
        return self.conservation.relative_error <= self.tolerance

    def to_dict(self) -> dict:
        c = asdict(self.conservation)
        c["residual_flagged"] = not self.ok
        return {
            "conservation": c,
            "tolerance": self.tolerance,
            "layers": [{**asdict(layer), "relative_error": layer.relative_error} for layer in self.layers],
            "unexpected": [n.name for n in self.unexpected],
            "expected_breaks": {
                "total": sum(n.breaks for n in self.expected),
                "by_rule": _by_rule(self.expected, "breaks"),
                "nodes": [n.name for n in self.expected],
            },
            "unexpected_breaks": {
                "total": sum(n.error for n in self.unexpected),
                "by_rule": _by_rule(self.unexpected, "error"),
                "nodes": [{"name": n.name, "rule": n.rule, "error": n.error, "relative_error": n.relative_error}
                          for n in self.unexpected],
            },
        }


def _by_rule(nodes: list[NodeAudit], figure: str) -> dict[str, dict]:
    """Per rule: how many nodes, their summed figure, and how the rule departs from conservation."""
    out: dict[str, dict] = {}
    for n in nodes:
        d = out.setdefault(n.rule, {"nodes": 0, figure: 0.0, "semantics": n.semantics})
        d["nodes"] += 1
        d[figure] += getattr(n, figure)
    return out


def build_audit(flow: Flow, binding: Binding, dtype: torch.dtype) -> Audit:
    """Aggregate a finished :class:`Flow` per node, per layer and for the graph."""
    graph = binding.graph
    layer_of = graph.layers
    nodes = []
    for rec in flow.nodes:
        node = graph.node(rec.name)
        gap = rec.relevance_in - rec.relevance_out - rec.absorbed
        nodes.append(NodeAudit(
            name=rec.name, op=node.op, layer=layer_of[rec.name], rule=rec.rule, where=rec.where,
            conserving=rec.conserving, relevance_in=rec.relevance_in, relevance_out=rec.relevance_out,
            absorbed=rec.absorbed, breaks=0.0 if rec.conserving else gap, error=gap if rec.conserving else 0.0,
            relative_error=abs(gap) / max(rec.mass_in, abs(rec.relevance_in), abs(rec.relevance_out),
                                          abs(rec.absorbed), 1e-30) if rec.conserving else 0.0,
            semantics=RULES[rec.rule].breaking if rec.rule in RULES else ""))

    layers: dict[str, LayerAudit] = {}
    for n in sorted(nodes, key=lambda n: graph.node(n.name).index):
        layer = layers.setdefault(n.layer, LayerAudit(n.layer))
        layer.absorbed += n.absorbed
        layer.breaks += n.breaks
        layer.nodes += 1
    for e in flow.edges:
        src = layer_of[e.producer] if e.producer is not None else "input"
        dst = layer_of[e.consumer] if e.consumer is not None else "output"
        if src == dst:
            continue
        if src in layers:
            layers[src].relevance_in += e.amount
        if dst in layers:
            layers[dst].relevance_out += e.amount

    output_value = float(flow.output_relevance.double().sum())
    input_total = float(sum(torch.nansum(t.double()) for t in flow.boundary.values())) if flow.boundary else 0.0
    absorbed = sum(n.absorbed for n in nodes)
    breaks = sum(n.breaks for n in nodes)
    residual = output_value - input_total - absorbed - breaks
    conservation = Conservation(
        output_value=output_value, input_total=input_total, absorbed=absorbed, breaks=breaks,
        residual=residual, relative_error=abs(residual) / max(abs(output_value), 1e-30),
        stranded={k: float(v) for k, v in flow.stranded.items()})
    return Audit(conservation, list(layers.values()), nodes, TOLERANCE.get(dtype, 1e-4))
