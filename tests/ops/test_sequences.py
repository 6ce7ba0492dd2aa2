"""The tensor-sequence ops against onnxruntime.

A sequence cannot be a graph input of rulegraph's models (graph inputs are tensors), so a case whose
op reads a sequence builds it first with ``SequenceConstruct`` (or ``SplitToSequence``) from tensor
inputs: two nodes, the op under test last. Sequence outputs are compared tensor by tensor.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import rulegraph
from rulegraph.ops.sequence import TensorSequence

RNG = np.random.default_rng(7)

#: the ops these cases cover (tests/ops/test_ops.py counts them as covered)
SEQUENCE_OPS = {"SplitToSequence", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceLength",
                "SequenceInsert", "SequenceErase", "ConcatFromSequence"}


def f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def i64(*values):
    return np.array(values, dtype=np.int64)


def _model(nodes, tensors: dict[str, np.ndarray], consts: dict[str, np.ndarray], outputs, opset):
    graph = helper.make_graph(
        nodes, "sequence", [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                            for k, v in tensors.items()],
        [helper.make_value_info(o, onnx.TypeProto()) for o in outputs],
        initializer=[onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=min(onnx.IR_VERSION, 10))


def _construct(*names):
    return helper.make_node("SequenceConstruct", list(names), ["seq"])


_X = {"a": f(2, 3), "b": f(2, 3), "c": f(2, 3)}
CASES = {
    # name: (nodes, tensors, constants)
    "split_default": ([helper.make_node("SplitToSequence", ["a"], ["y"], axis=1)], {"a": f(2, 3, 4)}, {}),
    "split_keepdims0": ([helper.make_node("SplitToSequence", ["a"], ["y"], axis=1, keepdims=0)], {"a": f(2, 3, 4)}, {}),
    "split_scalar": ([helper.make_node("SplitToSequence", ["a", "s"], ["y"], axis=0)], {"a": f(5, 2)}, {"s": i64(2)[0]}),
    "split_sizes": ([helper.make_node("SplitToSequence", ["a", "s"], ["y"], axis=-1)], {"a": f(2, 6)}, {"s": i64(1, 2, 3)}),
    "construct": ([helper.make_node("SequenceConstruct", ["a", "b", "c"], ["y"])], _X, {}),
    "at": ([_construct("a", "b", "c"), helper.make_node("SequenceAt", ["seq", "p"], ["y"])], _X, {"p": i64(1)[0]}),
    "at_negative": ([_construct("a", "b", "c"), helper.make_node("SequenceAt", ["seq", "p"], ["y"])], _X,
                    {"p": i64(-1)[0]}),
    "at_of_split": ([helper.make_node("SplitToSequence", ["a"], ["seq"], axis=1, keepdims=0),
                     helper.make_node("SequenceAt", ["seq", "p"], ["y"])], {"a": f(2, 4, 3)}, {"p": i64(2)[0]}),
    "length": ([_construct("a", "b", "c"), helper.make_node("SequenceLength", ["seq"], ["y"])], _X, {}),
    "insert_end": ([_construct("a", "b"), helper.make_node("SequenceInsert", ["seq", "c"], ["y"])], _X, {}),
    "insert_at": ([_construct("a", "b"), helper.make_node("SequenceInsert", ["seq", "c", "p"], ["y"])], _X,
                  {"p": i64(0)[0]}),
    "erase_last": ([_construct("a", "b", "c"), helper.make_node("SequenceErase", ["seq"], ["y"])], _X, {}),
    "erase_at": ([_construct("a", "b", "c"), helper.make_node("SequenceErase", ["seq", "p"], ["y"])], _X,
                 {"p": i64(-3)[0]}),
    "empty_insert": ([helper.make_node("SequenceEmpty", [], ["seq"], dtype=TensorProto.FLOAT),
                      helper.make_node("SequenceInsert", ["seq", "a"], ["y"])], {"a": f(2, 2)}, {}),
    "concat": ([_construct("a", "b", "c"), helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=1)], _X, {}),
    "concat_new_axis": ([_construct("a", "b", "c"), helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=-1,
                                                                     new_axis=1)], _X, {}),
}


@pytest.mark.parametrize("opset", [11, 18])
@pytest.mark.parametrize("name", sorted(CASES))
def test_sequence_op_against_onnxruntime(name, opset):
    nodes, tensors, consts = CASES[name]
    model = _model(nodes, tensors, consts, ["y"], opset)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, tensors)[0]
    got = rulegraph.run(rulegraph.load(model), {k: torch.from_numpy(v) for k, v in tensors.items()})["y"]
    if isinstance(ref, list):
        assert isinstance(got, TensorSequence) and len(got) == len(ref)
        pairs = list(zip(got, ref))
    else:
        pairs = [(got, ref)]
    for g, r in pairs:
        assert tuple(g.shape) == np.asarray(r).shape
        np.testing.assert_allclose(g.numpy(), r, rtol=1e-6, atol=1e-7)


def test_every_sequence_op_has_a_case():
    used = {n.op_type for nodes, _, _ in CASES.values() for n in nodes}
    assert SEQUENCE_OPS <= used


def test_relevance_through_a_sequence_is_refused():
    """A sequence op on the path relevance takes is a binding problem naming the node, not an internal error."""
    nodes = [helper.make_node("SplitToSequence", ["x"], ["seq"], axis=1, keepdims=0),
             helper.make_node("SequenceAt", ["seq", "p"], ["y"], name="pick")]
    model = _model(nodes, {"x": f(2, 3)}, {"p": i64(0)[0]}, ["y"], 18)
    binding = rulegraph.RuleSet.load("gi").bind(rulegraph.load(model))
    assert any("'pick' (SequenceAt) passes a tensor sequence" in str(p) for p in binding.problems)
