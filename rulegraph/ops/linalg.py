"""Matrix products."""
from __future__ import annotations

import itertools
import math

import torch

from .spec import at_most_one, op, unbroadcast, valueless

Tensor = torch.Tensor


#: a cotangent this large (elements), or one multiplying a weight this large, is checked for rows that are all
#: zero before the product
SPARSE_ROWS_FROM = 1 << 22


def nonzero_rows(flat: Tensor) -> Tensor:
    """The indices of the rows of a 2-D ``flat`` that are not all zero (a NaN counts as not zero), from one
    pass over it: each row's Σ|x|, zero only where every element is (a NaN or an infinity makes it so too:
    not zero), in one fused reduction (2.7× faster than each row's extremes on [511, 50257])."""
    return (torch.linalg.vector_norm(flat, ord=1, dim=-1) != 0).nonzero().squeeze(-1)


def rows_matmul(g: Tensor, m: Tensor, recycler=None) -> Tensor:
    """``g @ m`` for a weight matrix ``m``, multiplying only the rows of ``g`` that are not all zero
    where most are (checked where ``g`` or ``m`` has :data:`SPARSE_ROWS_FROM` elements, one pass over ``g``):
    the relevance of one position of a language model arrives at its [positions, vocabulary] logits (or at
    the few positions a continuation's head computed, :mod:`rulegraph.canonize.rows`), and the LM head's VJP
    then costs a row instead of one per position; against a weight that large the pass over ``g`` is cheap.
    The other rows are exactly 0 (a NaN row counts as not zero). A row with a single non-zero entry (a
    one-hot seed) gives the same bits either way."""
    if g.numel() < SPARSE_ROWS_FROM and m.numel() < SPARSE_ROWS_FROM or g.dim() < 2 or m.dim() != 2 or valueless(g):
        return product(g, m, recycler)
    flat = g.reshape(-1, g.shape[-1])
    rows = nonzero_rows(flat)
    if 2 * rows.numel() > flat.shape[0]:
        return product(g, m, recycler)
    out = flat.new_zeros(flat.shape[0], m.shape[-1])
    out[rows] = torch.matmul(flat[rows], m)
    return out.reshape(*g.shape[:-1], m.shape[-1])


def _matmul_vjp(grads, inputs, outputs, wants, recycler=None, **_):
    """numpy matmul VJP: 1-D operands are promoted to (1, k) / (k, 1) matrices and batch dims
    broadcast, so the cotangent is promoted alike and the VJPs summed back to each shape."""
    g = grads[0]
    a, b = inputs
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    if b.dim() == 1:
        g = g.unsqueeze(-1)
    if a.dim() == 1:
        g = g.unsqueeze(-2)
    ga = unbroadcast(rows_matmul(g, b2.mT, recycler), a2.shape).reshape(a.shape) if wants[0] else None
    gb = unbroadcast(torch.matmul(a2.mT, g), b2.shape).reshape(b.shape) if wants[1] else None
    return [ga, gb]


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of ``a @ b`` for operands of shapes ``a`` and ``b``: the broadcast batch dims, then rows of
    ``a`` × columns of ``b`` (1-D operands contribute no dim), in plain Python: it runs before every product."""
    rows = a[-2:-1] if len(a) > 1 else ()
    cols = b[-1:] if len(b) > 1 else ()
    batch = [max(x, y) if min(x, y) else 0 for x, y in itertools.zip_longest(a[-3::-1], b[-3::-1], fillvalue=1)]
    return (*batch[::-1], *rows, *cols)


def _matmul_size(args, attrs) -> int:
    """Elements of ``a @ b`` (:func:`_matmul_shape`)."""
    return math.prod(_matmul_shape(args[0].shape, args[1].shape))


def product(a: Tensor, b: Tensor, recycler=None) -> Tensor:
    """``a @ b``, written into a large tensor the explanation has finished with where ``recycler`` has one of
    its size (:class:`rulegraph.lifetimes.Recycler`: the same kernel, without the page faults of a fresh one)."""
    if a.dim() < 2 or b.dim() < 2 or recycler is None:
        return torch.matmul(a, b)
    return torch.matmul(a, b, **recycler.out(_matmul_shape(a.shape, b.shape), a, b))


@op("MatMul", affine=at_most_one(0, 1), product="contraction", vjp=_matmul_vjp, size=_matmul_size, outgrows=True)
def matmul(a, b, *, recycler=None):
    return product(a, b, recycler)


def _gemm_operands(a, b, transA, transB):
    return (a.mT if transA else a), (b.mT if transB else b)


def _gemm_vjp(grads, inputs, outputs, wants, *, alpha=1.0, beta=1.0, transA=0, transB=0, recycler=None):
    g = grads[0]
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    a2, b2 = _gemm_operands(a, b, transA, transB)
    out = [None, None, None][: len(inputs)]
    if wants[0]:
        ga = unbroadcast(alpha * rows_matmul(g, b2.mT, recycler), a2.shape)
        out[0] = ga.mT if transA else ga
    if wants[1]:
        gb = unbroadcast(alpha * torch.matmul(a2.mT, g), b2.shape)
        out[1] = gb.mT if transB else gb
    if c is not None and wants[2]:
        out[2] = unbroadcast(beta * g, c.shape)
    return out


def _gemm_affine(tainted):
    """Exactly one of A, B carried (C may be too): with neither, ``alpha·A·B`` is a constant
    that no additive input absorbs, so the gradient rules would not conserve."""
    return bool(tainted[0]) != bool(tainted[1])


@op("Gemm", affine=_gemm_affine, additive=(2,), product="affine", vjp=_gemm_vjp, bias=lambda c, output, attrs: attrs["beta"] * c)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """General matrix product ``alpha·A'B' + beta·C`` (batched A is accepted too)."""
    a2, b2 = _gemm_operands(a, b, transA, transB)
    y = torch.matmul(a2, b2)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        y = y + (c if beta == 1.0 else beta * c)
    return y


@op("Einsum", affine=lambda t: sum(map(bool, t)) <= 1, product="contraction", outgrows=True)
def einsum(*xs, equation):
    return torch.einsum(equation, *xs)
