"""onnxruntime's fused and n-bit contrib operators (rulegraph.loaders.contrib): each op, alone in a
model made with onnx.helper, runs like onnxruntime over its variants; what is not expanded is refused
by name; and end to end, a tiny BERT and GPT-2 fused by onnxruntime's transformer optimizer and
quantized by its n-bit quantizer run like onnxruntime and explain as their unfused (float) sources do."""
from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import rulegraph
import tiny
from rulegraph.cli import main
from rulegraph.errors import ModelError
from rulegraph.loaders.contrib import DOMAIN
from rulegraph.loaders.onnx import _symbolic_shapes

RNG = np.random.default_rng(0)
B, S, D, HEADS = 2, 5, 8, 2


def _model(node, inputs: dict[str, np.ndarray], outputs: list[str], initializers: dict[str, np.ndarray]):
    """A one-node model reading ``inputs`` (with their shapes declared) and ``initializers``."""
    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
             np.dtype(np.int64): TensorProto.INT64, np.dtype(np.uint8): TensorProto.UINT8}
    graph = helper.make_graph(
        [node], "contrib", [helper.make_tensor_value_info(k, types[v.dtype], v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


def _same_as_onnxruntime(model, feeds: dict[str, np.ndarray], rtol=1e-5):
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    graph = rulegraph.load(model)
    assert not any(n.domain == DOMAIN for n in graph.nodes)
    got = rulegraph.run(graph, {k: torch.from_numpy(v) for k, v in feeds.items()})
    for name, want in zip([o.name for o in model.graph.output], expected):
        have = got[name].numpy()
        assert have.shape == want.shape, name
        np.testing.assert_allclose(have, want, rtol=rtol, atol=rtol * max(1.0, float(np.abs(want).max())), err_msg=name)
    return graph


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# -- GELUs ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,bias", [("Gelu", False), ("BiasGelu", True), ("FastGelu", False), ("FastGelu", True)])
def test_gelus(op, bias):
    node = helper.make_node(op, ["x", "b"] if bias else ["x"], ["y"], domain=DOMAIN)
    graph = _same_as_onnxruntime(_model(node, {"x": 3 * _f(B, S, D)}, ["y"], {"b": _f(D)} if bias else {}), {"x": 3 * _f(B, S, D)})
    assert ("Tanh" if op == "FastGelu" else "Erf") in graph.op_types()


# -- layer normalizations ---------------------------------------------------------------------------

@pytest.mark.parametrize("beta", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("outputs", [("y",), ("y", "", "", "sum"), ("y", "mean", "inv_std", "sum")])
@pytest.mark.parametrize("skip", [(B, S, D), (1, S, D), (S, D)])
def test_skip_layer_normalization(beta, bias, outputs, skip):
    names = ["x", "skip", "gamma"] + (["beta"] if beta else [""]) + (["bias"] if bias else [])
    init = {"gamma": _f(D), "beta": _f(D), "bias": _f(D)}
    node = helper.make_node("SkipLayerNormalization", names, list(outputs), domain=DOMAIN, epsilon=1e-5)
    model = _model(node, {"x": _f(B, S, D), "skip": _f(*skip)}, [o for o in outputs if o],
                   {k: v for k, v in init.items() if k in names})
    graph = _same_as_onnxruntime(model, {"x": _f(B, S, D), "skip": _f(*skip)})
    assert "LayerNormalization" in graph.op_types()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("outputs", [("y",), ("y", "", "", "sum")])
def test_skip_simplified_layer_normalization(bias, outputs):
    names = ["x", "skip", "gamma"] + (["bias"] if bias else [])
    node = helper.make_node("SkipSimplifiedLayerNormalization", names, list(outputs), domain=DOMAIN, epsilon=1e-6)
    model = _model(node, {"x": _f(B, S, D), "skip": _f(B, S, D)}, [o for o in outputs if o],
                   {"gamma": _f(D), **({"bias": _f(D)} if bias else {})})
    _same_as_onnxruntime(model, {"x": _f(B, S, D), "skip": _f(B, S, D)})


@pytest.mark.parametrize("segments", [True, False])
@pytest.mark.parametrize("mask", [True, False])
@pytest.mark.parametrize("positions", [True, False])
def test_embed_layer_normalization(segments, mask, positions):
    vocab = 11
    ids = RNG.integers(0, vocab, (B, S)).astype(np.int32)
    feeds = {"ids": ids}
    names = ["ids", "segment_ids" if segments else "", "word", "position", "segment" if segments else "", "gamma",
             "beta", "mask" if mask else "", "position_ids" if positions else ""]
    if segments:
        feeds["segment_ids"] = RNG.integers(0, 2, (B, S)).astype(np.int32)
    if mask:
        feeds["mask"] = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    if positions:
        feeds["position_ids"] = RNG.integers(0, 7, (B, S)).astype(np.int32)
    while names[-1] == "":
        names.pop()
    node = helper.make_node("EmbedLayerNormalization", names, ["y", "mask_index", "sum"], domain=DOMAIN, epsilon=1e-5)
    init = {"word": _f(vocab, D), "position": _f(7, D), "segment": _f(2, D), "gamma": _f(D), "beta": _f(D)}
    model = _model(node, feeds, ["y", "sum"], {k: v for k, v in init.items() if k in names})
    model.graph.output.append(helper.make_tensor_value_info("mask_index", TensorProto.INT32, None))
    _same_as_onnxruntime(model, feeds)


# -- attention ----------------------------------------------------------------------------------------

MASKS = {
    "none": None,
    "end": np.array([3, 5], np.int32),                                       # 1-D [B]: right padding
    "end-start": np.array([4, 5, 1, 0], np.int32),                           # 1-D [2B]: ends, then starts
    "raw": np.array([[1, 0, 1, 1, 0], [1, 1, 1, 1, 1]], np.int32),            # 2-D [B, T]
    "3d": (RNG.random((B, S, S)) > 0.3).astype(np.int32),                    # 3-D [B, S, T]
}


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_masks(mask, unidirectional):
    feeds = {"x": _f(B, S, D)}
    names = ["x", "w", "b"]
    if MASKS[mask] is not None:
        feeds["mask"] = MASKS[mask]
        names.append("mask")
    node = helper.make_node("Attention", names, ["y"], domain=DOMAIN, num_heads=HEADS, unidirectional=unidirectional)
    graph = _same_as_onnxruntime(_model(node, feeds, ["y"], {"w": _f(D, 3 * D), "b": _f(3 * D)}), feeds)
    from rulegraph.patterns import PROBABILITIES
    matmuls = [n for n in graph.nodes if n.op == "MatMul" and PROBABILITIES.matches(graph, n.inputs[0])]
    assert len(matmuls) == 1 and matmuls[0].scope == "" and matmuls[0].name.startswith("Attention")


@pytest.mark.parametrize("variant", ["scale", "qkv_hidden_sizes", "no-bias", "attention_bias", "mask_filter_value"])
def test_attention_variants(variant):
    feeds = {"x": _f(B, S, D)}
    attrs = {"num_heads": HEADS}
    init = {"w": _f(D, 3 * D), "b": _f(3 * D)}
    names = ["x", "w", "b"]
    if variant == "scale":
        attrs["scale"] = 0.7
    elif variant == "qkv_hidden_sizes":
        attrs["qkv_hidden_sizes"] = [D, D, 2 * D]
        init = {"w": _f(D, 4 * D), "b": _f(4 * D)}
    elif variant == "no-bias":
        names[2] = ""
    elif variant == "mask_filter_value":          # a row whose keys are all masked attends by the filtered scores
        attrs["mask_filter_value"] = -3.0
        names.append("mask")
        feeds["mask"] = np.array([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0]], np.int32)
    else:
        names += ["", "", "attention_bias"]
        feeds["attention_bias"] = _f(B, HEADS, S, S)
    node = helper.make_node("Attention", names, ["y"], domain=DOMAIN, **attrs)
    _same_as_onnxruntime(_model(node, feeds, ["y"], {k: v for k, v in init.items() if k in names}), feeds)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mask", ["none", "raw", "end"])
@pytest.mark.parametrize("keys", [S, 3])
def test_multi_head_attention(bias, mask, keys):
    feeds = {"q": _f(B, S, D), "k": _f(B, keys, D), "v": _f(B, keys, D)}
    names = ["q", "k", "v", "bias" if bias else ""]
    if mask == "raw":
        feeds["mask"] = np.array([[1] * (keys - 1) + [0], [1] * keys], np.int32)
    elif mask == "end":
        feeds["mask"] = np.array([keys - 1, keys], np.int32)
    if mask != "none":
        names.append("mask")
    while names[-1] == "":
        names.pop()
    node = helper.make_node("MultiHeadAttention", names, ["y"], domain=DOMAIN, num_heads=HEADS)
    _same_as_onnxruntime(_model(node, feeds, ["y"], {"bias": _f(3 * D)} if bias else {}), feeds)


def test_multi_head_attention_bias_on_the_scores():
    feeds = {"q": _f(B, S, D), "k": _f(B, 3, D), "v": _f(B, 3, D), "attention_bias": _f(1, HEADS, S, 3)}
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "attention_bias"], ["y"], domain=DOMAIN,
                            num_heads=HEADS)
    _same_as_onnxruntime(_model(node, feeds, ["y"], {}), feeds)


@pytest.mark.parametrize("attrs", [{"unidirectional": 1}, {"scale": 0.3}])
def test_multi_head_attention_attributes(attrs):
    feeds = {"q": _f(B, S, D), "k": _f(B, S, D), "v": _f(B, S, D)}
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain=DOMAIN, num_heads=HEADS, **attrs)
    _same_as_onnxruntime(_model(node, feeds, ["y"], {}), feeds)


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("seqlens", [[S - 1, S - 1], [S - 1, 2]])
@pytest.mark.parametrize("present", [False, True])
def test_group_query_attention(kv_heads, seqlens, present):
    """Without a cache: causal, keys past seqlens_k masked (onnxruntime asks for heads of a multiple of 8)."""
    heads, size = 4, 8
    feeds = {"q": _f(B, S, heads * size), "k": _f(B, S, kv_heads * size), "v": _f(B, S, kv_heads * size),
             "seqlens_k": np.array(seqlens, np.int32), "total": np.array([S], np.int32)}
    outputs = ["y", "present_key", "present_value"] if present else ["y"]
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens_k", "total"], outputs, domain=DOMAIN,
                            num_heads=heads, kv_num_heads=kv_heads)
    _same_as_onnxruntime(_model(node, feeds, outputs, {}), feeds)


def test_shape_inference_writes_nothing_in_the_working_directory(tmp_path, monkeypatch):
    """onnxruntime's symbolic shape inference, asked by the contrib expansions, saves a graph it cannot
    follow (this one: the cache outputs) as ``sym_shape_infer_temp.onnx`` where it runs: a user's file of that
    name is kept, and no other file appears."""
    feeds = {"q": _f(B, S, 32), "k": _f(B, S, 16), "v": _f(B, S, 16),
             "seqlens_k": np.array([S - 1, S - 1], np.int32), "total": np.array([S], np.int32)}
    outputs = ["y", "present_key", "present_value"]
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens_k", "total"], outputs,
                            domain=DOMAIN, num_heads=4, kv_num_heads=2)
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "sym_shape_infer_temp.onnx"
    mine.write_bytes(b"the user's own")
    model = _model(node, feeds, outputs, {})
    _same_as_onnxruntime(model, feeds)
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.name] and mine.read_bytes() == b"the user's own"
    # the inference's steps, taken one by one, as the installed onnxruntime has them: this graph it cannot
    # follow, a contrib op it can (its output's shape inferred, where the model declares none)
    with pytest.raises(ValueError, match="incomplete"):
        _symbolic_shapes(model)
    gelu = _model(helper.make_node("FastGelu", ["x"], ["y"], domain=DOMAIN), {"x": _f(B, S, D)}, ["y"], {})
    inferred = {v.name: v for v in _symbolic_shapes(gelu).output}
    assert [d.dim_value for d in inferred["y"].type.tensor_type.shape.dim] == [B, S, D]


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["BSD", "BNSH"])
@pytest.mark.parametrize("positions", ["ids", "offset"])
@pytest.mark.parametrize("partial", [False, True])
def test_rotary_embedding(interleaved, layout, positions, partial):
    size = 8
    rotary = 4 if partial else size
    x = _f(B, S, HEADS * size) if layout == "BSD" else _f(B, HEADS, S, size)
    feeds = {"x": x, "pos": RNG.integers(0, 9, (B, S)).astype(np.int64) if positions == "ids" else np.array([2], np.int64)}
    angles = np.arange(16)[:, None] * (1.0 / 10000 ** (np.arange(rotary // 2) / (rotary // 2)))[None]
    attrs = {"interleaved": interleaved}
    if layout == "BSD" or partial:                 # onnxruntime asks for num_heads with a rotary dimension
        attrs["num_heads"] = HEADS
    if partial:
        attrs["rotary_embedding_dim"] = rotary
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=DOMAIN, **attrs)
    model = _model(node, feeds, ["y"], {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)})
    _same_as_onnxruntime(model, feeds)


# -- n-bit weights ------------------------------------------------------------------------------------

def _nbits(k: int, n: int, bits: int, symmetric: bool, bias: bool, block: int = 16):
    """A MatMul of ``[k, n]`` random weights quantized by onnxruntime's MatMulNBitsQuantizer."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    w = _f(k, n)
    nodes = [helper.make_node("MatMul", ["a", "w"], ["t" if bias else "y"])]
    if bias:
        nodes.append(helper.make_node("Add", ["t", "bias"], ["y"]))
    graph = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [B, S, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(_f(n), "bias")][:1 + bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = MatMulNBitsQuantizer(model, bits=bits, block_size=block, is_symmetric=symmetric)
        q.process()
    return q.model.model


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("k", [32, 40])
def test_matmul_nbits(bits, symmetric, k):
    model = _nbits(k, 6, bits, symmetric, bias=True)
    assert [n.op_type for n in model.graph.node if n.domain == DOMAIN] == ["MatMulNBits"]
    graph = _same_as_onnxruntime(model, {"a": _f(B, S, k)}, rtol=1e-5)
    (weights,) = [v for key, v in graph.constants.items() if key.endswith("/weight:value")]
    assert weights.dtype == torch.float32 and weights.shape == (k, 6)


def test_matmul_nbits_bias_input():
    """MatMulNBits' own bias input (5): A @ W + bias."""
    model = _nbits(32, 6, 4, False, bias=False)
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    while len(node.input) < 5:
        node.input.append("")
    node.input.append("nbits_bias")
    model.graph.initializer.append(numpy_helper.from_array(_f(6), "nbits_bias"))
    _same_as_onnxruntime(model, {"a": _f(B, S, 32)})


def test_matmul_nbits_float_zero_points():
    """Zero points given as floats (one per block, unpacked): W = (q − zero)·scale, as onnxruntime."""
    k, n, block = 32, 4, 16
    q = RNG.integers(0, 16, (n, k)).astype(np.uint8)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, k // block, block // 2)
    scales, zero = RNG.random((n, k // block)).astype(np.float32), (15 * RNG.random((n, k // block))).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["a", "B", "scales", "zero"], ["y"], domain=DOMAIN, K=k, N=n, bits=4,
                            block_size=block)
    model = _model(node, {"a": _f(B, k)}, ["y"], {"B": packed, "scales": scales.ravel(), "zero": zero.ravel()})
    _same_as_onnxruntime(model, {"a": _f(B, k)})


# -- what is refused ------------------------------------------------------------------------------------

REFUSALS = {
    "past": (helper.make_node("Attention", ["x", "w", "b", "", "past"], ["y"], domain=DOMAIN, num_heads=HEADS),
             {"past": _f(2, B, HEADS, 3, D // HEADS)}, "input 4 (past)"),
    "present": (helper.make_node("Attention", ["x", "w", "b"], ["y", "present"], domain=DOMAIN, num_heads=HEADS), {},
                "output 1 (present)"),
    "4-D mask": (helper.make_node("Attention", ["x", "w", "b", "mask"], ["y"], domain=DOMAIN, num_heads=HEADS),
                 {"mask": np.ones((B, 1, S, S), np.int32)}, "4-D mask_index"),
    "do_rotary": (helper.make_node("Attention", ["x", "w", "b"], ["y"], domain=DOMAIN, num_heads=HEADS, do_rotary=1), {},
                  "do_rotary=1"),
    "gqa-past": (helper.make_node("GroupQueryAttention", ["x", "x", "x", "past"], ["y"], domain=DOMAIN,
                                  num_heads=HEADS, kv_num_heads=1), {"past": _f(B, 1, 3, D // HEADS)}, "input 3 (past_key)"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_unexpanded_variants_are_refused_by_name(case, tmp_path, capsys):
    node, extra, said = REFUSALS[case]
    node.name = "fused_attention"
    model = _model(node, {"x": _f(B, S, D), **extra}, ["y"], {"w": _f(D, 3 * D), "b": _f(3 * D)})
    with pytest.raises(ModelError, match=f"node 'fused_attention' \\({node.op_type}, domain {DOMAIN}\\).*{re.escape(said)}"):
        rulegraph.load(model)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, D]))  # for the checker
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["check", str(tmp_path / "m.onnx"), "-r", "attnlrp"]) != 0
    out = capsys.readouterr()
    assert said in out.out + out.err and "Traceback" not in out.out + out.err


def test_matmul_nbits_act_order_is_refused():
    model = _nbits(32, 6, 4, False, bias=False)
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    while len(node.input) < 4:
        node.input.append("")
    node.input.append("g_idx")
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(32, np.int32), "g_idx"))
    with pytest.raises(ModelError, match="MatMulNBits.*input 4 \\(g_idx\\)"):
        rulegraph.load(model)


# -- end to end: onnxruntime's optimizer and n-bit quantizer on tiny transformers ---------------------

NAMES = ("input_ids", "attention_mask", "token_type_ids")
FUSED = {"bert": {"Attention", "SkipLayerNormalization", "EmbedLayerNormalization", "BiasGelu"},
         "bert-mha": {"MultiHeadAttention", "SkipLayerNormalization", "EmbedLayerNormalization", "BiasGelu"},
         "gpt2": {"SkipLayerNormalization", "FastGelu"}}


@pytest.fixture(scope="module", params=sorted(FUSED))
def fused(request, tmp_path_factory):
    """(architecture, unfused export, the optimizer's fused graph); ``bert-mha`` fuses the attention
    into MultiHeadAttention (the optimizer's ``use_multi_head_attention``)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model
    arch = request.param.split("-")[0]
    options = FusionOptions(arch)
    options.use_multi_head_attention = request.param.endswith("-mha")
    folder = tmp_path_factory.mktemp(f"fused_{request.param}")
    source = tiny.onnx(tiny.build(arch), folder / "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimized = optimize_model(str(source), model_type=arch, num_heads=tiny.SIZE["heads"],
                                   hidden_size=tiny.SIZE["hidden"], optimization_options=options)
    optimized.save_model_to_file(str(folder / "fused.onnx"))
    return request.param, source, folder / "fused.onnx"


def _feeds(**kw):
    return tiny.token_inputs(NAMES, **kw)


def test_the_optimizer_fuses(fused):
    arch, _, path = fused
    ops = {n.op_type for n in onnx.load(str(path)).graph.node if n.domain == DOMAIN}
    assert FUSED[arch] <= ops


def test_the_fused_graph_runs_like_onnxruntime(fused):
    _, _, path = fused
    feeds = _feeds(batch=2, length=11, pad=3)
    (expected,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {k: v.numpy() for k, v in feeds.items()})
    graph = rulegraph.load(path)
    assert not any(n.domain == DOMAIN for n in graph.nodes)
    got = rulegraph.run(graph, feeds)["logits"].numpy()
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max() + 1e-7


def test_the_fused_graph_in_float16_runs_like_onnxruntime(fused, tmp_path):
    """The optimizer's float16 conversion (inputs and outputs kept float32), as deployments ship it."""
    from onnxruntime.transformers.onnx_model import OnnxModel
    _, _, path = fused
    model = OnnxModel(onnx.load(str(path)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(tmp_path / "fp16.onnx"))
    feeds = _feeds(batch=2, length=11, pad=3)
    (expected,) = ort.InferenceSession(str(tmp_path / "fp16.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {k: v.numpy() for k, v in feeds.items()})
    got = rulegraph.run(rulegraph.load(tmp_path / "fp16.onnx"), feeds)["logits"].numpy()
    assert np.abs(got - expected).max() <= 2e-3 * np.abs(expected).max()


def test_the_fused_graph_keeps_its_layers(fused):
    """The expanded nodes take the fused nodes' scopes: the same blocks as the unfused export."""
    _, source, path = fused
    blocks = {layer for layer in rulegraph.load(path).layers.values()}
    assert blocks == {layer for layer in rulegraph.load(source).layers.values()}


def test_the_fused_attention_is_found_as_the_unfused_one(fused):
    """The attention heads (Softmax → value product, its block and head count) of the fused graph are the
    unfused export's, and rulegraph check passes."""
    from rulegraph.heads import find_heads
    _, source, path = fused
    blocks = [[(b.block, b.heads) for b in find_heads(rulegraph.load(p))] for p in (source, path)]
    assert blocks[0] == blocks[1] and len(blocks[0]) == tiny.SIZE["layers"]
    assert main(["check", str(path), "-r", "attnlrp"]) == 0


def test_every_rule_set_explains_the_fused_graph_as_the_unfused_one(fused):
    """float64: the same relevance per token as the unfused export (≤ 1e-9), conserved; gi equal to autograd."""
    _, source, path = fused
    feeds = _feeds(batch=1, length=9, pad=2)
    unfused, fused_graph = rulegraph.load(source), rulegraph.load(path)
    for rules in sorted(rulegraph.shipped_rule_sets()):
        a = rulegraph.explain(unfused, rules, feeds, dtype=torch.float64)
        b = rulegraph.explain(fused_graph, rules, feeds, dtype=torch.float64)
        sa, sb = np.asarray(a.scores("input_ids")), np.asarray(b.scores("input_ids"))
        assert np.abs(sa - sb).max() <= 1e-9 * max(np.abs(sa).max(), 1e-30), rules
        c = b.audit.conservation
        assert abs(c.residual) <= 1e-9 * abs(c.output_value), rules
        assert not b.audit.unexpected, rules


def test_gi_on_the_fused_graph_is_autograd_on_the_unfused_model(fused):
    """gradient × input at the embeddings, against torch autograd on the Hugging Face module."""
    arch, _, path = fused
    feeds = _feeds(batch=1, length=9)
    module = tiny.build(arch.split("-")[0]).double()
    e = rulegraph.explain(rulegraph.load(path), "gi", feeds, dtype=torch.float64)
    target = int(np.asarray(e.target).ravel()[0])
    embeds = module.get_input_embeddings()(feeds["input_ids"]).detach().requires_grad_(True)
    logits = module(inputs_embeds=embeds, attention_mask=feeds["attention_mask"],
                    token_type_ids=feeds["token_type_ids"]).logits
    logits[0, target].backward()
    expected = (embeds.grad * embeds).sum(-1).detach().numpy()
    # GPT-2's export (and so its fusion) holds float32 constants: the tanh-GELU's 0.044715 and √(2/π)
    tolerance = 1e-9 if arch.startswith("bert") else 1e-7
    np.testing.assert_allclose(np.asarray(e.scores("input_ids")).reshape(expected.shape), expected, rtol=0,
                               atol=tolerance * np.abs(expected).max())


# -- end to end: MatMulNBits -------------------------------------------------------------------------

def _dequantized(packed: np.ndarray, scales: np.ndarray, zero: np.ndarray, k: int, n: int, block: int) -> np.ndarray:
    """A 4-bit MatMulNBits' ``[K, N]`` float32 weights, read from its blobs with numpy (low nibble first)."""
    nibbles = np.stack([packed & 0x0F, packed >> 4], -1).reshape(n, -1)
    zeros = np.stack([zero & 0x0F, zero >> 4], -1).reshape(n, -1)[:, :nibbles.shape[1] // block]
    per_column = lambda t: np.repeat(t.reshape(n, -1), block, axis=1)  # noqa: E731
    return ((nibbles.astype(np.float32) - per_column(zeros).astype(np.float32)) * per_column(scales))[:, :k].T.copy()


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """(the 4-bit quantized tiny BERT, the same graph with each MatMulNBits a MatMul of its dequantized weights)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    folder = tmp_path_factory.mktemp("nbits")
    source = tiny.onnx(tiny.build("bert"), folder / "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = MatMulNBitsQuantizer(onnx.load(str(source)), bits=4, block_size=16, is_symmetric=False)
        q.process()
    onnx.save(q.model.model, folder / "nbits.onnx")
    float_model = onnx.load(str(folder / "nbits.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in float_model.graph.initializer}
    for node in float_model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            w = _dequantized(*(inits[v] for v in node.input[1:4]), attrs["K"], attrs["N"], attrs["block_size"])
            float_model.graph.initializer.append(numpy_helper.from_array(w, f"{node.name}_dequantized"))
            node.CopyFrom(helper.make_node("MatMul", [node.input[0], f"{node.name}_dequantized"], list(node.output),
                                           name=node.name))
    onnx.save(float_model, folder / "dequantized.onnx")
    return folder / "nbits.onnx", folder / "dequantized.onnx"


def test_the_nbit_model_runs_like_onnxruntime(quantized):
    path, _ = quantized
    assert sum(n.op_type == "MatMulNBits" for n in onnx.load(str(path)).graph.node) >= 6
    feeds = _feeds(batch=2, length=11, pad=3)
    (expected,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {k: v.numpy() for k, v in feeds.items()})
    got = rulegraph.run(rulegraph.load(path), feeds)["logits"].numpy()
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max() + 1e-7


def test_the_nbit_model_explains_as_its_dequantized_float_model(quantized):
    path, dequantized = quantized
    feeds = _feeds(batch=1, length=9)
    a, b = rulegraph.load(path), rulegraph.load(dequantized)
    for rules in sorted(rulegraph.shipped_rule_sets()):
        ea = rulegraph.explain(a, rules, feeds, dtype=torch.float64)
        eb = rulegraph.explain(b, rules, feeds, dtype=torch.float64)
        sa, sb = np.asarray(ea.scores("input_ids")), np.asarray(eb.scores("input_ids"))
        assert np.abs(sa - sb).max() <= 1e-9 * np.abs(sb).max(), rules
        assert abs(ea.audit.conservation.residual) <= 1e-9 * abs(ea.audit.conservation.output_value), rules


def test_a_fused_then_quantized_model_runs_like_onnxruntime(fused, tmp_path):
    """The optimizer's fused graph through the n-bit quantizer, as deployments chain them."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    _, _, path = fused
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = MatMulNBitsQuantizer(onnx.load(str(path)), bits=4, block_size=16, is_symmetric=True)
        q.process()
    onnx.save(q.model.model, tmp_path / "both.onnx")
    ops = {n.op_type for n in q.model.model.graph.node if n.domain == DOMAIN}
    assert "MatMulNBits" in ops and len(ops) > 1
    feeds = _feeds(batch=2, length=11, pad=3)
    (expected,) = ort.InferenceSession(str(tmp_path / "both.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {k: v.numpy() for k, v in feeds.items()})
    got = rulegraph.run(rulegraph.load(tmp_path / "both.onnx"), feeds)["logits"].numpy()
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max() + 1e-7
