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
    ``aten.gelu`` becomes a ``Gelu`` node). A program that mutates tensors in place (``aten.add_``,
    T5's relative-position buckets) is functionalized first (:func:`functional`). Raises
    :class:`UnsupportedOpError` naming the fx targets without a lowering in one line, and
    :class:`ModelError` for programs it cannot read.
    """
    if isinstance(program, torch.export.ExportedProgram):
        program = functional(program)
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


def mutates(gm: fx.GraphModule) -> bool:
    """Whether the graph calls an op that writes into one of its arguments (``aten.add_``, ``aten.copy_``…)."""
    return any(n.op == "call_function" and getattr(getattr(n.target, "_schema", None), "is_mutable", False)
               for n in gm.graph.nodes)


def functional(program: "torch.export.ExportedProgram") -> "torch.export.ExportedProgram":
    """``program`` with its in-place ops replaced by their functional forms, where it has any.

    ``torch.export`` returns its training IR, which keeps in-place ops (``x += y`` as ``aten.add_``);
    ``run_decompositions`` with an empty table functionalizes it (every mutation an out-of-place op
    whose result later readers take, a buffer's a program output) and decomposes nothing else.
    A program without in-place ops is returned as it is, so its lowering is unchanged."""
    if not mutates(program.graph_module):
        return program
    try:
        return program.run_decompositions({})
    except Exception:           # torch cannot functionalize it: the refusal names the in-place ops left
        return program


#: the unlowered targets a refusal names (the others are counted)
NAMED = 3


def _refuse_unlowered(gm: fx.GraphModule) -> None:
    """One short line for the aten targets the program calls that have no lowering: the first with its
    node and the closest lowered targets, up to :data:`NAMED` in all with their node counts, and the next
    step (an ONNX export)."""
    missing: dict[str, list[str]] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and target_name(n.target) not in LOWERINGS:
            missing.setdefault(target_name(n.target), []).append(n.name)
    if not missing:
        return
    (first, names), *others = missing.items()
    close = choices(LOWERINGS, first).partition("valid: ")[0].strip()
    more = "; ".join(f"{t} ({len(ns)} node(s), first {ns[0]!r})" for t, ns in others[:NAMED - 1])
    more += f"; and {len(others) - NAMED + 1} more" if len(others) >= NAMED else ""
    also = f" (nor do {len(others)} more target(s): {more})" if others else ""
    hint = f" ({close.rstrip('? ')}?)" if close else ""
    raise UnsupportedOpError(f"fx node {names[0]!r}: target {first} has no lowering in rulegraph's fx loader{hint}{also}; "
                             "export the model to ONNX with `rulegraph export` and explain the .onnx file")


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
