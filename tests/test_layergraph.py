"""The relevance graph (rulegraph.layergraph): per (layer, position) the relevance at each hidden state, and the
attention's query → key messages between layers, on a tiny BERT, GPT-2 and Llama (grouped-query) in float64."""
from __future__ import annotations

import json

import pytest
import torch

import rulegraph
from shell import rulegraph as run_cli

F64 = torch.float64
TEXT = "the cat sat on the mat"
TIGHT = 1e-10


def explain(model, rules="attnlrp", **kw):
    return rulegraph.explain(model, rules, text=TEXT, dtype=F64, graph=True, at="attention output", **kw)


@pytest.fixture(scope="module")
def bert_graph(bert_onnx):
    return explain(bert_onnx)


def _edges_into_each_query_are_the_attention_outputs_relevance(e):
    """Σ_k E[l, h, q, k] is the relevance ``--at "block l attention output"`` returns at (q, h): the z-rule's
    messages of the value product sum to what arrived at it (its output is never 0 with random weights)."""
    g = e.graph
    for block, edges in enumerate(g.edges):
        at = e.at("attention output")[block].relevance.double().sum(-1)         # [batch, position, head]
        into = edges.sum(-1).transpose(1, 2)                                    # [batch, query, head]
        assert float((into - at).abs().max()) <= TIGHT * float(at.abs().max())
        assert float(edges.abs().max()) > 0


def _layers_conserve_up_to_what_each_block_absorbed(e, model):
    """Each hidden state is a cut: Σ_p N[l] = Σ_p N[l+1] − what block l's nodes absorbed or broke (the ledger's
    own figures), and the last holds the explained value less what the head after it absorbed."""
    g = e.graph
    totals = g.nodes.sum(2)[0]
    output = e.audit.conservation.output_value
    assert len(g.absorbed) == len(g.edges) == totals.numel() - 1
    for block, absorbed in enumerate(g.absorbed):
        assert float(totals[block]) == pytest.approx(float(totals[block + 1]) - absorbed, rel=TIGHT,
                                                     abs=TIGHT * abs(output))
    nodes = [n for n in e.audit.nodes if n.rule != "boundary"]
    producer = rulegraph.load(model).producer[g.states[-1]].name
    last = next(i for i, n in enumerate(nodes) if n.name == producer)
    after = sum(n.absorbed + n.breaks for n in nodes[:last])
    assert float(totals[-1]) == pytest.approx(output - after, rel=TIGHT, abs=TIGHT * abs(output))


def test_bert_graph_edges_and_layers_add_up(bert_onnx, bert_graph):
    g = bert_graph.graph
    assert g.layers == ["embeddings", "block 0", "block 1"]
    assert g.nodes.shape == (1, 3, len(bert_graph.scores())) and g.names()[0] == "[CLS]"
    _edges_into_each_query_are_the_attention_outputs_relevance(bert_graph)
    _layers_conserve_up_to_what_each_block_absorbed(bert_graph, bert_onnx)


def test_half_of_each_edge_is_what_the_walk_brings_to_the_keys_value(bert_onnx, bert_graph):
    """AttnLRP's uniform rule hands half of each message to the value at the key: the relevance the walk itself
    records at the values ``V[h, k, :]``, summed over d, is Σ_q E[l, h, q, k] / 2 (E from the forward's P, V, O
    and the relevance at O alone)."""
    from rulegraph.layergraph import sites
    values = [p.inputs[1] for p in sites(rulegraph.load(bert_onnx)).products]
    e = rulegraph.explain(bert_onnx, "attnlrp", text=TEXT, dtype=F64, record=values)
    for block, v in enumerate(values):
        walked = e.recorded[v].sum(-1)                                  # [batch, heads, keys]
        half = bert_graph.graph.edges[block].sum(2) / 2
        assert float((walked - half).abs().max()) <= TIGHT * float(walked.abs().max())


def test_the_nodes_are_the_block_outputs_relevance_per_position(bert_onnx, bert_graph):
    e = rulegraph.explain(bert_onnx, "attnlrp", text=TEXT, dtype=F64, at="block output")
    for block, x in enumerate(e.at("block output")):
        assert torch.allclose(bert_graph.graph.nodes[:, block + 1], x.per_position(), rtol=TIGHT, atol=1e-18)


def test_a_causal_lm_attends_only_backward_and_its_graph_adds_up(causal_lm):
    """GPT-2 and Llama (grouped queries: each value head serves two query heads): no edge from a query to a later
    key, the identities as for BERT."""
    _, model = causal_lm
    e = explain(model)
    for edges in e.graph.edges:
        later = torch.triu(torch.ones(edges.shape[-2:], dtype=torch.bool), 1)
        assert float(edges[..., later].abs().max()) == 0.0
    _edges_into_each_query_are_the_attention_outputs_relevance(e)
    _layers_conserve_up_to_what_each_block_absorbed(e, model)
    assert e.graph.names()[1] == " cat"


def test_the_json_lists_nodes_edges_and_the_strongest_paths(bert_graph):
    d = json.loads(json.dumps(bert_graph.graph.to_dict()))
    assert len(d["nodes"]) == 3 and len(d["nodes"][0]) == len(d["tokens"])
    first = d["attention"][0]
    assert len(first["per_head"]) == first["heads"] and len(first["into"]) == len(d["tokens"])
    paths = [p for p in d["paths"] if p["block"] == 0]
    assert [abs(p["relevance"]) for p in paths] == sorted((abs(p["relevance"]) for p in paths), reverse=True)
    q, k = paths[0]["query"], paths[0]["key"]
    assert paths[0]["relevance"] == pytest.approx(first["edges"][q][k], rel=1e-15)
    assert abs(paths[0]["relevance"]) == pytest.approx(max(abs(v) for row in first["edges"] for v in row))
    assert bert_graph[0].graph.nodes.shape == bert_graph.graph.nodes.shape


def test_explain_writes_the_graph_as_json_html_and_png(bert_onnx, tmp_path):
    r = run_cli(["explain", bert_onnx, "--rules", "attnlrp", "--text", TEXT, "--graph", "g.json", "--graph", "g.html",
                 "--graph", "g.png"], tmp_path)
    assert r.code == 0, r.err
    d = json.loads((tmp_path / "g.json").read_text())
    assert d["layers"] == ["embeddings", "block 0", "block 1"] and d["tokens"][0] == "[CLS]"
    page = (tmp_path / "g.html").read_text()
    assert page.count('<circle class="node"') == 3 * len(d["tokens"]) and "<svg" in page
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
    bad = run_cli(["explain", bert_onnx, "--rules", "attnlrp", "--text", TEXT, "--graph", "g.svg"], tmp_path)
    assert bad.code != 0 and "suffix" in bad.err and ".html" in bad.err and "Traceback" not in bad.err
    bad = run_cli(["explain", bert_onnx, "--method", "rollout", "--text", TEXT, "--graph", "h.json"], tmp_path)
    assert bad.code != 0 and "--graph" in bad.err and "Traceback" not in bad.err


def test_a_model_without_blocks_is_refused_in_one_line(tmp_path):
    import cnn
    from rulegraph.errors import ModelError
    x = cnn.image(batch=1)
    model = cnn.onnx(cnn.build("cnn"), tmp_path / "model.onnx", x)
    with pytest.raises(ModelError, match="embedding lookup"):
        rulegraph.explain(model, "epsilon", {"pixel_values": x}, graph=True)


def test_the_explanations_json_holds_the_graph(bert_graph):
    d = bert_graph.to_dict()
    assert d["graph"]["nodes"] == bert_graph.graph.nodes[0].tolist()
