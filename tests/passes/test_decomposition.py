"""The decomposition pass (Yang et al. 2023, Sec. 2) against hand-written float64 decompositions,
its properties (exact reconstruction, Group Additivity of signed D̂ and not of abs),
partitions, rule-file errors and the command line."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import rulegraph
import tiny
from rulegraph import RuleSet
from rulegraph.cli import main
from rulegraph.passes import decomposition as engine
from rulegraph.passes.decomposition import run_pass
from rulegraph.passes.partition import assign
from rulegraph.errors import InputError, RuleFileError, RuleMatchError

F64 = torch.float64
SHIPPED = rulegraph.shipped_rule_sets()["decomposition"].read_text()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


# -- an independent reference: the paper's equations written out ------------------------------------------

@torch.no_grad()
def reference_activation(d, b, f, alpha="signed", variant="hat", lam=0.1):
    """One elementwise activation on components ``d`` [G, …] and bias ``b``, written from the paper.

    D̄ (Eq. 7–8): every component times the gate W' (for ReLU) / f(h)/h. D̂: B ↦ f(B) (Eq. 9);
    D_g ↦ W' D_g + α_g Θ with Θ = W' B − f(B) (Eq. 11, 33) and α by Eq. 12 / 13 / 17.
    """
    h = d.sum(0) + b
    gate = torch.where(h != 0, f(h) / torch.where(h != 0, h, torch.ones_like(h)), torch.zeros_like(h))
    if variant == "bar":
        return d * gate, b * gate
    theta = gate * b - f(b)
    signed = d / d.sum(0)
    absolute = d.abs() / d.abs().sum(0)
    if alpha == "signed":
        a = signed
    elif alpha == "abs":
        a = absolute
    else:
        r = d.sum(0).abs() / d.abs().sum(0)
        a = torch.where(r < lam, absolute, signed)
    return gate * d + a * theta, f(b)


class MLP(torch.nn.Module):
    def __init__(self, sizes=(6, 8, 8, 3), act=torch.relu):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.act = act

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.act(x)
        return x


@torch.no_grad()
def mlp_reference(model, x, groups, **kw):
    """Components of the MLP's logits for a partition of the input features."""
    d = torch.stack([x * torch.isin(torch.arange(x.shape[1]), torch.tensor(g)).to(x.dtype) for g in groups])
    b = torch.zeros_like(x)
    for i, layer in enumerate(model.layers):
        d = d @ layer.weight.T
        b = b @ layer.weight.T + layer.bias
        if i < len(model.layers) - 1:
            d, b = reference_activation(d, b, torch.relu, **kw)
    return d, b


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    from rulegraph.exporters import export_onnx
    torch.manual_seed(3)
    model = MLP().eval()
    x = torch.randn(2, 6)
    path = export_onnx(model, {"x": x}, tmp_path_factory.mktemp("mlp") / "mlp.onnx", overwrite=True)
    return model.double(), x.double(), path


@pytest.mark.parametrize("kw", [dict(alpha="signed"), dict(alpha="abs"), dict(alpha="hybrid", lam=0.5),
                                dict(variant="bar")])
@pytest.mark.parametrize("groups", ["token", [[0, 1], [2], [3, 4, 5]]])
def test_mlp_matches_the_papers_equations(mlp, kw, groups):
    model, x, path = mlp
    e = rulegraph.explain(path, "decomposition", {"x": x}, target=[0, 2], dtype=F64, groups=groups,
                  alpha=kw.get("alpha"), threshold=kw.get("lam"), variant=kw.get("variant"))
    explicit = [[i] for i in range(6)] if groups == "token" else groups
    d, b = mlp_reference(model, x, explicit, **kw)
    expected = d[:, [0, 1], [0, 2]].T                                  # [batch, G]
    got = torch.tensor([[g["score"] for g in item["groups"]] for item in e.extra["decomposition"]["items"]], dtype=F64)
    assert _relative(got, expected) < 1e-10
    bias = torch.tensor([item["bias"] for item in e.extra["decomposition"]["items"]], dtype=F64)
    assert _relative(bias, b[[0, 1], [0, 2]]) < 1e-10


# -- a ReLU / GELU BERT against a functional decomposition ----------------------------------------------------

@torch.no_grad()
def bert_reference(model, feeds, groups, *, act="relu", **kw):
    """Group components and bias of the logits of ``BertForSequenceClassification``, from its weights.

    The attention probabilities and LayerNorm's std are computed from the forward values
    (coefficients, Eq. 5–6); the word and token-type embeddings of a position belong to
    its group; position embeddings and biases start the bias component.
    """
    bert, emb = model.bert, model.bert.embeddings
    ids, mask, types = feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"]
    batch, length = ids.shape
    inputs = emb.word_embeddings(ids) + emb.token_type_embeddings(types)
    member = torch.zeros(len(groups), length, dtype=F64)
    for g, positions in enumerate(groups):
        member[g, positions] = 1
    d = member[:, None, :, None] * inputs[None]
    b = emb.position_embeddings.weight[:length].expand_as(inputs).clone()

    def linear(d, b, layer):
        return d @ layer.weight.T, b @ layer.weight.T + layer.bias

    def layer_norm(d, b, module):
        h = d.sum(0) + b
        std = torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + module.eps)
        return ((d - d.mean(-1, keepdim=True)) / std * module.weight,
                (b - b.mean(-1, keepdim=True)) / std * module.weight + module.bias)

    d, b = layer_norm(d, b, emb.LayerNorm)
    blocked = (1.0 - mask[:, None, None, :].to(F64)) * torch.finfo(F64).min
    for layer in bert.encoder.layer:
        att = layer.attention.self
        heads, size = att.num_attention_heads, att.attention_head_size
        x = d.sum(0) + b

        def split(t):
            return t.reshape(*t.shape[:-2], length, heads, size).transpose(-2, -3)

        def merge(t):
            return t.transpose(-2, -3).reshape(*t.shape[:-3], length, heads * size)

        q, k = split(att.query(x)), split(att.key(x))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(size) + blocked, dim=-1)
        vd, vb = linear(d, b, att.value)
        cd, cb = merge(probs @ split(vd)), merge(probs @ split(vb))
        od, ob = linear(cd, cb, layer.attention.output.dense)
        d, b = layer_norm(od + d, ob + b, layer.attention.output.LayerNorm)
        hd, hb = linear(d, b, layer.intermediate.dense)
        if act == "relu":
            hd, hb = reference_activation(hd, hb, torch.relu, **kw)
        else:  # GELU = h·Φ(h) with Φ(h) a coefficient on every component
            phi = 0.5 * (1 + torch.erf((hd.sum(0) + hb) / math.sqrt(2)))
            hd, hb = hd * phi, hb * phi
        fd, fb = linear(hd, hb, layer.output.dense)
        d, b = layer_norm(fd + d, fb + b, layer.output.LayerNorm)
    pd, pb = linear(d[:, :, 0], b[:, 0], bert.pooler.dense)
    pd, pb = reference_activation(pd, pb, torch.tanh, **kw)
    return linear(pd, pb, model.classifier)


@pytest.fixture(scope="module")
def relu_bert(tmp_path_factory):
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(5)
    s = tiny.SIZE
    config = BertConfig(vocab_size=len(tiny.VOCAB), hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                        num_attention_heads=s["heads"], intermediate_size=s["ffn"],
                        max_position_embeddings=s["positions"], hidden_act="relu", attn_implementation="eager")
    model = BertForSequenceClassification(config).eval()
    path = tiny.onnx(model, tmp_path_factory.mktemp("relu_bert") / "model.onnx")
    return model.double(), path


def _scores(e):
    doc = e.extra["decomposition"]
    items = doc["items"] if "items" in doc else [doc]
    return (torch.tensor([[g["score"] for g in item["groups"]] for item in items], dtype=F64),
            torch.tensor([item["bias"] for item in items], dtype=F64))


@pytest.mark.parametrize("alpha", ["signed", "abs", "hybrid"])
def test_relu_bert_matches_a_functional_decomposition(relu_bert, alpha):
    model, path = relu_bert
    feeds = tiny.token_inputs(batch=2, length=7, pad=2)
    e = rulegraph.explain(path, "decomposition", feeds, dtype=F64, alpha=alpha)
    d, b = bert_reference(model, feeds, [[i] for i in range(7)], alpha=alpha)
    got, bias = _scores(e)
    rows = torch.arange(2)
    assert _relative(got, d[:, rows, e.target].T) < 1e-10
    assert _relative(bias, b[rows, e.target]) < 1e-10


def test_gelu_bert_gates_with_phi(bert, bert_onnx):
    feeds = tiny.token_inputs(batch=2, length=7, pad=2)
    e = rulegraph.explain(bert_onnx, "decomposition", feeds, dtype=F64, groups="0-2,3-6", alpha="signed")
    d, b = bert_reference(bert.double(), feeds, [[0, 1, 2], [3, 4, 5, 6]], act="gelu", alpha="signed")
    got, bias = _scores(e)
    rows = torch.arange(2)
    assert _relative(got, d[:, rows, e.target].T) < 1e-10
    assert _relative(bias, b[rows, e.target]) < 1e-10


# -- exactness and properties ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (F64, 1e-10)])
@pytest.mark.parametrize("alpha", ["signed", "hybrid", "abs"])
def test_components_sum_to_every_value(bert_onnx, dtype, tolerance, alpha):
    feeds = tiny.token_inputs(batch=2, length=9, pad=3)
    result = run_pass(rulegraph.load(bert_onnx), RuleSet.load("decomposition"), feeds, dtype=dtype,
                      alpha=alpha, keep=True)
    assert len(result.errors) == len(result.binding.reached)       # every reached node is audited
    for name, (gap, scale) in result.errors.items():
        assert float(gap) <= tolerance * float(scale), name
    for value, parts in result.parts.items():                      # what the audit measured, recomputed
        assert _relative(parts.total(), result.env[value]) <= tolerance


@pytest.mark.parametrize("alpha", ["signed", "hybrid"])
def test_writing_into_dying_components_changes_no_bit(bert_onnx, alpha, monkeypatch):
    """Without ``keep``, a rule writes into the components of an input no later node reads and nothing
    else holds (``ComponentSite.into``: LayerNorm, the activations): the outputs' components and every
    node's audit are those of a pass that keeps everything, bit for bit, chunked or not."""
    feeds = tiny.token_inputs(batch=2, length=9, pad=3)
    graph, rules = rulegraph.load(bert_onnx), RuleSet.load("decomposition")
    from rulegraph.propagation.components import ComponentSite
    handed, into = [], ComponentSite.into

    def spy(site, k):
        groups = into(site, k)
        handed.append(groups is not None)
        return groups
    monkeypatch.setattr(ComponentSite, "into", spy)
    for chunk in (engine.CHUNK_ELEMENTS, 100):
        monkeypatch.setattr(engine, "CHUNK_ELEMENTS", chunk)
        kept = run_pass(graph, rules, feeds, dtype=F64, alpha=alpha, keep=True)
        assert handed and not any(handed)
        handed.clear()
        lean = run_pass(graph, rules, feeds, dtype=F64, alpha=alpha)
        assert sum(handed) >= 5                       # the LayerNorms and the activation, at least
        handed.clear()
        for value, parts in lean.parts.items():
            assert torch.equal(parts.groups, kept.parts[value].groups) and torch.equal(parts.bias, kept.parts[value].bias)
        assert {k: tuple(map(float, v)) for k, v in lean.errors.items()} == \
            {k: tuple(map(float, v)) for k, v in kept.errors.items()}


def test_audit_reports_every_layer(bert_onnx):
    e = rulegraph.explain(bert_onnx, "decomposition", tiny.token_inputs(length=6))
    a = e.audit
    assert [r.name for r in a.reconstruction] == ["embeddings", "block 0", "block 1", "head"]
    assert sum(r.nodes for r in a.reconstruction) == len(a.nodes)
    assert a.max_relative_error < 1e-5 and a.ok and not a.unexpected
    c = a.conservation
    assert c.breaks == 0 and c.input_total + c.absorbed + c.residual == pytest.approx(c.output_value, rel=1e-12)
    assert "reconstruction" in a.to_dict()


def _merged(feeds, alpha):
    graph, rules = rulegraph.load(feeds[0]), RuleSet.load("decomposition")
    token = run_pass(graph, rules, feeds[1], dtype=F64, alpha=alpha, keep=True)
    merged = run_pass(graph, rules, feeds[1], dtype=F64, alpha=alpha, keep=True,
                      groups=[[0], [1, 2], [3], [4], [5]])
    return token, merged


def test_signed_hat_has_group_additivity(relu_bert):
    """App. C: with signed α, the component of g1 ∪ g2 is the sum of those of g1 and g2, at every value."""
    token, merged = _merged((relu_bert[1], tiny.token_inputs(length=6, seed=4)), "signed")
    assert token.parts.keys() == merged.parts.keys()
    for value, t in token.parts.items():
        m = merged.parts[value].groups
        scale = t.groups.abs().max()
        assert (m[1] - t.groups[1] - t.groups[2]).abs().max() <= 1e-10 * scale, value
        assert (m[[0, 2, 3, 4]] - t.groups[[0, 3, 4, 5]]).abs().max() <= 1e-10 * scale, value


def test_absolute_alpha_breaks_group_additivity(relu_bert):
    """Eq. 12 (abs) is not additive (App. C): the merged group's share of Θ differs."""
    token, merged = _merged((relu_bert[1], tiny.token_inputs(length=6, seed=4)), "abs")
    output = "logits"
    t, m = token.parts[output].groups, merged.parts[output].groups
    assert (m[1] - t[1] - t[2]).abs().max() > 1e-6 * t.abs().max()


@pytest.mark.parametrize("kw", [dict(alpha="signed"), dict(variant="bar")])
@pytest.mark.parametrize("groups", ["token", "0-2,3-5"])
def test_linearized_pass_equals_carrying_every_component(relu_bert, bert_onnx, kw, groups):
    """With signed α or D̄ one group and a backward pass give every group's component (Group Additivity)."""
    for path in (relu_bert[1], bert_onnx):
        feeds = tiny.token_inputs(batch=2, length=7, pad=2)
        full = rulegraph.explain(path, "decomposition", feeds, dtype=F64, groups=groups, mode="components", **kw)
        fast = rulegraph.explain(path, "decomposition", feeds, dtype=F64, groups=groups, mode="linearized", **kw)
        assert fast.extra["decomposition"]["mode"] == "linearized"
        assert _relative(_scores(fast)[0], _scores(full)[0]) < 1e-10
        assert _relative(_scores(fast)[1], _scores(full)[1]) < 1e-10
        assert fast.audit.max_relative_error < 1e-10


def test_linearized_pass_refuses_abs_alpha(bert_onnx):
    with pytest.raises(InputError, match="linearized pass needs signed α or D̄"):
        rulegraph.explain(bert_onnx, "decomposition", tiny.token_inputs(), alpha="abs", mode="linearized")
    with pytest.raises(InputError, match="option decomposition.mode: 'fast' is not valid"):
        rulegraph.explain(bert_onnx, "decomposition", tiny.token_inputs(), mode="fast")


def test_chunks_do_not_change_the_result(bert_onnx, monkeypatch):
    feeds = tiny.token_inputs(batch=2, length=9, pad=3)
    whole = rulegraph.explain(bert_onnx, "decomposition", feeds, dtype=F64, alpha="hybrid")
    monkeypatch.setattr(engine, "CHUNK_ELEMENTS", 100)
    chunked = rulegraph.explain(bert_onnx, "decomposition", feeds, dtype=F64, alpha="hybrid")
    assert _relative(_scores(chunked)[0], _scores(whole)[0]) < 1e-12      # sums in another order only


def test_decoder_only_source_and_prefix(tmp_path):
    model = tiny.build("gpt2")
    path = tiny.onnx(model, tmp_path / "gpt2.onnx", names=("input_ids", "attention_mask"))
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), length=8)
    e = rulegraph.explain(path, "decomposition", feeds, dtype=F64, groups="source:5")
    doc = e.extra["decomposition"]
    assert [g["label"] for g in doc["groups"]] == ["source", "prefix"]
    assert [g["positions"] for g in doc["groups"]] == [[0, 1, 2, 3, 4], [5, 6, 7]]
    assert sum(g["score"] for g in doc["groups"]) + doc["bias"] == pytest.approx(e.output_value[0], rel=1e-10)
    assert e.audit.max_relative_error < 1e-10


# -- partitions ----------------------------------------------------------------------------------------------

def test_partitions():
    assert assign("token", 3).index == [0, 1, 2]
    words = assign("word", 6, [None, 0, 0, 1, 2, None], ["[CLS]", "un", "##fit", "for", "it", "[SEP]"])
    assert words.index == [0, 1, 1, 2, 3, 4] and words.labels[1] == "unfit"
    spans = assign("0-1,3+5", 7)
    assert spans.index == [0, 0, 2, 1, 2, 1, 2] and spans.labels == ["0-1", "3+5", "rest"]
    assert assign("source:2", 4).members() == [[0, 1], [2, 3]]
    assert assign([[1], [0, 2]], 3).index == [1, 0, 1]


@pytest.mark.parametrize("spec, message", [
    ("0-2,2-3", "position 2 is in groups 0 and 1"),
    ("0-9", "outside the input.s 4 positions"),
    ("a-b", "cannot read 'a-b'"),
    ("3-1", "range 3-1 is empty"),
    ("source:4", "K must be between 1 and 3"),
    ("word", "needs the tokenizer's word ids"),
])
def test_bad_partitions_are_one_line_errors(spec, message):
    with pytest.raises(InputError, match=message):
        assign(spec, 4)


# -- rule files ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("pass: backward\nrules:\n  - rule: linear\n", ":1: unknown pass 'backward'"),
    ("pass: decomposition\nrules:\n  - op: Relu\n    rule: ah\n", ":4: unknown rule 'ah'"),
    ("pass: decomposition\nrules:\n  - op: Relu\n    rule: activation\n    params: {alpha: sign}\n",
     ":5: bad params for rule 'activation': alpha must be one of signed, abs, hybrid"),
    ("pass: decomposition\nrules:\n  - rule: activation\n    params: {lambda: 0.2}\n",
     ":4: rule 'activation' has no param 'lambda'"),
])
def test_rule_file_errors_name_the_line(text, message):
    with pytest.raises(RuleFileError, match=message):
        RuleSet.from_yaml(text, source="d.yaml")


def test_a_nonlinear_op_needs_a_rule_that_handles_it(bert_onnx):
    rules = RuleSet.from_yaml("pass: decomposition\nrules:\n  - op: '*'\n    rule: linear\n", source="d.yaml")
    with pytest.raises(RuleMatchError, match="d.yaml:3: rule 'linear' cannot apply .* not linear"):
        rulegraph.explain(bert_onnx, rules, tiny.token_inputs())


def test_a_relevance_rule_set_is_refused_by_run_pass(bert_onnx):
    with pytest.raises(InputError, match="needs `pass: decomposition`"):
        run_pass(rulegraph.load(bert_onnx), RuleSet.load("lrp-ah-ln"), tiny.token_inputs())


# -- command line --------------------------------------------------------------------------------------------

def test_cli_prints_scores_and_json_carries_the_bias_share(capsys, bert_onnx, tmp_path):
    path = tmp_path / "d.json"
    code = main(["explain", str(bert_onnx), "-r", "decomposition", "-t", "w1 w2 w3 w4", "--groups", "1-2,3",
                 "--alpha", "signed", "--lambda", "0.2", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0 and "[CLS] w1 w2 w3 w4 [SEP]" in out and "unexplained residual" in out
    doc = json.loads(path.read_text())
    groups = doc["decomposition"]["groups"]
    assert [g["positions"] for g in groups] == [[1, 2], [3], [0, 4, 5]]
    assert doc["decomposition"]["alpha"] == "signed" and doc["decomposition"]["lambda"] == 0.2
    total = sum(g["score"] for g in groups) + doc["decomposition"]["bias"]
    assert total == pytest.approx(doc["output_value"], rel=1e-5)
    assert sum(doc["relevance"]["input_ids"]) == pytest.approx(sum(g["score"] for g in groups), rel=1e-6)


def test_cli_audit_prints_the_reconstruction_table(capsys, bert_onnx):
    code = main(["audit", str(bert_onnx), "-r", "decomposition", "-t", "w1 w2", "--groups", "word"])
    out = capsys.readouterr().out
    assert code == 0 and "reconstruction per layer" in out and "block 1" in out


def test_cli_decomposition_options_need_a_decomposition_rule_set(capsys, bert_onnx):
    code = main(["explain", str(bert_onnx), "-r", "lrp-ah-ln", "-t", "w1", "--alpha", "abs"])
    err = capsys.readouterr().err
    assert code == 2 and "--alpha applies to rule sets with `pass: decomposition` only" in err


def test_the_decomposition_method_takes_the_alpha_options(relu_bert):
    """``rulegraph evaluate -o decomposition.alpha=signed``: the method's options reach rulegraph.explain()."""
    from rulegraph.methods import explain_with
    path = relu_bert[1]
    feeds = tiny.token_inputs(batch=2, length=7, pad=2)
    for alpha in ("signed", "abs"):
        via_method = explain_with(path, "decomposition", feeds, dtype=F64, alpha=alpha)
        direct = rulegraph.explain(path, "decomposition", feeds, dtype=F64, alpha=alpha)
        assert torch.equal(via_method.relevance["input_ids"], direct.relevance["input_ids"])
    default = explain_with(path, "decomposition", feeds, dtype=F64, alpha=None)   # unset, as resolve() gives it
    assert default.extra["decomposition"]["mode"] == "components"          # the rule file's hybrid α
    assert _relative(_scores(default)[0], _scores(rulegraph.explain(path, "decomposition", feeds, dtype=F64))[0]) == 0
    assert not torch.allclose(via_method.relevance["input_ids"], default.relevance["input_ids"])
    with pytest.raises(InputError, match="alpha: 'plain' is not valid"):
        explain_with(path, "decomposition", feeds, alpha="plain")


def test_instance_norm_holds_the_std_as_a_coefficient():
    """GroupNorm's export (InstanceNormalization): Eq. 6 over the spatial dims, per item and channel —
    D_g ↦ (D_g − mean D_g)·α·γ_c, B ↦ (B − mean B)·α·γ_c + β_c, α = 1/√(Var x + ε) of the forward input."""
    from rulegraph.ir import Node
    from rulegraph.ops import lookup
    from rulegraph.propagation import RULES
    from rulegraph.propagation.components import ComponentSite, Parts
    g = torch.Generator().manual_seed(0)
    groups = torch.randn(3, 2, 4, 2, 3, generator=g, dtype=F64)
    bias = torch.randn(2, 4, 2, 3, generator=g, dtype=F64)
    x = groups.sum(0) + bias
    gamma, beta = torch.randn(4, generator=g, dtype=F64), torch.randn(4, generator=g, dtype=F64)
    spec = lookup("InstanceNormalization")
    attrs = {**spec.defaults, "epsilon": 1e-5}
    y = spec.forward(x, gamma, beta, **attrs)
    node = Node("norm", "InstanceNormalization", ("x", "g", "b"), ("y",), attrs)
    site = ComponentSite(node, spec, attrs, [x, gamma, beta], [y], [Parts(groups, bias), None, None], chunk=2)
    got = RULES["decomposition"].get("layernorm")().decompose(site)[0]
    alpha = 1.0 / torch.sqrt(x.var(dim=(2, 3), unbiased=False, keepdim=True) + 1e-5)
    c = gamma.reshape(4, 1, 1)
    expected = (groups - groups.mean(dim=(3, 4), keepdim=True)) * alpha * c
    torch.testing.assert_close(got.groups, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.bias, (bias - bias.mean(dim=(2, 3), keepdim=True)) * alpha * c + beta.reshape(4, 1, 1),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.total(), y, rtol=1e-12, atol=1e-12)
