"""Whole-model forward against onnxruntime, for every architecture and both exporters;
value classes and the per-shape cache; input checks."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import rulegraph
import tiny
from rulegraph.errors import InputError
from rulegraph.interpreter import Stage, all_finite, prepare, stages

NAMES = {"bert": ("input_ids", "attention_mask", "token_type_ids")}
PAD = {"roberta": 1}


@pytest.fixture(scope="module", params=[(a, e) for a in tiny.BUILDERS for e in ("torchscript", "dynamo")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def exported(request, tmp_path_factory):
    arch, exporter = request.param
    names = NAMES.get(arch, ("input_ids", "attention_mask"))
    module = tiny.build(arch, attention="sdpa" if exporter == "dynamo" else "eager")
    path = tiny.onnx(module, tmp_path_factory.mktemp(f"{arch}_{exporter}") / "m.onnx", names=names, exporter=exporter)
    return arch, names, path


def test_outputs_match_onnxruntime(exported):
    arch, names, path = exported
    graph = rulegraph.load(path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch, length, pad in [(1, 5, 0), (3, 11, 4), (2, 23, 7)]:
        feeds = tiny.token_inputs(names, batch=batch, length=length, pad=pad, pad_id=PAD.get(arch, 0), seed=length)
        expected = session.run(None, {k: v.numpy() for k, v in feeds.items()})[0]
        got = rulegraph.run(graph, feeds)["logits"].numpy()
        assert got.shape == expected.shape
        assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()
        got64 = rulegraph.run(graph, feeds, dtype=torch.float64)["logits"].numpy()
        assert np.abs(got64 - expected).max() <= 1e-4 * np.abs(expected).max()


def test_every_shipped_rule_set_covers_the_export(exported):
    _, _, path = exported
    graph = rulegraph.load(path)
    for name in rulegraph.shipped_rule_sets():
        binding = rulegraph.RuleSet.load(name).bind(graph)
        assert not binding.unmatched, (name, [n.op for n in binding.unmatched])


def test_shape_arithmetic_runs_once_per_shape(bert_onnx):
    graph = rulegraph.load(bert_onnx)
    kinds = stages(graph)
    shape_nodes = [n for n in graph.nodes if n.op == "Shape"]
    assert shape_nodes and all(kinds[n.outputs[0]] == Stage.SHAPE for n in shape_nodes)
    plan = prepare(graph)
    assert len(plan.value_steps) < len(plan.steps) < len(graph.nodes)
    first = plan.run(tiny.token_inputs(length=7))
    again = plan.run(tiny.token_inputs(length=7, seed=5))
    other = plan.run(tiny.token_inputs(length=12))
    assert first["logits"].shape == again["logits"].shape == other["logits"].shape == (1, 2)
    assert len(plan._shape_cache) == 2
    assert prepare(graph) is plan and prepare(graph, dtype=torch.float64) is not plan


@pytest.mark.parametrize("change, message", [
    (lambda f: f.pop("attention_mask"), "missing input(s) attention_mask; the model takes: input_ids (int64, batch×sequence)"),
    (lambda f: f.update(extra=torch.zeros(1)), "unknown input(s) extra"),
    (lambda f: f.update(input_ids=f["input_ids"].float()), "input input_ids must be int64, got float32"),
    (lambda f: f.update(input_ids=f["input_ids"][0]), "input input_ids must have 2 dims"),
])
def test_inputs_are_checked(bert_onnx, change, message):
    feeds = tiny.token_inputs()
    change(feeds)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rulegraph.run(rulegraph.load(bert_onnx), feeds)


def test_ids_outside_the_embedding_table_are_refused_before_the_run(bert_onnx):
    feeds = tiny.token_inputs()
    feeds["token_type_ids"] = feeds["token_type_ids"] + 7          # beyond the 2-row type embedding table
    with pytest.raises(rulegraph.errors.InputError, match=r"token_type_ids holds the id 7, outside the vocabulary: "
                                                          r"the embedding table .* has 2 rows \(ids 0…1\)"):
        rulegraph.run(rulegraph.load(bert_onnx), feeds)


def test_a_failing_op_names_its_node():
    from rulegraph.ir import Graph, Node, ValueInfo
    node = Node("squash", "Reshape", ("x", "shape"), ("y",))
    graph = Graph([node], [ValueInfo("x", torch.float32, (2, "n"))], ["y"],
                  {"shape": torch.tensor([5])}, opset=18)
    with pytest.raises(rulegraph.errors.ModelError, match=r"node 'squash' \(Reshape\) failed on inputs "
                                                          r"\[\(2, 3\):float32, \[5\]\]"):
        rulegraph.run(graph, {"x": torch.ones(2, 3)})


def test_sequence_outputs_explain_one_position(tmp_path):
    """A language-model head ([batch, positions, vocab]): the explained scalar is one position's logit."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tiny.VOCAB), n_embd=32, n_layer=2, n_head=4, n_positions=64,
                        attn_implementation="eager")
    path = tiny.onnx(GPT2LMHeadModel(config).eval(), tmp_path / "lm.onnx", names=("input_ids", "attention_mask"))
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), length=6)
    last = rulegraph.explain(path, "lrp-ah-ln", feeds, dtype=torch.float64)
    third = rulegraph.explain(path, "lrp-ah-ln", feeds, position=2, dtype=torch.float64)
    assert last.position == 5 and third.position == 2          # the last of 6 positions by default
    assert last.target == [int(last.output_tensor[0, -1].argmax())]
    scores = third.relevance["input_ids"][0]
    assert torch.all(scores[3:] == 0)                   # causal: later tokens cannot matter
    assert third.audit.conservation.relative_error < 1e-10


def test_keep_frees_what_is_not_asked_for(bert_onnx):
    plan = prepare(rulegraph.load(bert_onnx))
    feeds = tiny.token_inputs(length=6)
    full = plan.run(feeds)
    lean = plan.run(feeds, keep=frozenset())
    assert set(lean) < set(full) and "logits" in lean
    assert torch.equal(lean["logits"], full["logits"])
    some = next(v for v in full if v not in lean)
    assert some in plan.run(feeds, keep=frozenset({some}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_all_finite_finds_any_nan_or_inf(dtype):
    t = torch.randn(30, 7, dtype=dtype)
    assert all_finite(t) and all_finite(t.mT) and all_finite(t[:0])
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = t.clone()
        x[29, 6] = bad
        assert not all_finite(x) and not all_finite(x.mT)
    assert all_finite(torch.tensor([1, 2]))      # integers are finite


def test_a_dtype_may_be_named(bert_onnx):
    graph = rulegraph.load(bert_onnx)
    assert prepare(graph, dtype="float64") is prepare(graph, dtype=torch.float64)
    assert prepare(graph, dtype="torch.float32").dtype == torch.float32
    with pytest.raises(InputError, match=r"float32, float64, bfloat16, float16 \(a torch.dtype or its name\), got 'int8'"):
        prepare(graph, dtype="int8")


def _chain():
    """y = tanh((x · 3 + c) / 2) · x: each value but x dies where the next op reads it."""
    from rulegraph.ir import Graph, Node, ValueInfo
    nodes = [Node("scale", "Mul", ("x", "three"), ("a",)), Node("shift", "Add", ("a", "c"), ("b",)),
             Node("half", "Div", ("b", "two"), ("d",)), Node("squash", "Tanh", ("d",), ("e",)),
             Node("gate", "Mul", ("e", "x"), ("y",))]
    constants = {"three": torch.tensor(3.0), "two": torch.tensor(2.0), "c": torch.randn(5)}
    return Graph(nodes, [ValueInfo("x", torch.float32, ("n", 5))], ["y"], constants, opset=18)


def test_a_dying_input_takes_the_output_bit_for_bit(monkeypatch):
    """An elementwise op writes into an input no later node reads (no allocation), and gives the bits
    the op gives when every value is kept."""
    from rulegraph import interpreter, lifetimes
    donors = []                        # whether each call found one (holding the tensor would pin it)
    find = interpreter.donor

    def spy(*args):
        found = find(*args)
        donors.append(found is not None)
        return found
    monkeypatch.setattr(interpreter, "donor", spy)
    monkeypatch.setattr(lifetimes, "DONATE_FROM", 0)
    plan = prepare(_chain())
    x = torch.randn(4, 5)
    before = x.clone()
    whole = plan.run({"x": x})
    assert not any(donors)                                 # every value kept: nothing to write into
    lean = plan.run({"x": x}, keep=frozenset())
    assert donors == [True] * 4                            # a → b → d → e → y (x is the caller's)
    assert torch.equal(lean["y"], whole["y"]) and torch.equal(x, before)
    donors.clear()
    monkeypatch.setattr(lifetimes, "DONATE_FROM", 4 * 5 * 4 + 1)
    assert torch.equal(plan.run({"x": x}, keep=frozenset())["y"], whole["y"])
    assert donors == [False] * 4                           # below DONATE_FROM a fresh tensor is cheaper
    donors.clear()
    assert torch.equal(plan.run({"x": torch.cat([x] * 2)}, keep=frozenset())["y"], torch.cat([whole["y"]] * 2))
    assert donors == [True] * 4                            # twice as many rows: at it


@pytest.fixture
def donating(monkeypatch):
    """Every dying input a candidate, however small (the chain's values are 80 bytes)."""
    from rulegraph import lifetimes
    monkeypatch.setattr(lifetimes, "DONATE_FROM", 0)


def test_a_value_held_elsewhere_is_never_written_into(donating):
    """An override the caller holds, or a value another name aliases, keeps its memory."""
    plan = prepare(_chain())
    x = torch.randn(4, 5)
    expected = plan.run({"x": x})["y"]
    b = torch.randn(4, 5) * 3
    held = b.clone()
    out = plan.run({"x": x}, keep=frozenset(), overrides={"b": b})
    assert torch.equal(b, held)                            # the caller's tensor is untouched
    assert torch.equal(out["y"], torch.tanh(b / 2) * x)
    view = b.view(20)                                      # a view of it, alive: its storage has two owners
    plan.run({"x": x}, keep=frozenset(), overrides={"b": b})
    assert torch.equal(view, held.view(20)) and torch.equal(plan.run({"x": x}, keep=frozenset())["y"], expected)


def test_a_forward_under_autograd_writes_into_nothing(donating):
    """Values autograd records (an input requiring its gradient) are never written into: the gradient
    through a lean forward is the gradient through a whole one."""
    plan = prepare(_chain())
    x = torch.randn(4, 5, requires_grad=True)
    (whole,) = torch.autograd.grad(plan.run({"x": x})["y"].sum(), x)
    (lean,) = torch.autograd.grad(plan.run({"x": x}, keep=frozenset())["y"].sum(), x)
    assert torch.equal(whole, lean)
