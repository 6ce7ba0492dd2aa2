"""The entry point :func:`load_fx`: walk the program's fx graph with a
:class:`~rulegraph.loaders.fx.builder.Builder`, binding placeholders to user inputs or to
the program's parameters, buffers and lifted constants, then drop the nodes no output
reaches.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from ...errors import ModelError, UnsupportedOpError, choices
from ...ir import Graph, Node, ValueInfo
from .builder import LOWERINGS, Builder, Tensor, target_name

DEFAULT_OPSET = 18


# -- entry point ---------------------------------------------------------------------------------

def load_fx(program: "torch.export.ExportedProgram | fx.GraphModule", *, opset: int = DEFAULT_OPSET) -> Graph:
    """Lower a :func:`torch.export.export` program (or the GraphModule it wraps) to the IR.

    ``opset`` is the ONNX opset the lowering mirrors (18 by default; from 20 on
    ``aten.gelu`` becomes a ``Gelu`` node). Raises :class:`UnsupportedOpError` naming every
    fx target without a lowering at once, and :class:`ModelError` for programs it cannot read.
    """
    if isinstance(program, torch.export.ExportedProgram):
        gm, signature = program.graph_module, program.graph_signature
        source = "fx:ExportedProgram"
    elif isinstance(program, fx.GraphModule):
        gm, signature = program, None
        source = "fx:GraphModule"
    else:
        raise ModelError(f"load_fx takes a torch.export.ExportedProgram or an fx GraphModule, "
                         f"not a {type(program).__name__}")
    _refuse_unlowered(gm)
    b = Builder(opset)
    outputs: list[str] = []
    inputs: list[ValueInfo] = []
    specs = {}
    if signature is not None:
        specs = {s.arg.name: s for s in signature.input_specs if hasattr(s.arg, "name")}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            spec = specs.get(n.name)
            kind = spec.kind.name if spec is not None else "USER_INPUT"
            if kind == "USER_INPUT":
                inputs.append(b.user_input(n))
            elif kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
                b.env[n.name] = b.state(spec.target, _program_tensor(program, spec.target, n.name))
            else:
                raise ModelError(f"fx placeholder {n.name!r} is a {kind} input, which rulegraph does not support")
        elif n.op == "get_attr":
            value = _attribute(gm, n.target)
            if not isinstance(value, Tensor):
                raise ModelError(f"fx node {n.name!r} reads attribute {n.target!r}, a {type(value).__name__}; "
                                 "only tensors are supported")
            b.env[n.name] = b.state(n.target, value)
        elif n.op == "call_function":
            b.call(n)
        elif n.op == "call_module":
            if str(n.target).startswith("_guards"):
                b.env[n.name] = None  # torch.export's input guards
                continue
            raise UnsupportedOpError(f"fx node {n.name!r} calls submodule {n.target!r}; "
                                     "give the program from torch.export (all modules inlined)")
        elif n.op == "call_method":
            raise UnsupportedOpError(f"fx node {n.name!r} calls method {n.target!r}; "
                                     "give the program from torch.export (aten ops only)")
        elif n.op == "output":
            outputs = b.outputs(n, signature)
    nodes = _prune(b.nodes, outputs)
    used = {v for node in nodes for v in node.inputs} | set(outputs)
    constants = {k: v for k, v in b.constants.items() if k in used}
    return Graph(nodes, inputs, outputs, constants, opset=opset, name=b.root_name, source=source)


def _refuse_unlowered(gm: fx.GraphModule) -> None:
    """One error for every aten target the program calls that has no lowering: the first with its
    node and the closest lowered targets, the others with their node count and first node."""
    missing: dict[str, list[str]] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and target_name(n.target) not in LOWERINGS:
            missing.setdefault(target_name(n.target), []).append(n.name)
    if not missing:
        return
    (first, names), *others = missing.items()
    more = "; ".join(f"{t} ({len(ns)} node(s), first {ns[0]!r})" for t, ns in others)
    also = f" (nor do {len(others)} more target(s): {more})" if others else ""
    raise UnsupportedOpError(f"fx node {names[0]!r}: target {first} has no lowering in rulegraph's fx loader{also}; "
                             f"{choices(LOWERINGS, first)}")


def _program_tensor(program, target: str, name: str) -> Tensor:
    if target in program.state_dict:
        return program.state_dict[target]
    if target in program.constants:
        value = program.constants[target]
        if isinstance(value, Tensor):
            return value
    raise ModelError(f"fx placeholder {name!r} refers to {target!r}, which the program's state_dict "
                     "and constants do not hold")


def _attribute(gm: fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _prune(nodes: list[Node], outputs: list[str]) -> list[Node]:
    """Drop nodes none of whose outputs reach a graph output."""
    live = set(outputs)
    keep = []
    for node in reversed(nodes):
        if any(v in live for v in node.outputs):
            keep.append(node)
            live.update(v for v in node.inputs if v)
    return keep[::-1]
