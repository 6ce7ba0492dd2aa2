"""LRP through a recurrent cell, walked backward in time inside the node: LSTM, GRU, RNN and
DynamicQuantizeLSTM (the LSTM of its dequantized weights).

Arras et al. 2017, "Explaining recurrent neural network predictions in sentiment analysis", WASSA
workshop at EMNLP, Sec. 3 (their Eq. 1–4 for the linear and gated parts): the gates are weights,
``R(gate) = 0``; a gate × signal product hands its relevance all to the signal (signal-take-all,
Arras et al. 2019, "Evaluating recurrent neural network explanations", BlackboxNLP workshop at ACL);
the sums of gated signals (the cell update) and the linear maps (input and recurrent weights, the
biases absorbed) take the ε-rule (Bach et al. 2015, PLoS ONE, Eq. 58); the candidate's activation
(tanh) passes relevance as it is (identity). Per step ``t``, for a running batch row, with
``s = R / (z + ε·sign z)`` the ε-rule's ratio at the sum ``z``:

LSTM, ``h_t = o ⊙ tanh(c_t)``, ``c_t = f ⊙ c_{t−1} + i ⊙ g``, ``g = tanh(x W_gᵀ + h_{t−1} R_gᵀ + b_g)``::

    R(c_t) += R(h_t)                             (signal-take-all, identity through tanh)
    R(c_{t−1}) = f ⊙ c_{t−1} ⊙ s,  R(g) = i ⊙ g ⊙ s          (s at c_t)
    R(x_t) = x_t ⊙ (s' W_g),  R(h_{t−1}) = h_{t−1} ⊙ (s' R_g)   (s' = R(g) / stab(z_g))

GRU, ``h_t = (1 − u) ⊙ n + u ⊙ h_{t−1}`` (``u`` the update gate), the candidate
``n = tanh(x W_nᵀ + r ⊙ (h_{t−1} R_nᵀ + b_Rn) + b_Wn)`` (``linear_before_reset``) or
``tanh(x W_nᵀ + (r ⊙ h_{t−1}) R_nᵀ + b_n)``, the reset gate ``r`` a weight in either::

    R(n) = (1 − u) ⊙ n ⊙ s,  R(h_{t−1}) = u ⊙ h_{t−1} ⊙ s        (s at h_t)
    R(x_t) = x_t ⊙ (s' W_n),  R(h_{t−1}) += h_{t−1} ⊙ r ⊙ (s' R_n)  (s' = R(n) / stab(z_n))

RNN, ``h_t = f(x Wᵀ + h_{t−1} Rᵀ + b)``: the ε-rule on the linear map, identity through ``f``.

The relevance arriving at ``Y`` joins each step's state, at ``Y_h`` the last state, at ``Y_c`` the last
cell. What the biases and the stabilisers take is absorbed, and so is what reaches a constant initial
state; relevance reaching ``Y`` where a sequence has ended (zeros) is absorbed. So
``Σ R(X) + Σ R(initial states) + absorbed = Σ R(Y, Y_h, Y_c)``.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from ..ops.recurrent import CELL_OPS, STATE_INPUTS, cell, unroll
from .base import NON_NEGATIVE, Rule, param, relevance_rule
from .numerics import stabilize
from .signal import Contribution

Tensor = torch.Tensor


def _epsilon(r: Tensor, z: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """The ε-rule's ratio ``s = r / (z + ε·sign z)`` and what the stabiliser absorbs; where the denominator
    vanishes (ε = 0 and z = 0), ``s = 0`` and all of ``r`` is absorbed (LRP's 0/0 := 0, booked)."""
    stabilized = stabilize(z, epsilon)
    zero = stabilized == 0
    s = torch.where(zero, torch.zeros_like(r), r / torch.where(zero, 1.0, stabilized))
    return s, s * (stabilized - z) + torch.where(zero, r, torch.zeros_like(r))


@relevance_rule("recurrent")
class Recurrent(Rule):
    """LRP for LSTM / GRU / RNN cells (Arras et al. 2017, WASSA workshop at EMNLP, Sec. 3): gates are
    weights and their products hand everything to the signal, the ε-rule on the cell update and on the
    input and recurrent linear maps (biases absorb), identity through the candidate's tanh; walked
    backward in time inside the node, per direction. Relevance reaches the sequence ``X`` and the
    initial states (absorbed where they are constants)."""

    epsilon: float = param(1e-6, NON_NEGATIVE)
    ops: ClassVar[tuple[str, ...]] = tuple(CELL_OPS)
    breaking: ClassVar[str] = "biases, ε and constant initial states absorb"

    def check(self, node, spec, tainted):
        why = super().check(node, spec, tainted)
        held = [i for i, t in enumerate(tainted) if t and i not in STATE_INPUTS]
        if why is None and held:
            return (f"its weights, bias, peepholes and scales must be constants (input {held[0]} depends on the "
                    f"model's input)")
        return why

    def carries(self, node, spec, tainted):
        return [bool(t) and i in STATE_INPUTS for i, t in enumerate(tainted)]

    def propagate(self, site):
        kind, args, kwargs = cell(site.node.op, site.inputs, site.attrs)
        x, w, r, b, _, h0, c0, _ = args
        layout = kwargs.get("layout", 0)
        with torch.no_grad():
            _, records = unroll(kind, *args, **kwargs, keep=True)
        incoming = [site.incoming[k].tensor if k < len(site.incoming) and site.incoming[k] is not None else None
                    for k in range(3)]
        if layout:      # to time major: Y [S, D, N, H], Y_h / Y_c [D, N, H]
            incoming = [None if incoming[0] is None else incoming[0].permute(1, 2, 0, 3)] + \
                [None if t is None else t.transpose(0, 1) for t in incoming[1:]]
            x = x.transpose(0, 1)
        rx = torch.zeros_like(x)
        rh0, rc0 = [], []
        absorbed = x.new_zeros(())
        for d, steps in enumerate(records):
            bias = None if b is None else b[d].chunk(2)
            rxd, rh, rc, gone = self._direction(kind, x, w[d], r[d], bias, steps, incoming, d,
                                                kwargs.get("linear_before_reset", 0))
            rx = rx + rxd
            rh0.append(rh)
            rc0.append(rc)
            absorbed = absorbed + gone
        out: list[Contribution | None] = [None] * len(site.inputs)
        out[0] = Contribution(relevance=rx.transpose(0, 1) if layout else rx)
        for k, (given, parts) in ((5, (h0, rh0)), (6, (c0, rc0))):
            if given is not None and k < len(site.inputs) and parts[0] is not None:
                t = torch.stack(parts)
                out[k] = Contribution(relevance=t.transpose(0, 1) if layout else t)
            elif parts and parts[0] is not None and site.audit:     # no initial state (zeros): absorbed
                absorbed = absorbed + sum(p.sum() for p in parts)
        if site.audit:
            site.absorbed.append(absorbed)
        return out

    def _direction(self, kind, x, w, r, bias, steps, incoming, d, linear_before_reset):
        """One direction walked back from its last step: ``R(X)`` in time order, ``R(h_0)``, ``R(c_0)`` and
        the absorbed total."""
        eps = self.epsilon
        count, batch, hidden = x.shape[0], x.shape[1], r.shape[-1]
        ry = None if incoming[0] is None else torch.gather(
            incoming[0][:, d], 0, steps.order.unsqueeze(-1).expand(count, batch, hidden))  # processing order
        rh = incoming[1][d] if incoming[1] is not None else x.new_zeros((batch, hidden))
        rc = incoming[2][d] if kind == "LSTM" and incoming[2] is not None else \
            (x.new_zeros((batch, hidden)) if kind == "LSTM" else None)
        xs = torch.gather(x, 0, steps.order.unsqueeze(-1).expand_as(x))
        rx: list[Tensor | None] = [None] * count        # per step, stacked (relevance may carry a target axis)
        gone = x.new_zeros((batch, hidden))
        block = {"LSTM": 3, "GRU": 2, "RNN": 0}[kind]                  # the candidate's rows in W and R (iofc, zrh)
        wg, rg = w[block * hidden:(block + 1) * hidden], r[block * hidden:(block + 1) * hidden]
        bw, br = (None, None) if bias is None else (bias[0][block * hidden:(block + 1) * hidden],
                                                     bias[1][block * hidden:(block + 1) * hidden])
        for t in reversed(range(count)):
            go, gates = steps.running[t], steps.gates[t]
            h_prev, h_now = steps.h[t], steps.h[t + 1]
            r_out = rh if ry is None else rh + torch.where(go, ry[t], torch.zeros_like(ry[t]))
            if ry is not None:
                gone = gone + torch.where(go, torch.zeros_like(ry[t]), ry[t])   # Y is 0 past a sequence's end
            if kind == "LSTM":
                c_prev = steps.c[t]
                c_now = gates["f"] * c_prev + gates["i"] * gates["g"]
                s, lost = _epsilon(rc + r_out, c_now, eps)               # h = o ⊙ tanh(c): all to c
                r_cprev = gates["f"] * c_prev * s
                r_cand = gates["i"] * gates["g"] * s
                gone = gone + torch.where(go, lost, torch.zeros_like(lost))
            elif kind == "GRU":
                s, lost = _epsilon(r_out, h_now, eps)
                r_cand = (1 - gates["z"]) * gates["g"] * s
                r_hkeep = gates["z"] * h_prev * s
                gone = gone + torch.where(go, lost, torch.zeros_like(lost))
            else:
                r_cand = r_out
            z = gates["zg"]                                              # identity through the candidate's tanh
            s, lost = _epsilon(r_cand, z, eps)
            if kind == "GRU":
                reset = gates["r"]
                r_hprev = h_prev * torch.matmul(reset * s, rg) if linear_before_reset else \
                    h_prev * reset * torch.matmul(s, rg)
                r_hprev = r_hprev + r_hkeep
                b_eff = None if bias is None else (bw + reset * br if linear_before_reset else bw + br)
            else:
                r_hprev = h_prev * torch.matmul(s, rg)
                b_eff = None if bias is None else bw + br
            absorbed = lost if b_eff is None else lost + s * b_eff
            gone = gone + torch.where(go, absorbed, torch.zeros_like(absorbed))
            rx[t] = torch.where(go, xs[t] * torch.matmul(s, wg), torch.zeros_like(xs[t]))
            rh = torch.where(go, r_hprev, rh)
            if kind == "LSTM":
                rc = torch.where(go, r_cprev, rc)
        rx = torch.stack(rx) if count else torch.zeros_like(x)
        rx = torch.zeros_like(rx).scatter(0, steps.order.unsqueeze(-1).expand_as(rx), rx)  # back to time order
        return rx, rh, rc, gone.sum()
