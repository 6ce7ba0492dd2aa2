"""The torch.export loader: tiny random-weight transformers, exported with dynamic
batch/sequence axes, must run like the torch module and explain like their ONNX
exports under every shipped rule set."""
from __future__ import annotations

import functools
import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    RobertaConfig,
    RobertaForSequenceClassification,
)

import rulegraph  # noqa: E402
from rulegraph.errors import UnsupportedOpError  # noqa: E402
from rulegraph.exporters import HFClassifier, export_fx, export_onnx  # noqa: E402
from rulegraph.interpreter import prepare  # noqa: E402
from rulegraph.loaders.fx import LOWERINGS, load_fx  # noqa: E402
from rulegraph.loaders.fx.program import functional, mutates  # noqa: E402
from rulegraph.ruleset import RuleSet, shipped_rule_sets  # noqa: E402

VOCAB = 100
HIDDEN, LAYERS, HEADS, FFN, POSITIONS = 32, 2, 4, 64, 64
ARCHS = ("bert", "roberta", "distilbert", "gpt2", "gpt2-lm")
ATTENTIONS = ("eager", "sdpa")
RULE_SETS = ("gi", "lrp-ah", "lrp-ah-ln", "epsilon")
PAD = {"roberta": 1}


def _config(arch: str):
    if arch == "bert":
        return BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                          intermediate_size=FFN, max_position_embeddings=POSITIONS, pad_token_id=0)
    if arch == "roberta":
        return RobertaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                             num_attention_heads=HEADS, intermediate_size=FFN,
                             max_position_embeddings=POSITIONS + 2, type_vocab_size=1, pad_token_id=1,
                             bos_token_id=2, eos_token_id=3)
    if arch == "distilbert":
        return DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN,
                                max_position_embeddings=POSITIONS, pad_token_id=0)
    labels = {} if arch == "gpt2-lm" else {"num_labels": 3}
    return GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=POSITIONS,
                      pad_token_id=0, bos_token_id=2, eos_token_id=3, **labels)


MODELS = {"bert": BertForSequenceClassification, "roberta": RobertaForSequenceClassification,
          "distilbert": DistilBertForSequenceClassification, "gpt2": GPT2ForSequenceClassification,
          "gpt2-lm": GPT2LMHeadModel}


def build(arch: str, attention: str = "eager") -> HFClassifier:
    """``forward(input_ids, attention_mask) -> logits`` around a tiny random-weight model (same weights
    for every call with the same ``arch``)."""
    config = _config(arch)
    config._attn_implementation = attention
    torch.manual_seed(0)
    model = MODELS[arch](config).eval()
    model.config._attn_implementation = attention
    return HFClassifier(model).eval()


def example(arch: str) -> dict[str, torch.Tensor]:
    """The export example: 2 × 8, last row right-padded."""
    ids = 5 + torch.arange(16).reshape(2, 8) % (VOCAB - 5)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[-1, 5:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, PAD.get(arch, 0)), "attention_mask": mask}


def feeds(arch: str, batch: int = 3, length: int = 11) -> dict[str, torch.Tensor]:
    """Inputs in a shape unlike the export example, with padding in two rows."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, length - 4:] = 0
    if batch > 2:
        mask[2, 5:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, PAD.get(arch, 0)), "attention_mask": mask}


@functools.lru_cache(maxsize=None)
def program(arch: str, attention: str) -> torch.export.ExportedProgram:
    return export_fx(build(arch, attention), example(arch))


@functools.lru_cache(maxsize=None)
def graph(arch: str, attention: str) -> rulegraph.Graph:
    return load_fx(program(arch, attention))


@pytest.fixture(scope="module")
def onnx_graphs(tmp_path_factory):
    """TorchScript-exported ONNX (eager attention) of each architecture, loaded, built on demand."""
    folder = tmp_path_factory.mktemp("onnx")
    cache: dict[str, rulegraph.Graph] = {}

    def get(arch: str) -> rulegraph.Graph:
        if arch not in cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                path = export_onnx(build(arch), example(arch), folder / f"{arch}.onnx")
            cache[arch] = rulegraph.load(path)
        return cache[arch]
    return get


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert actual.shape == expected.shape
    return ((actual - expected).abs().max() / expected.abs().max()).item()


# -- 1. the lowered graph computes the module's logits ------------------------------------------------

@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_module(arch: str, attention: str) -> None:
    g = graph(arch, attention)
    x = feeds(arch)
    (name,) = g.outputs
    with torch.no_grad():
        expected32 = build(arch, attention)(**x)
        expected64 = build(arch, attention).double()(**x)
    assert rel_err(rulegraph.run(g, x)[name], expected32) <= 1e-5
    assert rel_err(rulegraph.run(g, x, dtype=torch.float64)[name], expected64) <= 1e-10
    # a second shape through the same graph (shape-dependent values are recomputed, not baked in)
    y = feeds(arch, batch=2, length=17)
    with torch.no_grad():
        assert rel_err(rulegraph.run(g, y)[name], build(arch, attention)(**y)) <= 1e-5


def test_shape_arithmetic_is_shape_only() -> None:
    """Shape, Range, Concat… depend on input shapes only: the interpreter caches them, no per-call cost."""
    for arch in ("bert", "gpt2"):
        g = graph(arch, "sdpa")
        plan = prepare(g)
        per_call = [s.node for s in plan.value_steps]
        assert not {n.op for n in per_call} & {"Shape", "Range", "ConstantOfShape", "Trilu"}
        assert not [n.name for n in per_call if n.name.endswith(".shape")]   # Reshape/Expand targets
        shape_nodes = [n for n in g.nodes if n.op == "Shape"]
        assert shape_nodes and all(n.attrs["end"] == n.attrs["start"] + 1 for n in shape_nodes
                                   if n.name.startswith("sym_size_int"))
        assert all(isinstance(d, str) for d in g.inputs[0].shape)   # symbolic dims, by name


# -- 2. one rule file, the same relevance on the fx and the ONNX export -------------------------------

@pytest.mark.parametrize("rules", RULE_SETS)
@pytest.mark.parametrize("arch", ARCHS)
def test_relevance_matches_onnx_export(onnx_graphs, arch: str, rules: str) -> None:
    x = feeds(arch)
    reference = rulegraph.explain(onnx_graphs(arch), rules, x, dtype=torch.float64)
    for attention in ATTENTIONS:   # the SDPA lowering gives the eager pattern: same relevance
        e = rulegraph.explain(graph(arch, attention), rules, x, dtype=torch.float64)
        assert rel_err(e.output_tensor, reference.output_tensor) <= 1e-7   # ONNX keeps float32 scalars
        assert e.target == reference.target
        assert rel_err(e.relevance["input_ids"], reference.relevance["input_ids"]) <= 1e-6, (attention, rules)
        assert abs(e.audit.conservation.residual - reference.audit.conservation.residual) <= \
            1e-6 * max(abs(v) for v in e.output_value)


# -- 3. every shipped rule set covers every lowered architecture --------------------------------------

@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("arch", ARCHS)
def test_shipped_rule_sets_cover_fx_graphs(arch: str, attention: str) -> None:
    g = graph(arch, attention)
    assert set(shipped_rule_sets()) >= set(RULE_SETS)
    for name in shipped_rule_sets():
        binding = RuleSet.load(name).bind(g)
        assert binding.unmatched == [], (name, [(n.name, n.op) for n in binding.unmatched])
        binding.require_complete()
        assert binding.reached


def test_attention_head_rule_applies_to_lowered_sdpa() -> None:
    g = graph("bert", "sdpa")
    out = g.node("scaled_dot_product_attention")
    assert out.op == "MatMul" and g.producer[out.inputs[0]].op == "Softmax"
    assert out.scope == "model.bert.encoder.layer.0.attention.self"
    binding = RuleSet.load("lrp-ah").bind(g)
    assert binding.assignments["scaled_dot_product_attention"].rule.name == "ah"
    assert binding.assignments["scaled_dot_product_attention_1"].rule.name == "ah"


# -- 4. errors ------------------------------------------------------------------------------------------

class _Cumprod(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(x, dim=1) + 1


def test_unsupported_aten_op_names_node_target_and_choices() -> None:
    ep = torch.export.export(_Cumprod(), (torch.randn(2, 3),))
    with pytest.raises(UnsupportedOpError) as info:
        load_fx(ep)
    message = str(info.value)
    assert "'cumprod'" in message and "aten.cumprod.default" in message
    assert "did you mean" in message and "valid: " not in message
    suggested = message.split("did you mean ")[1].split("?")[0].split(" or ")
    assert suggested and all(s.strip("'") in LOWERINGS for s in suggested)       # the closest lowered targets
    assert message.endswith("export the model to ONNX with `rulegraph export` and explain the .onnx file")
    assert "\n" not in message and len(message) < 300


class _Unlowered(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(x, dim=1) + torch.erfinv(x.tanh()) + torch.cumprod(x, dim=0)


def test_every_unlowered_target_is_named_at_once() -> None:
    with pytest.raises(UnsupportedOpError) as info:
        load_fx(torch.export.export(_Unlowered(), (torch.randn(2, 3),)))
    message = str(info.value)
    assert message.startswith("fx node 'cumprod': target aten.cumprod.default has no lowering")
    assert "(nor do 1 more target(s): aten.erfinv.default (1 node(s), first 'erfinv'))" in message
    assert "did you mean" in message and "\n" not in message


class _ManyUnlowered(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.cumprod(x, dim=1) + torch.erfinv(x.tanh()) + torch.special.i0(x) + torch.lgamma(x)
                + torch.digamma(x.abs() + 1))


def test_a_refusal_names_a_few_targets_and_the_next_step() -> None:
    with pytest.raises(UnsupportedOpError) as info:
        load_fx(torch.export.export(_ManyUnlowered(), (torch.randn(2, 3),)))
    message = str(info.value)
    assert re.findall(r"target (aten\.\w+)\.|(aten\.\w+)\.default \(1 node", message) == [
        ("aten.cumprod", ""), ("", "aten.erfinv"), ("", "aten.special_i0")]
    assert "and 2 more" in message and "lgamma" not in message
    assert "`rulegraph export`" in message and "\n" not in message and len(message) < 400


class _InPlace(torch.nn.Module):
    """In-place arithmetic on an intermediate, read before and after the mutation (as T5's
    ``relative_buckets += …``): only a functional lowering keeps both readers right."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        before = y.sum(-1, keepdim=True)
        y.add_(x)
        y.mul_(3)
        return y + before


def test_in_place_ops_are_functionalized_before_lowering() -> None:
    ep = torch.export.export(_InPlace(), (torch.randn(2, 3),))
    assert mutates(ep.graph_module)
    graph = load_fx(ep)
    assert {n.op for n in graph.nodes} >= {"Add", "Mul"}
    x = torch.randn(2, 3)
    got = rulegraph.run(graph, {graph.input_names[0]: x})[graph.outputs[0]]
    torch.testing.assert_close(got, _InPlace()(x))         # (2x + x)·3 + Σ 2x: both readers of y right
    plain = torch.export.export(_Cumprod(), (torch.randn(2, 3),))
    assert not mutates(plain.graph_module) and functional(plain) is plain      # nothing in place: lowered as it is


def test_load_rejects_other_objects() -> None:
    with pytest.raises(rulegraph.errors.ModelError):
        load_fx(torch.nn.Linear(2, 2))


# -- names, scopes, constants ----------------------------------------------------------------------------

def test_names_scopes_and_transposed_weights() -> None:
    g = graph("bert", "eager")
    state = program("bert", "eager").state_dict
    add, matmul = g.node("linear"), g.node("linear.matmul")
    assert (add.op, matmul.op) == ("Add", "MatMul")
    assert add.scope == matmul.scope == "model.bert.encoder.layer.0.attention.self.query"
    weight = "model.bert.encoder.layer.0.attention.self.query.weight"
    assert matmul.inputs[1] == weight + ".T"
    assert torch.equal(g.constants[weight + ".T"], state[weight].T)
    assert add.inputs[0] == "model.bert.encoder.layer.0.attention.self.query.bias"
    pooler = g.node("linear_12")   # 2-D input: Gemm, as the ONNX exporters emit
    assert pooler.op == "Gemm" and pooler.attrs["transB"] == 1 and pooler.scope == "model.bert.pooler.dense"
    assert g.node("layer_norm_1").op == "LayerNormalization"
    assert g.node("embedding").op == "Gather" and g.node("embedding").inputs[1] == "input_ids"
    assert g.node("gelu").op == "Mul" and g.node("gelu.erf").op == "Erf"   # opset 18: as the exporters
    assert g.opset == 18 and g.outputs == ["linear_13"]
    assert {layer for layer in g.layers.values()} >= {"embeddings", "block 0", "block 1", "head"}
    assert not any(n.name.startswith("_assert") for n in g.nodes)


def test_gelu_node_from_opset_20() -> None:
    g20 = load_fx(program("bert", "eager"), opset=20)
    assert g20.node("gelu").op == "Gelu" and g20.opset == 20
    x = feeds("bert")
    g18 = graph("bert", "eager")
    for rules in ("gi", "epsilon"):
        a = rulegraph.explain(g18, rules, x, dtype=torch.float64).relevance["input_ids"]
        b = rulegraph.explain(g20, rules, x, dtype=torch.float64).relevance["input_ids"]
        assert rel_err(b, a) <= 1e-9


def test_graph_module_and_pt2_file(tmp_path) -> None:
    ep = program("gpt2", "eager")
    x = feeds("gpt2")
    expected = rulegraph.run(graph("gpt2", "eager"), x)["index_1"]
    from_module = load_fx(ep.module())
    assert torch.equal(rulegraph.run(from_module, x)[from_module.outputs[0]], expected)
    path = tmp_path / "gpt2.pt2"
    torch.export.save(ep, str(path))
    from_file = rulegraph.load(path)
    assert from_file.source == f"fx:{path}"
    assert torch.equal(rulegraph.run(from_file, x)[from_file.outputs[0]], expected)
    assert rulegraph.load(ep).outputs == ["index_1"]


# -- lowerings the five architectures do not reach -------------------------------------------------------

class _Zoo(torch.nn.Module):
    """Causal / float-mask / default-scale SDPA, advanced indexing, splits, reductions, factories and
    SymInt arithmetic, all under dynamic batch and sequence sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("table", torch.randn(20, 3))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor):
        b, s = ids.shape
        x = self.emb(ids)
        h = x.view(b, s, 2, 4).permute(0, 2, 1, 3)
        causal = F.scaled_dot_product_attention(h, h, h, is_causal=True)
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * -1e4
        masked = F.scaled_dot_product_attention(h, h, h, attn_mask=bias)
        y = (causal + masked).transpose(1, 2).flatten(2)
        y = torch.cat([y, F.silu(self.lin(y))], dim=-1)
        a, c = torch.split(y, [6, 10], dim=-1)
        d = torch.stack([a.sum(-1), c.mean(-1), c.amax(-1)], dim=1)
        cs = torch.cumsum(mask, dim=1)
        z = d.masked_fill(mask[:, None, :] == 0, 0.0) * torch.rsqrt(cs[:, None, :].to(x.dtype) + 1)
        z = torch.min(torch.max(z, -0.25 * z), z + 1)          # aten.max.other, aten.min.other
        z = z.clamp(-3, 3) ** 2 - torch.ones_like(z) * 0.5
        sel = z[:, :, 1:].unflatten(1, (1, 3)).squeeze(1)
        pos = torch.arange(1, s, 1)
        g = torch.gather(sel, 2, (pos % 3)[None, None, :].expand(b, 3, -1))
        t = self.table[ids]                                   # index with a buffer as data
        t2 = t[:, torch.arange(s - 1)]                        # index on a later axis
        w = torch.where(g > 0, g, t2.transpose(1, 2))
        first = w[torch.arange(b), :, cs.argmax(-1) % (s - 1)]   # index / slice / index
        pair = t[:, torch.zeros(1, dtype=torch.long), torch.arange(3)]   # consecutive, not leading
        out = torch.triu(torch.ones(3, 3, dtype=first.dtype)) @ first.transpose(0, 1)
        flat = y.reshape(b * s, -1)                           # SymInt product
        grid = y.new_zeros((b, s + 1))                        # SymInt sum, symbolic factory
        return (out.transpose(0, 1) + 1 - torch.full((1, 3), 2.0), y.reshape(b, -1).repeat(1, 2)[:, : s // 2],
                pair.sum(-1), flat.amin(0), grid + F.gelu(d[:, 0, :1], approximate="tanh"))


def test_zoo_of_lowerings_matches_torch() -> None:
    torch.manual_seed(0)
    module = _Zoo().eval()
    ep = export_fx(module, {"ids": torch.randint(0, 20, (2, 6)), "mask": torch.ones(2, 6, dtype=torch.long)})
    g = load_fx(ep)
    assert {"Trilu", "Range", "GatherND", "Split", "CumSum", "ConstantOfShape", "Tanh"} <= g.op_types()
    ids = torch.randint(0, 20, (3, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        expected = module(ids, mask)
        expected64 = module.double()(ids, mask)
    got = rulegraph.run(g, {"ids": ids, "mask": mask})
    got64 = rulegraph.run(g, {"ids": ids, "mask": mask}, dtype=torch.float64)
    for name, e, e64 in zip(g.outputs, expected, expected64):
        assert rel_err(got[name], e) <= 1e-5, name
        assert rel_err(got64[name], e64) <= 1e-10, name


def test_table_lists_aten_overloads() -> None:
    for target in ("aten.linear.default", "aten.scaled_dot_product_attention.default", "aten.sym_size.int",
                   "aten.index.Tensor", "aten.embedding.default", "operator.getitem", "operator.floordiv",
                   "aten.max.other", "aten.min.other"):
        assert target in LOWERINGS
    assert math.isfinite(len(LOWERINGS)) and len(LOWERINGS) > 100


class _Index(torch.nn.Module):
    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = pattern

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        i = torch.tensor([[0], [2]])
        j = torch.tensor([1, -1, 0])
        return {"lead": lambda: x[i, j],            # consecutive from axis 0, broadcast indices
                "inner": lambda: x[:, i, j],        # consecutive, not leading: dims stay in place
                "split": lambda: x[i, :, j],        # separated: torch puts the index dims first
                "one": lambda: x[:, :, j]}[self.pattern]()


@pytest.mark.parametrize("pattern", ["lead", "inner", "split", "one"])
def test_advanced_indexing(pattern: str) -> None:
    x = torch.randn(3, 4, 5, 2)
    module = _Index(pattern)
    g = load_fx(torch.export.export(module, (x,)))
    assert torch.equal(rulegraph.run(g, {"x": x})[g.outputs[0]], module(x))


# -- CNN lowerings (convolution, batch norm, pooling, hard activations): the ONNX export's rules and relevance --

@pytest.mark.parametrize("name", ["cnn", "resnet", "mobilenetv3"])
def test_cnn_lowerings_explain_like_the_onnx_export(name: str, tmp_path) -> None:
    import cnn
    module = cnn.build(name).float()
    x = cnn.image(2, 16)
    g = load_fx(export_fx(module, {"input": x.float()}))           # a dynamic batch: explained with 3 images
    onnx_graph = rulegraph.load(str(cnn.onnx(module, tmp_path / "m.onnx", x, keep_batchnorm=True)))
    assert {"Conv", "Gemm", "GlobalAveragePool"} <= g.op_types()
    x3 = cnn.image(3, 16, seed=4)
    with torch.no_grad():
        expected = module.double()(x3)
    assert rel_err(rulegraph.run(g, {"input": x3}, dtype=torch.float64)[g.outputs[0]], expected) <= 1e-7
    for rules in shipped_rule_sets("cnns"):
        ours, theirs = RuleSet.load(rules).bind(g), RuleSet.load(rules).bind(onnx_graph)
        assert not ours.problems and not ours.unmatched
        rules_of = lambda b: [(n.op, b.assignments[n.name].rule.describe())  # noqa: E731
                              for n in b.reached if n.op not in ("Reshape", "Flatten", "Concat")]
        assert rules_of(ours) == rules_of(theirs)
        e = rulegraph.explain(g, rules, {"input": x3}, dtype=torch.float64)
        reference = rulegraph.explain(onnx_graph, rules, {"pixel_values": x3}, dtype=torch.float64)
        assert abs(e.audit.conservation.residual) <= 1e-10 * abs(e.audit.conservation.output_value)
        assert not e.audit.unexpected and e.audit.conservation.breaks == 0.0
        assert rel_err(e.boundary["input"], reference.boundary["pixel_values"]) <= 1e-6, rules


class _Vision(torch.nn.Module):
    """Convolution paddings, explicit pads, pooling options, ReLU6, and batch norm without affine parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.same = torch.nn.Conv2d(3, 4, (2, 3), padding="same", dilation=(2, 1))
        self.valid = torch.nn.Conv2d(4, 4, 3, padding="valid", stride=2, groups=2)
        self.line = torch.nn.Conv1d(3, 2, 3, padding=1, bias=False)
        self.norm = torch.nn.BatchNorm2d(4, affine=False).eval()
        self.norm.running_mean.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self.norm(self.same(F.pad(x, (1, 0, 0, 2), value=0.5))) * 4)
        y = F.pad(y, (1, 1, 0, 0), mode="reflect") + F.pad(y, (2, 0, 1, 1))[:, :, 1:-1]
        a = F.avg_pool2d(y, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
        m = F.max_pool2d(self.valid(y), 2, ceil_mode=True)
        lines = self.line(x.flatten(2)).sum(-1)
        return torch.cat([a.flatten(1), m.flatten(1), lines, F.hardsigmoid(lines)], dim=1)


def test_vision_lowerings_match_torch() -> None:
    torch.manual_seed(0)
    module = _Vision().eval().double()
    x = torch.randn(2, 3, 9, 7, dtype=torch.float64)
    g = load_fx(export_fx(module, {"x": x}))
    assert {"Conv", "BatchNormalization", "Clip", "AveragePool", "MaxPool", "HardSigmoid", "Pad"} <= g.op_types()
    x3 = torch.randn(3, 3, 9, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = module(x3)
    assert rel_err(rulegraph.run(g, {"x": x3}, dtype=torch.float64)[g.outputs[0]], expected) <= 1e-7


class _AudioFrontEnd(torch.nn.Module):
    """An audio encoder's front end (Wav2Vec2's): GroupNorm over a convolution's channels, in groups and one per
    channel, and a weight-normed grouped convolution (its positional embedding)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 4, 5, stride=2)
        self.groups = torch.nn.GroupNorm(2, 4)
        self.each = torch.nn.GroupNorm(4, 4, affine=False)
        self.positional = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(4, 4, 3, padding=1, groups=2),
                                                                      dim=2)

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:      # a waveform: its length is dynamic
        y = self.each(self.groups(self.conv(input_values.unsqueeze(1))))
        return (y + self.positional(y)).mean(-1)


def test_audio_lowerings_match_torch() -> None:
    """``group_norm`` → ``InstanceNormalization`` over the groups, ``_weight_norm`` → ``g · v / ‖v‖``."""
    torch.manual_seed(0)
    module = _AudioFrontEnd().eval().double()
    with torch.no_grad():
        module.groups.weight.uniform_(0.5, 2.0)
        module.groups.bias.uniform_(-1.0, 1.0)
    x = torch.randn(2, 40, dtype=torch.float64)
    g = load_fx(export_fx(module, {"input_values": x}))
    assert {"InstanceNormalization", "ReduceL2", "Conv"} <= g.op_types()
    x3 = torch.randn(3, 37, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = module(x3)
    assert rel_err(rulegraph.run(g, {"input_values": x3}, dtype=torch.float64)[g.outputs[0]], expected) <= 1e-12


def test_adaptive_pooling_to_more_than_one_pixel_is_refused() -> None:
    module = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(2)).eval()
    with pytest.raises(rulegraph.errors.ModelError, match="adaptive_avg_pool2d is lowered only to a 1×1 output"):
        load_fx(export_fx(module, {"input": torch.randn(2, 3, 4, 4)}))


class _Router(torch.nn.Module):
    """A mixture of experts' router: softmax, top-k, an in-place renormalisation, and the picked
    weights scattered into a dense [tokens, experts] matrix."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.gate = torch.nn.Linear(8, 5, bias=False)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor):
        x = self.emb(ids).reshape(-1, 8)
        probs = torch.softmax(self.gate(x), dim=-1)
        top, index = torch.topk(probs, 2, dim=-1)
        top /= top.sum(dim=-1, keepdim=True)
        dense = torch.zeros(x.shape[0], 5, dtype=top.dtype).scatter(1, index, top)
        return dense * mask.reshape(-1, 1), index


def test_router_lowerings_match_torch() -> None:
    torch.manual_seed(0)
    module = _Router().eval()
    ep = export_fx(module, {"ids": torch.randint(0, 20, (2, 6)), "mask": torch.ones(2, 6, dtype=torch.long)})
    g = load_fx(ep)
    assert {"TopK", "ScatterElements"} <= g.op_types()
    ids = torch.randint(0, 20, (3, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(3, 9, dtype=torch.long)
    with torch.no_grad():
        expected = module(ids, mask)
    got = rulegraph.run(g, {"ids": ids, "mask": mask})
    assert rel_err(got[g.outputs[0]], expected[0]) <= 1e-6
    assert torch.equal(got[g.outputs[1]], expected[1])


class _Softplus(torch.nn.Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x: torch.Tensor):
        return F.softplus(x, beta=self.beta, threshold=self.threshold)


@pytest.mark.parametrize("beta", [1.0, 2.5])
def test_softplus_lowering_matches_torch_across_its_threshold(beta: float) -> None:
    module = _Softplus(beta).eval()
    x = torch.linspace(-40, 40, 160, dtype=torch.float64).reshape(2, -1)      # βx on both sides of 20
    g = load_fx(export_fx(module, {"x": x.float()}))
    got = rulegraph.run(g, {"x": x}, dtype=torch.float64)[g.outputs[0]]
    torch.testing.assert_close(got, module(x), rtol=1e-15, atol=0)


def test_softplus_with_another_threshold_is_refused() -> None:
    with pytest.raises(UnsupportedOpError, match="softplus with threshold 5 "):
        load_fx(export_fx(_Softplus(threshold=5.0).eval(), {"x": torch.randn(2, 4)}))
