"""Every op's keyword defaults are the ONNX attribute defaults, and the interpreter completes each
node's attributes with them once (so the rules read ``attrs["epsilon"]`` without a default of their own)."""
from __future__ import annotations

import inspect

import onnx
import pytest
import torch
from onnx import defs, helper

from rulegraph.interpreter import Plan
from rulegraph.ir import Graph, Node, ValueInfo
from rulegraph.ops import REGISTRY

#: keyword arguments an op takes that are not ONNX attributes (set by the loaders themselves)
INTERNAL = {("Softmax", "coerce_2d"), ("LogSoftmax", "coerce_2d"), ("Hardmax", "coerce_2d")}


def _schema_defaults(op: str) -> dict | None:
    try:
        schema = defs.get_schema(op, max(18, defs.get_schema(op).since_version))   # newer ops: their first opset
    except Exception:
        return None
    out = {}
    for name, attr in schema.attributes.items():
        if attr.default_value is not None and attr.default_value.type != onnx.AttributeProto.UNDEFINED:
            out[name] = helper.get_attribute_value(attr.default_value)
    return out


@pytest.mark.parametrize("key", sorted(k for k in REGISTRY if not k[0]), ids=lambda k: k[1])
def test_keyword_defaults_are_the_onnx_defaults(key):
    spec = REGISTRY[key]
    schema = _schema_defaults(spec.name)
    if schema is None:
        pytest.skip(f"{spec.name} has no ONNX schema")
    for name, value in spec.defaults.items():
        if (spec.name, name) in INTERNAL or name not in schema or value is None:
            continue
        expected = schema[name]
        if isinstance(expected, bytes):
            expected = expected.decode()
        if isinstance(expected, float):
            assert value == pytest.approx(expected, rel=1e-6), f"{spec.name}.{name}"
        else:
            assert value == expected, f"{spec.name}.{name}: {value!r} vs ONNX {expected!r}"


def test_vjps_accept_every_keyword_their_forward_takes():
    for key, spec in REGISTRY.items():
        if spec.vjp is None:
            continue
        params = inspect.signature(spec.vjp).parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            continue
        assert not [n for n in spec.defaults if n not in params], key


def test_the_plan_completes_a_nodes_attributes():
    node = Node("ln", "LayerNormalization", ("x", "g"), ("y",), {"axis": -1})
    graph = Graph([node], [ValueInfo("x", torch.float32, (2, 3))], ["y"], {"g": torch.ones(3)}, opset=18)
    step = Plan(graph, torch.device("cpu"), torch.float32).step_by_name["ln"]
    assert step.attrs["epsilon"] == pytest.approx(1e-5) and step.attrs["axis"] == -1
    assert node.attrs == {"axis": -1}          # the graph is left as loaded
