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

:meth:`Conservation.summary` says the graph's figures in words: the share of the explained
value that the input tokens carry, that constants absorbed, that rules broke by design, and
what is left unexplained, flagged when the tokens carry under half of it or the opposite sign.
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


#: the shipped rule sets under which the explained value reaches the tokens with no break on a
#: transformer (each rule conserves on every node it meets; only constants and ε absorb);
#: tests/test_conservation_words.py checks the list against the audits of every shipped set
CONSERVE_TO_TOKENS = ("epsilon", "cp-lrp")
#: below this share of the explained value the tokens are said to carry "little" of it
LITTLE = 0.5
#: an explained value under this fraction of the largest part (tokens, absorbed, breaks) is "near 0":
#: shares of it would be huge numbers that mean nothing
NEAR_ZERO = 0.01


@dataclass
class Shares:
    """The explained value split into what the tokens carry, what constants absorbed, what rules
    broke by design and the unexplained residual (fractions of the explained value; they add to 1
    up to rounding, ``None`` each when the explained value is near 0), and the sentence saying it."""

    tokens: float | None
    absorbed: float | None
    breaks: float | None
    residual: float | None
    flagged: bool
    near_zero: bool
    sentence: str

    def to_dict(self) -> dict:
        """JSON's ``conservation.shares`` (the fractions and the flags) and ``conservation.sentence``."""
        words = asdict(self)
        return {"sentence": words.pop("sentence"), "shares": words}


@dataclass
class Conservation:
    output_value: float
    input_total: float
    absorbed: float
    breaks: float
    residual: float
    relative_error: float
    stranded: dict[str, float] = field(default_factory=dict)

    def summary(self, method: str = "", items: int = 1, inputs: str = "tokens") -> Shares:
        """The shares of the explained value in one sentence a reader can act on. ``method``: the
        rule set's name (the advice names the sets that conserve to the tokens, not this one);
        ``items``: the batch size (the figures are then the batch's sums, said so); ``inputs``: what
        the boundary relevance sits on (``tokens``, ``pixels``)."""
        v = self.output_value
        parts = {"tokens": self.input_total, "absorbed": self.absorbed, "breaks": self.breaks, "residual": self.residual}
        batch = f" (the batch's {items} items summed: the audit is for the whole batch)" if items > 1 else ""
        largest = max(abs(self.input_total), abs(self.absorbed), abs(self.breaks))
        if v == 0 or abs(v) < NEAR_ZERO * largest:
            return Shares(None, None, None, None, False, True,
                          f"the explained value {v:+.3g}{batch} is near 0 next to its parts ({inputs} "
                          f"{self.input_total:+.3g}, absorbed {self.absorbed:+.3g}, broken by design {self.breaks:+.3g}): "
                          "shares of it would mean nothing; read the scores against those parts")
        share = {k: x / v for k, x in parts.items()}
        flagged = share["tokens"] < LITTLE
        sentence = (f"the {inputs} carry {_pct(share['tokens'])} of the explained value {v:+.4g}{batch}, constants "
                    f"(absorbed: biases, LayerNorm β, ε, …) {_pct(share['absorbed'])}, broken by design "
                    f"{_pct(share['breaks'])}, unexplained {_pct(share['residual'])}")
        if flagged:
            why = "the opposite sign" if share["tokens"] < 0 else f"under {LITTLE:.0%} of it"
            others = [f"`{m}`" for m in CONSERVE_TO_TOKENS if m != method and inputs == "tokens"]
            advice = (f"for scores that carry it, use a rule set that conserves to the tokens ({' or '.join(others)}: "
                      "no breaks, only constants absorb)" if others and abs(share["breaks"]) > abs(share["absorbed"])
                      else "the constants took most of it: the scores are what biases, LayerNorm β and ε left"
                      if abs(share["absorbed"]) >= abs(share["breaks"]) else "the rules' breaks took most of it")
            sentence += f" — FLAGGED: the {inputs} carry {why}, so their scores tell only part of the story; {advice}"
        return Shares(share["tokens"], share["absorbed"], share["breaks"], share["residual"], flagged, False, sentence)


def _pct(x: float) -> str:
    return f"{x:+.0%}" if abs(x) >= 0.01 else f"{x:+.1%}"


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
