"""LSTM, GRU, RNN and DynamicQuantizeLSTM, one node at a time, against onnxruntime.

Over directions, layouts, ``sequence_lens``, initial states, ``clip``, peepholes, ``input_forget``,
``linear_before_reset``, and activations with their alpha / beta, in float32 (each case in the
harness's layouts: graph inputs, weights as initializers, all constant) and in float64 against
onnxruntime's double kernel where it has one.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from .onnx_harness import Case, assert_same, build, check_case, run_ort, run_rulegraph

RNG = np.random.default_rng(20261127)
S, N, I, H = 5, 3, 4, 3          # steps, batch, input size, hidden size
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def f(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def inputs(kind, *, directions=1, layout=0, bias=True, lens=None, initial=False, peepholes=False):
    g = GATES[kind]
    x = f(N, S, I) if layout else f(S, N, I)
    out = [x, f(directions, g * H, I, scale=0.6), f(directions, g * H, H, scale=0.6),
           f(directions, 2 * g * H) if bias else None,
           None if lens is None else np.array(lens, np.int32)]
    state = (lambda: f(N, directions, H)) if layout else (lambda: f(directions, N, H))
    out.append(state() if initial else None)
    if kind == "LSTM":
        out.append(state() if initial else None)
        out.append(f(directions, 3 * H) if peepholes else None)
    while out and out[-1] is None:
        out.pop()
    return out


CASES: list[Case] = []
#: onnxruntime's tanh / sigmoid kernels (MLAS) are approximations a few float32 ulps off torch's
_TOL = {"rtol": 2e-5, "atol": 2e-6}


def case(kind, name, *, directions=1, layout=0, bias=True, lens=None, initial=False, peepholes=False,
         layouts=None, **attrs):
    d = {1: attrs.get("direction", "forward"), 2: "bidirectional"}[directions]
    attrs = {"hidden_size": H, **attrs, "direction": d}
    if layout:
        attrs["layout"] = layout
    n_out = 3 if kind == "LSTM" else 2
    CASES.append(Case(kind, inputs(kind, directions=directions, layout=layout, bias=bias, lens=lens, initial=initial,
                                   peepholes=peepholes), attrs=attrs, n_outputs=n_out, opset=14, name=name,
                      layouts=layouts, **_TOL))


_LENS = [5, 2, 4]
for _kind in ("LSTM", "GRU", "RNN"):
    case(_kind, "forward")
    case(_kind, "reverse", direction="reverse")
    case(_kind, "bidirectional", directions=2)
    case(_kind, "no_bias", bias=False, layouts=("inputs",))
    case(_kind, "lens", lens=_LENS)
    case(_kind, "lens_reverse", lens=_LENS, direction="reverse")
    case(_kind, "lens_bidirectional_initial", directions=2, lens=_LENS, initial=True)
    case(_kind, "initial", initial=True)
    case(_kind, "layout1", layout=1, initial=True, layouts=("inputs", "data"))
    case(_kind, "layout1_bidirectional_lens", layout=1, directions=2, lens=[3, 5, 1], initial=True,
         layouts=("inputs", "data"))
    case(_kind, "clip", clip=0.4, initial=True)
    case(_kind, "clip_bidirectional", directions=2, clip=0.7, lens=_LENS, layouts=("inputs",))
case("LSTM", "peepholes", peepholes=True, initial=True)
case("LSTM", "peepholes_bidirectional_lens", peepholes=True, directions=2, lens=_LENS, initial=True)
case("LSTM", "input_forget", input_forget=1, peepholes=True, initial=True, layouts=("inputs",))
case("GRU", "linear_before_reset", linear_before_reset=1, initial=True)
case("GRU", "linear_before_reset_bidirectional_lens", linear_before_reset=1, directions=2, lens=_LENS)
case("LSTM", "activations", activations=["HardSigmoid", "LeakyRelu", "Affine"],
     activation_alpha=[0.3, 0.2, 0.5], activation_beta=[0.45, 0.1], initial=True, layouts=("inputs",))
case("GRU", "activations", activations=["HardSigmoid", "Softsign", "Sigmoid", "ScaledTanh"],
     activation_alpha=[0.25, 0.8], activation_beta=[0.5, 1.2], directions=2, layouts=("inputs",))
case("RNN", "relu", activations=["Relu"], layouts=("inputs",))
case("RNN", "elu_bidirectional", activations=["Elu", "Softplus"], activation_alpha=[0.7], directions=2,
     layouts=("inputs",))

RECURRENT_OPS = {c.op for c in CASES}


def _params(cases):
    return [pytest.param(c, layout, id=f"{c.id}-{layout}") for c in cases for layout in c.valid_layouts()]


@pytest.mark.parametrize("c, layout", _params([c for c in CASES if not c.attrs.get("layout")]))
def test_against_onnxruntime(c: Case, layout: str):
    check_case(c, layout)


def _ort_layout0(c: Case) -> list[np.ndarray]:
    """onnxruntime's outputs for ``c`` (its CPU kernels take layout 0 only: a ``layout=1`` case runs as
    its time-major twin, the outputs transposed back)."""
    attrs = dict(c.attrs)
    if not attrs.pop("layout", 0):
        return run_ort(*build(c, "data"))
    ins = [None if x is None else x.transpose(1, 0, 2) if i in (0, 5, 6) else x for i, x in enumerate(c.inputs)]
    outs = run_ort(*build(dataclasses.replace(c, inputs=ins, attrs=attrs), "data"))
    return [outs[0].transpose(2, 0, 1, 3)] + [o.transpose(1, 0, 2) for o in outs[1:]]


@pytest.mark.parametrize("c", [pytest.param(c, id=c.id) for c in CASES if c.attrs.get("layout")])
def test_layout1_against_onnxruntime_on_its_time_major_twin(c: Case):
    model, feeds = build(c, "data")
    for k, (g, ref) in enumerate(zip(run_rulegraph(model, feeds), _ort_layout0(c), strict=True)):
        assert_same(g, ref, rtol=c.rtol, atol=c.atol, float_dtype=torch.float32, what=f"{c.id} output {k}")


@pytest.mark.parametrize("c", [pytest.param(c, id=c.id) for c in CASES])
def test_float64_against_onnxruntime(c: Case):
    """onnxruntime has no double LSTM, GRU or RNN kernel: the float64 run against its float32 one, at the
    float32 tolerance (what is checked: the float64 plan computes the same recurrence)."""
    model, feeds = build(c, "data")
    double = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feeds.items()}
    for k, (g, ref) in enumerate(zip(run_rulegraph(model, double, dtype=torch.float64), _ort_layout0(c), strict=True)):
        assert g.dtype == torch.float64
        np.testing.assert_allclose(g.numpy(), ref, rtol=1e-5, atol=2e-6, err_msg=f"{c.id} output {k}")


# -- DynamicQuantizeLSTM (com.microsoft) ----------------------------------------------------------------

def _quantized_lstm(directions: int, per_column: bool, signed: bool, lens=None, initial=False):
    """A one-node DynamicQuantizeLSTM and its float LSTM twin (the dequantized weights)."""
    base = inputs("LSTM", directions=directions, lens=lens, initial=initial, peepholes=initial)
    base += [None] * (8 - len(base))
    x, w, r = base[0], base[1], base[2]
    qtype = np.int8 if signed else np.uint8

    def quantize(m):                                             # [D, 4H, K] float → [D, K, 4H] quantized
        t = m.transpose(0, 2, 1)
        axes = (1,) if per_column else (1, 2)
        lo, hi = np.minimum(t.min(axis=axes, keepdims=True), 0), np.maximum(t.max(axis=axes, keepdims=True), 0)
        scale = np.maximum(np.abs(lo), hi) / 127     # symmetric: onnxruntime's kernel takes one zero point per
        zero = np.full_like(scale, 0 if signed else 128)  # direction (uint8 per column: "must be constant")
        q = np.clip(np.round(t / scale) + zero, *((-127, 127) if signed else (1, 255))).astype(qtype)
        shape = (directions, 4 * H) if per_column else (directions,)
        return q, scale.reshape(shape).astype(np.float32), zero.reshape(shape).astype(qtype)

    (qw, sw, zw), (qr, sr, zr) = quantize(w), quantize(r)
    names = ["x", "w", "r", "b", "lens", "h0", "c0", "p", "sw", "zw", "sr", "zr"]
    values = base + [sw, zw, sr, zr]
    values[1], values[2] = qw, qr
    attrs = {"hidden_size": H, "direction": "bidirectional" if directions == 2 else "forward"}
    node = helper.make_node("DynamicQuantizeLSTM", [n if v is not None else "" for n, v in zip(names, values)],
                            ["y", "y_h", "y_c"], domain="com.microsoft", **attrs)
    inits = [numpy_helper.from_array(v, n) for n, v in zip(names[1:], values[1:]) if v is not None]
    graph = helper.make_graph([node], "dq_lstm", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x.shape))],
                              [helper.make_empty_tensor_value_info(o) for o in ("y", "y_h", "y_c")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)

    def dequantized(q, s, z):
        s = s[:, None, None] if s.ndim == 1 else s[:, None, :]
        z = z[:, None, None] if z.ndim == 1 else z[:, None, :]
        return ((q.astype(np.float32) - z.astype(np.float32)) * s).transpose(0, 2, 1).astype(np.float32)

    float_inputs = [x, dequantized(qw, sw, zw), dequantized(qr, sr, zr)] + base[3:]
    twin = Case("LSTM", float_inputs, attrs=attrs, n_outputs=3, opset=14, layouts=("data",))
    return model, {"x": x}, twin


@pytest.mark.parametrize("directions, per_column, signed, lens, initial", [
    (1, False, True, None, False), (1, True, False, None, True), (2, True, True, _LENS, True),
    (2, False, False, _LENS, False)], ids=["forward_s8", "per_column_u8_initial", "bidirectional_per_column_lens",
                                          "bidirectional_u8_lens"])
def test_dynamic_quantize_lstm_is_the_lstm_of_its_dequantized_weights(directions, per_column, signed, lens, initial):
    """Equal to the float LSTM of the dequantized weights (onnxruntime, float32), and to onnxruntime's
    DynamicQuantizeLSTM up to the uint8 rounding its kernel applies to the activations."""
    model, feeds, twin = _quantized_lstm(directions, per_column, signed, lens, initial)
    got = run_rulegraph(model, feeds)
    twin_model, twin_feeds = build(twin, "data")
    for g, ref in zip(got, run_ort(twin_model, twin_feeds)):
        np.testing.assert_allclose(g.numpy(), ref, rtol=2e-5, atol=2e-6)
    for g, ref in zip(got, run_ort(model, feeds)):     # the kernel's uint8 activations: up to 1.2e-2 apart here
        assert g.shape == ref.shape
        np.testing.assert_allclose(g.numpy(), ref, atol=0.025)
    got64 = run_rulegraph(model, feeds, dtype=torch.float64)
    for g, g64 in zip(got, got64):
        np.testing.assert_allclose(g64.numpy(), g.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs, expected", [
    ({"activations": ["Sigmoid", "Gelu", "Tanh"]}, "activation 'Gelu' is not one of ONNX's recurrent activations"),
    ({"activations": ["Sigmoid", "Tanh"]}, "LSTM takes 3 activations (3 per direction), got 2"),
    ({"direction": "bidirectional"}, "W has 1 directions, direction='bidirectional' needs 2"),
    ({"hidden_size": H + 1}, f"hidden_size={H + 1} but R holds a hidden size of {H}"),
])
def test_a_bad_cell_is_refused_in_one_line_naming_the_node(attrs, expected):
    import rulegraph
    from rulegraph.errors import RulegraphError

    c = Case("LSTM", inputs("LSTM"), attrs={"hidden_size": H, **attrs}, n_outputs=3, opset=14, check=False)
    model, feeds = build(c, "data")
    with pytest.raises(RulegraphError) as refused:
        rulegraph.run(rulegraph.load(model), {k: torch.from_numpy(v) for k, v in feeds.items()})
    message = str(refused.value)
    assert "\n" not in message and "(LSTM)" in message and expected in message, message
