"""Quantized deployment graphs: a tiny BERT and GPT-2 quantized by onnxruntime's own tools
(``quantize_dynamic``: DynamicQuantizeLinear + MatMulInteger, int8 embedding tables read through
DequantizeLinear; ``quantize_static`` in QDQ format: int8 weights, QuantizeLinear → DequantizeLinear
pairs on the activations) run like onnxruntime, are rewritten by the ``quantization`` canonizer into
the float computation they stand for, and explain under every shipped rule set, conserving in
float64 with the quantization error booked as its own absorbed term."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import rulegraph
import tiny
from rulegraph.api import prepared
from rulegraph.cli import main
from rulegraph.ruleset import RuleSet

NAMES = {"bert": ("input_ids", "attention_mask", "token_type_ids"), "gpt2": ("input_ids", "attention_mask")}


def _quantize(source, folder, names, how: str):
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    out = folder / f"{how}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "dynamic":
            quantize_dynamic(str(source), str(out), weight_type=QuantType.QInt8)
        else:
            feeds = iter([{k: v.numpy() for k, v in tiny.token_inputs(names, batch=1, length=9, seed=s).items()}
                          for s in range(4)])

            class Reader(CalibrationDataReader):
                def get_next(self):
                    return next(feeds, None)

            quantize_static(str(source), str(out), Reader(), quant_format=QuantFormat.QDQ,
                            weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    return out


@pytest.fixture(scope="module", params=[("bert", "dynamic"), ("bert", "static"), ("gpt2", "dynamic"),
                                        ("gpt2", "static")], ids=lambda p: "-".join(p))
def quantized(request, tmp_path_factory):
    """(architecture, float export, quantized export)."""
    arch, how = request.param
    folder = tmp_path_factory.mktemp(f"quantized_{arch}_{how}")
    source = tiny.onnx(tiny.build(arch), folder / "float.onnx", names=NAMES[arch])
    return arch, source, _quantize(source, folder, NAMES[arch], how)


def _ops(path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


def test_the_tools_emit_the_quantization_ops(quantized):
    _, _, path = quantized
    ops = _ops(path)
    assert {"DynamicQuantizeLinear", "MatMulInteger", "DequantizeLinear"} <= ops or \
        {"QuantizeLinear", "DequantizeLinear"} <= ops


def _literal(path) -> ort.InferenceSession:
    """onnxruntime running the graph as written: its optimiser would fuse Q/DQ pairs into integer
    kernels (QLinearMatMul…), whose requantisation rounds differently by one quantization step."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_the_quantized_graph_runs_like_onnxruntime(quantized):
    """As loaded (integer ops and all) and as the rule sets see it (canonized into float ops)."""
    arch, _, path = quantized
    feeds = tiny.token_inputs(NAMES[arch], batch=2, length=11, pad=3)
    (expected,) = _literal(path).run(None, {k: v.numpy() for k, v in feeds.items()})
    raw = rulegraph.load(path)
    canonized, _ = prepared(raw, "lrp-ah-ln")
    assert not {"MatMulInteger", "DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear"} & canonized.op_types()
    for graph in (raw, canonized):
        got = rulegraph.run(graph, feeds)["logits"].numpy()
        assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max() + 1e-7


def test_the_embedding_table_is_the_input_boundary(quantized):
    arch, _, path = quantized
    graph, rules = prepared(rulegraph.load(path), "lrp-ah-ln")
    binding = rules.bind(graph)
    assert {graph.producer[v].op for v in binding.boundary} == {"Gather"}
    tables = {graph.producer[v].inputs[0] for v in binding.boundary}
    assert all(graph.constants[t].is_floating_point() for t in tables)


def test_every_rule_set_conserves_with_the_quantization_error_reported(quantized):
    arch, _, path = quantized
    graph = rulegraph.load(path)
    feeds = tiny.token_inputs(NAMES[arch], batch=1, length=9)
    for rules in sorted(rulegraph.shipped_rule_sets()):
        e = rulegraph.explain(graph, rules, feeds, dtype=torch.float64)
        c = e.audit.conservation
        assert abs(c.residual) <= 1e-9 * abs(c.output_value), rules
        assert not e.audit.unexpected, rules
        if RuleSet.load(rules).pass_name == "relevance":
            joins = [n for n in e.audit.nodes if n.name.endswith("::quantization")]
            assert joins and all(n.conserving for n in joins), rules
            assert e.audit.quantization == pytest.approx(sum(n.absorbed for n in joins)) and e.audit.quantization != 0
            assert e.audit.to_dict()["conservation"]["quantization"] == e.audit.quantization


def test_the_quantized_explanation_is_close_to_the_float_ones(quantized):
    """Measured on these tiny random models (benchmarks/quantized_agreement.py does it on a trained
    one): the per-token lrp-ah-ln scores of the quantized model rank the tokens as the float
    model's do (Spearman ρ ≥ 0.8) and the top token is the same."""
    arch, source, path = quantized
    feeds = tiny.token_inputs(NAMES[arch], batch=1, length=9)
    a = np.asarray(rulegraph.explain(source, "lrp-ah-ln", feeds).scores("input_ids")).ravel()
    b = np.asarray(rulegraph.explain(path, "lrp-ah-ln", feeds).scores("input_ids")).ravel()
    ra, rb = a.argsort().argsort(), b.argsort().argsort()
    assert np.corrcoef(ra, rb)[0, 1] >= 0.8
    assert a.argmax() == b.argmax()


def test_rulegraph_check_passes_on_a_quantized_model(quantized, capsys):
    _, _, path = quantized
    assert main(["check", str(path), "-r", "attnlrp"]) == 0, capsys.readouterr().out


# -- the canonizer, one pattern at a time, against closed forms ----------------------------------------------

def _model(nodes, inputs, outputs, initializers):
    graph = helper.make_graph(nodes, "q", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def _qdq_matmul(scale, w):
    """x → QuantizeLinear → DequantizeLinear → MatMul(W)."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["xq"]),
             helper.make_node("MatMul", ["xq", "W"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
                  [numpy_helper.from_array(np.array(scale), "s"), numpy_helper.from_array(np.array(128, np.uint8), "z"),
                   numpy_helper.from_array(w, "W")])


def test_every_rule_file_canonizes_and_gives_the_round_trip_its_rule_unless_it_opts_out():
    """A rule file that says nothing of canonizers applies the quantization one, and its round trip
    gets the ``quantization`` rule before the file's own entries; ``no_canonize: [quantization]``
    leaves the graph as loaded (its integer ops then stop relevance)."""
    graph = rulegraph.load(_qdq_matmul(np.float32(0.1), np.array([[1.0], [-2.0], [0.5]], np.float32)))
    text = "boundary: inputs\nrules:\n  - op: '*'\n    rule: gradient\n"
    canonized, rules = prepared(graph, RuleSet.from_yaml(text, source="q.yaml"))
    assert "QuantizeLinear" not in canonized.op_types()
    (node,) = [n for n in canonized.nodes if n.op == "QuantizeDequantize"]
    assignment = rules.bind(canonized).assignments[node.name]
    assert (assignment.rule.name, assignment.where) == ("quantization", "q.yaml: canonizer quantization")
    raw, _ = prepared(graph, RuleSet.from_yaml("no_canonize: [quantization]\n" + text))
    assert raw is graph and "QuantizeLinear" in raw.op_types()


def test_a_qdq_pair_books_its_rounding_as_absorbed():
    """x → Q → DQ → MatMul(W): R(x) = x ⊙ W·s (LRP-0 = GI on a linear map), and the rounding δ = x̃ − x
    absorbs δ ⊙ W·s: the closed form, in float64."""
    scale, w = np.float32(0.1), np.array([[1.0], [-2.0], [0.5]], np.float32)
    model = _qdq_matmul(scale, w)
    x = torch.tensor([[0.234, -1.017, 0.55]])
    rules = RuleSet.from_yaml("boundary: inputs\ncanonize: [quantization]\nrules:\n  - op: '*'\n    rule: gradient\n")
    e = rulegraph.explain(model, rules, {"x": x}, target=0, dtype=torch.float64)
    xd, wd = x.double(), torch.from_numpy(w).double()
    rounded = torch.round(xd / float(scale)) * float(scale)
    torch.testing.assert_close(e.boundary["x"], xd * wd[:, 0], rtol=1e-12, atol=1e-12)
    assert e.audit.quantization == pytest.approx(float(((rounded - xd) * wd[:, 0]).sum()), rel=1e-9)
    assert e.output_value[0] == pytest.approx(float(rounded @ wd), rel=1e-12)


def test_a_dynamic_matmul_becomes_the_float_product_it_stands_for():
    """DynamicQuantizeLinear → MatMulInteger → Cast → Mul(s_x·s_w) is MatMul(x̃, (W_q − z_w)·s_w): the
    canonized graph computes onnxruntime's output, and the weights are the dequantized ones."""
    wq = np.array([[3, -7], [12, 0], [-128, 127]], np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "sx", "zx"]),
             helper.make_node("MatMulInteger", ["q", "Wq", "zx", "zw"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["sx", "sw"], ["scale"]),
             helper.make_node("Mul", ["accf", "scale"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
                   [numpy_helper.from_array(wq, "Wq"), numpy_helper.from_array(np.array(2, np.int8), "zw"),
                    numpy_helper.from_array(np.array(0.02, np.float32), "sw")])
    x = np.array([[0.3, -1.2, 2.0], [0.01, 0.5, -0.7]], np.float32)
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    graph, _ = prepared(rulegraph.load(model), RuleSet.from_yaml(
        "boundary: inputs\ncanonize: [quantization]\nrules:\n  - op: '*'\n    rule: gradient\n"))
    assert {"MatMul", "QuantizeDequantize", "QuantizationError"} <= graph.op_types()
    assert "MatMulInteger" not in graph.op_types()
    weights = next(t for k, t in graph.constants.items() if k.endswith("::dequantized"))
    torch.testing.assert_close(weights, (torch.from_numpy(wq).double() - 2) * float(np.float32(0.02)))
    np.testing.assert_allclose(rulegraph.run(graph, {"x": torch.from_numpy(x)})["y"].numpy(), expected, rtol=1e-6)


def test_a_float_graph_is_left_unchanged(bert_onnx):
    graph = rulegraph.load(bert_onnx)
    assert prepared(graph, "lrp-ah-ln")[0] is graph


def test_a_dynamically_quantized_cnn_explains_under_the_cnn_rule_sets(tmp_path):
    """quantize_dynamic on Conv and Gemm emits ConvInteger / MatMulInteger; the canonized graph runs
    like onnxruntime and both CNN rule sets (and gi) conserve in float64, the pixels' own rounding
    included (where x̃ = 0 the rounding absorbs all)."""
    import cnn
    from onnxruntime.quantization import QuantType, quantize_dynamic
    module, x = cnn.build("cnn"), cnn.image(2, 8)
    source = cnn.onnx(module, tmp_path / "cnn.onnx", x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(source), str(tmp_path / "dynamic.onnx"), weight_type=QuantType.QUInt8,
                         op_types_to_quantize=["Conv", "MatMul", "Gemm"])
    path = tmp_path / "dynamic.onnx"
    assert {"ConvInteger", "MatMulInteger"} <= _ops(path)
    (expected,) = _literal(path).run(None, {"pixel_values": x.float().numpy()})
    canonized, _ = prepared(rulegraph.load(path), "epsilon-gamma-box")
    assert "ConvInteger" not in canonized.op_types() and "Conv" in canonized.op_types()
    got = rulegraph.run(canonized, {"pixel_values": x.float()})["logits"].numpy()
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    for rules in ("epsilon-gamma-box", "epsilon-plus-flat", "gi"):
        e = rulegraph.explain(path, rules, {"pixel_values": x}, dtype=torch.float64)
        c = e.audit.conservation
        assert abs(c.residual) <= 1e-9 * abs(c.output_value) and not e.audit.unexpected, rules
        assert e.audit.quantization != 0, rules
