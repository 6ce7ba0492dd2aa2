"""Whole-model explanations on a tiny BERT against independent references, and the audit."""
from __future__ import annotations

import warnings

import pytest
import torch

import rulegraph
import tiny
from reference import bert_logits, gradient_x_input
from rulegraph import RuleSet
from rulegraph.errors import InputError, NumericalError
from rulegraph.propagation import RULES, Rule, relevance_rule
from rulegraph.propagation.signal import Contribution

SHIPPED = sorted(rulegraph.shipped_rule_sets())
F64 = torch.float64


def _feeds(batch=2, length=9, pad=3):
    return tiny.token_inputs(batch=batch, length=length, pad=pad)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def _reference(bert, feeds, target, **detach):
    model = bert.double()
    words = model.bert.embeddings.word_embeddings(feeds["input_ids"])
    return gradient_x_input(
        lambda w: bert_logits(model, w, feeds["attention_mask"], feeds["token_type_ids"], **detach), words, target)


def test_reference_reproduces_the_module(bert):
    """The functional re-implementation is the module (so the detach references are meaningful)."""
    model, feeds = bert.double(), _feeds()
    words = model.bert.embeddings.word_embeddings(feeds["input_ids"])
    with torch.no_grad():
        expected = model(**feeds).logits
        got = bert_logits(model, words, feeds["attention_mask"], feeds["token_type_ids"])
    assert _relative(got, expected) < 1e-12


def test_gi_equals_autograd_gradient_times_input(bert, bert_onnx):
    feeds = _feeds()
    e = rulegraph.explain(bert_onnx, "gi", feeds, dtype=F64)
    model = bert.double()
    words = model.bert.embeddings.word_embeddings(feeds["input_ids"])
    expected = gradient_x_input(lambda w: model(inputs_embeds=w, attention_mask=feeds["attention_mask"],
                                                token_type_ids=feeds["token_type_ids"]).logits, words, e.target)
    assert _relative(e.relevance["input_ids"], expected) < 1e-10


@pytest.mark.parametrize("rules, detach", [
    ("lrp-ah-ln", dict(detach_probs=True, detach_std=True)),
    ("lrp-ah", dict(detach_probs=True)),
])
def test_lrp_equals_the_papers_detach_trick(bert, bert_onnx, rules, detach):
    """Ali et al. 2022, Sec. 4: LRP (AH[+LN]) is GI with the probabilities [and LayerNorm std] detached."""
    feeds = _feeds()
    e = rulegraph.explain(bert_onnx, rules, feeds, dtype=F64)
    assert _relative(e.relevance["input_ids"], _reference(bert, feeds, e.target, **detach)) < 1e-8


@pytest.mark.parametrize("fixture", ["bert_dynamo_onnx", "bert_sdpa_onnx"])
@pytest.mark.parametrize("rules", SHIPPED)
def test_same_relevance_across_exports(request, bert_onnx, fixture, rules):
    """One rule file, the same relevance on the TorchScript, dynamo and SDPA-attention exports."""
    feeds = _feeds()
    base = rulegraph.explain(bert_onnx, rules, feeds, dtype=F64)
    other = rulegraph.explain(request.getfixturevalue(fixture), rules, feeds, dtype=F64)
    assert other.target == base.target
    assert _relative(other.relevance["input_ids"], base.relevance["input_ids"]) < 1e-8


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (F64, 1e-10)])
@pytest.mark.parametrize("rules", SHIPPED)
def test_every_shipped_rule_set_reconstructs_the_logit(bert_onnx, rules, dtype, tolerance):
    e = rulegraph.explain(bert_onnx, rules, _feeds(), dtype=dtype)
    c = e.audit.conservation
    assert c.output_value == pytest.approx(sum(e.output_value))
    assert abs(c.residual) / abs(c.output_value) <= tolerance
    assert c.input_total + c.absorbed + c.breaks + c.residual == pytest.approx(c.output_value, rel=1e-12)
    assert not e.audit.unexpected


def test_conserving_rule_set_has_no_breaks(bert_onnx):
    e = rulegraph.explain(bert_onnx, "epsilon", _feeds())
    assert all(n.conserving for n in e.audit.nodes)
    assert e.audit.conservation.breaks == 0.0
    assert e.audit.conservation.absorbed != 0.0     # biases, position embeddings, β and ε absorb


def test_gi_breaks_where_the_paper_says(bert_onnx):
    """GI breaks conservation in LayerNorm, attention and GELU (Ali et al. 2022, Sec. 3)."""
    e = rulegraph.explain(bert_onnx, "gi", _feeds())
    broken = {n.op for n in e.audit.nodes if not n.conserving and abs(n.breaks) > 0}
    assert {"LayerNormalization", "Softmax", "Erf"} <= broken


def test_layers_add_up_to_the_graph(bert_onnx):
    e = rulegraph.explain(bert_onnx, "lrp-ah-ln", _feeds())
    a = e.audit
    assert [layer.name for layer in a.layers] == ["embeddings", "block 0", "block 1", "head"]
    assert sum(layer.absorbed for layer in a.layers) == pytest.approx(a.conservation.absorbed)
    assert sum(layer.breaks for layer in a.layers) == pytest.approx(a.conservation.breaks)
    head, embeddings = a.layers[-1], a.layers[0]
    assert head.relevance_in == pytest.approx(a.conservation.output_value)
    assert embeddings.relevance_out == pytest.approx(a.conservation.input_total)
    for upper, lower in zip(a.layers[1:], a.layers[:-1]):   # what a layer passes down, the next receives
        assert upper.relevance_out == pytest.approx(lower.relevance_in)
    assert max(layer.relative_error for layer in a.layers) < 1e-5


def test_batch_items_are_explained_independently(bert_onnx):
    feeds = _feeds(batch=3, pad=2)
    batch = rulegraph.explain(bert_onnx, "lrp-ah-ln", feeds, dtype=F64)
    for i in range(3):
        single = rulegraph.explain(bert_onnx, "lrp-ah-ln", {k: v[i:i + 1] for k, v in feeds.items()}, dtype=F64)
        assert single.target == [batch.target[i]]
        assert _relative(batch.relevance["input_ids"][i:i + 1], single.relevance["input_ids"]) < 1e-10


def test_explicit_target_and_its_range(bert_onnx):
    feeds = _feeds(batch=1)
    e = rulegraph.explain(bert_onnx, "lrp-ah-ln", feeds, target=0)
    assert e.target == [0] and e.output_value[0] == pytest.approx(float(e.output_tensor[0, 0]))
    with pytest.raises(InputError, match="out of range"):
        rulegraph.explain(bert_onnx, "lrp-ah-ln", feeds, target=5)


@relevance_rule("test-leaky")
class _Leaky(Rule):
    """Claims to conserve but hands on only 90% (to show the audit catches it)."""

    def propagate(self, site):
        return [Contribution(relevance=0.9 * site.incoming[0].tensor) if t else None for t in site.tainted]


def test_audit_catches_a_rule_that_leaks(bert_onnx):
    try:
        rules = RuleSet.from_yaml(
            "rules:\n  - op: Tanh\n    rule: test-leaky\n" + _shipped_entries("lrp-ah-ln"), source="leaky.yaml")
        e = rulegraph.explain(bert_onnx, rules, _feeds())
    finally:
        RULES["relevance"].remove("test-leaky")
    assert [n.op for n in e.audit.unexpected] == ["Tanh"]
    assert not e.audit.ok
    tanh = e.audit.unexpected[0]
    assert e.audit.conservation.residual == pytest.approx(0.1 * tanh.relevance_in, rel=1e-4)


def test_stop_is_a_declared_break(bert_onnx):
    rules = RuleSet.from_yaml("rules:\n  - op: Tanh\n    rule: stop\n" + _shipped_entries("lrp-ah-ln"))
    e = rulegraph.explain(bert_onnx, rules, _feeds())
    c = e.audit.conservation
    assert c.input_total == 0.0 and c.absorbed == pytest.approx(0.0, abs=1e-12)
    assert c.breaks == pytest.approx(c.output_value)
    assert e.audit.ok


def test_unmatched_nodes_error_or_strand(bert_onnx):
    strict = RuleSet.from_yaml("rules:\n  - op: [Gemm, Tanh, Gather]\n    rule: gradient\n", source="partial.yaml")
    with pytest.raises(rulegraph.errors.RuleMatchError, match=r"partial.yaml: no rule matches node .*LayerNorm"):
        rulegraph.explain(bert_onnx, strict, _feeds())
    lenient = RuleSet.from_yaml("on_unmatched: warn\nrules:\n  - op: [Gemm, Tanh, Gather]\n    rule: gradient\n")
    with pytest.warns(UserWarning, match="have no rule"):
        e = rulegraph.explain(bert_onnx, lenient, _feeds())
    c = e.audit.conservation
    assert c.stranded and sum(c.stranded.values()) == pytest.approx(c.residual, rel=1e-6)
    assert not e.audit.ok


def test_nan_output_is_a_clear_error(tmp_path):
    import onnx
    from onnx import TensorProto, helper
    node = helper.make_node("Log", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(NumericalError, match="NaN or inf"):
        rulegraph.explain(model, "gi", {"x": torch.tensor([[-1.0, 2.0, 3.0]])})
    with pytest.raises(NumericalError, match="input x contains NaN"):
        rulegraph.explain(model, "gi", {"x": torch.tensor([[float("nan"), 2.0, 3.0]])})
    onnx.checker.check_model(model)


def _shipped_entries(name: str) -> str:
    """The ``rules:`` entries of a shipped rule set, to append after a test's own."""
    text = rulegraph.shipped_rule_sets()[name].read_text()
    return text[text.index("rules:\n") + len("rules:\n"):]


def test_no_warnings_on_the_happy_path(bert_onnx):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rulegraph.explain(bert_onnx, "lrp-ah-ln", _feeds())
