"""Canonizers: rewrite a graph into an equivalent one the rules treat as intended.

LRP rules see a linear layer's weights; a BatchNormalization after a convolution is a
second affine map, and the modified-weight rules (γ, z⁺, zB…) give a different result
on ``BN ∘ Conv`` than on the single convolution they make together. Zennit's canonizers
merge the two before attributing (``SequentialMergeBatchNorm``); :func:`fold_batchnorm`
does the same on the graph. A rule file asks for it with ``canonize: [batchnorm]``; the
folded graph computes the same function up to rounding (folding is done in float64).
"""
from __future__ import annotations

from typing import Callable

import torch

from .errors import RuleFileError
from .ir import Graph, Node
from .quantization import dequantize
from .final_softmax import final_softmax
from .ops import lookup
from .registry import Registry

#: name → graph rewrite ``Graph -> Graph``; a rule file's ``canonize:`` lists names
CANONIZERS: Registry[Callable[[Graph], Graph]] = Registry("canonizer", RuleFileError)


def canonize(graph: Graph, names: tuple[str, ...] | list[str]) -> Graph:
    """``graph`` with the named canonizers applied, in order (cached on the graph)."""
    if not names:
        return graph
    key = tuple(names)
    cache = graph.cache.canonized
    if key not in cache:
        out = graph
        for name in names:
            out = CANONIZERS.get(name)(out)
        cache[key] = out
    return cache[key]


@CANONIZERS.register("batchnorm")
def fold_batchnorm(graph: Graph) -> Graph:
    """Merge each BatchNormalization into the Conv or Gemm feeding it, when that layer's
    output feeds nothing else and every parameter is a constant:
    ``W' = a·W`` per output channel and ``b' = a·(b − mean) + β`` with ``a = γ/√(var + ε)``."""
    constants = dict(graph.constants)
    merged: dict[str, Node] = {}      # layer node name → replacement
    dropped: set[str] = set()
    for bn in graph.nodes:
        if bn.op != "BatchNormalization" or bn.attrs.get("training_mode", 0):
            continue
        layer = graph.producer.get(bn.inputs[0])
        if layer is None or layer.op not in ("Conv", "Gemm") or layer.name in merged:
            continue
        if len(graph.consumers.get(bn.inputs[0], [])) != 1 or bn.inputs[0] in graph.outputs:
            continue
        params = [v for v in (*bn.inputs[1:5], *layer.inputs[1:]) if v]
        if any(_constant(graph, v) is None for v in params):
            continue
        if layer.op == "Gemm" and (layer.attrs.get("alpha", 1.0) != 1.0 or layer.attrs.get("beta", 1.0) != 1.0
                                   or layer.attrs.get("transA", 0)):
            continue
        scale, beta, mean, var = (_constant(graph, v).double() for v in bn.inputs[1:5])
        a = scale / torch.sqrt(var + {**lookup("BatchNormalization").defaults, **bn.attrs}["epsilon"])
        w = _constant(graph, layer.inputs[1]).double()
        if layer.op == "Conv":
            w = w * a.reshape(-1, *([1] * (w.dim() - 1)))
        elif layer.attrs.get("transB", 0):
            w = w * a.reshape(-1, 1)
        else:
            w = w * a.reshape(1, -1)
        b = _constant(graph, layer.inputs[2]).double() if len(layer.inputs) > 2 and layer.inputs[2] else torch.zeros_like(a)
        w_name, b_name = f"{layer.name}::folded_weight", f"{layer.name}::folded_bias"
        constants[w_name], constants[b_name] = w, a * (b - mean) + beta
        merged[layer.name] = Node(layer.name, layer.op, (layer.inputs[0], w_name, b_name), bn.outputs,
                                  dict(layer.attrs), layer.domain, layer.scope)
        dropped.add(bn.name)
    if not merged:
        return graph
    nodes = [merged.get(n.name, n) if n.name not in dropped else None for n in graph.nodes]
    nodes = [Node(n.name, n.op, n.inputs, n.outputs, dict(n.attrs), n.domain, n.scope) for n in nodes if n is not None]
    used = {v for n in nodes for v in n.inputs}
    constants = {k: v for k, v in constants.items() if k in used or k in graph.outputs}
    nodes = [n for n in nodes if n.op != "Identity" or any(v in used or v in graph.outputs for v in n.outputs)]
    return Graph(nodes, graph.inputs, graph.outputs, constants, opset=graph.opset, name=graph.name,
                 metadata=graph.metadata, source=graph.source)


def _constant(graph: Graph, value: str) -> torch.Tensor | None:
    """The tensor ``value`` holds when it is an initializer, possibly behind Identity nodes."""
    for _ in range(16):
        if value in graph.constants:
            return graph.constants[value]
        producer = graph.producer.get(value)
        if producer is None or producer.op != "Identity":
            return None
        value = producer.inputs[0]
    return None



CANONIZERS.add("quantization", dequantize)
CANONIZERS.add("final-softmax", final_softmax)
