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


from .tolerances import relative

#: the name ending of the nodes where a quantized graph's quantization error joins (rulegraph.canonize.quantization):
#: what they absorb is the audit's ``quantization`` figure
QUANTIZATION = "::quantization"


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
        return relative(terms[0] - terms[1] - terms[2] - terms[3], *terms)


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
    #: per mixture-of-experts block, the relevance each expert received (rulegraph.experts.ExpertAudit)
    experts: list = field(default_factory=list)

    @property
    def unexpected(self) -> list[NodeAudit]:
        """Conserving nodes whose relative error exceeds the tolerance."""
        return [n for n in self.nodes if n.conserving and n.relative_error > self.tolerance]

    @property
    def expected(self) -> list[NodeAudit]:
        """Nodes whose rule does not conserve there by design and broke conservation (breaks ≠ 0)."""
        return [n for n in self.nodes if not n.conserving and n.breaks != 0.0]

    @property
    def quantization(self) -> float:
        """Relevance absorbed by the quantization error of a quantized graph (0 for a float one)."""
        return sum(n.absorbed for n in self.nodes if n.name.endswith(QUANTIZATION))

    @property
    def ok(self) -> bool:
        return self.conservation.relative_error <= self.tolerance

    def to_dict(self) -> dict:
        c = asdict(self.conservation)
        c["residual_flagged"] = not self.ok
        c["quantization"] = self.quantization
        return {
            "conservation": c,
            "tolerance": self.tolerance,
            "layers": [{**asdict(layer), "relative_error": layer.relative_error} for layer in self.layers],
            "experts": [asdict(x) for x in self.experts],
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
