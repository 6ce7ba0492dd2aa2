"""Small ONNX graphs built node by node (float64 throughout), for tests whose expected
relevance is computed by hand in numpy: ``model(nodes, {name: array}, inputs, outputs)``."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def node(op: str, inputs: list[str], outputs: list[str], name: str, **attrs):
    return helper.make_node(op, inputs, outputs, name=name, **attrs)


def model(nodes, constants: dict[str, np.ndarray], inputs: dict[str, int], outputs: dict[str, int], *,
          opset: int = 18):
    """An ONNX model; ``inputs`` / ``outputs`` map names to their feature width (batch dim free)."""
    inits = [numpy_helper.from_array(np.asarray(v, dtype=np.float64), k) for k, v in constants.items()]
    graph = helper.make_graph(
        nodes, "handbuilt",
        [helper.make_tensor_value_info(k, TensorProto.DOUBLE, ["batch", w]) for k, w in inputs.items()],
        [helper.make_tensor_value_info(k, TensorProto.DOUBLE, ["batch", w]) for k, w in outputs.items()],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def stabilize(z: np.ndarray, epsilon: float) -> np.ndarray:
    """``z + ε·sign z`` with sign 0 taken as +1 (the convention the README states for ε)."""
    return z + epsilon * np.where(z >= 0, 1.0, -1.0)


def seed(y: np.ndarray, target: list[int]) -> np.ndarray:
    """Relevance at the output: the explained logit per item, zero elsewhere."""
    r = np.zeros_like(y)
    r[np.arange(len(target)), target] = y[np.arange(len(target)), target]
    return r


def two_branch_net(W1: np.ndarray, V: np.ndarray, W2: np.ndarray):
    """y = (x·W1 + tanh(x)·V)·W2 on four input features: a MatMul branch and a Tanh branch."""
    return model([node("MatMul", ["x", "W1"], ["u"], "left/MatMul"),
                  node("Tanh", ["x"], ["tx"], "right/Tanh"),
                  node("MatMul", ["tx", "V"], ["v"], "right/MatMul"),
                  node("Add", ["u", "v"], ["z"], "sum/Add"),
                  node("MatMul", ["z", "W2"], ["y"], "out/MatMul")],
                 {"W1": W1, "V": V, "W2": W2}, {"x": 4}, {"y": 3})
