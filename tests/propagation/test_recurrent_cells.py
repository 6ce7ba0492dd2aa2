"""The ``recurrent`` rule (Arras et al. 2017) against an independent float64 reference, and its conservation.

The reference is written out from the paper's rules in numpy, one batch row, one direction, one step and
one hidden unit at a time: its own forward of the cell (ONNX's equations), then the backward walk —
signal-take-all at ``o ⊙ tanh(c)``, the ε-rule on the cell update (LSTM) or the update-gate mix (GRU)
with the gates as weights, identity through the candidate's tanh, the ε-rule on the candidate's input
and recurrent linear maps with the biases absorbed.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rulegraph.ir import Node
from rulegraph.ops import lookup
from rulegraph.propagation import RULES
from rulegraph.propagation.signal import Contribution, Incoming, Site

EPS = 0.05                          # large enough that the stabiliser's share is visible
S, N, I, H = 5, 3, 4, 3
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def sig(v):
    return 1 / (1 + np.exp(-v))


def sgn(v):
    return 1.0 if v >= 0 else -1.0


def reference(kind, x, w, r, b, lens, h0, c0, p, ry, rh_out, rc_out, *, reverse, lbr=0):
    """One direction, one batch row: R(x) [S, I], R(h0), R(c0), absorbed. ``x`` [S, I], weights ONNX's."""
    L = x.shape[0] if lens is None else int(lens)
    steps = list(range(L))[::-1] if reverse else list(range(L))
    wb, rb = (np.zeros(GATES[kind] * H), np.zeros(GATES[kind] * H)) if b is None else (b[:len(b) // 2], b[len(b) // 2:])
    h, c = h0.copy(), None if c0 is None else c0.copy()
    history = []
    for t in steps:                                      # the forward, ONNX's equations
        if kind == "LSTM":
            z = w @ x[t] + r @ h + wb + rb
            pi, po, pf = (np.zeros(H),) * 3 if p is None else (p[:H], p[H:2 * H], p[2 * H:])
            i, f = sig(z[:H] + pi * c), sig(z[2 * H:3 * H] + pf * c)
            zg = z[3 * H:]
            g = np.tanh(zg)
            c_new = f * c + i * g
            o = sig(z[H:2 * H] + po * c_new)
            h_new = o * np.tanh(c_new)
            history.append(dict(t=t, h=h, c=c, i=i, f=f, g=g, zg=zg, c_new=c_new))
            h, c = h_new, c_new
        elif kind == "GRU":
            u = sig(w[:H] @ x[t] + wb[:H] + r[:H] @ h + rb[:H])
            rr = sig(w[H:2 * H] @ x[t] + wb[H:2 * H] + r[H:2 * H] @ h + rb[H:2 * H])
            if lbr:
                zg = w[2 * H:] @ x[t] + wb[2 * H:] + rr * (r[2 * H:] @ h + rb[2 * H:])
            else:
                zg = w[2 * H:] @ x[t] + wb[2 * H:] + r[2 * H:] @ (rr * h) + rb[2 * H:]
            g = np.tanh(zg)
            h_new = (1 - u) * g + u * h
            history.append(dict(t=t, h=h, u=u, r=rr, g=g, zg=zg, h_new=h_new))
            h = h_new
        else:
            zg = w @ x[t] + r @ h + wb + rb
            history.append(dict(t=t, h=h, zg=zg))
            h = np.tanh(zg)
    rx = np.zeros_like(x)
    absorbed = sum(ry[t].sum() for t in range(x.shape[0]) if t not in steps)   # Y = 0 past the end
    rh, rc = rh_out.copy(), None if rc_out is None else rc_out.copy()
    blk = {"LSTM": 3, "GRU": 2, "RNN": 0}[kind]
    wg, rg = w[blk * H:(blk + 1) * H], r[blk * H:(blk + 1) * H]
    bg = wb[blk * H:(blk + 1) * H], rb[blk * H:(blk + 1) * H]
    for st in reversed(history):
        total = rh + ry[st["t"]]
        r_cand, r_hprev, r_cprev = np.zeros(H), np.zeros(H), np.zeros(H)
        for j in range(H):
            if kind == "LSTM":                       # all of R(h) to c; ε-rule on c = f·c_prev + i·g
                rj = rc[j] + total[j]
                den = st["c_new"][j] + EPS * sgn(st["c_new"][j])
                r_cprev[j] = st["f"][j] * st["c"][j] / den * rj
                r_cand[j] = st["i"][j] * st["g"][j] / den * rj
                absorbed += rj * (den - st["c_new"][j]) / den
            elif kind == "GRU":                      # ε-rule on h = (1 − u)·g + u·h_prev
                den = st["h_new"][j] + EPS * sgn(st["h_new"][j])
                r_cand[j] = (1 - st["u"][j]) * st["g"][j] / den * total[j]
                r_hprev[j] += st["u"][j] * st["h"][j] / den * total[j]
                absorbed += total[j] * (den - st["h_new"][j]) / den
            else:
                r_cand[j] = total[j]
        for j in range(H):                           # identity through tanh; ε-rule on the candidate's linear map
            zj = st["zg"][j]
            den = zj + EPS * sgn(zj)
            share = r_cand[j] / den
            for k in range(x.shape[1]):
                rx[st["t"], k] += x[st["t"], k] * wg[j, k] * share
            gate = st["r"][j] if kind == "GRU" and lbr else 1.0
            for k in range(H):
                weight = rg[j, k] * (st["r"][k] if kind == "GRU" and not lbr else 1.0)
                r_hprev[k] += st["h"][k] * weight * gate * share
            absorbed += (bg[0][j] + gate * bg[1][j]) * share + EPS * sgn(zj) * share
        rh = r_hprev
        rc = r_cprev if kind == "LSTM" else None
    return rx, rh, rc, absorbed


def run_rule(op, inputs, attrs, relevance, tainted):
    spec = lookup(op, "com.microsoft" if op == "DynamicQuantizeLSTM" else "")
    attrs = {**spec.defaults, **attrs}
    outputs = list(spec.forward(*inputs, **attrs))
    incoming = []
    for o, rel in zip(outputs, relevance):
        inc = Incoming(o)
        inc.add(Contribution(relevance=rel))
        incoming.append(inc)
    node = Node("n", op, tuple(f"i{k}" for k in range(len(inputs))), tuple(f"o{k}" for k in range(len(outputs))), attrs)
    site = Site(node=node, spec=spec, attrs=attrs, inputs=inputs, outputs=outputs, tainted=tainted, incoming=incoming)
    rule = RULES["relevance"].get("recurrent")(epsilon=EPS)
    got = rule.propagate(site)
    return [None if c is None else c.tensor(x) for c, x in zip(got, inputs)], float(sum(t.sum() for t in site.absorbed))


def _rand(*shape, scale=1.0, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


CASES = {
    "lstm_forward": ("LSTM", dict(), {}),
    "lstm_reverse_lens_initial": ("LSTM", dict(lens=[5, 2, 4], initial=True), {"direction": "reverse"}),
    "lstm_bidirectional_peepholes_lens": ("LSTM", dict(directions=2, lens=[3, 5, 1], initial=True, peepholes=True),
                                          {"direction": "bidirectional"}),
    "lstm_layout1_bidirectional": ("LSTM", dict(directions=2, initial=True, layout=1),
                                   {"direction": "bidirectional", "layout": 1}),
    "lstm_no_bias": ("LSTM", dict(bias=False, initial=True), {}),
    "gru_forward": ("GRU", dict(initial=True), {}),
    "gru_linear_before_reset_bidirectional_lens": ("GRU", dict(directions=2, lens=[4, 5, 2], initial=True),
                                                   {"direction": "bidirectional", "linear_before_reset": 1}),
    "gru_reverse_lens": ("GRU", dict(lens=[2, 5, 3]), {"direction": "reverse"}),
    "rnn_bidirectional_lens": ("RNN", dict(directions=2, lens=[5, 1, 3], initial=True), {"direction": "bidirectional"}),
    "dq_lstm_bidirectional": ("DynamicQuantizeLSTM", dict(directions=2, initial=True, lens=[4, 5, 2]),
                              {"direction": "bidirectional"}),
}


def _build(op, directions=1, lens=None, initial=False, peepholes=False, bias=True, layout=0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    kind = "LSTM" if op == "DynamicQuantizeLSTM" else op
    g = GATES[kind]
    x = _rand(N, S, I, gen=gen) if layout else _rand(S, N, I, gen=gen)
    w, r = _rand(directions, g * H, I, scale=0.7, gen=gen), _rand(directions, g * H, H, scale=0.7, gen=gen)
    b = _rand(directions, 2 * g * H, scale=0.5, gen=gen) if bias else None
    state = (lambda: _rand(N, directions, H, gen=gen)) if layout else (lambda: _rand(directions, N, H, gen=gen))
    h0 = state() if initial else None
    c0 = state() if initial and kind == "LSTM" else None
    p = _rand(directions, 3 * H, gen=gen) if peepholes else None
    seq = None if lens is None else torch.tensor(lens, dtype=torch.int32)
    inputs = [x, w, r, b, seq, h0] + ([c0, p] if kind == "LSTM" else [])
    float_w, float_r = w, r
    if op == "DynamicQuantizeLSTM":            # quantized weights, transposed; their dequantized twins for the reference
        ws, rs = torch.tensor([0.01, 0.02], dtype=torch.float64)[:directions], torch.tensor([0.015, 0.01], dtype=torch.float64)[:directions]
        qw = torch.randint(-100, 100, (directions, I, 4 * H), generator=gen, dtype=torch.int8)
        qr = torch.randint(-100, 100, (directions, H, 4 * H), generator=gen, dtype=torch.int8)
        zero = torch.zeros(directions, dtype=torch.int8)
        inputs = [x, qw, qr, b, seq, h0, c0, p, ws, zero, rs, zero]
        float_w = (qw.double() * ws[:, None, None]).transpose(1, 2)
        float_r = (qr.double() * rs[:, None, None]).transpose(1, 2)
    return inputs, float_w, float_r


@pytest.mark.parametrize("name", CASES)
def test_recurrent_rule_against_the_unrolled_reference(name):
    op, build, attrs = CASES[name]
    kind = "LSTM" if op == "DynamicQuantizeLSTM" else op
    directions = build.get("directions", 1)
    layout = build.get("layout", 0)
    inputs, w, r = _build(op, **build)
    spec = lookup(op, "com.microsoft" if op == "DynamicQuantizeLSTM" else "")
    outs = spec.forward(*inputs, **{**spec.defaults, **attrs})
    gen = torch.Generator().manual_seed(7)
    relevance = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs]
    tainted = [i in (0, 5, 6) and i < len(inputs) and inputs[i] is not None for i in range(len(inputs))]
    got, absorbed = run_rule(op, inputs, attrs, relevance, tainted)

    # the reference, time major, per direction and batch row
    t0 = (lambda t: None if t is None else t.transpose(0, 1)) if layout else (lambda t: t)
    x, h0, c0 = t0(inputs[0]).numpy(), t0(inputs[5]), t0(inputs[6]) if kind == "LSTM" else None
    ry = relevance[0].permute(1, 2, 0, 3) if layout else relevance[0]
    rys = [t0(t) for t in relevance[1:]]
    rx_ref = np.zeros_like(x)
    rh_ref, rc_ref = np.zeros((directions, N, H)), np.zeros((directions, N, H))
    absorbed_ref = 0.0
    b, p, lens = inputs[3], inputs[7] if kind == "LSTM" else None, inputs[4]
    for d in range(directions):
        reverse = attrs.get("direction") == "reverse" or d == 1
        for n in range(N):
            rx, rh, rc, gone = reference(
                kind, x[:, n], w[d].numpy(), r[d].numpy(), None if b is None else b[d].numpy(),
                None if lens is None else lens[n], np.zeros(H) if h0 is None else h0[d, n].numpy(),
                (np.zeros(H) if c0 is None else c0[d, n].numpy()) if kind == "LSTM" else None,
                None if p is None else p[d].numpy(), ry[:, d, n].numpy(), rys[0][d, n].numpy(),
                rys[1][d, n].numpy() if kind == "LSTM" else None, reverse=reverse,
                lbr=attrs.get("linear_before_reset", 0))
            rx_ref[:, n] += rx
            rh_ref[d, n], absorbed_ref = rh, absorbed_ref + gone
            if kind == "LSTM":
                rc_ref[d, n] = rc
    rx_got = t0(got[0]).numpy()
    np.testing.assert_allclose(rx_got, rx_ref, rtol=1e-9, atol=1e-11)
    for k, ref, given in ((5, rh_ref, h0), (6, rc_ref, c0)):
        if given is not None:
            np.testing.assert_allclose(t0(got[k]).numpy(), ref, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(absorbed, absorbed_ref, rtol=1e-9, atol=1e-10)
    # conservation: Σ R_in + absorbed = Σ R_out
    r_in = sum(float(g.sum()) for g in got if g is not None)
    r_out = sum(float(t.sum()) for t in relevance)
    assert abs(r_in + absorbed - r_out) <= 1e-9 * max(1.0, abs(r_out))


def test_with_epsilon_zero_and_no_bias_the_rule_is_exactly_conservative():
    """Nothing absorbs where ε = 0, the cell has no bias and no relevance reaches Y past an end."""
    inputs, _, _ = _build("LSTM", directions=2, initial=True, bias=False)
    spec = lookup("LSTM")
    attrs = {**spec.defaults, "direction": "bidirectional"}
    outs = spec.forward(*inputs, **attrs)
    relevance = [o * 0.5 for o in outs]
    node = Node("n", "LSTM", tuple(f"i{k}" for k in range(len(inputs))), ("y", "yh", "yc"), attrs)
    incoming = []
    for o, rel in zip(outs, relevance):
        incoming.append(Incoming(o))
        incoming[-1].add(Contribution(relevance=rel))
    site = Site(node=node, spec=spec, attrs=attrs, inputs=inputs, outputs=list(outs),
                tainted=[True, False, False, False, False, True, True, False], incoming=incoming)
    got = RULES["relevance"].get("recurrent")(epsilon=0.0).propagate(site)
    r_in = sum(float(c.tensor(x).sum()) for c, x in zip(got, inputs) if c is not None)
    assert float(sum(t.sum() for t in site.absorbed)) == pytest.approx(0.0, abs=1e-12)
    assert r_in == pytest.approx(sum(float(t.sum()) for t in relevance), rel=1e-12)


def test_the_rule_refuses_weights_that_depend_on_the_input():
    spec = lookup("GRU")
    node = Node("n", "GRU", ("x", "w", "r"), ("y",), {})
    rule = RULES["relevance"].get("recurrent")()
    assert "must be constants" in rule.check(node, spec, [True, True, False])
    assert rule.check(node, spec, [True, False, False]) is None
    assert "applies to" in rule.check(Node("m", "MatMul", ("a", "b"), ("y",), {}), lookup("MatMul"), [True, False])


def test_a_vanishing_denominator_books_its_relevance_as_absorbed():
    """ε = 0 and an RNN pre-activation exactly 0 (zero input, zero weights and state): the step's relevance
    reaches no input and is absorbed, so the node still conserves."""
    spec = lookup("RNN")
    attrs = {**spec.defaults}
    x = torch.zeros(2, 1, 2, dtype=torch.float64)
    inputs = [x, torch.ones(1, 1, 2, dtype=torch.float64), torch.ones(1, 1, 1, dtype=torch.float64)]
    outs = spec.forward(*inputs, **attrs)
    node = Node("n", "RNN", ("x", "w", "r"), ("y", "yh"), attrs)
    incoming = []
    for o in outs:
        incoming.append(Incoming(o))
        incoming[-1].add(Contribution(relevance=torch.ones_like(o)))
    site = Site(node=node, spec=spec, attrs=attrs, inputs=inputs, outputs=list(outs), tainted=[True, False, False],
                incoming=incoming)
    got = RULES["relevance"].get("recurrent")(epsilon=0.0).propagate(site)
    assert float(got[0].tensor(x).abs().sum()) == 0.0
    assert float(sum(t.sum() for t in site.absorbed)) == pytest.approx(3.0)
