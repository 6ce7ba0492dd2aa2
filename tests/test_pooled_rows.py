"""A classifier's last layers computed at the position its head reads (rulegraph.canonize.rows.pooled, the
default; ``logits="all"`` computes every position): every relevance, audit figure and output equals the whole
graph's (float64, 1e-12 relative: products over fewer rows may round otherwise), each layer's audit sums too;
a value read whole elsewhere stops the move; a graph whose rows do not work as the move reads them keeps the
whole graph, decided by comparing the output once."""
from __future__ import annotations

import pytest
import torch

import rulegraph
import tiny
from rulegraph.canonize.rows import SUFFIX, pooled
from rulegraph.ir import Graph, Node, ValueInfo

SENTENCE = "w1 w2 w3 w4 w5 w6"


def _inputs(length: int = 11) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, len(tiny.VOCAB), (2, length), generator=torch.Generator().manual_seed(3))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


def test_the_last_block_after_its_attention_reads_the_pooled_position(bert_onnx):
    graph = rulegraph.load(bert_onnx)
    moved = pooled(graph)
    assert moved is not None and pooled(graph) is moved                  # (kept on the graph)
    reads = {n.name: n.inputs[0] for n in moved.nodes if n.op == "MatMul" and n.inputs[1] in moved.constants}
    last = max(graph.block_of(n) or 0 for n in graph.nodes)
    rows = sorted(name for name, x in reads.items() if x.endswith(SUFFIX))
    assert rows == [f"/model/bert/encoder/layer.{last}/{part}/dense/MatMul"          # the last block's only
                    for part in ("attention/output", "intermediate", "output")]
    whole = [name for name, x in reads.items() if f"layer.{last}/attention/self" in name]
    assert len(whole) == 3 and not any(reads[name].endswith(SUFFIX) for name in whole)      # query, key, value


@pytest.mark.parametrize("rules", ["attnlrp", "lrp-ah-ln", "gi", "epsilon", "cp-lrp", "lrp-ah"])
def test_an_explanation_equals_the_whole_graphs(bert_onnx, rules):
    inputs = _inputs()
    rows = rulegraph.explain(bert_onnx, rules, inputs, dtype=torch.float64)
    whole = rulegraph.explain(bert_onnx, rules, inputs, dtype=torch.float64, logits="all")
    close = dict(rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(torch.tensor(rows.output_value), torch.tensor(whole.output_value), **close)
    for k in whole.relevance:
        torch.testing.assert_close(rows.relevance[k], whole.relevance[k], **close)
    a, b = rows.audit, whole.audit
    for field in ("output_value", "input_total", "absorbed", "breaks"):
        assert getattr(a.conservation, field) == pytest.approx(getattr(b.conservation, field), rel=1e-12, abs=1e-15)
    assert [layer.name for layer in a.layers] == [layer.name for layer in b.layers]
    for x, y in zip(a.layers, b.layers):
        assert (x.relevance_in, x.relevance_out, x.absorbed) == pytest.approx(
            (y.relevance_in, y.relevance_out, y.absorbed), rel=1e-10, abs=1e-12)
    assert any(n.name.endswith(f"{SUFFIX}::0") for n in a.nodes) and not any(SUFFIX in n.name for n in b.nodes)
    assert not a.unexpected


def test_values_read_inside_the_model_keep_every_position(bert_onnx):
    e = rulegraph.explain(bert_onnx, "attnlrp", _inputs(), at="every attention output")
    assert not any(SUFFIX in n.name for n in e.audit.nodes)


def _graph(outputs: list[str], rank: int) -> Graph:
    """x → LayerNormalization → Mul by a fixed vector → Gather of position 0 along axis 1 → y."""
    width = 4
    constants = {"scale": torch.ones(width), "bias": torch.zeros(width), "w": torch.arange(1.0, width + 1),
                 "zero": torch.tensor([0])}
    nodes = [Node("ln", "LayerNormalization", ("x", "scale", "bias"), ("h",), {"axis": -1}),
             Node("mul", "Mul", ("h", "w"), ("m",)),
             Node("pick", "Gather", ("m", "zero"), ("y",), {"axis": 1})]
    shape = [1, 3, width] if rank == 3 else [1, width]
    return Graph(nodes, [ValueInfo("x", torch.float32, shape)], outputs, constants, opset=17)


def test_the_move_stops_at_a_value_read_whole():
    assert [n.op for n in pooled(_graph(["y"], 3)).nodes] == ["Gather", "LayerNormalization", "Mul"]
    assert pooled(_graph(["y", "h"], 3)).nodes[0].op == "LayerNormalization"     # h is an output: moved to it
    assert pooled(_graph(["y", "m"], 3)) is None


def test_a_graph_whose_rows_differ_keeps_the_whole_graph():
    # [1, 4]: axis 1 is the last one, which the LayerNorm and the vector read: moving the pick above them is
    # wrong, and the output (a different shape) says so the first time
    graph = _graph(["y"], 2)
    assert pooled(graph) is not None
    x = torch.randn(1, 4, generator=torch.Generator().manual_seed(0))
    e = rulegraph.explain(graph, "gi", {"x": x}, target=0)
    assert graph.cache.canonized["pooled-agrees"] is False
    assert not any(SUFFIX in n.name for n in e.audit.nodes)


def test_a_pooled_forward_that_fails_runs_the_whole_graph():
    # [1, 4] @ [4, 4]: picking column 0 first leaves a [1, 1] the product refuses
    nodes = [Node("mm", "MatMul", ("x", "w"), ("h",)), Node("pick", "Gather", ("h", "zero"), ("y",), {"axis": 1})]
    graph = Graph(nodes, [ValueInfo("x", torch.float32, [1, 4])], ["y"],
                  {"w": torch.eye(4), "zero": torch.tensor([0])}, opset=17)
    assert [n.op for n in pooled(graph).nodes] == ["Gather", "MatMul"]
    e = rulegraph.explain(graph, "gi", {"x": torch.ones(1, 4)}, target=0)
    assert graph.cache.canonized["pooled-agrees"] is False and e.output_value == pytest.approx([1.0])


def test_a_value_read_twice_by_a_moved_node_is_picked_once():
    nodes = [Node("sq", "Mul", ("x", "x"), ("h",)), Node("pick", "Gather", ("h", "zero"), ("y",), {"axis": 1})]
    graph = Graph(nodes, [ValueInfo("x", torch.float32, [1, 3, 4])], ["y"], {"zero": torch.tensor(0)}, opset=17)
    moved = pooled(graph)
    assert [(n.op, n.inputs) for n in moved.nodes] == [("Gather", ("x", "zero")), ("Mul", (f"x{SUFFIX}",) * 2)]
    x = torch.randn(1, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    e = rulegraph.explain(graph, "gi", {"x": x}, target=1, dtype=torch.float64)
    assert e.output_value == pytest.approx([float(x[0, 0, 1] ** 2)])
