"""One block number (``Graph.block_of``): the attention blocks ``find_heads`` lists, the masks
``heads calibrate`` writes and the ``head-mask`` rule reads are keyed alike; a graph that does not
tell its blocks apart by number is refused by both, with the same reason."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

import rulegraph
import tiny
from rulegraph.calibrate import calibrate
from rulegraph.errors import InputError
from rulegraph.heads import block_numbers, find_heads
from rulegraph.ir import Graph
from rulegraph.methods.baselines.masklrp import rule_set
from rulegraph.heads import HeadMasks
from rulegraph.text import TextEncoder

TEXTS = ["w1 w2 w3 w4", "w5 w6 w7"]
MASKS = HeadMasks({0: ("positional", "none", "syntactic", "none"), 1: ("none", "syntactic", "none", "positional")})


def _renamed(graph: Graph, name) -> Graph:
    """``graph`` with each node renamed ``name(node)`` and no scopes."""
    nodes = [replace(n, name=name(n), scope="") for n in graph.nodes]
    return Graph(nodes, graph.inputs, graph.outputs, graph.constants, opset=graph.opset, metadata=graph.metadata,
                 source=graph.source)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tiny.tokenizer().save(str(path))
    return TextEncoder(path)


def test_numbered_blocks_key_alike(bert_onnx):
    graph = rulegraph.load(bert_onnx)
    blocks = find_heads(graph)
    assert [b.block for b in blocks] == [0, 1]
    assert all(graph.block_of(graph.node(b.product)) == b.block for b in blocks)
    assert all(graph.layers[b.product] == f"block {b.block}" for b in blocks)
    binding = rule_set(MASKS).bind(graph)
    assert not binding.problems
    rules = {b.block: binding.assignments[b.product].rule for b in blocks}
    assert {k: r.types(graph.node(b.product), b.heads) for (k, r), b in zip(rules.items(), blocks)} == MASKS.types


@pytest.mark.parametrize("case, name, reason", [
    ("unnumbered", lambda n: f"n{n.index}", "has no block number in its scope or name"),
    ("shared", lambda n: re.sub(r"layer\.(\d)", r"layer.0.\1", n.name), "shares block number 0 with another attention block"),
])
def test_blocks_not_told_apart_are_refused_alike(bert_onnx, encoder, case, name, reason):
    graph = _renamed(rulegraph.load(bert_onnx), name)
    blocks = find_heads(graph)
    assert [b.block for b in blocks] == [0, 1]                  # listed, in graph order
    assert block_numbers(graph) == {b.product: b.block for b in blocks}
    with pytest.raises(InputError, match=reason):
        calibrate(graph, encoder, TEXTS)
    binding = rule_set(MASKS).bind(graph)
    refused = [str(p) for p in binding.problems]
    assert len(refused) == 2 and all(reason in p and "head-mask" in p for p in refused)
    assert not rule_set(None).bind(graph).problems            # no mask, nothing to key: every head kept


def test_per_layer_blocks_read_the_same_number(bert_onnx):
    """A rule file's ``per_layer: {blocks: […]}`` matches by ``Graph.block_of`` too."""
    from rulegraph.ruleset import RuleSet
    graph = rulegraph.load(bert_onnx)
    rs = RuleSet.from_yaml("""name: per-layer
rules:
  - op: MatMul
    rule: epsilon
    per_layer:
      - {blocks: [1], params: {epsilon: 0.5}}
  - op: "*"
    rule: gradient
""", source="p.yaml")
    binding = rs.bind(graph)
    for node in graph.nodes:
        if node.name in binding.assignments and node.op == "MatMul":
            where = binding.assignments[node.name].where
            assert where.endswith(":6") == (graph.block_of(node) == 1), (node.name, where)
