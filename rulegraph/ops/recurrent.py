"""Recurrent cells: ONNX ``LSTM``, ``GRU``, ``RNN`` and onnxruntime's ``DynamicQuantizeLSTM``.

Each runs the recurrence of the ONNX operator specification step by step (one matrix product of the
whole input sequence, then one of the state per step), over ``forward``, ``reverse`` or
``bidirectional`` directions, per-batch ``sequence_lens`` (steps past a sequence's length leave its
state as it was and output zeros; a reverse direction reads each sequence backward from its last
valid step), initial states, ``layout`` 0 (time major) or 1 (batch major), ``clip`` on the
activations' inputs, and ``activations`` with their ``activation_alpha`` / ``activation_beta``.

:func:`unroll` is the one implementation: the ops' forward calls it, and so does the relevance rule of
:mod:`rulegraph.propagation.recurrent`, which reads the gates it keeps per step. No op has an explicit
VJP: autograd through the recurrence is the gradient (:func:`rulegraph.ops.autograd_vjp`).

``DynamicQuantizeLSTM`` (domain ``com.microsoft``, onnxruntime's ``quantize_dynamic`` of an LSTM) takes
its weights quantized, transposed (``[directions, input, 4·hidden]``) with a scale and zero point per
direction or per direction and output column: they dequantize, ``(W − zero_point) · scale``, to the
float LSTM it stands for. onnxruntime also rounds the activations to uint8 inside its kernel; rulegraph
computes in float (the LSTM the weights define), which differs from onnxruntime's outputs by that rounding.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .spec import op

Tensor = torch.Tensor

#: ONNX's recurrent activations: name → (function of (x, alpha, beta), default alpha, default beta); one
#: without a default does not take that parameter and consumes no ``activation_alpha`` / ``activation_beta``
ACTIVATIONS = {
    "Sigmoid": (lambda x, a, b: torch.sigmoid(x), None, None),
    "Tanh": (lambda x, a, b: torch.tanh(x), None, None),
    "Relu": (lambda x, a, b: torch.relu(x), None, None),
    "Softsign": (lambda x, a, b: F.softsign(x), None, None),
    "Softplus": (lambda x, a, b: F.softplus(x), None, None),
    "Affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "LeakyRelu": (lambda x, a, b: F.leaky_relu(x, a), 0.01, None),
    "ThresholdedRelu": (lambda x, a, b: torch.where(x > a, x, torch.zeros_like(x)), 1.0, None),
    "ScaledTanh": (lambda x, a, b: a * torch.tanh(b * x), 1.0, 1.0),
    "HardSigmoid": (lambda x, a, b: torch.clamp(a * x + b, 0, 1), 0.2, 0.5),
    "Elu": (lambda x, a, b: F.elu(x, a), 1.0, None),
}
_BY_LOWER = {k.lower(): k for k in ACTIVATIONS}

#: per cell: ONNX's default activations of one direction (``f, g, h`` / ``f, g`` / ``f``)
DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
DIRECTIONS = ("forward", "reverse", "bidirectional")


@dataclass
class Activation:
    name: str
    alpha: float | None
    beta: float | None

    def __call__(self, x: Tensor) -> Tensor:
        return ACTIVATIONS[self.name][0](x, self.alpha, self.beta)


def activations(kind: str, attrs_activations, alphas, betas, directions: int) -> list[list[Activation]]:
    """Per direction, the cell's activations (``f, g, h`` of an LSTM; ``f, g`` of a GRU; ``f`` of an RNN),
    each consuming ``activation_alpha`` / ``activation_beta`` in order where it takes them."""
    per = len(DEFAULT_ACTIVATIONS[kind])
    names = list(attrs_activations) if attrs_activations else list(DEFAULT_ACTIVATIONS[kind]) * directions
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    if len(names) == per and directions == 2:
        names = names * 2
    if len(names) != per * directions:
        raise ValueError(f"{kind} takes {per * directions} activations ({per} per direction), got {len(names)}")
    alphas, betas = list(alphas or ()), list(betas or ())
    out = []
    for n in names:
        name = _BY_LOWER.get(n.lower())
        if name is None:
            raise ValueError(f"activation {n!r} is not one of ONNX's recurrent activations ({', '.join(ACTIVATIONS)})")
        _, a0, b0 = ACTIVATIONS[name]
        a = (alphas.pop(0) if alphas else a0) if a0 is not None else None
        b = (betas.pop(0) if betas else b0) if b0 is not None else None
        out.append(Activation(name, a, b))
    return [out[d * per:(d + 1) * per] for d in range(directions)]


@dataclass
class Steps:
    """One direction's recurrence, as :func:`unroll` ran it, in processing order (``keep=True``): what
    the relevance rule reads. Per step ``t``: the state before (``h[t]``, ``c[t]``) and after
    (``h[t+1]``, ``c[t+1]``), the gates after their activation, the candidate's pre-activation and
    value, and which batch rows were still running (``running[t]``, ``[N, 1]``)."""

    order: Tensor                      # [S, N]: the input time index each step reads, per batch row
    h: list[Tensor] = field(default_factory=list)
    c: list[Tensor] = field(default_factory=list)
    gates: list[dict[str, Tensor]] = field(default_factory=list)
    running: list[Tensor] = field(default_factory=list)


def _order(steps: int, batch: int, lens: Tensor | None, reverse: bool, device) -> tuple[Tensor, Tensor]:
    """Per step and batch row: the time index read (a sequence read backward from its last valid step for
    a reverse direction) and whether the row is still running."""
    k = torch.arange(steps, device=device).unsqueeze(1).expand(steps, batch)
    length = torch.full((batch,), steps, device=device, dtype=torch.long) if lens is None else \
        lens.to(device=device, dtype=torch.long).clamp(0, steps)
    running = k < length
    if not reverse:
        return k, running
    return torch.where(running, length - 1 - k, k), running


def _direction(kind: str, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None, h0: Tensor, c0: Tensor | None,
               p: Tensor | None, lens: Tensor | None, reverse: bool, acts: list[Activation], clip: float | None,
               linear_before_reset: int, input_forget: int,
               keep: bool) -> tuple[Tensor, Tensor, Tensor | None, Steps | None]:
    """One direction over ``x`` ``[S, N, I]``: ``Y`` ``[S, N, H]`` (time order of ``x``), the last state and cell."""
    steps, batch = x.shape[0], x.shape[1]
    hidden = r.shape[-1]
    order, running = _order(steps, batch, lens, reverse, x.device)
    xs = torch.gather(x, 0, order.unsqueeze(-1).expand(steps, batch, x.shape[-1]))
    gx = torch.matmul(xs, w.transpose(0, 1))                     # X·Wᵀ for every step at once
    wb, rb = (b.chunk(2) if b is not None else (None, None))
    if wb is not None:
        gx = gx + wb
    squash = (lambda v: v) if clip is None else (lambda v: v.clamp(-clip, clip))
    h, c = h0, c0
    record = Steps(order) if keep else None
    ys = []
    for t in range(steps):
        go = running[t].unsqueeze(-1)
        if record is not None:
            record.h.append(h)
            record.c.append(c)
            record.running.append(go)
        if kind == "LSTM":
            z = gx[t] + torch.matmul(h, r.transpose(0, 1))
            if rb is not None:
                z = z + rb
            zi, zo, zf, zc = z.split(hidden, -1)
            if p is not None:
                pi, po, pf = p.split(hidden)
                zi, zf = zi + pi * c, zf + pf * c
            i = acts[0](squash(zi))
            f = 1 - i if input_forget else acts[0](squash(zf))
            g = acts[1](squash(zc))
            c_new = f * c + i * g
            if p is not None:
                zo = zo + po * c_new
            o = acts[0](squash(zo))
            h_new = o * acts[2](c_new)
            gates = {"i": i, "f": f, "o": o, "g": g, "zg": zc}
        elif kind == "GRU":
            rz, rr, rh = r.split(hidden, 0)
            bz, br, bh = rb.split(hidden) if rb is not None else (None, None, None)
            xz, xr, xh = gx[t].split(hidden, -1)
            zz = xz + torch.matmul(h, rz.transpose(0, 1))
            zr = xr + torch.matmul(h, rr.transpose(0, 1))
            if rb is not None:
                zz, zr = zz + bz, zr + br
            u = acts[0](squash(zz))
            reset = acts[0](squash(zr))
            if linear_before_reset:
                rec = torch.matmul(h, rh.transpose(0, 1))
                zh = xh + reset * (rec if bh is None else rec + bh)
            else:
                zh = xh + torch.matmul(reset * h, rh.transpose(0, 1))
                if bh is not None:
                    zh = zh + bh
            g = acts[1](squash(zh))
            h_new = (1 - u) * g + u * h
            c_new = None
            gates = {"z": u, "r": reset, "g": g, "zg": zh}
        else:
            zh = gx[t] + torch.matmul(h, r.transpose(0, 1))
            if rb is not None:
                zh = zh + rb
            h_new = acts[0](squash(zh))
            c_new = None
            gates = {"g": h_new, "zg": zh}
        if record is not None:
            record.gates.append(gates)
        ys.append(torch.where(go, h_new, torch.zeros_like(h_new)))
        h = torch.where(go, h_new, h)
        if c_new is not None:
            c = torch.where(go, c_new, c)
    if record is not None:
        record.h.append(h)
        record.c.append(c)
    y = torch.stack(ys) if ys else x.new_zeros((0, batch, hidden))
    y = torch.zeros_like(y).scatter(0, order.unsqueeze(-1).expand_as(y), y)  # back to the input's time order
    return y, h, c, record


def unroll(kind: str, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *,
           activation_alpha=None, activation_beta=None, activations_=None, clip=None, direction="forward",
           hidden_size=None, layout=0, linear_before_reset=0, input_forget=0, keep=False):
    """The ONNX recurrence of ``kind`` (``LSTM``, ``GRU``, ``RNN``): ``(Y, Y_h[, Y_c])`` and, with ``keep``,
    the per-direction :class:`Steps`. Inputs as the ONNX operator takes them (``W`` ``[D, G·H, I]``)."""
    if isinstance(direction, bytes):
        direction = direction.decode()
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r} is not one of {', '.join(DIRECTIONS)}")
    directions = 2 if direction == "bidirectional" else 1
    if w.shape[0] != directions:
        raise ValueError(f"W has {w.shape[0]} directions, direction={direction!r} needs {directions}")
    if layout:
        x = x.transpose(0, 1)
        initial_h = None if initial_h is None else initial_h.transpose(0, 1)
        initial_c = None if initial_c is None else initial_c.transpose(0, 1)
    hidden = r.shape[-1]
    if hidden_size and hidden_size != hidden:
        raise ValueError(f"hidden_size={hidden_size} but R holds a hidden size of {hidden}")
    batch = x.shape[1]
    acts = activations(kind, activations_, activation_alpha, activation_beta, directions)
    zeros = x.new_zeros((directions, batch, hidden))
    h0 = zeros if initial_h is None else initial_h.to(x.dtype)
    c0 = (zeros if initial_c is None else initial_c.to(x.dtype)) if kind == "LSTM" else None
    clip = None if clip is None else float(clip)
    ys, hs, cs, records = [], [], [], []
    for d in range(directions):
        reverse = direction == "reverse" or d == 1
        y, h, c, record = _direction(kind, x, w[d], r[d], None if b is None else b[d], h0[d],
                                     None if c0 is None else c0[d], None if p is None else p[d], sequence_lens,
                                     reverse, acts[d], clip, linear_before_reset, input_forget, keep)
        ys.append(y)
        hs.append(h)
        cs.append(c)
        records.append(record)
    y = torch.stack(ys, 1)                                        # [S, D, N, H]
    y_h = torch.stack(hs)                                         # [D, N, H]
    outs = [y, y_h] + ([torch.stack(cs)] if kind == "LSTM" else [])
    if layout:
        outs = [outs[0].permute(2, 0, 1, 3)] + [o.transpose(0, 1) for o in outs[1:]]
    return (tuple(outs), records) if keep else tuple(outs)


def _size(args: list, attrs: dict) -> int:
    """Elements of ``Y``: steps × batch × directions × hidden (either layout), before the cell runs."""
    x, r = args[0], args[2]
    return x.shape[0] * x.shape[1] * r.shape[0] * r.shape[-1]


def _attrs(kwargs: dict) -> dict:
    kwargs["activations_"] = kwargs.pop("activations")
    return kwargs


@op("LSTM", size=_size)
def lstm(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *, activation_alpha=None,
         activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
         input_forget=0, layout=0):
    """ONNX LSTM (gates ``iofc``, peepholes ``P`` = ``[iof]``): outputs ``Y, Y_h, Y_c``."""
    return unroll("LSTM", x, w, r, b, sequence_lens, initial_h, initial_c, p, **_attrs(dict(
        activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations, clip=clip,
        direction=direction, hidden_size=hidden_size, input_forget=input_forget, layout=layout)))


@op("GRU", size=_size)
def gru(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0, linear_before_reset=0):
    """ONNX GRU (gates ``zrh``): outputs ``Y, Y_h``."""
    return unroll("GRU", x, w, r, b, sequence_lens, initial_h, **_attrs(dict(
        activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations, clip=clip,
        direction=direction, hidden_size=hidden_size, layout=layout, linear_before_reset=linear_before_reset)))


@op("RNN", size=_size)
def rnn(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0):
    """ONNX RNN (a simple recurrent cell ``H = f(X·Wᵀ + H·Rᵀ + b)``): outputs ``Y, Y_h``."""
    return unroll("RNN", x, w, r, b, sequence_lens, initial_h, **_attrs(dict(
        activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations, clip=clip,
        direction=direction, hidden_size=hidden_size, layout=layout)))


def dequantized_weight(q: Tensor, scale: Tensor, zero_point: Tensor, dtype: torch.dtype) -> Tensor:
    """``(q − zero_point) · scale`` of a quantized ``[D, K, G·H]`` weight (scale per direction, or per
    direction and column), transposed to ONNX LSTM's ``[D, G·H, K]``."""
    scale = scale.to(dtype)
    zero = zero_point.to(dtype)
    if scale.dim() == 1:
        scale, zero = scale[:, None, None], zero[:, None, None]
    else:
        scale, zero = scale[:, None, :], zero[:, None, :]
    return ((q.to(dtype) - zero) * scale).transpose(1, 2)


@op("DynamicQuantizeLSTM", domain="com.microsoft")
def dynamic_quantize_lstm(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None,
                          w_scale=None, w_zero_point=None, r_scale=None, r_zero_point=None, *,
                          activation_alpha=None, activation_beta=None, activations=None, clip=None,
                          direction="forward", hidden_size=None, input_forget=0):
    """onnxruntime's DynamicQuantizeLSTM: the ONNX LSTM of the dequantized weights (``W``, ``R`` stored
    ``[D, K, 4H]`` as uint8 / int8 with scales and zero points per direction or per output column)."""
    return lstm(x, dequantized_weight(w, w_scale, w_zero_point, x.dtype),
                dequantized_weight(r, r_scale, r_zero_point, x.dtype), b, sequence_lens, initial_h, initial_c, p,
                activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
                clip=clip, direction=direction, hidden_size=hidden_size, input_forget=input_forget)


#: per op: the cell it runs; the inputs holding weights, bias and peepholes (which rules hold constant)
#: and the inputs holding the sequence and the initial states (which can carry relevance)
CELL_OPS = {"LSTM": "LSTM", "GRU": "GRU", "RNN": "RNN", "DynamicQuantizeLSTM": "LSTM"}
STATE_INPUTS = (0, 5, 6)


def cell(op_type: str, inputs: list, attrs: dict) -> tuple[str, list, dict]:
    """The ONNX cell a recurrent node runs and :func:`unroll`'s arguments for it: ``(kind, [X, W, R, B,
    sequence_lens, initial_h, initial_c, P], attributes)``, DynamicQuantizeLSTM's weights dequantized."""
    kind = CELL_OPS[op_type]
    args = list(inputs[:8]) + [None] * (8 - min(len(inputs), 8))
    if op_type == "DynamicQuantizeLSTM":
        w_scale, w_zero, r_scale, r_zero = (list(inputs[8:]) + [None] * 4)[:4]
        args[1] = dequantized_weight(args[1], w_scale, w_zero, args[0].dtype)
        args[2] = dequantized_weight(args[2], r_scale, r_zero, args[0].dtype)
    kwargs = dict(attrs)
    kwargs["activations_"] = kwargs.pop("activations", None)
    return kind, args, kwargs
