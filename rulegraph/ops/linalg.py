"""Matrix products."""
from __future__ import annotations

import torch

from . import at_most_one, op, unbroadcast

Tensor = torch.Tensor


def _matmul_vjp(grads, inputs, outputs, wants, **_):
    g = grads[0]
    a, b = inputs
    ga = gb = None
    if wants[0]:
        if b.dim() == 1:
            ga = g.unsqueeze(-1) * b
        else:
            ga = torch.matmul(g if a.dim() > 1 else g.unsqueeze(-2), b.mT)
            ga = unbroadcast(ga if a.dim() > 1 else ga.squeeze(-2), a.shape)
    if wants[1]:
        if a.dim() == 1:
            gb = torch.matmul(a.unsqueeze(-1), g.unsqueeze(-2) if b.dim() > 1 else g.unsqueeze(-1))
            gb = unbroadcast(gb if b.dim() > 1 else gb.squeeze(-1), b.shape)
        else:
            gb = torch.matmul(a.mT, g if b.dim() > 1 else g.unsqueeze(-1))
            gb = unbroadcast(gb if b.dim() > 1 else gb.squeeze(-1), b.shape)
    return [ga, gb]


@op("MatMul", affine=at_most_one(0, 1), vjp=_matmul_vjp)
def matmul(a, b):
    return torch.matmul(a, b)


def _gemm_operands(a, b, transA, transB):
    return (a.mT if transA else a), (b.mT if transB else b)


def _gemm_vjp(grads, inputs, outputs, wants, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    g = grads[0]
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    a2, b2 = _gemm_operands(a, b, transA, transB)
    out = [None, None, None][: len(inputs)]
    if wants[0]:
        ga = unbroadcast(alpha * torch.matmul(g, b2.mT), a2.shape)
        out[0] = ga.mT if transA else ga
    if wants[1]:
        gb = unbroadcast(alpha * torch.matmul(a2.mT, g), b2.shape)
        out[1] = gb.mT if transB else gb
    if c is not None and wants[2]:
        out[2] = unbroadcast(beta * g, c.shape)
    return out


@op("Gemm", affine=at_most_one(0, 1), additive=(2,), vjp=_gemm_vjp)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """General matrix product ``alpha·A'B' + beta·C``. Also accepts batched (N-D) A,
    which the fx loader uses for ``aten.linear``."""
    a2, b2 = _gemm_operands(a, b, transA, transB)
    y = torch.matmul(a2, b2)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        y = y + (c if beta == 1.0 else beta * c)
    return y


@op("Einsum", affine=lambda t: sum(map(bool, t)) <= 1)
def einsum(*xs, equation):
    return torch.einsum(equation, *xs)
