"""Producer patterns: what feeds a node's input, looking back through some ops.

A :class:`Pattern` is what a rule-file entry's ``inputs:`` says of one input::

    inputs:
      0: {from: Softmax, through: routing}                      # attention probabilities
      1: {from: sigmoidal, through: [arithmetic, routing]}      # the gate of x · ½(1 + erf(x/√2))

Names are op types (``Softmax``) or op traits (``routing``, ``sigmoidal``…: the lowercase names
of :data:`rulegraph.ops.TRAITS`, declared once per op in :mod:`rulegraph.ops`); ``from`` also
takes ``input`` (a graph input), ``constant`` (an initializer, or a value computed from
initializers only) and ``*`` (any producer). A pattern the code defines is registered under a
hyphenated name (:data:`PATTERNS`, :func:`named`), and a rule file names it alone, without
``through``, so the code that reads the graph and the rule files that assign rules mean the same
values::

    inputs:
      0: {from: attention-probabilities}                        # PROBABILITIES below Looking through an op means following its first
data input (:meth:`~rulegraph.ops.OpSpec.data_inputs`: Where's branches, not its condition)
that is not a constant. Ops declared ``transparent`` (a quantized graph's quantize–dequantize round
trips, :mod:`rulegraph.canonize.quantization`) are looked through always.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import RuleFileError
from .ir import Graph, Node
from .ops import TRAITS, OpSpec, find
from .registry import Registry

#: what ``from`` takes besides op types and traits
SPECIAL_SOURCES = ("input", "constant", "*")
#: how many ops a pattern looks through at most
DEPTH = 64


def names_op(node: Node, spec: OpSpec | None, names: tuple[str, ...]) -> bool:
    """Whether ``names`` (op types, traits, ``*``) include ``node``."""
    return "*" in names or node.op in names or \
        spec is not None and any(getattr(spec, n) for n in names if n in TRAITS)


@dataclass(frozen=True)
class Pattern:
    """``from``: what produces the value (op types, traits, ``input``, ``constant``, ``*``),
    looking back through ``through`` ops (op types or traits)."""

    sources: tuple[str, ...]
    through: tuple[str, ...] = ()

    def source(self, graph: Graph, value: str) -> Node | str | None:
        """What the pattern found feeding ``value``: the producing node, ``"input"`` or
        ``"constant"``; ``None`` when it does not match."""
        for _ in range(DEPTH):
            if value in graph.constant_values:
                return "constant" if "constant" in self.sources else None
            if value in graph.input_names:
                return "input" if "input" in self.sources else None
            producer = graph.producer.get(value)
            if producer is None:
                return None
            spec = find(producer.op, producer.domain)
            if names_op(producer, spec, self.sources):
                return producer
            if spec is not None and spec.transparent:          # a quantize–dequantize round trip
                value = producer.inputs[0]
                continue
            if not names_op(producer, spec, self.through) or spec is None:
                return None
            value = next((producer.inputs[i] for i in spec.data_inputs(producer)
                          if producer.inputs[i] and producer.inputs[i] not in graph.constant_values), None)
            if value is None:
                return None
        return None

    def matches(self, graph: Graph, value: str) -> bool:
        return self.source(graph, value) is not None


#: name → a pattern defined in code, as a rule file names it (``from: attention-probabilities``)
PATTERNS: Registry[Pattern] = Registry("pattern", RuleFileError)


def named(name: str, pattern: Pattern) -> Pattern:
    """Register ``pattern`` under ``name`` (hyphenated: never an op type or a trait) and return it."""
    PATTERNS.add(name, pattern)
    return pattern


#: the attention probabilities: a Softmax's output, moved or guarded by routing ops (the Where of an
#: SDPA export's NaN guard, a Cast, Dropout, a Reshape)
PROBABILITIES = named("attention-probabilities", Pattern(("Softmax",), ("routing",)))
#: an exported RMSNorm's factor 1/√(mean x² + ε): a Reciprocal (dynamo export) or a Div(1, Sqrt)
#: (TorchScript export), possibly cast
RMS_FACTOR = named("rms-factor", Pattern(("Reciprocal", "Sqrt"), ("Cast", "Div")))
#: an exported LayerNorm's standard deviation √(Var[x] + ε) (Sub/Pow/ReduceMean/Add/Sqrt/Div), the divisor
STD = named("layernorm-std", Pattern(("Sqrt",)))
#: the gate of an exported activation, x · ½(1 + erf(x/√2)) (GELU), with tanh, or x · sigmoid(x) (SiLU):
#: a sigmoidal op's output, through the arithmetic and routing around it
GATE = named("activation-gate", Pattern(("sigmoidal",), ("arithmetic", "routing")))
#: the kernel of Mamba's selective scan in the closed form of ``exporters/ssm.py``,
#: K_{t,s} = Σ_n C_{t,n} exp(A_n (S_t − S_s)) Δ_s B_{s,n}, the first input of its product with x: a sum over
#: the states of exponentials of differences of a cumulative sum of the time steps
SCAN_KERNEL = named("selective-scan-kernel", Pattern(("CumSum",), ("ReduceSum", "Exp", "arithmetic", "routing")))
