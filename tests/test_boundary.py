"""The input boundary (rulegraph/boundary.py) on hand-built graphs: embedding lookups reached through
index arithmetic — ids transposed, hashed into a table, shifted right behind a start token — the
mapping of their relevance back to the input's positions against autograd, the start token's share
booked as absorbed, and the errors: an input that reaches no lookup, a float computed from the ids
outside a lookup (relevance would be absorbed on a path that depends on the input), a lookup whose
indices come from two inputs. The architectures that need it (XLNet, CANINE, BART sequence
classification, a quantized BERT) are in tests/test_architectures.py and below."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import rulegraph
import tiny
from rulegraph.boundary import lookups
from rulegraph.errors import ModelError, RuleMatchError

B, T, H, V, BUCKETS = 2, 6, 4, 11, 5
START = 7
RNG = np.random.default_rng(3)
E = RNG.standard_normal((V, H))                    # token table, read twice
F = RNG.standard_normal((BUCKETS, H))              # hash table
W = RNG.standard_normal((H, 3))


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _graph(nodes, inits, inputs=(("ids", TensorProto.INT64),)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "boundary", [helper.make_tensor_value_info(n, t, [B, T]) for n, t in inputs],
        [helper.make_tensor_value_info("logits", TensorProto.DOUBLE, [B, 3])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _three_lookups() -> onnx.ModelProto:
    """logits = mean_t (E[idsᵀ]ᵀ + F[((id + 1)·3) mod 5] + E[shift_right(ids)]) · W"""
    nodes = [
        helper.make_node("Transpose", ["ids"], ["ids_t"], perm=[1, 0]),
        helper.make_node("Gather", ["E", "ids_t"], ["a_t"], name="lookup_transposed"),     # [T, B, H]
        helper.make_node("Transpose", ["a_t"], ["a"], perm=[1, 0, 2]),
        helper.make_node("Add", ["ids", "one"], ["p1"]),
        helper.make_node("Mul", ["p1", "three"], ["p2"]),
        helper.make_node("Mod", ["p2", "buckets"], ["hashed"]),
        helper.make_node("Gather", ["F", "hashed"], ["b"], name="lookup_hashed"),
        helper.make_node("Slice", ["ids", "zero1", "minus1", "one1"], ["head"]),
        helper.make_node("Concat", ["start", "head"], ["shifted"], axis=1),
        helper.make_node("Gather", ["E", "shifted"], ["c"], name="lookup_shifted"),
        helper.make_node("Add", ["a", "b"], ["ab"]),
        helper.make_node("Add", ["ab", "c"], ["abc"]),
        helper.make_node("MatMul", ["abc", "W"], ["z"]),
        helper.make_node("ReduceMean", ["z", "one1"], ["logits"], keepdims=0),
    ]
    inits = [_init("E", E), _init("F", F), _init("W", W), _init("one", np.array(1, np.int64)),
             _init("three", np.array(3, np.int64)), _init("buckets", np.array(BUCKETS, np.int64)),
             _init("zero1", np.array([0], np.int64)), _init("minus1", np.array([-1], np.int64)),
             _init("one1", np.array([1], np.int64)), _init("start", np.full((B, 1), START, np.int64))]
    return _graph(nodes, inits)


def _ids() -> torch.Tensor:
    return torch.tensor(RNG.integers(0, V, (B, T)), dtype=torch.int64)


def _reference(ids: torch.Tensor, target: list[int]) -> tuple[torch.Tensor, float]:
    """Gradient×Input at each lookup by autograd, mapped back to the positions by hand; and the start
    token's share."""
    e, f, w = (torch.tensor(t, requires_grad=False) for t in (E, F, W))
    shifted = torch.cat([torch.full((B, 1), START), ids[:, :-1]], 1)
    a = e[ids].requires_grad_(True)
    b = f[((ids + 1) * 3) % BUCKETS].requires_grad_(True)
    c = e[shifted].requires_grad_(True)
    logits = ((a + b + c) @ w).mean(1)
    logits[torch.arange(B), target].sum().backward()
    ga, gb, gc = ((x * x.grad).sum(-1) for x in (a, b, c))
    per_position = ga + gb
    per_position[:, :-1] += gc[:, 1:]          # the shifted lookup's position k reads the id at k − 1
    return per_position.detach(), float(gc[:, 0].detach().sum())


def test_lookups_are_found_through_index_arithmetic():
    graph = rulegraph.load(_three_lookups())
    found = {lk.node.name: lk for lk in lookups(graph)}
    assert set(found) == {"lookup_transposed", "lookup_hashed", "lookup_shifted"}
    assert all(lk.source == "ids" for lk in found.values())
    # the hashed ids are computed, not moved: the table's rows do not bound the ids
    assert found["lookup_transposed"].bounds_ids and found["lookup_shifted"].bounds_ids
    assert not found["lookup_hashed"].bounds_ids


def test_relevance_maps_back_to_the_input_positions():
    ids = _ids()
    e = rulegraph.explain(_three_lookups(), "gi", {"ids": ids}, dtype=torch.float64)
    reference, start_share = _reference(ids, e.target)
    assert list(e.relevance) == ["ids"]
    torch.testing.assert_close(e.relevance["ids"], reference, rtol=1e-12, atol=1e-12)
    assert e.boundary["ids"].shape == (B, T, H)
    # the start token's lookup is booked as absorbed where it was read, and the audit closes
    booked = [n for n in e.audit.nodes if n.rule == "boundary"]
    assert [n.name for n in booked] == ["lookup_shifted"]
    assert booked[0].absorbed == pytest.approx(start_share, rel=1e-12, abs=1e-14)
    c = e.audit.conservation
    assert c.input_total == pytest.approx(float(reference.sum()), rel=1e-12, abs=1e-14)
    assert c.relative_error < 1e-12


def test_decomposition_reads_the_same_mapping():
    """The graph is linear: each token's decomposition component is its exact contribution, the
    start token's lookup goes to the bias component."""
    ids = _ids()
    gi = rulegraph.explain(_three_lookups(), "gi", {"ids": ids}, dtype=torch.float64)
    for mode in ("components", "linearized"):
        d = rulegraph.explain(_three_lookups(), "decomposition", {"ids": ids}, target=gi.target, dtype=torch.float64,
                              mode=mode)
        torch.testing.assert_close(d.relevance["ids"], gi.relevance["ids"], rtol=1e-12, atol=1e-12)
        assert d.audit.conservation.relative_error < 1e-12


def test_ids_shifted_by_a_scatter_reach_their_lookup():
    """The dynamo export of shift_tokens_right: zeros, the ids written one place right (ScatterElements),
    the start token written at 0 — a scatter that writes is routing for the boundary."""
    positions = np.tile(np.arange(1, T, dtype=np.int64), (B, 1))
    nodes = [helper.make_node("Slice", ["ids", "zero1", "minus1", "one1"], ["head"]),
             helper.make_node("ScatterElements", ["zeros", "positions", "head"], ["moved"], axis=1),
             helper.make_node("ScatterElements", ["moved", "first", "start"], ["shifted"], axis=1),
             helper.make_node("Gather", ["E", "shifted"], ["c"], name="lookup_shifted"),
             helper.make_node("MatMul", ["c", "W"], ["z"]),
             helper.make_node("ReduceMean", ["z", "one1"], ["logits"], keepdims=0)]
    model = _graph(nodes, [_init("E", E), _init("W", W), _init("zeros", np.zeros((B, T), np.int64)),
                           _init("positions", positions), _init("first", np.zeros((B, 1), np.int64)),
                           _init("start", np.full((B, 1), START, np.int64)), _init("zero1", np.array([0], np.int64)),
                           _init("minus1", np.array([-1], np.int64)), _init("one1", np.array([1], np.int64))])
    ids = _ids()
    e = rulegraph.explain(model, "gi", {"ids": ids}, dtype=torch.float64)
    c = torch.tensor(E)[torch.cat([torch.full((B, 1), START), ids[:, :-1]], 1)].requires_grad_(True)
    (c @ torch.tensor(W)).mean(1)[torch.arange(B), e.target].sum().backward()
    gc = (c * c.grad).sum(-1).detach()
    expected = torch.zeros(B, T, dtype=torch.float64)
    expected[:, :-1] = gc[:, 1:]
    torch.testing.assert_close(e.relevance["ids"], expected, rtol=1e-12, atol=1e-14)
    assert [n.absorbed for n in e.audit.nodes if n.rule == "boundary"] == pytest.approx([float(gc[:, 0].sum())])


def test_an_input_that_reaches_no_lookup_is_named():
    nodes = [helper.make_node("CumSum", ["ids", "axis"], ["positions"], name="running"),
             helper.make_node("Gather", ["E", "positions"], ["x"]),
             helper.make_node("MatMul", ["x", "W"], ["z"]),
             helper.make_node("ReduceMean", ["z", "axes"], ["logits"], keepdims=0)]
    model = _graph(nodes, [_init("E", E), _init("W", W), _init("axis", np.array(1, np.int64)),
                           _init("axes", np.array([1], np.int64))])
    with pytest.raises(RuleMatchError, match=r"ids reaches no embedding lookup \(its values stop at 'running' \(CumSum\)"):
        rulegraph.explain(model, "gi", {"ids": _ids() % 2})


def test_relevance_is_never_absorbed_on_a_path_that_depends_on_the_input():
    """The ids cast to float and added to the embeddings: that summand depends on the input but is no
    lookup, so relevance reaching it would be absorbed — refused, naming the node and the input."""
    nodes = [helper.make_node("Gather", ["E", "ids"], ["x"]),
             helper.make_node("Cast", ["ids"], ["idf"], to=TensorProto.DOUBLE),
             helper.make_node("Unsqueeze", ["idf", "minus1"], ["idf3"]),
             helper.make_node("Add", ["x", "idf3"], ["y"], name="mix"),
             helper.make_node("MatMul", ["y", "W"], ["z"]),
             helper.make_node("ReduceMean", ["z", "axes"], ["logits"], keepdims=0)]
    model = _graph(nodes, [_init("E", E), _init("W", W), _init("minus1", np.array([-1], np.int64)),
                           _init("axes", np.array([1], np.int64))])
    with pytest.raises(ModelError, match=r"node 'mix' \(Add\) reads 'idf3', a float computed from input ids"):
        rulegraph.explain(model, "gi", {"ids": _ids()})


def test_a_lookup_the_walk_cannot_follow_is_refused_beside_one_it_can():
    """Token embeddings found, plus a second table read at CumSum(ids): that summand depends on the ids'
    values, is no lookup the boundary maps, so relevance reaching it would be absorbed — refused."""
    nodes = [helper.make_node("Gather", ["E", "ids"], ["x"]),
             helper.make_node("CumSum", ["ids", "axis"], ["running"]),
             helper.make_node("Mod", ["running", "buckets"], ["slot"]),
             helper.make_node("Gather", ["F", "slot"], ["extra"], name="running_lookup"),
             helper.make_node("Add", ["x", "extra"], ["y"], name="sum"),
             helper.make_node("MatMul", ["y", "W"], ["z"]),
             helper.make_node("ReduceMean", ["z", "axes"], ["logits"], keepdims=0)]
    model = _graph(nodes, [_init("E", E), _init("F", F), _init("W", W), _init("axis", np.array(1, np.int64)),
                           _init("buckets", np.array(BUCKETS, np.int64)), _init("axes", np.array([1], np.int64))])
    with pytest.raises(ModelError, match=r"node 'sum' \(Add\) reads 'extra', a float computed from input ids but not "
                                         r"through an embedding lookup"):
        rulegraph.explain(model, "gi", {"ids": _ids()})


def test_a_mask_of_the_ids_is_not_a_dependence():
    """RoBERTa-style: positions computed from ids ≠ pad (a mask) index a position table; that table's share
    is absorbed like any position embedding's, not refused."""
    nodes = [helper.make_node("Gather", ["E", "ids"], ["x"]),
             helper.make_node("Equal", ["ids", "pad"], ["is_pad"]),
             helper.make_node("Not", ["is_pad"], ["real"]),
             helper.make_node("Cast", ["real"], ["real_i"], to=TensorProto.INT64),
             helper.make_node("CumSum", ["real_i", "axis"], ["positions"]),
             helper.make_node("Gather", ["P", "positions"], ["p"]),
             helper.make_node("Add", ["x", "p"], ["y"]),
             helper.make_node("MatMul", ["y", "W"], ["z"]),
             helper.make_node("ReduceMean", ["z", "axes"], ["logits"], keepdims=0)]
    positions = RNG.standard_normal((T + 1, H))
    model = _graph(nodes, [_init("E", E), _init("P", positions), _init("W", W), _init("axis", np.array(1, np.int64)),
                           _init("pad", np.array(0, np.int64)), _init("axes", np.array([1], np.int64))])
    ids = torch.tensor([[3, 4, 1, 2, 0, 0], [5, 6, 7, 8, 9, 1]])
    e = rulegraph.explain(model, "gi", {"ids": ids}, dtype=torch.float64)
    assert e.audit.conservation.relative_error < 1e-12 and e.audit.conservation.absorbed != 0


def test_a_lookup_indexed_from_two_inputs_is_refused():
    nodes = [helper.make_node("Add", ["ids", "types"], ["both"]),
             helper.make_node("Gather", ["E", "both"], ["x"], name="joint"),
             helper.make_node("MatMul", ["x", "W"], ["z"]),
             helper.make_node("ReduceMean", ["z", "axes"], ["logits"], keepdims=0)]
    model = _graph(nodes, [_init("E", E), _init("W", W), _init("axes", np.array([1], np.int64))],
                   inputs=(("ids", TensorProto.INT64), ("types", TensorProto.INT64)))
    with pytest.raises(ModelError, match="'joint' .* from two inputs, ids and types"):
        rulegraph.explain(model, "gi", {"ids": _ids() % 5, "types": _ids() % 2})


# -- a BERT whose embedding tables onnxruntime quantized (dynamic int8): the lookups read dequantized tables


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    quantization = pytest.importorskip("onnxruntime.quantization")
    folder = tmp_path_factory.mktemp("quantized")
    module = tiny.build("bert")
    path = tiny.onnx(module, folder / "model.onnx")
    out = folder / "quantized.onnx"
    quantization.quantize_dynamic(str(path), str(out), op_types_to_quantize=["Gather"])
    return module, out


def test_a_dequantized_table_is_a_lookup(quantized):
    module, path = quantized
    graph = rulegraph.load(str(path))
    assert "DequantizeLinear" in graph.op_types()
    found = lookups(graph)
    assert {lk.source for lk in found} == {"input_ids", "token_type_ids"}
    assert all(lk.node.op == "DequantizeLinear" for lk in found)    # the rows of the int8 tables, made float


def test_quantized_bert_gi_equals_autograd_with_the_dequantized_tables(quantized):
    import copy
    module, path = quantized
    graph = rulegraph.load(str(path))
    feeds = tiny.token_inputs(length=7)
    e = rulegraph.explain(graph, "gi", feeds, dtype=torch.float64)
    model = copy.deepcopy(module).double()
    from rulegraph.boundary import constant_value
    embeddings = model.bert.embeddings
    tables = {m.weight.shape[0]: m for m in (embeddings.word_embeddings, embeddings.position_embeddings,
                                             embeddings.token_type_embeddings)}
    for node in graph.nodes:      # the module reads the dequantized tables the graph reads (DequantizeLinear(table[ids]))
        if node.op == "DequantizeLinear":
            gather = graph.producer[node.inputs[0]]
            scale, zero = (constant_value(graph, v).double() for v in node.inputs[1:3])
            table = (constant_value(graph, gather.inputs[0]).double() - zero) * scale
            tables[table.shape[0]].weight.data.copy_(table)
    ref = _hooked_gi(model, feeds, e.target[0], [embeddings.word_embeddings, embeddings.token_type_embeddings])
    torch.testing.assert_close(e.relevance["input_ids"], ref[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(e.relevance["token_type_ids"], ref[1], rtol=1e-9, atol=1e-12)
    assert e.audit.conservation.relative_error < 1e-10


def _hooked_gi(model, feeds, target: int, modules) -> list[torch.Tensor]:
    """x ⊙ ∂logit/∂x summed over the hidden dim at each module's output (one call each)."""
    caught: dict[int, torch.Tensor] = {}

    def hook(mod, args, out):
        out.retain_grad()
        caught[id(mod)] = out
    handles = [m.register_forward_hook(hook) for m in modules]
    try:
        model(**feeds).logits[0, target].backward()
    finally:
        for h in handles:
            h.remove()
    return [(caught[id(m)] * caught[id(m)].grad).sum(-1).detach() for m in modules]


def test_baselines_read_the_mapping():
    """gs reads ∂f/∂x at every lookup mapped back to the positions; ig, which interpolates each batch
    item's lookups, refuses a lookup whose batch is not its dim 0 (the transposed ids)."""
    from rulegraph.errors import InputError
    from rulegraph.methods import explain_with
    ids = _ids()
    e = explain_with(_three_lookups(), "gs", {"ids": ids}, dtype=torch.float64)
    assert e.relevance["ids"].shape == (B, T)
    with pytest.raises(InputError, match="ig interpolates .* 'a_t' does not hold the batch in dim 0"):
        explain_with(_three_lookups(), "ig", {"ids": ids}, dtype=torch.float64)
