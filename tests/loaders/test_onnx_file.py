"""An ONNX file read once (rulegraph.loaders.onnx_file): the weights are views of one buffer, aligned,
byte for byte what onnx reads (a load's memory: tests/loaders/test_memory.py); what the checker
refused is still refused, a payload that does not fit its shape is one
error, and a truncated file is one line; writing into a loaded weight touches nothing else, and
canonizing and explaining write into no weight."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import cnn
import rulegraph
from rulegraph.canonize import fold_batchnorm
from rulegraph.errors import ModelError
from rulegraph.loaders import onnx_file
from rulegraph.loaders.onnx import load_onnx

#: name → (dtype, shape): names of odd lengths put the raw data at unaligned offsets in the file
KINDS = {"w": (np.float32, (3, 5)), "odd_name_x": (np.float64, (7,)), "h16": (np.float16, (3, 3)),
         "i": (np.int64, (2, 3)), "int8s": (np.int8, (5,)), "flags": (np.bool_, (4,)), "b": (np.float32, (5,))}


def _model(path, *, bfloat16: bool = True) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = []
    for name, (dtype, shape) in KINDS.items():
        values = rng.standard_normal(shape) * 100 if np.issubdtype(dtype, np.floating) else rng.integers(-100, 100, shape)
        inits.append(numpy_helper.from_array(values.astype(dtype), name))
    if bfloat16:
        bits = torch.tensor([1.5, -2.25, 3e5], dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes()
        inits.append(helper.make_tensor("bf16_", TensorProto.BFLOAT16, [3], bits, raw=True))
    inits.append(helper.make_tensor("typed", TensorProto.FLOAT, [2], [0.5, -1.5]))     # float_data, not raw
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y0"]), helper.make_node("Add", ["y0", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return model


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def test_the_weights_are_aligned_views_of_one_buffer_equal_to_what_onnx_reads(tmp_path):
    model = _model(tmp_path / "m.onnx")
    graph = load_onnx(tmp_path / "m.onnx")
    whole = load_onnx(onnx.load(str(tmp_path / "m.onnx")))                 # the ModelProto path: copies
    raw = [t.name for t in model.graph.initializer if t.HasField("raw_data")]
    assert len(raw) == len(KINDS) + 1
    storages = {graph.constants[k].untyped_storage().data_ptr() for k in raw}
    assert len(storages) == 1                                               # one buffer holds every weight
    for name in raw:
        t = graph.constants[name]
        assert t.data_ptr() % t.element_size() == 0, name
        assert t.dtype == whole.constants[name].dtype and t.shape == whole.constants[name].shape
        assert _bytes(t) == model.graph.initializer[raw.index(name)].raw_data == _bytes(whole.constants[name]), name
    assert graph.constants["typed"].tolist() == [0.5, -1.5]
    assert graph.constants["bf16_"].dtype == torch.bfloat16
    spans = sorted((graph.constants[k].data_ptr(), graph.constants[k].data_ptr() + t.numel() * t.element_size())
                   for k in raw for t in [graph.constants[k]])
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))   # no two overlap
    x = torch.randn(1, 3)
    assert torch.equal(rulegraph.run(graph, {"x": x})["y"], rulegraph.run(whole, {"x": x})["y"])


def test_a_weight_with_no_room_to_be_aligned_is_copied():
    """Two payloads back to back (not a real file: there the nodes and the framing leave room) — the
    second cannot move to an 8-byte boundary without overwriting the first, so it is a copy."""
    model = onnx.ModelProto()
    for name, dtype in (("a", TensorProto.FLOAT), ("b", TensorProto.DOUBLE)):
        model.graph.initializer.append(helper.make_tensor(name, dtype, [1], [0.0]))
    data = np.zeros(16, np.uint8)
    data[1:5] = np.frombuffer(np.float32(1.25).tobytes(), np.uint8)
    data[5:13] = np.frombuffer(np.float64(-3.5).tobytes(), np.uint8)
    held = onnx_file.weights(onnx_file.OnnxFile(model, torch.from_numpy(data), [(1, 4), (5, 8)]),
                             {0: (torch.float32, 4), 1: (torch.float64, 8)}, "here")
    assert held[0].item() == 1.25 and held[1].item() == -3.5
    assert held[0].untyped_storage().data_ptr() == held[0].data_ptr()       # moved to the buffer's start
    assert torch.equal(held[1].view(torch.uint8), torch.from_numpy(data[5:13].copy()))
    assert held[1].untyped_storage().data_ptr() != held[0].untyped_storage().data_ptr()


def test_a_payload_that_does_not_fit_its_shape_is_one_error(tmp_path):
    model = _model(tmp_path / "m.onnx")
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]
    onnx.save(model, str(tmp_path / "short.onnx"))
    with pytest.raises(ModelError, match=r"short.onnx: initializer 'w' holds 56 bytes where its shape \[3, 5\] of "
                                         r"float32 needs 60$"):
        load_onnx(tmp_path / "short.onnx")


def test_a_truncated_or_corrupt_file_is_refused_in_one_line(tmp_path):
    _model(tmp_path / "m.onnx")
    data = (tmp_path / "m.onnx").read_bytes()
    for cut in (1, 7, len(data) // 3, len(data) // 2, len(data) - 3):
        (tmp_path / "cut.onnx").write_bytes(data[:cut])
        with pytest.raises(ModelError) as caught:
            load_onnx(tmp_path / "cut.onnx")
        assert "\n" not in str(caught.value) and "cut.onnx" in str(caught.value), cut
    (tmp_path / "group.onnx").write_bytes(b"\x0b" + data)                   # a group: the scanner hands over
    with pytest.raises(ModelError, match="is not a readable ONNX model"):
        load_onnx(tmp_path / "group.onnx")


@pytest.mark.parametrize("spoil, message", [
    ("order", "is not a valid ONNX model: Nodes in a graph must be topologically sorted"),
    ("twice", "is not a valid ONNX model: b initializer name is not unique"),
    ("two-fields", "is not a valid ONNX model: TensorProto (tensor name: w)"),
    ("undefined", "is not a valid ONNX model"),
])
def test_what_the_checker_refused_is_still_refused(tmp_path, spoil, message):
    model = _model(tmp_path / "m.onnx")
    g = model.graph
    if spoil == "order":
        g.node.reverse()
    elif spoil == "twice":
        g.initializer.append(numpy_helper.from_array(np.ones(5, np.float32), "b"))
    elif spoil == "two-fields":
        g.initializer[0].float_data.extend([1.0] * 15)
    else:
        g.initializer[0].data_type = TensorProto.UNDEFINED
    onnx.save(model, str(tmp_path / "bad.onnx"))
    with pytest.raises(ModelError) as caught:
        load_onnx(tmp_path / "bad.onnx")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_writing_into_a_loaded_weight_changes_that_weight_only(tmp_path):
    _model(tmp_path / "m.onnx")
    data = (tmp_path / "m.onnx").read_bytes()
    graph = load_onnx(tmp_path / "m.onnx")
    others = {k: v.clone() for k, v in graph.constants.items() if k != "w"}
    graph.constants["w"].fill_(7.0)
    assert all(torch.equal(graph.constants[k], v) for k, v in others.items())
    assert (tmp_path / "m.onnx").read_bytes() == data
    assert not torch.equal(load_onnx(tmp_path / "m.onnx").constants["w"], graph.constants["w"])


def test_canonizing_and_explaining_write_into_no_weight(tmp_path):
    """BatchNorm folding and the quantization canonizer make new tensors: the loaded ones are untouched."""
    path = cnn.onnx(cnn.build("resnet"), tmp_path / "resnet.onnx", cnn.image(), keep_batchnorm=True)
    graph = rulegraph.load(path)
    before = {k: v.clone() for k, v in graph.constants.items()}
    assert "BatchNormalization" in graph.op_types() and "BatchNormalization" not in fold_batchnorm(graph).op_types()
    for rules in ("epsilon-gamma-box", "epsilon-plus-flat"):
        rulegraph.explain(graph, rules, {"pixel_values": cnn.image().float()}, target=0)
    assert graph.constants.keys() == before.keys()
    assert all(torch.equal(graph.constants[k], v) for k, v in before.items())
