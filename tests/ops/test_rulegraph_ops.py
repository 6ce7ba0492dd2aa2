"""rulegraph's own ops (domain ai.rulegraph), which only canonizers write and onnxruntime cannot run,
against onnxruntime on the ONNX subgraphs they stand for."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from rulegraph.ops import REGISTRY
from rulegraph.ops.quantization import RULEGRAPH_DOMAIN

RNG = np.random.default_rng(7)


def _ort(nodes, x, initializers, outputs) -> list[np.ndarray]:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _op(name):
    return REGISTRY[(RULEGRAPH_DOMAIN, name)].forward


@pytest.mark.parametrize("zero, axis, scale", [
    (np.array(128, np.uint8), 1, np.array(0.05, np.float32)),
    (np.array(-3, np.int8), 1, np.array(0.02, np.float32)),
    (None, 1, np.array(0.05, np.float32)),
    (np.array([0, 5, -5], np.int8), 1, np.array([0.01, 0.02, 0.05], np.float32)),
])
def test_quantization_error_is_the_round_trip_minus_x(zero, axis, scale):
    x = (RNG.standard_normal((2, 3, 4)) * 2).astype(np.float32)
    inits = [numpy_helper.from_array(scale, "s")] + ([numpy_helper.from_array(zero, "z")] if zero is not None else [])
    params = ["s", "z"] if zero is not None else ["s"]
    nodes = [helper.make_node("QuantizeLinear", ["x", *params], ["q"], axis=axis),
             helper.make_node("DequantizeLinear", ["q", *params], ["y"], axis=axis)]
    (expected,) = _ort(nodes, x, inits, ["y"])
    got = _op("QuantizationError")(torch.from_numpy(x), torch.from_numpy(scale),
                                   None if zero is None else torch.from_numpy(zero), axis=axis)
    np.testing.assert_allclose(got.numpy(), expected - x, rtol=0, atol=1e-6)


def test_dynamic_quantization_error_is_dynamic_quantize_linears_round_trip():
    x = (RNG.standard_normal((3, 5)) * 3).astype(np.float32)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    (expected,) = _ort(nodes, x, [], ["y"])
    got = _op("QuantizationError")(torch.from_numpy(x), dynamic=1)
    np.testing.assert_allclose(got.numpy(), expected - x, rtol=0, atol=1e-6)


def test_quantize_dequantize_adds_the_error():
    x, error = torch.randn(2, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64) * 0.01
    torch.testing.assert_close(_op("QuantizeDequantize")(x, error), x + error, rtol=0, atol=0)
    spec = REGISTRY[(RULEGRAPH_DOMAIN, "QuantizeDequantize")]
    assert spec.transparent and spec.affine([True, False]) and spec.is_additive(1)
    assert REGISTRY[(RULEGRAPH_DOMAIN, "QuantizationError")].held


def test_every_rulegraph_op_is_tested_here():
    ours = {name for (domain, name) in REGISTRY if domain == RULEGRAPH_DOMAIN}
    assert ours == {"QuantizeDequantize", "QuantizationError"}, "a new rulegraph op needs its test here"
