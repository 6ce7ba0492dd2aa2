"""rulegraph.final_softmax: a final Softmax / LogSoftmax taken off (the canonizer), a value made the
graph's only output; both compute what the original graph computes there (onnxruntime)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from rulegraph.canonize import canonize
from rulegraph.canonize.final_softmax import final_softmax, only, with_batch_axis
from rulegraph.interpreter import run
from rulegraph.loaders import load


@pytest.fixture
def model(tmp_path):
    """x → Gemm → logits → Softmax → probs, and probs → ArgMax → label (outputs probs, label)."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], np.random.RandomState(0).randn(12).tolist())
    nodes = [helper.make_node("Gemm", ["x", "w"], ["logits"], name="gemm", transB=1),
             helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
             helper.make_node("ArgMax", ["probs"], ["label"], name="argmax", axis=-1, keepdims=0)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("label", TensorProto.INT64, [2])], [w])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_the_canonizer_takes_the_final_softmax_off(model):
    graph = load(str(model))
    out = final_softmax(graph)
    assert out.outputs == ["logits", "label"] and [n.op for n in out.nodes] == ["Gemm", "Softmax", "ArgMax"]
    assert canonize(graph, ["final-softmax"]).outputs == ["logits", "label"]      # registered by name
    x = np.random.RandomState(1).randn(2, 4).astype(np.float32)
    probs, label = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = run(out, {"x": torch.from_numpy(x)}, dtype=torch.float64)
    np.testing.assert_allclose(got["logits"].softmax(-1).numpy(), probs, atol=1e-6)
    np.testing.assert_array_equal(got["label"].numpy(), label)


def test_only_keeps_what_the_value_needs(model):
    graph = load(str(model))
    out = only(graph, "logits")
    assert out.outputs == ["logits"] and [n.op for n in out.nodes] == ["Gemm"]
    assert only(graph, "logits") is out and only(out, "logits") is out          # cached; already the only output
    assert [n.op for n in graph.nodes] == ["Gemm", "Softmax", "ArgMax"]          # the graph itself is unchanged


@pytest.mark.parametrize("opset", [11, 17])
def test_with_batch_axis_adds_a_leading_axis_of_one(tmp_path, opset):
    """x [3, 4] → Relu → y [3, 4]: y becomes [1, 3, 4] under its own name (axes an attribute before opset 13)."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), tmp_path / "m.onnx")
    graph = load(str(tmp_path / "m.onnx"))
    out = with_batch_axis(graph, "y")
    x = torch.randn(3, 4, dtype=torch.float64)
    got = run(out, {"x": x}, dtype=torch.float64)["y"]
    assert out.outputs == ["y"] and out.opset == opset and tuple(got.shape) == (1, 3, 4)
    torch.testing.assert_close(got[0], x.relu(), atol=0, rtol=0)
