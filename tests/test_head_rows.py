"""A causal LM's head computed only at the positions explained (rulegraph.canonize.rows): every score,
audit figure and logit read equals the whole head's (float64, 1e-12 relative: a product over fewer rows
may round otherwise), for one position, many targets at their own positions, a span and a continuation;
a head the graph does not show plainly keeps the whole head; a position not computed is refused by name."""
from __future__ import annotations

import pytest
import torch

import rulegraph
import tiny
from rulegraph.canonize.rows import head, head_rows
from rulegraph.errors import InputError
from rulegraph.ir import Graph, Node, ValueInfo
from rulegraph.loaders import load
from rulegraph.passes.base import apply_targets

PROMPT = "w1 w2 w3 w4 w5 w6 w7"


def _feeds(length: int = 9, seed: int = 0) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, len(tiny.VOCAB), (1, length), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _same(a, b) -> None:
    """Two explanations with the same targets, scores, explained value, logits and audit: the head's product
    over fewer rows may round otherwise (a matrix–vector kernel for one row), so to 1e-12 relative."""
    assert a.target == b.target and a.position == b.position
    close = dict(rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(torch.tensor(a.output_value), torch.tensor(b.output_value), **close)
    for k in a.boundary:
        torch.testing.assert_close(a.boundary[k], b.boundary[k], **close)
        torch.testing.assert_close(a.relevance[k], b.relevance[k], **close)
    torch.testing.assert_close(a.output_at(), b.output_at(), **close)
    if a.audit is not None:
        x, y = a.audit.conservation, b.audit.conservation
        for field in ("output_value", "input_total", "absorbed", "breaks"):
            assert getattr(x, field) == pytest.approx(getattr(y, field), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("rules", ["attnlrp", "lrp-ah-ln", "gi", "decomposition"])
def test_one_position_equals_the_whole_head(causal_lm, rules):
    _, path = causal_lm
    for position in (None, 3):
        rows = rulegraph.explain(path, rules, _feeds(), position=position, dtype=torch.float64)
        whole = rulegraph.explain(path, rules, _feeds(), position=position, dtype=torch.float64, logits="all")
        _same(rows, whole)
        assert rows.rows == [8 if position is None else position] and whole.rows is None
        assert rows.output_tensor.shape[:2] == (1, 1) and whole.output_tensor.shape[:2] == (1, 9)
        torch.testing.assert_close(rows.output_tensor[:, 0], whole.output_tensor[:, rows.rows[0]], rtol=1e-12, atol=0)


def test_targets_at_their_positions_a_span_and_a_continuation_equal_the_whole_head(causal_lm):
    _, path = causal_lm
    feeds = _feeds()
    graph = load(path)
    args = dict(positions=[2, 5, 7], dtype=torch.float64)
    narrow = apply_targets(graph, "attnlrp", feeds, [4, 9, 11], **args)
    wide = apply_targets(graph, "attnlrp", feeds, [4, 9, 11], **args, logits="all")
    for a, b in zip(narrow, wide, strict=True):
        _same(a, b)
    assert narrow[0].rows == [2, 5, 7, 8]
    for score in ("logit", "logprob"):
        objective = f"{score}[4]@2 + {score}[9]@5 - 0.5*{score}[11]@7"
        a = rulegraph.explain(graph, "attnlrp", feeds, objective=objective, dtype=torch.float64)
        b = rulegraph.explain(graph, "attnlrp", feeds, objective=objective, dtype=torch.float64, logits="all")
        _same(a, b)
        assert a.extra["objective_value"] == pytest.approx(b.extra["objective_value"], rel=1e-12)
        assert a.rows == [2, 5, 7]
    g = rulegraph.generate(path, "attnlrp", text=PROMPT, continuation="w1 w2 w3", dtype=torch.float64, span=True)
    h = rulegraph.generate(path, "attnlrp", text=PROMPT, continuation="w1 w2 w3", dtype=torch.float64, span=True,
                           logits="all")
    torch.testing.assert_close(g.matrix, h.matrix, rtol=1e-12, atol=1e-15, equal_nan=True)
    assert [s.probability for s in g.steps] == pytest.approx([s.probability for s in h.steps], rel=1e-12)
    assert g.span.value == pytest.approx(h.span.value, rel=1e-12)


def test_a_batch_of_texts_and_top_k_targets(causal_lm):
    _, path = causal_lm
    texts = ["w1 w2 w3 w4", "w5 w6"]
    a = rulegraph.explain(path, "attnlrp", text=texts, dtype=torch.float64, targets="top-3")
    b = rulegraph.explain(path, "attnlrp", text=texts, dtype=torch.float64, targets="top-3", logits="all")
    for x, y in zip(a, b, strict=True):
        _same(x, y)


def test_a_position_not_computed_is_refused_by_name(causal_lm):
    _, path = causal_lm
    e = rulegraph.explain(path, "attnlrp", _feeds(), position=4)
    with pytest.raises(InputError, match="logits at position 6 were not computed .only at 4.; .*logits='all'"):
        e.output_at(6)
    with pytest.raises(InputError, match="option attnlrp.logits: 'some' is not valid; valid: all, explained"):
        rulegraph.explain(path, "attnlrp", _feeds(), logits="some")
    with pytest.raises(InputError, match="position 9 is out of range; the output has 9 positions"):
        rulegraph.explain(path, "attnlrp", _feeds(), position=9)


def _graph(*between: Node, weight=(4, 6), constants=None) -> Graph:
    """x [batch, positions, 4] @ W, then ``between`` (from ``z`` to ``out``)."""
    nodes = [Node("head", "MatMul", ("x", "W"), ("z",)), *between]
    last = between[-1].outputs[0] if between else "z"
    return Graph(nodes, [ValueInfo("x", "float32", ("b", "n", 4))], [last],
                 {"W": torch.ones(weight), **(constants or {})}, opset=17)


def test_the_head_is_found_only_where_the_graph_shows_it_plainly():
    assert head(_graph(), "z").name == "head"
    capped = _graph(Node("cap", "Div", ("z", "c"), ("d",)), Node("tanh", "Tanh", ("d",), ("t",)),
                    Node("bias", "Add", ("t", "b"), ("out",)), constants={"c": torch.tensor(30.0), "b": torch.ones(6)})
    assert head(capped, "out").name == "head"
    rewritten = head_rows(capped, "out", [-1])
    gather = rewritten.node("head::rows")
    assert gather.op == "Gather" and gather.attrs == {"axis": -2} and rewritten.node("head").inputs[0] == "x::rows"
    assert head_rows(capped, "out", [-1]) is rewritten                       # kept per row set
    assert head(_graph(Node("r", "Reshape", ("z", "s"), ("out",)), constants={"s": torch.tensor([1, -1])}),
                "out") is None                                                # behind a reshape
    assert head(_graph(Node("mix", "Add", ("z", "p"), ("out",)), constants={"p": torch.ones(1, 3, 6)}),
                "out") is None                                                # a per-position term
    moving = Graph([Node("head", "MatMul", ("x", "y"), ("z",))],
                   [ValueInfo("x", "float32", ("b", "n", 4)), ValueInfo("y", "float32", (4, 6))], ["z"], {}, opset=17)
    assert head(moving, "z") is None                                         # no fixed weight
